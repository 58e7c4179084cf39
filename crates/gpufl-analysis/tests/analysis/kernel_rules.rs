//! Tests of the kernel table and the kernel rules — `low-occupancy`, `register-spill`,
//! `under-filled-grid` — at and around their thresholds, on H100 limits (132 SMs, 64 warps and 32
//! blocks per SM, 65536 registers, 228 KiB of shared memory per SM; occupancy figures derived in
//! src/occupancy_tests.rs).

use super::*;

const US: u64 = 1_000;

macro_rules! data {
    ($i:expr, $v:ident) => {
        match &$i.data {
            Some(RuleData::$v(d)) => d,
            other => panic!("expected {} data, got {:?}", stringify!($v), other),
        }
    };
}

fn h100_limits() -> GpuLimits {
    GpuLimits {
        max_threads_per_block: 1024,
        max_threads_per_sm: 2048,
        max_blocks_per_sm: 32,
        regs_per_sm: 65536,
        regs_per_block: 65536,
        smem_per_sm: 233_472,
        smem_per_block: 49_152,
        smem_per_block_optin: 232_448,
        smem_reserved_per_block: 1024,
        warp_size: 32,
        l2_bytes: 52_428_800,
        ..GpuLimits::default()
    }
}

/// A session on one GPU of compute capability `cc`, with recorded limits or not.
fn session_on(cc: (u32, u32), limits: Option<GpuLimits>) -> B {
    let mut b = B::new();
    if let Record::Header(h) = &mut b.recs[0] {
        h.gpus = vec![Gpu {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            sm_count: 132,
            cc_major: cc.0,
            cc_minor: cc.1,
            limits,
            ..Gpu::default()
        }];
    }
    b
}

fn h100() -> B {
    session_on((9, 0), Some(h100_limits()))
}

/// A launch configuration: `blocks` × `threads`, registers, dynamic shared memory, local memory.
#[derive(Clone, Copy)]
struct Cfg {
    blocks: i32,
    threads: i32,
    regs: u16,
    smem: i32,
    local: u32,
    carveout: Option<u32>,
}

fn cfg(blocks: i32, threads: i32, regs: u16) -> Cfg {
    Cfg {
        blocks,
        threads,
        regs,
        smem: 0,
        local: 0,
        carveout: None,
    }
}

/// A kernel `name` with configuration `c` on `stream` over `[start, end)`; its correlation id.
fn launch(b: &mut B, name: &str, c: Cfg, stream: u32, start: u64, end: u64) -> u32 {
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
        grid: [c.blocks, 1, 1],
        block: [c.threads, 1, 1],
        regs: c.regs,
        smem_static: 0,
        smem_dynamic: c.smem,
        local_mem: c.local,
        smem_executed: c.carveout,
        graph: None,
    }));
    corr
}

/// `n` back-to-back launches of `len` ns from `t` on stream 7; returns the end.
fn launches(b: &mut B, name: &str, c: Cfg, n: u64, t: u64, len: u64) -> u64 {
    for i in 0..n {
        launch(b, name, c, 7, t + i * len, t + (i + 1) * len);
    }
    t + n * len
}

/// A `function` record: the cubin's stack sizes of `name`.
fn function(b: &mut B, name: &str, frame: Option<u32>, stack: Option<u32>) {
    let name = b.s(name);
    b.recs.push(Record::Function(Function {
        name,
        module: 1,
        frame,
        stack,
        source: None,
    }));
}

fn callsite(b: &mut B, corr: u32, stack: StackId) {
    let api = b.s("cudaLaunchKernel");
    b.recs.push(Record::Callsite(Callsite {
        corr,
        api,
        tid: 1,
        ts: 0,
        stack,
        weight: None,
    }));
}

fn js<T: serde::Serialize>(v: T) -> serde_json::Value {
    serde_json::to_value(v).unwrap()
}

