//! The run page (`/runs/{run_id}`): the sessions of one `gpufl record` of several processes (an
//! uploaded run directory; their headers' `run_id`) as one run: the ranks side by side (each
//! one's headline figures and top finding, linking to its session page) and the cross-rank
//! findings of gpufl-analysis's run analysis (collective waits, stragglers), which ingest stores
//! once two of the run's sessions are analysed ([`crate::runs`]).

use super::cards::Card;
use super::{fmt, render, url_encode, Nav, Viewer, WebError};
use crate::store::{InsightRow, SessionRow};
use crate::AppState;
use askama::Template;
use axum::extract::{Path, State};
use axum::response::Response;
use serde_json::Value;
use std::sync::Arc;

/// One rank (a session of the run) as a column.
pub struct RankView {
    /// `rank 0`, or `no rank` (the launcher, a process without one).
    pub label: String,
    pub href: String,
    pub id: String,
    pub app: String,
    pub ingest: String,
    pub wall: String,
    pub busy: String,
    pub kernels: String,
    pub comm: String,
    pub syncs: String,
    pub blocked: String,
    pub severity: &'static str,
    pub severity_class: &'static str,
    pub top: String,
}

#[derive(Template)]
#[template(path = "run.html")]
struct RunPage {
    title: String,
    nav: Option<Nav>,
    run_id: String,
    host: String,
    command: String,
    start: String,
    ranks: Vec<RankView>,
    /// The run analysis covers this many of the sessions; 0 when there is none yet.
    analysed: i64,
    cards: Vec<Card>,
    warnings: Vec<String>,
}

fn severity_rank(s: &str) -> i64 {
    match s {
        "HIGH" => 3,
        "MEDIUM" => 2,
        "LOW" => 1,
        _ => 0,
    }
}

/// A cross-rank insight of the stored run analysis as a card (its line links into `session`).
fn card_of(i: &Value, session: &str) -> Card {
    let rule = i["rule"].as_str().unwrap_or("").to_string();
    let category = crate::ingest::category(&rule);
    let mut body = i.clone();
    body["category"] = Value::from(category);
    let row = InsightRow {
        ord: 0,
        severity: severity_rank(i["severity"].as_str().unwrap_or("")),
        category: category.to_string(),
        rule,
        title: i["title"].as_str().unwrap_or("").to_string(),
        file: i["location"]["file"].as_str().unwrap_or("").to_string(),
        line: i["location"]["line"].as_i64().unwrap_or(0),
        impact_ns: i["impact_ns"]
            .as_u64()
            .map_or(0, |v| v.min(i64::MAX as u64) as i64),
        body,
    };
    Card::from_row(&row, session)
}

fn rank_view(s: &SessionRow, summary: Option<&Value>) -> RankView {
    let ready = s.ingest == "ready";
    let fig = |v: String| if ready { v } else { "–".into() };
    RankView {
        label: if s.rank >= 0 {
            format!("rank {}", s.rank)
        } else {
            "no rank".into()
        },
        href: format!("/sessions/{}", url_encode(&s.id)),
        id: s.id.clone(),
        app: if s.app.is_empty() {
            s.id.clone()
        } else {
            s.app.clone()
        },
        ingest: if ready {
            String::new()
        } else {
            s.ingest.clone()
        },
        wall: fig(fmt::dur(s.wall_ns)),
        busy: fig(fmt::pct(s.busy_pct())),
        kernels: fig(fmt::count(s.kernels)),
        comm: summary
            .and_then(|r| r["comm_ns"].as_u64())
            .map_or_else(|| "–".into(), fmt::dur_u),
        syncs: fig(fmt::count(s.syncs)),
        blocked: fig(fmt::dur(s.blocked_ns)),
        severity: if s.top_severity > 0 {
            fmt::severity(s.top_severity)
        } else {
            "none"
        },
        severity_class: fmt::severity_class(s.top_severity),
        top: s.top_insight.clone(),
    }
}

/// `GET /runs/{run_id}`.
pub async fn page(
    State(st): State<Arc<AppState>>,
    Path(run_id): Path<String>,
    v: Viewer,
) -> Result<Response, WebError> {
    let p = v.project_id.as_str();
    let sessions = st.db.run_sessions(p, &run_id).await?;
    let Some(first) = sessions.first() else {
        return Err(WebError::NotFound(format!(
            "no run {run_id:?} in this project"
        )));
    };
    let stored = st.db.run(p, &run_id).await?;
    let body: Value = stored
        .as_ref()
        .and_then(|r| serde_json::from_str(&r.body).ok())
        .unwrap_or(Value::Null);
    let summaries = body["ranks"].as_array().cloned().unwrap_or_default();
    let summary_of = |id: &str| summaries.iter().find(|r| r["session"] == id);
    let ranks: Vec<RankView> = sessions
        .iter()
        .map(|s| rank_view(s, summary_of(&s.id)))
        .collect();
    // Cross-rank findings link their lines into the first rank's session.
    let link_to = sessions
        .iter()
        .find(|s| s.rank >= 0)
        .unwrap_or(first)
        .id
        .clone();
    let cards = body["insights"]
        .as_array()
        .map(|a| a.iter().map(|i| card_of(i, &link_to)).collect())
        .unwrap_or_default();
    let launcher = sessions.iter().find(|s| s.rank < 0).unwrap_or(first);
    render(&RunPage {
        title: run_id.clone(),
        nav: Some(v.nav()),
        host: launcher.host.clone(),
        command: launcher.command.clone(),
        start: fmt::time(sessions.iter().map(|s| s.start_ns).min().unwrap_or(0)),
        ranks,
        analysed: stored.map_or(0, |r| r.members),
        cards,
        warnings: body["warnings"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|w| w.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        run_id,
    })
}

/// The run page's address.
pub fn href(run_id: &str) -> String {
    format!("/runs/{}", url_encode(run_id))
}
