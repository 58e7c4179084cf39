//! What the timeline rules share (`gpu-idle`, `launch-bound`, `no-copy-compute-overlap`, the
//! kernel rules, `low-utilization`): each device's GPU ops in start order, the API call that issued
//! an op, merged busy intervals, and the user line of a launch.

use crate::ids::{CorrId, LocIx};
use crate::model::Model;
use crate::shared::Ctx;
use crate::store::Col;
use crate::userframe::{FrameOrigin, SourceLoc};
use crate::views::ApiRec;
use serde::Serialize;
use std::cell::OnceCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// `file` of the location of an insight without a user line.
pub const UNKNOWN_FILE: &str = "<unknown>";

/// How an insight's (or a gap's) line was found, most precise first.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum LocationSource {
    /// The call's own call-site stack (`callsite` record).
    Callsite,
    /// A synchronization's own stack.
    Sync,
    /// The most frequent sampled call site of the same kernel function.
    KernelCallsites,
    /// The first call with a call-site stack after the call, on the same thread before its next
    /// synchronization (the call itself was not sampled).
    NextCallsite,
    /// Approximate: the next synchronization with a stack on the issuing thread (the session has
    /// no call-site stack for the call; recorders before call sites).
    NextSync,
    /// No call site: the kernel's name stands for the location (kernel rules).
    KernelName,
    /// No line could be found.
    None,
}

/// Each device's ops sorted by start (ties in record order, kernels first): `op < kernel_count`
/// is a kernel, `op - kernel_count` a copy (memsets included when asked). With one device every op
/// is its. 4 bytes per op, and the sort is adaptive: records come nearly in start order.
pub(crate) fn device_timelines(m: &Model, memsets: bool) -> Vec<(u32, Vec<u32>)> {
    let devs = m.devices();
    let single = devs.len() == 1;
    let nk = m.kernel_count();
    let mut out: Vec<(u32, Vec<u32>)> = devs.iter().map(|&d| (d, Vec::new())).collect();
    if out.is_empty() {
        return out;
    }
    if single {
        out[0].1.reserve_exact(nk + m.copy_count());
    }
    let slot = |d: u32| {
        if single {
            Some(0)
        } else {
            devs.iter().position(|&x| x == d)
        }
    };
    for (i, d) in m.kernels.dev.iter().enumerate() {
        if let Some(p) = slot(d) {
            out[p].1.push(i as u32);
        }
    }
    let c = &m.copies;
    for (i, (d, op)) in c.dev.iter().zip(c.op.iter()).enumerate() {
        if !memsets && op == crate::views::OP_MEMSET {
            continue;
        }
        if let Some(p) = slot(d) {
            out[p].1.push((nk + i) as u32);
        }
    }
    for (_, v) in &mut out {
        v.sort_by_key(|&op| op_start(m, op));
    }
    out
}

/// Per device (as [`Model::devices`]): whether its kernels come in start order and its copies
/// (memsets included when asked) too, as the recorder writes them (then [`StartOrdered`] walks
/// its ops in [`device_timelines`]'s order without building or sorting a list), and the latest
/// start of its ops (0 without ops). One pass over the start columns.
pub(crate) fn order_and_last_start(m: &Model, memsets: bool) -> Vec<(bool, u64)> {
    let devs = m.devices();
    let single = devs.len() == 1;
    // Per device: in order so far, the last start, the latest start.
    let mut st: Vec<(bool, u64, u64)> = vec![(true, 0, 0); devs.len()];
    let mut table = |starts: &Col<u64>, dv: &Col<u32>, skip: Option<&Col<u8>>| {
        st.iter_mut().for_each(|x| x.1 = 0);
        for (c, ss) in starts.chunks().enumerate() {
            let ops = skip.map_or(&[][..], |o| o.chunk(c));
            if single && ops.is_empty() {
                // The common case: one device, nothing to skip.
                let x = &mut st[0];
                let (mut ok, mut prev, mut last) = (x.0, x.1, x.2);
                for &s in ss {
                    ok &= s >= prev;
                    prev = s;
                    last = last.max(s);
                }
                *x = (ok, prev, last);
                continue;
            }
            for (j, (&s, &d)) in ss.iter().zip(dv.chunk(c)).enumerate() {
                if ops.get(j) == Some(&crate::views::OP_MEMSET) {
                    continue;
                }
                let i = if single {
                    0
                } else {
                    match devs.binary_search(&d) {
                        Ok(i) => i,
                        Err(_) => continue,
                    }
                };
                let x = &mut st[i];
                x.0 &= s >= x.1;
                x.1 = s;
                x.2 = x.2.max(s);
            }
        }
    };
    let (k, c) = (&m.kernels, &m.copies);
    table(&k.start, &k.dev, None);
    let skip = (!memsets && m.memset_count() > 0).then_some(&c.op);
    table(&c.start, &c.dev, skip);
    st.into_iter().map(|(ok, _, last)| (ok, last)).collect()
}

