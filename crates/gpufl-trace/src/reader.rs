//! Streaming reader. Tolerates what crashes and newer versions leave behind: a truncated or corrupt
//! last block yields every complete record before it plus a warning; lines that do not parse are
//! skipped with a warning; record types this version does not know are skipped and counted; a trace
//! without an `end` record (the recorder died before closing it) gives a warning.

use crate::error::TraceError;
use crate::limits::{mib, ReadLimits, ENV_MAX_LINE_MB};
use crate::records::*;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::blocks::{BlockSet, FrameInput, FrameReader, Tally, Window, ZSTD_MAGIC};

/// What a trace is read from: plain NDJSON or zstd blocks, with what decoding them cost and found.
trait Input: BufRead {
    /// Decompressed bytes produced so far (0 for plain NDJSON).
    fn decoded(&self) -> u64 {
        0
    }
    /// Problems of the input layer that did not stop reading (skipped duplicate blocks).
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Plain NDJSON.
struct Plain<R>(R);

impl<R: BufRead> Read for Plain<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl<R: BufRead> BufRead for Plain<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.0.fill_buf()
    }
    fn consume(&mut self, n: usize) {
        self.0.consume(n)
    }
}

impl<R: BufRead> Input for Plain<R> {}

impl<R: FrameInput> Input for FrameReader<R> {
    fn decoded(&self) -> u64 {
        FrameReader::decoded(self)
    }
    fn warnings(&self) -> Vec<String> {
        FrameReader::warnings(self)
    }
}

