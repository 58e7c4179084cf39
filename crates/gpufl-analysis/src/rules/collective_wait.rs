//! Rule `collective-wait` (a run rule: it reads several sessions, one per rank): communication
//! kernels whose time is mostly spent waiting for one late rank — a straggler.
//!
//! - **Participants:** the sessions with communication kernels ([`crate::comm::is_comm_kernel`]);
//!   at least two.
//! - **Clocks:** every `start`/`end` is on its session's CUPTI clock. Sessions of one host are
//!   put on the host's wall clock with each header's clock pair (`unix_ns − trace_ns`);
//!   [`SAME_HOST_ERROR_NS`] bounds the error. Sessions of several hosts are aligned on the
//!   collectives themselves: each rank's offset is the median, over matched collectives, of the
//!   difference between the first participant's end time and its own (a collective ends at about
//!   the same instant on every rank: the last data exchanged reaches them all); lateness is then
//!   measured against that assumption, and the median spread of the ends is reported.
//! - **Matching:** per kernel name, the n-th kernel of each rank (start order) is the same
//!   collective (NCCL requires every rank to issue a communicator's collectives in one order);
//!   names missing on some rank are left out, and a name with different counts is matched up to the
//!   smallest (a warning says so).
//! - **Always-on runs** (some participant recorded GPU activity only inside `window` records): the
//!   ranks' windows open at their own times, so the n-th recorded kernel of one rank is not the
//!   n-th of another, and collectives are matched **by time**. Only one host's sessions can be
//!   aligned before matching (by their clock pairs); several hosts raise nothing, with a warning.
//!   The **shared windows** are the intervals in which every participant observed its GPU (its
//!   windows, less paused time; a default-mode participant: its whole span). A rank's kernel
//!   matches the first participant's (the anchor's) kernel of the same name whose end is nearest
//!   its own, when both lie whole inside one shared window and their ends differ by at most
//!   [`MAX_END_DIFF_NS`] and by less than half the gap to the neighbouring kernels of that name on
//!   either rank (a collective ends at about the same instant on every rank); a collective is
//!   matched when every participant has such a kernel. What else is read between collectives
//!   keeps to the shared windows too: the window, the GPU work compared across ranks, the call
//!   sites of its launches, and the late rank's host stretches, which also need its API records
//!   (recorded only in full-detail windows: a sampled window has none, and its synchronizations
//!   alone would read the unrecorded launches as time without a CUDA call). Windows that never
//!   overlap raise nothing, with a warning.
//! - **Lateness** of a rank at a collective: its kernel's start minus the latest start of the
//!   other ranks (positive when it arrives last). The **late rank** has the largest sum of
//!   positive lateness. Each other rank's **wait** at a collective: the part of its kernel before
//!   the late rank's start (at most the kernel's duration).
//! - **Late collectives:** those the late rank reaches ≥ [`MIN_LATE_NS`] after every other rank
//!   (with DDP's gradient buckets, typically the first collective of each step: the later ones
//!   queue behind it on the waiting ranks, so the late rank is late there by little).
//! - **Fires** with at least [`MIN_LATE_COLLECTIVES`] late collectives, the late rank holding ≥
//!   [`MIN_DOMINANCE_PCT`] % of all ranks' summed lateness (not ranks taking turns), the other
//!   ranks' communication kernels spending ≥ [`MIN_WAIT_PCT`] % of their time waiting for it,
//!   and that wait ≥ [`MIN_WINDOW_PCT`] % of the window. A balanced run (ranks arriving in turn
//!   within tens of µs) raises nothing.
//! - **Host line:** for each collective the late rank reached ≥ [`MIN_LATE_NS`] late, its
//!   longest stretch without any CUDA call (API and sync records of every thread of the process,
//!   status polls such as `cudaEventQuery` left out) between
//!   its previous communication kernel's launch and this one's: the time the host spent in code
//!   that makes no CUDA call. The location is the first CUDA call after that stretch (its call
//!   site; the line the host reached late), the call before it is named in the detail; the one
//!   with the most such time over the run wins. The recorder sees the host only at CUDA calls,
//!   so the line that takes the time lies between those two. When that stretch is short beside
//!   the lateness, the delay is on the late rank's GPU (its work before the collective), and the
//!   location is the collective's own launch line.
//! - **Impact:** the mean over the other ranks of their waiting time. **Window:** the span of the
//!   matched collectives (first start to last end, aligned; always-on: the shared windows' time
//!   inside it).

use crate::ids::LocIx;
use crate::insight::{fmt_duration, share, Insight};
use crate::intervals::DeviceBusy;
use crate::model::Model;
use crate::shared::advice::{advice, Fix, Program};
use crate::shared::host::{HostActivity, HostGap};
use crate::shared::timeline::{location_note, most_frequent_per_key, LocationSource, Locator};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use crate::Config;
use serde::Serialize;
use std::collections::HashMap;

/// Where a late rank's own work goes instead of the training loop.
const OFF_THE_LOOP: Fix = Fix {
    native: "a background thread or process",
    python: Some("worker processes, a background thread"),
    torch: Some("DataLoader workers, a background thread"),
    jax: None,
    cupy: None,
};

pub(crate) const RULE: &str = "collective-wait";
/// A collective the late rank reaches this much after every other rank is a late one, ns.
pub const MIN_LATE_NS: u64 = 200_000;
/// In an always-on run, the least p90 of the late collectives' lateness, ns: opening a sampled
/// window delays its rank's launches by itself (0.3–2 ms on the balanced always-on twin in
/// `testdata/runs/`, rank 1 "late" right after its windows opened), so sub-millisecond lateness
/// there cannot be told from the recorder's own effect.
pub const MIN_SAMPLED_P90_NS: u64 = 1_000_000;
/// Fewest late collectives for an insight.
pub const MIN_LATE_COLLECTIVES: u64 = 3;
/// The late rank's share of all ranks' summed lateness, percent.
pub const MIN_DOMINANCE_PCT: u64 = 80;
/// Least share of the other ranks' communication kernel time spent waiting, percent.
pub const MIN_WAIT_PCT: u64 = 50;
/// Least share of the window the waiting takes, percent.
pub const MIN_WINDOW_PCT: u64 = 1;
/// Error bound of times aligned between sessions of one host, ns: each session's clock pair is
/// two reads taken back to back (CUPTI's clock, then the wall clock; 182 ns apart in
/// `testdata/sessions/pytorch_train_sync-1304-…`), so two sessions are within the sum of two
/// such gaps, plus the wall clock being stepped between the two sessions' reads (NTP slews
/// rather than steps on a running host). 10 µs leaves a wide margin; lateness is only reported
/// from [`MIN_LATE_NS`], 20 times that.
pub const SAME_HOST_ERROR_NS: u64 = 10_000;
/// Collectives matched at most (per run): more are left out, with a warning.
pub const MAX_COLLECTIVES: usize = 1 << 20;
/// Always-on runs: the most a collective's end times on two ranks may differ for the two kernels
/// to be matched as one collective, ns (one host's sessions agree within
/// [`SAME_HOST_ERROR_NS`]; the ends of one collective within tens of µs on the H200 machine,
/// 2026-11-28). Tighter still where the same-name kernels follow each other closer (half the gap).
pub const MAX_END_DIFF_NS: u64 = 500_000;
/// Extra kernels listed.
pub const MAX_EXTRA_KERNELS: usize = 5;
/// An extra kernel is listed with at least this share of all the late rank's extra GPU time,
/// percent.
pub const MIN_EXTRA_PCT: u64 = 5;

/// How the ranks' clocks were put on one time line.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ClockMethod {
    /// One host: each session's header clock pair maps its times to the host's wall clock.
    SameHost,
    /// Several hosts: offsets from the matched collectives' end times.
    CollectiveEnds,
}

/// The clock alignment of a run's ranks.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct ClockAlignment {
    pub method: ClockMethod,
    /// Distinct hosts of the participants.
    pub hosts: Vec<String>,
    /// Bound on the error between two ranks' aligned times, ns (one host only; None across hosts,
    /// where the alignment rests on the collectives ending together).
    pub error_bound_ns: Option<u64>,
    /// Median over matched collectives of their end times' spread across ranks, after alignment,
    /// ns: small when the clocks agree (a collective ends nearly together on every rank).
    pub end_spread_ns: Option<u64>,
    /// Matched collectives.
    pub collectives: u64,
    /// Always-on runs: the windows every rank had open, where the collectives were matched by
    /// their end times (absent otherwise: matched by order).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub windows: Option<SharedWindows>,
}

