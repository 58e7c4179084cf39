use std::path::PathBuf;

/// Errors of the trace format crate.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("I/O error: {0}")]
    Write(#[from] std::io::Error),
    #[error("could not encode record: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("{0} is not a gpufl session directory (no trace-*.ndjson.zst file in it)")]
    NotASession(PathBuf),
    #[error("{path} is not a gpufl trace: {why}")]
    NotATrace { path: PathBuf, why: String },
}
