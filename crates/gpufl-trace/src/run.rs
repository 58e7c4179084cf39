//! Run directories: the sessions of one `gpufl record` (the command and every process it starts),
//! with a run record, `run.json` (docs/trace-format.md, "Run directories").
//!
//! ```text
//! <output>/run-<app>-<pid>-<YYYYmmddTHHMMSSZ>/
//!     run.json
//!     <app>-<pid>-<YYYYmmddTHHMMSSZ>/trace-0000.ndjson.zst     (one per recorded process)
//! ```

use crate::error::TraceError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Name of the run record in a run directory.
pub const RUN_FILE: &str = "run.json";
/// `format` of a run record.
pub const RUN_FORMAT: &str = "gpufl-run";
/// Version of the run record (same rules as the trace format's: fields are only added).
pub const RUN_VERSION: u32 = 1;
/// A run record larger than this is refused (it is a few hundred bytes).
pub const MAX_RUN_FILE_BYTES: u64 = 1 << 20;

/// What `gpufl record` writes about one run: when it started (written before the command starts)
/// and how it ended (updated when the command exits).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RunRecord {
    /// Always [`RUN_FORMAT`].
    pub format: String,
    /// [`RUN_VERSION`].
    pub version: u32,
    /// The run's id: also the run directory's name, and `run_id` in each session's header.
    pub run_id: String,
    pub gpufl_version: String,
    pub host: String,
    /// The recorded command (argv).
    pub command: Vec<String>,
    /// pid of `gpufl record`.
    pub pid: u32,
    /// Wall-clock start, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Wall-clock end (absent while the command runs, or when `gpufl record` was killed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_unix_ns: Option<u64>,
    /// The command's exit code (absent when it was killed by a signal, or has not ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The signal that ended the command (`SIGKILL`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// Directory name of a run: `run-<app>-<pid>-<YYYYmmddTHHMMSSZ>`.
pub fn run_dir_name(app_name: &str, pid: u32, start_unix_ns: u64) -> String {
    format!(
        "run-{}",
        crate::session::session_dir_name(app_name, pid, start_unix_ns)
    )
}

/// True if `dir` holds a run record.
pub fn is_run_dir(dir: &Path) -> bool {
    dir.join(RUN_FILE).is_file()
}

/// Read the run record of `dir`: None when there is none; an error when it cannot be read or is
/// not a run record.
pub fn read_run(dir: &Path) -> Result<Option<RunRecord>, TraceError> {
    let path = dir.join(RUN_FILE);
    let io = |source| TraceError::Io {
        path: path.clone(),
        source,
    };
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    let bad = |why: String| TraceError::NotATrace {
        path: path.clone(),
        why,
    };
    if !meta.is_file() {
        return Err(bad("not a regular file".into()));
    }
    if meta.len() > MAX_RUN_FILE_BYTES {
        return Err(bad(format!(
            "{} bytes, more than a run record's limit of {MAX_RUN_FILE_BYTES}",
            meta.len()
        )));
    }
    let text = std::fs::read(&path).map_err(io)?;
    let run: RunRecord =
        serde_json::from_slice(&text).map_err(|e| bad(format!("not a run record: {e}")))?;
    if run.format != RUN_FORMAT {
        return Err(bad(format!(
            "its format is {:?}, not {RUN_FORMAT:?}",
            run.format
        )));
    }
    Ok(Some(run))
}

/// Write `run` as `dir`'s run record, atomically (a temporary file renamed over it).
pub fn write_run(dir: &Path, run: &RunRecord) -> Result<(), TraceError> {
    let path = dir.join(RUN_FILE);
    let tmp: PathBuf = dir.join(format!(".{RUN_FILE}.{}", std::process::id()));
    let mut text = serde_json::to_vec_pretty(run)?;
    text.push(b'\n');
    std::fs::write(&tmp, &text).map_err(|source| TraceError::Io {
        path: tmp.clone(),
        source,
    })?;
    std::fs::rename(&tmp, &path).map_err(|source| TraceError::Io { path, source })
}