/// The windows every rank of an always-on run had open at once (the intersection of their
/// windows, on the aligned clock).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct SharedWindows {
    /// Such intervals, and those holding a matched collective.
    pub windows: u64,
    pub with_collectives: u64,
    /// Their summed time, ns.
    pub observed_ns: u64,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    /// The late rank (its `rank` header field, else its position among the participants).
    pub late_rank: u32,
    /// Its session (directory name).
    pub late_session: String,
    /// The other participants' ranks.
    pub waiting_ranks: Vec<u32>,
    /// The collective operation most often waited for (`AllReduce`), and its kernel's name.
    pub op: Option<String>,
    pub kernel: String,
    pub collectives: u64,
    /// Collectives the late rank reached last, and ≥ [`MIN_LATE_NS`] after the others.
    pub last_collectives: u64,
    pub late_collectives: u64,
    /// Median and 90th percentile (nearest rank) of its lateness over the late collectives, ns.
    pub median_late_ns: u64,
    pub p90_late_ns: u64,
    /// Its lateness in the collectives holding most of the late time (half of it, in at least
    /// 5 % of the late collectives), ns: the title's figure when the host does not explain it.
    pub weighted_late_ns: u64,
    /// Its share of all ranks' summed lateness, 0..1.
    pub lateness_share: f64,
    /// The other ranks' time waiting in communication kernels, summed, and their whole
    /// communication kernel time, ns.
    pub wait_ns: u64,
    pub comm_ns: u64,
    /// `wait_ns / comm_ns`.
    pub wait_share: f64,
    /// Median of the late rank's longest stretch without a CUDA call before each late collective
    /// (when host-bound: before each late collective whose lateness it explains, at least half of
    /// it), ns (None without API records).
    pub host_gap_median_ns: Option<u64>,
    /// The CUDA call that ended that stretch (the location), and the one before it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_before: Option<SourceLoc>,
    /// Whether the stretches explain the lateness: the late collectives whose stretch is at least
    /// half of their lateness hold at least half of all lateness. Else the delay is the late
    /// rank's GPU work before the collective.
    pub host_bound: bool,
    pub location_source: LocationSource,
    pub clock: ClockMethod,
    /// Host-bound, with host records on the late rank: what its host was doing during the
    /// stretches (its host samples and CUDA calls; the join of `shared::host`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<HostActivity>,
    /// When the location moved (to the host line of the stretches, or to the launch line of the
    /// late rank's extra GPU work): the line it has otherwise (the call after the stretch, or the
    /// collective's launch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gap_ended_at: Option<SourceLoc>,
    /// Not host-bound: the kernels the late rank runs and the others do not, or runs longer, over
    /// the matched collectives' span (most extra time first, at most [`MAX_EXTRA_KERNELS`]:
    /// those only it runs, at least once per two late collectives, and those with at least
    /// [`MIN_EXTRA_PCT`] % of the extra time).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub extra_kernels: Vec<ExtraKernel>,
    /// Always-on runs: the windows every rank had open, which the figures rest on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub windows: Option<SharedWindows>,
}

/// A kernel function the late rank runs more of than the other ranks (their mean).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct ExtraKernel {
    pub name: String,
    /// Its launches and GPU time on the late rank over the matched collectives' span, and the
    /// other ranks' mean.
    pub launches: u64,
    pub others_launches: u64,
    pub gpu_ns: u64,
    pub others_gpu_ns: u64,
    /// `gpu_ns − others_gpu_ns`, and that per late collective (about per step).
    pub extra_ns: u64,
    pub per_late_collective_ns: u64,
    /// The line of its launches that the others make less often (the late rank's sampled call
    /// sites of this kernel, by line, less the other ranks' mean there).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_line: Option<SourceLoc>,
}

/// One rank's part in the rule: its model, rank number and the offset that aligns its clock.
pub(crate) struct Rank<'a> {
    pub m: &'a Model,
    pub rank: u32,
    pub session: String,
    /// Its communication kernels (indices into the model's kernels), by start.
    comm: Vec<usize>,
    offset: i128,
}

impl<'a> Rank<'a> {
    pub(crate) fn new(m: &'a Model, rank: u32, session: String) -> Rank<'a> {
        let mut comm: Vec<usize> = (0..m.kernel_count())
            .filter(|&i| crate::comm::is_comm_kernel(m.str(m.kernel(i).name)))
            .collect();
        comm.sort_by_key(|&i| (m.kernel(i).start, i));
        Rank {
            m,
            rank,
            session,
            comm,
            offset: 0,
        }
    }

    /// Start and end of kernel `k` on the aligned clock (an inverted interval made empty).
    fn at(&self, k: usize) -> (i128, i128) {
        let r = self.m.kernel(k);
        (
            r.start as i128 + self.offset,
            r.end.max(r.start) as i128 + self.offset,
        )
    }
}

/// Per location of the call that ended a host stretch: the stretch time, votes `(0, location)`
/// for the call before it, and the least precise way a location was found.
/// (Stretch time, votes for the line of the call before as (0, (no line, line)): no line
/// counts as a line that loses ties, how the line was found.)
type LocVotes = (u64, Vec<(u32, NoneLast)>, LocationSource);

/// A line that may be none, ordered with none after every line.
type NoneLast = (bool, Option<LocIx>);

fn none_last(l: Option<LocIx>) -> NoneLast {
    (l.is_none(), l)
}

/// One matched collective: per participant, its kernel (index into the model's kernels).
struct Coll {
    name: usize,
    k: Vec<usize>,
}

fn median_of(v: &mut [i128]) -> i128 {
    v.sort_unstable();
    if v.is_empty() {
        0
    } else {
        v[v.len() / 2]
    }
}

/// ` (`text`)` for a line's text, or nothing.
fn quoted(text: &Option<String>) -> String {
    text.as_deref()
        .map(|t| format!(" (`{}`)", t.trim()))
        .unwrap_or_default()
}

/// Nearest-rank percentile of sorted values.
fn pct(v: &[u64], p: usize) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let r = (v.len() * p).div_ceil(100).max(1);
    v[r - 1]
}

/// The lateness of the collectives that hold most of the late time: of `sorted` (ascending), the
/// largest value whose own and larger values sum to at least half the total and number at least
/// 5 % of the values (0 for none). With DDP's gradient buckets a late step makes its first
/// collective late by the whole delay and the later ones by a little each: the plain median lands
/// on the little ones, this on the delay that holds the time; the count floor keeps a few
/// outliers (the first steps' set-up, tens of ms on the H200 machine) from setting it.
fn lateness_weighted_median(sorted: &[u64]) -> u64 {
    let total: u128 = sorted.iter().map(|&x| x as u128).sum();
    let min_count = (sorted.len() * HEAVY_MIN_PCT).div_ceil(100).max(1);
    let mut above: u128 = 0;
    for (k, &x) in sorted.iter().rev().enumerate() {
        above += x as u128;
        if above * 2 >= total && k + 1 >= min_count {
            return x;
        }
    }
    0
}

/// [`lateness_weighted_median`]'s count floor, percent of the late collectives.
const HEAVY_MIN_PCT: usize = 5;

