//! What ingest stores of a session's analysis: the `insights` and `kernels` rows (the columns
//! that are filtered and sorted on, and the whole item as JSON), the `session_docs` documents, the
//! summary columns of its `sessions` row and the `ingest_log` — all written in one transaction.

use super::{int, now_ns, text, Db};
use serde_json::Value;

/// One insight as ingest stores it: the columns the API filters on, and the whole insight as
/// JSON.
#[derive(Debug, Clone, Default)]
pub struct StoredInsight {
    pub severity: i64,
    pub category: &'static str,
    pub rule: String,
    pub title: String,
    pub file: String,
    pub line: i64,
    pub impact_ns: i64,
    pub body: String,
}

/// One kernel-table row as ingest stores it (per kernel name and device).
#[derive(Debug, Clone, Default)]
pub struct StoredKernel {
    pub device: i64,
    pub name: String,
    pub launches: i64,
    pub total_ns: i64,
    /// `gpufl_analysis::kernels::KernelRow` as JSON.
    pub body: String,
}

/// What one session's analysis stores.
#[derive(Debug, Default)]
pub struct Stored {
    pub app: String,
    pub host: String,
    pub command: String,
    pub start_ns: i64,
    pub wall_ns: i64,
    pub kernels: i64,
    pub syncs: i64,
    pub blocked_ns: i64,
    pub busy_ppm: i64,
    pub top_severity: i64,
    pub top_insight: String,
    pub warnings: Vec<String>,
    pub insights: Vec<StoredInsight>,
    pub kernels_rows: Vec<StoredKernel>,
    /// (kind, JSON).
    pub docs: Vec<(&'static str, String)>,
    /// The files did not decode to a session (no header): kept, marked corrupt.
    pub corrupt: Option<String>,
    /// Its records need more memory than the server gives one session's analysis: kept,
    /// marked `too_large`, with this reason.
    pub too_large: Option<String>,
    /// The run it belongs to (its header's `run_id`), empty for none; its rank, -1 for none.
    pub run_id: String,
    pub rank: i64,
}

impl Stored {
    /// The ingest state it is stored as: `too_large`, `corrupt` or `ready`.
    pub fn state(&self) -> &'static str {
        if self.too_large.is_some() {
            "too_large"
        } else if self.corrupt.is_some() {
            "corrupt"
        } else {
            "ready"
        }
    }

    /// Why it is not analysed (empty when it is).
    pub fn error(&self) -> String {
        self.too_large
            .clone()
            .or_else(|| self.corrupt.clone())
            .unwrap_or_default()
    }
}

/// Text for a plain text column: the NUL PostgreSQL refuses replaced by `␀` (U+2400), on both
/// backends alike (JSON columns escape it themselves).
pub fn clean(s: &str) -> String {
    s.replace('\0', "\u{2400}")
}

/// One stored insight, read back.
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

/// One stored kernel-table row, read back.
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

/// Reads, each bounded by the project.
impl Db {
    /// A stored document of a session (`header`, `profile`, `analysis`, `telemetry`, `lines`, …)
    /// as JSON text; None when ingest did not store it (not analysed yet, or corrupt).
    pub async fn doc(
        &self,
        project: &str,
        session: &str,
        kind: &str,
    ) -> Result<Option<String>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT body FROM session_docs WHERE project_id = $1 AND session_id = $2 AND kind = $3",
        )
        .bind(project)
        .bind(session)
        .bind(kind)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| text(&r, "body")))
    }

    /// A session's insights, highest impact first (ingest's order).
    pub async fn insights(
        &self,
        project: &str,
        session: &str,
    ) -> Result<Vec<InsightRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT ord, severity, category, rule, title, file, line, impact_ns, body FROM insights \
             WHERE project_id = $1 AND session_id = $2 ORDER BY ord",
        )
        .bind(project)
        .bind(session)
        .fetch_all(&self.pool)
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

    /// The JSON of a session's insights, in their order.
    pub async fn insight_bodies(
        &self,
        project: &str,
        session: &str,
    ) -> Result<Vec<String>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT body FROM insights WHERE project_id = $1 AND session_id = $2 ORDER BY ord",
        )
        .bind(project)
        .bind(session)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| text(r, "body")).collect())
    }

    /// The JSON of the insights located at `file:line`, in their order.
    pub async fn insight_bodies_at(
        &self,
        project: &str,
        session: &str,
        file: &str,
        line: i64,
    ) -> Result<Vec<String>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT body FROM insights WHERE project_id = $1 AND session_id = $2 AND file = $3 AND line = $4 ORDER BY ord",
        )
        .bind(project)
        .bind(session)
        .bind(file)
        .bind(line)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| text(r, "body")).collect())
    }

    /// The JSON of a session's kernel rows, in their order.
    pub async fn kernel_bodies(
        &self,
        project: &str,
        session: &str,
    ) -> Result<Vec<String>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT body FROM kernels WHERE project_id = $1 AND session_id = $2 ORDER BY ord",
        )
        .bind(project)
        .bind(session)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| text(r, "body")).collect())
    }

    /// The `limit` kernels with most GPU time, and how many kernel rows there are in all.
    pub async fn top_kernels(
        &self,
        project: &str,
        session: &str,
        limit: i64,
    ) -> Result<(Vec<KernelRow>, i64), sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT ord, device, name, launches, total_ns, body FROM kernels \
             WHERE project_id = $1 AND session_id = $2 ORDER BY total_ns DESC, ord LIMIT {}",
            limit.max(1)
        ))
        .bind(project)
        .bind(session)
        .fetch_all(&self.pool)
        .await?;
        let n = sqlx::query(
            "SELECT COUNT(*) AS n FROM kernels WHERE project_id = $1 AND session_id = $2",
        )
        .bind(project)
        .bind(session)
        .fetch_one(&self.pool)
        .await?;
        Ok((rows.iter().map(kernel_row).collect(), int(&n, "n")))
    }

    /// Kernel rows of the session with one of `names` (every device), most GPU time first.
    pub async fn kernels_named(
        &self,
        project: &str,
        session: &str,
        names: &[&str],
    ) -> Result<Vec<KernelRow>, sqlx::Error> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let marks: Vec<String> = (0..names.len()).map(|i| format!("${}", i + 3)).collect();
        let sql = format!(
            "SELECT ord, device, name, launches, total_ns, body FROM kernels \
             WHERE project_id = $1 AND session_id = $2 AND name IN ({}) ORDER BY total_ns DESC, ord",
            marks.join(", ")
        );
        let mut q = sqlx::query(&sql).bind(project).bind(session);
        for n in names {
            q = q.bind(*n);
        }
        let rows = q.fetch_all(&self.pool).await?;
        Ok(rows.iter().map(kernel_row).collect())
    }
}

