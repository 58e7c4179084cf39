//! Rule `blocking-call`: CUDA calls other than launches, copies and synchronizations that held
//! the host (`hostcall` records: allocations and frees, pinned-host allocations, module loads,
//! graph instantiation, stream and event lifecycle, device configuration) while the GPU idled —
//! most often an implicit synchronization in a loop (`cudaFree` waits for the device).
//!
//! - **Per (user line, call):** the hostcalls whose stack has that user line (with the library
//!   line beside it), by function name: count, host time (`end - start`), the longest, the bytes
//!   asked for, and the **GPU idle they caused**: the device's idle time overlapping each call
//!   (the call's context's device, all devices together when unknown; inside the device's active
//!   range, GPU-unobserved time left out). The Python API that made the call is named when the
//!   stack says (`torch.cuda.empty_cache()`, CuPy's pool `free_all_blocks()`).
//! - **What each call is** (`shared::host::calls::CallKind`): the known implicit synchronizers (`cudaFree` /
//!   `cuMemFree` wait for the device to finish its work; `cudaFreeHost`, `cudaMallocHost` /
//!   `cudaHostAlloc`, `cudaHostRegister` synchronize too), allocations, module loads, graph
//!   instantiation, stream and event lifecycle, device configuration, each with its fix.
//! - **Fires** with at least [`MIN_CALLS`] calls, GPU idle of at least [`MIN_SHARE_PCT`] % of the
//!   window (the line's span: first call's start to last call's end) and of at least
//!   [`MIN_ACTIVE_PCT`] % of the devices' observed active time; or, for a call that synchronizes
//!   and left the device some idle, host time in the calls above both shares (the device stayed
//!   busy through most of the waits, but the host could not queue work ahead of it across them). **Impact:** the GPU idle they
//!   caused (`gpu_idle_ns`); `blocked_ns` is their host time.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//!
//! Category SYNCHRONIZATION: these are calls that hold the host thread, most of them because
//! they synchronize implicitly; the dashboard lists them beside the explicit synchronizations
//! (sync-attribution, in-loop-sync). The idle gaps they leave are also in `gpu-idle`, whose
//! finding names the call as what the host was doing (docs/insights.md).

use crate::ids::{LocIx, StackIx};
use crate::insight::{fmt_duration, in_function, share, Insight};
use crate::shared::host::calls::{python_api, CallKind, FIX_CUPY_POOL, FIX_EMPTY_CACHE};
use crate::shared::host::gpu_idle_in;
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use serde::Serialize;
use std::collections::HashMap;

pub(crate) const RULE: &str = "blocking-call";
/// Fewest calls at a (line, call) for an insight.
pub const MIN_CALLS: u64 = 3;
/// Least share (percent) of the line's span the GPU idle must reach.
pub const MIN_SHARE_PCT: u64 = 5;
/// Least share (percent) of the devices' observed active time the GPU idle must reach.
pub const MIN_ACTIVE_PCT: u64 = 1;

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    /// The CUDA function (`cudaFree`).
    pub call: String,
    pub kind: CallKind,
    /// Whether it synchronizes with the device (an implicit synchronization).
    pub synchronizes: bool,
    /// The Python API that made the call, when its stack says (`torch.cuda.empty_cache()`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    pub calls: u64,
    /// Host time in the calls, and the longest, ns.
    pub host_ns: u64,
    pub max_ns: u64,
    /// The device's idle time overlapping the calls, ns.
    pub gpu_idle_ns: u64,
    /// A synchronizing call: the device's idle time from the end of each call that waited for
    /// work on it until its next work started (the call drained the queue, so the device
    /// restarted only when the host issued again), ns. Part of the GPU idle it caused.
    pub idle_after_ns: u64,
    /// Bytes asked for (allocation calls whose parameters say), summed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
}

