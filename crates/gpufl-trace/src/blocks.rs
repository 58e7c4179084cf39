//! Decoding the zstd blocks of a trace file, one whole block at a time (streaming only the rare
//! block too large to hold), within the reader's [`ReadLimits`].

use crate::limits::{mib, ReadLimits, ENV_MAX_BLOCK_MB, ENV_MAX_RATIO, ENV_MAX_SESSION_MB};
use std::collections::HashSet;
use std::hash::Hasher;
use std::io::{BufRead, Read};
use std::sync::{Arc, Mutex};

/// The first four bytes of every zstd frame.
pub(crate) const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Blocks that decode to at most this many bytes are held whole and released only once their
/// checksum matched; a larger block (never written by the recorder, whose blocks hold 500 ms of
/// records) is released as it decodes, so memory stays bounded whatever a frame declares.
pub(crate) const HOLD_BYTES: usize = 16 << 20;

/// Chunk of a streamed block released at a time.
const STREAM_CHUNK: usize = 1 << 20;

/// Largest zstd window accepted (log2): 32 MiB. The recorder's level 1 uses 512 KiB; zstd's own
/// levels up to 19 stay within 8 MiB. A frame asking for more is refused as corrupt instead of
/// allocating its window.
const WINDOW_LOG_MAX: u32 = 25;

/// (compressed length, hash of the compressed bytes) of the blocks seen in a session, to tell a
/// block seen twice (a file concatenated with itself, a copied file).
pub(crate) type BlockSet = Arc<Mutex<HashSet<(u64, u64)>>>;

/// Decodes a sequence of zstd frames ("blocks") one at a time and releases a block's bytes only once
/// the whole block decoded (and its checksum, when it has one, matched): a corrupt block yields none
/// of its records instead of altered ones. A block cut short by the end of the file (a crash while
/// it was being written) yields what decoded before the cut, then an `UnexpectedEof` error.
/// A block that decodes to more than [`HOLD_BYTES`] is released as it decodes; one over
/// `limits.max_block_bytes`, or decoding past the session's budget, ends reading with an error.
/// A block whose compressed bytes equal an earlier block's of the session (and that holds a record
/// that cannot repeat: see [`unrepeatable`]) is skipped with a warning.
pub(crate) struct FrameReader<R: BufRead> {
    input: R,
    dctx: zstd::zstd_safe::DCtx<'static>,
    out: Vec<u8>,
    pos: usize,
    blocks: u64,
    pending: Option<std::io::Error>,
    done: bool,
    limits: ReadLimits,
    /// Decompressed bytes this reader may produce (what is left of the session's budget, or the
    /// file's own by its size when smaller: `ratio_bound`).
    budget: u64,
    ratio_bound: bool,
    /// Decompressed bytes produced so far.
    decoded: u64,
    /// Inside a block too large to hold: its bytes decoded so far.
    streaming: Option<u64>,
    seen: BlockSet,
    duplicates: u64,
    warnings: Vec<String>,
}

/// A read limit was reached (carried inside an `io::Error` to the reader, which words it so).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct LimitReached(pub(crate) String);

fn limit_error(msg: String) -> std::io::Error {
    std::io::Error::other(LimitReached(msg))
}

