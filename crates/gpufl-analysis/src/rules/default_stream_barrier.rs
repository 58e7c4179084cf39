//! Rule `default-stream-barrier`: work on the legacy default stream (stream handle 0 without
//! per-thread default streams) serializes with every blocking stream of its context: it waits for
//! their earlier work and holds back their later work. The rule measures that waiting.
//!
//! - **Default stream:** the stream whose `stream` record says `legacy_default`. For a context with
//!   no `stream` record on any of its streams (sessions recorded before those records existed), the
//!   streams that received a synchronous (non-`Async`) copy or memset are taken as its legacy
//!   default stream: that is where `cudaMemcpy` / `cudaMemset` go unless the program was built with
//!   `--default-stream per-thread` (then the measurement below finds no waiting).
//! - **Measured, not assumed** (streams created with `cudaStreamNonBlocking` do not synchronize
//!   with the legacy stream, and the recorder does not know stream flags). For each default-stream
//!   operation D (kernel, copy, memset) of a context:
//!   - *others waited on D:* each operation X on another stream of the context issued after D
//!     (higher correlation id) that became ready — its API call returned and its stream's previous
//!     operation ended — before D ended, but started on the GPU only once D had ended (D is the
//!     last default-stream operation to end before X started) waited
//!     `D.end − max(ready(X), D.start)`;
//!   - *D waited on others:* D became ready at `max(its API call's start, the end of the previous
//!     default-stream operation)`; each other stream whose last operation issued before D ended
//!     after that but no later than D's start held D back; D waited until the last of them ended.
//!   - Pairs of copies in the same direction are left out (they share a copy engine and would
//!     serialize anyway). X needs its API record (when it returned), D its API record for its own
//!     wait.
//! - **Fires** for a default-stream operation when the operations that waited on it and those it
//!   waited on span **two or more** other streams (with a single other stream the implicit ordering
//!   is often what the program relies on for correctness), and for a line when its summed waiting
//!   is at least [`MIN_WAIT_NS`].
//! - **Impact:** both waits, summed over the line's default-stream operations. A synchronous
//!   default-stream copy's own wait is also host time, which blocking-copy counts too.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//! - **Location:** the callsite of the default-stream operation (the user frame: the line inside a
//!   helper that calls `cudaMemcpy`). A kernel without a callsite (launch callsites are sampled)
//!   takes the location of the sampled launches of the same kernel on the same stream when they all
//!   agree; operations left without a location are left out.

use crate::ids::{CorrId, LocIx};
use crate::insight::{fmt_duration, Insight};
use crate::shared::advice::Fix;
use crate::shared::copies::{
    api_name, gpu_ops, op_span, plural, where_, window, GpuOp, Names, OpKind, Window,
};
use crate::shared::Ctx;
use gpufl_trace::{CopyKind, StreamRole};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap, HashSet};

pub(crate) const RULE: &str = "default-stream-barrier";

/// Least summed waiting at a line for it to be reported, ns (10 µs: about one kernel launch).
pub const MIN_WAIT_NS: u64 = 10_000;

/// Most distinct streams remembered per operation (enough to tell one from several).
const MAX_STREAMS: usize = 64;

const FIX: Fix = Fix {
    native: "Issue this work on a stream you created (cudaStreamCreate) with the Async API \
(cudaMemcpyAsync / cudaMemsetAsync / kernel<<<grid, block, 0, stream>>>), and order it \
against the other streams with events (cudaEventRecord + cudaStreamWaitEvent) where it \
really depends on them; or compile with nvcc --default-stream per-thread (or use \
cudaStreamPerThread) so that the default stream no longer synchronizes with the others. \
Streams created with cudaStreamNonBlocking do not wait on the legacy default stream either.",
    python: None,
    torch: Some("Run this work on a stream of its own (s = torch.cuda.Stream(); with torch.cuda.stream(s): …) \
rather than on the default stream, copy with non_blocking=True, and order it against the \
other streams with events (torch.cuda.Event.record, s.wait_event / s.wait_stream) where it \
really depends on them."),
    jax: None,
    cupy: Some("Run this work on a stream you created (with cupy.cuda.Stream(non_blocking=True): …) rather \
than on the legacy default stream, and order it against the other streams with events \
(cupy.cuda.Event.record, stream.wait_event) where it really depends on them; the per-thread \
default stream (cupy.cuda.Stream.ptds) does not synchronize with the others either."),
};

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Data {
    /// The API that issued the default-stream work (the most frequent one).
    pub api: String,
    pub kernels: u64,
    pub copies: u64,
    pub memsets: u64,
    /// Time operations of other streams waited on this line's work, ns.
    pub others_wait_ns: u64,
    /// Time this line's work waited on other streams' earlier work, ns.
    pub own_wait_ns: u64,
    /// Operations of other streams that waited.
    pub waiting_ops: u64,
    /// Distinct other streams involved (waiting or waited on).
    pub other_streams: u64,
    /// Whether the default stream is known from `stream` records (false: inferred from
    /// synchronous copies).
    pub stream_role_recorded: bool,
}

