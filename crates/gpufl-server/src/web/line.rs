//! The line page (`/sessions/{id}/line?file=F&line=N`), the target of the insight chips: the
//! source text around the line as the recorder stored it, the synchronizations and copies issued
//! there (count, time, distribution), what the host did there (host samples by thread state, the
//! CUDA calls that held the thread), its split by library line (each linking to that library
//! line's page), the whole Python + native stack, the kernels launched from the line with their
//! stats (each linking to its kernel page) and the insights located there. A library line (the
//! frame nearest the CUDA call in a library, the cards' library chip) has a page of its own at the
//! same address: the user lines' locations through it, split by user line, and the insights
//! through it.
//!
//! Reads the session's `lines` document (gpufl-analysis's line details, at most 500 lines, one
//! entry per distinct location at that line: e.g. per library frame inside it), its `sources`
//! document (the texts of the lines the frames name) and the kernel rows of the kernels launched
//! there (by name), and the host samples and host calls at the line from its `hostlines` document
//! ([`super::hostview`]).

use super::cards::Card;
use super::charts::Bars;
use super::data;
use super::hostview::{self, HostAtLine, HostLineDoc};
use super::{fmt, render, url_encode, Nav, Viewer, WebError};
use crate::store::KernelRow;
use crate::AppState;
use askama::Template;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use gpufl_analysis::kernels::short_name;
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

/// Lines of source shown either side of the line.
pub const CONTEXT: u32 = 12;
/// Kernels listed, at most.
pub const MAX_KERNELS: usize = 50;
/// Stacks shown (one per location at the line, the most time first), at most.
pub const MAX_STACKS: usize = 3;

#[derive(Deserialize, Default)]
pub struct LineQuery {
    file: Option<String>,
    line: Option<String>,
}

