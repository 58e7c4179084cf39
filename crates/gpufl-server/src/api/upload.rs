//! `/api/v1/uploads/…`: resumable, idempotent, hash-checked uploads (docs/server-api.md).

use crate::auth::{Caller, UploadCaller};
use crate::blobs::Blobs;
use crate::error::ApiError;
use crate::store::{now_ns, NewPart, Published};
use crate::AppState;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use bytes::Bytes;
use gpufl_protocol::{
    Completion, Manifest, PartInfo, PartStored, StatusFile, UploadStatus, PART_SIZE,
};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A completion's manifest, at most.
const MAX_MANIFEST: usize = 1 << 20;
/// Files in one session, at most.
const MAX_FILES: usize = 4096;

/// A session id: `[A-Za-z0-9._-]`, 1-200 characters, not `.` or `..`.
pub fn check_session_id(s: &str) -> Result<(), ApiError> {
    let ok = !s.is_empty()
        && s.len() <= 200
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad(
            "bad_session_id",
            "a session id is 1-200 characters of [A-Za-z0-9._-], not . or ..",
        ))
    }
}

/// A trace file's name: `trace-NNNN.ndjson.zst` (4 to 6 digits).
pub fn check_file_name(s: &str) -> Result<(), ApiError> {
    let digits = s
        .strip_prefix("trace-")
        .and_then(|r| r.strip_suffix(".ndjson.zst"));
    match digits {
        Some(d) if (4..=6).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ => Err(ApiError::bad(
            "bad_file_name",
            "a session's files are named trace-NNNN.ndjson.zst",
        )),
    }
}

