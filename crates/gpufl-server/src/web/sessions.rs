//! The sessions page (`GET /sessions`): the viewer's project's sessions as a table, filtered,
//! searched, sorted and paged by a GET form and links (no script); the project's trend of GPU busy
//! and time blocked in synchronizations across runs; the form that picks two sessions to compare.
//!
//! The query string is validated here into the store's [`Filters`] (its SQL, built from a
//! whitelist with every value a bound parameter, is the store's: `store::sessions`); this module
//! adds what a page needs of them: parsing, names and labels of the sorts, links.

use super::compare::{self, Choice};
use super::{charts, fmt, render, url_encode, Nav, Viewer, WebError};
use crate::store::TrendPoint;
pub use crate::store::{Filters, SessionRow, Sort};
use crate::AppState;
use askama::Template;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap};
use axum::response::Response;
use serde::Deserialize;
use std::sync::Arc;

/// Rows a page shows unless told otherwise, and at most.
pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;
/// Sessions the trend plots at most (the latest by start).
pub const TREND_MAX: i64 = 500;
/// Characters of a command line the table shows (the whole one is its `title`).
const COMMAND_CHARS: usize = 48;

/// The query string as sent by the filter form and the links (every field text: an empty field
/// of a submitted form means "any").
#[derive(Deserialize, Default, Debug, Clone)]
pub struct SessionsQuery {
    pub app: Option<String>,
    pub host: Option<String>,
    pub severity: Option<String>,
    pub q: Option<String>,
    pub sort: Option<String>,
    pub dir: Option<String>,
    pub limit: Option<String>,
    pub offset: Option<String>,
}

/// The sorts as the page names them (the store orders by [`Sort::column`]).
impl Sort {
    pub fn parse(s: &str) -> Option<Sort> {
        Sort::ALL.into_iter().find(|x| x.name() == s)
    }

    /// Its name in the query string.
    pub fn name(self) -> &'static str {
        match self {
            Sort::Start => "start",
            Sort::Duration => "duration",
            Sort::Busy => "busy",
            Sort::Blocked => "blocked",
            Sort::Severity => "severity",
            Sort::App => "app",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Sort::Start => "start",
            Sort::Duration => "duration",
            Sort::Busy => "GPU busy",
            Sort::Blocked => "time blocked in syncs",
            Sort::Severity => "severity",
            Sort::App => "app",
        }
    }

    /// The direction a first click sorts in: names A→Z, figures largest first.
    pub fn default_desc(self) -> bool {
        self != Sort::App
    }
}

/// The unfiltered list's first page, latest start first.
impl Default for Filters {
    fn default() -> Self {
        Filters {
            app: None,
            host: None,
            severity: None,
            q: None,
            sort: Sort::Start,
            desc: true,
            limit: DEFAULT_LIMIT,
            offset: 0,
        }
    }
}

/// A field's value; empty or blank is "not given".
/// Characters of a search, at most.
pub const MAX_SEARCH: usize = 200;

fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The request as the page reads it and links to it.
impl Filters {
    /// Validate the query: unknown sort or direction, a severity other than LOW/MEDIUM/HIGH, a
    /// limit or offset that is not a number ≥ 1 / ≥ 0 are refused with the reason. A limit above
    /// [`MAX_LIMIT`] is cut to it.
    pub fn parse(q: &SessionsQuery) -> Result<Filters, WebError> {
        let mut f = Filters {
            app: given(&q.app).map(str::to_string),
            host: given(&q.host).map(str::to_string),
            q: given(&q.q).map(str::to_string),
            ..Filters::default()
        };
        if let Some(s) = &f.q {
            if s.chars().count() > MAX_SEARCH {
                return Err(WebError::BadRequest(format!(
                    "the search is at most {MAX_SEARCH} characters"
                )));
            }
        }
        if let Some(s) = given(&q.severity) {
            f.severity = match fmt::severity_rank(s) {
                0 => {
                    return Err(WebError::BadRequest(format!(
                        "severity {s:?}: expected LOW, MEDIUM or HIGH"
                    )))
                }
                n => Some(n),
            };
        }
        if let Some(s) = given(&q.sort) {
            f.sort = Sort::parse(s).ok_or_else(|| {
                WebError::BadRequest(format!(
                    "sort {s:?}: expected one of start, duration, busy, blocked, severity, app"
                ))
            })?;
        }
        f.desc = match given(&q.dir) {
            None => f.sort.default_desc(),
            Some("desc") => true,
            Some("asc") => false,
            Some(d) => {
                return Err(WebError::BadRequest(format!(
                    "dir {d:?}: expected asc or desc"
                )))
            }
        };
        if let Some(s) = given(&q.limit) {
            match s.parse::<i64>() {
                Ok(n) if n >= 1 => f.limit = n.min(MAX_LIMIT),
                _ => {
                    return Err(WebError::BadRequest(format!(
                        "limit {s:?}: expected a number of rows from 1 to {MAX_LIMIT}"
                    )))
                }
            }
        }
        if let Some(s) = given(&q.offset) {
            match s.parse::<i64>() {
                Ok(n) if n >= 0 => f.offset = n,
                _ => {
                    return Err(WebError::BadRequest(format!(
                        "offset {s:?}: expected a number of rows ≥ 0"
                    )))
                }
            }
        }
        Ok(f)
    }

    /// Whether any filter narrows the list.
    pub fn narrows(&self) -> bool {
        self.app.is_some() || self.host.is_some() || self.severity.is_some() || self.q.is_some()
    }

    /// A link to this list with another sort, direction or offset (the filters kept; defaults
    /// left out).
    pub fn href(&self, sort: Sort, desc: bool, offset: i64) -> String {
        let mut q: Vec<(&str, String)> = Vec::new();
        if let Some(a) = &self.app {
            q.push(("app", a.clone()));
        }
        if let Some(h) = &self.host {
            q.push(("host", h.clone()));
        }
        if let Some(s) = self.severity {
            q.push(("severity", fmt::severity(s).to_string()));
        }
        if let Some(s) = &self.q {
            q.push(("q", s.clone()));
        }
        if sort != Sort::Start || !desc {
            q.push(("sort", sort.name().to_string()));
            q.push(("dir", if desc { "desc" } else { "asc" }.to_string()));
        }
        if self.limit != DEFAULT_LIMIT {
            q.push(("limit", self.limit.to_string()));
        }
        if offset > 0 {
            q.push(("offset", offset.to_string()));
        }
        let mut s = String::from("/sessions");
        for (i, (k, v)) in q.iter().enumerate() {
            s.push(if i == 0 { '?' } else { '&' });
            s.push_str(k);
            s.push('=');
            s.push_str(&url_encode(v));
        }
        s
    }
}

/// One row of the table, as text.
pub struct Row {
    pub id: String,
    pub href: String,
    pub app: String,
    pub host: String,
    pub command: String,
    pub command_short: String,
    pub start: String,
    pub duration: String,
    pub busy: String,
    pub kernels: String,
    pub blocked: String,
    pub severity: &'static str,
    pub severity_class: &'static str,
    pub top_insight: String,
    /// Empty when the session is analysed; else `uploading`, `pending`, `running`, `corrupt`…
    pub ingest: String,
    /// `ingest-…` class: the state's word.
    pub ingest_class: String,
    pub ingest_error: String,
    /// A run's row: the run page; empty for a session's own row.
    pub run_href: String,
    /// `run · 3 sessions`.
    pub run_label: String,
    /// A run's sessions: (`rank 0`, its page).
    pub members: Vec<(String, String)>,
}

