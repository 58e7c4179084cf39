//! The `sessions` table: one row per uploaded session with its upload state, its ingest state
//! (claims of the ingest workers) and the summary figures ingest stored. Every read is bounded by
//! a project.
//!
//! The dashboard's list is built from a whitelist: sort columns and directions are chosen by
//! name ([`Sort`]), every value from the request is a bound parameter (`$2`, `$3`, … after the
//! project's `$1`), and the search is `LOWER(column) LIKE $n ESCAPE '!'` with the pattern's `%`,
//! `_` and `!` escaped — the same text on SQLite and PostgreSQL.

use super::{int, text, Db};

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
    /// `none`, `pending`, `running`, `ready`, `corrupt`, `failed`, `too_large`.
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
    /// The run it belongs to (its header's `run_id`); empty for none.
    pub run_id: String,
    /// Its rank in the run; -1 for none.
    pub rank: i64,
}

/// Columns of [`SessionRow`], for `SELECT`.
pub const SESSION_COLS: &str = "id, app, host, command, start_ns, wall_ns, state, ingest_state, \
     bytes, kernels, syncs, blocked_ns, busy_ppm, top_severity, top_insight, warnings, ingest_error, \
     run_id, run_rank";

impl SessionRow {
    pub(super) fn from_row(r: &sqlx::any::AnyRow) -> SessionRow {
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
            run_id: text(r, "run_id"),
            rank: int(r, "run_rank"),
        }
    }

    pub fn busy_pct(&self) -> f64 {
        self.busy_ppm as f64 / 10_000.0
    }
}

/// A session's row with what the API's session answer adds.
#[derive(Debug, Clone, Default)]
pub struct SessionDetail {
    pub row: SessionRow,
    /// The completed upload's manifest (JSON; empty while uploading).
    pub manifest: String,
    pub analysis_version: i64,
    pub uploaded_ns: i64,
    /// How many times the session was claimed for analysis.
    pub ingest_count: i64,
}

/// The API's filters of `GET /api/v1/sessions`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListFilter {
    pub app: Option<String>,
    pub host: Option<String>,
    /// Started at or after, ns since the epoch.
    pub since: Option<i64>,
    /// Started before, ns since the epoch.
    pub until: Option<i64>,
    /// At least this severity rank (1 LOW … 3 HIGH).
    pub min_severity: Option<i64>,
    pub limit: i64,
    pub offset: i64,
}

/// What the dashboard's table can be sorted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sort {
    Start,
    Duration,
    Busy,
    Blocked,
    Severity,
    App,
}

impl Sort {
    pub const ALL: [Sort; 6] = [
        Sort::Start,
        Sort::Duration,
        Sort::Busy,
        Sort::Blocked,
        Sort::Severity,
        Sort::App,
    ];

    /// What it orders by (a constant: never text from the request); names case-insensitively.
    pub fn column(self) -> &'static str {
        match self {
            Sort::Start => "start_ns",
            Sort::Duration => "wall_ns",
            Sort::Busy => "busy_ppm",
            Sort::Blocked => "blocked_ns",
            Sort::Severity => "top_severity",
            Sort::App => "LOWER(app)",
        }
    }
}

/// The dashboard's validated list request (parsed from the query string by the sessions page).
#[derive(Debug, Clone, PartialEq)]
pub struct Filters {
    pub app: Option<String>,
    pub host: Option<String>,
    /// At least this severity rank (1 LOW … 3 HIGH).
    pub severity: Option<i64>,
    /// Searched in the app, host, command and top insight, case-insensitively.
    pub q: Option<String>,
    pub sort: Sort,
    pub desc: bool,
    pub limit: i64,
    pub offset: i64,
}

/// A bound parameter.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    Text(String),
    Int(i64),
}

