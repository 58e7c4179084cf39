//! Issue 35: what the host was doing while the GPU waited — rule `blocking-call` over `hostcall`
//! records, and the join of `gpu-idle` and `launch-bound` gaps with hostcalls and host samples
//! (`data.host`, the finding moved to the host line holding most of the gaps).

use super::timeline_rules::launch;
use super::*;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

macro_rules! data {
    ($i:expr, $v:ident) => {
        match &$i.data {
            Some(RuleData::$v(d)) => d,
            other => panic!("expected {} data, got {:?}", stringify!($v), other),
        }
    };
}

/// A `hostcall` record of `name` on thread 1 over `[start, end)` with `stack`.
fn hostcall(b: &mut B, name: &str, start: u64, end: u64, stack: Option<StackId>) {
    let corr = b.next_corr();
    let name = b.s(name);
    b.recs.push(Record::Hostcall(Hostcall {
        domain: ApiDomain::Runtime,
        name,
        start,
        end,
        tid: 1,
        corr,
        ctx: Some(1),
        stack,
        ..Hostcall::default()
    }));
}

/// A host sample of thread `tid`.
fn sample(b: &mut B, tid: u64, ts: u64, state: HostState, period: u64, stack: Option<StackId>) {
    b.recs.push(Record::Hsample(Hsample {
        ts,
        tid,
        state,
        period_ns: period,
        stack,
        call: None,
    }));
}

/// A Python stack, innermost first: (func, file, line).
fn py_stack(b: &mut B, frames: &[(&str, &str, u32)]) -> StackId {
    let f: Vec<FrameId> = frames
        .iter()
        .map(|&(func, file, line)| b.python(func, file, line))
        .collect();
    b.stack(&f)
}

/// The C++ loop of examples/malloc_free_loop.cu, `n` iterations: cudaMalloc (40 µs, line 67),
/// the launch (5 µs, line 68), a 100 µs kernel, cudaFree (line 70) from 10 µs after the launch
/// until 30 µs after the kernel ends. The GPU idles from each kernel's end to the next one's
/// start: 30 µs in cudaFree, 40 µs in cudaMalloc, 7 µs launching.
fn malloc_free_loop(b: &mut B, n: usize, with_records: bool) {
    malloc_free_loop_with(b, n, with_records, (40, 30));
}

/// [`malloc_free_loop`] with cudaMalloc taking `malloc_us` and cudaFree returning `free_us` after
/// the kernel ends.
fn malloc_free_loop_with(
    b: &mut B,
    n: usize,
    with_records: bool,
    (malloc_us, free_us): (u64, u64),
) {
    let malloc = b.user_stack("/src/malloc_free_loop.cu", 67, "main");
    let launch_st = b.user_stack("/src/malloc_free_loop.cu", 68, "main");
    let free = b.user_stack("/src/malloc_free_loop.cu", 70, "main");
    let mut t = MS;
    for _ in 0..n {
        if with_records {
            hostcall(b, "cudaMalloc", t, t + malloc_us * US, Some(malloc));
        }
        let a = t + malloc_us * US;
        let k = a + 7 * US;
        launch(
            b,
            "fill_and_add",
            (a, a + 5 * US),
            k,
            k + 100 * US,
            Some(launch_st),
        );
        if with_records {
            hostcall(
                b,
                "cudaFree",
                a + 15 * US,
                k + (100 + free_us) * US,
                Some(free),
            );
        }
        t = k + (100 + free_us) * US;
    }
}