/// The rows of the page: one per session, except the sessions of one run (their header's
/// `run_id`), which make one row linking to the run page (the figures and top finding of its
/// member with the highest severity), its sessions listed under it.
fn rows_of(sessions: &[SessionRow]) -> Vec<Row> {
    let mut out: Vec<Row> = Vec::new();
    let mut runs: Vec<&str> = Vec::new();
    for s in sessions {
        if s.run_id.is_empty() {
            out.push(Row::of(s));
            continue;
        }
        if runs.contains(&s.run_id.as_str()) {
            continue;
        }
        runs.push(&s.run_id);
        let mut members: Vec<&SessionRow> =
            sessions.iter().filter(|m| m.run_id == s.run_id).collect();
        members.sort_by_key(|m| (m.rank < 0, m.rank, m.id.clone()));
        let worst = members
            .iter()
            .max_by_key(|m| (m.top_severity, std::cmp::Reverse(m.rank)))
            .copied()
            .unwrap_or(s);
        let mut row = Row::of(worst);
        row.id = s.run_id.clone();
        row.href = super::run::href(&s.run_id);
        row.run_href = row.href.clone();
        row.app = s.run_id.clone();
        row.run_label = format!("run · {} sessions", members.len());
        row.members = members
            .iter()
            .map(|m| {
                let label = if m.rank >= 0 {
                    format!("rank {} · {}", m.rank, m.id)
                } else {
                    m.id.clone()
                };
                (label, format!("/sessions/{}", url_encode(&m.id)))
            })
            .collect();
        out.push(row);
    }
    out
}

impl Row {
    fn of(s: &SessionRow) -> Row {
        let ready = s.ingest == "ready";
        let figures = |v: String| if ready { v } else { "–".to_string() };
        Row {
            id: s.id.clone(),
            href: format!("/sessions/{}", url_encode(&s.id)),
            app: if s.app.is_empty() {
                s.id.clone()
            } else {
                s.app.clone()
            },
            host: s.host.clone(),
            command: s.command.clone(),
            command_short: fmt::cut(&s.command, COMMAND_CHARS),
            start: fmt::time(s.start_ns),
            duration: figures(fmt::dur(s.wall_ns)),
            busy: figures(fmt::pct(s.busy_pct())),
            kernels: figures(fmt::count(s.kernels)),
            blocked: figures(fmt::dur(s.blocked_ns)),
            severity: if s.top_severity > 0 {
                fmt::severity(s.top_severity)
            } else {
                "none"
            },
            severity_class: fmt::severity_class(s.top_severity),
            top_insight: s.top_insight.clone(),
            ingest: if ready {
                String::new()
            } else if s.state == "uploading" {
                "uploading".into()
            } else if s.ingest == "none" {
                "not analysed".into()
            } else {
                s.ingest.clone()
            },
            ingest_class: if s.state == "uploading" {
                "uploading".into()
            } else {
                s.ingest.clone()
            },
            ingest_error: s.ingest_error.clone(),
            run_href: String::new(),
            run_label: String::new(),
            members: Vec::new(),
        }
    }
}

/// A column header: a sort link where the column sorts.
pub struct Head {
    pub label: &'static str,
    pub href: String,
    /// `▲`/`▼` on the column sorted by.
    pub arrow: &'static str,
    pub num: bool,
    /// `ascending`/`descending`/`none`, for `aria-sort`.
    pub aria: &'static str,
}

/// An option of a select.
pub struct Opt {
    pub value: String,
    pub label: String,
    pub selected: bool,
}

#[derive(Template)]
#[template(path = "sessions.html")]
struct SessionsPage {
    title: &'static str,
    nav: Option<Nav>,
    rows: Vec<Row>,
    heads: Vec<Head>,
    total: i64,
    /// The project has no session at all.
    empty_project: bool,
    from: i64,
    to: i64,
    prev: Option<String>,
    next: Option<String>,
    f_app: String,
    f_host: String,
    f_q: String,
    f_limit: i64,
    severities: Vec<Opt>,
    sorts: Vec<Opt>,
    dirs: Vec<Opt>,
    apps: Vec<String>,
    hosts: Vec<String>,
    trend_svg: String,
    trend_legend: String,
    trend_note: String,
    trend_runs: usize,
    upload_hint: String,
    choices: Vec<Choice>,
}

