//! Integration tests of gpufl-analysis: the model, totals, user frames, both rules at their
//! thresholds, ranking, and the real sessions of `testdata/`.

use gpufl_analysis::*;
use gpufl_trace::*;
use std::path::PathBuf;

/// The model's stack of a trace stack id: in a one-file trace whose stacks are written in id
/// order, the same index.
fn ix(s: StackId) -> StackIx {
    StackIx::new(s.0).unwrap()
}

// The rules of the streams seed, one module each group (tests/analysis/*.rs).
#[path = "analysis/copy_rules.rs"]
mod copy_rules;
#[path = "analysis/timeline_rules.rs"]
mod timeline_rules;
// The kernel table and the kernel rules (issue 5).
#[path = "analysis/kernel_rules.rs"]
mod kernel_rules;
// gpufl's occupancy against the CUDA runtime's (figures from examples/occupancy_check.cu).
#[path = "analysis/occupancy_runtime.rs"]
mod occupancy_runtime;
// The recorded examples of the streams seed.
#[path = "analysis/testdata_issue5.rs"]
mod testdata_issue5;
// The framework examples of issue 11 (JAX, autograd thread, Trainer, Lightning) and NVTX.
#[path = "analysis/testdata_frameworks.rs"]
mod testdata_frameworks;
#[path = "analysis/testdata_streams.rs"]
mod testdata_streams;
// The telemetry rules (issue 5): throttling, memory pressure, ECC errors, low utilization.
#[path = "analysis/locations.rs"]
mod locations;
#[path = "analysis/scope_rules.rs"]
mod scope_rules;
#[path = "analysis/telemetry_rules.rs"]
mod telemetry_rules;
// Always-on (sampled) sessions: windows, observed time, exact / estimated insights.
#[path = "analysis/always_on.rs"]
mod always_on;
// CUDA graphs (issue 18): replays, graph-replay-gaps, graph kernels and launch-bound.
#[path = "analysis/graph_rules.rs"]
mod graph_rules;
// torch.compile (issue 18): compilations and recompilations at the compiled call's line.
#[path = "analysis/compile_rules.rs"]
mod compile_rules;
// Inside kernels (issue 19): kdetail and kstall records, warp-divergence, uncoalesced-access,
// bank-conflicts, stall-reasons.
#[path = "analysis/detail_rules.rs"]
mod detail_rules;
// The rule table (issue 34): every rule documented in docs/insights.md under its anchor, every
// documented rule in the table, the categories the server groups by.
#[path = "analysis/rule_table.rs"]
mod rule_table;
// Issue 35: blocking-call, and what the host was doing during idle gaps (hostcall and hsample
// records).
#[path = "analysis/host_rules.rs"]
mod host_rules;

// ---------------------------------------------------------------------------------------------
// Helpers: build sessions record by record
// ---------------------------------------------------------------------------------------------

/// Builds a synthetic session. Strings, frames and stacks are interned like the writer does.
struct B {
    recs: Vec<Record>,
    strs: Vec<String>,
    frames: u32,
    stacks: u32,
    corr: u32,
}

fn header() -> Record {
    Record::Header(Box::new(Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        session_id: "test-1-20261122T000000Z".into(),
        app_name: "test".into(),
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    }))
}

impl B {
    fn new() -> B {
        B {
            recs: vec![header()],
            strs: Vec::new(),
            frames: 0,
            stacks: 0,
            corr: 0,
        }
    }

    fn s(&mut self, s: &str) -> StrId {
        if let Some(i) = self.strs.iter().position(|x| x == s) {
            return StrId(i as u32);
        }
        self.strs.push(s.to_string());
        let id = StrId(self.strs.len() as u32 - 1);
        self.recs.push(Record::Str(StrRecord { id, s: s.into() }));
        id
    }

    /// A native frame: (module, func, file, line).
    fn native(
        &mut self,
        module: &str,
        func: &str,
        file: Option<&str>,
        line: Option<u32>,
    ) -> FrameId {
        let f = Frame {
            id: FrameId(self.frames),
            kind: FrameKind::Native,
            module: Some(self.s(module)),
            offset: Some(0x1000),
            func: Some(self.s(func)),
            file: file.map(|f| self.s(f)),
            line,
            inlined: false,
            text: None,
        };
        self.frames += 1;
        self.recs.push(Record::Frame(f));
        FrameId(self.frames - 1)
    }

    fn python(&mut self, func: &str, file: &str, line: u32) -> FrameId {
        let f = Frame {
            id: FrameId(self.frames),
            kind: FrameKind::Python,
            module: None,
            offset: None,
            func: Some(self.s(func)),
            file: Some(self.s(file)),
            line: Some(line),
            inlined: false,
            text: None,
        };
        self.frames += 1;
        self.recs.push(Record::Frame(f));
        FrameId(self.frames - 1)
    }

    fn stack(&mut self, frames: &[FrameId]) -> StackId {
        let id = StackId(self.stacks);
        self.stacks += 1;
        self.recs.push(Record::Stack(Stack {
            id,
            frames: frames.to_vec(),
            via_tid: None,
        }));
        id
    }

