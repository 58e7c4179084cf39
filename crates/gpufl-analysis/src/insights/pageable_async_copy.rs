//! Rule `pageable-async-copy`: `cudaMemcpy*Async` to or from pageable host memory. The driver
//! stages pageable memory through a pinned buffer, so the "async" copy blocks the host and cannot
//! overlap with other work (nsys's `cuda_memcpy_async`).
//!
//! - **Fires** for every copy whose API name contains `Async` (`cudaMemcpyAsync`,
//!   `cuMemcpyDtoHAsync_v2`, …) and one of whose activity records has a pageable source or
//!   destination; one insight per user source line of the call (its `callsite` record).
//! - An operation is one API call (one correlation id): the several activity records CUPTI may
//!   write for one staged copy count once, their bytes and GPU times summed.
//! - **Impact:** host time blocked in those calls (the API records' durations; for a call without
//!   an API record, its GPU copy time as an estimate).
//! - **Severity:** on the impact's share of the session's wall time, as sync-attribution.
//! - Copies that blocking-copy reports as "copy then wait" (`.item()`/`.cpu()`-style: the copy and
//!   a synchronization at the same line) are left to that rule, so that no copy is counted twice.
//! - Copies without a callsite (older sessions, or callsites dropped by the recorder's rate cap)
//!   have no location and are left out: the figures of a line are then lower bounds.

use super::{fmt_duration, in_function, share, Ctx, Insight};
use crate::views::CopyOp;
use gpufl_trace::{CopyKind, MemoryKind};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

pub(crate) const RULE: &str = "pageable-async-copy";

const FIX: &str = "Allocate the host buffer as pinned (page-locked) memory: cudaMallocHost / cudaHostAlloc \
(or cudaHostRegister an existing buffer); in PyTorch, tensor.pin_memory() or DataLoader(pin_memory=True), \
then .to(device, non_blocking=True). Reuse pinned buffers rather than allocating them per copy.";

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Data {
    /// The API called (the most frequent one when the line mixes several).
    pub api: String,
    /// Bytes copied.
    pub bytes: u64,
    /// Summed GPU time of the copies, ns.
    pub copy_ns: u64,
    /// `bytes / copy_ns`, GB/s (0 when the copies took no measurable time).
    pub bandwidth_gbps: f64,
    pub host_to_device: u64,
    pub device_to_host: u64,
    /// Copies of another direction (host to host, arrays…).
    pub other_direction: u64,
}

/// One copy or memset API call: its activity records (one or more, same correlation id) folded.
#[derive(Clone, Copy, Debug)]
pub(super) struct CopyCall {
    pub corr: u32,
    /// The first record's kind (a memset's memory kind is in `Memset`).
    pub op: CopyOp,
    /// Any record touches pageable host memory.
    pub pageable: bool,
    pub bytes: u64,
    /// Summed GPU durations of the records.
    pub gpu_ns: u64,
    /// First record's start and last record's end on the GPU.
    pub start: u64,
    pub end: u64,
}

impl CopyCall {
    pub fn is_memset(&self) -> bool {
        matches!(self.op, CopyOp::Memset { .. })
    }

    /// The copy direction (None for a memset).
    pub fn copy_kind(&self) -> Option<CopyKind> {
        match self.op {
            CopyOp::Memcpy { kind, .. } => Some(kind),
            CopyOp::Memset { .. } => None,
        }
    }
}

/// Copies and memsets by API call (correlation id), ascending. Records with correlation id 0 (no
/// API call to link to) are left out.
pub(super) fn copy_calls(cx: &Ctx) -> Vec<CopyCall> {
    let m = cx.m;
    let mut idx: Vec<(u32, u32)> = (0..m.copy_count())
        .map(|i| (m.copies.corr.get(i), i as u32))
        .filter(|&(c, _)| c != 0)
        .collect();
    idx.sort_unstable();
    let mut out: Vec<CopyCall> = Vec::new();
    for (corr, i) in idx {
        let r = m.copy(i as usize);
        let pageable = match r.op {
            CopyOp::Memcpy {
                src_kind, dst_kind, ..
            } => src_kind == MemoryKind::Pageable || dst_kind == MemoryKind::Pageable,
            CopyOp::Memset { mem_kind } => mem_kind == MemoryKind::Pageable,
        };
        let gpu = r.end.saturating_sub(r.start);
        let end = r.end.max(r.start);
        match out.last_mut() {
            Some(c) if c.corr == corr => {
                c.pageable |= pageable;
                c.bytes = c.bytes.saturating_add(r.bytes);
                c.gpu_ns = c.gpu_ns.saturating_add(gpu);
                c.start = c.start.min(r.start);
                c.end = c.end.max(end);
            }
            _ => out.push(CopyCall {
                corr,
                op: r.op,
                pageable,
                bytes: r.bytes,
                gpu_ns: gpu,
                start: r.start,
                end,
            }),
        }
    }
    out
}

