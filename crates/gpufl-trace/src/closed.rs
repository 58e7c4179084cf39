//! The closed prefix of a trace file: the bytes up to the end of its last complete block, what can
//! be copied (uploaded) while the recorder is still writing the file, or after it died in the
//! middle of a block.
//!
//! Only the zstd framing is read (frame header, then the 3-byte header of each of the frame's
//! blocks, whose contents are skipped by seeking, then the checksum): nothing is decompressed or
//! even read of the blocks' contents, so the work is one small read per zstd block (at most
//! 128 KiB of compressed data each). A plain NDJSON file (first byte `{`)
//! ends at its last line end.

use crate::error::TraceError;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// The first four bytes of a zstd frame, little endian.
const ZSTD_MAGIC: u32 = 0xFD2F_B528;

/// A skippable frame's magic number is this with any low nibble.
const SKIPPABLE_MAGIC: u32 = 0x184D_2A50;

/// The largest block a zstd frame may hold (`Block_Maximum_Size`): the size of a compressed or raw
/// block's content, and what an RLE block decodes to.
const BLOCK_MAX: u64 = 128 << 10;

/// Bytes read at a time when a plain NDJSON file is searched backwards for its last line end.
const PLAIN_CHUNK: u64 = 64 << 10;

/// The length of the prefix of the trace file at `path` that ends at the end of its last complete
/// block (zstd frame): the whole file when it ends on a block boundary, else the end of the last
/// block before a block cut short (a recorder still writing it, or killed) or before bytes that are
/// not a zstd frame (those and everything after them are left out). 0 for a file whose first block
/// is incomplete, or that opens with neither a zstd frame nor `{`. A plain NDJSON file (first byte
/// `{`) ends after its last `\n`.
///
/// The file's length is taken once, when it is opened: bytes appended while it is walked are left
/// for a later call. Only regular files are opened (a FIFO is refused, as by the reader).
pub fn closed_len(path: &Path) -> Result<u64, TraceError> {
    Ok(open_closed(path)?.closed)
}

/// A trace file opened for copying its closed prefix (see [`open_closed`]).
#[derive(Debug)]
pub struct ClosedFile {
    /// The file, open for reading (its position is unspecified).
    pub file: std::fs::File,
    /// Its length when it was opened.
    pub len: u64,
    /// The length of its closed prefix ([`closed_len`]): bytes `[0, closed)` do not change while
    /// the recorder appends, so they can be read from `file` after the walk.
    pub closed: u64,
}

/// Open the trace file at `path` (a regular file only) and find its closed prefix, as
/// [`closed_len`] does, keeping the file open so the prefix can be read from the same file even if
/// the path is removed meanwhile (a rolling session deletes its oldest files).
pub fn open_closed(path: &Path) -> Result<ClosedFile, TraceError> {
    let mut file = crate::reader::open_regular(path)?;
    let io = |source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = file.metadata().map_err(io)?.len();
    let closed = closed_prefix_len(&mut file, len).map_err(io)?;
    Ok(ClosedFile { file, len, closed })
}

/// [`closed_len`] of the first `len` bytes of `input` (read from its start; `len` is not checked
/// against its real length, which may be longer: bytes past `len` are never read).
pub fn closed_prefix_len<R: Read + Seek>(input: R, len: u64) -> std::io::Result<u64> {
    let mut walk = Walk { r: input, len };
    let Some(first) = walk.read_at::<1>(0)? else {
        return Ok(0);
    };
    if first[0] == b'{' {
        return last_line_end(walk.r, len);
    }
    let mut end = 0;
    while end < len {
        match walk.frame_end(end)? {
            Some(next) => end = next,
            None => break,
        }
    }
    Ok(end)
}

/// The first `len` bytes of a reader, read in small pieces at given offsets.
struct Walk<R> {
    r: R,
    len: u64,
}