#[derive(Default)]
struct Group {
    calls: u64,
    host: u64,
    max: u64,
    idle: u64,
    /// Idle after the calls that waited for device work (see [`Data::idle_after_ns`]).
    after: u64,
    bytes: Option<u64>,
    first: u64,
    last: u64,
    /// A stack of one of its calls (the first), for the Python API that made it.
    stack: Option<StackIx>,
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let m = cx.m;
    if m.hostcall_count() == 0 {
        return Vec::new();
    }
    let mut groups: HashMap<(Option<LocIx>, u32), Group> = HashMap::new();
    for h in m.hostcalls() {
        let loc = h.stack.and_then(|s| cx.stack_loc(s));
        let dev = h.ctx.and_then(|c| m.device_of_ctx(c));
        let end = h.end.max(h.start);
        let g = groups.entry((loc, h.name.0)).or_insert_with(|| Group {
            first: h.start,
            stack: h.stack,
            ..Group::default()
        });
        g.calls += 1;
        g.host += end - h.start;
        g.max = g.max.max(end - h.start);
        let idle = gpu_idle_in(cx, dev, h.start, end);
        g.idle += idle;
        // The device had work during the call (it was not idle throughout): the idle from the
        // call's return until the next work is the drain's restart.
        if idle < end - h.start {
            g.after += cx.observed_idle_after(dev, end);
        }
        g.first = g.first.min(h.start);
        g.last = g.last.max(end);
        if g.stack.is_none() {
            g.stack = h.stack;
        }
        if let Some(b) = h.bytes {
            g.bytes = Some(g.bytes.unwrap_or(0).saturating_add(b));
        }
    }
    // Only a synchronizing call drains the device: the others keep only the idle inside them.
    for ((_, name), g) in groups.iter_mut() {
        if !synchronizes(cx, m.str(gpufl_trace::StrId(*name)), g.stack) {
            g.after = 0;
        }
    }
    let active = observed_active_ns(cx);
    let mut fired: Vec<((Option<LocIx>, u32), Group)> = groups
        .into_iter()
        .filter(|((_, name), g)| {
            let caused = g.idle + g.after;
            let window = cx.gpu_span(g.first, g.last).max(caused);
            let idle_enough = caused > 0
                && caused as u128 * 100 >= window as u128 * MIN_SHARE_PCT as u128
                && caused as u128 * 100 >= active as u128 * MIN_ACTIVE_PCT as u128;
            // An implicit synchronization in a loop that holds the host for a good share of
            // the line's span is named even while the GPU stays busy through most of it: the
            // host cannot queue work ahead of the device across it, and the device drained.
            let host_enough = caused > 0
                && synchronizes(cx, m.str(gpufl_trace::StrId(*name)), g.stack)
                && g.host as u128 * 100 >= window as u128 * MIN_SHARE_PCT as u128
                && g.host as u128 * 100 >= active as u128 * MIN_ACTIVE_PCT as u128;
            g.calls >= MIN_CALLS && (idle_enough || host_enough)
        })
        .collect();
    // A stable order (the map's is not): by line, then call name.
    fired.sort_by(|a, b| {
        (a.0 .0.is_none(), a.0 .0, m.str(gpufl_trace::StrId(a.0 .1))).cmp(&(
            b.0 .0.is_none(),
            b.0 .0,
            m.str(gpufl_trace::StrId(b.0 .1)),
        ))
    });
    fired
        .into_iter()
        .map(|((loc, name), g)| insight(cx, loc, m.str(gpufl_trace::StrId(name)), &g))
        .collect()
}

/// Whether a call named `call` (with a stack of it) synchronizes with the device: its kind, or the
/// Python API that made it (a pool's free).
fn synchronizes(cx: &Ctx, call: &str, stack: Option<StackIx>) -> bool {
    CallKind::of(call).synchronizes() || python_api(cx, stack).is_some()
}

/// The devices' active ranges (first op's start to last op's end), less GPU-unobserved time.
fn observed_active_ns(cx: &Ctx) -> u64 {
    cx.m.devices()
        .iter()
        .map(|&d| {
            let iv = cx.busy.intervals(Some(d));
            match (iv.first(), iv.last()) {
                (Some(a), Some(b)) => (b.1 - a.0).saturating_sub(cx.m.unobserved_in(a.0, b.1)),
                _ => 0,
            }
        })
        .sum()
}