/// The ops of one device, `(op, start, end)` in start order (ties: kernels first, each in record
/// order: the order of [`device_timelines`]), merging its kernels and its copies as they come,
/// when [`order_and_last_start`] says both do.
#[derive(Clone)]
pub(crate) struct StartOrdered<'m> {
    kernels: Rows<'m>,
    copies: Rows<'m>,
    nk: usize,
}

impl<'m> StartOrdered<'m> {
    pub(crate) fn new(m: &'m Model, dev: u32, memsets: bool) -> StartOrdered<'m> {
        // None: every op (the model has one device).
        let dev = (m.devices().len() > 1).then_some(dev);
        let (k, c) = (&m.kernels, &m.copies);
        let skip_memsets = !memsets && m.memset_count() > 0;
        StartOrdered {
            kernels: Rows::new(&k.start, &k.end, &k.dev, None, dev),
            copies: Rows::new(&c.start, &c.end, &c.dev, skip_memsets.then_some(&c.op), dev),
            nk: k.start.len(),
        }
    }
}

impl Iterator for StartOrdered<'_> {
    type Item = (u32, u64, u64);

    #[inline]
    fn next(&mut self) -> Option<(u32, u64, u64)> {
        let take_kernel = match (self.kernels.peek(), self.copies.peek()) {
            (None, None) => return None,
            (Some(ks), Some(cs)) => ks <= cs,
            (k, _) => k.is_some(),
        };
        if take_kernel {
            self.kernels.take().map(|(i, s, e)| (i as u32, s, e))
        } else {
            self.copies
                .take()
                .map(|(i, s, e)| ((self.nk + i) as u32, s, e))
        }
    }
}

/// Ops `(op, start, end)` in start order, handed to a function: one by one, or for
/// [`StartOrdered`] a run of kernels at a time where it can.
pub(crate) trait OpWalk: Iterator<Item = (u32, u64, u64)> + Sized {
    fn walk(self, mut f: impl FnMut(u32, u64, u64)) {
        for (op, s, e) in self {
            f(op, s, e);
        }
    }
}

/// A device's ops as [`device_timelines`] lists them (sorted), with their spans.
#[derive(Clone)]
pub(crate) struct Listed<'m> {
    pub(crate) m: &'m Model,
    pub(crate) ops: std::slice::Iter<'m, u32>,
}

impl Iterator for Listed<'_> {
    type Item = (u32, u64, u64);

    fn next(&mut self) -> Option<(u32, u64, u64)> {
        let &op = self.ops.next()?;
        let (s, e) = op_span(self.m, op);
        Some((op, s, e))
    }
}

impl OpWalk for Listed<'_> {}

impl OpWalk for StartOrdered<'_> {
    /// With one device, the kernels up to the next copy are handed over straight from their
    /// chunk (no merge step per kernel).
    fn walk(mut self, mut f: impl FnMut(u32, u64, u64)) {
        loop {
            let lim = self.copies.peek().unwrap_or(u64::MAX);
            let k = &mut self.kernels;
            if k.dev.is_none() && k.pos < k.s.len() {
                let base = (k.chunk << crate::store::CHUNK_BITS) + k.pos;
                let (ss, es) = (&k.s[k.pos..], &k.e[k.pos..]);
                let mut j = 0;
                while j < ss.len() && ss[j] <= lim {
                    f((base + j) as u32, ss[j], es[j]);
                    j += 1;
                }
                k.pos += j;
                if k.pos >= k.s.len() {
                    k.settle();
                }
                if j > 0 {
                    continue;
                }
            }
            match self.next() {
                Some((op, s, e)) => f(op, s, e),
                None => return,
            }
        }
    }
}

/// A walk over the rows of a table's (start, end) columns, chunk by chunk, keeping those of one
/// device (all when None) and, when `op` is given, leaving memsets out.
#[derive(Clone)]
struct Rows<'m> {
    starts: &'m Col<u64>,
    ends: &'m Col<u64>,
    devs: &'m Col<u32>,
    ops: Option<&'m Col<u8>>,
    dev: Option<u32>,
    /// The current chunk's number and slices, and the position in it.
    chunk: usize,
    s: &'m [u64],
    e: &'m [u64],
    d: &'m [u32],
    o: &'m [u8],
    pos: usize,
}

