//! Rule `uncoalesced-access`: a kernel's global loads or stores touch more 32-byte sectors per
//! request than the same bytes need, so memory moves sectors no lane uses.
//!
//! - **From** the kernel's `kdetail` counters (crate::kdetail): sectors per request
//!   (`gld_sectors / gld_inst`, and the same for stores) against the ideal (`gld_sectors_ideal /
//!   gld_inst` when the recorder gives it; else assumed [`ASSUMED_SECTORS_PER_REQUEST`] a
//!   request: 32 lanes × 4 bytes = 128 bytes).
//! - **Fires** when loads or stores take at least [`MIN_RATIO`] × the ideal, on a kernel the
//!   detail rules look at (not a vendor library's), with an impact of at least 1 % of its
//!   device's busy time.
//! - **Without the recorder's ideal** only more than [`WIDE_COALESCED`] sectors per request
//!   proves waste (a coalesced access of 8 or 16 bytes a lane takes 8 or 16); at 8–16 the insight
//!   is a LOW "possible" one that claims no time.
//! - **Location:** the line inside the kernel with the most excess sectors (loads and stores of
//!   the flagged kinds), with its figures (`kernel_detail.cu:81: loads take 32.0 sectors per
//!   request, 4.0 ideal`); the launch line beside it.
//! - **Impact:** the kernel's GPU time × excess sectors / all global sectors: the share of its
//!   memory traffic that is waste; an estimate and an upper bound (for a kernel bound by memory
//!   bandwidth).
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::insight::Insight;
use crate::kdetail::{Access, DetailCounts, ASSUMED_SECTORS_PER_REQUEST};
use crate::kernels::KernelTable;
use crate::shared::detail_site::{self, at_most, describe, launched, no_line_note, short, Site};
use crate::shared::timeline::Locator;
use crate::shared::Ctx;
use serde::Serialize;

pub(crate) const RULE: &str = "uncoalesced-access";
/// Sectors per request at least this many times the ideal fire.
pub const MIN_RATIO: u64 = 2;
/// Sectors per request a coalesced access of up to 16 bytes a lane may take (32 lanes × 16 bytes
/// = 512 bytes): without the recorder's ideal, only more proves waste.
pub const WIDE_COALESCED: f64 = 16.0;

/// Loads or stores of the kernel (or of the located line).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct AccessFigures {
    pub requests: u64,
    pub sectors: u64,
    pub ideal_sectors: u64,
    pub sectors_per_request: f64,
    pub ideal_per_request: f64,
    /// The ideal is assumed (4 sectors a request), the recorder gave none.
    pub ideal_assumed: bool,
    /// At least 2 × the ideal.
    pub flagged: bool,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    #[serde(flatten)]
    pub site: Site,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loads: Option<AccessFigures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stores: Option<AccessFigures>,
    /// Excess sectors of the flagged kinds, and every global sector.
    pub excess_sectors: u64,
    pub sectors: u64,
    /// The located line's figures for its kind with more excess (`load` or `store`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_kind: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line_access: Option<AccessFigures>,
    /// false: only the assumed ideal says the access wastes sectors, and the figures fit a
    /// coalesced access of 8 or 16 bytes a lane (LOW, no time claimed).
    pub proven: bool,
    pub recoverable_ns: u64,
}

fn flagged(a: &Access) -> bool {
    a.requests > 0 && a.ideal > 0 && a.sectors as u128 >= MIN_RATIO as u128 * a.ideal as u128
}

fn figures(a: &Access) -> Option<AccessFigures> {
    Some(AccessFigures {
        requests: a.requests,
        sectors: a.sectors,
        ideal_sectors: a.ideal,
        sectors_per_request: a.per_request()?,
        ideal_per_request: a.ideal_per_request()?,
        ideal_assumed: a.assumed,
        flagged: flagged(a),
    })
}

/// Excess sectors of the kinds flagged on the kernel (`[loads, stores]`).
fn excess(c: &DetailCounts, kinds: [bool; 2]) -> u64 {
    let ld = if kinds[0] {
        c.global(false).excess()
    } else {
        0
    };
    let st = if kinds[1] { c.global(true).excess() } else { 0 };
    ld.saturating_add(st)
}

/// `loads take 32.0 sectors per request, 4.0 ideal`.
fn phrase(kind: &str, f: &AccessFigures) -> String {
    let assumed = if f.ideal_assumed {
        " (assumed: 4-byte accesses)"
    } else {
        ""
    };
    format!(
        "{kind}s take {:.1} sectors per request, {:.1} ideal{assumed}",
        f.sectors_per_request, f.ideal_per_request
    )
}

