//! Tests of the timeline rules of the streams seed: `no-copy-compute-overlap`, `gpu-idle` (and its
//! per-device summary, `Analysis::gpu_idle`) and `launch-bound`, at and around their thresholds,
//! and on the real two_stream_overlap session.

use super::*;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

/// The rule data of an insight, as its variant (the data types live in crate-private modules).
macro_rules! data {
    ($i:expr, $v:ident) => {
        match &$i.data {
            Some(RuleData::$v(d)) => d,
            other => panic!("expected {} data, got {:?}", stringify!($v), other),
        }
    };
}

fn js<T: serde::Serialize>(v: T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

/// An `api` record on thread `tid`.
fn api_rec(b: &mut B, name: &str, start: u64, end: u64, corr: u32, tid: u64) {
    let name = b.s(name);
    b.recs.push(Record::Api(Api {
        domain: ApiDomain::Runtime,
        name,
        cbid: 0,
        start,
        end,
        tid,
        corr,
        ret: 0,
    }));
}

/// A `callsite` record: the stack of the call with correlation id `corr`.
fn site(b: &mut B, corr: u32, api: &str, stack: StackId, ts: u64) {
    let api = b.s(api);
    b.recs.push(Record::Callsite(Callsite {
        corr,
        api,
        tid: 1,
        ts,
        stack,
        weight: None,
    }));
}

/// A kernel `name` on `stream` (device 0) without an API record; returns its correlation id.
pub(super) fn kern(b: &mut B, name: &str, stream: u32, start: u64, end: u64) -> u32 {
    let corr = b.next_corr();
    let name = b.s(name);
    b.recs.push(Record::Kernel(Kernel {
        name,
        start,
        end,
        dev: 0,
        ctx: 1,
        stream,
        corr,
        ..Kernel::default()
    }));
    corr
}

/// A kernel launched by `cudaLaunchKernel` over `[api.0, api.1)` on thread 1, running over
/// `[start, end)` on stream 7, with a call-site stack when `stack` is Some.
pub(super) fn launch(
    b: &mut B,
    name: &str,
    api: (u64, u64),
    start: u64,
    end: u64,
    stack: Option<StackId>,
) -> u32 {
    let corr = kern(b, name, 7, start, end);
    api_rec(b, "cudaLaunchKernel", api.0, api.1, corr, 1);
    if let Some(st) = stack {
        site(b, corr, "cudaLaunchKernel", st, api.0);
    }
    corr
}

/// A memcpy of `kind` on `stream` without an API record; returns its correlation id.
fn copy(b: &mut B, kind: CopyKind, stream: u32, start: u64, end: u64) -> u32 {
    let corr = b.next_corr();
    b.recs.push(Record::Memcpy(Memcpy {
        kind,
        src_kind: MemoryKind::Pinned,
        dst_kind: MemoryKind::Device,
        bytes: 1 << 20,
        start,
        end,
        dev: 0,
        ctx: 1,
        stream,
        corr,
        graph: None,
    }));
    corr
}

/// A sync of `kind` on thread `tid`.
pub(super) fn sync_on(
    b: &mut B,
    tid: u64,
    kind: SyncKind,
    start: u64,
    end: u64,
    stack: Option<StackId>,
) {
    let corr = b.next_corr();
    b.recs.push(Record::Sync(Sync {
        kind,
        start,
        end,
        ctx: 1,
        stream: Some(7),
        corr,
        tid: Some(tid),
        stack,
        ..Sync::default()
    }));
}

/// H2D, kernel, D2H back to back on stream 7 from `t`, the H2D copy with a call-site stack at
/// `st`; returns the end.
fn pipeline_seq(b: &mut B, t: u64, st: StackId, h2d: u64, k: u64, d2h: u64) -> u64 {
    let c = copy(b, CopyKind::HtoD, 7, t, t + h2d);
    site(b, c, "cudaMemcpy", st, t);
    kern(b, "process", 7, t + h2d, t + h2d + k);
    copy(b, CopyKind::DtoH, 7, t + h2d + k, t + h2d + k + d2h);
    t + h2d + k + d2h
}

// ---------------------------------------------------------------------------------------------
// no-copy-compute-overlap
// ---------------------------------------------------------------------------------------------

#[test]
fn overlap_rule_predicts_the_seed_pipeline() {
    // The seed's worked example: H2D 30 ms, kernel 20 ms, D2H 30 ms, nothing overlapping.
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 80, "run");
    pipeline_seq(&mut b, 0, st, 30 * MS, 20 * MS, 30 * MS);
    let a = b.analyze();
    let v = rule(&a, "no-copy-compute-overlap");
    assert_eq!(v.len(), 1, "{:#?}", a.insights);
    let i = v[0];
    assert_eq!(
        i.title,
        "No copy/compute overlap × 1 @ app.cu:80 · 80.00ms could be ~55.00ms with 2 streams"
    );
    assert_eq!(i.location.line, Some(80));
    assert_eq!(i.count, 1);
    let d = data!(i, NoCopyComputeOverlap);
    assert_eq!(
        (d.stages.h2d_ns, d.stages.kernel_ns, d.stages.d2h_ns),
        (30 * MS, 20 * MS, 30 * MS)
    );
    assert_eq!(d.measured_ns, 80 * MS);
    assert_eq!(d.two_streams.time_ns, 55 * MS);
    assert_eq!(d.four_streams.time_ns, 42_500_000);
    assert!((d.four_streams.speedup - 80.0 / 42.5).abs() < 1e-9);
    assert_eq!(js(d.location_source), "callsite");
    // Impact: measured − 4-stream prediction, on the session's wall time (80 ms): 46.9 %.
    assert_eq!(i.impact_ns, 37_500_000);
    assert_eq!(i.window_ns, 80 * MS);
    assert_eq!(window_level(i), Severity::Medium);
    assert!(i.detail.contains("~42.50ms (1.88x)"), "{}", i.detail);
}

