//! Rule `pageable-async-copy`: `cudaMemcpy*Async` to or from pageable host memory. The driver
//! stages pageable memory through a pinned buffer, so the "async" copy blocks the host and cannot
//! overlap with other work (nsys's `cuda_memcpy_async`).
//!
//! - **Fires** for every copy whose API name contains `Async` (`cudaMemcpyAsync`,
//!   `cuMemcpyDtoHAsync_v2`, …) and one of whose activity records has a pageable source or
//!   destination; one insight per user source line of the call (its `callsite` record).
//! - An operation is one API call (one correlation id): the several activity records CUPTI may
//!   write for one staged copy count once, their bytes and GPU times summed.
//! - **Impact:** host time blocked in those calls (the API records' durations; for a call without
//!   an API record, its GPU copy time as an estimate).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").
//! - Copies that blocking-copy reports as "copy then wait" (`.item()`/`.cpu()`-style: the copy and
//!   a synchronization at the same line) are left to that rule, so that no copy is counted twice.
//! - Copies without a callsite (older sessions, or callsites dropped by the recorder's rate cap)
//!   have no location and are left out: the figures of a line are then lower bounds.

use crate::ids::{CorrId, LocIx};
use crate::insight::{fmt_duration, Insight};
use crate::shared::advice::Fix;
use crate::shared::copies::{
    api_name, bandwidth_gbps, call_ns, copy_calls, copy_then_wait, op_span, plural, where_, window,
    Names, Window,
};
use crate::shared::Ctx;
use gpufl_trace::CopyKind;
use serde::Serialize;
use std::collections::{HashMap, HashSet};

pub(crate) const RULE: &str = "pageable-async-copy";

const FIX: Fix = Fix {
    native: "Allocate the host buffer as pinned (page-locked) memory: cudaMallocHost / cudaHostAlloc (or \
cudaHostRegister an existing buffer). Reuse pinned buffers rather than allocating them per \
copy.",
    python: None,
    torch: Some("Copy from pinned (page-locked) memory: tensor.pin_memory() or DataLoader(pin_memory=True), \
then .to(device, non_blocking=True). Reuse pinned tensors rather than pinning them per copy."),
    jax: Some("Copies from NumPy arrays in pageable memory are staged by the host: transfer data once \
(jax.device_put outside the step) and keep it on the device, or prefetch the next batch with \
jax.device_put while the current step runs, so that the copy overlaps the work."),
    cupy: Some("Copy from pinned (page-locked) memory: allocate the host array with cupyx.empty_pinned (or \
cupyx.zeros_pinned) and copy it on a stream of your own. Reuse pinned buffers rather than \
allocating them per copy."),
};

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub struct Data {
    /// The API called (the most frequent one when the line mixes several).
    pub api: String,
    /// Bytes copied.
    pub bytes: u64,
    /// Summed GPU time of the copies, ns.
    pub copy_ns: u64,
    /// `bytes / copy_ns`, GB/s (0 when the copies took no measurable time).
    pub bandwidth_gbps: f64,
    pub host_to_device: u64,
    pub device_to_host: u64,
    /// Copies of another direction (host to host, arrays…).
    pub other_direction: u64,
}

#[derive(Default)]
struct Acc {
    count: u64,
    blocked: u64,
    bytes: u64,
    copy_ns: u64,
    h2d: u64,
    d2h: u64,
    other: u64,
    names: Names,
    ops: Vec<(CorrId, u64, u64)>,
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let calls = copy_calls(cx);
    let claimed: HashSet<CorrId> = copy_then_wait(cx, &calls)
        .iter()
        .map(|p| calls[p.call].corr)
        .collect();
    let mut groups: HashMap<LocIx, Acc> = HashMap::new();
    for c in &calls {
        let Some(kind) = c.copy_kind() else { continue };
        if !c.pageable || claimed.contains(&c.corr) {
            continue;
        }
        let Some(name) = api_name(cx, c.corr).filter(|n| n.contains("Async")) else {
            continue;
        };
        let Some(loc) = cx.callsite_loc(c.corr) else {
            continue;
        };
        let g = groups.entry(loc).or_default();
        g.count += 1;
        g.blocked += call_ns(cx, c.corr, c.gpu_ns);
        g.bytes = g.bytes.saturating_add(c.bytes);
        g.copy_ns += c.gpu_ns;
        match kind {
            CopyKind::HtoD | CopyKind::HtoA => g.h2d += 1,
            CopyKind::DtoH | CopyKind::AtoH => g.d2h += 1,
            _ => g.other += 1,
        }
        g.names.add(name);
        g.ops.push(op_span(cx, c.corr, c.start, c.end));
    }
    groups
        .into_iter()
        .map(|(loc, mut g)| {
            let w = window(cx, &mut g.ops);
            insight(cx, loc, g, w)
        })
        .collect()
}

fn insight(cx: &Ctx, loc: LocIx, g: Acc, w: Window) -> Insight {
    let location = cx.loc(loc).clone();
    let api = g.names.top();
    let bw = bandwidth_gbps(g.bytes, g.copy_ns);
    let title = format!(
        "Pageable {api} × {} @ {} · {} host blocked",
        g.count,
        location.short(),
        fmt_duration(g.blocked)
    );
    let detail = format!(
        "{} to or from pageable host memory {}: {} bytes in {} of GPU copy time ({bw:.2} GB/s); \
         the host was blocked {} in the calls ({}), which cannot overlap with other work while the \
         driver stages the data through a pinned buffer",
        plural(g.count, "copy", "copies"),
        where_(cx, loc),
        g.bytes,
        fmt_duration(g.copy_ns),
        fmt_duration(g.blocked),
        w.describe(g.blocked),
    );
    Insight::new(RULE, location, title, detail, cx.fix(&FIX))
        .count(g.count)
        .impact(g.blocked, w.ns, cx.wall_ns)
        .blocked(g.blocked)
        .data(Data {
            api,
            bytes: g.bytes,
            copy_ns: g.copy_ns,
            bandwidth_gbps: bw,
            host_to_device: g.h2d,
            device_to_host: g.d2h,
            other_direction: g.other,
        })
}