/// Two copies in the same direction (one copy engine).
fn same_engine(a: OpKind, b: OpKind) -> bool {
    let dir = |k: OpKind| match k {
        OpKind::Copy(CopyKind::HtoD | CopyKind::HtoA) => 1,
        OpKind::Copy(CopyKind::DtoH | CopyKind::AtoH) => 2,
        _ => 0,
    };
    dir(a) != 0 && dir(a) == dir(b)
}

/// Legacy default streams: (ctx, stream) → whether known from a `stream` record.
fn default_streams(cx: &Ctx) -> HashMap<(u32, u32), bool> {
    let m = cx.m;
    // Distinct (ctx, stream) pairs: records come in runs of one stream, so skip repeats cheaply,
    // and sessions have few streams, so look for the others in a short list first. Without any
    // `stream` record no pair has a role: the pairs are not needed.
    let mut pairs: Vec<(u32, u32)> = Vec::new();
    if m.has_stream_roles() {
        const SHORT: usize = 16;
        let mut seen: HashSet<(u32, u32)> = HashSet::new();
        let mut last = None;
        let kernels = m.kernels.ctx.iter().zip(m.kernels.stream.iter());
        let copies = m.copies.ctx.iter().zip(m.copies.stream.iter());
        for p in kernels.chain(copies) {
            if last == Some(p) {
                continue;
            }
            last = Some(p);
            if pairs.len() <= SHORT {
                if !pairs.contains(&p) {
                    pairs.push(p);
                    if pairs.len() > SHORT {
                        seen.extend(pairs.iter().copied());
                    }
                }
            } else if seen.insert(p) {
                pairs.push(p);
            }
        }
    }
    let mut recorded: HashMap<u32, bool> = HashMap::new();
    let mut out = HashMap::new();
    for &(ctx, stream) in &pairs {
        let role = m.stream_role(ctx, stream);
        *recorded.entry(ctx).or_default() |= role.is_some();
        if role == Some(StreamRole::LegacyDefault) {
            out.insert((ctx, stream), true);
        }
    }
    // Contexts without any stream record: synchronous copies and memsets mark the default stream.
    for i in 0..m.copy_count() {
        let (ctx, stream) = (m.copies.ctx.get(i), m.copies.stream.get(i));
        let Some(corr) = m.copy_corr(i).known() else {
            continue;
        };
        if recorded.get(&ctx) == Some(&true) || out.contains_key(&(ctx, stream)) {
            continue;
        }
        if api_name(cx, corr).is_some_and(|n| !n.contains("Async")) {
            out.insert((ctx, stream), false);
        }
    }
    out
}

/// Waiting measured around one default-stream operation.
#[derive(Default, Clone)]
struct DStat {
    others_wait: u64,
    own_wait: u64,
    waiting_ops: u64,
    streams: Vec<u32>,
}

impl DStat {
    fn add_stream(&mut self, s: u32) {
        if self.streams.len() < MAX_STREAMS && !self.streams.contains(&s) {
            self.streams.push(s);
        }
    }
}

