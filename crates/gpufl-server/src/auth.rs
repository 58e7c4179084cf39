//! Projects and API keys: a key is `gfl_up_…` (upload) or `gfl_rd_…` (read) followed by 32
//! random hex digits; the database keeps its SHA-256 only. Requests are checked against it on every
//! call (a revoked key stops at once) and rate-limited per key.

use crate::db::{now_ns, text, Db};
use crate::error::{ApiError, ServerError};
use axum::http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Upload,
    Read,
}

impl KeyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyKind::Upload => "upload",
            KeyKind::Read => "read",
        }
    }
    pub fn parse(s: &str) -> Option<KeyKind> {
        match s {
            "upload" => Some(KeyKind::Upload),
            "read" => Some(KeyKind::Read),
            _ => None,
        }
    }
    fn prefix(self) -> &'static str {
        match self {
            KeyKind::Upload => "gfl_up_",
            KeyKind::Read => "gfl_rd_",
        }
    }
}

/// The caller a request's key names.
#[derive(Debug, Clone)]
pub struct Caller {
    pub project_id: String,
    pub key_id: String,
    pub kind: KeyKind,
}

/// A new key as printed once to its owner.
#[derive(Debug, Clone)]
pub struct NewKey {
    pub id: String,
    pub kind: KeyKind,
    pub secret: String,
}

pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

pub(crate) fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    getrandom::getrandom(&mut b).expect("the OS's random source");
    hex::encode(b)
}

/// Create a project with one upload key and one read key.
pub async fn create_project(db: &Db, name: &str) -> Result<(String, Vec<NewKey>), ServerError> {
    if name.is_empty() || name.len() > 128 || name.chars().any(|c| c.is_control()) {
        return Err(ServerError::Config(
            "a project name is 1-128 printable characters".into(),
        ));
    }
    let exists = sqlx::query("SELECT id FROM projects WHERE name = $1")
        .bind(name)
        .fetch_optional(&db.pool)
        .await?;
    if exists.is_some() {
        return Err(ServerError::ProjectExists(name.to_string()));
    }
    let id = format!("p{}", random_hex(8));
    sqlx::query("INSERT INTO projects (id, name, created_ns) VALUES ($1, $2, $3)")
        .bind(&id)
        .bind(name)
        .bind(now_ns())
        .execute(&db.pool)
        .await?;
    let up = insert_key(db, &id, KeyKind::Upload).await?;
    let rd = insert_key(db, &id, KeyKind::Read).await?;
    Ok((id, vec![up, rd]))
}

/// The id of the project called `name`.
pub async fn project_id(db: &Db, name: &str) -> Result<String, ServerError> {
    let row = sqlx::query("SELECT id FROM projects WHERE name = $1")
        .bind(name)
        .fetch_optional(&db.pool)
        .await?;
    row.map(|r| text(&r, "id"))
        .ok_or_else(|| ServerError::NoProject(name.to_string()))
}

pub async fn create_key(db: &Db, project: &str, kind: KeyKind) -> Result<NewKey, ServerError> {
    let id = project_id(db, project).await?;
    insert_key(db, &id, kind).await
}

async fn insert_key(db: &Db, project_id: &str, kind: KeyKind) -> Result<NewKey, ServerError> {
    let secret = format!("{}{}", kind.prefix(), random_hex(16));
    let id = format!("k{}", random_hex(6));
    sqlx::query(
        "INSERT INTO api_keys (id, project_id, kind, hash, created_ns) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(&id)
    .bind(project_id)
    .bind(kind.as_str())
    .bind(sha256_hex(secret.as_bytes()))
    .bind(now_ns())
    .execute(&db.pool)
    .await?;
    Ok(NewKey { id, kind, secret })
}

pub async fn revoke_key(db: &Db, key_id: &str) -> Result<(), ServerError> {
    let r = sqlx::query("UPDATE api_keys SET revoked_ns = $1 WHERE id = $2 AND revoked_ns = 0")
        .bind(now_ns())
        .bind(key_id)
        .execute(&db.pool)
        .await?;
    if r.rows_affected() == 0 {
        return Err(ServerError::NoKey(key_id.to_string()));
    }
    Ok(())
}

/// (id, kind, created_ns, revoked_ns) of a project's keys.
pub async fn list_keys(
    db: &Db,
    project: &str,
) -> Result<Vec<(String, String, i64, i64)>, ServerError> {
    let id = project_id(db, project).await?;
    let rows = sqlx::query(
        "SELECT id, kind, created_ns, revoked_ns FROM api_keys WHERE project_id = $1 ORDER BY created_ns",
    )
    .bind(&id)
    .fetch_all(&db.pool)
    .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                text(r, "id"),
                text(r, "kind"),
                crate::db::int(r, "created_ns"),
                crate::db::int(r, "revoked_ns"),
            )
        })
        .collect())
}

/// The caller of a request, from its `Authorization: Bearer KEY`.
pub async fn caller(db: &Db, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let Some(h) = headers.get(axum::http::header::AUTHORIZATION) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_key",
            "send the project's key as `Authorization: Bearer KEY`",
        ));
    };
    let key = h
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    if key.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_key",
            "the Authorization header is not `Bearer KEY`",
        ));
    }
    let row =
        sqlx::query("SELECT id, project_id, kind FROM api_keys WHERE hash = $1 AND revoked_ns = 0")
            .bind(sha256_hex(key.as_bytes()))
            .fetch_optional(&db.pool)
            .await?;
    let Some(row) = row else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unknown_key",
            "this key is not known to the server, or it was revoked",
        ));
    };
    let kind = KeyKind::parse(&text(&row, "kind")).unwrap_or(KeyKind::Read);
    Ok(Caller {
        project_id: text(&row, "project_id"),
        key_id: text(&row, "id"),
        kind,
    })
}

/// The caller, who must hold a key of `kind`.
pub fn require(c: &Caller, kind: KeyKind) -> Result<(), ApiError> {
    if c.kind == kind {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "wrong_key_kind",
        format!(
            "this endpoint takes a key of kind {}; this key is of kind {}",
            kind.as_str(),
            c.kind.as_str()
        ),
    ))
}

/// Token buckets per key: `rate` requests a second, bursts of `burst`.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimiter {
    pub fn new(rate: f64, burst: f64) -> Self {
        RateLimiter {
            rate,
            burst: burst.max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Take one token of `key`'s bucket, or say how many seconds until one is there.
    pub fn take(&self, key: &str) -> Result<(), ApiError> {
        if self.rate <= 0.0 {
            return Ok(());
        }
        let now = Instant::now();
        let mut m = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if m.len() > 100_000 {
            m.clear();
        }
        let (tokens, last) = m.entry(key.to_string()).or_insert((self.burst, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * self.rate).min(self.burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            return Ok(());
        }
        let wait = ((1.0 - *tokens) / self.rate).ceil().max(1.0) as u64;
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "more than {} requests a second with this key; retry after {wait} s",
                self.rate
            ),
        );
        e.retry_after = Some(wait);
        Err(e)
    }
}
