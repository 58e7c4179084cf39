//! The session page (`/sessions/{id}`): headline numbers, then the findings as one ranked list in
//! the analysis's order (its first is the session's top finding), with the categories as filters
//! (`?category=…`, links with counts), then GPU utilization over time per device with idle time by cause, what the host was doing while the
//! GPU idled (the idle findings' host lines, [`super::hostview`]), telemetry charts (with throttling
//! bands), the scope tree with its roll-ups, and the kernel table.
//!
//! Bounded whatever the session's size: it reads the session's row, its insights, the small
//! documents ingest stored for this page (`timeline`, `scopes`, `telemetry`, the `header`'s GPU
//! names) and the top kernel rows (SQL `LIMIT`) — never the whole analysis nor every kernel — and
//! caps every list and chart.

use super::cards::{self, Card, Chip};
use super::charts::{self, Band, Column, LineChart, Series, StackedColumns};
use super::data;
use super::hostview::{self, IdleBreakdown};
use super::memory::{self, MemChart};
use super::{fmt, render, url_encode, Nav, Viewer, WebError};
use crate::store::{InsightRow, KernelRow, SessionRow};
use crate::AppState;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use gpufl_analysis::headline::{fmt_pct, names};
use gpufl_analysis::memview::MemoryView;
use gpufl_analysis::{fmt_duration, Headline};
use gpufl_trace::{throttle, Telemetry};
use serde::Deserialize;
use serde_json::Value;
use std::sync::Arc;

/// Kernel rows shown.
pub const KERNEL_ROWS: i64 = 50;
/// Scope rows shown (tree order), and range rows.
pub const SCOPE_ROWS: usize = 500;
pub const RANGE_ROWS: usize = 100;
/// Cards shown at most (the list, or one category of it).
pub const MAX_CARDS: usize = 100;
/// Cards shown open at the top of the unfiltered list; the rest open on a click.
pub const TOP_CARDS: usize = 5;
/// Points per telemetry series (and bands per chart) at most.
pub const MAX_POINTS: usize = 500;
/// Devices shown in the utilization and telemetry sections.
pub const MAX_DEVICES: usize = 64;

// ---------------------------------------------------------------------------------------------
// Stored documents, only the fields the page reads
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize, Default)]
#[serde(default)]
struct Timeline {
    devices: Vec<TDevice>,
}