fn check_hash(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `GET /api/v1/uploads/{session}`: what the server holds of a session.
pub async fn status(
    State(st): State<Arc<AppState>>,
    Path(session): Path<String>,
    UploadCaller(c): UploadCaller,
) -> Result<Json<UploadStatus>, ApiError> {
    check_session_id(&session)?;
    let state = st
        .db
        .upload_state(&c.project_id, &session)
        .await?
        .unwrap_or_else(|| "absent".into());
    let mut files: BTreeMap<String, Vec<PartInfo>> = BTreeMap::new();
    for p in st.db.parts(&c.project_id, &session).await? {
        files.entry(p.file).or_default().push(PartInfo {
            index: p.idx as u64,
            size: p.size as u64,
            sha256: p.sha256,
        });
    }
    Ok(Json(UploadStatus {
        session,
        part_size: PART_SIZE,
        state,
        files: files
            .into_iter()
            .map(|(name, parts)| StatusFile { name, parts })
            .collect(),
    }))
}

/// Bytes of a refused request's body read (and dropped) before answering, so that a client that
/// reads the answer only after sending its body gets the 4xx instead of a broken connection.
const DRAIN_MAX: u64 = 2 * PART_SIZE;

/// Read and drop what is left of a body, up to [`DRAIN_MAX`] bytes.
async fn drain(body: Option<Body>) {
    use futures_util::StreamExt;
    let Some(body) = body else { return };
    let mut s = body.into_data_stream();
    let mut n = 0u64;
    while let Some(Ok(chunk)) = s.next().await {
        n += chunk.len() as u64;
        if n > DRAIN_MAX {
            break;
        }
    }
}

/// `PUT /api/v1/uploads/{session}/files/{name}/parts/{index}`. A refused part's body is read
/// (up to [`DRAIN_MAX`]) before the answer.
pub async fn put_part(
    State(st): State<Arc<AppState>>,
    Path((session, file, index)): Path<(String, String, String)>,
    caller: Result<UploadCaller, ApiError>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<PartStored>, ApiError> {
    let mut body = Some(body);
    let r = match caller {
        Ok(UploadCaller(c)) => {
            put_part_inner(&st, &c, session, file, index, &headers, &mut body).await
        }
        Err(e) => Err(e),
    };
    if r.is_err() {
        drain(body).await;
    }
    r
}

async fn put_part_inner(
    st: &AppState,
    c: &Caller,
    session: String,
    file: String,
    index: String,
    headers: &HeaderMap,
    body: &mut Option<Body>,
) -> Result<Json<PartStored>, ApiError> {
    check_session_id(&session)?;
    check_file_name(&file)?;
    let max_parts = st.limits.max_session_bytes.div_ceil(PART_SIZE) as i64;
    let idx: i64 = match index.parse::<i64>() {
        Ok(i) if (0..max_parts).contains(&i) => i,
        _ => {
            return Err(ApiError::bad(
                "bad_part_index",
                format!("a part index is 0..{max_parts}"),
            ))
        }
    };
    let (bytes, got) = read_part(headers, body).await?;
    let size = bytes.len() as i64;
    let (project, db) = (c.project_id.as_str(), &st.db);
    // The session's row, created by its first part.
    let total = match db.session_part_bytes(project, &session).await? {
        Some(n) => n,
        None => {
            db.open_upload(project, &session, now_ns()).await?;
            0
        }
    };
    let conflict = || {
        ApiError::new(
            StatusCode::CONFLICT,
            "part_conflict",
            format!("part {idx} of {file} is stored with other bytes"),
        )
    };
    let old = db.part(project, &session, &file, idx).await?;
    if let Some(old) = &old {
        if old.size == size && old.sha256 == got {
            return Ok(Json(PartStored { stored: false }));
        }
        // Only a longer version of a short (last) part replaces it: the same file, grown.
        if old.size >= size {
            return Err(conflict());
        }
        let prev = st.blobs.get(&old.blob).await?;
        if !bytes.starts_with(&prev) {
            return Err(conflict());
        }
    }
    let max = st.limits.max_session_bytes.min(i64::MAX as u64) as i64;
    let over = || too_large(format!("a session is at most {max} bytes"));
    // Checked again when the part is published; this spares writing an object to refuse it.
    if total - old.as_ref().map_or(0, |o| o.size) + size > max {
        return Err(over());
    }
    let token = crate::auth::random_hex(6);
    let blob = Blobs::part_name(project, &session, &file, idx, &got, &token);
    let part = NewPart {
        project,
        session: &session,
        file: &file,
        idx,
        size,
        sha256: &got,
        blob: &blob,
        replaces: old.as_ref(),
    };
    let grace = i64::try_from(st.housekeeping.garbage_grace_ms.saturating_mul(1_000_000))
        .unwrap_or(i64::MAX);
    db.intend_blob(&part, now_ns().saturating_add(grace))
        .await?;
    st.blobs.put(&blob, bytes).await?;
    match db.publish_part(&part, max, now_ns(), grace).await? {
        Published::Stored => Ok(Json(PartStored { stored: true })),
        Published::Same => Ok(Json(PartStored { stored: false })),
        Published::Conflict(_) => Err(conflict()),
        Published::OverCap => Err(over()),
    }
}

/// A part's body as its headers announce it (`Content-Length` at most [`PART_SIZE`], the SHA-256
/// in `X-Gpufl-Sha256`), read and checked against the hash: (bytes, hash).
async fn read_part(
    headers: &HeaderMap,
    body: &mut Option<Body>,
) -> Result<(Bytes, String), ApiError> {
    let Some(len) = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    else {
        return Err(ApiError::new(
            StatusCode::LENGTH_REQUIRED,
            "length_required",
            "a part is sent with its Content-Length",
        ));
    };
    if len > PART_SIZE {
        if len > DRAIN_MAX {
            // Not worth reading to answer: the connection closes under it.
            body.take();
        }
        return Err(too_large(format!(
            "a part is at most {PART_SIZE} bytes; this one has {len}"
        )));
    }
    let Some(want) = headers
        .get("x-gpufl-sha256")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|h| check_hash(h))
    else {
        return Err(ApiError::bad(
            "missing_hash",
            "a part is sent with its SHA-256 in X-Gpufl-Sha256 (64 hex digits)",
        ));
    };
    let body = body.take().unwrap_or_default();
    let bytes: Bytes = axum::body::to_bytes(body, PART_SIZE as usize)
        .await
        .map_err(|_| {
            too_large(format!(
                "a part is at most {PART_SIZE} bytes, or the body was cut off"
            ))
        })?;
    let got = hex::encode(Sha256::digest(&bytes));
    if got != want {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "hash_mismatch",
            format!("the part's SHA-256 is {got}, not {want}: resend it"),
        ));
    }
    Ok((bytes, got))
}

