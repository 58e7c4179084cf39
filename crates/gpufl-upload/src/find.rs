//! Finding the session directories under the paths a user names.

use crate::error::UploadError;
use crate::parts::is_trace_name;
use std::path::{Path, PathBuf};

/// How deep below a named directory sessions are searched for (`gpufl record`'s output directory
/// holds `run-…/SESSION`: 2 levels).
pub const SEARCH_DEPTH: usize = 8;

/// Whether `dir` is a session directory: it holds a `trace-NNNN.ndjson.zst` that is not a
/// directory.
pub fn is_session_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|rd| {
        rd.filter_map(|e| e.ok()).any(|e| {
            e.file_name().to_str().is_some_and(is_trace_name)
                && e.file_type().is_ok_and(|t| !t.is_dir())
        })
    })
}

/// The session directories under `paths`: a path that is a session directory is one; otherwise
/// its subdirectories are searched **recursively**, down to [`SEARCH_DEPTH`] levels, and a session
/// directory found is not searched further. Symbolic links to directories are followed only where
/// named in `paths`, not met in the search (no loops). Each path's sessions are sorted by path;
/// a directory reached twice (overlapping paths) is listed once. A path that cannot be read is an
/// error; one that holds no session gives none.
pub fn find_sessions(paths: &[PathBuf]) -> Result<Vec<PathBuf>, UploadError> {
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|source| UploadError::Io {
            path: p.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(UploadError::NotASession(p.clone()));
        }
        let mut found = Vec::new();
        search(p, 0, &mut found)?;
        found.sort();
        for s in found {
            let key = std::fs::canonicalize(&s).unwrap_or_else(|_| s.clone());
            if seen.insert(key) {
                out.push(s);
            }
        }
    }
    Ok(out)
}

fn search(dir: &Path, depth: usize, found: &mut Vec<PathBuf>) -> Result<(), UploadError> {
    if is_session_dir(dir) {
        found.push(dir.to_path_buf());
        return Ok(());
    }
    if depth >= SEARCH_DEPTH {
        return Ok(());
    }
    let io = |source| UploadError::Io {
        path: dir.to_path_buf(),
        source,
    };
    for e in std::fs::read_dir(dir).map_err(io)? {
        let e = e.map_err(io)?;
        // `file_type` does not follow links: a link to a directory is not searched.
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            search(&e.path(), depth + 1, found)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_found_at_any_depth_once() {
        let root = std::env::temp_dir().join(format!("gpufl-upload-find-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mk = |rel: &str| {
            let d = root.join(rel);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("trace-0000.ndjson.zst"), b"x").unwrap();
            d
        };
        let a = mk("a-1-20260101T000000Z");
        let b = mk("run-x-1-20260101T000000Z/b-2-20260101T000000Z");
        let c = mk("deep/er/still/c-3-20260101T000000Z");
        // Inside a session: not searched.
        mk("a-1-20260101T000000Z/inner-9-20260101T000000Z");
        // Not sessions: other names, a directory named like a trace file.
        std::fs::create_dir_all(root.join("empty")).unwrap();
        std::fs::write(root.join("empty/trace-0000.ndjson"), b"x").unwrap();
        std::fs::create_dir_all(root.join("d/trace-0000.ndjson.zst")).unwrap();
        // A link loop is not followed.
        std::os::unix::fs::symlink(&root, root.join("deep/loop")).unwrap();

        let found = find_sessions(std::slice::from_ref(&root)).unwrap();
        assert_eq!(found, [a.clone(), c.clone(), b.clone()]);
        // A session named directly, overlapping paths listed once.
        let found = find_sessions(&[b.clone(), root.clone(), a.clone()]).unwrap();
        assert_eq!(found, [b.clone(), a.clone(), c.clone()]);
        assert!(is_session_dir(&a));
        assert!(!is_session_dir(&root.join("d")));
        // Nothing there; a path that does not exist; a file.
        assert!(find_sessions(&[root.join("empty")]).unwrap().is_empty());
        assert!(matches!(
            find_sessions(&[root.join("nope")]),
            Err(UploadError::Io { .. })
        ));
        assert!(matches!(
            find_sessions(&[a.join("trace-0000.ndjson.zst")]),
            Err(UploadError::NotASession(_))
        ));
        let _ = std::fs::remove_dir_all(&root);
    }
}