#[test]
fn overlap_rule_aggregates_sequences_per_line() {
    let mut b = B::new();
    let a80 = b.user_stack("/src/app.cu", 80, "run");
    let a90 = b.user_stack("/src/app.cu", 90, "other");
    let mut t = 0;
    for _ in 0..3 {
        t = pipeline_seq(&mut b, t, a80, 300 * US, 200 * US, 300 * US) + 100 * US;
    }
    pipeline_seq(&mut b, t, a90, 300 * US, 200 * US, 300 * US);
    let a = b.analyze();
    let v = rule(&a, "no-copy-compute-overlap");
    assert_eq!(v.len(), 2);
    let i80 = v.iter().find(|i| i.location.line == Some(80)).unwrap();
    assert_eq!(i80.count, 3);
    let d = data!(i80, NoCopyComputeOverlap);
    assert_eq!(d.sequences, 3);
    assert_eq!(d.measured_ns, 3 * 800 * US);
    assert_eq!(d.two_streams.time_ns, 3 * 550 * US);
    assert_eq!(i80.impact_ns, 3 * (800 - 425) * US);
    assert!(i80
        .title
        .starts_with("No copy/compute overlap × 3 @ app.cu:80 · 2.40ms"));
    assert_eq!(
        v.iter()
            .find(|i| i.location.line == Some(90))
            .unwrap()
            .count,
        1
    );
}

#[test]
fn overlap_rule_needs_comparable_stages() {
    // Kernel stage 100 ms; copies split evenly over H2D and D2H.
    let fires = |copies: u64| {
        let mut b = B::new();
        let st = b.user_stack("/src/app.cu", 80, "run");
        pipeline_seq(&mut b, 0, st, copies / 2, 100 * MS, copies - copies / 2);
        !rule(&b.analyze(), "no-copy-compute-overlap").is_empty()
    };
    assert!(fires(25 * MS), "copies exactly 25 % of the kernels");
    assert!(!fires(25 * MS - 2), "just under 25 %");
    assert!(fires(400 * MS), "copies exactly 4x the kernels");
    assert!(!fires(400 * MS + 2), "just over 4x");
    assert!(!fires(2 * MS), "compute-bound");
}

#[test]
fn overlap_rule_ignores_tiny_and_sparse_sequences() {
    let run = |h2d: u64, k: u64, d2h: u64, pause: u64| {
        let mut b = B::new();
        let st = b.user_stack("/src/app.cu", 80, "run");
        let c = copy(&mut b, CopyKind::HtoD, 7, 0, h2d);
        site(&mut b, c, "cudaMemcpy", st, 0);
        kern(&mut b, "process", 7, h2d, h2d + k);
        let t = h2d + k + pause;
        copy(&mut b, CopyKind::DtoH, 7, t, t + d2h);
        rule(&b.analyze(), "no-copy-compute-overlap").len()
    };
    assert_eq!(run(30 * US, 40 * US, 30 * US, 0), 1, "exactly 100 µs");
    assert_eq!(run(30 * US, 40 * US, 30 * US - 1, 0), 0, "under 100 µs");
    // Host pause between the kernel and the D2H copy: stages must fill half the span.
    assert_eq!(run(30 * MS, 20 * MS, 30 * MS, 80 * MS), 1, "exactly half");
    assert_eq!(run(30 * MS, 20 * MS, 30 * MS, 80 * MS + 1), 0);
}

#[test]
fn overlap_rule_rejects_overlapped_or_out_of_order_work() {
    // A kernel on another stream under the H2D copy: overlap up to 1 % of the span is jitter.
    let with_overlap = |ov: u64| {
        let mut b = B::new();
        let st = b.user_stack("/src/app.cu", 80, "run");
        pipeline_seq(&mut b, 0, st, 30 * MS, 20 * MS, 30 * MS);
        kern(&mut b, "other", 8, 10 * MS, 10 * MS + ov);
        b.analyze()
    };
    let a = with_overlap(800 * US);
    let v = rule(&a, "no-copy-compute-overlap");
    assert_eq!(v.len(), 1, "0.8 ms of 80 ms: exactly 1 %");
    assert_eq!(
        data!(v[0], NoCopyComputeOverlap).stages.kernel_ns,
        20 * MS,
        "the stream's own sequence, counted once"
    );
    assert!(rule(&with_overlap(800 * US + 1), "no-copy-compute-overlap").is_empty());
    // Out of order: D2H before the kernel, or kernel first.
    let mut b = B::new();
    copy(&mut b, CopyKind::HtoD, 7, 0, 30 * MS);
    copy(&mut b, CopyKind::DtoH, 7, 30 * MS, 60 * MS);
    kern(&mut b, "process", 7, 60 * MS, 80 * MS);
    assert!(rule(&b.analyze(), "no-copy-compute-overlap").is_empty());
}

#[test]
fn overlap_rule_follows_work_serialized_across_streams() {
    // cudaMemcpy on the legacy default stream (7) around a kernel on stream 13: the device ran
    // them one after the other, although no single stream holds the sequence.
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 80, "run");
    let c = copy(&mut b, CopyKind::HtoD, 7, 0, 30 * MS);
    site(&mut b, c, "cudaMemcpy", st, 0);
    kern(&mut b, "process", 13, 30 * MS, 50 * MS);
    copy(&mut b, CopyKind::DtoH, 7, 50 * MS, 80 * MS);
    let a = b.analyze();
    let v = rule(&a, "no-copy-compute-overlap");
    assert_eq!(v.len(), 1);
    assert_eq!(data!(v[0], NoCopyComputeOverlap).measured_ns, 80 * MS);
}

#[test]
fn overlap_rule_without_callsites_falls_back_to_the_next_sync_or_none() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 71, "run_sequential");
    let c = copy(&mut b, CopyKind::HtoD, 7, 1000, 1000 + 30 * MS);
    api_rec(&mut b, "cudaMemcpy", 900, 1000 + 30 * MS, c, 1);
    kern(&mut b, "process", 7, 1000 + 30 * MS, 1000 + 50 * MS);
    copy(&mut b, CopyKind::DtoH, 7, 1000 + 50 * MS, 1000 + 80 * MS);
    let mut no_sync = b.recs.clone();
    b.sync(SyncKind::EventSynchronize, 81 * MS, 81 * MS + 10, Some(st));
    let a = b.analyze();
    let i = rule(&a, "no-copy-compute-overlap")[0];
    assert_eq!(i.location.line, Some(71));
    assert_eq!(
        js(data!(i, NoCopyComputeOverlap).location_source),
        "next_sync"
    );
    assert!(i.detail.contains("line approximate"), "{}", i.detail);
    // No sync with a stack either: no line.
    no_sync.retain(|r| !matches!(r, Record::Sync(_)));
    let a = analyze(&Model::load(no_sync), &Config::default());
    let i = rule(&a, "no-copy-compute-overlap")[0];
    assert_eq!(i.location.file, "<unknown>");
    assert_eq!(i.location.line, None);
    assert!(
        i.title.starts_with("No copy/compute overlap × 1 · 80.00ms"),
        "{}",
        i.title
    );
}