    /// A one-frame user stack at `file:line` in `func`.
    fn user_stack(&mut self, file: &str, line: u32, func: &str) -> StackId {
        let a = self.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None);
        let b = self.native("/opt/app/bin/app", func, Some(file), Some(line));
        self.stack(&[a, b])
    }

    fn next_corr(&mut self) -> u32 {
        self.corr += 1;
        self.corr
    }

    fn kernel_on(&mut self, stream: u32, start: u64, end: u64) {
        let corr = self.next_corr();
        let name = self.s("k");
        self.recs.push(Record::Kernel(Kernel {
            name,
            start,
            end,
            dev: 0,
            ctx: 1,
            stream,
            corr,
            ..Kernel::default()
        }));
    }

    fn kernel(&mut self, start: u64, end: u64) {
        self.kernel_on(7, start, end)
    }

    fn sync(&mut self, kind: SyncKind, start: u64, end: u64, stack: Option<StackId>) {
        let corr = self.next_corr();
        self.recs.push(Record::Sync(Sync {
            kind,
            start,
            end,
            ctx: 1,
            stream: Some(7),
            corr,
            tid: Some(1),
            stack,
            ..Sync::default()
        }));
    }

    fn model(&self) -> Model {
        Model::load(self.recs.clone())
    }

    fn analyze(&self) -> Analysis {
        analyze(&self.model(), &Config::default())
    }
}

/// The level of an insight's impact against its rule's own window (`share_of_window`, exact in
/// integers): HIGH above 50 %, MEDIUM above 10 %, LOW otherwise — how the rules' tests check which
/// window a rule measures against. Severity itself is rated on the session's time
/// (`Severity::of_impact`, docs/insights.md "Ranking and severity").
fn window_level(i: &Insight) -> Severity {
    let (x, w) = (i.impact_ns as u128, i.window_ns as u128);
    if w > 0 && x * 2 > w {
        Severity::High
    } else if w > 0 && x * 10 > w {
        Severity::Medium
    } else {
        Severity::Low
    }
}

/// The findings of `rule`, whether headline or merged into another as a facet (same line and
/// cause).
fn rule<'a>(a: &'a Analysis, rule: &str) -> Vec<&'a Insight> {
    a.findings().filter(|i| i.rule == rule).collect()
}

/// A session whose wall time is exactly `wall` ns (one kernel over [0, wall)) with `n` stream
/// syncs at one line, `blocked` ns in all.
fn attribution_session(wall: u64, blocked: u64) -> Analysis {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 10, "f");
    b.kernel(0, wall);
    b.sync(SyncKind::StreamSynchronize, 100, 100 + blocked, Some(st));
    b.analyze()
}

// ---------------------------------------------------------------------------------------------
// Totals and intervals
// ---------------------------------------------------------------------------------------------

#[test]
fn union_with_overlapping_streams_never_exceeds_wall() {
    let mut b = B::new();
    // Stream 7: [0,600) [1000,1600); stream 8: [300,900) [1500,2000): union 900 + 1000.
    b.kernel_on(7, 0, 600);
    b.kernel_on(8, 300, 900);
    b.kernel_on(7, 1000, 1600);
    b.kernel_on(8, 1500, 2000);
    let t = totals(&b.model());
    assert_eq!(t.wall_ns, 2000);
    assert_eq!(t.gpu_busy_ns, 1900);
    assert!((t.gpu_busy_pct - 95.0).abs() < 1e-9);
    // Fully concurrent streams: the sum of kernel times is twice the wall, the union is the wall.
    let mut b = B::new();
    b.kernel_on(7, 0, 1000);
    b.kernel_on(8, 0, 1000);
    let t = totals(&b.model());
    assert_eq!((t.wall_ns, t.gpu_busy_ns), (1000, 1000));
    assert!(t.gpu_busy_pct <= 100.0);
    let mut iv = [(0, 1000), (0, 1000), (500, 1500)];
    assert_eq!(union_ns(&mut iv), 1500);
}

#[test]
fn totals_count_and_exclude_device_side_waits_from_blocked_time() {
    let mut b = B::new();
    let st = b.user_stack("/src/app.cu", 10, "f");
    b.kernel(0, 100);
    b.sync(SyncKind::StreamSynchronize, 100, 150, Some(st));
    b.sync(SyncKind::StreamWaitEvent, 150, 160, None);
    b.sync(SyncKind::ContextSynchronize, 200, 230, None);
    b.recs.push(Record::Memset(Memset {
        start: 300,
        end: 310,
        ctx: 1,
        ..Memset::default()
    }));
    b.recs.push(Record::Memcpy(Memcpy {
        start: 400,
        end: 500,
        ctx: 1,
        ..Memcpy::default()
    }));
    let t = totals(&b.model());
    assert_eq!((t.kernels, t.copies, t.memsets, t.syncs), (1, 1, 1, 3));
    assert_eq!(t.sync_blocked_ns, 50 + 30);
    assert_eq!(t.syncs_with_stack, 1);
    assert_eq!(t.wall_ns, 500);
    assert_eq!(t.gpu_busy_ns, 100 + 10 + 100);
}

// ---------------------------------------------------------------------------------------------
// User frames
// ---------------------------------------------------------------------------------------------

#[test]
fn user_frame_of_a_cpp_stack() {
    let mut b = B::new();
    let f = [
        b.native("/usr/lib/x86_64-linux-gnu/libcupti.so.13", "??", None, None),
        b.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None),
        // Statically linked cudart: in the app's module, but without debug info.
        b.native(
            "/work/build/stream_sync_loop",
            "cudaStreamSynchronize",
            None,
            None,
        ),
        b.native(
            "/work/build/stream_sync_loop",
            "std::function<void()>::operator()",
            Some("/usr/include/c++/13/bits/std_function.h"),
            Some(591),
        ),
        b.native(
            "/work/build/stream_sync_loop",
            "step(CUstream_st*, int)",
            Some("/work/examples/stream_sync_loop.cu"),
            Some(54),
        ),
        b.native(
            "/work/build/stream_sync_loop",
            "main",
            Some("/work/examples/stream_sync_loop.cu"),
            Some(83),
        ),
        b.native(
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "__libc_start_main",
            None,
            None,
        ),
    ];
    let st = b.stack(&f);
    let m = b.model();
    let loc = user_frame(&m, ix(st), &FrameFilter::default());
    assert_eq!(
        loc,
        SourceLoc {
            file: "/work/examples/stream_sync_loop.cu".into(),
            line: Some(54),
            function: Some("step(CUstream_st*, int)".into()),
            origin: FrameOrigin::Native,
            text: None,
            library: None,
        }
    );
    // Excluding the file moves the attribution outwards... to the same file: use a function's file.
    let mut f2 = FrameFilter::default();
    f2.exclude.push("*/stream_sync_loop.cu".into());
    assert_eq!(
        user_frame(&m, ix(st), &f2).origin,
        FrameOrigin::DriverInternal
    );
}

