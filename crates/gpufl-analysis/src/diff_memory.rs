//! Memory in `gpufl diff` (issue 38): each device's peak of the process's live bytes, and per
//! allocating line (on a device) its live bytes at that device's peak and its allocations, from
//! the sessions' `mem` records ([`crate::memview`]). Lines match by device, file, line, function
//! and the library frame (the short name); statuses and the threshold as for the other tables.

use super::{pair, status, Delta, Status};
use crate::memview::{MemLoc, MemoryView};
use serde::{Deserialize, Serialize};

/// A session's memory as [`super::diff`] compares it; empty without `mem` records.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct MemProfile {
    /// Per device: its peak live bytes.
    pub devices: Vec<MemDeviceStat>,
    /// Per allocating line and device.
    pub lines: Vec<MemLineStat>,
}

impl MemProfile {
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty() && self.lines.is_empty()
    }

    /// From a session's memory view.
    pub fn of(v: &MemoryView) -> MemProfile {
        MemProfile {
            devices: v
                .devices
                .iter()
                .map(|d| MemDeviceStat {
                    device: d.device,
                    peak_bytes: d.peak_bytes,
                })
                .collect(),
            lines: v
                .lines
                .iter()
                .map(|l| MemLineStat {
                    device: l.device,
                    location: l.at.clone(),
                    peak_live: l.peak_live,
                    allocs: l.allocs,
                })
                .collect(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MemDeviceStat {
    pub device: u32,
    pub peak_bytes: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct MemLineStat {
    pub device: u32,
    pub location: MemLoc,
    /// Live bytes at the device's peak.
    pub peak_live: u64,
    pub allocs: u64,
}

/// A device's peak in both sessions.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct MemDeviceDelta {
    pub device: u32,
    /// None: in both sessions, the peak within the threshold.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    pub peak_bytes: Delta,
}

/// An allocating line whose live bytes at the peak or allocations changed.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct MemLineDelta {
    pub device: u32,
    /// NEW's where it has the line, else BASE's.
    pub location: MemLoc,
    pub status: Status,
    pub peak_live: Delta,
    pub allocs: Delta,
}

/// The memory of two sessions compared.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct MemoryDiff {
    /// Every device with allocations in either session (unchanged ones too: the peak is the
    /// headline), by device.
    pub devices: Vec<MemDeviceDelta>,
    /// Most live bytes at the peak moved first.
    pub lines: Vec<MemLineDelta>,
    pub lines_hidden: u64,
}

impl MemoryDiff {
    /// Whether nothing moved beyond `th` %.
    pub fn is_unchanged(&self, th: f64) -> bool {
        self.lines.is_empty() && self.devices.iter().all(|d| !d.peak_bytes.moved(th))
    }
}

/// The memory diff; None when neither session has `mem` records.
pub fn memory_diff(base: &MemProfile, new: &MemProfile, th: f64) -> Option<MemoryDiff> {
    if base.is_empty() && new.is_empty() {
        return None;
    }
    let devices = pair(&base.devices, &new.devices, |d| d.device)
        .into_iter()
        .map(|(b, n)| {
            let peak_bytes =
                Delta::of(b.map_or(0, |d| d.peak_bytes), n.map_or(0, |d| d.peak_bytes));
            MemDeviceDelta {
                device: n.or(b).map_or(0, |d| d.device),
                status: status(b.is_some(), n.is_some(), peak_bytes.moved(th)),
                peak_bytes,
            }
        })
        .collect();
    let mut lines = Vec::new();
    let mut lines_hidden = 0;
    let key = |l: &MemLineStat| {
        (
            l.device,
            l.location.file.clone(),
            l.location.line,
            l.location.function.clone(),
            l.location.location.clone(),
        )
    };
    for (b, n) in pair(&base.lines, &new.lines, key) {
        let d = |f: fn(&MemLineStat) -> u64| Delta::of(b.map_or(0, f), n.map_or(0, f));
        let (peak_live, allocs) = (d(|l| l.peak_live), d(|l| l.allocs));
        let moved = peak_live.moved(th) || allocs.moved(th);
        match status(b.is_some(), n.is_some(), moved) {
            Some(status) => {
                let l = n.or(b).expect("a side");
                lines.push(MemLineDelta {
                    device: l.device,
                    location: l.location.clone(),
                    status,
                    peak_live,
                    allocs,
                })
            }
            None => lines_hidden += 1,
        }
    }
    lines.sort_by(|a, b| {
        b.peak_live
            .delta
            .unsigned_abs()
            .cmp(&a.peak_live.delta.unsigned_abs())
            .then_with(|| (a.device, &a.location.location).cmp(&(b.device, &b.location.location)))
    });
    Some(MemoryDiff {
        devices,
        lines,
        lines_hidden,
    })
}