/// The `%`/`_`/`!` of `s` escaped with `!` (for `LIKE … ESCAPE '!'`), lower-cased, inside `%…%`.
pub fn like_pattern(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('%');
    for c in s.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '!') {
            out.push('!');
        }
        out.push(c);
    }
    out.push('%');
    out
}

/// The columns the search looks in.
const SEARCHED: [&str; 4] = ["app", "host", "command", "top_insight"];

impl Filters {
    /// `WHERE project_id = $1 AND …` and the parameters after the project's, in their order.
    pub fn where_sql(&self) -> (String, Vec<Param>) {
        let mut sql = String::from("WHERE project_id = $1");
        let mut params = Vec::new();
        let mut add = |sql: &mut String, cond: &str, p: Param| {
            params.push(p);
            let n = params.len() + 1;
            sql.push_str(&cond.replace("$?", &format!("${n}")));
        };
        if let Some(a) = &self.app {
            add(&mut sql, " AND app = $?", Param::Text(a.clone()));
        }
        if let Some(h) = &self.host {
            add(&mut sql, " AND host = $?", Param::Text(h.clone()));
        }
        if let Some(s) = self.severity {
            add(&mut sql, " AND top_severity >= $?", Param::Int(s));
        }
        if let Some(q) = &self.q {
            let pat = like_pattern(q);
            for (i, col) in SEARCHED.iter().enumerate() {
                let cond = format!(
                    "{}LOWER({col}) LIKE $? ESCAPE '!'{}",
                    if i == 0 { " AND (" } else { " OR " },
                    if i + 1 == SEARCHED.len() { ")" } else { "" }
                );
                add(&mut sql, &cond, Param::Text(pat.clone()));
            }
        }
        (sql, params)
    }

    /// `ORDER BY …`, ties by id in the same direction.
    pub fn order_sql(&self) -> String {
        let d = if self.desc { "DESC" } else { "ASC" };
        format!("ORDER BY {} {d}, id {d}", self.sort.column())
    }

    /// The page's rows.
    pub fn list_sql(&self) -> (String, Vec<Param>) {
        let (w, p) = self.where_sql();
        (
            format!(
                "SELECT {SESSION_COLS} FROM sessions {w} {} LIMIT {} OFFSET {}",
                self.order_sql(),
                self.limit,
                self.offset
            ),
            p,
        )
    }
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

/// `sql` with the project as `$1` and `params` after it.
fn bound<'q>(sql: &'q str, project: &'q str, params: &'q [Param]) -> AnyQuery<'q> {
    let mut q = sqlx::query(sql).bind(project);
    for p in params {
        q = match p {
            Param::Text(s) => q.bind(s.as_str()),
            Param::Int(n) => q.bind(*n),
        };
    }
    q
}

/// One point of the dashboard's trend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrendPoint {
    pub start_ns: i64,
    pub wall_ns: i64,
    pub busy_ppm: i64,
    pub blocked_ns: i64,
}

/// An analysed session as the compare form offers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionChoice {
    pub id: String,
    pub app: String,
    pub start_ns: i64,
}

/// A session an ingest worker claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    pub project: String,
    pub session: String,
    /// The upload generation claimed: the results are stored only if it is still current.
    pub gen: i64,
    /// The completed upload's manifest (JSON).
    pub manifest: String,
    /// Errors its analysis met and survived so far (for the backoff).
    pub retries: i64,
}

