//! Reading a trace on several cores. A compressed trace file is a sequence of independent zstd
//! frames (blocks) that end on line ends, and nothing of the reader's state crosses a block but
//! what is cheap to carry in order: the line count, the structure checks of [`State`] (header,
//! `end` record and its counts), the limits' byte counts and the blocks seen ([`Tally`]). So the
//! caller's thread delimits the blocks (`ZSTD_findFrameCompressedSize` walks the block headers
//! without decoding) and hands them to worker threads, which decode each through a ring buffer of
//! its window's size ([`Ring`]: what `decode_whole` decodes, checksum checked, never more than
//! ~0.8 MiB held for the recorder's blocks) and classify its lines ([`classify`]) as they are
//! decoded; the caller takes the blocks back in file order and runs them through the same
//! [`Tally`] and [`State`] as the sequential [`TraceReader`].
//!
//! **Same records, warnings and errors as [`TraceReader`].** Whatever the parallel path does not
//! take exactly as the sequential reader would — a block that is not an ordinary frame lying whole
//! in the file, one that does not decode (damage, a truncated last block), one of
//! [`crate::blocks::HOLD_BYTES`] or more, one past a limit (per block, per file, per session), a
//! block that does not end at a line end, bytes after the last frame — hands the file to the
//! sequential reader: it reads the file again from its start (with the session's blocks seen as
//! they were when the file was opened), the records already handed out are passed over, and its
//! records and warnings are the reader's from there on. Damaged or unusual files cost at most
//! twice the decoding; the recorder's files never take that way. Plain NDJSON is read by the
//! sequential reader.
//!
//! With N threads, N − 1 workers decode ahead (at most 2N blocks beyond the one being handed out,
//! and never more than [`MAX_AHEAD`]) and the caller decodes too whenever the block it needs next
//! is not ready, so at most N threads are busy; with N = 1 the caller decodes every block itself,
//! one at a time, as it needs it (blocks decoded whole, and folded, are faster to load than records
//! one by one). Decoding contexts and their rings come from a pool: no more of them than blocks
//! decoded at once, so what a reader holds is bounded whatever its number of threads.

use crate::blocks::{
    block_hash, frame_len, BlockSet, FrameInput, Repeat, Tally, Window, WHOLE_MAX_COMPRESSED,
    ZSTD_MAGIC,
};
use crate::error::TraceError;
use crate::fastpath::Parser;
use crate::limits::ReadLimits;
use crate::reader::{classify, open_regular, Line, State, TraceReader};
use crate::records::{Counts, Record};
use crate::ring::Ring;
use std::any::Any;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

/// Work a reader's decoding workers do on a block's records, in place of handing them out one by
/// one (set with [`Items::set_fold`], read with [`Items::next_item`]): a consumer that builds
/// something from the records (the analysis's model) builds a part of it per block on the
/// workers and joins the parts in file order.
///
/// Runs of a block's records are folded: records one after the other, every one a valid record
/// that [`BlockFold::takes`] (never a header or an end record: those check the file's structure),
/// at least 64 of them (a shorter run comes record by record: a part costs more than that), in a
/// block read in parallel (on one thread too: the caller decodes it); every other line comes one
/// by one, as without a fold, in its place between the runs. The reader takes a run's records
/// into its checks (counts, records after the end record) as it would take them one by one, so
/// warnings and errors are the same, and a consumer that joins the folded runs in order, each as
/// its records one by one, builds what it would build from the records.
pub trait BlockFold: Send + Sync {
    /// Whether a record may be folded.
    fn takes(&self, rec: &Record) -> bool;
    /// Start folding a run of at most about `bytes` decoded bytes (a hint): its records are
    /// pushed as they are parsed, in file order (a run of a block that turns out not to be
    /// read in parallel after all is dropped half-folded).
    fn start(&self, bytes: usize) -> Box<dyn BlockFolding>;
}