fn opts(pairs: &[(&str, &str)], selected: &str) -> Vec<Opt> {
    pairs
        .iter()
        .map(|(v, l)| Opt {
            value: v.to_string(),
            label: l.to_string(),
            selected: *v == selected,
        })
        .collect()
}

/// The trend's chart, legend and note from its points in start order.
pub fn trend(points: &[TrendPoint]) -> (String, String, String) {
    let names = vec![
        "GPU busy (% of the run)".to_string(),
        "blocked in syncs (% of the run)".to_string(),
    ];
    let busy = points
        .iter()
        .enumerate()
        .map(|(i, p)| ((i + 1) as f64, p.busy_ppm as f64 / 10_000.0))
        .collect();
    let blocked = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let share = if p.wall_ns > 0 {
                (p.blocked_ns as f64 * 100.0 / p.wall_ns as f64).min(100.0)
            } else {
                0.0
            };
            ((i + 1) as f64, share)
        })
        .collect();
    let chart = charts::LineChart {
        title: "GPU busy and time blocked in synchronizations, per run in start order".into(),
        height: 160.0,
        series: vec![
            charts::Series {
                name: names[0].clone(),
                points: busy,
            },
            charts::Series {
                name: names[1].clone(),
                points: blocked,
            },
        ],
        y_max: Some(100.0),
        y_unit: "%".into(),
        x_unit: String::new(),
        ..charts::LineChart::default()
    };
    let note = match (points.first(), points.last()) {
        (Some(a), Some(z)) if points.len() > 1 => format!(
            "x: run 1 to {} in start order ({} … {})",
            points.len(),
            fmt::time(a.start_ns),
            fmt::time(z.start_ns)
        ),
        (Some(a), _) => format!("one run ({})", fmt::time(a.start_ns)),
        _ => String::new(),
    };
    (chart.render(), charts::legend(&names), note)
}

/// The table's column headers: sort links where a column sorts.
fn heads(f: &Filters) -> Vec<Head> {
    [
        ("app", Some(Sort::App), false),
        ("host", None, false),
        ("command", None, false),
        ("start", Some(Sort::Start), false),
        ("duration", Some(Sort::Duration), true),
        ("GPU busy", Some(Sort::Busy), true),
        ("kernels", None, true),
        ("blocked in syncs", Some(Sort::Blocked), true),
        ("severity", Some(Sort::Severity), false),
        ("top insight", None, false),
    ]
    .into_iter()
    .map(|(label, sort, num)| {
        let on = sort == Some(f.sort);
        Head {
            label,
            href: match sort {
                // The sorted column's link turns the direction; another's sorts its own way.
                Some(s) if on => f.href(s, !f.desc, 0),
                Some(s) => f.href(s, s.default_desc(), 0),
                None => String::new(),
            },
            arrow: match (on, f.desc) {
                (false, _) => "",
                (true, true) => "▼",
                (true, false) => "▲",
            },
            num,
            aria: match (on, f.desc) {
                (false, _) => "none",
                (true, true) => "descending",
                (true, false) => "ascending",
            },
        }
    })
    .collect()
}

