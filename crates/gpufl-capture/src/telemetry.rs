//! GPU telemetry: a sampling thread that reads NVML (`nvml-wrapper`, which loads
//! `libnvidia-ml.so.1` at run time: nothing to link, no NVIDIA library needed to build) every
//! `telemetry_ms` and sends one `telemetry` record per GPU to the writer thread.
//!
//! - Sampled GPUs: those of the session header, matched to NVML's devices by UUID (NVML and CUDA
//!   number GPUs differently); every NVML device when the header lists none (then `dev` is NVML's
//!   index, and a notice says so).
//! - Off the application's threads: the thread only queries NVML and sends over the writer's
//!   channel (never blocks). A query a GPU does not support is not asked again.
//! - Failure: NVML missing or failing to initialize gives one `notice` in the trace and the thread
//!   ends; nothing is printed. No panic leaves the thread.
//! - Shutdown: [`Handle::stop`] wakes the thread, which ends before its next GPU query; the writer
//!   waits for it (bounded) so that no NVML call is in flight while the process exits.

use crate::sink::Sink;
use gpufl_trace::{Gpu, Notice, Record, Telemetry, TraceError};
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::device::SampleValue;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::{Device, Nvml};
use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The NVML library, as the driver installs it (the unversioned `.so` is a development link).
const NVML_LIB: &str = "libnvidia-ml.so.1";
/// `NVML_FI_DEV_PCIE_COUNT_TX_BYTES` / `RX_BYTES` (nvml.h): cumulative PCIe byte counters, read
/// in well under a millisecond, unlike `nvmlDeviceGetPcieThroughput`, which measures for 20 ms.
const FI_PCIE_TX_BYTES: u32 = 197;
const FI_PCIE_RX_BYTES: u32 = 198;
/// Longest wait for the thread to end at shutdown.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// What the sampling thread sends to the writer.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// One round: a sample of each GPU.
    Samples(Vec<Telemetry>),
    /// A one-off message for the trace (`level`, text).
    Notice(&'static str, String),
}

/// One round of queries over every sampled GPU. The NVML implementation is [`NvmlSource`]; tests
/// use their own.
pub trait Source {
    /// Append one sample per GPU to `out`, each stamped with `now()` when its queries begin;
    /// stop early (returning what was sampled) once `stop()` is true.
    fn sample(&mut self, now: &dyn Fn() -> u64, stop: &dyn Fn() -> bool, out: &mut Vec<Telemetry>);
}

/// Shared between the thread and its [`Handle`].
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    done: AtomicBool,
    rounds: AtomicU64,
    samples: AtomicU64,
    busy_ns: AtomicU64,
    max_ns: AtomicU64,
}

/// The running sampling thread.
pub struct Handle {
    shared: Arc<Shared>,
    thread: std::thread::Thread,
    period: Duration,
}

impl Handle {
    /// Ask the thread to end and wait (at most [`STOP_WAIT`]) until it has. True if it ended.
    pub fn stop(&self) -> bool {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
        let t0 = Instant::now();
        while !self.shared.done.load(Ordering::SeqCst) {
            if t0.elapsed() >= STOP_WAIT {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// Whether the thread has ended (NVML missing, channel closed, or stopped).
    pub fn finished(&self) -> bool {
        self.shared.done.load(Ordering::SeqCst)
    }

    /// The thread's cost so far, for a notice: rounds, samples, mean and max time per round.
    pub fn cost_summary(&self) -> Option<String> {
        let s = &self.shared;
        let rounds = s.rounds.load(Ordering::Relaxed);
        if rounds == 0 {
            return None;
        }
        let busy = s.busy_ns.load(Ordering::Relaxed);
        Some(format!(
            "telemetry: {rounds} rounds every {} ms, {} samples; NVML queries took {:.1} µs per round on average, {:.1} µs at most (sampling thread)",
            self.period.as_millis(),
            s.samples.load(Ordering::Relaxed),
            busy as f64 / rounds as f64 / 1e3,
            s.max_ns.load(Ordering::Relaxed) as f64 / 1e3
        ))
    }
}

/// Start sampling the session's GPUs every `period_ms` (0: not at all), sending what it reads
/// through `send` (which returns false once the writer is gone). A thread that cannot be started
/// leaves a notice in the trace through `sink`.
pub fn start_for(
    sink: &mut Sink,
    gpus: &[Gpu],
    period_ms: u32,
    now: impl Fn() -> u64 + Send + 'static,
    send: impl FnMut(Report) -> bool + Send + 'static,
) -> Option<Handle> {
    if period_ms == 0 {
        return None;
    }
    let gpus = gpus.to_vec();
    let spawned = spawn(
        Duration::from_millis(period_ms as u64),
        now,
        send,
        move || NvmlSource::open(&gpus),
    );
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            let _ = sink.write(&Record::Notice(Notice {
                level: "warning".into(),
                message: format!("telemetry off: cannot start its thread: {e}"),
            }));
            None
        }
    }
}

/// Start the thread over the source `open` makes (on the thread: opening NVML can take a while).
pub fn spawn<S: Source + 'static>(
    period: Duration,
    now: impl Fn() -> u64 + Send + 'static,
    mut send: impl FnMut(Report) -> bool + Send + 'static,
    open: impl FnOnce() -> Result<(S, Vec<String>), String> + Send + 'static,
) -> std::io::Result<Handle> {
    let shared = Arc::new(Shared::default());
    let sh = shared.clone();
    let join = std::thread::Builder::new()
        .name("gpufl-telemetry".into())
        .spawn(move || {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match open() {
                Ok((source, notes)) => {
                    for n in notes {
                        if !send(Report::Notice("warning", n)) {
                            return;
                        }
                    }
                    run(source, period, &now, &mut send, &sh);
                }
                Err(why) => {
                    send(Report::Notice("warning", format!("telemetry off: {why}")));
                }
            }));
            sh.done.store(true, Ordering::SeqCst);
        })?;
    Ok(Handle {
        shared,
        thread: join.thread().clone(),
        period,
    })
}