impl<'m> Rows<'m> {
    fn new(
        starts: &'m Col<u64>,
        ends: &'m Col<u64>,
        devs: &'m Col<u32>,
        ops: Option<&'m Col<u8>>,
        dev: Option<u32>,
    ) -> Rows<'m> {
        let mut r = Rows {
            starts,
            ends,
            devs,
            ops,
            dev,
            chunk: 0,
            s: &[],
            e: &[],
            d: &[],
            o: &[],
            pos: 0,
        };
        r.load(0);
        r.settle();
        r
    }

    /// Chunk `c`'s slices (empty past the last).
    fn load(&mut self, c: usize) {
        self.chunk = c;
        self.pos = 0;
        self.s = self.starts.chunk(c);
        self.e = self.ends.chunk(c);
        self.d = if self.dev.is_some() {
            self.devs.chunk(c)
        } else {
            &[]
        };
        self.o = self.ops.map_or(&[], |o| o.chunk(c));
    }

    /// On to the next row kept (or past the end).
    #[inline]
    fn settle(&mut self) {
        loop {
            while self.pos < self.s.len() {
                let p = self.pos;
                let other_dev = self.dev.is_some_and(|d| self.d[p] != d);
                let memset = !self.o.is_empty() && self.o[p] == crate::views::OP_MEMSET;
                if !other_dev && !memset {
                    return;
                }
                self.pos += 1;
            }
            if self.s.is_empty() {
                return;
            }
            self.load(self.chunk + 1);
        }
    }

    /// The start of the current row.
    #[inline]
    fn peek(&self) -> Option<u64> {
        self.s.get(self.pos).copied()
    }

    /// The current row (its index, start and end), moving past it.
    #[inline]
    fn take(&mut self) -> Option<(usize, u64, u64)> {
        let p = self.pos;
        let row = (
            (self.chunk << crate::store::CHUNK_BITS) + p,
            *self.s.get(p)?,
            self.e[p],
        );
        self.pos += 1;
        if self.dev.is_some() || !self.o.is_empty() || self.pos >= self.s.len() {
            self.settle();
        }
        Some(row)
    }
}

/// Start of an op of a timeline.
pub(crate) fn op_start(m: &Model, op: u32) -> u64 {
    let nk = m.kernel_count();
    let i = op as usize;
    if i < nk {
        m.kernels.start.get(i)
    } else {
        m.copies.start.get(i - nk)
    }
}

/// End of an op of a timeline, never before its start.
pub(crate) fn op_end(m: &Model, op: u32) -> u64 {
    let (s, e) = op_span(m, op);
    e.max(s)
}

pub(crate) fn op_span(m: &Model, op: u32) -> (u64, u64) {
    let nk = m.kernel_count();
    let i = op as usize;
    if i < nk {
        (m.kernels.start.get(i), m.kernels.end.get(i))
    } else {
        (m.copies.start.get(i - nk), m.copies.end.get(i - nk))
    }
}

pub(crate) fn op_corr(m: &Model, op: u32) -> CorrId {
    let nk = m.kernel_count();
    let i = op as usize;
    if i < nk {
        m.kernel_corr(i)
    } else {
        m.copy_corr(i - nk)
    }
}

/// The API call that issued a GPU op (None for correlation id 0, which CUPTI never assigns).
pub(crate) fn issuing_api(cx: &Ctx, corr: CorrId) -> Option<ApiRec> {
    cx.api(corr.known()?)
}

/// Finds API calls by correlation id for a sequence of lookups with mostly increasing ids (GPU
/// ops in start order): a galloping search from the previous hit, O(1) when ids increase.
pub(crate) struct ApiCursor<'a> {
    cx: &'a Ctx<'a>,
    at: usize,
}

impl<'a> ApiCursor<'a> {
    pub(crate) fn new(cx: &'a Ctx<'a>) -> ApiCursor<'a> {
        ApiCursor { cx, at: 0 }
    }

    /// As [`issuing_api`].
    pub(crate) fn find(&mut self, corr: CorrId) -> Option<ApiRec> {
        let v = &self.cx.api_by_corr;
        if corr.known().is_none() || v.is_empty() {
            return None;
        }
        let at = self.at.min(v.len() - 1);
        // Bracket [lo, hi) around the first entry >= corr by doubling steps from `at`.
        let (mut lo, mut hi);
        if v[at].0 < corr {
            let mut step = 1;
            lo = at + 1;
            hi = lo;
            while hi < v.len() && v[hi].0 < corr {
                lo = hi + 1;
                hi = (hi + step).min(v.len());
                step *= 2;
            }
        } else {
            let mut step = 1;
            hi = at;
            lo = at;
            while lo > 0 && v[lo - 1].0 >= corr {
                hi = lo - 1;
                lo = lo.saturating_sub(step);
                step *= 2;
            }
        }
        let hi = hi.min(v.len());
        let lo = lo.min(hi);
        let i = lo + v[lo..hi].partition_point(|a| a.0 < corr);
        self.at = i.min(v.len() - 1);
        match v.get(i) {
            Some(&(c, idx)) if c == corr => Some(self.cx.m.api(idx as usize)),
            _ => None,
        }
    }
}