// ---------------------------------------------------------------------------------------------
// The kernel table
// ---------------------------------------------------------------------------------------------

#[test]
fn kernel_table_times_shares_and_configurations() {
    let mut b = h100();
    let c = cfg(264, 256, 32);
    // "k": 4 launches of 10, 20, 30, 40 µs, two of them concurrent on streams 7 and 8.
    launch(&mut b, "k", c, 7, 0, 10 * US);
    launch(&mut b, "k", c, 8, 5 * US, 25 * US);
    launch(&mut b, "k", cfg(8, 256, 32), 7, 100 * US, 130 * US);
    launch(&mut b, "k", c, 7, 200 * US, 240 * US);
    // "other": 60 µs; a copy of 100 µs.
    launch(&mut b, "other", c, 7, 300 * US, 360 * US);
    b.recs.push(Record::Memcpy(Memcpy {
        start: 400 * US,
        end: 500 * US,
        ..Memcpy::default()
    }));
    let m = b.model();
    // Two distinct configurations for the five kernels.
    assert_eq!(m.configs().len(), 2);
    assert_eq!(m.kernel_config(2).grid, [8, 1, 1]);
    let a = analyze(&m, &Config::default());
    let t = &a.kernels;
    assert_eq!(t.rows.len(), 2);
    let k = &t.rows[0];
    assert_eq!(k.name, "k");
    assert_eq!((k.launches, k.total_ns, k.mean_ns), (4, 100 * US, 25 * US));
    // Sorted durations 10 20 30 40: median 20 + (30 − 20) / 2 = 25; p99 rank 4 → 40.
    assert_eq!((k.p50_ns, k.p99_ns), (25 * US, 40 * US));
    // Its busy time is a union: [0,25) + [100,130) + [200,240) = 95 µs, not 100.
    assert_eq!(k.busy_ns, 95 * US);
    // The device was busy 95 + 60 + 100 (the copy) = 255 µs.
    assert!((k.busy_share - 95.0 / 255.0).abs() < 1e-9);
    // Two configurations; the row shows the one with the most GPU time (70 µs vs 30).
    assert_eq!((k.configs, k.launch.grid, k.blocks), (2, [264, 1, 1], 264));
    assert_eq!(k.threads_per_block, 256);
    let o = k.occupancy.as_ref().unwrap();
    assert_eq!((o.blocks_per_sm, o.occupancy), (8, 1.0));
    // 264 blocks / (8 × 132) = 0.25 waves.
    assert_eq!(k.waves, Some(0.25));
    assert_eq!(t.limits[0].limits.source, occupancy::LimitsSource::Header);
    let j = js(&a);
    assert_eq!(
        j["kernels"]["rows"][0]["occupancy"]["limited_by"][0],
        "registers"
    );
    assert_eq!(j["kernels"]["rows"][1]["name"], "other");
    assert!(j["kernels"]["rows"][0].get("variants").is_none());
}

#[test]
fn kernel_table_merges_a_name_interned_again_by_a_second_trace_file() {
    let mut b = h100();
    launch(&mut b, "k", cfg(1, 32, 16), 7, 0, 10);
    // A second trace file: its ids restart at 0 and intern "k" again, to another model id.
    b.recs.push(header());
    b.recs.push(Record::Str(StrRecord {
        id: StrId(0),
        s: "k".into(),
    }));
    b.recs.push(Record::Kernel(Kernel {
        name: StrId(0),
        start: 20,
        end: 40,
        block: [32, 1, 1],
        grid: [1, 1, 1],
        ..Kernel::default()
    }));
    let a = b.analyze();
    assert_eq!(a.kernels.rows.len(), 1);
    assert_eq!(a.kernels.rows[0].launches, 2);
}

