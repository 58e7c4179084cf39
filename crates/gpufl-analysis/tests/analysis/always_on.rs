//! Always-on (sampled) sessions: GPU activity only inside `window` records, syncs everywhere.
//! Idle time outside windows is not counted, GPU insights are marked estimated with the
//! windows' coverage, sync insights exact, call-site weights summed, rolling files read.

use super::timeline_rules::{kern, launch};
use super::*;

const US: u64 = 1_000;

fn always_on_header() -> Record {
    match header() {
        Record::Header(mut h) => {
            h.options.mode = Some("always-on".into());
            Record::Header(h)
        }
        _ => unreachable!(),
    }
}

/// A builder whose header says always-on.
fn always_on() -> B {
    let mut b = B::new();
    b.recs[0] = always_on_header();
    b
}

fn window(b: &mut B, start: u64, end: u64, reason: &str) {
    b.recs.push(Record::Window(gpufl_trace::Window {
        start,
        end,
        reason: reason.into(),
    }));
}

fn basis(i: &Insight) -> Basis {
    i.basis
        .unwrap_or_else(|| panic!("no basis on {}: {}", i.rule, i.title))
}

/// 60 iterations of 200 µs: a 100 µs kernel (recorded only inside the windows [0, 1 ms) and
/// [10 ms, 11 ms)), then the host blocked 90 µs in a stream sync at app.cu:20 (recorded in every
/// iteration). The last record ends at 11.99 ms.
fn sync_loop(b: &mut B, reasons: [&str; 2]) {
    let st = b.user_stack("/src/app.cu", 20, "step");
    for i in 0..60u64 {
        let t = i * 200 * US;
        if t < 1000 * US || (10_000 * US..11_000 * US).contains(&t) {
            kern(b, "k", 7, t, t + 100 * US);
        }
        b.sync(
            SyncKind::StreamSynchronize,
            t + 100 * US,
            t + 190 * US,
            Some(st),
        );
    }
    window(b, 0, 1000 * US, reasons[0]);
    window(b, 10_000 * US, 11_000 * US, reasons[1]);
}

#[test]
fn model_reads_windows_mode_observed_time_and_coverage() {
    let mut b = always_on();
    sync_loop(&mut b, ["sampled", "trigger"]);
    let m = b.model();
    assert!(m.is_always_on());
    assert_eq!(m.windows().len(), 2);
    assert_eq!(m.windows()[1].reason, WindowReason::Trigger);
    assert_eq!(m.time_range(), (0, 11_990 * US));
    assert_eq!(
        m.observed(),
        vec![(0, 1000 * US), (10_000 * US, 11_000 * US)]
    );
    assert_eq!(m.observed_ns(), 2000 * US);
    assert!((m.coverage() - 2000.0 / 11_990.0).abs() < 1e-12);
    assert_eq!(m.unobserved_in(900 * US, 10_100 * US), 9000 * US);
    // A default-mode session observes everything.
    let mut d = B::new();
    sync_loop(&mut d, ["sampled", "sampled"]);
    let m = d.model();
    assert!(!m.is_always_on());
    assert_eq!(m.observed_ns(), 11_990 * US);
    assert_eq!(m.coverage(), 1.0);
}

#[test]
fn gpu_idle_outside_windows_is_not_counted() {
    let mut b = always_on();
    sync_loop(&mut b, ["sampled", "sampled"]);
    let a = b.analyze();
    let d = &a.gpu_idle[0];
    // 4 gaps of 100 µs in each window; [900 µs, 10 ms) between the windows is not observed.
    assert_eq!(d.gaps, 8);
    assert_eq!(d.idle_ns, 800 * US);
    assert_eq!(d.unobserved_ns, 9100 * US);
    assert_eq!(d.paused_ns, 0);
    // Utilization: the chunks between the windows are not low (nothing is known of them).
    assert!(d.utilization.iter().any(|c| c.unobserved_ns > 0));
    assert!(d
        .utilization
        .iter()
        .filter(|c| c.unobserved_ns == c.duration_ns)
        .all(|c| !c.low));
    assert!(rule(&a, "low-utilization").is_empty(), "{:#?}", a.insights);
    // Busy share of the observed time, not of the wall.
    assert!(
        (a.totals.gpu_busy_pct - 50.0).abs() < 1e-9,
        "{}",
        a.totals.gpu_busy_pct
    );
    // The same records read as a default-mode session: the gap between the windows is idle.
    let mut d = B::new();
    sync_loop(&mut d, ["sampled", "sampled"]);
    let a = d.analyze();
    assert_eq!(a.gpu_idle[0].idle_ns, 800 * US + 9100 * US);
    assert_eq!(a.gpu_idle[0].unobserved_ns, 0);
    assert!(a.sampling.is_none());
    assert!(a.insights.iter().all(|i| i.basis.is_none()));
}

