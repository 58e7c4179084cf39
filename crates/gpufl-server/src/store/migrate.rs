//! Schema migrations: each version a list of statements, applied in one transaction when the
//! store opens.

use super::{Backend, Db};
use crate::error::ServerError;
use sqlx::{Executor, Row};

/// Schema versions, each a list of statements; `{BIG}`-free SQL common to both backends except
/// where a pair is given. Append only: a released version never changes.
const MIGRATIONS: &[&[&str]] = &[
    // 1: projects, keys, sessions, parts, analysis rows.
    &[
        "CREATE TABLE projects (id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, created_ns BIGINT NOT NULL)",
        "CREATE TABLE api_keys (id TEXT PRIMARY KEY, project_id TEXT NOT NULL REFERENCES projects(id), \
         kind TEXT NOT NULL, hash TEXT NOT NULL UNIQUE, created_ns BIGINT NOT NULL, revoked_ns BIGINT NOT NULL DEFAULT 0)",
        "CREATE TABLE sessions (project_id TEXT NOT NULL REFERENCES projects(id), id TEXT NOT NULL, \
         state TEXT NOT NULL, upload_gen BIGINT NOT NULL DEFAULT 0, manifest TEXT NOT NULL DEFAULT '', \
         bytes BIGINT NOT NULL DEFAULT 0, created_ns BIGINT NOT NULL, uploaded_ns BIGINT NOT NULL DEFAULT 0, \
         ingest_state TEXT NOT NULL DEFAULT 'none', ingest_gen BIGINT NOT NULL DEFAULT -1, \
         claimed_by TEXT NOT NULL DEFAULT '', claimed_ns BIGINT NOT NULL DEFAULT 0, \
         ingest_count BIGINT NOT NULL DEFAULT 0, analysis_version BIGINT NOT NULL DEFAULT 0, \
         app TEXT NOT NULL DEFAULT '', host TEXT NOT NULL DEFAULT '', command TEXT NOT NULL DEFAULT '', \
         start_ns BIGINT NOT NULL DEFAULT 0, wall_ns BIGINT NOT NULL DEFAULT 0, kernels BIGINT NOT NULL DEFAULT 0, \
         syncs BIGINT NOT NULL DEFAULT 0, blocked_ns BIGINT NOT NULL DEFAULT 0, busy_ppm BIGINT NOT NULL DEFAULT 0, \
         top_severity BIGINT NOT NULL DEFAULT 0, top_insight TEXT NOT NULL DEFAULT '', \
         warnings TEXT NOT NULL DEFAULT '[]', ingest_error TEXT NOT NULL DEFAULT '', \
         PRIMARY KEY (project_id, id))",
        "CREATE INDEX sessions_ingest ON sessions (ingest_state, uploaded_ns)",
        "CREATE INDEX sessions_start ON sessions (project_id, start_ns)",
        "CREATE TABLE parts (project_id TEXT NOT NULL, session_id TEXT NOT NULL, file TEXT NOT NULL, \
         idx BIGINT NOT NULL, size BIGINT NOT NULL, sha256 TEXT NOT NULL, \
         PRIMARY KEY (project_id, session_id, file, idx))",
        "CREATE TABLE insights (project_id TEXT NOT NULL, session_id TEXT NOT NULL, ord BIGINT NOT NULL, \
         severity BIGINT NOT NULL, category TEXT NOT NULL, rule TEXT NOT NULL, title TEXT NOT NULL, \
         file TEXT NOT NULL, line BIGINT NOT NULL, impact_ns BIGINT NOT NULL, body TEXT NOT NULL, \
         PRIMARY KEY (project_id, session_id, ord))",
        "CREATE TABLE kernels (project_id TEXT NOT NULL, session_id TEXT NOT NULL, ord BIGINT NOT NULL, \
         device BIGINT NOT NULL, name TEXT NOT NULL, launches BIGINT NOT NULL, total_ns BIGINT NOT NULL, \
         body TEXT NOT NULL, PRIMARY KEY (project_id, session_id, ord))",
        "CREATE TABLE session_docs (project_id TEXT NOT NULL, session_id TEXT NOT NULL, kind TEXT NOT NULL, \
         body TEXT NOT NULL, PRIMARY KEY (project_id, session_id, kind))",
        "CREATE TABLE ingest_log (project_id TEXT NOT NULL, session_id TEXT NOT NULL, instance TEXT NOT NULL, \
         gen BIGINT NOT NULL, started_ns BIGINT NOT NULL, finished_ns BIGINT NOT NULL, outcome TEXT NOT NULL)",
    ],
    // 2: hardening (issue 36). Parts name their object (its name carries the hash; '' for the
    // objects of schema 1) and the session keeps their byte sum (the cap checked and moved in one
    // statement); the ingest's attempts, retries and backoff; the files whose hash completion
    // checked; objects to delete unless a part names them; the dashboard's login sessions.
    &[
        "ALTER TABLE parts ADD COLUMN blob TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE sessions ADD COLUMN part_bytes BIGINT NOT NULL DEFAULT 0",
        "UPDATE sessions SET part_bytes = COALESCE((SELECT SUM(p.size) FROM parts p \
         WHERE p.project_id = sessions.project_id AND p.session_id = sessions.id), 0)",
        "ALTER TABLE sessions ADD COLUMN updated_ns BIGINT NOT NULL DEFAULT 0",
        "UPDATE sessions SET updated_ns = CASE WHEN uploaded_ns > created_ns THEN uploaded_ns ELSE created_ns END",
        "ALTER TABLE sessions ADD COLUMN ingest_attempts BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE sessions ADD COLUMN ingest_retries BIGINT NOT NULL DEFAULT 0",
        "ALTER TABLE sessions ADD COLUMN not_before_ns BIGINT NOT NULL DEFAULT 0",
        "CREATE INDEX sessions_state ON sessions (state, updated_ns)",
        "CREATE TABLE verified_files (project_id TEXT NOT NULL, session_id TEXT NOT NULL, file TEXT NOT NULL, \
         size BIGINT NOT NULL, sha256 TEXT NOT NULL, PRIMARY KEY (project_id, session_id, file, size))",
        "CREATE TABLE blob_garbage (name TEXT PRIMARY KEY, project_id TEXT NOT NULL, session_id TEXT NOT NULL, \
         file TEXT NOT NULL, idx BIGINT NOT NULL, after_ns BIGINT NOT NULL)",
        "CREATE INDEX blob_garbage_after ON blob_garbage (after_ns)",
        "CREATE TABLE web_sessions (hash TEXT PRIMARY KEY, key_id TEXT NOT NULL, created_ns BIGINT NOT NULL, \
         expires_ns BIGINT NOT NULL)",
    ],
    // 3: runs (issue 37). A session names its run (`run_id` of its header: the sessions of one
    // `gpufl record` of several processes) and its rank; a run's cross-rank analysis is stored
    // once per run, with the number of its members it covers.
    &[
        "ALTER TABLE sessions ADD COLUMN run_id TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE sessions ADD COLUMN run_rank BIGINT NOT NULL DEFAULT -1",
        "CREATE INDEX sessions_run ON sessions (project_id, run_id)",
        "CREATE TABLE runs (project_id TEXT NOT NULL, run_id TEXT NOT NULL, members BIGINT NOT NULL, \
         body TEXT NOT NULL, updated_ns BIGINT NOT NULL, PRIMARY KEY (project_id, run_id))",
    ],
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

impl Db {
    /// Bring the schema to [`SCHEMA_VERSION`]; several instances starting at once on one
    /// PostgreSQL serialize on an advisory lock.
    pub(super) async fn migrate(&self) -> Result<(), ServerError> {
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock(7349215)")
                .execute(&mut *tx)
                .await?;
        }
        tx.execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
            .await?;
        let found: Option<i64> = sqlx::query("SELECT MAX(version) AS v FROM schema_version")
            .fetch_one(&mut *tx)
            .await?
            .try_get("v")?;
        let found = found.unwrap_or(0);
        if found > SCHEMA_VERSION {
            return Err(ServerError::SchemaTooNew {
                found,
                known: SCHEMA_VERSION,
            });
        }
        for (i, stmts) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            for s in *stmts {
                tx.execute(*s).await?;
            }
            sqlx::query("INSERT INTO schema_version (version) VALUES ($1)")
                .bind(i as i64 + 1)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }
}