/// Open a file for reading only if it is a regular file: a FIFO, a device or a socket named like a
/// trace file is refused (opening one could block forever, reading one need never end). The file is
/// opened without blocking and checked again once open, so it cannot be swapped in between.
pub(crate) fn open_regular(path: &Path) -> Result<File, TraceError> {
    let io = |source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let not_regular = |ft: std::fs::FileType| {
        use std::os::unix::fs::FileTypeExt;
        let what = if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_dir() {
            "a directory"
        } else {
            "not a regular file"
        };
        TraceError::NotATrace {
            path: path.to_path_buf(),
            why: format!("{what}, not a regular file: refused"),
        }
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    Ok(file)
}

/// Iterator over the records of one trace (NDJSON, zstd-compressed or plain).
pub struct TraceReader {
    input: Box<dyn Input>,
    /// A line that spans two buffers of `input` (lines inside one buffer are parsed in place).
    buf: Vec<u8>,
    line_no: u64,
    done: bool,
    st: State,
}

/// Unknown record types a reader names in its warnings, at most (records of further types are
/// counted together).
pub const MAX_UNKNOWN_TYPES: usize = 64;
/// Bytes of an unknown type's name that a reader keeps to name it, at most.
pub const MAX_UNKNOWN_TAG: usize = 64;

/// What parsing a line updates (apart from the input, so a line can be parsed in place while the
/// input's buffer is borrowed). The parallel reader ([`crate::par`]) runs the same state over the
/// lines its workers classified.
pub(crate) struct State {
    source: String,
    warnings: Vec<String>,
    bad_lines: u64,
    unknown_types: BTreeMap<String, u64>,
    /// Records of unknown types beyond the [`MAX_UNKNOWN_TYPES`] named ones (or with a type name
    /// longer than [`MAX_UNKNOWN_TAG`]): counted, not named, so that a hostile trace of distinct
    /// types holds no more than a count.
    unknown_other: u64,
    /// Records skipped for holding more entries than the reader takes, by type.
    oversized: BTreeMap<String, u64>,
    header_version: Option<u32>,
    saw_end: bool,
    /// Records returned so far, and what they count as in an `end` record.
    records: u64,
    counts: Counts,
    /// Lines after the `end` record (skipped).
    after_end: u64,
    headers: u64,
    /// The file turned out not to be a gpufl trace (unknown `format`): nothing more is read.
    stop: bool,
    max_line: usize,
    /// Lines longer than `max_line`, skipped.
    long_lines: u64,
    parser: crate::fastpath::Parser,
}

impl TraceReader {
    /// Open a trace file; zstd is detected by its magic number, anything else is read as plain NDJSON.
    /// Only regular files are opened. Reading is bounded by [`ReadLimits::from_env`].
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        Self::open_with(path, ReadLimits::from_env())
    }

    /// [`TraceReader::open`] within the given limits.
    pub fn open_with(path: &Path, limits: ReadLimits) -> Result<Self, TraceError> {
        Self::open_in_session(path, limits, limits.max_session_bytes, BlockSet::default())
    }

    fn open_in_session(
        path: &Path,
        limits: ReadLimits,
        budget: u64,
        seen: BlockSet,
    ) -> Result<Self, TraceError> {
        let io = |source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = open_regular(path)?;
        let size = file.metadata().map_err(io)?.len();
        Self::from_file(file, size, path, limits, budget, seen)
    }

    /// Read a regular file opened by [`open_regular`] (at its start), `size` bytes long when opened.
    pub(crate) fn from_file(
        file: File,
        size: u64,
        path: &Path,
        limits: ReadLimits,
        budget: u64,
        seen: BlockSet,
    ) -> Result<Self, TraceError> {
        Self::from_window(Window::new(file), size, path, limits, budget, seen)
    }

    /// [`TraceReader::from_file`] over a file already wrapped in a [`Window`] (nothing consumed).
    pub(crate) fn from_window(
        mut file: Window<File>,
        size: u64,
        path: &Path,
        limits: ReadLimits,
        budget: u64,
        seen: BlockSet,
    ) -> Result<Self, TraceError> {
        let io = |source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let head = file.fill_buf().map_err(io)?;
        let input: Box<dyn Input> = if head.starts_with(&ZSTD_MAGIC) {
            let budget = limits.file_budget(size, budget);
            Box::new(FrameReader::new(file, Tally::new(limits, budget, seen)))
        } else if head.is_empty() || head[0] == b'{' {
            Box::new(Plain(file))
        } else {
            return Err(TraceError::NotATrace {
                path: path.to_path_buf(),
                why: "neither zstd nor NDJSON".into(),
            });
        };
        Ok(Self::from_bufread(
            input,
            path.display().to_string(),
            limits,
        ))
    }

    /// Read a trace held in memory: the bytes of a trace file (zstd blocks, detected by the magic
    /// number, with the same tolerance as [`TraceReader::open`]) or plain NDJSON.
    pub fn from_bytes(bytes: Vec<u8>, source: impl Into<String>) -> Result<Self, TraceError> {
        Self::from_bytes_with(bytes, source, ReadLimits::from_env())
    }

    /// [`TraceReader::from_bytes`] within the given limits.
    pub fn from_bytes_with(
        bytes: Vec<u8>,
        source: impl Into<String>,
        limits: ReadLimits,
    ) -> Result<Self, TraceError> {
        Self::from_memory(
            bytes,
            source.into(),
            limits,
            limits.max_session_bytes,
            BlockSet::default(),
        )
    }

    /// Read the bytes of a trace held in memory, as the part of a session whose budget and blocks
    /// seen so far are given.
    pub(crate) fn from_memory<T: AsRef<[u8]> + 'static>(
        bytes: T,
        source: String,
        limits: ReadLimits,
        budget: u64,
        seen: BlockSet,
    ) -> Result<Self, TraceError> {
        let b = bytes.as_ref();
        let input: Box<dyn Input> = if b.starts_with(&ZSTD_MAGIC) {
            let budget = limits.file_budget(b.len() as u64, budget);
            Box::new(FrameReader::new(
                std::io::Cursor::new(bytes),
                Tally::new(limits, budget, seen),
            ))
        } else if b.is_empty() || b[0] == b'{' {
            Box::new(Plain(std::io::Cursor::new(bytes)))
        } else {
            return Err(TraceError::NotATrace {
                path: source.into(),
                why: "neither zstd nor NDJSON".into(),
            });
        };
        Ok(Self::from_bufread(input, source, limits))
    }

    /// Read plain NDJSON (already decompressed) from any reader.
    pub fn from_reader<R: Read + 'static>(r: R, source: impl Into<String>) -> Self {
        Self::from_bufread(
            Box::new(Plain(BufReader::new(r))),
            source.into(),
            ReadLimits::from_env(),
        )
    }

    fn from_bufread(input: Box<dyn Input>, source: String, limits: ReadLimits) -> Self {
        TraceReader {
            input,
            buf: Vec::with_capacity(1024),
            line_no: 0,
            done: false,
            st: State::new(source, &limits),
        }
    }

    /// Problems met so far (truncation, corrupt lines, unknown record types). Complete once the
    /// iterator returned `None`.
    pub fn warnings(&self) -> Vec<String> {
        self.st.report(self.input.warnings())
    }

    /// Decompressed bytes read so far (0 for plain NDJSON).
    pub fn decompressed_bytes(&self) -> u64 {
        self.input.decoded()
    }

    /// Records of unknown types skipped so far, by type.
    pub fn unknown_types(&self) -> &BTreeMap<String, u64> {
        &self.st.unknown_types
    }

    /// The next line into `buf`, across buffer boundaries (the slow path).
    fn next_line(&mut self) -> Option<()> {
        loop {
            self.buf.clear();
            let max = self.st.max_line;
            let r = (&mut self.input)
                .take(max as u64 + 1)
                .read_until(b'\n', &mut self.buf);
            if matches!(r, Ok(n) if n > max && self.buf.last() != Some(&b'\n')) {
                // A line over the limit: skip the rest of it without holding it.
                self.buf.clear();
                self.st.long_lines += 1;
                self.line_no += 1;
                match skip_line(self.input.as_mut()) {
                    Ok(true) => continue,
                    Ok(false) => return None,
                    Err(e) => {
                        self.st.read_error(self.line_no, &e);
                        return None;
                    }
                }
            }
            return self.line_done(r);
        }
    }

    fn line_done(&mut self, r: std::io::Result<usize>) -> Option<()> {
        let st = &mut self.st;
        match r {
            Ok(0) => {
                st.clean_end(self.line_no);
                None
            }
            Ok(_) if self.buf.last() != Some(&b'\n') => {
                st.warnings.push(format!(
                    "{}: truncated: the last record (line {}) is incomplete and was dropped",
                    st.source,
                    self.line_no + 1
                ));
                None
            }
            Ok(_) => {
                self.line_no += 1;
                Some(())
            }
            Err(e) => {
                st.read_error(self.line_no, &e);
                None
            }
        }
    }
}

