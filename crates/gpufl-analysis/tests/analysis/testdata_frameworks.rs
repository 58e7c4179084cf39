//! The H100 recordings of issue 11's framework examples (short runs, see testdata/README.md):
//! JAX (XLA worker threads), PyTorch's autograd thread, HuggingFace Trainer and Lightning loops,
//! and NVTX registered strings and start/end ranges (`examples/nvtx_ranges.cu`).

use super::*;

fn at<'a>(a: &'a Analysis, rule_name: &str, line: u32) -> Vec<&'a Insight> {
    rule(a, rule_name)
        .into_iter()
        .filter(|i| i.location.line == Some(line))
        .collect()
}

/// `<driver-internal>` holds at most 5 % of the sync time and of the GPU time.
fn driver_internal_at_most_5_percent(a: &Analysis) {
    for (what, s) in [("sync", &a.attribution.sync), ("GPU", &a.attribution.gpu)] {
        assert!(s.total_ns() > 0, "{what}: nothing attributed");
        assert!(
            s.driver_internal_ns * 20 <= s.total_ns(),
            "{what}: <driver-internal> {} of {}",
            s.driver_internal_ns,
            s.total_ns()
        );
    }
}

#[test]
fn jax_float_read_is_named_at_the_users_line_via_the_waiting_thread() {
    let a = session("jax_train-");
    let line = example_line("jax_train.py", "# gpufl-example: host read");
    let reads = at(&a, "host-read", line);
    assert_eq!(reads.len(), 1, "{:#?}", rule(&a, "host-read"));
    let r = reads[0];
    // 20 steps and 2 warm-up steps: one 4-byte read of the loss each.
    assert_eq!(r.count, 22);
    assert_eq!(window_level(r), Severity::High);
    // XLA's worker thread issued the copy; the Python frames are the main thread's.
    let inf = r.inferred.as_ref().expect("inferred via another thread");
    assert_eq!(inf.via_tids.len(), 1);
    assert!(r.location.file.ends_with("examples/jax_train.py"));
    // XLA's DelayKernel (autotuning) is not the user's kernel.
    assert!(rule(&a, "under-filled-grid").is_empty());
    driver_internal_at_most_5_percent(&a);
    // Almost all kernel time is at the user's lines, inferred through the dispatching thread.
    assert!(a.attribution.gpu.inferred_ns * 10 > a.attribution.gpu.total_ns() * 9);
}

#[test]
fn pytorch_backward_kernels_land_on_the_backward_line() {
    let a = session("pytorch_backward-");
    let line = example_line("pytorch_backward.py", "# gpufl-example: backward");
    let idle = at(&a, "gpu-idle", line);
    assert_eq!(idle.len(), 1, "{:#?}", rule(&a, "gpu-idle"));
    assert!(
        idle[0].inferred.is_some(),
        "launched by the autograd thread"
    );
    assert_eq!(at(&a, "launch-bound", line).len(), 1);
    // The per-step .item() is at its own line.
    let item = example_line("pytorch_backward.py", "# gpufl-example: item");
    assert!(!at(&a, "blocking-copy", item).is_empty());
    driver_internal_at_most_5_percent(&a);
    assert!(a.attribution.gpu.inferred_ns > 0 && a.attribution.gpu.user_ns > 0);
}

/// The in-loop insights of a library loop: the library line that syncs, the user's call beside it.
fn library_syncs<'a>(a: &'a Analysis, rule_name: &str, user_line: u32) -> Vec<&'a Insight> {
    rule(a, rule_name)
        .into_iter()
        .filter(|i| i.location.line == Some(user_line) && i.location.library.is_some())
        .collect()
}

#[test]
fn hf_trainer_syncs_are_named_at_transformers_lines_beside_the_train_call() {
    let a = session("hf_trainer-");
    let train = example_line("hf_trainer.py", "# gpufl-example: train");
    let loops = library_syncs(&a, "in-loop-sync", train);
    assert!(loops.len() >= 2, "{:#?}", rule(&a, "in-loop-sync"));
    let libs: Vec<String> = loops
        .iter()
        .map(|i| i.location.library.as_ref().unwrap().short())
        .collect();
    // Trainer reads the loss and the gradient norm every step (logging_steps=1).
    assert!(
        libs.iter().any(|l| l.starts_with("trainer.py:")),
        "{libs:?}"
    );
    for i in &loops {
        let lib = i.location.library.as_ref().unwrap();
        assert!(
            lib.file.contains("site-packages/transformers/"),
            "{}",
            lib.file
        );
        assert!(lib.text.is_some(), "the library line's text was recorded");
        assert_eq!(i.count, 20);
    }
    // Locations split by library line: not everything on `trainer.train()`.
    let idle_libs: std::collections::HashSet<String> = library_syncs(&a, "gpu-idle", train)
        .iter()
        .map(|i| i.location.library.as_ref().unwrap().short())
        .collect();
    assert!(idle_libs.len() >= 3, "{idle_libs:?}");
    driver_internal_at_most_5_percent(&a);
}

#[test]
fn lightning_item_is_named_at_lightnings_line_beside_the_fit_call() {
    let a = session("lightning_fit-");
    let fit = example_line("lightning_fit.py", "# gpufl-example: fit");
    let copies = library_syncs(&a, "blocking-copy", fit);
    let item = copies
        .iter()
        .find(|i| {
            let l = i.location.library.as_ref().unwrap();
            l.file.ends_with("lightning/fabric/utilities/apply_func.py")
                && l.text.as_deref().is_some_and(|t| t.contains(".item()"))
        })
        .unwrap_or_else(|| panic!("{copies:#?}"));
    // self.log(..., prog_bar=True) turns the logged loss into a Python number every step.
    assert_eq!(item.count, 90);
    driver_internal_at_most_5_percent(&a);
}

#[test]
fn nvtx_registered_strings_and_cross_thread_ranges() {
    let a = session("nvtx_ranges-");
    let names: Vec<Vec<&str>> = a
        .scopes
        .iter()
        .enumerate()
        .map(|(i, _)| gpufl_analysis::rollup_path(&a.scopes, i))
        .collect();
    assert_eq!(
        names,
        vec![vec!["train_step"], vec!["train_step", "forward"]]
    );
    for s in &a.scopes {
        assert!(s.nvtx && s.count == 20 && s.unclosed == 0, "{s:?}");
    }
    assert_eq!(a.ranges.len(), 1, "{:?}", a.ranges);
    let r = &a.ranges[0];
    assert_eq!(
        (r.name.as_str(), r.count, r.cross_thread),
        ("data load", 20, 20)
    );
    // Each range spans the worker's 200 µs sleep at least.
    assert!(r.wall_ns >= 20 * 200_000, "{r:?}");
}
