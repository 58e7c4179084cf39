//! Tests of the streams-seed rules (see the module list in analysis.rs): pageable-async-copy,
//! blocking-copy, default-stream-barrier, device-wide-sync.

use super::*;

// ---------------------------------------------------------------------------------------------
// Helpers: API calls with their GPU work and callsites (all in context 1)
// ---------------------------------------------------------------------------------------------

/// The main thread.
const T1: u64 = 1;

/// An `api` record; returns its correlation id.
fn api(b: &mut B, name: &str, call: (u64, u64), tid: u64) -> u32 {
    let corr = b.next_corr();
    let name = b.s(name);
    b.recs.push(Record::Api(Api {
        domain: ApiDomain::Runtime,
        name,
        cbid: 0,
        start: call.0,
        end: call.1,
        tid,
        corr,
        ret: 0,
    }));
    corr
}

fn callsite(b: &mut B, corr: u32, name: &str, ts: u64, stack: StackId) {
    let api = b.s(name);
    b.recs.push(Record::Callsite(Callsite {
        corr,
        api,
        tid: T1,
        ts,
        stack,
        weight: None,
    }));
}

/// A copy: its API call on `tid`, its GPU record, its callsite when `at` is given.
#[derive(Clone, Copy)]
struct Cp {
    api: &'static str,
    kind: CopyKind,
    src: MemoryKind,
    dst: MemoryKind,
    bytes: u64,
    call: (u64, u64),
    gpu: (u64, u64),
    stream: u32,
    tid: u64,
    at: Option<StackId>,
}

impl Cp {
    /// A pageable 1 MiB host-to-device cudaMemcpyAsync on stream 13 by T1.
    fn new(call: (u64, u64), gpu: (u64, u64), at: Option<StackId>) -> Cp {
        Cp {
            api: "cudaMemcpyAsync",
            kind: CopyKind::HtoD,
            src: MemoryKind::Pageable,
            dst: MemoryKind::Device,
            bytes: 1 << 20,
            call,
            gpu,
            stream: 13,
            tid: T1,
            at,
        }
    }

    fn d2h(mut self) -> Cp {
        self.kind = CopyKind::DtoH;
        (self.src, self.dst) = (MemoryKind::Device, self.src);
        self
    }
}

fn copy(b: &mut B, c: Cp) -> u32 {
    let corr = api(b, c.api, c.call, c.tid);
    b.recs.push(Record::Memcpy(Memcpy {
        kind: c.kind,
        src_kind: c.src,
        dst_kind: c.dst,
        bytes: c.bytes,
        start: c.gpu.0,
        end: c.gpu.1,
        dev: 0,
        ctx: 1,
        stream: c.stream,
        corr,
        graph: None,
    }));
    if let Some(st) = c.at {
        callsite(b, corr, c.api, c.call.0, st);
    }
    corr
}

#[allow(clippy::too_many_arguments)]
fn memset(
    b: &mut B,
    name: &str,
    mem_kind: MemoryKind,
    bytes: u64,
    call: (u64, u64),
    gpu: (u64, u64),
    stream: u32,
    at: Option<StackId>,
) -> u32 {
    let corr = api(b, name, call, T1);
    b.recs.push(Record::Memset(Memset {
        bytes,
        value: 0,
        mem_kind,
        start: gpu.0,
        end: gpu.1,
        dev: 0,
        ctx: 1,
        stream,
        corr,
        graph: None,
    }));
    if let Some(st) = at {
        callsite(b, corr, name, call.0, st);
    }
    corr
}

/// A kernel launch (`cudaLaunchKernel` by `tid`) of kernel "k" on `stream`.
fn launch(
    b: &mut B,
    stream: u32,
    call: (u64, u64),
    gpu: (u64, u64),
    tid: u64,
    at: Option<StackId>,
) -> u32 {
    let corr = api(b, "cudaLaunchKernel", call, tid);
    let name = b.s("k");
    b.recs.push(Record::Kernel(Kernel {
        name,
        start: gpu.0,
        end: gpu.1,
        dev: 0,
        ctx: 1,
        stream,
        corr,
        ..Kernel::default()
    }));
    if let Some(st) = at {
        callsite(b, corr, "cudaLaunchKernel", call.0, st);
    }
    corr
}

/// A synchronization by `tid` (no API record: syncs carry their own times).
fn sync_by(b: &mut B, kind: SyncKind, span: (u64, u64), tid: u64, stack: Option<StackId>) {
    let corr = b.next_corr();
    b.recs.push(Record::Sync(Sync {
        kind,
        start: span.0,
        end: span.1,
        ctx: 1,
        stream: (kind != SyncKind::ContextSynchronize).then_some(13),
        corr,
        tid: Some(tid),
        stack,
        ..Sync::default()
    }));
}

fn role(b: &mut B, stream: u32, role: StreamRole) {
    b.recs.push(Record::Stream(StreamInfo {
        ctx: 1,
        stream,
        role,
    }));
}

/// The session's wall time: one kernel over [0, wall) in another context (2), without a
/// correlation id: it links to no call, thread, line or stream of context 1.
fn wall(b: &mut B, wall: u64) {
    b.recs.push(Record::Kernel(Kernel {
        start: 0,
        end: wall,
        ctx: 2,
        dev: 1,
        stream: 99,
        corr: 0,
        ..Kernel::default()
    }));
}

fn data_of(i: &Insight) -> serde_json::Value {
    serde_json::to_value(i.data.as_ref().expect("rule data")).unwrap()
}

fn at_line<'a>(a: &'a Analysis, r: &str, line: u32) -> Option<&'a Insight> {
    rule(a, r)
        .into_iter()
        .find(|i| i.location.line == Some(line))
}

// ---------------------------------------------------------------------------------------------
// pageable-async-copy
// ---------------------------------------------------------------------------------------------

