//! The contract between the rules and everything that reads their findings: an [`Insight`] (one
//! finding of a rule, built with `Insight::new` and its setters), its [`Severity`], how its
//! location was [`Inferred`], and the prose helpers every rule writes with ([`fmt_duration`],
//! [`short_function`], `in_function`, `share`; all but `in_function` live in `crate::text` so
//! that lower modules use them without depending on the rules).
//!
//! A rule's own figures are one variant of [`RuleData`], declared with the rule table
//! (`crate::rules`).

use crate::rules::{Cause, RuleData};
pub(crate) use crate::text::share;
pub use crate::text::{fmt_bytes, fmt_duration, short_function};
use crate::userframe::SourceLoc;
use gpufl_trace::SyncKind;
use serde::{Deserialize, Serialize};

/// How much an insight matters.
#[derive(Serialize, Deserialize, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug, Hash)]
#[serde(rename_all = "UPPERCASE")]
pub enum Severity {
    Low,
    Medium,
    High,
}

/// Severity thresholds, in percent of the session's time (see [`Severity::of_impact`]).
pub const HIGH_SHARE_PCT: u64 = 25;
pub const MEDIUM_SHARE_PCT: u64 = 5;

impl Severity {
    /// The one severity formula (docs/insights.md, "Ranking and severity"): HIGH if `impact_ns`
    /// is more than [`HIGH_SHARE_PCT`] % of `session_ns` (the session's wall time; in an always-on
    /// session its observed time), MEDIUM if more than [`MEDIUM_SHARE_PCT`] %, LOW otherwise
    /// (exactly 5 % is LOW, exactly 25 % MEDIUM; an empty session is LOW). Integer arithmetic, so
    /// the boundaries are exact. Monotone in `impact_ns`: insights ranked by impact never rise in
    /// severity down the list.
    pub fn of_impact(impact_ns: u64, session_ns: u64) -> Severity {
        let (i, w) = (impact_ns as u128 * 100, session_ns as u128);
        if w == 0 {
            Severity::Low
        } else if i > w * HIGH_SHARE_PCT as u128 {
            Severity::High
        } else if i > w * MEDIUM_SHARE_PCT as u128 {
            Severity::Medium
        } else {
            Severity::Low
        }
    }
}

/// One finding of a rule, with its source location and fix.
#[derive(Serialize, Clone, Debug)]
pub struct Insight {
    /// The rule's name (`"sync-attribution"`, `"low-occupancy"`, …): the headline's, when other
    /// rules' findings at the same line and cause were merged into this one (`facets`).
    pub rule: &'static str,
    /// What the finding is about (the rule table's [`Cause`]); one finding per line and cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    pub severity: Severity,
    pub title: String,
    pub detail: String,
    pub fix: String,
    pub location: SourceLoc,
    /// Operations the insight covers (synchronizations, copies, launches…).
    pub count: u64,
    /// Time the rule attributes to this finding, ns (see each rule); insights are ranked by it.
    pub impact_ns: u64,
    /// `impact_ns / wall_ns` of the session, 0..1.
    pub share_of_wall: f64,
    /// The rule's own window, ns, which `share_of_window` measures the impact against: the
    /// session's wall time for sync-attribution, the loop's span for in-loop-sync, the sampled
    /// time for the telemetry rules (see each rule). Severity is not rated on it.
    pub window_ns: u64,
    /// `impact_ns / window_ns`, 0..1: the impact against the rule's own window.
    pub share_of_window: f64,
    /// `impact_ns` over the session's time (its wall time; in an always-on session its observed
    /// time), 0..1: what `severity` is rated on ([`Severity::of_impact`]), filled after the rules run.
    pub share_of_session: f64,
    /// Host time blocked in the covered synchronizations, ns (for StreamWaitEvent: the enqueue).
    pub blocked_ns: u64,
    /// GPU idle time the rule attributes to the synchronizations, ns (0 for sync-attribution).
    pub gpu_idle_ns: u64,
    /// The synchronizations' kind; None when they mix kinds.
    pub sync_kind: Option<SyncKind>,
    /// in-loop-sync: median number of kernel launches between consecutive synchronizations.
    pub median_kernels_between: Option<f64>,
    /// The rule's own figures (rules other than the two sync rules).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<RuleData>,
    /// The other rules' findings about the same line and cause, merged into this one, highest
    /// impact first (`shared::finish::merge`), each a whole finding (rule, title, figures, data);
    /// the report says the fix once, the headline's. The finding's impact is the headline's, the
    /// largest: the facets measure the same time from other sides, so they are not added. A
    /// facet holds no facets.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub facets: Vec<Insight>,
    /// The innermost named scope (outermost first) open on the thread of the insight's
    /// representative event: its longest synchronization at [`Insight::location`], else its
    /// longest API call (launch, copy, memset) with a call-site stack there. Filled after the rules
    /// run (`shared::finish::name_scopes`); None without scopes or without such an event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<Vec<String>>,
    /// Set when the location's Python frames were read from another thread (cross-thread Python
    /// attribution: the calling thread ran no Python). Filled after the rules run (`shared::finish::mark_inferred`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inferred: Option<Inferred>,
    /// In an always-on session: whether the figures are exact (records kept all the time) or
    /// estimated from the GPU activity windows, and the observed share they rest on (absent in
    /// default-mode sessions, which observe everything). Filled after the rules run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub basis: Option<crate::sampling::Basis>,
}