/// The stack of a `tick<<<1, 32>>>(…)` launch as recorded on the H100 (nvcc 13): the launch
/// line is in `main`, not in the host wrapper named like the kernel at its `__global__` line.
#[test]
fn user_frame_of_a_kernel_launch_skips_nvcc_stub_and_wrapper() {
    let mut b = B::new();
    let app = "/work/build/launch_bound";
    let f = [
        b.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None),
        b.native(app, "cudaLaunchKernel", None, None),
        b.native(
            app,
            "__cudaLaunchKernel_helper",
            Some("/usr/local/cuda/bin/../targets/x86_64-linux/include/crt/device_functions.h"),
            Some(2963),
        ),
        b.native(
            app,
            "__device_stub__Z4tickPjj(unsigned int*, unsigned int)",
            Some("/tmp/tmpxft_000005ba_00000000-6_launch_bound.cudafe1.stub.c"),
            Some(13),
        ),
        b.native(
            app,
            "tick(unsigned int*, unsigned int)",
            Some("/work/examples/launch_bound.cu"),
            Some(32),
        ),
        b.native(
            app,
            "main",
            Some("/work/examples/launch_bound.cu"),
            Some(54),
        ),
    ];
    let st = b.stack(&f);
    let m = b.model();
    let loc = user_frame(&m, ix(st), &FrameFilter::default());
    assert_eq!(
        (loc.line, loc.function.as_deref()),
        (Some(54), Some("main"))
    );
}

#[test]
fn user_frame_of_a_python_stack_skips_torch_stdlib_and_site_packages() {
    let mut b = B::new();
    let f = [
        b.native(
            "/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcupti.so.13",
            "??",
            None,
            None,
        ),
        b.native(
            "/venv/lib/python3.12/site-packages/torch/lib/libcudart.so.13",
            "cudaDeviceSynchronize",
            None,
            None,
        ),
        b.native(
            "/venv/lib/python3.12/site-packages/torch/lib/libtorch_cuda.so",
            "c10::cuda::device_synchronize()",
            None,
            None,
        ),
        b.native(
            "/venv/lib/python3.12/site-packages/torch/lib/libtorch_python.so",
            "THCPModule_cudaSynchronize",
            None,
            None,
        ),
        b.python(
            "synchronize",
            "/venv/lib/python3.12/site-packages/torch/cuda/__init__.py",
            1083,
        ),
        b.python(
            "ContextDecorator.inner",
            "/usr/lib/python3.12/contextlib.py",
            81,
        ),
        b.python("train_step", "/home/u/train.py", 45),
        b.python("main", "/home/u/train.py", 63),
        b.python("<module>", "/home/u/train.py", 72),
    ];
    let st = b.stack(&f);
    let m = b.model();
    let loc = user_frame(&m, ix(st), &FrameFilter::default());
    assert_eq!(
        loc,
        SourceLoc {
            file: "/home/u/train.py".into(),
            line: Some(45),
            function: Some("train_step".into()),
            origin: FrameOrigin::Python,
            text: None,
            library: None,
        }
    );
    // Include wins over exclude: attribute to torch's Python, which the user is working on.
    let mut inc = FrameFilter::default();
    inc.include.push("site-packages/torch/cuda".into());
    let loc = user_frame(&m, ix(st), &inc);
    assert_eq!((loc.line, loc.origin), (Some(1083), FrameOrigin::Python));
}

#[test]
fn user_frame_of_a_driver_internal_stack() {
    let mut b = B::new();
    let f = [
        b.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None),
        b.native(
            "/usr/local/cuda/lib64/libcudart.so.13",
            "cudart::contextStateManager::destroy",
            Some("/dvs/p4/cudart/context.cpp"),
            Some(120),
        ),
        b.native("/usr/lib/x86_64-linux-gnu/libc.so.6", "exit", None, None),
        b.native("/work/build/app", "??", None, None),
    ];
    let st = b.stack(&f);
    let m = b.model();
    assert_eq!(
        user_frame(&m, ix(st), &FrameFilter::default()),
        SourceLoc::driver_internal()
    );
    // An undefined stack is driver-internal too.
    assert_eq!(
        user_frame(&m, StackIx::new(99).unwrap(), &FrameFilter::default()).file,
        "<driver-internal>"
    );
}

// ---------------------------------------------------------------------------------------------
// sync-attribution
// ---------------------------------------------------------------------------------------------

#[test]
fn severity_is_the_impacts_share_of_the_session_with_exact_boundaries() {
    // One sync line in a session of 100 µs: its blocked time is its impact.
    let sev = |wall, blocked| {
        let a = attribution_session(wall, blocked);
        let v = rule(&a, "sync-attribution");
        assert_eq!(v.len(), 1);
        assert!((v[0].share_of_session - blocked as f64 / wall as f64).abs() < 1e-12);
        v[0].severity
    };
    assert_eq!(sev(100_000, 5_000), Severity::Low, "exactly 5 % is LOW");
    assert_eq!(sev(100_000, 5_010), Severity::Medium, "5.01 % is MEDIUM");
    assert_eq!(
        sev(100_000, 25_000),
        Severity::Medium,
        "exactly 25 % is MEDIUM"
    );
    assert_eq!(sev(100_000, 25_010), Severity::High, "25.01 % is HIGH");
    assert_eq!(sev(100_000, 5), Severity::Low);
}