/// Measure the waits of one context's operations (`idx`: indices into `ops`, all of this context);
/// returns (op index, stats) for each default-stream operation with any waiting.
fn measure_ctx(
    cx: &Ctx,
    ops: &[GpuOp],
    mut idx: Vec<usize>,
    is_default: impl Fn(&GpuOp) -> bool,
) -> Vec<(usize, DStat)> {
    // Issue order: correlation ids.
    idx.sort_unstable_by_key(|&i| (ops[i].corr, ops[i].start));
    // End of the previous operation of the same stream (stream order is issue order).
    let mut prev_end: HashMap<usize, u64> = HashMap::with_capacity(idx.len());
    let mut last_of_stream: HashMap<u32, u64> = HashMap::new();
    for &i in &idx {
        let o = &ops[i];
        let e = last_of_stream.entry(o.stream).or_insert(0);
        prev_end.insert(i, *e);
        *e = (*e).max(o.end);
    }
    let mut ds: Vec<usize> = idx
        .iter()
        .copied()
        .filter(|&i| is_default(&ops[i]))
        .collect();
    if ds.is_empty() || ds.len() == idx.len() {
        return Vec::new();
    }
    ds.sort_unstable_by_key(|&i| (ops[i].end, ops[i].start));
    let pos: HashMap<usize, usize> = ds.iter().enumerate().map(|(p, &i)| (i, p)).collect();
    let mut stats = vec![DStat::default(); ds.len()];

    // Others waited on D.
    for &x in &idx {
        let xo = &ops[x];
        if is_default(xo) {
            continue;
        }
        let Some(api) = cx.api(xo.corr) else { continue };
        let ready = api.end.max(prev_end[&x]);
        let p = ds.partition_point(|&d| ops[d].end <= xo.start);
        let Some(&d) = p.checked_sub(1).and_then(|p| ds.get(p)) else {
            continue;
        };
        let dop = &ops[d];
        if dop.corr >= xo.corr || same_engine(dop.kind, xo.kind) {
            continue;
        }
        let from = ready.max(dop.start);
        if dop.end > from {
            let st = &mut stats[p - 1];
            st.others_wait += dop.end - from;
            st.waiting_ops += 1;
            st.add_stream(xo.stream);
        }
    }

    // D waited on others: sweep in issue order, keeping each other stream's latest end.
    let mut latest: HashMap<u32, (u64, OpKind)> = HashMap::new();
    let mut by_end: BTreeSet<(u64, u32)> = BTreeSet::new();
    for &i in &idx {
        let o = &ops[i];
        if !is_default(o) {
            let old = latest.get(&o.stream).copied();
            if old.is_none_or(|(e, _)| o.end >= e) {
                if let Some((e, _)) = old {
                    by_end.remove(&(e, o.stream));
                }
                latest.insert(o.stream, (o.end, o.kind));
                by_end.insert((o.end, o.stream));
            }
            continue;
        }
        let Some(api) = cx.api(o.corr) else { continue };
        let ready = api.start.max(prev_end[&i]);
        if ready >= o.start {
            continue;
        }
        let st = &mut stats[pos[&i]];
        let mut last = None;
        for &(e, s) in by_end
            .range((ready + 1, 0)..=(o.start, u32::MAX))
            .rev()
            .take(MAX_STREAMS)
        {
            if latest.get(&s).is_some_and(|&(_, k)| same_engine(k, o.kind)) {
                continue;
            }
            last = last.or(Some(e));
            st.add_stream(s);
        }
        if let Some(e) = last {
            st.own_wait += e - ready;
        }
    }
    ds.into_iter()
        .zip(stats)
        .filter(|(_, s)| s.others_wait + s.own_wait > 0)
        .collect()
}

/// Location of each default-stream kernel without a callsite: that of the sampled launches of the
/// same (kernel, ctx, stream) when they agree (None when they disagree).
fn kernel_locs(
    cx: &Ctx,
    ops: &[GpuOp],
    is_default: &dyn Fn(&GpuOp) -> bool,
) -> HashMap<(u32, u32, u32), Option<LocIx>> {
    let mut m: HashMap<(u32, u32, u32), Option<LocIx>> = HashMap::new();
    for o in ops {
        if o.kind != OpKind::Kernel || !is_default(o) {
            continue;
        }
        let Some(loc) = cx.callsite_loc(o.corr) else {
            continue;
        };
        m.entry((o.name, o.ctx, o.stream))
            .and_modify(|l| {
                if *l != Some(loc) {
                    *l = None
                }
            })
            .or_insert(Some(loc));
    }
    m
}