// ---------------------------------------------------------------------------------------------
// gpu-idle
// ---------------------------------------------------------------------------------------------

/// `n` kernels of 100 µs; each after the first launched `host_us` µs after the previous kernel
/// ended (5 µs launch call, kernel 2 µs after it returns): gaps of `host_us + 7` µs, class launch.
/// The launches carry a call-site stack at `/src/app.cu:30`.
fn launch_loop(b: &mut B, t0: u64, n: usize, host_us: u64, st: Option<StackId>) -> u64 {
    let mut t = t0;
    launch(b, "step_k", (t - 10 * US, t - 5 * US), t, t + 100 * US, st);
    t += 100 * US;
    for _ in 1..n {
        let a = t + host_us * US;
        let k = a + 7 * US;
        launch(b, "step_k", (a, a + 5 * US), k, k + 100 * US, st);
        t = k + 100 * US;
    }
    t
}

#[test]
fn gpu_idle_launch_gaps_make_one_insight_per_line() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "train_step");
    launch_loop(&mut b, MS, 10, 20, Some(st));
    let a = b.analyze();
    let d = &a.gpu_idle[0];
    assert_eq!(d.device, 0);
    assert_eq!(d.gaps, 9);
    assert_eq!(d.by_class.launch.gaps, 9);
    assert_eq!(d.by_class.launch.idle_ns, 9 * 27 * US);
    assert_eq!((d.busy_ns, d.idle_ns), (1000 * US, 243 * US));
    assert_eq!(d.active_ns, d.busy_ns + d.idle_ns);
    let v = rule(&a, "gpu-idle");
    assert_eq!(v.len(), 1, "{:#?}", v);
    let i = v[0];
    assert_eq!(i.location.line, Some(30));
    assert_eq!(i.impact_ns, 243 * US);
    assert_eq!(i.gpu_idle_ns, 243 * US);
    // Window: the first gap's start to the last gap's end.
    assert_eq!(i.window_ns, 9 * 127 * US - 100 * US);
    assert_eq!(i.severity, Severity::Medium);
    assert_eq!(i.sync_kind, None);
    assert!(
        i.title
            .starts_with("GPU idle × 9 @ app.cu:30 · 243.0µs waiting for the host to issue work"),
        "{}",
        i.title
    );
    let dd = data!(i, GpuIdle);
    assert_eq!(js(dd.class), "launch");
    assert_eq!(dd.largest_gap_ns, 27 * US);
    assert_eq!(js(dd.location_source), "callsite");
    assert_eq!(d.top_gaps.len(), 9);
    assert_eq!(
        d.top_gaps[0].start_offset_ns,
        10 * US + 100 * US,
        "earliest of equal gaps first"
    );
    assert_eq!(d.top_gaps[0].location.as_ref().unwrap().line, Some(30));
}

#[test]
fn gpu_idle_floor_and_launch_share_thresholds() {
    // Gaps under 5 µs are kernel waits: counted, never classified or attributed.
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "f");
    let mut t = MS;
    for gap in [4_999, 5_000, 5_000, 5_000] {
        launch(
            &mut b,
            "k",
            (t - 3 * US, t - 2 * US),
            t,
            t + 100 * US,
            Some(st),
        );
        t += 100 * US + gap;
    }
    launch(&mut b, "k", (t - 1, t), t, t + 100 * US, Some(st));
    let a = b.analyze();
    let d = &a.gpu_idle[0];
    assert_eq!(
        (d.by_class.kernel_wait.gaps, d.by_class.kernel_wait.idle_ns),
        (1, 4_999)
    );
    assert_eq!(
        (d.by_class.launch.gaps, d.by_class.launch.idle_ns),
        (3, 15_000)
    );
    // The launch class fires at 5 % of the line's span (first gap's start to last gap's end):
    // 3 gaps of 5 µs between 4 kernels of `k` ns, a span of 15 µs + 2k.
    let share = |k: u64| {
        let mut b = B::new();
        let st = b.user_stack("/src/app.cu", 30, "f");
        let mut t = MS;
        for _ in 0..4 {
            launch(&mut b, "k", (t - 3 * US, t - 2 * US), t, t + k, Some(st));
            t += k + 5 * US;
        }
        rule(&b.analyze(), "gpu-idle").len()
    };
    assert_eq!(share(142_500), 1, "15 µs of 300 µs: exactly 5 %");
    assert_eq!(share(142_501), 0, "15 µs of 300.002 µs");
}

#[test]
fn gpu_idle_needs_three_gaps_and_one_percent_of_the_active_range() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "f");
    let end = launch_loop(&mut b, MS, 3, 20, Some(st));
    assert_eq!(rule(&b.analyze(), "gpu-idle").len(), 0, "2 gaps");
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "f");
    let end4 = launch_loop(&mut b, MS, 4, 20, Some(st));
    assert_eq!(rule(&b.analyze(), "gpu-idle").len(), 1, "3 gaps");
    assert!(end4 > end);
    // The same burst in a device range 100x longer (81 µs of idle, under 1 % of ~8.2 ms): a kernel
    // 8 ms later, issued early (its gap is `other`, and a one-off).
    let c = kern(&mut b, "late", 8, end4 + 8 * MS, end4 + 8 * MS + 10 * US);
    api_rec(&mut b, "cudaLaunchKernel", MS / 2, MS / 2 + 1, c, 1);
    let a = b.analyze();
    assert_eq!(a.gpu_idle[0].by_class.other.gaps, 1);
    assert!(
        rule(&a, "gpu-idle").is_empty(),
        "{:#?}",
        rule(&a, "gpu-idle")
    );
}