#[test]
fn pageable_async_copies_group_by_line_with_count_bytes_bandwidth_and_blocked_time() {
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let a = b.user_stack("/src/app.cu", 42, "load(float*, int)");
    let other = b.user_stack("/src/app.cu", 50, "save");
    // Line 42: three pageable H2D copies, 1 MiB each, 100 µs on the GPU, 120 µs in the call.
    for k in 0..3u64 {
        let t = 10_000 + k * 200_000;
        copy(
            &mut b,
            Cp::new((t, t + 120_000), (t + 10_000, t + 110_000), Some(a)),
        );
    }
    // Line 42 also: a pinned async copy (asynchronous for real) and a synchronous cudaMemcpy
    // (blocking-copy's): neither is this rule's.
    let mut pinned = Cp::new((700_000, 700_010), (700_020, 710_000), Some(a));
    pinned.src = MemoryKind::Pinned;
    copy(&mut b, pinned);
    let mut sync = Cp::new((720_000, 800_000), (720_020, 790_000), Some(a));
    sync.api = "cudaMemcpy";
    copy(&mut b, sync);
    // Line 50: one pageable D2H copy through the driver API.
    let mut d2h = Cp::new((900_000, 950_000), (900_100, 940_100), Some(other)).d2h();
    d2h.api = "cuMemcpyDtoHAsync_v2";
    d2h.bytes = 2 << 20;
    copy(&mut b, d2h);

    let an = b.analyze();
    let v = rule(&an, "pageable-async-copy");
    assert_eq!(v.len(), 2, "one insight per line: {v:#?}");
    let i = v[0];
    assert_eq!(i.location.line, Some(42), "ranked first: 360 µs > 50 µs");
    assert_eq!(i.count, 3);
    assert_eq!((i.impact_ns, i.blocked_ns), (360_000, 360_000));
    assert_eq!(
        i.title,
        "Pageable cudaMemcpyAsync × 3 @ app.cu:42 · 360.0µs host blocked"
    );
    assert!(i.detail.contains("at app.cu:42 in load()"), "{}", i.detail);
    // A C/C++ program (no Python frame): the CUDA runtime's words, not PyTorch's.
    assert!(i.fix.contains("cudaMallocHost") && !i.fix.contains("pin_memory()"));
    assert_eq!(i.window_ns, 1_000_000);
    assert_eq!(window_level(i), Severity::Medium, "36 % of the session");
    assert!(i.sync_kind.is_none() && i.median_kernels_between.is_none());
    let d = data_of(i);
    assert_eq!(d["rule"], "pageable-async-copy");
    assert_eq!(d["bytes"], 3u64 << 20);
    assert_eq!(d["copy_ns"], 300_000);
    // 3 MiB over 300 µs of copy time: 3 145 728 B / 300 000 ns.
    assert!((d["bandwidth_gbps"].as_f64().unwrap() - 10.48576).abs() < 1e-9);
    assert_eq!(
        (d["host_to_device"].as_u64(), d["device_to_host"].as_u64()),
        (Some(3), Some(0))
    );

    let j = v[1];
    assert_eq!(j.location.line, Some(50));
    assert_eq!(j.count, 1);
    assert!(j
        .title
        .starts_with("Pageable cuMemcpyDtoHAsync_v2 × 1 @ app.cu:50"));
    assert_eq!(data_of(j)["device_to_host"], 1);
    assert_eq!(j.severity, Severity::Low, "5 % of the session");
}

#[test]
fn pageable_async_copy_needs_pageable_memory_on_either_side() {
    let fires = |src, dst| {
        let mut b = B::new();
        wall(&mut b, 100_000);
        let a = b.user_stack("/src/app.cu", 7, "f");
        let mut c = Cp::new((1000, 2000), (1500, 3000), Some(a));
        (c.src, c.dst) = (src, dst);
        copy(&mut b, c);
        rule(&b.analyze(), "pageable-async-copy").len()
    };
    use MemoryKind::*;
    assert_eq!(fires(Pageable, Device), 1);
    assert_eq!(fires(Device, Pageable), 1);
    assert_eq!(fires(Pinned, Device), 0);
    assert_eq!(fires(Device, Pinned), 0);
    assert_eq!(fires(Managed, Device), 0);
}

#[test]
fn pageable_async_copy_counts_a_staged_copy_once_and_needs_a_callsite() {
    let mut b = B::new();
    wall(&mut b, 100_000);
    let a = b.user_stack("/src/app.cu", 7, "f");
    let corr = copy(&mut b, Cp::new((1000, 9000), (1500, 3000), Some(a)));
    // CUPTI wrote the staged copy as two records of one call.
    b.recs.push(Record::Memcpy(Memcpy {
        kind: CopyKind::HtoD,
        src_kind: MemoryKind::Pageable,
        dst_kind: MemoryKind::Device,
        bytes: 1 << 20,
        start: 4000,
        end: 6000,
        ctx: 1,
        stream: 13,
        corr,
        ..Memcpy::default()
    }));
    // A pageable async copy without a callsite (rate cap, or an older session): no location.
    copy(&mut b, Cp::new((20_000, 21_000), (20_100, 20_900), None));
    let an = b.analyze();
    let v = rule(&an, "pageable-async-copy");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].count, 1, "one API call");
    assert_eq!(v[0].blocked_ns, 8000, "the call's duration, once");
    assert_eq!(data_of(v[0])["bytes"], 2u64 << 20);
    assert_eq!(data_of(v[0])["copy_ns"], 1500 + 2000);
}

#[test]
fn pageable_async_copy_without_a_user_frame_groups_under_driver_internal() {
    let mut b = B::new();
    wall(&mut b, 100_000);
    let f = b.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None);
    // A whole walk: it reached the C runtime's start of the program, no user frame on the way.
    let start = b.native(
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
        "__libc_start_main",
        None,
        None,
    );
    let st = b.stack(&[f, start]);
    copy(&mut b, Cp::new((1000, 2000), (1500, 3000), Some(st)));
    copy(&mut b, Cp::new((5000, 6000), (5500, 7000), Some(st)));
    let an = b.analyze();
    let v = rule(&an, "pageable-async-copy");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].location, SourceLoc::driver_internal());
    assert_eq!(v[0].count, 2);
    assert!(
        v[0].detail.contains("no frame of your code"),
        "{}",
        v[0].detail
    );
}

/// A call site's walk cut short inside CUDA (only CUPTI and driver frames, or none: the first,
/// cold walks of a thread hit the few-µs bound there) names no line: such copies are located as
/// copies without a call site are, not grouped under `<driver-internal>`.
#[test]
fn a_walk_cut_short_in_cuda_is_no_location() {
    let mut b = B::new();
    wall(&mut b, 100_000);
    let cupti = b.native("/opt/cuda/lib64/libcupti.so.13", "??", None, None);
    let drv = b.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None);
    let cut = b.stack(&[cupti, drv]);
    let empty = b.stack(&[]);
    let user = b.native("/app/loop", "main", Some("/app/loop.cu"), Some(30));
    let whole = b.stack(&[cupti, drv, user]);
    copy(&mut b, Cp::new((1000, 2000), (1500, 3000), Some(cut)));
    copy(&mut b, Cp::new((5000, 6000), (5500, 7000), Some(empty)));
    copy(&mut b, Cp::new((9000, 10_000), (9500, 11_000), Some(whole)));
    let an = b.analyze();
    let v = rule(&an, "pageable-async-copy");
    assert_eq!(v.len(), 1, "{v:#?}");
    assert_eq!(v[0].location.file, "/app/loop.cu");
    assert_eq!(v[0].count, 1, "the cut walks are not counted at a line");
    assert!(
        !an.insights
            .iter()
            .any(|i| i.location == SourceLoc::driver_internal()),
        "no <driver-internal> insight from cut walks"
    );
}