/// Sample every `period` (on a fixed schedule: a late round does not shift the next ones; missed
/// rounds are skipped) until stopped or the writer is gone.
fn run<S: Source>(
    mut source: S,
    period: Duration,
    now: &dyn Fn() -> u64,
    send: &mut dyn FnMut(Report) -> bool,
    sh: &Shared,
) {
    let stop = || sh.stop.load(Ordering::SeqCst);
    let mut next = Instant::now();
    while !stop() {
        let t0 = Instant::now();
        let mut batch = Vec::new();
        // Nothing is collected while the program has paused recording (`gpufl_pause`).
        if !crate::recorder::is_paused() {
            source.sample(now, &stop, &mut batch);
        }
        let ns = t0.elapsed().as_nanos() as u64;
        sh.rounds.fetch_add(1, Ordering::Relaxed);
        sh.samples.fetch_add(batch.len() as u64, Ordering::Relaxed);
        sh.busy_ns.fetch_add(ns, Ordering::Relaxed);
        sh.max_ns.fetch_max(ns, Ordering::Relaxed);
        if !batch.is_empty() && !send(Report::Samples(batch)) {
            return;
        }
        next += period;
        let t = Instant::now();
        if next <= t {
            next = t + period;
        }
        while !stop() {
            let t = Instant::now();
            if t >= next {
                break;
            }
            std::thread::park_timeout(next - t);
        }
    }
}

/// Write what the thread sent.
pub fn write(sink: &mut Sink, r: Report) -> Result<(), TraceError> {
    match r {
        Report::Samples(v) => v
            .into_iter()
            .try_for_each(|t| sink.write(&Record::Telemetry(Box::new(t)))),
        Report::Notice(level, message) => sink.write(&Record::Notice(Notice {
            level: level.into(),
            message,
        })),
    }
}

/// At the end of a session, once [`Handle::stop`] returned: note the thread's cost, and whether
/// it was still inside NVML.
pub fn finish(h: Option<&Handle>, sink: &mut Sink) {
    let Some(h) = h else { return };
    if let Some(cost) = h.cost_summary() {
        let _ = sink.write(&Record::Notice(Notice {
            level: "info".into(),
            message: cost,
        }));
    }
    if !h.finished() {
        let _ = sink.write(&Record::Notice(Notice {
            level: "info".into(),
            message: "telemetry: the sampling thread was still inside NVML at shutdown".into(),
        }));
    }
}

// ---------------------------------------------------------------------------------------------
// Which GPUs
// ---------------------------------------------------------------------------------------------

/// Pair the header's GPUs with NVML's devices by UUID: `(CUDA ordinal, NVML index)` per GPU, and
/// a note for each GPU NVML does not know. With no GPUs in the header, every NVML device, its
/// NVML index standing for the ordinal (noted).
pub fn match_gpus(header: &[Gpu], nvml_uuids: &[(u32, String)]) -> (Vec<(u32, u32)>, Vec<String>) {
    let mut notes = Vec::new();
    if header.is_empty() {
        if !nvml_uuids.is_empty() {
            notes.push(
                "telemetry: the session's GPU list is empty, so telemetry `dev` is NVML's device index, which may differ from the CUDA ordinal"
                    .into(),
            );
        }
        return (nvml_uuids.iter().map(|(i, _)| (*i, *i)).collect(), notes);
    }
    let mut pairs = Vec::new();
    for g in header {
        match nvml_uuids
            .iter()
            .find(|(_, u)| !g.uuid.is_empty() && u.eq_ignore_ascii_case(&g.uuid))
        {
            Some((i, _)) => pairs.push((g.index, *i)),
            None => notes.push(format!(
                "telemetry: GPU {} ({}) is not among NVML's devices (a MIG instance, or hidden from NVML): not sampled",
                g.index,
                if g.uuid.is_empty() { "no UUID" } else { &g.uuid }
            )),
        }
    }
    (pairs, notes)
}