fn too_large(reason: String) -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", reason)
}

fn malformed(reason: impl Into<String>) -> ApiError {
    ApiError::bad("malformed_manifest", reason)
}

fn parse_manifest(body: &[u8], max_session: u64) -> Result<Manifest, ApiError> {
    let mut m: Manifest = serde_json::from_slice(body).map_err(|e| {
        malformed(format!(
            "expected {{\"files\": [{{\"name\", \"size\", \"sha256\", \"parts\"}}]}}: {e}"
        ))
    })?;
    if m.files.is_empty() || m.files.len() > MAX_FILES {
        return Err(malformed(format!("a session has 1 to {MAX_FILES} files")));
    }
    m.files.sort_by(|a, b| a.name.cmp(&b.name));
    let mut total = 0u64;
    for (i, f) in m.files.iter_mut().enumerate() {
        check_file_name(&f.name)?;
        f.sha256 = f.sha256.to_ascii_lowercase();
        if !check_hash(&f.sha256) {
            return Err(malformed(format!("{}: sha256 is 64 hex digits", f.name)));
        }
        if f.parts != f.size.div_ceil(PART_SIZE) {
            return Err(malformed(format!(
                "{}: {} bytes make {} parts of {PART_SIZE}, not {}",
                f.name,
                f.size,
                f.size.div_ceil(PART_SIZE),
                f.parts
            )));
        }
        total = total.saturating_add(f.size);
        let _ = i;
    }
    if m.files.windows(2).any(|w| w[0].name == w[1].name) {
        return Err(malformed("a file is named twice"));
    }
    if total > max_session {
        return Err(too_large(format!(
            "a session is at most {max_session} bytes"
        )));
    }
    Ok(m)
}

/// `POST /api/v1/uploads/{session}/complete`.
pub async fn complete(
    State(st): State<Arc<AppState>>,
    Path(session): Path<String>,
    caller: Result<UploadCaller, ApiError>,
    body: Body,
) -> Result<Json<Completion>, ApiError> {
    let c = match caller {
        Ok(UploadCaller(c)) => c,
        Err(e) => {
            drain(Some(body)).await;
            return Err(e);
        }
    };
    check_session_id(&session)?;
    let body = axum::body::to_bytes(body, MAX_MANIFEST)
        .await
        .map_err(|_| too_large(format!("a manifest is at most {MAX_MANIFEST} bytes")))?;
    let m = parse_manifest(&body, st.limits.max_session_bytes)?;
    let (project, session) = (c.project_id.as_str(), session.as_str());
    // Idempotent: only a manifest that adds to what is stored moves the session, and only the
    // completion that saw the stored manifest last (a race is taken again from the start).
    for _ in 0..4 {
        let (state, stored) = st
            .db
            .upload_manifest(project, session)
            .await?
            .ok_or_else(ApiError::not_found)?;
        let was_complete = state == "complete";
        let prev: Option<Manifest> = if was_complete {
            serde_json::from_str(&stored).ok()
        } else {
            None
        };
        let merged = merge_manifest(prev.as_ref(), &m, st.limits.max_session_bytes)?;
        let manifest = serde_json::to_string(&merged).map_err(ApiError::internal)?;
        let stored_word = if was_complete && manifest == stored {
            "unchanged"
        } else {
            check_parts_held(st.as_ref(), project, session, &merged).await?;
            check_hashes(st.as_ref(), project, session, &merged).await?;
            if prev.as_ref().and_then(|p| p.files.first()) != merged.files.first() {
                check_opens_with_header(st.as_ref(), project, session, &merged).await?;
            }
            let bytes: u64 = merged.files.iter().map(|f| f.size).sum();
            let moved = st
                .db
                .complete_upload(project, session, &stored, &manifest, bytes as i64, now_ns())
                .await?;
            if !moved {
                continue;
            }
            st.ingest_wake.notify_waiters();
            if was_complete {
                "extended"
            } else {
                "new"
            }
        };
        let ingest = st.db.ingest_state(project, session).await?;
        return Ok(Json(Completion {
            ingest,
            session: session.to_string(),
            state: "complete".into(),
            stored: stored_word.into(),
        }));
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "completion_raced",
        "other completions of this session kept changing it meanwhile: retry",
    ))
}

