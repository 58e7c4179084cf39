//! What is done to the rules' insights once they have all run: each one's scope path
//! ([`name_scopes`]), whether its location was read from another thread ([`mark_inferred`]), and
//! the ranking ([`rank`]).

use crate::ids::LocIx;
use crate::insight::{Inferred, Insight};
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
