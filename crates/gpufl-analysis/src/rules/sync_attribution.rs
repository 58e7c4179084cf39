//! Rule `sync-attribution`: every synchronization with a stack, grouped by (kind, user source
//! location); one insight per group.
//!
//! - **Fires** whenever stacks were captured and any synchronization happened (syncs without a
//!   stack are left out: they have no location).
//! - **Impact:** the group's host-side time in the calls (for StreamWaitEvent the enqueue only:
//!   the wait itself happens on the device).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//! - Syncs with no user frame group under `<driver-internal>`.

use crate::ids::LocIx;
use crate::insight::{fmt_duration, in_function, share, Insight};
use crate::shared::advice::Fix;
use crate::shared::Ctx;
use crate::views::sync_kind_from_u8;
use gpufl_trace::SyncKind;
use std::collections::HashMap;

pub(crate) const RULE: &str = "sync-attribution";

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    // (kind, location) -> (count, host time)
    let mut groups: HashMap<(u8, LocIx), (u64, u64)> = HashMap::new();
    let s = &cx.m.syncs;
    for (i, &loc) in cx.sync_locs.iter().enumerate() {
        let Some(loc) = loc else { continue };
        let g = groups.entry((s.kind.get(i), loc)).or_default();
        g.0 += 1;
        g.1 += s.end.get(i).saturating_sub(s.start.get(i));
    }
    groups
        .into_iter()
        .map(|((kind, loc), (count, blocked))| {
            insight(cx, sync_kind_from_u8(kind), loc, count, blocked)
        })
        .collect()
}

fn insight(cx: &Ctx, kind: SyncKind, loc: LocIx, count: u64, blocked: u64) -> Insight {
    let location = cx.loc(loc).clone();
    let share_of_wall = share(blocked, cx.wall_ns);
    let title = format!(
        "{} × {count} @ {} · {} ({:.1}% of session)",
        kind.display_name(),
        location.short(),
        fmt_duration(blocked),
        share_of_wall * 100.0
    );
    let calls = if count == 1 { "call" } else { "calls" };
    let detail = if kind == SyncKind::StreamWaitEvent {
        format!(
            "{} spent enqueuing {count} device-side waits at {}{} (the host is not blocked; the waiting stream is)",
            fmt_duration(blocked),
            location.short(),
            in_function(&location)
        )
    } else if cx.is_driver_internal(loc) {
        format!(
            "{} blocked across {count} {calls} with no frame of your code on the stack (issued by the CUDA runtime or a framework)",
            fmt_duration(blocked)
        )
    } else {
        format!(
            "{} blocked across {count} {calls} at {}{}",
            fmt_duration(blocked),
            location.short(),
            in_function(&location)
        )
    };
    Insight::new(RULE, location, title, detail, cx.fix(fix(kind)))
        .count(count)
        .impact(blocked, cx.wall_ns, cx.wall_ns)
        .blocked(blocked)
        .sync_kind(Some(kind))
}

const CONTEXT_SYNC: Fix = Fix {
    native: "Synchronize on the narrowest thing you need: an event (cudaEventSynchronize) or one stream \
(cudaStreamSynchronize) rather than the whole device (cudaDeviceSynchronize waits for every \
stream); sync later, or not at all.",
    python: None,
    torch: Some("Synchronize on the narrowest thing you need: an event (torch.cuda.Event(...).synchronize()) \
or one stream (torch.cuda.current_stream().synchronize()) rather than the whole device \
(torch.cuda.synchronize() waits for every stream); sync later, or not at all — a value read \
with .item()/.cpu() every step is a sync every step."),
    jax: Some("Wait on the narrowest thing you need: x.block_until_ready() on the arrays whose values you \
read rather than on all the device's work, later, or not at all — a value converted to \
Python or NumPy (float(x), np.asarray(x), print) every step is a sync every step."),
    cupy: Some("Synchronize on the narrowest thing you need: an event (cupy.cuda.Event: record(), then \
synchronize()) or one stream (stream.synchronize()) rather than the whole device \
(cupy.cuda.Device().synchronize() waits for every stream); sync later, or not at all — a \
value read with .get() or cupy.asnumpy() every step is a sync every step."),
};

const STREAM_SYNC: Fix = Fix {
    native: "Wait later and on less: record an event after the work whose results you need and wait on it \
(cudaEventSynchronize), or order GPU work with cudaStreamWaitEvent, which does not block the \
host.",
    python: None,
    torch: Some("Wait later and on less: record a torch.cuda.Event after the work whose results you need and \
wait on it (event.synchronize()), or order GPU work with stream.wait_event(event), which \
does not block the host; a value read with .item()/.cpu() every step is a sync every step."),
    jax: Some("Wait later and on less: read values on the host (float(x), np.asarray(x), print, \
block_until_ready()) every N steps rather than every step, and after the next step is \
dispatched; each read waits for the work that produces it."),
    cupy: Some("Wait later and on less: record a cupy.cuda.Event after the work whose results you need and \
wait on it (event.synchronize()), or order GPU work with stream.wait_event(event), which \
does not block the host; a value read with .get() every step is a sync every step."),
};

const EVENT_SYNC: Fix = Fix::any(
    "Record the event right after the work you need and wait as late as possible; to order work \
     between streams use cudaStreamWaitEvent, which does not block the host.",
);

const STREAM_WAIT: Fix = Fix::any(
    "A device-side wait: the host is not blocked, but the waiting stream idles until the event; record \
     the event earlier or split the producer's work so the consumer can start sooner.",
);

const UNKNOWN_SYNC: Fix = Fix::any(
    "Synchronize later, less often, or on less (an event rather than a stream, a stream rather than \
     the device).",
);

/// The fix of a sync kind.
fn fix(kind: SyncKind) -> &'static Fix {
    match kind {
        SyncKind::ContextSynchronize => &CONTEXT_SYNC,
        SyncKind::StreamSynchronize => &STREAM_SYNC,
        SyncKind::EventSynchronize => &EVENT_SYNC,
        SyncKind::StreamWaitEvent => &STREAM_WAIT,
        SyncKind::Unknown => &UNKNOWN_SYNC,
    }
}
