//! Reading a trace on several cores. A compressed trace file is a sequence of independent zstd
//! frames (blocks) that end on line ends, and nothing of the reader's state crosses a block but
//! what is cheap to carry in order: the line count, the structure checks of [`State`] (header,
//! `end` record and its counts), the limits' byte counts and the blocks seen ([`Tally`]). So the
//! caller's thread delimits the blocks (`ZSTD_findFrameCompressedSize` walks the block headers
//! without decoding) and hands them to worker threads, which decode each whole
//! ([`decode_whole`]) and classify its lines ([`classify`]); the caller takes the blocks back in
//! file order and runs them through the same [`Tally`] and [`State`] as the sequential
//! [`TraceReader`].
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
//! With N threads, N − 1 workers decode ahead (at most 2N blocks beyond the one being handed out)
//! and the caller decodes too whenever the block it needs next is not ready, so at most N threads
//! are busy; with N = 1 the caller decodes every block itself, one at a time, as it needs it
//! (blocks decoded whole, and folded, are faster to load than records one by one).

use crate::blocks::{
    block_hash, decode_whole, frame_len, new_dctx, unrepeatable, BlockSet, FrameInput, Repeat,
    Tally, Window, WHOLE_MAX_COMPRESSED, ZSTD_MAGIC,
};
use crate::error::TraceError;
use crate::limits::ReadLimits;
use crate::reader::{classify, open_regular, Line, State, TraceReader};
use crate::records::{Counts, Record};
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
/// A block is folded only when it was decoded by a worker, ends at a line end, and every one of
/// its lines is a valid record that [`BlockFold::takes`] (never a header or an end record: those
/// check the file's structure); every other block's records come one by one, as without a fold.
/// The reader takes a folded block's records into its checks (counts, records after the end
/// record) as it would take them one by one, so warnings and errors are the same.
pub trait BlockFold: Send + Sync {
    /// Whether a record may be folded (asked of every record of a block before it is folded).
    fn takes(&self, rec: &Record) -> bool;
    /// Start folding a block of `bytes` decoded bytes: its records are pushed as they are parsed,
    /// in file order (a block found not to fold after all is dropped half-folded).
    fn start(&self, bytes: usize) -> Box<dyn BlockFolding>;
}

/// One block being folded (see [`BlockFold::start`]).
pub trait BlockFolding {
    /// Fold the block's next record (one that [`BlockFold::takes`]).
    fn push(&mut self, rec: Record);
    /// The block's fold, once its every record was pushed.
    fn finish(self: Box<Self>) -> Box<dyn Any + Send>;
}

/// What a reader with a [`BlockFold`] hands out: a record, or a block's records folded.
pub enum Item {
    Record(Record),
    Folded(Box<dyn Any + Send>),
}

/// Readers that can fold blocks on their workers ([`ParTraceReader`], [`ParSessionReader`]).
pub trait Items {
    /// Fold the blocks read from now on with `fold` (where the reader decodes on workers).
    fn set_fold(&mut self, fold: Arc<dyn BlockFold>);
    /// The next record or folded block, in file order.
    fn next_item(&mut self) -> Option<Item>;
}

/// A folded block: the fold's part, its records and their counts.
type Part = (Box<dyn Any + Send>, u64, Counts);

/// The environment variable that sets the number of threads readers and the analysis use.
pub const THREADS_ENV: &str = "GPUFL_THREADS";

/// The most threads a reader starts, whatever it is asked for.
pub const MAX_THREADS: usize = 256;

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
    /// Its lines but the blank ones, in order (empty when folded).
    items: Vec<Line>,
    folded: Option<Part>,
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
            items: Vec::new(),
            folded: None,
        }
    }
}

/// A thread's zstd context and decoding buffer, reused from block to block.
struct Scratch {
    dctx: zstd::zstd_safe::DCtx<'static>,
    decoded: Vec<u8>,
}

