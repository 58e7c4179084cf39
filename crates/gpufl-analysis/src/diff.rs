//! Comparing two sessions (`gpufl diff BASE NEW`), sans-IO.
//!
//! [`profile`] reduces one analysed session to what is compared: its totals, per kernel name
//! (demangled, summed over devices) launches and GPU time, per source line (the user location of
//! the stack, as the insights name it) synchronizations with the host time blocked in them and
//! copies with their GPU time, and its insights. [`diff`] compares two profiles:
//!
//! - **Matching:** kernels by name; lines by file, line, function and library frame (the line's
//!   text is left out: an edit elsewhere does not make a line another); insights by rule,
//!   location, sync kind and subject (the kernel of a kernel rule, the API of a copy rule, the
//!   idle class of `gpu-idle`), with an ordinal when one session still has two alike.
//! - **Status:** `new` (only in NEW), `gone` (only in BASE), `changed` (some figure moved by at
//!   least the threshold, relative to BASE; an insight whose severity changed), else unchanged and
//!   hidden (counted). Relative deltas are against BASE (`None` where BASE is 0).
//! - **Regressions** (with a regression threshold): wall time, host time blocked in
//!   synchronizations or GPU busy time grew by more than the threshold (a sync time that was 0
//!   and is not counts), or a HIGH insight is new. Sessions of different lengths compare in
//!   absolute terms; [`TotalsDiff::per_second`] gives the rates beside them.

use crate::insights::{Insight, RuleData, Severity};
use crate::model::Model;
use crate::totals::Totals;
use crate::userframe::{user_frame, SourceLoc};
use crate::{Analysis, Config};
use gpufl_trace::StackId;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

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
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Profile {
    pub totals: Totals,
    /// An always-on session (its GPU figures cover its windows only).
    pub always_on: bool,
    /// Per kernel name, summed over devices; by name.
    pub kernels: Vec<KernelStat>,
    /// Per source line with synchronizations or copies; by location.
    pub lines: Vec<LineStat>,
    pub insights: Vec<InsightStat>,
}

/// A kernel name's launches and GPU time.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct KernelStat {
    /// Demangled name.
    pub name: String,
    pub launches: u64,
    /// Summed kernel durations, ns.
    pub total_ns: u64,
}

/// What happened at one source line.
#[derive(Serialize, Clone, Debug, PartialEq)]
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
#[derive(Serialize, Clone, Debug, PartialEq)]
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
    let mut by_stack: HashMap<u32, SourceLoc> = HashMap::new();
    let mut loc_of = |stack: Option<StackId>| -> SourceLoc {
        match stack {
            None => no_stack(),
            Some(s) => by_stack
                .entry(s.0)
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
        let stack = (c.corr != 0)
            .then(|| m.callsite(c.corr))
            .flatten()
            .map(|(s, _)| s);
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
        always_on: a.sampling.is_some(),
        kernels: kernels.into_values().collect(),
        lines: lines.into_values().collect(),
        insights,
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
    pub sync_blocked_ns: Delta,
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

/// What regressed beyond the regression threshold.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Regression {
    /// `wall`, `sync_blocked`, `gpu_busy` or `new_high_insight`.
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
    /// Empty without a regression threshold.
    pub regressions: Vec<Regression>,
}

impl Diff {
    /// Whether anything regressed beyond the regression threshold.
    pub fn regressed(&self) -> bool {
        !self.regressions.is_empty()
    }

    /// Whether nothing at all is shown (totals within the threshold, no kernel, line or insight).
    pub fn is_unchanged(&self) -> bool {
        self.kernels.is_empty()
            && self.lines.is_empty()
            && self.insights.is_empty()
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
        ]
        .iter()
        .any(|d| d.moved(th))
    }
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

fn totals_diff(b: &Totals, n: &Totals) -> TotalsDiff {
    let r = |f: fn(&Totals) -> u64| FDelta::of(rate(f(b), b.wall_ns), rate(f(n), n.wall_ns));
    TotalsDiff {
        wall_ns: Delta::of(b.wall_ns, n.wall_ns),
        gpu_busy_ns: Delta::of(b.gpu_busy_ns, n.gpu_busy_ns),
        gpu_busy_pct: FDelta::of(b.gpu_busy_pct, n.gpu_busy_pct),
        kernels: Delta::of(b.kernels, n.kernels),
        copies: Delta::of(b.copies, n.copies),
        memsets: Delta::of(b.memsets, n.memsets),
        syncs: Delta::of(b.syncs, n.syncs),
        sync_blocked_ns: Delta::of(b.sync_blocked_ns, n.sync_blocked_ns),
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
    let totals = totals_diff(&base.totals, &new.totals);

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

    let mut regressions = Vec::new();
    if let Some(f) = opts.fail_on_regression_pct {
        let t = &totals;
        for (metric, what, d) in [
            ("wall", "wall time", t.wall_ns),
            (
                "sync_blocked",
                "host time blocked in syncs",
                t.sync_blocked_ns,
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
        for i in &insights {
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
    }
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
        regressions,
    })
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
        }
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
        assert_eq!(r, ["wall", "sync_blocked", "new_high_insight"]);
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
        assert_eq!(d.regressions[0].metric, "sync_blocked");
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
}
