//! Tests of the telemetry rules (issue 5): `throttling`, `memory-pressure`, `ecc-errors` at their
//! thresholds, `low-utilization` over gpu-idle's chunks, and the per-device telemetry summary.

use super::timeline_rules::{kern, launch, sync_on};
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

/// A telemetry sample of `dev` at `ts`, filled in by `f`.
fn tel(b: &mut B, dev: u32, ts: u64, f: impl FnOnce(&mut Telemetry)) {
    let mut t = Telemetry {
        ts,
        dev,
        ..Telemetry::default()
    };
    f(&mut t);
    b.recs.push(Record::Telemetry(Box::new(t)));
}

/// `n` samples of device 0 every 10 ms, the first `k` with throttle reasons `bits`, the rest with
/// none.
fn throttled(n: u64, k: u64, bits: u64) -> Analysis {
    let mut b = B::new();
    for i in 0..n {
        tel(&mut b, 0, i * 10 * MS, |t| {
            t.throttle = Some(if i < k { bits } else { 0 })
        });
    }
    b.analyze()
}

// ---------------------------------------------------------------------------------------------
// Model and summary
// ---------------------------------------------------------------------------------------------

#[test]
fn telemetry_loads_per_device_without_widening_the_session() {
    let mut b = B::new();
    b.kernel(MS, 2 * MS);
    for i in 0..6u64 {
        tel(&mut b, 1, i * MS, |t| {
            t.gpu_util = Some(10 * i as u32);
            t.mem_used = Some(i << 30);
            t.mem_total = Some(80 << 30);
        });
        tel(&mut b, 0, i * MS, |t| t.temp_c = Some(40 + i as u32));
    }
    let m = b.model();
    assert_eq!(
        m.time_range(),
        (MS, 2 * MS),
        "samples are the recorder's own"
    );
    assert_eq!(m.telemetry().len(), 2);
    let a = analyze(&m, &Config::default());
    assert_eq!(a.totals.wall_ns, MS);
    let t: Vec<&DeviceTelemetry> = a.telemetry.iter().collect();
    assert_eq!((t[0].device, t[1].device), (0, 1));
    assert_eq!(
        (t[1].samples, t[1].period_ns, t[1].span_ns),
        (6, MS, 5 * MS)
    );
    assert_eq!(t[1].start_offset_ns, -(MS as i64));
    let u = t[1].gpu_util_pct.unwrap();
    assert_eq!((u.min, u.mean, u.max), (0.0, 25.0, 50.0));
    assert_eq!(t[1].mem_total_bytes, Some(80 << 30));
    assert!(t[1].temp_c.is_none() && t[0].gpu_util_pct.is_none());
    assert_eq!(t[0].temp_c.unwrap().max, 45.0);
    // In the JSON, only with samples.
    let v = serde_json::to_value(&a).unwrap();
    assert_eq!(v["telemetry"][1]["gpu_util_pct"]["mean"], 25.0);
    let mut plain = B::new();
    plain.kernel(0, MS);
    let v = serde_json::to_value(plain.analyze()).unwrap();
    assert!(v.get("telemetry").is_none(), "{v}");
}

// ---------------------------------------------------------------------------------------------
// throttling
// ---------------------------------------------------------------------------------------------

