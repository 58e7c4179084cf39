//! `gpufl export`: recorded sessions as a timeline that Perfetto (protobuf) or any Chrome trace
//! viewer (JSON trace events) opens — a track per host thread and per GPU stream, flow arrows
//! from each launch to its GPU work, the CUDA calls that held a thread (`hostcall`) as slices on
//! it and its host samples on a `host samples` track beside it (what the host did during a GPU
//! gap), scopes and NVTX ranges as slices, telemetry as counter
//! tracks and the insights of gpufl-analysis as annotated instants; several sessions go in one
//! file, one process track group each.
//!
//! Streamed: each session is read twice (the first pass finds the flows' ends, the time range and
//! the insights; the second writes), and the output goes out through a buffered writer as it is
//! produced, so memory does not grow with the session (the insights' analysis, which holds the
//! session, runs only up to a record budget). See docs/export.md.

mod chrome;
mod error;
pub mod links;
mod perfetto;
mod scan;
mod sink;
mod walk;

pub use error::ExportError;
pub use walk::{flow_id, WalkStats, MAX_DEPTH, MAX_STREAMS, MAX_THREADS};

use gpufl_analysis::Config;
use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Perfetto's protobuf trace (`Trace` of `TracePacket`s with `TrackEvent`s).
    Perfetto,
    /// Chrome's JSON trace event format (`{"traceEvents": [...]}`).
    Chrome,
}

/// Default record budget of the insights' analysis (~60 bytes a record at its peak: ~180 MB).
pub const DEFAULT_INSIGHTS_MAX_RECORDS: u64 = 3_000_000;

/// How to export.
#[derive(Clone, Debug)]
pub struct Options {
    pub format: Format,
    /// Sessions with more records get no insights (0: never compute them).
    pub insights_max_records: u64,
    /// Decoding threads.
    pub threads: usize,
    /// The analysis' configuration (which frames are the user's).
    pub config: Config,
    /// Write every frame of a stack: by default its leading frames of the recorder, CUPTI, the
    /// driver and the CUDA runtime's internals are left out
    /// (`gpufl_analysis::frames::first_shown_frame`).
    pub all_frames: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            format: Format::Perfetto,
            insights_max_records: DEFAULT_INSIGHTS_MAX_RECORDS,
            threads: 1,
            config: Config::default(),
            all_frames: false,
        }
    }
}

/// One session's part of an export.
#[derive(Clone, Debug)]
pub struct SessionSummary {
    pub dir: PathBuf,
    /// The pid the export gives the session's process track group.
    pub pid: u32,
    pub records: u64,
    pub insights: usize,
    pub stats: WalkStats,
    /// Things to tell the user: reader warnings, insights left out, flows past the cap, scopes.
    pub notes: Vec<String>,
}

/// What an export wrote.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub sessions: Vec<SessionSummary>,
}

/// The session directories named by `paths`: each a session, or a directory holding sessions
/// (a run).
pub fn find_sessions(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ExportError> {
    if paths.is_empty() {
        return Err(ExportError::Empty);
    }
    let mut out = Vec::new();
    for p in paths {
        let found = gpufl_trace::session::find_sessions(p);
        if found.is_empty() {
            return Err(ExportError::NoSession(p.clone()));
        }
        out.extend(found);
    }
    Ok(out)
}

/// "rank R/N · " for a session of a multi-rank job (the launcher's variables in its header), so
/// the ranks of a run exported to one file are told apart; empty otherwise.
fn rank_label(h: &gpufl_trace::Header) -> String {
    match (h.rank, h.world_size) {
        (Some(r), Some(n)) => format!("rank {r}/{n} · "),
        (Some(r), None) => format!("rank {r} · "),
        _ => String::new(),
    }
}

/// The first header of a session (for the Chrome format's time base).
fn first_start(dir: &Path) -> Option<u64> {
    let mut r = gpufl_trace::SessionReader::open(dir).ok()?;
    match r.next()? {
        gpufl_trace::Record::Header(h) => Some(h.start_unix_ns),
        _ => None,
    }
}

/// Export the sessions `dirs` (see [`find_sessions`]) to `out`.
pub fn export<W: Write>(dirs: &[PathBuf], out: W, opts: &Options) -> Result<Summary, ExportError> {
    if dirs.is_empty() {
        return Err(ExportError::Empty);
    }
    let mut sink: Box<dyn sink::Sink + '_> = match opts.format {
        Format::Perfetto => Box::new(perfetto::Writer::new(out)),
        Format::Chrome => {
            // Times are written relative to the earliest session start (in µs with ns decimals,
            // exact where a double holds them); the base goes into the file's metadata.
            let base = dirs
                .iter()
                .filter_map(|d| first_start(d))
                .min()
                .unwrap_or(0);
            Box::new(chrome::Writer::new(out, base)?)
        }
    };
    let mut summary = Summary::default();
    let mut pids = HashSet::new();
    for (i, dir) in dirs.iter().enumerate() {
        let sess = i as u32;
        let mut scan = scan::scan(dir, &opts.config, opts.insights_max_records, opts.threads)?;
        let (pid, name, gpus) = match &scan.header {
            Some(h) => (
                h.pid,
                format!(
                    "{}{} (pid {}, {}) {}",
                    rank_label(h),
                    h.app_name,
                    h.pid,
                    h.host,
                    h.session_id
                ),
                h.gpus.iter().map(|g| (g.index, g.name.clone())).collect(),
            ),
            None => (0, dir.display().to_string(), Vec::new()),
        };
        let pid = if pid != 0 && pids.insert(pid) {
            pid
        } else {
            0x4000_0000 + sess
        };
        pids.insert(pid);
        sink.session(sess, sink::SessionMeta { pid, name, gpus })?;
        let stats = walk::walk(dir, &mut scan, sess, sink.as_mut(), opts)?;
        let mut notes = scan.warnings.clone();
        notes.extend(scan.insights_note.clone());
        if scan.links.over_cap > 0 {
            notes.push(format!(
                "{} record(s) have correlation ids beyond the flow table's {} chunks of 65,536 ids: no flow arrow for them",
                scan.links.over_cap,
                links::MAX_CHUNKS
            ));
        }
        if stats.unclosed_scopes > 0 {
            notes.push(format!(
                "{} scope(s) never closed: shown ending at the session's last record",
                stats.unclosed_scopes
            ));
        }
        if stats.lost_scopes > 0 {
            notes.push(format!(
                "{} scope event(s) not shown (a close without an open scope, deeper than {} levels, or past {} threads)",
                stats.lost_scopes, MAX_DEPTH, MAX_THREADS
            ));
        }
        summary.sessions.push(SessionSummary {
            dir: dir.clone(),
            pid,
            records: scan.records,
            insights: scan.insights.len(),
            stats,
            notes,
        });
    }
    sink.finish()?;
    Ok(summary)
}
