//! The parts of an upload: the `parts` table (which part of which file a session holds, its size,
//! hash and object; the bytes are in the object store), the session's byte sum kept beside it
//! (`sessions.part_bytes`), the objects to remove unless a part names them (`blob_garbage`) and
//! the files whose hash a completion checked (`verified_files`).
//!
//! A part is published in one transaction that moves the session's byte sum within its cap and
//! inserts (or, for a longer version of a short last part, swaps) the part's row: concurrent
//! parts never exceed the cap, and of two different bodies for one part exactly one is published.

use super::{int, text, Db};
use crate::blobs::Blobs;

/// One stored part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartRow {
    pub file: String,
    pub idx: i64,
    pub size: i64,
    pub sha256: String,
    /// Its object in the store.
    pub blob: String,
}

fn part_row(r: &sqlx::any::AnyRow, project: &str, session: &str) -> PartRow {
    let (file, idx) = (text(r, "file"), int(r, "idx"));
    let mut blob = text(r, "blob");
    if blob.is_empty() {
        blob = Blobs::legacy_name(project, session, &file, idx);
    }
    PartRow {
        file,
        idx,
        size: int(r, "size"),
        sha256: text(r, "sha256"),
        blob,
    }
}

/// A part to publish.
#[derive(Debug, Clone, Copy)]
pub struct NewPart<'a> {
    pub project: &'a str,
    pub session: &'a str,
    pub file: &'a str,
    pub idx: i64,
    pub size: i64,
    pub sha256: &'a str,
    pub blob: &'a str,
    /// The shorter version of the part this one replaces (its row as read before), if any.
    pub replaces: Option<&'a PartRow>,
}

/// What publishing a part did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Published {
    /// The row now names this part's object.
    Stored,
    /// Another request stored the same bytes first.
    Same,
    /// The part is stored with other bytes (the row as it is).
    Conflict(PartRow),
    /// The session would hold more than its cap.
    OverCap,
}