#[test]
fn insight_inside_windows_is_estimated_with_the_coverage_and_sync_insight_exact() {
    let mut b = always_on();
    sync_loop(&mut b, ["sampled", "sampled"]);
    let a = b.analyze();
    let coverage = 2000.0 / 11_990.0;
    // The GPU idle while the host was blocked, measured in the windows: 8 × 100 µs over the
    // line's observed span [100 µs, 10.8 ms) less the 9 ms between the windows.
    let gi = rule(&a, "gpu-idle");
    assert_eq!(gi.len(), 1, "{:#?}", a.insights);
    let gi = gi[0];
    assert_eq!((gi.count, gi.impact_ns), (8, 800 * US));
    assert_eq!(gi.window_ns, 1700 * US, "observed span of the line");
    assert_eq!(window_level(gi), Severity::Medium);
    assert_eq!(gi.location.line, Some(20));
    let bs = basis(gi);
    assert_eq!(bs.kind, BasisKind::Estimated);
    assert_eq!(bs.observed_ns, 2000 * US);
    assert!((bs.coverage - coverage).abs() < 1e-12);
    // Both windows periodic: the whole-run figure is given beside the measured one.
    let x = bs.extrapolated_impact_ns.unwrap();
    assert!((x as f64 - 800e3 / coverage).abs() < 2.0, "{x}");
    // The syncs are recorded everywhere: 60 × 90 µs, exact over the whole run.
    let sa = rule(&a, "sync-attribution");
    assert_eq!(sa.len(), 1);
    assert_eq!((sa[0].count, sa[0].impact_ns), (60, 60 * 90 * US));
    let bs = basis(sa[0]);
    assert_eq!(bs.kind, BasisKind::Exact);
    assert_eq!((bs.observed_ns, bs.coverage), (11_990 * US, 1.0));
    assert_eq!(bs.extrapolated_impact_ns, None);
    // Ranked by what was measured: the sampled estimate is never scaled up to outrank.
    assert_eq!(a.insights[0].rule, "sync-attribution");
    let s = a.sampling.as_ref().unwrap();
    assert_eq!((s.windows, s.sampled, s.triggered, s.api), (2, 2, 0, 0));
    assert_eq!((s.observed_ns, s.span_ns), (2000 * US, 11_990 * US));
    // JSON: the basis is spelled out.
    let v = serde_json::to_value(gi).unwrap();
    assert_eq!(v["basis"]["kind"], "estimated");
    assert!(v["basis"]["coverage"].as_f64().unwrap() > 0.16);
}

#[test]
fn a_triggered_window_is_not_extrapolated() {
    let mut b = always_on();
    sync_loop(&mut b, ["sampled", "trigger"]);
    let a = b.analyze();
    let gi = rule(&a, "gpu-idle")[0];
    assert_eq!(basis(gi).kind, BasisKind::Estimated);
    assert_eq!(basis(gi).extrapolated_impact_ns, None);
    let s = a.sampling.unwrap();
    assert_eq!((s.sampled, s.triggered), (1, 1));
}

#[test]
fn every_rule_is_exact_or_estimated() {
    for r in [
        "sync-attribution",
        "in-loop-sync",
        "throttling",
        "memory-pressure",
        "ecc-errors",
    ] {
        assert!(sampling::rule_is_exact(r), "{r}");
    }
    for r in [
        "gpu-idle",
        "launch-bound",
        "low-utilization",
        "host-read",
        "no-copy-compute-overlap",
        "pageable-async-copy",
        "blocking-copy",
        "default-stream-barrier",
        "device-wide-sync",
        "low-occupancy",
        "register-spill",
        "under-filled-grid",
    ] {
        assert!(!sampling::rule_is_exact(r), "{r}");
    }
}

/// A callsite record with a weight.
fn weighted_site(b: &mut B, corr: u32, api: &str, stack: StackId, ts: u64, weight: Option<u64>) {
    let api = b.s(api);
    b.recs.push(Record::Callsite(Callsite {
        corr,
        api,
        tid: 1,
        ts,
        stack,
        weight,
    }));
}

