//! The read endpoints (docs/server-api.md): a key reaches its own project's sessions only — every
//! query is bounded by the caller's project, and another project's session answers 404.

use crate::api::upload::check_session_id;
use crate::auth::{Caller, ReadCaller};
use crate::error::ApiError;
use crate::store::{ListFilter, SessionDetail, SessionRow};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpufl_protocol::Manifest;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

const SEVERITIES: [&str; 4] = ["", "LOW", "MEDIUM", "HIGH"];

fn severity_name(n: i64) -> Value {
    match n {
        1..=3 => Value::from(SEVERITIES[n as usize]),
        _ => Value::Null,
    }
}

#[derive(Deserialize, Default)]
pub struct ListQuery {
    app: Option<String>,
    host: Option<String>,
    since: Option<String>,
    until: Option<String>,
    severity: Option<String>,
    limit: Option<i64>,
    offset: Option<i64>,
}

/// `since` / `until`: ns since the epoch, or RFC 3339 UTC (`2026-11-26T14:00:00Z`).
fn parse_time(s: &str) -> Result<i64, ApiError> {
    if let Ok(n) = s.parse::<i64>() {
        return Ok(n);
    }
    parse_rfc3339(s).ok_or_else(|| {
        ApiError::bad(
            "bad_query",
            format!(
                "{s:?}: a time is ns since the epoch or an RFC 3339 UTC date that exists, \
                 1678 to 2262 (2026-11-26T14:00:00Z)"
            ),
        )
    })
}

fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    let days_in = match mo {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=12).contains(&mo) || !(1..=days_in).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let rest = &s[19..];
    let (frac, tz) = match rest.strip_prefix('.') {
        Some(r) => {
            let n = r.bytes().take_while(u8::is_ascii_digit).count();
            let digits = &r[..n];
            let mut ns: i64 = 0;
            for (i, c) in digits.bytes().take(9).enumerate() {
                ns += i64::from(c - b'0') * 10i64.pow(8 - i as u32);
            }
            (ns, &r[n..])
        }
        None => (0, rest),
    };
    if tz != "Z" && tz != "+00:00" {
        return None;
    }
    // Days from the civil date (proleptic Gregorian).
    let (y2, m2) = if mo <= 2 {
        (y - 1, mo + 9)
    } else {
        (y, mo - 3)
    };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    // Out of the range of ns since the epoch in 64 bits (1677-2262): None, never wrapped.
    (days * 86_400 + h * 3600 + mi * 60 + sec)
        .checked_mul(1_000_000_000)?
        .checked_add(frac)
}

fn session_json(r: &SessionRow) -> Value {
    json!({
        "id": r.id,
        "app": r.app,
        "host": r.host,
        "command": r.command,
        "start_unix_ns": r.start_ns,
        "wall_ns": r.wall_ns,
        "state": r.state,
        "ingest": r.ingest,
        "bytes": r.bytes,
        "kernels": r.kernels,
        "syncs": r.syncs,
        "sync_blocked_ns": r.blocked_ns,
        "gpu_busy_pct": r.busy_pct(),
        "top_severity": severity_name(r.top_severity),
        "top_insight": r.top_insight,
    })
}

/// The list's filters from the query string.
fn list_filter(q: &ListQuery) -> Result<ListFilter, ApiError> {
    let since = q.since.as_deref().map(parse_time).transpose()?;
    let until = q.until.as_deref().map(parse_time).transpose()?;
    let min_severity = match &q.severity {
        None => None,
        Some(s) => Some(match s.to_ascii_uppercase().as_str() {
            "LOW" => 1,
            "MEDIUM" => 2,
            "HIGH" => 3,
            _ => {
                return Err(ApiError::bad(
                    "bad_query",
                    "severity is LOW, MEDIUM or HIGH",
                ))
            }
        }),
    };
    Ok(ListFilter {
        app: q.app.clone(),
        host: q.host.clone(),
        since,
        until,
        min_severity,
        limit: q.limit.unwrap_or(100).clamp(1, 1000),
        offset: q.offset.unwrap_or(0).max(0),
    })
}

/// `GET /api/v1/sessions`.
pub async fn list(
    State(st): State<Arc<AppState>>,
    ReadCaller(c): ReadCaller,
    q: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad("bad_query", e.body_text()))?;
    let f = list_filter(&q)?;
    let rows = st.db.list_sessions(&c.project_id, &f).await?;
    Ok(Json(json!({
        "sessions": rows.iter().map(session_json).collect::<Vec<_>>(),
        "limit": f.limit,
        "offset": f.offset,
    })))
}

