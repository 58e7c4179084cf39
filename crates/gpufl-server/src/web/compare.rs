//! The compare page (`GET /compare?a=BASE&b=NEW`): two sessions of the viewer's project compared
//! by `gpufl_analysis::diff` (the same comparison as `gpufl diff`), from the `profile` documents
//! ingest stored: totals side by side, insights new / gone / changed, per-kernel and per-line time
//! deltas. Without both sessions: the form that picks them.

use super::data;
use super::{fmt, render, url_encode, Nav, Viewer, WebError};
use crate::store::SessionRow;
use crate::AppState;
use askama::Template;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Response;
use gpufl_analysis::diff::{self, Delta, Diff, FDelta, Profile};
use gpufl_analysis::headline::names;
use gpufl_analysis::userframe::{FrameOrigin, SourceLoc};
use gpufl_analysis::Severity;
use serde::Deserialize;
use std::sync::Arc;

/// Sessions the choosing form lists (the latest analysed ones).
pub const CHOICES: i64 = 200;
/// Kernel and line rows shown at most (the most time moved first).
pub const MAX_ROWS: usize = 100;

/// An option of the choosing form's selects.
pub struct Choice {
    pub id: String,
    pub label: String,
    pub selected_a: bool,
    pub selected_b: bool,
}

/// The project's latest analysed sessions as options, `a` and `b` preselected (listed even when
/// older than the latest [`CHOICES`]). With neither given, the latest is NEW and the one before
/// it BASE.
pub async fn choices(
    st: &AppState,
    project: &str,
    a: Option<&str>,
    b: Option<&str>,
) -> Result<Vec<Choice>, WebError> {
    let rows = st.db.ready_sessions(project, CHOICES).await?;
    let mut out: Vec<Choice> = rows
        .into_iter()
        .map(|r| {
            let id = r.id;
            Choice {
                label: format!("{} · {} · {id}", r.app, fmt::time(r.start_ns)),
                selected_a: Some(id.as_str()) == a,
                selected_b: Some(id.as_str()) == b,
                id,
            }
        })
        .collect();
    for (want, is_a) in [(a, true), (b, false)] {
        if let Some(w) = want {
            if !out.iter().any(|c| c.id == w) {
                out.push(Choice {
                    id: w.to_string(),
                    label: w.to_string(),
                    selected_a: is_a,
                    selected_b: !is_a,
                });
            }
        }
    }
    if a.is_none() && b.is_none() && out.len() >= 2 {
        out[0].selected_b = true;
        out[1].selected_a = true;
    }
    Ok(out)
}

#[derive(Deserialize, Default)]
pub struct CompareQuery {
    a: Option<String>,
    b: Option<String>,
}

/// A figure in both sessions, as text; `class` says whether the change is worse (`delta-up`),
/// better (`delta-down`) or neither (`delta-same`).
pub struct Figure {
    pub label: &'static str,
    pub base: String,
    pub new: String,
    pub delta: String,
    pub class: &'static str,
}

/// Which way a figure is worse.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Worse {
    Up,
    Down,
    Neither,
}

/// The class of a change: `delta-up` worse, `delta-down` better, `delta-same` no change or no
/// judgement.
pub fn delta_class(delta: f64, worse: Worse) -> &'static str {
    if delta == 0.0 || !delta.is_finite() {
        return "delta-same";
    }
    match (worse, delta > 0.0) {
        (Worse::Neither, _) => "delta-same",
        (Worse::Up, true) | (Worse::Down, false) => "delta-up",
        _ => "delta-down",
    }
}

fn signed(s: String, positive: bool) -> String {
    if positive {
        format!("+{s}")
    } else {
        s
    }
}

fn rel(pct: Option<f64>) -> String {
    match pct {
        Some(p) if p.is_finite() => format!(" ({}{p:.1}%)", if p > 0.0 { "+" } else { "" }),
        Some(_) => String::new(),
        None => " (new)".into(),
    }
}

/// A time delta: `+1.20s (+12.0%)`, `-3.00ms (-50.0%)`, `0`.
pub fn dur_delta(d: &Delta) -> String {
    if d.delta == 0 {
        return "0".into();
    }
    format!("{}{}", signed(fmt::dur(d.delta), d.delta > 0), rel(d.pct))
}

/// A count delta: `+12 (+5.0%)`.
pub fn count_delta(d: &Delta) -> String {
    if d.delta == 0 {
        return "0".into();
    }
    format!("{}{}", signed(fmt::count(d.delta), d.delta > 0), rel(d.pct))
}

