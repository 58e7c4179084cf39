//! Comparing two sessions (`gpufl diff BASE NEW`), sans-IO.
//!
//! [`profile`] reduces one analysed session to what is compared: its totals, per kernel name
//! (demangled, summed over devices) launches and GPU time, per source line (the user location of
//! the stack, as the insights name it) synchronizations with the host time blocked in them and
//! copies with their GPU time, its insights, and per CUDA graph its replays. [`diff`] compares
//! two profiles:
//!
//! - **Matching:** kernels by name; lines by file, line, function and library frame (the line's
//!   text is left out: an edit elsewhere does not make a line another); insights by rule,
//!   location, sync kind and subject (the kernel of a kernel rule, the API of a copy rule, the
//!   idle class of `gpu-idle`), with an ordinal when one session still has two alike.
//!   CUDA graphs (whose CUPTI ids differ between runs) by their launch line, else by the names
//!   of their top operations; graphs sharing one are paired by operations, device, then rank.
//! - **Status:** `new` (only in NEW), `gone` (only in BASE), `changed` (some figure moved by at
//!   least the threshold, relative to BASE; an insight whose severity changed), else unchanged and
//!   hidden (counted). Relative deltas are against BASE (`None` where BASE is 0).
//! - **Totals:** the sessions' headline figures ([`crate::headline`], the names every view
//!   uses): wall, GPU busy time and share, kernels, syncs, host blocked (in syncs, in blocking
//!   copies), GPU idle; copies and memsets.
//! - **Regressions** (with a regression threshold): wall time, host blocked time (in
//!   synchronizations and blocking copies) or GPU busy time grew by more than the threshold (a sync time that was 0
//!   and is not counts), or a HIGH insight is new. Graphs are not gated (their GPU time is
//!   inside GPU busy time; docs/diff.md). Sessions of different lengths compare in absolute
//!   terms; [`TotalsDiff::per_second`] gives the rates beside them.

use crate::headline::Headline;
use crate::ids::StackIx;
use crate::insight::{Insight, Severity};
use crate::model::Model;
use crate::rules::RuleData;
use crate::totals::Totals;
use crate::userframe::{user_frame, SourceLoc};
use crate::{Analysis, Config};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

#[path = "diff_memory.rs"]
mod memory;
pub use memory::{
    memory_diff, MemDeviceDelta, MemDeviceStat, MemLineDelta, MemLineStat, MemProfile, MemoryDiff,
};

/// What a threshold or a pair of sessions can get wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DiffError {
    /// A threshold that is not a finite percentage ≥ 0.
    #[error("{what} must be a percentage ≥ 0, got {value}")]
    BadThreshold { what: &'static str, value: f64 },
    /// An always-on session counts kernels and GPU time inside its windows only: its figures do
    /// not compare with a default-mode session's.
    #[error("cannot compare an always-on session with a default-mode one: the always-on session's GPU figures cover its windows only")]
    MixedModes,
}

/// Default [`Options::threshold_pct`]: changes under 1 % are hidden.
pub const DEFAULT_THRESHOLD_PCT: f64 = 1.0;

/// How [`diff`] filters and gates.
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Changes smaller than this (relative to BASE, in %) are hidden.
    pub threshold_pct: f64,
    /// Regression threshold (%): with it, [`Diff::regressions`] lists what regressed.
    pub fail_on_regression_pct: Option<f64>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            threshold_pct: DEFAULT_THRESHOLD_PCT,
            fail_on_regression_pct: None,
        }
    }
}

/// One session, reduced to what [`diff`] compares.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Profile {
    pub totals: Totals,
    /// The session's headline figures ([`crate::headline`]); a profile stored without one reads
    /// back as the default, and [`Profile::headline`] gives the totals' figures then.
    #[serde(default)]
    pub headline: Headline,
    /// An always-on session (its GPU figures cover its windows only).
    #[serde(default)]
    pub always_on: bool,
    /// Per kernel name, summed over devices; by name.
    pub kernels: Vec<KernelStat>,
    /// Per source line with synchronizations or copies; by location.
    pub lines: Vec<LineStat>,
    pub insights: Vec<InsightStat>,
    /// Per CUDA graph and device ([`Analysis::graphs`]); absent from JSON without graphs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graphs: Vec<GraphStat>,
    /// Peak memory per device and live bytes at the peak per allocating line (`mem` records);
    /// absent from JSON without them.
    #[serde(default, skip_serializing_if = "MemProfile::is_empty")]
    pub memory: MemProfile,
}

impl Profile {
    /// The headline compared: the session's, or for a profile stored before profiles had one,
    /// the figures its totals give (no blocking copies, no GPU idle).
    pub fn headline(&self) -> Headline {
        if self.headline != Headline::default() {
            return self.headline.clone();
        }
        let t = &self.totals;
        Headline {
            wall_ns: t.wall_ns,
            always_on: self.always_on,
            gpu_busy_ns: t.gpu_busy_ns,
            gpu_busy_pct: t.gpu_busy_pct,
            kernels: t.kernels,
            syncs: t.syncs,
            host_blocked_ns: t.sync_blocked_ns,
            sync_blocked_ns: t.sync_blocked_ns,
            ..Headline::default()
        }
    }
}

/// A CUDA graph's replays on one device, as [`diff`] matches them: by the graph launch's user
/// line, else (no launch line) by the names of its top operations. CUPTI's graph ids differ
/// between runs and are not matched on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GraphStat {
    /// CUPTI's graph id in this session.
    pub graph: u32,
    pub device: u32,
    /// The graph launch's user line; None without one (no call sites, or no user frame).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_location: Option<SourceLoc>,
    /// The names of its top operations ([`crate::GraphSummary::top`]), sorted and deduplicated.
    pub ops: Vec<String>,
    pub replays: u64,
    /// Median time of one replay (first operation's start to last one's end), ns.
    pub replay_median_ns: u64,
    /// Summed time of all replays, ns.
    pub replay_total_ns: u64,
    /// The device's idle time in the gaps between consecutive replays, ns.
    pub gap_idle_ns: u64,
    /// GPU busy inside the replays, ns (ranks graphs that share a launch line).
    pub busy_ns: u64,
}

impl GraphStat {
    fn of(g: &crate::GraphSummary) -> GraphStat {
        let mut ops: Vec<String> = g.top.iter().map(|o| o.name.clone()).collect();
        ops.sort();
        ops.dedup();
        GraphStat {
            graph: g.graph,
            device: g.device,
            launch_location: g
                .launch_location
                .as_ref()
                .filter(|l| !l.is_unattributed())
                .cloned(),
            ops,
            replays: g.replays,
            replay_median_ns: g.replay_median_ns,
            replay_total_ns: g.replay_total_ns,
            gap_idle_ns: g.gap_idle_ns,
            busy_ns: g.busy_ns,
        }
    }
}

/// A kernel name's launches and GPU time.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct KernelStat {
    /// Demangled name.
    pub name: String,
    pub launches: u64,
    /// Summed kernel durations, ns.
    pub total_ns: u64,
}