/// Which claim a result belongs to.
#[derive(Debug, Clone, Copy)]
pub struct ClaimKey<'a> {
    pub project: &'a str,
    pub session: &'a str,
    /// The instance holding the claim.
    pub instance: &'a str,
    /// The upload generation claimed.
    pub gen: i64,
}

/// The write: one transaction per analysed session.
impl Db {
    /// Store the results `s` of analysis `version` for claim `c` (begun at `started`), if the
    /// session is still claimed by `c.instance` at generation `c.gen` — else nothing is written
    /// and the answer is false (it was uploaded again meanwhile, or the claim was taken over).
    pub async fn save_analysis(
        &self,
        c: ClaimKey<'_>,
        s: &Stored,
        version: i64,
        started: i64,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let state = s.state();
        let r = sqlx::query(
            "UPDATE sessions SET ingest_state = $1, analysis_version = $2, claimed_by = '', \
             ingest_attempts = 0, ingest_retries = 0, not_before_ns = 0, \
             app = $3, host = $4, command = $5, start_ns = $6, wall_ns = $7, kernels = $8, syncs = $9, \
             blocked_ns = $10, busy_ppm = $11, top_severity = $12, top_insight = $13, warnings = $14, \
             ingest_error = $15, run_id = $20, run_rank = $21 \
             WHERE project_id = $16 AND id = $17 AND claimed_by = $18 AND upload_gen = $19 AND ingest_state = 'running'",
        )
        .bind(state)
        .bind(version)
        .bind(clean(&s.app))
        .bind(clean(&s.host))
        .bind(clean(&s.command))
        .bind(s.start_ns)
        .bind(s.wall_ns)
        .bind(s.kernels)
        .bind(s.syncs)
        .bind(s.blocked_ns)
        .bind(s.busy_ppm)
        .bind(s.top_severity)
        .bind(clean(&s.top_insight))
        .bind(serde_json::to_string(&s.warnings).unwrap_or_else(|_| "[]".into()))
        .bind(clean(&s.error()))
        .bind(c.project)
        .bind(c.session)
        .bind(c.instance)
        .bind(c.gen)
        .bind(clean(&s.run_id))
        .bind(s.rank)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        for t in ["insights", "kernels", "session_docs"] {
            sqlx::query(&format!(
                "DELETE FROM {t} WHERE project_id = $1 AND session_id = $2"
            ))
            .bind(c.project)
            .bind(c.session)
            .execute(&mut *tx)
            .await?;
        }
        for (ord, i) in s.insights.iter().enumerate() {
            sqlx::query(
                "INSERT INTO insights (project_id, session_id, ord, severity, category, rule, title, file, line, impact_ns, body) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
            )
            .bind(c.project)
            .bind(c.session)
            .bind(ord as i64)
            .bind(i.severity)
            .bind(i.category)
            .bind(clean(&i.rule))
            .bind(clean(&i.title))
            .bind(clean(&i.file))
            .bind(i.line)
            .bind(i.impact_ns)
            .bind(&i.body)
            .execute(&mut *tx)
            .await?;
        }
        for (ord, k) in s.kernels_rows.iter().enumerate() {
            sqlx::query(
                "INSERT INTO kernels (project_id, session_id, ord, device, name, launches, total_ns, body) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind(c.project)
            .bind(c.session)
            .bind(ord as i64)
            .bind(k.device)
            .bind(clean(&k.name))
            .bind(k.launches)
            .bind(k.total_ns)
            .bind(&k.body)
            .execute(&mut *tx)
            .await?;
        }
        for (kind, body) in &s.docs {
            sqlx::query(
                "INSERT INTO session_docs (project_id, session_id, kind, body) VALUES ($1, $2, $3, $4)",
            )
            .bind(c.project)
            .bind(c.session)
            .bind(*kind)
            .bind(body)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query(
            "INSERT INTO ingest_log (project_id, session_id, instance, gen, started_ns, finished_ns, outcome) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(c.project)
        .bind(c.session)
        .bind(c.instance)
        .bind(c.gen)
        .bind(started)
        .bind(now_ns())
        .bind(state)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }
}
