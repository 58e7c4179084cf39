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