/// One run of records being folded (see [`BlockFold::start`]).
pub trait BlockFolding {
    /// Fold the run's next record (one that [`BlockFold::takes`]).
    fn push(&mut self, rec: Record);
    /// The run's fold, once its every record was pushed.
    fn finish(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// What a reader with a [`BlockFold`] hands out: a record, or a run of records folded.
pub enum Item {
    Record(Record),
    Folded(Box<dyn Any + Send>),
}

/// Readers that can fold blocks on their workers ([`ParTraceReader`], [`ParSessionReader`]).
pub trait Items {
    /// Fold the blocks read from now on with `fold` (where the reader decodes on workers).
    fn set_fold(&mut self, fold: Arc<dyn BlockFold>);
    /// The next record or folded run of records, in file order.
    fn next_item(&mut self) -> Option<Item>;
}

/// A folded run: the fold's part, its records and their counts.
type Part = (Box<dyn Any + Send>, u64, Counts);

pub use crate::limits::THREADS_ENV;

/// The most threads a reader starts, whatever it is asked for.
pub const MAX_THREADS: usize = 256;

/// The most blocks a reader delimits beyond the one it is handing out, whatever its number of
/// threads (2 per thread below that): what it holds at once (compressed bytes, a block being
/// decoded in a ring of its window's size, or decoded and folded) stays bounded, and 16 threads
/// keep their 2 blocks each.
pub const MAX_AHEAD: u64 = 32;

/// Threads to read with: `GPUFL_THREADS` when it is a positive integer, else the available cores.
pub fn default_threads() -> usize {
    threads_from(crate::limits::threads_var().as_deref())
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

/// Bytes of a trace held in memory, shared with the workers without a copy.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// [`SharedBytes`] as a byte slice (for a `Cursor`).
#[derive(Clone)]
struct Held(SharedBytes);

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref()
    }
}

/// The compressed bytes of one block.
enum Frame {
    /// Of a trace in memory.
    Range(Held, usize, usize),
    /// Copied out of a file.
    Owned(Vec<u8>),
}

impl Frame {
    fn bytes(&self) -> &[u8] {
        match self {
            Frame::Range(h, a, b) => &h.as_ref()[*a..*b],
            Frame::Owned(v) => v,
        }
    }
}

/// One block, decoded and its lines classified by a worker.
struct Block {
    /// Decoded whole (else the sequential reader is to read the file).
    whole: bool,
    frame_len: usize,
    hash: u64,
    /// Decoded bytes.
    size: usize,
    unrepeatable: Repeat,
    /// Empty, or ends with a line end.
    ends_line: bool,
    /// Line ends in the block.
    lines: u64,
    /// Its lines but the blank ones, in order, runs of them folded.
    segs: Vec<Seg>,
}

/// A line of a block, or a run of its records folded.
enum Seg {
    Line(Line),
    Run(Part),
}

impl Block {
    fn not_whole() -> Block {
        Block {
            whole: false,
            frame_len: 0,
            hash: 0,
            size: 0,
            unrepeatable: Repeat::Free,
            ends_line: false,
            lines: 0,
            segs: Vec::new(),
        }
    }
}

/// A zstd context and its ring ([`Ring`]), taken from the reader's pool for a block at a time:
/// there are never more than blocks being decoded at once, whatever the number of threads.
type Scratch = Ring;

/// Records of a run held before a fold is started for it: shorter runs (between records the fold
/// does not take) come one by one, without the cost of a part.
const RUN_MIN: usize = 64;

/// The segments of a block being read: lines, and runs of records folded.
struct Runs<'a> {
    fold: Option<&'a dyn BlockFold>,
    /// Bytes the block may decode to (a hint for a fold's columns).
    bound: usize,
    held: Vec<Record>,
    folding: Option<(Box<dyn BlockFolding>, u64, Counts)>,
    segs: Vec<Seg>,
}

