//! Rule `low-utilization`: the stretches of a device's active range where its GPU was busy less
//! than half the time, and what the host was doing then. It reads the devices' idle summaries
//! ([`crate::shared::idle`], the `gpu_idle` of the analysis), not the records again: their utilization series ([`UTIL_CHUNKS`] chunks of the active range, busy = union
//! of kernels, copies and memsets) and its classification of each idle gap (`launch`, `sync`,
//! `other`, `kernel_wait`, with the user line of the launch or of the sync / blocking copy).
//!
//! - **One-off pauses** are cut out first, as gpu-idle does per line but per device: from the
//!   device's longest gap down, each gap longer than all its shorter gaps together (startup, a lazy
//!   load, a checkpoint).
//! - **Low chunks:** the summary's (`shared::idle::mark_low`, the count every view shows): chunks
//!   still under 50 % busy once their one-off pause time (and time the GPU was not observed:
//!   recording paused, or an always-on session outside its windows) is cut out, and not mostly
//!   (more than half) pause or unobserved. **Runs:** maximal runs of consecutive low chunks; a chunk that is
//!   mostly pause ends a run.
//! - **What the host was doing:** the class with the most idle time in the run (pauses excluded)
//!   and, for `launch` and `sync`, the line with the most idle time of that class, as gpu-idle
//!   names it (with the blocking call for `sync`).
//! - **NVML's second opinion:** when the session has `telemetry`, the mean NVML GPU utilization of
//!   the device's samples inside each run (coarser: NVML's own period is 1/6 s to 1 s, and it
//!   counts every process's kernels).
//! - **Fires** per device when the runs' idle time (pauses excluded) is at least [`MIN_SHARE_PCT`] %
//!   of the window: the active range less the one-off pauses (and less the device's gaps that
//!   overlap time the GPU was not observed, in an always-on session).
//! - **Impact:** 0 (so LOW, as the severity formula gives): this is a view over time of idle time
//!   that gpu-idle and the sync and copy rules already attribute to lines, and rank; it is not
//!   counted again (`gpu_idle_ns` carries it).
//! - **Location:** the line of the largest run, or the device when that run has none.

use crate::ids::LocIx;
use crate::insight::{fmt_duration, share, Insight};
use crate::shared::idle::{
    one_off_pauses, overlap, DeviceIdle, Gap, IdleClass, FIX_LAUNCH, FIX_OTHER, FIX_SYNC,
    LOW_UTILIZATION, UTIL_CHUNKS,
};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use serde::Serialize;
use std::collections::HashMap;

pub(crate) const RULE: &str = "low-utilization";
/// Least share (percent) of the window the counted runs' idle time must reach.
pub const MIN_SHARE_PCT: u64 = 5;
/// Runs spelled out in an insight's detail (all are in its data).
const RUNS_IN_DETAIL: usize = 5;

/// Idle time of a run by class, ns (one-off pauses excluded).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ClassNs {
    pub kernel_wait: u64,
    pub launch: u64,
    pub sync: u64,
    pub other: u64,
}

/// One run of low chunks.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Run {
    /// Chunk indices into the device's utilization series, inclusive.
    pub first_chunk: u32,
    pub last_chunk: u32,
    /// Start, ns after the session's first record, and length.
    pub start_offset_ns: u64,
    pub duration_ns: u64,
    pub busy_ns: u64,
    /// One-off pauses inside the run, ns.
    pub pause_ns: u64,
    /// Idle time less the pauses, ns.
    pub idle_ns: u64,
    /// `busy_ns / (duration_ns - pause_ns)`.
    pub busy_share: f64,
    pub by_class: ClassNs,
    /// The class with the most idle time.
    pub class: IdleClass,
    /// `launch` / `sync`: the line with the most idle time of that class.
    pub location: Option<SourceLoc>,
    /// `sync`: the blocking call at that line.
    pub blocking_call: Option<String>,
    /// Mean NVML GPU utilization of the samples inside the run, percent, and their number.
    pub nvml_gpu_util_pct: Option<f64>,
    pub nvml_samples: u64,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub device: u32,
    pub chunks: u32,
    /// The summary's low chunks (`DeviceIdle::low_utilization_chunks`), and those in counted runs
    /// (the same: every low chunk is in a run).
    pub low_chunks: u32,
    pub counted_chunks: u32,
    /// Counted runs, in time order.
    pub runs: Vec<Run>,
    /// Their idle time (the impact), ns.
    pub idle_ns: u64,
    /// The device's one-off pauses, ns, left out of the window.
    pub pause_ns: u64,
    /// Mean NVML GPU utilization over the counted runs' samples, percent.
    pub nvml_gpu_util_pct: Option<f64>,
}

pub(crate) fn run(cx: &Ctx, devices: &[DeviceIdle]) -> Vec<Insight> {
    devices.iter().filter_map(|d| device(cx, d)).collect()
}