/// Three pageable copies at loop.cu:30 of a 10 ms session, 50 µs blocked each, 200 µs apart from
/// 1 ms on; `launches[i]` kernels launched after copy i.
fn copy_loop(launches: &[usize]) -> Analysis {
    let mut b = B::new();
    wall(&mut b, 10_000_000);
    let st = b.user_stack("/src/loop.cu", 30, "step");
    for k in 0..3u64 {
        let t = 1_000_000 + k * 200_000;
        copy(
            &mut b,
            Cp::new((t, t + 50_000), (t + 1000, t + 40_000), Some(st)),
        );
        for j in 0..launches.get(k as usize).copied().unwrap_or(0) as u64 {
            let l = t + 60_000 + j * 10_000;
            launch(&mut b, 13, (l, l + 1000), (l + 2000, l + 9000), T1, None);
        }
    }
    b.analyze()
}

#[test]
fn copy_rules_rate_a_loop_on_its_span_and_a_burst_on_the_session() {
    // A kernel between consecutive copies: a loop, rated on its span, 1 ms → 1.45 ms.
    let a = copy_loop(&[1, 1]);
    let i = rule(&a, "pageable-async-copy")[0];
    assert_eq!((i.impact_ns, i.window_ns), (150_000, 450_000));
    assert_eq!(window_level(i), Severity::Medium, "33 % of the loop");
    assert!((i.share_of_window - 1.0 / 3.0).abs() < 1e-12);
    assert!((i.share_of_wall - 0.015).abs() < 1e-12);
    assert!(
        i.detail.contains("(33.3% of its loop's span)"),
        "{}",
        i.detail
    );
    // No GPU work between the copies (a burst, e.g. a model's upload), or a median of 0.5 launch
    // between them: rated on the whole session.
    for launches in [&[0, 0][..], &[1, 0]] {
        let a = copy_loop(launches);
        let i = rule(&a, "pageable-async-copy")[0];
        assert_eq!(i.window_ns, 10_000_000, "{launches:?}");
        assert_eq!(i.severity, Severity::Low);
        assert!(i.detail.contains("(1.5% of the session)"), "{}", i.detail);
    }
}

// ---------------------------------------------------------------------------------------------
// blocking-copy
// ---------------------------------------------------------------------------------------------

/// A session with one synchronous copy at /src/app.cu:9 (call 10 µs → 60 µs).
fn one_sync_copy(kind: CopyKind, bytes: u64) -> Analysis {
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let a = b.user_stack("/src/app.cu", 9, "f");
    let mut c = Cp::new((10_000, 60_000), (20_000, 55_000), Some(a));
    (c.api, c.kind, c.bytes, c.stream) = ("cudaMemcpy", kind, bytes, 7);
    c.src = MemoryKind::Pinned;
    copy(&mut b, c);
    b.analyze()
}

#[test]
fn blocking_copy_ignores_host_to_device_copies_of_64_kib_or_less() {
    assert!(rule(&one_sync_copy(CopyKind::HtoD, 64 * 1024), "blocking-copy").is_empty());
    let a = one_sync_copy(CopyKind::HtoD, 64 * 1024 + 1);
    let v = rule(&a, "blocking-copy");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].blocked_ns, 50_000, "the call's duration");
    assert_eq!(
        v[0].title,
        "Blocking cudaMemcpy × 1 @ app.cu:9 · 50.0µs host blocked"
    );
    // Device to host: no exemption, whatever the size.
    assert_eq!(
        rule(&one_sync_copy(CopyKind::DtoH, 4), "blocking-copy").len(),
        1
    );
    // Device to device: no host synchronization (CUDA's API synchronization behavior).
    assert!(rule(&one_sync_copy(CopyKind::DtoD, 1 << 30), "blocking-copy").is_empty());
}

