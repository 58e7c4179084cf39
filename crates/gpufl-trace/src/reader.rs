//! Streaming reader. Tolerates what crashes and newer versions leave behind: a truncated or corrupt
//! last block yields every complete record before it plus a warning; lines that do not parse are
//! skipped with a warning; record types this version does not know are skipped and counted; a trace
//! without an `end` record (the recorder died before closing it) gives a warning.

use crate::error::TraceError;
use crate::records::*;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::blocks::{FrameReader, ZSTD_MAGIC};

/// Iterator over the records of one trace (NDJSON, zstd-compressed or plain).
pub struct TraceReader {
    input: Box<dyn BufRead>,
    /// A line that spans two buffers of `input` (lines inside one buffer are parsed in place).
    buf: Vec<u8>,
    line_no: u64,
    done: bool,
    st: State,
}

/// What parsing a line updates (apart from the input, so a line can be parsed in place while the
/// input's buffer is borrowed). The parallel reader ([`crate::par`]) keeps one per block and adds
/// them up in order.
pub(crate) struct State {
    pub(crate) source: String,
    pub(crate) warnings: Vec<String>,
    pub(crate) bad_lines: u64,
    pub(crate) unknown_types: BTreeMap<String, u64>,
    pub(crate) header_version: Option<u32>,
    pub(crate) saw_end: bool,
}