#[test]
fn throttling_fires_above_five_percent_and_rates_power_and_thermal_apart() {
    use gpufl_trace::throttle as t;
    // Whether it fires; its severity is its impact's (the work slowed down) share of the session.
    let fired = |a: &Analysis| rule(a, "throttling").first().map(|_| ());
    assert_eq!(
        fired(&throttled(100, 5, t::SW_POWER_CAP)),
        None,
        "exactly 5 %"
    );
    assert_eq!(fired(&throttled(100, 6, t::SW_POWER_CAP)), Some(()));
    assert_eq!(
        fired(&throttled(100, 50, t::SW_POWER_CAP)),
        Some(()),
        "power cap half the time"
    );
    assert_eq!(fired(&throttled(100, 51, t::SW_POWER_CAP)), Some(()));
    for hw in [
        t::SW_THERMAL_SLOWDOWN,
        t::HW_THERMAL_SLOWDOWN,
        t::HW_SLOWDOWN,
        t::HW_POWER_BRAKE_SLOWDOWN,
    ] {
        assert_eq!(fired(&throttled(100, 6, hw)), Some(()), "{hw:#x}");
        assert_eq!(fired(&throttled(100, 5, hw)), None, "{hw:#x}");
    }
    // Clock settings and idle clocks are not throttling.
    let settings =
        t::GPU_IDLE | t::APPLICATIONS_CLOCKS_SETTING | t::SYNC_BOOST | t::DISPLAY_CLOCK_SETTING;
    assert_eq!(fired(&throttled(100, 100, settings)), None);
    // 5 % thermal and 10 % power: it fires (15 %), but the hardware share is not above 5 %.
    let mut b = B::new();
    for i in 0..100u64 {
        let bits = match i {
            0..5 => t::SW_THERMAL_SLOWDOWN,
            5..15 => t::SW_POWER_CAP,
            _ => 0,
        };
        tel(&mut b, 0, i * 10 * MS, |x| x.throttle = Some(bits));
    }
    let a = b.analyze();
    let i = rule(&a, "throttling")[0];
    assert_eq!(i.severity, Severity::Low);
    let d = data!(i, Throttling);
    assert_eq!(
        (d.throttled_ns, d.power_ns, d.thermal_ns, d.hardware_ns),
        (150 * MS, 100 * MS, 50 * MS, 50 * MS)
    );
    assert_eq!(d.sampled_ns, 1000 * MS);
    // Without any throttle bitmask: nothing.
    let mut b = B::new();
    tel(&mut b, 0, 0, |x| x.sm_mhz = Some(1000));
    assert!(rule(&b.analyze(), "throttling").is_empty());
}

#[test]
fn throttling_impact_is_busy_time_times_clock_shortfall_at_the_device() {
    let session = |util: Option<u32>, max: Option<u32>| {
        let mut b = B::new();
        for i in 0..10u64 {
            tel(&mut b, 3, i * 10 * MS, |t| {
                t.throttle = Some(if i < 5 { throttle::SW_POWER_CAP } else { 0 });
                t.sm_mhz = Some(if i < 5 { 1500 } else { 2000 });
                t.sm_max_mhz = max;
                t.gpu_util = util;
                t.temp_c = Some(60 + i as u32);
                t.power_mw = Some(700_000);
            });
        }
        b.analyze()
    };
    let a = session(Some(80), Some(2000));
    let v = rule(&a, "throttling");
    assert_eq!(v.len(), 1);
    let i = v[0];
    // 5 samples × 10 ms × 80 % busy × (1 − 1500/2000).
    assert_eq!(i.impact_ns, 10 * MS);
    assert_eq!(i.window_ns, 100 * MS);
    assert_eq!(
        i.severity,
        Severity::Low,
        "power cap for exactly half the time"
    );
    assert_eq!(i.location, SourceLoc::device(3));
    assert_eq!(
        (i.location.file.as_str(), i.location.line, i.location.origin),
        ("GPU 3", None, FrameOrigin::Device)
    );
    assert!(
        i.title.starts_with(
            "Throttling on GPU 3 · 50.0% of the time (power 50%) · SM clock 1500 of 2000 MHz"
        ),
        "{}",
        i.title
    );
    assert!(
        i.detail.contains("up to 64 °C") && i.detail.contains("up to 700 W"),
        "{}",
        i.detail
    );
    let d = data!(i, Throttling);
    assert_eq!(
        (d.throttled_sm_mhz, d.sm_max_mhz),
        (Some(1500.0), Some(2000))
    );
    assert_eq!(d.max_temp_c, Some(64), "the hottest throttled sample");
    // Utilization unknown: counted as busy. Maximum clock unknown: no estimate.
    assert_eq!(
        rule(&session(None, Some(2000)), "throttling")[0].impact_ns,
        12_500_000
    );
    assert_eq!(rule(&session(Some(80), None), "throttling")[0].impact_ns, 0);
}

// ---------------------------------------------------------------------------------------------
// memory-pressure
// ---------------------------------------------------------------------------------------------

