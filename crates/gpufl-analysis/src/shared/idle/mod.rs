//! Every device's idle gaps between its GPU work, classified by what the host was doing, with a
//! per-device summary ([`DeviceIdle`]: class totals, largest gaps, utilization over time; the
//! `gpu_idle` of the analysis). Shared, not a rule: the rule `gpu-idle` makes its insights from
//! the gaps grouped by (class, line) ([`IdleScan::groups`]), `low-utilization` reads the summary.
//!
//! - **Gaps:** per device, the union of kernels, copies and memsets between the device's first and
//!   last op (`[first start, last end]`, its *active range*); a gap is a hole in that union.
//!   Gaps under [`MIN_GAP_NS`] are `kernel_wait` (HTA's name: the GPU front end between two queued
//!   ops; not actionable) and are counted, not classified.
//! - **Classes** (of the op that ends the gap, its issuing API call found by correlation id):
//!   `sync` when the thread that issued that op (all threads when its API call is unknown) was
//!   blocked in a synchronization or a blocking copy (`cudaMemcpy*`/`cuMemcpy*` without `Async`)
//!   for more than half of the gap; else `launch` when that API call began at or after the gap's
//!   start (the host issued the work only after the GPU had run out of it); else `other` (the
//!   work was already queued: stream/event dependencies, other devices, or unknown).
//! - **Lines:** `launch`: the call's own call-site stack, else the most frequent sampled call site
//!   of the same kernel function, else (sessions without call sites) the next synchronization with
//!   a stack on the issuing thread (approximate; said in the insight). `sync`: the sync's own
//!   stack, or the blocking copy's call site. `other`: no line.
//! - **One-off pauses** of a (class, line) ([`Group::settle`]): from the longest gap down, each
//!   gap longer than all the group's shorter gaps together (the wait before the first step, a lazy
//!   module load, a checkpoint) is left out of its figures (it stays in the summary's top gaps).
//! - **Not observed:** a gap that overlaps a paused interval or, in an always-on session, time
//!   outside its windows ([`Model::unobserved`]) is neither a gap nor idle time: what the GPU did
//!   there is unknown (a window's first op may follow work that ran before the window opened).
//! - **Utilization** ([`utilization`]): each device's active range cut into [`UTIL_CHUNKS`] equal
//!   chunks (as `nsys analyze gpu_time_util`), the busy share of each. **Low chunks**
//!   ([`mark_low`]): the device's one-off pauses ([`one_off_pauses`]: from its longest gap down,
//!   each gap longer than all its shorter gaps together — startup, a lazy load, a checkpoint) are
//!   cut out of each chunk, with the time the GPU was not observed; a chunk is `low` when it is not
//!   mostly (more than half) pause or unobserved and is busy less than 50 % of what remains. Their
//!   count, [`DeviceIdle::low_utilization_chunks`], is the one every view shows (the report's
//!   header, the headline, `low-utilization`'s title, the dashboard).

pub(crate) mod utilization;

use crate::ids::LocIx;
use crate::model::Model;
use crate::shared::advice::Fix;
use crate::shared::host::HostGap;
pub use crate::shared::timeline::LocationSource;
use crate::shared::timeline::{device_timelines, op_corr, ApiCursor, Locator};
use crate::shared::timeline::{order_and_last_start, push_capped, Listed, OpWalk, StartOrdered};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use crate::views::sync_kind_from_u8;
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use utilization::{ChunkIdle, Util};

/// Gaps shorter than this are `kernel_wait`: counted, not classified, never in an insight.
pub const MIN_GAP_NS: u64 = 5_000;
/// Chunks of the utilization series.
pub const UTIL_CHUNKS: u32 = 30;
/// A chunk busy less than this share is flagged `low`.
pub const LOW_UTILIZATION: f64 = 0.5;
/// Largest gaps listed per device.
pub const TOP_GAPS: usize = 10;
/// A gap is `sync` when blocked calls cover more than this share of it (percent).
const SYNC_COVER_PCT: u64 = 50;
/// One-off pauses are looked for among a line's largest gaps only (each one is longer than all
/// smaller gaps together, so there can be only ~64 of them anyway).
const ONE_OFF_CANDIDATES: usize = 64;
/// Blocked calls examined per gap (a thread's calls do not overlap; this bounds odd data).
const MAX_BLOCKED_PER_GAP: usize = 64;

