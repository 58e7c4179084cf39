//! Decoding the zstd blocks of a trace file, one whole block at a time (streaming only the rare
//! block too large to hold), within the reader's [`ReadLimits`].

use crate::limits::{mib, ReadLimits, ENV_MAX_BLOCK_MB, ENV_MAX_RATIO, ENV_MAX_SESSION_MB};
use std::collections::HashSet;
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

/// A decoder context as the streaming decoder uses it.
pub(crate) fn new_dctx() -> zstd::zstd_safe::DCtx<'static> {
    let mut dctx = zstd::zstd_safe::DCtx::create();
    let _ = dctx.set_parameter(zstd::zstd_safe::DParameter::WindowLogMax(WINDOW_LOG_MAX));
    dctx
}

/// Decodes a sequence of zstd frames ("blocks") one at a time and releases a block's bytes only once
/// the whole block decoded (and its checksum, when it has one, matched): a corrupt block yields none
/// of its records instead of altered ones. A block cut short by the end of the file (a crash while
/// it was being written) yields what decoded before the cut, then an `UnexpectedEof` error.
/// A block that decodes to more than [`HOLD_BYTES`] is released as it decodes; one over
/// `limits.max_block_bytes`, or decoding past the session's budget, ends reading with an error.
/// A block whose compressed bytes equal an earlier block's of the session (and that holds a record
/// that cannot repeat: see [`unrepeatable`]) is skipped with a warning.
pub(crate) struct FrameReader<R: FrameInput> {
    input: R,
    dctx: zstd::zstd_safe::DCtx<'static>,
    out: Vec<u8>,
    pos: usize,
    pending: Option<std::io::Error>,
    done: bool,
    /// Inside a block too large to hold: its bytes decoded so far.
    streaming: Option<u64>,
    tally: Tally,
}

/// A read limit was reached (carried inside an `io::Error` to the reader, which words it so).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct LimitReached(pub(crate) String);

fn limit_error(msg: String) -> std::io::Error {
    std::io::Error::other(LimitReached(msg))
}

/// What [`FrameReader`] reads compressed bytes from: a [`BufRead`] that can also hold a whole
/// frame in its buffer, so an ordinary block is decoded in one call ([`decode_whole`]).
pub(crate) trait FrameInput: BufRead {
    /// At least `n` bytes from the current position in the buffer (fewer only at the end of the
    /// input).
    fn fill_at_least(&mut self, n: usize) -> std::io::Result<&[u8]>;
}

impl<T: AsRef<[u8]>> FrameInput for std::io::Cursor<T> {
    fn fill_at_least(&mut self, _n: usize) -> std::io::Result<&[u8]> {
        // Everything left is in memory already.
        self.fill_buf()
    }
}

/// A buffered reader whose buffer grows on request ([`FrameInput::fill_at_least`]) and moves
/// its unread bytes to the front when it refills, instead of returning them in pieces.
pub(crate) struct Window<R> {
    inner: R,
    buf: Vec<u8>,
    pos: usize,
    end: usize,
    eof: bool,
}

/// Bytes [`Window`] reads at a time.
const WINDOW_READ: usize = 1 << 20;

impl<R: std::io::Read> Window<R> {
    pub(crate) fn new(inner: R) -> Self {
        Window {
            inner,
            buf: Vec::new(),
            pos: 0,
            end: 0,
            eof: false,
        }
    }
}

impl<R> Window<R> {
    /// The reader (what was buffered is dropped).
    pub(crate) fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: std::io::Read> std::io::Read for Window<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl<R: std::io::Read> BufRead for Window<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        if self.pos == self.end {
            self.fill_at_least(1)?;
        }
        Ok(&self.buf[self.pos..self.end])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }
}