/// What happened at one source line.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct LineStat {
    /// The user location (`<driver-internal>` for stacks without one; `<no stack>` for
    /// synchronizations and copies recorded without a stack).
    pub location: SourceLoc,
    /// Synchronizations, StreamWaitEvent included.
    pub syncs: u64,
    /// Host time blocked in them, ns (StreamWaitEvent excluded, as in the totals).
    pub sync_blocked_ns: u64,
    /// Memcpys issued there (memsets left out).
    pub copies: u64,
    /// Their GPU time, ns.
    pub copy_ns: u64,
    pub copy_bytes: u64,
}

/// An insight, as [`diff`] matches it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct InsightStat {
    /// `rule @ location [sync kind] [subject] [#n]`: what matches across sessions.
    pub key: String,
    pub rule: String,
    pub severity: Severity,
    pub title: String,
    pub location: SourceLoc,
    pub count: u64,
    pub impact_ns: u64,
}

/// The location of synchronizations and copies recorded without a stack.
fn no_stack() -> SourceLoc {
    let mut l = SourceLoc::driver_internal();
    l.file = "<no stack>".to_string();
    l
}

/// A location without the text of its lines: what lines and insights match by.
fn match_loc(l: &SourceLoc) -> SourceLoc {
    let mut k = l.clone();
    k.text = None;
    if let Some(lib) = &mut k.library {
        lib.text = None;
    }
    k
}

/// `file:line  function`, with the library frame first (`lib.py:3 ← train.py:16  step`).
pub fn describe(l: &SourceLoc) -> String {
    let mut s = String::new();
    if let Some(lib) = &l.library {
        s += &describe(lib);
        s += " ← ";
    }
    s += &l.file;
    if let Some(n) = l.line {
        s += &format!(":{n}");
    }
    if let Some(f) = &l.function {
        s += &format!("  {f}");
    }
    s
}

/// What an insight is about, beyond its rule and location.
fn subject(i: &Insight) -> Option<String> {
    match i.data.as_ref()? {
        RuleData::LowOccupancy(d) => Some(format!("{} GPU {}", d.kernel, d.device)),
        RuleData::RegisterSpill(d) => Some(format!("{} GPU {}", d.kernel, d.device)),
        RuleData::UnderFilledGrid(d) => Some(format!("{} GPU {}", d.kernel, d.device)),
        RuleData::BlockingCopy(d) => Some(d.api.clone()),
        RuleData::PageableAsyncCopy(d) => Some(d.api.clone()),
        RuleData::DefaultStreamBarrier(d) => Some(d.api.clone()),
        RuleData::GpuIdle(d) => Some(format!("{:?}", d.class).to_lowercase()),
        _ => None,
    }
}

/// Reduce an analysed session to a [`Profile`]. `cfg` must be the one `a` was analysed with (it
/// picks the user frame of each stack).
pub fn profile(m: &Model, a: &Analysis, cfg: &Config) -> Profile {
    let mut kernels: BTreeMap<&str, KernelStat> = BTreeMap::new();
    for r in &a.kernels.rows {
        let k = kernels.entry(&r.name).or_insert_with(|| KernelStat {
            name: r.name.clone(),
            launches: 0,
            total_ns: 0,
        });
        k.launches += r.launches;
        k.total_ns = k.total_ns.saturating_add(r.total_ns);
    }
    // User location per stack, computed once per distinct stack.
    let mut by_stack: HashMap<StackIx, SourceLoc> = HashMap::new();
    let mut loc_of = |stack: Option<StackIx>| -> SourceLoc {
        match stack {
            None => no_stack(),
            Some(s) => by_stack
                .entry(s)
                .or_insert_with(|| user_frame(m, s, &cfg.filter))
                .clone(),
        }
    };
    let mut lines: BTreeMap<SourceLoc, LineStat> = BTreeMap::new();
    fn line(lines: &mut BTreeMap<SourceLoc, LineStat>, loc: SourceLoc) -> &mut LineStat {
        lines.entry(match_loc(&loc)).or_insert_with(|| LineStat {
            location: loc,
            syncs: 0,
            sync_blocked_ns: 0,
            copies: 0,
            copy_ns: 0,
            copy_bytes: 0,
        })
    }
    for s in m.syncs() {
        let l = line(&mut lines, loc_of(s.stack));
        l.syncs += 1;
        if s.kind.blocks_host() {
            l.sync_blocked_ns = l.sync_blocked_ns.saturating_add(s.duration_ns());
        }
    }
    for c in m.copies() {
        if matches!(c.op, crate::views::CopyOp::Memset { .. }) {
            continue;
        }
        let stack = c.corr.known().and_then(|c| m.callsite(c)).map(|(s, _)| s);
        let l = line(&mut lines, loc_of(stack));
        l.copies += 1;
        l.copy_ns = l.copy_ns.saturating_add(c.end.saturating_sub(c.start));
        l.copy_bytes = l.copy_bytes.saturating_add(c.bytes);
    }
    let mut seen: HashMap<String, u32> = HashMap::new();
    let insights = a
        .insights
        .iter()
        .map(|i| {
            let mut key = format!("{} @ {}", i.rule, describe(&match_loc(&i.location)));
            if let Some(k) = i.sync_kind {
                key += &format!(" [{}]", k.display_name());
            }
            if let Some(s) = subject(i) {
                key += &format!(" [{s}]");
            }
            let n = seen.entry(key.clone()).or_default();
            *n += 1;
            if *n > 1 {
                key += &format!(" #{n}");
            }
            InsightStat {
                key,
                rule: i.rule.to_string(),
                severity: i.severity,
                title: i.title.clone(),
                location: i.location.clone(),
                count: i.count,
                impact_ns: i.impact_ns,
            }
        })
        .collect();
    Profile {
        totals: a.totals.clone(),
        headline: a.headline.clone(),
        always_on: a.sampling.is_some(),
        kernels: kernels.into_values().collect(),
        lines: lines.into_values().collect(),
        insights,
        graphs: a.graphs.iter().map(GraphStat::of).collect(),
        memory: MemProfile::of(&crate::memview::memory_view(m, cfg)),
    }
}

/// An integer figure in both sessions.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Delta {
    pub base: u64,
    pub new: u64,
    /// `new - base`.
    pub delta: i64,
    /// `delta / base × 100`; None where `base` is 0.
    pub pct: Option<f64>,
}

impl Delta {
    pub fn of(base: u64, new: u64) -> Delta {
        let delta = (new as i128 - base as i128).clamp(i64::MIN as i128, i64::MAX as i128) as i64;
        let pct = (base > 0).then(|| delta as f64 * 100.0 / base as f64);
        Delta {
            base,
            new,
            delta,
            pct,
        }
    }

    /// Whether the change is at least `threshold_pct` of BASE (any change from 0 is).
    pub fn moved(&self, threshold_pct: f64) -> bool {
        self.delta != 0 && self.pct.is_none_or(|p| p.abs() >= threshold_pct)
    }

    /// Whether it grew by more than `pct` of BASE (any growth from 0 does).
    pub fn grew_beyond(&self, pct: f64) -> bool {
        self.delta > 0 && self.pct.is_none_or(|p| p > pct)
    }
}

/// A real-valued figure in both sessions (a share, a rate).
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct FDelta {
    pub base: f64,
    pub new: f64,
    pub delta: f64,
    /// `delta / base × 100`; None where `base` is 0.
    pub pct: Option<f64>,
}