fn u(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}

fn dur_fig(label: &'static str, d: &Delta, worse: Worse) -> Figure {
    Figure {
        label,
        base: fmt::dur(u(d.base)),
        new: fmt::dur(u(d.new)),
        delta: dur_delta(d),
        class: delta_class(d.delta as f64, worse),
    }
}

fn count_fig(label: &'static str, d: &Delta, worse: Worse) -> Figure {
    Figure {
        label,
        base: fmt::count(u(d.base)),
        new: fmt::count(u(d.new)),
        delta: count_delta(d),
        class: delta_class(d.delta as f64, worse),
    }
}

fn pct_fig(label: &'static str, d: &FDelta, worse: Worse) -> Figure {
    Figure {
        label,
        base: fmt::pct(d.base),
        new: fmt::pct(d.new),
        delta: if d.delta == 0.0 {
            "0".into()
        } else {
            let sign = if d.delta > 0.0 { "+" } else { "" };
            if d.delta.abs() < 0.1 {
                format!("{sign}{:.2} pt", d.delta)
            } else {
                format!("{sign}{:.1} pt", d.delta)
            }
        },
        class: delta_class(d.delta, worse),
    }
}

/// Which direction of each compared figure is worse for the user, in one place: the page
/// colours a change red (worse) or green (better) by this table, and not at all where a change is
/// neither (`Neither`: it grows with the work done, e.g. kernels, or GPU busy time, whose share
/// of the run is what tells). A finding's time: more is worse; a new finding is worse, a gone one
/// better, whatever its time.
///
/// The totals are the sessions' headline figures, under the names every view gives them
/// (`gpufl_analysis::headline::names`: the session page, `gpufl report`, `gpufl info`, `gpufl diff`).
pub const WORSE: &[(&str, Worse)] = &[
    (names::WALL, Worse::Up),
    (names::GPU_BUSY_TIME, Worse::Neither),
    (names::GPU_BUSY, Worse::Down),
    (names::KERNELS, Worse::Neither),
    (names::COPIES, Worse::Neither),
    (names::SYNCS, Worse::Up),
    (names::HOST_BLOCKED, Worse::Up),
    (names::IN_SYNCS, Worse::Up),
    (names::IN_BLOCKING_COPIES, Worse::Up),
    (names::GPU_IDLE, Worse::Up),
    ("finding's time", Worse::Up),
    ("kernel's GPU time", Worse::Up),
    ("line's time blocked", Worse::Up),
];

/// Which direction of figure `label` is worse ([`WORSE`]; `Neither` for one not in it).
pub fn worse(label: &str) -> Worse {
    WORSE
        .iter()
        .find(|(l, _)| *l == label)
        .map_or(Worse::Neither, |(_, w)| *w)
}

/// The totals the page shows, each coloured by [`WORSE`].
pub fn totals(d: &Diff) -> Vec<Figure> {
    let t = &d.totals;
    let dur = |label, x| dur_fig(label, x, worse(label));
    vec![
        dur(names::WALL, &t.wall_ns),
        pct_fig(names::GPU_BUSY, &t.gpu_busy_pct, worse(names::GPU_BUSY)),
        dur(names::GPU_BUSY_TIME, &t.gpu_busy_ns),
        count_fig(names::KERNELS, &t.kernels, worse(names::KERNELS)),
        count_fig(names::SYNCS, &t.syncs, worse(names::SYNCS)),
        dur(names::HOST_BLOCKED, &t.host_blocked_ns),
        dur(names::IN_SYNCS, &t.sync_blocked_ns),
        dur(names::IN_BLOCKING_COPIES, &t.copy_blocked_ns),
        dur(names::GPU_IDLE, &t.gpu_idle_ns),
        count_fig(names::COPIES, &t.copies, worse(names::COPIES)),
    ]
}

/// A location as a link to a line's page, or as plain text where it is no source line.
pub struct Loc {
    /// Empty: not a line of a file (no link).
    pub href: String,
    pub text: String,
    pub title: String,
    /// The library line inside it, as text (empty if none).
    pub lib: String,
    pub lib_title: String,
}

fn loc_text(l: &SourceLoc) -> String {
    fmt::loc(&l.file, l.line, 36)
}