#[test]
fn calls_per_line_sum_the_call_site_weights() {
    let mut b = always_on();
    let l1 = b.user_stack("/src/train.py", 30, "step");
    let l2 = b.user_stack("/src/train.py", 41, "step");
    for (i, w) in [1u64, 5, 10].into_iter().enumerate() {
        let c = b.next_corr();
        weighted_site(&mut b, c, "cudaLaunchKernel", l1, i as u64 * 1000, Some(w));
    }
    for i in 0..2u64 {
        let c = b.next_corr();
        weighted_site(&mut b, c, "cudaMemcpyAsync", l2, 5000 + i, None);
    }
    let m = b.model();
    assert!(m.has_callsite_weights());
    let a = analyze(&m, &Config::default());
    let c = &a.sampling.as_ref().unwrap().calls_per_line;
    assert_eq!(c.len(), 2);
    assert_eq!(
        (
            c[0].api.as_str(),
            c[0].location.line,
            c[0].captures,
            c[0].calls
        ),
        ("cudaLaunchKernel", Some(30), 3, 16)
    );
    assert_eq!(
        (
            c[1].api.as_str(),
            c[1].location.line,
            c[1].captures,
            c[1].calls
        ),
        ("cudaMemcpyAsync", Some(41), 2, 2),
        "absent weight = 1"
    );
}

/// 30 iterations of 1 ms: 4 kernels launched at app.cu:50 (the first launch of each iteration's
/// call site captured with weight 4), then a sync at app.cu:60.
fn launch_loop(b: &mut B, windows: &[(u64, u64)]) {
    let sync_at = b.user_stack("/src/app.cu", 60, "loop");
    let launch_at = b.user_stack("/src/app.cu", 50, "loop");
    let ms = 1000 * US;
    for i in 0..30u64 {
        let t = i * ms;
        for k in 0..4u64 {
            let ks = t + k * 200 * US;
            let seen = windows.iter().any(|&(s, e)| ks >= s && ks < e);
            let corr = if seen {
                kern(b, "k", 7, ks, ks + 190 * US)
            } else {
                b.next_corr()
            };
            if k == 0 {
                weighted_site(b, corr, "cudaLaunchKernel", launch_at, t, Some(4));
            }
        }
        b.sync(
            SyncKind::StreamSynchronize,
            t + 850 * US,
            t + 950 * US,
            Some(sync_at),
        );
    }
    for &(s, e) in windows {
        window(b, s, e, "sampled");
    }
}

#[test]
fn in_loop_sync_counts_launches_in_windows_and_stays_exact() {
    let mut b = always_on();
    // Two windows of 3 ms: the syncs at 5.95 and 6.95 ms lie inside the first (one pair).
    launch_loop(
        &mut b,
        &[(5_000 * US, 8_000 * US), (20_000 * US, 23_000 * US)],
    );
    let a = b.analyze();
    let v = rule(&a, "in-loop-sync");
    assert_eq!(v.len(), 1, "{:#?}", a.insights);
    let i = v[0];
    assert_eq!(i.count, 30, "every sync, in windows or not");
    assert_eq!(i.median_kernels_between, Some(4.0));
    assert_eq!(basis(i).kind, BasisKind::Exact);
    assert!(
        i.detail
            .contains("consecutive syncs with GPU activity recorded"),
        "{}",
        i.detail
    );
    // The GPU idle after the syncs counts only where it was observed.
    assert!(
        i.gpu_idle_ns > 0 && i.gpu_idle_ns <= 4 * 240 * US,
        "{}",
        i.gpu_idle_ns
    );
}

#[test]
fn in_loop_sync_estimates_launches_from_call_site_weights_without_a_pair_in_a_window() {
    let mut b = always_on();
    // Windows shorter than an iteration, between the syncs: no pair of syncs inside one.
    launch_loop(
        &mut b,
        &[(2_000 * US, 2_500 * US), (9_000 * US, 9_500 * US)],
    );
    let a = b.analyze();
    let v = rule(&a, "in-loop-sync");
    assert_eq!(v.len(), 1, "{:#?}", a.insights);
    assert_eq!(v[0].median_kernels_between, Some(4.0));
    assert!(
        v[0].detail.contains("sampled launch call sites"),
        "{}",
        v[0].detail
    );
    assert_eq!(v[0].gpu_idle_ns, 0, "no idle observed after any sync");
    // Without weights nothing says how many launches lie between: no insight.
    let mut b = always_on();
    launch_loop(&mut b, &[(2_000 * US, 2_500 * US)]);
    for r in b.recs.iter_mut() {
        if let Record::Callsite(c) = r {
            c.weight = None;
        }
    }
    assert!(rule(&b.analyze(), "in-loop-sync").is_empty());
}