impl Runs<'_> {
    /// The next line of the block, `at` bytes into it.
    #[inline]
    fn line(&mut self, l: Line, at: usize) {
        match l {
            Line::Blank => {}
            Line::Rec(r) if self.folds(&r) => self.push(r, at),
            l => {
                self.end_run();
                self.segs.push(Seg::Line(l));
            }
        }
    }

    #[inline]
    fn folds(&self, r: &Record) -> bool {
        self.fold
            .is_some_and(|f| !matches!(r, Record::Header(_) | Record::End(_)) && f.takes(r))
    }

    #[inline]
    fn push(&mut self, r: Record, at: usize) {
        if let Some((f, n, counts)) = self.folding.as_mut() {
            counts.add(&r);
            *n += 1;
            f.push(r);
            return;
        }
        self.held.push(r);
        if self.held.len() >= RUN_MIN {
            if let Some(fold) = self.fold {
                let mut f = fold.start(self.bound.saturating_sub(at));
                let mut counts = Counts::default();
                let n = self.held.len() as u64;
                for r in self.held.drain(..) {
                    counts.add(&r);
                    f.push(r);
                }
                self.folding = Some((f, n, counts));
            }
        }
    }

    /// The run read so far, folded (or its records one by one when it is short).
    fn end_run(&mut self) {
        if let Some((f, n, counts)) = self.folding.take() {
            self.segs.push(Seg::Run((f.finish(), n, counts)));
        }
        for r in self.held.drain(..) {
            self.segs.push(Seg::Line(Line::Rec(r)));
        }
    }
}

fn process(
    frame: &Frame,
    limits: &ReadLimits,
    fold: Option<&dyn BlockFold>,
    sc: &mut Scratch,
) -> Block {
    let bytes = frame.bytes();
    let limit = usize::try_from(limits.max_block_bytes).unwrap_or(usize::MAX);
    let max_line = limits.max_line_bytes.max(1);
    let bound = zstd::zstd_safe::decompress_bound(bytes)
        .ok()
        .and_then(|b| usize::try_from(b).ok())
        .unwrap_or(0)
        .min(limit);
    let mut runs = Runs {
        fold,
        bound,
        held: Vec::new(),
        folding: None,
        // Trace lines are ~150-250 bytes: one allocation for most blocks read line by line.
        segs: Vec::with_capacity(if fold.is_some() { 4 } else { bound / 160 + 1 }),
    };
    // The kernel-line cache of this block's lines (a few dozen tails in a training loop's).
    let mut parser = Parser::new();
    let Some(d) = sc.lines(bytes, limit, |line, at| {
        runs.line(classify(line, max_line, &mut parser), at)
    }) else {
        return Block::not_whole();
    };
    runs.end_run();
    Block {
        whole: true,
        frame_len: bytes.len(),
        hash: block_hash(bytes),
        size: d.size,
        unrepeatable: d.repeat,
        ends_line: d.ends_line,
        lines: d.lines,
        segs: runs.segs,
    }
}

/// [`process`] with a context from the pool (returned to it after), a panic taken as a block not
/// decoded whole (the sequential reader then meets it on the caller's thread, as it would have
/// without workers).
fn process_caught(sh: &Shared, frame: &Frame) -> Block {
    let Some(mut sc) = sh.scratch() else {
        return Block::not_whole();
    };
    let fold = sh.fold.get().map(|f| &**f);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        process(frame, &sh.limits, fold, &mut sc)
    })) {
        Ok(b) => {
            sh.lock_pool().push(sc);
            b
        }
        // The context is dropped, not reused.
        Err(_) => Block::not_whole(),
    }
}

struct Queue {
    /// Blocks to decode, by their number in the file.
    jobs: VecDeque<(u64, Arc<Frame>)>,
    done: BTreeMap<u64, Block>,
    stop: bool,
}

struct Shared {
    limits: ReadLimits,
    fold: OnceLock<Arc<dyn BlockFold>>,
    q: Mutex<Queue>,
    cv: Condvar,
    /// Contexts not in use.
    pool: Mutex<Vec<Scratch>>,
    /// Contexts made so far.
    made: std::sync::atomic::AtomicUsize,
}

