//! What the copy and stream rules share (`pageable-async-copy`, `blocking-copy`,
//! `default-stream-barrier`, `device-wide-sync`): copies and memsets folded per API call
//! ([`copy_calls`]), the "copy then wait" pairs that blocking-copy reports and
//! pageable-async-copy leaves to it ([`copy_then_wait`]), every GPU operation with its stream
//! ([`gpu_ops`]), and how a line's operations are measured and described: the severity
//! [`Window`] of a line (its loop's span, else the session), the API name, `at file:line`.

use crate::ids::{CorrId, LocIx};
use crate::insight::{in_function, share};
use crate::shared::Ctx;
use crate::views::CopyOp;
use gpufl_trace::{CopyKind, MemoryKind};
use std::collections::HashMap;

/// One copy or memset API call: its activity records (one or more, same correlation id) folded.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CopyCall {
    pub corr: CorrId,
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
pub(crate) fn copy_calls(cx: &Ctx) -> Vec<CopyCall> {
    let m = cx.m;
    let mut idx: Vec<(CorrId, u32)> = (0..m.copy_count())
        .filter_map(|i| Some((m.copy_corr(i).known()?, i as u32)))
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

/// Host-to-device synchronous copies of at most this many bytes are ignored (64 KiB, as nsys).
pub const SMALL_H2D_BYTES: u64 = 64 * 1024;

/// Whether a call named `name` blocks the host until the GPU is done (blocking-copy's synchronous
/// calls): no `Async` in its name, and per CUDA's API synchronization behavior a copy touching
/// host memory (host-to-device copies of [`SMALL_H2D_BYTES`] or less excepted) or a memset of
/// pinned, pageable or managed memory.
pub(crate) fn blocks_host(name: &str, c: &CopyCall) -> bool {
    if name.contains("Async") {
        return false;
    }
    match c.op {
        CopyOp::Memcpy { kind, .. } => {
            touches_host(kind)
                && !(matches!(kind, CopyKind::HtoD | CopyKind::HtoA) && c.bytes <= SMALL_H2D_BYTES)
        }
        CopyOp::Memset { mem_kind } => matches!(
            mem_kind,
            MemoryKind::Pinned
                | MemoryKind::Pageable
                | MemoryKind::Managed
                | MemoryKind::ManagedStatic
        ),
    }
}

/// The copy and memset calls rule blocking-copy counts, with or without a line: the calls that
/// block the host ([`blocks_host`]) and the async copies of its copy-then-wait pairs
/// ([`copy_then_wait`]; their waits are synchronizations, counted there). How many, and the host
/// time in the calls (each call's API duration, its GPU time without an API record), ns.
pub(crate) fn blocking_calls(cx: &Ctx) -> (u64, u64) {
    let calls = copy_calls(cx);
    let (mut n, mut ns) = (0u64, 0u64);
    for c in &calls {
        if api_name(cx, c.corr).is_some_and(|name| blocks_host(name, c)) {
            n += 1;
            ns = ns.saturating_add(call_ns(cx, c.corr, c.gpu_ns));
        }
    }
    for p in copy_then_wait(cx, &calls) {
        let c = &calls[p.call];
        n += 1;
        ns = ns.saturating_add(call_ns(cx, c.corr, c.gpu_ns));
    }
    (n, ns)
}

/// Name of the API call with this correlation id: from its `api` record, else its `callsite`.
pub(crate) fn api_name<'m>(cx: &Ctx<'m>, corr: CorrId) -> Option<&'m str> {
    let m: &'m crate::Model = cx.m;
    if let Some(a) = cx.api(corr) {
        return Some(m.str(a.name));
    }
    m.callsite(corr).map(|(_, name)| m.str(name))
}

/// (corr, start, end) of an operation for [`window`]: from its API call's start (the GPU start
/// without an API record) to the later of the call's end and `end`.
pub(crate) fn op_span(cx: &Ctx, corr: CorrId, start: u64, end: u64) -> (CorrId, u64, u64) {
    match cx.api(corr) {
        Some(a) => (corr, a.start, a.end.max(end)),
        None => (corr, start, end),
    }
}

/// Host time in the call: its API record's duration, else `fallback_ns`.
pub(crate) fn call_ns(cx: &Ctx, corr: CorrId, fallback_ns: u64) -> u64 {
    cx.api(corr).map_or(fallback_ns, |a| a.duration_ns())
}

/// `bytes / ns` in GB/s; 0 when `ns` is 0.
pub(crate) fn bandwidth_gbps(bytes: u64, ns: u64) -> f64 {
    if ns == 0 {
        0.0
    } else {
        bytes as f64 / ns as f64
    }
}

/// Counts of names; the most frequent (ties: alphabetical first).
#[derive(Default, Debug)]
pub(crate) struct Names(HashMap<String, u64>);

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
pub(crate) struct Window {
    pub ns: u64,
    pub is_loop: bool,
    /// An always-on session: `ns` counts GPU-observed time only.
    pub sampled: bool,
}