/// Consume input up to and including the next newline; Ok(false) at the end of input.
fn skip_line(input: &mut dyn Input) -> std::io::Result<bool> {
    loop {
        let b = input.fill_buf()?;
        if b.is_empty() {
            return Ok(false);
        }
        if let Some(i) = memchr::memchr(b'\n', b) {
            input.consume(i + 1);
            return Ok(true);
        }
        let n = b.len();
        input.consume(n);
    }
}

impl State {
    pub(crate) fn new(source: String, limits: &ReadLimits) -> State {
        State {
            source,
            warnings: Vec::new(),
            bad_lines: 0,
            unknown_types: BTreeMap::new(),
            unknown_other: 0,
            oversized: BTreeMap::new(),
            header_version: None,
            saw_end: false,
            records: 0,
            counts: Counts::default(),
            after_end: 0,
            headers: 0,
            stop: false,
            max_line: limits.max_line_bytes.max(1),
            long_lines: 0,
            parser: crate::fastpath::Parser::new(),
        }
    }

    /// The file turned out not to be a gpufl trace: nothing more is read.
    pub(crate) fn stopped(&self) -> bool {
        self.stop
    }

    /// Records of unknown types skipped so far, by type.
    pub(crate) fn unknown_types(&self) -> &BTreeMap<String, u64> {
        &self.unknown_types
    }