#[test]
fn gpu_idle_leaves_one_off_pauses_out_of_the_insight() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "train_step");
    // Startup: one kernel, a 100 ms pause, then the loop (9 gaps of 27 µs).
    launch(&mut b, "init", (0, 5 * US), 10 * US, 20 * US, Some(st));
    launch_loop(&mut b, 100 * MS, 10, 20, Some(st));
    let a = b.analyze();
    let d = &a.gpu_idle[0];
    assert_eq!(d.by_class.launch.gaps, 10);
    assert_eq!(d.top_gaps[0].duration_ns, 100 * MS - 20 * US);
    assert_eq!(js(d.top_gaps[0].class), "launch");
    let i = rule(&a, "gpu-idle")[0];
    assert_eq!(i.count, 9);
    assert_eq!(i.impact_ns, 243 * US);
    // The span from the pause's start to the last gap's end, the pause cut out: the loop's first
    // kernel and its 9 periods.
    assert_eq!(
        i.window_ns,
        9 * 127 * US,
        "the pause is cut out of the span"
    );
    let dd = data!(i, GpuIdle);
    assert_eq!(
        (dd.classes[0].one_off_gaps, dd.classes[0].one_off_ns),
        (1, 100 * MS - 20 * US)
    );
    assert!(
        i.detail.contains("1 one-off pause (99.98ms"),
        "{}",
        i.detail
    );
}

#[test]
fn gpu_idle_sync_class_names_the_sync() {
    // Each iteration: a 100 µs kernel; the launching thread then blocks in a stream sync until
    // 200 µs after the kernel ended (a host callback, say); the next launch 5 µs later.
    let session = |tid: u64, blocked_us: u64| {
        let mut b = B::new();
        let sst = b.user_stack("/src/app.cu", 54, "step");
        let mut t = MS;
        for _ in 0..5 {
            launch(&mut b, "k", (t - 7 * US, t - 2 * US), t, t + 100 * US, None);
            sync_on(
                &mut b,
                tid,
                SyncKind::StreamSynchronize,
                t + 50 * US,
                t + 100 * US + blocked_us * US,
                Some(sst),
            );
            t += 100 * US + 210 * US;
        }
        b.analyze()
    };
    let a = session(1, 200);
    let d = &a.gpu_idle[0];
    assert_eq!((d.by_class.sync.gaps, d.by_class.launch.gaps), (4, 0));
    let v = rule(&a, "gpu-idle");
    assert_eq!(v.len(), 1);
    let i = v[0];
    assert_eq!(i.location.line, Some(54));
    assert_eq!(i.impact_ns, 4 * 210 * US);
    let dd = data!(i, GpuIdle);
    assert_eq!(js(dd.class), "sync");
    assert_eq!(dd.blocking_call.as_deref(), Some("StreamSynchronize"));
    assert_eq!(js(dd.location_source), "sync");
    assert!(
        i.title
            .contains("while the host was blocked in StreamSynchronize"),
        "{}",
        i.title
    );
    assert!(i.detail.contains("sync-attribution"), "{}", i.detail);
    // The sync-attribution insight of the same line counts host time, not GPU idle.
    assert_eq!(rule(&a, "sync-attribution")[0].impact_ns, 5 * 250 * US);
    // Coverage: more than half the gap (210 µs): 105 µs is not enough, 105 µs + 1 ns is.
    let half = session(1, 105);
    assert_eq!(half.gpu_idle[0].by_class.sync.gaps, 0);
    assert_eq!(half.gpu_idle[0].by_class.launch.gaps, 4);
    let mut b = B::new();
    let sst = b.user_stack("/src/app.cu", 54, "step");
    let mut t = MS;
    for _ in 0..2 {
        launch(&mut b, "k", (t - 7 * US, t - 2 * US), t, t + 100 * US, None);
        sync_on(
            &mut b,
            1,
            SyncKind::StreamSynchronize,
            t,
            t + 205 * US + 1,
            Some(sst),
        );
        t += 310 * US;
    }
    assert_eq!(b.analyze().gpu_idle[0].by_class.sync.gaps, 1);
    // A sync on another thread does not explain the launching thread's lateness.
    let other = session(2, 200);
    assert_eq!(other.gpu_idle[0].by_class.sync.gaps, 0);
    assert_eq!(other.gpu_idle[0].by_class.launch.gaps, 4);
}

#[test]
fn gpu_idle_blocking_copy_is_a_sync_cause() {
    // The thread sits in a blocking cudaMemcpy (pageable, staged by the host) while the GPU idles
    // between the copy's DMA chunks.
    let mut b = B::new();
    let cst = b.user_stack("/src/app.cu", 64, "load");
    let mut t = MS;
    let c = b.next_corr();
    api_rec(&mut b, "cudaMemcpy", t - US, t + 4 * 300 * US, c, 1);
    site(&mut b, c, "cudaMemcpy", cst, t - US);
    for _ in 0..4 {
        b.recs.push(Record::Memcpy(Memcpy {
            kind: CopyKind::HtoD,
            src_kind: MemoryKind::Pageable,
            dst_kind: MemoryKind::Device,
            bytes: 1 << 20,
            start: t,
            end: t + 100 * US,
            dev: 0,
            ctx: 1,
            stream: 7,
            corr: c,
            graph: None,
        }));
        t += 300 * US;
    }
    let a = b.analyze();
    assert_eq!(a.gpu_idle[0].by_class.sync.gaps, 3);
    let i = rule(&a, "gpu-idle")[0];
    assert_eq!(i.location.line, Some(64));
    let dd = data!(i, GpuIdle);
    assert_eq!(dd.blocking_call.as_deref(), Some("cudaMemcpy"));
    assert_eq!(js(dd.location_source), "callsite");
}

#[test]
fn gpu_idle_other_class_is_one_session_insight_without_a_line() {
    // Kernels on stream 8 launched long before they run (waiting on events): gaps with work
    // already queued.
    let mut b = B::new();
    let mut t = MS;
    for _ in 0..5 {
        let c = kern(&mut b, "k", 8, t, t + 100 * US);
        api_rec(&mut b, "cudaLaunchKernel", 10 * US, 12 * US, c, 1);
        t += 150 * US;
    }
    let a = b.analyze();
    assert_eq!(a.gpu_idle[0].by_class.other.gaps, 4);
    let v = rule(&a, "gpu-idle");
    assert_eq!(v.len(), 1);
    let i = v[0];
    assert_eq!(i.location.file, "<unknown>");
    assert_eq!(i.location.line, None);
    assert_eq!(i.impact_ns, 200 * US);
    assert_eq!(js(data!(i, GpuIdle).class), "other");
    assert!(
        i.title
            .starts_with("GPU idle × 4 · 200.0µs with work already queued"),
        "{}",
        i.title
    );
}

