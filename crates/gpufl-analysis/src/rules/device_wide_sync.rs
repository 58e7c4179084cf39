//! Rule `device-wide-sync`: `cudaDeviceSynchronize` / `cuCtxSynchronize` (ContextSynchronize)
//! that kept waiting for other streams' work after the work the calling thread needed was done.
//!
//! - **The streams the caller needed:** of the streams of the sync's context that the calling
//!   thread issued work to (its `api` records, by thread, linked to kernels / copies / memsets by
//!   correlation id) since its previous device-wide sync, those it copied results back to the host
//!   from (a device-to-host copy: the host reads those after the sync); when it copied nothing
//!   back, all of them; when it issued nothing in that window, every stream it issued work to
//!   before the sync. So a thread that launches a long background kernel on one stream and a short
//!   computation plus its download on another, then syncs the device, waited for the background
//!   kernel needlessly. A stream whose work feeds the needed ones (through events) must finish
//!   before them and so never counts as extra.
//! - **Extra wait** of one sync: the needed streams were done at `caller_done` (the end of the
//!   last operation issued to them before the sync, by any thread: stream order); operations issued
//!   before the sync to *other* streams of the context still ran after `max(caller_done,
//!   sync start)`, until `other_last`. Extra wait = `min(sync end, other_last) − max(caller_done,
//!   sync start)`, when positive. A sync meant to time everything (a benchmark's
//!   `cudaDeviceSynchronize` before reading a clock), or work read by the host through mapped or
//!   managed memory, is a false positive of the device-to-host heuristic.
//! - **Caller unknown** (the sync has no thread, the session has no API records, or the thread
//!   issued no GPU work): only when two or more streams had work pending at the sync's start and
//!   more than half of the sync's waiting came after the first of them finished; the extra wait is
//!   then the time after the first pending stream finished (an upper bound: it assumes the caller
//!   needed only that stream), and the insight says so.
//! - **Fires** for a user line whose device-wide syncs waited at least [`MIN_EXTRA_NS`] extra in all;
//!   one insight per line (`<driver-internal>` for syncs without a user frame; syncs without a stack
//!   are left out, as in sync-attribution).
//! - **Impact:** the summed extra wait. `blocked_ns`: the whole duration of the syncs that waited
//!   extra.

use crate::ids::{CorrId, LocIx};
use crate::insight::{fmt_duration, Insight};
use crate::shared::advice::Fix;
use crate::shared::copies::{gpu_ops, OpKind};
use crate::shared::copies::{plural, where_, window, Window};
use crate::shared::Ctx;
use gpufl_trace::{CopyKind, SyncKind};
use serde::Serialize;
use std::collections::{HashMap, HashSet};

pub(crate) const RULE: &str = "device-wide-sync";

/// Least summed extra wait at a line for it to be reported, ns (10 µs: about the cost of a sync
/// call itself).
pub const MIN_EXTRA_NS: u64 = 10_000;

const FIX: Fix = Fix {
    native: "Wait only for what you need: cudaStreamSynchronize(stream) on the stream whose results you \
read, or record an event right after that work (cudaEventRecord) and cudaEventSynchronize \
it, instead of cudaDeviceSynchronize. The other streams then keep running while the host \
goes on.",
    python: None,
    torch: Some("Wait only for what you need: torch.cuda.current_stream().synchronize() (or the stream whose \
results you read) or a torch.cuda.Event recorded right after that work and its \
.synchronize(), instead of torch.cuda.synchronize(). The other streams then keep running \
while the host goes on."),
    jax: Some("Wait only for what you need: x.block_until_ready() on the arrays whose results you read \
rather than a wait for all of the device's work. The other work then keeps running while the \
host goes on."),
    cupy: Some("Wait only for what you need: stream.synchronize() on the stream whose results you read, or a \
cupy.cuda.Event recorded right after that work and its .synchronize(), instead of \
cupy.cuda.Device().synchronize() or cupy.cuda.runtime.deviceSynchronize(). The other streams \
then keep running while the host goes on."),
};

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Data {
    /// Device-wide syncs at the line (those that waited extra are the insight's `count`).
    pub syncs_at_line: u64,
    /// Summed extra wait, ns (the insight's impact).
    pub extra_wait_ns: u64,
    /// Most other streams pending at one sync.
    pub other_streams: u64,
    /// Syncs whose thread's streams were unknown (estimated; see the rule's doc).
    pub unknown_caller: u64,
}

