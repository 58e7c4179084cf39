//! Where the session's time is attributed: the share of synchronization time and of GPU kernel time
//! whose location names a line (the user's, directly or through another thread, or a library's)
//! against the share left at `<driver-internal>`. Shared machinery, not a rule: the report prints
//! it under the headline, and it is how "the line is lost" is measured.

use crate::ids::LocIx;
use crate::shared::timeline::Locator;
use crate::shared::Ctx;
use serde::Serialize;

/// Time (ns) by what its location names.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Shares {
    /// At a user line, from the calling thread's own stack.
    pub user_ns: u64,
    /// At a user line read from another thread (cross-thread Python attribution).
    pub inferred_ns: u64,
    /// At a library line only (no frame of the user's code in the stack).
    pub library_ns: u64,
    /// At `<driver-internal>`: a stack with no user or library frame.
    pub driver_internal_ns: u64,
    /// Not located: a sync without a stack, or a kernel whose launch and function have no
    /// call-site stack.
    pub unlocated_ns: u64,
}

impl Shares {
    /// The sum of the shares (saturating: hostile durations can reach `u64::MAX`).
    pub fn total_ns(&self) -> u64 {
        self.user_ns
            .saturating_add(self.inferred_ns)
            .saturating_add(self.library_ns)
            .saturating_add(self.driver_internal_ns)
            .saturating_add(self.unlocated_ns)
    }

    /// Share of the time that names no line (`<driver-internal>` plus unlocated), 0..1.
    pub fn lost_share(&self) -> f64 {
        crate::insight::share(
            self.driver_internal_ns.saturating_add(self.unlocated_ns),
            self.total_ns(),
        )
    }

    fn add(&mut self, cx: &Ctx, loc: Option<LocIx>, via: bool, ns: u64) {
        let Some(loc) = loc else {
            self.unlocated_ns = self.unlocated_ns.saturating_add(ns);
            return;
        };
        let l = cx.loc(loc);
        if l.is_unattributed() {
            self.driver_internal_ns = self.driver_internal_ns.saturating_add(ns);
        } else if l.origin == crate::userframe::FrameOrigin::DriverInternal {
            self.library_ns = self.library_ns.saturating_add(ns);
        } else if via {
            self.inferred_ns = self.inferred_ns.saturating_add(ns);
        } else {
            self.user_ns = self.user_ns.saturating_add(ns);
        }
    }
}

/// Synchronization (host blocked) time and GPU kernel time by what their locations name.
#[derive(Serialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    pub sync: Shares,
    pub gpu: Shares,
}

/// Attribute every synchronization (by its own stack) and every kernel (by its launch's call-site
/// stack, else by the most frequent call site of its kernel function's sampled launches, as the
/// timeline rules locate kernels).
pub(crate) fn attribute(cx: &Ctx) -> Attribution {
    let m = cx.m;
    let mut a = Attribution::default();
    for (i, s) in m.syncs().enumerate() {
        let loc = cx.sync_loc(i);
        let via = m.sync_stack(i).is_some_and(|s| cx.stack_is_via(s));
        a.sync.add(cx, loc, via, s.duration_ns());
    }
    if m.callsites.is_empty() {
        // No call-site stack: no kernel is located (not even by its function's sampled launches).
        let k = &m.kernels;
        for (ss, es) in k.start.chunks().zip(k.end.chunks()) {
            for (&s, &e) in ss.iter().zip(es) {
                a.gpu.unlocated_ns = a.gpu.unlocated_ns.saturating_add(e.saturating_sub(s));
            }
        }
        return a;
    }
    let locator = Locator::new(cx);
    for (i, name) in m.kernel_names().enumerate() {
        let ns = m.kernels.end.get(i).saturating_sub(m.kernels.start.get(i));
        let site = m.kernel_corr(i).known().and_then(|c| m.callsite(c));
        let (loc, via) = match site.filter(|&(stack, _)| !cx.stack_is_cut(stack)) {
            Some((stack, _)) => (cx.stack_loc(stack), cx.stack_is_via(stack)),
            None => match locator.kernel_name_line(name) {
                Some(loc) => (Some(loc), cx.loc_is_via(loc)),
                None => (None, false),
            },
        };
        a.gpu.add(cx, loc, via, ns);
    }
    a
}
