//! Rolling trace files: the disk bound of a session (`GPUFL_MAX_DISK_MB`, on by default in
//! always-on mode). When the current file passes an eighth of the bound (at least
//! [`MIN_FILE_BYTES`]) the writer goes on in the next `trace-NNNN.ndjson.zst`, and the oldest files
//! are deleted while the closed files add up to more than the bound less one file's limit (room
//! for the new file to grow); after every block the oldest closed files are also deleted while all
//! of them, the growing one included, add up to more than the bound. So the session exceeds the
//! bound by at most one block, for the moment between the block's write and the deletion. Each file is
//! self-contained (its own header and interning), so the files that remain read as a session: the
//! most recent part of the run.

use crate::sink::Sink;
use gpufl_trace::{Header, TraceError};
use std::path::{Path, PathBuf};

/// Smallest file size that triggers a rotation.
pub const MIN_FILE_BYTES: u64 = 1 << 20;

/// The rolling state of one session.
pub struct Rolling {
    dir: PathBuf,
    index: u32,
    max_bytes: u64,
    /// Files deleted so far.
    pub deleted: u64,
}

/// `trace-0007.ndjson.zst`.
pub fn file_name(index: u32) -> String {
    format!("trace-{index:04}.ndjson.zst")
}

impl Rolling {
    /// For a session in `dir` whose first file is `trace-0000…`; None without a bound.
    pub fn new(dir: &Path, max_bytes: u64) -> Option<Rolling> {
        (max_bytes > 0).then(|| Rolling {
            dir: dir.to_path_buf(),
            index: 0,
            max_bytes,
            deleted: 0,
        })
    }

    fn file_limit(&self) -> u64 {
        (self.max_bytes / 8).max(MIN_FILE_BYTES)
    }

    /// After a block was closed: rotate if the current file is full, then delete the oldest
    /// files beyond the bound.
    pub fn after_block(&mut self, sink: &mut Sink, header: &Header) -> Result<(), TraceError> {
        let current = self.dir.join(file_name(self.index));
        let size = std::fs::metadata(&current).map(|m| m.len()).unwrap_or(0);
        if size < self.file_limit() {
            // The current file grows: older files make room for it as it does, so the session
            // stays within the bound after every block, not only at rotations.
            if self.index > 0 {
                self.deleted += enforce_bound(&self.dir, self.max_bytes, &file_name(self.index));
            }
            return Ok(());
        }
        self.index += 1;
        sink.rotate(&self.dir.join(file_name(self.index)), header)?;
        // Room for the new file to reach its limit: the closed files keep to the rest.
        let room = self.max_bytes.saturating_sub(self.file_limit());
        self.deleted += enforce_bound(&self.dir, room, &file_name(self.index));
        Ok(())
    }
}

/// Delete the oldest trace files of `dir` (never `keep`) while all of them add up to more than
/// `max_bytes`. Returns how many were deleted.
pub fn enforce_bound(dir: &Path, max_bytes: u64, keep: &str) -> u64 {
    let Ok(files) = gpufl_trace::session::trace_files(dir) else {
        return 0;
    };
    let mut sized: Vec<(PathBuf, u64)> = files
        .into_iter()
        .map(|p| {
            let n = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
            (p, n)
        })
        .collect();
    let mut total: u64 = sized.iter().map(|(_, n)| n).sum();
    let mut deleted = 0;
    sized.reverse(); // newest first; pop the oldest
    while total > max_bytes {
        let Some((p, n)) = sized.pop() else { break };
        if p.file_name().is_some_and(|f| f == keep) {
            break;
        }
        if std::fs::remove_file(&p).is_ok() {
            total -= n;
            deleted += 1;
        }
    }
    deleted
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufl_trace::{Notice, Record, SessionReader, TraceWriter};
    use std::io::BufWriter;

    fn header() -> Header {
        Header {
            format: gpufl_trace::FORMAT_NAME.into(),
            version: gpufl_trace::FORMAT_VERSION,
            session_id: "roll".into(),
            ..Header::default()
        }
    }

    /// Incompressible text, so the files grow with what is written.
    fn noise(i: u64, n: usize) -> String {
        let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect()
    }

    #[test]
    fn files_roll_within_the_bound_and_the_newest_remain_readable() {
        let dir = std::env::temp_dir().join(format!("gpufl-rolling-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let h = header();
        let f = std::fs::File::create(dir.join(file_name(0))).unwrap();
        let mut sink = Sink::new(TraceWriter::new(BufWriter::new(f), &h).unwrap(), None);
        let max = 4 * MIN_FILE_BYTES; // files of 1 MiB (the minimum), at most 4 MiB in all
        let mut roll = Rolling::new(&dir, max).unwrap();
        let mut peak = 0u64;
        // ~20 MiB of notices, a block every ~64 KiB.
        for i in 0..20 * 16 {
            for j in 0..16 {
                sink.write(&Record::Notice(Notice {
                    level: "info".into(),
                    message: format!("{} {}", i * 16 + j, noise(i * 16 + j, 4000)),
                }))
                .unwrap();
            }
            sink.end_block().unwrap();
            roll.after_block(&mut sink, &h).unwrap();
            let total: u64 = gpufl_trace::session::trace_files(&dir)
                .unwrap()
                .iter()
                .map(|p| std::fs::metadata(p).unwrap().len())
                .sum();
            peak = peak.max(total);
        }
        assert!(roll.deleted > 5, "deleted {}", roll.deleted);
        // After every block the session is within the bound.
        assert!(peak <= max, "peak {peak} over the bound {max}");
        let files = gpufl_trace::session::trace_files(&dir).unwrap();
        assert!(files[0].file_name().unwrap() != "trace-0000.ndjson.zst");
        // What remains decodes, and holds the newest records.
        let mut r = SessionReader::open(&dir).unwrap();
        let mut last = None;
        for rec in r.by_ref() {
            if let Record::Notice(n) = rec {
                last = n
                    .message
                    .split(' ')
                    .next()
                    .map(|s| s.parse::<u64>().unwrap());
            }
        }
        assert_eq!(last, Some(20 * 16 * 16 - 1));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