fn device(cx: &Ctx, d: &DeviceIdle) -> Option<Insight> {
    let chunks = &d.utilization;
    if chunks.len() != d.chunk_idle.len() || chunks.is_empty() {
        return None;
    }
    let pauses = one_off_pauses(d);
    let pause_total: u64 = pauses.iter().map(|g| g.duration_ns).sum();
    let origin = cx.m.time_range().0;
    let series = cx.m.telemetry().iter().find(|s| s.device == d.device);
    // Low once pauses are cut out, and not mostly pause: the summary's flag (shared::idle).
    let low: Vec<bool> = chunks.iter().map(|c| c.low).collect();
    let mut runs = Vec::new();
    let mut i = 0;
    while i < chunks.len() {
        if !low[i] {
            i += 1;
            continue;
        }
        let j = i + low[i..].iter().take_while(|&&l| l).count();
        runs.push(make_run(cx, d, i, j, &pauses, origin, series));
        i = j;
    }
    let idle: u64 = runs.iter().map(|r| r.idle_ns).sum();
    let window = d
        .active_ns
        .saturating_sub(pause_total + d.unobserved_ns)
        .max(idle);
    if runs.is_empty() || idle == 0 || (idle as u128) * 100 < window as u128 * MIN_SHARE_PCT as u128
    {
        return None;
    }
    let counted_chunks: u32 = runs.iter().map(|r| r.last_chunk - r.first_chunk + 1).sum();
    let (mut nv_sum, mut nv_n) = (0f64, 0u64);
    for r in &runs {
        if let Some(u) = r.nvml_gpu_util_pct {
            nv_sum += u * r.nvml_samples as f64;
            nv_n += r.nvml_samples;
        }
    }
    let nvml = (nv_n > 0).then(|| nv_sum / nv_n as f64);
    // The host's activity over all counted runs.
    let mut total = ClassNs::default();
    for r in &runs {
        total.kernel_wait += r.by_class.kernel_wait;
        total.launch += r.by_class.launch;
        total.sync += r.by_class.sync;
        total.other += r.by_class.other;
    }
    let class = dominant(&total);
    let largest = runs.iter().max_by(|a, b| {
        a.idle_ns
            .cmp(&b.idle_ns)
            .then(b.start_offset_ns.cmp(&a.start_offset_ns))
    })?;
    let location = largest
        .location
        .clone()
        .unwrap_or_else(|| SourceLoc::device(d.device));
    let at = largest
        .location
        .as_ref()
        .map(|l| format!(" @ {}", l.short()))
        .unwrap_or_default();
    let title = format!(
        "Low utilization on GPU {} · {} of {} chunks under 50% busy · {} idle ({:.0}% of the active time{}), mostly {}{at}",
        d.device,
        counted_chunks,
        chunks.len(),
        fmt_duration(idle),
        share(idle, window) * 100.0,
        if pause_total > 0 { " outside one-off pauses" } else { "" },
        phrase(class, largest.blocking_call.as_deref()),
    );
    let mut detail = String::new();
    for (k, r) in runs.iter().take(RUNS_IN_DETAIL).enumerate() {
        if k > 0 {
            detail += "; ";
        }
        detail += &describe(r);
    }
    if runs.len() > RUNS_IN_DETAIL {
        detail += &format!("; {} more runs", runs.len() - RUNS_IN_DETAIL);
    }
    if pause_total > 0 {
        detail += &format!(
            "; {} one-off pause{} ({}, e.g. startup) left out",
            pauses.len(),
            if pauses.len() == 1 { "" } else { "s" },
            fmt_duration(pause_total)
        );
    }
    if let Some(u) = nvml.filter(|_| runs.len() > 1) {
        detail += &format!(
            "; NVML's utilization in these chunks: {u:.0}% (coarser, any process on the GPU)"
        );
    }
    if nvml.is_some_and(|u| u >= LOW_UTILIZATION * 100.0) {
        detail += "; NVML saw the GPU busier than the kernel timeline: another process may be using this GPU";
    }
    let fix = cx.fix(match class {
        IdleClass::Sync => &FIX_SYNC,
        IdleClass::Other | IdleClass::KernelWait => &FIX_OTHER,
        IdleClass::Launch => &FIX_LAUNCH,
    });
    Some(
        Insight::new(RULE, location, title, detail, fix)
            .count(runs.len() as u64)
            .window(window)
            .share_of_window(share(idle, window))
            .gpu_idle(idle)
            .data(Data {
                device: d.device,
                chunks: chunks.len() as u32,
                low_chunks: d.low_utilization_chunks,
                counted_chunks,
                runs,
                idle_ns: idle,
                pause_ns: pause_total,
                nvml_gpu_util_pct: nvml,
            }),
    )
}

