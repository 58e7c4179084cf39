//! Session directories: one per recorded process, `<app>-<pid>-<UTC start>`, holding
//! `trace-0000.ndjson.zst` (later files, if any, are numbered on).

use crate::error::TraceError;
use std::path::{Path, PathBuf};

/// Name of the first trace file of a session.
pub const FIRST_TRACE_FILE: &str = "trace-0000.ndjson.zst";

/// Directory name of a session: `<app>-<pid>-<YYYYmmddTHHMMSSZ>`, app sanitized to `[A-Za-z0-9_.-]`.
pub fn session_dir_name(app_name: &str, pid: u32, start_unix_ns: u64) -> String {
    let app: String = app_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    let app = if app.is_empty() {
        "app".to_string()
    } else {
        app
    };
    format!("{app}-{pid}-{}", utc_compact(start_unix_ns / 1_000_000_000))
}

/// `YYYYmmddTHHMMSSZ` for a Unix time in seconds.
pub fn utc_compact(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Trace files of a session directory, in order. Errors if there are none.
pub fn trace_files(dir: &Path) -> Result<Vec<PathBuf>, TraceError> {
    let rd = std::fs::read_dir(dir).map_err(|source| TraceError::Io {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("trace-") && n.contains(".ndjson"))
        })
        .collect();
    if files.is_empty() {
        return Err(TraceError::NotASession(dir.to_path_buf()));
    }
    files.sort();
    Ok(files)
}

/// True if `dir` holds at least one trace file.
pub fn is_session_dir(dir: &Path) -> bool {
    trace_files(dir).is_ok()
}

/// Session directories directly under `root` (or `root` itself if it is one), and those of the
/// run directories directly under it (a subdirectory with a `run.json`: `gpufl record`'s output
/// directory holds one per run), sorted by path.
pub fn find_sessions(root: &Path) -> Vec<PathBuf> {
    if is_session_dir(root) {
        return vec![root.to_path_buf()];
    }
    let subdirs = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    };
    let mut out = Vec::new();
    for p in subdirs(root) {
        if is_session_dir(&p) {
            out.push(p);
        } else if crate::run::is_run_dir(&p) {
            out.extend(subdirs(&p).into_iter().filter(|s| is_session_dir(s)));
        }
    }
    out.sort();
    out
}
