//! Decoding the zstd blocks of a trace file, one whole block at a time.

use std::io::{BufRead, Read};

/// The first four bytes of every zstd frame.
pub(crate) const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Decodes a sequence of zstd frames ("blocks") one at a time and releases a block's bytes only once
/// the whole block decoded (and its checksum, when it has one, matched): a corrupt block yields none
/// of its records instead of altered ones. A block cut short by the end of the file (a crash while
/// it was being written) yields what decoded before the cut, then an `UnexpectedEof` error.
pub(crate) struct FrameReader<R: BufRead> {
    input: R,
    dctx: zstd::zstd_safe::DCtx<'static>,
    out: Vec<u8>,
    pos: usize,
    blocks: u64,
    pending: Option<std::io::Error>,
    done: bool,
}

impl<R: BufRead> FrameReader<R> {
    pub(crate) fn new(input: R) -> Self {
        FrameReader {
            input,
            dctx: zstd::zstd_safe::DCtx::create(),
            out: Vec::new(),
            pos: 0,
            blocks: 0,
            pending: None,
            done: false,
        }
    }

    /// Decode the next block into `out` (into its spare capacity: nothing is zeroed or copied
    /// twice); Ok(false) at a clean end of input.
    fn next_block(&mut self) -> std::io::Result<bool> {
        use std::io::{Error, ErrorKind};
        use zstd::zstd_safe::{get_error_name, InBuffer, OutBuffer, ResetDirective};
        self.out.clear();
        self.pos = 0;
        if self.input.fill_buf()?.is_empty() {
            return Ok(false);
        }
        let n = self.blocks + 1;
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
            self.input.consume(consumed);
            match res {
                Ok(0) => {
                    self.blocks = n;
                    return Ok(true);
                }
                Ok(_) => {}
                Err(code) => {
                    return corrupt(&mut self.out, &get_error_name(code), ErrorKind::InvalidData)
                }
            }
        }
    }
}

impl<R: BufRead> FrameReader<R> {
    /// Number the blocks of this input from `before + 1` (a stretch of a file whose first `before`
    /// blocks are decoded elsewhere), so errors name the same block as a reader of the whole file.
    pub(crate) fn blocks_before(mut self, before: u64) -> Self {
        self.blocks = before;
        self
    }

    /// The next block's bytes into `out` (its contents replaced, its capacity reused), with the
    /// errors and end of [`BufRead::fill_buf`]: Ok(false) at a clean end, a truncated block's bytes
    /// then its error at the next call, nothing of a corrupt block. Not to be mixed with `fill_buf`.
    pub(crate) fn read_block_into(&mut self, out: &mut Vec<u8>) -> std::io::Result<bool> {
        if let Some(e) = self.pending.take() {
            self.done = true;
            return Err(e);
        }
        if self.done {
            return Ok(false);
        }
        std::mem::swap(&mut self.out, out);
        let res = self.next_block();
        std::mem::swap(&mut self.out, out);
        self.out.clear();
        self.pos = 0;
        match res {
            Ok(true) => Ok(true),
            Ok(false) => {
                self.done = true;
                Ok(false)
            }
            Err(e) => {
                out.clear();
                self.done = true;
                Err(e)
            }
        }
    }
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
