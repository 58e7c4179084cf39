//! The sessions page (`GET /sessions`): the viewer's project's sessions as a table, filtered,
//! searched, sorted and paged by a GET form and links (no script); the project's trend of GPU busy
//! and time blocked in synchronizations across runs; the form that picks two sessions to compare.
//!
//! The SQL is built from a whitelist: sort columns and directions are chosen by name, every value
//! from the request is a bound parameter (`$2`, `$3`, … after the project's `$1`), and the search
//! is `LOWER(column) LIKE $n ESCAPE '!'` with the pattern's `%`, `_` and `!` escaped — the same
//! text on SQLite and PostgreSQL.

use super::compare::{self, Choice};
use super::data::{SessionRow, SESSION_COLS};
use super::{charts, fmt, render, url_encode, viewer, Nav, WebError};
use crate::db::int;
use crate::AppState;
use askama::Template;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, Uri};
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

/// What the table can be sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    Start,
    Duration,
    Busy,
    Blocked,
    Severity,
    App,
}

impl Sort {
    pub const ALL: [Sort; 6] = [
        Sort::Start,
        Sort::Duration,
        Sort::Busy,
        Sort::Blocked,
        Sort::Severity,
        Sort::App,
    ];

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

    /// What it orders by (a constant: never text from the request); names case-insensitively.
    pub fn column(self) -> &'static str {
        match self {
            Sort::Start => "start_ns",
            Sort::Duration => "wall_ns",
            Sort::Busy => "busy_ppm",
            Sort::Blocked => "blocked_ns",
            Sort::Severity => "top_severity",
            Sort::App => "LOWER(app)",
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

/// A bound parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Text(String),
    Int(i64),
}

/// The validated request.
#[derive(Debug, Clone, PartialEq)]
pub struct Filters {
    pub app: Option<String>,
    pub host: Option<String>,
    /// At least this severity rank (1 LOW … 3 HIGH).
    pub severity: Option<i64>,
    pub q: Option<String>,
    pub sort: Sort,
    pub desc: bool,
    pub limit: i64,
    pub offset: i64,
}

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
fn given(v: &Option<String>) -> Option<&str> {
    v.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The `%`/`_`/`!` of `s` escaped with `!` (for `LIKE … ESCAPE '!'`), lower-cased, inside `%…%`.
pub fn like_pattern(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('%');
    for c in s.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '!') {
            out.push('!');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// The columns the search looks in.
const SEARCHED: [&str; 4] = ["app", "host", "command", "top_insight"];

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

    /// `WHERE project_id = $1 AND …` and the parameters after the project's, in their order.
    pub fn where_sql(&self) -> (String, Vec<Param>) {
        let mut sql = String::from("WHERE project_id = $1");
        let mut params = Vec::new();
        let mut add = |sql: &mut String, cond: &str, p: Param| {
            params.push(p);
            let n = params.len() + 1;
            sql.push_str(&cond.replace("$?", &format!("${n}")));
        };
        if let Some(a) = &self.app {
            add(&mut sql, " AND app = $?", Param::Text(a.clone()));
        }
        if let Some(h) = &self.host {
            add(&mut sql, " AND host = $?", Param::Text(h.clone()));
        }
        if let Some(s) = self.severity {
            add(&mut sql, " AND top_severity >= $?", Param::Int(s));
        }
        if let Some(q) = &self.q {
            let pat = like_pattern(q);
            for (i, col) in SEARCHED.iter().enumerate() {
                let cond = format!(
                    "{}LOWER({col}) LIKE $? ESCAPE '!'{}",
                    if i == 0 { " AND (" } else { " OR " },
                    if i + 1 == SEARCHED.len() { ")" } else { "" }
                );
                add(&mut sql, &cond, Param::Text(pat.clone()));
            }
        }
        (sql, params)
    }

    /// `ORDER BY …`, ties by id in the same direction.
    pub fn order_sql(&self) -> String {
        let d = if self.desc { "DESC" } else { "ASC" };
        format!("ORDER BY {} {d}, id {d}", self.sort.column())
    }

    /// The page's rows.
    pub fn list_sql(&self) -> (String, Vec<Param>) {
        let (w, p) = self.where_sql();
        (
            format!(
                "SELECT {SESSION_COLS} FROM sessions {w} {} LIMIT {} OFFSET {}",
                self.order_sql(),
                self.limit,
                self.offset
            ),
            p,
        )
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

fn bind_all<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    project: &'q str,
    params: &'q [Param],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    q = q.bind(project);
    for p in params {
        q = match p {
            Param::Text(s) => q.bind(s.as_str()),
            Param::Int(n) => q.bind(*n),
        };
    }
    q
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

/// The trend's chart, legend and note from (start_ns, wall_ns, busy_ppm, blocked_ns) in start
/// order.
pub fn trend(points: &[(i64, i64, i64, i64)]) -> (String, String, String) {
    let names = vec![
        "GPU busy (% of the run)".to_string(),
        "blocked in syncs (% of the run)".to_string(),
    ];
    let busy = points
        .iter()
        .enumerate()
        .map(|(i, p)| ((i + 1) as f64, p.2 as f64 / 10_000.0))
        .collect();
    let blocked = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let share = if p.1 > 0 {
                (p.3 as f64 * 100.0 / p.1 as f64).min(100.0)
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
            fmt::time(a.0),
            fmt::time(z.0)
        ),
        (Some(a), _) => format!("one run ({})", fmt::time(a.0)),
        _ => String::new(),
    };
    (chart.render(), charts::legend(&names), note)
}

pub async fn page(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    uri: Uri,
    q: Result<Query<SessionsQuery>, QueryRejection>,
) -> Result<Response, WebError> {
    let v = viewer(&st, &headers, &uri.to_string()).await?;
    let Query(q) = q.map_err(|e| WebError::BadRequest(e.body_text()))?;
    let f = Filters::parse(&q)?;
    let pool = &st.db.pool;
    let project = v.project_id.as_str();

    let (sql, params) = f.list_sql();
    let rows: Vec<SessionRow> = bind_all(sqlx::query(&sql), project, &params)
        .fetch_all(pool)
        .await?
        .iter()
        .map(SessionRow::from_row)
        .collect();
    let (w, params) = f.where_sql();
    let count_sql = format!("SELECT COUNT(*) AS n FROM sessions {w}");
    let total = int(
        &bind_all(sqlx::query(&count_sql), project, &params)
            .fetch_one(pool)
            .await?,
        "n",
    );
    let empty_project = total == 0
        && (!f.narrows()
            || int(
                &sqlx::query("SELECT COUNT(*) AS n FROM sessions WHERE project_id = $1")
                    .bind(project)
                    .fetch_one(pool)
                    .await?,
                "n",
            ) == 0);

    // The trend: the latest analysed sessions that pass the filters, plotted oldest first.
    let trend_sql = format!(
        "SELECT start_ns, wall_ns, busy_ppm, blocked_ns FROM sessions {w} AND ingest_state = 'ready' \
         ORDER BY start_ns DESC, id DESC LIMIT {TREND_MAX}"
    );
    let mut points: Vec<(i64, i64, i64, i64)> = bind_all(sqlx::query(&trend_sql), project, &params)
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| {
            (
                int(r, "start_ns"),
                int(r, "wall_ns"),
                int(r, "busy_ppm"),
                int(r, "blocked_ns"),
            )
        })
        .collect();
    points.reverse();
    let (trend_svg, trend_legend, trend_note) = trend(&points);

    let distinct = |col: &'static str| async move {
        let rows = sqlx::query(&format!(
            "SELECT DISTINCT {col} AS v FROM sessions WHERE project_id = $1 AND {col} <> '' \
             ORDER BY {col} LIMIT 200"
        ))
        .bind(project)
        .fetch_all(pool)
        .await?;
        Ok::<_, WebError>(
            rows.iter()
                .map(|r| crate::db::text(r, "v"))
                .collect::<Vec<_>>(),
        )
    };
    let apps = distinct("app").await?;
    let hosts = distinct("host").await?;
    let choices = compare::choices(&st, project, None, None).await?;

    let heads = [
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
    .collect();

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
        rows: rows.iter().map(Row::of).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (sql, p) = f.list_sql();
        assert_eq!(
            sql,
            format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE project_id = $1 \
                 ORDER BY start_ns DESC, id DESC LIMIT 50 OFFSET 0"
            )
        );
        assert!(p.is_empty());
    }

