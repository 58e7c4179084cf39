//! What the pages read from the database: every query bounded by the viewer's project.

use super::WebError;
use crate::db::{int, text};
use crate::AppState;
use serde_json::Value;

/// One session's row (the summary columns ingest stored).
#[derive(Debug, Clone, Default)]
pub struct SessionRow {
    pub id: String,
    pub app: String,
    pub host: String,
    pub command: String,
    pub start_ns: i64,
    pub wall_ns: i64,
    /// Upload state: `uploading`, `complete`.
    pub state: String,
    /// `none`, `pending`, `running`, `ready`, `corrupt`.
    pub ingest: String,
    pub bytes: i64,
    pub kernels: i64,
    pub syncs: i64,
    pub blocked_ns: i64,
    /// GPU busy, parts per million of the session's wall time.
    pub busy_ppm: i64,
    /// 0 none, 1 LOW, 2 MEDIUM, 3 HIGH.
    pub top_severity: i64,
    pub top_insight: String,
    /// The reader's and the analysis's warnings (JSON array of strings).
    pub warnings: Vec<String>,
    pub ingest_error: String,
}

/// Columns of [`SessionRow`], for `SELECT`.
pub const SESSION_COLS: &str = "id, app, host, command, start_ns, wall_ns, state, ingest_state, \
     bytes, kernels, syncs, blocked_ns, busy_ppm, top_severity, top_insight, warnings, ingest_error";

impl SessionRow {
    pub fn from_row(r: &sqlx::any::AnyRow) -> SessionRow {
        SessionRow {
            id: text(r, "id"),
            app: text(r, "app"),
            host: text(r, "host"),
            command: text(r, "command"),
            start_ns: int(r, "start_ns"),
            wall_ns: int(r, "wall_ns"),
            state: text(r, "state"),
            ingest: text(r, "ingest_state"),
            bytes: int(r, "bytes"),
            kernels: int(r, "kernels"),
            syncs: int(r, "syncs"),
            blocked_ns: int(r, "blocked_ns"),
            busy_ppm: int(r, "busy_ppm"),
            top_severity: int(r, "top_severity"),
            top_insight: text(r, "top_insight"),
            warnings: serde_json::from_str(&text(r, "warnings")).unwrap_or_default(),
            ingest_error: text(r, "ingest_error"),
        }
    }

    pub fn busy_pct(&self) -> f64 {
        self.busy_ppm as f64 / 10_000.0
    }
}

/// A session of the project, or [`WebError::NotFound`].
pub async fn session(st: &AppState, project: &str, id: &str) -> Result<SessionRow, WebError> {
    let row = sqlx::query(&format!(
        "SELECT {SESSION_COLS} FROM sessions WHERE project_id = $1 AND id = $2"
    ))
    .bind(project)
    .bind(id)
    .fetch_optional(&st.db.pool)
    .await?;
    row.map(|r| SessionRow::from_row(&r))
        .ok_or_else(|| WebError::NotFound(format!("no session {id:?} in this project")))
}

/// A stored document of a session (`header`, `profile`, `analysis`, `telemetry`, `lines`, …) as
/// JSON text; None when ingest did not store it (not analysed yet, or corrupt).
pub async fn doc_text(
    st: &AppState,
    project: &str,
    id: &str,
    kind: &str,
) -> Result<Option<String>, WebError> {
    let row = sqlx::query(
        "SELECT body FROM session_docs WHERE project_id = $1 AND session_id = $2 AND kind = $3",
    )
    .bind(project)
    .bind(id)
    .bind(kind)
    .fetch_optional(&st.db.pool)
    .await?;
    Ok(row.map(|r| text(&r, "body")))
}

/// A stored document parsed into `T` (only the fields `T` names are kept).
pub async fn doc<T: serde::de::DeserializeOwned>(
    st: &AppState,
    project: &str,
    id: &str,
    kind: &str,
) -> Result<Option<T>, WebError> {
    match doc_text(st, project, id, kind).await? {
        Some(s) => serde_json::from_str(&s)
            .map(Some)
            .map_err(|e| WebError::Internal(format!("stored {kind} document: {e}"))),
        None => Ok(None),
    }
}