/// An operation a thread issued: (corr, ctx, stream, whether it copies to host memory).
type Issued = (CorrId, u32, u32, bool);

/// Per (ctx, stream): (corr, running max of end) in issue order.
type Ends = HashMap<(u32, u32), Vec<(CorrId, u64)>>;

/// Latest end of the operations of a stream issued before `corr` (0 if none).
fn end_before(ends: &Ends, ctx: u32, stream: u32, corr: CorrId) -> u64 {
    let Some(v) = ends.get(&(ctx, stream)) else {
        return 0;
    };
    let p = v.partition_point(|&(c, _)| c < corr);
    p.checked_sub(1).map_or(0, |p| v[p].1)
}

#[derive(Default)]
struct Acc {
    at_line: u64,
    count: u64,
    extra: u64,
    blocked: u64,
    other_streams: u64,
    unknown: u64,
    /// (corr, start, end) of every device-wide sync at the line.
    ops: Vec<(CorrId, u64, u64)>,
}

/// What one sync waited for beyond its caller's work: (extra ns, other streams pending, caller
/// unknown).
struct Extra(u64, u64, bool);

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let is_dev = |i: usize| cx.m.sync_kind_at(i) == SyncKind::ContextSynchronize;
    if !(0..cx.m.sync_count()).any(|i| is_dev(i) && cx.sync_loc(i).is_some()) {
        return Vec::new();
    }
    let ops = gpu_ops(cx);
    let mut ends: Ends = HashMap::new();
    let mut streams_of_ctx: HashMap<u32, Vec<u32>> = HashMap::new();
    // tid -> (corr, ctx, stream) of the operations it issued.
    let mut by_tid: HashMap<u64, Vec<Issued>> = HashMap::new();
    for o in &ops {
        ends.entry((o.ctx, o.stream))
            .or_default()
            .push((o.corr, o.end));
        if let Some(a) = cx.api(o.corr) {
            let to_host = matches!(o.kind, OpKind::Copy(CopyKind::DtoH | CopyKind::AtoH));
            by_tid
                .entry(a.tid)
                .or_default()
                .push((o.corr, o.ctx, o.stream, to_host));
        }
    }
    for (&(ctx, stream), v) in ends.iter_mut() {
        v.sort_unstable();
        let mut m = 0;
        for e in v.iter_mut() {
            m = m.max(e.1);
            e.1 = m;
        }
        streams_of_ctx.entry(ctx).or_default().push(stream);
    }
    for v in streams_of_ctx.values_mut() {
        v.sort_unstable();
    }
    for v in by_tid.values_mut() {
        v.sort_unstable();
    }
    // tid -> correlation ids of its device-wide syncs, ascending.
    let mut dev_syncs: HashMap<u64, Vec<CorrId>> = HashMap::new();
    for i in 0..cx.m.sync_count() {
        if let (true, Some(tid)) = (is_dev(i), cx.m.sync(i).tid) {
            dev_syncs.entry(tid).or_default().push(cx.m.sync_corr(i));
        }
    }
    for v in dev_syncs.values_mut() {
        v.sort_unstable();
    }

    let mut groups: HashMap<LocIx, Acc> = HashMap::new();
    for i in 0..cx.m.sync_count() {
        let Some(loc) = cx.sync_loc(i).filter(|_| is_dev(i)) else {
            continue;
        };
        let s = cx.m.sync(i);
        let (start, end) = (s.start, s.end.max(s.start));
        let streams = streams_of_ctx.get(&s.ctx).map(Vec::as_slice).unwrap_or(&[]);
        let caller = s.tid.and_then(|t| {
            let mine = by_tid.get(&t)?;
            let prev = dev_syncs.get(&t).map_or(CorrId(0), |v| {
                let p = v.partition_point(|&c| c < s.corr);
                p.checked_sub(1).map_or(CorrId(0), |p| v[p])
            });
            let lo = mine.partition_point(|x| x.0 <= prev);
            let hi = mine.partition_point(|x| x.0 < s.corr);
            let pick = |r: &[Issued], to_host: bool| -> HashSet<u32> {
                r.iter()
                    .filter(|x| x.1 == s.ctx && (x.3 || !to_host))
                    .map(|x| x.2)
                    .collect()
            };
            let window = mine.get(lo..hi).unwrap_or(&[]);
            let mut set = pick(window, true);
            if set.is_empty() {
                set = pick(window, false);
            }
            if set.is_empty() {
                set = pick(mine.get(..hi).unwrap_or(&[]), false);
            }
            (!set.is_empty()).then_some(set)
        });
        let ex = match caller {
            Some(set) => {
                let done = set
                    .iter()
                    .map(|&st| end_before(&ends, s.ctx, st, s.corr))
                    .max()
                    .unwrap_or(0);
                let base = done.max(start);
                let (mut n, mut last) = (0, 0);
                for &st in streams.iter().filter(|st| !set.contains(st)) {
                    let e = end_before(&ends, s.ctx, st, s.corr);
                    if e > base {
                        n += 1;
                        last = last.max(e);
                    }
                }
                Extra(end.min(last).saturating_sub(base), n, false)
            }
            None => {
                let pending: Vec<u64> = streams
                    .iter()
                    .map(|&st| end_before(&ends, s.ctx, st, s.corr))
                    .filter(|&e| e > start)
                    .collect();
                let (first, last) = (
                    pending.iter().copied().min().unwrap_or(0),
                    pending.iter().copied().max().unwrap_or(0),
                );
                let waited = end.min(last).saturating_sub(start);
                let extra = end.min(last).saturating_sub(first.max(start));
                if pending.len() >= 2 && extra as u128 * 2 > waited as u128 {
                    Extra(extra, pending.len() as u64 - 1, true)
                } else {
                    Extra(0, 0, true)
                }
            }
        };
        let g = groups.entry(loc).or_default();
        g.at_line += 1;
        g.ops.push((s.corr, start, end));
        if ex.0 > 0 {
            g.count += 1;
            g.extra += ex.0;
            g.blocked += end - start;
            g.other_streams = g.other_streams.max(ex.1);
            g.unknown += ex.2 as u64;
        }
    }
    groups
        .into_iter()
        .filter(|(_, g)| g.extra >= MIN_EXTRA_NS)
        .map(|(loc, mut g)| {
            let w = window(cx, &mut g.ops);
            insight(cx, loc, g, w)
        })
        .collect()
}