#[test]
fn blocking_copy_ranks_lines_by_blocked_time_and_counts_memsets_of_host_memory_only() {
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let a = b.user_stack("/src/io.cu", 20, "read_back");
    let m = b.user_stack("/src/io.cu", 30, "clear");
    let d = b.user_stack("/src/io.cu", 40, "clear_device");
    for k in 0..2u64 {
        let t = 100_000 * (k + 1);
        let mut c = Cp::new((t, t + 80_000), (t + 1000, t + 79_000), Some(a)).d2h();
        c.api = "cudaMemcpy";
        copy(&mut b, c);
    }
    // Pinned memset: blocks (200 µs); device memset: asynchronous for the host (not reported).
    memset(
        &mut b,
        "cudaMemset",
        MemoryKind::Pinned,
        4096,
        (500_000, 700_000),
        (500_100, 699_000),
        7,
        Some(m),
    );
    memset(
        &mut b,
        "cudaMemset",
        MemoryKind::Device,
        1 << 26,
        (800_000, 800_020),
        (800_100, 900_000),
        7,
        Some(d),
    );
    let an = b.analyze();
    let v = rule(&an, "blocking-copy");
    let lines: Vec<_> = v
        .iter()
        .map(|i| (i.location.line, i.count, i.impact_ns))
        .collect();
    assert_eq!(
        lines,
        vec![(Some(30), 1, 200_000), (Some(20), 2, 160_000)],
        "ranked by blocked time; the device memset is not a blocking call"
    );
    let dm = data_of(v[0]);
    assert_eq!(
        (dm["memsets"].as_u64(), dm["sync_copies"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(v[0].severity, Severity::Medium, "20 % of the session");
    let dc = data_of(v[1]);
    assert_eq!(dc["rule"], "blocking-copy");
    assert_eq!(
        (dc["sync_copies"].as_u64(), dc["call_ns"].as_u64()),
        (Some(2), Some(160_000))
    );
    assert_eq!(dc["copy_then_wait"], 0);
    assert_eq!(dc["pageable"], 2);
    assert!(
        v[1].detail
            .contains("2 synchronous copies at io.cu:20 in read_back()"),
        "{}",
        v[1].detail
    );
}

/// `.item()`-style: a pageable D2H cudaMemcpyAsync at `copy_line` (call 100 µs → 130 µs), then a
/// StreamSynchronize (140 µs → 400 µs) by `sync_tid` at `sync_line`, optionally with another sync
/// (thread T1, line 99) in between.
fn copy_then_wait(copy_line: u32, sync_line: u32, sync_tid: u64, between: bool) -> Analysis {
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let c = b.user_stack("/home/u/train.py", copy_line, "train_step");
    let s = if sync_line == copy_line {
        c
    } else {
        b.user_stack("/home/u/train.py", sync_line, "train_step")
    };
    let mut cp = Cp::new((100_000, 130_000), (110_000, 125_000), Some(c)).d2h();
    cp.bytes = 4;
    copy(&mut b, cp);
    if between {
        let o = b.user_stack("/home/u/train.py", 99, "log");
        sync_by(
            &mut b,
            SyncKind::StreamSynchronize,
            (132_000, 135_000),
            T1,
            Some(o),
        );
    }
    sync_by(
        &mut b,
        SyncKind::StreamSynchronize,
        (140_000, 400_000),
        sync_tid,
        Some(s),
    );
    b.analyze()
}

#[test]
fn blocking_copy_treats_an_async_copy_waited_on_at_its_line_as_one_blocking_copy() {
    let an = copy_then_wait(12, 12, T1, false);
    let v = rule(&an, "blocking-copy");
    assert_eq!(v.len(), 1);
    let i = v[0];
    assert_eq!(i.location.line, Some(12));
    assert_eq!(i.count, 1);
    assert_eq!(
        i.blocked_ns,
        30_000 + 260_000,
        "the copy call plus the wait"
    );
    assert!(
        i.detail.contains("copy then wait: .item()/.cpu()-style"),
        "{}",
        i.detail
    );
    assert_eq!(
        i.title,
        "Blocking cudaMemcpyAsync + sync × 1 @ train.py:12 · 290.0µs host blocked"
    );
    let d = data_of(i);
    assert_eq!(
        (d["copy_then_wait"].as_u64(), d["waits"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        (d["call_ns"].as_u64(), d["wait_ns"].as_u64()),
        (Some(30_000), Some(260_000))
    );
    assert_eq!(d["pageable"], 1);
    // A C/C++ program: the CUDA runtime's words, not PyTorch's `.item()`.
    assert!(i.fix.contains("cudaMemcpyAsync") && !i.fix.contains(".item()"));
    // Not counted twice: the pageable copy is blocking-copy's, not pageable-async-copy's.
    assert!(rule(&an, "pageable-async-copy").is_empty());
    // The sync itself is still attributed as a sync.
    assert_eq!(rule(&an, "sync-attribution").len(), 1);
}

#[test]
fn blocking_copy_pairs_only_a_wait_at_the_same_line_on_the_same_thread_right_after() {
    for (what, an) in [
        ("other line", copy_then_wait(12, 13, T1, false)),
        ("other thread", copy_then_wait(12, 12, 2, false)),
        ("a sync in between", copy_then_wait(12, 12, T1, true)),
    ] {
        assert!(rule(&an, "blocking-copy").is_empty(), "{what}");
        let p = rule(&an, "pageable-async-copy");
        assert_eq!(p.len(), 1, "{what}: an ordinary pageable async copy");
        assert_eq!(p[0].blocked_ns, 30_000, "{what}");
    }
}

#[test]
fn blocking_copy_counts_each_copy_of_a_wait_and_the_wait_once() {
    // `.tolist()` of two tensors at one line: two copies, one sync; twice (a loop).
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let c = b.user_stack("/home/u/train.py", 20, "step");
    for k in 0..2u64 {
        let t = 100_000 + k * 300_000;
        copy(
            &mut b,
            Cp::new((t, t + 10_000), (t + 1000, t + 9000), Some(c)).d2h(),
        );
        copy(
            &mut b,
            Cp::new((t + 20_000, t + 30_000), (t + 21_000, t + 29_000), Some(c)).d2h(),
        );
        sync_by(
            &mut b,
            SyncKind::StreamSynchronize,
            (t + 40_000, t + 140_000),
            T1,
            Some(c),
        );
    }
    let an = b.analyze();
    let v = rule(&an, "blocking-copy");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].count, 4);
    let d = data_of(v[0]);
    assert_eq!(
        (d["waits"].as_u64(), d["wait_ns"].as_u64()),
        (Some(2), Some(200_000))
    );
    assert_eq!(v[0].blocked_ns, 4 * 10_000 + 200_000);
}

// ---------------------------------------------------------------------------------------------
// default-stream-barrier
// ---------------------------------------------------------------------------------------------

/// A default-stream kernel D on stream 7 (launched at 1 µs, on the GPU 2 µs → 12 µs) at
/// helper.cu:8 inside `prepare` called from main.cu:30; then one kernel on each of `others`,
/// launched while D runs, starting at `start` on the GPU.
fn barrier(others: &[u32], start: u64, roles: bool) -> Analysis {
    let mut b = B::new();
    wall(&mut b, 100_000);
    if roles {
        role(&mut b, 7, StreamRole::LegacyDefault);
    }
    let f = [
        b.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None),
        b.native(
            "/opt/app",
            "prepare(float*)",
            Some("/src/helper.cu"),
            Some(8),
        ),
        b.native("/opt/app", "main", Some("/src/main.cu"), Some(30)),
    ];
    let st = b.stack(&f);
    launch(&mut b, 7, (1000, 1010), (2000, 12_000), T1, Some(st));
    for (k, &s) in others.iter().enumerate() {
        let t = 1100 + 100 * k as u64;
        launch(&mut b, s, (t, t + 10), (start, start + 5000), T1, None);
    }
    b.analyze()
}

#[test]
fn default_stream_barrier_needs_two_other_streams_waiting() {
    let one = barrier(&[13], 12_000, true);
    assert!(
        rule(&one, "default-stream-barrier").is_empty(),
        "1 other stream"
    );
    let two = barrier(&[13, 14], 12_000, true);
    let v = rule(&two, "default-stream-barrier");
    assert_eq!(v.len(), 1, "2 other streams");
    let i = v[0];
    // Each kernel was ready at 1.1 µs / 1.2 µs, D ran 2 µs → 12 µs: 10 µs of waiting each.
    assert_eq!(i.impact_ns, 20_000);
    assert_eq!(i.count, 1);
    // The user frame is the line inside the helper that issued the default-stream work.
    assert_eq!(
        (i.location.file.as_str(), i.location.line),
        ("/src/helper.cu", Some(8))
    );
    assert!(
        i.detail.contains("at helper.cu:8 in prepare()"),
        "{}",
        i.detail
    );
    assert!(
        i.title
            .starts_with("Legacy default stream: cudaLaunchKernel × 1 @ helper.cu:8 · 20.0µs"),
        "{}",
        i.title
    );
    assert!(i.fix.contains("--default-stream per-thread") && i.fix.contains("Async"));
    let d = data_of(i);
    assert_eq!(d["rule"], "default-stream-barrier");
    assert_eq!(
        (d["others_wait_ns"].as_u64(), d["own_wait_ns"].as_u64()),
        (Some(20_000), Some(0))
    );
    assert_eq!(
        (d["waiting_ops"].as_u64(), d["other_streams"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        (d["kernels"].as_u64(), d["stream_role_recorded"].as_bool()),
        (Some(1), Some(true))
    );
}

#[test]
fn default_stream_barrier_measures_waiting_so_non_blocking_streams_raise_nothing() {
    // cudaStreamNonBlocking streams start while D runs: nobody waited.
    let a = barrier(&[13, 14], 3000, true);
    assert!(rule(&a, "default-stream-barrier").is_empty());
    // A recorded per-thread default stream is no barrier, even with the same timeline.
    let mut b = B::new();
    role(&mut b, 7, StreamRole::PerThreadDefault);
    launch(&mut b, 7, (1000, 1010), (2000, 12_000), T1, None);
    let st = b.user_stack("/src/a.cu", 1, "f");
    callsite(&mut b, 1, "cudaLaunchKernel", 1000, st);
    launch(&mut b, 13, (1100, 1110), (12_000, 13_000), T1, None);
    launch(&mut b, 14, (1200, 1210), (12_000, 13_000), T1, None);
    assert!(rule(&b.analyze(), "default-stream-barrier").is_empty());
}

#[test]
fn default_stream_barrier_reports_a_line_from_10_us_of_waiting() {
    // Two waiters of 5 µs and 5 µs − late: 10 000 ns at the threshold, 9 999 ns below.
    let run = |late: u64| {
        let mut b = B::new();
        wall(&mut b, 100_000);
        role(&mut b, 7, StreamRole::LegacyDefault);
        let st = b.user_stack("/src/a.cu", 3, "f");
        // Earlier work of streams 13 and 14, still running when D starts (D does not wait on it).
        launch(&mut b, 13, (100, 110), (0, 7000), T1, None);
        launch(&mut b, 14, (200, 210), (0, 7000 + late), T1, None);
        launch(&mut b, 7, (1000, 1010), (2000, 12_000), T1, Some(st));
        // Ready once their stream's earlier work ends (7 µs, 7 µs + late); D ends at 12 µs.
        launch(&mut b, 13, (1100, 1110), (12_000, 13_000), T1, None);
        launch(&mut b, 14, (1200, 1210), (12_000, 13_000), T1, None);
        rule(&b.analyze(), "default-stream-barrier").len()
    };
    assert_eq!(run(0), 1, "10 000 ns");
    assert_eq!(run(1), 0, "9 999 ns");
}

#[test]
fn default_stream_barrier_counts_the_default_streams_own_wait_on_earlier_work() {
    // The seed's trap in a loop: streams 13 and 14 run [0, 20 µs) and [0, 25 µs); then the
    // helper's cudaMemcpy (default stream) is called at 5 µs but can only start at 25 µs.
    let mut b = B::new();
    wall(&mut b, 100_000);
    role(&mut b, 7, StreamRole::LegacyDefault);
    launch(&mut b, 13, (100, 110), (0, 20_000), T1, None);
    launch(&mut b, 14, (200, 210), (0, 25_000), T1, None);
    let st = b.user_stack("/src/helper.cu", 8, "prepare");
    let mut c = Cp::new((5000, 40_000), (25_000, 39_000), Some(st));
    (c.api, c.stream, c.src) = ("cudaMemcpy", 7, MemoryKind::Pinned);
    copy(&mut b, c);
    let an = b.analyze();
    let v = rule(&an, "default-stream-barrier");
    assert_eq!(v.len(), 1);
    let d = data_of(v[0]);
    assert_eq!(
        (d["own_wait_ns"].as_u64(), d["others_wait_ns"].as_u64()),
        (Some(20_000), Some(0))
    );
    assert_eq!(d["copies"], 1);
    assert_eq!(
        v[0].title,
        "Legacy default stream: cudaMemcpy × 1 @ helper.cu:8 · 20.0µs of stream waiting"
    );
    // The same call blocked the host: blocking-copy reports it too, by its call time.
    assert_eq!(rule(&an, "blocking-copy")[0].blocked_ns, 35_000);
}

#[test]
fn default_stream_barrier_without_stream_records_takes_the_synchronous_copies_stream() {
    // An older session: no stream record; a cudaMemcpy on stream 7 marks it as the default stream.
    let mut b = B::new();
    wall(&mut b, 100_000);
    let st = b.user_stack("/src/a.cu", 5, "f");
    let mut c = Cp::new((1000, 1010), (2000, 12_000), Some(st));
    (c.api, c.stream, c.kind, c.src, c.dst) = (
        "cudaMemcpy",
        7,
        CopyKind::DtoD,
        MemoryKind::Device,
        MemoryKind::Device,
    );
    copy(&mut b, c);
    launch(&mut b, 13, (1100, 1110), (12_000, 13_000), T1, None);
    launch(&mut b, 14, (1200, 1210), (12_000, 13_000), T1, None);
    let an = b.analyze();
    let v = rule(&an, "default-stream-barrier");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].impact_ns, 20_000);
    assert_eq!(data_of(v[0])["stream_role_recorded"], false);
    assert!(v[0].detail.contains("inferred"), "{}", v[0].detail);
    // The same trace with an async copy on stream 7: no evidence that 7 is the default stream.
    let mut recs = Vec::new();
    for r in b.recs.iter().cloned() {
        if let Record::Str(mut s) = r {
            if s.s == "cudaMemcpy" {
                s.s = "cudaMemcpyAsync".into();
            }
            recs.push(Record::Str(s));
        } else {
            recs.push(r);
        }
    }
    let an = analyze(&Model::load(recs), &Config::default());
    assert!(rule(&an, "default-stream-barrier").is_empty());
}

#[test]
fn default_stream_barrier_leaves_out_copies_sharing_an_engine_and_locates_unsampled_launches() {
    // D is an H2D copy; the waiters are H2D copies too: they would have queued on the copy engine.
    let mut b = B::new();
    wall(&mut b, 100_000);
    role(&mut b, 7, StreamRole::LegacyDefault);
    let st = b.user_stack("/src/a.cu", 5, "f");
    let mut d = Cp::new((1000, 1010), (2000, 12_000), Some(st));
    (d.stream, d.src) = (7, MemoryKind::Pinned);
    copy(&mut b, d);
    for (k, s) in [13u32, 14].into_iter().enumerate() {
        let t = 1100 + 100 * k as u64;
        let mut x = Cp::new((t, t + 10), (12_000, 13_000), None);
        (x.stream, x.src) = (s, MemoryKind::Pinned);
        copy(&mut b, x);
    }
    assert!(rule(&b.analyze(), "default-stream-barrier").is_empty());

    // Two default-stream launches of kernel "k", only the first sampled: both at its line.
    let mut b = B::new();
    wall(&mut b, 100_000);
    role(&mut b, 7, StreamRole::LegacyDefault);
    let st = b.user_stack("/src/a.cu", 6, "f");
    for (k, at) in [Some(st), None].into_iter().enumerate() {
        let t = k as u64 * 20_000;
        launch(
            &mut b,
            7,
            (t + 1000, t + 1010),
            (t + 2000, t + 12_000),
            T1,
            at,
        );
        launch(
            &mut b,
            13,
            (t + 1100, t + 1110),
            (t + 12_000, t + 13_000),
            T1,
            None,
        );
        launch(
            &mut b,
            14,
            (t + 1200, t + 1210),
            (t + 12_000, t + 13_000),
            T1,
            None,
        );
    }
    let an = b.analyze();
    let v = rule(&an, "default-stream-barrier");
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].count, v[0].impact_ns), (2, 40_000));
}

