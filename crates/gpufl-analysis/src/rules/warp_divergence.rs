//! Rule `warp-divergence`: the lanes of a kernel's warps take different paths of its branches,
//! and a warp runs each path in turn with the other lanes masked off.
//!
//! - **From** the kernel's `kdetail` counters (crate::kdetail): active lanes per warp instruction
//!   = `thread_inst / inst` over the instrumented launches (32: no divergence).
//! - **Fires** when a kernel the detail rules look at
//!   ([`looked_at`](crate::shared::detail_site::looked_at): not a vendor library's) has fewer than
//!   [`MAX_LANES`] active lanes per warp instruction and an impact of at least 1 % of its
//!   device's busy time.
//! - **Location:** the line inside the kernel whose branches split warps most often
//!   (`branch_divergent`: the branch itself, `kernel_detail.cu:56`) when the recorder counted
//!   branches; else the line with the most lost lane-slots (`inst × 32 − thread_inst`). The lines
//!   where the lanes are lost, with their own lanes (`kernel_detail.cu:48: 16 of 32 lanes
//!   active`), are in the detail, and the launch line beside it (see `detail_site`).
//! - **Impact:** the kernel's GPU time × (1 − lanes / 32): an estimate and an upper bound (the
//!   share of issue slots the idle lanes waste; a kernel bound by memory gains less).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::insight::Insight;
use crate::kdetail::{DetailLine, WARP};
use crate::kernels::KernelTable;
use crate::shared::detail_site::{self, at_most, describe, launched, no_line_note, short, Site};
use crate::shared::timeline::Locator;
use crate::shared::Ctx;
use serde::Serialize;

pub(crate) const RULE: &str = "warp-divergence";
/// Fewer active lanes per warp instruction than this fires (28 of 32: a warp with 4 lanes idle on
/// every instruction, 12.5 % of its issue slots).
pub const MAX_LANES: f64 = 28.0;
/// Lines listed in the detail and the data.
const LINES: usize = 5;

/// One line inside the kernel and its lanes.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LineLanes {
    pub file: String,
    pub line: u32,
    pub inst: u64,
    /// Active lanes per warp instruction at the line.
    pub lanes: f64,
    /// `inst × 32 − thread_inst` at the line.
    pub lost_lane_slots: u64,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    #[serde(flatten)]
    pub site: Site,
    /// Active lanes per warp instruction over the kernel, and the counts it comes from.
    pub lanes: f64,
    pub inst: u64,
    pub thread_inst: u64,
    /// The kernel's lost lane-slots, and the share of them at the located line.
    pub lost_lane_slots: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_lanes: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_share: Option<f64>,
    /// The lines with the most lost lane-slots, most first (at most 5).
    pub lines: Vec<LineLanes>,
    /// The branch that splits warps most often (`file:line`), when branches were counted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch_line: Option<String>,
    /// Uniform branch executions over all (Nsight Compute's branch efficiency / 100).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branch_efficiency: Option<f64>,
    pub recoverable_ns: u64,
}

/// `16` or `16.2`: lanes without a needless decimal.
pub(crate) fn fmt_lanes(l: f64) -> String {
    if (l - l.round()).abs() < 0.05 {
        format!("{:.0}", l.round())
    } else {
        format!("{l:.1}")
    }
}

fn line_lanes(l: &DetailLine) -> LineLanes {
    LineLanes {
        file: l.file.clone(),
        line: l.line,
        inst: l.counts.inst,
        lanes: l.counts.lanes().unwrap_or(WARP),
        lost_lane_slots: l.counts.lost_lanes(),
    }
}