/// A session of the caller's project, or 404.
async fn session_row(st: &AppState, c: &Caller, id: &str) -> Result<SessionDetail, ApiError> {
    check_session_id(id).map_err(|_| ApiError::not_found())?;
    st.db
        .session_detail(&c.project_id, id)
        .await?
        .ok_or_else(ApiError::not_found)
}

/// A stored document as JSON; null when absent (or unreadable).
async fn doc(st: &AppState, c: &Caller, id: &str, kind: &str) -> Result<Value, ApiError> {
    let body = st.db.doc(&c.project_id, id, kind).await?;
    Ok(body
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or(Value::Null))
}

/// Stored JSON bodies parsed, the unreadable left out.
fn parsed(bodies: Vec<String>) -> Vec<Value> {
    bodies
        .iter()
        .filter_map(|b| serde_json::from_str(b).ok())
        .collect()
}

/// `GET /api/v1/sessions/{id}`.
pub async fn one(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    ReadCaller(c): ReadCaller,
) -> Result<Json<Value>, ApiError> {
    let r = session_row(&st, &c, &id).await?;
    let mut v = session_json(&r.row);
    v["warnings"] = json!(r.row.warnings);
    v["ingest_error"] = Value::from(r.row.ingest_error.as_str());
    v["analysis_version"] = Value::from(r.analysis_version);
    v["uploaded_unix_ns"] = Value::from(r.uploaded_ns);
    // How many times the session was analysed (claims of its ingest).
    v["analyses"] = Value::from(r.ingest_count);
    v["header"] = doc(&st, &c, &id, "header").await?;
    let a = doc(&st, &c, &id, "analysis").await?;
    v["totals"] = a.get("totals").cloned().unwrap_or(Value::Null);
    v["attribution"] = a.get("attribution").cloned().unwrap_or(Value::Null);
    v["gpu_idle"] = a.get("gpu_idle").cloned().unwrap_or(json!([]));
    v["scopes"] = a.get("scopes").cloned().unwrap_or(json!([]));
    Ok(Json(v))
}

/// `GET /api/v1/sessions/{id}/insights`.
pub async fn insights(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    ReadCaller(c): ReadCaller,
) -> Result<Json<Value>, ApiError> {
    session_row(&st, &c, &id).await?;
    let list = parsed(st.db.insight_bodies(&c.project_id, &id).await?);
    Ok(Json(json!({ "session": id, "insights": list })))
}

#[derive(Deserialize)]
pub struct LineQuery {
    file: String,
    line: i64,
    /// Every frame of each stack, not from the first shown one.
    #[serde(default)]
    all_frames: bool,
}

/// `GET /api/v1/sessions/{id}/lines?file=&line=`: what happened at the line (gpufl-analysis's
/// line detail: synchronizations with their duration distribution, copies, the kernels launched
/// there, a whole stack — one entry per distinct location at that line, e.g. per library frame)
/// and the insights located there.
pub async fn line(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    ReadCaller(c): ReadCaller,
    q: Result<Query<LineQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let Query(q) = q.map_err(|e| ApiError::bad("bad_query", e.body_text()))?;
    session_row(&st, &c, &id).await?;
    let details = doc(&st, &c, &id, "lines").await?;
    let matches = |loc: &Value| {
        loc.get("file").and_then(Value::as_str) == Some(q.file.as_str())
            && loc.get("line").and_then(Value::as_i64) == Some(q.line)
    };
    let mut lines: Vec<Value> = details
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|l| l.get("location").is_some_and(matches))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    // Each line's stack from the `stacks` document (where ingest keeps each stack once), from its
    // first shown frame unless `all_frames`.
    let stacks: Option<crate::linedoc::Stacks> =
        if lines.iter().any(|l| l.get("stack_ref").is_some()) {
            st.db
                .doc(&c.project_id, &id, "stacks")
                .await?
                .and_then(|b| serde_json::from_str(&b).ok())
        } else {
            None
        };
    for l in &mut lines {
        let mut frames = crate::linedoc::stack_of(l, stacks.as_ref());
        if !q.all_frames {
            frames = crate::linedoc::shown(frames);
        }
        if let Some(o) = l.as_object_mut() {
            o.remove("stack_ref");
            o.insert("stack".into(), json!(frames));
        }
    }
    let ins = parsed(
        st.db
            .insight_bodies_at(&c.project_id, &id, &q.file, q.line)
            .await?,
    );
    if lines.is_empty() && ins.is_empty() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "nothing recorded at that line in this session",
        ));
    }
    Ok(Json(json!({
        "session": id, "file": q.file, "line": q.line,
        "activity": lines, "insights": ins,
    })))
}

