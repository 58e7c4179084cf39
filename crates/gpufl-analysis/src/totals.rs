//! Session totals: wall time, GPU busy time, counts, time blocked in synchronizations.

use crate::intervals::DeviceBusy;
use crate::model::Model;
use serde::{Deserialize, Serialize};

/// Totals of one session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// First to last timed record of the session (kernels, copies, memsets, syncs, API calls,
    /// callsites; not CUPTI's own overhead records), ns.
    pub wall_ns: u64,
    /// Union of kernel, copy and memset intervals per device (concurrent work counted once),
    /// summed over devices, ns.
    pub gpu_busy_ns: u64,
    /// `gpu_busy_ns / (wall_ns × devices with activity) × 100`; never above 100; 0 without activity.
    /// In an always-on session over its GPU-observed time ([`Model::observed_ns`]) instead of
    /// `wall_ns`: the busy time is the windows' only.
    pub gpu_busy_pct: f64,
    pub kernels: u64,
    /// Memcpys (memsets are counted apart).
    pub copies: u64,
    pub memsets: u64,
    pub syncs: u64,
    /// Host time blocked in synchronizations: their summed durations, StreamWaitEvent excluded
    /// (a device-side wait: the host only enqueues it).
    pub sync_blocked_ns: u64,
    pub syncs_with_stack: u64,
}

/// Totals of a model.
pub fn totals(m: &Model) -> Totals {
    totals_with(m, &DeviceBusy::new(m))
}

pub(crate) fn totals_with(m: &Model, busy: &DeviceBusy) -> Totals {
    let (first, last) = m.time_range();
    let wall_ns = last - first;
    let gpu_busy_ns = busy.busy_ns();
    let observed = if m.is_always_on() {
        m.observed_ns()
    } else {
        wall_ns
    };
    let denom = observed as f64 * busy.device_count() as f64;
    let gpu_busy_pct = if denom > 0.0 {
        (gpu_busy_ns as f64 / denom * 100.0).min(100.0)
    } else {
        0.0
    };
    let s = &m.syncs;
    let mut sync_blocked_ns = 0u64;
    let mut syncs_with_stack = 0u64;
    for i in 0..m.sync_count() {
        if m.sync_kind_at(i).blocks_host() {
            sync_blocked_ns += s.end.get(i).saturating_sub(s.start.get(i));
        }
        if m.sync_stack(i).is_some() {
            syncs_with_stack += 1;
        }
    }
    Totals {
        wall_ns,
        gpu_busy_ns,
        gpu_busy_pct,
        kernels: m.kernel_count() as u64,
        copies: (m.copy_count() - m.memset_count()) as u64,
        memsets: m.memset_count() as u64,
        syncs: m.sync_count() as u64,
        sync_blocked_ns,
        syncs_with_stack,
    }
}
