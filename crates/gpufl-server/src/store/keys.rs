//! Projects and API keys: the `projects` and `api_keys` tables. Keys are found by the SHA-256 of
//! their secret (the secret itself is never stored).

use super::{int, text, Db};

/// A key of a project as listed to its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRow {
    pub id: String,
    /// `upload` or `read`.
    pub kind: String,
    pub created_ns: i64,
    /// 0 while the key is valid.
    pub revoked_ns: i64,
}

/// A key that is not revoked, found by its hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveKey {
    pub id: String,
    pub project_id: String,
    /// `upload` or `read`.
    pub kind: String,
}

impl Db {
    /// The id of the project called `name`.
    pub async fn project_id_by_name(&self, name: &str) -> Result<Option<String>, sqlx::Error> {
        let row = sqlx::query("SELECT id FROM projects WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| text(&r, "id")))
    }

    pub async fn insert_project(
        &self,
        id: &str,
        name: &str,
        created_ns: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO projects (id, name, created_ns) VALUES ($1, $2, $3)")
            .bind(id)
            .bind(name)
            .bind(created_ns)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// A new key of `project_id`, kept as the SHA-256 `hash` of its secret.
    pub async fn insert_key(
        &self,
        id: &str,
        project_id: &str,
        kind: &str,
        hash: &str,
        created_ns: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO api_keys (id, project_id, kind, hash, created_ns) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(id)
        .bind(project_id)
        .bind(kind)
        .bind(hash)
        .bind(created_ns)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Revoke key `key_id` at `now`; false when there is no such key or it is revoked already.
    pub async fn revoke_key(&self, key_id: &str, now: i64) -> Result<bool, sqlx::Error> {
        let r = sqlx::query("UPDATE api_keys SET revoked_ns = $1 WHERE id = $2 AND revoked_ns = 0")
            .bind(now)
            .bind(key_id)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected() > 0)
    }

    /// A project's keys, oldest first.
    pub async fn keys_of_project(&self, project_id: &str) -> Result<Vec<KeyRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT id, kind, created_ns, revoked_ns FROM api_keys WHERE project_id = $1 ORDER BY created_ns",
        )
        .bind(project_id)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| KeyRow {
                id: text(r, "id"),
                kind: text(r, "kind"),
                created_ns: int(r, "created_ns"),
                revoked_ns: int(r, "revoked_ns"),
            })
            .collect())
    }

    /// The key whose secret hashes to `hash`, unless revoked.
    pub async fn live_key(&self, hash: &str) -> Result<Option<LiveKey>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT id, project_id, kind FROM api_keys WHERE hash = $1 AND revoked_ns = 0",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| LiveKey {
            id: text(&r, "id"),
            project_id: text(&r, "project_id"),
            kind: text(&r, "kind"),
        }))
    }

    /// [`Db::live_key`] with its project's name.
    pub async fn live_key_with_project(
        &self,
        hash: &str,
    ) -> Result<Option<(LiveKey, String)>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT k.id, k.kind, k.project_id, p.name FROM api_keys k JOIN projects p ON p.id = k.project_id \
             WHERE k.hash = $1 AND k.revoked_ns = 0",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| {
            (
                LiveKey {
                    id: text(&r, "id"),
                    project_id: text(&r, "project_id"),
                    kind: text(&r, "kind"),
                },
                text(&r, "name"),
            )
        }))
    }
}

/// The dashboard's login sessions: the `web_sessions` table (the SHA-256 of a session's random
/// id, the read key it stands for, when it ends).
impl Db {
    pub async fn insert_web_session(
        &self,
        hash: &str,
        key_id: &str,
        created_ns: i64,
        expires_ns: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO web_sessions (hash, key_id, created_ns, expires_ns) VALUES ($1, $2, $3, $4)",
        )
        .bind(hash)
        .bind(key_id)
        .bind(created_ns)
        .bind(expires_ns)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The read key (not revoked) and project name of the login session whose id hashes to
    /// `hash`, unless it ended before `now`.
    pub async fn web_session(
        &self,
        hash: &str,
        now: i64,
    ) -> Result<Option<(LiveKey, String)>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT k.id, k.kind, k.project_id, p.name FROM web_sessions w \
             JOIN api_keys k ON k.id = w.key_id JOIN projects p ON p.id = k.project_id \
             WHERE w.hash = $1 AND w.expires_ns > $2 AND k.revoked_ns = 0 AND k.kind = 'read'",
        )
        .bind(hash)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|r| {
            (
                LiveKey {
                    id: text(&r, "id"),
                    project_id: text(&r, "project_id"),
                    kind: text(&r, "kind"),
                },
                text(&r, "name"),
            )
        }))
    }

    /// End a login session.
    pub async fn delete_web_session(&self, hash: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM web_sessions WHERE hash = $1")
            .bind(hash)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Remove the login sessions that ended before `now`.
    pub async fn purge_web_sessions(&self, now: i64) -> Result<u64, sqlx::Error> {
        let r = sqlx::query("DELETE FROM web_sessions WHERE expires_ns <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }
}
