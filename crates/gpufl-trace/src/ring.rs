//! Decoding one zstd frame (a trace block) through a ring buffer the size of its window, handing
//! out its lines as they are decoded, for the parallel reader: a worker holds ~0.8 MiB for the
//! recorder's blocks (512 KiB window) instead of the whole decoded block (~12 MB for 50,000
//! kernels), so the memory of the blocks in flight does not grow with the block size, and each
//! line is parsed while it is still in the core's cache.
//!
//! zstd's buffer-less API (`ZSTD_decompressContinue`) decodes block after block next to the
//! previous one and wraps to the start of the ring as zstd's own streaming decoder does (the ring
//! of `ZSTD_decodingBufferSize_min` bytes keeps a whole window behind the block being decoded).
//! The frame's checksum is checked after its last block, as the one-call decoder checks it: the
//! caller drops everything it built from the lines of a frame that does not decode whole.

use crate::blocks::Repeat;
use std::ptr::NonNull;
use zstd::zstd_safe::zstd_sys as zs;

/// A zstd decoding context and the ring and line buffer reused from frame to frame.
pub(crate) struct Ring {
    dctx: NonNull<zs::ZSTD_DCtx>,
    ring: Vec<u8>,
    /// The start of a line that wrapped around the end of the ring.
    carry: Vec<u8>,
}

// The context is used by one thread at a time (`&mut self`), and zstd keeps no thread state.
unsafe impl Send for Ring {}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: created by ZSTD_createDCtx, freed once.
        unsafe {
            zs::ZSTD_freeDCtx(self.dctx.as_ptr());
        }
    }
}

/// What decoding a frame found (see [`Ring::lines`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Decoded {
    /// Decoded bytes.
    pub(crate) size: usize,
    /// Line ends.
    pub(crate) lines: u64,
    /// Empty, or ends with a line end.
    pub(crate) ends_line: bool,
    /// What [`crate::blocks::unrepeatable`] finds in the decoded bytes.
    pub(crate) repeat: Repeat,
}

fn is_error(code: usize) -> bool {
    // SAFETY: a pure function of its argument.
    unsafe { zs::ZSTD_isError(code) != 0 }
}

impl Ring {
    /// A context, or None when zstd cannot allocate one.
    pub(crate) fn new() -> Option<Ring> {
        // SAFETY: plain constructor; null on failure.
        let dctx = NonNull::new(unsafe { zs::ZSTD_createDCtx() })?;
        Some(Ring {
            dctx,
            ring: Vec::new(),
            carry: Vec::new(),
        })
    }