impl Scratch {
    fn new() -> Self {
        Scratch {
            dctx: new_dctx(),
            decoded: Vec::new(),
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
    if !decode_whole(&mut sc.dctx, bytes, limit, &mut sc.decoded) {
        return Block::not_whole();
    }
    let data = &sc.decoded;
    let max_line = limits.max_line_bytes.max(1);
    let mut b = Block {
        whole: true,
        frame_len: bytes.len(),
        hash: block_hash(bytes),
        size: data.len(),
        unrepeatable: unrepeatable(data),
        ends_line: false,
        lines: 0,
        items: Vec::new(),
        folded: None,
    };
    if let Some((part, lines)) = fold.and_then(|f| fold_lines(f, data, max_line)) {
        b.ends_line = true;
        b.lines = lines;
        b.folded = Some(part);
        return b;
    }
    // Trace lines are ~150-250 bytes (kernels, most of a trace): one allocation for most blocks.
    let mut items = Vec::with_capacity(data.len() / 160 + 1);
    let mut at = 0;
    let mut lines = 0;
    for nl in memchr::memchr_iter(b'\n', data) {
        lines += 1;
        match classify(&data[at..nl], max_line) {
            Line::Blank => {}
            l => items.push(l),
        }
        at = nl + 1;
    }
    b.ends_line = at == data.len();
    b.lines = lines;
    b.items = items;
    b
}

/// A block's records folded as they are parsed, and its line ends; `None` when the block does not
/// fold: it does not end at a line end, or some line is not a valid record that `fold` takes (or
/// is a header or an end record). Blank lines are skipped, as when the records come one by one.
fn fold_lines(fold: &dyn BlockFold, data: &[u8], max_line: usize) -> Option<(Part, u64)> {
    if data.last().is_some_and(|&c| c != b'\n') {
        return None;
    }
    let mut folding = fold.start(data.len());
    let mut counts = Counts::default();
    let (mut n, mut lines, mut at) = (0u64, 0u64, 0);
    for nl in memchr::memchr_iter(b'\n', data) {
        lines += 1;
        match classify(&data[at..nl], max_line) {
            Line::Blank => {}
            Line::Rec(r) if !matches!(r, Record::Header(_) | Record::End(_)) && fold.takes(&r) => {
                counts.add(&r);
                n += 1;
                folding.push(r);
            }
            _ => return None,
        }
        at = nl + 1;
    }
    Some(((folding.finish(), n, counts), lines))
}

/// [`process`], a panic taken as a block not decoded whole (the sequential reader then meets it
/// on the caller's thread, as it would have without workers).
fn process_caught(
    frame: &Frame,
    limits: &ReadLimits,
    fold: Option<&dyn BlockFold>,
    sc: &mut Scratch,
) -> Block {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        process(frame, limits, fold, sc)
    })) {
        Ok(b) => b,
        Err(_) => {
            *sc = Scratch::new();
            Block::not_whole()
        }
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
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // Nothing is left half-done behind the lock (processing happens outside it).
        self.q.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn work(sh: Arc<Shared>) {
    let mut sc = Scratch::new();
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
        let b = process_caught(&frame, &sh.limits, sh.fold.get().map(|f| &**f), &mut sc);
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
    sc: Scratch,
    tally: Tally,
    st: State,
    line_no: u64,
    cur: std::vec::IntoIter<Line>,
    /// The folded block to hand out next.
    pending: Option<Part>,
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
                let b = process_caught(&f, &sh.limits, sh.fold.get().map(|f| &**f), &mut self.sc);
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
                    self.cur = b.items.into_iter();
                    self.pending = b.folded;
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
            window: 2 * threads as u64,
            sc: Scratch::new(),
            tally: Tally::new(limits, file_budget, seen.clone()),
            st: State::new(source.clone(), &limits),
            line_no: 0,
            cur: Vec::new().into_iter(),
            pending: None,
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
            if let Some((part, n, counts)) = p.pending.take() {
                if p.st.stopped() {
                    p.finish();
                    return None;
                }
                if p.st.accept_folded(n, &counts) {
                    p.handed += n;
                    return Some(Item::Folded(part));
                }
                continue;
            }
            if let Some(item) = p.cur.next() {
                if p.st.stopped() {
                    p.cur = Vec::new().into_iter();
                    p.finish();
                    return None;
                }
                if let Some(r) = p.st.accept(item) {
                    p.handed += 1;
                    return Some(Item::Record(r));
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

    /// The next record (a reader given a fold hands folded blocks out through
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

    /// The next record (a reader given a fold hands folded blocks out through
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
