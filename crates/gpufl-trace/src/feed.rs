//! The node-local metrics feed: the status datagram a recorder sends to `gpufl exporter` about
//! once a second (docs/architecture.md, "Production metrics").
//!
//! One datagram is one JSON object ([`Status`]) of at most [`MAX_DATAGRAM`] bytes on a Unix
//! datagram socket. Every figure is cumulative since the recorder started (counters), so a lost
//! datagram loses nothing but freshness. Strings are bounded ([`MAX_LABEL`]) and the lists are
//! short ([`TOP_LINES`], [`MAX_GPUS`]) so the exporter's label cardinality stays bounded whatever
//! a sender puts in them; the exporter checks the bounds again ([`Status::clamp`]).

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The datagram's format version (`v`).
pub const FEED_VERSION: u32 = 1;
/// Largest datagram a recorder sends and the exporter reads.
pub const MAX_DATAGRAM: usize = 8192;
/// Sync lines per process in a datagram: the top ones by time blocked.
pub const TOP_LINES: usize = 3;
/// CUDA calls per process in a datagram (`hostcalls`): the ones that held the host longest.
pub const MAX_CALLS: usize = 8;
/// GPUs per process in a datagram.
pub const MAX_GPUS: usize = 16;
/// Longest string field, in bytes (cut at a character boundary).
pub const MAX_LABEL: usize = 120;
/// Overrides where recorders send and where the exporter listens.
pub const ENV_SOCKET: &str = "GPUFL_EXPORTER_SOCKET";
/// `0` stops a recorder from sending.
pub const ENV_FEED: &str = "GPUFL_EXPORTER_FEED";
/// The node-wide socket of an exporter run as a system service (root creates `/run/gpufl`).
pub const SYSTEM_SOCKET: &str = "/run/gpufl/exporter.sock";

/// Why a datagram was refused.
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    #[error("datagram of {0} bytes is larger than {MAX_DATAGRAM}")]
    TooLarge(usize),
    #[error("not a status datagram: {0}")]
    Json(#[from] serde_json::Error),
    #[error("feed version {0} is not understood (this exporter reads {FEED_VERSION})")]
    Version(u32),
}

/// What one recorder says about its process.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Status {
    /// [`FEED_VERSION`].
    pub v: u32,
    /// The process id as the process sees it (the exporter prefers the kernel's credentials).
    pub pid: u32,
    /// The session's app name (the program's name unless set).
    pub app: String,
    /// A job id from the environment (`GPUFL_JOB`, `SLURM_JOB_ID`, …), empty if none.
    #[serde(default)]
    pub job: String,
    /// The session directory's name.
    #[serde(default)]
    pub session: String,
    /// `recording`, `paused`, `scopes-only` (no GPU capture), `ended`.
    pub status: String,
    /// Datagram number, from 0.
    pub seq: u64,
    /// Seconds since the recorder started.
    pub uptime_s: f64,
    /// Host time blocked in synchronizations, seconds, all GPUs.
    pub sync_s: f64,
    /// Synchronizations recorded.
    pub syncs: u64,
    /// Scope and range records written.
    #[serde(default)]
    pub scopes: u64,
    /// Per GPU (CUDA ordinal).
    #[serde(default)]
    pub gpus: Vec<GpuStatus>,
    /// The lines that blocked longest in syncs, longest first.
    #[serde(default)]
    pub top: Vec<LineStatus>,
    /// Host time inside CUDA calls that held their thread (`hostcall` records: `cudaFree`,
    /// `cudaMalloc`, module loads …) by call, the longest [`MAX_CALLS`] first (absent from
    /// recorders before host calls were recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hostcalls: Vec<CallStatus>,
}

/// One CUDA function's `hostcall` records in a process.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CallStatus {
    /// The function, e.g. `cudaFree`.
    pub call: String,
    /// Host time inside it, seconds.
    pub blocked_s: f64,
    pub calls: u64,
}

/// One GPU of a process.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct GpuStatus {
    pub dev: u32,
    /// The GPU's UUID (`GPU-…`), as NVML and dcgm-exporter name it; empty if unknown.
    #[serde(default)]
    pub uuid: String,
    /// Time the GPU ran this process's kernels, copies or memsets (overlaps counted once),
    /// seconds.
    pub busy_s: f64,
    pub kernels: u64,
    /// Copies and memsets.
    #[serde(default)]
    pub copies: u64,
    /// Host time blocked in synchronizations on this GPU's contexts, seconds.
    #[serde(default)]
    pub sync_s: f64,
    #[serde(default)]
    pub syncs: u64,
    /// GPU-visible memory this process holds on this GPU: its allocations not yet freed (`mem`
    /// records: what CUDA sees, e.g. PyTorch's cached segments), bytes; absent from recorders
    /// before memory was recorded, or with `mem` records off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bytes: Option<u64>,
    /// The highest `mem_bytes` since the recorder started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_peak_bytes: Option<u64>,
}