pub(crate) fn run(cx: &Ctx, table: &KernelTable) -> Vec<Insight> {
    let locator = Locator::new(cx);
    let mut out = Vec::new();
    for (row, d) in detail_site::with_detail(cx, table) {
        let ld = d.totals.global(false);
        let st = d.totals.global(true);
        let kinds = [flagged(&ld), flagged(&st)];
        if !kinds[0] && !kinds[1] {
            continue;
        }
        let all = ld.sectors.saturating_add(st.sectors);
        let waste = excess(&d.totals, kinds);
        let potential = detail_site::part(row.total_ns, crate::insight::share(waste, all.max(1)));
        if !detail_site::worth(potential, row) {
            continue;
        }
        let proves = |a: &Access| !a.assumed || a.per_request().is_some_and(|p| p > WIDE_COALESCED);
        let proven = (kinds[0] && proves(&ld)) || (kinds[1] && proves(&st));
        let impact = if proven { potential } else { 0 };
        // The line with the most excess sectors of the flagged kinds.
        let top = d
            .lines
            .iter()
            .filter(|l| excess(&l.counts, kinds) > 0)
            .max_by(|a, b| {
                excess(&a.counts, kinds)
                    .cmp(&excess(&b.counts, kinds))
                    .then_with(|| (&b.file, b.line).cmp(&(&a.file, a.line)))
            });
        let line_kind_figs = top.and_then(|l| {
            let (lx, sx) = (
                if kinds[0] {
                    l.counts.global(false).excess()
                } else {
                    0
                },
                if kinds[1] {
                    l.counts.global(true).excess()
                } else {
                    0
                },
            );
            if lx >= sx {
                Some(("load", figures(&l.counts.global(false))?))
            } else {
                Some(("store", figures(&l.counts.global(true))?))
            }
        });
        let (loc, site) = detail_site::site(
            &locator,
            row,
            top.map(|l| (l.file.as_str(), l.line)),
            (d.launches, d.records, d.lineinfo),
        );
        let kernel_kind = if kinds[0] && (!kinds[1] || ld.excess() >= st.excess()) {
            ("load", figures(&ld))
        } else {
            ("store", figures(&st))
        };
        let shown = line_kind_figs
            .clone()
            .or_else(|| kernel_kind.1.clone().map(|f| (kernel_kind.0, f)));
        let what = shown
            .as_ref()
            .map(|(k, f)| phrase(k, f))
            .unwrap_or_default();
        let title = if proven {
            format!(
                "Uncoalesced access × {}{} · {}: {what} · {} recoverable",
                row.launches,
                detail_site::at(&loc),
                short(row),
                at_most(impact)
            )
        } else {
            format!(
                "Possible uncoalesced access × {}{} · {}: {what} (coalesced 8- and 16-byte \
                 accesses take 8 and 16)",
                row.launches,
                detail_site::at(&loc),
                short(row),
            )
        };
        let kind_text = |k: &str, a: &Access| match figures(a) {
            Some(f) => format!(
                "{k}: {} requests, {:.1} sectors per request against {:.1} ideal{}",
                a.requests,
                f.sectors_per_request,
                f.ideal_per_request,
                if a.assumed { " (assumed)" } else { "" }
            ),
            None => format!("{k}: none"),
        };
        let at_line = match (top, &line_kind_figs) {
            (Some(l), Some((k, f))) => format!(
                " Most excess sectors at {}:{}: {}.",
                l.file.rsplit('/').next().unwrap_or(&l.file),
                l.line,
                phrase(k, f)
            ),
            _ => String::new(),
        };
        let claim = if proven {
            format!(
                " Impact: the kernel's GPU time × the excess share of its global sectors ({}) = \
                 {}, an estimate and an upper bound (for a kernel bound by memory bandwidth).",
                detail_site::pct(waste, all),
                crate::insight::fmt_duration(impact)
            )
        } else {
            format!(
                " The recorder gave no ideal, and {ASSUMED_SECTORS_PER_REQUEST} sectors a request \
                 is the ideal of 4-byte accesses only: 8- or 16-byte accesses (double, float2, \
                 float4) take 8 or 16 when coalesced, so gpufl claims no recoverable time."
            )
        };
        let detail = format!(
            "{}: global {}; {} ({} instrumented launch(es)). A warp's request touches every \
             32-byte sector its 32 lanes' addresses fall in: lanes reading addresses far apart \
             make memory move sectors no lane uses.{at_line}{}{}{claim}",
            describe(row),
            kind_text("loads", &ld),
            kind_text("stores", &st),
            d.launches,
            launched(&site),
            no_line_note(&site),
        );
        let fix = "Make consecutive lanes touch consecutive addresses: index with `threadIdx.x` \
                   in the fastest-varying position (lane i reads element i, not i × stride); \
                   store structures of arrays rather than arrays of structures (each field \
                   contiguous); for a transpose or another strided pattern, stage a tile through \
                   shared memory — read it coalesced, write it out coalesced from the transposed \
                   tile (padded `[32][33]` against bank conflicts)."
            .to_string();
        let data = Data {
            site,
            loads: figures(&ld),
            stores: figures(&st),
            excess_sectors: waste,
            sectors: all,
            line_kind: line_kind_figs.as_ref().map(|(k, _)| *k),
            line_access: line_kind_figs.map(|(_, f)| f),
            proven,
            recoverable_ns: impact,
        };
        out.push(detail_site::insight(cx, RULE, row, (title, detail, fix), loc, impact).data(data));
    }
    out
}
