//! What the rules over the recorder's view inside kernels (`warp-divergence`,
//! `uncoalesced-access`, `bank-conflicts`, `stall-reasons`; `crate::kdetail`) share: which kernels
//! they look at, and where an insight is.
//!
//! **Location.** An insight's location is the line *inside the kernel* the rule names
//! (`kernel_detail.cu:81`: the file and line of the kernel's source from the cubin's line table;
//! `function` the kernel's name, origin [`FrameOrigin::Native`]: it is compiled code with debug
//! information, like a host frame), and the host line that launched the kernel — found as the
//! other kernel rules find it ([`kernel_site::location`]: the most frequent call site of the
//! kernel's sampled launches) — is given beside it, in the detail's text and in the data's
//! `launch` (absent when no launch of the kernel has a call-site stack). Without a line (a cubin
//! without a line table: built without `-lineinfo`; or counts on no line), the location is the
//! launch line, as for the other kernel rules, and the text says why.

use crate::insight::{fmt_duration, Insight};
use crate::kdetail::{KernelDetail, KernelStalls};
use crate::kernels::{short_name, KernelRow, KernelTable};
use crate::shared::kernel_site::{self, KernelInsight};
use crate::shared::timeline::{LocationSource, Locator};
use crate::shared::Ctx;
use crate::userframe::{FrameOrigin, SourceLoc};
use serde::Serialize;

/// Whether a kernel is one the detail rules look at: not a vendor library's (its code is not
/// the user's to change), a framework runtime's or a communication library's, on a device with
/// busy time. Whether it matters is each rule's impact against the device's busy time
/// ([`kernel_site::worth`]): a kernel the user had the recorder look inside may be short.
pub(crate) fn looked_at(row: &KernelRow) -> bool {
    !row.library
        && !row.comm
        && !crate::kernels::is_runtime_kernel(&row.name)
        && row.device_busy_ns > 0
}

/// Each kernel-table row the rules look at with its merged counters.
pub(crate) fn with_detail<'t>(
    cx: &'t Ctx,
    table: &'t KernelTable,
) -> impl Iterator<Item = (&'t KernelRow, &'t KernelDetail)> + 't {
    table
        .rows
        .iter()
        .filter(|r| looked_at(r))
        .filter_map(|r| Some((r, cx.m.kernel_detail(&r.name, r.device)?)))
}

/// Each kernel-table row the rules look at with its merged PC samples.
pub(crate) fn with_stalls<'t>(
    cx: &'t Ctx,
    table: &'t KernelTable,
) -> impl Iterator<Item = (&'t KernelRow, &'t KernelStalls)> + 't {
    table
        .rows
        .iter()
        .filter(|r| looked_at(r))
        .filter_map(|r| Some((r, cx.m.kernel_stall(&r.name, r.device)?)))
}

/// Where an insight is: the kernel's line and its launch line (see the module's doc).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Site {
    pub kernel: String,
    pub device: u32,
    /// The kernel's launches, GPU time and share of its device's busy time (kernel table).
    pub launches: u64,
    pub gpu_ns: u64,
    pub busy_share: f64,
    /// Launches the counters (or samples) come from, and the collection windows.
    pub instrumented_launches: u64,
    pub windows: u32,
    /// The line inside the kernel the insight names (None: no line, see `lineinfo`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Whether the kernel's cubin had line info.
    pub lineinfo: bool,
    /// The host line that launched the kernel, when a launch of it has a call-site stack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launch: Option<SourceLoc>,
    /// How the launch line (or, without a kernel line, the location) was found.
    pub location_source: LocationSource,
}

/// The location and [`Site`] of an insight about `row` at `line` (file, line) inside it.
pub(crate) fn site(
    locator: &Locator,
    row: &KernelRow,
    line: Option<(&str, u32)>,
    (instrumented, windows, lineinfo): (u64, u32, bool),
) -> (SourceLoc, Site) {
    let (launch_loc, src) = kernel_site::location(locator, row);
    let loc = match line {
        Some((file, l)) => SourceLoc {
            file: file.to_string(),
            line: Some(l),
            function: Some(row.name.clone()),
            origin: FrameOrigin::Native,
            text: None,
            library: None,
        },
        None => launch_loc.clone(),
    };
    let launch = (src != LocationSource::KernelName).then_some(launch_loc);
    let site = Site {
        kernel: row.name.clone(),
        device: row.device,
        launches: row.launches,
        gpu_ns: row.total_ns,
        busy_share: row.busy_share,
        instrumented_launches: instrumented,
        windows,
        file: line.map(|(f, _)| f.to_string()),
        line: line.map(|(_, l)| l),
        lineinfo,
        launch,
        location_source: src,
    };
    (loc, site)
}

/// ` @ kernel_detail.cu:81` (the kernel's line, else its launch line; nothing for a kernel-name
/// location).
pub(crate) fn at(loc: &SourceLoc) -> String {
    kernel_site::at(loc)
}

/// ` Launched at main.cu:163 in main().`, or a note that no launch line was recorded.
pub(crate) fn launched(s: &Site) -> String {
    match &s.launch {
        Some(l) => format!(" Launched at {}{}.", l.short(), crate::insight::in_function(l)),
        None => " (No launch of this kernel has a call-site stack: record with stacks on to get its launch line.)".into(),
    }
}

/// Why there is no line inside the kernel, for the detail's text (empty when there is one).
pub(crate) fn no_line_note(s: &Site) -> &'static str {
    match (s.line, s.lineinfo) {
        (Some(_), _) => "",
        (None, false) => {
            " The kernel's cubin has no line info, so no line inside it can be named: build with \
             `nvcc -lineinfo` (or `-G`); located at its launch line."
        }
        (None, true) => {
            " No counts were mapped to a line inside the kernel; located at its launch line."
        }
    }
}

/// `divergent (200 launches, 12.40ms in all, 80.1% of GPU 0's busy time)`.
pub(crate) fn describe(row: &KernelRow) -> String {
    kernel_site::describe(row)
}

/// The kernel's short name.
pub(crate) fn short(row: &KernelRow) -> &str {
    short_name(&row.name)
}

/// `≤ 1.23ms` for a time that is an upper bound.
pub(crate) fn at_most(ns: u64) -> String {
    format!("≤ {}", fmt_duration(ns))
}

/// An insight from its texts and figures: severity from the impact's share of the device's busy
/// time ([`kernel_site::insight`]; the rule adds its own figures with [`Insight::data`]).
pub(crate) fn insight(
    cx: &Ctx,
    rule: &'static str,
    row: &KernelRow,
    (title, detail, fix): (String, String, String),
    location: SourceLoc,
    impact_ns: u64,
) -> Insight {
    kernel_site::insight(
        cx,
        KernelInsight {
            rule,
            title,
            detail,
            fix,
            location,
            launches: row.launches,
            impact_ns,
            window_ns: row.device_busy_ns,
        },
    )
}

/// `share × ns`, rounded down ([`kernel_site::part`]).
pub(crate) fn part(ns: u64, share: f64) -> u64 {
    kernel_site::part(ns, share)
}

/// Whether an impact is worth an insight ([`kernel_site::worth`]: 1 % of the device's busy time).
pub(crate) fn worth(impact_ns: u64, row: &KernelRow) -> bool {
    kernel_site::worth(impact_ns, row)
}

/// `a / b` as a percentage with one decimal (at most 100: a damaged count cannot claim more),
/// `-` for an empty `b`.
pub(crate) fn pct(a: u64, b: u64) -> String {
    if b == 0 {
        "-".into()
    } else {
        format!("{:.1}%", crate::insight::share(a, b) * 100.0)
    }
}