/// One source line that synchronized.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct LineStatus {
    /// `file.py:42` (the file's last component), `<driver-internal>` or `<no stack>`.
    pub line: String,
    pub sync_s: f64,
    pub syncs: u64,
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn bounded(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Status {
    /// Enforce the bounds on lists and strings (what a sender should already have done).
    pub fn clamp(&mut self) {
        fn cut(s: &mut String) {
            let n = bounded(s, MAX_LABEL).len();
            s.truncate(n);
        }
        cut(&mut self.app);
        cut(&mut self.job);
        cut(&mut self.session);
        cut(&mut self.status);
        self.gpus.truncate(MAX_GPUS);
        for g in &mut self.gpus {
            cut(&mut g.uuid);
        }
        self.top.truncate(TOP_LINES);
        for l in &mut self.top {
            cut(&mut l.line);
        }
        self.hostcalls.truncate(MAX_CALLS);
        for c in &mut self.hostcalls {
            cut(&mut c.call);
        }
    }

    /// The datagram's bytes (bounded: see [`Status::clamp`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut s = self.clone();
        s.clamp();
        serde_json::to_vec(&s).unwrap_or_default()
    }

    /// Read a datagram; its bounds are enforced.
    pub fn decode(bytes: &[u8]) -> Result<Status, FeedError> {
        if bytes.len() > MAX_DATAGRAM {
            return Err(FeedError::TooLarge(bytes.len()));
        }
        let mut s: Status = serde_json::from_slice(bytes)?;
        if s.v != FEED_VERSION {
            return Err(FeedError::Version(s.v));
        }
        s.clamp();
        Ok(s)
    }
}

/// The per-user socket: `/tmp/gpufl-<uid>/exporter.sock` (the exporter makes the directory,
/// mode 0700). Not `$XDG_RUNTIME_DIR`: batch jobs often run without it, and the two sides must
/// agree without sharing an environment.
pub fn user_socket(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/gpufl-{uid}/exporter.sock"))
}

/// Where a recorder of user `uid` sends: `$GPUFL_EXPORTER_SOCKET` alone if set, else its user's
/// socket and the node-wide [`SYSTEM_SOCKET`].
pub fn send_targets(uid: u32, env: Option<&str>) -> Vec<PathBuf> {
    match env.filter(|v| !v.is_empty()) {
        Some(p) => vec![PathBuf::from(p)],
        None => vec![user_socket(uid), PathBuf::from(SYSTEM_SOCKET)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        let s = Status {
            v: FEED_VERSION,
            pid: 7,
            app: "a".repeat(500),
            status: "recording".into(),
            top: (0..10)
                .map(|i| LineStatus {
                    line: format!("t.py:{i}"),
                    sync_s: 1.0,
                    syncs: 1,
                })
                .collect(),
            gpus: vec![GpuStatus {
                dev: 1,
                busy_s: 0.5,
                kernels: 3,
                ..GpuStatus::default()
            }],
            hostcalls: (0..20)
                .map(|i| CallStatus {
                    call: format!("cudaFree{}", "x".repeat(i * 10)),
                    blocked_s: 1.0,
                    calls: 3,
                })
                .collect(),
            ..Status::default()
        };
        let bytes = s.encode();
        assert!(bytes.len() < MAX_DATAGRAM);
        let back = Status::decode(&bytes).unwrap();
        assert_eq!(back.app.len(), MAX_LABEL);
        assert_eq!(back.top.len(), TOP_LINES);
        assert_eq!(back.gpus, s.gpus);
        assert_eq!(back.hostcalls.len(), MAX_CALLS);
        assert_eq!(back.hostcalls[0].call, "cudaFree");
        // A datagram of a recorder before host calls: none.
        let old =
            br#"{"v":1,"pid":1,"app":"","status":"","seq":0,"uptime_s":0,"sync_s":0,"syncs":0}"#;
        assert!(Status::decode(old).unwrap().hostcalls.is_empty());
        assert!(matches!(
            Status::decode(br#"{"v":99,"pid":1,"app":"","status":"","seq":0,"uptime_s":0,"sync_s":0,"syncs":0}"#),
            Err(FeedError::Version(99))
        ));
        assert!(Status::decode(b"not json").is_err());
        assert!(matches!(
            Status::decode(&vec![b' '; MAX_DATAGRAM + 1]),
            Err(FeedError::TooLarge(_))
        ));
    }

    #[test]
    fn bounded_cuts_at_char_boundaries() {
        assert_eq!(bounded("héllo", 2), "h");
        assert_eq!(bounded("abc", 10), "abc");
    }

    #[test]
    fn targets() {
        assert_eq!(
            send_targets(5, None),
            vec![
                PathBuf::from("/tmp/gpufl-5/exporter.sock"),
                PathBuf::from(SYSTEM_SOCKET)
            ]
        );
        assert_eq!(send_targets(5, Some("/x")), vec![PathBuf::from("/x")]);
    }
}