#[test]
fn old_traces_get_h100_limits_from_the_compute_capability_and_others_none() {
    let mut b = session_on((9, 0), None);
    launches(&mut b, "k", cfg(2000, 256, 128), 10, 0, 100 * US);
    let a = b.analyze();
    assert_eq!(
        a.kernels.limits[0].limits.source,
        occupancy::LimitsSource::ComputeCapability
    );
    assert_eq!(rule(&a, "low-occupancy").len(), 1);
    // An A100 (8.0) session without recorded limits: no occupancy, no occupancy rule.
    let mut b = session_on((8, 0), None);
    launches(&mut b, "k", cfg(2000, 256, 128), 10, 0, 100 * US);
    let a = b.analyze();
    assert!(a.kernels.limits.is_empty());
    assert_eq!(a.kernels.rows[0].occupancy, None);
    assert!(rule(&a, "low-occupancy").is_empty());
}

// ---------------------------------------------------------------------------------------------
// low-occupancy
// ---------------------------------------------------------------------------------------------

#[test]
fn low_occupancy_fires_under_half_with_the_register_change() {
    // 64 registers at 256 threads: exactly 50 % (4 blocks): quiet.
    let mut b = h100();
    launches(&mut b, "k", cfg(2000, 256, 64), 10, 0, 100 * US);
    assert!(rule(&b.analyze(), "low-occupancy").is_empty());
    // 72 registers: 3 blocks = 37.5 %.
    let mut b = h100();
    launches(&mut b, "k", cfg(2000, 256, 72), 10, 0, 100 * US);
    let a = b.analyze();
    let v = rule(&a, "low-occupancy");
    assert_eq!(v.len(), 1);
    let i = v[0];
    // Impact: 1 ms × (1 − 0.375 / 0.5) = 250 µs, of a 1 ms busy device: MEDIUM.
    assert_eq!(i.impact_ns, 250 * US);
    assert_eq!(i.severity, Severity::Medium);
    assert_eq!(i.count, 10);
    assert!(
        i.title.contains("37.5%, limited by registers"),
        "{}",
        i.title
    );
    assert!(i.title.contains("registers 72 → ≤ 64"), "{}", i.title);
    assert!(i.fix.contains("__launch_bounds__(256, 4)"), "{}", i.fix);
    let d = data!(i, LowOccupancy);
    assert_eq!(d.limiter, Limiter::Registers);
    assert_eq!((d.target_regs, d.min_blocks), (Some(64), 4));
    assert_eq!(d.occupancy.blocks_per_sm, 3);
    // No call site: the kernel's name is the location.
    assert_eq!(i.location.origin, FrameOrigin::Kernel);
    assert_eq!(i.location.file, "k");
    assert_eq!(js(d.location_source), "kernel_name");
}

#[test]
fn low_occupancy_severity_follows_the_share_of_busy_time() {
    // 255 registers: 12.5 % → impact 75 % of the kernel's time; the kernel is all the GPU did.
    let mut b = h100();
    launches(&mut b, "k", cfg(2000, 256, 255), 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "low-occupancy")[0];
    assert_eq!(i.impact_ns, 750 * US);
    assert_eq!(i.severity, Severity::High);
    assert_eq!(i.window_ns, 1000 * US);
    // The same kernel beside 9 ms of other GPU work: 7.5 % of the busy time, LOW.
    let mut b = h100();
    let t = launches(&mut b, "k", cfg(2000, 256, 255), 10, 0, 100 * US);
    launches(&mut b, "other", cfg(2000, 256, 32), 9, t, 1000 * US);
    let i = rule(&b.analyze(), "low-occupancy")[0].clone();
    assert_eq!(window_level(&i), Severity::Low);
}

#[test]
fn low_occupancy_needs_a_grid_larger_than_one_wave() {
    // 72 registers: 3 blocks per SM × 132 = 396 blocks at once. A grid of 396 is all resident.
    let mut b = h100();
    launches(&mut b, "k", cfg(396, 256, 72), 10, 0, 100 * US);
    assert!(rule(&b.analyze(), "low-occupancy").is_empty());
    let mut b = h100();
    launches(&mut b, "k", cfg(397, 256, 72), 10, 0, 100 * US);
    assert_eq!(rule(&b.analyze(), "low-occupancy").len(), 1);
}