/// A source location as the `lines` document stores it.
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct LocDoc {
    pub file: String,
    pub line: Option<u32>,
    pub function: Option<String>,
    pub text: Option<String>,
    pub library: Option<Box<LocDoc>>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct LineKernelDoc {
    pub name: String,
    pub launches: u64,
    pub total_ns: u64,
}

/// A frame of a stack (the `stacks` document's, or a line's own in an older analysis).
pub type FrameDoc = crate::linedoc::Frame;

/// One entry of the `lines` document (gpufl_analysis::lines::LineDetail); fields an older
/// analysis did not write read as empty.
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct LineDoc {
    pub location: LocDoc,
    pub syncs: u64,
    pub sync_blocked_ns: u64,
    pub sync_p50_ns: u64,
    pub sync_p99_ns: u64,
    pub sync_max_ns: u64,
    pub sync_hist: Vec<u64>,
    pub copies: u64,
    pub copy_ns: u64,
    pub copy_bytes: u64,
    pub launches: u64,
    pub kernels: Vec<LineKernelDoc>,
    /// Its stack (an older analysis's documents), or…
    pub stack: Vec<FrameDoc>,
    /// …its index in the `stacks` document.
    pub stack_ref: Option<usize>,
}

/// One file of the `sources` document.
#[derive(Deserialize, Default)]
#[serde(default)]
struct SourceDoc {
    file: String,
    lines: Vec<(u32, String)>,
}

/// A row of the source listing: a line, or a gap (`⋮`).
pub struct SrcLine {
    pub gap: bool,
    pub n: u32,
    pub text: String,
    pub hit: bool,
}

/// One distinct location at the line: on a user line's page, per library line inside it; on a
/// library line's page, per user line that called it.
pub struct Variant {
    pub via: String,
    /// That line's page; empty for none (the user line calling CUDA directly).
    pub href: String,
    pub title: String,
    pub syncs: String,
    pub blocked: String,
    pub p50: String,
    pub p99: String,
    pub max: String,
    pub copies: String,
    pub launches: String,
}

pub struct FrameView {
    pub user: bool,
    pub kind: String,
    pub function: String,
    pub loc: String,
    pub loc_title: String,
    pub module: String,
    pub text: String,
}

pub struct StackView {
    pub label: String,
    pub groups: Vec<FrameGroup>,
}

/// Consecutive frames of a stack: shown, or (a run of [`FOLD_MIN`] or more native frames that
/// are not the user's) folded under a summary.
pub struct FrameGroup {
    /// The 1-based number of its first frame in the stack.
    pub start: usize,
    pub folded: bool,
    /// `12 native frames in libcupti.so, libjax.so`.
    pub summary: String,
    pub frames: Vec<FrameView>,
}

/// Native frames in a row folded under one summary, at least.
pub const FOLD_MIN: usize = 4;

/// Split frames into shown runs and folded runs of native library frames.
pub fn fold_frames(frames: Vec<FrameView>) -> Vec<FrameGroup> {
    let foldable = |f: &FrameView| f.kind == "native" && !f.user;
    let mut groups: Vec<FrameGroup> = Vec::new();
    let mut i = 0;
    let mut it = frames.into_iter().peekable();
    while let Some(f) = it.next() {
        let start = i + 1;
        let fold = foldable(&f);
        let mut run = vec![f];
        i += 1;
        while let Some(n) = it.peek() {
            if foldable(n) != fold {
                break;
            }
            run.push(it.next().expect("peeked"));
            i += 1;
        }
        let folded = fold && run.len() >= FOLD_MIN;
        let summary = if folded {
            let mut mods: Vec<&str> = Vec::new();
            for f in &run {
                let m = f.module.rsplit('/').next().unwrap_or("");
                if !m.is_empty() && !mods.contains(&m) {
                    mods.push(m);
                }
            }
            let more = mods.len().saturating_sub(3);
            let mut s = format!("{} native frames", run.len());
            if !mods.is_empty() {
                s.push_str(" in ");
                s.push_str(&mods[..mods.len().min(3)].join(", "));
                if more > 0 {
                    s.push_str(&format!(" and {more} more"));
                }
            }
            s
        } else {
            String::new()
        };
        // A shown run after a shown run (a short native run between Python frames) joins it.
        match groups.last_mut() {
            Some(g) if !g.folded && !folded => g.frames.extend(run),
            _ => groups.push(FrameGroup {
                start,
                folded,
                summary,
                frames: run,
            }),
        }
    }
    groups
}

pub struct KernelLink {
    pub href: String,
    pub device: i64,
}

pub struct KernelView {
    pub name: String,
    pub short: String,
    pub links: Vec<KernelLink>,
    pub launches: String,
    pub gpu: String,
    pub mean: String,
    pub p50: String,
    pub p99: String,
}

#[derive(Template)]
#[template(path = "line.html")]
pub struct LinePage {
    pub title: String,
    pub nav: Option<Nav>,
    pub session: String,
    pub session_href: String,
    pub file: String,
    pub line: u32,
    pub function: String,
    /// A library line (the page gathers the user lines' locations through it).
    pub library: bool,
    pub source: Vec<SrcLine>,
    /// The recorder stored texts of this file (lines elsewhere in it).
    pub file_has_text: bool,
    pub syncs: u64,
    pub sync_blocked: String,
    pub sync_p50: String,
    pub sync_p99: String,
    pub sync_max: String,
    /// Whose median and p99 these are, when several locations at the line synchronized.
    pub pct_note: String,
    /// The distribution's SVG (from web::charts), empty when not stored.
    pub sync_chart: String,
    pub variants: Vec<Variant>,
    pub copies: u64,
    pub copy_time: String,
    pub copy_bytes: String,
    pub launches: u64,
    pub stacks: Vec<StackView>,
    /// Locations with a stack beyond those shown.
    pub stacks_more: usize,
    pub kernels: Vec<KernelView>,
    pub cards: Vec<Card>,
    /// The host samples and host calls at the line (web::hostview), when any.
    pub host: Option<HostAtLine>,
    /// The allocations at the line per device (web::memory), when the session has `mem` records.
    pub allocs: Vec<super::memory::LineAllocs>,
    /// The session has `mem` records.
    pub has_mem: bool,
}

fn bad(why: &str) -> WebError {
    WebError::BadRequest(why.to_string())
}

/// The listing of `file` around `line`: every line with a text within [`CONTEXT`], gaps as `⋮`,
/// the line itself always (with `hit_text` when the sources have none).
pub fn listing(lines: &[(u32, String)], line: u32, hit_text: Option<&str>) -> Vec<SrcLine> {
    let lo = line.saturating_sub(CONTEXT);
    let hi = line.saturating_add(CONTEXT);
    let mut near: BTreeMap<u32, &str> = lines
        .iter()
        .filter(|(n, _)| (lo..=hi).contains(n))
        .map(|(n, t)| (*n, t.as_str()))
        .collect();
    if near.is_empty() && hit_text.is_none() {
        return Vec::new();
    }
    near.entry(line).or_insert(hit_text.unwrap_or(""));
    let mut out = Vec::new();
    let mut prev: Option<u32> = None;
    for (&n, &t) in &near {
        if prev.is_some_and(|p| n > p + 1) {
            out.push(SrcLine {
                gap: true,
                n: 0,
                text: String::new(),
                hit: false,
            });
        }
        out.push(SrcLine {
            gap: false,
            n,
            text: t.to_string(),
            hit: n == line,
        });
        prev = Some(n);
    }
    out
}

/// Labels of the power-of-4 buckets from 1 µs (gpufl_analysis::lines::log4_us_hist).
fn log4_label(i: usize) -> (String, String) {
    if i == 0 {
        return ("<1µs".into(), "shorter than 1µs".into());
    }
    let lo = 4u64.saturating_pow(i as u32 - 1).saturating_mul(1000);
    let hi = lo.saturating_mul(4);
    (
        fmt::dur_u(lo),
        format!("{} to {}", fmt::dur_u(lo), fmt::dur_u(hi)),
    )
}

/// The sync-duration bars of a histogram (counts per bucket).
pub fn sync_bars(hist: &[u64]) -> String {
    if hist.iter().all(|&n| n == 0) {
        return String::new();
    }
    let bars = hist
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let (label, range) = log4_label(i);
            let tip = format!(
                "{} synchronization{} of {range}",
                fmt::count(n as i64),
                if n == 1 { "" } else { "s" }
            );
            (label, n as f64, tip)
        })
        .collect();
    Bars {
        title: "Synchronization durations (count per duration bucket)".into(),
        height: 150.0,
        bars,
    }
    .render()
}