#[test]
fn blocking_call_names_cuda_free_in_a_loop_with_the_gpu_idle_it_caused() {
    let mut b = B::new();
    malloc_free_loop(&mut b, 20, true);
    let a = b.analyze();
    let v = rule(&a, "blocking-call");
    assert_eq!(v.len(), 2, "{v:#?}");
    let free = v
        .iter()
        .find(|i| i.location.line == Some(70))
        .expect("cudaFree");
    let d = data!(free, BlockingCall);
    assert_eq!((d.call.as_str(), d.calls), ("cudaFree", 20));
    assert!(d.synchronizes);
    assert_eq!(d.host_ns, 20 * 122 * US);
    // Idle inside each call: from the kernel's end to the call's end, 30 µs, except after the
    // last kernel (the device's active range ends there).
    assert_eq!(d.gpu_idle_ns, 19 * 30 * US);
    // cudaFree drained the device: it stays idle until the next kernel starts, 47 µs later
    // (cudaMalloc, then the launch), except after the last call.
    assert_eq!(d.idle_after_ns, 19 * 47 * US);
    assert_eq!(free.gpu_idle_ns, d.gpu_idle_ns + d.idle_after_ns);
    assert_eq!(free.impact_ns, free.gpu_idle_ns);
    assert_eq!(free.blocked_ns, d.host_ns);
    assert!(
        free.title.starts_with(
            "Blocking call × 20 @ malloc_free_loop.cu:70 · cudaFree held the host 2.44ms, the GPU idle 570.0µs of it and 893.0µs after it"
        ),
        "{}",
        free.title
    );
    assert!(free
        .detail
        .contains("waits for the device to finish all its work"));
    assert!(free.fix.contains("cudaMallocAsync"));
    let malloc = v
        .iter()
        .find(|i| i.location.line == Some(67))
        .expect("cudaMalloc");
    let d = data!(malloc, BlockingCall);
    // The first cudaMalloc is before the device's first op: no idle there.
    assert_eq!(
        (d.call.as_str(), d.gpu_idle_ns),
        ("cudaMalloc", 19 * 40 * US)
    );
    assert!(!d.synchronizes);
    assert_eq!(d.idle_after_ns, 0, "cudaMalloc does not drain the device");
}

#[test]
fn blocking_call_needs_three_calls_and_idle_gpu() {
    let mut b = B::new();
    malloc_free_loop(&mut b, 2, true);
    assert!(rule(&b.analyze(), "blocking-call").is_empty(), "2 calls");
    // Calls while the GPU is busy the whole time cause no idle.
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 12, "main");
    b.kernel(0, 10 * MS);
    for k in 0..5 {
        hostcall(
            &mut b,
            "cudaFree",
            MS + k * MS,
            MS + k * MS + 500 * US,
            Some(st),
        );
    }
    assert!(rule(&b.analyze(), "blocking-call").is_empty(), "GPU busy");
    // No hostcall records: nothing.
    let mut b = B::new();
    malloc_free_loop(&mut b, 20, false);
    assert!(rule(&b.analyze(), "blocking-call").is_empty());
}

/// torch.cuda.empty_cache() each step while the GPU has ~1 ms of work queued: the host waits in
/// cudaFree for the queue to drain (most of the call), the device idles only between the call's
/// return and the next step's first kernel. Named for the host time, LOW for the little idle.
#[test]
fn blocking_call_names_a_synchronizing_call_that_holds_the_host_while_the_gpu_drains() {
    let mut b = B::new();
    let st = b.user_stack("/app/step.py", 45, "main");
    let mut t = MS;
    for _ in 0..20 {
        b.kernel(t, t + MS);
        hostcall(&mut b, "cudaFree", t + 100 * US, t + MS + 5 * US, Some(st));
        t += MS + 20 * US;
    }
    let a = b.analyze();
    let v = rule(&a, "blocking-call");
    assert_eq!(v.len(), 1, "{v:#?}");
    let i = v[0];
    assert_eq!((i.location.line, i.severity), (Some(45), Severity::Low));
    let d = data!(i, BlockingCall);
    assert_eq!((d.calls, d.host_ns), (20, 20 * 905 * US));
    assert!(d.gpu_idle_ns + d.idle_after_ns > 0);
    assert!(
        (d.gpu_idle_ns + d.idle_after_ns) * 20 < d.host_ns,
        "under 5 % of the host time: {d:?}"
    );
    // A call that does not synchronize, the same way: nothing.
    let mut b = B::new();
    let st = b.user_stack("/app/step.py", 45, "main");
    let mut t = MS;
    for _ in 0..20 {
        b.kernel(t, t + MS);
        hostcall(
            &mut b,
            "cudaStreamQuery",
            t + 100 * US,
            t + MS + 5 * US,
            Some(st),
        );
        t += MS + 20 * US;
    }
    assert!(rule(&b.analyze(), "blocking-call").is_empty());
}