#[test]
fn sync_attribution_groups_by_kind_and_line_with_the_seed_title() {
    let mut b = B::new();
    let a = b.user_stack("/home/u/03_pytorch_benchmark.py", 90, "train_step");
    let other = b.user_stack("/home/u/03_pytorch_benchmark.py", 91, "train_step");
    b.kernel(0, 1_000_000_000);
    for i in 0..50 {
        let t = 10_000_000 * i;
        b.sync(SyncKind::ContextSynchronize, t, t + 1_900_000, Some(a));
    }
    b.sync(
        SyncKind::StreamSynchronize,
        900_000_000,
        900_000_100,
        Some(a),
    );
    b.sync(
        SyncKind::StreamSynchronize,
        910_000_000,
        910_000_100,
        Some(other),
    );
    b.sync(SyncKind::StreamSynchronize, 920_000_000, 920_000_100, None);
    let an = b.analyze();
    let v = rule(&an, "sync-attribution");
    assert_eq!(
        v.len(),
        3,
        "(context, :90), (stream, :90), (stream, :91); the stackless sync is left out"
    );
    let top = v[0];
    assert_eq!(
        top.title,
        "ContextSynchronize × 50 @ 03_pytorch_benchmark.py:90 · 95.00ms (9.5% of session)"
    );
    assert_eq!(
        top.detail,
        "95.00ms blocked across 50 calls at 03_pytorch_benchmark.py:90 in train_step()"
    );
    assert_eq!(top.count, 50);
    assert_eq!(top.impact_ns, 95_000_000);
    assert!((top.share_of_wall - 0.095).abs() < 1e-12);
    assert_eq!(top.severity, Severity::Medium, "9.5 % of the session");
    assert_eq!(top.sync_kind, Some(SyncKind::ContextSynchronize));
    assert!(an
        .warnings
        .iter()
        .any(|w| w.contains("1 of 53 synchronizations have no stack")));
}

#[test]
fn sync_attribution_needs_stacks_and_groups_driver_internal_syncs() {
    let mut b = B::new();
    b.kernel(0, 1000);
    b.sync(SyncKind::ContextSynchronize, 100, 200, None);
    let an = b.analyze();
    assert!(!an.has_stacks);
    assert!(an.insights.is_empty());

    let mut b = B::new();
    let f = b.native("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "??", None, None);
    let st = b.stack(&[f]);
    b.kernel(0, 1000);
    b.sync(SyncKind::ContextSynchronize, 100, 200, Some(st));
    b.sync(SyncKind::ContextSynchronize, 300, 400, Some(st));
    b.sync(SyncKind::ContextSynchronize, 500, 600, Some(st));
    let an = b.analyze();
    assert!(an.has_stacks);
    let v = rule(&an, "sync-attribution");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].location.file, "<driver-internal>");
    assert!(
        v[0].title
            .starts_with("ContextSynchronize × 3 @ <driver-internal> · "),
        "{}",
        v[0].title
    );
    assert!(
        rule(&an, "in-loop-sync").is_empty(),
        "driver-internal syncs are not a loop of the user's"
    );
}

// ---------------------------------------------------------------------------------------------
// in-loop-sync
// ---------------------------------------------------------------------------------------------

/// Syncs at one line with `kernels[i]` kernels launched before sync i+1 (sync 0 first). Each
/// iteration: kernels of 100 ns back to back, a sync of 50 ns, then 200 ns until the next launch.
fn loop_session(kernels: &[usize]) -> B {
    let mut b = B::new();
    let st = b.user_stack("/src/loop.cu", 54, "step(CUstream_st*, int)");
    let mut t = 1000;
    b.sync(SyncKind::StreamSynchronize, t, t + 50, Some(st));
    t += 50 + 200;
    for &k in kernels {
        for _ in 0..k {
            b.kernel(t, t + 100);
            t += 100;
        }
        b.sync(SyncKind::StreamSynchronize, t, t + 50, Some(st));
        t += 50 + 200;
    }
    b
}

#[test]
fn in_loop_needs_three_syncs() {
    let two = loop_session(&[10]).analyze();
    assert!(rule(&two, "in-loop-sync").is_empty(), "2 syncs");
    let three = loop_session(&[10, 10]).analyze();
    let v = rule(&three, "in-loop-sync");
    assert_eq!(v.len(), 1, "3 syncs");
    assert_eq!(v[0].count, 3);
    assert_eq!(
        v[0].title,
        "In-loop sync × 3 — likely blocking GPU pipelining"
    );
    assert_eq!(v[0].location.line, Some(54));
    assert!(
        v[0].detail
            .starts_with("150ns blocked across 3 calls at loop.cu:54 in step()"),
        "{}",
        v[0].detail
    );
    assert!(v[0].fix.starts_with("Move the sync outside the loop"));
}

#[test]
fn in_loop_median_threshold() {
    let fires = |k: &[usize]| !rule(&loop_session(k).analyze(), "in-loop-sync").is_empty();
    assert!(!fires(&[2, 2, 2, 2]), "median 2");
    assert!(fires(&[3, 3, 3, 3]), "median 3");
    assert!(!fires(&[2, 3]), "median 2.5");
    assert!(fires(&[3, 2, 3]), "median 3 with one pair below");
    assert!(fires(&[0, 9, 9]));
    let a = loop_session(&[3, 2, 3]).analyze();
    assert_eq!(
        rule(&a, "in-loop-sync")[0].median_kernels_between,
        Some(3.0)
    );
}