/// The manifest a completion stores: for a session completed before, the stored manifest with
/// this one's files added or grown — files it leaves out are kept (a rolling session deletes its
/// oldest files), a file shorter than stored is refused (409 `manifest_shrinks`: a completed
/// session only grows).
fn merge_manifest(prev: Option<&Manifest>, m: &Manifest, max: u64) -> Result<Manifest, ApiError> {
    let Some(prev) = prev else {
        return Ok(m.clone());
    };
    let mut files: BTreeMap<&str, &gpufl_protocol::FileManifest> =
        prev.files.iter().map(|f| (f.name.as_str(), f)).collect();
    for f in &m.files {
        if let Some(old) = files.get(f.name.as_str()) {
            if f.size < old.size {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "manifest_shrinks",
                    format!(
                        "{}: the session holds {} bytes of it, this manifest {}: a completed session only grows",
                        f.name, old.size, f.size
                    ),
                ));
            }
        }
        files.insert(&f.name, f);
    }
    if files.len() > MAX_FILES {
        return Err(malformed(format!("a session has 1 to {MAX_FILES} files")));
    }
    let merged = Manifest {
        files: files.into_values().cloned().collect(),
    };
    let total: u64 = merged.files.iter().map(|f| f.size).sum();
    if total > max {
        return Err(too_large(format!("a session is at most {max} bytes")));
    }
    Ok(merged)
}

/// Every part of the manifest held, at least as long as the manifest says (409 `incomplete`).
async fn check_parts_held(
    st: &AppState,
    project: &str,
    session: &str,
    m: &Manifest,
) -> Result<(), ApiError> {
    let held: BTreeMap<(String, i64), i64> = st
        .db
        .parts(project, session)
        .await?
        .into_iter()
        .map(|p| ((p.file, p.idx), p.size))
        .collect();
    let mut missing = Vec::new();
    for f in &m.files {
        for i in 0..f.parts {
            let want = f.part_len(i) as i64;
            // A stored part longer than the manifest says is a later, grown version of it: the
            // manifest's prefix of it is what this completion covers.
            match held.get(&(f.name.clone(), i as i64)) {
                Some(&s) if s >= want => {}
                _ => missing.push(format!("{}#{i}", f.name)),
            }
        }
    }
    if !missing.is_empty() {
        let n = missing.len();
        missing.truncate(20);
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "incomplete",
            format!(
                "{n} part(s) missing or shorter than the manifest says: {}",
                missing.join(", ")
            ),
        ));
    }
    Ok(())
}