impl<R: Read + Seek> Walk<R> {
    /// The `N` bytes at `at`, None when fewer than `N` are left before `len` (or in the input).
    fn read_at<const N: usize>(&mut self, at: u64) -> std::io::Result<Option<[u8; N]>> {
        if self.len.saturating_sub(at) < N as u64 {
            return Ok(None);
        }
        self.r.seek(SeekFrom::Start(at))?;
        let mut b = [0u8; N];
        match self.r.read_exact(&mut b) {
            Ok(()) => Ok(Some(b)),
            // The input is shorter than `len` said (a file cut while it was walked).
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The end of the frame that starts at `at`, when it is whole within `len`; None when it is
    /// cut short or is not a frame (damage, garbage).
    fn frame_end(&mut self, at: u64) -> std::io::Result<Option<u64>> {
        let Some(magic) = self.read_at::<4>(at)? else {
            return Ok(None);
        };
        let magic = u32::from_le_bytes(magic);
        if magic & 0xFFFF_FFF0 == SKIPPABLE_MAGIC {
            let Some(size) = self.read_at::<4>(at + 4)? else {
                return Ok(None);
            };
            let end = at + 8 + u64::from(u32::from_le_bytes(size));
            return Ok((end <= self.len).then_some(end));
        }
        if magic != ZSTD_MAGIC {
            return Ok(None);
        }
        let Some([fhd]) = self.read_at::<1>(at + 4)? else {
            return Ok(None);
        };
        // Frame_Header_Descriptor: the reserved bit must be 0.
        if fhd & 0x08 != 0 {
            return Ok(None);
        }
        let single_segment = fhd & 0x20 != 0;
        let checksum = fhd & 0x04 != 0;
        let dict_id = [0u64, 1, 2, 4][usize::from(fhd & 0x03)];
        let fcs = match fhd >> 6 {
            0 if single_segment => 1,
            0 => 0,
            1 => 2,
            2 => 4,
            _ => 8,
        };
        let window = u64::from(!single_segment);
        let mut p = at + 5 + window + dict_id + fcs;
        loop {
            let Some(h) = self.read_at::<3>(p)? else {
                return Ok(None);
            };
            let h = u32::from(h[0]) | u32::from(h[1]) << 8 | u32::from(h[2]) << 16;
            let last = h & 1 != 0;
            let kind = (h >> 1) & 3;
            let size = u64::from(h >> 3);
            if kind == 3 || size > BLOCK_MAX {
                return Ok(None);
            }
            // An RLE block holds one byte, repeated `size` times when decoded.
            p += 3 + if kind == 1 { 1 } else { size };
            if p > self.len {
                return Ok(None);
            }
            if last {
                break;
            }
        }
        if checksum {
            p += 4;
        }
        Ok((p <= self.len).then_some(p))
    }
}

/// The end of the last line (just past its `\n`) of the first `len` bytes of `input`, 0 if none.
fn last_line_end<R: Read + Seek>(mut input: R, len: u64) -> std::io::Result<u64> {
    let mut end = len;
    let mut buf = vec![0u8; PLAIN_CHUNK as usize];
    while end > 0 {
        let start = end.saturating_sub(PLAIN_CHUNK);
        let chunk = &mut buf[..(end - start) as usize];
        input.seek(SeekFrom::Start(start))?;
        input.read_exact(chunk)?;
        if let Some(i) = memchr::memrchr(b'\n', chunk) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;
    use std::path::PathBuf;

    fn prefix(bytes: &[u8]) -> u64 {
        closed_prefix_len(Cursor::new(bytes), bytes.len() as u64).unwrap()
    }

    /// Every trace file of the bundled sessions.
    fn testdata_files() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
        let mut files = Vec::new();
        for s in crate::session::find_sessions(&root) {
            files.extend(crate::session::trace_files(&s).unwrap());
        }
        assert!(files.len() >= 20, "{} trace files", files.len());
        files
    }

    /// The ends of the frames of a whole file, as zstd itself finds them.
    fn frame_ends(bytes: &[u8]) -> Vec<u64> {
        let mut ends = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let n = zstd::zstd_safe::find_frame_compressed_size(&bytes[at..]).unwrap();
            at += n;
            ends.push(at as u64);
        }
        ends
    }

    #[test]
    fn a_whole_file_is_closed_to_its_end() {
        for f in testdata_files() {
            let len = std::fs::metadata(&f).unwrap().len();
            assert_eq!(closed_len(&f).unwrap(), len, "{}", f.display());
        }
    }

    /// Cut anywhere inside its last block, a file is closed at the end of the block before; the
    /// file's blocks are zstd's frames.
    #[test]
    fn a_file_cut_in_its_last_block_ends_at_the_block_before() {
        let mut cuts = 0;
        for f in testdata_files() {
            let bytes = std::fs::read(&f).unwrap();
            let ends = frame_ends(&bytes);
            let before = if ends.len() >= 2 {
                ends[ends.len() - 2]
            } else {
                0
            };
            for cut in before..bytes.len() as u64 {
                assert_eq!(
                    prefix(&bytes[..cut as usize]),
                    before,
                    "{} cut at {cut}",
                    f.display()
                );
                cuts += 1;
            }
        }
        assert!(cuts > 1000, "{cuts} cuts");
    }

    /// Cut at every offset of a whole (small) file: the end of the last frame before the cut.
    #[test]
    fn a_file_cut_anywhere_ends_at_the_last_whole_block() {
        let f = multi_block_file();
        let bytes = std::fs::read(&f).unwrap();
        let ends = frame_ends(&bytes);
        for cut in 0..=bytes.len() as u64 {
            let want = ends
                .iter()
                .copied()
                .filter(|&e| e <= cut)
                .max()
                .unwrap_or(0);
            assert_eq!(prefix(&bytes[..cut as usize]), want, "cut at {cut}");
        }
    }

    /// The bundled file with the most blocks.
    fn multi_block_file() -> PathBuf {
        testdata_files()
            .into_iter()
            .max_by_key(|f| frame_ends(&std::fs::read(f).unwrap()).len())
            .unwrap()
    }

    /// `len` bounds the walk: bytes past it are never counted (a file that grows while read).
    #[test]
    fn bytes_past_len_are_not_read() {
        let f = &multi_block_file();
        let bytes = std::fs::read(f).unwrap();
        let ends = frame_ends(&bytes);
        let len = ends[0] + 3;
        assert_eq!(
            closed_prefix_len(Cursor::new(&bytes), len).unwrap(),
            ends[0]
        );
    }

    /// Frames of other writers: without checksum, with the content size, an RLE block, a
    /// skippable frame, a dictionary id — each whole, and cut.
    #[test]
    fn other_frame_shapes() {
        let text = b"{\"t\":\"notice\"}\n".repeat(20_000);
        let mut file = Vec::new();
        // Content size, no checksum (bulk API), several 128 KiB blocks.
        file.extend(zstd::bulk::compress(&text, 3).unwrap());
        // Streaming with a checksum.
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        enc.include_checksum(true).unwrap();
        std::io::Write::write_all(&mut enc, &text[..1000]).unwrap();
        file.extend(enc.finish().unwrap());
        // A skippable frame of 5 bytes.
        file.extend([0x5A, 0x2A, 0x4D, 0x18, 5, 0, 0, 0, 1, 2, 3, 4, 5]);
        // An RLE block: 1,000 × 'a', single segment with a 2-byte content size, one block.
        let rle_len = 1000u32;
        let h = 1 | (1 << 1) | (rle_len << 3);
        let mut rle = vec![0x28, 0xB5, 0x2F, 0xFD, 0x60];
        rle.extend(((rle_len - 256) as u16).to_le_bytes());
        rle.extend([h as u8, (h >> 8) as u8, (h >> 16) as u8, b'a']);
        assert_eq!(zstd::decode_all(&rle[..]).unwrap(), vec![b'a'; 1000]);
        file.extend(&rle);
        // A frame with a 1-byte dictionary id and one empty raw block (zstd cannot decode it
        // without the dictionary, but its framing is whole).
        file.extend([0x28, 0xB5, 0x2F, 0xFD, 0x01, 0x00, 0x07, 0x01, 0x00, 0x00]);
        let ends = frame_ends(&file);
        assert_eq!(ends.len(), 5);
        assert_eq!(prefix(&file), file.len() as u64);
        for cut in 0..=file.len() as u64 {
            let want = ends
                .iter()
                .copied()
                .filter(|&e| e <= cut)
                .max()
                .unwrap_or(0);
            assert_eq!(prefix(&file[..cut as usize]), want, "cut at {cut}");
        }
    }

    #[test]
    fn garbage_is_not_closed() {
        assert_eq!(prefix(b""), 0);
        assert_eq!(prefix(b"\0"), 0);
        assert_eq!(prefix(b"not a trace at all\n"), 0);
        assert_eq!(prefix(&[0x28, 0xB5, 0x2F]), 0);
        // The reserved bit of the frame header.
        assert_eq!(prefix(&[0x28, 0xB5, 0x2F, 0xFD, 0x08, 0, 1, 0, 0]), 0);
        // A reserved block type, and a block over 128 KiB.
        assert_eq!(prefix(&[0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x00, 0x07, 0, 0]), 0);
        let big = ((BLOCK_MAX as u32 + 1) << 3) | 1;
        let mut f = vec![0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x00];
        f.extend(&big.to_le_bytes()[..3]);
        f.resize(f.len() + BLOCK_MAX as usize + 1, 0);
        assert_eq!(prefix(&f), 0);
        // Garbage after whole blocks: the blocks before it.
        let file = std::fs::read(&testdata_files()[0]).unwrap();
        let mut bad = file.clone();
        bad.extend(b"garbage after the last block");
        assert_eq!(prefix(&bad), file.len() as u64);
        // Garbage in the middle: the blocks before it only.
        let file = std::fs::read(multi_block_file()).unwrap();
        let ends = frame_ends(&file);
        let mut bad = file.clone();
        bad[ends[0] as usize] ^= 0xFF;
        assert_eq!(prefix(&bad), ends[0]);
    }

    /// Mutated files (bytes flipped, cut, inserted) never panic nor end past their length.
    #[test]
    fn mutated_files_never_panic() {
        let file = std::fs::read(multi_block_file()).unwrap();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2_000 {
            let mut f = file.clone();
            for _ in 0..1 + rand() % 8 {
                let at = (rand() % f.len() as u64) as usize;
                match rand() % 3 {
                    0 => f[at] = rand() as u8,
                    1 => f.truncate(at.max(1)),
                    _ => f.insert(at, rand() as u8),
                }
            }
            let n = prefix(&f);
            assert!(n <= f.len() as u64);
        }
    }

    /// A file the writer is still writing: the compressor has handed part of the open block to the
    /// file; the closed prefix ends at the last `end_block`, and reads back whole.
    #[test]
    fn a_file_being_written_ends_at_its_last_closed_block() {
        use crate::records::{Header, Notice, Record};
        let dir = std::env::temp_dir().join(format!("gpufl-closed-w-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace-0000.ndjson.zst");
        let file = std::fs::File::create(&path).unwrap();
        let mut w = crate::TraceWriter::new(file, &Header::default()).unwrap();
        let mut n = 0u64;
        let mut notices = |w: &mut crate::TraceWriter<std::fs::File>, k: u64| {
            for _ in 0..k {
                n += 1;
                let message = format!("notice {n} {}", n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
                w.write(&Record::Notice(Notice {
                    level: "info".into(),
                    message,
                }))
                .unwrap();
            }
        };
        w.end_block().unwrap();
        notices(&mut w, 20_000);
        w.end_block().unwrap();
        let closed = std::fs::metadata(&path).unwrap().len();
        assert_eq!(closed_len(&path).unwrap(), closed);
        // Enough for the compressor to write some of the open block out.
        notices(&mut w, 60_000);
        let len = std::fs::metadata(&path).unwrap().len();
        assert!(len > closed, "nothing of the open block written ({len})");
        assert_eq!(closed_len(&path).unwrap(), closed);
        // The closed prefix reads back: the header and every notice of the closed blocks.
        let bytes = std::fs::read(&path).unwrap();
        let text = zstd::decode_all(&bytes[..closed as usize]).unwrap();
        assert_eq!(text.iter().filter(|&&b| b == b'\n').count(), 1 + 20_000);
        w.finish(0, "shutdown").unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(closed_len(&path).unwrap(), len);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn plain_ndjson_ends_at_its_last_line_end() {
        assert_eq!(prefix(b"{\"t\":\"header\"}\n{\"t\":\"kern"), 15);
        assert_eq!(prefix(b"{\"t\":\"header\"}\n"), 15);
        assert_eq!(prefix(b"{\"t\":\"header\""), 0);
        let mut long = b"{}\n".to_vec();
        long.resize(3 + 3 * PLAIN_CHUNK as usize, b' ');
        assert_eq!(prefix(&long), 3);
    }

    #[test]
    fn a_fifo_is_refused() {
        let dir = std::env::temp_dir().join(format!("gpufl-closed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("trace-0000.ndjson.zst");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(closed_len(&fifo).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
