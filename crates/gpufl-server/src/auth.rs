//! Projects and API keys: a key is `gfl_up_…` (upload) or `gfl_rd_…` (read) followed by 32
//! random hex digits; the database keeps its SHA-256 only. Requests are checked against it on every
//! call (a revoked key stops at once) and rate-limited per key. The API's handlers take the
//! caller as an extractor: [`UploadCaller`] (an upload key) or [`ReadCaller`] (a read key, or the
//! open project of `--local` / `--demo` when the request has no key).

use crate::error::{ApiError, ServerError};
use crate::store::{now_ns, Db};
use crate::AppState;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
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
    if db.project_id_by_name(name).await?.is_some() {
        return Err(ServerError::ProjectExists(name.to_string()));
    }
    let id = format!("p{}", random_hex(8));
    db.insert_project(&id, name, now_ns()).await?;
    let up = insert_key(db, &id, KeyKind::Upload).await?;
    let rd = insert_key(db, &id, KeyKind::Read).await?;
    Ok((id, vec![up, rd]))
}

/// The id of the project called `name`.
pub async fn project_id(db: &Db, name: &str) -> Result<String, ServerError> {
    db.project_id_by_name(name)
        .await?
        .ok_or_else(|| ServerError::NoProject(name.to_string()))
}

pub async fn create_key(db: &Db, project: &str, kind: KeyKind) -> Result<NewKey, ServerError> {
    let id = project_id(db, project).await?;
    insert_key(db, &id, kind).await
}

async fn insert_key(db: &Db, project_id: &str, kind: KeyKind) -> Result<NewKey, ServerError> {
    let secret = format!("{}{}", kind.prefix(), random_hex(16));
    let id = format!("k{}", random_hex(6));
    let hash = sha256_hex(secret.as_bytes());
    db.insert_key(&id, project_id, kind.as_str(), &hash, now_ns())
        .await?;
    Ok(NewKey { id, kind, secret })
}

pub async fn revoke_key(db: &Db, key_id: &str) -> Result<(), ServerError> {
    if !db.revoke_key(key_id, now_ns()).await? {
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
    let keys = db.keys_of_project(&id).await?;
    Ok(keys
        .into_iter()
        .map(|k| (k.id, k.kind, k.created_ns, k.revoked_ns))
        .collect())
}

/// The key of an `Authorization: Bearer KEY` header (the scheme in any case, RFC 7235); None
/// without the header, an empty key for any other form.
pub fn bearer(headers: &HeaderMap) -> Option<String> {
    let h = headers.get(header::AUTHORIZATION)?;
    let v = h.to_str().unwrap_or("").trim();
    Some(match v.split_once(' ') {
        Some((scheme, key)) if scheme.eq_ignore_ascii_case("bearer") => key.trim().to_string(),
        _ => String::new(),
    })
}

/// The caller of a request, from its `Authorization: Bearer KEY`.
pub async fn caller(db: &Db, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let Some(key) = bearer(headers) else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_key",
            "send the project's key as `Authorization: Bearer KEY`",
        ));
    };
    if key.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_key",
            "the Authorization header is not `Bearer KEY`",
        ));
    }
    let Some(row) = db.live_key(&sha256_hex(key.as_bytes())).await? else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unknown_key",
            "this key is not known to the server, or it was revoked",
        ));
    };
    let kind = KeyKind::parse(&row.kind).unwrap_or(KeyKind::Read);
    Ok(Caller {
        project_id: row.project_id,
        key_id: row.id,
        kind,
    })
}

/// The client's address as the per-address limit counts it (`-` when unknown).
pub fn client_key(parts: &Parts) -> String {
    parts
        .extensions
        .get::<crate::net::ClientAddr>()
        .map_or_else(|| "-".to_string(), |a| a.0.ip().to_string())
}

/// A failed authentication from `client`: the failure itself, or — past the address's rate
/// ([`AppState::fail_limiter`]) — a 429 with `Retry-After`.
pub fn failed(st: &AppState, client: &str, e: ApiError) -> ApiError {
    match st.fail_limiter.take(client) {
        Ok(()) => e,
        Err(limited) => limited,
    }
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

/// An API request's caller: its key, known and not revoked, within the key's rate (answers 401
/// or 429 otherwise).
impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &Arc<AppState>) -> Result<Self, ApiError> {
        let c = match caller(&st.db, &parts.headers).await {
            Ok(c) => c,
            Err(e) if e.status == StatusCode::UNAUTHORIZED => {
                return Err(failed(st, &client_key(parts), e))
            }
            Err(e) => return Err(e),
        };
        st.limiter.take(&c.key_id)?;
        Ok(c)
    }
}

/// The caller of an upload endpoint: a [`Caller`] with an upload key (403 otherwise).
#[derive(Debug, Clone)]
pub struct UploadCaller(pub Caller);

impl FromRequestParts<Arc<AppState>> for UploadCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &Arc<AppState>) -> Result<Self, ApiError> {
        let c = Caller::from_request_parts(parts, st).await?;
        require(&c, KeyKind::Upload)?;
        Ok(UploadCaller(c))
    }
}

/// The caller of a read endpoint: a [`Caller`] with a read key (403 otherwise) — or, on a server
/// with an open project (`--local`, `--demo`), a request without a key is that project's reader.
#[derive(Debug, Clone)]
pub struct ReadCaller(pub Caller);

impl FromRequestParts<Arc<AppState>> for ReadCaller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, st: &Arc<AppState>) -> Result<Self, ApiError> {
        if let (None, Some((id, _))) = (parts.headers.get(header::AUTHORIZATION), &st.open_project)
        {
            return Ok(ReadCaller(Caller {
                project_id: id.clone(),
                key_id: "open".into(),
                kind: KeyKind::Read,
            }));
        }
        let c = Caller::from_request_parts(parts, st).await?;
        require(&c, KeyKind::Read)?;
        Ok(ReadCaller(c))
    }
}

/// Token buckets per key (an API key's id, or a client address): `rate` requests a second,
/// bursts of `burst`; 0: unlimited.
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
                "more than {} requests a second ({key}); retry after {wait} s",
                self.rate
            ),
        );
        e.retry_after = Some(wait);
        Err(e)
    }
}