/// What the host was doing during a GPU idle gap.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum IdleClass {
    /// Shorter than [`MIN_GAP_NS`]: the GPU moving from one queued op to the next.
    KernelWait,
    /// The API call that issued the next op began after the GPU went idle, or was still running
    /// when it did (a launch slower than the work before it: launch-bound).
    Launch,
    /// The issuing thread was blocked in a synchronization or blocking copy for most of the gap.
    Sync,
    /// Neither: the next op was already queued.
    Other,
}

impl IdleClass {
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Count and idle time of one class of gaps.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassTotal {
    pub gaps: u64,
    pub idle_ns: u64,
}

/// Gaps of one device by class.
#[derive(Serialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdleByClass {
    pub kernel_wait: ClassTotal,
    pub launch: ClassTotal,
    pub sync: ClassTotal,
    pub other: ClassTotal,
}

impl IdleByClass {
    fn get_mut(&mut self, c: IdleClass) -> &mut ClassTotal {
        match c {
            IdleClass::KernelWait => &mut self.kernel_wait,
            IdleClass::Launch => &mut self.launch,
            IdleClass::Sync => &mut self.sync,
            IdleClass::Other => &mut self.other,
        }
    }
}

/// One idle gap.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Gap {
    /// Start, ns after the session's first record.
    pub start_offset_ns: u64,
    pub duration_ns: u64,
    pub class: IdleClass,
    /// The user line of the class (None for `kernel_wait`, `other`, or when unknown).
    pub location: Option<SourceLoc>,
    pub location_source: Option<LocationSource>,
}

/// One chunk of the utilization series.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct UtilChunk {
    /// Start, ns after the session's first record.
    pub start_offset_ns: u64,
    pub duration_ns: u64,
    pub busy_ns: u64,
    /// `busy_ns` over the chunk's recorded time (its duration less paused gaps), 0..1.
    pub busy_share: f64,
    /// Busy under [`LOW_UTILIZATION`] of the chunk once one-off pauses and unobserved time are
    /// cut out, and not mostly pause or unobserved ([`mark_low`]).
    pub low: bool,
    /// Time of the chunk in gaps that overlap a pause or time the GPU was not observed (always-on
    /// sessions outside their windows): left out of `busy_share`.
    #[serde(skip_serializing_if = "is_zero")]
    pub unobserved_ns: u64,
}

/// Idle time of one device (the `gpu_idle` field of the analysis).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct DeviceIdle {
    pub device: u32,
    /// First op's start, ns after the session's first record.
    pub active_start_offset_ns: u64,
    /// First op's start to last op's end.
    pub active_ns: u64,
    /// Union of the device's kernels, copies and memsets.
    pub busy_ns: u64,
    /// `active_ns - busy_ns - paused_ns - unobserved_ns`: the gaps together.
    pub idle_ns: u64,
    /// Gaps that overlap an interval in which recording was paused (`capture` records): what the
    /// GPU did there is unknown, so they are neither idle time nor gaps.
    #[serde(skip_serializing_if = "is_zero")]
    pub paused_ns: u64,
    /// Gaps that overlap time in which the GPU was not observed (an always-on session outside its
    /// windows; none overlapping a pause): neither idle time nor gaps either.
    #[serde(skip_serializing_if = "is_zero")]
    pub unobserved_ns: u64,
    pub gaps: u64,
    pub by_class: IdleByClass,
    /// The [`TOP_GAPS`] longest gaps, longest first (earlier first on ties).
    pub top_gaps: Vec<Gap>,
    /// [`UTIL_CHUNKS`] chunks of the active range (empty when it is shorter than that many ns).
    pub utilization: Vec<UtilChunk>,
    /// Chunks of `utilization` flagged `low` ([`mark_low`]).
    pub low_utilization_chunks: u32,
    /// The device's one-off pauses ([`one_off_pauses`]) together, ns: left out of the low chunks.
    #[serde(skip_serializing_if = "is_zero")]
    pub one_off_pause_ns: u64,
    /// Per chunk of `utilization`: its idle time by class and line (read by `low-utilization`;
    /// not in the JSON output).
    #[serde(skip)]
    pub chunk_idle: Vec<ChunkIdle>,
}