fn loc_title(l: &SourceLoc) -> String {
    let mut s = l.file.clone();
    if let Some(n) = l.line {
        s += &format!(":{n}");
    }
    if let Some(f) = &l.function {
        s += &format!(" in {f}()");
    }
    s
}

/// `l` linked to its line page in session `session`.
pub fn loc(l: &SourceLoc, session: &str) -> Loc {
    let is_line = matches!(l.origin, FrameOrigin::Python | FrameOrigin::Native)
        && !l.file.is_empty()
        && !l.file.starts_with('<');
    let href = match (is_line, l.line) {
        (true, Some(n)) => format!(
            "/sessions/{}/line?file={}&line={n}",
            url_encode(session),
            url_encode(&l.file)
        ),
        _ => String::new(),
    };
    let (lib, lib_title) = match &l.library {
        Some(b) => (loc_text(b), loc_title(b)),
        None => (String::new(), String::new()),
    };
    Loc {
        href,
        text: loc_text(l),
        title: loc_title(l),
        lib,
        lib_title,
    }
}

fn rank(s: Severity) -> i64 {
    match s {
        Severity::Low => 1,
        Severity::Medium => 2,
        Severity::High => 3,
    }
}

pub struct InsightRow {
    /// `new`, `gone`, `changed`.
    pub status: &'static str,
    pub severity: String,
    pub severity_class: &'static str,
    pub title: String,
    pub loc: Loc,
    pub count: String,
    pub impact: String,
    pub delta: String,
    pub class: &'static str,
}

pub struct KernelRow {
    pub status: &'static str,
    pub name: String,
    pub name_short: String,
    pub launches: String,
    pub base: String,
    pub new: String,
    pub delta: String,
    pub class: &'static str,
}

pub struct LineRow {
    pub status: &'static str,
    pub loc: Loc,
    pub syncs: String,
    pub base: String,
    pub new: String,
    pub delta: String,
    pub class: &'static str,
    pub copies: String,
    pub copy_delta: String,
}

fn arrow(b: String, n: String) -> String {
    if b == n {
        b
    } else {
        format!("{b} → {n}")
    }
}

/// The rows of a [`Diff`] of sessions `a` (BASE) and `b` (NEW), in the order the diff gives
/// them; kernels and lines cut to [`MAX_ROWS`].
pub fn rows(d: &Diff, a: &str, b: &str) -> (Vec<InsightRow>, Vec<KernelRow>, Vec<LineRow>) {
    // A location names a line of NEW, except for what only BASE has.
    let at = |s: diff::Status| if s == diff::Status::Gone { a } else { b };
    let insights = d
        .insights
        .iter()
        .map(|i| {
            let side = i.side();
            let sev = match (&i.base, &i.new) {
                (Some(x), Some(y)) if x.severity != y.severity => format!(
                    "{} → {}",
                    fmt::severity(rank(x.severity)),
                    fmt::severity(rank(y.severity))
                ),
                _ => fmt::severity(rank(side.severity)).to_string(),
            };
            InsightRow {
                status: i.status.as_str(),
                severity: sev,
                severity_class: fmt::severity_class(rank(side.severity)),
                title: side.title.clone(),
                loc: loc(&i.location, at(i.status)),
                count: arrow(fmt::count(u(i.count.base)), fmt::count(u(i.count.new))),
                impact: arrow(fmt::dur(u(i.impact_ns.base)), fmt::dur(u(i.impact_ns.new))),
                delta: dur_delta(&i.impact_ns),
                class: match i.status {
                    diff::Status::New => "delta-up",
                    diff::Status::Gone => "delta-down",
                    _ => delta_class(i.impact_ns.delta as f64, worse("finding's time")),
                },
            }
        })
        .collect();
    let kernels = d
        .kernels
        .iter()
        .take(MAX_ROWS)
        .map(|k| KernelRow {
            status: k.status.as_str(),
            name_short: {
                let n: String = k.name.chars().take(120).collect();
                if n.len() < k.name.len() {
                    format!("{n}…")
                } else {
                    n
                }
            },
            name: k.name.clone(),
            launches: arrow(
                fmt::count(u(k.launches.base)),
                fmt::count(u(k.launches.new)),
            ),
            base: fmt::dur(u(k.total_ns.base)),
            new: fmt::dur(u(k.total_ns.new)),
            delta: dur_delta(&k.total_ns),
            class: delta_class(k.total_ns.delta as f64, worse("kernel's GPU time")),
        })
        .collect();
    let lines = d
        .lines
        .iter()
        .take(MAX_ROWS)
        .map(|l| LineRow {
            status: l.status.as_str(),
            loc: loc(&l.location, at(l.status)),
            syncs: arrow(fmt::count(u(l.syncs.base)), fmt::count(u(l.syncs.new))),
            base: fmt::dur(u(l.sync_blocked_ns.base)),
            new: fmt::dur(u(l.sync_blocked_ns.new)),
            delta: dur_delta(&l.sync_blocked_ns),
            class: delta_class(l.sync_blocked_ns.delta as f64, worse("line's time blocked")),
            copies: arrow(fmt::count(u(l.copies.base)), fmt::count(u(l.copies.new))),
            copy_delta: dur_delta(&l.copy_ns),
        })
        .collect();
    (insights, kernels, lines)
}

