//! The H100 recordings of issue 5's examples: named scopes and NVTX ranges
//! (`examples/pytorch_scopes.py`) and NVML telemetry (`examples/matmul_loop.py --fill-memory 0.93`).

use super::*;

#[test]
fn testdata_scopes_roll_the_item_syncs_up_to_train_step_forward() {
    let a = session("pytorch_scopes-735-");
    let get = |path: &[&str]| {
        (0..a.scopes.len())
            .find(|&i| gpufl_analysis::rollup_path(&a.scopes, i) == path)
            .map(|i| &a.scopes[i])
            .unwrap_or_else(|| panic!("no scope {path:?} in {:#?}", a.scopes))
    };
    let step = get(&["train_step"]);
    let fwd = get(&["train_step", "forward"]);
    let bwd = get(&["train_step", "backward"]);
    let opt = get(&["train_step", "optimizer"]);
    // 30 steps, each with its scopes; the optimizer range is torch.cuda.nvtx.range (NVTX).
    for s in [step, fwd, bwd, opt] {
        assert_eq!((s.count, s.unclosed), (30, 0), "{s:?}");
    }
    assert!(opt.nvtx && !fwd.nvtx && !step.nvtx);
    // The one sync per step is loss.item() inside forward: it rolls up to forward and its parent.
    assert_eq!((fwd.syncs, bwd.syncs, opt.syncs), (30, 0, 0));
    assert_eq!(step.syncs, fwd.syncs);
    assert!(fwd.sync_blocked_ns > 0 && fwd.sync_blocked_ns == step.sync_blocked_ns);
    assert!(fwd.wall_ns <= step.wall_ns && bwd.wall_ns + fwd.wall_ns + opt.wall_ns <= step.wall_ns);
    // Kernels are counted by their launch on the scope's thread.
    assert!(fwd.kernels_by_launch);
    assert_eq!(step.kernels, fwd.kernels + bwd.kernels + opt.kernels);
    // Each insight at the .item() line names its innermost scope.
    let line = example_line("pytorch_scopes.py", "# gpufl-example: scopes");
    let at_line: Vec<_> = a
        .findings()
        .filter(|i| i.location.line == Some(line))
        .collect();
    assert!(at_line.len() >= 2, "{at_line:#?}");
    for i in at_line {
        assert_eq!(
            i.scope.as_deref(),
            Some(&["train_step".to_string(), "forward".to_string()][..]),
            "{}",
            i.title
        );
    }
}

#[test]
fn testdata_telemetry_series_is_plausible_and_flags_memory_pressure() {
    let a = session("matmul_loop-878-");
    assert_eq!(a.telemetry.len(), 1);
    let t = &a.telemetry[0];
    assert_eq!(t.device, 0);
    // 100 ms sampling over the ~3.5 s run.
    assert_eq!((t.period_ns + 500_000) / 1_000_000, 100, "{}", t.period_ns);
    assert!(t.samples >= 20, "{t:?}");
    // The bf16 matmul loop drives the GPU to 100 % (NVML's utilization counter).
    let util = t.gpu_util_pct.as_ref().unwrap();
    assert_eq!(util.max, 100.0);
    assert!(
        util.min < 50.0,
        "the host-bound tail is in the series too: {util:?}"
    );
    let power = t.power_w.as_ref().unwrap();
    assert!(power.max > 300.0 && power.max < 800.0, "{power:?}");
    let used = t.mem_used_bytes.as_ref().unwrap();
    let total = t.mem_total_bytes.unwrap() as f64;
    assert!(
        used.max / total > 0.9,
        "--fill-memory 0.93: {} of {}",
        used.max,
        total
    );
    let v = rule(&a, "memory-pressure");
    assert_eq!(v.len(), 1, "{v:#?}");
    assert!(rule(&a, "ecc-errors").is_empty());
    // The host-bound tail (20 ms sleeps before small matmuls) is the low-utilization line.
    let tail = example_line("matmul_loop.py", "# gpufl-example: low-utilization");
    let low = rule(&a, "low-utilization");
    assert_eq!(low.len(), 1, "{low:#?}");
    assert_eq!(low[0].location.line, Some(tail));
}
