//! The memory of a session for views outside the report (the dashboard, `gpufl diff`): each
//! device's live bytes over time with its peak and the lines holding memory at the peak, and
//! each allocating line's allocations, bytes and live bytes at its device's peak. Read from the
//! session's `mem` records by the same replay as the memory rules (`memory-peak`, `memory-leak`,
//! `out-of-memory`); empty without them.

use crate::intervals::DeviceBusy;
use crate::shared::memory::{self, Holder};
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use crate::{Config, Model};
use serde::{Deserialize, Serialize};

/// An allocating line: where it is and its short name (`train.py:12`); `file` is empty for
/// allocations without a stack.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemLoc {
    pub file: String,
    pub line: Option<u32>,
    pub function: Option<String>,
    pub location: String,
    /// The library's line inside the user's line, when the allocation was made in a library
    /// (`transformers/activations.py:66`): what tells apart the holders of one user line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<MemLib>,
}

/// A library's line.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemLib {
    pub file: String,
    pub line: Option<u32>,
    pub function: Option<String>,
}

/// A line's live memory at its device's peak.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemHolder {
    #[serde(flatten)]
    pub at: MemLoc,
    pub bytes: u64,
    /// Its allocations live then.
    pub allocs: u64,
}

/// The live memory at the peak for one purpose ([`memory::Role`]).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemRole {
    /// `weights`, `optimizer_state`, `gradients`, `activations`, `other`.
    pub role: String,
    /// In prose: `optimizer state`.
    pub label: String,
    pub bytes: u64,
}

/// One device's memory over the session.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemDevice {
    pub device: u32,
    pub peak_bytes: u64,
    /// ns after the session's first record.
    pub peak_offset_ns: i64,
    /// The device's memory in all, when known.
    pub total_bytes: Option<u64>,
    pub end_bytes: u64,
    pub allocs: u64,
    pub frees: u64,
    /// `[ns after the first record, live bytes]`, at most
    /// [`crate::shared::memory::MAX_SERIES_POINTS`] points (each the highest of its stretch).
    pub series: Vec<[i64; 2]>,
    /// Every line holding memory at the peak, largest first.
    pub holders: Vec<MemHolder>,
    /// The memory at the peak by what it is for, largest first; empty when nothing but "other"
    /// was found (documents stored before it: empty).
    #[serde(default)]
    pub roles: Vec<MemRole>,
}

/// One allocating line on one device.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemLine {
    pub device: u32,
    #[serde(flatten)]
    pub at: MemLoc,
    pub allocs: u64,
    pub frees: u64,
    pub bytes_allocated: u64,
    /// Its live bytes at its device's peak, at its own highest, at the end.
    pub peak_live: u64,
    pub max_live: u64,
    pub end_live: u64,
}

/// A failed allocation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemFailure {
    pub device: u32,
    pub offset_ns: i64,
    pub bytes: u64,
    pub free: Option<u64>,
    #[serde(flatten)]
    pub at: MemLoc,
    /// Live bytes of the process on the device then.
    pub live_bytes: u64,
}

/// The memory of a session.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemoryView {
    pub devices: Vec<MemDevice>,
    /// By device, then file and line.
    pub lines: Vec<MemLine>,
    pub failures: Vec<MemFailure>,
}

fn mem_loc(cx: &Ctx, loc: Option<crate::ids::LocIx>) -> MemLoc {
    match loc {
        None => MemLoc {
            location: "(no stack)".into(),
            ..MemLoc::default()
        },
        Some(l) => {
            let s: &SourceLoc = cx.loc(l);
            MemLoc {
                file: s.file.clone(),
                line: s.line,
                function: s.function.clone(),
                location: s.short(),
                library: s.library.as_ref().map(|l| MemLib {
                    file: l.file.clone(),
                    line: l.line,
                    function: l.function.clone(),
                }),
            }
        }
    }
}

fn holder(cx: &Ctx, h: &Holder) -> MemHolder {
    MemHolder {
        at: mem_loc(cx, h.loc),
        bytes: h.bytes,
        allocs: h.allocs,
    }
}

/// The memory of an analysed session's model (`cfg` picks each stack's user line, as the
/// analysis's).
pub fn memory_view(m: &Model, cfg: &Config) -> MemoryView {
    if m.mems().is_empty() {
        return MemoryView::default();
    }
    let busy = DeviceBusy::default();
    let cx = Ctx::new(m, cfg, &busy, 0);
    let scan = memory::scan(&cx);
    let devices = scan
        .devices
        .iter()
        .map(|d| MemDevice {
            device: d.dev,
            peak_bytes: d.peak_bytes,
            peak_offset_ns: memory::offset_ns(&cx, d.peak_ts),
            total_bytes: memory::device_total(&cx, d.dev),
            end_bytes: d.end_bytes,
            allocs: d.allocs,
            frees: d.frees,
            series: d
                .series
                .iter()
                .map(|&(t, b)| [memory::offset_ns(&cx, t), b.min(i64::MAX as u64) as i64])
                .collect(),
            holders: d.holders.iter().map(|h| holder(&cx, h)).collect(),
            roles: if d.roles.iter().any(|r| r.0 != memory::Role::Other) {
                d.roles
                    .iter()
                    .map(|&(r, bytes)| MemRole {
                        role: r.name().into(),
                        label: r.label().into(),
                        bytes,
                    })
                    .collect()
            } else {
                Vec::new()
            },
        })
        .collect();
    let mut lines: Vec<MemLine> = scan
        .lines
        .iter()
        .map(|l| {
            let peak_live = scan
                .devices
                .iter()
                .find(|d| d.dev == l.dev)
                .and_then(|d| d.holders.iter().find(|h| h.loc == l.loc))
                .map_or(0, |h| h.bytes);
            MemLine {
                device: l.dev,
                at: mem_loc(&cx, l.loc),
                allocs: l.allocs,
                frees: l.frees,
                bytes_allocated: l.bytes_allocated,
                peak_live,
                max_live: l.max_live,
                end_live: l.end_live,
            }
        })
        .collect();
    lines.sort_by(|a, b| {
        (a.device, &a.at.file, a.at.line, &a.at.location).cmp(&(
            b.device,
            &b.at.file,
            b.at.line,
            &b.at.location,
        ))
    });
    let failures = scan
        .failures
        .iter()
        .map(|f| MemFailure {
            device: f.dev,
            offset_ns: memory::offset_ns(&cx, f.ts),
            bytes: f.bytes,
            free: f.free,
            at: mem_loc(&cx, f.loc),
            live_bytes: f.live_bytes,
        })
        .collect();
    MemoryView {
        devices,
        lines,
        failures,
    }
}