/// One stored insight.
#[derive(Debug, Clone)]
pub struct InsightRow {
    pub ord: i64,
    /// 1 LOW, 2 MEDIUM, 3 HIGH.
    pub severity: i64,
    pub category: String,
    pub rule: String,
    pub title: String,
    /// The user location (empty when it has none).
    pub file: String,
    pub line: i64,
    pub impact_ns: i64,
    /// The whole insight (`gpufl_analysis::Insight` as JSON, plus `category`).
    pub body: Value,
}

/// A session's insights, highest impact first (ingest's order).
pub async fn insights(st: &AppState, project: &str, id: &str) -> Result<Vec<InsightRow>, WebError> {
    let rows = sqlx::query(
        "SELECT ord, severity, category, rule, title, file, line, impact_ns, body FROM insights \
         WHERE project_id = $1 AND session_id = $2 ORDER BY ord",
    )
    .bind(project)
    .bind(id)
    .fetch_all(&st.db.pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| InsightRow {
            ord: int(r, "ord"),
            severity: int(r, "severity"),
            category: text(r, "category"),
            rule: text(r, "rule"),
            title: text(r, "title"),
            file: text(r, "file"),
            line: int(r, "line"),
            impact_ns: int(r, "impact_ns"),
            body: serde_json::from_str(&text(r, "body")).unwrap_or(Value::Null),
        })
        .collect())
}

/// One stored kernel-table row (per kernel name and device).
#[derive(Debug, Clone)]
pub struct KernelRow {
    pub ord: i64,
    pub device: i64,
    pub name: String,
    pub launches: i64,
    pub total_ns: i64,
    /// `gpufl_analysis::kernels::KernelRow` as JSON.
    pub body: Value,
}

fn kernel_row(r: &sqlx::any::AnyRow) -> KernelRow {
    KernelRow {
        ord: int(r, "ord"),
        device: int(r, "device"),
        name: text(r, "name"),
        launches: int(r, "launches"),
        total_ns: int(r, "total_ns"),
        body: serde_json::from_str(&text(r, "body")).unwrap_or(Value::Null),
    }
}

/// The `limit` kernels with most GPU time, and how many kernel rows there are in all.
pub async fn top_kernels(
    st: &AppState,
    project: &str,
    id: &str,
    limit: i64,
) -> Result<(Vec<KernelRow>, i64), WebError> {
    let rows = sqlx::query(&format!(
        "SELECT ord, device, name, launches, total_ns, body FROM kernels \
         WHERE project_id = $1 AND session_id = $2 ORDER BY total_ns DESC, ord LIMIT {}",
        limit.max(1)
    ))
    .bind(project)
    .bind(id)
    .fetch_all(&st.db.pool)
    .await?;
    let n =
        sqlx::query("SELECT COUNT(*) AS n FROM kernels WHERE project_id = $1 AND session_id = $2")
            .bind(project)
            .bind(id)
            .fetch_one(&st.db.pool)
            .await?;
    Ok((rows.iter().map(kernel_row).collect(), int(&n, "n")))
}

/// One kernel row by name and device.
pub async fn kernel(
    st: &AppState,
    project: &str,
    id: &str,
    name: &str,
    device: i64,
) -> Result<Option<KernelRow>, WebError> {
    let row = sqlx::query(
        "SELECT ord, device, name, launches, total_ns, body FROM kernels \
         WHERE project_id = $1 AND session_id = $2 AND name = $3 AND device = $4",
    )
    .bind(project)
    .bind(id)
    .bind(name)
    .bind(device)
    .fetch_optional(&st.db.pool)
    .await?;
    Ok(row.as_ref().map(kernel_row))
}

/// Kernel rows of the session with one of `names` (every device), most GPU time first.
pub async fn kernels_named(
    st: &AppState,
    project: &str,
    id: &str,
    names: &[&str],
) -> Result<Vec<KernelRow>, WebError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let marks: Vec<String> = (0..names.len()).map(|i| format!("${}", i + 3)).collect();
    let sql = format!(
        "SELECT ord, device, name, launches, total_ns, body FROM kernels \
         WHERE project_id = $1 AND session_id = $2 AND name IN ({}) ORDER BY total_ns DESC, ord",
        marks.join(", ")
    );
    let mut q = sqlx::query(&sql).bind(project).bind(id);
    for n in names {
        q = q.bind(*n);
    }
    let rows = q.fetch_all(&st.db.pool).await?;
    Ok(rows.iter().map(kernel_row).collect())
}