#[test]
fn in_loop_counts_by_time_when_correlation_ids_are_unusable() {
    let mut b = loop_session(&[4, 4, 4]);
    for r in &mut b.recs {
        match r {
            Record::Kernel(k) => k.corr = 0,
            Record::Sync(s) => s.corr = 0,
            _ => {}
        }
    }
    let a = b.analyze();
    assert_eq!(
        rule(&a, "in-loop-sync")[0].median_kernels_between,
        Some(4.0)
    );
}

#[test]
fn in_loop_impact_is_blocked_plus_idle_and_severity_is_on_the_loop_span() {
    // Iteration: 3 kernels of 100 ns, sync 50 ns, 200 ns idle before the next launch.
    let a = loop_session(&[3, 3, 3]).analyze();
    let i = rule(&a, "in-loop-sync")[0];
    assert_eq!(i.blocked_ns, 4 * 50);
    assert_eq!(i.gpu_idle_ns, 3 * 200, "idle after every sync but the last");
    assert_eq!(i.impact_ns, 200 + 600);
    // Span: first sync's start to last sync's end.
    assert_eq!(i.window_ns, 3 * (250 + 300) + 50);
    assert_eq!(window_level(i), Severity::Medium, "47 % of the loop");
    assert!((i.share_of_window - 800.0 / 1700.0).abs() < 1e-12);
}

/// 3 syncs of `b` ns at one line, 3 kernels of `d` ns back to back between consecutive syncs, no
/// idle: impact 3b over a window of 3b + 6d.
fn dense_loop(b_ns: u64, d: u64) -> Analysis {
    let mut b = B::new();
    let st = b.user_stack("/src/loop.cu", 7, "f");
    let mut t = 0;
    for n in 0..3 {
        b.sync(SyncKind::StreamSynchronize, t, t + b_ns, Some(st));
        t += b_ns;
        if n < 2 {
            for _ in 0..3 {
                b.kernel(t, t + d);
                t += d;
            }
        }
    }
    b.analyze()
}

#[test]
fn in_loop_severity_boundaries_on_the_loop_span() {
    let sev = |b, d| {
        let a = dense_loop(b, d);
        let i = rule(&a, "in-loop-sync")[0].clone();
        assert_eq!(i.gpu_idle_ns, 0);
        assert_eq!((i.impact_ns, i.window_ns), (3 * b, 3 * b + 6 * d));
        window_level(&i)
    };
    assert_eq!(sev(200, 900), Severity::Low, "600 / 6000: exactly 10 %");
    assert_eq!(sev(201, 900), Severity::Medium, "603 / 6003: 10.04 %");
    assert_eq!(sev(200, 100), Severity::Medium, "600 / 1200: exactly 50 %");
    assert_eq!(sev(201, 100), Severity::High, "603 / 1203");
}

#[test]
fn in_loop_idle_ignores_other_streams_still_running() {
    // A long kernel on stream 8 covers every sync's end: the device is never idle.
    let mut b = loop_session(&[3, 3, 3]);
    b.kernel_on(8, 0, 1_000_000);
    let a = b.analyze();
    assert_eq!(rule(&a, "in-loop-sync")[0].gpu_idle_ns, 0);
}

// ---------------------------------------------------------------------------------------------
// Ranking and JSON
// ---------------------------------------------------------------------------------------------

#[test]
fn insights_are_ranked_by_impact_then_rule_then_location() {
    let mut b = B::new();
    let s1 = b.user_stack("/src/a.cu", 1, "f");
    let s2 = b.user_stack("/src/b.cu", 2, "g");
    let s3 = b.user_stack("/src/c.cu", 3, "h");
    b.kernel(0, 100_000);
    b.sync(SyncKind::StreamSynchronize, 1000, 1100, Some(s2)); // 100
    b.sync(SyncKind::StreamSynchronize, 2000, 2100, Some(s1)); // 100: same impact, a.cu first
    b.sync(SyncKind::StreamSynchronize, 3000, 3500, Some(s3)); // 500
    let a = b.analyze();
    let order: Vec<_> = a
        .insights
        .iter()
        .map(|i| i.location.line.unwrap())
        .collect();
    assert_eq!(order, vec![3, 1, 2]);
    // Equal impact across rules (no idle: in-loop impact = blocked time = the attribution's):
    // "in-loop-sync" sorts before "sync-attribution", so it is the headline of their one finding
    // (same line, same cause) and the attribution its facet.
    let a = dense_loop(200, 900);
    let v: Vec<_> = a.insights.iter().map(|i| (i.rule, i.impact_ns)).collect();
    assert_eq!(v, vec![("in-loop-sync", 600)]);
    let f: Vec<_> = a.insights[0]
        .facets
        .iter()
        .map(|i| (i.rule, i.impact_ns))
        .collect();
    assert_eq!(f, vec![("sync-attribution", 600)]);
}

#[test]
fn analysis_serializes_to_stable_json() {
    let a = loop_session(&[3, 3, 3]).analyze();
    let v = serde_json::to_value(&a).unwrap();
    assert!(v["totals"]["wall_ns"].is_u64());
    assert_eq!(v["has_stacks"], true);
    let i = &v["insights"][0];
    assert_eq!(i["rule"], "in-loop-sync");
    assert_eq!(i["severity"], "HIGH", "rated on the session's time");
    assert_eq!(i["location"]["origin"], "native");
    assert_eq!(i["location"]["line"], 54);
    assert_eq!(i["sync_kind"], "stream_synchronize");
    for key in [
        "title",
        "detail",
        "fix",
        "count",
        "impact_ns",
        "share_of_wall",
        "window_ns",
        "share_of_window",
    ] {
        assert!(!i[key].is_null(), "{key}");
    }
    assert_eq!(
        serde_json::to_value(SourceLoc::driver_internal()).unwrap()["origin"],
        "driver_internal"
    );
}