/// Push into a min-heap of at most `cap` items, keeping the largest.
pub(crate) fn push_capped<T: Ord>(heap: &mut BinaryHeap<Reverse<T>>, item: T, cap: usize) {
    if heap.len() < cap {
        heap.push(Reverse(item));
    } else if let Some(mut min) = heap.peek_mut() {
        if item > min.0 {
            *min = Reverse(item);
        }
    }
}

/// Merged busy intervals of one device, with prefix sums: busy time in a range, idle before an
/// instant.
pub(crate) struct BusyIndex {
    iv: Vec<(u64, u64)>,
    /// `prefix[i]`: busy time of `iv[..i]`.
    prefix: Vec<u64>,
}

impl BusyIndex {
    /// From intervals already sorted and merged (as [`crate::DeviceBusy`] keeps them).
    pub(crate) fn from_merged(iv: Vec<(u64, u64)>) -> BusyIndex {
        let mut prefix = Vec::with_capacity(iv.len() + 1);
        let mut acc = 0u64;
        prefix.push(0);
        for &(s, e) in &iv {
            acc += e - s;
            prefix.push(acc);
        }
        BusyIndex { iv, prefix }
    }

    /// From any intervals (sorted and merged here; empty or inverted ones count for nothing).
    pub(crate) fn from_intervals(mut iv: Vec<(u64, u64)>) -> BusyIndex {
        let n = crate::intervals::merge(&mut iv).len();
        iv.truncate(n);
        Self::from_merged(iv)
    }

    /// Busy time within `[a, b)`.
    pub(crate) fn busy_in(&self, a: u64, b: u64) -> u64 {
        if b <= a {
            return 0;
        }
        let i = self.iv.partition_point(|&(_, e)| e <= a);
        let j = self.iv.partition_point(|&(s, _)| s < b);
        if i >= j {
            return 0;
        }
        let mut t = self.prefix[j] - self.prefix[i];
        let (s0, _) = self.iv[i];
        t -= a.saturating_sub(s0);
        let (_, e1) = self.iv[j - 1];
        t -= e1.saturating_sub(b);
        t
    }

    /// Idle time right before work starting at `t`: the gap that ends at `t` when `t` starts a
    /// busy interval after another; 0 when the device was already busy at `t` or `t` starts the
    /// device's first interval.
    pub(crate) fn idle_before(&self, t: u64) -> u64 {
        let i = self.iv.partition_point(|&(s, _)| s < t);
        match (i.checked_sub(1).map(|p| self.iv[p]), self.iv.get(i)) {
            (Some((_, pe)), Some(&(s, _))) if s == t && pe < t => t - pe,
            _ => 0,
        }
    }
}

/// Kernels outside graphs and their sampled launches, for the kernel-function fallbacks.
#[derive(Default)]
struct SampledLaunches {
    /// (correlation id, kernel name), sorted.
    kernels: Vec<(CorrId, u32)>,
    /// (kernel name, launching thread or `u64::MAX`, location) of each located sampled launch.
    votes: Vec<(u32, u64, LocIx)>,
}

/// Finds the user line of a GPU op's API call, with lazily built indexes.
pub(crate) struct Locator<'a> {
    cx: &'a Ctx<'a>,
    /// (tid, start, loc) of syncs with a user location, sorted.
    syncs_by_tid: OnceCell<Vec<(u64, u64, LocIx)>>,
    /// (start, loc) of the same syncs, sorted.
    syncs_by_start: OnceCell<Vec<(u64, LocIx)>>,
    /// The sampled launches of kernels outside graphs (see [`Locator::sampled_launches`]).
    launches: OnceCell<SampledLaunches>,
    /// (kernel name, most frequent call-site location) of kernels with sampled call sites.
    name_lines: OnceCell<Vec<(u32, LocIx)>>,
    /// ((kernel name, launching thread), most frequent call-site location).
    thread_lines: OnceCell<Vec<((u32, u64), LocIx)>>,
    /// (graph id, most frequent location of its sampled graph launches).
    graph_lines: OnceCell<Vec<(u32, LocIx)>>,
}

