//! Memory on the dashboard, from the `memory` document ingest stores
//! ([`gpufl_analysis::memview::MemoryView`]): on the session page, each device's live bytes over
//! time with the peak marked and the lines holding memory at the peak (chips to their line
//! pages); on a line page, the allocations at that line.

use super::cards::Chip;
use super::charts::{LineChart, Mark, Series};
use super::{fmt, url_encode};
use gpufl_analysis::memview::{MemLine, MemLoc, MemoryView};
use std::collections::BTreeMap;

/// Holders listed per device, at most.
pub const MAX_HOLDERS: usize = 10;

/// One device's memory chart.
pub struct MemChart {
    pub heading: String,
    pub summary: String,
    pub svg: String,
    pub holders: Vec<HolderRow>,
    /// Holders not listed.
    pub holders_more: usize,
    /// The memory at the peak by what it is for (weights, optimizer state, …), largest first;
    /// empty when nothing but "other" was found.
    pub roles: Vec<RoleRow>,
}

/// One purpose's memory at the peak.
pub struct RoleRow {
    pub label: String,
    pub bytes: String,
    pub share: String,
}

/// A line holding memory at the peak.
pub struct HolderRow {
    /// A link to its line page; `None` for allocations without a stack.
    pub chip: Option<Chip>,
    /// The library's line inside it, a link to that line's page.
    pub lib: Option<Chip>,
    pub text: String,
    pub bytes: String,
    pub share: String,
    pub allocs: u64,
}

/// The chip of an allocating line (None without a stack).
fn chip(session: &str, at: &MemLoc) -> Option<Chip> {
    if at.file.is_empty() {
        return None;
    }
    let line = at.line.unwrap_or(0);
    let title = match &at.function {
        Some(f) if !f.is_empty() => format!("{}:{line} in {f}()", at.file),
        _ => format!("{}:{line}", at.file),
    };
    Some(Chip {
        href: format!(
            "/sessions/{}/line?file={}&line={line}",
            url_encode(session),
            url_encode(&at.file)
        ),
        text: fmt::loc(&at.file, at.line, 48),
        title,
    })
}

/// The chip of the library line inside an allocating line, if any.
fn lib_chip(session: &str, at: &MemLoc) -> Option<Chip> {
    let l = at.library.as_ref()?;
    let line = l.line.unwrap_or(0);
    Some(Chip {
        href: if l.file.is_empty() || line == 0 {
            String::new()
        } else {
            format!(
                "/sessions/{}/line?file={}&line={line}",
                url_encode(session),
                url_encode(&l.file)
            )
        },
        text: match line {
            0 => fmt::lib_path(&l.file, 48),
            n => format!("{}:{n}", fmt::lib_path(&l.file, 48)),
        },
        title: format!(
            "{}:{line} in {}()",
            l.file,
            l.function.as_deref().unwrap_or("?")
        ),
    })
}

/// The unit of a chart whose top is `max` bytes: (divisor, suffix).
fn unit(max: u64) -> (f64, &'static str) {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if max >= GIB {
        (GIB as f64, " GiB")
    } else if max >= MIB {
        (MIB as f64, " MiB")
    } else {
        (1024.0, " KiB")
    }
}

/// The session page's memory charts, one per device with allocations (`heading` names a device).
pub fn charts(doc: &MemoryView, session: &str, heading: impl Fn(u32) -> String) -> Vec<MemChart> {
    doc.devices
        .iter()
        .filter(|d| d.allocs > 0)
        .map(|d| {
            let top = d
                .peak_bytes
                .max(d.total_bytes.unwrap_or(0).min(d.peak_bytes * 2));
            let (div, suffix) = unit(top.max(1));
            let points: Vec<(f64, f64)> = d
                .series
                .iter()
                .map(|p| (p[0] as f64 / 1e9, p[1] as f64 / div))
                .collect();
            let peak_label = format!(
                "peak {} at {}",
                fmt::bytes(d.peak_bytes.min(i64::MAX as u64) as i64),
                fmt::dur(d.peak_offset_ns)
            );
            let name = heading(d.device);
            let svg = LineChart {
                title: format!("{name}: live bytes allocated by the process over time"),
                height: 200.0,
                series: vec![Series {
                    name: "live bytes".into(),
                    points,
                }],
                marks: vec![Mark {
                    x: d.peak_offset_ns as f64 / 1e9,
                    y: d.peak_bytes as f64 / div,
                    label: peak_label.clone(),
                }],
                y_unit: suffix.into(),
                x_unit: "s".into(),
                ..LineChart::default()
            }
            .render();
            let mut summary = format!(
                "{peak_label}; {} allocations, {} frees; {} live at the end",
                d.allocs,
                d.frees,
                fmt::bytes(d.end_bytes.min(i64::MAX as u64) as i64)
            );
            if let Some(t) = d.total_bytes.filter(|&t| t > 0) {
                summary += &format!(
                    "; the peak is {} of the device's {}",
                    fmt::pct(d.peak_bytes as f64 * 100.0 / t as f64),
                    fmt::bytes(t.min(i64::MAX as u64) as i64)
                );
            }
            let holders = d
                .holders
                .iter()
                .take(MAX_HOLDERS)
                .map(|h| HolderRow {
                    chip: chip(session, &h.at),
                    lib: lib_chip(session, &h.at),
                    text: h.at.location.clone(),
                    bytes: fmt::bytes(h.bytes.min(i64::MAX as u64) as i64),
                    share: fmt::pct(h.bytes as f64 * 100.0 / d.peak_bytes.max(1) as f64),
                    allocs: h.allocs,
                })
                .collect();
            let roles = d
                .roles
                .iter()
                .map(|r| RoleRow {
                    label: r.label.clone(),
                    bytes: fmt::bytes(r.bytes.min(i64::MAX as u64) as i64),
                    share: fmt::pct(r.bytes as f64 * 100.0 / d.peak_bytes.max(1) as f64),
                })
                .collect();
            MemChart {
                heading: name,
                summary,
                svg,
                holders,
                holders_more: d.holders.len().saturating_sub(MAX_HOLDERS),
                roles,
            }
        })
        .collect()
}

/// A line page's allocations on one device.
pub struct LineAllocs {
    pub device: u32,
    pub allocs: u64,
    pub frees: u64,
    pub bytes: String,
    pub peak_live: String,
    pub max_live: String,
    pub end_live: String,
}

/// The allocations at `file:line` (every line of `file` when `line` is 0), per device; lines that
/// differ only by their library frame add up.
pub fn line_allocs(doc: &MemoryView, file: &str, line: u32) -> Vec<LineAllocs> {
    let b = |v: u64| fmt::bytes(v.min(i64::MAX as u64) as i64);
    let mut by: BTreeMap<u32, Vec<&MemLine>> = BTreeMap::new();
    for l in &doc.lines {
        if l.at.file == file && (line == 0 || l.at.line == Some(line)) {
            by.entry(l.device).or_default().push(l);
        }
    }
    by.into_iter()
        .map(|(device, ls)| LineAllocs {
            device,
            allocs: ls.iter().map(|l| l.allocs).sum(),
            frees: ls.iter().map(|l| l.frees).sum(),
            bytes: b(ls.iter().map(|l| l.bytes_allocated).sum()),
            peak_live: b(ls.iter().map(|l| l.peak_live).sum()),
            max_live: b(ls.iter().map(|l| l.max_live).sum()),
            end_live: b(ls.iter().map(|l| l.end_live).sum()),
        })
        .collect()
}