impl FDelta {
    pub fn of(base: f64, new: f64) -> FDelta {
        FDelta {
            base,
            new,
            delta: new - base,
            pct: (base != 0.0).then(|| (new - base) * 100.0 / base),
        }
    }
}

/// The sessions' totals side by side.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct TotalsDiff {
    pub wall_ns: Delta,
    pub gpu_busy_ns: Delta,
    /// GPU busy share of the wall time, % (its delta in percentage points).
    pub gpu_busy_pct: FDelta,
    pub kernels: Delta,
    pub copies: Delta,
    pub memsets: Delta,
    pub syncs: Delta,
    /// Host time blocked in synchronizations ([`Headline::sync_blocked_ns`]).
    pub sync_blocked_ns: Delta,
    /// Host time blocked in blocking copies and memsets ([`Headline::copy_blocked_ns`]).
    pub copy_blocked_ns: Delta,
    /// Host time blocked in both ([`Headline::host_blocked_ns`]): what the gate reads.
    pub host_blocked_ns: Delta,
    /// GPU idle time summed over devices ([`Headline::gpu_idle_ns`]).
    pub gpu_idle_ns: Delta,
    /// The same figures per second of wall time, for sessions of different lengths.
    pub per_second: Rates,
}

/// Figures per second of wall time.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Rates {
    pub kernels: FDelta,
    pub copies: FDelta,
    pub syncs: FDelta,
    /// Host time blocked in synchronizations per second of wall, ns/s (×1e-7 = % of the time).
    pub sync_blocked_ns: FDelta,
    pub gpu_busy_ns: FDelta,
}

/// Whether something is in one session only, or in both and moved.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    New,
    Gone,
    Changed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::New => "new",
            Status::Gone => "gone",
            Status::Changed => "changed",
        }
    }
}

/// A kernel name whose launches or GPU time changed.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct KernelDelta {
    pub name: String,
    pub status: Status,
    pub launches: Delta,
    pub total_ns: Delta,
}

/// A source line whose synchronizations or copies changed.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LineDelta {
    /// NEW's location where it has the line, else BASE's.
    pub location: SourceLoc,
    pub status: Status,
    pub syncs: Delta,
    pub sync_blocked_ns: Delta,
    pub copies: Delta,
    pub copy_ns: Delta,
}

/// An insight in one session, as [`InsightDelta`] shows it.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct InsightSide {
    pub severity: Severity,
    pub title: String,
    pub count: u64,
    pub impact_ns: u64,
}

/// An insight that appeared, went away, or changed.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct InsightDelta {
    pub key: String,
    pub rule: String,
    pub status: Status,
    pub location: SourceLoc,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<InsightSide>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<InsightSide>,
    pub count: Delta,
    pub impact_ns: Delta,
}

impl InsightDelta {
    /// NEW's side, else BASE's.
    pub fn side(&self) -> &InsightSide {
        self.new
            .as_ref()
            .or(self.base.as_ref())
            .expect("an insight delta has a side")
    }
}

/// How two graphs were matched.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum GraphMatch {
    /// By the graph launch's user line (file, line, function, library frame).
    Line,
    /// No launch line: by the names of the graph's top operations.
    Ops,
}

/// A CUDA graph in one session, as [`GraphDelta`] shows it.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct GraphSide {
    /// CUPTI's graph id in that session.
    pub graph: u32,
    pub device: u32,
}

/// A CUDA graph that appeared, went away, or whose replays changed.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct GraphDelta {
    pub status: Status,
    pub matched_by: GraphMatch,
    /// The launch line (NEW's where it has the graph, else BASE's); absent for `ops`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch_location: Option<SourceLoc>,
    /// The names of its top operations (NEW's, else BASE's), sorted.
    pub ops: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<GraphSide>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new: Option<GraphSide>,
    pub replays: Delta,
    /// Median time of one replay, ns.
    pub replay_median_ns: Delta,
    /// Summed time of all replays, ns.
    pub replay_total_ns: Delta,
    /// The device's idle time between consecutive replays, ns.
    pub gap_idle_ns: Delta,
}

/// What regressed beyond the regression threshold.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Regression {
    /// `wall`, `host_blocked`, `gpu_busy` or `new_high_insight`.
    pub metric: &'static str,
    /// The figure (ns) in both sessions; for an insight, its impact.
    pub change: Delta,
    /// The insight's key (`new_high_insight` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insight: Option<String>,
    /// One line for people.
    pub detail: String,
}

/// Two sessions compared ([`diff`]).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Diff {
    pub threshold_pct: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fail_on_regression_pct: Option<f64>,
    pub totals: TotalsDiff,
    /// Most GPU time moved first.
    pub kernels: Vec<KernelDelta>,
    /// Kernel names in both sessions whose change is under the threshold.
    pub kernels_hidden: u64,
    /// Most sync plus copy time moved first.
    pub lines: Vec<LineDelta>,
    pub lines_hidden: u64,
    /// Most impact moved first.
    pub insights: Vec<InsightDelta>,
    pub insights_hidden: u64,
    /// CUDA graphs, most replay time moved first; absent from JSON when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub graphs: Vec<GraphDelta>,
    /// Graphs in both sessions whose change is under the threshold; absent from JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub graphs_hidden: u64,
    /// Peak memory per device and per-line live bytes at the peak; absent from JSON when
    /// neither session has `mem` records.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryDiff>,
    /// Empty without a regression threshold.
    pub regressions: Vec<Regression>,
}

impl Diff {
    /// Whether anything regressed beyond the regression threshold.
    pub fn regressed(&self) -> bool {
        !self.regressions.is_empty()
    }

    /// Whether nothing at all is shown (totals within the threshold, no kernel, line, insight
    /// or graph).
    pub fn is_unchanged(&self) -> bool {
        self.kernels.is_empty()
            && self.lines.is_empty()
            && self.insights.is_empty()
            && self.graphs.is_empty()
            && self
                .memory
                .as_ref()
                .is_none_or(|m| m.is_unchanged(self.threshold_pct))
            && !self.totals_moved(self.threshold_pct)
    }