// ---------------------------------------------------------------------------------------------
// Blocked host calls
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
enum Blocker {
    Sync(u8),
    Call(u32),
}

#[derive(Clone, Copy)]
struct Blocked {
    tid: u64,
    start: u64,
    end: u64,
    what: Blocker,
    loc: Option<LocIx>,
    src: LocationSource,
}

/// Synchronizations and blocking copies, by thread and by start, to find what covers a gap.
#[derive(Default)]
pub(crate) struct BlockedIndex {
    /// Sorted by (tid, start); unknown threads under `u64::MAX`.
    by_tid: Vec<Blocked>,
    /// Running max of `end` within each thread's run of `by_tid`.
    tid_max_end: Vec<u64>,
    /// Indices into `by_tid`, sorted by start, and the running max of `end` in that order.
    by_start: Vec<u32>,
    start_max_end: Vec<u64>,
}

fn is_blocking_copy(name: &str) -> bool {
    (name.starts_with("cudaMemcpy") || name.starts_with("cuMemcpy")) && !name.contains("Async")
}

impl BlockedIndex {
    fn new(cx: &Ctx, loc: &Locator) -> BlockedIndex {
        let m = cx.m;
        let s = &m.syncs;
        let mut v: Vec<Blocked> = Vec::new();
        for i in 0..m.sync_count() {
            let kind = s.kind.get(i);
            if !sync_kind_from_u8(kind).blocks_host() {
                continue;
            }
            let l = cx.sync_loc(i);
            v.push(Blocked {
                tid: s.tid.get(i),
                start: s.start.get(i),
                end: s.end.get(i).max(s.start.get(i)),
                what: Blocker::Sync(kind),
                loc: l,
                src: match l {
                    None => LocationSource::None,
                    Some(_) => LocationSource::Sync,
                },
            });
        }
        // Blocking copies: API records whose name is a synchronous memcpy (decided once per name).
        let mut blocking: Vec<u8> = vec![2; m.strings.len()];
        let a = &m.apis;
        for i in 0..a.start.len() {
            let name = a.name.get(i);
            let Some(flag) = blocking.get_mut(name as usize) else {
                continue;
            };
            if *flag == 2 {
                *flag = is_blocking_copy(m.str(gpufl_trace::StrId(name))) as u8;
            }
            if *flag == 0 {
                continue;
            }
            let api = m.api(i);
            let (l, src) = loc.locate(api.corr, None, Some(&api), api.start);
            v.push(Blocked {
                tid: api.tid,
                start: api.start,
                end: api.end.max(api.start),
                what: Blocker::Call(name),
                loc: l,
                src,
            });
        }
        v.sort_unstable_by_key(|b| (b.tid, b.start, b.end));
        let mut tid_max_end = Vec::with_capacity(v.len());
        for (i, b) in v.iter().enumerate() {
            let prev = match i.checked_sub(1) {
                Some(p) if v[p].tid == b.tid => tid_max_end[p],
                _ => 0,
            };
            tid_max_end.push(b.end.max(prev));
        }
        let mut by_start: Vec<u32> = (0..v.len() as u32).collect();
        by_start.sort_unstable_by_key(|&i| (v[i as usize].start, i));
        let mut start_max_end = Vec::with_capacity(v.len());
        let mut mx = 0u64;
        for &i in &by_start {
            mx = mx.max(v[i as usize].end);
            start_max_end.push(mx);
        }
        BlockedIndex {
            by_tid: v,
            tid_max_end,
            by_start,
            start_max_end,
        }
    }

