//! What can go wrong uploading a session.

use std::path::PathBuf;

/// Errors of an upload. [`UploadError::Server`] carries the server's own `error` code and
/// `reason` (docs/server-api.md, "Errors"); its texts come from the server, so a terminal
/// printing them should escape control characters.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// A local file or directory could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A trace file could not be opened as one (a FIFO, a device, …).
    #[error(transparent)]
    Trace(#[from] gpufl_trace::TraceError),
    /// Not a session directory: no `trace-NNNN.ndjson.zst` file in it.
    #[error("{} is not a gpufl session directory (no trace-NNNN.ndjson.zst file in it)", .0.display())]
    NotASession(PathBuf),
    /// The directory's name (the session id) has characters the server refuses.
    #[error("{} cannot be uploaded: the server takes session names of [A-Za-z0-9._-] only", .0.display())]
    BadSessionName(PathBuf),
    /// No trace file of the session holds a closed block yet (the recorder has just started).
    #[error("{}: no closed block to send (a recorder that has just started, or not a gpufl trace)", .0.display())]
    NothingClosed(PathBuf),
    /// The server's options are unusable (an empty URL or key, a scheme other than http/https).
    #[error("{0}")]
    Options(String),
    /// The server refused the request: a 4xx answer (other than 429), or a 5xx or 429 still there
    /// after every retry.
    #[error("{what}: the server answered {status} {code}: {reason}")]
    Server {
        /// The request, e.g. `PUT trace-0000.ndjson.zst part 3`.
        what: String,
        /// HTTP status.
        status: u16,
        /// The body's `error` code (`unknown_key`, `part_conflict`, …), or `http_STATUS` when the
        /// body was not the server's JSON error.
        code: String,
        /// The body's `reason`, or what the body held when it was not JSON.
        reason: String,
    },
    /// The server could not be reached (connection refused, DNS, TLS, timeout), after every retry.
    #[error("{what}: could not reach the server after {attempts} attempt(s): {why}")]
    Transport {
        what: String,
        attempts: u32,
        why: String,
    },
    /// The server answered something that is not the protocol (not JSON, a redirect, a part size
    /// out of range).
    #[error("{what}: unexpected answer from the server: {why}")]
    Protocol { what: String, why: String },
}

impl UploadError {
    /// The server's `error` code, for an error the server answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            UploadError::Server { code, .. } => Some(code),
            _ => None,
        }
    }
}

impl UploadError {
    /// Whether the session's upload is worth starting over once: the server refused the
    /// completion because it no longer holds every part (`409 incomplete`) or another completion
    /// of the session raced it (`409 completion_raced`). A shorter file than the server holds
    /// (`409 manifest_shrinks`) or a part stored with other bytes (`409 part_conflict`) is final:
    /// the local files are not the ones uploaded before.
    pub fn worth_starting_over(&self) -> bool {
        matches!(
            self,
            UploadError::Server { status: 409, code, .. }
                if code == "incomplete" || code == "completion_raced"
        )
    }

    /// Why this error would fail every other session alike (a refused key, a server out of
    /// reach, unusable options), so that a caller uploading several stops there; None otherwise.
    pub fn stops_the_rest(&self) -> Option<&'static str> {
        match self {
            UploadError::Server {
                status: 401 | 403, ..
            } => Some("the key is refused"),
            UploadError::Transport { .. } => Some("the server is out of reach"),
            UploadError::Options(_) => Some("the options are unusable"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(status: u16, code: &str) -> UploadError {
        UploadError::Server {
            what: "POST complete".into(),
            status,
            code: code.into(),
            reason: String::new(),
        }
    }

    #[test]
    fn which_refusals_start_the_upload_over() {
        assert!(server(409, "incomplete").worth_starting_over());
        assert!(server(409, "completion_raced").worth_starting_over());
        for (s, c) in [
            (409, "manifest_shrinks"),
            (409, "part_conflict"),
            (422, "hash_mismatch"),
            (429, "rate_limited"),
            (401, "unknown_key"),
        ] {
            assert!(!server(s, c).worth_starting_over(), "{s} {c}");
        }
    }
}