    /// Decode the ordinary frame `frame` (exactly one frame, see [`crate::blocks::frame_len`]),
    /// calling `line` with each complete line (without its line end; a line that wrapped around
    /// the ring comes from a copy) and the number of bytes decoded before it, in order. `Some`
    /// when the frame decodes whole, checksum checked, to at most `limit` bytes, as
    /// [`crate::blocks::decode_whole`] would decode it; None otherwise (the lines handed out so
    /// far are to be dropped).
    pub(crate) fn lines(
        &mut self,
        frame: &[u8],
        limit: usize,
        mut line: impl FnMut(&[u8], usize),
    ) -> Option<Decoded> {
        let limit = limit.min(crate::blocks::HOLD_BYTES - 1);
        if !crate::blocks::window_ok(frame) {
            return None;
        }
        let mut zfh = zs::ZSTD_FrameHeader {
            frameContentSize: 0,
            windowSize: 0,
            blockSizeMax: 0,
            frameType: zs::ZSTD_FrameType_e::ZSTD_frame,
            headerSize: 0,
            dictID: 0,
            checksumFlag: 0,
            _reserved1: 0,
            _reserved2: 0,
        };
        // SAFETY: `frame` is readable for its length; `zfh` is written on success only.
        let r = unsafe { zs::ZSTD_getFrameHeader(&mut zfh, frame.as_ptr().cast(), frame.len()) };
        if r != 0 || zfh.frameType != zs::ZSTD_FrameType_e::ZSTD_frame {
            return None;
        }
        let content = zfh.frameContentSize;
        if content != zs::ZSTD_CONTENTSIZE_UNKNOWN as u64 && content > limit as u64 {
            return None;
        }
        // SAFETY: a pure function of its arguments.
        let min = unsafe { zs::ZSTD_decodingBufferSize_min(zfh.windowSize, content) };
        if is_error(min) {
            return None;
        }
        // A window larger than the block limit (zstd's highest levels) is not needed whole: the
        // frame is decoded without wrapping, at most `limit` bytes and one block more.
        let whole = crate::blocks::HOLD_BYTES + zs::ZSTD_BLOCKSIZE_MAX as usize;
        let (size, wraps) = if min > whole {
            (whole, false)
        } else {
            (min, (min as u64) < content)
        };
        // zstd writes the ring before reading it: zeroed once per size only (a `Vec` of
        // initialized bytes keeps this module free of uninitialized memory); a ring much larger
        // than needed is given back.
        if self.ring.len() < size || self.ring.len() > 4 * size.max(1 << 20) {
            self.ring = vec![0; size];
        }
        let dctx = self.dctx.as_ptr();
        // SAFETY: a valid context.
        if is_error(unsafe { zs::ZSTD_decompressBegin(dctx) }) {
            return None;
        }
        let block_max = zfh.blockSizeMax as usize;
        let ring_len = size;
        let mut marks = Marks::default();
        self.carry.clear();
        let (mut src, mut pos, mut start, mut total, mut lines) = (0usize, 0usize, 0usize, 0, 0);
        // Bytes decoded before the line being read.
        let mut line_at = 0;
        loop {
            // SAFETY: a valid context.
            let need = unsafe { zs::ZSTD_nextSrcSizeToDecompress(dctx) };
            if need == 0 {
                break;
            }
            let rest = frame.get(src..src.checked_add(need)?)?;
            // SAFETY: `pos <= ring_len`; zstd writes at most `ring_len - pos` bytes there and
            // reads the window behind it, all within the ring, which does not move while the
            // frame decodes; `rest` is readable for `need` bytes.
            let n = unsafe {
                zs::ZSTD_decompressContinue(
                    dctx,
                    self.ring.as_mut_ptr().add(pos).cast(),
                    ring_len - pos,
                    rest.as_ptr().cast(),
                    need,
                )
            };
            if is_error(n) {
                return None;
            }
            src += need;
            if n == 0 {
                continue;
            }
            total += n;
            if total > limit {
                return None;
            }
            let new = &self.ring[pos..pos + n];
            marks.feed(new);
            let mut at = start;
            for nl in memchr::memchr_iter(b'\n', new) {
                let end = pos + nl;
                lines += 1;
                if self.carry.is_empty() {
                    line(&self.ring[at..end], line_at);
                } else {
                    self.carry.extend_from_slice(&self.ring[at..end]);
                    line(&self.carry, line_at);
                    self.carry.clear();
                }
                at = end + 1;
                line_at = total - n + nl + 1;
            }
            pos += n;
            start = at;
            if wraps && pos + block_max > ring_len {
                // The next block is decoded at the start of the ring: keep the line begun.
                self.carry.extend_from_slice(&self.ring[start..pos]);
                pos = 0;
                start = 0;
            }
        }
        if src != frame.len() {
            return None;
        }
        Some(Decoded {
            size: total,
            lines,
            ends_line: start == pos && self.carry.is_empty(),
            repeat: marks.repeat(),
        })
    }
}

/// What [`crate::blocks::unrepeatable`] looks for.
const NEVER: [&[u8]; 5] = [
    b"\"start\":",
    b"\"ts\":",
    b"{\"t\":\"str\"",
    b"{\"t\":\"frame\"",
    b"{\"t\":\"stack\"",
];
const HEADER: &[u8] = b"{\"t\":\"header\"";

/// Bytes of the previous pieces kept to find a mark that spans two pieces (the longest mark less
/// one byte).
const KEEP: usize = 12;

/// [`crate::blocks::unrepeatable`] over a block given piece by piece.
#[derive(Default)]
struct Marks {
    never: bool,
    header: bool,
    /// The last bytes fed (up to [`KEEP`]), and how many.
    tail: [u8; KEEP],
    kept: usize,
}

impl Marks {
    fn scan(&mut self, b: &[u8]) {
        if NEVER.iter().any(|m| memchr::memmem::find(b, m).is_some()) {
            self.never = true;
        } else if !self.header && memchr::memmem::find(b, HEADER).is_some() {
            self.header = true;
        }
    }

    fn feed(&mut self, piece: &[u8]) {
        if self.never || piece.is_empty() {
            return;
        }
        // A mark across the previous pieces and this one lies in their last and its first
        // KEEP bytes.
        let mut joint = [0u8; 2 * KEEP];
        let head = piece.len().min(KEEP);
        joint[..self.kept].copy_from_slice(&self.tail[..self.kept]);
        joint[self.kept..self.kept + head].copy_from_slice(&piece[..head]);
        self.scan(&joint[..self.kept + head]);
        self.scan(piece);
        // Keep the last KEEP bytes of everything fed.
        if piece.len() >= KEEP {
            self.tail.copy_from_slice(&piece[piece.len() - KEEP..]);
            self.kept = KEEP;
        } else {
            // `joint` holds the kept bytes then the whole piece.
            let all = self.kept + head;
            let keep = all.min(KEEP);
            self.tail[..keep].copy_from_slice(&joint[all - keep..all]);
            self.kept = keep;
        }
    }

