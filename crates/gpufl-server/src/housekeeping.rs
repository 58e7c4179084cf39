//! Housekeeping, one task per instance, every [`Housekeeping::every_ms`]: temporary ingest
//! directories of dead processes removed ([`crate::ingest::clean_tmp`]); uploads never completed
//! and untouched for [`Housekeeping::upload_expiry_ms`] removed (their row, parts and objects);
//! objects no part names (a request that died between writing its part and publishing it, the
//! loser of two requests racing for one part, a part replaced by a longer version) removed once
//! their grace ([`Housekeeping::garbage_grace_ms`]) is over; ended login sessions forgotten.

use crate::store::now_ns;
use crate::AppState;
use std::sync::Arc;
use std::time::Duration;

/// When housekeeping runs and what it removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Housekeeping {
    /// How often, ms.
    pub every_ms: u64,
    /// An upload not completed and untouched this long is removed, ms.
    pub upload_expiry_ms: u64,
    /// An object written for a part is kept this long before it counts as garbage unless a part
    /// names it, ms: longer than any request takes.
    pub garbage_grace_ms: u64,
}

impl Default for Housekeeping {
    fn default() -> Self {
        Housekeeping {
            every_ms: 10 * 60 * 1000,
            upload_expiry_ms: 7 * 24 * 3600 * 1000,
            garbage_grace_ms: 3600 * 1000,
        }
    }
}

fn ms_ns(ms: u64) -> i64 {
    i64::try_from(ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX)
}

/// What one pass removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub tmp_dirs: usize,
    pub uploads: usize,
    pub objects: usize,
}

/// One pass.
pub async fn sweep(st: &AppState) -> Result<Swept, crate::ServerError> {
    let mut out = Swept {
        tmp_dirs: crate::ingest::clean_tmp(&st.tmp_dir),
        ..Swept::default()
    };
    let now = now_ns();
    st.db.purge_web_sessions(now).await?;
    let before = now.saturating_sub(ms_ns(st.housekeeping.upload_expiry_ms));
    loop {
        let old = st.db.abandoned_uploads(before, 100).await?;
        if old.is_empty() {
            break;
        }
        for (p, s) in &old {
            if st.db.drop_upload(p, s, before, now).await? {
                out.uploads += 1;
            }
        }
        if old.len() < 100 {
            break;
        }
    }
    loop {
        let due = st.db.due_garbage(now_ns(), 500).await?;
        for g in &due {
            if !st.db.blob_in_use(g).await? {
                st.blobs.delete(&g.name).await?;
                out.objects += 1;
            }
            st.db.forget_garbage(&g.name).await?;
        }
        if due.len() < 500 {
            break;
        }
    }
    Ok(out)
}

/// The housekeeping task: a pass now, then every [`Housekeeping::every_ms`].
pub async fn task(st: Arc<AppState>) {
    loop {
        match sweep(&st).await {
            Ok(s) if s != Swept::default() => eprintln!(
                "gpufl serve: housekeeping: removed {} abandoned upload(s), {} unused object(s), {} temporary director(y/ies)",
                s.uploads, s.objects, s.tmp_dirs
            ),
            Ok(_) => {}
            Err(e) => eprintln!("gpufl serve: housekeeping: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(st.housekeeping.every_ms.max(10))).await;
    }
}