/// `GET /api/v1/sessions/{id}/kernels`.
pub async fn kernels(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    ReadCaller(c): ReadCaller,
) -> Result<Json<Value>, ApiError> {
    session_row(&st, &c, &id).await?;
    let list = parsed(st.db.kernel_bodies(&c.project_id, &id).await?);
    Ok(Json(json!({ "session": id, "kernels": list })))
}

/// `GET /api/v1/sessions/{id}/telemetry`: per GPU the NVML samples (at most 2,000 a device),
/// their summary, and the utilization series of the idle analysis.
pub async fn telemetry(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    ReadCaller(c): ReadCaller,
) -> Result<Json<Value>, ApiError> {
    session_row(&st, &c, &id).await?;
    let a = doc(&st, &c, &id, "analysis").await?;
    let series = doc(&st, &c, &id, "telemetry").await?;
    Ok(Json(json!({
        "session": id,
        "series": series,
        "telemetry": a.get("telemetry").cloned().unwrap_or(json!([])),
        "utilization": a.get("gpu_idle").and_then(Value::as_array).map(|d| d.iter().map(|d| json!({
            "device": d.get("device"),
            "chunks": d.get("utilization"),
        })).collect::<Vec<_>>()).unwrap_or_default(),
    })))
}

fn manifest_of(r: &SessionDetail) -> Option<Manifest> {
    serde_json::from_str(&r.manifest).ok()
}

/// `GET /api/v1/sessions/{id}/files`.
pub async fn files(
    State(st): State<Arc<AppState>>,
    Path(id): Path<String>,
    ReadCaller(c): ReadCaller,
) -> Result<Json<Value>, ApiError> {
    let r = session_row(&st, &c, &id).await?;
    let m = manifest_of(&r).ok_or_else(ApiError::not_found)?;
    Ok(Json(json!({ "session": id, "files": m.files })))
}

/// `GET /api/v1/sessions/{id}/files/{name}`: the file as uploaded, streamed part by part.
pub async fn file(
    State(st): State<Arc<AppState>>,
    Path((id, name)): Path<(String, String)>,
    ReadCaller(c): ReadCaller,
) -> Result<Response, ApiError> {
    let r = session_row(&st, &c, &id).await?;
    let m = manifest_of(&r).ok_or_else(ApiError::not_found)?;
    let Some(f) = m.files.into_iter().find(|f| f.name == name) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such file in this session",
        ));
    };
    let parts = st.db.file_parts(&c.project_id, &id, &f.name).await?;
    let mut names = Vec::with_capacity(f.parts as usize);
    for i in 0..f.parts {
        let Some(p) = parts.iter().find(|p| p.idx == i as i64) else {
            return Err(ApiError::internal(format!(
                "{id}/{}: part {i} missing",
                f.name
            )));
        };
        names.push((p.blob.clone(), f.part_len(i) as usize));
    }
    let blobs = st.blobs.clone();
    let size = f.size;
    let stream = futures_util::stream::unfold(names.into_iter(), move |mut it| {
        let blobs = blobs.clone();
        async move {
            let (name, len) = it.next()?;
            let r = blobs
                .get(&name)
                .await
                .map(|b| b.slice(..len.min(b.len())))
                .map_err(std::io::Error::other);
            Some((r, it))
        }
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/zstd".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339() {
        assert_eq!(super::parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            super::parse_rfc3339("2026-11-26T14:00:00.5Z"),
            Some(1_795_701_600_500_000_000)
        );
        assert_eq!(super::parse_rfc3339("2026-13-26T14:00:00Z"), None);
        assert_eq!(super::parse_rfc3339("2026-11-26 14:00:00Z"), None);
        assert_eq!(super::parse_rfc3339("2026-02-31T00:00:00Z"), None);
        assert_eq!(super::parse_rfc3339("2025-02-29T00:00:00Z"), None);
        assert!(super::parse_rfc3339("2024-02-29T00:00:00Z").is_some());
        assert_eq!(super::parse_rfc3339("9999-12-31T23:59:59Z"), None);
        assert_eq!(super::parse_rfc3339("1000-01-01T00:00:00Z"), None);
    }
}
