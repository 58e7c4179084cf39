//! Errors: the server's own ([`ServerError`]) and the API's answers to bad requests ([`ApiError`]).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// What stops the server or an admin command.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("no project named {0:?}")]
    NoProject(String),
    #[error("a project named {0:?} exists already")]
    ProjectExists(String),
    #[error("no key with id {0:?}")]
    NoKey(String),
    /// Stored data that does not add up (a part a completed manifest names is not stored).
    #[error("{0}")]
    Inconsistent(String),
    #[error("the database's schema is version {found}, newer than this gpufl knows ({known}): upgrade gpufl")]
    SchemaTooNew { found: i64, known: i64 },
}

impl ServerError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        ServerError::Io {
            what: what.into(),
            source,
        }
    }
}

/// An answer other than 2xx: a status, a stable code and a reason for people
/// (docs/server-api.md lists them).
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub reason: String,
    /// Seconds, for 429.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, reason: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            reason: reason.into(),
            retry_after: None,
        }
    }
    pub fn bad(code: &'static str, reason: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, reason)
    }
    pub fn not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such session in this key's project",
        )
    }
    /// A fault of the server (database, store): logged, answered with 500/503 and no detail that
    /// could leak another project's data.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        eprintln!("gpufl serve: internal error: {e}");
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the server's storage did not answer; retry later",
        )
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(e: sqlx::Error) -> Self {
        ApiError::internal(e)
    }
}

impl From<object_store::Error> for ApiError {
    fn from(e: object_store::Error) -> Self {
        ApiError::internal(e)
    }
}

impl From<ServerError> for ApiError {
    fn from(e: ServerError) -> Self {
        ApiError::internal(e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = gpufl_protocol::ErrorBody {
            error: self.code.to_string(),
            reason: self.reason,
        };
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