#[test]
fn low_occupancy_only_for_kernels_that_matter_and_not_for_libraries() {
    // 5 % of the device's busy time matters, 4.9 % does not.
    for (other_us, fires) in [(1900, true), (1950, false)] {
        let mut b = h100();
        let t = launches(&mut b, "k", cfg(2000, 256, 128), 1, 0, 100 * US);
        launches(&mut b, "other", cfg(2000, 256, 32), 1, t, other_us * US);
        let a = b.analyze();
        assert_eq!(!rule(&a, "low-occupancy").is_empty(), fires, "{other_us}");
    }
    // A cuBLAS kernel is tuned on purpose.
    let mut b = h100();
    let name = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_execute_kernel";
    launches(&mut b, name, cfg(2000, 128, 255), 10, 0, 100 * US);
    let a = b.analyze();
    assert!(rule(&a, "low-occupancy").is_empty());
    assert!(a.kernels.rows[0].library);
}

#[test]
fn kernel_insights_need_1_percent_of_the_busy_time() {
    // 96 threads at 64 registers: 8 warps per sub-partition, 32 per SM, 10 blocks of 3 warps =
    // 30 warps = 46.875 %: impact 1 − 0.46875 / 0.5 = 6.25 % of the kernel's 1 ms = 62.5 µs.
    // Beside 9 ms of other work that is 0.625 % of the busy time: no insight; beside 4 ms, 1.25 %.
    for (other_ms, fires) in [(9, false), (4, true)] {
        let mut b = h100();
        let t = launches(&mut b, "k", cfg(2000, 96, 64), 10, 0, 100 * US);
        launches(&mut b, "other", cfg(2000, 256, 32), other_ms, t, 1000 * US);
        let a = b.analyze();
        let v = rule(&a, "low-occupancy");
        assert_eq!(!v.is_empty(), fires, "{other_ms}");
        if fires {
            assert_eq!(v[0].impact_ns, 62_500);
        }
    }
}

#[test]
fn low_occupancy_by_shared_memory_and_by_the_executed_carveout() {
    // 48 KiB dynamic at 128 threads: 4 blocks = 25 %; ≤ 28160 bytes give 8 blocks = 50 %.
    let mut b = h100();
    let c = Cfg {
        smem: 49152,
        ..cfg(2000, 128, 32)
    };
    launches(&mut b, "tile", c, 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "low-occupancy")[0];
    let d = data!(i, LowOccupancy);
    assert_eq!(
        (d.limiter, d.target_smem),
        (Limiter::SharedMemory, Some(28160))
    );
    assert!(
        i.fix.contains("Shared memory 48 KiB → ≤ 27.5 KiB"),
        "{}",
        i.fix
    );
    // 8 KiB at 256 threads in a 32 KiB carveout: 3 blocks = 37.5 %; the largest carveout gives
    // 8 blocks: the fix is the carveout preference.
    let mut b = h100();
    let c = Cfg {
        smem: 8192,
        carveout: Some(32768),
        ..cfg(2000, 256, 32)
    };
    launches(&mut b, "tile", c, 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "low-occupancy")[0];
    assert!(i.detail.contains("32 KiB carveout"), "{}", i.detail);
    assert!(
        i.fix
            .contains("cudaFuncAttributePreferredSharedMemoryCarveout"),
        "{}",
        i.fix
    );
}

