//! Named scopes (`scope` records: gpufl's API and NVTX ranges) as nested per-thread intervals, and
//! the per-scope roll-up: wall time, GPU busy, kernels, synchronizations and time blocked in them.

use crate::ids::CorrId;
use crate::intervals::DeviceBusy;
use crate::model::Model;
use serde::Serialize;
use std::collections::HashMap;

/// One scope event as loaded (model string index for the name).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawScope {
    pub tid: u64,
    pub ts: u64,
    pub name: u32,
    pub end: bool,
    pub nvtx: bool,
}

/// One scope instance: opened at `start`, closed at `end` on thread `tid`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScopeSpan {
    pub tid: u64,
    pub start: u64,
    /// The close; for a scope never closed, the session's end (`closed` false).
    pub end: u64,
    pub(crate) name: u32,
    /// 0 = outermost on its thread.
    pub depth: u32,
    /// Index of the enclosing span in [`Model::scopes`].
    pub parent: Option<u32>,
    pub closed: bool,
    /// From an NVTX range (else gpufl's API).
    pub nvtx: bool,
}

/// Scopes nest at most this deep per thread: deeper ones (a runaway recursion, a hostile trace)
/// are folded into their ancestor at this depth, so every per-scope walk (paths, the innermost
/// scope of an event) is bounded whatever the trace.
pub const MAX_SCOPE_DEPTH: usize = 256;

/// Spans sorted by (tid, start), with the loading warnings.
pub(crate) fn build(mut raw: Vec<RawScope>, session_end: u64) -> (Vec<ScopeSpan>, Vec<String>) {
    // Stable: events at one instant keep their file order (a push then its pop).
    raw.sort_by_key(|r| (r.tid, r.ts));
    let mut spans: Vec<ScopeSpan> = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut tid = None;
    let (mut unbalanced, mut unclosed, mut folded) = (0u64, 0u64, 0u64);
    // Scopes open beyond MAX_SCOPE_DEPTH on the current thread (not spans).
    let mut deep = 0u64;
    let close_all = |spans: &mut Vec<ScopeSpan>, open: &mut Vec<usize>, n: &mut u64| {
        for i in open.drain(..) {
            spans[i].end = session_end.max(spans[i].start);
            *n += 1;
        }
    };
    for r in raw {
        if tid != Some(r.tid) {
            close_all(&mut spans, &mut open, &mut unclosed);
            deep = 0;
            tid = Some(r.tid);
        }
        if !r.end && open.len() >= MAX_SCOPE_DEPTH {
            deep += 1;
            folded += 1;
            continue;
        }
        if r.end && deep > 0 {
            deep -= 1;
            continue;
        }
        if r.end {
            match open.pop() {
                Some(i) => {
                    spans[i].end = r.ts.max(spans[i].start);
                    spans[i].closed = true;
                }
                None => unbalanced += 1,
            }
        } else {
            spans.push(ScopeSpan {
                tid: r.tid,
                start: r.ts,
                end: r.ts,
                name: r.name,
                depth: open.len() as u32,
                parent: open.last().map(|&p| p as u32),
                closed: false,
                nvtx: r.nvtx,
            });
            open.push(spans.len() - 1);
        }
    }
    close_all(&mut spans, &mut open, &mut unclosed);
    let mut warnings = Vec::new();
    if folded > 0 {
        warnings.push(format!(
            "{folded} scope instance(s) nested deeper than {MAX_SCOPE_DEPTH} levels: counted in their ancestor at that depth"
        ));
    }
    if unbalanced > 0 {
        warnings.push(format!(
            "{unbalanced} scope close(s) without an open scope on their thread: ignored"
        ));
    }
    if unclosed > 0 {
        warnings.push(format!(
            "{unclosed} scope(s) never closed: counted until the end of the session"
        ));
    }
    (spans, warnings)
}

/// One start/end range (NVTX `nvtxRangeStart*` / `nvtxRangeEnd`): it may end on another thread
/// and does not nest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RangeSpan {
    /// Model string index of its name.
    pub name: u32,
    pub start: u64,
    pub end: u64,
    pub tid: u64,
    pub end_tid: Option<u64>,
}

/// Roll-up of every start/end range of one name.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct RangeRollup {
    pub name: String,
    pub count: u64,
    /// Sum of the ranges' durations, ns.
    pub wall_ns: u64,
    /// Longest range, ns.
    pub max_ns: u64,
    /// GPU busy time (any device) overlapping the ranges, ns (summed over ranges).
    pub gpu_busy_ns: u64,
    /// Ranges that ended on another thread than they started on.
    pub cross_thread: u64,
}

