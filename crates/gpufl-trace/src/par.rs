//! Reading a trace on several cores. A compressed trace file is a sequence of independent zstd
//! frames (blocks), and no reader state crosses a block but the line count, the warnings and a line
//! that a damaged file splits across two blocks: interned ids stay the trace file's own (the
//! [`Record`]s carry them as written; resolving them is the consumer's, in record order). So the
//! blocks are located first (`ZSTD_findFrameCompressedSize` walks the block headers without
//! decoding), decoded and parsed on worker threads, and handed out strictly in file order; what
//! each block met is added up in that order.
//!
//! The records and warnings are exactly those of the sequential [`TraceReader`](crate::TraceReader)
//! over the same bytes, with any number of threads: blocks are decoded by the same code
//! ([`FrameReader`]) and lines parsed by the same parser; a block that does not end at a line end
//! has its last line joined with the next block's first (re-parsed in order); the first corrupt or
//! truncated block ends the trace as it ends the sequential reader (later blocks are decoded
//! ahead but dropped); bytes that do not delimit as a frame are decoded as one stretch, by the
//! sequential code.
//!
//! With `threads` = 1 everything runs on the caller's thread. With N > 1, N - 1 workers decode
//! ahead (at most 2N blocks beyond the one the caller reads) and the caller decodes too whenever
//! the block it needs next is not ready, so N threads are busy at most.

use crate::blocks::{FrameReader, ZSTD_MAGIC};
use crate::error::TraceError;
use crate::reader::State;
use crate::records::Record;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The environment variable that sets the number of threads readers and the analysis use.
pub const THREADS_ENV: &str = "GPUFL_THREADS";

/// The most threads a reader starts, whatever it is asked for.
pub const MAX_THREADS: usize = 256;

/// Plain NDJSON is cut into pieces of about this size (after a line end) for the workers.
const PLAIN_PIECE: usize = 1 << 20;

/// Threads to read with: `GPUFL_THREADS` when it is a positive integer, else the available cores.
pub fn default_threads() -> usize {
    threads_from(std::env::var(THREADS_ENV).ok().as_deref())
}

/// `value` as a thread count (a positive integer, at most [`MAX_THREADS`]), else the available
/// cores.
pub fn threads_from(value: Option<&str>) -> usize {
    value
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .min(MAX_THREADS)
}

/// Bytes shared with the workers.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Exactly one zstd frame.
    Frame,
    /// The rest of a compressed file from a point where no frame could be delimited: decoded as
    /// the sequential reader decodes it, block after block until the end or the first error.
    Rest,
    /// Lines of plain NDJSON.
    Plain,
}

#[derive(Clone, Copy, Debug)]
struct Unit {
    start: usize,
    end: usize,
    kind: Kind,
    /// Blocks of the file before this unit (numbers blocks in errors as the sequential reader).
    blocks_before: u64,
}

fn split(bytes: &[u8]) -> Vec<Unit> {
    let mut units = Vec::new();
    let mut at = 0;
    if bytes.starts_with(&ZSTD_MAGIC) {
        let mut n = 0u64;
        while at < bytes.len() {
            match zstd::zstd_safe::find_frame_compressed_size(&bytes[at..]) {
                Ok(len) if len > 0 && len <= bytes.len() - at => {
                    units.push(Unit {
                        start: at,
                        end: at + len,
                        kind: Kind::Frame,
                        blocks_before: n,
                    });
                    at += len;
                    n += 1;
                }
                _ => {
                    units.push(Unit {
                        start: at,
                        end: bytes.len(),
                        kind: Kind::Rest,
                        blocks_before: n,
                    });
                    break;
                }
            }
        }
    } else {
        while at < bytes.len() {
            let from = (at + PLAIN_PIECE).min(bytes.len());
            let end = memchr::memchr(b'\n', &bytes[from..]).map_or(bytes.len(), |i| from + i + 1);
            units.push(Unit {
                start: at,
                end,
                kind: Kind::Plain,
                blocks_before: 0,
            });
            at = end;
        }
    }
    units
}