    fn totals_moved(&self, th: f64) -> bool {
        let t = &self.totals;
        [
            t.wall_ns,
            t.gpu_busy_ns,
            t.kernels,
            t.copies,
            t.memsets,
            t.syncs,
            t.sync_blocked_ns,
            t.copy_blocked_ns,
            t.gpu_idle_ns,
        ]
        .iter()
        .any(|d| d.moved(th))
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What graphs are first grouped by: the launch line, else the top operations' names.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
enum GraphGroup {
    Line(SourceLoc),
    Ops(Vec<String>),
}

fn graph_group(g: &GraphStat) -> GraphGroup {
    match &g.launch_location {
        Some(l) => GraphGroup::Line(match_loc(l)),
        None => GraphGroup::Ops(g.ops.clone()),
    }
}

/// What one pass of [`pair_graphs`] pairs graphs by: (device, top operations), None = any.
type PairKey = fn(&GraphStat) -> (Option<u32>, Option<&[String]>);

/// Pairs of graphs of BASE and NEW, unmatched ones with one side: graphs match within a group
/// (one launch line, or one set of top operations without a line); inside a group, first those
/// with the same top operations on the same device, then the same top operations, then the same
/// device, then any, each pass in order of GPU time inside the replays (most first). Every pass
/// is a lookup by key: no quadratic work on a group of many graphs.
fn pair_graphs<'a>(
    base: &'a [GraphStat],
    new: &'a [GraphStat],
) -> Vec<(GraphGroup, Option<&'a GraphStat>, Option<&'a GraphStat>)> {
    type Side<'a> = Vec<&'a GraphStat>;
    let mut groups: BTreeMap<GraphGroup, (Side<'a>, Side<'a>)> = BTreeMap::new();
    for g in base {
        groups.entry(graph_group(g)).or_default().0.push(g);
    }
    for g in new {
        groups.entry(graph_group(g)).or_default().1.push(g);
    }
    let rank = |a: &&GraphStat, b: &&GraphStat| {
        b.busy_ns
            .cmp(&a.busy_ns)
            .then_with(|| b.replay_total_ns.cmp(&a.replay_total_ns))
            .then_with(|| a.graph.cmp(&b.graph))
            .then_with(|| a.device.cmp(&b.device))
    };
    let mut out = Vec::new();
    for (key, (mut bs, mut ns)) in groups {
        bs.sort_by(rank);
        ns.sort_by(rank);
        let mut b_used = vec![false; bs.len()];
        let mut n_used = vec![false; ns.len()];
        let passes: [PairKey; 4] = [
            |g| (Some(g.device), Some(g.ops.as_slice())),
            |g| (None, Some(g.ops.as_slice())),
            |g| (Some(g.device), None),
            |_| (None, None),
        ];
        for pass in passes {
            let mut free: BTreeMap<_, std::collections::VecDeque<usize>> = BTreeMap::new();
            for (j, n) in ns.iter().enumerate() {
                if !n_used[j] {
                    free.entry(pass(n)).or_default().push_back(j);
                }
            }
            if free.is_empty() {
                break;
            }
            for (i, b) in bs.iter().enumerate() {
                if b_used[i] {
                    continue;
                }
                if let Some(j) = free.get_mut(&pass(b)).and_then(|q| q.pop_front()) {
                    b_used[i] = true;
                    n_used[j] = true;
                    out.push((key.clone(), Some(*b), Some(ns[j])));
                }
            }
        }
        for (i, b) in bs.iter().enumerate() {
            if !b_used[i] {
                out.push((key.clone(), Some(*b), None));
            }
        }
        for (j, n) in ns.iter().enumerate() {
            if !n_used[j] {
                out.push((key.clone(), None, Some(*n)));
            }
        }
    }
    out
}

fn check(what: &'static str, value: f64) -> Result<(), DiffError> {
    if value.is_finite() && value >= 0.0 {
        Ok(())
    } else {
        Err(DiffError::BadThreshold { what, value })
    }
}

fn rate(count: u64, wall_ns: u64) -> f64 {
    if wall_ns == 0 {
        0.0
    } else {
        count as f64 * 1e9 / wall_ns as f64
    }
}

/// The headline figures (and the totals' copies and memsets) side by side.
fn totals_diff(b: &Headline, n: &Headline, bt: &Totals, nt: &Totals) -> TotalsDiff {
    let r = |f: fn(&Totals) -> u64| FDelta::of(rate(f(bt), bt.wall_ns), rate(f(nt), nt.wall_ns));
    TotalsDiff {
        wall_ns: Delta::of(b.wall_ns, n.wall_ns),
        gpu_busy_ns: Delta::of(b.gpu_busy_ns, n.gpu_busy_ns),
        gpu_busy_pct: FDelta::of(b.gpu_busy_pct, n.gpu_busy_pct),
        kernels: Delta::of(b.kernels, n.kernels),
        copies: Delta::of(bt.copies, nt.copies),
        memsets: Delta::of(bt.memsets, nt.memsets),
        syncs: Delta::of(b.syncs, n.syncs),
        sync_blocked_ns: Delta::of(b.sync_blocked_ns, n.sync_blocked_ns),
        copy_blocked_ns: Delta::of(b.copy_blocked_ns, n.copy_blocked_ns),
        host_blocked_ns: Delta::of(b.host_blocked_ns, n.host_blocked_ns),
        gpu_idle_ns: Delta::of(b.gpu_idle_ns, n.gpu_idle_ns),
        per_second: Rates {
            kernels: r(|t| t.kernels),
            copies: r(|t| t.copies),
            syncs: r(|t| t.syncs),
            sync_blocked_ns: r(|t| t.sync_blocked_ns),
            gpu_busy_ns: r(|t| t.gpu_busy_ns),
        },
    }
}

/// Both sides of a keyed collection: `(key, base, new)` in key order.
fn pair<'a, T, K: Ord>(
    base: &'a [T],
    new: &'a [T],
    key: impl Fn(&'a T) -> K,
) -> Vec<(Option<&'a T>, Option<&'a T>)> {
    let mut m: BTreeMap<K, (Option<&T>, Option<&T>)> = BTreeMap::new();
    for b in base {
        m.entry(key(b)).or_default().0 = Some(b);
    }
    for n in new {
        m.entry(key(n)).or_default().1 = Some(n);
    }
    m.into_values().collect()
}

fn status(b: bool, n: bool, moved: bool) -> Option<Status> {
    match (b, n) {
        (false, true) => Some(Status::New),
        (true, false) => Some(Status::Gone),
        _ => moved.then_some(Status::Changed),
    }
}

/// Compare two profiles: BASE (`base`) against NEW (`new`).
pub fn diff(base: &Profile, new: &Profile, opts: &Options) -> Result<Diff, DiffError> {
    let th = opts.threshold_pct;
    check("the threshold", th)?;
    if let Some(f) = opts.fail_on_regression_pct {
        check("the regression threshold", f)?;
    }
    if base.always_on != new.always_on {
        return Err(DiffError::MixedModes);
    }
    let totals = totals_diff(&base.headline(), &new.headline(), &base.totals, &new.totals);
    let (kernels, kernels_hidden) = kernel_deltas(base, new, th);
    let (lines, lines_hidden) = line_deltas(base, new, th);
    let (insights, insights_hidden) = insight_deltas(base, new, th);
    let (graphs, graphs_hidden) = graph_deltas(base, new, th);
    // Graphs are not gated (docs/diff.md): their GPU time is inside GPU busy and their host
    // effect inside wall time, as for kernels and lines, and matching them is heuristic.
    let regressions = match opts.fail_on_regression_pct {
        Some(f) => regressions(&totals, &insights, f),
        None => Vec::new(),
    };
    Ok(Diff {
        threshold_pct: th,
        fail_on_regression_pct: opts.fail_on_regression_pct,
        totals,
        kernels,
        kernels_hidden,
        lines,
        lines_hidden,
        insights,
        insights_hidden,
        graphs,
        graphs_hidden,
        memory: memory_diff(&base.memory, &new.memory, th),
        regressions,
    })
}

/// Kernels that appeared, went or moved by more than `th` % (launches or GPU time), the most
/// GPU time moved first; and how many did not.
fn kernel_deltas(base: &Profile, new: &Profile, th: f64) -> (Vec<KernelDelta>, u64) {
    let mut kernels = Vec::new();
    let mut kernels_hidden = 0;
    for (b, n) in pair(&base.kernels, &new.kernels, |k| k.name.as_str()) {
        let get = |k: Option<&KernelStat>| k.map_or((0, 0), |k| (k.launches, k.total_ns));
        let ((bl, bt), (nl, nt)) = (get(b), get(n));
        let (launches, total_ns) = (Delta::of(bl, nl), Delta::of(bt, nt));
        let moved = launches.moved(th) || total_ns.moved(th);
        match status(b.is_some(), n.is_some(), moved) {
            Some(status) => kernels.push(KernelDelta {
                name: n.or(b).map(|k| k.name.clone()).unwrap_or_default(),
                status,
                launches,
                total_ns,
            }),
            None => kernels_hidden += 1,
        }
    }
    kernels.sort_by(|a, b| {
        b.total_ns
            .delta
            .unsigned_abs()
            .cmp(&a.total_ns.delta.unsigned_abs())
            .then_with(|| a.name.cmp(&b.name))
    });
    (kernels, kernels_hidden)
}

/// Source lines whose syncs or copies appeared, went or moved, the most time moved first; and
/// how many did not.
fn line_deltas(base: &Profile, new: &Profile, th: f64) -> (Vec<LineDelta>, u64) {
    let mut lines = Vec::new();
    let mut lines_hidden = 0;
    for (b, n) in pair(&base.lines, &new.lines, |l| match_loc(&l.location)) {
        let d = |f: fn(&LineStat) -> u64| Delta::of(b.map_or(0, f), n.map_or(0, f));
        let (syncs, sync_blocked_ns) = (d(|l| l.syncs), d(|l| l.sync_blocked_ns));
        let (copies, copy_ns) = (d(|l| l.copies), d(|l| l.copy_ns));
        let moved = [syncs, sync_blocked_ns, copies, copy_ns]
            .iter()
            .any(|x| x.moved(th));
        match status(b.is_some(), n.is_some(), moved) {
            Some(status) => lines.push(LineDelta {
                location: n.or(b).map(|l| l.location.clone()).expect("a side"),
                status,
                syncs,
                sync_blocked_ns,
                copies,
                copy_ns,
            }),
            None => lines_hidden += 1,
        }
    }
    let moved_ns =
        |l: &LineDelta| l.sync_blocked_ns.delta.unsigned_abs() + l.copy_ns.delta.unsigned_abs();
    lines.sort_by(|a, b| {
        moved_ns(b)
            .cmp(&moved_ns(a))
            .then_with(|| a.location.cmp(&b.location))
    });
    (lines, lines_hidden)
}

/// Insights (by key) that appeared, went, changed severity or moved, the most impact moved
/// first; and how many did not.
fn insight_deltas(base: &Profile, new: &Profile, th: f64) -> (Vec<InsightDelta>, u64) {
    let mut insights = Vec::new();
    let mut insights_hidden = 0;
    for (b, n) in pair(&base.insights, &new.insights, |i| i.key.as_str()) {
        let side = |i: &InsightStat| InsightSide {
            severity: i.severity,
            title: i.title.clone(),
            count: i.count,
            impact_ns: i.impact_ns,
        };
        let count = Delta::of(b.map_or(0, |i| i.count), n.map_or(0, |i| i.count));
        let impact_ns = Delta::of(b.map_or(0, |i| i.impact_ns), n.map_or(0, |i| i.impact_ns));
        let severity_moved = matches!((b, n), (Some(b), Some(n)) if b.severity != n.severity);
        let moved = severity_moved || count.moved(th) || impact_ns.moved(th);
        let Some(either) = n.or(b) else { continue };
        match status(b.is_some(), n.is_some(), moved) {
            Some(status) => insights.push(InsightDelta {
                key: either.key.clone(),
                rule: either.rule.clone(),
                status,
                location: either.location.clone(),
                base: b.map(side),
                new: n.map(side),
                count,
                impact_ns,
            }),
            None => insights_hidden += 1,
        }
    }
    insights.sort_by(|a, b| {
        b.impact_ns
            .delta
            .unsigned_abs()
            .cmp(&a.impact_ns.delta.unsigned_abs())
            .then_with(|| a.key.cmp(&b.key))
    });
    (insights, insights_hidden)
}

/// CUDA graphs (matched by launch line, else by operations) that appeared, went or moved, the
/// most time moved first; and how many did not.
fn graph_deltas(base: &Profile, new: &Profile, th: f64) -> (Vec<GraphDelta>, u64) {
    let mut graphs = Vec::new();
    let mut graphs_hidden = 0;
    for (key, b, n) in pair_graphs(&base.graphs, &new.graphs) {
        let d = |f: fn(&GraphStat) -> u64| Delta::of(b.map_or(0, f), n.map_or(0, f));
        let replays = d(|g| g.replays);
        let replay_median_ns = d(|g| g.replay_median_ns);
        let replay_total_ns = d(|g| g.replay_total_ns);
        let gap_idle_ns = d(|g| g.gap_idle_ns);
        let moved = [replays, replay_median_ns, replay_total_ns, gap_idle_ns]
            .iter()
            .any(|x| x.moved(th));
        let Some(either) = n.or(b) else { continue };
        let side = |g: &GraphStat| GraphSide {
            graph: g.graph,
            device: g.device,
        };
        match status(b.is_some(), n.is_some(), moved) {
            Some(status) => graphs.push(GraphDelta {
                status,
                matched_by: match key {
                    GraphGroup::Line(_) => GraphMatch::Line,
                    GraphGroup::Ops(_) => GraphMatch::Ops,
                },
                launch_location: either.launch_location.clone(),
                ops: either.ops.clone(),
                base: b.map(side),
                new: n.map(side),
                replays,
                replay_median_ns,
                replay_total_ns,
                gap_idle_ns,
            }),
            None => graphs_hidden += 1,
        }
    }
    let moved_ns = |g: &GraphDelta| {
        (g.replay_total_ns.delta.unsigned_abs()).saturating_add(g.gap_idle_ns.delta.unsigned_abs())
    };
    graphs.sort_by(|a, b| {
        moved_ns(b)
            .cmp(&moved_ns(a))
            .then_with(|| a.launch_location.cmp(&b.launch_location))
            .then_with(|| a.ops.cmp(&b.ops))
            .then_with(|| a.status.cmp(&b.status))
    });
    (graphs, graphs_hidden)
}

/// What fails `--fail-on-regression f`: a total grown by more than `f` %, a new HIGH insight.
fn regressions(totals: &TotalsDiff, insights: &[InsightDelta], f: f64) -> Vec<Regression> {
    let mut regressions = Vec::new();
    let t = totals;
    for (metric, what, d) in [
        ("wall", "wall", t.wall_ns),
        (
            "host_blocked",
            "host blocked (in syncs and blocking copies)",
            t.host_blocked_ns,
        ),
        ("gpu_busy", "GPU busy time", t.gpu_busy_ns),
    ] {
        if d.grew_beyond(f) {
            regressions.push(Regression {
                metric,
                change: d,
                insight: None,
                detail: format!(
                    "{what} {} → {} ({})",
                    crate::fmt_duration(d.base),
                    crate::fmt_duration(d.new),
                    pct_text(d.pct)
                ),
            });
        }
    }
    for i in insights {
        let high = i.new.as_ref().is_some_and(|s| s.severity == Severity::High);
        if i.status == Status::New && high {
            regressions.push(Regression {
                metric: "new_high_insight",
                change: i.impact_ns,
                insight: Some(i.key.clone()),
                detail: format!("new HIGH insight [{}]: {}", i.rule, i.side().title),
            });
        }
    }
    regressions
}

/// `+12.3 %`, `-4.0 %`, `×15.1` (from +1000 %), or `from 0` for a change from 0.
pub fn pct_text(p: Option<f64>) -> String {
    match p {
        Some(p) if p >= 1000.0 => format!("×{:.1}", 1.0 + p / 100.0),
        Some(p) => format!("{p:+.1} %"),
        None => "from 0".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::userframe::FrameOrigin;

    fn totals(wall: u64, busy: u64, syncs: u64, blocked: u64) -> Totals {
        Totals {
            wall_ns: wall,
            gpu_busy_ns: busy,
            gpu_busy_pct: busy as f64 * 100.0 / wall as f64,
            kernels: 10,
            copies: 0,
            memsets: 0,
            syncs,
            sync_blocked_ns: blocked,
            syncs_with_stack: syncs,
        }
    }

    fn loc(file: &str, line: u32, text: &str) -> SourceLoc {
        SourceLoc {
            file: file.to_string(),
            line: Some(line),
            function: Some("step".to_string()),
            origin: FrameOrigin::Python,
            text: Some(text.to_string()),
            library: None,
        }
    }

    fn ins(rule: &str, sev: Severity, l: SourceLoc, impact: u64) -> InsightStat {
        InsightStat {
            key: format!("{rule} @ {}", describe(&match_loc(&l))),
            rule: rule.to_string(),
            severity: sev,
            title: format!("{rule} title"),
            location: l,
            count: 5,
            impact_ns: impact,
        }
    }

    fn line(l: SourceLoc, syncs: u64, blocked: u64) -> LineStat {
        LineStat {
            location: l,
            syncs,
            sync_blocked_ns: blocked,
            copies: 0,
            copy_ns: 0,
            copy_bytes: 0,
        }
    }

    fn base() -> Profile {
        Profile {
            totals: totals(1_000_000_000, 100_000_000, 10, 50_000_000),
            headline: Headline::default(),
            always_on: false,
            kernels: vec![
                KernelStat {
                    name: "a".into(),
                    launches: 10,
                    total_ns: 60_000_000,
                },
                KernelStat {
                    name: "b".into(),
                    launches: 10,
                    total_ns: 40_000_000,
                },
            ],
            lines: vec![line(loc("t.py", 5, "sync()"), 10, 50_000_000)],
            insights: vec![ins(
                "sync-attribution",
                Severity::Low,
                loc("t.py", 5, "sync()"),
                50_000_000,
            )],
            graphs: Vec::new(),
            memory: MemProfile::default(),
        }
    }

    #[test]
    fn a_stored_profile_reads_back_as_it_was() {
        // The server stores profiles as JSON and compares them later (its Compare page).
        let mut p = base();
        p.lines[0].location.library = Some(Box::new(loc("lib.py", 3, "x.item()")));
        p.graphs.push(GraphStat {
            graph: 7,
            device: 0,
            launch_location: None,
            ops: vec!["k".into()],
            replays: 3,
            replay_median_ns: 10,
            replay_total_ns: 30,
            gap_idle_ns: 5,
            busy_ns: 30,
        });
        let back: Profile = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
        // Without graphs (left out of the JSON) and without `always_on`.
        let mut v = serde_json::to_value(base()).unwrap();
        v.as_object_mut().unwrap().remove("always_on");
        let back: Profile = serde_json::from_value(v).unwrap();
        assert_eq!(back, base());
    }

    #[test]
    fn a_profile_against_itself_has_no_changes_and_no_regressions() {
        let p = base();
        let opts = Options {
            threshold_pct: 0.0,
            fail_on_regression_pct: Some(0.0),
        };
        let d = diff(&p, &p, &opts).unwrap();
        assert!(d.is_unchanged(), "{d:#?}");
        assert!(!d.regressed());
        assert_eq!(d.kernels_hidden, 2);
        assert_eq!(d.lines_hidden, 1);
        assert_eq!(d.insights_hidden, 1);
        assert_eq!(d.totals.wall_ns.pct, Some(0.0));
    }

    #[test]
    fn new_gone_and_changed_with_a_threshold() {
        let b = base();
        let mut n = base();
        n.totals = totals(1_100_000_000, 100_500_000, 20, 90_000_000);
        n.kernels[0].total_ns = 60_300_000; // +0.5 %: hidden at 1 %
        n.kernels[1].name = "c".into(); // b gone, c new
                                        // The same line, its text edited: still the same line.
        n.lines = vec![
            line(loc("t.py", 5, "sync() # edited"), 10, 50_000_000),
            line(loc("t.py", 9, "x.item()"), 10, 40_000_000),
        ];
        n.insights.push(ins(
            "blocking-copy",
            Severity::High,
            loc("t.py", 9, "x.item()"),
            40_000_000,
        ));
        n.insights[0].severity = Severity::Medium;
        let d = diff(
            &b,
            &n,
            &Options {
                threshold_pct: 1.0,
                fail_on_regression_pct: Some(5.0),
            },
        )
        .unwrap();
        let k: Vec<(&str, Status)> = d
            .kernels
            .iter()
            .map(|k| (k.name.as_str(), k.status))
            .collect();
        assert_eq!(k, [("b", Status::Gone), ("c", Status::New)]);
        assert_eq!(d.kernels_hidden, 1);
        assert_eq!(d.lines.len(), 1, "{:#?}", d.lines);
        assert_eq!(d.lines[0].location.line, Some(9));
        assert_eq!(d.lines[0].status, Status::New);
        assert_eq!(d.lines[0].sync_blocked_ns.delta, 40_000_000);
        assert_eq!(d.lines[0].sync_blocked_ns.pct, None);
        assert_eq!(d.lines_hidden, 1);
        let i: Vec<(&str, Status)> = d
            .insights
            .iter()
            .map(|i| (i.rule.as_str(), i.status))
            .collect();
        assert_eq!(
            i,
            [
                ("blocking-copy", Status::New),
                ("sync-attribution", Status::Changed)
            ]
        );
        assert_eq!(d.totals.wall_ns.pct, Some(10.0));
        assert_eq!(d.totals.sync_blocked_ns.delta, 40_000_000);
        let r: Vec<&str> = d.regressions.iter().map(|r| r.metric).collect();
        // GPU busy grew 0.5 %: under 5 %.
        assert_eq!(r, ["wall", "host_blocked", "new_high_insight"]);
        assert!(!d.is_unchanged());
        // The other way round nothing grew and no HIGH insight is new.
        let back = diff(
            &n,
            &b,
            &Options {
                threshold_pct: 1.0,
                fail_on_regression_pct: Some(5.0),
            },
        )
        .unwrap();
        assert!(!back.regressed(), "{:#?}", back.regressions);
        assert_eq!(back.insights[0].status, Status::Gone);
    }

    #[test]
    fn regression_threshold_is_strict_and_growth_from_zero_counts() {
        let b = base();
        let mut n = base();
        n.totals.wall_ns = 1_050_000_000; // exactly +5 %
        let opts = Options {
            threshold_pct: 1.0,
            fail_on_regression_pct: Some(5.0),
        };
        assert!(!diff(&b, &n, &opts).unwrap().regressed());
        n.totals.wall_ns = 1_050_000_001;
        assert!(diff(&b, &n, &opts).unwrap().regressed());
        let mut b0 = base();
        b0.totals.sync_blocked_ns = 0;
        let d = diff(&b0, &b, &opts).unwrap();
        assert_eq!(d.regressions[0].metric, "host_blocked");
        assert_eq!(d.regressions[0].change.pct, None);
    }

    #[test]
    fn bad_thresholds_and_mixed_modes_are_errors() {
        let p = base();
        let bad = Options {
            threshold_pct: f64::NAN,
            fail_on_regression_pct: None,
        };
        assert!(matches!(
            diff(&p, &p, &bad),
            Err(DiffError::BadThreshold { .. })
        ));
        let bad = Options {
            threshold_pct: 1.0,
            fail_on_regression_pct: Some(-1.0),
        };
        assert!(matches!(
            diff(&p, &p, &bad),
            Err(DiffError::BadThreshold { .. })
        ));
        let mut aon = base();
        aon.always_on = true;
        assert_eq!(
            diff(&p, &aon, &Options::default()),
            Err(DiffError::MixedModes)
        );
    }

    /// Synthetic sessions with CUDA graph replays, analysed and reduced to profiles (as the CLI
    /// does): each graph's replays are launched by `cudaGraphLaunch` (an `api` record) with a
    /// `callsite` at `graph.cu:LINE` in `replay_loop`, or without a call site (no launch line).
    mod graphs {
        use super::super::*;
        use gpufl_trace::*;

        /// One graph of a synthetic session.
        pub struct G {
            /// CUPTI's graph id.
            pub id: u32,
            /// The launch line; None: no call site.
            pub line: Option<u32>,
            /// Its kernels, one node each, run back to back.
            pub kernels: &'static [&'static str],
            pub replays: u64,
            /// Each node's kernel, ns.
            pub node_ns: u64,
        }

        pub fn g(id: u32, line: Option<u32>, kernels: &'static [&'static str]) -> G {
            G {
                id,
                line,
                kernels,
                replays: 10,
                node_ns: 20_000,
            }
        }

        struct B {
            recs: Vec<Record>,
            strs: Vec<String>,
            frames: u32,
            stacks: u32,
            corr: u32,
        }

        impl B {
            fn s(&mut self, s: &str) -> StrId {
                if let Some(i) = self.strs.iter().position(|x| x == s) {
                    return StrId(i as u32);
                }
                self.strs.push(s.to_string());
                let id = StrId(self.strs.len() as u32 - 1);
                self.recs.push(Record::Str(StrRecord { id, s: s.into() }));
                id
            }

            fn user_stack(&mut self, line: u32) -> StackId {
                let module = self.s("/opt/app/bin/app");
                let func = self.s("replay_loop");
                let file = self.s("/src/graph.cu");
                let f = FrameId(self.frames);
                self.frames += 1;
                self.recs.push(Record::Frame(Frame {
                    id: f,
                    kind: FrameKind::Native,
                    module: Some(module),
                    offset: Some(0x1000 + line as u64),
                    func: Some(func),
                    file: Some(file),
                    line: Some(line),
                    inlined: false,
                    text: None,
                }));
                let id = StackId(self.stacks);
                self.stacks += 1;
                self.recs.push(Record::Stack(Stack {
                    id,
                    frames: vec![f],
                    via_tid: None,
                }));
                id
            }
        }

        /// The graphs replayed one after another (all of one graph, then the next), 30 µs of
        /// host time between replays, one device.
        pub fn profile_of(graphs: &[G]) -> Profile {
            let mut b = B {
                recs: Vec::new(),
                strs: Vec::new(),
                frames: 0,
                stacks: 0,
                corr: 0,
            };
            let launch = b.s("cudaGraphLaunch");
            let mut t = 1_000_000u64;
            for g in graphs {
                let at = g.line.map(|l| b.user_stack(l));
                let names: Vec<StrId> = g.kernels.iter().map(|k| b.s(k)).collect();
                for _ in 0..g.replays {
                    b.corr += 1;
                    let corr = b.corr;
                    b.recs.push(Record::Api(Api {
                        domain: ApiDomain::Runtime,
                        name: launch,
                        cbid: 311,
                        start: t,
                        end: t + 5_000,
                        tid: 1,
                        corr,
                        ret: 0,
                    }));
                    if let Some(stack) = at {
                        b.recs.push(Record::Callsite(Callsite {
                            corr,
                            api: launch,
                            tid: 1,
                            ts: t,
                            stack,
                            weight: None,
                        }));
                    }
                    let mut k = t + 6_000;
                    for (n, &name) in names.iter().enumerate() {
                        b.recs.push(Record::Kernel(Kernel {
                            name,
                            start: k,
                            end: k + g.node_ns,
                            dev: 0,
                            ctx: 1,
                            stream: 9,
                            corr,
                            graph: Some(GraphNode(g.id, 100 + n as u64)),
                            ..Kernel::default()
                        }));
                        k += g.node_ns;
                    }
                    t = k + 30_000;
                }
            }
            let m = Model::load(b.recs);
            let cfg = Config::default();
            let a = crate::analyze(&m, &cfg);
            profile(&m, &a, &cfg)
        }
    }