#[test]
fn blocking_call_names_torch_empty_cache() {
    let mut b = B::new();
    let st = py_stack(
        &mut b,
        &[
            (
                "empty_cache",
                "/venv/lib/python3.12/site-packages/torch/cuda/memory.py",
                222,
            ),
            ("main", "/app/pytorch_empty_cache.py", 41),
        ],
    );
    let mut t = MS;
    for _ in 0..10 {
        b.kernel(t, t + 100 * US);
        hostcall(&mut b, "cudaFree", t + 50 * US, t + 150 * US, Some(st));
        t += 200 * US;
    }
    let a = b.analyze();
    let v = rule(&a, "blocking-call");
    assert_eq!(v.len(), 1, "{v:#?}");
    let i = v[0];
    assert_eq!(i.location.line, Some(41));
    assert!(
        i.title.contains("cudaFree (torch.cuda.empty_cache())"),
        "{}",
        i.title
    );
    assert!(i
        .detail
        .starts_with("torch.cuda.empty_cache() hands the caching allocator's"));
    assert!(i
        .fix
        .starts_with("Don't call torch.cuda.empty_cache() in the loop"));
    let d = data!(i, BlockingCall);
    assert_eq!(d.via.as_deref(), Some("torch.cuda.empty_cache()"));
    assert!(d.synchronizes);
    let j = serde_json::to_value(i).unwrap();
    assert_eq!(j["data"]["rule"], "blocking-call");
    assert_eq!(j["data"]["kind"], "free");
}

#[test]
fn gpu_idle_moves_to_the_host_line_that_holds_most_of_the_gaps() {
    let mut b = B::new();
    malloc_free_loop(&mut b, 20, true);
    let a = b.analyze();
    let v = rule(&a, "gpu-idle");
    assert_eq!(v.len(), 1, "{v:#?}");
    let i = v[0];
    // Each gap: 30 µs in cudaFree, 40 µs in cudaMalloc, 7 µs launching (5 µs in the call).
    assert_eq!(i.impact_ns, 19 * 77 * US);
    assert_eq!(i.location.line, Some(67), "cudaMalloc holds 40 of 77 µs");
    assert!(
        i.title.starts_with(
            "GPU idle × 19 @ malloc_free_loop.cu:67 · 1.46ms while the launching thread was in cudaMalloc (52% of the gaps' time;"
        ),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains(
            "during 19 gaps (1.46ms) the launching thread was 52% in cudaMalloc @ malloc_free_loop.cu:67, 39% in cudaFree @ malloc_free_loop.cu:70, 6% in cudaLaunchKernel @ malloc_free_loop.cu:68 (97% timed exactly)"
        ),
        "{}",
        i.detail
    );
    assert!(i
        .detail
        .contains("the gaps ended at malloc_free_loop.cu:68"));
    assert!(i.fix.contains("cudaMallocAsync"), "{}", i.fix);
    let d = data!(i, GpuIdle);
    assert_eq!(d.gap_ended_at.as_ref().and_then(|l| l.line), Some(68));
    let h = d.host.as_ref().expect("host");
    assert_eq!(
        (h.gaps, h.gap_ns, h.exact_ns),
        (19, 19 * 77 * US, 19 * 75 * US)
    );
    assert_eq!(h.threads, vec![1]);
    assert_eq!(h.lines[0].what, "cudaMalloc");
    let j = serde_json::to_value(i).unwrap();
    assert_eq!(j["data"]["host"]["lines"][1]["what"], "cudaFree");
    assert_eq!(j["data"]["gap_ended_at"]["line"], 68);
    // Without host records: the launch line, no host data.
    let mut b = B::new();
    malloc_free_loop(&mut b, 20, false);
    let a = b.analyze();
    let i = rule(&a, "gpu-idle")[0];
    assert_eq!(i.location.line, Some(68));
    assert!(i.title.contains("waiting for the host to issue work"));
    let j = serde_json::to_value(i).unwrap();
    assert!(j["data"].get("host").is_none() && j["data"].get("gap_ended_at").is_none());
}