impl Db {
    /// Every part a session holds, by file and index.
    pub async fn parts(&self, project: &str, session: &str) -> Result<Vec<PartRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT file, idx, size, sha256, blob FROM parts WHERE project_id = $1 AND session_id = $2 ORDER BY file, idx",
        )
        .bind(project)
        .bind(session)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| part_row(r, project, session)).collect())
    }

    /// The parts of one file, by index.
    pub async fn file_parts(
        &self,
        project: &str,
        session: &str,
        file: &str,
    ) -> Result<Vec<PartRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT file, idx, size, sha256, blob FROM parts WHERE project_id = $1 AND session_id = $2 AND file = $3 ORDER BY idx",
        )
        .bind(project)
        .bind(session)
        .bind(file)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| part_row(r, project, session)).collect())
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
            "SELECT file, idx, size, sha256, blob FROM parts WHERE project_id = $1 AND session_id = $2 AND file = $3 AND idx = $4",
        )
        .bind(project)
        .bind(session)
        .bind(file)
        .bind(idx)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.as_ref().map(|r| part_row(r, project, session)))
    }

    /// Bytes of all the parts a session holds (its kept sum); None for no such session.
    pub async fn session_part_bytes(
        &self,
        project: &str,
        session: &str,
    ) -> Result<Option<i64>, sqlx::Error> {
        let r = sqlx::query("SELECT part_bytes FROM sessions WHERE project_id = $1 AND id = $2")
            .bind(project)
            .bind(session)
            .fetch_optional(&self.pool)
            .await?;
        Ok(r.map(|r| int(&r, "part_bytes")))
    }

    /// Note object `name` (about to be written for part `idx` of `file`) as garbage after
    /// `after_ns` unless a part's row names it by then: a request that dies between writing the
    /// object and publishing its row leaves nothing behind for long.
    pub async fn intend_blob(&self, p: &NewPart<'_>, after_ns: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO blob_garbage (name, project_id, session_id, file, idx, after_ns) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (name) DO UPDATE SET after_ns = excluded.after_ns",
        )
        .bind(p.blob)
        .bind(p.project)
        .bind(p.session)
        .bind(p.file)
        .bind(p.idx)
        .bind(after_ns)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Publish part `p` (its object written): in one transaction, the session's byte sum moved
    /// within `max_bytes` and the row inserted — or, when `p.replaces` a shorter version, the row
    /// swapped only if it still is that version. The object of a replaced version becomes garbage
    /// after `grace_ns` (a reader may still be reading it).
    pub async fn publish_part(
        &self,
        p: &NewPart<'_>,
        max_bytes: i64,
        now: i64,
        grace_ns: i64,
    ) -> Result<Published, sqlx::Error> {
        let old_size = p.replaces.map_or(0, |o| o.size);
        let delta = p.size - old_size;
        let mut tx = self.pool.begin().await?;
        let moved = sqlx::query(
            "UPDATE sessions SET part_bytes = part_bytes + $1, updated_ns = $2 \
             WHERE project_id = $3 AND id = $4 AND part_bytes + $1 <= $5",
        )
        .bind(delta)
        .bind(now)
        .bind(p.project)
        .bind(p.session)
        .bind(max_bytes)
        .execute(&mut *tx)
        .await?;
        if moved.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(Published::OverCap);
        }
        let written = match p.replaces {
            None => sqlx::query(
                "INSERT INTO parts (project_id, session_id, file, idx, size, sha256, blob) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (project_id, session_id, file, idx) DO NOTHING",
            )
            .bind(p.project)
            .bind(p.session)
            .bind(p.file)
            .bind(p.idx)
            .bind(p.size)
            .bind(p.sha256)
            .bind(p.blob)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
            Some(old) => sqlx::query(
                "UPDATE parts SET size = $1, sha256 = $2, blob = $3 \
                 WHERE project_id = $4 AND session_id = $5 AND file = $6 AND idx = $7 \
                 AND size = $8 AND sha256 = $9",
            )
            .bind(p.size)
            .bind(p.sha256)
            .bind(p.blob)
            .bind(p.project)
            .bind(p.session)
            .bind(p.file)
            .bind(p.idx)
            .bind(old.size)
            .bind(&old.sha256)
            .execute(&mut *tx)
            .await?
            .rows_affected(),
        };
        if written == 0 {
            tx.rollback().await?;
            // Someone else published this part meanwhile: the same bytes, or others.
            return Ok(
                match self.part(p.project, p.session, p.file, p.idx).await? {
                    Some(r) if r.size == p.size && r.sha256 == p.sha256 => Published::Same,
                    Some(r) => Published::Conflict(r),
                    None => Published::Conflict(PartRow {
                        file: p.file.to_string(),
                        idx: p.idx,
                        size: 0,
                        sha256: String::new(),
                        blob: String::new(),
                    }),
                },
            );
        }
        sqlx::query("DELETE FROM blob_garbage WHERE name = $1")
            .bind(p.blob)
            .execute(&mut *tx)
            .await?;
        if let Some(old) = p.replaces.filter(|o| o.blob != p.blob) {
            sqlx::query(
                "INSERT INTO blob_garbage (name, project_id, session_id, file, idx, after_ns) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (name) DO UPDATE SET after_ns = excluded.after_ns",
            )
            .bind(&old.blob)
            .bind(p.project)
            .bind(p.session)
            .bind(p.file)
            .bind(p.idx)
            .bind(now + grace_ns)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(Published::Stored)
    }

    /// The SHA-256 completion found for the first `size` bytes of `file` (those bytes never
    /// change once stored: a part is only ever replaced by a longer version of itself).
    pub async fn verified_hash(
        &self,
        project: &str,
        session: &str,
        file: &str,
        size: i64,
    ) -> Result<Option<String>, sqlx::Error> {
        let r = sqlx::query(
            "SELECT sha256 FROM verified_files WHERE project_id = $1 AND session_id = $2 AND file = $3 AND size = $4",
        )
        .bind(project)
        .bind(session)
        .bind(file)
        .bind(size)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.map(|r| text(&r, "sha256")))
    }

    /// Keep the SHA-256 of the first `size` bytes of `file`.
    pub async fn record_verified(
        &self,
        project: &str,
        session: &str,
        file: &str,
        size: i64,
        sha256: &str,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO verified_files (project_id, session_id, file, size, sha256) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (project_id, session_id, file, size) DO NOTHING",
        )
        .bind(project)
        .bind(session)
        .bind(file)
        .bind(size)
        .bind(sha256)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

