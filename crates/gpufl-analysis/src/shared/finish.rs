//! What is done to the rules' insights once they have all run: each one's scope path
//! ([`name_scopes`]), whether its location was read from another thread ([`mark_inferred`]), its
//! severity ([`rate`]), the ranking ([`rank`]) and one finding per line and cause ([`merge`]).

use crate::ids::LocIx;
use crate::insight::{share, Inferred, Insight, Severity};
use crate::rules::{Cause, RuleData};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use std::collections::HashMap;

/// Fill [`Insight::inferred`] of every insight whose location has stacks read from another thread.
pub(crate) fn mark_inferred(cx: &Ctx, insights: &mut [Insight]) {
    let by_loc = loc_index(cx);
    for ins in insights.iter_mut() {
        let Some(&l) = by_loc.get(&ins.location) else {
            continue;
        };
        let Some(v) = cx.loc_via.get(l.index()) else {
            continue;
        };
        if v.via_stacks > 0 {
            ins.inferred = Some(Inferred {
                via_tids: v.tids.clone(),
                via_stacks: v.via_stacks,
                stacks: v.stacks,
            });
        }
    }
}

/// Fill [`Insight::scope`] of every insight: the scope path open at the longest synchronization
/// whose user location is the insight's, else at the longest call-site API call there.
pub(crate) fn name_scopes(cx: &Ctx, insights: &mut [Insight]) {
    let m = cx.m;
    if m.scopes().is_empty() {
        return;
    }
    // Longest sync (with a thread) per user location.
    let mut best: HashMap<LocIx, (u64, u64, u64)> = HashMap::new();
    for (i, s) in m.syncs().enumerate() {
        let (Some(tid), Some(loc)) = (s.tid, cx.sync_loc(i)) else {
            continue;
        };
        let d = s.duration_ns();
        let e = best.entry(loc).or_insert((d, tid, s.start));
        if d > e.0 {
            *e = (d, tid, s.start);
        }
    }
    // Where no sync is: the longest API call (launch, copy, memset) with a call-site stack there.
    let mut by_site: HashMap<LocIx, (u64, u64, u64)> = HashMap::new();
    for c in &m.callsites {
        let (Some(loc), Some(api)) = (cx.callsite_loc(c.corr), cx.api(c.corr)) else {
            continue;
        };
        if best.contains_key(&loc) {
            continue;
        }
        let d = api.duration_ns();
        let e = by_site.entry(loc).or_insert((d, api.tid, api.start));
        if d > e.0 {
            *e = (d, api.tid, api.start);
        }
    }
    let by_loc = loc_index(cx);
    for ins in insights.iter_mut() {
        let Some(l) = by_loc.get(&ins.location) else {
            continue;
        };
        let Some(&(_, tid, ts)) = best.get(l).or_else(|| by_site.get(l)) else {
            continue;
        };
        ins.scope = m.innermost_scope(tid, ts).map(|i| m.scope_path(i));
    }
}

/// The handle of each of the context's locations.
fn loc_index<'c>(cx: &'c Ctx) -> HashMap<&'c SourceLoc, LocIx> {
    cx.locs
        .iter()
        .enumerate()
        .map(|(i, l)| (l, LocIx::at(i)))
        .collect()
}

/// The time severity is rated on: the session's wall time, or in an always-on session the time
/// the GPU was observed (its windows), where the GPU rules' impacts were measured.
pub(crate) fn session_ns(m: &crate::Model, wall_ns: u64) -> u64 {
    if m.is_always_on() {
        m.observed_ns().min(wall_ns.max(1))
    } else {
        wall_ns
    }
}

/// Rate every insight by the one formula ([`Severity::of_impact`]): its impact's share of
/// `session_ns` ([`session_ns`]), kept as `share_of_session`. Ranked by impact, severities then
/// never rise down the list.
pub(crate) fn rate(v: &mut [Insight], session_ns: u64) {
    for i in v.iter_mut() {
        i.severity = Severity::of_impact(i.impact_ns, session_ns);
        i.share_of_session = share(i.impact_ns, session_ns).min(1.0);
    }
}

/// Sort by impact (highest first), then rule, location and title, so the order is total and stable.
pub(crate) fn rank(v: &mut [Insight]) {
    v.sort_by(|a, b| {
        b.impact_ns
            .cmp(&a.impact_ns)
            .then_with(|| a.rule.cmp(b.rule))
            .then_with(|| a.location.cmp(&b.location))
            .then_with(|| a.title.cmp(&b.title))
    });
}

/// A line as findings are merged on: the user's file and line and the library line inside it
/// (the function and the text follow from them).
type LineKey = (String, Option<u32>, Option<(String, Option<u32>)>);

fn line_key(l: &SourceLoc) -> LineKey {
    (
        l.file.clone(),
        l.line,
        l.library.as_ref().map(|b| (b.file.clone(), b.line)),
    )
}

/// One finding per line and cause (docs/insights.md, "One finding per cause"), over a ranked
/// list, which stays ranked. First the `gpu-idle` roll-ups under a user call take in the findings
/// at their library lines: `gpu-idle`'s own there are left out (they are the roll-up's
/// `library_lines` already), the other GPU-starved findings there (`low-utilization`) are merged
/// into the roll-up. Then findings at the same line ([`SourceLoc`]'s file and line, and its library
/// line) with the same [`Cause`] merge: the first — the highest impact — is the headline, keeping
/// its rule, impact, severity and fix; the others become its [`Insight::facets`], in rank order.
pub(crate) fn merge(v: Vec<Insight>) -> Vec<Insight> {
    // The roll-ups' library lines, each to its roll-up's key.
    let mut to_rollup: HashMap<LineKey, LineKey> = HashMap::new();
    for i in &v {
        if let Some(RuleData::GpuIdle(d)) = &i.data {
            for l in &d.library_lines {
                to_rollup
                    .entry(line_key(&l.location))
                    .or_insert_with(|| line_key(&i.location));
            }
        }
    }
    let mut out: Vec<Insight> = Vec::with_capacity(v.len());
    let mut at: HashMap<(LineKey, Cause), usize> = HashMap::new();
    for ins in v {
        let Some(cause) = ins.cause else {
            out.push(ins);
            continue;
        };
        let mut key = line_key(&ins.location);
        if cause == Cause::GpuStarved {
            if let Some(r) = to_rollup.get(&key) {
                if ins.rule == crate::rules::gpu_idle::RULE {
                    continue;
                }
                key = r.clone();
            }
        }
        match at.get(&(key.clone(), cause)) {
            Some(&h) => {
                let mut ins = ins;
                let more = std::mem::take(&mut ins.facets);
                out[h].facets.push(ins);
                out[h].facets.extend(more);
            }
            None => {
                at.insert((key, cause), out.len());
                out.push(ins);
            }
        }
    }
    out
}