/// How an insight's location was inferred from another thread.
#[derive(Serialize, Clone, Debug, PartialEq, Eq)]
pub struct Inferred {
    /// The threads whose Python frames were read (OS thread ids), smallest first.
    pub via_tids: Vec<u64>,
    /// Stacks at this location whose Python frames came from another thread, and all its stacks.
    pub via_stacks: u32,
    pub stacks: u32,
}

impl Insight {
    /// A finding of `rule` at `location`, with its prose; no operation counted, no time, LOW, no
    /// figures of its own until the setters below say otherwise. The JSON output is the struct's
    /// fields in their declared order, however the insight was built.
    pub(crate) fn new(
        rule: &'static str,
        location: SourceLoc,
        title: String,
        detail: String,
        fix: impl Into<String>,
    ) -> Insight {
        Insight {
            rule,
            cause: crate::rules::spec(rule).map(|s| s.cause),
            severity: Severity::Low,
            title,
            detail,
            fix: fix.into(),
            location,
            count: 0,
            impact_ns: 0,
            share_of_wall: 0.0,
            window_ns: 0,
            share_of_window: 0.0,
            share_of_session: 0.0,
            blocked_ns: 0,
            gpu_idle_ns: 0,
            sync_kind: None,
            median_kernels_between: None,
            data: None,
            facets: Vec::new(),
            scope: None,
            inferred: None,
            basis: None,
        }
    }

    /// The time the finding costs, measured against `window_ns`: `share_of_window` from their
    /// ratio, `share_of_wall` from `impact_ns / wall_ns` (the severity is rated after the rules
    /// run, on the session's time: `shared::finish::rate`).
    pub(crate) fn impact(mut self, impact_ns: u64, window_ns: u64, wall_ns: u64) -> Insight {
        self.impact_ns = impact_ns;
        self.window_ns = window_ns;
        self.share_of_wall = share(impact_ns, wall_ns);
        self.share_of_window = share(impact_ns, window_ns);
        self
    }

    /// Operations the insight covers.
    pub(crate) fn count(mut self, n: u64) -> Insight {
        self.count = n;
        self
    }

    /// Host time blocked in the covered synchronizations, ns.
    pub(crate) fn blocked(mut self, ns: u64) -> Insight {
        self.blocked_ns = ns;
        self
    }

    /// GPU idle time the rule attributes to the finding, ns.
    pub(crate) fn gpu_idle(mut self, ns: u64) -> Insight {
        self.gpu_idle_ns = ns;
        self
    }

    /// The covered synchronizations' kind (None when they mix kinds).
    pub(crate) fn sync_kind(mut self, kind: Option<SyncKind>) -> Insight {
        self.sync_kind = kind;
        self
    }

    /// in-loop-sync: median number of kernel launches between consecutive synchronizations.
    pub(crate) fn median_kernels_between(mut self, median: f64) -> Insight {
        self.median_kernels_between = Some(median);
        self
    }

    /// The rule's own figures (its `Data`, one variant of [`RuleData`]).
    pub(crate) fn data(mut self, data: impl Into<RuleData>) -> Insight {
        self.data = Some(data.into());
        self
    }

    /// The scope path a rule found itself (others get theirs after the rules run).
    pub(crate) fn scope(mut self, scope: Option<Vec<String>>) -> Insight {
        self.scope = scope;
        self
    }

    /// The window, ns, where it is not the one severity was measured against (or there is no
    /// impact).
    pub(crate) fn window(mut self, window_ns: u64) -> Insight {
        self.window_ns = window_ns;
        self
    }

    /// `share_of_window`, where it is not `impact_ns / window_ns` (a rule without an impact).
    pub(crate) fn share_of_window(mut self, share: f64) -> Insight {
        self.share_of_window = share;
        self
    }
}

/// ` in func()` or nothing.
pub(crate) fn in_function(loc: &SourceLoc) -> String {
    loc.function
        .as_deref()
        .map(|f| format!(" in {}()", short_function(f)))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severity_boundaries_are_exact() {
        assert_eq!(Severity::of_impact(500, 10_000), Severity::Low);
        assert_eq!(Severity::of_impact(501, 10_000), Severity::Medium);
        assert_eq!(Severity::of_impact(2500, 10_000), Severity::Medium);
        assert_eq!(Severity::of_impact(2501, 10_000), Severity::High);
        assert_eq!(Severity::of_impact(5, 0), Severity::Low);
        assert!(Severity::High > Severity::Medium && Severity::Medium > Severity::Low);
    }

    #[test]
    fn severity_is_monotone_in_impact() {
        let mut last = Severity::Low;
        for i in (0..=10_000u64).step_by(7) {
            let s = Severity::of_impact(i, 10_000);
            assert!(s >= last);
            last = s;
        }
    }
}