impl<R: BufRead> FrameReader<R> {
    pub(crate) fn new(
        input: R,
        limits: ReadLimits,
        (budget, ratio_bound): (u64, bool),
        seen: BlockSet,
    ) -> Self {
        let mut dctx = zstd::zstd_safe::DCtx::create();
        let _ = dctx.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(WINDOW_LOG_MAX));
        FrameReader {
            input,
            dctx,
            out: Vec::new(),
            pos: 0,
            blocks: 0,
            pending: None,
            done: false,
            limits,
            budget,
            ratio_bound,
            decoded: 0,
            streaming: None,
            seen,
            duplicates: 0,
            warnings: Vec::new(),
        }
    }

    /// Decompressed bytes produced so far.
    pub(crate) fn decoded(&self) -> u64 {
        self.decoded
    }

    /// Warnings of blocks skipped so far (duplicates).
    pub(crate) fn warnings(&self) -> Vec<String> {
        let mut w = self.warnings.clone();
        if self.duplicates > 0 {
            w.push(format!(
                "{} block(s) identical to an earlier block of the session (a file concatenated with itself, or copied?) were skipped",
                self.duplicates
            ));
        }
        w
    }

    /// Count `n` more decompressed bytes of block `block` (`in_block` of it so far); an error
    /// once a limit is passed.
    fn account(&mut self, n: usize, block: u64, in_block: u64) -> std::io::Result<()> {
        self.decoded += n as u64;
        if in_block > self.limits.max_block_bytes {
            return Err(limit_error(format!(
                "block {block} decompresses to more than {}, the limit per block ({ENV_MAX_BLOCK_MB} raises it): reading stopped there",
                mib(self.limits.max_block_bytes)
            )));
        }
        if self.decoded > self.budget && self.ratio_bound {
            return Err(limit_error(format!(
                "the file decompresses to more than {}, the limit per file ({} times its size, at least {}; {ENV_MAX_RATIO} raises it): reading stopped in block {block}",
                mib(self.budget),
                self.limits.max_ratio,
                mib(crate::limits::RATIO_FLOOR)
            )));
        }
        if self.decoded > self.budget {
            return Err(limit_error(format!(
                "the session decompresses to more than {}, the limit per session ({ENV_MAX_SESSION_MB} raises it): reading stopped in block {block}",
                mib(self.limits.max_session_bytes)
            )));
        }
        Ok(())
    }

    /// Decode the next block into `out` (into its spare capacity: nothing is zeroed or copied
    /// twice); Ok(false) at a clean end of input.
    fn next_block(&mut self) -> std::io::Result<bool> {
        use std::io::{Error, ErrorKind};
        use zstd::zstd_safe::{get_error_name, InBuffer, OutBuffer, ResetDirective};
        if self.streaming.is_some() {
            return self.continue_stream();
        }
        self.out.clear();
        self.pos = 0;
        let head = self.input.fill_buf()?;
        if head.is_empty() {
            return Ok(false);
        }
        let n = self.blocks + 1;
        // A frame that declares its size: refuse one over the limit before decoding anything.
        if let Ok(Some(size)) = zstd::zstd_safe::get_frame_content_size(head) {
            self.account(0, n, size)?;
        }
        let corrupt = |out: &mut Vec<u8>, why: &dyn std::fmt::Display, kind| {
            out.clear();
            Err(Error::new(
                kind,
                format!("block {n} is corrupt and was dropped: {why}"),
            ))
        };
        if let Err(code) = self.dctx.reset(ResetDirective::SessionOnly) {
            return corrupt(&mut self.out, &get_error_name(code), ErrorKind::Other);
        }
        let mut hash = std::collections::hash_map::DefaultHasher::new();
        let mut compressed = 0u64;
        loop {
            let input = match self.input.fill_buf() {
                Ok(b) => b,
                Err(e) => return corrupt(&mut self.out, &e, e.kind()),
            };
            if input.is_empty() {
                // Truncated: zstd only releases whole decoded blocks, so what came out is intact.
                self.pending = Some(Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("block {n} is incomplete: incomplete frame"),
                ));
                return Ok(true);
            }
            if self.out.capacity() - self.out.len() < 1 << 16 {
                self.out.reserve(self.out.capacity().max(1 << 17));
            }
            let mut inb = InBuffer::around(input);
            let len = self.out.len();
            let mut outb = OutBuffer::around_pos(&mut self.out, len);
            let res = self.dctx.decompress_stream(&mut outb, &mut inb);
            let consumed = inb.pos();
            hash.write(&input[..consumed]);
            compressed += consumed as u64;
            self.input.consume(consumed);
            let produced = self.out.len() - len;
            if let Err(e) = self.account(produced, n, self.out.len() as u64) {
                self.out.clear();
                return Err(e);
            }
            match res {
                Ok(0) => {
                    self.blocks = n;
                    let key = (compressed, hash.finish());
                    let first = self.seen.lock().map_or(true, |mut s| s.insert(key));
                    if !first && unrepeatable(&self.out) {
                        self.duplicates += 1;
                        self.out.clear();
                    }
                    return Ok(true);
                }
                Ok(_) if self.out.len() >= HOLD_BYTES => {
                    // Too large to hold: release what decoded, go on as it decodes.
                    self.streaming = Some(self.out.len() as u64);
                    return Ok(true);
                }
                Ok(_) => {}
                Err(code) => {
                    return corrupt(&mut self.out, &get_error_name(code), ErrorKind::InvalidData)
                }
            }
        }
    }

    /// The next chunk of a block too large to hold.
    fn continue_stream(&mut self) -> std::io::Result<bool> {
        use std::io::{Error, ErrorKind};
        use zstd::zstd_safe::{get_error_name, InBuffer, OutBuffer};
        self.out.clear();
        self.pos = 0;
        let n = self.blocks + 1;
        let mut in_block = self.streaming.unwrap_or(0);
        let corrupt = |why: &dyn std::fmt::Display, kind, done: u64| {
            Err(Error::new(
                kind,
                format!(
                    "block {n} is corrupt after its first {} (read unverified: a block over {} is read as it decodes); the rest was dropped: {why}",
                    mib(done),
                    mib(HOLD_BYTES as u64)
                ),
            ))
        };
        loop {
            let input = match self.input.fill_buf() {
                Ok(b) => b,
                Err(e) => return corrupt(&e, e.kind(), in_block),
            };
            if input.is_empty() {
                self.streaming = None;
                self.pending = Some(Error::new(
                    ErrorKind::UnexpectedEof,
                    format!("block {n} is incomplete: incomplete frame"),
                ));
                return Ok(true);
            }
            if self.out.capacity() - self.out.len() < 1 << 16 {
                self.out.reserve(STREAM_CHUNK);
            }
            let mut inb = InBuffer::around(input);
            let len = self.out.len();
            let mut outb = OutBuffer::around_pos(&mut self.out, len);
            let res = self.dctx.decompress_stream(&mut outb, &mut inb);
            let consumed = inb.pos();
            self.input.consume(consumed);
            let produced = self.out.len() - len;
            in_block += produced as u64;
            self.streaming = Some(in_block);
            if let Err(e) = self.account(produced, n, in_block) {
                self.streaming = None;
                self.out.clear();
                return Err(e);
            }
            match res {
                Ok(0) => {
                    self.streaming = None;
                    self.blocks = n;
                    return Ok(true);
                }
                Ok(_) if self.out.len() >= STREAM_CHUNK => return Ok(true),
                Ok(_) => {}
                Err(code) => {
                    self.streaming = None;
                    self.out.clear();
                    return corrupt(&get_error_name(code), ErrorKind::InvalidData, in_block);
                }
            }
        }
    }
}

/// Whether a block's content can only have been written once: it holds a timed record (`start`,
/// `ts`), an interned definition or a header. A block of untimed records only (`dropped`,
/// `notice`, `stream`, `function`) may legitimately repeat byte for byte.
fn unrepeatable(block: &[u8]) -> bool {
    const MARKS: [&[u8]; 6] = [
        b"\"start\":",
        b"\"ts\":",
        b"{\"t\":\"str\"",
        b"{\"t\":\"frame\"",
        b"{\"t\":\"stack\"",
        b"{\"t\":\"header\"",
    ];
    MARKS
        .iter()
        .any(|m| memchr::memmem::find(block, m).is_some())
}

impl<R: BufRead> BufRead for FrameReader<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        loop {
            if self.pos < self.out.len() {
                return Ok(&self.out[self.pos..]);
            }
            if let Some(e) = self.pending.take() {
                self.done = true;
                return Err(e);
            }
            if self.done {
                return Ok(&[]);
            }
            match self.next_block() {
                Ok(true) => {}
                Ok(false) => {
                    self.done = true;
                    return Ok(&[]);
                }
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            }
        }
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.out.len());
    }
}

impl<R: BufRead> Read for FrameReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}
