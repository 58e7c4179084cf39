//! CUDA graphs as units (shared by the rules and the report): the kernels, copies and memsets a
//! graph launch ran carry their graph node (`graph` on the records) and the graph launch's
//! correlation id, so one (graph, correlation id) pair is one *replay*. Per graph: its replays,
//! the time of one replay (first operation's start to last one's end), the GPU busy inside it,
//! the gaps between consecutive replays and what the launching thread did there (a host
//! synchronization that returned inside the gap), the graph launch's line (its `callsite`
//! record), and the nodes that take most of a replay's time.

use crate::ids::{CorrId, LocIx};
use crate::shared::timeline::{median_p99, most_frequent_per_key, BusyIndex};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use crate::views::CopyOp;
use serde::Serialize;
use std::collections::HashMap;

/// A sync that returned this much before a replay's recorded end still counts as waiting for
/// it (the host's and the GPU's timestamps of one instant can differ by a little).
pub const SYNC_SLACK_NS: u64 = 2_000;

/// Operations shown per graph in [`GraphSummary::top`].
pub const TOP_OPS: usize = 5;

/// One CUDA graph's replays (on one device).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct GraphSummary {
    /// CUPTI's graph id.
    pub graph: u32,
    pub device: u32,
    /// Graph launches that ran work (distinct correlation ids).
    pub replays: u64,
    /// Distinct graph nodes seen.
    pub nodes: u64,
    /// Kernels, copies and memsets the replays ran.
    pub ops: u64,
    /// One replay's time, first operation's start to last one's end: median, 99th percentile
    /// (nearest rank) and total, ns.
    pub replay_median_ns: u64,
    pub replay_p99_ns: u64,
    pub replay_total_ns: u64,
    /// GPU busy inside the replays (union of their operations), ns.
    pub busy_ns: u64,
    /// Gaps between consecutive replays (end of one to start of the next; 0 when they overlap):
    /// how many, median, total, and the device's idle time inside them, ns.
    pub gaps: u64,
    pub gap_median_ns: u64,
    pub gap_total_ns: u64,
    pub gap_idle_ns: u64,
    /// Gaps in which a host synchronization of the launching thread returned (the host waited for
    /// the replay before launching the next), the time blocked in those syncs, and the device's
    /// idle time in those gaps.
    pub gaps_with_sync: u64,
    pub sync_blocked_ns: u64,
    pub sync_gap_idle_ns: u64,
    /// The most frequent user line of those synchronizations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_location: Option<SourceLoc>,
    /// The most frequent user line of the graph launch calls (`callsite` records).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_location: Option<SourceLoc>,
    /// The most frequent user line among the calls that created the graph's nodes (`gnode`
    /// records: the launches and copies a stream capture turned into nodes), when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capture_location: Option<SourceLoc>,
    /// Median host time of a graph launch call (`api` records), ns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_call_median_ns: Option<u64>,
    /// The operations with the most GPU time over all replays, most first (at most [`TOP_OPS`]).
    pub top: Vec<GraphOp>,
}

/// A kernel (by name), or copies or memsets of a kind, inside a graph's replays.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct GraphOp {
    pub name: String,
    /// Executions over all replays.
    pub count: u64,
    pub total_ns: u64,
    /// `total_ns` over the summed duration of all the graph's operations, 0..1.
    pub share: f64,
    /// The most frequent user line of the calls that created its nodes, when recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<SourceLoc>,
}

/// One operation a graph ran.
struct Op {
    graph: u32,
    corr: CorrId,
    start: u64,
    end: u64,
    dev: u32,
    node: u64,
    /// Kernel name string id, or None for a copy / memset (`label`).
    name: Option<u32>,
    label: &'static str,
}