/// What one unit holds, parsed.
struct Piece {
    /// The bytes before the first line end (all of them when there is none): re-parsed with the
    /// previous unit's unfinished line, if it left one.
    head: Vec<u8>,
    has_newline: bool,
    /// The first line parsed alone, and what it met.
    first: Option<Record>,
    first_st: State,
    /// The lines after the first.
    rest: Vec<Record>,
    rest_st: State,
    rest_lines: u64,
    /// The bytes after the last line end.
    tail: Vec<u8>,
    /// The decoding error that ends the trace after this unit's bytes.
    error: Option<std::io::Error>,
}

/// A worker's buffers and zstd context, reused from unit to unit.
#[derive(Default)]
struct Scratch {
    decoded: Vec<u8>,
    more: Vec<u8>,
    dctx: Option<zstd::zstd_safe::DCtx<'static>>,
}

/// A whole frame is decoded in one call (straight into `decoded`, no copy out of zstd's window)
/// into a buffer of up to this size; larger ones stream.
const ONE_SHOT_MAX: usize = 256 << 20;

/// Decode one whole zstd frame in one call; false (and `decoded` empty) if it cannot be, for any
/// reason: the streaming decoder then decodes it, with the sequential reader's errors.
fn one_shot(sc: &mut Scratch, frame: &[u8]) -> bool {
    use zstd::zstd_safe;
    // The decoded size when the frame states it; else the buffer grows until the frame fits
    // (trace blocks decode to ~15 times their size).
    let mut cap = match zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) => usize::try_from(n).unwrap_or(usize::MAX),
        _ => sc.decoded.capacity().max(frame.len().saturating_mul(16)),
    };
    let dctx = sc.dctx.get_or_insert_with(zstd_safe::DCtx::create);
    while cap <= ONE_SHOT_MAX {
        sc.decoded.clear();
        sc.decoded.reserve(cap);
        match dctx.decompress(&mut sc.decoded, frame) {
            Ok(_) => return true,
            Err(code) => {
                sc.decoded.clear();
                let _ = dctx.reset(zstd_safe::ResetDirective::SessionOnly);
                if zstd_safe::get_error_name(code) != "Destination buffer is too small" {
                    return false;
                }
                cap = cap.saturating_mul(2).max(sc.decoded.capacity() + 1);
            }
        }
    }
    false
}