// ---------------------------------------------------------------------------------------------
// PCIe counters
// ---------------------------------------------------------------------------------------------

/// A cumulative counter read: value, width in bits (it wraps at 2^bits), NVML's timestamp (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    pub value: u64,
    pub bits: u32,
    pub at_us: i64,
}

/// KB/s (1000 bytes) between two reads of a wrapping byte counter, over `fallback_ns` when NVML's
/// timestamps do not advance. None when the width changed or no time passed.
pub fn rate_kbs(prev: Counter, cur: Counter, fallback_ns: u64) -> Option<u64> {
    if prev.bits != cur.bits || cur.bits == 0 || cur.bits > 64 {
        return None;
    }
    let delta = cur.value.wrapping_sub(prev.value);
    let delta = if cur.bits == 64 {
        delta
    } else {
        delta & ((1u64 << cur.bits) - 1)
    };
    let dt_ns = if cur.at_us > prev.at_us && prev.at_us > 0 {
        (cur.at_us - prev.at_us) as u128 * 1000
    } else {
        fallback_ns as u128
    };
    if dt_ns == 0 {
        return None;
    }
    // bytes / s / 1000 = delta * 1e9 / dt_ns / 1e3.
    u64::try_from(delta as u128 * 1_000_000 / dt_ns).ok()
}

fn counter(v: &SampleValue, at_us: i64) -> Option<Counter> {
    match *v {
        SampleValue::U32(x) => Some(Counter {
            value: x as u64,
            bits: 32,
            at_us,
        }),
        SampleValue::U64(x) => Some(Counter {
            value: x,
            bits: 64,
            at_us,
        }),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// NVML
// ---------------------------------------------------------------------------------------------

/// Metrics a GPU said it does not support: not asked again (bits of [`Target::unsupported`]).
const M_UTIL: u16 = 1;
const M_MEM: u16 = 2;
const M_TEMP: u16 = 4;
const M_POWER: u16 = 8;
const M_SM: u16 = 16;
const M_MEMCLK: u16 = 32;
const M_THROTTLE: u16 = 64;
const M_ECC: u16 = 128;
const M_PCIE: u16 = 256;

struct Target {
    dev: u32,
    nvml_index: u32,
    sm_max: Option<u32>,
    unsupported: u16,
    /// Last PCIe counters (tx, rx) and the sample's trace time.
    pcie: Option<(Counter, Counter, u64)>,
}

/// Errors that mean "this GPU or driver cannot do that": stop asking.
fn is_permanent(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported | NvmlError::FailedToLoadSymbol(_) | NvmlError::FunctionNotFound
    )
}

/// A metric's value, remembering permanent refusals in `unsupported`.
fn ask<T>(unsupported: &mut u16, bit: u16, f: impl FnOnce() -> Result<T, NvmlError>) -> Option<T> {
    if *unsupported & bit != 0 {
        return None;
    }
    match f() {
        Ok(v) => Some(v),
        Err(e) => {
            if is_permanent(&e) {
                *unsupported |= bit;
            }
            None
        }
    }
}

/// Telemetry read through NVML.
pub struct NvmlSource {
    nvml: Nvml,
    targets: Vec<Target>,
}

impl NvmlSource {
    /// Load and initialize NVML and find the session's GPUs; notes for GPUs it cannot sample.
    pub fn open(gpus: &[Gpu]) -> Result<(NvmlSource, Vec<String>), String> {
        let nvml = Nvml::builder()
            .lib_path(OsStr::new(NVML_LIB))
            .init()
            .map_err(|e| format!("NVML ({NVML_LIB}) unavailable: {e}"))?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("NVML cannot count GPUs: {e}"))?;
        let uuids: Vec<(u32, String)> = (0..count)
            .filter_map(|i| Some((i, nvml.device_by_index(i).ok()?.uuid().ok()?)))
            .collect();
        let (pairs, notes) = match_gpus(gpus, &uuids);
        if pairs.is_empty() {
            return Err("NVML found none of the session's GPUs".into());
        }
        let targets = pairs
            .into_iter()
            .map(|(dev, nvml_index)| {
                let d = nvml.device_by_index(nvml_index).ok();
                let ecc_on = d
                    .as_ref()
                    .and_then(|d| d.is_ecc_enabled().ok())
                    .is_some_and(|m| m.currently_enabled);
                Target {
                    dev,
                    nvml_index,
                    sm_max: d.as_ref().and_then(|d| d.max_clock_info(Clock::SM).ok()),
                    unsupported: if ecc_on { 0 } else { M_ECC },
                    pcie: None,
                }
            })
            .collect();
        Ok((NvmlSource { nvml, targets }, notes))
    }
}

