//! Rule `memory-peak`: each device's highest live memory of the process (`mem` records) and the
//! lines holding it then, with the memory over time.
//!
//! - **Fires** per device with allocations.
//! - **Severity:** by the ranking's one formula: **impact** 0 (information), so LOW; the title
//!   says when the peak is at least [`NEAR_PCT`] % of the device's memory (telemetry's
//!   `mem_total`, else the header's).
//! - **Figures:** the peak and when, the largest holders by allocating line, the live bytes by
//!   what they are for ([`memory::Role`]: weights, optimizer state, gradients, activations), live bytes at the
//!   end, allocations and frees, the busiest line by allocations and frees per second (churn), and
//!   the memory over time ([`crate::shared::memory::MAX_SERIES_POINTS`] points at most, each the
//!   highest of its stretch: `[ns after the first record, live bytes]`).
//! - **Location:** the largest holder's line (the device when it has no stack).

use crate::insight::Insight;
use crate::shared::memory::{self, fmt_bytes, holders_data, holders_text, HolderData};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use serde::Serialize;

pub(crate) const RULE: &str = "memory-peak";
/// Peak share of the device's memory (percent) from which the finding is MEDIUM.
pub const NEAR_PCT: u64 = 90;
/// Holders named, at most.
pub const TOP_HOLDERS: usize = 5;

/// The line with the most allocations and frees per second.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Churn {
    pub location: String,
    pub allocs: u64,
    pub frees: u64,
    pub per_s: f64,
}

/// Live bytes at the peak for one purpose ([`memory::Role`]).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct RoleData {
    pub role: memory::Role,
    pub bytes: u64,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    pub device: u32,
    pub peak_bytes: u64,
    pub peak_offset_ns: i64,
    pub total_bytes: Option<u64>,
    pub peak_share: Option<f64>,
    pub end_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
    pub holders: Vec<HolderData>,
    /// The live bytes at the peak by what they are for (weights, optimizer state, gradients,
    /// activations, other), largest first; empty (left out) when nothing but "other" was found.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<RoleData>,
    pub churn: Option<Churn>,
    /// `[ns after the first record, live bytes]`.
    pub series: Vec<[i64; 2]>,
}

const FIX: &str = "To lower the peak, shrink its largest holders: the batch or sequence behind \
activations, optimizer state (a fused or 8-bit optimizer, sharding), weights (lower precision); free \
what a step no longer needs before the next allocates.";

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let scan = memory::scan(cx);
    scan.devices
        .iter()
        .filter(|d| d.allocs > 0)
        .map(|d| {
            let holders = holders_data(cx, &d.holders, TOP_HOLDERS);
            let total = memory::device_total(cx, d.dev);
            let share = total.map(|t| d.peak_bytes as f64 / t.max(1) as f64);
            let near = total.is_some_and(|t| d.peak_bytes as u128 * 100 >= t as u128 * NEAR_PCT as u128);
            let churn = scan
                .lines
                .iter()
                .filter(|l| l.dev == d.dev && l.frees > 0)
                .max_by(|a, b| a.churn_per_s().total_cmp(&b.churn_per_s()))
                .map(|l| Churn {
                    location: l
                        .loc
                        .map_or_else(|| "(no stack)".to_string(), |x| cx.loc(x).short()),
                    allocs: l.allocs,
                    frees: l.frees,
                    per_s: l.churn_per_s(),
                });
            let loc = d.holders.first().and_then(|h| h.loc).map_or_else(
                || SourceLoc::device(d.dev),
                |l| cx.loc(l).clone(),
            );
            let title = format!(
                "Memory peak on GPU {} · {} live{}",
                d.dev,
                fmt_bytes(d.peak_bytes),
                share
                    .map(|s| format!(
                        " ({:.0}% of the device{})",
                        s * 100.0,
                        if near { ": close to running out" } else { "" }
                    ))
                    .unwrap_or_default()
            );
            let mut detail = format!(
                "The process's allocations peaked at {} ({} allocations, {} frees; {} live at the end)",
                fmt_bytes(d.peak_bytes),
                d.allocs,
                d.frees,
                fmt_bytes(d.end_bytes)
            );
            if !holders.is_empty() {
                detail += &format!("; held at the peak by: {}", holders_text(&holders));
            }
            let roles: Vec<RoleData> = if d.roles.iter().any(|r| r.0 != memory::Role::Other) {
                d.roles
                    .iter()
                    .map(|&(role, bytes)| RoleData { role, bytes })
                    .collect()
            } else {
                Vec::new()
            };
            if !roles.is_empty() {
                detail += &format!(
                    "; by what it is for: {}",
                    roles
                        .iter()
                        .map(|r| format!("{} {}", r.role.label(), fmt_bytes(r.bytes)))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            if let Some(c) = &churn {
                detail += &format!(
                    "; most churn: {} ({:.0} allocations and frees per second)",
                    c.location, c.per_s
                );
            }
            Insight::new(RULE, loc, title, detail, FIX)
                .count(d.allocs)
                .data(Data {
                    device: d.dev,
                    peak_bytes: d.peak_bytes,
                    peak_offset_ns: memory::offset_ns(cx, d.peak_ts),
                    total_bytes: total,
                    peak_share: share,
                    end_bytes: d.end_bytes,
                    allocs: d.allocs,
                    frees: d.frees,
                    holders,
                    roles,
                    churn,
                    series: d
                        .series
                        .iter()
                        .map(|&(t, b)| [memory::offset_ns(cx, t), b as i64])
                        .collect(),
                })
        })
        .collect()
}
