//! Rule `memory-leak`: a line whose live memory rises with the iterations and never returns
//! (`mem` records: allocations matched to their frees by address, by allocating line).
//!
//! - **Fires** per (device, line with a stack) that made at least [`MIN_ALLOCS`] allocations,
//!   whose live bytes reached a new high after at least [`MIN_RISING`] of them (a steady rise, not
//!   one that returns each iteration), held at the end at least [`MIN_KEPT`] of its highest, and
//!   grew by at least [`MIN_GROWTH_BYTES`] from its first allocation to the end.
//! - **Figures:** growth in all, per allocation (≈ per iteration of the loop that allocates) and
//!   per second, live bytes at the end, allocations and frees.
//! - **Severity:** by the ranking's one formula (docs/insights.md "Ranking and severity"):
//!   **impact** 0 (a risk, not time lost; `out-of-memory` carries the crash's, and a leak at the
//!   failing line is a facet of that finding: both are the device-memory cause), so LOW.
//! - **Location:** the allocating line.

use crate::insight::{fmt_duration, Insight};
use crate::shared::memory::{self, fmt_bytes, LineMem};
use crate::shared::Ctx;
use serde::Serialize;

pub(crate) const RULE: &str = "memory-leak";
/// Allocations a line makes before it can be a leak.
pub const MIN_ALLOCS: u64 = 5;
/// Share of its allocations after which the line's live bytes were a new high.
pub const MIN_RISING: f64 = 0.8;
/// Share of its highest live bytes the line still holds at the end.
pub const MIN_KEPT: f64 = 0.9;
/// Growth from the first allocation to the end, bytes.
pub const MIN_GROWTH_BYTES: u64 = 16 << 20;

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub device: u32,
    pub allocs: u64,
    pub frees: u64,
    /// Live bytes gained from the line's first allocation to the end.
    pub growth_bytes: u64,
    pub growth_per_alloc: u64,
    pub growth_per_s: f64,
    pub end_live_bytes: u64,
    /// From the line's first to its last operation, ns.
    pub span_ns: u64,
}

const FIX: &str = "Something keeps every allocation of this line alive: a list or dict that grows each \
step, a tensor kept with its autograd graph (store loss.item(), detach()), a cache without a bound, or \
a cudaMalloc without its cudaFree. Free it, or allocate once outside the loop and reuse it.";

/// Whether the line's history is a leak.
pub fn is_leak(l: &LineMem) -> bool {
    l.loc.is_some()
        && l.allocs >= MIN_ALLOCS
        && l.new_highs as f64 >= MIN_RISING * l.allocs as f64
        && l.end_live as f64 >= MIN_KEPT * l.max_live as f64
        && l.growth() >= MIN_GROWTH_BYTES
}

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let scan = memory::scan(cx);
    scan.lines
        .iter()
        .filter(|l| is_leak(l))
        .map(|l| {
            let loc = cx.loc(l.loc.expect("a leak has a line")).clone();
            let span = l.last_ts.saturating_sub(l.first_ts);
            let growth = l.growth();
            let per_alloc = growth / (l.allocs - 1).max(1);
            let per_s = if span > 0 {
                growth as f64 * 1e9 / span as f64
            } else {
                0.0
            };
            let oom = scan.failures.iter().any(|f| f.dev == l.dev);
            let title = format!(
                "Memory grows at {} on GPU {} · +{} over {} allocations, never freed",
                loc.short(),
                l.dev,
                fmt_bytes(growth),
                l.allocs
            );
            let detail = format!(
                "Its live memory rose after {} of {} allocations and was still {} at the end \
                 ({} per allocation, {}/s over {}); {} of its allocations were freed{}",
                l.new_highs,
                l.allocs,
                fmt_bytes(l.end_live),
                fmt_bytes(per_alloc),
                fmt_bytes(per_s as u64),
                fmt_duration(span),
                l.frees,
                if oom {
                    "; the device ran out of memory"
                } else {
                    ""
                }
            );
            Insight::new(RULE, loc, title, detail, FIX)
                .count(l.allocs)
                .window(span)
                .data(Data {
                    device: l.dev,
                    allocs: l.allocs,
                    frees: l.frees,
                    growth_bytes: growth,
                    growth_per_alloc: per_alloc,
                    growth_per_s: per_s,
                    end_live_bytes: l.end_live,
                    span_ns: span,
                })
        })
        .collect()
}