    /// The warnings met, then those of the input layer (`input`: skipped blocks), the skipped lines
    /// and the unknown types.
    pub(crate) fn report(&self, input: Vec<String>) -> Vec<String> {
        let st = self;
        let mut w = st.warnings.clone();
        w.extend(input.into_iter().map(|m| format!("{}: {m}", st.source)));
        if st.after_end > 0 {
            w.push(format!(
                "{}: skipped {} line(s) after the end record (a file concatenated with another, or written to after it was closed?)",
                st.source, st.after_end
            ));
        }
        if st.long_lines > 0 {
            w.push(format!(
                "{}: skipped {} line(s) longer than {}, the limit per record ({ENV_MAX_LINE_MB} raises it)",
                st.source,
                st.long_lines,
                mib(st.max_line as u64)
            ));
        }
        if st.bad_lines > 0 {
            w.push(format!(
                "{}: skipped {} line(s) that are not valid records",
                st.source, st.bad_lines
            ));
        }
        for (t, n) in &st.oversized {
            w.push(format!(
                "{}: skipped {n} '{t}' record(s) beyond the reader's bounds (more than {} lines, or {} stall reasons on a line)",
                st.source,
                crate::kdetail::MAX_RECORD_LINES,
                crate::kdetail::MAX_STALL_REASONS
            ));
        }
        for (t, n) in &st.unknown_types {
            w.push(format!(
                "{}: skipped {n} record(s) of unknown type '{t}' (written by a newer gpufl?)",
                st.source
            ));
        }
        if st.unknown_other > 0 {
            w.push(format!(
                "{}: skipped {} record(s) of further unknown types",
                st.source, st.unknown_other
            ));
        }
        w
    }

    /// A clean end of input after `line_no` complete lines, no line left unfinished.
    pub(crate) fn clean_end(&mut self, line_no: u64) {
        // A clean end of input without an `end` record: the writer never finished this file
        // (crash, kill, or still running). Closed blocks end on record boundaries, so the
        // loss of every block after the last flushed one is invisible to the decoder.
        if !self.saw_end {
            self.warnings.push(if line_no == 0 {
                format!(
                    "{}: empty: the recorder stopped before its first block was written",
                    self.source
                )
            } else {
                format!(
                    "{}: no end record after line {line_no}: the trace was not closed (the recorder crashed, was killed or is still running); records after the last complete block are missing",
                    self.source
                )
            });
        }
    }

    fn read_error(&mut self, line_no: u64, e: &std::io::Error) {
        let limit = e
            .get_ref()
            .is_some_and(|x| x.is::<crate::blocks::LimitReached>());
        let msg = if limit {
            format!(
                "{}: reading stopped after line {line_no}: {e}; the records before it were read",
                self.source
            )
        } else {
            format!(
                "{}: truncated or corrupt after line {line_no} ({e}); the records before it were read",
                self.source
            )
        };
        self.warnings.push(msg);
    }

    /// Parse a line (without or with its newline) and check it against the file's structure.
    fn parse_line(&mut self, line: &[u8]) -> Option<Record> {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        if line.len() > self.max_line {
            // Checked first, as for a line that spans buffers (never held whole).
            self.long_lines += 1;
            return None;
        }
        if self.saw_end {
            if !trim_line(line).is_empty() {
                self.after_end += 1;
            }
            return None;
        }
        match classify(line, self.max_line, &mut self.parser) {
            Line::Blank => None,
            other => self.accept(other),
        }
    }