    use graphs::{g, profile_of, G};

    fn gdiff(b: &[G], n: &[G]) -> Diff {
        let opts = Options {
            threshold_pct: 1.0,
            fail_on_regression_pct: Some(5.0),
        };
        diff(&profile_of(b), &profile_of(n), &opts).unwrap()
    }

    #[test]
    fn a_matched_graph_whose_replays_got_slower() {
        let b = [g(3, Some(40), &["scale", "add"])];
        let mut slow = g(3, Some(40), &["scale", "add"]);
        slow.node_ns = 30_000;
        let d = gdiff(&b, &[slow]);
        assert_eq!(d.graphs.len(), 1, "{:#?}", d.graphs);
        let x = &d.graphs[0];
        assert_eq!(x.status, Status::Changed);
        assert_eq!(x.matched_by, GraphMatch::Line);
        let l = x.launch_location.as_ref().unwrap();
        assert_eq!((l.file.as_str(), l.line), ("/src/graph.cu", Some(40)));
        assert_eq!(x.ops, ["add", "scale"]);
        assert_eq!(x.replays, Delta::of(10, 10));
        assert_eq!(x.replay_median_ns, Delta::of(40_000, 60_000));
        assert_eq!(x.replay_median_ns.pct, Some(50.0));
        assert_eq!(x.replay_total_ns, Delta::of(400_000, 600_000));
        // 30 µs of host time between replays (launch to work: 6 µs more), unchanged.
        assert_eq!(x.gap_idle_ns, Delta::of(9 * 36_000, 9 * 36_000));
        assert_eq!(d.graphs_hidden, 0);
        // The gate (docs/diff.md): slower replays regress through GPU busy and wall time, not
        // as a graph of their own.
        let r: Vec<&str> = d.regressions.iter().map(|r| r.metric).collect();
        assert_eq!(r, ["wall", "gpu_busy"]);
        // Against itself: counted as unchanged, not shown.
        let same = gdiff(&b, &b);
        assert!(
            same.graphs.is_empty() && same.graphs_hidden == 1,
            "{same:#?}"
        );
        assert!(same.is_unchanged());
    }