#[test]
fn kernel_rules_name_the_launch_line_from_a_sampled_call_site() {
    let mut b = h100();
    let st = b.user_stack("/src/pitfalls.cu", 42, "run");
    let c = cfg(2000, 256, 128);
    let corr = launch(&mut b, "k", c, 7, 0, 100 * US);
    callsite(&mut b, corr, st);
    launches(&mut b, "k", c, 9, 100 * US, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "low-occupancy")[0];
    assert_eq!(i.location.line, Some(42));
    assert!(i.title.contains("@ pitfalls.cu:42"), "{}", i.title);
    assert_eq!(
        js(data!(i, LowOccupancy).location_source),
        "kernel_callsites"
    );
}

// ---------------------------------------------------------------------------------------------
// register-spill
// ---------------------------------------------------------------------------------------------

#[test]
fn register_spill_at_the_cap_is_weighted_by_the_local_share_of_state() {
    let mut b = h100();
    launches(&mut b, "k", cfg(2000, 256, 128), 10, 0, 100 * US);
    assert!(rule(&b.analyze(), "register-spill").is_empty());
    // At the 255-register cap the bytes are spills: weighted, severity by the share.
    let mut b = h100();
    let c = Cfg {
        local: 1024,
        ..cfg(2000, 128, 255)
    };
    launches(&mut b, "k", c, 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "register-spill")[0];
    assert!(i.fix.contains("255-register cap"), "{}", i.fix);
    // 1024 / (1024 + 1020) = 50.1 % of 1 ms → HIGH.
    assert_eq!(i.impact_ns, (1000.0 * US as f64 * 1024.0 / 2044.0) as u64);
    assert_eq!(i.severity, Severity::High);
    assert!(i.title.starts_with("Register spill"), "{}", i.title);
    assert!(
        i.title
            .contains("1024 B of local memory per thread beside 255 registers"),
        "{}",
        i.title
    );
    let d = data!(i, RegisterSpill);
    assert_eq!((d.local_bytes, d.regs, d.spill_evidence), (1024, 255, true));
    assert!(d.weighted_ns > 0);
}

#[test]
fn register_spill_without_evidence_is_low_and_claims_no_time() {
    // 256 B of local memory beside 128 registers: spills or an array, gpufl cannot tell.
    let mut b = h100();
    let c = Cfg {
        local: 256,
        ..cfg(2000, 256, 128)
    };
    launches(&mut b, "k", c, 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "register-spill")[0];
    assert_eq!(i.severity, Severity::Low);
    assert_eq!(i.impact_ns, 0);
    assert!(
        i.title.starts_with("Possible register spill"),
        "{}",
        i.title
    );
    assert!(!i.title.contains("weighted"), "{}", i.title);
    assert!(
        i.title
            .contains("256 B of local memory per thread beside 128 registers"),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains("claims no recoverable time"),
        "{}",
        i.detail
    );
    assert!(i.fix.contains("__launch_bounds__(256, …)"), "{}", i.fix);
    let d = data!(i, RegisterSpill);
    assert_eq!((d.weighted_ns, d.spill_evidence), (0, false));
}