fn frames_view(
    stack: &[FrameDoc],
    user_files: &HashSet<&str>,
    file: &str,
    line: u32,
) -> Vec<FrameView> {
    stack
        .iter()
        .map(|f| {
            let ffile = f.file.as_deref().unwrap_or("");
            let user = (ffile == file && f.line == Some(line))
                || (!ffile.is_empty() && user_files.contains(ffile));
            FrameView {
                user,
                kind: f.kind.clone(),
                function: f.function.clone().unwrap_or_default(),
                loc: if ffile.is_empty() {
                    String::new()
                } else {
                    fmt::loc(ffile, f.line, 56)
                },
                loc_title: match f.line {
                    Some(l) if !ffile.is_empty() => format!("{ffile}:{l}"),
                    _ => ffile.to_string(),
                },
                module: f.module.clone().unwrap_or_default(),
                text: f.text.clone().unwrap_or_default(),
            }
        })
        .collect()
}

fn body_u(b: &serde_json::Value, k: &str) -> i64 {
    b.get(k)
        .and_then(serde_json::Value::as_u64)
        .map(|v| v.min(i64::MAX as u64) as i64)
        .unwrap_or(0)
}

/// The `file` and `line` asked for.
fn target(q: LineQuery) -> Result<(String, u32), WebError> {
    let file = q
        .file
        .filter(|f| !f.is_empty())
        .ok_or_else(|| bad("no file given (?file=…&line=…)"))?;
    let line: u32 = q
        .line
        .as_deref()
        .ok_or_else(|| bad("no line given (?file=…&line=…)"))?
        .trim()
        .parse()
        .map_err(|_| bad("line must be a line number"))?;
    Ok((file, line))
}

