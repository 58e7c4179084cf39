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
    let malloc = b.user_stack("/src/malloc_free_loop.cu", 67, "main");
    let launch_st = b.user_stack("/src/malloc_free_loop.cu", 68, "main");
    let free = b.user_stack("/src/malloc_free_loop.cu", 70, "main");
    let mut t = MS;
    for _ in 0..n {
        if with_records {
            hostcall(b, "cudaMalloc", t, t + 40 * US, Some(malloc));
        }
        let a = t + 40 * US;
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
            hostcall(b, "cudaFree", a + 15 * US, k + 130 * US, Some(free));
        }
        t = k + 130 * US;
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
    assert_eq!(free.gpu_idle_ns, d.gpu_idle_ns);
    assert_eq!(free.impact_ns, d.gpu_idle_ns);
    assert_eq!(free.blocked_ns, d.host_ns);
    assert!(
        free.title.starts_with(
            "Blocking call × 20 @ malloc_free_loop.cu:70 · cudaFree held the host 2.44ms, the GPU idle 570.0µs of it"
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