pub async fn page(
    State(st): State<Arc<AppState>>,
    v: Viewer,
    headers: HeaderMap,
    q: Result<Query<SessionsQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    let Query(q) = q.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let f = Filters::parse(&q)?;
    let project = v.project_id.as_str();
    let rows = st.db.sessions_page(project, &f).await?;
    let total = st.db.count_sessions(project, &f).await?;
    let empty_project =
        total == 0 && (!f.narrows() || st.db.project_session_count(project).await? == 0);
    // The trend: the latest analysed sessions that pass the filters, plotted oldest first.
    let mut points = st.db.trend(project, &f, TREND_MAX).await?;
    points.reverse();
    let (trend_svg, trend_legend, trend_note) = trend(&points);
    let apps = st.db.apps(project).await?;
    let hosts = st.db.hosts(project).await?;
    let choices = compare::choices(&st, project, None, None).await?;
    let heads = heads(&f);
    let shown = rows.len() as i64;
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("HOST:PORT");
    let sev_name = f.severity.map(fmt::severity).unwrap_or("");
    let sorts: Vec<(&str, &str)> = Sort::ALL.iter().map(|s| (s.name(), s.label())).collect();
    render(&SessionsPage {
        title: "Sessions",
        nav: Some(v.nav()),
        heads,
        total,
        empty_project,
        from: if shown > 0 { f.offset + 1 } else { 0 },
        to: f.offset + shown,
        prev: (f.offset > 0).then(|| f.href(f.sort, f.desc, (f.offset - f.limit).max(0))),
        next: (f.offset + shown < total).then(|| f.href(f.sort, f.desc, f.offset + f.limit)),
        f_app: f.app.clone().unwrap_or_default(),
        f_host: f.host.clone().unwrap_or_default(),
        f_q: f.q.clone().unwrap_or_default(),
        f_limit: f.limit,
        severities: opts(
            &[
                ("", "any"),
                ("LOW", "LOW or above"),
                ("MEDIUM", "MEDIUM or above"),
                ("HIGH", "HIGH"),
            ],
            sev_name,
        ),
        sorts: opts(&sorts, f.sort.name()),
        dirs: opts(
            &[("desc", "descending"), ("asc", "ascending")],
            if f.desc { "desc" } else { "asc" },
        ),
        apps,
        hosts,
        trend_runs: points.len(),
        trend_svg,
        trend_legend,
        trend_note,
        upload_hint: format!("gpufl upload DIR --server http://{host} --api-key UPLOAD_KEY"),
        choices,
        rows: rows_of(&rows),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::Uri;

    fn query(pairs: &[(&str, &str)]) -> SessionsQuery {
        let s: String = pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", url_encode(v)))
            .collect::<Vec<_>>()
            .join("&");
        serde_urlencoded_like(&s)
    }

    /// What axum's `Query` makes of a query string (serde_urlencoded, through axum).
    fn serde_urlencoded_like(s: &str) -> SessionsQuery {
        let uri: Uri = format!("/sessions?{s}").parse().unwrap();
        Query::<SessionsQuery>::try_from_uri(&uri).unwrap().0
    }

    fn bad(pairs: &[(&str, &str)]) -> String {
        match Filters::parse(&query(pairs)) {
            Err(WebError::BadRequest(r)) => r,
            other => panic!("{pairs:?}: expected a bad request, got {other:?}"),
        }
    }

    #[test]
    fn defaults_and_empty_form_fields() {
        let f = Filters::parse(&SessionsQuery::default()).unwrap();
        assert_eq!(f, Filters::default());
        // A submitted form sends every field, empty ones included: "any".
        let f = Filters::parse(&serde_urlencoded_like(
            "app=&host=&severity=&q=&sort=&dir=&limit=&offset=",
        ))
        .unwrap();
        assert_eq!(f, Filters::default());
        assert_eq!(
            (f.limit, f.offset, f.sort, f.desc),
            (DEFAULT_LIMIT, 0, Sort::Start, true)
        );
    }

    #[test]
    fn sorting_is_a_whitelist() {
        for s in Sort::ALL {
            let f = Filters::parse(&query(&[("sort", s.name()), ("dir", "asc")])).unwrap();
            assert_eq!((f.sort, f.desc), (s, false));
        }
        let f = Filters::parse(&query(&[("sort", "app")])).unwrap();
        assert!(!f.desc, "names sort A→Z first");
        let f = Filters::parse(&query(&[("sort", "busy")])).unwrap();
        assert!(f.desc, "figures sort largest first");
        assert!(bad(&[("sort", "start_ns; DROP TABLE sessions")]).contains("sort"));
        assert!(bad(&[("sort", "Start")]).contains("sort"));
        assert!(bad(&[("dir", "up")]).contains("dir"));
    }

    #[test]
    fn values_are_validated() {
        assert!(bad(&[("severity", "CRITICAL")]).contains("LOW, MEDIUM or HIGH"));
        assert!(bad(&[("offset", "-1")]).contains("offset"));
        assert!(bad(&[("offset", "x")]).contains("offset"));
        assert!(bad(&[("limit", "0")]).contains("limit"));
        assert!(bad(&[("limit", "ten")]).contains("limit"));
        let f = Filters::parse(&query(&[("limit", "100000"), ("severity", "medium")])).unwrap();
        assert_eq!(f.limit, MAX_LIMIT);
        assert_eq!(f.severity, Some(2));
    }

    /// The store's test `filters_are_numbered_parameters_in_order` renders these filters.
    #[test]
    fn the_query_string_becomes_the_stores_filters() {
        let f = Filters::parse(&query(&[
            ("app", "train"),
            ("host", "h'1"),
            ("severity", "HIGH"),
            ("q", "item()"),
            ("sort", "blocked"),
            ("limit", "10"),
            ("offset", "20"),
        ]))
        .unwrap();
        assert_eq!(
            f,
            Filters {
                app: Some("train".into()),
                host: Some("h'1".into()),
                severity: Some(3),
                q: Some("item()".into()),
                sort: Sort::Blocked,
                desc: true,
                limit: 10,
                offset: 20,
            }
        );
    }

    #[test]
    fn links_keep_the_filters() {
        let f = Filters::parse(&query(&[
            ("app", "a&b c"),
            ("q", "x=1"),
            ("severity", "low"),
            ("limit", "20"),
        ]))
        .unwrap();
        assert_eq!(
            f.href(Sort::Busy, false, 40),
            "/sessions?app=a%26b%20c&severity=LOW&q=x%3D1&sort=busy&dir=asc&limit=20&offset=40"
        );
        assert_eq!(Filters::default().href(Sort::Start, true, 0), "/sessions");
    }

    #[test]
    fn the_trend_plots_busy_and_blocked_shares() {
        let (svg, legend, note) = trend(&[
            TrendPoint {
                start_ns: 1_795_702_721_000_000_000,
                wall_ns: 1_000_000_000,
                busy_ppm: 500_000,
                blocked_ns: 250_000_000,
            },
            TrendPoint {
                start_ns: 1_795_702_781_000_000_000,
                wall_ns: 2_000_000_000,
                busy_ppm: 800_000,
                blocked_ns: 0,
            },
        ]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(legend.contains("GPU busy") && legend.contains("blocked in syncs"));
        assert!(note.starts_with("x: run 1 to 2"), "{note}");
        let (svg, _, note) = trend(&[]);
        assert!(svg.starts_with("<svg") && note.is_empty());
    }

    #[test]
    fn rows_say_what_is_not_analysed() {
        let mut s = SessionRow {
            id: "x-1".into(),
            command: "python ".to_string() + &"a".repeat(100),
            ingest: "pending".into(),
            state: "complete".into(),
            ..SessionRow::default()
        };
        let r = Row::of(&s);
        assert_eq!(r.ingest, "pending");
        assert_eq!(r.busy, "–");
        assert_eq!(r.app, "x-1");
        assert_eq!(r.command_short.chars().count(), COMMAND_CHARS);
        s.ingest = "ready".into();
        s.top_severity = 3;
        let r = Row::of(&s);
        assert_eq!((r.ingest.as_str(), r.severity), ("", "HIGH"));
    }
}