    /// Take `n` records folded by a worker (see [`crate::par::BlockFold`]: none a header or an
    /// end record, `counts` theirs) as [`State::accept`] takes them one by one; false when they
    /// are not to be handed out (they come after the end record).
    pub(crate) fn accept_folded(&mut self, n: u64, counts: &Counts) -> bool {
        if self.saw_end {
            self.after_end += n;
            return false;
        }
        let first = self.records == 0;
        self.records += n;
        let c = &mut self.counts;
        c.kernels += counts.kernels;
        c.memcpys += counts.memcpys;
        c.memsets += counts.memsets;
        c.syncs += counts.syncs;
        c.apis += counts.apis;
        c.stacks += counts.stacks;
        c.dropped += counts.dropped;
        if first && n > 0 && self.headers == 0 {
            self.warnings.push(format!(
                "{}: no header record at the start of the file (not written by gpufl, or its start was cut?): its records are read as format v{FORMAT_VERSION}",
                self.source
            ));
        }
        true
    }

    /// Take a classified line (see [`classify`]) into the file's structure: a header first,
    /// nothing after the end record, the end record's counts equal to what was read. The record,
    /// when it is one to hand out.
    pub(crate) fn accept(&mut self, line: Line) -> Option<Record> {
        let rec = match line {
            Line::Long => {
                self.long_lines += 1;
                return None;
            }
            Line::Blank => return None,
            _ if self.saw_end => {
                self.after_end += 1;
                return None;
            }
            Line::Bad => {
                self.bad_lines += 1;
                return None;
            }
            Line::Unknown(tag) => {
                let room = self.unknown_types.len() < MAX_UNKNOWN_TYPES;
                match self.unknown_types.get_mut(&*tag) {
                    Some(n) => *n += 1,
                    None if room && tag.len() <= MAX_UNKNOWN_TAG => {
                        self.unknown_types.insert(tag.into(), 1);
                    }
                    None => self.unknown_other += 1,
                }
                return None;
            }
            Line::Oversized(tag) => {
                *self.oversized.entry(tag.into()).or_insert(0) += 1;
                return None;
            }
            Line::Rec(rec) => rec,
        };
        self.records += 1;
        match &rec {
            Record::Kernel(_) => self.counts.kernels += 1,
            Record::Header(h) => {
                self.headers += 1;
                if !self.check_header(h) {
                    return None;
                }
            }
            Record::End(e) => {
                self.saw_end = true;
                self.check_counts(&e.counts);
            }
            other => self.counts.add(other),
        }
        if self.records == 1 && self.headers == 0 {
            self.warnings.push(format!(
                "{}: no header record at the start of the file (not written by gpufl, or its start was cut?): its records are read as format v{FORMAT_VERSION}",
                self.source
            ));
        }
        Some(rec)
    }

    /// Problems of a header; false when the file is not a gpufl trace (nothing more is read).
    fn check_header(&mut self, h: &Header) -> bool {
        if h.format != FORMAT_NAME {
            self.warnings.push(format!(
                "{}: not a gpufl trace: its header says format '{}' (expected '{FORMAT_NAME}'); the rest of the file was not read",
                self.source, h.format
            ));
            self.stop = true;
            return false;
        }
        if self.headers > 1 {
            self.warnings.push(format!(
                "{}: a second header record (record {}): files concatenated?",
                self.source, self.records
            ));
        }
        self.header_version = Some(h.version);
        if h.version == 0 {
            self.warnings.push(format!(
                "{}: header version 0 is not a trace format version (versions start at 1): read as v{FORMAT_VERSION}",
                self.source
            ));
        } else if h.version > FORMAT_VERSION {
            self.warnings.push(format!(
                "{}: trace format v{} is newer than this reader (v{FORMAT_VERSION}); reading what it knows",
                self.source, h.version
            ));
        }
        true
    }