/// Per range name, by total wall time (longest first; ties by name). Ranges whose names are the
/// same text count as one name (a later trace file interns its strings again; a lost string is
/// `?`), so the order is total.
pub fn range_rollup(m: &Model, busy: &DeviceBusy) -> Vec<RangeRollup> {
    let gpu = busy.intervals(None);
    let mut by_name: HashMap<&str, RangeRollup> = HashMap::new();
    for r in &m.ranges {
        let name = m
            .strings
            .get(r.name as usize)
            .and_then(|x| x.as_deref())
            .unwrap_or("?");
        let e = by_name.entry(name).or_insert_with(|| RangeRollup {
            name: name.to_string(),
            count: 0,
            wall_ns: 0,
            max_ns: 0,
            gpu_busy_ns: 0,
            cross_thread: 0,
        });
        let d = r.end.saturating_sub(r.start);
        e.count += 1;
        e.wall_ns = e.wall_ns.saturating_add(d);
        e.max_ns = e.max_ns.max(d);
        e.gpu_busy_ns = e
            .gpu_busy_ns
            .saturating_add(crate::intervals::overlap_ns(gpu, r.start, r.end));
        e.cross_thread += u64::from(r.end_tid.is_some_and(|t| t != r.tid));
    }
    let mut v: Vec<RangeRollup> = by_name.into_values().collect();
    v.sort_by(|a, b| b.wall_ns.cmp(&a.wall_ns).then_with(|| a.name.cmp(&b.name)));
    v
}

impl Model {
    /// Start/end ranges in the order they were read.
    pub fn ranges(&self) -> &[RangeSpan] {
        &self.ranges
    }

    /// Scope instances, sorted by (thread, start); parents precede their children.
    pub fn scopes(&self) -> &[ScopeSpan] {
        &self.scopes
    }

    /// A scope's name ("?" if its string was lost).
    pub fn scope_name(&self, s: &ScopeSpan) -> &str {
        self.strings
            .get(s.name as usize)
            .and_then(|x| x.as_deref())
            .unwrap_or("?")
    }

    /// The innermost scope open on thread `tid` at `ts` (start <= ts < end), by index.
    pub fn innermost_scope(&self, tid: u64, ts: u64) -> Option<usize> {
        let sp = &self.scopes;
        // Last span of this thread that started at or before ts.
        let i = sp.partition_point(|s| (s.tid, s.start) <= (tid, ts));
        let mut cur = i.checked_sub(1).filter(|&j| sp[j].tid == tid);
        // Scopes of a thread nest: the innermost one around ts is that span or an ancestor.
        while let Some(j) = cur {
            let s = &sp[j];
            // An NVTX range never closed (NCCL's `ncclCommInitRankConfig` on the thread that made
            // the communicator, pushed and popped elsewhere or never) spans the rest of the
            // session: it names no scope the user's code is in.
            if s.start <= ts && ts < s.end && (s.closed || !s.nvtx) {
                return Some(j);
            }
            cur = s.parent.map(|p| p as usize);
        }
        None
    }

    /// Names from the outermost scope down to span `i`.
    pub fn scope_path(&self, i: usize) -> Vec<String> {
        let mut path = Vec::new();
        let mut cur = Some(i);
        while let Some(j) = cur {
            let s = &self.scopes[j];
            path.push(self.scope_name(s).to_string());
            cur = s.parent.map(|p| p as usize);
        }
        path.reverse();
        path
    }
}

/// Roll-up of every instance of one scope path. The path is shared, not copied: a row names its
/// parent row (see [`rollup_path`]).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct ScopeRollup {
    /// Index in the roll-up of the enclosing scope path's row (absent for an outermost scope).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<u32>,
    pub name: String,
    /// 0 for an outermost scope, its parent's depth + 1 otherwise.
    pub depth: u32,
    /// Instances (summed over threads).
    pub count: u64,
    /// Sum of the instances' durations, ns.
    pub wall_ns: u64,
    /// GPU busy time (any device: union of kernels, copies, memsets) overlapping the instances, ns.
    pub gpu_busy_ns: u64,
    /// Kernels launched on the scope's thread inside it (from `api` records); when the session has
    /// no API record for its kernels, kernels that started on the GPU inside it
    /// (`kernels_by_launch` false).
    pub kernels: u64,
    pub kernels_by_launch: bool,
    /// Synchronizations that started on the scope's thread inside it.
    pub syncs: u64,
    /// Host time blocked in those synchronizations (clipped to the scope), ns.
    pub sync_blocked_ns: u64,
    /// Instances never closed (counted until the session's end).
    pub unclosed: u64,
    /// Whether it came from NVTX ranges.
    pub nvtx: bool,
}