/// Reads: one session, lists, the dashboard's table, trend and choices.
impl Db {
    /// A session of the project.
    pub async fn session(
        &self,
        project: &str,
        id: &str,
    ) -> Result<Option<SessionRow>, sqlx::Error> {
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLS} FROM sessions WHERE project_id = $1 AND id = $2"
        ))
        .bind(project)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(SessionRow::from_row))
    }

    /// A session of the project with its manifest and analysis bookkeeping.
    pub async fn session_detail(
        &self,
        project: &str,
        id: &str,
    ) -> Result<Option<SessionDetail>, sqlx::Error> {
        let row = sqlx::query(&format!(
            "SELECT {SESSION_COLS}, manifest, analysis_version, uploaded_ns, ingest_count \
             FROM sessions WHERE project_id = $1 AND id = $2"
        ))
        .bind(project)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| SessionDetail {
            row: SessionRow::from_row(&r),
            manifest: text(&r, "manifest"),
            analysis_version: int(&r, "analysis_version"),
            uploaded_ns: int(&r, "uploaded_ns"),
            ingest_count: int(&r, "ingest_count"),
        }))
    }

    /// The API's list: the project's sessions passing `f`, latest start first.
    pub async fn list_sessions(
        &self,
        project: &str,
        f: &ListFilter,
    ) -> Result<Vec<SessionRow>, sqlx::Error> {
        let mut sql = format!("SELECT {SESSION_COLS} FROM sessions WHERE project_id = $1");
        let mut params = Vec::new();
        // Text parameters first, integers after them, each numbered as it is added.
        let texts = [("app", &f.app), ("host", &f.host)];
        for (col, v) in texts {
            if let Some(v) = v {
                params.push(Param::Text(v.clone()));
                sql.push_str(&format!(" AND {col} = ${}", params.len() + 1));
            }
        }
        let ints = [
            ("start_ns >=", f.since),
            ("start_ns <", f.until),
            ("top_severity >=", f.min_severity),
        ];
        for (cond, v) in ints {
            if let Some(v) = v {
                params.push(Param::Int(v));
                sql.push_str(&format!(" AND {cond} ${}", params.len() + 1));
            }
        }
        sql.push_str(&format!(
            " ORDER BY start_ns DESC, id LIMIT {} OFFSET {}",
            f.limit, f.offset
        ));
        let rows = bound(&sql, project, &params).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(SessionRow::from_row).collect())
    }

    /// The dashboard's page of the list.
    pub async fn sessions_page(
        &self,
        project: &str,
        f: &Filters,
    ) -> Result<Vec<SessionRow>, sqlx::Error> {
        let (sql, params) = f.list_sql();
        let rows = bound(&sql, project, &params).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(SessionRow::from_row).collect())
    }

    /// How many sessions pass the dashboard's filters.
    pub async fn count_sessions(&self, project: &str, f: &Filters) -> Result<i64, sqlx::Error> {
        let (w, params) = f.where_sql();
        let sql = format!("SELECT COUNT(*) AS n FROM sessions {w}");
        let r = bound(&sql, project, &params).fetch_one(&self.pool).await?;
        Ok(int(&r, "n"))
    }

    /// How many sessions the project has.
    pub async fn project_session_count(&self, project: &str) -> Result<i64, sqlx::Error> {
        let r = sqlx::query("SELECT COUNT(*) AS n FROM sessions WHERE project_id = $1")
            .bind(project)
            .fetch_one(&self.pool)
            .await?;
        Ok(int(&r, "n"))
    }

    /// The latest `max` analysed sessions that pass the filters, latest first.
    pub async fn trend(
        &self,
        project: &str,
        f: &Filters,
        max: i64,
    ) -> Result<Vec<TrendPoint>, sqlx::Error> {
        let (w, params) = f.where_sql();
        let sql = format!(
            "SELECT start_ns, wall_ns, busy_ppm, blocked_ns FROM sessions {w} AND ingest_state = 'ready' \
             ORDER BY start_ns DESC, id DESC LIMIT {max}"
        );
        let rows = bound(&sql, project, &params).fetch_all(&self.pool).await?;
        Ok(rows
            .iter()
            .map(|r| TrendPoint {
                start_ns: int(r, "start_ns"),
                wall_ns: int(r, "wall_ns"),
                busy_ppm: int(r, "busy_ppm"),
                blocked_ns: int(r, "blocked_ns"),
            })
            .collect())
    }

    /// The project's apps (non-empty, at most 200, in order).
    pub async fn apps(&self, project: &str) -> Result<Vec<String>, sqlx::Error> {
        self.distinct(project, "app").await
    }

    /// The project's hosts (non-empty, at most 200, in order).
    pub async fn hosts(&self, project: &str) -> Result<Vec<String>, sqlx::Error> {
        self.distinct(project, "host").await
    }

    async fn distinct(&self, project: &str, col: &'static str) -> Result<Vec<String>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT DISTINCT {col} AS v FROM sessions WHERE project_id = $1 AND {col} <> '' \
             ORDER BY {col} LIMIT 200"
        ))
        .bind(project)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| text(r, "v")).collect())
    }

    /// The project's latest `limit` analysed sessions, latest first.
    pub async fn ready_sessions(
        &self,
        project: &str,
        limit: i64,
    ) -> Result<Vec<SessionChoice>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT id, app, start_ns FROM sessions WHERE project_id = $1 AND ingest_state = 'ready' \
             ORDER BY start_ns DESC, id DESC LIMIT {limit}"
        ))
        .bind(project)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| SessionChoice {
                id: text(r, "id"),
                app: text(r, "app"),
                start_ns: int(r, "start_ns"),
            })
            .collect())
    }
}

