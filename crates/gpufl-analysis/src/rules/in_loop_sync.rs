//! Rule `in-loop-sync`: a synchronization inside a hot loop with GPU work between calls — the
//! host cannot queue the next iteration while it waits, so the GPU drains and idles every iteration.
//!
//! - **Fires** for a user source line (any sync kind; `<driver-internal>` excluded) with at least
//!   [`MIN_SYNCS`] synchronizations whose consecutive pairs (in start order) have a **median** of at
//!   least [`MIN_MEDIAN_KERNELS`] kernel launches between them.
//! - **Kernels between two syncs** are counted by correlation id, which CUDA assigns in API-call
//!   order within a process: the distinct kernel correlation ids strictly between the two syncs'
//!   ids. When a line's correlation ids are unusable (a zero id, or ids not increasing with start
//!   time, or kernels without ids), kernels whose start lies in `(end of first, end of second]`
//!   are counted instead.
//! - **Impact** (`impact_ns`): the host time blocked in the line's syncs **plus the GPU idle time
//!   after each sync**: the idle gap of the sync's device (the device of its context; all devices
//!   when unknown) that begins when the sync returns and lasts until the device's next kernel,
//!   copy or memset starts — 0 if the device is still busy (other streams) when the sync returns.
//!   Idle is counted after every sync but the last (the bubble between iterations; what follows
//!   the loop is not the loop's cost) and never beyond the start of the line's next sync.
//! - **Always-on sessions** (kernels recorded only inside windows): kernels are counted only
//!   between consecutive syncs with no unobserved time between them; when no pair qualifies, the
//!   launches between two syncs are estimated as the summed `weight` of the launch call sites
//!   (`callsite` records of a `*Launch*` API) whose correlation id lies between theirs. The GPU
//!   idle after a sync counts only when that gap was observed (0 otherwise): a lower bound.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::ids::{CorrId, LocIx};
use crate::insight::{fmt_duration, in_function, Insight};
use crate::shared::advice::Fix;
use crate::shared::Ctx;
use std::sync::OnceLock;

pub(crate) const RULE: &str = "in-loop-sync";
/// Fewest syncs from one line for the rule to look at it.
pub const MIN_SYNCS: usize = 3;
/// Fewest kernel launches between consecutive syncs (median over pairs) for the rule to fire.
pub const MIN_MEDIAN_KERNELS: f64 = 3.0;

const FIX: Fix = Fix {
    native: "Move the sync outside the loop (after it, if you only need the results at the end), or \
capture the loop body into a CUDA graph (cudaStreamBeginCapture … cudaGraphLaunch): replay \
amortizes launch overhead and host-side coordination.",
    python: None,
    torch: Some("Move the sync outside the loop (after it, if you only need the results at the end; .item(), \
.cpu() or printing a tensor in the loop is a sync), or capture the loop body into a CUDA \
graph (torch.cuda.graphs / torch.cuda.CUDAGraph): replay amortizes launch overhead and \
host-side coordination."),
    jax: Some("Move the sync outside the loop: don't read values in it (float(x), np.asarray(x), print, \
block_until_ready()), read them after it or every N iterations; or run the loop inside one \
jax.jit function (lax.scan / lax.fori_loop), which dispatches it once."),
    cupy: Some("Move the sync outside the loop (after it, if you only need the results at the end; .get() or \
cupy.asnumpy() in the loop is a sync), or capture the loop body into a CUDA graph \
(stream.begin_capture() … graph.launch()): replay amortizes launch overhead and host-side \
coordination."),
};

/// Kernel start times (sorted), built once, on first need (the correlation ids are the
/// analysis's: [`Ctx::kernel_corrs`]).
struct KernelIndex<'a> {
    cx: &'a Ctx<'a>,
    starts: OnceLock<Vec<u64>>,
    /// (corr, running sum of weights) of the launch call sites (always-on sessions).
    launch_weights: OnceLock<Vec<(CorrId, u64)>>,
}

/// How the kernels between a line's syncs were counted (always-on sessions).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Counted {
    /// Every pair (a default-mode session).
    All,
    /// Only the pairs of syncs with observed GPU time between them: (pairs used, pairs).
    InWindows(usize, usize),
    /// Estimated from the weights of the sampled launch call sites.
    FromCallsites,
}

/// Whether a `callsite` API name is a kernel (or graph) launch.
fn is_launch(name: &str) -> bool {
    name.contains("Launch")
}

impl KernelIndex<'_> {
    fn starts(&self) -> &[u64] {
        self.starts.get_or_init(|| {
            let mut v: Vec<u64> = self.cx.m.kernels.start.iter().collect();
            v.sort();
            v
        })
    }

    /// Launches estimated from the sampled launch call sites with a correlation id in `(a, b)`:
    /// the sum of their weights.
    fn between_weight(&self, a: CorrId, b: CorrId) -> u64 {
        let v = self.launch_weights.get_or_init(|| {
            let m = self.cx.m;
            let mut sum = 0u64;
            let mut v = Vec::new();
            for c in &m.callsites {
                if is_launch(m.str(gpufl_trace::StrId(c.api))) {
                    sum += u64::from(c.weight);
                    v.push((c.corr, sum));
                }
            }
            v
        });
        let upto = |c: CorrId, incl: bool| {
            let i = v.partition_point(|x| if incl { x.0 <= c } else { x.0 < c });
            i.checked_sub(1).map_or(0, |j| v[j].1)
        };
        upto(b, false).saturating_sub(upto(a, true))
    }

    /// Kernels starting in `(a, b]`.
    fn between_time(&self, a: u64, b: u64) -> u64 {
        let s = self.starts();
        s.partition_point(|&x| x <= b)
            .saturating_sub(s.partition_point(|&x| x <= a)) as u64
    }
}

