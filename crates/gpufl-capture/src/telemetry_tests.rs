//! Tests of the sampling thread with a scripted source (no GPU here), of the UUID matching and of
//! the PCIe counter arithmetic.

use super::*;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Mutex;

fn gpu(index: u32, uuid: &str) -> Gpu {
    Gpu {
        index,
        uuid: uuid.into(),
        ..Gpu::default()
    }
}

#[test]
fn gpus_are_matched_by_uuid_not_by_position() {
    let header = [gpu(0, "GPU-bbbb"), gpu(1, "GPU-aaaa"), gpu(2, "GPU-cccc")];
    // NVML enumerates in PCI order, CUDA fastest first: the orders differ.
    let nvml = [(0, "GPU-AAAA".to_string()), (1, "GPU-bbbb".to_string())];
    let (pairs, notes) = match_gpus(&header, &nvml);
    assert_eq!(pairs, vec![(0, 1), (1, 0)], "(CUDA ordinal, NVML index)");
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].contains("GPU 2") && notes[0].contains("GPU-cccc"),
        "{notes:?}"
    );
    // A header GPU without a UUID matches nothing, even an NVML device without one.
    let (pairs, notes) = match_gpus(&[gpu(0, "")], &[(0, String::new())]);
    assert!(pairs.is_empty());
    assert!(notes[0].contains("no UUID"));
}

#[test]
fn empty_header_samples_every_nvml_device_and_says_dev_is_nvml_index() {
    let nvml = [(0, "GPU-a".to_string()), (1, "GPU-b".to_string())];
    let (pairs, notes) = match_gpus(&[], &nvml);
    assert_eq!(pairs, vec![(0, 0), (1, 1)]);
    assert_eq!(notes.len(), 1);
    assert!(notes[0].contains("NVML's device index"));
    let (pairs, notes) = match_gpus(&[], &[]);
    assert!(pairs.is_empty() && notes.is_empty());
}

fn c(value: u64, bits: u32, at_us: i64) -> Counter {
    Counter { value, bits, at_us }
}

#[test]
fn pcie_rate_from_wrapping_counters() {
    // 5 MB in 100 ms = 50 000 KB/s, timed by NVML's own timestamps (not the fallback).
    assert_eq!(
        rate_kbs(c(1_000, 64, 1_000_000), c(5_001_000, 64, 1_100_000), 1),
        Some(50_000)
    );
    // Without usable NVML timestamps, the samples' interval.
    assert_eq!(
        rate_kbs(c(0, 64, 0), c(5_000_000, 64, 0), 100_000_000),
        Some(50_000)
    );
    assert_eq!(
        rate_kbs(c(0, 64, 7), c(5_000_000, 64, 7), 50_000_000),
        Some(100_000)
    );
    // A 32-bit counter that wrapped once: 2^32 - 1000 → 4000 is 5000 bytes.
    assert_eq!(
        rate_kbs(
            c((1u64 << 32) - 1000, 32, 1_000_000),
            c(4000, 32, 1_001_000),
            0
        ),
        Some(5_000)
    );
    // A 64-bit counter wrapping.
    assert_eq!(
        rate_kbs(c(u64::MAX - 999, 64, 1), c(1000, 64, 1_000_001), 0),
        Some(2)
    );
    // Width changed, no time passed, a nonsense width.
    assert_eq!(rate_kbs(c(0, 32, 1), c(10, 64, 2), 5), None);
    assert_eq!(rate_kbs(c(0, 64, 0), c(10, 64, 0), 0), None);
    assert_eq!(rate_kbs(c(0, 0, 1), c(10, 0, 2), 5), None);
}