    #[test]
    fn graphs_match_by_launch_line_whatever_their_graph_ids() {
        let b = [
            g(3, Some(40), &["scale", "add"]),
            g(4, Some(50), &["reduce"]),
        ];
        // Other ids, another capture order, the graph at line 50 replayed twice as often.
        let mut more = g(11, Some(50), &["reduce"]);
        more.replays = 20;
        let n = [more, g(12, Some(40), &["scale", "add"])];
        let d = gdiff(&b, &n);
        assert_eq!(d.graphs.len(), 1, "{:#?}", d.graphs);
        let x = &d.graphs[0];
        assert_eq!(x.status, Status::Changed);
        assert_eq!(x.launch_location.as_ref().unwrap().line, Some(50));
        assert_eq!(
            x.base,
            Some(GraphSide {
                graph: 4,
                device: 0
            })
        );
        assert_eq!(
            x.new,
            Some(GraphSide {
                graph: 11,
                device: 0
            })
        );
        assert_eq!(x.replays, Delta::of(10, 20));
        assert_eq!(x.replay_median_ns, Delta::of(20_000, 20_000));
        assert_eq!(d.graphs_hidden, 1, "line 40: ids 3 and 12, unchanged");
    }

    #[test]
    fn graphs_sharing_a_launch_line_match_by_their_operations() {
        // Two graphs replayed from one line (per batch size, say): their ops tell them apart,
        // whatever their ids and order.
        let b = [g(1, Some(40), &["small"]), g(2, Some(40), &["large"])];
        let mut slower = g(7, Some(40), &["small"]);
        slower.node_ns = 40_000;
        let n = [g(6, Some(40), &["large"]), slower];
        let d = gdiff(&b, &n);
        assert_eq!(d.graphs.len(), 1, "{:#?}", d.graphs);
        assert_eq!(d.graphs[0].ops, ["small"]);
        assert_eq!(d.graphs[0].base.as_ref().unwrap().graph, 1);
        assert_eq!(d.graphs[0].new.as_ref().unwrap().graph, 7);
        assert_eq!(d.graphs[0].replay_median_ns, Delta::of(20_000, 40_000));
        assert_eq!(d.graphs_hidden, 1);
    }