/// The location of the page's line in a `lines` entry: the entry's own, or (a library line's
/// page) its library frame.
fn own(d: &LineDoc, library: bool) -> &LocDoc {
    match &d.location.library {
        Some(l) if library => l,
        _ => &d.location,
    }
}

/// The function the line is in: a location's, else an insight card's.
fn function_at(here: &[&LineDoc], cards: &[Card], library: bool) -> String {
    here.iter()
        .find_map(|d| own(d, library).function.clone())
        .or_else(|| {
            cards.iter().find(|c| !c.function.is_empty()).map(|c| {
                c.function
                    .trim_start_matches("in ")
                    .trim_end_matches("()")
                    .to_string()
            })
        })
        .unwrap_or_default()
}

/// The line's text as a location or an insight card recorded it.
fn hit_text<'a>(here: &[&'a LineDoc], cards: &'a [Card], library: bool) -> Option<&'a str> {
    here.iter()
        .find_map(|d| own(d, library).text.as_deref())
        .or_else(|| {
            cards
                .iter()
                .find(|c| !c.code.is_empty())
                .map(|c| c.code.as_str())
        })
}

/// The sync-duration histogram summed over the locations at the line.
fn merged_hist(here: &[&LineDoc]) -> Vec<u64> {
    let mut hist: Vec<u64> = Vec::new();
    for d in here {
        if hist.len() < d.sync_hist.len() {
            hist.resize(d.sync_hist.len(), 0);
        }
        for (a, b) in hist.iter_mut().zip(&d.sync_hist) {
            *a = a.saturating_add(*b);
        }
    }
    hist
}

/// The page of `file:line` in session `id`.
pub fn line_href(id: &str, file: &str, line: u32) -> String {
    format!(
        "/sessions/{}/line?file={}&line={line}",
        url_encode(id),
        url_encode(file)
    )
}

/// The split of the line's locations: on a user line's page by the library line inside it
/// (whenever one is, or there are several), on a library line's page by the user line that called
/// it; each linking to that line's page.
fn variants(here: &[&LineDoc], library: bool, id: &str) -> Vec<Variant> {
    if !library && here.len() <= 1 && here.iter().all(|d| d.location.library.is_none()) {
        return Vec::new();
    }
    here.iter()
        .map(|d| {
            let other = if library {
                Some(&d.location)
            } else {
                d.location.library.as_deref()
            };
            let (via, href, title) = match other {
                Some(l) => (
                    format!(
                        "{}{}:{} in {}()",
                        if library { "from " } else { "" },
                        fmt::short_path(&l.file, 48),
                        l.line.unwrap_or(0),
                        l.function.as_deref().unwrap_or("?")
                    ),
                    l.line
                        .filter(|_| !l.file.is_empty())
                        .map(|n| line_href(id, &l.file, n))
                        .unwrap_or_default(),
                    format!("{}:{}", l.file, l.line.unwrap_or(0)),
                ),
                None => ("directly".into(), String::new(), String::new()),
            };
            Variant {
                via,
                href,
                title,
                syncs: fmt::count(d.syncs as i64),
                blocked: fmt::dur_u(d.sync_blocked_ns),
                p50: fmt::dur_u(d.sync_p50_ns),
                p99: fmt::dur_u(d.sync_p99_ns),
                max: fmt::dur_u(d.sync_max_ns),
                copies: fmt::count(d.copies as i64),
                launches: fmt::count(d.launches as i64),
            }
        })
        .collect()
}

/// Whether an insight's stored body locates it through the library line `file:line`.
fn through_library(body: &serde_json::Value, file: &str, line: u32) -> bool {
    let l = &body["location"]["library"];
    l["file"].as_str() == Some(file) && l["line"].as_u64() == Some(u64::from(line))
}

/// Whose percentiles the page shows when several locations at the line synchronized.
fn pct_note(here: &[&LineDoc], top: Option<&LineDoc>, syncs: u64) -> String {
    match (here.iter().filter(|d| d.syncs > 0).count(), top) {
        (n, Some(t)) if n > 1 => format!(
            "Median and p99 of the location with the most synchronizations ({} of them); \
             the distribution counts all {}; the locations below list each one's.",
            fmt::count(t.syncs as i64),
            fmt::count(syncs as i64)
        ),
        _ => String::new(),
    }
}