    #[test]
    fn sorting_is_a_whitelist() {
        for s in Sort::ALL {
            let f = Filters::parse(&query(&[("sort", s.name()), ("dir", "asc")])).unwrap();
            assert_eq!(
                f.order_sql(),
                format!("ORDER BY {} ASC, id ASC", s.column())
            );
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

    #[test]
    fn like_patterns_escape_their_wildcards() {
        assert_eq!(like_pattern("Train"), "%train%");
        assert_eq!(like_pattern("50%_done!"), "%50!%!_done!!%");
        assert_eq!(like_pattern("a'b\\c"), "%a'b\\c%");
    }

    #[test]
    fn filters_are_numbered_parameters_in_order() {
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
        let (sql, p) = f.list_sql();
        assert_eq!(
            sql,
            format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE project_id = $1 AND app = $2 AND host = $3 \
                 AND top_severity >= $4 AND (LOWER(app) LIKE $5 ESCAPE '!' OR LOWER(host) LIKE $6 ESCAPE '!' \
                 OR LOWER(command) LIKE $7 ESCAPE '!' OR LOWER(top_insight) LIKE $8 ESCAPE '!') \
                 ORDER BY blocked_ns DESC, id DESC LIMIT 10 OFFSET 20"
            )
        );
        assert_eq!(
            p,
            vec![
                Param::Text("train".into()),
                Param::Text("h'1".into()),
                Param::Int(3),
                Param::Text("%item()%".into()),
                Param::Text("%item()%".into()),
                Param::Text("%item()%".into()),
                Param::Text("%item()%".into()),
            ]
        );
        // No text from the request in the SQL.
        assert!(!sql.contains("train") && !sql.contains("h'1") && !sql.contains("item"));
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
            (
                1_795_702_721_000_000_000,
                1_000_000_000,
                500_000,
                250_000_000,
            ),
            (1_795_702_781_000_000_000, 2_000_000_000, 800_000, 0),
        ]);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(legend.contains("GPU busy") && legend.contains("blocked in syncs"));
        assert!(note.starts_with("x: run 1 to 2"), "{note}");
        let (svg, _, note) = trend(&[]);
        assert!(svg.starts_with("<svg") && note.is_empty());
    }

    /// The SQL as SQLite runs it (and PostgreSQL, where `GPUFL_TEST_PG_URL` names one:
    /// `scripts/services.sh`): search with wildcards in the text, filters, sort, paging.
    #[tokio::test]
    async fn the_queries_run_on_sqlite_and_postgres() {
        let dir = tempfile::tempdir().unwrap();
        queries_on(&format!(
            "sqlite://{}?mode=rwc",
            dir.path().join("t.db").display()
        ))
        .await;
        if let Ok(base) = std::env::var("GPUFL_TEST_PG_URL") {
            let name = format!("gpufl_t_sessions_{}", std::process::id());
            let out = std::process::Command::new("psql")
                .arg(&base)
                .args(["-qc", &format!("CREATE DATABASE {name}")])
                .output()
                .expect("psql");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let at = base.rfind('/').unwrap();
            queries_on(&format!("{}/{name}", &base[..at])).await;
        }
    }

    async fn queries_on(url: &str) {
        let db = crate::db::Db::open(url).await.unwrap();
        for p in ["p", "other"] {
            sqlx::query("INSERT INTO projects (id, name, created_ns) VALUES ($1, $1, 0)")
                .bind(p)
                .execute(&db.pool)
                .await
                .unwrap();
        }
        let sessions = [
            (
                "p",
                "s1",
                "Train",
                "python train.py --lr 50%",
                "In-loop sync",
                3,
                10,
            ),
            (
                "p",
                "s2",
                "train",
                "python train.py --lr 5",
                "Blocking copy",
                2,
                20,
            ),
            ("p", "s3", "eval_x", "python eval.py", "GPU idle", 1, 30),
            ("p", "s4", "evalXx", "python eval.py", "", 0, 40),
            (
                "other",
                "s5",
                "train",
                "python train.py",
                "In-loop sync",
                3,
                50,
            ),
        ];
        for (p, id, app, cmd, top, sev, start) in sessions {
            sqlx::query(
                "INSERT INTO sessions (project_id, id, state, created_ns, app, host, command, \
                 top_insight, top_severity, start_ns, ingest_state) \
                 VALUES ($1, $2, 'complete', 0, $3, 'h', $4, $5, $6, $7, 'ready')",
            )
            .bind(p)
            .bind(id)
            .bind(app)
            .bind(cmd)
            .bind(top)
            .bind(sev as i64)
            .bind(start as i64)
            .execute(&db.pool)
            .await
            .unwrap();
        }
        let ids = |pairs: &'static [(&'static str, &'static str)]| {
            let pool = db.pool.clone();
            async move {
                let f = Filters::parse(&query(pairs)).unwrap();
                let (sql, params) = f.list_sql();
                bind_all(sqlx::query(&sql), "p", &params)
                    .fetch_all(&pool)
                    .await
                    .unwrap()
                    .iter()
                    .map(|r| crate::db::text(r, "id"))
                    .collect::<Vec<_>>()
            }
        };
        assert_eq!(ids(&[]).await, ["s4", "s3", "s2", "s1"]);
        // Case-insensitive, in the command and the top insight too; another project's never.
        assert_eq!(ids(&[("q", "TRAIN")]).await, ["s2", "s1"]);
        assert_eq!(ids(&[("q", "in-loop")]).await, ["s1"]);
        // `%` and `_` are text, not wildcards.
        assert_eq!(ids(&[("q", "50%")]).await, ["s1"]);
        assert_eq!(ids(&[("q", "5%")]).await, Vec::<String>::new());
        assert_eq!(ids(&[("q", "eval_")]).await, ["s3"]);
        assert_eq!(
            ids(&[("q", "'; DROP TABLE sessions; --")]).await,
            Vec::<String>::new()
        );
        assert_eq!(ids(&[("severity", "MEDIUM")]).await, ["s2", "s1"]);
        assert_eq!(ids(&[("app", "train")]).await, ["s2"]);
        assert_eq!(
            ids(&[("sort", "app"), ("dir", "asc")]).await,
            ["s3", "s4", "s1", "s2"]
        );
        assert_eq!(
            ids(&[("sort", "severity"), ("limit", "2"), ("offset", "1")]).await,
            ["s2", "s3"]
        );
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