/// Run the rule over the ranks (the sessions of one run). Returns the insights, the clock
/// alignment (None with fewer than two participants) and warnings.
pub(crate) fn run(
    ranks: Vec<Rank>,
    cfg: &Config,
) -> (Vec<Insight>, Option<ClockAlignment>, Vec<String>) {
    let mut warnings = Vec::new();
    let mut ps: Vec<Rank> = ranks.into_iter().filter(|r| !r.comm.is_empty()).collect();
    if ps.len() < 2 {
        return (Vec::new(), None, warnings);
    }
    let windowed = ps.iter().any(|p| p.m.is_always_on());
    let (names, colls, method, hosts, sampled) = if windowed {
        match match_in_windows(&mut ps, &mut warnings) {
            Some((names, colls, hosts, sampled)) => {
                (names, colls, ClockMethod::SameHost, hosts, Some(sampled))
            }
            None => return (Vec::new(), None, warnings),
        }
    } else {
        let (names, colls) = match_collectives(&ps, &mut warnings);
        if colls.is_empty() {
            warnings.push(
                "no communication kernel name is common to every rank: collectives not matched"
                    .into(),
            );
            return (Vec::new(), None, warnings);
        }
        let (method, hosts) = align_clocks(&mut ps, &colls, &mut warnings);
        (names, colls, method, hosts, None)
    };
    let mut spread = Spread::of(&ps, &colls);
    let align = ClockAlignment {
        method,
        hosts,
        error_bound_ns: (method == ClockMethod::SameHost).then_some(SAME_HOST_ERROR_NS),
        end_spread_ns: Some(median_of(&mut spread.end_spreads).max(0) as u64),
        collectives: colls.len() as u64,
        windows: sampled.as_ref().map(|s| s.summary.clone()),
    };
    let late_sum = &spread.late_sum;
    let Some(l) = (0..ps.len()).max_by_key(|&pi| (late_sum[pi], std::cmp::Reverse(pi))) else {
        return (Vec::new(), Some(align), warnings);
    };
    let waits = Waits::of(&ps, &colls, l);
    // The window: the matched collectives' span, or in an always-on run the time every rank
    // observed inside it.
    let window = match &sampled {
        None => (spread.last - spread.first).max(0) as u64,
        Some(s) => s.shared.within(spread.first, spread.last),
    };
    let figures = Figures::of(
        &waits,
        &spread,
        l,
        (ps.len(), colls.len()),
        (window, sampled.is_some()),
    );
    if !figures.fires {
        return (Vec::new(), Some(align), warnings);
    }
    let host = host_time(
        &ps,
        l,
        (&colls, &spread, sampled.as_ref()),
        &waits,
        figures.weighted_late,
        cfg,
    );
    let found = Found {
        names: &names,
        method,
        waits: &waits,
        figures: &figures,
        sampled: sampled.as_ref(),
    };
    let mut ins = insight(&ps, l, &found, host);
    if let Some(s) = &sampled {
        ins.basis = Some(s.basis(&ps));
    }
    (vec![ins], Some(align), warnings)
}

