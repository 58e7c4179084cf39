//! Streaming writer: NDJSON lines, zstd-compressed in independent frames ("blocks").
//!
//! Interned records (`str`, `frame`, `stack`) are written by the `intern_*` methods the first time a
//! value is seen, so they always precede the first record that uses them. [`TraceWriter::end_block`]
//! closes the current zstd frame and flushes it to the underlying writer: a reader can decode every
//! closed block even if the process dies right after.

use crate::error::TraceError;
use crate::ids::{FrameId, StackId, StrId};
use crate::records::*;
use std::collections::HashMap;
use std::io::Write;

/// zstd level: fast, and still ~10x on this kind of text.
const ZSTD_LEVEL: i32 = 1;

/// Bytes of NDJSON gathered before they go to the compressor.
const PENDING_BYTES: usize = 64 * 1024;

/// A new zstd frame. Frames carry a content checksum (4 bytes each) so that a reader can tell a
/// damaged block from a good one instead of returning altered records.
fn new_encoder<W: Write>(out: W) -> std::io::Result<zstd::stream::write::Encoder<'static, W>> {
    let mut enc = zstd::stream::write::Encoder::new(out, ZSTD_LEVEL)?;
    enc.include_checksum(true)?;
    Ok(enc)
}

/// The content of a frame, without its id (the interning key).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FrameData {
    pub kind: FrameKind,
    pub module: Option<StrId>,
    pub offset: Option<u64>,
    pub func: Option<StrId>,
    pub file: Option<StrId>,
    pub line: Option<u32>,
    pub inlined: bool,
    /// Source text of the line, if the recorder read it.
    pub text: Option<StrId>,
}

/// Writes one trace file.
pub struct TraceWriter<W: Write> {
    enc: Option<zstd::stream::write::Encoder<'static, W>>,
    strings: HashMap<String, StrId>,
    frames: HashMap<FrameData, FrameId>,
    stacks: HashMap<(Vec<FrameId>, Option<u64>), StackId>,
    counts: Counts,
    /// NDJSON lines not yet handed to the compressor.
    pending: Vec<u8>,
    uncompressed_bytes: u64,
}

impl<W: Write> TraceWriter<W> {
    /// Start a trace: writes `header` as the first record.
    pub fn new(out: W, header: &Header) -> Result<Self, TraceError> {
        let enc = new_encoder(out)?;
        let mut w = TraceWriter {
            enc: Some(enc),
            strings: HashMap::new(),
            frames: HashMap::new(),
            stacks: HashMap::new(),
            counts: Counts::default(),
            pending: Vec::with_capacity(PENDING_BYTES + 4096),
            uncompressed_bytes: 0,
        };
        let mut h = header.clone();
        h.format = FORMAT_NAME.to_string();
        h.version = FORMAT_VERSION;
        w.write(&Record::Header(Box::new(h)))?;
        Ok(w)
    }

    /// Append one record. Lines gather in a buffer that goes to the compressor in chunks of
    /// [`PENDING_BYTES`] (one call per line costs more than compressing the line), so a record
    /// is in the file only after [`TraceWriter::end_block`] or [`TraceWriter::finish`].
    pub fn write(&mut self, rec: &Record) -> Result<(), TraceError> {
        if self.enc.is_none() {
            return Err(TraceError::Write(std::io::Error::other(
                "trace writer already finished",
            )));
        }
        let before = self.pending.len();
        match rec {
            Record::Kernel(k) => crate::fastwrite::kernel(&mut self.pending, k),
            Record::Api(a) => crate::fastwrite::api(&mut self.pending, a),
            _ => {
                if let Err(e) = serde_json::to_writer(&mut self.pending, rec) {
                    self.pending.truncate(before);
                    return Err(e.into());
                }
            }
        }
        self.pending.push(b'\n');
        self.counts.add(rec);
        self.uncompressed_bytes += (self.pending.len() - before) as u64;
        if self.pending.len() >= PENDING_BYTES {
            self.compress_pending()?;
        }
        Ok(())
    }

    /// Hand the gathered lines to the compressor.
    fn compress_pending(&mut self) -> Result<(), TraceError> {
        if let Some(enc) = self.enc.as_mut() {
            enc.write_all(&self.pending)?;
        }
        self.pending.clear();
        Ok(())
    }

    /// Id of `s`, writing a `str` record the first time.
    pub fn intern_str(&mut self, s: &str) -> Result<StrId, TraceError> {
        if let Some(id) = self.strings.get(s) {
            return Ok(*id);
        }
        let id = StrId(self.strings.len() as u32);
        self.strings.insert(s.to_owned(), id);
        self.write(&Record::Str(StrRecord {
            id,
            s: s.to_owned(),
        }))?;
        Ok(id)
    }

    /// Id of a frame, writing a `frame` record the first time.
    pub fn intern_frame(&mut self, f: FrameData) -> Result<FrameId, TraceError> {
        if let Some(id) = self.frames.get(&f) {
            return Ok(*id);
        }
        let id = FrameId(self.frames.len() as u32);
        let rec = Frame {
            id,
            kind: f.kind,
            module: f.module,
            offset: f.offset,
            func: f.func,
            file: f.file,
            line: f.line,
            inlined: f.inlined,
            text: f.text,
        };
        self.frames.insert(f, id);
        self.write(&Record::Frame(rec))?;
        Ok(id)
    }

    /// Id of a stack (frame ids, innermost first), writing a `stack` record the first time.
    pub fn intern_stack(&mut self, frames: &[FrameId]) -> Result<StackId, TraceError> {
        self.intern_stack_via(frames, None)
    }

    /// Id of a stack whose Python frames were read from thread `via_tid` (see [`Stack::via_tid`]),
    /// writing a `stack` record the first time.
    pub fn intern_stack_via(
        &mut self,
        frames: &[FrameId],
        via_tid: Option<u64>,
    ) -> Result<StackId, TraceError> {
        let key = (frames.to_vec(), via_tid);
        if let Some(id) = self.stacks.get(&key) {
            return Ok(*id);
        }
        let id = StackId(self.stacks.len() as u32);
        self.stacks.insert(key, id);
        self.write(&Record::Stack(Stack {
            id,
            frames: frames.to_vec(),
            via_tid,
        }))?;
        Ok(id)
    }

    /// Records written so far, by kind.
    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Bytes of NDJSON written so far (before compression).
    pub fn uncompressed_bytes(&self) -> u64 {
        self.uncompressed_bytes
    }

    /// Close the current zstd frame and flush it, so everything written so far survives a crash.
    pub fn end_block(&mut self) -> Result<(), TraceError> {
        self.compress_pending()?;
        let Some(enc) = self.enc.take() else {
            return Ok(());
        };
        let mut out = enc.finish()?;
        out.flush()?;
        self.enc = Some(new_encoder(out)?);
        Ok(())
    }

    /// Write the `end` record (with the final counts), close the last block and return the writer.
    pub fn finish(mut self, end_unix_ns: u64, reason: &str) -> Result<W, TraceError> {
        let mut counts = self.counts.clone();
        counts.add(&Record::End(End::default()));
        self.write(&Record::End(End {
            end_unix_ns,
            reason: reason.to_string(),
            counts,
        }))?;
        self.compress_pending()?;
        let enc = self.enc.take().ok_or_else(|| {
            TraceError::Write(std::io::Error::other("trace writer already finished"))
        })?;
        let mut out = enc.finish()?;
        out.flush()?;
        Ok(out)
    }
}