    #[test]
    fn new_and_gone_graphs_and_graphs_without_a_launch_line() {
        let b = [
            g(1, None, &["x", "y"]),
            g(2, Some(50), &["reduce"]),
            g(3, None, &["z"]),
        ];
        // No launch line: matched by the set of its ops (another node order); line 50 gone,
        // line 60 new; the graph of `z` gone, one of `w` new.
        let n = [
            g(9, None, &["y", "x"]),
            g(8, Some(60), &["reduce"]),
            g(5, None, &["w"]),
        ];
        let d = gdiff(&b, &n);
        let mut rows: Vec<(Status, GraphMatch, Option<u32>, Vec<String>)> = d
            .graphs
            .iter()
            .map(|x| {
                (
                    x.status,
                    x.matched_by,
                    x.launch_location.as_ref().and_then(|l| l.line),
                    x.ops.clone(),
                )
            })
            .collect();
        rows.sort();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            rows,
            [
                (Status::New, GraphMatch::Line, Some(60), s(&["reduce"])),
                (Status::New, GraphMatch::Ops, None, s(&["w"])),
                (Status::Gone, GraphMatch::Line, Some(50), s(&["reduce"])),
                (Status::Gone, GraphMatch::Ops, None, s(&["z"])),
            ]
        );
        assert_eq!(d.graphs_hidden, 1, "x, y: ids 1 and 9, unchanged");
        let gone = d.graphs.iter().find(|x| x.status == Status::Gone).unwrap();
        assert!(gone.new.is_none() && gone.base.is_some());
        assert_eq!(gone.replays, Delta::of(10, 0));
        assert_eq!(gone.replay_median_ns.pct, Some(-100.0));
        let new = d.graphs.iter().find(|x| x.status == Status::New).unwrap();
        assert_eq!(new.replays.pct, None);
        // Graphs never gate by themselves: the same work in both sessions. The insights new at
        // the new line (gpu-idle, graph-replay-gaps) are rated on the session's time, of which
        // the graph at line 60 is one of four: MEDIUM, not a new HIGH, so nothing regresses.
        let new_at_60: Vec<(&str, Severity)> = d
            .insights
            .iter()
            .filter(|i| i.status == Status::New)
            .filter_map(|i| i.new.as_ref().map(|s| (i.rule.as_str(), s.severity)))
            .collect();
        assert_eq!(
            new_at_60,
            [
                ("gpu-idle", Severity::Medium),
                ("graph-replay-gaps", Severity::Medium)
            ]
        );
        assert!(d.regressions.is_empty(), "{:?}", d.regressions);
    }

    #[test]
    fn sessions_without_graphs_have_no_graph_fields() {
        let p = base();
        let d = diff(&p, &p, &Options::default()).unwrap();
        let v = serde_json::to_value(&d).unwrap();
        assert!(
            v.get("graphs").is_none() && v.get("graphs_hidden").is_none(),
            "{v}"
        );
        assert!(serde_json::to_value(&p).unwrap().get("graphs").is_none());
        // One side with graphs: they are new.
        let n = profile_of(&[g(1, Some(40), &["k"])]);
        let mut b = n.clone();
        b.graphs.clear();
        let d = diff(&b, &n, &Options::default()).unwrap();
        assert_eq!(d.graphs.len(), 1);
        assert_eq!(d.graphs[0].status, Status::New);
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["graphs"][0]["status"], "new");
        assert_eq!(v["graphs"][0]["matched_by"], "line");
        assert_eq!(v["graphs"][0]["new"]["graph"], 1);
        assert!(v["graphs"][0].get("base").is_none());
        assert!(v.get("graphs_hidden").is_none());
    }

    #[test]
    fn many_graphs_at_one_line_pair_in_order_without_overflow() {
        // Hostile figures: deltas at the ends of u64 saturate, the sort does not overflow.
        let big = |graph: u32, v: u64| GraphStat {
            graph,
            device: graph % 3,
            launch_location: Some(loc("t.py", 5, "g.replay()")),
            ops: vec![format!("k{}", graph % 7)],
            replays: v,
            replay_median_ns: v,
            replay_total_ns: v,
            gap_idle_ns: v,
            busy_ns: v,
        };
        let mut b = base();
        let mut n = base();
        b.graphs = (0..2000).map(|i| big(i, u64::MAX - i as u64)).collect();
        n.graphs = (0..1500).map(|i| big(i + 5000, i as u64)).collect();
        let d = diff(&b, &n, &Options::default()).unwrap();
        let count = |s: Status| d.graphs.iter().filter(|x| x.status == s).count();
        assert_eq!(count(Status::Changed) + d.graphs_hidden as usize, 1500);
        assert_eq!(count(Status::Gone), 500);
        assert_eq!(count(Status::New), 0);
    }
}