/// The collectives: per kernel name, the n-th kernel of each participant (start order); names
/// missing on some participant left out, and a name with different counts matched up to the
/// smallest (with a warning). Returns the names (indexed by [`Coll::name`]) and the collectives.
fn match_collectives(ps: &[Rank], warnings: &mut Vec<String>) -> (Vec<String>, Vec<Coll>) {
    // Kernels of each name, per participant.
    let mut names: Vec<String> = Vec::new();
    let mut name_ix: HashMap<String, usize> = HashMap::new();
    let mut per: Vec<Vec<Vec<usize>>> = Vec::new();
    for p in ps {
        let mut by: Vec<Vec<usize>> = vec![Vec::new(); names.len()];
        for &i in &p.comm {
            let n = p.m.str(p.m.kernel(i).name);
            let ix = *name_ix.entry(n.to_string()).or_insert_with(|| {
                names.push(n.to_string());
                names.len() - 1
            });
            if by.len() <= ix {
                by.resize(ix + 1, Vec::new());
            }
            by[ix].push(i);
        }
        per.push(by);
    }
    let mut colls: Vec<Coll> = Vec::new();
    for (ix, name) in names.iter().enumerate() {
        let counts: Vec<usize> = per
            .iter()
            .map(|by| by.get(ix).map_or(0, |v| v.len()))
            .collect();
        let n = counts.iter().copied().min().unwrap_or(0);
        if n == 0 {
            continue;
        }
        if counts.iter().any(|&c| c != n) {
            warnings.push(format!(
                "ranks recorded different numbers of {} kernels ({}): the first {n} of each were matched",
                crate::kernels::short_name(name),
                counts
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for j in 0..n {
            if colls.len() >= MAX_COLLECTIVES {
                break;
            }
            colls.push(Coll {
                name: ix,
                k: per.iter().map(|by| by[ix][j]).collect(),
            });
        }
    }
    if colls.len() >= MAX_COLLECTIVES {
        warnings.push(format!(
            "more than {MAX_COLLECTIVES} collectives: the rest were left out"
        ));
    }
    (names, colls)
}

/// The distinct hosts of the participants (their headers' `host`), sorted.
fn hosts_of(ps: &[Rank]) -> Vec<String> {
    let mut hosts: Vec<String> = ps
        .iter()
        .map(|p| p.m.header().map(|h| h.host.clone()).unwrap_or_default())
        .collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// One host's sessions on its wall clock, through their headers' clock pairs.
fn align_same_host(ps: &mut [Rank]) {
    for p in ps.iter_mut() {
        p.offset =
            p.m.header()
                .map_or(0, |h| h.clock.unix_ns as i128 - h.clock.trace_ns as i128);
    }
}

/// Put the participants' clocks on one time line (each one's `offset`): one host's sessions on
/// its wall clock through their headers' clock pairs, else each rank on the first one's clock
/// through the collectives' end times (with a warning). Returns the method and the hosts.
fn align_clocks(
    ps: &mut [Rank],
    colls: &[Coll],
    warnings: &mut Vec<String>,
) -> (ClockMethod, Vec<String>) {
    let hosts = hosts_of(ps);
    let method = if hosts.len() == 1 {
        align_same_host(ps);
        ClockMethod::SameHost
    } else {
        for pi in 1..ps.len() {
            let mut d: Vec<i128> = colls
                .iter()
                .map(|c| ps[0].m.kernel(c.k[0]).end as i128 - ps[pi].m.kernel(c.k[pi]).end as i128)
                .collect();
            ps[pi].offset = median_of(&mut d);
        }
        warnings.push(format!(
            "the ranks ran on {} hosts: their clocks are aligned on the collectives' end times, not measured (docs/insights.md, rule collective-wait)",
            hosts.len()
        ));
        ClockMethod::CollectiveEnds
    };
    (method, hosts)
}

/// Sorted, disjoint intervals on the aligned clock, ns.
type Spans = Vec<(i128, i128)>;

/// Sort and merge intervals (empty ones dropped; touching ones merged): [`crate::intervals::merge`].
fn merged(mut v: Spans) -> Spans {
    let n = crate::intervals::merge(&mut v).len();
    v.truncate(n);
    v
}

/// The intersection of two sorted, disjoint interval lists.
fn intersect(a: &[(i128, i128)], b: &[(i128, i128)]) -> Spans {
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::new();
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if s < e {
            out.push((s, e));
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// A participant's GPU-observed time on the aligned clock: its windows in an always-on session
/// (its whole span in a default-mode one), less its paused intervals.
fn observed(p: &Rank) -> Spans {
    let m = p.m;
    let o = p.offset;
    let seen: Spans = if m.is_always_on() {
        merged(
            m.windows()
                .iter()
                .map(|w| (w.start as i128 + o, w.end as i128 + o))
                .collect(),
        )
    } else {
        let (t0, t1) = m.time_range();
        vec![(t0 as i128 + o, t1 as i128 + o + 1)]
    };
    // The complement of the paused intervals.
    let mut free: Spans = Vec::new();
    let mut at = i128::MIN;
    for &(s, e) in m.paused() {
        let (s, e) = (s as i128 + o, e as i128 + o);
        if s > at {
            free.push((at, s));
        }
        at = at.max(e);
    }
    free.push((at, i128::MAX));
    intersect(&seen, &free)
}

/// The interval of `iv` (sorted, disjoint) holding all of `[s, e]`, if one does.
fn holding(iv: &[(i128, i128)], s: i128, e: i128) -> Option<usize> {
    let i = iv.partition_point(|x| x.1 < e);
    iv.get(i).filter(|x| x.0 <= s).map(|_| i)
}

/// Where a participant's API records cover its host, on the aligned clock: in an always-on
/// session, its windows holding at least one API record (full-detail windows: sampled ones
/// record none), less paused time; in a default-mode one, all it observed.
fn api_cover(p: &Rank) -> Spans {
    let (m, o) = (p.m, p.offset);
    if !m.is_always_on() {
        return observed(p);
    }
    let ws: Spans = m
        .windows()
        .iter()
        .map(|w| (w.start as i128 + o, w.end as i128 + o))
        .collect();
    let mut hit = vec![false; ws.len()];
    for i in 0..m.api_count() as usize {
        let t = m.api(i).start as i128 + o;
        let j = ws.partition_point(|w| w.0 <= t);
        if j > 0 && t < ws[j - 1].1 {
            hit[j - 1] = true;
        }
    }
    let with_api: Spans = ws
        .into_iter()
        .zip(hit)
        .filter(|x| x.1)
        .map(|x| x.0)
        .collect();
    intersect(&merged(with_api), &observed(p))
}

/// The windows every participant of an always-on run had open (its time, on the aligned clock).
struct Shared {
    iv: Spans,
}

impl Shared {
    /// The interval holding all of `[s, e]`, if one does.
    fn holding(&self, s: i128, e: i128) -> Option<usize> {
        holding(&self.iv, s, e)
    }

    /// Time of the intervals inside `[a, b]`, ns.
    fn within(&self, a: i128, b: i128) -> u64 {
        self.iv
            .iter()
            .map(|&(s, e)| (e.min(b) - s.max(a)).max(0))
            .sum::<i128>() as u64
    }
}

/// What an always-on run's matching rests on: the shared windows, per shared window holding
/// matched collectives the span from their first start to their last end (the time the GPU work
/// is compared over), and the summary given in the output.
struct Sampled {
    shared: Shared,
    spans: Spans,
    summary: SharedWindows,
}

impl Sampled {
    fn new(shared: Shared, ps: &[Rank], colls: &[Coll]) -> Sampled {
        let mut spans: Vec<Option<(i128, i128)>> = vec![None; shared.iv.len()];
        for c in colls {
            let se: Vec<(i128, i128)> = c.k.iter().zip(ps).map(|(&k, p)| p.at(k)).collect();
            let s = se.iter().map(|x| x.0).min().unwrap_or(0);
            let e = se.iter().map(|x| x.1).max().unwrap_or(0);
            if let Some(w) = shared.holding(s, e) {
                let x = spans[w].get_or_insert((s, e));
                *x = (x.0.min(s), x.1.max(e));
            }
        }
        let spans: Spans = spans.into_iter().flatten().collect();
        let summary = SharedWindows {
            windows: shared.iv.len() as u64,
            with_collectives: spans.len() as u64,
            observed_ns: shared.within(i128::MIN, i128::MAX),
        };
        Sampled {
            shared,
            spans,
            summary,
        }
    }

    /// The insight's basis: estimated from the time every rank observed, over the run's span.
    /// Not extrapolated to the whole run: the windows the ranks shared are where they happened
    /// to overlap, and a run's start (NCCL's set-up, seconds long on the H200 machine) has no
    /// collectives to wait in.
    fn basis(&self, ps: &[Rank]) -> crate::sampling::Basis {
        let lo = ps
            .iter()
            .map(|p| p.m.time_range().0 as i128 + p.offset)
            .min()
            .unwrap_or(0);
        let hi = ps
            .iter()
            .map(|p| p.m.time_range().1 as i128 + p.offset)
            .max()
            .unwrap_or(0);
        let observed = self.summary.observed_ns;
        let coverage = if hi > lo {
            (observed as f64 / (hi - lo) as f64).min(1.0)
        } else {
            1.0
        };
        crate::sampling::Basis {
            kind: crate::sampling::BasisKind::Estimated,
            observed_ns: observed,
            coverage,
            extrapolated_impact_ns: None,
        }
    }
}

/// An always-on run's matching: the kernel names (indexed by [`Coll::name`]), the collectives,
/// the hosts, and the shared windows.
type Matched = (Vec<String>, Vec<Coll>, Vec<String>, Sampled);

/// An always-on run's collectives, matched by time (see the module doc): one host's clocks
/// aligned first, then per kernel name each anchor kernel whole inside a shared window paired
/// with every other participant's kernel of that name ending nearest it, within the tolerance.
/// Returns None (with a warning) when that cannot be done: several hosts, windows that never
/// overlap, no collective recorded by every rank.
fn match_in_windows(ps: &mut [Rank], warnings: &mut Vec<String>) -> Option<Matched> {
    let hosts = hosts_of(ps);
    if hosts.len() > 1 {
        warnings.push(format!(
            "always-on sessions on {} hosts: collectives not matched (windows record collectives at different times on each rank, so they are matched by time, which needs the clocks aligned first; across hosts the clocks are aligned only by matching collectives)",
            hosts.len()
        ));
        return None;
    }
    align_same_host(ps);
    let mut iv = observed(&ps[0]);
    for p in &ps[1..] {
        iv = intersect(&iv, &observed(p));
    }
    if iv.is_empty() {
        warnings.push(
            "always-on windows of the ranks never overlapped: no collective recorded by every rank, collectives not matched".into(),
        );
        return None;
    }
    let shared = Shared { iv };
    // Per participant and kernel name: (aligned end, kernel), by end.
    let mut names: Vec<String> = Vec::new();
    let mut name_ix: HashMap<String, usize> = HashMap::new();
    let mut per: Vec<HashMap<usize, Vec<(i128, usize)>>> = Vec::new();
    for p in ps.iter() {
        let mut by: HashMap<usize, Vec<(i128, usize)>> = HashMap::new();
        for &k in &p.comm {
            let n = p.m.str(p.m.kernel(k).name);
            let ix = *name_ix.entry(n.to_string()).or_insert_with(|| {
                names.push(n.to_string());
                names.len() - 1
            });
            by.entry(ix).or_default().push((p.at(k).1, k));
        }
        for v in by.values_mut() {
            v.sort_unstable();
        }
        per.push(by);
    }
    // The gap from the `i`-th end of a list to its nearer neighbour (unbounded without one).
    let gap = |v: &[(i128, usize)], i: usize| -> i128 {
        let before = i.checked_sub(1).map_or(i128::MAX, |h| v[i].0 - v[h].0);
        let after = v.get(i + 1).map_or(i128::MAX, |x| x.0 - v[i].0);
        before.min(after)
    };
    let mut colls: Vec<(i128, Coll)> = Vec::new();
    for ix in 0..names.len() {
        let lists: Option<Vec<&Vec<(i128, usize)>>> = per.iter().map(|by| by.get(&ix)).collect();
        let Some(lists) = lists else {
            continue;
        };
        let anchor = lists[0];
        for (i, &(ea, ka)) in anchor.iter().enumerate() {
            let Some(w) = shared.holding(ps[0].at(ka).0, ea) else {
                continue;
            };
            let mut k = vec![ka];
            for (q, b) in lists.iter().enumerate().skip(1) {
                // The kernel of this name ending nearest the anchor's.
                let j = b.partition_point(|x| x.0 < ea);
                let Some(j) = [j.checked_sub(1), (j < b.len()).then_some(j)]
                    .into_iter()
                    .flatten()
                    .min_by_key(|&j| (b[j].0 - ea).abs())
                else {
                    break;
                };
                let (eb, kb) = b[j];
                let d = (eb - ea).abs();
                let fits = d <= MAX_END_DIFF_NS as i128
                    && d.saturating_mul(2) < gap(anchor, i)
                    && d.saturating_mul(2) < gap(b, j)
                    && shared.holding(ps[q].at(kb).0, eb) == Some(w);
                if !fits {
                    break;
                }
                k.push(kb);
            }
            if k.len() == ps.len() {
                colls.push((ea, Coll { name: ix, k }));
            }
        }
    }
    if colls.is_empty() {
        warnings.push(format!(
            "always-on: no collective recorded by every rank inside the {} interval{} in which all their windows were open: collectives not matched",
            shared.iv.len(),
            if shared.iv.len() == 1 { "" } else { "s" }
        ));
        return None;
    }
    colls.sort_by_key(|c| (c.0, c.1.name));
    if colls.len() > MAX_COLLECTIVES {
        colls.truncate(MAX_COLLECTIVES);
        warnings.push(format!(
            "more than {MAX_COLLECTIVES} collectives: the rest were left out"
        ));
    }
    let colls: Vec<Coll> = colls.into_iter().map(|c| c.1).collect();
    let sampled = Sampled::new(shared, ps, &colls);
    Some((names, colls, hosts, sampled))
}

/// The matched collectives on the aligned clocks.
struct Spread {
    /// Per collective: the spread of its end times across the participants.
    end_spreads: Vec<i128>,
    /// Per participant: its summed lateness (its start after every other participant's).
    late_sum: Vec<i128>,
    /// The first start and the last end of them all.
    first: i128,
    last: i128,
}

impl Spread {
    fn of(ps: &[Rank], colls: &[Coll]) -> Spread {
        let np = ps.len();
        let mut end_spreads: Vec<i128> = Vec::with_capacity(colls.len());
        let mut late_sum = vec![0i128; np];
        let (mut first, mut last) = (i128::MAX, i128::MIN);
        for c in colls {
            let se: Vec<(i128, i128)> = (0..np).map(|pi| ps[pi].at(c.k[pi])).collect();
            let (lo, hi) = se.iter().fold((i128::MAX, i128::MIN), |(a, b), &(_, e)| {
                (a.min(e), b.max(e))
            });
            end_spreads.push(hi - lo);
            first = first.min(se.iter().map(|x| x.0).min().unwrap_or(first));
            last = last.max(hi);
            for pi in 0..np {
                let others = (0..np)
                    .filter(|&q| q != pi)
                    .map(|q| se[q].0)
                    .max()
                    .unwrap_or(se[pi].0);
                late_sum[pi] += (se[pi].0 - others).max(0);
            }
        }
        Spread {
            end_spreads,
            late_sum,
            first,
            last,
        }
    }
}

/// The late rank's lateness at each collective, and the other ranks' waits for it.
struct Waits {
    /// Per collective: the late rank's start after the latest start of the others, ns (0 when
    /// it was not last).
    lateness: Vec<u64>,
    /// The other ranks' time in their communication kernels before the late rank's start, and
    /// all their communication kernel time, ns.
    wait: u64,
    comm: u64,
    /// Collectives the late rank started last.
    last_count: u64,
    /// Collectives it reached at least [`MIN_LATE_NS`] after the others (indices).
    late_colls: Vec<usize>,
    /// Waiting time per kernel name (index into the names).
    op_votes: HashMap<usize, u64>,
}

impl Waits {
    fn of(ps: &[Rank], colls: &[Coll], l: usize) -> Waits {
        let np = ps.len();
        let mut lateness: Vec<u64> = Vec::with_capacity(colls.len());
        let (mut wait, mut comm, mut last_count) = (0u64, 0u64, 0u64);
        let mut late_colls: Vec<usize> = Vec::new();
        let mut op_votes: HashMap<usize, u64> = HashMap::new();
        for (ci, c) in colls.iter().enumerate() {
            let sl = ps[l].at(c.k[l]).0;
            let others = (0..np)
                .filter(|&q| q != l)
                .map(|q| ps[q].at(c.k[q]).0)
                .max()
                .unwrap_or(sl);
            let late = (sl - others).max(0) as u64;
            lateness.push(late);
            if late > 0 {
                last_count += 1;
            }
            for q in (0..np).filter(|&q| q != l) {
                let (s, e) = ps[q].at(c.k[q]);
                let d = (e - s) as u64;
                comm += d;
                let w = ((sl - s).max(0) as u64).min(d);
                wait += w;
                *op_votes.entry(c.name).or_default() += w;
            }
            if late >= MIN_LATE_NS {
                late_colls.push(ci);
            }
        }
        Waits {
            lateness,
            wait,
            comm,
            last_count,
            late_colls,
            op_votes,
        }
    }
}

/// The rule's figures over the collectives, and whether it fires.
struct Figures {
    /// The lateness of the late collectives (at least [`MIN_LATE_NS`]), sorted.
    sorted: Vec<u64>,
    median_late: u64,
    /// [`lateness_weighted_median`] of `sorted`.
    weighted_late: u64,
    /// Matched collectives.
    n: u64,
    /// Their span (first start to last end, aligned; in an always-on run the time every rank
    /// observed inside it), ns.
    window: u64,
    /// The mean over the other ranks of their waiting time, ns.
    impact: u64,
    /// The late rank's share of all ranks' summed lateness.
    dominance: f64,
    fires: bool,
}

impl Figures {
    /// `window`: the matched collectives' span, or the observed time in it (always-on).
    fn of(
        w: &Waits,
        s: &Spread,
        l: usize,
        (np, n): (usize, usize),
        (window, sampled): (u64, bool),
    ) -> Figures {
        let mut sorted: Vec<u64> = w
            .lateness
            .iter()
            .copied()
            .filter(|&x| x >= MIN_LATE_NS)
            .collect();
        sorted.sort_unstable();
        let median_late = pct(&sorted, 50);
        let weighted_late = lateness_weighted_median(&sorted);
        let impact = w.wait / (np as u64 - 1);
        let all_late: i128 = s.late_sum.iter().sum();
        let dominance = if all_late > 0 {
            s.late_sum[l] as f64 / all_late as f64
        } else {
            0.0
        };
        let fires = sorted.len() as u64 >= MIN_LATE_COLLECTIVES
            && s.late_sum[l] * 100 >= all_late * MIN_DOMINANCE_PCT as i128
            && w.comm > 0
            && (w.wait as u128) * 100 >= (w.comm as u128) * MIN_WAIT_PCT as u128
            && (impact as u128) * 100 >= (window as u128) * MIN_WINDOW_PCT as u128
            && (!sampled || pct(&sorted, 90) >= MIN_SAMPLED_P90_NS);
        Figures {
            sorted,
            median_late,
            weighted_late,
            n: n as u64,
            window,
            impact,
            dominance,
            fires,
        }
    }
}

/// The late rank's host calls (API records and synchronizations of every thread of the
/// process), and how their lines are found.
struct HostCalls<'c> {
    m: &'c Model,
    cx: &'c Ctx<'c>,
    locator: &'c Locator<'c>,
    /// (start, end, call) by start: API records (call `i`), then synchronizations (call
    /// `na + i`: a sync may have no API record of its own).
    calls: Vec<(u64, u64, usize)>,
    /// API records.
    na: usize,
}

/// The line of a host call, how it was found, and the call's (thread, start).
type CallLine = (Option<LocIx>, LocationSource, CallAt);

/// A host call's (thread, start), when known.
type CallAt = Option<(u64, u64)>;

impl<'c> HostCalls<'c> {
    fn new(cx: &'c Ctx<'c>, locator: &'c Locator<'c>) -> HostCalls<'c> {
        let m = cx.m;
        let na = m.api_count() as usize;
        // Status polls (`cudaEventQuery`, `cuStreamQuery`…) are left out: watchdog and proxy
        // threads (PyTorch's NCCL watchdog) issue them on their own schedule, whatever the host
        // is doing.
        let mut calls: Vec<(u64, u64, usize)> = (0..na)
            .map(|i| (i, m.api(i)))
            .filter(|(_, a)| !m.str(a.name).contains("Query"))
            .map(|(i, a)| (a.start, a.end.max(a.start), i))
            .chain((0..m.sync_count()).map(|i| {
                let s = m.sync(i);
                (s.start, s.end.max(s.start), na + i)
            }))
            .collect();
        calls.sort_unstable();
        HostCalls {
            m,
            cx,
            locator,
            calls,
            na,
        }
    }

    /// The line of host call `c`.
    fn call_loc(&self, c: usize) -> CallLine {
        let m = self.m;
        if c < self.na {
            let a = m.api(c);
            let (loc, src) = self.locator.locate(a.corr, None, Some(&a), a.start);
            (loc, src, Some((a.tid, a.start)))
        } else {
            let i = c - self.na;
            let loc = self.cx.sync_loc(i);
            let s = m.sync(i);
            let src = match loc {
                None => LocationSource::None,
                Some(_) => LocationSource::Sync,
            };
            (loc, src, s.tid.map(|t| (t, s.start)))
        }
    }

    /// The line of the call at `calls[pos]` that ended a stretch. A launch without a call-site
    /// stack of its own (launches are sampled) takes the sampled call sites of the same kernel
    /// function from the same thread; else the first call after it on the same thread that has
    /// one, before that thread's next synchronization (at most 256 calls on): the host reached
    /// that line right after the stretch.
    fn stretch_end_loc(&self, pos: usize) -> CallLine {
        let (m, calls, na) = (self.m, &self.calls, self.na);
        let first = self.call_loc(calls[pos].2);
        if first.1 <= LocationSource::Sync || pos >= calls.len() {
            return first;
        }
        let Some((tid, _)) = first.2 else {
            return first;
        };
        if calls[pos].2 < na {
            let a = m.api(calls[pos].2);
            if let Some(loc) = self.locator.kernel_thread_line(a.corr, a.tid) {
                return (Some(loc), LocationSource::KernelCallsites, first.2);
            }
        }
        for c in calls[pos + 1..].iter().take(256) {
            if c.2 >= na {
                if m.sync(c.2 - na).tid == Some(tid) {
                    break;
                }
                continue;
            }
            let a = m.api(c.2);
            if a.tid != tid {
                continue;
            }
            if let Some(loc) = self.cx.callsite_loc(a.corr) {
                return (
                    Some(loc),
                    LocationSource::NextCallsite,
                    Some((a.tid, a.start)),
                );
            }
        }
        first
    }

    /// Launch start of kernel `k` (its start when the launch has no API record).
    fn launch_at(&self, k: usize) -> u64 {
        let r = self.m.kernel(k);
        self.cx.api(r.corr).map_or(r.start, |a| a.start)
    }
}

/// The longest stretch without a CUDA call before a late collective: the call that ended it
/// (index into the host calls), the call before it, its length, and the collective's lateness.
type Stretch = (usize, Option<usize>, u64, u64);

/// Whether a stretch explains its collective's lateness: at least half of it.
fn explains(g: &Stretch) -> bool {
    g.2.saturating_mul(2) >= g.3
}

/// Per late collective: the late rank's longest stretch without a CUDA call between its
/// previous communication kernel's launch and this one's. `cover` (always-on runs): where the
/// late rank's host calls were recorded and every rank observed its GPU (aligned clock); a
/// collective is left out unless that whole span lies in one of its intervals, so unrecorded
/// time never reads as time without a CUDA call.
fn stretches(
    h: &HostCalls,
    lr: &Rank,
    (l, colls): (usize, &[Coll]),
    w: &Waits,
    cover: Option<&[(i128, i128)]>,
) -> Vec<Stretch> {
    let (t0, calls) = (h.m.time_range().0, &h.calls);
    let pos_of: HashMap<usize, usize> = lr.comm.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    let mut gaps: Vec<Stretch> = Vec::new();
    for &ci in &w.late_colls {
        let k = colls[ci].k[l];
        let end = h.launch_at(k);
        let prev = pos_of
            .get(&k)
            .and_then(|&p| p.checked_sub(1))
            .map(|p| lr.comm[p]);
        let begin = match (prev, cover) {
            (Some(p), _) => h.launch_at(p),
            (None, None) => t0,
            (None, Some(_)) => continue,
        };
        if let Some(c) = cover {
            let o = lr.offset;
            if holding(c, begin as i128 + o, end as i128 + o).is_none() {
                continue;
            }
        }
        let from = calls.partition_point(|c| c.0 < begin);
        let mut best: Option<(u64, usize, Option<usize>)> = None;
        let mut reach: Option<(u64, usize)> = None;
        for (j, c) in calls[from..]
            .iter()
            .enumerate()
            .take_while(|(_, c)| c.0 <= end)
        {
            if let Some((re, ri)) = reach {
                if c.0 > re && best.is_none_or(|b| c.0 - re > b.0) {
                    best = Some((c.0 - re, from + j, Some(ri)));
                }
            }
            if reach.is_none_or(|(re, _)| c.1 > re) {
                reach = Some((c.1, c.2));
            }
        }
        if let Some((d, after, before)) = best {
            gaps.push((after, before, d, w.lateness[ci]));
        }
    }
    gaps
}

/// Where the late rank's host spent the time: the insight's location and host figures.
struct Host {
    loc: Option<LocIx>,
    location: SourceLoc,
    /// The line of the call before the stretch.
    before: Option<SourceLoc>,
    src: LocationSource,
    /// The scope open where the stretch ended.
    scope: Option<Vec<String>>,
    host_bound: bool,
    gap_median: Option<u64>,
    /// Late collectives whose stretch explains their lateness, and all with a stretch.
    explained: usize,
    stretches: usize,
    /// The title's lateness: where the host made the rank late when host-bound (the later
    /// buckets' small lateness would hide it), else the lateness-weighted median over the late
    /// collectives (the plain median would land on the later buckets).
    title_late: u64,
    /// Host-bound with host records: the join over the stretches, and the line's share and
    /// activity when the location moved to it.
    join: Option<HostActivity>,
    moved: Option<(f64, String)>,
    /// The location it has without the move.
    gap_ended_at: Option<SourceLoc>,
    /// Not host-bound: the late rank's extra GPU work.
    extra: Vec<ExtraKernel>,
    /// An always-on run: stretches only where the late rank's API records and every rank's
    /// windows were (none: too few such late collectives).
    windowed: bool,
    /// The late rank's program kind, whose words the fix uses.
    program: Program,
}

/// A location: the line, the call before the stretch, how it was found, the scope open there.
type Line = (
    Option<LocIx>,
    Option<SourceLoc>,
    LocationSource,
    Option<Vec<String>>,
);

/// Where the late rank's host spent the time before its late collectives (see the module doc).
fn host_time(
    ps: &[Rank],
    l: usize,
    (colls, spread, sampled): (&[Coll], &Spread, Option<&Sampled>),
    w: &Waits,
    weighted_late: u64,
    cfg: &Config,
) -> Host {
    let lr = &ps[l];
    let m = lr.m;
    let busy = DeviceBusy::new(m);
    let (t0, t1) = m.time_range();
    let cx = Ctx::new(m, cfg, &busy, t1.saturating_sub(t0));
    let locator = Locator::new(&cx);
    let h = HostCalls::new(&cx, &locator);
    let cover = sampled.map(|s| intersect(&s.shared.iv, &api_cover(lr)));
    let mut gaps = stretches(&h, lr, (l, colls), w, cover.as_deref());
    // Always-on: too few stretches to judge the host by are none.
    if sampled.is_some() && (gaps.len() as u64) < MIN_LATE_COLLECTIVES {
        gaps.clear();
    }
    // The host explains a collective's lateness when its stretch is at least half of it; the run
    // is host-bound when such collectives hold at least half of all the lateness. (With DDP's
    // gradient buckets, the first collective of a step is late by the host's whole delay and the
    // later ones by a little each, with short stretches between backward's launches: a median
    // over all of them would hide the one stretch that matters.)
    let late_all = gaps.iter().fold(0u64, |a, g| a.saturating_add(g.3));
    let late_explained = gaps
        .iter()
        .filter(|g| explains(g))
        .fold(0u64, |a, g| a.saturating_add(g.3));
    let host_bound = !gaps.is_empty() && late_explained.saturating_mul(2) >= late_all;
    // The stretches reported: those of the collectives the host explains when host-bound, all
    // of them otherwise.
    let mut stretch: Vec<u64> = gaps
        .iter()
        .filter(|g| !host_bound || explains(g))
        .map(|g| g.2)
        .collect();
    stretch.sort_unstable();
    let gap_median = (!stretch.is_empty()).then(|| pct(&stretch, 50));
    let explained = gaps.iter().filter(|g| explains(g)).count();
    let mut explained_late: Vec<u64> = gaps.iter().filter(|g| explains(g)).map(|g| g.3).collect();
    explained_late.sort_unstable();
    let title_late = if host_bound && !explained_late.is_empty() {
        pct(&explained_late, 50)
    } else {
        weighted_late
    };
    let (loc, before, src, scope) = if host_bound {
        stretch_line(&h, &gaps)
    } else {
        None
    }
    .unwrap_or_else(|| launch_line(&h, l, colls, &w.late_colls));
    let mut host = Host {
        loc,
        location: locator.source_loc(loc),
        before,
        src,
        scope,
        host_bound,
        gap_median,
        explained,
        stretches: gaps.len(),
        title_late,
        join: None,
        moved: None,
        gap_ended_at: None,
        extra: Vec::new(),
        windowed: sampled.is_some(),
        program: cx.program,
    };
    if host_bound {
        stretch_join(&h, &gaps, &mut host);
    } else if gap_median.is_some() {
        // Compared over the matched collectives' span, or (always-on) over the parts of it
        // every rank observed.
        let whole = [(spread.first, spread.last)];
        let spans = sampled.map_or(&whole[..], |s| &s.spans[..]);
        host.extra = extra_kernels(
            ps,
            l,
            (spans, sampled.is_some()),
            w.late_colls.len() as u64,
            cfg,
        );
        // The launch line of the work with the most extra time that has one (a library's
        // launches, cuBLAS's, may have no sampled call site).
        if let Some(line) = host.extra.iter().find_map(|k| k.launch_line.clone()) {
            if line != host.location {
                host.gap_ended_at = Some(std::mem::replace(&mut host.location, line));
                host.moved = Some((0.0, String::new()));
            }
        }
    }
    host
}

/// What the late rank's host was doing during the stretches that explain its lateness (the join
/// of `shared::host` over them, the thread of the call that ended each, and its driver): the
/// location moves to the host line holding most of their time.
fn stretch_join(h: &HostCalls, gaps: &[Stretch], host: &mut Host) {
    let hx = h.cx.host();
    if hx.is_empty() {
        return;
    }
    let spans: Vec<HostGap> = gaps
        .iter()
        .filter(|g| explains(g))
        .map(|&(after, _, d, _)| {
            let c = h.calls[after];
            HostGap {
                start: c.0.saturating_sub(d),
                end: c.0,
                tid: h.call_loc(c.2).2.map(|(t, _)| t),
            }
        })
        .collect();
    let j = hx.explain(h.cx, h.locator, &spans, host.loc);
    if let Some(t) = j.line.as_ref().filter(|t| Some(t.loc) != host.loc) {
        let new_loc = h.locator.source_loc(t.loc);
        host.gap_ended_at = Some(std::mem::replace(&mut host.location, new_loc));
        host.loc = Some(t.loc);
        host.moved = Some((t.share, t.phrase.clone()));
    }
    host.join = Some(j.activity);
}

/// Whether aligned time `t` lies in one of `spans` (ends included).
fn in_spans(spans: &[(i128, i128)], t: i128) -> bool {
    holding(spans, t, t).is_some()
}

/// Per kernel name (communication kernels left out): launches and GPU time of a rank's kernels
/// that start inside the aligned spans (sorted, disjoint; ends included).
fn kernel_profile(r: &Rank, spans: &[(i128, i128)]) -> HashMap<String, (u64, u64)> {
    let m = r.m;
    let mut out: HashMap<String, (u64, u64)> = HashMap::new();
    let mut comm: HashMap<u32, bool> = HashMap::new();
    for k in 0..m.kernel_count() {
        let (s, e) = r.at(k);
        if !in_spans(spans, s) {
            continue;
        }
        let name = m.kernel(k).name;
        let is_comm = *comm
            .entry(name.0)
            .or_insert_with(|| crate::comm::is_comm_kernel(m.str(name)));
        if is_comm {
            continue;
        }
        let e2 = out.entry(m.str(name).to_string()).or_default();
        e2.0 += 1;
        e2.1 += (e - s) as u64;
    }
    out
}

/// A rank's sampled launch call sites by (kernel name, line as `file:line`): the calls they
/// stand for, and the line. With `spans` (always-on runs), only the launches of kernels that
/// start inside them.
fn site_lines(
    r: &Rank,
    spans: Option<&[(i128, i128)]>,
    cfg: &Config,
) -> HashMap<(String, String), (u64, SourceLoc)> {
    let m = r.m;
    let mut name_of: HashMap<u32, u32> = HashMap::new();
    for k in 0..m.kernel_count() {
        if spans.is_some_and(|sp| !in_spans(sp, r.at(k).0)) {
            continue;
        }
        let r = m.kernel(k);
        if r.corr.known().is_some() {
            name_of.entry(r.corr.0).or_insert(r.name.0);
        }
    }
    let mut locs: HashMap<crate::ids::StackIx, SourceLoc> = HashMap::new();
    let mut out: HashMap<(String, String), (u64, SourceLoc)> = HashMap::new();
    for c in &m.callsites {
        let Some(&name) = name_of.get(&c.corr.0) else {
            continue;
        };
        let loc = locs
            .entry(c.stack)
            .or_insert_with(|| crate::userframe::user_frame(m, c.stack, &cfg.filter))
            .clone();
        if loc.is_unattributed() {
            continue;
        }
        let key = (m.str(gpufl_trace::StrId(name)).to_string(), loc.short());
        let e = out.entry(key).or_insert((0, loc));
        e.0 += c.weight as u64;
    }
    out
}

/// The kernels the late rank runs and the others do not, or runs longer (over `spans`: the
/// matched collectives' span, or in an always-on run the parts of it every rank observed, with
/// `windowed` set), with the launch line of their extra launches.
fn extra_kernels(
    ps: &[Rank],
    l: usize,
    (spans, windowed): (&[(i128, i128)], bool),
    late: u64,
    cfg: &Config,
) -> Vec<ExtraKernel> {
    let mine = kernel_profile(&ps[l], spans);
    let others: Vec<HashMap<String, (u64, u64)>> = (0..ps.len())
        .filter(|&q| q != l)
        .map(|q| kernel_profile(&ps[q], spans))
        .collect();
    let n = others.len().max(1) as u64;
    let mut extra: Vec<ExtraKernel> = mine
        .iter()
        .filter_map(|(name, &(count, ns))| {
            let (oc, ons) = others.iter().fold((0u64, 0u64), |a, o| {
                let v = o.get(name).copied().unwrap_or((0, 0));
                (a.0 + v.0, a.1 + v.1)
            });
            let (oc, ons) = (oc / n, ons / n);
            (ns > ons).then(|| ExtraKernel {
                name: name.clone(),
                launches: count,
                others_launches: oc,
                gpu_ns: ns,
                others_gpu_ns: ons,
                extra_ns: ns - ons,
                per_late_collective_ns: (ns - ons) / late.max(1),
                launch_line: None,
            })
        })
        .collect();
    let total: u64 = extra.iter().map(|k| k.extra_ns).sum();
    // Kernels only the late rank runs about every step (at least once per two late
    // collectives: a one-off kernel is no straggler's work), and those holding enough of the
    // extra time.
    extra.retain(|k| {
        (k.others_launches == 0 && k.launches * 2 >= late)
            || k.extra_ns as u128 * 100 >= total as u128 * MIN_EXTRA_PCT as u128
    });
    extra.sort_by(|a, b| {
        b.extra_ns
            .cmp(&a.extra_ns)
            .then_with(|| a.name.cmp(&b.name))
    });
    extra.truncate(MAX_EXTRA_KERNELS);
    if extra.is_empty() {
        return extra;
    }
    // Launch lines: the late rank's call sites of each kernel, by line, less the others' mean.
    let sites_in = windowed.then_some(spans);
    let my_sites = site_lines(&ps[l], sites_in, cfg);
    let other_sites: Vec<HashMap<(String, String), (u64, SourceLoc)>> = (0..ps.len())
        .filter(|&q| q != l)
        .map(|q| site_lines(&ps[q], sites_in, cfg))
        .collect();
    for k in extra.iter_mut() {
        let best = my_sites
            .iter()
            .filter(|(key, _)| key.0 == k.name)
            .map(|(key, (w, loc))| {
                let o: u64 = other_sites
                    .iter()
                    .map(|s| s.get(key).map_or(0, |v| v.0))
                    .sum::<u64>()
                    / n;
                (w.saturating_sub(o), std::cmp::Reverse(key.1.clone()), loc)
            })
            .filter(|x| x.0 > 0)
            .max_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        k.launch_line = best.map(|b| b.2.clone());
    }
    extra
}

/// The line of the call that ended the most stretch time (of the stretches that explain their
/// collective's lateness), with the call before it and the scope open there; None without one.
fn stretch_line(h: &HostCalls, gaps: &[Stretch]) -> Option<Line> {
    let mut by_loc: HashMap<Option<LocIx>, LocVotes> = HashMap::new();
    // Per location of the call that ended a stretch: the stretch time, votes for the call before.
    let mut where_at: Vec<(Option<LocIx>, CallAt)> = Vec::new();
    for &(after, before, d, _) in gaps.iter().filter(|g| explains(g)) {
        let (loc, src, at) = h.stretch_end_loc(after);
        where_at.push((loc, at));
        let e = by_loc.entry(loc).or_insert((0, Vec::new(), src));
        e.0 += d;
        e.2 = e.2.max(src);
        if let Some(b) = before {
            e.1.push((0, none_last(h.call_loc(b).0)));
        }
    }
    let (loc, (_, votes, src)) = by_loc
        .into_iter()
        .max_by_key(|(loc, v)| (v.0, std::cmp::Reverse(none_last(*loc))))?;
    let before = most_frequent_per_key(votes)
        .first()
        .and_then(|&(_, (_, b))| b)
        .filter(|&b| Some(b) != loc)
        .map(|b| h.locator.source_loc(b));
    // The scope open where the stretch ended, on the calling thread.
    let scope = where_at
        .iter()
        .find(|w| w.0 == loc)
        .and_then(|w| w.1)
        .and_then(|(tid, ts)| h.m.innermost_scope(tid, ts.saturating_sub(1)))
        .map(|i| h.m.scope_path(i));
    Some((loc, before, src, scope))
}

/// The late collectives' own launch line (the most frequent).
fn launch_line(h: &HostCalls, l: usize, colls: &[Coll], late_colls: &[usize]) -> Line {
    let mut votes = Vec::new();
    let mut src = LocationSource::None;
    for &ci in late_colls {
        let r = h.m.kernel(colls[ci].k[l]);
        let a = h.cx.api(r.corr);
        let (loc, s) = h.locator.locate(r.corr, None, a.as_ref(), r.start);
        if let Some(loc) = loc {
            votes.push((0, loc));
            src = src.min(s);
        }
    }
    let loc = most_frequent_per_key(votes).first().map(|v| v.1);
    let src = if loc.is_none() {
        LocationSource::None
    } else {
        src
    };
    (loc, None, src, None)
}

/// What the insight is written from, besides the ranks and the host's time.
struct Found<'f> {
    names: &'f [String],
    method: ClockMethod,
    waits: &'f Waits,
    figures: &'f Figures,
    /// An always-on run's shared windows.
    sampled: Option<&'f Sampled>,
}

/// The insight: rank `l` late at the collectives, the others waiting for it.
fn insight(ps: &[Rank], l: usize, found: &Found, host: Host) -> Insight {
    let (lr, w, f) = (&ps[l], found.waits, found.figures);
    let top_name = w
        .op_votes
        .iter()
        .max_by_key(|(ix, w)| (**w, std::cmp::Reverse(**ix)))
        .map_or(0, |(ix, _)| *ix);
    let kernel = found.names[top_name].clone();
    let op = crate::comm::collective_op(&kernel);
    let what = op.unwrap_or_else(|| crate::kernels::short_name(&kernel));
    let waiting: Vec<u32> = (0..ps.len())
        .filter(|&q| q != l)
        .map(|q| ps[q].rank)
        .collect();
    let waiting_txt = waiting
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let at_txt = if host.loc.is_none() {
        String::new()
    } else {
        format!(" @ {}", host.location.short())
    };
    let title = format!(
        "Collective wait × {} · rank {} arrives {} late at {what} · rank{} {waiting_txt} wait{} {} in it{at_txt}",
        w.late_colls.len(),
        lr.rank,
        fmt_duration(host.title_late),
        if waiting.len() == 1 { "" } else { "s" },
        if waiting.len() == 1 { "s" } else { "" },
        fmt_duration(f.impact),
    );
    let detail = format!(
        "{what} kernels on rank{} {waiting_txt} spend {:.0}% of their time ({} of {}) waiting for rank {}, \
         which starts them last in {} of {} collectives and at least {} late in {}: median {} (p90 {}) \
         after the next-latest rank{}.{} \
         ({}.)",
        if waiting.len() == 1 { "" } else { "s" },
        share(w.wait, w.comm) * 100.0,
        fmt_duration(w.wait),
        fmt_duration(w.comm),
        lr.rank,
        w.last_count,
        f.n,
        fmt_duration(MIN_LATE_NS),
        f.sorted.len(),
        fmt_duration(f.median_late),
        fmt_duration(pct(&f.sorted, 90)),
        // Where most of the late time lies, when the median hides it (DDP's later buckets).
        if f.weighted_late.saturating_mul(2) > f.median_late.saturating_mul(3) {
            format!(", {} where most of the late time lies", fmt_duration(f.weighted_late))
        } else {
            String::new()
        },
        host_text(lr, &host),
        clock_text(found),
    );
    let fix = format!(
        "Make rank {} arrive with the others: find the work only it does before the collective \
         (data loading or preprocessing, logging, checkpointing, evaluation on one rank, an uneven \
         shard) and move it off the training loop ({}), spread it over every rank, or do it at the \
         same point on all of them. The other ranks' GPUs idle in {what} meanwhile: their kernels \
         are not slow, and no change to them helps.",
        lr.rank,
        advice(host.program, &OFF_THE_LOOP)
    );
    let sev_window = f.window.max(1);
    Insight::new(RULE, host.location, title, detail, fix)
        .count(w.late_colls.len() as u64)
        .impact(f.impact, sev_window, sev_window)
        .window(f.window)
        .data(Data {
            late_rank: lr.rank,
            late_session: lr.session.clone(),
            waiting_ranks: waiting,
            op: op.map(str::to_string),
            kernel,
            collectives: f.n,
            last_collectives: w.last_count,
            late_collectives: f.sorted.len() as u64,
            median_late_ns: f.median_late,
            weighted_late_ns: f.weighted_late,
            p90_late_ns: pct(&f.sorted, 90),
            lateness_share: f.dominance,
            wait_ns: w.wait,
            comm_ns: w.comm,
            wait_share: share(w.wait, w.comm),
            host_gap_median_ns: host.gap_median,
            gap_before: host.before,
            host_bound: host.host_bound,
            location_source: host.src,
            clock: found.method,
            host: host.join,
            gap_ended_at: host.gap_ended_at,
            extra_kernels: host.extra,
            windows: found.sampled.map(|s| s.summary.clone()),
        })
        .scope(host.scope)
}

/// How the clocks were aligned and the collectives matched, for the detail.
fn clock_text(found: &Found) -> String {
    let clocks = match found.method {
        ClockMethod::SameHost => format!(
            "clocks of one host, aligned within {}",
            fmt_duration(SAME_HOST_ERROR_NS)
        ),
        ClockMethod::CollectiveEnds => {
            "hosts differ: clocks aligned on the collectives' end times (approximate)".to_string()
        }
    };
    match found.sampled {
        None => format!("{clocks}; the same collective on each rank matched by order of its kernel name"),
        Some(s) => format!(
            "{clocks}; always-on: {} collectives matched by end time in {} of the {} windows every rank had open ({} in all)",
            found.figures.n,
            s.summary.with_collectives,
            s.summary.windows,
            fmt_duration(s.summary.observed_ns)
        ),
    }
}

/// What the late rank's host did, for the detail.
fn host_text(lr: &Rank, h: &Host) -> String {
    let mut s = stretch_text(lr, h);
    if let Some(j) = &h.join {
        s += &format!(
            " Over those stretches, {}.",
            j.sentence(&format!("rank {}'s host", lr.rank))
        );
    }
    if let (Some((sh, _)), Some(end)) = (&h.moved, &h.gap_ended_at) {
        if h.host_bound {
            s += &format!(
                " Located at the host line holding {:.0}% of the stretches' time; they ended at the CUDA call at {}.",
                sh * 100.0,
                end.short()
            );
        } else {
            s += &format!(
                " Located at the launch line of its extra GPU work; the late collectives are launched at {}.",
                end.short()
            );
        }
    }
    if !h.extra.is_empty() {
        let parts: Vec<String> = h
            .extra
            .iter()
            .map(|k| {
                let at = k
                    .launch_line
                    .as_ref()
                    .map(|l| format!(" launched @ {}", l.short()))
                    .unwrap_or_default();
                format!(
                    "{} × {} (the others: {}; {} more GPU time, {} per late collective){at}",
                    crate::kernels::short_name(&k.name),
                    k.launches,
                    k.others_launches,
                    fmt_duration(k.extra_ns),
                    fmt_duration(k.per_late_collective_ns)
                )
            })
            .collect();
        s += &format!(
            " GPU work rank {} runs and the others do not, or longer, over the matched collectives: {}.",
            lr.rank,
            parts.join("; ")
        );
    }
    s
}

/// What the stretches without CUDA calls say, for the detail.
fn stretch_text(lr: &Rank, h: &Host) -> String {
    let location = h.gap_ended_at.as_ref().unwrap_or(&h.location);
    match (h.host_bound, h.gap_median) {
        (true, Some(g)) => {
            let between = match (&h.before, h.loc.is_none()) {
                (Some(b), false) => format!(
                    ": between {}{} and the next CUDA call at {}{}",
                    b.short(),
                    quoted(&b.text),
                    location.short(),
                    quoted(&location.text)
                ),
                (None, false) => format!(
                    ": up to the CUDA call at {}{}",
                    location.short(),
                    quoted(&location.text)
                ),
                _ => String::new(),
            };
            let which = if h.explained == h.stretches {
                "each late collective".to_string()
            } else {
                format!(
                    "{} of the {} late collectives (those it makes late)",
                    h.explained, h.stretches
                )
            };
            format!(
                " Rank {}'s host made no CUDA call for {} (median) before {which}{between} \
                 — the time goes to code run between those calls that makes none{}.",
                lr.rank,
                fmt_duration(g),
                location_note(h.src, "that call")
            )
        }
        (false, Some(g)) => format!(
            " Rank {}'s host kept making CUDA calls (longest stretch without one: {} median): the \
             delay is its GPU work before the collective (uneven work or a slower GPU), launched @ the line named{}.",
            lr.rank,
            fmt_duration(g),
            location_note(h.src, "the collective's launch")
        ),
        (_, None) if h.windowed => format!(
            " Rank {}'s host time cannot be placed: always-on sessions record API calls only in \
             full-detail windows (`gpufl trigger`), and fewer than {MIN_LATE_COLLECTIVES} of its late \
             collectives (with the collective before each) lie in one that every rank had open.",
            lr.rank
        ),
        (_, None) => format!(
            " Rank {}'s session has no API records, so its host's time cannot be placed.",
            lr.rank
        ),
    }
}

#[cfg(test)]
#[path = "collective_wait_tests.rs"]
mod tests;