fn insight(cx: &Ctx, loc: LocIx, g: Acc, w: Window) -> Insight {
    let location = cx.loc(loc).clone();
    let title = format!(
        "Device-wide sync × {} @ {} · {} waiting for other streams",
        g.count,
        location.short(),
        fmt_duration(g.extra)
    );
    let unknown = if g.unknown > 0 {
        format!(
            "; for {} of them the calling thread's streams are unknown (no API records link it to its \
             work): their extra wait is the time after the first pending stream finished, an upper bound",
            g.unknown
        )
    } else {
        String::new()
    };
    let detail = format!(
        "{} of {} device-wide syncs {} went on waiting {} in all for up to {} after the \
         work this thread needed was done (its streams that it copied results back from, or else all \
         the streams it issued work to; blocked {} in those calls; {}){unknown}",
        g.count,
        g.at_line,
        where_(cx, loc),
        fmt_duration(g.extra),
        plural(g.other_streams, "other stream", "other streams"),
        fmt_duration(g.blocked),
        w.describe(g.extra),
    );
    Insight::new(RULE, location, title, detail, cx.fix(&FIX))
        .count(g.count)
        .impact(g.extra, w.ns, cx.wall_ns)
        .blocked(g.blocked)
        .sync_kind(Some(SyncKind::ContextSynchronize))
        .data(Data {
            syncs_at_line: g.at_line,
            extra_wait_ns: g.extra,
            other_streams: g.other_streams,
            unknown_caller: g.unknown,
        })
}
