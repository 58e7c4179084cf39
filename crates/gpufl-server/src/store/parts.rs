//! The parts of an upload: the `parts` table (which part of which file a session holds, its size
//! and hash; the bytes are in the object store).

use super::{int, sum, text, Db};

/// One stored part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartRow {
    pub file: String,
    pub idx: i64,
    pub size: i64,
    pub sha256: String,
}

fn part_row(r: &sqlx::any::AnyRow) -> PartRow {
    PartRow {
        file: text(r, "file"),
        idx: int(r, "idx"),
        size: int(r, "size"),
        sha256: text(r, "sha256"),
    }
}

impl Db {
    /// Every part a session holds, by file and index.
    pub async fn parts(&self, project: &str, session: &str) -> Result<Vec<PartRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT file, idx, size, sha256 FROM parts WHERE project_id = $1 AND session_id = $2 ORDER BY file, idx",
        )
        .bind(project)
        .bind(session)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(part_row).collect())
    }

    /// Part `idx` of `file`, if the session holds it.
    pub async fn part(
        &self,
        project: &str,
        session: &str,
        file: &str,
        idx: i64,
    ) -> Result<Option<PartRow>, sqlx::Error> {
        let row = sqlx::query(
            "SELECT file, idx, size, sha256 FROM parts WHERE project_id = $1 AND session_id = $2 AND file = $3 AND idx = $4",
        )
        .bind(project)
        .bind(session)
        .bind(file)
        .bind(idx)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(part_row))
    }

    /// Bytes of all the parts a session holds.
    pub async fn session_part_bytes(
        &self,
        project: &str,
        session: &str,
    ) -> Result<i64, sqlx::Error> {
        let r = sqlx::query(
            "SELECT COALESCE(SUM(size), 0) AS n FROM parts WHERE project_id = $1 AND session_id = $2",
        )
        .bind(project)
        .bind(session)
        .fetch_one(&self.pool)
        .await?;
        Ok(sum(&r, "n"))
    }

    /// Record part `idx` of `file` (replacing the row of a shorter version of it).
    pub async fn record_part(
        &self,
        project: &str,
        session: &str,
        file: &str,
        idx: i64,
        size: i64,
        sha256: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO parts (project_id, session_id, file, idx, size, sha256) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (project_id, session_id, file, idx) DO UPDATE SET size = excluded.size, sha256 = excluded.sha256",
        )
        .bind(project)
        .bind(session)
        .bind(file)
        .bind(idx)
        .bind(size)
        .bind(sha256)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