impl<R: std::io::Read> FrameInput for Window<R> {
    fn fill_at_least(&mut self, n: usize) -> std::io::Result<&[u8]> {
        if self.end - self.pos < n && !self.eof {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.pos = 0;
            let want = n.max(WINDOW_READ);
            if self.buf.len() < want {
                self.buf.resize(want, 0);
            }
            while self.end < n {
                if self.end == self.buf.len() {
                    let more = self.buf.len().max(WINDOW_READ);
                    self.buf.resize(self.buf.len() + more, 0);
                }
                match self.inner.read(&mut self.buf[self.end..]) {
                    Ok(0) => {
                        self.eof = true;
                        break;
                    }
                    Ok(k) => self.end += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(&self.buf[self.pos..self.end])
    }
}

/// Compressed bytes of the longest frame [`FrameReader`] tries to decode in one call (longer ones,
/// never written by the recorder, stream).
pub(crate) const WHOLE_MAX_COMPRESSED: usize = 16 << 20;

/// The compressed length of the ordinary zstd frame at the start of `bytes` (the whole frame in
/// `bytes`); None when there is none (another magic number, a frame cut short, damage).
pub(crate) fn frame_len(bytes: &[u8]) -> Option<usize> {
    if !bytes.starts_with(&ZSTD_MAGIC) {
        return None;
    }
    match zstd::zstd_safe::find_frame_compressed_size(bytes) {
        Ok(len) if len > 0 && len <= bytes.len() => Some(len),
        _ => None,
    }
}

/// Whether the streaming decoder accepts the window the frame at the start of `frame` asks for
/// (see [`WINDOW_LOG_MAX`]); a frame of one segment uses its content size as its window, and one
/// decoded whole is below [`HOLD_BYTES`].
pub(crate) fn window_ok(frame: &[u8]) -> bool {
    let Some(&fhd) = frame.get(4) else {
        return false;
    };
    if fhd & 0x20 != 0 {
        return true;
    }
    let Some(&wd) = frame.get(5) else {
        return false;
    };
    let log = 10 + u64::from(wd >> 3);
    if log > u64::from(WINDOW_LOG_MAX) {
        return false;
    }
    let base = 1u64 << log;
    base + (base / 8) * u64::from(wd & 7) <= 1 << WINDOW_LOG_MAX
}

/// Decode the ordinary frame `frame` (exactly one frame, see [`frame_len`]) in one call into
/// `out` (its contents replaced, its capacity reused), when it decodes without error to at most
/// `limit` bytes (below [`HOLD_BYTES`]) and the streaming decoder would take it: then what the
/// streaming decoder gives, block checksum checked. False (`out` empty) otherwise: the streaming
/// decoder is to decode it, with its errors and limits.
pub(crate) fn decode_whole(
    dctx: &mut zstd::zstd_safe::DCtx<'static>,
    frame: &[u8],
    limit: usize,
    out: &mut Vec<u8>,
) -> bool {
    use zstd::zstd_safe;
    out.clear();
    let limit = limit.min(HOLD_BYTES - 1);
    if !window_ok(frame) {
        return false;
    }
    let mut cap = match zstd_safe::get_frame_content_size(frame) {
        Ok(Some(n)) if n <= limit as u64 => n as usize,
        Ok(Some(_)) => return false,
        // Trace blocks decode to ~10-20 times their size.
        _ => out
            .capacity()
            .max(frame.len().saturating_mul(16))
            .min(limit),
    };
    loop {
        out.clear();
        out.reserve(cap);
        match dctx.decompress(out, frame) {
            Ok(n) if n <= limit => return true,
            Ok(_) => break,
            Err(code) => {
                let _ = dctx.reset(zstd_safe::ResetDirective::SessionOnly);
                let small = zstd_safe::get_error_name(code) == "Destination buffer is too small";
                if !small || cap >= limit {
                    break;
                }
                cap = cap.saturating_mul(2).min(limit);
            }
        }
    }
    out.clear();
    false
}

/// What the reader of a file has decoded and skipped: the state that crosses blocks, shared by the
/// sequential [`FrameReader`] and the parallel reader.
pub(crate) struct Tally {
    pub(crate) limits: ReadLimits,
    /// Decompressed bytes this reader may produce (what is left of the session's budget, or the
    /// file's own by its size when smaller: `ratio_bound`).
    budget: u64,
    ratio_bound: bool,
    /// Decompressed bytes produced so far.
    decoded: u64,
    /// Blocks decoded whole so far.
    pub(crate) blocks: u64,
    seen: BlockSet,
    duplicates: u64,
}

impl Tally {
    pub(crate) fn new(
        limits: ReadLimits,
        (budget, ratio_bound): (u64, bool),
        seen: BlockSet,
    ) -> Self {
        Tally {
            limits,
            budget,
            ratio_bound,
            decoded: 0,
            blocks: 0,
            seen,
            duplicates: 0,
        }
    }

    /// Decompressed bytes produced so far.
    pub(crate) fn decoded(&self) -> u64 {
        self.decoded
    }

    /// Warnings of blocks skipped so far (duplicates).
    pub(crate) fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.duplicates > 0 {
            w.push(format!(
                "{} block(s) identical to an earlier block of the session (a file concatenated with itself, or copied?) were skipped",
                self.duplicates
            ));
        }
        w
    }

    /// Take the next block, decoded whole elsewhere ([`decode_whole`]) from the compressed bytes
    /// `frame` to `size` bytes (`unrepeatable`: see [`unrepeatable`], needed only for a block seen
    /// before), as the streaming decoder would have taken it: Some(true) to read its bytes,
    /// Some(false) for a duplicate to skip, None (nothing counted) when it passes a limit, for the
    /// streaming decoder to stop there with its error.
    pub(crate) fn take_whole(
        &mut self,
        frame_len: usize,
        hash: u64,
        size: usize,
        unrepeatable: impl FnOnce() -> Repeat,
    ) -> Option<bool> {
        let size = size as u64;
        if size > self.limits.max_block_bytes || self.decoded + size > self.budget {
            return None;
        }
        self.decoded += size;
        self.blocks += 1;
        Some(self.first_or_repeat((frame_len as u64, hash), unrepeatable))
    }

    /// Whether a whole block with this key is to be read: false for a block seen earlier in the
    /// session that holds a record that cannot repeat (counted as a duplicate).
    fn first_or_repeat(&mut self, key: (u64, u64), unrepeatable: impl FnOnce() -> Repeat) -> bool {
        let first = self.seen.lock().map_or(true, |mut s| s.insert(key));
        // `blocks` counts this block already: 1 is the first block of this file.
        let opens_file = self.blocks == 1;
        let skip = match unrepeatable() {
            Repeat::Never => true,
            Repeat::Header => !opens_file,
            Repeat::Free => false,
        };
        if !first && skip {
            self.duplicates += 1;
            return false;
        }
        true
    }
}

/// The hash of a block's compressed bytes that, with their length, tells a block seen twice
/// (XXH3: a tenth of SipHash's time over the compressed bytes; keyless like the SipHash with fixed
/// keys it replaces, so neither resists a crafted collision, which at worst skips a block).
pub(crate) fn block_hash(frame: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(frame)
}

impl<R: FrameInput> FrameReader<R> {
    pub(crate) fn new(input: R, tally: Tally) -> Self {
        FrameReader {
            input,
            dctx: new_dctx(),
            out: Vec::new(),
            pos: 0,
            pending: None,
            done: false,
            streaming: None,
            tally,
        }
    }

    /// Decompressed bytes produced so far.
    pub(crate) fn decoded(&self) -> u64 {
        self.tally.decoded
    }

    /// Warnings of blocks skipped so far (duplicates).
    pub(crate) fn warnings(&self) -> Vec<String> {
        self.tally.warnings()
    }

    /// Count `n` more decompressed bytes of block `block` (`in_block` of it so far); an error
    /// once a limit is passed.
    fn account(&mut self, n: usize, block: u64, in_block: u64) -> std::io::Result<()> {
        let t = &mut self.tally;
        t.decoded += n as u64;
        if in_block > t.limits.max_block_bytes {
            return Err(limit_error(format!(
                "block {block} decompresses to more than {}, the limit per block ({ENV_MAX_BLOCK_MB} raises it): reading stopped there",
                mib(t.limits.max_block_bytes)
            )));
        }
        if t.decoded > t.budget && t.ratio_bound {
            return Err(limit_error(format!(
                "the file decompresses to more than {}, the limit per file ({} times its size, at least {}; {ENV_MAX_RATIO} raises it): reading stopped in block {block}",
                mib(t.budget),
                t.limits.max_ratio,
                mib(crate::limits::RATIO_FLOOR)
            )));
        }
        if t.decoded > t.budget {
            return Err(limit_error(format!(
                "the session decompresses to more than {}, the limit per session ({ENV_MAX_SESSION_MB} raises it): reading stopped in block {block}",
                mib(t.limits.max_session_bytes)
            )));
        }
        Ok(())
    }

    /// The next block decoded in one call, when it is an ordinary frame that lies whole in the
    /// input and passes no limit: Ok(true) with `out` holding its bytes (empty for a skipped
    /// duplicate) and the input past it. Ok(false) (nothing consumed or counted) leaves it to the
    /// streaming decoder, which gives the same bytes or meets the same limit or damage.
    fn next_whole(&mut self) -> std::io::Result<bool> {
        let mut want = 1 << 16;
        let len = loop {
            // An input error is left to the streaming decoder to meet and word.
            let Ok(head) = self.input.fill_at_least(want) else {
                return Ok(false);
            };
            if let Some(len) = frame_len(head) {
                break len;
            }
            if head.len() < want || want >= WHOLE_MAX_COMPRESSED || !head.starts_with(&ZSTD_MAGIC) {
                return Ok(false);
            }
            want = (want * 4).min(WHOLE_MAX_COMPRESSED);
        };
        let Ok(head) = self.input.fill_at_least(len) else {
            return Ok(false);
        };
        let frame = &head[..len];
        let limit = usize::try_from(self.tally.limits.max_block_bytes).unwrap_or(usize::MAX);
        if !decode_whole(&mut self.dctx, frame, limit, &mut self.out) {
            return Ok(false);
        }
        let out = &self.out;
        match self
            .tally
            .take_whole(len, block_hash(frame), out.len(), || unrepeatable(out))
        {
            None => {
                self.out.clear();
                Ok(false)
            }
            Some(read) => {
                if !read {
                    self.out.clear();
                }
                self.input.consume(len);
                Ok(true)
            }
        }
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
        if self.input.fill_buf()?.is_empty() {
            return Ok(false);
        }
        if self.next_whole()? {
            return Ok(true);
        }
        let head = self.input.fill_buf()?;
        let n = self.tally.blocks + 1;
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
        // The same hash as [`block_hash`] over the whole frame.
        let mut hash = twox_hash::XxHash3_64::new();
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
            std::hash::Hasher::write(&mut hash, &input[..consumed]);
            compressed += consumed as u64;
            self.input.consume(consumed);
            let produced = self.out.len() - len;
            if let Err(e) = self.account(produced, n, self.out.len() as u64) {
                self.out.clear();
                return Err(e);
            }
            match res {
                Ok(0) => {
                    self.tally.blocks = n;
                    let key = (compressed, std::hash::Hasher::finish(&hash));
                    let out = &self.out;
                    if !self.tally.first_or_repeat(key, || unrepeatable(out)) {
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
        let n = self.tally.blocks + 1;
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
                    self.tally.blocks = n;
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
/// `ts`) or an interned definition ([`Repeat::Never`]), or a header ([`Repeat::Header`]: the first
/// block of each file of a rolling session is its header and stream records, the same in every
/// file, so a header block repeats legitimately at the start of a file and nowhere else). A block
/// of untimed records only (`dropped`, `notice`, `stream`, `function`) may repeat byte for byte.
pub(crate) fn unrepeatable(block: &[u8]) -> Repeat {
    const MARKS: [&[u8]; 5] = [
        b"\"start\":",
        b"\"ts\":",
        b"{\"t\":\"str\"",
        b"{\"t\":\"frame\"",
        b"{\"t\":\"stack\"",
    ];
    if MARKS
        .iter()
        .any(|m| memchr::memmem::find(block, m).is_some())
    {
        Repeat::Never
    } else if memchr::memmem::find(block, b"{\"t\":\"header\"").is_some() {
        Repeat::Header
    } else {
        Repeat::Free
    }
}

/// What [`unrepeatable`] found in a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Repeat {
    /// Timed records or interned definitions: written once.
    Never,
    /// A header and untimed records: repeats only as the first block of a file.
    Header,
    /// Untimed records only.
    Free,
}

impl<R: FrameInput> BufRead for FrameReader<R> {
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

impl<R: FrameInput> Read for FrameReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block decoded whole and the same block streamed (hashed piece by piece as it is
    /// consumed) get one key, so a duplicate is found whichever way either was read.
    #[test]
    fn block_hash_in_pieces_is_the_hash_of_the_whole() {
        let frame: Vec<u8> = (0..100_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for cuts in [
            vec![],
            vec![1],
            vec![7, 64, 65, 240, 1024, 99_999],
            vec![50_000],
        ] {
            let mut h = twox_hash::XxHash3_64::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([frame.len()]) {
                std::hash::Hasher::write(&mut h, &frame[at..c]);
                at = c;
            }
            assert_eq!(std::hash::Hasher::finish(&h), block_hash(&frame));
        }
        assert_ne!(block_hash(&frame), block_hash(&frame[1..]));
    }
}