impl TraceReader {
    /// Open a trace file; zstd is detected by its magic number, anything else is read as plain NDJSON.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let io = |source| TraceError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut file = BufReader::new(File::open(path).map_err(io)?);
        let head = file.fill_buf().map_err(io)?;
        let input: Box<dyn BufRead> = if head.starts_with(&ZSTD_MAGIC) {
            Box::new(FrameReader::new(file))
        } else if head.is_empty() || head[0] == b'{' {
            Box::new(file)
        } else {
            return Err(TraceError::NotATrace {
                path: path.to_path_buf(),
                why: "neither zstd nor NDJSON".into(),
            });
        };
        Ok(Self::from_bufread(input, path.display().to_string()))
    }

    /// Read a trace held in memory: the bytes of a trace file (zstd blocks, detected by the magic
    /// number, with the same tolerance as [`TraceReader::open`]) or plain NDJSON.
    pub fn from_bytes(bytes: Vec<u8>, source: impl Into<String>) -> Result<Self, TraceError> {
        let source = source.into();
        let input: Box<dyn BufRead> = if bytes.starts_with(&ZSTD_MAGIC) {
            Box::new(FrameReader::new(std::io::Cursor::new(bytes)))
        } else if bytes.is_empty() || bytes[0] == b'{' {
            Box::new(std::io::Cursor::new(bytes))
        } else {
            return Err(TraceError::NotATrace {
                path: source.into(),
                why: "neither zstd nor NDJSON".into(),
            });
        };
        Ok(Self::from_bufread(input, source))
    }

    /// Read plain NDJSON (already decompressed) from any reader.
    pub fn from_reader<R: Read + 'static>(r: R, source: impl Into<String>) -> Self {
        Self::from_bufread(Box::new(BufReader::new(r)), source.into())
    }

    fn from_bufread(input: Box<dyn BufRead>, source: String) -> Self {
        TraceReader {
            input,
            buf: Vec::with_capacity(1024),
            line_no: 0,
            done: false,
            st: State::new(source),
        }
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

    /// The next line into `buf`, across buffer boundaries (the slow path).
    fn next_line(&mut self) -> Option<()> {
        self.buf.clear();
        let st = &mut self.st;
        match self.input.read_until(b'\n', &mut self.buf) {
            Ok(0) => {
                st.clean_end(self.line_no);
                None
            }
            Ok(_) if self.buf.last() != Some(&b'\n') => {
                st.truncated_line(self.line_no);
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

impl State {
    pub(crate) fn new(source: String) -> State {
        State {
            source,
            warnings: Vec::new(),
            bad_lines: 0,
            unknown_types: BTreeMap::new(),
            header_version: None,
            saw_end: false,
        }
    }

    /// The warnings of [`TraceReader::warnings`]: those met, then the skipped lines and types.
    pub(crate) fn report(&self) -> Vec<String> {
        let mut w = self.warnings.clone();
        if self.bad_lines > 0 {
            w.push(format!(
                "{}: skipped {} line(s) that are not valid records",
                self.source, self.bad_lines
            ));
        }
        for (t, n) in &self.unknown_types {
            w.push(format!(
                "{}: skipped {n} record(s) of unknown type '{t}' (written by a newer gpufl?)",
                self.source
            ));
        }
        w
    }

    /// Add what a later stretch of the same trace met (parsed on its own, e.g. on another thread).
    pub(crate) fn absorb(&mut self, later: State) {
        self.warnings.extend(later.warnings);
        self.bad_lines += later.bad_lines;
        for (t, n) in later.unknown_types {
            *self.unknown_types.entry(t).or_insert(0) += n;
        }
        if later.header_version.is_some() {
            self.header_version = later.header_version;
        }
        self.saw_end |= later.saw_end;
    }

    /// A clean end of input after `line_no` lines.
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

    /// The input ended inside the line after `line_no` complete lines.
    pub(crate) fn truncated_line(&mut self, line_no: u64) {
        self.warnings.push(format!(
            "{}: truncated: the last record (line {}) is incomplete and was dropped",
            self.source,
            line_no + 1
        ));
    }

    pub(crate) fn read_error(&mut self, line_no: u64, e: &std::io::Error) {
        self.warnings.push(format!(
            "{}: truncated or corrupt after line {line_no} ({e}); the records before it were read",
            self.source
        ));
    }

    pub(crate) fn parse_line(&mut self, line: &[u8]) -> Option<Record> {
        let line = trim_line(line);
        if line.is_empty() {
            return None;
        }
        // Kernels are most of a trace: parse the writer's exact shape by hand (serde_json otherwise).
        if let Some(k) = crate::fastpath::kernel(line) {
            return Some(Record::Kernel(k));
        }
        let tag: std::borrow::Cow<str> = match peek_tag(line) {
            Some(t) => t.into(),
            None => match serde_json::from_slice::<serde_json::Value>(line) {
                Ok(v) => match v.get("t").and_then(|t| t.as_str()) {
                    Some(t) => t.to_owned().into(),
                    None => {
                        self.bad_lines += 1;
                        return None;
                    }
                },
                Err(_) => {
                    self.bad_lines += 1;
                    return None;
                }
            },
        };
        let parsed = parse_known(&tag, line);
        match parsed {
            Some(Ok(rec)) => {
                if let Record::End(_) = &rec {
                    self.saw_end = true;
                }
                if let Record::Header(h) = &rec {
                    self.header_version = Some(h.version);
                    if h.version > FORMAT_VERSION {
                        self.warnings.push(format!(
                            "{}: trace format v{} is newer than this reader (v{FORMAT_VERSION}); reading what it knows",
                            self.source, h.version
                        ));
                    }
                }
                Some(rec)
            }
            Some(Err(_)) => {
                self.bad_lines += 1;
                None
            }
            None => {
                *self.unknown_types.entry(tag.into_owned()).or_insert(0) += 1;
                None
            }
        }
    }
}

impl Iterator for TraceReader {
    type Item = Record;

    fn next(&mut self) -> Option<Record> {
        while !self.done {
            // Fast path: a whole line inside the input's buffer is parsed where it lies.
            match self.input.fill_buf() {
                Ok(b) if !b.is_empty() => {
                    if let Some(nl) = memchr::memchr(b'\n', b) {
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
        "stream" => p(line, Record::Stream),
        "capture" => p(line, Record::Capture),
        "scope" => p(line, Record::Scope),
        "range" => p(line, Record::Range),
        "window" => p(line, Record::Window),
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
}

impl SessionReader {
    /// Open a session directory (see [`crate::session`]).
    pub fn open(dir: &Path) -> Result<Self, TraceError> {
        let files = crate::session::trace_files(dir)?;
        Ok(SessionReader {
            files: files.into_iter(),
            current: None,
            warnings: Vec::new(),
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
                let done = self
                    .current
                    .take()
                    .map(|c| c.warnings())
                    .unwrap_or_default();
                self.warnings.extend(done);
            }
            let path = self.files.next()?;
            match TraceReader::open(&path) {
                Ok(r) => self.current = Some(r),
                Err(e) => self.warnings.push(e.to_string()),
            }
        }
    }
}