// ---------------------------------------------------------------------------------------------
// device-wide-sync
// ---------------------------------------------------------------------------------------------

/// T1 launches on stream 13 ([1 µs, 10 µs) on the GPU); thread 2 launches on stream 14 ending at
/// `other_end`; T1 then calls cudaDeviceSynchronize at main.cu:77 over [5 µs, `other_end` + 100).
fn device_sync(other_end: u64, with_api: bool) -> Analysis {
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let st = b.user_stack("/src/main.cu", 77, "main");
    launch(&mut b, 13, (100, 200), (1000, 10_000), T1, None);
    launch(&mut b, 14, (300, 400), (1000, other_end), 2, None);
    sync_by(
        &mut b,
        SyncKind::ContextSynchronize,
        (5000, other_end + 100),
        T1,
        Some(st),
    );
    if !with_api {
        b.recs.retain(|r| !matches!(r, Record::Api(_)));
    }
    b.analyze()
}

#[test]
fn device_wide_sync_reports_the_wait_for_streams_the_caller_did_not_use() {
    let a = device_sync(50_000, true);
    let v = rule(&a, "device-wide-sync");
    assert_eq!(v.len(), 1);
    let i = v[0];
    // The caller's stream was done at 10 µs; the sync went on until stream 14 ended at 50 µs.
    assert_eq!(i.impact_ns, 40_000);
    assert_eq!(i.blocked_ns, 45_100);
    assert_eq!((i.count, i.location.line), (1, Some(77)));
    assert_eq!(i.sync_kind, Some(SyncKind::ContextSynchronize));
    assert_eq!(
        i.title,
        "Device-wide sync × 1 @ main.cu:77 · 40.0µs waiting for other streams"
    );
    assert!(i.fix.contains("cudaStreamSynchronize") && i.fix.contains("cudaEventSynchronize"));
    let d = data_of(i);
    assert_eq!(d["rule"], "device-wide-sync");
    assert_eq!(
        (d["other_streams"].as_u64(), d["unknown_caller"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(d["extra_wait_ns"], 40_000);
}

#[test]
fn device_wide_sync_threshold_and_caller_only_work() {
    // 10 µs + 10 µs − 1 ns after the caller's work: 9 999 ns is below the 10 µs threshold.
    assert!(rule(&device_sync(19_999, true), "device-wide-sync").is_empty());
    assert_eq!(
        rule(&device_sync(20_000, true), "device-wide-sync").len(),
        1
    );
    // Only the caller's stream pending: nothing to narrow.
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let st = b.user_stack("/src/main.cu", 77, "main");
    launch(&mut b, 13, (100, 200), (1000, 50_000), T1, None);
    launch(&mut b, 14, (300, 400), (1000, 3000), 2, None);
    sync_by(
        &mut b,
        SyncKind::ContextSynchronize,
        (5000, 50_100),
        T1,
        Some(st),
    );
    assert!(rule(&b.analyze(), "device-wide-sync").is_empty());
    // The caller issued work to both streams: it needed both.
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let st = b.user_stack("/src/main.cu", 77, "main");
    launch(&mut b, 13, (100, 200), (1000, 10_000), T1, None);
    launch(&mut b, 14, (300, 400), (1000, 50_000), T1, None);
    sync_by(
        &mut b,
        SyncKind::ContextSynchronize,
        (5000, 50_100),
        T1,
        Some(st),
    );
    assert!(rule(&b.analyze(), "device-wide-sync").is_empty());
}

#[test]
fn device_wide_sync_caller_streams_are_those_used_since_its_previous_device_sync() {
    // T1 used stream 14 once, synced the device, then only stream 13; thread 2 now runs long
    // work on stream 14: T1's second sync waits for it needlessly. Three syncs at the line, two
    // (the 2nd and 3rd) waited extra.
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let st = b.user_stack("/src/main.cu", 90, "loop_body");
    launch(&mut b, 14, (100, 200), (1000, 2000), T1, None);
    sync_by(
        &mut b,
        SyncKind::ContextSynchronize,
        (300, 2100),
        T1,
        Some(st),
    );
    for k in 0..2u64 {
        let t = 100_000 * (k + 1);
        launch(&mut b, 13, (t, t + 100), (t + 1000, t + 10_000), T1, None);
        launch(
            &mut b,
            14,
            (t + 200, t + 300),
            (t + 1000, t + 60_000),
            2,
            None,
        );
        sync_by(
            &mut b,
            SyncKind::ContextSynchronize,
            (t + 5000, t + 60_100),
            T1,
            Some(st),
        );
    }
    let an = b.analyze();
    let v = rule(&an, "device-wide-sync");
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].count, v[0].impact_ns), (2, 2 * 50_000));
    assert_eq!(data_of(v[0])["syncs_at_line"], 3);
    assert!(
        v[0].detail
            .starts_with("2 of 3 device-wide syncs at main.cu:90 in loop_body()"),
        "{}",
        v[0].detail
    );
}