#[derive(Deserialize, Default, Clone, Copy)]
#[serde(default)]
struct ClassTotal {
    gaps: u64,
    idle_ns: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ByClass {
    kernel_wait: ClassTotal,
    launch: ClassTotal,
    sync: ClassTotal,
    other: ClassTotal,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ChunkIdle {
    kernel_wait: u64,
    launch: u64,
    sync: u64,
    other: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TChunk {
    start_offset_ns: u64,
    duration_ns: u64,
    busy_ns: u64,
    busy_share: f64,
    low: bool,
    unobserved_ns: u64,
    idle_ns: ChunkIdle,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TLoc {
    file: String,
    line: Option<u32>,
    function: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TGap {
    start_offset_ns: u64,
    duration_ns: u64,
    class: String,
    location: Option<TLoc>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TDevice {
    device: u32,
    active_start_offset_ns: u64,
    active_ns: u64,
    busy_ns: u64,
    idle_ns: u64,
    paused_ns: u64,
    unobserved_ns: u64,
    gaps: u64,
    by_class: ByClass,
    top_gaps: Vec<TGap>,
    low_utilization_chunks: u32,
    chunks: Vec<TChunk>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ScopesDoc {
    scopes_total: usize,
    scopes: Vec<ScopeRow>,
    ranges_total: usize,
    ranges: Vec<RangeRow>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ScopeRow {
    name: String,
    depth: u32,
    count: u64,
    wall_ns: u64,
    gpu_busy_ns: u64,
    kernels: u64,
    kernels_by_launch: bool,
    syncs: u64,
    sync_blocked_ns: u64,
    unclosed: u64,
    nvtx: bool,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct RangeRow {
    name: String,
    count: u64,
    wall_ns: u64,
    max_ns: u64,
    gpu_busy_ns: u64,
    cross_thread: u64,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TelemetryDoc {
    origin_ns: u64,
    devices: Vec<TelemetryDevice>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TelemetryDevice {
    device: u32,
    every: u64,
    samples: Vec<Telemetry>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct HeaderDoc {
    gpus: Vec<HeaderGpu>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct HeaderGpu {
    index: u32,
    name: String,
}

// ---------------------------------------------------------------------------------------------
// What the template shows
// ---------------------------------------------------------------------------------------------

/// A headline number.
pub struct Stat {
    pub key: &'static str,
    pub value: String,
    /// Extra class of the value (the severity's).
    pub class: &'static str,
    pub tip: String,
}

/// A category filter of the findings list: a link with the category's count.
pub struct Filter {
    pub label: String,
    pub href: String,
    pub count: usize,
    /// Whether the list shows this filter now.
    pub on: bool,
}

/// A row of a device's idle-by-class table.
pub struct ClassRow {
    pub name: &'static str,
    pub what: &'static str,
    pub gaps: String,
    pub idle: String,
    pub share: String,
}

/// One of a device's longest gaps.
pub struct GapRow {
    pub start: String,
    pub duration: String,
    pub class: String,
    pub chip: Option<Chip>,
    /// A location that is not a line (e.g. `<driver-internal>`).
    pub place: String,
}

/// The utilization part of one device.
pub struct DeviceView {
    pub heading: String,
    pub summary: String,
    pub chart: String,
    pub legend: String,
    pub caption: String,
    pub classes: Vec<ClassRow>,
    pub gaps: Vec<GapRow>,
}

/// One telemetry chart.
pub struct TelChart {
    pub title: String,
    pub svg: String,
    /// A legend (HTML from `charts::legend`); empty for one series.
    pub legend: String,
    pub note: String,
}

/// The telemetry part of one device.
pub struct TelemetryView {
    pub heading: String,
    pub summary: String,
    pub charts: Vec<TelChart>,
}

pub struct ScopeView {
    pub name: String,
    pub depth_class: String,
    pub count: String,
    pub wall: String,
    pub busy: String,
    pub kernels: String,
    pub syncs: String,
    pub blocked: String,
    pub note: String,
}

pub struct RangeView {
    pub name: String,
    pub count: String,
    pub wall: String,
    pub max: String,
    pub busy: String,
    pub cross_thread: String,
}

pub struct KernelView {
    pub name: String,
    pub short: String,
    pub href: String,
    pub device: i64,
    pub launches: String,
    pub total: String,
    pub mean: String,
    pub p50: String,
    pub p99: String,
    pub busy_share: String,
    pub occupancy: String,
    pub limiter: String,
    pub registers: String,
}

#[derive(Template)]
#[template(path = "session.html")]
struct SessionPage {
    title: String,
    nav: Option<Nav>,
    id: String,
    host: String,
    command: String,
    start: String,
    duration: String,
    warnings: Vec<String>,
    ingest_error: String,
    /// Why there is nothing more to show yet (not analysed); empty when analysed.
    pending: String,
    stats: Vec<Stat>,
    /// The findings in the analysis's order (filtered by `category` when one is chosen): the
    /// first [`TOP_CARDS`] shown open (all when filtered), the rest after them.
    top: Vec<Card>,
    rest: Vec<Card>,
    /// Findings not shown (over [`MAX_CARDS`]).
    cards_more: usize,
    /// Findings in all (before the filter).
    findings: usize,
    /// The chosen category; empty for all.
    category: String,
    filters: Vec<Filter>,
    devices: Vec<DeviceView>,
    /// What the host was doing while the GPU idled (web::hostview), when the findings say.
    idle_host: Option<IdleBreakdown>,
    /// Memory over time per device with the holders at the peak (web::memory), when recorded.
    memory: Vec<MemChart>,
    telemetry: Vec<TelemetryView>,
    scopes: Vec<ScopeView>,
    scopes_more: usize,
    ranges: Vec<RangeView>,
    ranges_more: usize,
    kernels: Vec<KernelView>,
    kernels_more: i64,
}

impl SessionPage {
    /// The page's head (title, the session's row, its ingest state) with every section empty.
    fn head(s: &SessionRow, nav: Option<Nav>) -> SessionPage {
        SessionPage {
            title: if s.app.is_empty() {
                s.id.clone()
            } else {
                s.app.clone()
            },
            nav,
            id: s.id.clone(),
            host: s.host.clone(),
            command: s.command.clone(),
            start: fmt::time(s.start_ns),
            duration: fmt::dur(s.wall_ns),
            warnings: s.warnings.clone(),
            ingest_error: s.ingest_error.clone(),
            pending: pending_text(s),
            stats: Vec::new(),
            top: Vec::new(),
            rest: Vec::new(),
            cards_more: 0,
            findings: 0,
            category: String::new(),
            filters: Vec::new(),
            devices: Vec::new(),
            idle_host: None,
            memory: Vec::new(),
            telemetry: Vec::new(),
            scopes: Vec::new(),
            scopes_more: 0,
            ranges: Vec::new(),
            ranges_more: 0,
            kernels: Vec::new(),
            kernels_more: 0,
        }
    }
}

/// The session page's query: the category the findings list is filtered by.
#[derive(Deserialize, Default)]
pub struct SessionQuery {
    #[serde(default)]
    pub category: Option<String>,
}

pub async fn page(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(q): Query<SessionQuery>,
    v: Viewer,
) -> Result<Response, WebError> {
    let p = v.project_id.as_str();
    let s = data::session(&st, p, &id).await?;
    let ready = s.ingest == "ready";
    let mut page = SessionPage::head(&s, Some(v.nav()));
    if !ready {
        return render(&page);
    }
    let timeline: Timeline = data::doc(&st, p, &id, "timeline")
        .await?
        .unwrap_or_default();
    let header: HeaderDoc = data::doc(&st, p, &id, "header").await?.unwrap_or_default();
    let head: Option<Headline> = data::doc(&st, p, &id, "headline").await?;
    page.stats = headline(&s, head.as_ref());
    let insights = st.db.insights(p, &id).await?;
    page.idle_host = hostview::idle_breakdown(&insights, &id);
    findings_list(&mut page, &insights, &id, q.category.as_deref());
    let gpu_name = |d: u32| {
        header
            .gpus
            .iter()
            .find(|g| g.index == d)
            .map(|g| format!("GPU {d} · {}", g.name))
            .unwrap_or_else(|| format!("GPU {d}"))
    };
    page.devices = timeline
        .devices
        .iter()
        .take(MAX_DEVICES)
        .map(|d| device_view(d, &id, &gpu_name(d.device)))
        .collect();
    let mem: MemoryView = data::doc(&st, p, &id, "memory").await?.unwrap_or_default();
    page.memory = memory::charts(&mem, &id, gpu_name)
        .into_iter()
        .take(MAX_DEVICES)
        .collect();
    let tel: TelemetryDoc = data::doc(&st, p, &id, "telemetry")
        .await?
        .unwrap_or_default();
    page.telemetry = tel
        .devices
        .iter()
        .filter(|d| !d.samples.is_empty())
        .take(MAX_DEVICES)
        .map(|d| telemetry_view(d, tel.origin_ns, &gpu_name(d.device)))
        .collect();
    let sc: ScopesDoc = data::doc(&st, p, &id, "scopes").await?.unwrap_or_default();
    page.scopes = sc.scopes.iter().take(SCOPE_ROWS).map(scope_view).collect();
    page.scopes_more = sc.scopes_total.max(sc.scopes.len()) - page.scopes.len();
    page.ranges = sc.ranges.iter().take(RANGE_ROWS).map(range_view).collect();
    page.ranges_more = sc.ranges_total.max(sc.ranges.len()) - page.ranges.len();
    let (rows, n) = st.db.top_kernels(p, &id, KERNEL_ROWS).await?;
    page.kernels = rows.iter().map(|k| kernel_view(k, &id)).collect();
    distinct_kernel_names(&mut page.kernels, &rows);
    page.kernels_more = (n - page.kernels.len() as i64).max(0);
    render(&page)
}

/// The findings list of the page: every insight in stored (the analysis's) order, or those of
/// `category`; and the filters, one per category present, with counts.
fn findings_list(page: &mut SessionPage, rows: &[InsightRow], id: &str, category: Option<&str>) {
    let category = category
        .filter(|c| rows.iter().any(|r| r.category == *c))
        .unwrap_or("");
    let base = format!("/sessions/{}", url_encode(id));
    page.findings = rows.len();
    page.category = category.to_string();
    page.filters = std::iter::once(Filter {
        label: "all".into(),
        href: format!("{base}#insights"),
        count: rows.len(),
        on: category.is_empty(),
    })
    .chain(cards::categories(rows).into_iter().map(|(c, n)| Filter {
        label: c.to_string(),
        href: format!("{base}?category={}#insights", url_encode(c)),
        count: n,
        on: c == category,
    }))
    .collect();
    let mut shown: Vec<Card> = rows
        .iter()
        .filter(|r| category.is_empty() || r.category == category)
        .map(|r| Card::from_row(r, id))
        .collect();
    page.cards_more = shown.len().saturating_sub(MAX_CARDS);
    shown.truncate(MAX_CARDS);
    let open = if category.is_empty() {
        TOP_CARDS
    } else {
        MAX_CARDS
    };
    page.rest = shown.split_off(open.min(shown.len()));
    page.top = shown;
}

/// What a session that is not analysed (yet) says instead of its figures.
fn pending_text(s: &SessionRow) -> String {
    let upload = if s.state == "complete" {
        "uploaded".to_string()
    } else {
        format!(
            "upload {} ({} received so far)",
            s.state,
            fmt::bytes(s.bytes)
        )
    };
    match s.ingest.as_str() {
        "ready" => String::new(),
        "pending" => format!("Not analysed yet: waiting for analysis (ingest pending; {upload})."),
        "running" => format!("Not analysed yet: the analysis is running (ingest running; {upload})."),
        "corrupt" => format!(
            "The files did not decode to a gpufl session, so there is nothing to show (ingest corrupt; {upload})."
        ),
        "failed" => format!(
            "The analysis failed and is not tried again until a newer gpufl's analysis; the reason is above (ingest failed; {upload})."
        ),
        "too_large" => format!(
            "Too large to analyse on this server; the reason is above (ingest too_large; {upload})."
        ),
        "none" | "" => format!(
            "Not analysed yet: the upload is not complete (ingest none; {upload})."
        ),
        other => format!("Not analysed yet (ingest {other}; {upload})."),
    }
}

/// The headline boxes: the analysis's headline figures (`gpufl_analysis::Headline`, stored by
/// ingest as the `headline` document), under the names every view gives them
/// (`gpufl_analysis::headline::names`), formatted as `gpufl report` and `gpufl info` print them;
/// then the top severity. A session analysed before the document existed shows its row's figures.
fn headline(s: &SessionRow, h: Option<&Headline>) -> Vec<Stat> {
    let stat = |key, value: String, tip: String| Stat {
        key,
        value,
        class: "",
        tip,
    };
    let sev = fmt::severity(s.top_severity);
    let top = Stat {
        key: "top severity",
        value: if sev.is_empty() {
            "none".into()
        } else {
            sev.into()
        },
        class: fmt::severity_class(s.top_severity),
        tip: "the highest severity of the session's insights".into(),
    };
    let Some(h) = h else {
        return vec![
            stat(names::WALL, fmt::dur(s.wall_ns), WALL_TIP.into()),
            stat(names::GPU_BUSY, fmt_pct(s.busy_pct()), BUSY_TIP.into()),
            stat(
                names::KERNELS,
                fmt::count(s.kernels),
                "kernel executions".into(),
            ),
            stat(names::SYNCS, fmt::count(s.syncs), "synchronizations".into()),
            stat(
                names::IN_SYNCS,
                fmt::dur(s.blocked_ns),
                "host time blocked in synchronizations".into(),
            ),
            top,
        ];
    };
    let (low, chunks) = h.low_chunks();
    let (of_observed, in_windows) = if h.always_on {
        (
            " of the GPU-observed time (always-on)",
            " (in the windows only)",
        )
    } else {
        ("", "")
    };
    let mut out = vec![
        stat(names::WALL, fmt_duration(h.wall_ns), WALL_TIP.into()),
        stat(
            names::GPU_BUSY,
            fmt_pct(h.gpu_busy_pct),
            format!("{BUSY_TIP}{of_observed}: {}", fmt_duration(h.gpu_busy_ns)),
        ),
        stat(
            names::KERNELS,
            h.kernels.to_string(),
            format!("kernel executions{in_windows}"),
        ),
        stat(names::SYNCS, h.syncs.to_string(), "synchronizations".into()),
        stat(
            names::HOST_BLOCKED,
            fmt_duration(h.host_blocked_ns),
            format!(
                "host time waiting for the GPU: {} {}, {} {} ({} calls)",
                names::IN_SYNCS,
                fmt_duration(h.sync_blocked_ns),
                names::IN_BLOCKING_COPIES,
                fmt_duration(h.copy_blocked_ns),
                h.blocking_copies
            ),
        ),
    ];
    if !h.devices.is_empty() {
        out.push(stat(
            names::GPU_IDLE,
            fmt_duration(h.gpu_idle_ns),
            format!(
                "gaps between GPU work within each device's active range ({}), summed over devices",
                fmt_duration(h.gpu_active_ns)
            ),
        ));
    }
    if chunks > 0 {
        out.push(stat(
            names::LOW_CHUNKS,
            format!("{low} of {chunks}"),
            "chunks of each device's active range busy less than half the time, one-off pauses left out".into(),
        ));
    }
    out.push(top);
    out
}

const WALL_TIP: &str = "first to last timed record of the session";
const BUSY_TIP: &str = "kernels, copies and memsets (union per device) over the wall time";

// ---------------------------------------------------------------------------------------------
// Utilization over time
// ---------------------------------------------------------------------------------------------

/// Segments of a utilization column, bottom first: (name, what it means).
const SEGMENTS: [(&str, &str); 6] = [
    ("busy", "kernels, copies or memsets running"),
    (
        "idle: sync",
        "the issuing thread was blocked in a synchronization or blocking copy",
    ),
    (
        "idle: launch",
        "the host issued the next work only after the GPU ran out of it",
    ),
    (
        "idle: other",
        "the next work was already queued (dependencies, other devices)",
    ),
    (
        "idle: kernel wait",
        "gaps under 5µs between queued ops (not actionable)",
    ),
    ("not observed", "paused or outside the recording's windows"),
];

fn secs(ns: u64) -> String {
    format!("{:.3}s", ns as f64 / 1e9)
}

fn share_pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64 * 100.0
    }
}

fn device_view(d: &TDevice, session: &str, heading: &str) -> DeviceView {
    let names: Vec<String> = SEGMENTS.iter().map(|s| s.0.to_string()).collect();
    let columns: Vec<Column> = d
        .chunks
        .iter()
        .take(MAX_POINTS)
        .map(|c| {
            let dur = c.duration_ns.max(1);
            let v = [
                c.busy_ns,
                c.idle_ns.sync,
                c.idle_ns.launch,
                c.idle_ns.other,
                c.idle_ns.kernel_wait,
                c.unobserved_ns,
            ];
            let mut label = format!(
                "{}–{}: busy {}{}",
                secs(c.start_offset_ns),
                secs(c.start_offset_ns + c.duration_ns),
                fmt::pct(c.busy_share * 100.0),
                if c.low { " (low)" } else { "" }
            );
            for (i, ns) in v.iter().enumerate().skip(1) {
                if *ns > 0 {
                    label.push_str(&format!(
                        ", {} {} ({})",
                        SEGMENTS[i].0,
                        fmt::pct(share_pct(*ns, dur)),
                        fmt::dur_u(*ns)
                    ));
                }
            }
            Column {
                values: v.iter().map(|ns| share_pct(*ns, dur)).collect(),
                label,
            }
        })
        .collect();
    let chart = StackedColumns {
        title: format!("{heading}: utilization over time, idle time by cause"),
        height: 150.0,
        names,
        columns,
        y_max: Some(100.0),
        y_unit: "%".into(),
    };
    let caption = match d.chunks.first() {
        Some(c) => format!(
            "{} slices of {} each, from {} to {} after the session's start (each device's first to last GPU operation).",
            d.chunks.len(),
            fmt::dur_u(c.duration_ns),
            secs(d.active_start_offset_ns),
            secs(d.active_start_offset_ns + d.active_ns)
        ),
        None => "The device's active range is too short to slice.".into(),
    };
    let b = &d.by_class;
    let class_rows = [
        ("sync", SEGMENTS[1].1, b.sync),
        ("launch", SEGMENTS[2].1, b.launch),
        ("other", SEGMENTS[3].1, b.other),
        ("kernel wait", SEGMENTS[4].1, b.kernel_wait),
    ];
    let classes = class_rows
        .iter()
        .map(|(name, what, t)| ClassRow {
            name,
            what,
            gaps: fmt::count(t.gaps.min(i64::MAX as u64) as i64),
            idle: fmt::dur_u(t.idle_ns),
            share: fmt::pct(share_pct(t.idle_ns, d.idle_ns)),
        })
        .collect();
    let gaps = d
        .top_gaps
        .iter()
        .map(|g| {
            let (chip, place) = match &g.location {
                Some(l) if !l.file.is_empty() && !l.file.starts_with('<') => {
                    (Some(line_chip(session, l)), String::new())
                }
                Some(l) => (None, l.file.clone()),
                None => (None, String::new()),
            };
            GapRow {
                start: secs(g.start_offset_ns),
                duration: fmt::dur_u(g.duration_ns),
                class: g.class.replace('_', " "),
                chip,
                place,
            }
        })
        .collect();
    let mut summary = format!(
        "busy {} of {} active ({}); idle {} in {} gaps",
        fmt::dur_u(d.busy_ns),
        fmt::dur_u(d.active_ns),
        fmt::pct(share_pct(
            d.busy_ns,
            d.active_ns - d.paused_ns.min(d.active_ns) - d.unobserved_ns.min(d.active_ns)
        )),
        fmt::dur_u(d.idle_ns),
        fmt::count(d.gaps.min(i64::MAX as u64) as i64)
    );
    if d.low_utilization_chunks > 0 {
        summary.push_str(&format!(
            "; {} of {} chunks under 50 % busy",
            d.low_utilization_chunks,
            d.chunks.len()
        ));
    }
    if d.paused_ns > 0 {
        summary.push_str(&format!("; {} paused", fmt::dur_u(d.paused_ns)));
    }
    if d.unobserved_ns > 0 {
        summary.push_str(&format!("; {} not observed", fmt::dur_u(d.unobserved_ns)));
    }
    DeviceView {
        heading: heading.to_string(),
        summary,
        legend: chart.legend(),
        chart: chart.render(),
        caption,
        classes,
        gaps,
    }
}

/// The chip of a user line: a link to its detail.
fn line_chip(session: &str, l: &TLoc) -> Chip {
    let line = l.line.unwrap_or(0);
    let text = if line > 0 {
        format!("{}:{line}", fmt::short_path(&l.file, 48))
    } else {
        fmt::short_path(&l.file, 48)
    };
    let title = match &l.function {
        Some(f) if !f.is_empty() => format!("{}:{line} in {f}()", l.file),
        _ => format!("{}:{line}", l.file),
    };
    Chip {
        href: format!(
            "/sessions/{}/line?file={}&line={line}",
            url_encode(session),
            url_encode(&l.file)
        ),
        text,
        title,
    }
}

// ---------------------------------------------------------------------------------------------
// Telemetry
// ---------------------------------------------------------------------------------------------

/// Names of the throttle reasons (NVML's clocks-event reasons), idle left out.
const REASONS: [(u64, &str); 8] = [
    (throttle::SW_POWER_CAP, "power cap"),
    (throttle::HW_SLOWDOWN, "hardware slowdown"),
    (throttle::SW_THERMAL_SLOWDOWN, "software thermal slowdown"),
    (throttle::HW_THERMAL_SLOWDOWN, "hardware thermal slowdown"),
    (throttle::HW_POWER_BRAKE_SLOWDOWN, "power brake"),
    (throttle::APPLICATIONS_CLOCKS_SETTING, "applications clocks"),
    (throttle::SYNC_BOOST, "sync boost"),
    (throttle::DISPLAY_CLOCK_SETTING, "display clocks"),
];

/// The reasons of a throttle bitmask (idle left out), as text.
pub fn reasons(bits: u64) -> String {
    let bits = bits & !throttle::GPU_IDLE;
    let mut out: Vec<String> = REASONS
        .iter()
        .filter(|(b, _)| bits & b != 0)
        .map(|(_, n)| n.to_string())
        .collect();
    let known = REASONS.iter().fold(0, |a, (b, _)| a | b);
    if bits & !known != 0 {
        out.push(format!("other reasons (0x{:x})", bits & !known));
    }
    out.join(", ")
}

/// One bucket of consecutive samples: its time range (s) and the mean of each present metric.
struct Bucket {
    x0: f64,
    x1: f64,
    /// Throttle bits (idle left out) of any sample of the bucket.
    throttle: u64,
    sums: [(f64, u32); 9],
}

/// Metrics of a bucket, in `Bucket::sums` order.
const M_GPU: usize = 0;
const M_MEMU: usize = 1;
const M_MEM: usize = 2;
const M_TEMP: usize = 3;
const M_POWER: usize = 4;
const M_SM: usize = 5;
const M_MEMCLK: usize = 6;
const M_RX: usize = 7;
const M_TX: usize = 8;

fn metrics(t: &Telemetry) -> [Option<f64>; 9] {
    [
        t.gpu_util.map(f64::from),
        t.mem_util.map(f64::from),
        t.mem_used.map(|b| b as f64 / (1u64 << 30) as f64),
        t.temp_c.map(f64::from),
        t.power_mw.map(|p| p as f64 / 1000.0),
        t.sm_mhz.map(f64::from),
        t.mem_mhz.map(f64::from),
        t.pcie_rx_kbs.map(|k| k as f64 / 1000.0),
        t.pcie_tx_kbs.map(|k| k as f64 / 1000.0),
    ]
}

/// At most [`MAX_POINTS`] buckets of consecutive samples (sample `i` stands for the time to the
/// next one; the last for the median period).
fn buckets(samples: &[Telemetry], origin: u64) -> Vec<Bucket> {
    let x = |ts: u64| (ts as f64 - origin as f64) / 1e9;
    let n = samples.len();
    let mut periods: Vec<u64> = samples
        .windows(2)
        .map(|w| w[1].ts.saturating_sub(w[0].ts))
        .collect();
    periods.sort_unstable();
    let period = periods.get(periods.len() / 2).copied().unwrap_or(0);
    let per = n.div_ceil(MAX_POINTS).max(1);
    let mut out = Vec::with_capacity(n.div_ceil(per));
    for (bi, chunk) in samples.chunks(per).enumerate() {
        let next = samples.get((bi + 1) * per).map(|t| t.ts);
        let last = chunk[chunk.len() - 1].ts;
        let mut b = Bucket {
            x0: x(chunk[0].ts),
            x1: x(next.unwrap_or(last + period)),
            throttle: 0,
            sums: [(0.0, 0); 9],
        };
        for t in chunk {
            b.throttle |= t.throttle.unwrap_or(0) & !throttle::GPU_IDLE;
            for (s, m) in b.sums.iter_mut().zip(metrics(t)) {
                if let Some(v) = m {
                    if v.is_finite() {
                        s.0 += v;
                        s.1 += 1;
                    }
                }
            }
        }
        out.push(b);
    }
    out
}

fn series(bs: &[Bucket], name: &str, m: usize) -> Series {
    Series {
        name: name.to_string(),
        points: bs
            .iter()
            .filter(|b| b.sums[m].1 > 0)
            .map(|b| (b.x0, b.sums[m].0 / f64::from(b.sums[m].1)))
            .collect(),
    }
}

/// A band per run of buckets with the same throttle reasons (idle left out).
fn throttle_bands(bs: &[Bucket]) -> Vec<Band> {
    let mut out: Vec<Band> = Vec::new();
    let mut run: Option<(f64, f64, u64)> = None;
    for b in bs {
        match run {
            Some((x0, _, bits)) if bits == b.throttle => run = Some((x0, b.x1, bits)),
            _ => {
                if let Some((x0, x1, bits)) = run.take() {
                    if bits != 0 {
                        out.push(band(x0, x1, bits));
                    }
                }
                run = Some((b.x0, b.x1, b.throttle));
            }
        }
    }
    if let Some((x0, x1, bits)) = run {
        if bits != 0 {
            out.push(band(x0, x1, bits));
        }
    }
    out
}

fn band(x0: f64, x1: f64, bits: u64) -> Band {
    Band {
        x0,
        x1,
        label: format!("{:.2}s–{:.2}s: {}", x0, x1, reasons(bits)),
    }
}

fn telemetry_view(d: &TelemetryDevice, origin: u64, heading: &str) -> TelemetryView {
    let bs = buckets(&d.samples, origin);
    let mut charts_out = Vec::new();
    let mut chart = |title: &str,
                     series_list: Vec<Series>,
                     y_max: Option<f64>,
                     unit: &str,
                     bands: Vec<Band>,
                     note: String| {
        let series_list: Vec<Series> = series_list
            .into_iter()
            .filter(|s| !s.points.is_empty())
            .collect();
        if series_list.is_empty() {
            return;
        }
        let legend = if series_list.len() > 1 {
            charts::legend(
                &series_list
                    .iter()
                    .map(|s| s.name.clone())
                    .collect::<Vec<_>>(),
            )
        } else {
            String::new()
        };
        let c = LineChart {
            title: format!("{heading}: {title}"),
            height: 220.0,
            series: series_list,
            bands,
            marks: Vec::new(),
            y_max,
            y_unit: unit.to_string(),
            x_unit: "s".into(),
        };
        charts_out.push(TelChart {
            title: title.to_string(),
            svg: c.render(),
            legend,
            note,
        });
    };
    chart(
        "GPU utilization",
        vec![
            series(&bs, "GPU utilization %", M_GPU),
            series(&bs, "memory utilization %", M_MEMU),
        ],
        Some(100.0),
        "%",
        Vec::new(),
        String::new(),
    );
    let mem_total = d.samples.iter().filter_map(|t| t.mem_total).max();
    chart(
        "Memory used",
        vec![series(&bs, "memory used (GiB)", M_MEM)],
        mem_total.map(|b| b as f64 / (1u64 << 30) as f64),
        " GiB",
        Vec::new(),
        mem_total
            .map(|b| format!("of {}", fmt::bytes(b.min(i64::MAX as u64) as i64)))
            .unwrap_or_default(),
    );
    chart(
        "Temperature",
        vec![series(&bs, "temperature (°C)", M_TEMP)],
        None,
        "°C",
        Vec::new(),
        String::new(),
    );
    chart(
        "Power",
        vec![series(&bs, "power (W)", M_POWER)],
        None,
        " W",
        Vec::new(),
        String::new(),
    );
    let bands = throttle_bands(&bs);
    let mut why: Vec<String> = Vec::new();
    let all_bits = bs.iter().fold(0, |a, b| a | b.throttle);
    if all_bits != 0 {
        why.push(format!(
            "shaded: clocks throttled ({}), {} interval{}",
            reasons(all_bits),
            bands.len(),
            if bands.len() == 1 { "" } else { "s" }
        ));
    } else if d.samples.iter().any(|t| t.throttle.is_some()) {
        why.push("no throttling".into());
    }
    let sm_max = d.samples.iter().filter_map(|t| t.sm_max_mhz).max();
    if let Some(m) = sm_max {
        why.push(format!("max SM clock {m} MHz"));
    }
    chart(
        "Clocks",
        vec![
            series(&bs, "SM clock (MHz)", M_SM),
            series(&bs, "memory clock (MHz)", M_MEMCLK),
        ],
        None,
        " MHz",
        bands,
        why.join("; "),
    );
    chart(
        "PCIe",
        vec![
            series(&bs, "PCIe rx, host to GPU (MB/s)", M_RX),
            series(&bs, "PCIe tx, GPU to host (MB/s)", M_TX),
        ],
        None,
        " MB/s",
        Vec::new(),
        String::new(),
    );
    let span = match (d.samples.first(), d.samples.last()) {
        (Some(a), Some(b)) => b.ts.saturating_sub(a.ts),
        _ => 0,
    };
    let mut summary = format!(
        "{} samples over {}",
        fmt::count(d.samples.len() as i64),
        fmt::dur_u(span)
    );
    if d.every > 1 {
        summary.push_str(&format!(" (every {}th sample kept)", d.every));
    }
    TelemetryView {
        heading: heading.to_string(),
        summary,
        charts: charts_out,
    }
}

// ---------------------------------------------------------------------------------------------
// Scopes and kernels
// ---------------------------------------------------------------------------------------------

fn c(n: u64) -> String {
    fmt::count(n.min(i64::MAX as u64) as i64)
}

fn scope_view(r: &ScopeRow) -> ScopeView {
    let mut note = Vec::new();
    if r.nvtx {
        note.push("NVTX".to_string());
    }
    if r.unclosed > 0 {
        note.push(format!("{} never closed", c(r.unclosed)));
    }
    if !r.kernels_by_launch && r.kernels > 0 {
        note.push("kernels by GPU start".to_string());
    }
    ScopeView {
        name: r.name.clone(),
        depth_class: format!("d{}", r.depth.min(12)),
        count: c(r.count),
        wall: fmt::dur_u(r.wall_ns),
        busy: fmt::dur_u(r.gpu_busy_ns),
        kernels: c(r.kernels),
        syncs: c(r.syncs),
        blocked: fmt::dur_u(r.sync_blocked_ns),
        note: note.join(", "),
    }
}

fn range_view(r: &RangeRow) -> RangeView {
    RangeView {
        name: r.name.clone(),
        count: c(r.count),
        wall: fmt::dur_u(r.wall_ns),
        max: fmt::dur_u(r.max_ns),
        busy: fmt::dur_u(r.gpu_busy_ns),
        cross_thread: c(r.cross_thread),
    }
}

/// The first `n` characters of a name, with `…` after when cut.
fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// Where rows would read the same (template instantiations: `vectorized_elementwise_kernel` 15
/// times), enough of their signatures to tell them apart
/// ([`gpufl_analysis::kernels::distinct_names`]).
fn distinct_kernel_names(views: &mut [KernelView], rows: &[KernelRow]) {
    let shorts: Vec<String> = rows
        .iter()
        .map(|k| gpufl_analysis::kernels::short_name(&k.name).to_string())
        .collect();
    let full: Vec<&str> = rows.iter().map(|k| k.name.as_str()).collect();
    // `cut` keeps 79 characters and `…`: rows must differ within those.
    let names = gpufl_analysis::kernels::distinct_names(&shorts, &full, KERNEL_NAME_CHARS - 1);
    for (v, n) in views.iter_mut().zip(names) {
        v.short = fmt::cut(&n, KERNEL_NAME_CHARS);
    }
}

/// Width of a kernel's name in the session page's table.
const KERNEL_NAME_CHARS: usize = 80;

fn kernel_view(k: &KernelRow, session: &str) -> KernelView {
    let b = &k.body;
    let occ = b.get("occupancy").filter(|o| o.is_object());
    let occupancy = occ
        .and_then(|o| o.get("occupancy"))
        .and_then(Value::as_f64)
        .map(|f| fmt::pct(f * 100.0))
        .unwrap_or_else(|| "–".into());
    let limiter = occ
        .and_then(|o| o.get("limited_by"))
        .and_then(Value::as_array)
        .map(|l| {
            l.iter()
                .filter_map(Value::as_str)
                .map(|s| s.replace('_', " "))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    let regs = b
        .get("launch")
        .and_then(|l| l.get("regs"))
        .and_then(Value::as_u64);
    KernelView {
        short: fmt::cut(
            gpufl_analysis::kernels::short_name(&k.name),
            KERNEL_NAME_CHARS,
        ),
        href: format!(
            "/sessions/{}/kernel?name={}&device={}",
            url_encode(session),
            url_encode(&k.name),
            k.device
        ),
        name: k.name.clone(),
        device: k.device,
        launches: fmt::count(k.launches),
        total: fmt::dur(k.total_ns),
        mean: fmt::dur_u(u(b, "mean_ns")),
        p50: fmt::dur_u(u(b, "p50_ns")),
        p99: fmt::dur_u(u(b, "p99_ns")),
        busy_share: b
            .get("busy_share")
            .and_then(Value::as_f64)
            .map(|f| fmt::pct(f * 100.0))
            .unwrap_or_else(|| "–".into()),
        occupancy,
        limiter,
        registers: regs.map_or_else(|| "–".into(), |r| r.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(ts: u64, throttle_bits: Option<u64>, sm: u32) -> Telemetry {
        Telemetry {
            ts,
            gpu_util: Some(50),
            sm_mhz: Some(sm),
            throttle: throttle_bits,
            ..Telemetry::default()
        }
    }

    #[test]
    fn a_session_not_analysed_says_so_and_shows_no_figures() {
        let s = SessionRow {
            id: "app-1-20261122T000000Z".into(),
            app: "<b>app</b>".into(),
            state: "complete".into(),
            ingest: "pending".into(),
            ..SessionRow::default()
        };
        let mut page = SessionPage::head(&s, None);
        page.warnings = vec!["a <warning>".into()];
        let html = page.render().unwrap();
        assert!(
            html.contains("id=\"session-title\">&#60;b&#62;app&#60;/b&#62;</h1>")
                || html.contains("id=\"session-title\">&lt;b&gt;app&lt;/b&gt;</h1>"),
            "{html}"
        );
        assert!(html.contains("ingest pending"), "{html}");
        assert!(!html.contains("id=\"headline\""), "{html}");
        assert!(!html.contains("<warning>"), "{html}");
        let ready = SessionRow {
            ingest: "ready".into(),
            ..s
        };
        assert!(pending_text(&ready).is_empty());
    }

    #[test]
    fn reasons_leave_idle_out_and_name_unknown_bits() {
        assert_eq!(reasons(throttle::GPU_IDLE), "");
        assert_eq!(
            reasons(throttle::SW_POWER_CAP | throttle::GPU_IDLE),
            "power cap"
        );
        assert_eq!(
            reasons(throttle::SW_THERMAL_SLOWDOWN | 0x10000),
            "software thermal slowdown, other reasons (0x10000)"
        );
    }

    #[test]
    fn bands_follow_runs_of_throttled_samples() {
        let s: Vec<Telemetry> = (0..10u64)
            .map(|i| {
                let bits = match i {
                    2..=3 => throttle::SW_POWER_CAP,
                    6 => throttle::HW_SLOWDOWN,
                    _ => throttle::GPU_IDLE,
                };
                sample(i * 100_000_000, Some(bits), 1000)
            })
            .collect();
        let b = buckets(&s, 0);
        assert_eq!(b.len(), 10);
        let bands = throttle_bands(&b);
        assert_eq!(bands.len(), 2, "{:?}", bands);
        assert!((bands[0].x0 - 0.2).abs() < 1e-9 && (bands[0].x1 - 0.4).abs() < 1e-9);
        assert!(bands[0].label.contains("power cap"));
        assert!(bands[1].label.contains("hardware slowdown"));
    }

    #[test]
    fn long_series_are_cut_to_max_points() {
        let s: Vec<Telemetry> = (0..2000u64)
            .map(|i| sample(i * 1000, None, 1000 + i as u32))
            .collect();
        let b = buckets(&s, 0);
        assert!(b.len() <= MAX_POINTS, "{}", b.len());
        let sm = series(&b, "sm", M_SM);
        assert_eq!(sm.points.len(), b.len());
        assert!(throttle_bands(&b).is_empty());
    }
}