    /// Time of `[gs, ge)` covered by blocked calls of thread `tid` (and of unknown threads), or of
    /// any thread when `tid` is None; and the call covering most of it.
    fn cover(&self, tid: Option<u64>, gs: u64, ge: u64) -> (u64, Option<usize>) {
        let mut covered = 0u64;
        let mut best: Option<(u64, usize)> = None;
        let mut visit = |i: usize| {
            let b = &self.by_tid[i];
            let ov = b.end.min(ge).saturating_sub(b.start.max(gs));
            covered += ov;
            if ov > 0 && best.is_none_or(|(o, _)| ov > o) {
                best = Some((ov, i));
            }
        };
        match tid {
            Some(t) => {
                let threads: &[u64] = if t == u64::MAX { &[t] } else { &[t, u64::MAX] };
                for &t in threads {
                    let v = &self.by_tid;
                    let lo = v.partition_point(|b| b.tid < t);
                    let hi = lo + v[lo..].partition_point(|b| b.tid == t && b.start < ge);
                    let mut i = hi;
                    let mut steps = 0;
                    while i > lo && steps < MAX_BLOCKED_PER_GAP {
                        i -= 1;
                        if self.tid_max_end[i] <= gs {
                            break;
                        }
                        visit(i);
                        steps += 1;
                    }
                }
            }
            None => {
                let hi = self
                    .by_start
                    .partition_point(|&i| self.by_tid[i as usize].start < ge);
                let mut k = hi;
                let mut steps = 0;
                while k > 0 && steps < MAX_BLOCKED_PER_GAP {
                    k -= 1;
                    if self.start_max_end[k] <= gs {
                        break;
                    }
                    visit(self.by_start[k] as usize);
                    steps += 1;
                }
            }
        }
        (covered.min(ge - gs), best.map(|b| b.1))
    }