/// One thread: a background kernel on stream 14 ([1 µs, 60 µs)), a short kernel on stream 13
/// ([1 µs, 8 µs)) and a 64 KB copy of its result on stream 13 ([8 µs, 10 µs)), D2H unless
/// `download` is false; with `bg_download`, stream 14's result is copied back too ([60 µs, 61
/// µs)). Then cudaDeviceSynchronize at main.cu:97.
fn one_thread_device_sync(download: bool, bg_download: bool) -> Analysis {
    let mut b = B::new();
    wall(&mut b, 1_000_000);
    let st = b.user_stack("/src/main.cu", 97, "main");
    launch(&mut b, 14, (100, 200), (1000, 60_000), T1, None);
    launch(&mut b, 13, (300, 400), (1000, 8000), T1, None);
    let mut c = Cp::new((500, 600), (8000, 10_000), None).d2h();
    (c.bytes, c.dst) = (64 << 10, MemoryKind::Pinned);
    if !download {
        (c.kind, c.dst) = (CopyKind::DtoD, MemoryKind::Device);
    }
    copy(&mut b, c);
    let end = if bg_download {
        let mut d = Cp::new((700, 800), (60_000, 61_000), None).d2h();
        (d.stream, d.dst) = (14, MemoryKind::Pinned);
        copy(&mut b, d);
        61_000
    } else {
        60_000
    };
    sync_by(
        &mut b,
        SyncKind::ContextSynchronize,
        (900, end + 100),
        T1,
        Some(st),
    );
    b.analyze()
}