fn process(sh: &Shared, i: usize, sc: &mut Scratch) -> Piece {
    let u = sh.units[i];
    let all: &[u8] = (*sh.bytes).as_ref();
    let bytes = &all[u.start..u.end];
    let mut error = None;
    let data: &[u8] = match u.kind {
        Kind::Plain => bytes,
        Kind::Frame if one_shot(sc, bytes) => &sc.decoded,
        Kind::Frame | Kind::Rest => {
            let mut fr = FrameReader::new(bytes).blocks_before(u.blocks_before);
            sc.decoded.clear();
            let mut first = true;
            loop {
                let out = if first { &mut sc.decoded } else { &mut sc.more };
                match fr.read_block_into(out) {
                    Ok(true) => {
                        if !first {
                            sc.decoded.extend_from_slice(&sc.more);
                        }
                        first = false;
                    }
                    Ok(false) => break,
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            &sc.decoded
        }
    };
    let mut p = parse(data, &sh.source);
    p.error = error;
    p
}

fn parse(data: &[u8], source: &str) -> Piece {
    let mut p = Piece {
        head: Vec::new(),
        has_newline: false,
        first: None,
        first_st: State::new(source.to_owned()),
        rest: Vec::new(),
        rest_st: State::new(source.to_owned()),
        rest_lines: 0,
        tail: Vec::new(),
        error: None,
    };
    let Some(nl) = memchr::memchr(b'\n', data) else {
        p.head = data.to_vec();
        return p;
    };
    p.has_newline = true;
    p.head = data[..nl].to_vec();
    p.first = p.first_st.parse_line(&data[..nl]);
    let body = &data[nl + 1..];
    // Trace lines are ~200 bytes (kernels, most of a trace): one allocation for most blocks.
    p.rest.reserve(body.len() / 200);
    let mut at = 0;
    for nl in memchr::memchr_iter(b'\n', body) {
        p.rest_lines += 1;
        if let Some(r) = p.rest_st.parse_line(&body[at..nl]) {
            p.rest.push(r);
        }
        at = nl + 1;
    }
    p.tail = body[at..].to_vec();
    p
}

struct Queue {
    /// The next unit no one has taken.
    next: usize,
    /// Units below this may be taken (bounds the memory of pieces decoded ahead).
    limit: usize,
    done: Vec<Option<Piece>>,
    stop: bool,
}

struct Shared {
    bytes: SharedBytes,
    units: Vec<Unit>,
    source: String,
    q: Mutex<Queue>,
    cv: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A worker that panicked left nothing half-done behind the lock: its unit is never
        // stored, and the caller decodes it itself.
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn work(sh: Arc<Shared>) {
    let mut sc = Scratch::default();
    loop {
        let i = {
            let mut q = sh.lock();
            loop {
                if q.stop || q.next >= sh.units.len() {
                    return;
                }
                if q.next < q.limit {
                    break;
                }
                q = sh.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
            q.next += 1;
            q.next - 1
        };
        let piece = process(&sh, i, &mut sc);
        let mut q = sh.lock();
        q.done[i] = Some(piece);
        sh.cv.notify_all();
    }
}

/// Iterator over the records of one trace, decoded on several threads: the same records and
/// warnings as [`TraceReader`](crate::TraceReader) (see the module's documentation).
pub struct ParTraceReader {
    sh: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    /// Units decoded ahead of the one being read, at most.
    window: usize,
    sc: Scratch,
    next_unit: usize,
    st: State,
    line_no: u64,
    /// An unfinished line at the end of the units handed out so far.
    carry: Vec<u8>,
    first: Option<Record>,
    cur: std::vec::IntoIter<Record>,
    done: bool,
}

impl ParTraceReader {
    /// Open a trace file (read into memory whole; zstd detected by its magic number, anything
    /// else read as plain NDJSON) to be decoded on `threads` threads (0 is taken as 1).
    pub fn open(path: &Path, threads: usize) -> Result<Self, TraceError> {
        let io = |source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(TraceError::NotATrace {
                path: path.to_path_buf(),
                why: "not a regular file".into(),
            });
        }
        let bytes = std::fs::read(path).map_err(io)?;
        Self::from_shared(Arc::new(bytes), path.display().to_string(), threads)
    }

    /// Read a trace held in memory (see [`ParTraceReader::from_shared`]).
    pub fn from_bytes(
        bytes: Vec<u8>,
        source: impl Into<String>,
        threads: usize,
    ) -> Result<Self, TraceError> {
        Self::from_shared(Arc::new(bytes), source, threads)
    }

    /// Read a trace held in memory, shared with the workers without a copy: the bytes of a trace
    /// file (zstd blocks, detected by the magic number) or plain NDJSON, on `threads` threads (0 is
    /// taken as 1; at most [`MAX_THREADS`]).
    pub fn from_shared(
        bytes: SharedBytes,
        source: impl Into<String>,
        threads: usize,
    ) -> Result<Self, TraceError> {
        let source = source.into();
        let b: &[u8] = (*bytes).as_ref();
        if !(b.starts_with(&ZSTD_MAGIC) || b.is_empty() || b[0] == b'{') {
            return Err(TraceError::NotATrace {
                path: source.into(),
                why: "neither zstd nor NDJSON".into(),
            });
        }
        let units = split(b);
        let threads = threads.clamp(1, MAX_THREADS);
        let window = 2 * threads;
        let n = units.len();
        let sh = Arc::new(Shared {
            bytes,
            units,
            source: source.clone(),
            q: Mutex::new(Queue {
                next: 0,
                limit: window,
                done: (0..n).map(|_| None).collect(),
                stop: false,
            }),
            cv: Condvar::new(),
        });
        let mut workers = Vec::new();
        for _ in 1..threads.min(n) {
            let sh = Arc::clone(&sh);
            // A worker that cannot be started leaves its share to the others and the caller.
            if let Ok(h) = std::thread::Builder::new()
                .name("gpufl-decode".into())
                .spawn(move || work(sh))
            {
                workers.push(h);
            }
        }
        Ok(ParTraceReader {
            sh,
            workers,
            window,
            sc: Scratch::default(),
            next_unit: 0,
            st: State::new(source),
            line_no: 0,
            carry: Vec::new(),
            first: None,
            cur: Vec::new().into_iter(),
            done: false,
        })
    }

    /// Problems met so far (truncation, corrupt lines, unknown record types). Complete once the
    /// iterator returned `None`.
    pub fn warnings(&self) -> Vec<String> {
        self.st.report()
    }

    /// Records of unknown types skipped so far, by type.
    pub fn unknown_types(&self) -> &BTreeMap<String, u64> {
        &self.st.unknown_types
    }

    /// Unit `k`'s piece: decoded by a worker, or here when it is not ready and some unit is left.
    fn take(&mut self, k: usize) -> Piece {
        let sh = Arc::clone(&self.sh);
        let mut q = sh.lock();
        loop {
            if let Some(p) = q.done[k].take() {
                q.limit = k + 1 + self.window;
                sh.cv.notify_all();
                return p;
            }
            if q.next < sh.units.len() && q.next < q.limit {
                let i = q.next;
                q.next += 1;
                drop(q);
                let p = process(&sh, i, &mut self.sc);
                q = sh.lock();
                q.done[i] = Some(p);
                sh.cv.notify_all();
                continue;
            }
            if self.workers.iter().all(|w| w.is_finished()) && q.done[k].is_none() {
                // Unit k was taken by a worker that died (a panic): decode it here.
                drop(q);
                return process(&sh, k, &mut self.sc);
            }
            q = sh
                .cv
                .wait_timeout(q, std::time::Duration::from_millis(100))
                .map(|(q, _)| q)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Hand out the next unit's records, or end the trace.
    fn advance(&mut self) {
        if self.next_unit >= self.sh.units.len() {
            if self.carry.is_empty() {
                self.st.clean_end(self.line_no);
            } else {
                self.st.truncated_line(self.line_no);
            }
            self.finish();
            return;
        }
        let p = self.take(self.next_unit);
        self.next_unit += 1;
        if p.has_newline {
            self.line_no += 1;
            if self.carry.is_empty() {
                self.st.absorb(p.first_st);
                self.first = p.first;
            } else {
                self.carry.extend_from_slice(&p.head);
                self.first = self.st.parse_line(&self.carry);
                self.carry.clear();
            }
            self.line_no += p.rest_lines;
            self.st.absorb(p.rest_st);
            self.cur = p.rest.into_iter();
            self.carry = p.tail;
        } else {
            self.carry.extend_from_slice(&p.head);
        }
        if let Some(e) = p.error {
            self.st.read_error(self.line_no, &e);
            self.finish();
        }
    }

    fn finish(&mut self) {
        self.done = true;
        let mut q = self.sh.lock();
        q.stop = true;
        for p in q.done.iter_mut() {
            *p = None;
        }
        self.sh.cv.notify_all();
    }
}

impl Iterator for ParTraceReader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some(r) = self.first.take() {
                return Some(r);
            }
            if let Some(r) = self.cur.next() {
                return Some(r);
            }
            if self.done {
                return None;
            }
            self.advance();
        }
    }
}

impl Drop for ParTraceReader {
    fn drop(&mut self) {
        self.finish();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// Reads every trace file of a session directory in order, each on several threads: the records
/// and warnings of [`SessionReader`](crate::SessionReader).
pub struct ParSessionReader {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<ParTraceReader>,
    warnings: Vec<String>,
    threads: usize,
}

impl ParSessionReader {
    /// Open a session directory (see [`crate::session`]), to be read on `threads` threads.
    pub fn open(dir: &Path, threads: usize) -> Result<Self, TraceError> {
        let files = crate::session::trace_files(dir)?;
        Ok(ParSessionReader {
            files: files.into_iter(),
            current: None,
            warnings: Vec::new(),
            threads,
        })
    }

    /// Warnings of every file read so far (complete once the iterator returned `None`).
    pub fn warnings(&self) -> Vec<String> {
        let mut w = self.warnings.clone();
        if let Some(c) = &self.current {
            w.extend(c.warnings());
        }
        w
    }
}

impl Iterator for ParSessionReader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some(cur) = self.current.as_mut() {
                if let Some(r) = cur.next() {
                    return Some(r);
                }
                let done = self
                    .current
                    .take()
                    .map(|c| c.warnings())
                    .unwrap_or_default();
                self.warnings.extend(done);
            }
            let path = self.files.next()?;
            match ParTraceReader::open(&path, self.threads) {
                Ok(r) => self.current = Some(r),
                Err(e) => self.warnings.push(e.to_string()),
            }
        }
    }
}