impl Shared {
    fn lock_pool(&self) -> MutexGuard<'_, Vec<Scratch>> {
        self.pool.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A context from the pool, or a new one.
    fn scratch(&self) -> Option<Scratch> {
        if let Some(sc) = self.lock_pool().pop() {
            return Some(sc);
        }
        self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ring::new()
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing is left half-done behind the lock (processing happens outside it).
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn work(sh: Arc<Shared>) {
    loop {
        let (k, frame) = {
            let mut q = sh.lock();
            loop {
                if q.stop {
                    return;
                }
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                q = sh.cv.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let b = process_caught(&sh, &frame);
        drop(frame);
        let mut q = sh.lock();
        q.done.insert(k, b);
        sh.cv.notify_all();
    }
}

/// Where the compressed bytes come from.
enum Src {
    Memory {
        bytes: Held,
        at: usize,
    },
    File {
        win: Window<std::fs::File>,
        size: u64,
    },
}

/// What follows the blocks delimited so far.
enum Next {
    Frame(Frame),
    /// A clean end of the file.
    End,
    /// Bytes that are not an ordinary frame lying whole in the file.
    Odd,
}

impl Src {
    fn next_frame(&mut self) -> Next {
        match self {
            Src::Memory { bytes, at } => {
                let rest = &bytes.as_ref()[*at..];
                if rest.is_empty() {
                    return Next::End;
                }
                match frame_len(rest) {
                    Some(len) => {
                        let f = Frame::Range(bytes.clone(), *at, *at + len);
                        *at += len;
                        Next::Frame(f)
                    }
                    None => Next::Odd,
                }
            }
            Src::File { win, .. } => {
                let mut want = 1 << 16;
                loop {
                    let Ok(head) = win.fill_at_least(want) else {
                        return Next::Odd;
                    };
                    if head.is_empty() {
                        return Next::End;
                    }
                    if let Some(len) = frame_len(head) {
                        let f = Frame::Owned(head[..len].to_vec());
                        win.consume(len);
                        return Next::Frame(f);
                    }
                    if head.len() < want
                        || want >= WHOLE_MAX_COMPRESSED
                        || !head.starts_with(&ZSTD_MAGIC)
                    {
                        return Next::Odd;
                    }
                    want = (want * 4).min(WHOLE_MAX_COMPRESSED);
                }
            }
        }
    }
}

/// The blocks being read in parallel.
struct Pipe {
    sh: Arc<Shared>,
    workers: Vec<std::thread::JoinHandle<()>>,
    src: Src,
    /// Blocks delimited so far (the next one's number), and what ended the delimiting.
    delimited: u64,
    tail: Option<Next>,
    /// The next block to hand out.
    next: u64,
    window: u64,
    /// The most blocks delimited beyond the one being handed out, so far.
    most_ahead: u64,
    tally: Tally,
    st: State,
    line_no: u64,
    cur: std::vec::IntoIter<Seg>,
    /// Records handed out so far.
    handed: u64,
    done: bool,
    /// What the sequential reader needs to read the file again.
    source: String,
    path: Option<PathBuf>,
    limits: ReadLimits,
    budget: u64,
    seen: BlockSet,
    seen_at_open: HashSet<(u64, u64)>,
}

impl Pipe {
    /// Delimit blocks up to `window` beyond the next one to hand out.
    fn top_up(&mut self) {
        while self.tail.is_none() && self.delimited < self.next + self.window {
            match self.src.next_frame() {
                Next::Frame(f) => {
                    let mut q = self.sh.lock();
                    q.jobs.push_back((self.delimited, Arc::new(f)));
                    self.delimited += 1;
                    self.most_ahead = self.most_ahead.max(self.delimited - self.next);
                    self.sh.cv.notify_one();
                }
                other => self.tail = Some(other),
            }
        }
    }

    /// Block `k` (delimited), decoded by a worker or here.
    fn take(&mut self, k: u64) -> Block {
        let sh = Arc::clone(&self.sh);
        let mut q = sh.lock();
        loop {
            if let Some(b) = q.done.remove(&k) {
                return b;
            }
            if let Some((i, f)) = q.jobs.pop_front() {
                drop(q);
                let b = process_caught(&sh, &f);
                drop(f);
                if i == k {
                    return b;
                }
                q = sh.lock();
                q.done.insert(i, b);
                continue;
            }
            q = sh.cv.wait(q).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// The next block's lines, or the end of the file; false when the sequential reader is to
    /// read the file.
    fn advance(&mut self) -> bool {
        loop {
            self.top_up();
            if self.next == self.delimited {
                return match self.tail {
                    Some(Next::End) => {
                        self.st.clean_end(self.line_no);
                        self.finish();
                        true
                    }
                    _ => false,
                };
            }
            let b = self.take(self.next);
            self.next += 1;
            if !b.whole {
                return false;
            }
            let unrep = b.unrepeatable;
            match self.tally.take_whole(b.frame_len, b.hash, b.size, || unrep) {
                None => return false,
                Some(false) => continue,
                Some(true) if !b.ends_line => return false,
                Some(true) => {
                    self.line_no += b.lines;
                    self.cur = b.segs.into_iter();
                    return true;
                }
            }
        }
    }

    fn finish(&mut self) {
        self.done = true;
        let mut q = self.sh.lock();
        q.stop = true;
        q.jobs.clear();
        q.done.clear();
        self.sh.cv.notify_all();
    }

    /// The sequential reader over the whole file, past the records handed out so far.
    fn sequential(&mut self) -> Result<TraceReader, TraceError> {
        self.finish();
        if let Ok(mut s) = self.seen.lock() {
            *s = self.seen_at_open.clone();
        }
        let src = std::mem::replace(
            &mut self.src,
            Src::Memory {
                bytes: Held(Arc::new(Vec::new())),
                at: 0,
            },
        );
        let mut r = match src {
            Src::Memory { bytes, .. } => TraceReader::from_memory(
                bytes,
                self.source.clone(),
                self.limits,
                self.budget,
                self.seen.clone(),
            )?,
            Src::File { win, size } => {
                let path = self.path.clone().unwrap_or_default();
                let mut file = win.into_inner();
                file.rewind().map_err(|source| TraceError::Io {
                    path: path.clone(),
                    source,
                })?;
                TraceReader::from_file(
                    file,
                    size,
                    &path,
                    self.limits,
                    self.budget,
                    self.seen.clone(),
                )?
            }
        };
        for _ in 0..self.handed {
            if r.next().is_none() {
                break;
            }
        }
        Ok(r)
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.finish();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

enum Mode {
    Seq(Box<TraceReader>),
    Par(Box<Pipe>),
    /// Reading the file again failed (an I/O error): what was read before, then this warning.
    Failed(Box<Pipe>, String),
    /// Only while switching.
    Gone,
}

static EMPTY: BTreeMap<String, u64> = BTreeMap::new();

/// Iterator over the records of one trace, decoded on several threads: the same records and
/// warnings as [`TraceReader`] (see the module's documentation).
pub struct ParTraceReader {
    mode: Mode,
}

impl ParTraceReader {
    /// Open a trace file (zstd detected by its magic number, anything else read as plain NDJSON;
    /// only regular files), to be decoded on `threads` threads (0 is taken as 1), within
    /// [`ReadLimits::from_env`].
    pub fn open(path: &Path, threads: usize) -> Result<Self, TraceError> {
        Self::open_with(path, ReadLimits::from_env(), threads)
    }

    /// [`ParTraceReader::open`] within the given limits.
    pub fn open_with(path: &Path, limits: ReadLimits, threads: usize) -> Result<Self, TraceError> {
        Self::open_in_session(
            path,
            limits,
            limits.max_session_bytes,
            BlockSet::default(),
            threads,
        )
    }

    fn open_in_session(
        path: &Path,
        limits: ReadLimits,
        budget: u64,
        seen: BlockSet,
        threads: usize,
    ) -> Result<Self, TraceError> {
        let io = |source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = open_regular(path)?;
        let size = file.metadata().map_err(io)?.len();
        let mut win = Window::new(file);
        let zstd = win.fill_buf().map_err(io)?.starts_with(&ZSTD_MAGIC);
        if !zstd {
            return Ok(ParTraceReader {
                mode: Mode::Seq(Box::new(TraceReader::from_window(
                    win, size, path, limits, budget, seen,
                )?)),
            });
        }
        let file_budget = limits.file_budget(size, budget);
        Ok(Self::pipe(
            Src::File { win, size },
            path.display().to_string(),
            Some(path.to_path_buf()),
            limits,
            (budget, file_budget),
            seen,
            threads,
        ))
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
    /// taken as 1; at most [`MAX_THREADS`]), within [`ReadLimits::from_env`].
    pub fn from_shared(
        bytes: SharedBytes,
        source: impl Into<String>,
        threads: usize,
    ) -> Result<Self, TraceError> {
        Self::from_shared_with(bytes, source, ReadLimits::from_env(), threads)
    }

    /// [`ParTraceReader::from_shared`] within the given limits.
    pub fn from_shared_with(
        bytes: SharedBytes,
        source: impl Into<String>,
        limits: ReadLimits,
        threads: usize,
    ) -> Result<Self, TraceError> {
        let source = source.into();
        let held = Held(bytes);
        let b = held.as_ref();
        if !b.starts_with(&ZSTD_MAGIC) {
            return Ok(ParTraceReader {
                mode: Mode::Seq(Box::new(TraceReader::from_memory(
                    held,
                    source,
                    limits,
                    limits.max_session_bytes,
                    BlockSet::default(),
                )?)),
            });
        }
        let file_budget = limits.file_budget(b.len() as u64, limits.max_session_bytes);
        Ok(Self::pipe(
            Src::Memory { bytes: held, at: 0 },
            source,
            None,
            limits,
            (limits.max_session_bytes, file_budget),
            BlockSet::default(),
            threads,
        ))
    }

    fn pipe(
        src: Src,
        source: String,
        path: Option<PathBuf>,
        limits: ReadLimits,
        (budget, file_budget): (u64, (u64, bool)),
        seen: BlockSet,
        threads: usize,
    ) -> Self {
        let threads = threads.clamp(1, MAX_THREADS);
        let sh = Arc::new(Shared {
            limits,
            fold: OnceLock::new(),
            q: Mutex::new(Queue {
                jobs: VecDeque::new(),
                done: BTreeMap::new(),
                stop: false,
            }),
            cv: Condvar::new(),
            pool: Mutex::new(Vec::new()),
            made: std::sync::atomic::AtomicUsize::new(0),
        });
        let mut workers = Vec::new();
        for _ in 1..threads {
            let sh = Arc::clone(&sh);
            // A worker that cannot be started leaves its share to the others and the caller.
            if let Ok(h) = std::thread::Builder::new()
                .name("gpufl-decode".into())
                .spawn(move || work(sh))
            {
                workers.push(h);
            }
        }
        let seen_at_open = seen.lock().map(|s| s.clone()).unwrap_or_default();
        let pipe = Pipe {
            sh,
            workers,
            src,
            delimited: 0,
            tail: None,
            next: 0,
            window: (2 * threads as u64).min(MAX_AHEAD),
            most_ahead: 0,
            tally: Tally::new(limits, file_budget, seen.clone()),
            st: State::new(source.clone(), &limits),
            line_no: 0,
            cur: Vec::new().into_iter(),
            handed: 0,
            done: false,
            source,
            path,
            limits,
            budget,
            seen,
            seen_at_open,
        };
        ParTraceReader {
            mode: Mode::Par(Box::new(pipe)),
        }
    }

    /// Problems met so far (truncation, corrupt lines, unknown record types). Complete once the
    /// iterator returned `None`.
    pub fn warnings(&self) -> Vec<String> {
        match &self.mode {
            Mode::Seq(r) => r.warnings(),
            Mode::Gone => Vec::new(),
            Mode::Par(p) => p.st.report(p.tally.warnings()),
            Mode::Failed(p, e) => {
                let mut w = p.st.report(p.tally.warnings());
                w.push(e.clone());
                w
            }
        }
    }

    /// Decompressed bytes read so far (0 for plain NDJSON).
    pub fn decompressed_bytes(&self) -> u64 {
        match &self.mode {
            Mode::Seq(r) => r.decompressed_bytes(),
            Mode::Gone => 0,
            Mode::Par(p) | Mode::Failed(p, _) => p.tally.decoded(),
        }
    }

    /// Records of unknown types skipped so far, by type.
    pub fn unknown_types(&self) -> &BTreeMap<String, u64> {
        match &self.mode {
            Mode::Seq(r) => r.unknown_types(),
            Mode::Gone => &EMPTY,
            Mode::Par(p) | Mode::Failed(p, _) => p.st.unknown_types(),
        }
    }

    /// Whether the file went to the sequential reader after a block the parallel path does not
    /// take (see the module's documentation; never for the recorder's files), or was read by it
    /// from the start (plain NDJSON).
    pub fn is_sequential(&self) -> bool {
        !matches!(self.mode, Mode::Par(_))
    }

    /// Hand the file to the sequential reader.
    fn hand_to_sequential(&mut self) {
        let old = std::mem::replace(&mut self.mode, Mode::Gone);
        self.mode = match old {
            Mode::Par(mut p) => match p.sequential() {
                Ok(r) => Mode::Seq(Box::new(r)),
                Err(e) => Mode::Failed(p, e.to_string()),
            },
            other => other,
        };
    }
}

impl Items for ParTraceReader {
    fn set_fold(&mut self, fold: Arc<dyn BlockFold>) {
        if let Mode::Par(p) = &self.mode {
            let _ = p.sh.fold.set(fold);
        }
    }

    fn next_item(&mut self) -> Option<Item> {
        loop {
            let p = match &mut self.mode {
                Mode::Seq(r) => return r.next().map(Item::Record),
                Mode::Failed(..) | Mode::Gone => return None,
                Mode::Par(p) => p,
            };
            if let Some(seg) = p.cur.next() {
                if p.st.stopped() {
                    p.cur = Vec::new().into_iter();
                    p.finish();
                    return None;
                }
                match seg {
                    Seg::Line(l) => {
                        if let Some(r) = p.st.accept(l) {
                            p.handed += 1;
                            return Some(Item::Record(r));
                        }
                    }
                    Seg::Run((part, n, counts)) => {
                        if p.st.accept_folded(n, &counts) {
                            p.handed += n;
                            return Some(Item::Folded(part));
                        }
                    }
                }
                continue;
            }
            if p.done || p.st.stopped() {
                if !p.done {
                    p.finish();
                }
                return None;
            }
            if !p.advance() {
                self.hand_to_sequential();
            }
        }
    }
}

impl Iterator for ParTraceReader {
    type Item = Record;

    /// The next record (a reader given a fold hands folded runs out through
    /// [`Items::next_item`] only: read it with that).
    fn next(&mut self) -> Option<Record> {
        loop {
            match self.next_item()? {
                Item::Record(r) => return Some(r),
                Item::Folded(_) => debug_assert!(false, "a folding reader read record by record"),
            }
        }
    }
}

/// Reads every trace file of a session directory in order, each on several threads: the records
/// and warnings of [`SessionReader`](crate::SessionReader).
pub struct ParSessionReader {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<ParTraceReader>,
    warnings: Vec<String>,
    limits: ReadLimits,
    /// Decompressed bytes of the files finished so far.
    decoded: u64,
    seen: BlockSet,
    threads: usize,
    fold: Option<Arc<dyn BlockFold>>,
}

impl ParSessionReader {
    /// Open a session directory (see [`crate::session`]), to be read on `threads` threads within
    /// [`ReadLimits::from_env`].
    pub fn open(dir: &Path, threads: usize) -> Result<Self, TraceError> {
        Self::open_with(dir, ReadLimits::from_env(), threads)
    }

    /// [`ParSessionReader::open`] within the given limits (the session limit covers every file).
    pub fn open_with(dir: &Path, limits: ReadLimits, threads: usize) -> Result<Self, TraceError> {
        let files = crate::session::trace_files(dir)?;
        Ok(ParSessionReader {
            files: files.into_iter(),
            current: None,
            warnings: Vec::new(),
            limits,
            decoded: 0,
            seen: BlockSet::default(),
            threads,
            fold: None,
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

impl Items for ParSessionReader {
    fn set_fold(&mut self, fold: Arc<dyn BlockFold>) {
        if let Some(c) = self.current.as_mut() {
            c.set_fold(fold.clone());
        }
        self.fold = Some(fold);
    }

    fn next_item(&mut self) -> Option<Item> {
        loop {
            if let Some(cur) = self.current.as_mut() {
                if let Some(r) = cur.next_item() {
                    return Some(r);
                }
                if let Some(c) = self.current.take() {
                    self.decoded += c.decompressed_bytes();
                    self.warnings.extend(c.warnings());
                }
            }
            let path = self.files.next()?;
            let budget = self.limits.max_session_bytes.saturating_sub(self.decoded);
            match ParTraceReader::open_in_session(
                &path,
                self.limits,
                budget,
                self.seen.clone(),
                self.threads,
            ) {
                Ok(mut r) => {
                    if let Some(f) = &self.fold {
                        r.set_fold(f.clone());
                    }
                    self.current = Some(r)
                }
                Err(e) => self.warnings.push(e.to_string()),
            }
        }
    }
}

impl Iterator for ParSessionReader {
    type Item = Record;

    /// The next record (a reader given a fold hands folded runs out through
    /// [`Items::next_item`] only: read it with that).
    fn next(&mut self) -> Option<Record> {
        loop {
            match self.next_item()? {
                Item::Record(r) => return Some(r),
                Item::Folded(_) => debug_assert!(false, "a folding reader read record by record"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{Header, Kernel};
    use crate::TraceWriter;

    /// A trace of `blocks` blocks of `per` kernels each.
    fn trace(blocks: u64, per: u64) -> Vec<u8> {
        let mut w = TraceWriter::new(Vec::new(), &Header::default()).unwrap();
        for b in 0..blocks {
            for i in 0..per {
                let t = (b * per + i) * 1_000;
                w.write(&Record::Kernel(Kernel {
                    start: t,
                    end: t + 500,
                    corr: (b * per + i) as u32,
                    ..Kernel::default()
                }))
                .unwrap();
            }
            w.end_block().unwrap();
        }
        w.finish(0, "exit").unwrap()
    }

    /// The most blocks the reader delimited ahead and the contexts it made, reading `bytes` on
    /// `threads` threads (the records checked against the sequential reader's).
    fn held(bytes: &[u8], threads: usize) -> (u64, usize) {
        let want: Vec<String> = TraceReader::from_bytes(bytes.to_vec(), "t")
            .unwrap()
            .map(|r| format!("{r:?}"))
            .collect();
        let mut r = ParTraceReader::from_bytes(bytes.to_vec(), "t", threads).unwrap();
        let got: Vec<String> = r.by_ref().map(|r| format!("{r:?}")).collect();
        assert!(got == want, "{threads} threads: records differ");
        match &r.mode {
            Mode::Par(p) => (
                p.most_ahead,
                p.sh.made.load(std::sync::atomic::Ordering::Relaxed),
            ),
            _ => panic!("read by the sequential reader"),
        }
    }

    #[test]
    fn blocks_held_at_once_are_bounded_whatever_the_threads() {
        let bytes = trace(120, 40);
        for threads in [1, 3, 16, 100, MAX_THREADS] {
            let (ahead, made) = held(&bytes, threads);
            let window = (2 * threads as u64).min(MAX_AHEAD);
            assert!(ahead <= window, "{threads} threads: {ahead} blocks ahead");
            // A context per block being decoded at once, never more than the window.
            assert!(made as u64 <= window, "{threads} threads: {made} contexts");
            if threads >= 16 {
                assert_eq!(window, MAX_AHEAD);
            }
        }
    }
}
