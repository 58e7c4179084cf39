//! The headline line of `gpufl report` and `gpufl info`: the analysis's [`Headline`] under the
//! names every view gives its figures ([`names`]), durations as the dashboard prints them.

use gpufl_analysis::headline::{fmt_pct, names};
use gpufl_analysis::{fmt_duration, Headline};

/// `wall 224.61ms · GPU busy 5.7% · 20 kernels · 0 syncs · host blocked 13.11ms (in syncs 0ns,
/// in blocking copies 13.11ms) · GPU idle 23.99ms · 18 of 30 chunks under 50 % busy`.
pub fn line(h: &Headline) -> String {
    let (of_observed, in_windows) = if h.always_on {
        (" of observed", " in windows")
    } else {
        ("", "")
    };
    let mut s = format!(
        "{} {} · {} {}{of_observed} · {} {}{in_windows} · {} {} · {} {} ({} {}, {} {})",
        names::WALL,
        fmt_duration(h.wall_ns),
        names::GPU_BUSY,
        fmt_pct(h.gpu_busy_pct),
        h.kernels,
        names::KERNELS,
        h.syncs,
        names::SYNCS,
        names::HOST_BLOCKED,
        fmt_duration(h.host_blocked_ns),
        names::IN_SYNCS,
        fmt_duration(h.sync_blocked_ns),
        names::IN_BLOCKING_COPIES,
        fmt_duration(h.copy_blocked_ns),
    );
    if !h.devices.is_empty() {
        s += &format!(" · {} {}", names::GPU_IDLE, fmt_duration(h.gpu_idle_ns));
    }
    let (low, chunks) = h.low_chunks();
    if chunks > 0 {
        s += &format!(" · {low} of {chunks} {}", names::LOW_CHUNKS);
    }
    s
}