    /// Compare the end record's counts with the records read from this file.
    fn check_counts(&mut self, end: &Counts) {
        let read = &self.counts;
        let fields = [
            ("kernels", end.kernels, read.kernels),
            ("memcpys", end.memcpys, read.memcpys),
            ("memsets", end.memsets, read.memsets),
            ("syncs", end.syncs, read.syncs),
            ("apis", end.apis, read.apis),
            ("stacks", end.stacks, read.stacks),
            ("dropped", end.dropped, read.dropped),
        ];
        let diff: Vec<String> = fields
            .iter()
            .filter(|f| f.1 != f.2)
            .map(|(name, said, got)| format!("{name} {said} (read {got})"))
            .collect();
        if !diff.is_empty() {
            self.warnings.push(format!(
                "{}: the end record's counts disagree with the records read: {} (records lost or duplicated?)",
                self.source,
                diff.join(", ")
            ));
        }
    }
}

/// One line of a trace on its own, before the file's structure is checked ([`State::accept`]):
/// what the line is depends on its bytes and the line limit only, so lines can be classified on
/// any thread.
pub(crate) enum Line {
    Rec(Record),
    /// Nothing but whitespace.
    Blank,
    /// Longer than the limit per line.
    Long,
    /// Not a valid record.
    Bad,
    /// A record of a type this version does not know.
    Unknown(Box<str>),
    /// A record of this type with more entries than the reader takes
    /// ([`crate::kdetail::MAX_RECORD_LINES`], [`crate::kdetail::MAX_STALL_REASONS`]).
    Oversized(Box<str>),
}

/// What a line (without its newline) is.
pub(crate) fn classify(line: &[u8], max_line: usize, parser: &mut crate::fastpath::Parser) -> Line {
    if line.len() > max_line {
        return Line::Long;
    }
    let line = trim_line(line);
    if line.is_empty() {
        return Line::Blank;
    }
    // Kernels, API calls, syncs and copies are most of a trace: parse the writer's exact shape
    // by hand (serde_json otherwise).
    if let Some(rec) = parser.record(line) {
        return Line::Rec(rec);
    }
    let tag: std::borrow::Cow<str> = match peek_tag(line) {
        Some(t) => t.into(),
        None => match serde_json::from_slice::<serde_json::Value>(line) {
            Ok(v) => match v.get("t").and_then(|t| t.as_str()) {
                Some(t) => t.to_owned().into(),
                None => return Line::Bad,
            },
            Err(_) => return Line::Bad,
        },
    };
    match parse_known(&tag, line) {
        Some(Ok(rec)) => Line::Rec(rec),
        Some(Err(e)) if e.to_string().contains(crate::kdetail::BOUND_ERROR) => {
            Line::Oversized(tag.into())
        }
        Some(Err(_)) => Line::Bad,
        None => Line::Unknown(tag.into()),
    }
}

impl Iterator for TraceReader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        while !self.done && !self.st.stop {
            // Fast path: a whole line inside the input's buffer is parsed where it lies.
            match self.input.fill_buf() {
                Ok(b) if !b.is_empty() => {
                    if let Some(nl) = memchr::memchr(b'\n', b) {
                        if nl == 0 {
                            // A run of empty lines (never written; hostile input can hold a
                            // billion of them): skipped at once, not one by one.
                            let n = b.iter().take_while(|&&c| c == b'\n').count();
                            self.line_no += n as u64;
                            self.input.consume(n);
                            continue;
                        }
                        self.line_no += 1;
                        let rec = self.st.parse_line(&b[..nl]);
                        self.input.consume(nl + 1);
                        match rec {
                            Some(r) => return Some(r),
                            None => continue,
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    self.st.read_error(self.line_no, &e);
                    self.done = true;
                    break;
                }
            }
            // Slow path: end of input, or a line that spans buffers.
            if self.next_line().is_none() {
                self.done = true;
                break;
            }
            if let Some(rec) = self.st.parse_line(&self.buf) {
                return Some(rec);
            }
        }
        None
    }
}

fn trim_line(line: &[u8]) -> &[u8] {
    let mut l = line;
    while let Some((last, rest)) = l.split_last() {
        if last.is_ascii_whitespace() {
            l = rest;
        } else {
            break;
        }
    }
    l
}

