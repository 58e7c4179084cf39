//! The SQL store: every statement the server runs, on SQLite (embedded default) or PostgreSQL
//! through sqlx's `Any` driver, as methods of [`Db`] named for what they do and returning typed
//! rows — the handlers, pages and the ingest worker call these and hold no SQL of their own.
//! Split by what the statements touch: [`keys`] (projects and API keys), [`sessions`] (the
//! sessions table: uploads, listings, ingest claims), [`parts`] (the parts of an upload),
//! [`analysis`] (what ingest stores: insights, kernel rows, documents) and [`runs`] (the sessions of
//! a run and its cross-rank analysis). Schema migrations
//! ([`migrate`]) run when the store opens; the few statements that differ per backend are chosen
//! by [`Backend`].

pub mod analysis;
pub mod keys;
pub mod migrate;
pub mod parts;
pub mod runs;
pub mod sessions;

pub use analysis::{ClaimKey, InsightRow, KernelRow, Stored, StoredInsight, StoredKernel};
pub use keys::{KeyRow, LiveKey};
pub use migrate::SCHEMA_VERSION;
pub use parts::{Garbage, NewPart, PartRow, Published};
pub use runs::{RunMemberRow, RunRow};
pub use sessions::{
    Claimed, Filters, ListFilter, SessionChoice, SessionDetail, SessionRow, Sort, TrendPoint,
};

use crate::error::ServerError;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Executor, Row};
use std::time::Duration;

/// Which SQL database the pool talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The pool and its backend.
#[derive(Clone)]
pub struct Db {
    pub pool: AnyPool,
    pub backend: Backend,
}

impl Db {
    /// Connect (creating a SQLite file if needed) and migrate.
    pub async fn open(url: &str) -> Result<Db, ServerError> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else {
            return Err(ServerError::Config(format!(
                "--db {url:?}: expected sqlite://PATH or postgres://…"
            )));
        };
        let mut opts = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite { 8 } else { 16 })
            .acquire_timeout(Duration::from_secs(30));
        if backend == Backend::Sqlite {
            opts = opts.after_connect(|conn, _| {
                Box::pin(async move {
                    conn.execute("PRAGMA busy_timeout = 30000").await?;
                    conn.execute("PRAGMA journal_mode = WAL").await?;
                    conn.execute("PRAGMA synchronous = NORMAL").await?;
                    conn.execute("PRAGMA foreign_keys = ON").await?;
                    Ok(())
                })
            });
        }
        let pool = opts.connect(url).await?;
        let db = Db { pool, backend };
        db.migrate().await?;
        Ok(db)
    }

    /// ` FOR UPDATE SKIP LOCKED` where the backend has it (PostgreSQL); SQLite serializes writers.
    fn skip_locked(&self) -> &'static str {
        match self.backend {
            Backend::Postgres => " FOR UPDATE SKIP LOCKED",
            Backend::Sqlite => "",
        }
    }
}

/// A text column, empty when NULL.
fn text(r: &AnyRow, col: &str) -> String {
    r.try_get::<Option<String>, _>(col)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// An integer column, 0 when NULL.
fn int(r: &AnyRow, col: &str) -> i64 {
    r.try_get::<Option<i64>, _>(col)
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Nanoseconds since the Unix epoch, now.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}
