//! Rule `host-read`: a small device-to-host copy issued at one user line again and again, after
//! which the device runs out of work until the host issues more — the host read a result (`float(x)`
//! on a JAX array, a logged loss) and waited for it before issuing the next step.
//!
//! In-loop-sync sees such a wait when it is a CUDA synchronization (PyTorch's `.item()` is a copy
//! then a `cudaStreamSynchronize`). JAX/XLA (PJRT) waits for its transfers without one: it records
//! an event after the copy and polls it from its own threads, so the only trace of the read on the
//! GPU side is the copy and the idle GPU after it. This rule finds those.
//!
//! - **Reads:** memcpys device → host of at most [`MAX_READ_BYTES`] whose call site has a user
//!   line (`<driver-internal>` excluded). Lines where a host-blocking synchronization (any kind
//!   but StreamWaitEvent) also has its stack are left to in-loop-sync and blocking-copy.
//! - **Idle after a read:** the idle gap of the copy's device that begins when the copy ends and
//!   lasts until the device's next kernel, copy or memset starts (0 if the device is still busy);
//!   gaps under [`MIN_GAP_NS`](crate::shared::idle::MIN_GAP_NS) do not count, nor does the gap after
//!   the line's last read (what follows the loop is not the loop's cost).
//! - **Fires** for a line with at least [`MIN_READS`] reads followed by idle, and idle after them
//!   of at least [`MIN_SHARE_PCT`] % of the line's **span** (first read's start to last read's end,
//!   the window, as in-loop-sync's loop span). **Impact:** the idle time after the reads.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::ids::LocIx;
use crate::insight::{fmt_duration, in_function, share, Insight};
use crate::shared::advice::Fix;
use crate::shared::idle::MIN_GAP_NS;
use crate::shared::Ctx;
use crate::views::CopyOp;
use gpufl_trace::CopyKind;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

pub(crate) const RULE: &str = "host-read";
/// Largest device-to-host copy counted as a read of a result (64 KiB).
pub const MAX_READ_BYTES: u64 = 64 * 1024;
/// Fewest reads followed by idle GPU for an insight.
pub const MIN_READS: u64 = 3;
/// Least share (percent) of the line's span the idle after its reads must reach.
pub const MIN_SHARE_PCT: u64 = 5;

const FIX: Fix = Fix {
    native: "Keep the value on the device and read it less often: accumulate per-step values in a device \
array and read it every N steps or once at the end; when you read it, copy it with \
cudaMemcpyAsync into pinned memory (cudaHostAlloc), record an event after the copy, and wait \
on the event a step later rather than right away.",
    python: None,
    torch: Some("Keep the value on the device and read it less often: accumulate per-step values in a tensor \
on the GPU (total += loss.detach()) and call .item() / .cpu() every N steps or once at the \
end; when you need it sooner, copy it with .to('cpu', non_blocking=True) and read it a step \
later, after a torch.cuda.Event recorded behind the copy has completed."),
    jax: Some("Keep the value on the device and read it less often: accumulate per-step values in a device \
array and read it every N steps or once at the end. In JAX, start the copy early and read it \
a step later (`loss.copy_to_host_async()` after the step, `float(loss)` after the next one \
is dispatched), or log through `jax.debug.callback`."),
    cupy: Some("Keep the value on the device and read it less often: accumulate per-step values in a CuPy \
array and call .get() / cupy.asnumpy() every N steps or once at the end; when you need it \
sooner, copy it on a stream of your own into pinned memory (cupyx.empty_pinned) and read it \
a step later, after a cupy.cuda.Event recorded behind the copy has completed."),
};

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Data {
    /// Device-to-host copies of at most MAX_READ_BYTES at the line.
    pub reads: u64,
    /// Largest of them, bytes.
    pub max_bytes: u64,
    /// Reads after which the device idled (gap of at least MIN_GAP_NS).
    pub reads_then_idle: u64,
    /// Idle after them, ns (the impact), and its median per read.
    pub idle_ns: u64,
    pub median_idle_ns: u64,
}

#[derive(Default)]
struct Line {
    reads: u64,
    max_bytes: u64,
    /// (copy end, idle after it) of reads followed by idle.
    idle: Vec<(u64, u64)>,
    first: u64,
    last: u64,
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let m = cx.m;
    // Lines a host-blocking sync also has: in-loop-sync / blocking-copy report those.
    let synced: HashSet<LocIx> = m
        .syncs()
        .zip(cx.sync_locs.iter())
        .filter(|(s, _)| s.kind.blocks_host())
        .filter_map(|(_, &l)| l)
        .collect();
    let mut lines: HashMap<LocIx, Line> = HashMap::new();
    for c in m.copies() {
        let CopyOp::Memcpy { kind, .. } = c.op else {
            continue;
        };
        if kind != CopyKind::DtoH || c.bytes > MAX_READ_BYTES {
            continue;
        }
        let Some(loc) = c.corr.known().and_then(|c| cx.callsite_loc(c)) else {
            continue;
        };
        if cx.is_driver_internal(loc) || synced.contains(&loc) {
            continue;
        }
        let l = lines.entry(loc).or_insert_with(|| Line {
            first: c.start,
            ..Line::default()
        });
        l.reads += 1;
        l.max_bytes = l.max_bytes.max(c.bytes);
        l.first = l.first.min(c.start);
        l.last = l.last.max(c.end);
        let idle = cx.observed_idle_after(Some(c.dev), c.end);
        if idle >= MIN_GAP_NS {
            l.idle.push((c.end, idle));
        }
    }
    let mut out = Vec::new();
    let mut locs: Vec<(LocIx, Line)> = lines.into_iter().collect();
    locs.sort_unstable_by_key(|(loc, _)| *loc);
    for (loc, l) in locs {
        // The idle after the line's last read is what follows the loop, not the loop's cost.
        let mut gaps: Vec<u64> = l
            .idle
            .iter()
            .filter(|&&(end, _)| end < l.last)
            .map(|&(_, g)| g)
            .collect();
        let n_idle = gaps.len() as u64;
        let idle: u64 = gaps.iter().sum();
        let window = cx.gpu_span(l.first, l.last).max(1);
        if n_idle < MIN_READS || (idle as u128) * 100 < window as u128 * MIN_SHARE_PCT as u128 {
            continue;
        }
        gaps.sort_unstable();
        let median = gaps[gaps.len() / 2];
        let location = cx.loc(loc).clone();
        let detail = format!(
            "{} device-to-host copies of at most {} bytes{}: after {n_idle} of them the GPU ran \
             out of work and idled until the host issued more ({} in all, median {} per read, \
             {:.0}% of the span from the first read to the last): the host waited for the value \
             before issuing the next step. The wait is not a CUDA synchronization (the framework \
             polls for the copy to finish), so in-loop-sync does not see it.",
            l.reads,
            l.max_bytes,
            in_function(&location),
            fmt_duration(idle),
            fmt_duration(median),
            share(idle, window) * 100.0
        );
        let title = format!(
            "Host read × {} @ {} · a {}-byte device→host copy, then the GPU idles {} until \
             the next step",
            l.reads,
            location.short(),
            l.max_bytes,
            fmt_duration(idle)
        );
        out.push(
            Insight::new(RULE, location, title, detail, cx.fix(&FIX))
                .count(l.reads)
                .impact(idle, window, cx.wall_ns)
                .gpu_idle(idle)
                .data(Data {
                    reads: l.reads,
                    max_bytes: l.max_bytes,
                    reads_then_idle: n_idle,
                    idle_ns: idle,
                    median_idle_ns: median,
                }),
        );
    }
    out
}