/// One side of the comparison, as the title shows it.
pub struct Side {
    pub id: String,
    pub href: String,
    pub app: String,
    pub start: String,
}

impl Side {
    fn of(s: &SessionRow) -> Side {
        Side {
            id: s.id.clone(),
            href: format!("/sessions/{}", url_encode(&s.id)),
            app: if s.app.is_empty() {
                s.id.clone()
            } else {
                s.app.clone()
            },
            start: fmt::time(s.start_ns),
        }
    }
}

/// The comparison as the page shows it.
pub struct View {
    pub a: Side,
    pub b: Side,
    pub totals: Vec<Figure>,
    pub insights: Vec<InsightRow>,
    pub insights_hidden: u64,
    pub kernels: Vec<KernelRow>,
    /// Changed kernels beyond the rows shown.
    pub kernels_more: usize,
    pub kernels_hidden: u64,
    pub lines: Vec<LineRow>,
    pub lines_more: usize,
    pub lines_hidden: u64,
    pub threshold: String,
    pub unchanged: bool,
}

#[derive(Template)]
#[template(path = "compare.html")]
struct ComparePage {
    title: String,
    nav: Option<Nav>,
    choices: Vec<Choice>,
    cmp: Option<View>,
}

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

async fn profile(st: &AppState, project: &str, s: &SessionRow) -> Result<Profile, WebError> {
    data::doc::<Profile>(st, project, &s.id, "profile")
        .await?
        .ok_or_else(|| {
            let why = match s.ingest.as_str() {
                "corrupt" => "its files could not be read (corrupt)".to_string(),
                "failed" | "too_large" => {
                    format!("its analysis is {}: {}", s.ingest, s.ingest_error)
                }
                "ready" => {
                    "it has no stored comparison profile (analysed by an older server?)".to_string()
                }
                "none" => "its upload is not complete".to_string(),
                other => format!("its analysis is {other}"),
            };
            WebError::NotFound(format!(
                "session {:?} is not analysed yet: {why}; try again once it is",
                s.id
            ))
        })
}