/// Name of the API call with this correlation id: from its `api` record, else its `callsite`.
pub(super) fn api_name<'m>(cx: &Ctx<'m>, corr: u32) -> Option<&'m str> {
    let m: &'m crate::Model = cx.m;
    if let Some(a) = cx.api(corr) {
        return Some(m.str(a.name));
    }
    m.callsite(corr).map(|(_, name)| m.str(name))
}

/// (corr, start, end) of an operation for [`window`]: from its API call's start (the GPU start
/// without an API record) to the later of the call's end and `end`.
pub(super) fn op_span(cx: &Ctx, corr: u32, start: u64, end: u64) -> (u32, u64, u64) {
    match cx.api(corr) {
        Some(a) => (corr, a.start, a.end.max(end)),
        None => (corr, start, end),
    }
}

/// Host time in the call: its API record's duration, else `fallback_ns`.
pub(super) fn call_ns(cx: &Ctx, corr: u32, fallback_ns: u64) -> u64 {
    cx.api(corr).map_or(fallback_ns, |a| a.duration_ns())
}

/// `bytes / ns` in GB/s; 0 when `ns` is 0.
pub(super) fn bandwidth_gbps(bytes: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        bytes as f64 / ns as f64
    }
}

/// Counts of names; the most frequent (ties: alphabetical first).
#[derive(Default, Debug)]
pub(super) struct Names(HashMap<String, u64>);

impl Names {
    pub fn add(&mut self, name: &str) {
        *self.0.entry(name.to_string()).or_default() += 1;
    }

    pub fn top(&self) -> String {
        self.0
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
            .map(|(n, _)| n.clone())
            .unwrap_or_default()
    }
}

/// Fewest operations of a line for its span to be the severity window (see [`Window`]).
pub const MIN_LOOP_OPS: usize = 3;

/// What severity is measured against, as in-loop-sync: the span of the line's operations (first
/// call's start to last operation's end) when the line is a loop — at least [`MIN_LOOP_OPS`]
/// operations with a median of at least one kernel launch between consecutive ones (iterations,
/// not a burst such as a model's upload) — else the session's wall time. Startup (CUDA and framework
/// initialization, often seconds) does not grow with the run and would rate every loop of a short
/// recording LOW.
pub(super) struct Window {
    pub ns: u64,
    pub is_loop: bool,
    /// An always-on session: `ns` counts GPU-observed time only.
    pub sampled: bool,
}

/// The severity window of a line's operations, given as (corr, start, end).
pub(super) fn window(cx: &Ctx, ops: &mut [(u32, u64, u64)]) -> Window {
    let wall = Window {
        ns: cx.gpu_wall_ns(),
        is_loop: false,
        sampled: cx.m.is_always_on(),
    };
    if ops.len() < MIN_LOOP_OPS || ops.iter().any(|o| o.0 == 0) {
        return wall;
    }
    ops.sort_unstable();
    let mut kc = cx.kernel_corrs().cursor();
    let mut between: Vec<usize> = ops.windows(2).map(|w| kc.between(w[0].0, w[1].0)).collect();
    between.sort_unstable();
    let n = between.len();
    // Median of at least 1: the middle value (odd), or the two middle ones summing to 2 (even).
    let looped = if n % 2 == 1 {
        between[n / 2] >= 1
    } else {
        between[n / 2 - 1] + between[n / 2] >= 2
    };
    let first = ops.iter().map(|o| o.1).min().unwrap_or(0);
    let last = ops.iter().map(|o| o.2.max(o.1)).max().unwrap_or(0);
    if !looped || last <= first {
        return wall;
    }
    Window {
        ns: cx.gpu_span(first, last).min(cx.gpu_wall_ns().max(1)),
        is_loop: true,
        sampled: cx.m.is_always_on(),
    }
}