/// Launches slower than the kernels they launch (as `examples/launch_bound.cu` on the H100: a
/// 7 µs launch of a 1 µs kernel): each call starts before the GPU goes idle but ends after, so
/// the gap is the host's (`launch`), not work that was already queued (`other`).
#[test]
fn gpu_idle_counts_a_launch_still_running_when_the_gpu_went_idle_as_launch() {
    let mut b = B::new();
    let st = b.user_stack("/src/loop.cu", 54, "main");
    let mut t = MS;
    for i in 0..6 {
        // The call runs [t, t + 7 µs); its kernel [t + 8, t + 9 µs); the next call starts at
        // t + 7 µs, before this kernel ends, and returns at t + 14 µs.
        launch(
            &mut b,
            "tick",
            (t, t + 7 * US),
            t + 8 * US,
            t + 9 * US,
            (i == 0).then_some(st),
        );
        t += 7 * US;
    }
    let a = b.analyze();
    let d = &a.gpu_idle[0];
    assert_eq!(d.gaps, 5);
    assert_eq!((d.by_class.launch.gaps, d.by_class.other.gaps), (5, 0));
    assert_eq!(d.by_class.launch.idle_ns, 5 * 6 * US);
}

#[test]
fn gpu_idle_locates_unsampled_launches_by_kernel_then_by_next_sync() {
    // Only the first launch of `step_k` was sampled (the recorder samples launches): the others
    // take its line.
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "train_step");
    let t = launch_loop(&mut b, MS, 1, 20, Some(st));
    launch_loop(&mut b, t + 27 * US, 9, 20, None);
    let a = b.analyze();
    let i = rule(&a, "gpu-idle")[0];
    assert_eq!(i.location.line, Some(30));
    assert_eq!(js(data!(i, GpuIdle).location_source), "kernel_callsites");
    assert!(
        i.detail.contains("sampled launches of the same kernel"),
        "{}",
        i.detail
    );
    // No call sites at all (older recorders): the next sync with a stack on the thread.
    let mut b = B::new();
    let sst = b.user_stack("/src/app.cu", 54, "step");
    let end = launch_loop(&mut b, MS, 10, 20, None);
    b.sync(
        SyncKind::StreamSynchronize,
        end + US,
        end + 2 * US,
        Some(sst),
    );
    let a = b.analyze();
    let i = rule(&a, "gpu-idle")[0];
    assert_eq!(i.location.line, Some(54));
    assert_eq!(js(data!(i, GpuIdle).location_source), "next_sync");
    assert!(i.detail.contains("line approximate"), "{}", i.detail);
}

#[test]
fn gpu_idle_finds_launch_calls_whatever_the_correlation_order() {
    // The same loop with correlation ids reversed (and a gap in them): the API calls are found by
    // id, not by position.
    let build = |remap: fn(u32) -> u32| {
        let mut b = B::new();
        let st = b.user_stack("/src/app.cu", 30, "train_step");
        launch_loop(&mut b, MS, 10, 20, Some(st));
        for r in &mut b.recs {
            match r {
                Record::Kernel(k) => k.corr = remap(k.corr),
                Record::Api(a) => a.corr = remap(a.corr),
                Record::Callsite(c) => c.corr = remap(c.corr),
                _ => {}
            }
        }
        b.analyze()
    };
    let straight = build(|c| c);
    let reversed = build(|c| 1000 - 7 * c);
    for a in [&straight, &reversed] {
        assert_eq!(a.gpu_idle[0].by_class.launch.gaps, 9);
        assert_eq!(rule(a, "gpu-idle")[0].location.line, Some(30));
    }
}

#[test]
fn gpu_idle_folds_classes_of_one_line_into_one_insight() {
    // Per iteration: a kernel, a late launch (next sync: :54) and a sync at :54 covering a gap.
    let mut b = B::new();
    let sst = b.user_stack("/src/app.cu", 54, "step");
    let mut t = MS;
    for _ in 0..4 {
        launch(&mut b, "a", (t - 7 * US, t - 2 * US), t, t + 100 * US, None);
        let l = t + 130 * US;
        launch(
            &mut b,
            "b",
            (l, l + 5 * US),
            l + 10 * US,
            l + 110 * US,
            None,
        );
        let e = l + 110 * US;
        sync_on(
            &mut b,
            1,
            SyncKind::StreamSynchronize,
            e - 10 * US,
            e + 200 * US,
            Some(sst),
        );
        t = e + 205 * US;
    }
    let a = b.analyze();
    let c = &a.gpu_idle[0].by_class;
    assert_eq!((c.launch.gaps, c.sync.gaps), (4, 3));
    let v = rule(&a, "gpu-idle");
    assert_eq!(v.len(), 1, "one insight per line: {:#?}", v);
    let dd = data!(v[0], GpuIdle);
    assert_eq!(dd.classes.len(), 2);
    assert_eq!(
        js(dd.class),
        "sync",
        "the class with the most idle time names it"
    );
    assert_eq!(v[0].impact_ns, 4 * 40 * US + 3 * 205 * US);
}

#[test]
fn gpu_idle_utilization_series_has_exact_shares() {
    // Active range 3000 ns = 30 chunks of 100 ns: busy [0,1450) and [2425,3000).
    let mut b = B::new();
    kern(&mut b, "a", 7, 10_000, 11_450);
    kern(&mut b, "b", 8, 12_425, 13_000);
    let a = b.analyze();
    let d = &a.gpu_idle[0];
    assert_eq!((d.active_ns, d.busy_ns, d.idle_ns), (3000, 2025, 975));
    assert_eq!(d.active_start_offset_ns, 0);
    assert_eq!(d.by_class.kernel_wait.gaps, 1, "975 ns: under the floor");
    let u = &d.utilization;
    assert_eq!(u.len(), 30);
    assert!(u[..14].iter().all(|c| c.busy_share == 1.0 && !c.low));
    assert_eq!(
        (u[14].busy_ns, u[14].busy_share, u[14].low),
        (50, 0.5, false)
    );
    assert!(u[15..24].iter().all(|c| c.busy_ns == 0 && c.low));
    assert_eq!((u[24].busy_ns, u[24].busy_share), (75, 0.75));
    assert_eq!(u[24].start_offset_ns, 2400);
    assert!(u[25..].iter().all(|c| c.busy_share == 1.0));
    assert_eq!(d.low_utilization_chunks, 9);
    assert_eq!(u.iter().map(|c| c.busy_ns).sum::<u64>(), d.busy_ns);
    // Concurrent kernels count once; a range shorter than 30 ns has no series.
    let mut b = B::new();
    kern(&mut b, "a", 7, 0, 20);
    kern(&mut b, "b", 8, 0, 20);
    let a = b.analyze();
    assert_eq!(a.gpu_idle[0].busy_ns, 20);
    assert!(a.gpu_idle[0].utilization.is_empty());
}