/// Uploads: a session's row from its first part to its completion.
impl Db {
    /// A session's upload state (`uploading`, `complete`); None when absent.
    pub async fn upload_state(
        &self,
        project: &str,
        session: &str,
    ) -> Result<Option<String>, sqlx::Error> {
        let row = sqlx::query("SELECT state FROM sessions WHERE project_id = $1 AND id = $2")
            .bind(project)
            .bind(session)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| text(&r, "state")))
    }

    /// The session's row, `uploading`, unless it exists.
    pub async fn open_upload(
        &self,
        project: &str,
        session: &str,
        now: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO sessions (project_id, id, state, created_ns, updated_ns) \
             VALUES ($1, $2, 'uploading', $3, $3) ON CONFLICT (project_id, id) DO NOTHING",
        )
        .bind(project)
        .bind(session)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// A session's upload state and its stored manifest (empty while uploading); None when
    /// absent.
    pub async fn upload_manifest(
        &self,
        project: &str,
        session: &str,
    ) -> Result<Option<(String, String)>, sqlx::Error> {
        let row =
            sqlx::query("SELECT state, manifest FROM sessions WHERE project_id = $1 AND id = $2")
                .bind(project)
                .bind(session)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| (text(&r, "state"), text(&r, "manifest"))))
    }

    /// Mark the session complete with `manifest` and pending analysis (a new upload generation:
    /// its attempts, retries and error cleared) — only if it still holds manifest `prev`. True
    /// when it moved (of completions racing from one `prev`, one).
    pub async fn complete_upload(
        &self,
        project: &str,
        session: &str,
        prev: &str,
        manifest: &str,
        bytes: i64,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let r = sqlx::query(
            "UPDATE sessions SET state = 'complete', manifest = $1, bytes = $2, uploaded_ns = $3, \
             updated_ns = $3, upload_gen = upload_gen + 1, ingest_state = 'pending', \
             ingest_attempts = 0, ingest_retries = 0, not_before_ns = 0, ingest_error = '' \
             WHERE project_id = $4 AND id = $5 AND manifest = $6 AND manifest <> $1",
        )
        .bind(manifest)
        .bind(bytes)
        .bind(now)
        .bind(project)
        .bind(session)
        .bind(prev)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }

    /// A session's ingest state (`none`, `pending`, `running`, `ready`, `corrupt`, `failed`,
    /// `too_large`); an error
    /// when there is no such session.
    pub async fn ingest_state(&self, project: &str, session: &str) -> Result<String, sqlx::Error> {
        let r = sqlx::query("SELECT ingest_state FROM sessions WHERE project_id = $1 AND id = $2")
            .bind(project)
            .bind(session)
            .fetch_one(&self.pool)
            .await?;
        Ok(text(&r, "ingest_state"))
    }
}