#[test]
fn unsupported_metrics_are_not_asked_again_but_transient_errors_are() {
    let mut unsupported = 0u16;
    let mut calls = 0;
    for _ in 0..3 {
        let v: Option<u32> = ask(&mut unsupported, M_TEMP, || {
            calls += 1;
            Err(NvmlError::NotSupported)
        });
        assert_eq!(v, None);
    }
    assert_eq!(calls, 1, "NotSupported is remembered");
    let mut calls = 0;
    for _ in 0..3 {
        let v: Option<u32> = ask(&mut unsupported, M_POWER, || {
            calls += 1;
            Err(NvmlError::GpuLost)
        });
        assert_eq!(v, None);
    }
    assert_eq!(calls, 3, "other errors are retried");
    assert_eq!(ask(&mut unsupported, M_SM, || Ok(1410)), Some(1410));
    assert_eq!(unsupported, M_TEMP);
}

/// A scripted source: `gpus` samples per round, each query taking `query` of wall time.
struct Fake {
    gpus: u32,
    query: Duration,
    rounds: Arc<Mutex<Vec<Instant>>>,
    panic_at: Option<usize>,
}

impl Source for Fake {
    fn sample(&mut self, now: &dyn Fn() -> u64, stop: &dyn Fn() -> bool, out: &mut Vec<Telemetry>) {
        let n = {
            let mut r = self.rounds.lock().unwrap();
            r.push(Instant::now());
            r.len()
        };
        if self.panic_at == Some(n) {
            panic!("scripted failure");
        }
        for dev in 0..self.gpus {
            if stop() {
                return;
            }
            std::thread::sleep(self.query);
            out.push(Telemetry {
                ts: now(),
                dev,
                gpu_util: Some(50),
                ..Telemetry::default()
            });
        }
    }
}

fn fake(gpus: u32, query: Duration) -> (Fake, Arc<Mutex<Vec<Instant>>>) {
    let rounds = Arc::new(Mutex::new(Vec::new()));
    (
        Fake {
            gpus,
            query,
            rounds: rounds.clone(),
            panic_at: None,
        },
        rounds,
    )
}

fn start_fake(source: Fake, period: Duration, notes: Vec<String>) -> (Handle, Receiver<Report>) {
    let (tx, rx) = channel();
    let t0 = Instant::now();
    let h = spawn(
        period,
        move || t0.elapsed().as_nanos() as u64,
        move |r| tx.send(r).is_ok(),
        move || Ok((source, notes)),
    )
    .unwrap();
    (h, rx)
}