#[test]
fn gpu_idle_is_per_device_and_survives_odd_records() {
    let mut b = B::new();
    kern(&mut b, "a", 7, 1000, 2000);
    let c = kern(&mut b, "b", 7, 50_000, 40_000); // ends before it starts
    api_rec(&mut b, "cudaLaunchKernel", 1500, 500, c, 1); // so does its launch call
    b.recs.push(Record::Kernel(Kernel {
        name: StrId(0),
        start: 5000,
        end: 9000,
        dev: 1,
        ctx: 2,
        stream: 3,
        corr: 0,
        ..Kernel::default()
    }));
    let a = b.analyze();
    assert_eq!(a.gpu_idle.len(), 2);
    let d0 = &a.gpu_idle[0];
    assert_eq!(
        (d0.device, d0.active_ns, d0.busy_ns, d0.gaps),
        (0, 49_000, 1000, 1)
    );
    assert_eq!(
        d0.by_class.other.gaps, 1,
        "its launch call began before the gap"
    );
    let d1 = &a.gpu_idle[1];
    assert_eq!(
        (d1.device, d1.active_ns, d1.busy_ns, d1.gaps),
        (1, 4000, 4000, 0)
    );
    // No GPU work: no summary, and none in the JSON.
    let a = B::new().analyze();
    assert!(a.gpu_idle.is_empty());
    assert!(js(&a).get("gpu_idle").is_none());
}

// ---------------------------------------------------------------------------------------------
// launch-bound
// ---------------------------------------------------------------------------------------------

/// `n` launches of `name`, one every 20 µs: a 6 µs launch call, the kernel 1 µs after it returns,
/// running 2 µs (short) — or 7 µs for the first `long` launches. Call sites at `/src/app.cu:40`.
fn tiny_launches(b: &mut B, name: &str, t0: u64, n: usize, long: usize, st: Option<StackId>) {
    for i in 0..n {
        let a = t0 + i as u64 * 20 * US;
        let k = a + 7 * US;
        let d = if i < long { 7 * US } else { 2 * US };
        launch(b, name, (a, a + 6 * US), k, k + d, st);
    }
}

#[test]
fn launch_bound_fires_at_100_launches_with_stats() {
    let run = |n: usize| {
        let mut b = B::new();
        let st = b.user_stack("/src/app.cu", 40, "step");
        tiny_launches(&mut b, "void tiny<float>(float*, int)", MS, n, 0, Some(st));
        b.analyze()
    };
    assert!(rule(&run(99), "launch-bound").is_empty(), "99 launches");
    let a = run(100);
    let v = rule(&a, "launch-bound");
    assert_eq!(v.len(), 1);
    let i = v[0];
    assert_eq!(i.location.line, Some(40));
    assert_eq!(i.count, 100);
    // Recoverable: launch − kernel = 4 µs per launch, except the first (no idle before it).
    assert_eq!(i.impact_ns, 99 * 4 * US);
    assert_eq!(i.window_ns, 99 * 20 * US + 2 * US);
    assert_eq!(i.severity, Severity::Medium);
    assert_eq!(
        i.title,
        "Launch-bound × 100 @ app.cu:40 · tiny runs 2.0µs but takes 6.0µs to launch · ~396.0µs recoverable"
    );
    let d = data!(i, LaunchBound);
    assert_eq!((d.launches, d.short_launches), (100, 100));
    let k = &d.kernels[0];
    assert_eq!(k.name, "void tiny<float>(float*, int)");
    assert_eq!(
        (k.kernel.median_ns, k.launch.median_ns, k.queue.median_ns),
        (2 * US, 6 * US, US)
    );
    assert_eq!(k.launch.p99_ns, 6 * US);
    assert_eq!(k.short_share_of_kernel_time, 1.0);
    assert!((k.busy_share - 200.0 / 1982.0).abs() < 1e-12);
    assert_eq!(js(d.location_source), "callsite");
    assert!(i.fix.contains("CUDA graph"));
}

#[test]
fn launch_bound_needs_half_short_launches_and_an_idle_gpu() {
    let short = |long: usize| {
        let mut b = B::new();
        tiny_launches(&mut b, "tiny", MS, 100, long, None);
        rule(&b.analyze(), "launch-bound").len()
    };
    assert_eq!(short(50), 1, "50 of 100 short");
    assert_eq!(short(51), 0, "49 of 100 short");
    // A long kernel on another stream keeps the device busy over half the span (1982 µs).
    let busy = |d: u64| {
        let mut b = B::new();
        tiny_launches(&mut b, "tiny", MS, 100, 0, None);
        kern(&mut b, "long", 8, MS + 7 * US, MS + 7 * US + d);
        rule(&b.analyze(), "launch-bound").len()
    };
    assert_eq!(busy(800 * US), 1);
    // tiny kernels outside [7 µs, 7 µs + d) add 2 µs each to the busy time.
    assert_eq!(
        busy(1000 * US),
        0,
        "busy 1000 + 50 × 2 µs of 1982 µs: over half"
    );
    // Launches without an API record do not count.
    let mut b = B::new();
    tiny_launches(&mut b, "tiny", MS, 100, 0, None);
    let last_api = b
        .recs
        .iter()
        .rposition(|r| matches!(r, Record::Api(_)))
        .unwrap();
    b.recs.remove(last_api);
    assert!(
        rule(&b.analyze(), "launch-bound").is_empty(),
        "99 recorded launches"
    );
}

#[test]
fn launch_bound_recoverable_time_is_bounded_by_the_idle_before_each_kernel() {
    // 1 µs kernels, 10 µs launch calls, but only 3 µs idle between kernels (calls overlap).
    let mut b = B::new();
    for i in 0..100u64 {
        let k = MS + i * 4 * US;
        launch(&mut b, "tiny", (k - 11 * US, k - US), k, k + US, None);
    }
    let a = b.analyze();
    let i = rule(&a, "launch-bound")[0];
    assert_eq!(i.impact_ns, 99 * 3 * US);
    assert_eq!(i.location.file, "<unknown>");
    assert!(
        i.title.starts_with("Launch-bound × 100 · tiny runs"),
        "{}",
        i.title
    );
}