#[test]
fn register_spill_from_a_stack_frame() {
    // 64 registers, no local memory, a 568-byte frame (kernel_pitfalls' `spills` on CUDA 13,
    // capped by __launch_bounds__(256, 4), not by the 255 registers): LOW, no weighted time.
    let mut b = h100();
    function(&mut b, "spills(float*, int)", Some(568), Some(568));
    launches(
        &mut b,
        "spills(float*, int)",
        cfg(2000, 256, 64),
        10,
        0,
        100 * US,
    );
    let a = b.analyze();
    assert_eq!(a.kernels.rows[0].stack_frame, Some(568));
    assert_eq!(a.kernels.rows[0].launch.local_mem, 0);
    let i = rule(&a, "register-spill")[0];
    assert_eq!((i.severity, i.impact_ns), (Severity::Low, 0));
    assert!(
        i.title
            .contains("spills: 568 B of stack frame per thread beside 64 registers"),
        "{}",
        i.title
    );
    assert!(i.detail.contains("spill stores"), "{}", i.detail);
    let d = data!(i, RegisterSpill);
    assert_eq!((d.local_bytes, d.stack_frame, d.regs), (0, Some(568), 64));

    // sinf/cosf's slow path: a 32-byte frame in a clean kernel raises nothing.
    let mut b = h100();
    function(&mut b, "trig(float*)", Some(32), Some(32));
    launches(&mut b, "trig(float*)", cfg(2000, 256, 40), 10, 0, 100 * US);
    assert!(rule(&b.analyze(), "register-spill").is_empty());
    // A frame at the register cap is evidence.
    let mut b = h100();
    function(&mut b, "k", Some(2048), Some(2048));
    launches(&mut b, "k", cfg(2000, 128, 255), 10, 0, 100 * US);
    let i = rule(&b.analyze(), "register-spill")[0].clone();
    // 2048 / (2048 + 1020) = 67 % of the busy time.
    assert_eq!(window_level(&i), Severity::High);
    assert!(i.title.contains("weighted"), "{}", i.title);
    assert!(data!(&i, RegisterSpill).spill_evidence);
    // Only the stack with callees known: it stands in for the frame.
    let mut b = h100();
    function(&mut b, "k", None, Some(128));
    launches(&mut b, "k", cfg(2000, 256, 128), 10, 0, 100 * US);
    assert_eq!(rule(&b.analyze(), "register-spill").len(), 1);
}

#[test]
fn register_spill_from_a_stack_frame_needs_1_percent_and_a_frame() {
    let run = |frame: Option<u32>| {
        let mut b = h100();
        function(&mut b, "k", frame, frame);
        launches(&mut b, "k", cfg(2000, 128, 255), 10, 0, 100 * US);
        rule(&b.analyze(), "register-spill").len()
    };
    // 10 / (10 + 1020) = 0.97 % of the busy time; 11 / 1031 = 1.07 %.
    assert_eq!(run(Some(10)), 0);
    assert_eq!(run(Some(11)), 1);
    assert_eq!(run(Some(0)), 0);
    assert_eq!(run(None), 0);
    // No function record for the kernel: no frame in the table.
    let mut b = h100();
    function(&mut b, "other", Some(512), None);
    launches(&mut b, "k", cfg(2000, 256, 128), 10, 0, 100 * US);
    let a = b.analyze();
    assert_eq!(a.kernels.rows[0].stack_frame, None);
    assert!(rule(&a, "register-spill").is_empty());
}

#[test]
fn register_spill_with_local_memory_keeps_its_wording_and_notes_the_frame() {
    let mut b = h100();
    function(&mut b, "k", Some(96), Some(96));
    // Two modules with the name: the larger frame.
    function(&mut b, "k", Some(32), Some(32));
    let c = Cfg {
        local: 64,
        ..cfg(2000, 128, 255)
    };
    launches(&mut b, "k", c, 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "register-spill")[0];
    assert_eq!(i.impact_ns, (1000.0 * US as f64 * 64.0 / 1084.0) as u64);
    assert!(i.title.starts_with("Register spill"), "{}", i.title);
    assert_eq!(data!(i, RegisterSpill).stack_frame, Some(96));
}

#[test]
fn register_spill_skips_libraries_and_small_kernels() {
    let c = Cfg {
        local: 256,
        ..cfg(2000, 256, 128)
    };
    let mut b = h100();
    launches(&mut b, "void cutlass::Kernel2<x>(int)", c, 10, 0, 100 * US);
    assert!(rule(&b.analyze(), "register-spill").is_empty());
    let mut b = h100();
    let t = launches(&mut b, "k", c, 1, 0, 100 * US);
    launches(&mut b, "other", cfg(2000, 256, 32), 1, t, 1950 * US);
    assert!(rule(&b.analyze(), "register-spill").is_empty());
}

// ---------------------------------------------------------------------------------------------
// under-filled-grid
// ---------------------------------------------------------------------------------------------