#[test]
fn device_wide_sync_needs_the_streams_a_thread_copies_results_back_from() {
    // The host reads stream 13's download; the background kernel on 14 was not needed: the sync
    // waited from 10 µs to 60 µs for it.
    let a = one_thread_device_sync(true, false);
    let v = rule(&a, "device-wide-sync");
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].impact_ns, v[0].count), (50_000, 1));
    // Both streams copied back: both needed.
    assert!(rule(&one_thread_device_sync(true, true), "device-wide-sync").is_empty());
    // Nothing copied back: every stream the thread used counts as needed.
    assert!(rule(&one_thread_device_sync(false, false), "device-wide-sync").is_empty());
}

#[test]
fn device_wide_sync_without_api_records_needs_very_different_end_times() {
    // No API records: the caller's streams are unknown. Streams end at 10 µs and 50 µs: 40 of
    // the 45 µs waited came after the first finished: reported, as an upper bound.
    let a = device_sync(50_000, false);
    let v = rule(&a, "device-wide-sync");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].impact_ns, 40_000);
    assert_eq!(data_of(v[0])["unknown_caller"], 1);
    assert!(v[0].detail.contains("unknown"), "{}", v[0].detail);
    // Ends at 10 µs and 14 µs: 4 of 9 µs after the first: not very different.
    assert!(rule(&device_sync(14_000, false), "device-wide-sync").is_empty());
}

// ---------------------------------------------------------------------------------------------
// Robustness and JSON
// ---------------------------------------------------------------------------------------------

#[test]
fn copy_rules_survive_odd_data() {
    let mut b = B::new();
    let st = b.user_stack("/src/a.cu", 1, "f");
    role(&mut b, 7, StreamRole::LegacyDefault);
    // Inverted intervals, corr 0, a callsite whose corr has no GPU record, API records with one
    // corr twice, a device sync without a thread.
    copy(&mut b, Cp::new((500, 100), (900, 300), Some(st)));
    let mut c = Cp::new((1000, 2000), (1500, 1400), Some(st));
    (c.api, c.stream) = ("cudaMemcpy", 7);
    let corr = copy(&mut b, c);
    b.recs.push(Record::Api(Api {
        name: StrId(0),
        start: 10,
        end: 5,
        corr,
        ..Api::default()
    }));
    b.recs.push(Record::Kernel(Kernel {
        start: 50,
        end: 10,
        ctx: 1,
        stream: 7,
        corr: 0,
        ..Kernel::default()
    }));
    callsite(&mut b, 999, "cudaMemcpy", 5, st);
    b.recs.push(Record::Sync(Sync {
        kind: SyncKind::ContextSynchronize,
        start: 3000,
        end: 2000,
        ctx: 1,
        stack: Some(st),
        ..Sync::default()
    }));
    launch(
        &mut b,
        13,
        (u64::MAX - 10, u64::MAX),
        (u64::MAX - 5, u64::MAX),
        T1,
        None,
    );
    let a = b.analyze();
    for i in &a.insights {
        assert!((0.0..=1.0).contains(&i.share_of_wall), "{i:?}");
    }
}

#[test]
fn copy_rule_data_serializes_with_the_rule_tag() {
    let a = copy_then_wait(12, 13, T1, false);
    let v = serde_json::to_value(&a).unwrap();
    let p = v["insights"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["rule"] == "pageable-async-copy")
        .expect("pageable insight");
    assert_eq!(p["data"]["rule"], "pageable-async-copy");
    assert_eq!(p["data"]["api"], "cudaMemcpyAsync");
    assert!(p["data"]["bandwidth_gbps"].is_f64());
    assert_eq!(p["severity"], "LOW");
    assert_eq!(p["location"]["line"], 12);
    let a = device_sync(50_000, true);
    let v = serde_json::to_value(&a).unwrap();
    // Headline or facet of the finding at its line (same cause as the sync's attribution).
    let all: Vec<&serde_json::Value> = v["insights"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|i| std::iter::once(i).chain(i["facets"].as_array().into_iter().flatten()))
        .collect();
    let d = all
        .iter()
        .find(|i| i["rule"] == "device-wide-sync")
        .unwrap();
    assert_eq!(d["sync_kind"], "context_synchronize");
    assert_eq!(d["data"]["syncs_at_line"], 1);
}

// ---------------------------------------------------------------------------------------------
// The real session two_stream_overlap (recorded before callsites and stream records existed)
// ---------------------------------------------------------------------------------------------

fn two_stream_overlap_records() -> Vec<Record> {
    let dir = std::fs::read_dir(testdata())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("two_stream_overlap-1453-")
        })
        .unwrap();
    let mut r = SessionReader::open(&dir).unwrap();
    r.by_ref().collect()
}

#[test]
fn testdata_two_stream_overlap_raises_nothing_from_the_copy_rules_as_recorded() {
    let recs = two_stream_overlap_records();
    let a = analyze(&Model::load(recs), &Config::default());
    for r in [
        "pageable-async-copy",
        "blocking-copy",
        "default-stream-barrier",
        "device-wide-sync",
    ] {
        // No callsites: copies have no location. The device syncs of run_overlapped wait for
        // both of the thread's own streams; the warm-up sync for the thread's one kernel.
        assert!(rule(&a, r).is_empty(), "{r}: {:#?}", rule(&a, r));
    }
}

