//! What every rule reads: [`Ctx`], the model with the session's wall time, the devices' busy
//! intervals, and the user location of every stack, synchronization and call site (computed once
//! per distinct stack), with the lookups the rules share (an API call by correlation id, a call
//! site's line, the GPU-observed span of an always-on session, the host records indexed for the
//! join of idle gaps with the host).

use crate::corrs::KernelCorrs;
use crate::ids::{CorrId, LocIx, StackIx};
use crate::intervals::DeviceBusy;
use crate::model::Model;
use crate::shared::advice::{advice, Fix, Program};
use crate::userframe::{user_frame, FrameOrigin, SourceLoc};
use crate::Config;
use std::collections::HashMap;
use std::sync::OnceLock;

/// Per location: how many of its stacks were read from another thread, and from which threads.
#[derive(Clone, Debug, Default)]
pub(crate) struct LocVia {
    pub stacks: u32,
    pub via_stacks: u32,
    pub tids: Vec<u64>,
}

/// What every rule needs: the model, the session's wall time, device busy intervals, and the user
/// location of each synchronization (computed once per distinct stack).
pub(crate) struct Ctx<'a> {
    pub m: &'a Model,
    pub wall_ns: u64,
    pub busy: &'a DeviceBusy,
    /// Which frames are the user's code (the analysis's configuration).
    pub filter: crate::userframe::FrameFilter,
    /// The kind of program recorded (from its frames), whose words the fixes use.
    pub program: Program,
    /// Distinct user locations ([`LocIx`] indexes them; see [`Ctx::loc`]).
    pub locs: Vec<SourceLoc>,
    /// Each sync's user location, None for a sync without a stack.
    pub sync_locs: Vec<Option<LocIx>>,
    /// Each model stack's user location, by [`StackIx`] (see [`Ctx::stack_loc`]).
    stack_locs: Vec<LocIx>,
    /// Per model stack: a walk cut short inside CUDA ([`crate::userframe::is_cut_in_cuda`]).
    stack_cut: Vec<bool>,
    /// (corr, index) of every API record, sorted by corr.
    pub(crate) api_by_corr: Vec<(CorrId, u32)>,
    /// Per location, by [`LocIx`]: stacks read from another thread.
    pub loc_via: Vec<LocVia>,
    /// The kernels' distinct correlation ids, on first need.
    kernel_corrs: OnceLock<Option<Vec<u32>>>,
    /// The host records indexed for the join, on first need.
    host: OnceLock<crate::shared::host::HostIndex>,
}