fn wait_until(what: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !what() {
        assert!(t0.elapsed() < Duration::from_secs(10), "timed out");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn samples_every_period_until_stopped_and_stops_within_a_period() {
    let period = Duration::from_millis(100);
    let (src, rounds) = fake(2, Duration::ZERO);
    let (h, rx) = start_fake(src, period, vec!["a note".into()]);
    wait_until(|| rounds.lock().unwrap().len() >= 3);
    let t = Instant::now();
    assert!(h.stop(), "the thread ended");
    assert!(
        t.elapsed() < period,
        "stopped in {:?}, more than one period",
        t.elapsed()
    );
    assert!(h.finished());
    let n = rounds.lock().unwrap().len();
    std::thread::sleep(period * 2);
    assert_eq!(rounds.lock().unwrap().len(), n, "no round after stop");
    let reports: Vec<Report> = rx.try_iter().collect();
    assert_eq!(reports[0], Report::Notice("warning", "a note".into()));
    let batches: Vec<&Vec<Telemetry>> = reports[1..]
        .iter()
        .map(|r| match r {
            Report::Samples(v) => v,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(batches.len(), n);
    for b in &batches {
        assert_eq!(b.iter().map(|t| t.dev).collect::<Vec<_>>(), vec![0, 1]);
    }
    // A fixed schedule: round k starts no earlier than k periods after the first (a late round
    // does not shift the next ones, so two rounds can be less than a period apart, never two at
    // once).
    let r = rounds.lock().unwrap();
    for (k, t) in r.iter().enumerate() {
        let since = *t - r[0];
        assert!(
            since + Duration::from_millis(1) >= period * k as u32,
            "round {k} at {since:?}"
        );
    }
    for w in r.windows(2) {
        assert!(w[1] - w[0] > period / 2, "rounds {:?} apart", w[1] - w[0]);
    }
    let cost = h.cost_summary().unwrap();
    assert!(cost.contains(&format!("{n} rounds every 100 ms")), "{cost}");
    assert!(cost.contains(&format!("{} samples", 2 * n)), "{cost}");
}

#[test]
fn stop_interrupts_a_slow_round_between_gpus() {
    // 8 GPUs whose queries take 30 ms each: a round lasts 240 ms, far more than the period.
    let (src, rounds) = fake(8, Duration::from_millis(30));
    let (h, rx) = start_fake(src, Duration::from_millis(10), Vec::new());
    wait_until(|| !rounds.lock().unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(45));
    let t = Instant::now();
    assert!(h.stop());
    assert!(
        t.elapsed() < Duration::from_millis(200),
        "waited {:?}: the round went on after stop",
        t.elapsed()
    );
    // The cut round's samples are still sent, fewer than 8.
    let batches: Vec<Report> = rx.try_iter().collect();
    assert_eq!(batches.len(), 1);
    let Report::Samples(v) = &batches[0] else {
        panic!("{batches:?}")
    };
    assert!(!v.is_empty() && v.len() < 8, "{} samples", v.len());
}

#[test]
fn writer_gone_ends_the_thread() {
    let (src, rounds) = fake(1, Duration::ZERO);
    let (h, rx) = start_fake(src, Duration::from_millis(5), Vec::new());
    wait_until(|| !rounds.lock().unwrap().is_empty());
    drop(rx);
    wait_until(|| h.finished());
    let n = rounds.lock().unwrap().len();
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(rounds.lock().unwrap().len(), n);
}

#[test]
fn a_panic_in_the_source_ends_the_thread_quietly() {
    let (mut src, rounds) = fake(1, Duration::ZERO);
    src.panic_at = Some(3);
    let (h, rx) = start_fake(src, Duration::from_millis(5), Vec::new());
    wait_until(|| h.finished());
    assert_eq!(rounds.lock().unwrap().len(), 3);
    assert_eq!(rx.try_iter().count(), 2, "the two rounds before the panic");
    assert!(h.stop(), "stopping an ended thread returns at once");
}

#[test]
fn a_source_that_cannot_open_leaves_one_notice() {
    let (tx, rx) = channel();
    let h = spawn::<Fake>(
        Duration::from_millis(5),
        || 0,
        move |r| tx.send(r).is_ok(),
        || Err("NVML (libnvidia-ml.so.1) unavailable: not here".into()),
    )
    .unwrap();
    wait_until(|| h.finished());
    let reports: Vec<Report> = rx.try_iter().collect();
    assert_eq!(
        reports,
        vec![Report::Notice(
            "warning",
            "telemetry off: NVML (libnvidia-ml.so.1) unavailable: not here".into()
        )]
    );
    assert_eq!(h.cost_summary(), None);
}

#[test]
fn without_nvml_the_real_source_gives_one_notice_and_no_samples() {
    if crate::dl::Lib::open(NVML_LIB).is_some() {
        return; // a machine with the NVIDIA driver: nothing to check here
    }
    let (tx, rx) = channel();
    let h = spawn(
        Duration::from_millis(5),
        || 0,
        move |r| tx.send(r).is_ok(),
        || NvmlSource::open(&[gpu(0, "GPU-0")]),
    )
    .unwrap();
    wait_until(|| h.finished());
    let reports: Vec<Report> = rx.try_iter().collect();
    assert_eq!(reports.len(), 1, "{reports:?}");
    let Report::Notice(level, msg) = &reports[0] else {
        panic!("{reports:?}")
    };
    assert_eq!(*level, "warning");
    assert!(
        msg.starts_with("telemetry off: NVML (libnvidia-ml.so.1) unavailable"),
        "{msg}"
    );
}