#[test]
fn launch_bound_groups_functions_by_line() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 40, "step");
    let sst = b.user_stack("/src/app.cu", 54, "step");
    tiny_launches(&mut b, "a", MS, 100, 0, Some(st));
    tiny_launches(&mut b, "b", MS + 10 * US, 100, 0, Some(st));
    // Without call sites: the next sync of the launching thread.
    tiny_launches(&mut b, "c", 10 * MS, 100, 0, None);
    b.sync(SyncKind::StreamSynchronize, 13 * MS, 13 * MS + 1, Some(sst));
    let a = b.analyze();
    let v = rule(&a, "launch-bound");
    assert_eq!(v.len(), 2, "{:#?}", v);
    let at40 = v.iter().find(|i| i.location.line == Some(40)).unwrap();
    let d = data!(at40, LaunchBound);
    assert_eq!(d.kernels.len(), 2);
    assert_eq!(d.launches, 200);
    assert!(
        at40.title
            .contains("2 kernels mostly shorter than their launch"),
        "{}",
        at40.title
    );
    let at54 = v.iter().find(|i| i.location.line == Some(54)).unwrap();
    assert_eq!(js(data!(at54, LaunchBound).location_source), "next_sync");
}

// ---------------------------------------------------------------------------------------------
// JSON and the real session
// ---------------------------------------------------------------------------------------------

#[test]
fn timeline_rules_serialize_to_json() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "train_step");
    let t = launch_loop(&mut b, MS, 10, 20, Some(st));
    tiny_launches(&mut b, "tiny", t + MS, 100, 0, Some(st));
    pipeline_seq(&mut b, t + 10 * MS, st, 3 * MS, 2 * MS, 3 * MS);
    let a = b.analyze();
    let v = js(&a);
    let dev = &v["gpu_idle"][0];
    assert_eq!(dev["utilization"].as_array().unwrap().len(), 30);
    assert!(dev["by_class"]["launch"]["idle_ns"].is_u64());
    assert!(dev["top_gaps"][0]["class"].is_string());
    let by_rule = |r: &str| {
        v["insights"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["rule"] == r)
            .unwrap_or_else(|| panic!("no {r}"))
            .clone()
    };
    let o = by_rule("no-copy-compute-overlap");
    assert_eq!(o["data"]["rule"], "no-copy-compute-overlap");
    assert_eq!(o["data"]["stages"]["h2d_ns"], 3 * MS);
    assert_eq!(o["data"]["two_streams"]["chunks"], 2);
    assert!(o["data"]["four_streams"]["speedup"].is_f64());
    assert!(o["sync_kind"].is_null() && o["median_kernels_between"].is_null());
    let g = by_rule("gpu-idle");
    assert_eq!(g["data"]["rule"], "gpu-idle");
    assert_eq!(g["data"]["class"], "launch");
    assert_eq!(g["data"]["classes"][0]["class"], "launch");
    let l = by_rule("launch-bound");
    assert_eq!(l["data"]["rule"], "launch-bound");
    assert_eq!(l["data"]["kernels"][0]["launch"]["median_ns"], 6 * US);
    assert_eq!(l["data"]["location_source"], "callsite");
}

#[test]
fn testdata_two_stream_overlap_sequential_part_has_no_overlap() {
    let a = session("two_stream_overlap-1453-");
    let v = rule(&a, "no-copy-compute-overlap");
    // run_sequential only: the chunks of run_overlapped overlap their copies with kernels.
    assert_eq!(v.len(), 1, "{:#?}", v);
    let i = v[0];
    assert_eq!(i.count, 1);
    // No call-site records in this session: the line is that of the sync after the copies.
    let line = example_line(
        "two_stream_overlap.cu",
        "CHECK(cudaEventSynchronize(ev[3]));",
    );
    assert_eq!(i.location.line, Some(line));
    assert!(i.location.file.ends_with("examples/two_stream_overlap.cu"));
    assert!(i
        .location
        .function
        .as_deref()
        .unwrap()
        .starts_with("run_sequential("));
    let d = data!(i, NoCopyComputeOverlap);
    assert_eq!(js(d.location_source), "next_sync");
    // Recorded: H2D 1.23 ms, kernel 1.22 ms, D2H 1.23 ms (64 MiB each way on an H100).
    for stage in [d.stages.h2d_ns, d.stages.kernel_ns, d.stages.d2h_ns] {
        assert!((1_150_000..1_300_000).contains(&stage), "{stage}");
    }
    assert!(
        (1.45..1.55).contains(&d.two_streams.speedup),
        "{}",
        d.two_streams.speedup
    );
    assert!(
        (1.9..2.1).contains(&d.four_streams.speedup),
        "{}",
        d.four_streams.speedup
    );
    assert_eq!(i.impact_ns, d.measured_ns - d.four_streams.time_ns);
    // The summary adds up on the real session.
    let g = &a.gpu_idle[0];
    assert_eq!(g.active_ns, g.busy_ns + g.idle_ns);
    let c = &g.by_class;
    assert_eq!(
        c.kernel_wait.idle_ns + c.launch.idle_ns + c.sync.idle_ns + c.other.idle_ns,
        g.idle_ns
    );
    assert_eq!(
        g.utilization.iter().map(|c| c.busy_ns).sum::<u64>(),
        g.busy_ns
    );
    assert_eq!(
        g.utilization.iter().map(|c| c.duration_ns).sum::<u64>(),
        g.active_ns
    );
    // The host's work between the runs (memset and compare of 64 MiB host buffers) idles the GPU.
    assert!(g.top_gaps[0].duration_ns > 5 * MS);
    assert_eq!(js(g.top_gaps[0].class), "launch");
}