#[test]
fn under_filled_grid_fewer_blocks_than_sms() {
    // 118 blocks on 132 SMs: 14 idle = 10.6 % ≥ 10 %: fires; 119 (9.8 %) does not.
    let mut b = h100();
    launches(&mut b, "small", cfg(119, 256, 32), 10, 0, 100 * US);
    assert!(rule(&b.analyze(), "under-filled-grid").is_empty());
    let mut b = h100();
    launches(&mut b, "small", cfg(66, 256, 32), 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "under-filled-grid")[0];
    // 66 of 132 SMs: half the SM time idle, all of the kernel's time alone: 500 µs.
    assert_eq!(i.impact_ns, 500 * US);
    assert_eq!(window_level(i), Severity::Medium);
    assert!(
        i.title.contains("small runs 66 blocks on 132 SMs"),
        "{}",
        i.title
    );
    let d = data!(i, UnderFilledGrid);
    assert_eq!(js(d.shape), "fewer_blocks_than_sms");
    assert_eq!((d.blocks, d.sm_count, d.alone_ns), (66, 132, 1000 * US));
    let mut b = h100();
    launches(&mut b, "small", cfg(118, 256, 32), 10, 0, 100 * US);
    assert_eq!(rule(&b.analyze(), "under-filled-grid").len(), 1);
}

#[test]
fn framework_runtime_kernels_raise_no_kernel_insight() {
    // XLA times its autotuning with a one-thread DelayKernel: nothing the user can change.
    let name = "void stream_executor::gpu::(anonymous namespace)::DelayKernel(int*, long)";
    let mut b = h100();
    launches(&mut b, name, cfg(1, 1, 255), 10, 0, 100 * US);
    function(&mut b, name, Some(2048), Some(2048));
    let a = b.analyze();
    for r in ["under-filled-grid", "low-occupancy", "register-spill"] {
        assert!(rule(&a, r).is_empty(), "{r} fired on a runtime kernel");
    }
    // The same kernel under a user's name fires.
    let mut b = h100();
    launches(&mut b, "delay(int*, long)", cfg(1, 1, 255), 10, 0, 100 * US);
    assert_eq!(rule(&b.analyze(), "under-filled-grid").len(), 1);
}

#[test]
fn under_filled_grid_needs_launches_of_10us() {
    for (len, fires) in [(10 * US, true), (10 * US - 1, false)] {
        let mut b = h100();
        launches(&mut b, "small", cfg(1, 32, 16), 100, 0, len);
        assert_eq!(
            !rule(&b.analyze(), "under-filled-grid").is_empty(),
            fires,
            "{len}"
        );
    }
}

#[test]
fn under_filled_grid_partial_last_wave() {
    // 32 registers at 256 threads: 8 blocks per SM, 1056 a wave.
    // 1056 + 100: 2 waves, the last 9.5 % full: idle (1 − 100/1056) / 2 = 45.3 %.
    let mut b = h100();
    launches(&mut b, "wave", cfg(1156, 256, 32), 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "under-filled-grid")[0];
    let d = data!(i, UnderFilledGrid);
    assert_eq!(js(d.shape), "partial_last_wave");
    assert_eq!(d.blocks_per_wave, Some(1056));
    assert!((d.idle_share - (1.0 - 100.0 / 1056.0) / 2.0).abs() < 1e-9);
    assert!(i.title.contains("last wave is 9% full"), "{}", i.title);
    // A last wave at least half full (1056 + 528) is fine; so is a small tail after many full
    // waves (10 × 1056 + 10: idle (1 − 10/1056) / 11 = 9 % < 10 %).
    for blocks in [1056 + 528, 10 * 1056 + 10, 2 * 1056] {
        let mut b = h100();
        launches(&mut b, "wave", cfg(blocks, 256, 32), 10, 0, 100 * US);
        assert!(
            rule(&b.analyze(), "under-filled-grid").is_empty(),
            "{blocks}"
        );
    }
}