/// Each file's bytes against its hash (422 `hash_mismatch`). A file's first `size` bytes never
/// change once stored, so their hash, once found, is kept: a completion reads and hashes only the
/// files (and lengths) no completion checked before, a few at a time server-wide.
async fn check_hashes(
    st: &AppState,
    project: &str,
    session: &str,
    m: &Manifest,
) -> Result<(), ApiError> {
    for f in &m.files {
        let size = f.size as i64;
        let got = match st.db.verified_hash(project, session, &f.name, size).await? {
            Some(h) => h,
            None => {
                let _permit = st.hashing.acquire().await.map_err(ApiError::internal)?;
                let parts = st.db.file_parts(project, session, &f.name).await?;
                let mut h = Sha256::new();
                for i in 0..f.parts {
                    let Some(p) = parts.iter().find(|p| p.idx == i as i64) else {
                        return Err(ApiError::new(
                            StatusCode::CONFLICT,
                            "incomplete",
                            format!("{}#{i} is missing", f.name),
                        ));
                    };
                    let b = st.blobs.get(&p.blob).await?;
                    let want = f.part_len(i) as usize;
                    h.update(&b[..want.min(b.len())]);
                }
                let got = hex::encode(h.finalize());
                st.db
                    .record_verified(project, session, &f.name, size, &got)
                    .await?;
                got
            }
        };
        if got != f.sha256 {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "hash_mismatch",
                format!(
                    "{}: the stored bytes hash to {got}, the manifest says {}",
                    f.name, f.sha256
                ),
            ));
        }
    }
    Ok(())
}

/// The first file opens with a gpufl header (422 `not_a_gpufl_session`).
async fn check_opens_with_header(
    st: &AppState,
    project: &str,
    session: &str,
    m: &Manifest,
) -> Result<(), ApiError> {
    let first = &m.files[0];
    if first.parts == 0 {
        return Err(not_gpufl("its first file is empty"));
    }
    let Some(p0) = st.db.part(project, session, &first.name, 0).await? else {
        return Err(not_gpufl("its first file has no part 0"));
    };
    let b = st.blobs.get(&p0.blob).await?;
    let b = b.slice(..(first.part_len(0) as usize).min(b.len()));
    match gpufl_trace::TraceReader::from_bytes(b.to_vec(), first.name.clone()) {
        Ok(mut r) => match r.next() {
            Some(gpufl_trace::Record::Header(_)) => {}
            _ => {
                return Err(not_gpufl(
                    "its first file does not open with a gpufl header",
                ))
            }
        },
        Err(e) => return Err(not_gpufl(&e.to_string())),
    }
    Ok(())
}

fn not_gpufl(why: &str) -> ApiError {
    ApiError::new(
        StatusCode::UNPROCESSABLE_ENTITY,
        "not_a_gpufl_session",
        format!("not a gpufl session: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(check_session_id("app-12-20261122T083249Z").is_ok());
        for bad in ["", ".", "..", "a/b", "a b", "<x>", &"a".repeat(201)] {
            assert!(check_session_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_file_name("trace-0000.ndjson.zst").is_ok());
        assert!(check_file_name("trace-123456.ndjson.zst").is_ok());
        for bad in [
            "trace-00.ndjson.zst",
            "../trace-0000.ndjson.zst",
            "trace-000a.ndjson.zst",
            "x",
        ] {
            assert!(check_file_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn manifests() {
        let h = "a".repeat(64);
        let ok = format!(
            r#"{{"files":[{{"name":"trace-0000.ndjson.zst","size":{},"sha256":"{h}","parts":2}}]}}"#,
            PART_SIZE + 1
        );
        let m = parse_manifest(ok.as_bytes(), u64::MAX).unwrap();
        assert_eq!(m.files[0].part_len(1), 1);
        let wrong_parts = ok.replace("\"parts\":2", "\"parts\":1");
        assert_eq!(
            parse_manifest(wrong_parts.as_bytes(), u64::MAX)
                .unwrap_err()
                .code,
            "malformed_manifest"
        );
        assert_eq!(
            parse_manifest(b"{}", u64::MAX).unwrap_err().code,
            "malformed_manifest"
        );
        assert_eq!(
            parse_manifest(ok.as_bytes(), 10).unwrap_err().code,
            "too_large"
        );
    }
}