/// Per scope path, in tree order (a parent before its children, siblings by wall time).
pub fn rollup(m: &Model, busy: &DeviceBusy) -> Vec<ScopeRollup> {
    let spans = m.scopes();
    if spans.is_empty() {
        return Vec::new();
    }
    let per_tid = |items: &mut dyn Iterator<Item = (u64, u64, u64)>| {
        let mut map: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
        for (tid, a, b) in items {
            map.entry(tid).or_default().push((a, b));
        }
        for v in map.values_mut() {
            v.sort_unstable();
        }
        map
    };
    let syncs = per_tid(
        &mut m
            .syncs()
            .filter_map(|s| s.tid.map(|t| (t, s.start, s.end.max(s.start)))),
    );
    let kernel_corrs: std::collections::HashSet<CorrId> = m.kernels().map(|k| k.corr).collect();
    let launches = per_tid(
        &mut m
            .apis()
            .filter(|a| kernel_corrs.contains(&a.corr))
            .map(|a| (a.tid, a.start, a.start)),
    );
    let by_launch = !launches.is_empty();
    let mut kernel_starts: Vec<u64> = m.kernels().map(|k| k.start).collect();
    kernel_starts.sort_unstable();
    let gpu = busy.intervals(None);

    // Node of each span: (parent node, name) → node index.
    let mut nodes: Vec<ScopeRollup> = Vec::new();
    let mut parent_of: Vec<Option<usize>> = Vec::new();
    let mut index: HashMap<(Option<usize>, u32), usize> = HashMap::new();
    let mut node_of: Vec<usize> = Vec::with_capacity(spans.len());
    let empty = Vec::new();
    for s in spans {
        let pnode = s.parent.map(|p| node_of[p as usize]);
        let n = *index.entry((pnode, s.name)).or_insert_with(|| {
            nodes.push(ScopeRollup {
                parent: None,
                name: m.scope_name(s).to_string(),
                depth: pnode.map_or(0, |p| nodes[p].depth + 1),
                count: 0,
                wall_ns: 0,
                gpu_busy_ns: 0,
                kernels: 0,
                kernels_by_launch: by_launch,
                syncs: 0,
                sync_blocked_ns: 0,
                unclosed: 0,
                nvtx: s.nvtx,
            });
            parent_of.push(pnode);
            nodes.len() - 1
        });
        node_of.push(n);
        let r = &mut nodes[n];
        let (a, b) = (s.start, s.end);
        r.count += 1;
        r.wall_ns += b - a;
        r.unclosed += u64::from(!s.closed);
        r.gpu_busy_ns += crate::intervals::overlap_ns(gpu, a, b);
        for &(ss, se) in in_range(syncs.get(&s.tid).unwrap_or(&empty), a, b) {
            r.syncs += 1;
            r.sync_blocked_ns += se.min(b) - ss;
        }
        r.kernels += if by_launch {
            in_range(launches.get(&s.tid).unwrap_or(&empty), a, b).len() as u64
        } else {
            let lo = kernel_starts.partition_point(|&t| t < a);
            let hi = kernel_starts.partition_point(|&t| t < b);
            (hi - lo) as u64
        };
    }
    // Tree order: children of each node by wall time, depth first.
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len() + 1];
    for (i, p) in parent_of.iter().enumerate() {
        children[p.unwrap_or(nodes.len())].push(i);
    }
    for c in &mut children {
        c.sort_by(|&x, &y| {
            nodes[y]
                .wall_ns
                .cmp(&nodes[x].wall_ns)
                .then_with(|| nodes[x].name.cmp(&nodes[y].name))
        });
    }
    let mut order = Vec::with_capacity(nodes.len());
    let mut stack: Vec<usize> = children[nodes.len()].iter().rev().copied().collect();
    while let Some(i) = stack.pop() {
        order.push(i);
        stack.extend(children[i].iter().rev().copied());
    }
    // Rows in tree order, each naming its parent's row.
    let mut row_of = vec![0u32; nodes.len()];
    for (row, &i) in order.iter().enumerate() {
        row_of[i] = row as u32;
    }
    let mut slots: Vec<Option<ScopeRollup>> = nodes.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|i| {
            let mut r = slots[i].take()?;
            r.parent = parent_of[i].map(|p| row_of[p]);
            Some(r)
        })
        .collect()
}

/// Names from the outermost scope down to row `i` of a [`rollup`] (empty for a row out of range).
pub fn rollup_path(rows: &[ScopeRollup], i: usize) -> Vec<&str> {
    let mut path = Vec::new();
    let mut cur = rows.get(i);
    // Parents precede their children, so the walk ends; the bound guards hand-made rows.
    while let Some(r) = cur {
        path.push(r.name.as_str());
        if path.len() > rows.len() {
            break;
        }
        cur = r.parent.and_then(|p| rows.get(p as usize));
    }
    path.reverse();
    path
}

/// Items of a sorted (start, end) list whose start lies in [a, b).
fn in_range(v: &[(u64, u64)], a: u64, b: u64) -> &[(u64, u64)] {
    let lo = v.partition_point(|x| x.0 < a);
    let hi = v.partition_point(|x| x.0 < b);
    &v[lo..hi.max(lo)]
}