/// Ingest: claims of the workers. A claim counts an attempt; a claim that never comes back (the
/// instance died: killed, out of memory) leaves it counted, so a session whose analysis stops
/// the server is tried [`Db::claim_next_session`]'s `max_attempts` times, then `failed` for
/// good (until a newer analysis); an error the worker survives gives the attempt back and
/// retries later (backoff), up to `max_retries`.
impl Db {
    /// Every session stored by an analysis other than `version` (analysed, corrupt, failed or
    /// too large) pending again, its attempts and retries cleared.
    pub async fn requeue_old(&self, version: i64) -> Result<u64, sqlx::Error> {
        let r = sqlx::query(
            "UPDATE sessions SET ingest_state = 'pending', ingest_attempts = 0, ingest_retries = 0, \
             not_before_ns = 0 WHERE state = 'complete' \
             AND ingest_state IN ('ready', 'corrupt', 'failed', 'too_large') AND analysis_version <> $1",
        )
        .bind(version)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    /// The instances holding claims now.
    pub async fn claimants(&self) -> Result<Vec<String>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT DISTINCT claimed_by FROM sessions WHERE ingest_state = 'running' AND claimed_by <> ''",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| text(r, "claimed_by")).collect())
    }

    /// The claims of instance `who` (gone), pending again — their attempts stay counted.
    pub async fn requeue_claims_of(&self, who: &str) -> Result<u64, sqlx::Error> {
        let r = sqlx::query(
            "UPDATE sessions SET ingest_state = 'pending', claimed_by = '' \
             WHERE ingest_state = 'running' AND claimed_by = $1",
        )
        .bind(who)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected())
    }

    /// Claim the pending session uploaded first whose backoff is over, or one whose claim is
    /// older than `lease_ns`, for `instance` (several instances on one PostgreSQL skip each
    /// other's locked rows). Sessions that would be claimed after `max_attempts` claims that
    /// never came back are marked `failed` with `poison_reason` (and analysis `version`) first.
    pub async fn claim_next_session(
        &self,
        instance: &str,
        now: i64,
        lease_ns: i64,
        max_attempts: i64,
        version: i64,
        poison_reason: &str,
    ) -> Result<Option<Claimed>, sqlx::Error> {
        sqlx::query(
            "UPDATE sessions SET ingest_state = 'failed', claimed_by = '', analysis_version = $1, \
             ingest_error = $2 \
             WHERE (ingest_state = 'pending' OR (ingest_state = 'running' AND claimed_ns < $3)) \
             AND ingest_attempts >= $4",
        )
        .bind(version)
        .bind(poison_reason)
        .bind(now - lease_ns)
        .bind(max_attempts)
        .execute(&self.pool)
        .await?;
        let sql = format!(
            "UPDATE sessions SET ingest_state = 'running', claimed_by = $1, claimed_ns = $2, \
             ingest_gen = upload_gen, ingest_count = ingest_count + 1, \
             ingest_attempts = ingest_attempts + 1 \
             WHERE (project_id, id) IN (SELECT project_id, id FROM sessions \
               WHERE (ingest_state = 'pending' AND not_before_ns <= $2) \
                  OR (ingest_state = 'running' AND claimed_ns < $3) \
               ORDER BY uploaded_ns LIMIT 1{}) \
             RETURNING project_id, id, upload_gen, manifest, ingest_retries",
            self.skip_locked()
        );
        let row = sqlx::query(&sql)
            .bind(instance)
            .bind(now)
            .bind(now - lease_ns)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| Claimed {
            project: text(&r, "project_id"),
            session: text(&r, "id"),
            gen: int(&r, "upload_gen"),
            manifest: text(&r, "manifest"),
            retries: int(&r, "ingest_retries"),
        }))
    }

    /// Give back a claim whose analysis met an error the worker survived (a store that did not
    /// answer, a full disk): pending again after `not_before_ns` with `reason` kept — or, when
    /// `fail`, `failed` for good (analysis `version`). Only while the claim is still `instance`'s
    /// at generation `gen`.
    #[allow(clippy::too_many_arguments)]
    pub async fn release_claim(
        &self,
        project: &str,
        session: &str,
        instance: &str,
        gen: i64,
        reason: &str,
        not_before_ns: i64,
        fail: bool,
        version: i64,
    ) -> Result<bool, sqlx::Error> {
        let r = sqlx::query(
            "UPDATE sessions SET ingest_state = $1, claimed_by = '', ingest_error = $2, \
             not_before_ns = $3, ingest_retries = ingest_retries + 1, \
             ingest_attempts = CASE WHEN ingest_attempts > 0 THEN ingest_attempts - 1 ELSE 0 END, \
             analysis_version = CASE WHEN $1 = 'failed' THEN $4 ELSE analysis_version END \
             WHERE project_id = $5 AND id = $6 AND claimed_by = $7 AND upload_gen = $8 \
             AND ingest_state = 'running'",
        )
        .bind(if fail { "failed" } else { "pending" })
        .bind(reason)
        .bind(not_before_ns)
        .bind(version)
        .bind(project)
        .bind(session)
        .bind(instance)
        .bind(gen)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filters() -> Filters {
        Filters {
            app: None,
            host: None,
            severity: None,
            q: None,
            sort: Sort::Start,
            desc: true,
            limit: 50,
            offset: 0,
        }
    }

    #[test]
    fn the_default_list() {
        let (sql, p) = filters().list_sql();
        assert_eq!(
            sql,
            format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE project_id = $1 \
                 ORDER BY start_ns DESC, id DESC LIMIT 50 OFFSET 0"
            )
        );
        assert!(p.is_empty());
    }

    #[test]
    fn sorting_is_by_a_constant_column() {
        for s in Sort::ALL {
            let f = Filters {
                sort: s,
                desc: false,
                ..filters()
            };
            assert_eq!(
                f.order_sql(),
                format!("ORDER BY {} ASC, id ASC", s.column())
            );
        }
    }

    #[test]
    fn like_patterns_escape_their_wildcards() {
        assert_eq!(like_pattern("Train"), "%train%");
        assert_eq!(like_pattern("50%_done!"), "%50!%!_done!!%");
        assert_eq!(like_pattern("a'b\\c"), "%a'b\\c%");
    }

    #[test]
    fn filters_are_numbered_parameters_in_order() {
        let f = Filters {
            app: Some("train".into()),
            host: Some("h'1".into()),
            severity: Some(3),
            q: Some("item()".into()),
            sort: Sort::Blocked,
            desc: true,
            limit: 10,
            offset: 20,
        };
        let (sql, p) = f.list_sql();
        assert_eq!(
            sql,
            format!(
                "SELECT {SESSION_COLS} FROM sessions WHERE project_id = $1 AND app = $2 AND host = $3 \
                 AND top_severity >= $4 AND (LOWER(app) LIKE $5 ESCAPE '!' OR LOWER(host) LIKE $6 ESCAPE '!' \
                 OR LOWER(command) LIKE $7 ESCAPE '!' OR LOWER(top_insight) LIKE $8 ESCAPE '!') \
                 ORDER BY blocked_ns DESC, id DESC LIMIT 10 OFFSET 20"
            )
        );
        assert_eq!(
            p,
            vec![
                Param::Text("train".into()),
                Param::Text("h'1".into()),
                Param::Int(3),
                Param::Text("%item()%".into()),
                Param::Text("%item()%".into()),
                Param::Text("%item()%".into()),
                Param::Text("%item()%".into()),
            ]
        );
        // No text from the request in the SQL.
        assert!(!sql.contains("train") && !sql.contains("h'1") && !sql.contains("item"));
    }
}
