//! Errors of an export.

use std::path::PathBuf;

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A session could not be opened (not a session, unreadable).
    #[error(transparent)]
    Trace(#[from] gpufl_trace::TraceError),
    /// Writing the output failed.
    #[error("writing the export failed: {0}")]
    Write(#[from] std::io::Error),
    /// A path given is neither a session directory nor a directory holding sessions.
    #[error("{0} is not a gpufl session directory (and contains none)")]
    NoSession(PathBuf),
    /// No path was given.
    #[error("no session to export")]
    Empty,
}
