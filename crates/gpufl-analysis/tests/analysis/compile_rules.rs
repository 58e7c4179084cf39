//! Rule `torch-compile`: Dynamo's compilations found from the CUDA calls made inside its frame
//! compiler, spanned from the thread's last CUDA call before to its first after, at the user's
//! line; the first is a one-off, later ones are recompilations.

use super::*;

const DYNAMO: &str = "/venv/lib/python3.12/site-packages/torch/_dynamo/convert_frame.py";
const SCRIPT: &str = "/app/infer.py";

/// Stacks: the compiled call at infer.py:20 running compiled code (replays), and the same call
/// inside Dynamo's frame compiler (compiling).
fn stacks(b: &mut B) -> (StackId, StackId) {
    let user = b.python("infer_step", SCRIPT, 20);
    let main = b.python("main", SCRIPT, 40);
    let run = b.stack(&[user, main]);
    let inner = b.python("_compile", DYNAMO, 700);
    let call = b.python("ConvertFrame.__call__", DYNAMO, 1400);
    let compiling = b.stack(&[inner, call, user, main]);
    (run, compiling)
}

/// The session's one `torch-compile` insight and its data.
fn only(a: &Analysis) -> (&Insight, &gpufl_analysis::insights::torch_compile::Data) {
    let v = rule(a, "torch-compile");
    assert_eq!(v.len(), 1, "{v:#?}");
    let Some(RuleData::TorchCompile(d)) = &v[0].data else {
        panic!("no data")
    };
    (v[0], d)
}

/// A sync at `t` (1 µs) with `stack`, and 2 µs of GPU work before it.
fn step(b: &mut B, t: u64, stack: StackId) {
    b.kernel(t.saturating_sub(3_000), t.saturating_sub(1_000));
    b.sync(SyncKind::StreamSynchronize, t, t + 1_000, Some(stack));
}

#[test]
fn a_first_compilation_is_one_off_and_a_later_one_is_a_recompilation() {
    let mut b = B::new();
    let (run, compiling) = stacks(&mut b);
    let setup = b.python("build", SCRIPT, 10);
    let setup = b.stack(&[setup]);
    // Startup: one call at 1 ms (setting up, another line), then compiling: calls from inside Dynamo at 400 ms and 600 ms
    // (tracing and code generation make none), then steps every 1 ms from 900 ms.
    step(&mut b, 1_000_000, setup);
    step(&mut b, 400_000_000, compiling);
    step(&mut b, 600_000_000, compiling);
    for i in 0..50u64 {
        step(&mut b, 900_000_000 + i * 1_000_000, run);
    }
    let a = b.analyze();
    let (i, d) = only(&a);
    assert_eq!(i.location.short(), "infer.py:20");
    assert_eq!(i.severity, Severity::Low);
    assert_eq!(i.impact_ns, 0, "a one-off is listed, not ranked");
    assert_eq!((d.compilations, d.recompilations), (1, 0));
    // From the end of the call at 1 ms to the start of the first step's sync at 900 ms.
    assert_eq!(d.episodes[0].span_ns, 900_000_000 - 1_001_000);
    assert_eq!(d.episodes[0].calls, 2);
    // The GPU ran only the 2 µs before each of the compiling syncs and the first step's.
    assert_eq!(d.gpu_idle_ns, d.compile_ns - 3 * 2_000);

    // A recompilation at 1.5 s, 300 ms long, in the middle of the steps.
    for i in 0..50u64 {
        step(&mut b, 1_000_000_000 + i * 1_000_000, run);
    }
    step(&mut b, 1_250_000_000, compiling);
    for i in 0..50u64 {
        step(&mut b, 1_350_000_000 + i * 1_000_000, run);
    }
    let a = b.analyze();
    let (i, d) = only(&a);
    assert_eq!((d.compilations, d.recompilations), (2, 1));
    assert_eq!(d.recompile_ns, 1_350_000_000 - (1_049_000_000 + 1_000));
    assert_eq!(i.severity, Severity::Medium);
    assert_eq!(i.impact_ns, d.recompile_gpu_idle_ns);
    assert!(i.impact_ns > 290_000_000, "{}", i.impact_ns);
    assert!(i.title.contains("1 recompilation(s)"), "{}", i.title);
}

#[test]
fn compiled_code_running_and_walks_cut_short_are_not_compilations() {
    let mut b = B::new();
    let (run, _) = stacks(&mut b);
    for i in 0..20u64 {
        step(&mut b, 1_000_000 + i * 50_000_000, run);
    }
    // A call-site walk cut short inside CUDA: no frames to judge by.
    let cupti = b.native("/opt/cuda/lib64/libcupti.so.13", "??", None, None);
    let cut = b.stack(&[cupti]);
    b.sync(
        SyncKind::StreamSynchronize,
        2_000_000_000,
        2_000_001_000,
        Some(cut),
    );
    assert!(rule(&b.analyze(), "torch-compile").is_empty());
}

#[test]
fn short_compilations_are_left_out() {
    let mut b = B::new();
    let (run, compiling) = stacks(&mut b);
    step(&mut b, 1_000_000, run);
    step(&mut b, 1_200_000, compiling);
    step(&mut b, 1_500_000, run);
    assert!(rule(&b.analyze(), "torch-compile").is_empty());
}

/// A first compilation that hit Inductor's caches made no CUDA call inside Dynamo and is not
/// seen; a later one (new shapes: kernels autotuned) is, after the compiled code ran at its line:
/// a recompilation, not a first compilation (the H100 run of `torch_compile_graphs.py
/// --reshape-at 50`, 2026-11-26).
#[test]
fn a_compilation_after_the_code_ran_at_its_line_is_a_recompilation_even_if_alone() {
    let mut b = B::new();
    let (run, compiling) = stacks(&mut b);
    for i in 0..50u64 {
        step(&mut b, 1_000_000 + i * 1_000_000, run);
    }
    step(&mut b, 200_000_000, compiling);
    // Steps up to 1 s: the recompilation's 250 ms of GPU idle is under half the wall time.
    for i in 0..700u64 {
        step(&mut b, 300_000_000 + i * 1_000_000, run);
    }
    let a = b.analyze();
    let (i, d) = only(&a);
    assert_eq!((d.compilations, d.recompilations), (1, 1));
    // 250 ms of GPU idle in a session of about 1 s: more than 25 % of it.
    assert_eq!(i.severity, Severity::High);
    assert!(
        i.share_of_session > 0.2 && i.share_of_session < 0.3,
        "{}",
        i.share_of_session
    );
    assert_eq!(d.recompile_ns, 300_000_000 - 50_001_000);
}
