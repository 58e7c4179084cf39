//! Runs: the sessions of one `gpufl record` of several processes (their headers' `run_id`), and
//! each run's stored cross-rank analysis (gpufl-analysis's `RunAnalysis` as JSON).

use super::sessions::{SessionRow, SESSION_COLS};
use super::{int, now_ns, text, Db};

/// A member session of a run, as the run analysis needs it.
#[derive(Debug, Clone)]
pub struct RunMemberRow {
    pub id: String,
    pub ingest: String,
    /// The upload's manifest (JSON), to fetch its files.
    pub manifest: String,
}

/// A run's stored analysis.
#[derive(Debug, Clone)]
pub struct RunRow {
    /// The member sessions the analysis covers.
    pub members: i64,
    /// `RunAnalysis` as JSON.
    pub body: String,
    pub updated_ns: i64,
}

impl Db {
    /// The sessions of run `run_id` in project `project`, by id.
    pub async fn run_members(
        &self,
        project: &str,
        run_id: &str,
    ) -> Result<Vec<RunMemberRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, ingest_state, manifest FROM sessions \
             WHERE project_id = $1 AND run_id = $2 ORDER BY id",
        )
        .bind(project)
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| RunMemberRow {
                id: text(r, "id"),
                ingest: text(r, "ingest_state"),
                manifest: text(r, "manifest"),
            })
            .collect())
    }

    /// The rows of run `run_id`'s sessions, by rank (sessions without one last), then id.
    pub async fn run_sessions(
        &self,
        project: &str,
        run_id: &str,
    ) -> Result<Vec<SessionRow>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE project_id = $1 AND run_id = $2 \
             ORDER BY CASE WHEN run_rank < 0 THEN 1 ELSE 0 END, run_rank, id"
        ))
        .bind(project)
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(SessionRow::from_row).collect())
    }

    /// Store run `run_id`'s analysis over `members` sessions, unless one over more members is
    /// stored already (two members finishing at once: the analysis of the larger set stays).
    /// Whether it was written.
    pub async fn save_run(
        &self,
        project: &str,
        run_id: &str,
        members: i64,
        body: &str,
    ) -> Result<bool, sqlx::Error> {
        let now = now_ns();
        let r = sqlx::query(
            "INSERT INTO runs (project_id, run_id, members, body, updated_ns) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (project_id, run_id) DO UPDATE SET members = excluded.members, \
             body = excluded.body, updated_ns = excluded.updated_ns \
             WHERE runs.members <= excluded.members",
        )
        .bind(project)
        .bind(run_id)
        .bind(members)
        .bind(body)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }

    /// Run `run_id`'s stored analysis, if any.
    pub async fn run(&self, project: &str, run_id: &str) -> Result<Option<RunRow>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT members, body, updated_ns FROM runs WHERE project_id = $1 AND run_id = $2",
        )
        .bind(project)
        .bind(run_id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| RunRow {
            members: int(&r, "members"),
            body: text(&r, "body"),
            updated_ns: int(&r, "updated_ns"),
        }))
    }
}