/// Chunks `i..j` (all low) as a run.
fn make_run(
    cx: &Ctx,
    d: &DeviceIdle,
    i: usize,
    j: usize,
    pauses: &[&Gap],
    origin: u64,
    series: Option<&crate::telemetry::Series>,
) -> Run {
    let chunks = &d.utilization[i..j];
    let start = chunks[0].start_offset_ns;
    let duration: u64 = chunks.iter().map(|c| c.duration_ns).sum();
    let end = start + duration;
    let busy: u64 = chunks.iter().map(|c| c.busy_ns).sum();
    let mut by_class = [0u64; 4];
    let mut lines: HashMap<(IdleClass, LocIx), (u64, u64, Option<&str>)> = HashMap::new();
    for ci in &d.chunk_idle[i..j] {
        for (k, v) in ci.by_class.iter().enumerate() {
            by_class[k] += v;
        }
        for l in &ci.lines {
            let e = lines.entry((l.class, l.loc)).or_insert((0, 0, None));
            e.0 += l.idle_ns;
            if l.idle_ns > e.1 {
                e.1 = l.idle_ns;
                e.2 = l.blocking_call.as_deref();
            }
        }
    }
    let mut pause = 0u64;
    for g in pauses {
        let ov = overlap(
            start,
            end,
            g.start_offset_ns,
            g.start_offset_ns + g.duration_ns,
        );
        if ov == 0 {
            continue;
        }
        pause += ov;
        let k = g.class as usize;
        by_class[k] = by_class[k].saturating_sub(ov);
        if let Some(loc) = &g.location {
            for ((class, l), e) in lines.iter_mut() {
                if *class == g.class && cx.loc(*l) == loc {
                    e.0 = e.0.saturating_sub(ov);
                }
            }
        }
    }
    let eff = duration.saturating_sub(pause);
    let idle = eff.saturating_sub(busy);
    let cls = ClassNs {
        kernel_wait: by_class[IdleClass::KernelWait as usize],
        launch: by_class[IdleClass::Launch as usize],
        sync: by_class[IdleClass::Sync as usize],
        other: by_class[IdleClass::Other as usize],
    };
    let class = dominant(&cls);
    let line = lines
        .iter()
        .filter(|((c, _), e)| *c == class && e.0 > 0)
        .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0 .1.cmp(&a.0 .1)))
        .map(|((_, l), e)| (*l, e.2));
    let (mut nv_sum, mut nv_n) = (0u64, 0u64);
    if let Some(s) = series {
        let (a, b) = (origin.saturating_add(start), origin.saturating_add(end));
        for t in s.samples().filter(|t| t.ts >= a && t.ts < b) {
            if let Some(u) = t.gpu_util {
                nv_sum += u as u64;
                nv_n += 1;
            }
        }
    }
    Run {
        first_chunk: i as u32,
        last_chunk: (j - 1) as u32,
        start_offset_ns: start,
        duration_ns: duration,
        busy_ns: busy,
        pause_ns: pause,
        idle_ns: idle,
        busy_share: share(busy, eff),
        by_class: cls,
        class,
        location: line.map(|(l, _)| cx.loc(l).clone()),
        blocking_call: line.and_then(|(_, b)| b.map(str::to_string)),
        nvml_gpu_util_pct: (nv_n > 0).then(|| nv_sum as f64 / nv_n as f64),
        nvml_samples: nv_n,
    }
}

/// The class with the most idle time (ties: launch, sync, other, kernel_wait).
fn dominant(c: &ClassNs) -> IdleClass {
    [
        (c.launch, IdleClass::Launch),
        (c.sync, IdleClass::Sync),
        (c.other, IdleClass::Other),
        (c.kernel_wait, IdleClass::KernelWait),
    ]
    .into_iter()
    .fold(
        (0, IdleClass::Launch),
        |best, x| if x.0 > best.0 { x } else { best },
    )
    .1
}

fn phrase(class: IdleClass, call: Option<&str>) -> String {
    match class {
        IdleClass::Launch => "waiting for the host to issue work".into(),
        IdleClass::Sync => format!("while the host was blocked in {}", call.unwrap_or("a sync")),
        IdleClass::Other => "with work already queued".into(),
        IdleClass::KernelWait => "between back-to-back GPU work".into(),
    }
}

fn describe(r: &Run) -> String {
    let chunks = if r.first_chunk == r.last_chunk {
        format!("chunk {}", r.first_chunk + 1)
    } else {
        format!("chunks {}–{}", r.first_chunk + 1, r.last_chunk + 1)
    };
    let class = match r.class {
        IdleClass::KernelWait => "kernel_wait",
        IdleClass::Launch => "launch",
        IdleClass::Sync => "sync",
        IdleClass::Other => "other",
    };
    let mut s = format!(
        "{chunks} of {UTIL_CHUNKS} (+{}, {} long): {:.0}% busy, {class}",
        fmt_duration(r.start_offset_ns),
        fmt_duration(r.duration_ns),
        r.busy_share * 100.0,
    );
    if let Some(l) = &r.location {
        if let Some(c) = &r.blocking_call {
            s += &format!(" in {c}");
        }
        s += &format!(" @ {}", l.short());
    }
    if let Some(u) = r.nvml_gpu_util_pct {
        s += &format!(", NVML utilization {u:.0}%");
    }
    s
}