// ---------------------------------------------------------------------------------------------
// Model robustness and size
// ---------------------------------------------------------------------------------------------

#[test]
fn model_resolves_forward_references_and_flags_unknown_ids() {
    let recs = vec![
        header(),
        // Kernel uses string 0 before it is defined; sync uses stack 5, never defined.
        Record::Kernel(Kernel {
            name: StrId(0),
            start: 10,
            end: 20,
            ctx: 1,
            corr: 1,
            ..Kernel::default()
        }),
        Record::Str(StrRecord {
            id: StrId(0),
            s: "gemm".into(),
        }),
        Record::Kernel(Kernel {
            name: StrId(3),
            start: 30,
            end: 40,
            ctx: 1,
            corr: 2,
            ..Kernel::default()
        }),
        Record::Sync(Sync {
            kind: SyncKind::StreamSynchronize,
            start: 50,
            end: 40,
            corr: 3,
            stack: Some(StackId(5)),
            ..Sync::default()
        }),
    ];
    let m = Model::load(recs);
    let names: Vec<&str> = m.kernels().map(|k| m.str(k.name)).collect();
    assert_eq!(names, vec!["gemm", "?"]);
    let w = m.warnings().join("\n");
    assert!(
        w.contains("1 string(s), 1 stack(s) referenced but never defined"),
        "{w}"
    );
    assert!(w.contains("end before they start"), "{w}");
    let a = analyze(&m, &Config::default());
    assert_eq!(
        rule(&a, "sync-attribution")[0].location.file,
        "<driver-internal>"
    );
    assert_eq!(a.totals.sync_blocked_ns, 0);
}

#[test]
fn model_remaps_ids_of_each_trace_file() {
    // Two files: each restarts interning at 0, with different strings for id 0.
    let file = |name: &str, start: u64| {
        vec![
            header(),
            Record::Str(StrRecord {
                id: StrId(0),
                s: name.into(),
            }),
            Record::Kernel(Kernel {
                name: StrId(0),
                start,
                end: start + 5,
                ctx: 1,
                corr: 1,
                ..Kernel::default()
            }),
            Record::Dropped(Dropped {
                source: "cupti".into(),
                count: 2,
            }),
        ]
    };
    let mut recs = file("first", 0);
    recs.extend(file("second", 100));
    let mut m = Model::load(recs);
    assert_eq!(m.files(), 2);
    let names: Vec<&str> = m.kernels().map(|k| m.str(k.name)).collect();
    assert_eq!(names, vec!["first", "second"]);
    assert_eq!(m.dropped(), 4);
    assert_eq!(m.time_range(), (0, 105));
    m.add_warnings(["reader: block 3 is incomplete".to_string()]);
    assert!(m.warnings().last().unwrap().contains("incomplete"));
    assert!(m
        .warnings()
        .iter()
        .any(|w| w.contains("4 record(s) were lost")));
}

#[test]
fn model_survives_hostile_ids_and_empty_input() {
    let m = Model::load(Vec::new());
    assert!(m.header().is_none());
    let a = analyze(&m, &Config::default());
    assert_eq!(a.totals.wall_ns, 0);
    assert_eq!(a.totals.gpu_busy_pct, 0.0);
    let recs = vec![
        Record::Str(StrRecord {
            id: StrId(u32::MAX - 1),
            s: "x".into(),
        }),
        Record::Stack(Stack {
            id: StackId(4_000_000_000),
            frames: vec![FrameId(3_000_000_000)],
            via_tid: None,
        }),
        Record::Sync(Sync {
            stack: Some(StackId(4_000_000_000)),
            end: 10,
            ..Sync::default()
        }),
    ];
    let m = Model::load(recs);
    assert_eq!(m.sync(0).stack.map(|s| m.stack(s).unwrap().len()), Some(1));
    let a = analyze(&m, &Config::default());
    assert_eq!(a.insights.len(), 1);
}

#[test]
fn model_keeps_at_most_64_devices_and_many_contexts_and_streams() {
    // A hostile trace: every GPU record on its own device, context and stream, each stream with a
    // role record. Per-device work is bounded by the device cap; contexts and streams are hashed.
    let n = 5_000u32;
    let mut recs = vec![Record::Str(StrRecord {
        id: StrId(0),
        s: "k".into(),
    })];
    for i in 0..n {
        recs.push(Record::Stream(gpufl_trace::StreamInfo {
            ctx: i,
            stream: i,
            role: StreamRole::LegacyDefault,
        }));
        recs.push(Record::Kernel(Kernel {
            start: 1_000 + 10 * i as u64,
            end: 1_005 + 10 * i as u64,
            dev: i,
            ctx: i,
            stream: i,
            corr: i + 1,
            ..Kernel::default()
        }));
        recs.push(Record::Telemetry(Box::new(gpufl_trace::Telemetry {
            ts: 1_000 + 10 * i as u64,
            dev: i,
            gpu_util: Some(5),
            ..Default::default()
        })));
    }
    let m = Model::load(recs);
    let max = gpufl_analysis::model::MAX_DEVICES;
    assert_eq!(m.devices().len(), max);
    assert_eq!(m.devices(), (0..max as u32).collect::<Vec<_>>());
    assert_eq!(m.kernel_count(), max);
    assert_eq!(m.telemetry().len(), max);
    assert_eq!(m.device_of_ctx(7), Some(7));
    assert_eq!(m.device_of_ctx(max as u32 + 1), None);
    assert_eq!(m.stream_role(4_999, 4_999), Some(StreamRole::LegacyDefault));
    let left_out = 2 * (n as usize - max);
    assert!(
        m.warnings().iter().any(|w| w.starts_with(&format!(
            "{left_out} GPU record(s) and telemetry sample(s) of devices beyond the first {max}"
        ))),
        "{:?}",
        m.warnings()
    );
    let a = analyze(&m, &Config::default());
    assert_eq!(a.totals.kernels, max as u64);
}