fn memory(used: &[u64], total: u64) -> Analysis {
    let mut b = B::new();
    for (i, &u) in used.iter().enumerate() {
        tel(&mut b, 0, i as u64 * 10 * MS, |t| {
            t.mem_used = Some(u);
            t.mem_total = Some(total);
        });
    }
    b.analyze()
}

#[test]
fn memory_pressure_thresholds_are_exact() {
    let sev = |used: u64| {
        rule(&memory(&[100, used, 100], 1000), "memory-pressure")
            .first()
            .map(|i| (i.severity, i.impact_ns))
    };
    // A risk, not time: impact 0, so LOW (docs/insights.md, "Ranking and severity").
    assert_eq!(sev(900), None, "exactly 90 %");
    assert_eq!(sev(901), Some((Severity::Low, 0)));
    assert_eq!(sev(981), Some((Severity::Low, 0)));
    // Large totals: the comparison is exact in integers (80 GiB, one byte over 90 %).
    let total = 80u64 << 30;
    let edge = total / 10 * 9;
    assert_eq!(total % 10, 0);
    assert!(rule(&memory(&[edge], total), "memory-pressure").is_empty());
    assert_eq!(
        rule(&memory(&[edge + 1], total), "memory-pressure").len(),
        1
    );
}

#[test]
fn memory_pressure_reports_the_peak_share_and_time_above() {
    let mut b = B::new();
    for (i, (u, t)) in [
        (500, Some(1000)),
        (950, Some(1000)),
        (1900, Some(2100)), // 90.5 %: above, but a lower share than 95 %
        (990, None),        // no total: not counted
        (5, Some(0)),       // a zero total: not counted
        (700, Some(1000)),
    ]
    .into_iter()
    .enumerate()
    {
        tel(&mut b, 1, 5 * MS + i as u64 * 10 * MS, |x| {
            x.mem_used = Some(u);
            x.mem_total = t;
        });
    }
    let a = b.analyze();
    let i = rule(&a, "memory-pressure")[0];
    assert_eq!((i.severity, i.impact_ns), (Severity::Low, 0));
    assert_eq!(i.location, SourceLoc::device(1));
    assert_eq!(i.impact_ns, 0, "a risk, not lost time");
    let d = data!(i, MemoryPressure);
    assert_eq!(
        (d.peak_used_bytes, d.total_bytes, d.samples),
        (950, 1000, 4)
    );
    assert_eq!(d.peak_share, 0.95);
    assert_eq!(d.above_ns, 20 * MS);
    assert_eq!(
        d.first_above_offset_ns,
        15 * MS as i64,
        "no timed record: origin 0"
    );
    assert!(i.title.contains("95.0% of"), "{}", i.title);
    // No memory figures at all: nothing.
    assert!(rule(&throttled(3, 0, 0), "memory-pressure").is_empty());
}

// ---------------------------------------------------------------------------------------------
// ecc-errors
// ---------------------------------------------------------------------------------------------

fn ecc(counts: &[(u64, u64)]) -> Analysis {
    let mut b = B::new();
    for (i, &(c, u)) in counts.iter().enumerate() {
        tel(&mut b, 0, i as u64 * 10 * MS, |t| {
            t.ecc_corr = Some(c);
            t.ecc_uncorr = Some(u);
        });
    }
    // A GPU without ECC: no counters, never an insight.
    tel(&mut b, 1, 0, |t| t.temp_c = Some(50));
    b.analyze()
}