impl<'a> Locator<'a> {
    pub(crate) fn new(cx: &'a Ctx<'a>) -> Locator<'a> {
        Locator {
            cx,
            syncs_by_tid: OnceCell::new(),
            syncs_by_start: OnceCell::new(),
            launches: OnceCell::new(),
            name_lines: OnceCell::new(),
            thread_lines: OnceCell::new(),
            graph_lines: OnceCell::new(),
        }
    }

    fn user_syncs(&self) -> &[(u64, u64, LocIx)] {
        self.syncs_by_tid.get_or_init(|| {
            let s = &self.cx.m.syncs;
            let mut v: Vec<(u64, u64, LocIx)> = self
                .cx
                .sync_locs
                .iter()
                .enumerate()
                .filter_map(|(i, &loc)| Some((i, loc?)))
                .filter(|&(_, loc)| !self.cx.is_driver_internal(loc))
                .map(|(i, loc)| (s.tid.get(i), s.start.get(i), loc))
                .collect();
            v.sort_unstable();
            v
        })
    }

    /// The first synchronization with a user location that starts at or after `t`, on thread
    /// `tid`; on any thread when `tid` is None or that thread has none after `t` (e.g. PyTorch's
    /// autograd thread launches the backward pass and never synchronizes).
    pub(crate) fn next_sync(&self, tid: Option<u64>, t: u64) -> Option<LocIx> {
        if let Some(tid) = tid {
            let v = self.user_syncs();
            let i = v.partition_point(|&(x, s, _)| (x, s) < (tid, t));
            if let Some(r) = v.get(i).filter(|r| r.0 == tid) {
                return Some(r.2);
            }
        }
        let v = self.syncs_by_start.get_or_init(|| {
            let mut v: Vec<(u64, LocIx)> =
                self.user_syncs().iter().map(|&(_, s, l)| (s, l)).collect();
            v.sort_unstable();
            v
        });
        let i = v.partition_point(|&(s, _)| s < t);
        v.get(i).map(|r| r.1)
    }

    /// The most frequent location of the sampled launches of CUDA graph `graph` (graph launches
    /// are sampled per executable graph; the kernels of an unsampled replay share its
    /// correlation id, not a call site).
    pub(crate) fn graph_line(&self, graph: u32) -> Option<LocIx> {
        let v = self.graph_lines.get_or_init(|| {
            let m = self.cx.m;
            let votes: Vec<(u32, LocIx)> = m
                .graph_kernels
                .iter()
                .filter_map(|&(k, g)| {
                    let corr = m.kernel_corr(k as usize);
                    Some((g.0, self.cx.callsite_loc(corr)?))
                })
                .collect();
            most_frequent_per_key(votes)
        });
        let i = v.partition_point(|&(g, _)| g < graph);
        v.get(i).filter(|r| r.0 == graph).map(|r| r.1)
    }

    /// Kernels outside graphs by correlation id, and the sampled launches among them with a
    /// located stack (a walk cut short in CUDA is left out). Graph kernels are left out: a node's
    /// kernel function may also be launched directly, elsewhere (graph_replay.cu's `mix`), and
    /// its call site is a graph launch's.
    fn sampled_launches(&self) -> &SampledLaunches {
        self.launches.get_or_init(|| {
            let m = self.cx.m;
            if m.callsites.is_empty() {
                return SampledLaunches::default();
            }
            let in_graph = graph_kernel_mask(m);
            let mut kernels: Vec<(CorrId, u32)> = m
                .kernel_corrs()
                .zip(m.kernel_names())
                .enumerate()
                .filter(|&(i, (c, _))| {
                    c.known().is_some() && !in_graph.get(i).copied().unwrap_or(false)
                })
                .map(|(_, x)| x)
                .collect();
            kernels.sort_unstable();
            kernels.dedup_by_key(|x| x.0);
            // A merge join of the two lists, both sorted by correlation id.
            let mut votes = Vec::new();
            let mut j = 0;
            for &crate::model::Callsite { corr, stack, .. } in &m.callsites {
                while j < kernels.len() && kernels[j].0 < corr {
                    j += 1;
                }
                if j < kernels.len() && kernels[j].0 == corr && !self.cx.stack_is_cut(stack) {
                    if let Some(loc) = self.cx.stack_loc(stack) {
                        let tid = self.cx.api(corr).map_or(u64::MAX, |a| a.tid);
                        votes.push((kernels[j].1, tid, loc));
                    }
                }
            }
            SampledLaunches { kernels, votes }
        })
    }

    /// The most frequent call-site location of sampled launches of a kernel function.
    pub(crate) fn kernel_name_line(&self, name: u32) -> Option<LocIx> {
        let v = self.name_lines.get_or_init(|| {
            let votes = self.sampled_launches().votes.iter();
            most_frequent_per_key(votes.map(|&(n, _, l)| (n, l)).collect())
        });
        let i = v.partition_point(|&(n, _)| n < name);
        v.get(i).filter(|r| r.0 == name).map(|r| r.1)
    }

    /// The most frequent call-site location of the sampled launches of the kernel function that
    /// the launch with correlation id `corr` ran, launched from thread `tid` (a loop's earlier
    /// iterations, sampled while the sampler's schedule was dense, name the line of a later,
    /// unsampled launch of the same kernel from the same thread).
    pub(crate) fn kernel_thread_line(&self, corr: CorrId, tid: u64) -> Option<LocIx> {
        let s = self.sampled_launches();
        let k = s.kernels.partition_point(|&(c, _)| c < corr);
        let name = s.kernels.get(k).filter(|x| x.0 == corr)?.1;
        let v = self.thread_lines.get_or_init(|| {
            let mut votes: Vec<((u32, u64), LocIx)> =
                s.votes.iter().map(|&(n, t, l)| ((n, t), l)).collect();
            votes.sort_unstable();
            // Per key, the most frequent location (ties: the smallest).
            let mut out: Vec<((u32, u64), LocIx)> = Vec::new();
            let mut best = 0usize;
            for run in votes.chunk_by(|a, b| a == b) {
                match out.last_mut() {
                    Some(last) if last.0 == run[0].0 => {
                        if run.len() > best {
                            *last = run[0];
                            best = run.len();
                        }
                    }
                    _ => {
                        out.push(run[0]);
                        best = run.len();
                    }
                }
            }
            out
        });
        let i = v.partition_point(|&(key, _)| key < (name, tid));
        v.get(i).filter(|r| r.0 == (name, tid)).map(|r| r.1)
    }

    /// The user line of the call with correlation id `corr` (a kernel launch when `kernel_name`
    /// is Some): its own call site, the kernel function's sampled call sites, or the next sync on
    /// the calling thread after the call (after `t` when the call is unknown); None with
    /// [`LocationSource::None`].
    pub(crate) fn locate(
        &self,
        corr: CorrId,
        kernel_name: Option<u32>,
        api: Option<&ApiRec>,
        t: u64,
    ) -> (Option<LocIx>, LocationSource) {
        if let Some(loc) = corr.known().and_then(|c| self.cx.callsite_loc(c)) {
            return (Some(loc), LocationSource::Callsite);
        }
        if let Some(loc) = kernel_name.and_then(|n| self.kernel_name_line(n)) {
            return (Some(loc), LocationSource::KernelCallsites);
        }
        let (tid, at) = match api {
            Some(a) => (Some(a.tid), a.start),
            None => (None, t),
        };
        match self.next_sync(tid, at) {
            Some(loc) => (Some(loc), LocationSource::NextSync),
            None => (None, LocationSource::None),
        }
    }

    /// The location for an insight: the context's location `loc`, or [`unknown_loc`] for None.
    pub(crate) fn source_loc(&self, loc: impl Into<Option<LocIx>>) -> SourceLoc {
        loc.into()
            .and_then(|l| self.cx.locs.get(l.index()))
            .cloned()
            .unwrap_or_else(unknown_loc)
    }
}