fn insight(cx: &Ctx, loc: Option<LocIx>, call: &str, g: &Group) -> Insight {
    let kind = CallKind::of(call);
    let via = python_api(cx, g.stack);
    let location = loc.map_or_else(SourceLoc::driver_internal, |l| cx.loc(l).clone());
    let caused = g.idle + g.after;
    let window = cx.gpu_span(g.first, g.last).max(caused);
    let at = if location.is_unattributed() {
        String::new()
    } else {
        format!(" @ {}", location.short())
    };
    let name = match via {
        Some(api) => format!("{call} ({api})"),
        None => call.to_string(),
    };
    let after_title = if g.after > 0 {
        format!(" and {} after it", fmt_duration(g.after))
    } else {
        String::new()
    };
    let title = format!(
        "Blocking call × {}{at} · {name} held the host {}, the GPU idle {} of it{after_title} ({:.1}% of the line's span)",
        g.calls,
        fmt_duration(g.host),
        fmt_duration(g.idle),
        share(caused, window) * 100.0
    );
    let what = match via {
        Some("torch.cuda.empty_cache()") => {
            "torch.cuda.empty_cache() hands the caching allocator's free blocks back \
with cudaFree, which waits for the device to finish all its work (an implicit synchronization)"
                .to_string()
        }
        Some(api) => format!("{api} frees its blocks with {call}, which {}", kind.what()),
        None => format!("{call} {}", kind.what()),
    };
    let where_ = if location.is_unattributed() {
        String::new()
    } else {
        format!(" at {}{}", location.short(), in_function(&location))
    };
    let bytes = g
        .bytes
        .map(|b| format!(", {} asked for", fmt_bytes(b)))
        .unwrap_or_default();
    let detail = format!(
        "{what}: {} call{}{where_} held the thread {} in all (longest {}{bytes}), and the GPU was idle for {} of that \
         time ({:.0}% of it): the device waited while the host was inside the call{}",
        g.calls,
        if g.calls == 1 { "" } else { "s" },
        fmt_duration(g.host),
        fmt_duration(g.max),
        fmt_duration(g.idle),
        share(g.idle, g.host) * 100.0,
        if g.after > 0 {
            format!(
                "; the call drained the device, which then stayed idle {} more until the host issued work again",
                fmt_duration(g.after)
            )
        } else {
            String::new()
        }
    );
    let fix = match via {
        Some("torch.cuda.empty_cache()") => FIX_EMPTY_CACHE,
        Some(_) => FIX_CUPY_POOL,
        None => cx.fix(kind.fix()),
    };
    Insight::new(RULE, location, title, detail, fix)
        .count(g.calls)
        .impact(caused, window, cx.wall_ns)
        .blocked(g.host)
        .gpu_idle(caused)
        .data(Data {
            call: call.to_string(),
            kind,
            synchronizes: kind.synchronizes() || via.is_some(),
            via: via.map(str::to_string),
            calls: g.calls,
            host_ns: g.host,
            max_ns: g.max,
            gpu_idle_ns: g.idle,
            idle_after_ns: g.after,
            bytes: g.bytes,
        })
}

/// `16.0 MiB`.
fn fmt_bytes(b: u64) -> String {
    let f = b as f64;
    if b >= 1 << 30 {
        format!("{:.1} GiB", f / (1u64 << 30) as f64)
    } else if b >= 1 << 20 {
        format!("{:.1} MiB", f / (1u64 << 20) as f64)
    } else if b >= 1 << 10 {
        format!("{:.1} KiB", f / 1024.0)
    } else {
        format!("{b} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_for_prose() {
        assert_eq!(fmt_bytes(16 << 20), "16.0 MiB");
        assert_eq!(fmt_bytes(3 << 30), "3.0 GiB");
        assert_eq!(fmt_bytes(2048), "2.0 KiB");
        assert_eq!(fmt_bytes(12), "12 B");
    }
}
