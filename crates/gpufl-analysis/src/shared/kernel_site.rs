//! What the kernel rules (`low-occupancy`, `register-spill`, `under-filled-grid`) share: which
//! kernels matter, where a kernel is launched, how it is described.

use crate::insight::{fmt_duration, Insight};
use crate::kernels::short_name as short_kernel;
use crate::kernels::KernelRow;
use crate::shared::timeline::{LocationSource, Locator};
use crate::shared::Ctx;
use crate::userframe::{FrameOrigin, SourceLoc};

/// A kernel matters when its busy time is at least this share of its device's busy time, percent.
pub const MIN_BUSY_PCT: u64 = 5;

/// An insight needs an impact of at least this share of the device's busy time, percent (a
/// kernel at 49 % occupancy, or a few bytes of local memory, is not worth a line).
pub const MIN_IMPACT_PCT: u64 = 1;

/// Whether an impact reaches [`MIN_IMPACT_PCT`] % of the device's busy time (and is not 0).
pub(crate) fn worth(impact_ns: u64, row: &KernelRow) -> bool {
    impact_ns > 0 && impact_ns as u128 * 100 >= row.device_busy_ns as u128 * MIN_IMPACT_PCT as u128
}

/// Whether a kernel takes at least [`MIN_BUSY_PCT`] % of its device's busy time (a framework
/// runtime's own kernels never do: [`crate::kernels::is_runtime_kernel`]; nor do communication
/// kernels, whose time is mostly waiting for other ranks and whose grid follows the library's
/// channels: [`crate::comm::is_comm_kernel`], rule `collective-wait` reads them).
pub(crate) fn matters(row: &KernelRow) -> bool {
    !crate::kernels::is_runtime_kernel(&row.name)
        && !row.comm
        && row.device_busy_ns > 0
        && row.busy_ns as u128 * 100 >= row.device_busy_ns as u128 * MIN_BUSY_PCT as u128
}

/// The kernel's launch line: the most frequent call site of its sampled launches; else its name.
pub(crate) fn location(locator: &Locator, row: &KernelRow) -> (SourceLoc, LocationSource) {
    for &id in &row.name_ids {
        if let Some(loc) = locator.kernel_name_line(id) {
            return (locator.source_loc(loc), LocationSource::KernelCallsites);
        }
    }
    (
        SourceLoc {
            file: short_kernel(&row.name).to_string(),
            line: None,
            function: Some(row.name.clone()),
            origin: FrameOrigin::Kernel,
            text: None,
            library: None,
        },
        LocationSource::KernelName,
    )
}

/// ` @ file:line` for a call site; nothing for a kernel-name location (the title names the kernel).
pub(crate) fn at(loc: &SourceLoc) -> String {
    if loc.origin == FrameOrigin::Kernel {
        String::new()
    } else {
        format!(" @ {}", loc.short())
    }
}

/// `regs_heavy (200 launches, 12.40ms, 80.1% of GPU 0's busy time)`.
pub(crate) fn describe(row: &KernelRow) -> String {
    format!(
        "{} ({} launches, {} in all, {:.1}% of GPU {}'s busy time)",
        short_kernel(&row.name),
        row.launches,
        fmt_duration(row.total_ns),
        row.busy_share * 100.0,
        row.device
    )
}

/// A note for the detail when the location is the kernel's name.
pub(crate) fn location_note(src: LocationSource) -> &'static str {
    match src {
        LocationSource::KernelName => {
            " (no launch of this kernel has a call-site stack: record with stacks on to get its launch line)"
        }
        _ => "",
    }
}

/// `share × ns`, rounded down, for a share in 0..1.
pub(crate) fn part(ns: u64, share: f64) -> u64 {
    (ns as f64 * share.clamp(0.0, 1.0)) as u64
}

/// The fields every kernel insight fills the same way.
pub(crate) struct KernelInsight {
    pub rule: &'static str,
    pub title: String,
    pub detail: String,
    pub fix: String,
    pub location: SourceLoc,
    pub launches: u64,
    pub impact_ns: u64,
    /// The device's busy time: severity is the impact's share of it.
    pub window_ns: u64,
}

/// The insight, its severity from the impact's share of the window (the rule adds its figures
/// with [`Insight::data`]).
pub(crate) fn insight(cx: &Ctx, k: KernelInsight) -> Insight {
    let window = k.window_ns.max(k.impact_ns);
    Insight::new(k.rule, k.location, k.title, k.detail, k.fix)
        .count(k.launches)
        .impact(k.impact_ns, window, cx.wall_ns)
}