#[test]
fn kernel_table_of_many_names_on_many_devices_counts_each_pair() {
    // 10,000 names on 64 devices: (name, device) cells far outnumber the kernels, so the table
    // numbers only the pairs present; every row must still be right.
    let n = 10_000u32;
    let mut recs = Vec::new();
    for i in 0..n {
        recs.push(Record::Str(StrRecord {
            id: StrId(i),
            s: format!("kernel_{i}"),
        }));
        for rep in 0..2u64 {
            let t = 1_000 + 100 * (2 * i as u64 + rep);
            recs.push(Record::Kernel(Kernel {
                name: StrId(i),
                start: t,
                end: t + 10 + i as u64 % 7,
                dev: i % 64,
                ctx: 1 + i % 64,
                stream: 7,
                corr: 2 * i + rep as u32 + 1,
                grid: [1 + rep as i32, 1, 1],
                block: [32, 1, 1],
                ..Kernel::default()
            }));
        }
    }
    let a = analyze(&Model::load(recs), &Config::default());
    let rows = &a.kernels.rows;
    assert_eq!(rows.len(), n as usize);
    for r in rows {
        let i: u32 = r.name.trim_start_matches("kernel_").parse().unwrap();
        assert_eq!(r.device, i % 64, "{}", r.name);
        assert_eq!(r.launches, 2);
        assert_eq!(r.configs, 2, "two grid sizes");
        assert_eq!(r.total_ns, 2 * (10 + i as u64 % 7));
        assert_eq!(r.variants.iter().map(|v| v.launches).sum::<u64>(), 2);
    }
}

#[test]
fn model_memory_is_at_most_64_bytes_per_record() {
    let mut b = B::new();
    let st = b.user_stack("/src/a.cu", 1, "f");
    let n = 300_000u64;
    for i in 0..n {
        b.kernel(i * 10, i * 10 + 5);
        if i % 100 == 0 {
            b.sync(
                SyncKind::StreamSynchronize,
                i * 10 + 6,
                i * 10 + 9,
                Some(st),
            );
        }
    }
    let m = b.model();
    let records = m.kernel_count() + m.sync_count();
    let per = m.column_bytes() as f64 / records as f64;
    assert!(per <= 64.0, "{per} bytes per record");
}

// ---------------------------------------------------------------------------------------------
// The real sessions of testdata/
// ---------------------------------------------------------------------------------------------

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions")
}

fn session(prefix: &str) -> Analysis {
    let dir = std::fs::read_dir(testdata())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .unwrap_or_else(|| panic!("no session {prefix}* in testdata"));
    let mut r = SessionReader::open(&dir).unwrap();
    let mut m = Model::load(r.by_ref());
    m.add_warnings(r.warnings());
    analyze(&m, &Config::default())
}

/// Line of `needle` in an example (1-based), so the tests follow edits of the examples.
fn example_line(file: &str, needle: &str) -> u32 {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file);
    let text = std::fs::read_to_string(p).unwrap();
    text.lines()
        .position(|l| l.contains(needle))
        .expect("marker line") as u32
        + 1
}

/// The one in-loop-sync insight of a recording of examples/pytorch_train_sync.py (or of the heavy
/// variant, which calls the same `train_step`): at the planted line, in `train_step`, 55 syncs.
fn planted_python_in_loop_sync(a: &Analysis) -> &Insight {
    let line = example_line(
        "pytorch_train_sync.py",
        "torch.cuda.synchronize()  # gpufl-example",
    );
    let v = rule(a, "in-loop-sync");
    assert_eq!(v.len(), 1, "{:#?}", v);
    let i = v[0];
    assert!(i.location.file.ends_with("examples/pytorch_train_sync.py"));
    assert_eq!(i.location.line, Some(line));
    assert_eq!(i.location.function.as_deref(), Some("train_step"));
    assert_eq!(i.location.origin, FrameOrigin::Python);
    assert_eq!(i.count, 55, "5 warmup + 50 steps, two call paths, one line");
    i
}

#[test]
fn testdata_pytorch_train_sync_in_loop_sync_at_train_step() {
    let a = session("pytorch_train_sync-");
    let i = planted_python_in_loop_sync(&a);
    assert_eq!(i.median_kernels_between, Some(52.0));
    assert_eq!(i.sync_kind, Some(SyncKind::ContextSynchronize));
    assert!(i.detail.contains("in train_step()"));
    // Recorded figures: ~0.53 ms blocked + ~8.7 ms GPU idle over a ~94.5 ms loop: 9.8 %.
    assert!(
        i.share_of_window > 0.08 && i.share_of_window < 0.12,
        "{}",
        i.share_of_window
    );
    assert_eq!(a.totals.kernels, 2862);
    assert!(a.has_stacks);
    let sa = rule(&a, "sync-attribution");
    assert!(sa.iter().any(|i| i
        .title
        .starts_with("ContextSynchronize × 55 @ pytorch_train_sync.py:")));
}