#[test]
fn ecc_errors_any_uncorrected_fires_corrected_only_when_they_grow() {
    let one = |counts: &[(u64, u64)]| {
        let a = ecc(counts);
        let v = rule(&a, "ecc-errors");
        assert!(v.len() <= 1);
        v.first().map(|i| (i.severity, data!(i, EccErrors).clone()))
    };
    assert_eq!(one(&[(0, 0), (0, 0)]), None);
    assert_eq!(
        one(&[(7, 0), (7, 0)]),
        None,
        "old corrected errors, none new"
    );
    let (sev, d) = one(&[(7, 0), (8, 0), (9, 0)]).unwrap();
    assert_eq!(sev, Severity::Low);
    assert_eq!(
        (d.corrected_first, d.corrected_last, d.corrected_new),
        (7, 9, 2)
    );
    let (sev, d) = one(&[(0, 1), (0, 1)]).unwrap();
    // A risk, not time: impact 0, so LOW; the title says uncorrected.
    assert_eq!(
        sev,
        Severity::Low,
        "uncorrected before the session still counts"
    );
    assert_eq!((d.uncorrected_max, d.uncorrected_new), (1, 0));
    let (sev, d) = one(&[(3, 0), (4, 2), (4, 2)]).unwrap();
    assert_eq!(sev, Severity::Low);
    assert_eq!((d.uncorrected_new, d.corrected_new), (2, 1));
    let a = ecc(&[(3, 0), (4, 2)]);
    let i = rule(&a, "ecc-errors")[0];
    assert_eq!(
        i.title,
        "Uncorrected ECC errors on GPU 0 · 2 (2 during this session)"
    );
    assert_eq!(i.location, SourceLoc::device(0));
    // A sample with only one of the two counters is not used.
    let mut b = B::new();
    tel(&mut b, 0, 0, |t| t.ecc_uncorr = Some(5));
    assert!(rule(&b.analyze(), "ecc-errors").is_empty());
}

// ---------------------------------------------------------------------------------------------
// low-utilization
// ---------------------------------------------------------------------------------------------

/// Kernels over [0, 30 µs) with a gap of `g1` ns in chunk 4, 740 ns in chunk 10 and 100 ns in
/// chunk 20 (chunks of 1 µs); no API records, so every gap is gpu-idle's `kernel_wait`.
fn two_low_chunks(g1: u64) -> Analysis {
    let mut b = B::new();
    for (s, e) in [
        (0, 4100),
        (4100 + g1, 10_100),
        (10_840, 20_000),
        (20_100, 30_000),
    ] {
        kern(&mut b, "k", 7, s, e);
    }
    b.analyze()
}

#[test]
fn low_utilization_fires_at_five_percent_of_the_active_range() {
    let a = two_low_chunks(760);
    let d = &a.gpu_idle[0];
    assert_eq!(d.active_ns, 30_000);
    assert_eq!(d.low_utilization_chunks, 2);
    let v = rule(&a, "low-utilization");
    assert_eq!(v.len(), 1, "1500 ns of 30 µs: exactly 5 %");
    let i = v[0];
    assert_eq!((i.impact_ns, i.gpu_idle_ns, i.window_ns), (0, 1500, 30_000));
    assert_eq!(i.severity, Severity::Low);
    assert_eq!(i.location, SourceLoc::device(0), "no line: the device");
    let dd = data!(i, LowUtilization);
    assert_eq!((dd.chunks, dd.low_chunks, dd.counted_chunks), (30, 2, 2));
    assert_eq!(
        dd.runs
            .iter()
            .map(|r| (r.first_chunk, r.last_chunk, r.idle_ns, r.busy_ns))
            .collect::<Vec<_>>(),
        vec![(4, 4, 760, 240), (10, 10, 740, 260)]
    );
    assert_eq!(dd.runs[0].class, IdleClass::KernelWait);
    assert_eq!(dd.pause_ns, 0);
    assert!(two_low_chunks(759)
        .insights
        .iter()
        .all(|i| i.rule != "low-utilization"));
}