impl<'a> Ctx<'a> {
    pub fn new(m: &'a Model, cfg: &Config, busy: &'a DeviceBusy, wall_ns: u64) -> Ctx<'a> {
        let mut locs = Vec::new();
        let mut index: HashMap<SourceLoc, LocIx> = HashMap::new();
        let stack_locs: Vec<LocIx> = m
            .stack_ixs()
            .map(|s| {
                let loc = user_frame(m, s, &cfg.filter);
                *index.entry(loc).or_insert_with_key(|loc| {
                    locs.push(loc.clone());
                    LocIx::at(locs.len() - 1)
                })
            })
            .collect();
        // Only a stack without a user or library line can be a walk cut short in CUDA.
        let stack_cut: Vec<bool> = m
            .stack_ixs()
            .zip(&stack_locs)
            .map(|(s, &l)| {
                locs[l.index()].is_unattributed() && crate::userframe::is_cut_in_cuda(m, s)
            })
            .collect();
        let mut loc_via = vec![LocVia::default(); locs.len()];
        for (s, &l) in m.stack_ixs().zip(&stack_locs) {
            let v = &mut loc_via[l.index()];
            v.stacks += 1;
            if let Some(t) = m.stack_via(s) {
                v.via_stacks += 1;
                if !v.tids.contains(&t) && v.tids.len() < 8 {
                    v.tids.push(t);
                    v.tids.sort_unstable();
                }
            }
        }
        let sync_locs = m
            .sync_stacks()
            .map(|s| s.and_then(|s| stack_locs.get(s.index()).copied()))
            .collect();
        let mut api_by_corr: Vec<(CorrId, u32)> = (0..m.apis.corr.len())
            .map(|i| (m.api_corr(i), i as u32))
            .collect();
        api_by_corr.sort_unstable();
        Ctx {
            m,
            wall_ns,
            busy,
            filter: cfg.filter.clone(),
            program: Program::of(m),
            locs,
            sync_locs,
            stack_locs,
            stack_cut,
            api_by_corr,
            loc_via,
            kernel_corrs: OnceLock::new(),
            host: OnceLock::new(),
        }
    }

    /// The host records (`hostcall`, `hsample`) indexed for the join of idle gaps with what the
    /// host was doing (built on the first call, shared by the rules; empty without them).
    pub fn host(&self) -> &crate::shared::host::HostIndex {
        self.host
            .get_or_init(|| crate::shared::host::HostIndex::new(self))
    }

    /// The kernels' distinct non-zero correlation ids, sorted (built on the first call, shared by
    /// the rules).
    pub fn kernel_corrs(&self) -> KernelCorrs<'_> {
        let col = &self.m.kernels.corr;
        KernelCorrs::of(
            col,
            self.kernel_corrs
                .get_or_init(|| crate::corrs::sorted_copy(col)),
        )
    }

    /// The text of a fix in this program's words ([`advice`]).
    pub fn fix(&self, fix: &Fix) -> &'static str {
        advice(self.program, fix)
    }

    /// A user location.
    pub fn loc(&self, loc: LocIx) -> &SourceLoc {
        &self.locs[loc.index()]
    }

    /// The user location of a model stack.
    pub fn stack_loc(&self, stack: StackIx) -> Option<LocIx> {
        self.stack_locs.get(stack.index()).copied()
    }

    /// Every model stack's user location, by [`StackIx`].
    pub fn stack_locs(&self) -> &[LocIx] {
        &self.stack_locs
    }

    /// The user location of synchronization `i` (None without a stack).
    pub fn sync_loc(&self, i: usize) -> Option<LocIx> {
        self.sync_locs.get(i).copied().flatten()
    }

    /// Whether model stack `stack` carries Python frames read from another thread.
    pub fn stack_is_via(&self, stack: StackIx) -> bool {
        self.m.stack_via(stack).is_some()
    }

    /// Whether most stacks of location `loc` were read from another thread.
    pub fn loc_is_via(&self, loc: LocIx) -> bool {
        self.loc_via
            .get(loc.index())
            .is_some_and(|v| v.via_stacks * 2 > v.stacks)
    }

    /// The API call with this correlation id (`api` records; None when API records were off).
    pub fn api(&self, corr: CorrId) -> Option<crate::views::ApiRec> {
        let i = self.api_by_corr.partition_point(|a| a.0 < corr);
        let &(c, idx) = self.api_by_corr.get(i)?;
        (c == corr).then(|| self.m.api(idx as usize))
    }

    /// Index into `locs` of the user location of the API call with this correlation id, from its
    /// `callsite` record (copies, memsets, sampled launches); None also when that record's walk was
    /// cut short inside CUDA (its stack names no line, and the call is then located as an unsampled
    /// one would be).
    pub fn callsite_loc(&self, corr: CorrId) -> Option<LocIx> {
        let (stack, _) = self.m.callsite(corr)?;
        if self.stack_is_cut(stack) {
            return None;
        }
        self.stack_loc(stack)
    }

    /// Whether model stack `stack` is a walk cut short inside CUDA (it names no line).
    pub fn stack_is_cut(&self, stack: StackIx) -> bool {
        self.stack_cut.get(stack.index()).copied().unwrap_or(false)
    }

    pub fn is_driver_internal(&self, loc: LocIx) -> bool {
        self.loc(loc).origin == FrameOrigin::DriverInternal
    }

    /// The idle gap of `dev` that begins at `t` ([`DeviceBusy::idle_after`]), 0 when that gap
    /// overlaps time in which the GPU was not observed (paused, or an always-on session outside
    /// its windows): what the GPU did there is unknown.
    pub fn observed_idle_after(&self, dev: Option<u32>, t: u64) -> u64 {
        let g = self.busy.idle_after(dev, t);
        if g > 0 && self.m.unobserved_in(t, t.saturating_add(g)) > 0 {
            0
        } else {
            g
        }
    }

    /// The span `[a, b)` as a severity window of a rule that reads GPU activity: in an always-on
    /// session, its GPU-observed time only (the time outside windows cannot hold the rule's
    /// events); `b - a` otherwise.
    pub fn gpu_span(&self, a: u64, b: u64) -> u64 {
        let d = b.saturating_sub(a);
        if self.m.is_always_on() {
            d.saturating_sub(self.m.unobserved_in(a, b))
        } else {
            d
        }
    }

    /// The session's wall time as the severity window of a rule that reads GPU activity: in an
    /// always-on session its GPU-observed time ([`Model::observed_ns`]), else `wall_ns`.
    pub fn gpu_wall_ns(&self) -> u64 {
        if self.m.is_always_on() {
            self.m.observed_ns()
        } else {
            self.wall_ns
        }
    }

    /// Device of a sync's context, if known.
    pub fn sync_device(&self, i: usize) -> Option<u32> {
        let ctx = self.m.syncs.ctx.get(i);
        self.m.device_of_ctx(ctx)
    }
}