fn median(v: &mut [u64]) -> f64 {
    v.sort_unstable();
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2] as f64
    } else {
        (v[n / 2 - 1] as f64 + v[n / 2] as f64) / 2.0
    }
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let mut by_loc: Vec<Vec<u32>> = vec![Vec::new(); cx.locs.len()];
    for (i, &loc) in cx.sync_locs.iter().enumerate() {
        if let Some(loc) = loc.filter(|&l| !cx.is_driver_internal(l)) {
            by_loc[loc.index()].push(i as u32);
        }
    }
    let idx = KernelIndex {
        cx,
        starts: OnceLock::new(),
        launch_weights: OnceLock::new(),
    };
    by_loc
        .iter_mut()
        .enumerate()
        .filter(|(_, syncs)| syncs.len() >= MIN_SYNCS)
        .filter_map(|(loc, syncs)| line(cx, &idx, LocIx::at(loc), syncs))
        .collect()
}

fn line(cx: &Ctx, idx: &KernelIndex, loc: LocIx, syncs: &mut [u32]) -> Option<Insight> {
    let s = &cx.m.syncs;
    let (start, end, corr) = (
        |i: u32| s.start.get(i as usize),
        |i: u32| s.end.get(i as usize),
        |i: u32| cx.m.sync_corr(i as usize),
    );
    syncs.sort_by_key(|&i| (start(i), corr(i)));
    let kcorrs = cx.kernel_corrs();
    let corr_usable = !kcorrs.is_empty()
        && syncs.iter().all(|&i| corr(i).known().is_some())
        && syncs.windows(2).all(|w| corr(w[0]) < corr(w[1]));
    // The syncs' ids increase: each count gallops on from the previous one.
    let mut cursor = kcorrs.cursor();
    let mut count = |w: &[u32]| {
        if corr_usable {
            // Distinct kernel correlation ids in `(a, b)`.
            cursor.between(corr(w[0]), corr(w[1])) as u64
        } else {
            idx.between_time(end(w[0]), end(w[1]))
        }
    };
    let (mut between, counted): (Vec<u64>, Counted) = if !cx.m.is_always_on() {
        (syncs.windows(2).map(&mut count).collect(), Counted::All)
    } else {
        // Always-on: kernels are recorded inside windows only; count the pairs whose time between
        // lies in observed time, else estimate from the launch call sites' weights.
        let pairs = syncs.len() - 1;
        let seen: Vec<u64> = syncs
            .windows(2)
            .filter(|w| cx.m.unobserved_in(end(w[0]), end(w[1])) == 0)
            .map(&mut count)
            .collect();
        let ids_usable = syncs.iter().all(|&i| corr(i).known().is_some())
            && syncs.windows(2).all(|w| corr(w[0]) < corr(w[1]));
        if !seen.is_empty() {
            let n = seen.len();
            (seen, Counted::InWindows(n, pairs))
        } else if ids_usable && cx.m.has_callsite_weights() {
            let est = syncs
                .windows(2)
                .map(|w| idx.between_weight(corr(w[0]), corr(w[1])))
                .collect();
            (est, Counted::FromCallsites)
        } else {
            return None;
        }
    };
    let med = median(&mut between);
    if med < MIN_MEDIAN_KERNELS {
        return None;
    }
    let blocked: u64 = syncs.iter().map(|&i| end(i).saturating_sub(start(i))).sum();
    let idle: u64 = syncs
        .windows(2)
        .map(|w| {
            let t = end(w[0]);
            let gap = cx.observed_idle_after(cx.sync_device(w[0] as usize), t);
            gap.min(start(w[1]).saturating_sub(t))
        })
        .sum();
    let first = syncs.iter().map(|&i| start(i)).min().unwrap_or(0);
    let last = syncs
        .iter()
        .map(|&i| end(i).max(start(i)))
        .max()
        .unwrap_or(0);
    let window = last - first;
    let impact = blocked + idle;
    let n = syncs.len();
    let kind = cx.m.sync_kind_at(syncs[0] as usize);
    let same_kind = syncs.iter().all(|&i| cx.m.sync_kind_at(i as usize) == kind);
    let location = cx.loc(loc).clone();
    let mut detail = format!(
        "{} blocked across {n} calls at {}{}; the GPU then sat idle {} in all until the next iteration's work \
         (median {med} kernel launches between syncs)",
        fmt_duration(blocked),
        location.short(),
        in_function(&location),
        fmt_duration(idle),
    );
    match counted {
        Counted::All => {}
        Counted::InWindows(k, pairs) => detail += &format!(
            "; launches counted between the {k} of {pairs} consecutive syncs with GPU activity recorded \
             between them, and GPU idle only where it was observed (always-on windows)"
        ),
        Counted::FromCallsites => detail += "; launches between syncs estimated from the sampled \
             launch call sites' weights (no pair of syncs fell inside a window), GPU idle only where \
             it was observed (always-on windows)",
    }
    Some(
        Insight::new(
            RULE,
            location,
            format!("In-loop sync × {n} — likely blocking GPU pipelining"),
            detail,
            cx.fix(&FIX),
        )
        .count(n as u64)
        .impact(impact, window, cx.wall_ns)
        .blocked(blocked)
        .gpu_idle(idle)
        .sync_kind(same_kind.then_some(kind))
        .median_kernels_between(med),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&mut [5, 1, 3]), 3.0);
        assert_eq!(median(&mut [2, 3]), 2.5);
        assert_eq!(median(&mut [4, 1, 3, 2]), 2.5);
        assert_eq!(median(&mut []), 0.0);
    }
}