/// For each key of `(key, value)` pairs, its most frequent value (ties: the smallest), sorted by key.
pub(crate) fn most_frequent_per_key<K: Ord + Copy, V: Ord + Copy>(
    mut v: Vec<(K, V)>,
) -> Vec<(K, V)> {
    v.sort_unstable();
    let mut out: Vec<(K, V)> = Vec::new();
    let mut best: Option<(K, V, usize)> = None;
    let mut i = 0;
    while i < v.len() {
        let j = i + v[i..].iter().take_while(|x| **x == v[i]).count();
        let (k, val, n) = (v[i].0, v[i].1, j - i);
        match best {
            Some((bk, _, bn)) if bk == k => {
                if n > bn {
                    best = Some((k, val, n));
                }
            }
            _ => {
                if let Some((bk, bv, _)) = best {
                    out.push((bk, bv));
                }
                best = Some((k, val, n));
            }
        }
        i = j;
    }
    if let Some((bk, bv, _)) = best {
        out.push((bk, bv));
    }
    out
}

/// The location of an insight or gap with no user line.
pub(crate) fn unknown_loc() -> SourceLoc {
    SourceLoc {
        file: UNKNOWN_FILE.to_string(),
        line: None,
        function: None,
        origin: FrameOrigin::DriverInternal,
        text: None,
        library: None,
    }
}

