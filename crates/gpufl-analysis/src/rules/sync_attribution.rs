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
    Insight::new(RULE, location, title, detail, fix(kind))
        .count(count)
        .impact(blocked, cx.wall_ns, cx.wall_ns)
        .blocked(blocked)
        .sync_kind(Some(kind))
}

fn fix(kind: SyncKind) -> &'static str {
    match kind {
        SyncKind::ContextSynchronize => {
            "Synchronize on the narrowest thing you need: an event or one stream rather than the whole device \
             (cudaDeviceSynchronize / torch.cuda.synchronize() waits for every stream); sync later, or not at \
             all — a value read with .item()/.cpu() every step is a sync every step."
        }
        SyncKind::StreamSynchronize => {
            "Wait later and on less: record an event after the work whose results you need and wait on it \
             (cudaEventSynchronize), or order GPU work with cudaStreamWaitEvent, which does not block the host; \
             a value read with .item()/.cpu() every step is a sync every step."
        }
        SyncKind::EventSynchronize => {
            "Record the event right after the work you need and wait as late as possible; to order work \
             between streams use cudaStreamWaitEvent, which does not block the host."
        }
        SyncKind::StreamWaitEvent => {
            "A device-side wait: the host is not blocked, but the waiting stream idles until the event; record \
             the event earlier or split the producer's work so the consumer can start sooner."
        }
        SyncKind::Unknown => {
            "Synchronize later, less often, or on less (an event rather than a stream, a stream rather than \
             the device)."
        }
    }
}
