//! A session's headline figures, computed once ([`Headline`]) and shown by every view under the
//! same names ([`names`]): `gpufl report`'s header and `--json`, `gpufl info`, the dashboard's
//! session page and `gpufl diff` (through [`crate::diff::Profile`]).
//!
//! - **wall**: first to last timed record ([`Totals::wall_ns`]).
//! - **GPU busy**: union of kernels, copies and memsets per device, summed over devices, and its
//!   share of the wall (of the GPU-observed time in an always-on session).
//! - **kernels**, **syncs**: executions and synchronizations recorded.
//! - **host blocked**: host time spent waiting for the GPU = **in syncs** (synchronizations,
//!   StreamWaitEvent excluded: a device-side wait) + **in blocking copies** (the copy and memset
//!   calls rule `blocking-copy` counts, with or without a source line: those that block the host —
//!   no `Async`, touching host memory, host-to-device copies of 64 KiB or less excepted — and the
//!   async copies waited on at once by a sync at the same line, `.item()`-style, whose wait is in
//!   syncs). A blocking-copy finding's "host blocked" (calls plus their waits) is part of it.
//! - **GPU idle**: each device's idle gaps within its active range (first op to last), paused and
//!   unobserved time left out, summed over devices ([`DeviceIdle::idle_ns`]).
//! - **low chunks**: per device, the chunks of its utilization series under 50 % busy once its
//!   one-off pauses are cut out ([`DeviceIdle::low_utilization_chunks`]; the count rule
//!   `low-utilization` reports too).
//!
//! [`headline_on`] computes it without the rules (what `gpufl info` needs): the device busy
//! intervals, the totals and the idle scan; [`crate::analyze_on`] builds the same from the same
//! products ([`Headline::of`]).

use crate::intervals::DeviceBusy;
use crate::model::Model;
use crate::shared::idle::DeviceIdle;
use crate::totals::Totals;
use crate::Config;
use serde::{Deserialize, Serialize};

/// The names every view gives the headline figures.
pub mod names {
    pub const WALL: &str = "wall";
    /// The share (percent); its time is [`GPU_BUSY_TIME`].
    pub const GPU_BUSY: &str = "GPU busy";
    pub const GPU_BUSY_TIME: &str = "GPU busy time";
    pub const COPIES: &str = "copies";
    pub const MEMSETS: &str = "memsets";
    pub const KERNELS: &str = "kernels";
    pub const SYNCS: &str = "syncs";
    pub const HOST_BLOCKED: &str = "host blocked";
    pub const IN_SYNCS: &str = "in syncs";
    pub const IN_BLOCKING_COPIES: &str = "in blocking copies";
    pub const GPU_IDLE: &str = "GPU idle";
    pub const LOW_CHUNKS: &str = "chunks under 50 % busy";
}

/// One device's part of the headline.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct DeviceHeadline {
    pub device: u32,
    /// Its active range less paused and unobserved time, ns.
    pub active_ns: u64,
    /// Its idle gaps together, ns.
    pub idle_ns: u64,
    /// Chunks of its utilization series, and the low ones.
    pub chunks: u32,
    pub low_chunks: u32,
    /// Its one-off pauses together (left out of the low chunks), ns.
    pub one_off_pause_ns: u64,
}

/// The figures a session's first line shows, in every view.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Headline {
    pub wall_ns: u64,
    /// An always-on session: GPU busy is a share of the observed time, kernels and busy time are
    /// the windows' only.
    pub always_on: bool,
    pub gpu_busy_ns: u64,
    /// Percent, never above 100.
    pub gpu_busy_pct: f64,
    pub kernels: u64,
    pub syncs: u64,
    /// `sync_blocked_ns + copy_blocked_ns`.
    pub host_blocked_ns: u64,
    /// Host time in synchronizations, ns.
    pub sync_blocked_ns: u64,
    /// Host time in blocking copy and memset calls, ns, and how many calls.
    pub copy_blocked_ns: u64,
    pub blocking_copies: u64,
    /// Summed over devices, ns.
    pub gpu_idle_ns: u64,
    /// The devices' active ranges (observed parts) together, ns: what `gpu_idle_ns` is a part of.
    pub gpu_active_ns: u64,
    /// Per device with GPU work.
    pub devices: Vec<DeviceHeadline>,
}

impl Headline {
    /// The headline from the session's totals, its devices' idle summaries and its blocking
    /// copies (`(calls, host ns)`).
    pub(crate) fn of(
        t: &Totals,
        always_on: bool,
        idle: &[DeviceIdle],
        (blocking_copies, copy_blocked_ns): (u64, u64),
    ) -> Headline {
        let devices: Vec<DeviceHeadline> = idle
            .iter()
            .map(|d| DeviceHeadline {
                device: d.device,
                active_ns: d.active_ns - d.paused_ns - d.unobserved_ns,
                idle_ns: d.idle_ns,
                chunks: d.utilization.len() as u32,
                low_chunks: d.low_utilization_chunks,
                one_off_pause_ns: d.one_off_pause_ns,
            })
            .collect();
        Headline {
            wall_ns: t.wall_ns,
            always_on,
            gpu_busy_ns: t.gpu_busy_ns,
            gpu_busy_pct: t.gpu_busy_pct,
            kernels: t.kernels,
            syncs: t.syncs,
            host_blocked_ns: t.sync_blocked_ns.saturating_add(copy_blocked_ns),
            sync_blocked_ns: t.sync_blocked_ns,
            copy_blocked_ns,
            blocking_copies,
            gpu_idle_ns: devices.iter().map(|d| d.idle_ns).sum(),
            gpu_active_ns: devices.iter().map(|d| d.active_ns).sum(),
            devices,
        }
    }

    /// Low chunks and chunks, summed over devices.
    pub fn low_chunks(&self) -> (u32, u32) {
        self.devices
            .iter()
            .fold((0, 0), |(l, c), d| (l + d.low_chunks, c + d.chunks))
    }
}

/// A session's headline without running the rules: the device busy intervals, the totals, the
/// idle scan (on up to `threads` threads for the busy intervals).
pub fn headline_on(m: &Model, cfg: &Config, threads: usize) -> Headline {
    let busy = DeviceBusy::new_on(m, threads.max(1));
    let totals = crate::totals::totals_with(m, &busy);
    let cx = crate::shared::Ctx::new(m, cfg, &busy, totals.wall_ns);
    let idle = crate::shared::idle::scan(&cx);
    Headline::of(
        &totals,
        m.is_always_on(),
        &idle.devices,
        crate::shared::copies::blocking_calls(&cx),
    )
}

/// A share in percent as every view prints it: `5.7%`.
pub fn fmt_pct(p: f64) -> String {
    format!("{p:.1}%")
}