#[derive(Default)]
struct Acc {
    corrs: HashSet<CorrId>,
    kernels: u64,
    copies: u64,
    memsets: u64,
    others_wait: u64,
    own_wait: u64,
    waiting_ops: u64,
    streams: Vec<(u32, u32)>,
    recorded: bool,
    names: Names,
    ops: Vec<(CorrId, u64, u64)>,
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    // Most sessions have no default-stream work: find that out before building the op list.
    let defaults = default_streams(cx);
    if defaults.is_empty() {
        return Vec::new();
    }
    let ops = gpu_ops(cx);
    let is_default = |o: &GpuOp| defaults.contains_key(&(o.ctx, o.stream));
    let mut by_ctx: HashMap<u32, Vec<usize>> = HashMap::new();
    for (i, o) in ops.iter().enumerate() {
        by_ctx.entry(o.ctx).or_default().push(i);
    }
    let klocs = kernel_locs(cx, &ops, &is_default);
    let mut groups: HashMap<LocIx, Acc> = HashMap::new();
    for (_, idx) in by_ctx {
        for (d, st) in measure_ctx(cx, &ops, idx, is_default) {
            if st.streams.len() < 2 {
                continue;
            }
            let o = &ops[d];
            let loc = cx.callsite_loc(o.corr).or_else(|| match o.kind {
                OpKind::Kernel => klocs.get(&(o.name, o.ctx, o.stream)).copied().flatten(),
                _ => None,
            });
            let Some(loc) = loc else { continue };
            let g = groups.entry(loc).or_default();
            if g.corrs.insert(o.corr) {
                g.ops.push(op_span(cx, o.corr, o.start, o.end));
                match o.kind {
                    OpKind::Kernel => g.kernels += 1,
                    OpKind::Copy(_) => g.copies += 1,
                    OpKind::Memset => g.memsets += 1,
                }
                let name = api_name(cx, o.corr).unwrap_or(match o.kind {
                    OpKind::Kernel => "kernel launch",
                    OpKind::Copy(_) => "copy",
                    OpKind::Memset => "memset",
                });
                g.names.add(name);
            }
            g.others_wait += st.others_wait;
            g.own_wait += st.own_wait;
            g.waiting_ops += st.waiting_ops;
            for s in st.streams {
                if g.streams.len() < MAX_STREAMS && !g.streams.contains(&(o.ctx, s)) {
                    g.streams.push((o.ctx, s));
                }
            }
            g.recorded |= defaults[&(o.ctx, o.stream)];
        }
    }
    groups
        .into_iter()
        .filter(|(_, g)| g.others_wait + g.own_wait >= MIN_WAIT_NS)
        .map(|(loc, mut g)| {
            let w = window(cx, &mut g.ops);
            insight(cx, loc, g, w)
        })
        .collect()
}

fn insight(cx: &Ctx, loc: LocIx, g: Acc, w: Window) -> Insight {
    let location = cx.loc(loc).clone();
    let api = g.names.top();
    let n = g.kernels + g.copies + g.memsets;
    let impact = g.others_wait + g.own_wait;
    let title = format!(
        "Legacy default stream: {api} × {n} @ {} · {} of stream waiting",
        location.short(),
        fmt_duration(impact)
    );
    let how = if g.recorded {
        ""
    } else {
        " (default stream inferred from synchronous copies: this session has no stream records)"
    };
    let (they, them) = if n == 1 {
        ("it", "it")
    } else {
        ("they", "them")
    };
    let mut waits = Vec::new();
    if g.others_wait > 0 {
        waits.push(format!(
            "{} of those streams waited {} for {them} to finish",
            plural(g.waiting_ops, "operation", "operations"),
            fmt_duration(g.others_wait)
        ));
    }
    if g.own_wait > 0 {
        waits.push(format!(
            "{they} waited {} for the other streams' earlier work to drain",
            fmt_duration(g.own_wait)
        ));
    }
    let detail = format!(
        "{} on the legacy default stream{how} {} serialized {} other streams: {} ({})",
        plural(n, "operation", "operations"),
        where_(cx, loc),
        g.streams.len(),
        waits.join("; "),
        w.describe(impact),
    );
    Insight::new(RULE, location, title, detail, cx.fix(&FIX))
        .count(n)
        .impact(impact, w.ns, cx.wall_ns)
        .data(Data {
            api,
            kernels: g.kernels,
            copies: g.copies,
            memsets: g.memsets,
            others_wait_ns: g.others_wait,
            own_wait_ns: g.own_wait,
            waiting_ops: g.waiting_ops,
            other_streams: g.streams.len() as u64,
            stream_role_recorded: g.recorded,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_in_one_direction_share_an_engine() {
        let h2d = OpKind::Copy(CopyKind::HtoD);
        let d2h = OpKind::Copy(CopyKind::DtoH);
        assert!(same_engine(h2d, OpKind::Copy(CopyKind::HtoA)));
        assert!(same_engine(d2h, d2h));
        assert!(!same_engine(h2d, d2h));
        assert!(!same_engine(OpKind::Kernel, OpKind::Kernel));
        assert!(!same_engine(OpKind::Memset, OpKind::Memset));
    }
}