#[test]
fn testdata_two_stream_overlap_with_callsites_reports_the_sequential_copies_only() {
    let mut recs = two_stream_overlap_records();
    // Give every copy, memset and launch the callsite it would have today: a stack with one user
    // frame at the line of its call in the example (ids far above the file's own).
    let h2d = example_line("two_stream_overlap.cu", "cudaMemcpy(d_in, h_in, bytes");
    let d2h = example_line("two_stream_overlap.cu", "cudaMemcpy(h_out, d_out, bytes");
    let apis: Vec<(u32, String, u64)> = {
        let strs: std::collections::HashMap<u32, String> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Str(s) => Some((s.id.0, s.s.clone())),
                _ => None,
            })
            .collect();
        recs.iter()
            .filter_map(|r| match r {
                Record::Api(a) => Some((a.corr, strs[&a.name.0].clone(), a.start)),
                _ => None,
            })
            .collect()
    };
    let (file, func, name) = (StrId(90_000), StrId(90_001), StrId(90_002));
    recs.push(Record::Str(StrRecord {
        id: file,
        s: "/work/main/examples/two_stream_overlap.cu".into(),
    }));
    recs.push(Record::Str(StrRecord {
        id: func,
        s: "run".into(),
    }));
    recs.push(Record::Str(StrRecord {
        id: name,
        s: "api".into(),
    }));
    let mut n = 0u32;
    for (corr, api, start) in &apis {
        let line = if api == "cudaMemcpy" {
            if n == 0 {
                h2d
            } else {
                d2h
            }
        } else if api.starts_with("cudaMemcpy")
            || api.starts_with("cudaMemset")
            || api == "cudaLaunchKernel"
        {
            1000 + corr
        } else {
            continue;
        };
        n += (api == "cudaMemcpy") as u32;
        let id = 90_000 + corr;
        recs.push(Record::Frame(Frame {
            id: FrameId(id),
            kind: FrameKind::Native,
            module: None,
            offset: None,
            func: Some(func),
            file: Some(file),
            line: Some(line),
            inlined: false,
            text: None,
        }));
        recs.push(Record::Stack(Stack {
            id: StackId(id),
            frames: vec![FrameId(id)],
            via_tid: None,
        }));
        recs.push(Record::Callsite(Callsite {
            corr: *corr,
            api: name,
            tid: 1453,
            ts: *start,
            stack: StackId(id),
            weight: None,
        }));
    }
    assert_eq!(n, 2, "run_sequential's two cudaMemcpy");
    let call_ns = |corr: u32| {
        recs.iter()
            .find_map(|r| match r {
                Record::Api(a) if a.corr == corr => Some(a.end - a.start),
                _ => None,
            })
            .unwrap()
    };
    let copy_corrs: Vec<u32> = apis
        .iter()
        .filter(|a| a.1 == "cudaMemcpy")
        .map(|a| a.0)
        .collect();
    let expect: Vec<u64> = copy_corrs.iter().map(|&c| call_ns(c)).collect();
    let a = analyze(&Model::load(recs), &Config::default());
    assert!(
        (270_000_000..272_000_000).contains(&a.totals.wall_ns),
        "callsites at their calls' times leave the session's 271 ms as they were"
    );

    // Blocking: the two 64 MiB pinned cudaMemcpy of run_sequential, one insight per line, each
    // with its call's duration; the cudaMemset calls (device memory) are not blocking.
    let v = rule(&a, "blocking-copy");
    assert_eq!(v.len(), 2, "{v:#?}");
    for (line, ns) in [(h2d, expect[0]), (d2h, expect[1])] {
        let i = at_line(&a, "blocking-copy", line).expect("a blocking cudaMemcpy");
        assert_eq!((i.count, i.blocked_ns), (1, ns));
        assert_eq!(data_of(i)["bytes"], 64u64 << 20);
        // 64 MiB in about 1.2 ms: tens of GB/s over PCIe / NVLink-C2C.
        let bw = data_of(i)["bandwidth_gbps"].as_f64().unwrap();
        assert!((10.0..200.0).contains(&bw), "{bw}");
        assert_eq!(i.severity, Severity::Low, "a few ms of a 271 ms session");
    }
    // Pinned buffers: no pageable copy. Nothing waited on the default stream (its memsets run
    // between the overlapped runs, after a device sync), and run_overlapped's device sync waits
    // only for the thread's own two streams.
    for r in [
        "pageable-async-copy",
        "default-stream-barrier",
        "device-wide-sync",
    ] {
        assert!(rule(&a, r).is_empty(), "{r}: {:#?}", rule(&a, r));
    }
    assert!(a.insights.iter().all(|i| i.severity != Severity::High));
}

// ---------------------------------------------------------------------------------------------
// host-read
// ---------------------------------------------------------------------------------------------

const US: u64 = 1_000;

/// `steps` iterations of: a 100 µs kernel, then a 4-byte D2H copy (read at `read`), then `idle`
/// of GPU idle until the next step's kernel. Optionally a host-blocking sync at the read's line.
fn read_loop(steps: u64, idle: u64, bytes: u64, synced: bool) -> Analysis {
    let mut b = B::new();
    let read = b.user_stack("train.py", 61, "main");
    let mut t = 0;
    for _ in 0..steps {
        b.kernel(t, t + 100 * US);
        let c = Cp {
            bytes,
            ..Cp::new(
                (t + 10 * US, t + 12 * US),
                (t + 100 * US, t + 101 * US),
                Some(read),
            )
            .d2h()
        };
        copy(&mut b, c);
        if synced {
            b.sync(
                SyncKind::StreamSynchronize,
                t + 12 * US,
                t + 101 * US,
                Some(read),
            );
        }
        t += 101 * US + idle;
    }
    b.analyze()
}

#[test]
fn host_read_names_the_read_line_when_no_sync_records_the_wait() {
    // 10 steps, 400 µs of idle after each read: 9 counted (not the last), 3.6 ms of 4.5 ms.
    let a = read_loop(10, 400 * US, 4, false);
    let i = rule(&a, "host-read");
    assert_eq!(i.len(), 1, "{:?}", a.insights);
    let i = i[0];
    assert_eq!(i.location.line, Some(61));
    assert_eq!(i.count, 10);
    assert_eq!(i.impact_ns, 9 * 400 * US);
    assert_eq!(i.window_ns, 9 * 501 * US + 101 * US - 100 * US);
    assert_eq!(i.severity, Severity::High);
    assert!(
        i.title.starts_with("Host read × 10 @ train.py:61"),
        "{}",
        i.title
    );
    assert!(i.title.contains("4-byte"), "{}", i.title);
    match &i.data {
        Some(RuleData::HostRead(d)) => {
            assert_eq!((d.reads, d.max_bytes, d.reads_then_idle), (10, 4, 9));
            assert_eq!(d.median_idle_ns, 400 * US);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn host_read_leaves_synced_reads_big_copies_and_busy_gpus_alone() {
    // The same loop with a cudaStreamSynchronize at the read's line: in-loop-sync's.
    assert!(rule(&read_loop(10, 400 * US, 4, true), "host-read").is_empty());
    // A bulk copy is not a read of a result.
    assert!(rule(&read_loop(10, 400 * US, 1 << 20, false), "host-read").is_empty());
    // Idle gaps under 5 µs do not count; too few reads do not fire.
    assert!(rule(&read_loop(10, 4 * US, 4, false), "host-read").is_empty());
    assert!(rule(&read_loop(3, 400 * US, 4, false), "host-read").is_empty());
    // Idle under 5 % of the span: 5 µs after each 101 µs step is 4.7 %, 6 µs is 5.6 %.
    assert!(rule(&read_loop(10, 5 * US, 4, false), "host-read").is_empty());
    assert_eq!(rule(&read_loop(10, 6 * US, 4, false), "host-read").len(), 1);
}
