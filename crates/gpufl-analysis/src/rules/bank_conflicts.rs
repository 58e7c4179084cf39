//! Rule `bank-conflicts`: lanes of a warp access different words of one shared-memory bank, and
//! the access is split into several wavefronts that run one after the other.
//!
//! - **From** the kernel's `kdetail` counters (crate::kdetail): shared-memory wavefronts against
//!   the wavefronts without conflicts (`shared_wavefronts_ideal`); the extra wavefronts are the
//!   conflicts. Without the recorder's ideal the rule says nothing (the ideal depends on the
//!   access width: a 16-byte access takes 4 wavefronts without any conflict).
//! - **Fires** when the extra wavefronts are at least [`MIN_SHARE_PCT`] % of the wavefronts, on a
//!   kernel the detail rules look at (not a vendor library's), with an impact of at least 1 % of
//!   its device's busy time.
//! - **Location:** the line inside the kernel with the most extra wavefronts, with its
//!   wavefronts per shared instruction and the ideal; the launch line beside it.
//! - **Impact:** the kernel's GPU time × extra / (warp instructions + extra): each extra
//!   wavefront costs the warp about an issue cycle, as an instruction does; an estimate and an
//!   upper bound (the kernel's time is not all issue). Without instruction counts, × extra /
//!   wavefronts.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::insight::Insight;
use crate::kdetail::DetailCounts;
use crate::kernels::KernelTable;
use crate::shared::detail_site::{self, at_most, describe, launched, no_line_note, short, Site};
use crate::shared::timeline::Locator;
use crate::shared::Ctx;
use serde::Serialize;

pub(crate) const RULE: &str = "bank-conflicts";
/// Extra wavefronts at least this share of all wavefronts fire, percent.
pub const MIN_SHARE_PCT: u64 = 25;

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    #[serde(flatten)]
    pub site: Site,
    pub shared_inst: u64,
    pub wavefronts: u64,
    pub ideal_wavefronts: u64,
    pub extra_wavefronts: u64,
    /// Extra over all wavefronts, 0..1.
    pub conflict_share: f64,
    /// At the located line: wavefronts and the ideal per shared instruction, extra wavefronts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_wavefronts_per_inst: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_ideal_per_inst: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_extra_wavefronts: Option<u64>,
    pub recoverable_ns: u64,
}

fn per_inst(n: u64, c: &DetailCounts) -> Option<f64> {
    (c.shared_inst > 0).then(|| n as f64 / c.shared_inst as f64)
}

pub(crate) fn run(cx: &Ctx, table: &KernelTable) -> Vec<Insight> {
    let locator = Locator::new(cx);
    let mut out = Vec::new();
    for (row, d) in detail_site::with_detail(cx, table) {
        let t = &d.totals;
        let (Some(extra), Some(ideal)) = (t.extra_wavefronts(), t.shared_wavefronts_ideal) else {
            continue;
        };
        let wf = t.shared_wavefronts;
        if wf == 0 || (extra as u128) * 100 < wf as u128 * MIN_SHARE_PCT as u128 {
            continue;
        }
        let share = extra as f64 / wf as f64;
        let weight = if t.inst > 0 {
            extra as f64 / (t.inst as f64 + extra as f64)
        } else {
            share
        };
        let impact = detail_site::part(row.total_ns, weight);
        if !detail_site::worth(impact, row) {
            continue;
        }
        let top = d
            .lines
            .iter()
            .filter_map(|l| Some((l, l.counts.extra_wavefronts().filter(|&x| x > 0)?)))
            .max_by(|(a, x), (b, y)| {
                x.cmp(y)
                    .then_with(|| (&b.file, b.line).cmp(&(&a.file, a.line)))
            });
        let (loc, site) = detail_site::site(
            &locator,
            row,
            top.map(|(l, _)| (l.file.as_str(), l.line)),
            (d.launches, d.records, d.lineinfo),
        );
        let line_figs = top.and_then(|(l, x)| {
            let c = &l.counts;
            Some((
                per_inst(c.shared_wavefronts, c)?,
                per_inst(c.shared_wavefronts_ideal?, c)?,
                x,
            ))
        });
        let what = match line_figs {
            Some((w, i, _)) => {
                format!("{w:.1} wavefronts per shared access there, {i:.1} without conflicts")
            }
            None => match (per_inst(wf, t), per_inst(ideal, t)) {
                (Some(w), Some(i)) => {
                    format!("{w:.1} wavefronts per shared access, {i:.1} without conflicts")
                }
                _ => format!(
                    "{:.0}% of its shared-memory wavefronts are conflicts",
                    share * 100.0
                ),
            },
        };
        let title = format!(
            "Bank conflicts × {}{} · {}: {what} · {} recoverable",
            row.launches,
            detail_site::at(&loc),
            short(row),
            at_most(impact)
        );
        let at_line = match (top, line_figs) {
            (Some((l, _)), Some((w, i, x))) => format!(
                " Most extra wavefronts at {}:{}: {w:.1} per shared access against {i:.1} ({x} \
                 extra, {} of the kernel's).",
                l.file.rsplit('/').next().unwrap_or(&l.file),
                l.line,
                detail_site::pct(x, extra)
            ),
            _ => String::new(),
        };
        let detail = format!(
            "{}: {} shared-memory wavefronts for {} shared accesses, {} without bank conflicts: \
             {extra} extra ({:.1}%), over {} instrumented launch(es). Shared memory has 32 \
             banks of 4-byte words; lanes of a warp that access different words of one bank \
             are served one wavefront after the other.{at_line}{}{} Impact: the kernel's GPU \
             time × extra wavefronts / (warp instructions + extra wavefronts) = {}, an estimate \
             and an upper bound (each extra wavefront costs about an issue cycle).",
            describe(row),
            wf,
            t.shared_inst,
            ideal,
            share * 100.0,
            d.launches,
            launched(&site),
            no_line_note(&site),
            crate::insight::fmt_duration(impact)
        );
        let fix = "Spread a warp's accesses over the 32 banks: pad the shared array by one word a \
                   row (`__shared__ float s[32][33]` instead of `[32][32]`: a column access then \
                   hits 32 banks), or change the index mapping so that consecutive lanes access \
                   consecutive words (or swizzle the index: `col ^ row`); lanes reading the same \
                   word are a broadcast, not a conflict."
            .to_string();
        let data = Data {
            site,
            shared_inst: t.shared_inst,
            wavefronts: wf,
            ideal_wavefronts: ideal,
            extra_wavefronts: extra,
            conflict_share: share,
            line_wavefronts_per_inst: line_figs.map(|f| f.0),
            line_ideal_per_inst: line_figs.map(|f| f.1),
            line_extra_wavefronts: line_figs.map(|f| f.2),
            recoverable_ns: impact,
        };
        out.push(detail_site::insight(cx, RULE, row, (title, detail, fix), loc, impact).data(data));
    }
    out
}