impl Source for NvmlSource {
    fn sample(&mut self, now: &dyn Fn() -> u64, stop: &dyn Fn() -> bool, out: &mut Vec<Telemetry>) {
        let NvmlSource { nvml, targets } = self;
        for t in targets.iter_mut() {
            if stop() {
                return;
            }
            let ts = now();
            let mut s = Telemetry {
                ts,
                dev: t.dev,
                sm_max_mhz: t.sm_max,
                ..Telemetry::default()
            };
            if let Ok(d) = nvml.device_by_index(t.nvml_index) {
                read_device(nvml, &d, t, &mut s);
            }
            out.push(s);
        }
    }
}

fn read_device(nvml: &Nvml, d: &Device, t: &mut Target, s: &mut Telemetry) {
    let u = &mut t.unsupported;
    if let Some(r) = ask(u, M_UTIL, || d.utilization_rates()) {
        s.gpu_util = Some(r.gpu);
        s.mem_util = Some(r.memory);
    }
    if let Some(m) = ask(u, M_MEM, || d.memory_info()) {
        s.mem_used = Some(m.used);
        s.mem_total = Some(m.total);
    }
    s.temp_c = ask(u, M_TEMP, || d.temperature(TemperatureSensor::Gpu));
    s.power_mw = ask(u, M_POWER, || d.power_usage());
    s.sm_mhz = ask(u, M_SM, || d.clock_info(Clock::SM));
    s.mem_mhz = ask(u, M_MEMCLK, || d.clock_info(Clock::Memory));
    s.throttle = ask(u, M_THROTTLE, || throttle_reasons(nvml, d));
    if let Some((c, x)) = ask(u, M_ECC, || {
        let c = d.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)?;
        let x = d.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)?;
        Ok((c, x))
    }) {
        s.ecc_corr = Some(c);
        s.ecc_uncorr = Some(x);
    }
    let pcie = ask(u, M_PCIE, || {
        let v = d.field_values_for(&[FieldId(FI_PCIE_TX_BYTES), FieldId(FI_PCIE_RX_BYTES)])?;
        let read = |i: usize| -> Result<Counter, NvmlError> {
            let f = v.get(i).ok_or(NvmlError::NotSupported)?;
            let f = f.as_ref().map_err(|_| NvmlError::NotSupported)?;
            let val = f.value.as_ref().map_err(|_| NvmlError::NotSupported)?;
            counter(val, f.timestamp).ok_or(NvmlError::NotSupported)
        };
        Ok((read(0)?, read(1)?))
    });
    if let Some((tx, rx)) = pcie {
        if let Some((ptx, prx, pts)) = t.pcie {
            let dt = s.ts.saturating_sub(pts);
            s.pcie_tx_kbs = rate_kbs(ptx, tx, dt);
            s.pcie_rx_kbs = rate_kbs(prx, rx, dt);
        }
        t.pcie = Some((tx, rx, s.ts));
    }
}

/// The clocks-event reasons with every bit the driver sets (nvml-wrapper's own call drops the
/// bits it does not know): `nvmlDeviceGetCurrentClocksEventReasons`, or its older name.
fn throttle_reasons(nvml: &Nvml, d: &Device) -> Result<u64, NvmlError> {
    let lib = nvml.lib();
    // SAFETY: the handle belongs to this live NVML instance.
    let h = unsafe { d.handle() };
    let mut v: std::os::raw::c_ulonglong = 0;
    // SAFETY: both functions take (nvmlDevice_t, unsigned long long *) and write one value.
    let rc = if let Ok(f) = lib.nvmlDeviceGetCurrentClocksEventReasons.as_ref() {
        unsafe { f(h, &mut v) }
    } else if let Ok(f) = lib.nvmlDeviceGetCurrentClocksThrottleReasons.as_ref() {
        unsafe { f(h, &mut v) }
    } else {
        return Err(NvmlError::FunctionNotFound);
    };
    nvml_try(rc)?;
    Ok(v as u64)
}

#[cfg(test)]
#[path = "telemetry_tests.rs"]
mod tests;