/// Stacks: one per location at the line (the longest synchronization's, else a copy's or a
/// launch's), at most [`MAX_STACKS`].
fn stacks(
    here: &[&LineDoc],
    user_files: &HashSet<&str>,
    (file, line): (&str, u32),
    library: bool,
) -> Vec<StackView> {
    here.iter()
        .filter(|d| !d.stack.is_empty())
        .take(MAX_STACKS)
        .map(|d| StackView {
            label: match &d.location.library {
                Some(_) if library => format!(
                    "from {}:{}",
                    fmt::short_path(&d.location.file, 48),
                    d.location.line.unwrap_or(0)
                ),
                Some(l) => format!(
                    "through {}:{}",
                    fmt::short_path(&l.file, 48),
                    l.line.unwrap_or(0)
                ),
                None => String::new(),
            },
            groups: fold_frames(frames_view(&d.stack, user_files, file, line)),
        })
        .collect()
}

/// Kernels launched from the line, merged over its locations: (name, launches, GPU ns), the
/// most GPU time first, at most [`MAX_KERNELS`].
fn kernels_at<'a>(here: &[&'a LineDoc]) -> Vec<(&'a str, u64, u64)> {
    let mut merged: HashMap<&str, (u64, u64)> = HashMap::new();
    for d in here {
        for k in &d.kernels {
            let e = merged.entry(k.name.as_str()).or_default();
            e.0 = e.0.saturating_add(k.launches);
            e.1 = e.1.saturating_add(k.total_ns);
        }
    }
    let mut list: Vec<(&str, u64, u64)> = merged.into_iter().map(|(n, (l, t))| (n, l, t)).collect();
    list.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(b.0)));
    list.truncate(MAX_KERNELS);
    list
}

/// The kernels launched from the line with their kernel rows' stats and a link per device; where
/// two would read the same (template instantiations), enough of their signatures to tell them
/// apart ([`gpufl_analysis::kernels::distinct_names`], at most 80 characters).
fn kernel_views(list: &[(&str, u64, u64)], rows: &[KernelRow], id: &str) -> Vec<KernelView> {
    let mut views = plain_kernel_views(list, rows, id);
    let shorts: Vec<String> = views.iter().map(|v| v.short.clone()).collect();
    let full: Vec<&str> = list.iter().map(|l| l.0).collect();
    let names = gpufl_analysis::kernels::distinct_names(&shorts, &full, 79);
    for ((v, n), s) in views.iter_mut().zip(names).zip(&shorts) {
        if n != *s {
            v.short = fmt::cut(&n, 80);
        }
    }
    views
}

fn plain_kernel_views(list: &[(&str, u64, u64)], rows: &[KernelRow], id: &str) -> Vec<KernelView> {
    list.iter()
        .map(|&(name, launches, total)| {
            let mine: Vec<&KernelRow> = rows.iter().filter(|r| r.name == name).collect();
            let best = mine.iter().max_by_key(|r| (r.launches, -r.device)).copied();
            let stat = |k: &str| {
                best.map(|r| fmt::dur(body_u(&r.body, k)))
                    .unwrap_or_else(|| "–".into())
            };
            let mut devs: Vec<i64> = mine.iter().map(|r| r.device).collect();
            devs.sort_unstable();
            KernelView {
                name: name.to_string(),
                short: short_name(name).to_string(),
                links: devs
                    .into_iter()
                    .map(|d| KernelLink {
                        href: format!(
                            "/sessions/{}/kernel?name={}&device={d}",
                            url_encode(id),
                            url_encode(name)
                        ),
                        device: d,
                    })
                    .collect(),
                launches: fmt::count(launches.min(i64::MAX as u64) as i64),
                gpu: fmt::dur_u(total),
                mean: stat("mean_ns"),
                p50: stat("p50_ns"),
                p99: stat("p99_ns"),
            }
        })
        .collect()
}