#[test]
fn gpu_idle_names_two_host_lines_that_hold_the_gaps_together() {
    let mut b = B::new();
    malloc_free_loop_with(&mut b, 20, true, (35, 35));
    let a = b.analyze();
    let i = rule(&a, "gpu-idle")[0];
    assert_eq!(
        i.location.line,
        Some(68),
        "no line holds half: the launch line stays"
    );
    assert!(
        i.title.starts_with(
            "GPU idle × 19 @ malloc_free_loop.cu:68 · 1.46ms while the launching thread was in cudaMalloc @ malloc_free_loop.cu:67 (45%) and in cudaFree @ malloc_free_loop.cu:70 (45%;"
        ),
        "{}",
        i.title
    );
    assert!(data!(i, GpuIdle).gap_ended_at.is_none());
}

/// A PyTorch-like loop: ~5 ms of NumPy preparation on the main thread (line 40) before each
/// step's launch (line 44), sampled every 1 ms.
fn prep_loop(b: &mut B, steps: u64) {
    let launch_st = b.user_stack("/app/pytorch_numpy_prep.py", 44, "main");
    let prep = py_stack(
        b,
        &[
            (
                "stack",
                "/venv/lib/python3.12/site-packages/numpy/core/shape_base.py",
                456,
            ),
            ("main", "/app/pytorch_numpy_prep.py", 40),
        ],
    );
    let other = py_stack(b, &[("main", "/app/pytorch_numpy_prep.py", 42)]);
    let mut t = MS;
    let mut ts = 0;
    for _ in 0..steps {
        // The step's kernel: 1 ms.
        let a = t;
        launch(
            b,
            "step",
            (a, a + 5 * US),
            a + 10 * US,
            a + MS,
            Some(launch_st),
        );
        t = a + MS;
        // Preparation, then the next launch at t + 5.2 ms.
        while ts < t + 5_200 * US {
            if ts >= t {
                let st = if ts < t + 5 * MS { prep } else { other };
                sample(b, 1, ts, HostState::Cpu, MS, Some(st));
            }
            ts += MS;
        }
        t += 5_200 * US;
    }
}

#[test]
fn gpu_idle_names_the_preparation_line_from_host_samples() {
    let mut b = B::new();
    prep_loop(&mut b, 30);
    let a = b.analyze();
    let v = rule(&a, "gpu-idle");
    assert_eq!(v.len(), 1, "{v:#?}");
    let i = v[0];
    assert_eq!(i.location.line, Some(40), "{}", i.title);
    let d = data!(i, GpuIdle);
    let h = d.host.as_ref().unwrap();
    assert!(h.lines[0].share >= 0.8, "{:?}", h.lines[0]);
    assert_eq!(h.lines[0].doing, Doing::Cpu);
    assert!(
        i.title.contains("while the launching thread was on CPU"),
        "{}",
        i.title
    );
    assert!(i
        .fix
        .starts_with("Move the host work at that line off the launching thread"));
    assert_eq!(d.gap_ended_at.as_ref().and_then(|l| l.line), Some(44));
}

