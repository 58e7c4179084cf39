//! Always-on (sampled) sessions: what was observed, which insights are exact and which are
//! estimated from the windows, and the calls per call site estimated from `callsite.weight`.
//!
//! In an always-on session (`options.mode` "always-on") every synchronization is recorded with its
//! stack, telemetry and scopes are continuous, but kernels, copies and memsets are recorded only
//! inside `window` records. The analysis reads the GPU as *not observed* outside them
//! ([`Model::unobserved`]), never as idle. An insight's [`Basis`] says which it rests on:
//!
//! - **exact** — `sync-attribution`, `in-loop-sync` (found from syncs, recorded everywhere; its
//!   GPU-idle term counts only observed idle), `throttling`, `memory-pressure`, `ecc-errors`
//!   (telemetry is continuous): they rest on the whole run.
//! - **estimated** — every rule that reads kernels, copies or memsets: its figures were measured
//!   inside the windows only. `impact_ns` stays what was measured there (a lower bound of the
//!   run's cost, never scaled up), so ranking by it never lets a sample pass for a measurement;
//!   `extrapolated_impact_ns` (impact / coverage) is given beside it only when every window was a
//!   periodic `sampled` one (a triggered or API window was opened for a reason: not typical).

use crate::ids::LocIx;
use crate::insight::Insight;
use crate::model::{Model, WindowReason};
use crate::userframe::SourceLoc;
use serde::Serialize;
use std::collections::HashMap;

/// What an insight's figures rest on.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BasisKind {
    /// From records kept all the time (synchronizations, telemetry): the whole run.
    Exact,
    /// From GPU activity recorded inside the always-on windows only.
    Estimated,
}

/// How an insight's figures were obtained, in an always-on session (absent in default-mode
/// sessions, which observe everything: exact).
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Basis {
    pub kind: BasisKind,
    /// Time the figures rest on, ns: the session's span (exact), or its GPU-observed time
    /// (estimated).
    pub observed_ns: u64,
    /// `observed_ns` over the session's span, 0..1.
    pub coverage: f64,
    /// Estimated insights of a session whose windows were all periodic (`sampled`), with an
    /// impact: `impact_ns / coverage`, what the whole run would cost if the windows are typical.
    /// Never used for ranking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub extrapolated_impact_ns: Option<u64>,
}

/// Whether a rule's figures come only from records kept all the time in an always-on session
/// (the rule table's `exact`, [`crate::rules::RULES`]; false for a name no rule has).
pub fn rule_is_exact(rule: &str) -> bool {
    crate::rules::spec(rule).is_some_and(|r| r.exact)
}

/// Calls of one API at one user line, estimated from the sampled call sites.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct CallsPerLine {
    pub location: SourceLoc,
    /// The API (`cudaLaunchKernel`, `cudaMemcpyAsync`, …).
    pub api: String,
    /// `callsite` records (captures) at this line.
    pub captures: u64,
    /// Σ `weight` of those captures: the calls they stand for.
    pub calls: u64,
}

/// What an always-on session observed (the `sampling` field of the analysis).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Sampling {
    /// `"always-on"`.
    pub mode: &'static str,
    /// `window` records read, by reason.
    pub windows: u64,
    pub sampled: u64,
    pub triggered: u64,
    pub api: u64,
    /// GPU-observed time inside the session's span, ns (windows, less paused time).
    pub observed_ns: u64,
    /// The session's span (first to last record), ns.
    pub span_ns: u64,
    /// `observed_ns / span_ns`, 0..1.
    pub coverage: f64,
    /// Trace files read (rolling files; older ones may have been deleted).
    pub files: u32,
    /// Calls per user line and API, estimated from `callsite.weight`, most calls first.
    pub calls_per_line: Vec<CallsPerLine>,
    /// When the call sites behind `calls_per_line` were recorded: "windows" (inside the windows
    /// only: the calls of the observed time) or "always" (throughout the run).
    pub call_sites: &'static str,
}

/// The session's sampling summary: None unless it is always-on.
pub(crate) fn summarize(m: &Model, stack_loc: &[LocIx], locs: &[SourceLoc]) -> Option<Sampling> {
    if !m.is_always_on() {
        return None;
    }
    let count = |r: WindowReason| m.windows().iter().filter(|w| w.reason == r).count() as u64;
    let (first, last) = m.time_range();
    Some(Sampling {
        mode: "always-on",
        windows: m.windows().len() as u64,
        sampled: count(WindowReason::Sampled),
        triggered: count(WindowReason::Trigger),
        api: count(WindowReason::Api),
        observed_ns: m.observed_ns(),
        span_ns: last - first,
        coverage: m.coverage(),
        files: m.files(),
        calls_per_line: calls_per_line(m, stack_loc, locs),
        call_sites: if m.call_sites_in_windows() {
            "windows"
        } else {
            "always"
        },
    })
}

/// Σ weight of the `callsite` records per (user line, API).
fn calls_per_line(m: &Model, stack_loc: &[LocIx], locs: &[SourceLoc]) -> Vec<CallsPerLine> {
    let mut acc: HashMap<(LocIx, u32), (u64, u64)> = HashMap::new();
    for c in &m.callsites {
        let Some(&loc) = stack_loc.get(c.stack.index()) else {
            continue;
        };
        let e = acc.entry((loc, c.api)).or_insert((0, 0));
        e.0 += 1;
        e.1 += u64::from(c.weight);
    }
    let mut out: Vec<CallsPerLine> = acc
        .into_iter()
        .filter_map(|((loc, api), (captures, calls))| {
            Some(CallsPerLine {
                location: locs.get(loc.index())?.clone(),
                api: m.str(gpufl_trace::StrId(api)).to_string(),
                captures,
                calls,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        b.calls
            .cmp(&a.calls)
            .then_with(|| a.location.cmp(&b.location))
            .then_with(|| a.api.cmp(&b.api))
    });
    out
}

/// Fill [`Insight::basis`] of every insight of an always-on session.
pub(crate) fn mark_basis(m: &Model, insights: &mut [Insight]) {
    if !m.is_always_on() {
        return;
    }
    let (first, last) = m.time_range();
    let span = last - first;
    let observed = m.observed_ns();
    let coverage = m.coverage();
    let periodic = !m.windows().is_empty()
        && m.windows()
            .iter()
            .all(|w| w.reason == WindowReason::Sampled);
    for ins in insights.iter_mut() {
        ins.basis = Some(if rule_is_exact(ins.rule) {
            Basis {
                kind: BasisKind::Exact,
                observed_ns: span,
                coverage: 1.0,
                extrapolated_impact_ns: None,
            }
        } else {
            let extrapolated = (periodic && ins.impact_ns > 0 && coverage > 0.0)
                .then(|| (ins.impact_ns as f64 / coverage).min(u64::MAX as f64) as u64);
            Basis {
                kind: BasisKind::Estimated,
                observed_ns: observed,
                coverage,
                extrapolated_impact_ns: extrapolated,
            }
        });
    }
}