/// The severity window of a line's operations, given as (corr, start, end).
pub(crate) fn window(cx: &Ctx, ops: &mut [(CorrId, u64, u64)]) -> Window {
    let wall = Window {
        ns: cx.gpu_wall_ns(),
        is_loop: false,
        sampled: cx.m.is_always_on(),
    };
    if ops.len() < MIN_LOOP_OPS || ops.iter().any(|o| o.0.known().is_none()) {
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
pub(crate) fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `at file.cu:42 in f()`, or, without a user frame, a sentence saying so.
pub(crate) fn where_(cx: &Ctx, loc: LocIx) -> String {
    let l = cx.loc(loc);
    if cx.is_driver_internal(loc) {
        "with no frame of your code on the call stack (issued by the CUDA runtime or a framework)"
            .to_string()
    } else {
        format!("at {}{}", l.short(), in_function(l))
    }
}

/// A copy (index into the calls) waited on by a synchronization (index into the model's syncs)
/// at the same user line `loc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pair {
    pub call: usize,
    pub sync: usize,
    pub loc: LocIx,
}

/// Whether a copy of this kind involves host memory (and can block the host).
pub(crate) fn touches_host(kind: CopyKind) -> bool {
    matches!(
        kind,
        CopyKind::HtoD
            | CopyKind::DtoH
            | CopyKind::HtoA
            | CopyKind::AtoH
            | CopyKind::HtoH
            | CopyKind::Unknown
    )
}

/// "Copy then wait" pairs: async host copies followed on the same thread by a host-blocking sync at
/// the same user line (see the module doc). O(n log n).
pub(crate) fn copy_then_wait(cx: &Ctx, calls: &[CopyCall]) -> Vec<Pair> {
    // (tid, time, 0 = copy / 1 = sync, index, location)
    let mut ev: Vec<(u64, u64, u8, usize, LocIx)> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        if !c.copy_kind().is_some_and(touches_host) {
            continue;
        }
        let (Some(a), Some(loc)) = (cx.api(c.corr), cx.callsite_loc(c.corr)) else {
            continue;
        };
        if !cx.m.str(a.name).contains("Async") {
            continue;
        }
        ev.push((a.tid, a.start, 0, i, loc));
    }
    if ev.is_empty() {
        return Vec::new();
    }
    for (i, &loc) in cx.sync_locs.iter().enumerate() {
        let s = cx.m.sync(i);
        let (Some(tid), Some(loc)) = (s.tid, loc) else {
            continue;
        };
        if !s.kind.blocks_host() {
            continue;
        }
        ev.push((tid, s.start, 1, i, loc));
    }
    ev.sort_unstable();
    let mut pairs = Vec::new();
    let mut pending: Vec<(usize, LocIx)> = Vec::new();
    let mut tid = None;
    for &(t, _, what, i, loc) in &ev {
        if tid != Some(t) {
            tid = Some(t);
            pending.clear();
        }
        if what == 0 {
            pending.push((i, loc));
        } else {
            pairs.extend(pending.iter().filter(|p| p.1 == loc).map(|p| Pair {
                call: p.0,
                sync: i,
                loc,
            }));
            pending.clear();
        }
    }
    pairs
}

/// What a GPU operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    Kernel,
    Copy(CopyKind),
    Memset,
}

/// A kernel, copy or memset (one activity record), `end >= start`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GpuOp {
    pub start: u64,
    pub end: u64,
    pub corr: CorrId,
    pub ctx: u32,
    pub stream: u32,
    pub kind: OpKind,
    /// Kernel name (string id), 0 otherwise.
    pub name: u32,
}

/// Every kernel, copy and memset with a correlation id (0 means "none": left out), inverted
/// intervals made empty.
pub(crate) fn gpu_ops(cx: &Ctx) -> Vec<GpuOp> {
    let m = cx.m;
    let mut v = Vec::with_capacity(m.kernel_count() + m.copy_count());
    for i in 0..m.kernel_count() {
        let k = m.kernel(i);
        v.push(GpuOp {
            start: k.start,
            end: k.end.max(k.start),
            corr: k.corr,
            ctx: k.ctx,
            stream: k.stream,
            kind: OpKind::Kernel,
            name: k.name.0,
        });
    }
    for i in 0..m.copy_count() {
        let c = m.copy(i);
        v.push(GpuOp {
            start: c.start,
            end: c.end.max(c.start),
            corr: c.corr,
            ctx: c.ctx,
            stream: c.stream,
            kind: match c.op {
                CopyOp::Memcpy { kind, .. } => OpKind::Copy(kind),
                CopyOp::Memset { .. } => OpKind::Memset,
            },
            name: 0,
        });
    }
    v.retain(|o| o.corr.known().is_some());
    v
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