/// An object due for removal (see [`Db::intend_blob`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Garbage {
    pub name: String,
    pub project: String,
    pub session: String,
    pub file: String,
    pub idx: i64,
}

/// Housekeeping of objects and abandoned uploads.
impl Db {
    /// At most `limit` objects whose time has come.
    pub async fn due_garbage(&self, now: i64, limit: i64) -> Result<Vec<Garbage>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT name, project_id, session_id, file, idx FROM blob_garbage WHERE after_ns <= $1 \
             ORDER BY after_ns LIMIT {limit}"
        ))
        .bind(now)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| Garbage {
                name: text(r, "name"),
                project: text(r, "project_id"),
                session: text(r, "session_id"),
                file: text(r, "file"),
                idx: int(r, "idx"),
            })
            .collect())
    }

    /// Whether the part `g` was written for names object `g.name` now.
    pub async fn blob_in_use(&self, g: &Garbage) -> Result<bool, sqlx::Error> {
        let r = sqlx::query(
            "SELECT blob FROM parts WHERE project_id = $1 AND session_id = $2 AND file = $3 AND idx = $4",
        )
        .bind(&g.project)
        .bind(&g.session)
        .bind(&g.file)
        .bind(g.idx)
        .fetch_optional(&self.pool)
        .await?;
        Ok(r.is_some_and(|r| {
            let b = text(&r, "blob");
            b == g.name
                || (b.is_empty()
                    && Blobs::legacy_name(&g.project, &g.session, &g.file, g.idx) == g.name)
        }))
    }

    /// Forget a garbage row (its object removed, or found in use).
    pub async fn forget_garbage(&self, name: &str) -> Result<(), sqlx::Error> {
        sqlx::query("DELETE FROM blob_garbage WHERE name = $1")
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Uploads not completed and untouched since `before_ns`: (project, session), at most `limit`.
    pub async fn abandoned_uploads(
        &self,
        before_ns: i64,
        limit: i64,
    ) -> Result<Vec<(String, String)>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT project_id, id FROM sessions WHERE state = 'uploading' AND updated_ns < $1 \
             ORDER BY updated_ns LIMIT {limit}"
        ))
        .bind(before_ns)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(|r| (text(r, "project_id"), text(r, "id")))
            .collect())
    }

    /// Remove an abandoned upload (still `uploading` and untouched since `before_ns`): its row,
    /// its parts' rows and checked hashes, its parts' objects noted as garbage now. False when
    /// it moved meanwhile.
    pub async fn drop_upload(
        &self,
        project: &str,
        session: &str,
        before_ns: i64,
        now: i64,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query(
            "DELETE FROM sessions WHERE project_id = $1 AND id = $2 AND state = 'uploading' AND updated_ns < $3",
        )
        .bind(project)
        .bind(session)
        .bind(before_ns)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 0 {
            tx.rollback().await?;
            return Ok(false);
        }
        let parts = sqlx::query(
            "SELECT file, idx, size, sha256, blob FROM parts WHERE project_id = $1 AND session_id = $2",
        )
        .bind(project)
        .bind(session)
        .fetch_all(&mut *tx)
        .await?;
        for r in &parts {
            let p = part_row(r, project, session);
            sqlx::query(
                "INSERT INTO blob_garbage (name, project_id, session_id, file, idx, after_ns) VALUES ($1, $2, $3, $4, $5, $6) \
                 ON CONFLICT (name) DO UPDATE SET after_ns = excluded.after_ns",
            )
            .bind(&p.blob)
            .bind(project)
            .bind(session)
            .bind(&p.file)
            .bind(p.idx)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        for t in ["parts", "verified_files"] {
            sqlx::query(&format!(
                "DELETE FROM {t} WHERE project_id = $1 AND session_id = $2"
            ))
            .bind(project)
            .bind(session)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }
}