pub async fn page(
    State(st): State<Arc<AppState>>,
    v: Viewer,
    q: Result<Query<CompareQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    let Query(q) = q.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let project = v.project_id.as_str();
    let (a, b) = (given(&q.a), given(&q.b));
    let choices = choices(&st, project, a, b).await?;
    let (Some(a), Some(b)) = (a, b) else {
        return render(&ComparePage {
            title: "Compare".into(),
            nav: Some(v.nav()),
            choices,
            cmp: None,
        });
    };
    let sa = data::session(&st, project, a).await?;
    let sb = data::session(&st, project, b).await?;
    let pa = profile(&st, project, &sa).await?;
    let pb = profile(&st, project, &sb).await?;
    let opts = diff::Options::default();
    let d = diff::diff(&pa, &pb, &opts).map_err(|e| WebError::BadRequest(e.to_string()))?;
    let (insights, kernels, lines) = rows(&d, &sa.id, &sb.id);
    let view = View {
        a: Side::of(&sa),
        b: Side::of(&sb),
        totals: totals(&d),
        insights,
        insights_hidden: d.insights_hidden,
        kernels_more: d.kernels.len().saturating_sub(MAX_ROWS),
        kernels,
        kernels_hidden: d.kernels_hidden,
        lines_more: d.lines.len().saturating_sub(MAX_ROWS),
        lines,
        lines_hidden: d.lines_hidden,
        threshold: format!("{}%", d.threshold_pct),
        unchanged: d.is_unchanged(),
    };
    render(&ComparePage {
        title: format!("Compare {} → {}", view.a.app, view.b.app),
        nav: Some(v.nav()),
        choices,
        cmp: Some(view),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufl_analysis::diff::{InsightStat, KernelStat, LineStat};
    use gpufl_analysis::totals::Totals;

    fn at(file: &str, line: u32) -> SourceLoc {
        SourceLoc {
            file: file.into(),
            line: Some(line),
            function: Some("step".into()),
            origin: FrameOrigin::Python,
            text: None,
            library: None,
        }
    }

    fn prof(wall: u64, kernel_ns: u64, blocked: u64, extra_insight: bool) -> Profile {
        let mut insights = vec![InsightStat {
            key: "sync @ t.py:5".into(),
            rule: "sync".into(),
            severity: Severity::Medium,
            title: "In-loop sync <b>".into(),
            location: at("/w/t.py", 5),
            count: 50,
            impact_ns: blocked,
        }];
        if extra_insight {
            insights.push(InsightStat {
                key: "copy @ t.py:9".into(),
                rule: "copy".into(),
                severity: Severity::High,
                title: "Blocking copy".into(),
                location: at("/w/t.py", 9),
                count: 1,
                impact_ns: 10,
            });
        }
        Profile {
            totals: Totals {
                wall_ns: wall,
                gpu_busy_ns: kernel_ns,
                gpu_busy_pct: kernel_ns as f64 * 100.0 / wall as f64,
                kernels: 100,
                copies: 0,
                memsets: 0,
                syncs: 50,
                sync_blocked_ns: blocked,
                syncs_with_stack: 50,
            },
            headline: Default::default(),
            always_on: false,
            kernels: vec![KernelStat {
                name: "gemm<float>".into(),
                launches: 100,
                total_ns: kernel_ns,
            }],
            lines: vec![LineStat {
                location: at("/w/t.py", 5),
                syncs: 50,
                sync_blocked_ns: blocked,
                copies: 0,
                copy_ns: 0,
                copy_bytes: 0,
            }],
            insights,
            graphs: Vec::new(),
            memory: Default::default(),
        }
    }

    #[test]
    fn deltas_read_as_worse_or_better() {
        assert_eq!(delta_class(5.0, Worse::Up), "delta-up");
        assert_eq!(delta_class(-5.0, Worse::Up), "delta-down");
        assert_eq!(delta_class(5.0, Worse::Down), "delta-down");
        assert_eq!(delta_class(0.0, Worse::Up), "delta-same");
        assert_eq!(delta_class(3.0, Worse::Neither), "delta-same");
        assert_eq!(
            dur_delta(&Delta::of(1_000_000_000, 1_500_000_000)),
            "+500.00ms (+50.0%)"
        );
        assert_eq!(
            dur_delta(&Delta::of(2_000_000, 1_000_000)),
            "-1.00ms (-50.0%)"
        );
        assert_eq!(dur_delta(&Delta::of(0, 1_000)), "+1.0µs (new)");
        assert_eq!(count_delta(&Delta::of(7, 7)), "0");
    }

    #[test]
    fn each_figure_is_coloured_by_its_own_direction() {
        let base = prof(1_000_000_000, 400_000_000, 100_000_000, false);
        let new = prof(800_000_000, 500_000_000, 50_000_000, true);
        let d = diff::diff(&base, &new, &diff::Options::default()).unwrap();
        let class = |label: &str| {
            totals(&d)
                .into_iter()
                .find(|f| f.label == label)
                .map(|f| f.class)
                .unwrap()
        };
        // Faster and less blocked: better; more GPU busy time for the work: not judged, its
        // share of the run grew: better.
        assert_eq!(class("wall"), "delta-down");
        assert_eq!(class("host blocked"), "delta-down");
        assert_eq!(class("in syncs"), "delta-down");
        assert_eq!(class("GPU busy time"), "delta-same");
        assert_eq!(class("GPU busy"), "delta-down");
        // Every total the page shows has its direction in the table.
        for f in totals(&d) {
            assert!(WORSE.iter().any(|(l, _)| *l == f.label), "{}", f.label);
        }
        // A finding new in B is worse whatever its time, a gone one better.
        let (ins, _, _) = rows(&d, "a", "b");
        for i in &ins {
            match i.status {
                "new" => assert_eq!(i.class, "delta-up", "{}", i.title),
                "gone" => assert_eq!(i.class, "delta-down", "{}", i.title),
                _ => {}
            }
        }
        assert!(
            ins.iter().any(|i| i.status == "new"),
            "the new profile adds a finding"
        );
    }

    #[test]
    fn a_slower_run_shows_its_kernel_line_and_insight_changes() {
        let base = prof(1_000_000_000, 400_000_000, 100_000_000, false);
        let new = prof(1_200_000_000, 500_000_000, 300_000_000, true);
        let d = diff::diff(&base, &new, &diff::Options::default()).unwrap();
        let t = totals(&d);
        assert_eq!(t[0].label, "wall");
        assert_eq!(t[0].class, "delta-up");
        assert_eq!(t[0].delta, "+200.00ms (+20.0%)");
        let (ins, ks, ls) = rows(&d, "base-1", "new/2");
        let statuses: Vec<_> = ins.iter().map(|i| i.status).collect();
        assert!(statuses.contains(&"new") && statuses.contains(&"changed"));
        let changed = ins.iter().find(|i| i.status == "changed").unwrap();
        assert_eq!(changed.impact, "100.00ms → 300.00ms");
        assert_eq!(changed.title, "In-loop sync <b>");
        assert_eq!(ks.len(), 1);
        assert_eq!(ks[0].delta, "+100.00ms (+25.0%)");
        assert_eq!(ls.len(), 1);
        // Lines link to NEW's line page.
        assert_eq!(
            ls[0].loc.href,
            "/sessions/new%2F2/line?file=%2Fw%2Ft.py&line=5"
        );
        assert_eq!(ls[0].loc.text, "/w/t.py:5");
        assert_eq!(ls[0].loc.title, "/w/t.py:5 in step()");
        assert_eq!(ls[0].class, "delta-up");
    }

    #[test]
    fn gone_things_link_to_base_and_non_lines_do_not_link() {
        let base = prof(1_000_000_000, 400_000_000, 100_000_000, true);
        let new = prof(1_000_000_000, 400_000_000, 100_000_000, false);
        let d = diff::diff(&base, &new, &diff::Options::default()).unwrap();
        let (ins, _, _) = rows(&d, "a", "b");
        assert_eq!(ins.len(), 1);
        assert_eq!(ins[0].status, "gone");
        assert!(
            ins[0].loc.href.starts_with("/sessions/a/line?"),
            "{}",
            ins[0].loc.href
        );
        let mut l = at("<driver-internal>", 0);
        l.line = None;
        l.origin = FrameOrigin::DriverInternal;
        assert_eq!(loc(&l, "b").href, "");
        let mut g = at("GPU 0", 0);
        g.origin = FrameOrigin::Device;
        assert_eq!(loc(&g, "b").href, "");
    }

    #[test]
    fn the_comparison_renders_escaped() {
        let base = prof(1_000_000_000, 400_000_000, 100_000_000, false);
        let mut new = prof(1_000_000_000, 400_000_000, 100_000_000, true);
        new.kernels[0].name = "<script>alert(1)</script>".into();
        let d = diff::diff(&base, &new, &diff::Options::default()).unwrap();
        let (insights, kernels, lines) = rows(&d, "a", "b\"><img>");
        let side = |id: &str| Side {
            id: id.into(),
            href: format!("/sessions/{}", url_encode(id)),
            app: "<i>app</i>".into(),
            start: "–".into(),
        };
        let html = ComparePage {
            title: "Compare".into(),
            nav: None,
            choices: vec![Choice {
                id: "x\"><script>".into(),
                label: "<script>".into(),
                selected_a: true,
                selected_b: false,
            }],
            cmp: Some(View {
                a: side("a"),
                b: side("b\"><img>"),
                totals: totals(&d),
                insights,
                insights_hidden: 0,
                kernels,
                kernels_more: 0,
                kernels_hidden: 0,
                lines,
                lines_more: 0,
                lines_hidden: 0,
                threshold: "1%".into(),
                unchanged: false,
            }),
        }
        .render()
        .unwrap();
        assert!(!html.contains("<script") && !html.contains("<img") && !html.contains("<i>"));
        for id in [
            "compare-title",
            "compare-totals",
            "compare-insights",
            "compare-kernels",
            "compare-lines",
            "compare-form",
        ] {
            assert!(html.contains(&format!("id=\"{id}\"")), "{id}");
        }
        assert!(html.contains("class=\"kernel-delta"));
        assert!(html.contains("class=\"insight-new"));
    }
}