/// Fast path: every writer puts `"t"` first, so `{"t":"kernel",…` gives the tag without a full parse.
fn peek_tag(line: &[u8]) -> Option<&str> {
    let rest = line.strip_prefix(b"{\"t\":\"")?;
    let end = rest.iter().position(|&b| b == b'"')?;
    std::str::from_utf8(&rest[..end]).ok()
}

/// Parse a line whose tag is known to this version; None for unknown tags.
fn parse_known(tag: &str, line: &[u8]) -> Option<Result<Record, serde_json::Error>> {
    fn p<T: serde::de::DeserializeOwned>(
        line: &[u8],
        f: impl FnOnce(T) -> Record,
    ) -> Option<Result<Record, serde_json::Error>> {
        Some(serde_json::from_slice::<T>(line).map(f))
    }
    match tag {
        "header" => p(line, |h: Header| Record::Header(Box::new(h))),
        "str" => p(line, Record::Str),
        "frame" => p(line, Record::Frame),
        "stack" => p(line, Record::Stack),
        "kernel" => p(line, Record::Kernel),
        "function" => p(line, Record::Function),
        "memcpy" => p(line, Record::Memcpy),
        "memset" => p(line, Record::Memset),
        "sync" => p(line, Record::Sync),
        "api" => p(line, Record::Api),
        "callsite" => p(line, Record::Callsite),
        "hostcall" => p(line, Record::Hostcall),
        "hsample" => p(line, Record::Hsample),
        "mem" => p(line, Record::Mem),
        "gnode" => p(line, Record::Gnode),
        "stream" => p(line, Record::Stream),
        "capture" => p(line, Record::Capture),
        "scope" => p(line, Record::Scope),
        "range" => p(line, Record::Range),
        "window" => p(line, Record::Window),
        "kdetail" => p(line, |k| Record::Kdetail(Box::new(k))),
        "kstall" => p(line, |k| Record::Kstall(Box::new(k))),
        "telemetry" => p(line, Record::Telemetry),
        "overhead" => p(line, Record::Overhead),
        "dropped" => p(line, Record::Dropped),
        "notice" => p(line, Record::Notice),
        "end" => p(line, Record::End),
        _ => None,
    }
}

/// Reads every trace file of a session directory in order.
pub struct SessionReader {
    files: std::vec::IntoIter<PathBuf>,
    current: Option<TraceReader>,
    warnings: Vec<String>,
    limits: ReadLimits,
    /// Decompressed bytes of the files finished so far.
    decoded: u64,
    seen: BlockSet,
}

impl SessionReader {
    /// Open a session directory (see [`crate::session`]), reading within [`ReadLimits::from_env`].
    pub fn open(dir: &Path) -> Result<Self, TraceError> {
        Self::open_with(dir, ReadLimits::from_env())
    }

    /// [`SessionReader::open`] within the given limits (the session limit covers every file).
    pub fn open_with(dir: &Path, limits: ReadLimits) -> Result<Self, TraceError> {
        let files = crate::session::trace_files(dir)?;
        Ok(SessionReader {
            files: files.into_iter(),
            current: None,
            warnings: Vec::new(),
            limits,
            decoded: 0,
            seen: BlockSet::default(),
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

impl Iterator for SessionReader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        loop {
            if let Some(cur) = self.current.as_mut() {
                if let Some(r) = cur.next() {
                    return Some(r);
                }
                if let Some(c) = self.current.take() {
                    self.decoded += c.decompressed_bytes();
                    self.warnings.extend(c.warnings());
                }
            }
            let path = self.files.next()?;
            let budget = self.limits.max_session_bytes.saturating_sub(self.decoded);
            match TraceReader::open_in_session(&path, self.limits, budget, self.seen.clone()) {
                Ok(r) => self.current = Some(r),
                Err(e) => self.warnings.push(e.to_string()),
            }
        }
    }
}