#[test]
fn launch_bound_carries_the_join_of_the_idle_before_its_kernels() {
    // 100 launches, one every 20 µs: a 6 µs call at line 40, the kernel 1 µs later for 2 µs; the
    // host samples Python at line 50 between the launches.
    let run = |python: bool| {
        let mut b = B::new();
        let st = b.user_stack("/src/app.cu", 40, "step");
        let py = py_stack(&mut b, &[("prepare", "/app/loop.py", 50)]);
        for i in 0..100u64 {
            let a = MS + i * 20 * US;
            launch(
                &mut b,
                "tiny",
                (a, a + 6 * US),
                a + 7 * US,
                a + 9 * US,
                Some(st),
            );
            if python {
                sample(&mut b, 1, a - 5 * US, HostState::Cpu, 20 * US, Some(py));
            }
        }
        b.analyze()
    };
    let a = run(true);
    let v = rule(&a, "launch-bound");
    assert_eq!(v.len(), 1);
    let i = v[0];
    let d = data!(i, LaunchBound);
    let h = d.host.as_ref().expect("host");
    // 99 gaps of 18 µs: 6 µs in the launch call, the 12 µs left estimated from the samples.
    assert_eq!(
        (h.gaps, h.gap_ns, h.exact_ns),
        (99, 99 * 18 * US, 99 * 6 * US)
    );
    assert_eq!(h.sampled_ns, 99 * 12 * US);
    assert_eq!(i.location.file, "/app/loop.py");
    assert_eq!(i.location.line, Some(50));
    assert_eq!(d.gap_ended_at.as_ref().and_then(|l| l.line), Some(40));
    assert!(
        i.title.starts_with("Launch-bound × 100 @ loop.py:50 · the GPU waited 1.78ms between short kernels while the launching thread was on CPU (67% of that time)"),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains("33% in cudaLaunchKernel @ app.cu:40"),
        "{}",
        i.detail
    );
    // Host records without samples at a line: the launch line stays.
    let a = run(false);
    let i = rule(&a, "launch-bound")[0];
    assert_eq!(i.location.line, Some(40));
    assert!(
        data!(i, LaunchBound).host.is_none(),
        "no host records at all"
    );
}

/// A `generate()`-like loop: each step, three library lines under the user's call at gen.py:40
/// each launch a 50 µs kernel 300 µs after the previous launch, the host on CPU at that library
/// line in between (sampled every 100 µs when `samples`).
fn generate_loop(b: &mut B, steps: u64, samples: bool) {
    let lib = "/venv/lib/python3.12/site-packages/transformers/models/gpt2/modeling_gpt2.py";
    let stacks: Vec<StackId> = [185u32, 273, 282]
        .iter()
        .map(|&l| py_stack(b, &[("forward", lib, l), ("main", "/app/gen.py", 40)]))
        .collect();
    let mut t = MS;
    for _ in 0..steps {
        for &st in &stacks {
            if samples {
                for k in 1..3u64 {
                    sample(b, 1, t - k * 100 * US, HostState::Cpu, 100 * US, Some(st));
                }
            }
            launch(b, "k", (t, t + 5 * US), t + 10 * US, t + 60 * US, Some(st));
            t += 300 * US;
        }
    }
}

#[test]
fn gpu_idle_rolls_library_lines_up_under_the_users_call() {
    let mut b = B::new();
    generate_loop(&mut b, 30, true);
    let a = b.analyze();
    let v = rule(&a, "gpu-idle");
    let up: Vec<_> = v
        .iter()
        .filter(|i| !data!(i, GpuIdle).library_lines.is_empty())
        .collect();
    assert_eq!(up.len(), 1, "{v:#?}");
    let i = up[0];
    assert_eq!(
        (i.location.file.as_str(), i.location.line),
        ("/app/gen.py", Some(40))
    );
    assert!(i.location.library.is_none());
    let d = data!(i, GpuIdle);
    assert_eq!(d.library_lines.len(), 3);
    // 89 gaps of 250 µs, kernel end to the next kernel start (none before the first).
    assert_eq!((d.gaps, d.idle_ns), (89, 89 * 250 * US));
    let h = d.host.as_ref().expect("host");
    let o = h.overhead.as_ref().expect("framework overhead");
    assert_eq!(o.lines, 3);
    assert_eq!(o.under.as_ref().and_then(|u| u.line), Some(40));
    assert!(
        i.title.starts_with(
            "GPU idle × 89 under gen.py:40 · 22.25ms before the launches of 3 library lines; host: framework overhead"
        ),
        "{}",
        i.title
    );
    // Without host records the per-line findings stay as they were, with no roll-up.
    let mut b = B::new();
    generate_loop(&mut b, 30, false);
    let a = b.analyze();
    assert!(rule(&a, "gpu-idle")
        .iter()
        .all(|i| data!(i, GpuIdle).library_lines.is_empty()));
}