impl Window {
    /// `41.2% of its loop's span` / `3.1% of the session`.
    pub fn describe(&self, impact: u64) -> String {
        let pct = share(impact, self.ns) * 100.0;
        match (self.is_loop, self.sampled) {
            (true, false) => format!("{pct:.1}% of its loop's span"),
            (true, true) => format!("{pct:.1}% of its loop's observed span"),
            (false, false) => format!("{pct:.1}% of the session"),
            (false, true) => format!("{pct:.1}% of the observed time"),
        }
    }
}

/// `1 copy`, `2 copies`.
pub(super) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `at file.cu:42 in f()`, or, without a user frame, a sentence saying so.
pub(super) fn where_(cx: &Ctx, loc: u32) -> String {
    let l = &cx.locs[loc as usize];
    if cx.is_driver_internal(loc) {
        "with no frame of your code on the call stack (issued by the CUDA runtime or a framework)"
            .to_string()
    } else {
        format!("at {}{}", l.short(), in_function(l))
    }
}

#[derive(Default)]
struct Acc {
    count: u64,
    blocked: u64,
    bytes: u64,
    copy_ns: u64,
    h2d: u64,
    d2h: u64,
    other: u64,
    names: Names,
    ops: Vec<(u32, u64, u64)>,
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let calls = copy_calls(cx);
    let claimed: HashSet<u32> = super::blocking_copy::copy_then_wait(cx, &calls)
        .iter()
        .map(|p| calls[p.call].corr)
        .collect();
    let mut groups: HashMap<u32, Acc> = HashMap::new();
    for c in &calls {
        let Some(kind) = c.copy_kind() else { continue };
        if !c.pageable || claimed.contains(&c.corr) {
            continue;
        }
        let Some(name) = api_name(cx, c.corr).filter(|n| n.contains("Async")) else {
            continue;
        };
        let Some(loc) = cx.callsite_loc(c.corr) else {
            continue;
        };
        let g = groups.entry(loc).or_default();
        g.count += 1;
        g.blocked += call_ns(cx, c.corr, c.gpu_ns);
        g.bytes = g.bytes.saturating_add(c.bytes);
        g.copy_ns += c.gpu_ns;
        match kind {
            CopyKind::HtoD | CopyKind::HtoA => g.h2d += 1,
            CopyKind::DtoH | CopyKind::AtoH => g.d2h += 1,
            _ => g.other += 1,
        }
        g.names.add(name);
        g.ops.push(op_span(cx, c.corr, c.start, c.end));
    }
    groups
        .into_iter()
        .map(|(loc, mut g)| {
            let w = window(cx, &mut g.ops);
            insight(cx, loc, g, w)
        })
        .collect()
}

fn insight(cx: &Ctx, loc: u32, g: Acc, w: Window) -> Insight {
    let location = cx.locs[loc as usize].clone();
    let api = g.names.top();
    let bw = bandwidth_gbps(g.bytes, g.copy_ns);
    let title = format!(
        "Pageable {api} × {} @ {} · {} host blocked",
        g.count,
        location.short(),
        fmt_duration(g.blocked)
    );
    let detail = format!(
        "{} to or from pageable host memory {}: {} bytes in {} of GPU copy time ({bw:.2} GB/s); \
         the host was blocked {} in the calls ({}), which cannot overlap with other work while the \
         driver stages the data through a pinned buffer",
        plural(g.count, "copy", "copies"),
        where_(cx, loc),
        g.bytes,
        fmt_duration(g.copy_ns),
        fmt_duration(g.blocked),
        w.describe(g.blocked),
    );
    Insight::new(RULE, location, title, detail, FIX)
        .count(g.count)
        .impact(g.blocked, w.ns, cx.wall_ns)
        .blocked(g.blocked)
        .data(Data {
            api,
            bytes: g.bytes,
            copy_ns: g.copy_ns,
            bandwidth_gbps: bw,
            host_to_device: g.h2d,
            device_to_host: g.d2h,
            other_direction: g.other,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_and_names() {
        assert_eq!(bandwidth_gbps(10, 0), 0.0);
        assert_eq!(bandwidth_gbps(3_000, 1_000), 3.0);
        let mut n = Names::default();
        assert_eq!(n.top(), "");
        n.add("b");
        n.add("a");
        assert_eq!(n.top(), "a", "ties: alphabetical first");
        n.add("b");
        assert_eq!(n.top(), "b");
    }
}