fn base(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

pub(crate) fn run(cx: &Ctx, table: &KernelTable) -> Vec<Insight> {
    let locator = Locator::new(cx);
    let mut out = Vec::new();
    for (row, d) in detail_site::with_detail(cx, table) {
        let Some(lanes) = d.totals.lanes() else {
            continue;
        };
        if lanes >= MAX_LANES {
            continue;
        }
        let impact = detail_site::part(row.total_ns, 1.0 - lanes / WARP);
        if !detail_site::worth(impact, row) {
            continue;
        }
        let mut lines: Vec<&DetailLine> = d
            .lines
            .iter()
            .filter(|l| l.counts.inst > 0 && l.counts.lost_lanes() > 0)
            .collect();
        lines.sort_by(|a, b| {
            b.counts
                .lost_lanes()
                .cmp(&a.counts.lost_lanes())
                .then_with(|| (&a.file, a.line).cmp(&(&b.file, b.line)))
        });
        lines.truncate(LINES);
        let top = lines.first().copied();
        // The branch that splits warps most often, when branches were counted.
        let branch = d
            .lines
            .iter()
            .filter(|l| l.counts.branch_divergent > 0)
            .max_by(|a, b| {
                a.counts
                    .branch_divergent
                    .cmp(&b.counts.branch_divergent)
                    .then_with(|| (&b.file, b.line).cmp(&(&a.file, a.line)))
            });
        let located = branch.or(top);
        let (loc, site) = detail_site::site(
            &locator,
            row,
            located.map(|l| (l.file.as_str(), l.line)),
            (d.launches, d.records, d.lineinfo),
        );
        let lost = d.totals.lost_lanes();
        let line_lanes_v = top.and_then(|l| l.counts.lanes());
        let line_share = top.map(|l| crate::insight::share(l.counts.lost_lanes(), lost));
        let lanes_s = fmt_lanes(lanes);
        let efficiency = d.totals.branch_efficiency();
        let title = match (branch, top, line_lanes_v) {
            (Some(b), _, _) => format!(
                "Warp divergence × {}{} · {}: the branch here splits warps ({} of {} executions), {} of 32 lanes active over the kernel · {} recoverable",
                row.launches,
                detail_site::at(&loc),
                short(row),
                b.counts.branch_divergent,
                b.counts
                    .branch_divergent
                    .saturating_add(b.counts.branch_uniform),
                lanes_s,
                at_most(impact)
            ),
            (None, Some(_), Some(ll)) => format!(
                "Warp divergence × {}{} · {}: {} of 32 lanes active there ({} over the kernel) · {} recoverable",
                row.launches,
                detail_site::at(&loc),
                short(row),
                fmt_lanes(ll),
                lanes_s,
                at_most(impact)
            ),
            _ => format!(
                "Warp divergence × {}{} · {}: {} of 32 lanes active per warp instruction · {} recoverable",
                row.launches,
                detail_site::at(&loc),
                short(row),
                lanes_s,
                at_most(impact)
            ),
        };
        let at_line = match (top, line_lanes_v, line_share) {
            (Some(l), Some(ll), Some(sh)) => {
                let others: Vec<String> = lines[1..]
                    .iter()
                    .map(|o| {
                        format!(
                            "{}:{} ({} lanes)",
                            base(&o.file),
                            o.line,
                            fmt_lanes(o.counts.lanes().unwrap_or(WARP))
                        )
                    })
                    .collect();
                let then = if others.is_empty() {
                    String::new()
                } else {
                    format!("; then {}", others.join(", "))
                };
                let branch_note = match (branch, efficiency) {
                    (Some(b), Some(e)) => format!(
                        " The branch at {}:{} splits warps: {} of its {} executions took two or \
                         more targets (branch efficiency over the kernel {:.2}%).",
                        base(&b.file),
                        b.line,
                        b.counts.branch_divergent,
                        b.counts
                            .branch_divergent
                            .saturating_add(b.counts.branch_uniform),
                        e * 100.0
                    ),
                    _ => " The line where lanes go idle is inside the branch; the branch that \
                          splits the warp is the condition that leads there."
                        .to_string(),
                };
                format!(
                    " Most lane-slots are lost at {}:{}: {} of 32 lanes active there ({:.0}% of \
                     the kernel's lost lane-slots){then}.{branch_note}",
                    base(&l.file),
                    l.line,
                    fmt_lanes(ll),
                    sh * 100.0
                )
            }
            _ => String::new(),
        };
        let detail = format!(
            "{}: {lanes_s} of 32 lanes active per warp instruction ({} thread instructions over \
             {} warp instructions, {} instrumented launch(es)). When the lanes of a warp take \
             different paths of a branch, the warp runs each path in turn with the other lanes \
             masked off.{at_line}{}{} Impact: the kernel's GPU time × (1 − {lanes_s}/32) = {}, an \
             estimate and an upper bound (the share of issue slots idle lanes waste; a kernel \
             bound by memory gains less).",
            describe(row),
            d.totals.thread_inst,
            d.totals.inst,
            d.launches,
            launched(&site),
            no_line_note(&site),
            crate::insight::fmt_duration(impact),
        );
        let fix = "Make the 32 lanes of a warp take the same path: sort or bin the data so that \
                   the elements taking one path are adjacent (a warp then diverges once, not on \
                   every element), decide the branch per warp rather than per thread (a condition \
                   on `threadIdx.x / 32` or on data a warp shares), or replace short branches by \
                   arithmetic (a select: `v = c ? a : b` on values computed by every lane). \
                   Lanes idle at the end of loops whose trip count differs per lane call for \
                   balancing the work per lane."
            .to_string();
        let data = Data {
            site,
            lanes,
            inst: d.totals.inst,
            thread_inst: d.totals.thread_inst,
            lost_lane_slots: lost,
            line_lanes: line_lanes_v,
            line_share,
            lines: lines.iter().map(|l| line_lanes(l)).collect(),
            branch_line: branch.map(|b| format!("{}:{}", b.file, b.line)),
            branch_efficiency: efficiency,
            recoverable_ns: impact,
        };
        out.push(detail_site::insight(cx, RULE, row, (title, detail, fix), loc, impact).data(data));
    }
    out
}