/// A note for the detail of an insight whose line is approximate.
pub(crate) fn location_note(src: LocationSource, what: &str) -> String {
    match src {
        LocationSource::KernelCallsites => format!(
            " (line from sampled launches of the same kernel: not every one of {what} was sampled)"
        ),
        LocationSource::NextCallsite => format!(
            " (line approximate: the session has no call-site stack for {what}, so this is the \
             first sampled call after it on the same thread)"
        ),
        LocationSource::NextSync => format!(
            " (line approximate: the session has no call-site stack for {what}, so this is the \
             next synchronization after them, on the calling thread if it has one)"
        ),
        LocationSource::None => {
            format!(" (no line: the session has no call-site stack for {what})")
        }
        _ => String::new(),
    }
}

/// `median` and `p99` (nearest rank) of a slice, reordering it; `(0, 0)` when empty.
pub(crate) fn median_p99<T: Copy + Ord + Into<u64>>(v: &mut [T]) -> (u64, u64) {
    if v.is_empty() {
        return (0, 0);
    }
    v.sort_unstable();
    let n = v.len();
    let at = |i: usize| -> u64 { v[i].into() };
    let med = if n % 2 == 1 {
        at(n / 2)
    } else {
        at(n / 2 - 1) + (at(n / 2) - at(n / 2 - 1)) / 2
    };
    let rank = (n * 99).div_ceil(100).max(1);
    (med, at(rank - 1))
}