#[test]
fn testdata_pytorch_heavy_steps_make_the_planted_sync_high() {
    let a = session("pytorch_train_sync_heavy-");
    let i = planted_python_in_loop_sync(&a);
    let line = i.location.line;
    assert_eq!(window_level(i), Severity::High, "{}", i.share_of_window);
    assert_eq!(a.insights[0].rule, "in-loop-sync", "ranked first");
    // The line blocks ~1.1 s of a ~6.5 s session: between the 10 % and 50 % boundaries.
    let sa = rule(&a, "sync-attribution");
    let planted = sa
        .iter()
        .find(|i| i.location.line == line)
        .expect("the planted line");
    assert_eq!(planted.severity, Severity::Medium, "{}", planted.title);
}

#[test]
fn testdata_stream_sync_loop_in_loop_sync_at_step() {
    let a = session("stream_sync_loop-1427-");
    let line = example_line(
        "stream_sync_loop.cu",
        "cudaStreamSynchronize(stream));  // gpufl-example",
    );
    assert_eq!(line, 54);
    let v = rule(&a, "in-loop-sync");
    assert_eq!(v.len(), 1);
    let i = v[0];
    assert!(i.location.file.ends_with("examples/stream_sync_loop.cu"));
    assert_eq!(i.location.line, Some(line));
    assert!(i.location.function.as_deref().unwrap().starts_with("step("));
    assert_eq!(i.location.origin, FrameOrigin::Native);
    assert_eq!(i.count, 200);
    assert_eq!(i.median_kernels_between, Some(3.0));
    assert!(i.detail.contains(" in step()"), "{}", i.detail);
    assert_eq!(window_level(i), Severity::High);
    assert_eq!(a.insights[0].rule, "in-loop-sync", "ranked first");
}

#[test]
fn testdata_two_stream_overlap_has_no_in_loop_sync_in_the_chunk_loop() {
    let a = session("two_stream_overlap-1453-");
    let sync_line = example_line("two_stream_overlap.cu", "the one sync, after the loop");
    // The chunk loop has no sync: nothing is attributed inside it.
    for i in &a.insights {
        let l = i.location.line.unwrap();
        assert!(!(91..sync_line).contains(&l), "{}", i.title);
    }
    // Recorded with 2 repeats of `run_overlapped`: its one sync after the chunk loop runs twice,
    // below the seed's ">= 3 syncs from one line": the program raises no in-loop sync.
    assert!(rule(&a, "in-loop-sync").is_empty(), "{:#?}", a.insights);
    assert_eq!(rule(&a, "sync-attribution").len(), 3);
}

#[test]
fn testdata_disabled_capture_gives_a_warning_and_no_insight() {
    let a = session("stream_sync_loop-665-");
    assert!(a.insights.is_empty());
    assert!(!a.has_stacks);
    assert!(
        a.warnings.iter().any(|w| w.contains("capture disabled")),
        "{:?}",
        a.warnings
    );
}

#[test]
fn testdata_every_session_analyzes_within_bounds() {
    for e in std::fs::read_dir(testdata()).unwrap() {
        let dir = e.unwrap().path();
        let mut r = SessionReader::open(&dir).unwrap();
        let m = Model::load(r.by_ref());
        let a = analyze(&m, &Config::default());
        assert!(a.totals.gpu_busy_pct <= 100.0);
        assert!(a.totals.gpu_busy_ns <= a.totals.wall_ns);
        for i in &a.insights {
            assert!(
                (0.0..=1.0).contains(&i.share_of_wall) && (0.0..=1.0).contains(&i.share_of_window)
            );
            assert!(i.impact_ns <= i.window_ns.max(a.totals.wall_ns));
        }
    }
}

fn model_of(prefix: &str) -> Model {
    let dir = std::fs::read_dir(testdata())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .unwrap();
    let mut r = SessionReader::open(&dir).unwrap();
    Model::load(r.by_ref())
}

/// The line detail: in the C++ session the event sync in `wait_for` (20 calls, its whole stack,
/// innermost first, up to `main`); in the Trainer session the launches sampled at a line with
/// their kernels' names; no line without a stack-carrying record.
#[test]
fn line_details_of_real_sessions() {
    let m = model_of("cpp_api");
    let lines = gpufl_analysis::lines::line_details(&m, &Config::default());
    let sync = lines
        .iter()
        .find(|l| l.location.function.as_deref() == Some("wait_for"))
        .expect("wait_for's line");
    assert!(sync.location.file.ends_with("cpp_api.cu"));
    assert_eq!(sync.syncs, 20);
    assert!(sync.sync_p50_ns <= sync.sync_p99_ns && sync.sync_p99_ns <= sync.sync_max_ns);
    assert!(sync.sync_blocked_ns >= sync.sync_max_ns);
    let funcs: Vec<&str> = sync
        .stack
        .iter()
        .filter_map(|f| f.function.as_deref())
        .collect();
    let at = |name: &str| funcs.iter().position(|f| f.contains(name));
    let (w, mn) = (at("wait_for").expect("wait_for"), at("main").expect("main"));
    assert!(w < mn, "innermost first: {funcs:?}");
    assert!(lines.iter().all(|l| l.syncs + l.copies + l.launches > 0));

    let m = model_of("hf_trainer");
    let lines = gpufl_analysis::lines::line_details(&m, &Config::default());
    let launch = lines
        .iter()
        .find(|l| l.launches > 0)
        .expect("a line with sampled launches");
    assert!(!launch.kernels.is_empty());
    assert!(launch.kernels.len() <= gpufl_analysis::lines::MAX_KERNELS);
    assert!(launch.launches >= launch.kernels.iter().map(|k| k.launches).sum::<u64>());
    assert!(!launch.stack.is_empty());
    assert!(
        launch.stack.iter().any(|f| f.kind == "python"),
        "a Python frame in the stack"
    );
}