/// `GET /sessions/{id}/line?file=&line=`.
pub async fn page(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    v: Viewer,
    q: Result<Query<LineQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, WebError> {
    let Query(q) = q.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let (file, line) = target(q)?;
    let p = v.project_id.as_str();
    let session = data::session(&st, p, &id).await?;
    let mut docs: Vec<LineDoc> = data::doc(&st, p, &id, "lines").await?.unwrap_or_default();
    let at_user = |d: &LineDoc| d.location.file == file && d.location.line == Some(line);
    let at_lib = |d: &LineDoc| {
        d.location
            .library
            .as_deref()
            .is_some_and(|l| l.file == file && l.line == Some(line))
    };
    // A library line: no user location there, but user lines' locations through it.
    let library = !docs.iter().any(at_user) && docs.iter().any(at_lib);
    let at = |d: &LineDoc| if library { at_lib(d) } else { at_user(d) };
    if docs.iter().any(|d| at(d) && d.stack_ref.is_some()) {
        let stacks: Option<crate::linedoc::Stacks> = data::doc(&st, p, &id, "stacks").await?;
        if let Some(stacks) = stacks {
            for d in docs.iter_mut().filter(|d| at(d)) {
                if let Some(i) = d.stack_ref {
                    d.stack = stacks.frames_of(i);
                }
            }
        }
    }
    // Stacks shown from their first shown frame (not the recorder's, CUPTI's, the driver's).
    for d in docs.iter_mut().filter(|d| at(d)) {
        d.stack = crate::linedoc::shown(std::mem::take(&mut d.stack));
    }
    let user_files: HashSet<&str> = docs
        .iter()
        .map(|d| d.location.file.as_str())
        .filter(|f| !f.starts_with('<'))
        .collect();
    let here: Vec<&LineDoc> = docs.iter().filter(|d| at(d)).collect();
    let cards: Vec<Card> = st
        .db
        .insights(p, &id)
        .await?
        .iter()
        .filter(|r| {
            (r.file == file && r.line == i64::from(line))
                || (library && through_library(&r.body, &file, line))
        })
        .map(|r| Card::from_row(r, &id))
        .collect();
    let host_docs: Vec<HostLineDoc> = data::doc(&st, p, &id, "hostlines")
        .await?
        .unwrap_or_default();
    let host = hostview::at_line(&host_docs, &file, line);
    let host_loc = hostview::location_at(&host_docs, &file, line);
    let mem: gpufl_analysis::memview::MemoryView =
        data::doc(&st, p, &id, "memory").await?.unwrap_or_default();
    let allocs = super::memory::line_allocs(&mem, &file, line);
    if here.is_empty() && cards.is_empty() && host.is_none() && allocs.is_empty() {
        return Err(WebError::NotFound(format!(
            "nothing recorded at {file}:{line} in this session"
        )));
    }
    // Source text around the line.
    let sources: Vec<SourceDoc> = data::doc(&st, p, &id, "sources").await?.unwrap_or_default();
    let texts = sources
        .into_iter()
        .find(|s| s.file == file)
        .map(|s| s.lines)
        .unwrap_or_default();
    let list = kernels_at(&here);
    let names: Vec<&str> = list.iter().map(|k| k.0).collect();
    let rows = st.db.kernels_named(p, &id, &names).await?;
    // Synchronizations and copies: summed over the locations at the line; with one location its
    // percentiles, with several the busiest one's (the table lists each).
    let sum = |f: fn(&LineDoc) -> u64| here.iter().map(|d| f(d)).fold(0u64, u64::saturating_add);
    let syncs = sum(|d| d.syncs);
    let top = here
        .iter()
        .max_by_key(|d| (d.syncs, d.sync_blocked_ns))
        .copied();
    render(&LinePage {
        title: format!("{}:{line}", fmt::short_path(&file, 72)),
        nav: Some(v.nav()),
        session_href: format!("/sessions/{}", url_encode(&session.id)),
        session: session.id,
        function: match function_at(&here, &cards, library) {
            f if f.is_empty() => host_loc
                .and_then(|l| l.function.clone())
                .unwrap_or_default(),
            f => f,
        },
        source: listing(
            &texts,
            line,
            hit_text(&here, &cards, library).or(host_loc.and_then(|l| l.text.as_deref())),
        ),
        file_has_text: !texts.is_empty(),
        syncs,
        sync_blocked: fmt::dur_u(sum(|d| d.sync_blocked_ns)),
        sync_p50: fmt::dur_u(top.map_or(0, |d| d.sync_p50_ns)),
        sync_p99: fmt::dur_u(top.map_or(0, |d| d.sync_p99_ns)),
        pct_note: pct_note(&here, top, syncs),
        sync_max: fmt::dur_u(here.iter().map(|d| d.sync_max_ns).max().unwrap_or(0)),
        sync_chart: sync_bars(&merged_hist(&here)),
        variants: variants(&here, library, &id),
        library,
        copies: sum(|d| d.copies),
        copy_time: fmt::dur_u(sum(|d| d.copy_ns)),
        copy_bytes: fmt::bytes(sum(|d| d.copy_bytes).min(i64::MAX as u64) as i64),
        launches: sum(|d| d.launches),
        stacks_more: here
            .iter()
            .filter(|d| !d.stack.is_empty())
            .count()
            .saturating_sub(MAX_STACKS),
        stacks: stacks(&here, &user_files, (&file, line), library),
        kernels: kernel_views(&list, &rows, &id),
        cards,
        host,
        allocs,
        has_mem: !mem.devices.is_empty(),
        file,
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fv(kind: &str, module: &str, user: bool) -> FrameView {
        FrameView {
            user,
            kind: kind.into(),
            function: "f".into(),
            loc: String::new(),
            loc_title: String::new(),
            module: module.into(),
            text: String::new(),
        }
    }

    #[test]
    fn long_runs_of_native_library_frames_fold_and_the_rest_shows() {
        let mut frames: Vec<FrameView> = (0..6)
            .map(|i| {
                fv(
                    "native",
                    if i < 4 {
                        "/x/libcupti.so"
                    } else {
                        "/y/libjax.so"
                    },
                    false,
                )
            })
            .collect();
        frames.push(fv("python", "", true));
        frames.push(fv("native", "/z/libpython.so", false));
        frames.push(fv("python", "", false));
        frames.extend((0..3).map(|_| fv("native", "/z/libpython.so", false)));
        let g = fold_frames(frames);
        assert_eq!(g.len(), 2, "one folded run, then one shown run");
        assert!(g[0].folded);
        assert_eq!(g[0].start, 1);
        assert_eq!(g[0].summary, "6 native frames in libcupti.so, libjax.so");
        assert!(!g[1].folded);
        assert_eq!(g[1].start, 7);
        assert_eq!(g[1].frames.len(), 6, "short native runs stay shown");
        assert!(fold_frames(Vec::new()).is_empty());
    }

    #[test]
    fn listing_shows_gaps_and_the_hit_line() {
        let lines: Vec<(u32, String)> = [1u32, 30, 40, 41, 43, 52, 53, 60]
            .iter()
            .map(|&n| (n, format!("l{n}")))
            .collect();
        let l = listing(&lines, 42, Some("hit"));
        let shown: Vec<String> = l
            .iter()
            .map(|s| {
                if s.gap {
                    "⋮".into()
                } else {
                    format!("{}{}", s.n, if s.hit { "*" } else { "" })
                }
            })
            .collect();
        assert_eq!(shown, ["30", "⋮", "40", "41", "42*", "43", "⋮", "52", "53"]);
        assert_eq!(l[4].text, "hit");
        assert!(listing(&[], 5, None).is_empty());
        let only = listing(&[], 5, Some("x = 1"));
        assert_eq!(
            (only.len(), only[0].hit, only[0].text.as_str()),
            (1, true, "x = 1")
        );
    }

    #[test]
    fn sync_bars_label_power_of_four_buckets() {
        assert_eq!(sync_bars(&[]), "");
        let svg = sync_bars(&[1, 0, 3]);
        assert!(svg.contains("&lt;1µs") && svg.contains("4.0µs"), "{svg}");
        assert!(
            svg.contains("3 synchronizations of 4.0µs to 16.0µs"),
            "{svg}"
        );
    }
}