/// What names an operation: its kernel name string id, else its label ([`Op`]).
type OpName = (Option<u32>, &'static str);

/// One replay.
struct Replay {
    corr: CorrId,
    start: u64,
    end: u64,
}

/// Every graph of the session, the most GPU time inside replays first (ties: graph id).
pub(crate) fn summarize(cx: &Ctx) -> Vec<GraphSummary> {
    let m = cx.m;
    if m.graph_kernels.is_empty() && m.graph_copies.is_empty() {
        return Vec::new();
    }
    let mut ops: Vec<Op> = Vec::with_capacity(m.graph_kernels.len() + m.graph_copies.len());
    for &(i, g) in &m.graph_kernels {
        let k = m.kernel(i as usize);
        ops.push(Op {
            graph: g.0,
            corr: k.corr,
            start: k.start,
            end: k.end.max(k.start),
            dev: k.dev,
            node: g.1,
            name: Some(k.name.0),
            label: "",
        });
    }
    for &(i, g) in &m.graph_copies {
        let c = m.copy(i as usize);
        ops.push(Op {
            graph: g.0,
            corr: c.corr,
            start: c.start,
            end: c.end.max(c.start),
            dev: c.dev,
            node: g.1,
            name: None,
            label: match c.op {
                CopyOp::Memcpy { .. } => "[memcpy]",
                CopyOp::Memset { .. } => "[memset]",
            },
        });
    }
    ops.sort_unstable_by_key(|o| (o.graph, o.dev, o.corr, o.start));

    let sync_ends = SyncEnds::new(m);

    let sites = SiteCalls::new(cx);
    let mut out = Vec::new();
    let mut busy_by_dev: HashMap<u32, BusyIndex> = HashMap::new();
    let single = m.devices().len() == 1;
    let mut i = 0;
    while i < ops.len() {
        let (g, dev) = (ops[i].graph, ops[i].dev);
        let j = i + ops[i..]
            .iter()
            .take_while(|o| o.graph == g && o.dev == dev)
            .count();
        let busy = busy_by_dev.entry(dev).or_insert_with(|| {
            BusyIndex::from_merged(cx.busy.intervals((!single).then_some(dev)).to_vec())
        });
        out.push(one_graph(cx, &ops[i..j], busy, &sync_ends, &sites));
        i = j;
    }
    out.sort_by(|a, b| b.busy_ns.cmp(&a.busy_ns).then(a.graph.cmp(&b.graph)));
    out
}

fn one_graph(
    cx: &Ctx,
    ops: &[Op],
    busy: &BusyIndex,
    sync_ends: &SyncEnds,
    sites: &SiteCalls,
) -> GraphSummary {
    let m = cx.m;
    let (graph, device) = (ops[0].graph, ops[0].dev);
    // Replays: runs of one correlation id (ops are sorted by corr, then start).
    let mut replays: Vec<Replay> = Vec::new();
    let mut busy_ns = 0u64;
    let mut k = 0;
    while k < ops.len() {
        let corr = ops[k].corr;
        let n = ops[k..].iter().take_while(|o| o.corr == corr).count();
        let run = &ops[k..k + n];
        let (mut s, mut e, mut covered_to) = (u64::MAX, 0u64, 0u64);
        for o in run {
            s = s.min(o.start);
            e = e.max(o.end);
            // Union of the replay's operations (sorted by start).
            let from = o.start.max(covered_to);
            if o.end > from {
                busy_ns = busy_ns.saturating_add(o.end - from);
            }
            covered_to = covered_to.max(o.end);
        }
        replays.push(Replay {
            corr,
            start: s,
            end: e,
        });
        k += n;
    }
    replays.sort_unstable_by_key(|r| (r.start, r.end));
    let mut spans: Vec<u64> = replays.iter().map(|r| r.end - r.start).collect();
    let replay_total_ns = spans.iter().fold(0u64, |a, &d| a.saturating_add(d));
    let (replay_median_ns, replay_p99_ns) = median_p99(&mut spans);

    // Launch calls: their host time and line.
    let mut launch_ns: Vec<u64> = Vec::new();
    let mut site_votes: Vec<(u32, LocIx)> = Vec::new();
    let mut tid_of: Vec<Option<u64>> = Vec::with_capacity(replays.len());
    for r in &replays {
        let api = r.corr.known().and_then(|c| cx.api(c));
        tid_of.push(api.as_ref().map(|a| a.tid));
        let site = r.corr.known().and_then(|c| cx.callsite_loc(c));
        // CUPTI gives graph work the correlation id of the driver's graph launch, while the call
        // site is taken at the runtime's call around it (cudaGraphLaunch → cuGraphLaunch): the
        // enclosing call on the same thread then holds the line and the host time.
        let outer = api.as_ref().and_then(|a| sites.enclosing(a));
        match (&outer, &api) {
            (Some(o), _) => launch_ns.push(o.end.saturating_sub(o.start)),
            (None, Some(a)) => launch_ns.push(a.duration_ns()),
            _ => {}
        }
        if let Some(l) = site.or_else(|| outer.and_then(|o| cx.callsite_loc(o.corr))) {
            site_votes.push((0, l));
        }
    }

    // Gaps, and the host synchronizations that returned inside them.
    let mut gaps: Vec<u64> = Vec::new();
    let (mut gap_idle_ns, mut gaps_with_sync, mut sync_blocked_ns, mut sync_gap_idle_ns) =
        (0u64, 0u64, 0u64, 0u64);
    let mut sync_votes: Vec<(u32, LocIx)> = Vec::new();
    for w in 1..replays.len() {
        let (prev, next) = (&replays[w - 1], &replays[w]);
        let (a, b) = (prev.end, next.start);
        // A gap holding time in which the GPU was not observed (paused, outside an always-on
        // session's windows) is left out: what happened there is unknown.
        if m.unobserved_in(a, b) > 0 {
            continue;
        }
        let gap = b.saturating_sub(a);
        gaps.push(gap);
        if gap == 0 {
            continue;
        }
        let idle = gap - busy.busy_in(a, b).min(gap);
        gap_idle_ns = gap_idle_ns.saturating_add(idle);
        // The thread that launched the next replay (else the previous one's); any thread when
        // API records are off.
        let tid = tid_of[w].or(tid_of[w - 1]);
        if let Some(si) = sync_ends.within(tid, a.saturating_sub(SYNC_SLACK_NS), b) {
            let s = m.sync(si as usize);
            gaps_with_sync += 1;
            sync_blocked_ns = sync_blocked_ns.saturating_add(s.end.saturating_sub(s.start));
            sync_gap_idle_ns = sync_gap_idle_ns.saturating_add(idle);
            if let Some(l) = cx.sync_loc(si as usize) {
                sync_votes.push((0, l));
            }
        }
    }
    let gap_total_ns = gaps.iter().fold(0u64, |a, &d| a.saturating_add(d));
    let gap_count = gaps.len() as u64;
    let (gap_median_ns, _) = median_p99(&mut gaps);
    let loc = |votes: Vec<(u32, LocIx)>| -> Option<SourceLoc> {
        most_frequent_per_key(votes)
            .first()
            .map(|&(_, l)| cx.loc(l).clone())
    };

    // Nodes, and the operations with the most time (with the line that put each into the graph).
    let mut nodes: Vec<u64> = ops.iter().map(|o| o.node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let created: Vec<(u64, (u64, LocIx))> = nodes
        .iter()
        .filter_map(|&n| creation_loc(cx, n).map(|c| (n, c)))
        .collect();
    let node_locs: HashMap<u64, LocIx> = created.iter().map(|&(n, (_, l))| (n, l)).collect();
    // Where the graph was captured: the line that made its first node (node ids count up within a
    // graph, so the smallest original id is the first node captured); a line found on a node
    // itself rather than on the one it was cloned from (the instantiating call) only when no
    // original has one.
    let capture_location = created
        .iter()
        .map(|&(n, (orig, l))| (orig == n, orig, l))
        .min()
        .map(|(_, _, l)| cx.loc(l).clone());
    let mut slot: HashMap<OpName, usize> = HashMap::new();
    let mut per_name: Vec<(OpName, u64, u64)> = Vec::new();
    let mut loc_votes: Vec<(u32, LocIx)> = Vec::new();
    let mut all_ns = 0u64;
    for o in ops {
        let d = o.end - o.start;
        all_ns = all_ns.saturating_add(d);
        let i = *slot.entry((o.name, o.label)).or_insert_with(|| {
            per_name.push(((o.name, o.label), 0, 0));
            per_name.len() - 1
        });
        per_name[i].1 += 1;
        per_name[i].2 = per_name[i].2.saturating_add(d);
        if let Some(&l) = node_locs.get(&o.node) {
            loc_votes.push((i as u32, l));
        }
    }
    let loc_of: HashMap<u32, LocIx> = most_frequent_per_key(loc_votes).into_iter().collect();
    let mut top: Vec<GraphOp> = per_name
        .into_iter()
        .enumerate()
        .map(|(i, ((name, label), count, total_ns))| GraphOp {
            name: match name {
                None => label.to_string(),
                Some(name) => m.str(gpufl_trace::StrId(name)).to_string(),
            },
            count,
            total_ns,
            share: crate::insight::share(total_ns, all_ns),
            created_at: loc_of.get(&(i as u32)).map(|&l| cx.loc(l).clone()),
        })
        .collect();
    top.sort_by(|a, b| b.total_ns.cmp(&a.total_ns).then(a.name.cmp(&b.name)));
    top.truncate(TOP_OPS);

    GraphSummary {
        graph,
        device,
        replays: replays.len() as u64,
        nodes: nodes.len() as u64,
        ops: ops.len() as u64,
        replay_median_ns,
        replay_p99_ns,
        replay_total_ns,
        busy_ns,
        gaps: gap_count,
        gap_median_ns,
        gap_total_ns,
        gap_idle_ns,
        gaps_with_sync,
        sync_blocked_ns,
        sync_gap_idle_ns,
        sync_location: loc(sync_votes),
        launch_location: loc(site_votes),
        capture_location,
        launch_call_median_ns: (!launch_ns.is_empty()).then(|| median_p99(&mut launch_ns).0),
        top,
    }
}

/// The graph launch calls (`api` records of `cudaGraphLaunch`, `cuGraphLaunch` and their
/// variants), by thread and start: (tid, start, end, corr).
struct SiteCalls(Vec<(u64, u64, u64, CorrId)>);

/// An API call found around another one.
struct Outer {
    start: u64,
    end: u64,
    corr: CorrId,
}

impl SiteCalls {
    fn new(cx: &Ctx) -> SiteCalls {
        let mut v: Vec<(u64, u64, u64, CorrId)> =
            cx.m.apis()
                .filter(|a| cx.m.str(a.name).contains("GraphLaunch"))
                .map(|a| (a.tid, a.start, a.end.max(a.start), a.corr))
                .collect();
        v.sort_unstable();
        SiteCalls(v)
    }

    /// The graph launch call that encloses `inner` on its thread (the runtime's around the
    /// driver's; the innermost among the few that start last before it).
    fn enclosing(&self, inner: &crate::views::ApiRec) -> Option<Outer> {
        let v = &self.0;
        let upto = v.partition_point(|r| (r.0, r.1) <= (inner.tid, inner.start));
        v[..upto]
            .iter()
            .rev()
            .take(8)
            .take_while(|r| r.0 == inner.tid)
            .find(|r| r.3 != inner.corr && r.2 >= inner.end)
            .map(|r| Outer {
                start: r.1,
                end: r.2,
                corr: r.3,
            })
    }
}

/// Host synchronizations by end time, per thread and all together, for "did the host wait in
/// this gap": each question is two binary searches, however many syncs or threads there are.
struct SyncEnds {
    /// (tid, end, index), sorted.
    by_tid: Vec<(u64, u64, u32)>,
    /// (end, index), sorted.
    by_end: Vec<(u64, u32)>,
}

impl SyncEnds {
    fn new(m: &crate::Model) -> SyncEnds {
        let syncs = &m.syncs;
        let mut by_tid: Vec<(u64, u64, u32)> = (0..m.sync_count())
            .map(|i| (syncs.tid.get(i), syncs.end.get(i), i as u32))
            .collect();
        by_tid.sort_unstable();
        let mut by_end: Vec<(u64, u32)> = by_tid.iter().map(|r| (r.1, r.2)).collect();
        by_end.sort_unstable();
        SyncEnds { by_tid, by_end }
    }

    /// A synchronization of thread `tid` (any thread when None) that returned within `[a, b]`:
    /// the one that returned last (ties: the highest index), as an index into the syncs.
    fn within(&self, tid: Option<u64>, a: u64, b: u64) -> Option<u32> {
        let (end, idx) = match tid {
            Some(t) => {
                let lo = self.by_tid.partition_point(|r| r.0 < t);
                let rows = &self.by_tid[lo..];
                let rows = &rows[..rows.partition_point(|r| r.0 == t)];
                let r = rows[..rows.partition_point(|r| r.1 <= b)].last()?;
                (r.1, r.2)
            }
            None => *self.by_end[..self.by_end.partition_point(|r| r.0 <= b)].last()?,
        };
        (end >= a).then_some(idx)
    }
}

/// The node `node` was first made as (following the nodes it was cloned from, at most 8 steps:
/// instantiation clones once, a clone of a clone is rare), and the user location of the context:
/// the line of the call that made it. An instantiated graph's nodes are clones of the captured ones,
/// and CUDA may also report them as created (at the instantiating call): the captured node's line
/// (the launch that was captured) is the one to show, the clone's own only when the original has
/// none.
fn creation_loc(cx: &Ctx, node: u64) -> Option<(u64, LocIx)> {
    let mut n = node;
    let mut found = None;
    for _ in 0..8 {
        let Some(&(stack, from)) = cx.m.graph_nodes.get(&n) else {
            break;
        };
        if let Some(l) = stack
            .and_then(|s| cx.stack_loc(s))
            .filter(|&l| !cx.loc(l).is_unattributed())
        {
            found = Some((n, l));
        }
        match from {
            Some(f) if f != n => n = f,
            _ => break,
        }
    }
    found
}