#[test]
fn timeline_rules_survive_random_records() {
    // Deterministic noise: overlapping, inverted and zero-length ops on two devices, duplicate and
    // zero correlation ids, API calls that end before they start, callsites of unknown calls.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut rnd = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    for round in 0..20 {
        let mut b = B::new();
        let st = b.user_stack("/src/app.cu", 10 + round, "f");
        let names = ["a", "b", "c"];
        for i in 0..400u64 {
            let t = rnd(2 * MS);
            let d = rnd(50 * US);
            let (s, e) = if rnd(10) == 0 { (t + d, t) } else { (t, t + d) };
            let corr = match rnd(8) {
                0 => 0,
                1 => 7,
                _ => (i + 1) as u32,
            };
            let dev = rnd(2) as u32;
            match rnd(4) {
                0 | 1 => {
                    let name = b.s(names[rnd(3) as usize]);
                    b.recs.push(Record::Kernel(Kernel {
                        name,
                        start: s,
                        end: e,
                        dev,
                        ctx: dev + 1,
                        stream: 7 + rnd(3) as u32,
                        corr,
                        ..Kernel::default()
                    }));
                }
                2 => b.recs.push(Record::Memcpy(Memcpy {
                    kind: [CopyKind::HtoD, CopyKind::DtoH, CopyKind::DtoD][rnd(3) as usize],
                    start: s,
                    end: e,
                    dev,
                    ctx: dev + 1,
                    stream: 7 + rnd(3) as u32,
                    corr,
                    ..Memcpy::default()
                })),
                _ => sync_on(&mut b, rnd(3), SyncKind::StreamSynchronize, s, e, Some(st)),
            }
            if rnd(2) == 0 {
                let a = rnd(2 * MS);
                let name = ["cudaLaunchKernel", "cudaMemcpy", "cudaMemcpyAsync"][rnd(3) as usize];
                api_rec(
                    &mut b,
                    name,
                    a,
                    a + rnd(20 * US) - rnd(5 * US).min(a),
                    corr,
                    rnd(3),
                );
            }
            if rnd(3) == 0 {
                site(&mut b, corr, "cudaLaunchKernel", st, t);
            }
        }
        let a = b.analyze();
        for d in &a.gpu_idle {
            assert_eq!(d.active_ns, d.busy_ns + d.idle_ns);
            let c = &d.by_class;
            let sum = c.kernel_wait.idle_ns + c.launch.idle_ns + c.sync.idle_ns + c.other.idle_ns;
            assert_eq!(sum, d.idle_ns);
            if !d.utilization.is_empty() {
                assert_eq!(
                    d.utilization.iter().map(|u| u.busy_ns).sum::<u64>(),
                    d.busy_ns
                );
            }
        }
        let lines: Vec<_> = a
            .insights
            .iter()
            .filter(|i| i.rule == "gpu-idle" || i.rule == "launch-bound")
            .map(|i| (i.rule, i.location.clone()))
            .collect();
        for (k, l) in lines.iter().enumerate() {
            assert!(!lines[..k].contains(l), "one insight per rule and line");
        }
        for i in &a.insights {
            assert!((0.0..=1.0).contains(&i.share_of_window));
        }
        serde_json::to_string(&a).unwrap();
    }
}

#[test]
fn gpu_idle_leaves_paused_recording_out_of_idle_time() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "train_step");
    let end1 = launch_loop(&mut b, MS, 10, 20, Some(st));
    // The program pauses recording 1 ms after the first loop and resumes 50 ms later: the 51+ ms
    // without GPU records in between is not idle time, and its chunks are not low.
    let (pause, resume) = (end1 + MS, end1 + 51 * MS);
    b.recs.push(Record::Capture(CaptureState {
        ts: resume,
        recording: true,
    }));
    b.recs.push(Record::Capture(CaptureState {
        ts: pause,
        recording: false,
    }));
    // A resume while recording changes nothing.
    b.recs.push(Record::Capture(CaptureState {
        ts: resume + MS,
        recording: true,
    }));
    launch_loop(&mut b, resume + 10 * US, 10, 20, Some(st));
    let a = b.analyze();
    let d = &a.gpu_idle[0];
    assert_eq!(d.gaps, 18, "9 gaps per loop; the paused one is not a gap");
    assert_eq!(d.idle_ns, 18 * 27 * US);
    assert_eq!(d.paused_ns, resume + 10 * US - end1);
    assert_eq!(d.active_ns, d.busy_ns + d.idle_ns + d.paused_ns);
    assert!(d.top_gaps.iter().all(|g| g.duration_ns == 27 * US));
    let chunks = &d.utilization;
    assert_eq!(chunks.len(), 30);
    // The loops run at 100/127 busy; the chunks inside the pause have no recorded time.
    assert!(chunks.iter().all(|c| !c.low), "{chunks:#?}");
    assert_eq!(js(d)["paused_ns"], js(d.paused_ns));
    let v = rule(&a, "gpu-idle");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].impact_ns, 18 * 27 * US);
}

#[test]
fn a_session_paused_and_never_resumed_is_paused_to_its_end() {
    let mut b = B::new();
    let end1 = launch_loop(&mut b, MS, 4, 20, None);
    b.recs.push(Record::Capture(CaptureState {
        ts: end1,
        recording: false,
    }));
    // Work recorded before the pause took effect arrives later in the file, and a late kernel
    // after it (recorded while pausing) ends the session.
    kern(&mut b, "late_k", 7, end1 + 5 * MS, end1 + 6 * MS);
    let a = b.analyze();
    let d = &a.gpu_idle[0];
    assert_eq!(d.gaps, 3);
    assert_eq!(d.paused_ns, 5 * MS);
    assert_eq!(d.idle_ns, 3 * 27 * US);
}

#[test]
fn an_insight_without_a_sync_names_the_scope_of_its_call_sites() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 30, "train_step");
    let scope = |b: &mut B, ts: u64, name: &str, end: bool| {
        let name = b.s(name);
        b.recs.push(Record::Scope(Scope {
            ts,
            tid: 1,
            name,
            depth: 0,
            end,
            source: ScopeSource::Api,
        }));
    };
    scope(&mut b, MS - 20 * US, "epoch", false);
    scope(&mut b, MS - 15 * US, "train_step", false);
    let end = launch_loop(&mut b, MS, 10, 20, Some(st));
    scope(&mut b, end + US, "train_step", true);
    scope(&mut b, end + 2 * US, "epoch", true);
    let a = b.analyze();
    let v = rule(&a, "gpu-idle");
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].location.line, Some(30));
    // No synchronization at app.cu:30: the scope comes from its launches' call sites.
    assert_eq!(
        v[0].scope.as_deref(),
        Some(&["epoch".to_string(), "train_step".to_string()][..])
    );
}