    fn repeat(&self) -> Repeat {
        if self.never {
            Repeat::Never
        } else if self.header {
            Repeat::Header
        } else {
            Repeat::Free
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::{decode_whole, new_dctx, unrepeatable};

    fn marks_in_pieces(b: &[u8], cuts: &[usize]) -> Repeat {
        let mut m = Marks::default();
        let mut at = 0;
        for &c in cuts.iter().chain([b.len()].iter()) {
            let c = c.min(b.len()).max(at);
            m.feed(&b[at..c]);
            at = c;
        }
        m.repeat()
    }

    #[test]
    fn marks_found_in_pieces_are_those_of_the_whole() {
        let texts: [&[u8]; 6] = [
            b"{\"t\":\"dropped\",\"n\":3}\n{\"t\":\"header\",\"x\":1}\n",
            b"{\"t\":\"notice\"}\n{\"t\":\"sync\",\"start\":12}\n",
            b"xx{\"t\":\"stack\",\"id\":1}",
            b"{\"t\":\"stream\",\"id\":2}\n{\"t\":\"stream\",\"id\":3}\n",
            b"\"ts\":",
            b"{\"t\":\"header\"{\"t\":\"frame\"",
        ];
        for t in texts {
            let whole = unrepeatable(t);
            for a in 0..=t.len() {
                for b in a..=t.len() {
                    let cuts = [a, b, b + 1, b + 3];
                    assert_eq!(marks_in_pieces(t, &cuts), whole, "{t:?} cut at {cuts:?}");
                }
            }
            // One byte at a time.
            let ones: Vec<usize> = (1..t.len()).collect();
            assert_eq!(marks_in_pieces(t, &ones), whole);
        }
    }

    /// Lines of a frame decoded whole.
    fn whole_lines(frame: &[u8]) -> Option<(Vec<Vec<u8>>, usize)> {
        let mut out = Vec::new();
        if !decode_whole(&mut new_dctx(), frame, usize::MAX, &mut out) {
            return None;
        }
        let lines = out
            .split_inclusive(|&c| c == b'\n')
            .filter(|l| l.ends_with(b"\n"))
            .map(|l| l[..l.len() - 1].to_vec())
            .collect();
        Some((lines, out.len()))
    }

    fn ring_lines(ring: &mut Ring, frame: &[u8]) -> Option<(Vec<Vec<u8>>, Decoded)> {
        let mut lines = Vec::new();
        let mut at = 0;
        let d = ring.lines(frame, usize::MAX, |l, before| {
            assert_eq!(before, at, "bytes before the line");
            at += l.len() + 1;
            lines.push(l.to_vec())
        })?;
        Some((lines, d))
    }

    /// A frame of `text` compressed with a small window (the ring wraps many times).
    fn frame(text: &[u8], window_log: u32, pledge: bool) -> Vec<u8> {
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        enc.window_log(window_log).unwrap();
        enc.include_checksum(true).unwrap();
        if pledge {
            enc.set_pledged_src_size(Some(text.len() as u64)).unwrap();
        }
        std::io::Write::write_all(&mut enc, text).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn ring_lines_are_the_whole_blocks_lines() {
        let mut ring = Ring::new().unwrap();
        let mut text = Vec::new();
        let mut x = 7u64;
        for i in 0..40_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Lines of varied length, some long (they wrap around the ring), some empty.
            let len = match i % 1000 {
                0 => 70_000,
                1 => 0,
                _ => (x % 300) as usize,
            };
            text.extend((0..len).map(|j| b'a' + ((x >> (j % 50)) % 26) as u8));
            text.push(b'\n');
        }
        for (cut, pledge, wlog) in [
            (0, false, 10),
            (3, false, 10),
            (0, true, 11),
            (0, false, 19),
        ] {
            let t = &text[..text.len() - cut];
            let f = frame(t, wlog, pledge);
            let (want, size) = whole_lines(&f).unwrap();
            let (got, d) = ring_lines(&mut ring, &f).unwrap();
            assert_eq!(got.len(), want.len());
            assert!(got == want, "cut {cut} window {wlog}");
            assert_eq!(d.size, size);
            assert_eq!(d.lines, want.len() as u64);
            assert_eq!(d.ends_line, cut == 0);
            assert_eq!(d.repeat, unrepeatable(t));
        }
    }

    #[test]
    fn damaged_or_too_large_frames_do_not_decode() {
        let mut ring = Ring::new().unwrap();
        let text: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("{{\"t\":\"sync\",\"start\":{i}}}\n").into_bytes())
            .collect();
        let f = frame(&text, 12, false);
        assert!(ring_lines(&mut ring, &f).is_some());
        // Damage anywhere after the header: the block is not taken (checksum, or corrupt data).
        for at in [f.len() - 1, f.len() - 5, f.len() / 2, 20] {
            let mut d = f.clone();
            d[at] ^= 0x55;
            assert_eq!(
                ring_lines(&mut ring, &d).is_some(),
                whole_lines(&d).is_some(),
                "damage at {at}"
            );
        }
        // Cut short.
        assert!(ring_lines(&mut ring, &f[..f.len() - 3]).is_none());
        // Over the limit.
        assert!(ring.lines(&f, text.len() - 1, |_, _| {}).is_none());
        assert!(ring.lines(&f, text.len(), |_, _| {}).is_some());
        // The context is reused after a failure.
        assert_eq!(ring_lines(&mut ring, &f).unwrap().0.len(), 200_000);
    }
}