#[test]
fn under_filled_grid_counts_only_time_alone_on_the_gpu() {
    // 66 blocks for 1 ms, with another kernel on stream 8 running through the second half.
    let mut b = h100();
    launches(&mut b, "small", cfg(66, 256, 32), 10, 0, 100 * US);
    launch(&mut b, "other", cfg(66, 256, 32), 8, 500 * US, 1000 * US);
    let a = b.analyze();
    let i = rule(&a, "under-filled-grid")
        .into_iter()
        .find(|i| i.title.contains("small"))
        .unwrap();
    // Alone 500 µs, half of it idle SM time.
    assert_eq!(i.impact_ns, 250 * US);
    assert_eq!(data!(i, UnderFilledGrid).alone_ns, 500 * US);
    // Fully covered by concurrent work: nothing to recover.
    let mut b = h100();
    launches(&mut b, "small", cfg(66, 256, 32), 10, 0, 100 * US);
    launch(&mut b, "other", cfg(66, 256, 32), 8, 0, 1000 * US);
    assert!(rule(&b.analyze(), "under-filled-grid").is_empty());
}

#[test]
fn under_filled_grid_without_limits_uses_the_sm_count() {
    // An A100 session without recorded limits: no occupancy, but fewer blocks than SMs is known.
    let mut b = session_on((8, 0), None);
    launches(&mut b, "small", cfg(8, 256, 32), 10, 0, 100 * US);
    let a = b.analyze();
    let i = rule(&a, "under-filled-grid")[0];
    assert_eq!(data!(i, UnderFilledGrid).blocks_per_wave, None);
}

// ---------------------------------------------------------------------------------------------
// The recorded example (examples/kernel_pitfalls.cu)
// ---------------------------------------------------------------------------------------------

#[test]
fn testdata_kernel_pitfalls_flags_each_planted_kernel_at_its_line() {
    let a = session("kernel_pitfalls-731-");
    // `spills`: nvcc spills it to the ABI stack frame (568 B, 900 B of spill stores), which
    // CUPTI's localMemoryPerThread leaves out (0); the frame comes from the module's cubin.
    for (rule_name, kernel) in [
        ("low-occupancy", "regs_heavy"),
        ("register-spill", "spills"),
        ("under-filled-grid", "small_grid"),
    ] {
        let line = example_line("kernel_pitfalls.cu", &format!("gpufl-example: {rule_name}"));
        let v = rule(&a, rule_name);
        assert_eq!(v.len(), 1, "{rule_name}: {v:#?}");
        assert_eq!(v[0].location.line, Some(line), "{}", v[0].title);
        assert!(v[0].title.contains(kernel), "{}", v[0].title);
    }
    let row = |prefix: &str| {
        a.kernels
            .rows
            .iter()
            .find(|r| r.name.starts_with(prefix))
            .unwrap_or_else(|| panic!("no kernel {prefix}"))
    };
    let heavy = row("regs_heavy(");
    let o = heavy.occupancy.as_ref().unwrap();
    assert!(o.occupancy < 0.5 && o.limiter() == Some(Limiter::Registers));
    assert_eq!(heavy.launch.local_mem, 0);
    assert!(heavy.launch.smem_executed.is_some(), "carveout recorded");
    let spills = row("spills(");
    // Registers as nvcc --resource-usage reports them (64, the __launch_bounds__(256, 4) cap);
    // local memory as CUPTI reports it (0); the stack frame as ptxas and cuobjdump say (568).
    assert_eq!((spills.launch.regs, spills.launch.local_mem), (64, 0));
    assert_eq!(spills.stack_frame, Some(568));
    assert_eq!(row("small_grid(").blocks, 32);
    assert_eq!(
        a.kernels.limits[0].limits.source,
        occupancy::LimitsSource::Header
    );
}