#[test]
fn low_utilization_names_the_launch_line_leaves_the_startup_pause_out_and_asks_nvml() {
    let session = |nvml_low: u32| {
        let mut b = B::new();
        let st = b.user_stack("/src/train.py", 10, "setup");
        let st2 = b.user_stack("/src/train.py", 42, "train_step");
        let t0 = 100 * MS;
        // Startup, a 100 ms pause, a 10 ms busy kernel, then 10 short kernels launched late.
        launch(&mut b, "init", (0, 5 * US), 5 * US, 10 * US, Some(st));
        launch(
            &mut b,
            "big",
            (t0 - 2 * US, t0 - US),
            t0,
            t0 + 10 * MS,
            Some(st),
        );
        for k in 0..10 {
            let t = t0 + 10 * MS + k * MS;
            launch(
                &mut b,
                "small",
                (t - 3 * US, t - 2 * US),
                t,
                t + 100 * US,
                Some(st2),
            );
        }
        for k in 0..20u64 {
            let ts = t0 + k * MS;
            tel(&mut b, 0, ts, |t| {
                t.gpu_util = Some(if ts < t0 + 10 * MS { 99 } else { nvml_low })
            });
        }
        b.analyze()
    };
    let a = session(12);
    let d = &a.gpu_idle[0];
    let i = rule(&a, "low-utilization")[0];
    let dd = data!(i, LowUtilization);
    assert_eq!(dd.runs.len(), 1, "{:#?}", dd.runs);
    let r = &dd.runs[0];
    // The pause's chunks are left out: the run is the tail of the loop.
    assert!(r.first_chunk >= 26 && r.last_chunk == 29, "{r:#?}");
    assert_eq!(dd.pause_ns, 100 * MS - 10 * US, "the startup gap");
    assert_eq!(r.pause_ns, 0);
    assert_eq!(r.class, IdleClass::Launch);
    assert_eq!(r.location.as_ref().and_then(|l| l.line), Some(42));
    assert_eq!(i.location.line, Some(42));
    // The run's idle time is gpu-idle's chunks' idle time.
    let chunks = &d.utilization[r.first_chunk as usize..=r.last_chunk as usize];
    let idle: u64 = chunks.iter().map(|c| c.duration_ns - c.busy_ns).sum();
    assert_eq!(r.idle_ns, idle);
    assert_eq!(r.by_class.launch, idle, "all of it the late launches");
    assert_eq!(i.window_ns, d.active_ns - dd.pause_ns);
    assert_eq!(i.impact_ns, 0);
    assert_ne!(i.severity, Severity::High);
    assert_eq!(r.nvml_gpu_util_pct, Some(12.0));
    assert!(r.nvml_samples > 0);
    assert!(
        i.detail.contains("1 one-off pause") && i.detail.contains("NVML utilization 12%"),
        "{}",
        i.detail
    );
    assert!(
        i.title
            .contains("waiting for the host to issue work @ train.py:42"),
        "{}",
        i.title
    );
    assert!(!i.detail.contains("another process"));
    // NVML busy while the kernel timeline is idle: said.
    let a = session(95);
    let i = rule(&a, "low-utilization")[0];
    assert!(
        i.detail.contains("another process may be using this GPU"),
        "{}",
        i.detail
    );
}

#[test]
fn low_utilization_names_the_blocking_call_of_sync_gaps_and_claims_no_time() {
    let mut b = B::new();
    let sst = b.user_stack("/src/app.cu", 54, "step");
    let mut t = MS;
    for _ in 0..5 {
        launch(&mut b, "k", (t - 7 * US, t - 2 * US), t, t + 100 * US, None);
        sync_on(
            &mut b,
            1,
            SyncKind::StreamSynchronize,
            t + 50 * US,
            t + 300 * US,
            Some(sst),
        );
        t += 310 * US;
    }
    let a = b.analyze();
    assert_eq!(a.gpu_idle[0].by_class.sync.gaps, 4);
    let i = rule(&a, "low-utilization")[0];
    let dd = data!(i, LowUtilization);
    assert!(dd.runs.len() >= 4, "one run per gap: {:#?}", dd.runs);
    for r in &dd.runs {
        assert_eq!(r.class, IdleClass::Sync);
        assert_eq!(r.blocking_call.as_deref(), Some("StreamSynchronize"));
        assert_eq!(r.location.as_ref().and_then(|l| l.line), Some(54));
    }
    assert!(
        i.title
            .contains("while the host was blocked in StreamSynchronize @ app.cu:54"),
        "{}",
        i.title
    );
    // Most of the active range is idle (840 of 1340 µs), yet impact 0 (LOW): the line rules rank
    // it (merged into gpu-idle's finding at the same line, as a facet).
    assert!(i.gpu_idle_ns * 2 > i.window_ns);
    assert_eq!((i.impact_ns, i.severity), (0, Severity::Low));
    // The same gaps as gpu-idle's sync insight, which carries the impact.
    assert_eq!(rule(&a, "gpu-idle")[0].impact_ns, 4 * 210 * US);
}