/// Which kernels a graph launch ran, by index into the model's kernels (empty when none did).
pub(crate) fn graph_kernel_mask(m: &Model) -> Vec<bool> {
    if m.graph_kernels.is_empty() {
        return Vec::new();
    }
    let mut v = vec![false; m.kernel_count()];
    for &(i, _) in &m.graph_kernels {
        if let Some(x) = v.get_mut(i as usize) {
            *x = true;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufl_trace::{Kernel, Memcpy, Memset, Record};

    #[test]
    fn runs_of_kernels_across_chunks_are_the_sorted_timeline() {
        // More kernels than a column chunk holds, copies among them, one device.
        let recs = (0..70_000u64).map(|i| {
            let (start, end) = (i / 2 * 10, i / 2 * 10 + 15);
            if i % 997 == 0 {
                Record::Memcpy(Memcpy {
                    start,
                    end,
                    ..Memcpy::default()
                })
            } else {
                Record::Kernel(Kernel {
                    start,
                    end,
                    ..Kernel::default()
                })
            }
        });
        let m = Model::load(recs);
        assert!(order_and_last_start(&m, true)[0].0);
        let want: Vec<(u32, u64, u64)> = device_timelines(&m, true)[0]
            .1
            .iter()
            .map(|&op| {
                let (s, e) = op_span(&m, op);
                (op, s, e)
            })
            .collect();
        let mut walked = Vec::new();
        StartOrdered::new(&m, 0, true).walk(|op, s, e| walked.push((op, s, e)));
        assert_eq!(walked.len(), 70_000);
        assert!(walked == want);
    }

    #[test]
    fn ops_merged_as_they_come_are_the_sorted_timelines() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for round in 0..40 {
            let devices = 1 + round % 3;
            // Kernels in start order, copies and memsets (one table) too, with frequent ties
            // across the two; interleaved in the file at random.
            let mut t = [0u64; 2];
            let mut recs = Vec::new();
            for _ in 0..300 {
                let kind = rnd(3) as usize;
                let at = &mut t[kind.min(1)];
                *at += rnd(if round % 2 == 0 { 4 } else { 100 });
                // Some empty and inverted ops.
                let len = rnd(50);
                let end = if rnd(10) == 0 {
                    at.saturating_sub(len)
                } else {
                    *at + len
                };
                let (start, dev) = (*at, rnd(devices) as u32);
                recs.push(match kind {
                    0 => Record::Kernel(Kernel {
                        start,
                        end,
                        dev,
                        ..Kernel::default()
                    }),
                    1 => Record::Memcpy(Memcpy {
                        start,
                        end,
                        dev,
                        ..Memcpy::default()
                    }),
                    _ => Record::Memset(Memset {
                        start,
                        end,
                        dev,
                        ..Memset::default()
                    }),
                });
            }
            let unsorted = round % 5 == 4;
            if unsorted {
                // A kernel of device 0 after later ones: its starts go back.
                recs.push(Record::Kernel(Kernel::default()));
            }
            let m = Model::load(recs);
            for memsets in [true, false] {
                let ext = order_and_last_start(&m, memsets);
                let ordered: Vec<bool> = ext.iter().map(|x| x.0).collect();
                let timelines = device_timelines(&m, memsets);
                for (di, &dev) in m.devices().iter().enumerate() {
                    let ops = &timelines[di].1;
                    let sorted = ops
                        .windows(2)
                        .all(|w| op_start(&m, w[0]) <= op_start(&m, w[1]));
                    assert!(sorted);
                    if !ordered[di] {
                        assert!(unsorted, "round {round}");
                        continue;
                    }
                    let want: Vec<(u32, u64, u64)> = ops
                        .iter()
                        .map(|&op| {
                            let (s, e) = op_span(&m, op);
                            (op, s, e)
                        })
                        .collect();
                    let got: Vec<(u32, u64, u64)> = StartOrdered::new(&m, dev, memsets).collect();
                    assert_eq!(got, want, "round {round}, device {dev}, memsets {memsets}");
                    // Runs of kernels handed over at once: the same ops, in the same order.
                    let mut walked = Vec::new();
                    StartOrdered::new(&m, dev, memsets).walk(|op, s, e| walked.push((op, s, e)));
                    assert_eq!(
                        walked, want,
                        "round {round}, device {dev}, memsets {memsets}"
                    );
                    let mut listed = Vec::new();
                    let ops = ops.iter();
                    Listed { m: &m, ops }.walk(|op, s, e| listed.push((op, s, e)));
                    assert_eq!(listed, want);
                    let last = want.iter().map(|o| o.1).max().unwrap_or(0);
                    assert_eq!(ext[di].1, last);
                    if memsets {
                        // gpu-idle's latest end: the busy intervals' (kernels, copies and
                        // memsets) or a later start.
                        let busy = crate::DeviceBusy::new(&m);
                        let end = busy.intervals(Some(dev)).last().map_or(0, |iv| iv.1);
                        let want_end = want.iter().map(|o| o.2.max(o.1)).max();
                        assert_eq!(Some(last.max(end)), want_end, "round {round}");
                    }
                }
                if unsorted {
                    assert!(ordered.iter().any(|&o| !o), "round {round}");
                }
            }
        }
    }

    #[test]
    fn median_and_p99_nearest_rank() {
        assert_eq!(median_p99::<u64>(&mut []), (0, 0));
        assert_eq!(median_p99(&mut [7u32]), (7, 7));
        assert_eq!(median_p99(&mut [4u64, 1, 3, 2]), (2, 4));
        let mut v: Vec<u64> = (1..=200).collect();
        assert_eq!(median_p99(&mut v), (100, 198));
        let mut v: Vec<u64> = (1..=100).collect();
        assert_eq!(median_p99(&mut v), (50, 99));
    }

    #[test]
    fn api_cursor_agrees_with_binary_search_in_any_order() {
        use gpufl_trace::{Api, Record, StrId};
        let recs: Vec<Record> = (1..=300u32)
            .map(|i| {
                Record::Api(Api {
                    name: StrId(0),
                    start: i as u64,
                    end: i as u64 + 1,
                    corr: i * 2,
                    ..Api::default()
                })
            })
            .collect();
        let m = Model::load(recs);
        let busy = crate::DeviceBusy::new(&m);
        let cx = Ctx::new(&m, &crate::Config::default(), &busy, 0);
        let mut cur = ApiCursor::new(&cx);
        // Increasing, decreasing, jumping, missing, out of range and zero ids.
        let mut queries: Vec<u32> = (0..700).collect();
        queries.extend((0..700).rev());
        queries.extend([600, 2, 599, 3, 300, 301, 1, 0, 10_000, 598, 4]);
        let mut x: u32 = 12345;
        for _ in 0..2000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            queries.push(x % 650);
        }
        for q in queries {
            let want = if q == 0 { None } else { cx.api(CorrId(q)) };
            assert_eq!(cur.find(CorrId(q)), want, "corr {q}");
        }
    }

    #[test]
    fn most_frequent_value_per_key() {
        let v = vec![
            (1, 5),
            (2, 7),
            (1, 6),
            (1, 6),
            (2, 3),
            (2, 7),
            (3, 9),
            (3, 8),
        ];
        assert_eq!(most_frequent_per_key(v), vec![(1, 6), (2, 7), (3, 8)]);
        assert!(most_frequent_per_key(Vec::<(u32, u32)>::new()).is_empty());
    }
}