    pub(crate) fn label(&self, cx: &Ctx, i: usize) -> String {
        match self.by_tid[i].what {
            Blocker::Sync(k) => sync_kind_from_u8(k).display_name().to_string(),
            Blocker::Call(n) => cx.m.str(gpufl_trace::StrId(n)).to_string(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Gaps by (class, line), and the scan
// ---------------------------------------------------------------------------------------------

/// The gaps of one (class, line), for its insight.
#[derive(Default)]
pub(crate) struct Group {
    pub(crate) gaps: u64,
    pub(crate) idle_ns: u64,
    pub(crate) first_start: u64,
    pub(crate) last_end: u64,
    /// The longest gaps: (duration, start), a min-heap of at most [`ONE_OFF_CANDIDATES`].
    pub(crate) top: BinaryHeap<Reverse<(u64, u64)>>,
    /// Least precise location source seen.
    pub(crate) src: Option<LocationSource>,
    /// The blocked call of the longest gap (sync class): index into the blocked index.
    pub(crate) blocker: Option<(u64, usize)>,
    /// Every gap with the thread that issued the op that ended it (or was blocked), for the join
    /// with the host ([`crate::shared::host`]): kept only when the session has host records.
    pub(crate) host: Vec<HostGap>,
}

impl Group {
    fn add(&mut self, gs: u64, ge: u64, src: LocationSource, blocker: Option<usize>) {
        let len = ge - gs;

        if self.gaps == 0 {
            self.first_start = gs;
        }
        self.first_start = self.first_start.min(gs);
        self.last_end = self.last_end.max(ge);
        self.gaps += 1;
        self.idle_ns += len;
        self.src = Some(self.src.map_or(src, |s| s.max(src)));
        if let Some(b) = blocker {
            if self.blocker.is_none_or(|(l, _)| len > l) {
                self.blocker = Some((len, b));
            }
        }
        push_capped(&mut self.top, (len, gs), ONE_OFF_CANDIDATES);
    }

    /// The group's gaps for the join with the host: those counted, and its `one_off` one-off
    /// pauses (the longest, as [`Group::settle`] finds them). Empty without host records.
    pub(crate) fn host_gaps(&self, one_off: u64) -> (Vec<HostGap>, Vec<HostGap>) {
        let mut top: Vec<(u64, u64)> = self.top.iter().map(|r| r.0).collect();
        top.sort_unstable_by(|a, b| b.cmp(a));
        let off: Vec<u64> = top.iter().take(one_off as usize).map(|t| t.1).collect();
        self.host.iter().partition(|g| !off.contains(&g.start))
    }

    /// The group's figures without its one-off pauses: from the longest gap down, each gap longer
    /// than all the group's shorter gaps together (stopping at the first that is not). The window
    /// leaves out the time recording was paused, and the time the GPU was not observed.
    pub(crate) fn settle(&self, m: &Model) -> ClassFigures {
        let mut top: Vec<(u64, u64)> = self.top.iter().map(|r| r.0).collect();
        top.sort_unstable_by(|a, b| b.cmp(a));
        let mut rest = self.idle_ns;
        let (mut n_off, mut off) = (0u64, 0u64);
        let mut largest = 0u64;
        for (rank, &(len, _)) in top.iter().enumerate() {
            let below = rest - len;
            let count_below = self.gaps - rank as u64 - 1;
            if count_below >= 1 && len > below {
                n_off += 1;
                off += len;
            } else {
                largest = len;
                break;
            }
            rest = below;
        }
        let idle = self.idle_ns - off;
        let paused = m.unobserved_in(self.first_start, self.last_end);
        let window = (self.last_end - self.first_start)
            .saturating_sub(off)
            .saturating_sub(paused)
            .max(idle);
        ClassFigures {
            gaps: self.gaps - n_off,
            idle_ns: idle,
            one_off_gaps: n_off,
            one_off_ns: off,
            window_ns: window,
            largest,
        }
    }
}

pub(crate) struct ClassFigures {
    pub(crate) gaps: u64,
    pub(crate) idle_ns: u64,
    pub(crate) one_off_gaps: u64,
    pub(crate) one_off_ns: u64,
    pub(crate) window_ns: u64,
    pub(crate) largest: u64,
}

/// Top gaps of a device: min-heap by (duration, earlier first).
/// (Never two with one start: the location is no tie-break.)
type TopGap = (
    u64,
    Reverse<u64>,
    IdleClass,
    Option<LocIx>,
    Option<LocationSource>,
);

struct DeviceScan<'c> {
    cx: &'c Ctx<'c>,
    apis: ApiCursor<'c>,
    locator: &'c Locator<'c>,
    blocked: &'c BlockedIndex,
    groups: &'c mut [Group],
    util: Util,
    by_class: IdleByClass,
    top: BinaryHeap<Reverse<TopGap>>,
    gaps: u64,
    idle: u64,
    /// Keep each gap with its thread in its group (the session has host records).
    host: bool,
}

impl DeviceScan<'_> {
    fn gap(&mut self, gs: u64, ge: u64, op: u32) {
        let m = self.cx.m;
        let len = ge - gs;
        self.gaps += 1;
        self.idle += len;
        let mut thread = None;
        let (class, loc, src, blocker) = if len < MIN_GAP_NS {
            (IdleClass::KernelWait, None, None, None)
        } else {
            let corr = op_corr(m, op);
            let api = self.apis.find(corr);
            let tid = api.map(|a| a.tid);
            thread = tid;
            let (cov, best) = self.blocked.cover(tid, gs, ge);
            let covered = cov as u128 * 100 > len as u128 * SYNC_COVER_PCT as u128;
            if let Some(b) = best.filter(|_| covered) {
                let blk = &self.blocked.by_tid[b];
                thread = Some(blk.tid).filter(|&t| t != u64::MAX).or(tid);
                (IdleClass::Sync, blk.loc, Some(blk.src), Some(b))
            } else if api.is_some_and(|a| a.start >= gs || a.end > gs) {
                let is_kernel = (op as usize) < m.kernel_count();
                // A kernel a graph replay ran: its replay's call site, else the graph's sampled
                // launches' line (not its function's direct launches, elsewhere).
                let graph = is_kernel
                    .then(|| {
                        let gk = &m.graph_kernels;
                        let i = gk.partition_point(|&(k, _)| k < op);
                        gk.get(i).filter(|&&(k, _)| k == op).map(|&(_, g)| g.0)
                    })
                    .flatten();
                let name = (is_kernel && graph.is_none()).then(|| m.kernel_name_at(op as usize));
                let (loc, src) = match graph {
                    Some(g) if self.cx.callsite_loc(corr).is_none() => {
                        match self.locator.graph_line(g) {
                            Some(l) => (Some(l), LocationSource::KernelCallsites),
                            None => self.locator.locate(corr, None, api.as_ref(), gs),
                        }
                    }
                    _ => self.locator.locate(corr, name, api.as_ref(), gs),
                };
                (IdleClass::Launch, loc, Some(src), None)
            } else {
                (IdleClass::Other, None, None, None)
            }
        };
        let t = self.by_class.get_mut(class);
        t.gaps += 1;
        t.idle_ns += len;
        self.util.add_idle(gs, ge, class, loc, blocker);
        if class != IdleClass::KernelWait {
            let n = self.cx.locs.len() + 1;
            let slot = match loc {
                Some(l) if class != IdleClass::Other => l.index(),
                _ => n - 1,
            };
            let g = &mut self.groups[class.index() * n + slot];
            g.add(gs, ge, src.unwrap_or(LocationSource::None), blocker);
            if self.host {
                g.host.push(HostGap {
                    start: gs,
                    end: ge,
                    tid: thread,
                });
            }
        }
        push_capped(&mut self.top, (len, Reverse(gs), class, loc, src), TOP_GAPS);
    }
}

/// The idle gaps of every device: each device's summary, and the gaps grouped by (class, line)
/// for the rule gpu-idle's insights.
#[derive(Default)]
pub(crate) struct IdleScan {
    /// Per device with GPU work, in the model's device order.
    pub devices: Vec<DeviceIdle>,
    /// Per (class, line): `groups[class.index() * (locs + 1) + slot]`, `slot` the index into
    /// `Ctx::locs` or, last, the gaps without a line (`other`, or no line found). Empty without
    /// devices.
    pub groups: Vec<Group>,
    /// The synchronizations and blocking copies that gaps were classified `sync` by.
    pub blocked: BlockedIndex,
    /// The devices' active ranges together, less paused and unobserved time, ns: thresholds are
    /// shares of the observed time (paused and unobserved intervals say nothing).
    pub active_ns: u64,
}

/// Scan every device's timeline for its idle gaps.
pub(crate) fn scan(cx: &Ctx) -> IdleScan {
    let m = cx.m;
    let locator = Locator::new(cx);
    // Every device of the model has an op (memsets included).
    if m.devices().is_empty() {
        return IdleScan::default();
    }
    // Each device's ops in start order: its kernels and copies merged as they come, or, for a
    // device whose records do not come in start order, sorted.
    let ext = order_and_last_start(m, true);
    let timelines = if ext.iter().all(|x| x.0) {
        Vec::new()
    } else {
        device_timelines(m, true)
    };
    let blocked = BlockedIndex::new(cx, &locator);
    let n = cx.locs.len() + 1;
    let mut groups: Vec<Group> = (0..4 * n).map(|_| Group::default()).collect();
    let mut devices = Vec::new();
    for (di, &dev) in m.devices().iter().enumerate() {
        let (g, l, b) = (&mut groups[..], &locator, &blocked);
        // The latest end of an op (never before its start): the device's last busy interval's
        // end, or the latest start when an empty op starts after it.
        let (ordered, last_start) = ext[di];
        let busy_end = cx.busy.intervals(Some(dev)).last().map_or(0, |iv| iv.1);
        let last = last_start.max(busy_end);
        let d = if ordered {
            scan_device(cx, (l, b, g), (dev, last), StartOrdered::new(m, dev, true))
        } else {
            let ops = timelines.get(di).map_or(&[][..], |t| &t.1[..]);
            let ops = ops.iter();
            scan_device(cx, (l, b, g), (dev, last), Listed { m, ops })
        };
        devices.extend(d);
    }
    let active_ns: u64 = devices
        .iter()
        .map(|d| d.active_ns - d.paused_ns - d.unobserved_ns)
        .sum();
    IdleScan {
        devices,
        groups,
        blocked,
        active_ns,
    }
}

/// The gaps of one device, its ops `(op, start, end)` given in start order (ties: kernels first,
/// each in record order), `last` the latest end of an op (never before its start); None without
/// ops.
fn scan_device(
    cx: &Ctx,
    (locator, blocked, groups): (&Locator, &BlockedIndex, &mut [Group]),
    (dev, last): (u32, u64),
    ops: impl OpWalk + Clone,
) -> Option<DeviceIdle> {
    let m = cx.m;
    let origin = m.time_range().0;
    let (_, first, _) = ops.clone().next()?;
    let span = last - first;
    let mut scan = DeviceScan {
        cx,
        apis: ApiCursor::new(cx),
        locator,
        blocked,
        groups,
        util: Util::new(first, span),
        by_class: IdleByClass::default(),
        top: BinaryHeap::new(),
        gaps: 0,
        idle: 0,
        host: m.has_host_records(),
    };
    // The first op only extends `ce` (its start is `first`).
    let (mut cs, mut ce) = (first, first);
    let (mut busy, mut paused, mut unobserved) = (0u64, 0u64, 0u64);
    ops.walk(|op, s, e| {
        let e = e.max(s);
        if s > ce {
            scan.util.add(cs, ce);
            busy += ce - cs;
            if m.unobserved_in(ce, s) > 0 {
                scan.util.add_paused(ce, s);
                if m.paused_in(ce, s) > 0 {
                    paused += s - ce;
                } else {
                    unobserved += s - ce;
                }
            } else {
                scan.gap(ce, s, op);
            }
            (cs, ce) = (s, e);
        } else {
            ce = ce.max(e);
        }
    });
    scan.util.add(cs, ce);
    busy += ce - cs;
    let mut top: Vec<TopGap> = scan.top.into_iter().map(|r| r.0).collect();
    top.sort_unstable_by(|a, b| b.cmp(a));
    let top_gaps = top
        .into_iter()
        .map(|(len, Reverse(gs), class, loc, src)| Gap {
            start_offset_ns: gs - origin,
            duration_ns: len,
            class,
            location: loc.map(|l| locator.source_loc(l)),
            location_source: src,
        })
        .collect();
    let utilization = scan.util.chunks(origin);
    let chunk_idle = scan.util.chunk_idle(|b| blocked.label(cx, b));
    let mut d = DeviceIdle {
        device: dev,
        active_start_offset_ns: first - origin,
        active_ns: span,
        busy_ns: busy,
        idle_ns: scan.idle,
        paused_ns: paused,
        unobserved_ns: unobserved,
        gaps: scan.gaps,
        by_class: scan.by_class,
        top_gaps,
        low_utilization_chunks: 0,
        one_off_pause_ns: 0,
        utilization,
        chunk_idle,
    };
    mark_low(&mut d);
    Some(d)
}

/// The device's one-off pauses among its longest gaps (longest first): from the longest gap
/// down, each gap longer than all the device's shorter gaps together.
pub(crate) fn one_off_pauses(d: &DeviceIdle) -> Vec<&Gap> {
    let mut rest = d.idle_ns;
    let mut out = Vec::new();
    for (rank, g) in d.top_gaps.iter().enumerate() {
        let below = rest.saturating_sub(g.duration_ns);
        let count_below = d.gaps.saturating_sub(rank as u64 + 1);
        if count_below >= 1 && g.duration_ns > below {
            out.push(g);
            rest = below;
        } else {
            break;
        }
    }
    out
}

/// Overlap of `[a0, a1)` and `[b0, b1)`, ns.
pub(crate) fn overlap(a0: u64, a1: u64, b0: u64, b1: u64) -> u64 {
    a1.min(b1).saturating_sub(a0.max(b0))
}

/// Time of `[start, start + len)` in the one-off pauses, ns.
pub(crate) fn pause_in(pauses: &[&Gap], start: u64, len: u64) -> u64 {
    pauses
        .iter()
        .map(|g| {
            overlap(
                start,
                start + len,
                g.start_offset_ns,
                g.start_offset_ns + g.duration_ns,
            )
        })
        .sum()
}

/// Flag the low chunks of a device's utilization series and count them: busy less than
/// [`LOW_UTILIZATION`] of the chunk less its one-off pause and unobserved time, that remainder
/// being at least half the chunk.
pub(crate) fn mark_low(d: &mut DeviceIdle) {
    let pauses = one_off_pauses(d);
    let pause_ns: u64 = pauses.iter().map(|g| g.duration_ns).sum();
    let low: Vec<bool> = d
        .utilization
        .iter()
        .map(|c| {
            let pause = pause_in(&pauses, c.start_offset_ns, c.duration_ns);
            let eff = c.duration_ns.saturating_sub(pause + c.unobserved_ns);
            eff > 0 && eff * 2 >= c.duration_ns && (c.busy_ns as f64) < eff as f64 * LOW_UTILIZATION
        })
        .collect();
    for (c, l) in d.utilization.iter_mut().zip(low) {
        c.low = l;
    }
    d.low_utilization_chunks = d.utilization.iter().filter(|c| c.low).count() as u32;
    d.one_off_pause_ns = pause_ns;
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

pub(crate) const FIX_LAUNCH: Fix = Fix {
    native: "Issue GPU work before the GPU runs out of it: don't synchronize before launching the next \
step's work, move CPU work (data loading, preprocessing, logging) off the launching thread \
or overlap it with GPU work (a loader thread, pinned buffers with cudaMemcpyAsync, \
prefetching the next batch), and make launches cheaper (fused kernels, CUDA graphs: \
cudaStreamBeginCapture … cudaGraphLaunch).",
    python: Some("Issue GPU work before the GPU runs out of it: don't synchronize before launching the next \
step's work, move CPU work (data loading, preprocessing, logging) off the launching thread \
or overlap it with GPU work (worker processes or a loader thread, pinned buffers with \
asynchronous copies, prefetching the next batch), and make launches cheaper (fused kernels, \
CUDA graphs)."),
    torch: Some("Issue GPU work before the GPU runs out of it: don't synchronize before launching the next \
step's work, move CPU work (data loading, preprocessing, logging) off the launching thread \
or overlap it with GPU work (DataLoader workers, pinned memory with non_blocking copies, \
prefetching), and make launches cheaper (fused kernels, CUDA graphs: torch.cuda.graphs, \
torch.compile(mode=\"reduce-overhead\"))."),
    jax: Some("Keep the GPU fed: don't read values on the host before dispatching the next step (JAX \
dispatches asynchronously until a value is read), move data loading and preprocessing off \
the launching thread and prefetch the next batch onto the device while this one runs \
(jax.device_put from a loader thread), and put more of the step in one jax.jit function so \
that each dispatch carries more work."),
    cupy: Some("Issue GPU work before the GPU runs out of it: don't synchronize before launching the next \
step's work, move CPU work off the launching thread or overlap it with GPU work (a loader \
thread, pinned buffers from cupyx.empty_pinned with asynchronous copies, prefetching), and \
make launches cheaper (cupy.fuse, a RawKernel, CUDA graphs: stream.begin_capture())."),
};
pub(crate) const FIX_SYNC: Fix = Fix::any(
    "The host waited while the GPU had nothing to do: wait on what the GPU work actually \
needs (an event recorded after the producer, cudaStreamWaitEvent rather than a host sync), use pinned memory \
so copies are DMA transfers rather than staged by the host, and queue the next work before waiting.",
);
pub(crate) const FIX_OTHER: Fix = Fix::any(
    "The next work was already queued but did not start: look for dependencies the trace \
does not show (cudaStreamWaitEvent on events recorded late, host callbacks, work on other devices or \
processes), and record with API records on so gaps can be attributed.",
);