#[test]
fn launch_bound_window_counts_observed_time_only() {
    // Tiny kernels launched late inside two windows far apart: the functions' span crosses
    // 100 ms of unobserved time, which must not dilute the severity.
    let mut b = always_on();
    let st = b.user_stack("/src/app.cu", 70, "tick");
    for w in [0u64, 100_000] {
        let base = w * US;
        for i in 0..50u64 {
            let t = base + i * 20 * US;
            launch(
                &mut b,
                "tick",
                (t, t + 15 * US),
                t + 16 * US,
                t + 18 * US,
                Some(st),
            );
        }
        window(&mut b, base, base + 1000 * US, "sampled");
    }
    let a = b.analyze();
    for i in &a.insights {
        if sampling::rule_is_exact(i.rule) {
            continue;
        }
        assert_eq!(basis(i).kind, BasisKind::Estimated, "{}", i.rule);
        assert!(
            i.window_ns <= 2000 * US,
            "{}: window {} spans unobserved time",
            i.rule,
            i.window_ns
        );
    }
    assert!(!rule(&a, "launch-bound").is_empty(), "{:#?}", a.insights);
}

#[test]
fn rolling_session_whose_first_file_was_deleted_still_analyses() {
    let root = std::env::temp_dir().join(format!("gpufl-always-on-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let mut h = match always_on_header() {
        Record::Header(h) => *h,
        _ => unreachable!(),
    };
    // Three rolling files, each with its own header and interning; the first is deleted.
    for f in 0..3u64 {
        h.session_id = "rolling-1-20261122T000000Z".into();
        let file = std::fs::File::create(root.join(format!("trace-{f:04}.ndjson.zst"))).unwrap();
        let mut w = TraceWriter::new(file, &h).unwrap();
        let file_s = w.intern_str(&format!("/src/part{f}.py")).unwrap();
        let fr = w
            .intern_frame(FrameData {
                kind: FrameKind::Python,
                module: None,
                offset: None,
                func: None,
                file: Some(file_s),
                line: Some(10),
                inlined: false,
                text: None,
            })
            .unwrap();
        let st = w.intern_stack(&[fr]).unwrap();
        let kname = w.intern_str("k").unwrap();
        let base = f * 10_000 * US;
        for i in 0..5u64 {
            let t = base + i * 200 * US;
            w.write(&Record::Kernel(Kernel {
                name: kname,
                start: t,
                end: t + 100 * US,
                ctx: 1,
                stream: 7,
                corr: (f * 100 + i * 2 + 1) as u32,
                ..Kernel::default()
            }))
            .unwrap();
            w.write(&Record::Sync(Sync {
                kind: SyncKind::StreamSynchronize,
                start: t + 100 * US,
                end: t + 190 * US,
                ctx: 1,
                stream: Some(7),
                corr: (f * 100 + i * 2 + 2) as u32,
                tid: Some(1),
                stack: Some(st),
                ..Sync::default()
            }))
            .unwrap();
        }
        w.write(&Record::Window(gpufl_trace::Window {
            start: base,
            end: base + 1000 * US,
            reason: "sampled".into(),
        }))
        .unwrap();
        w.finish(0, "rolled").unwrap();
    }
    std::fs::remove_file(root.join("trace-0000.ndjson.zst")).unwrap();
    let mut r = SessionReader::open(&root).unwrap();
    let mut m = Model::load(r.by_ref());
    m.add_warnings(r.warnings());
    assert_eq!(m.files(), 2);
    assert!(m.is_always_on(), "mode read from the first surviving file");
    assert_eq!(m.windows().len(), 2);
    let a = analyze(&m, &Config::default());
    let s = a.sampling.as_ref().unwrap();
    // The span ends with the last record, 10 µs before the last window closes.
    assert_eq!((s.files, s.windows, s.observed_ns), (2, 2, 1990 * US));
    // Each file's ids resolve to its own strings.
    let sa = rule(&a, "sync-attribution");
    let mut files: Vec<&str> = sa.iter().map(|i| i.location.file.as_str()).collect();
    files.sort();
    assert_eq!(files, vec!["/src/part1.py", "/src/part2.py"]);
    assert!(sa.iter().all(|i| basis(i).kind == BasisKind::Exact));
    // The gap between the two files' windows is not observed.
    assert_eq!(a.gpu_idle[0].idle_ns, 8 * 100 * US);
    let _ = std::fs::remove_dir_all(&root);
}
