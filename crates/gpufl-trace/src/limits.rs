//! Limits of the reader on untrusted input: what one trace may cost to read, whatever its bytes.
//! Documented in docs/trace-format.md ("Limits").
//!
//! This is also where the crate reads its environment: the `GPUFL_MAX_*` limits below and
//! [`THREADS_ENV`] (the readers' threads, [`crate::par::default_threads`]). The exporter feed's
//! variables ([`crate::feed::ENV_SOCKET`], [`crate::feed::ENV_FEED`]) are only named in this crate;
//! the recorder and the exporter read them.

/// Limits on what reading a trace may decompress and hold. The defaults are far above what the
/// recorder writes (a block every 500 ms; records of a few hundred bytes) and can be raised with
/// environment variables (see [`ReadLimits::from_env`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadLimits {
    /// Decompressed bytes of one zstd frame (block). A frame that declares more in its header is
    /// refused unread; one that decodes to more is cut there. Reading stops at it (as at a corrupt
    /// block), with a warning.
    pub max_block_bytes: u64,
    /// Decompressed bytes of every zstd frame of a session together (all its trace files).
    /// Reading stops there, with a warning.
    pub max_session_bytes: u64,
    /// Bytes of one line (one record). A longer line is skipped (never held whole), with a warning.
    pub max_line_bytes: usize,
    /// Decompressed bytes of one file per byte of the file (with [`RATIO_FLOOR`] allowed whatever
    /// the file's size): the recorder's files decompress about 10–20×, a decompression bomb
    /// thousands of times. Reading stops there, with a warning. This keeps the cost of reading a
    /// file proportional to its size.
    pub max_ratio: u64,
}

/// Decompressed bytes any file may produce, whatever its size and [`ReadLimits::max_ratio`]: 64 MiB.
pub const RATIO_FLOOR: u64 = 64 << 20;

/// Default of [`ReadLimits::max_block_bytes`]: 256 MiB.
pub const DEFAULT_MAX_BLOCK_BYTES: u64 = 256 << 20;
/// Default of [`ReadLimits::max_session_bytes`]: 32 GiB.
pub const DEFAULT_MAX_SESSION_BYTES: u64 = 32 << 30;
/// Default of [`ReadLimits::max_line_bytes`]: 16 MiB.
pub const DEFAULT_MAX_LINE_BYTES: usize = 16 << 20;
/// Default of [`ReadLimits::max_ratio`]: 1000.
pub const DEFAULT_MAX_RATIO: u64 = 1000;

/// Environment variable overriding [`ReadLimits::max_block_bytes`], in MiB.
pub const ENV_MAX_BLOCK_MB: &str = "GPUFL_MAX_BLOCK_MB";
/// Environment variable overriding [`ReadLimits::max_session_bytes`], in MiB.
pub const ENV_MAX_SESSION_MB: &str = "GPUFL_MAX_SESSION_MB";
/// Environment variable overriding [`ReadLimits::max_line_bytes`], in MiB.
pub const ENV_MAX_LINE_MB: &str = "GPUFL_MAX_LINE_MB";
/// Environment variable overriding [`ReadLimits::max_ratio`].
pub const ENV_MAX_RATIO: &str = "GPUFL_MAX_RATIO";

/// The environment variable that sets the number of threads readers and the analysis use
/// ([`crate::par::default_threads`]).
pub const THREADS_ENV: &str = "GPUFL_THREADS";

/// The value of [`THREADS_ENV`], if set.
pub(crate) fn threads_var() -> Option<String> {
    std::env::var(THREADS_ENV).ok()
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            max_block_bytes: DEFAULT_MAX_BLOCK_BYTES,
            max_session_bytes: DEFAULT_MAX_SESSION_BYTES,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            max_ratio: DEFAULT_MAX_RATIO,
        }
    }
}

impl ReadLimits {
    /// The defaults, with `GPUFL_MAX_BLOCK_MB`, `GPUFL_MAX_SESSION_MB` and `GPUFL_MAX_LINE_MB`
    /// (whole MiB, at least 1) and `GPUFL_MAX_RATIO` (at least 1) taken where set; values that are
    /// not such numbers are ignored.
    pub fn from_env() -> Self {
        let mib = |name: &str| -> Option<u64> {
            let v: u64 = std::env::var(name).ok()?.trim().parse().ok()?;
            (v >= 1).then(|| v.saturating_mul(1 << 20))
        };
        let d = ReadLimits::default();
        ReadLimits {
            max_block_bytes: mib(ENV_MAX_BLOCK_MB).unwrap_or(d.max_block_bytes),
            max_session_bytes: mib(ENV_MAX_SESSION_MB).unwrap_or(d.max_session_bytes),
            max_line_bytes: mib(ENV_MAX_LINE_MB)
                .map(|b| usize::try_from(b).unwrap_or(usize::MAX))
                .unwrap_or(d.max_line_bytes),
            max_ratio: std::env::var(ENV_MAX_RATIO)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|&v| v >= 1)
                .unwrap_or(d.max_ratio),
        }
    }

    /// What a file of `file_bytes` may decompress to when `session_left` bytes of the session's
    /// budget are left: the bytes, and whether the file's own limit (the ratio) is the smaller.
    pub(crate) fn file_budget(&self, file_bytes: u64, session_left: u64) -> (u64, bool) {
        let own = file_bytes.saturating_mul(self.max_ratio).max(RATIO_FLOOR);
        if own < session_left {
            (own, true)
        } else {
            (session_left, false)
        }
    }
}

/// `n` bytes in MiB for messages.
pub(crate) fn mib(n: u64) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}
