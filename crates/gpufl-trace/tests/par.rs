//! The parallel reader yields exactly the records and warnings of the sequential one, with 1, 2, 4
//! and 7 threads: on every session of testdata/, on a generated multi-block trace, on damaged
//! copies of it (truncated, flipped bytes, a line split across two blocks, garbage after the last
//! block, plain NDJSON), and within the reader's limits (blocks too large to hold or over the
//! limit, decompression bombs, the per-file, per-session and per-line caps, duplicate blocks and
//! files, header and end-record problems).

use gpufl_trace::*;
use std::path::{Path, PathBuf};

const THREADS: [usize; 4] = [1, 2, 4, 7];

fn seq_bytes(bytes: &[u8]) -> Result<(Vec<Record>, Vec<String>), String> {
    let mut r = TraceReader::from_bytes(bytes.to_vec(), "t").map_err(|e| e.to_string())?;
    let recs: Vec<Record> = r.by_ref().collect();
    Ok((recs, r.warnings()))
}

fn par_bytes(bytes: &[u8], threads: usize) -> Result<(Vec<Record>, Vec<String>), String> {
    let mut r =
        ParTraceReader::from_bytes(bytes.to_vec(), "t", threads).map_err(|e| e.to_string())?;
    let recs: Vec<Record> = r.by_ref().collect();
    Ok((recs, r.warnings()))
}

fn seq_with(bytes: &[u8], limits: ReadLimits) -> Result<(Vec<Record>, Vec<String>), String> {
    let mut r =
        TraceReader::from_bytes_with(bytes.to_vec(), "t", limits).map_err(|e| e.to_string())?;
    let recs: Vec<Record> = r.by_ref().collect();
    Ok((recs, r.warnings()))
}

fn par_with(
    bytes: &[u8],
    limits: ReadLimits,
    threads: usize,
) -> Result<(Vec<Record>, Vec<String>), String> {
    let shared: SharedBytes = std::sync::Arc::new(bytes.to_vec());
    let mut r = ParTraceReader::from_shared_with(shared, "t", limits, threads)
        .map_err(|e| e.to_string())?;
    let recs: Vec<Record> = r.by_ref().collect();
    Ok((recs, r.warnings()))
}

/// Both readers agree on `bytes` within `limits` with every thread count; returns the
/// sequential result.
fn same_with(
    bytes: &[u8],
    limits: ReadLimits,
    what: &str,
) -> Result<(Vec<Record>, Vec<String>), String> {
    let want = seq_with(bytes, limits);
    for t in THREADS {
        let got = par_with(bytes, limits, t);
        match (&want, &got) {
            (Ok((wr, ww)), Ok((gr, gw))) => {
                assert_eq!(gr.len(), wr.len(), "{what}, {t} threads: record count");
                assert!(gr == wr, "{what}, {t} threads: records differ");
                assert_eq!(gw, ww, "{what}, {t} threads: warnings");
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "{what}, {t} threads: error"),
            _ => panic!("{what}, {t} threads: {want:?} vs {got:?}"),
        }
    }
    want
}

/// Both readers agree on `bytes` with every thread count; returns the sequential result.
fn same(bytes: &[u8], what: &str) -> Result<(Vec<Record>, Vec<String>), String> {
    let want = seq_bytes(bytes);
    for t in THREADS {
        let got = par_bytes(bytes, t);
        match (&want, &got) {
            (Ok((wr, ww)), Ok((gr, gw))) => {
                assert_eq!(gr.len(), wr.len(), "{what}, {t} threads: record count");
                for (i, (g, w)) in gr.iter().zip(wr).enumerate() {
                    assert_eq!(g, w, "{what}, {t} threads: record {i}");
                }
                assert_eq!(gw, ww, "{what}, {t} threads: warnings");
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "{what}, {t} threads: error"),
            _ => panic!("{what}, {t} threads: {want:?} vs {got:?}"),
        }
    }
    want
}

fn testdata_sessions() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
    let s = session::find_sessions(&root);
    assert!(s.len() >= 20, "testdata sessions: {}", s.len());
    s
}

#[test]
fn testdata_sessions_read_the_same_on_any_number_of_threads() {
    for dir in testdata_sessions() {
        let mut seq = SessionReader::open(&dir).unwrap();
        let want: Vec<Record> = seq.by_ref().collect();
        let want_w = seq.warnings();
        assert!(!want.is_empty(), "{}", dir.display());
        for t in THREADS {
            let mut par = ParSessionReader::open(&dir, t).unwrap();
            let got: Vec<Record> = par.by_ref().collect();
            assert!(
                got == want,
                "{}, {t} threads: records differ",
                dir.display()
            );
            assert_eq!(par.warnings(), want_w, "{}, {t} threads", dir.display());
        }
        for f in session::trace_files(&dir).unwrap() {
            same(&std::fs::read(&f).unwrap(), &f.display().to_string()).unwrap();
            let mut r = ParTraceReader::open(&f, 2).unwrap();
            r.by_ref().for_each(drop);
            assert!(!r.is_sequential(), "{}: read in parallel", f.display());
        }
    }
}

/// A trace of `n` records in blocks of `per_block` records: kernels, syncs with stacks, copies,
/// strings interned along the way (so some blocks define ids that later blocks use).
fn generated(n: usize, per_block: usize) -> Vec<u8> {
    let header = Header {
        session_id: "par-1-20261125T000000Z".into(),
        app_name: "par".into(),
        ..Header::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    let module = w.intern_str("/usr/lib/libcuda.so.1").unwrap();
    let mut t = 1_000_000u64;
    for i in 0..n {
        t += 1000 + (i as u64 * 7919) % 3000;
        let name = w.intern_str(&format!("kernel_{}", i % 37)).unwrap();
        let rec = match i % 50 {
            7 => {
                let f = w
                    .intern_frame(FrameData {
                        kind: FrameKind::Native,
                        module: Some(module),
                        offset: Some(0x1000 + (i % 5) as u64),
                        func: None,
                        file: None,
                        line: None,
                        inlined: false,
                        text: None,
                    })
                    .unwrap();
                let stack = w.intern_stack(&[f]).unwrap();
                Record::Sync(Sync {
                    kind: SyncKind::StreamSynchronize,
                    start: t,
                    end: t + 500,
                    ctx: 1,
                    stream: Some(7),
                    corr: i as u32,
                    tid: Some(42),
                    stack: Some(stack),
                    ..Sync::default()
                })
            }
            21 => Record::Memcpy(Memcpy {
                kind: CopyKind::DtoH,
                src_kind: MemoryKind::Device,
                dst_kind: MemoryKind::Pageable,
                bytes: 4096,
                start: t,
                end: t + 900,
                dev: 0,
                ctx: 1,
                stream: 13,
                corr: i as u32,
                graph: None,
            }),
            _ => Record::Kernel(Kernel {
                name,
                start: t,
                end: t + 700,
                dev: 0,
                ctx: 1,
                stream: 7,
                corr: i as u32,
                grid: [64, 1, 1],
                block: [128, 1, 1],
                regs: 32,
                smem_static: 0,
                smem_dynamic: 0,
                local_mem: 0,
                smem_executed: (i % 2 == 0).then_some(1024),
                graph: None,
            }),
        };
        w.write(&rec).unwrap();
        if i % per_block == per_block - 1 {
            w.end_block().unwrap();
        }
    }
    w.finish(0, "exit").unwrap()
}

#[test]
fn generated_multi_block_trace_reads_the_same() {
    let bytes = generated(20_000, 700);
    let (recs, warnings) = same(&bytes, "generated").unwrap();
    // Read in parallel to its end, not handed to the sequential reader.
    let mut r = ParTraceReader::from_bytes(bytes.clone(), "t", 3).unwrap();
    assert_eq!(r.by_ref().count(), recs.len());
    assert!(!r.is_sequential());
    assert!(recs.len() > 20_000, "{}", recs.len());
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn damaged_traces_read_the_same() {
    let bytes = generated(3_000, 200);
    // Truncated anywhere: inside a block, at a block's end, inside the magic number.
    for cut in (0..bytes.len())
        .step_by(bytes.len() / 37)
        .chain([1, 3, 4, 5])
    {
        same(&bytes[..cut], &format!("cut at {cut}")).ok();
    }
    // Flipped bytes: a corrupt block ends the trace (or a frame header no longer delimits).
    for at in (4..bytes.len()).step_by(bytes.len() / 29) {
        let mut b = bytes.clone();
        b[at] ^= 0x5a;
        same(&b, &format!("flip at {at}")).unwrap();
    }
    // Garbage after the last block; the file twice.
    let mut b = bytes.clone();
    b.extend_from_slice(b"not zstd at all\n");
    let (_, w) = same(&b, "garbage after").unwrap();
    assert!(w.iter().any(|w| w.contains("corrupt")), "{w:?}");
    let mut b = bytes.clone();
    b.extend_from_slice(&bytes);
    same(&b, "twice").unwrap();
    same(&[], "empty").unwrap();
    same(b"{\"t\":\"end\"", "one partial line").unwrap();
    same(b"\x28\xb5\x2f", "part of the magic").ok();
}

#[test]
fn lines_split_across_blocks_are_joined_as_the_sequential_reader_joins_them() {
    let text = zstd::decode_all(&generated(2_000, 300)[..]).unwrap();
    // Blocks cut at arbitrary bytes (other tools' files): lines span blocks, some blocks hold no
    // line end at all.
    for step in [97usize, 1000, 4099, 50_000] {
        let mut b = Vec::new();
        let mut at = 0;
        let mut k = 0;
        while at < text.len() {
            let end = (at + step + (k * 131) % step).min(text.len());
            b.extend(zstd::encode_all(&text[at..end], 1).unwrap());
            at = end;
            k += 1;
        }
        let (recs, w) = same(&b, &format!("blocks of ~{step} bytes")).unwrap();
        assert_eq!(
            recs,
            seq_bytes(&zstd::encode_all(&text[..], 1).unwrap())
                .unwrap()
                .0
        );
        assert!(w.is_empty(), "{w:?}");
        // Truncated inside a line that spans blocks.
        same(&b[..b.len() * 2 / 3], &format!("blocks of ~{step}, cut")).unwrap();
    }
}

#[test]
fn plain_ndjson_reads_the_same() {
    let text = zstd::decode_all(&generated(12_000, 1000)[..]).unwrap();
    assert!(text.len() > 2 << 20, "several pieces: {}", text.len());
    let (recs, w) = same(&text, "plain").unwrap();
    assert!(recs.len() > 12_000 && w.is_empty(), "{w:?}");
    // An incomplete last line, bad lines and an unknown record type in the middle.
    let mut t = text[..text.len() - 10].to_vec();
    let mid = t.len() / 2;
    let mid = mid + t[mid..].iter().position(|&c| c == b'\n').unwrap() + 1;
    t.splice(
        mid..mid,
        b"{\"t\":\"future\",\"x\":1}\nnot json\n\n{\"t\":\"kernel\"}\n"
            .iter()
            .copied(),
    );
    let (_, w) = same(&t, "plain, damaged").unwrap();
    assert_eq!(w.len(), 3, "{w:?}");
}

#[test]
fn thread_count_from_the_environment_value() {
    use gpufl_trace::par::{threads_from, MAX_THREADS};
    assert_eq!(threads_from(Some("3")), 3);
    assert_eq!(threads_from(Some(" 16 ")), 16);
    let cores = threads_from(None);
    assert!(cores >= 1);
    assert_eq!(threads_from(Some("0")), cores);
    assert_eq!(threads_from(Some("many")), cores);
    assert_eq!(threads_from(Some("100000")), MAX_THREADS);
}

/// Limits small enough for the generated traces to meet them.
fn small_limits() -> Vec<(ReadLimits, &'static str)> {
    let d = ReadLimits::default();
    vec![
        (
            ReadLimits {
                max_block_bytes: 40_000,
                ..d
            },
            "block limit",
        ),
        (
            ReadLimits {
                max_session_bytes: 300_000,
                ..d
            },
            "session limit",
        ),
        (
            ReadLimits { max_ratio: 2, ..d },
            "ratio (the 64 MiB floor holds)",
        ),
        (
            ReadLimits {
                max_line_bytes: 180,
                ..d
            },
            "line limit",
        ),
        (
            ReadLimits {
                max_line_bytes: 1,
                ..d
            },
            "every line too long",
        ),
    ]
}

#[test]
fn limits_are_met_where_the_sequential_reader_meets_them() {
    let bytes = generated(6_000, 250);
    for (limits, what) in small_limits() {
        let (_, w) = same_with(&bytes, limits, what).unwrap();
        assert!(w.is_empty() == what.starts_with("ratio"), "{what}: {w:?}");
        let mut twice = bytes.clone();
        twice.extend_from_slice(&bytes);
        same_with(&twice, limits, &format!("{what}, twice")).unwrap();
        same_with(&bytes[..bytes.len() / 2], limits, &format!("{what}, cut")).unwrap();
    }
}

/// A zstd frame of `total` bytes of `byte` in RLE blocks; with `declare`, the header states the
/// content size.
fn rle_frame(byte: u8, total: u64, declare: bool) -> Vec<u8> {
    let mut f = vec![0x28, 0xb5, 0x2f, 0xfd];
    if declare {
        f.extend([0xc0, 0x38]);
        f.extend(total.to_le_bytes());
    } else {
        f.extend([0x00, 0x38]);
    }
    let mut left = total;
    while left > 0 {
        let n = left.min(128 << 10);
        left -= n;
        let hdr = u32::from(left == 0) | (1 << 1) | ((n as u32) << 3);
        f.extend(&hdr.to_le_bytes()[..3]);
        f.push(byte);
    }
    f
}

#[test]
fn large_blocks_and_decompression_bombs_read_the_same() {
    let bytes = generated(2_000, 300);
    for (total, declare) in [
        (1u64 << 20, true),
        (1 << 20, false),
        (20 << 20, true),
        (20 << 20, false),
        (300 << 20, true),
        (300 << 20, false),
    ] {
        // Newlines (blank lines) and spaces (one long blank line), after a good trace or alone.
        for byte in [b'\n', b' '] {
            let mut b = bytes.clone();
            b.extend(rle_frame(byte, total, declare));
            b.extend_from_slice(&bytes[bytes.len() / 2..]);
            let what = format!("{total} bytes of {byte}, declared {declare}");
            same(&b, &what).unwrap();
            same(&rle_frame(byte, total, declare), &what).ok();
        }
    }
}

/// A trace of header `h` and `n` kernels, in blocks of 50, closed with an end record.
fn with_header(h: &Header, n: usize, extra_block: Option<&str>) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), h).unwrap();
    let name = w.intern_str("k").unwrap();
    for i in 0..n {
        w.write(&Record::Kernel(Kernel {
            name,
            start: 1000 + i as u64 * 10,
            end: 1005 + i as u64 * 10,
            ..Kernel::default()
        }))
        .unwrap();
        if i % 50 == 49 {
            w.end_block().unwrap();
        }
    }
    let mut b = w.finish(0, "exit").unwrap();
    if let Some(text) = extra_block {
        b.extend(zstd::encode_all(text.as_bytes(), 1).unwrap());
    }
    b
}

#[test]
fn header_and_end_problems_read_the_same() {
    let good = Header::default();
    let v0 = Header {
        version: 0,
        ..Header::default()
    };
    let other = Header {
        format: "not-gpufl".into(),
        ..Header::default()
    };
    let head = serde_json::to_string(&Record::Header(Box::new(other.clone()))).unwrap();
    let cases = [
        with_header(&good, 300, None),
        with_header(&v0, 300, None),
        with_header(&other, 300, None),
        // A second header (another format) in a later block: reading stops there.
        with_header(&good, 300, Some(&format!("{head}\n"))),
        // Records after the end record, blank and long lines among them.
        with_header(
            &good,
            300,
            Some("{\"t\":\"notice\",\"level\":\"info\",\"message\":\"late\"}\n\n   \nnot json\n"),
        ),
    ];
    for (i, b) in cases.iter().enumerate() {
        same(b, &format!("case {i}")).unwrap();
        let mut twice = b.clone();
        twice.extend_from_slice(b);
        same(&twice, &format!("case {i}, twice")).unwrap();
        // No header: the first block dropped.
        let first = gpufl_trace_first_frame_len(b);
        same(&b[first..], &format!("case {i}, no header")).unwrap();
    }
}

/// The length of the first zstd frame of `b`.
fn gpufl_trace_first_frame_len(b: &[u8]) -> usize {
    let mut d = zstd::stream::read::Decoder::new(b).unwrap().single_frame();
    std::io::copy(&mut d, &mut std::io::sink()).unwrap();
    let rest = d.finish();
    let rest = std::io::BufRead::fill_buf(&mut std::io::BufReader::new(rest))
        .unwrap()
        .len();
    b.len() - rest
}

/// A session directory of these trace files.
fn session_of(files: &[Vec<u8>], tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufl-par-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (i, b) in files.iter().enumerate() {
        std::fs::write(dir.join(format!("trace-{i:04}.ndjson.zst")), b).unwrap();
    }
    dir
}

#[test]
fn sessions_read_the_same_within_their_limits() {
    let a = generated(3_000, 200);
    let b = generated(2_000, 150);
    let mut cut = b.clone();
    cut.truncate(b.len() * 2 / 3);
    let dir = session_of(&[a.clone(), b, a.clone(), cut, a], "limits");
    let mut all = small_limits();
    all.push((ReadLimits::default(), "defaults"));
    for (limits, what) in all {
        let mut seq = SessionReader::open_with(&dir, limits).unwrap();
        let want: Vec<Record> = seq.by_ref().collect();
        let want_w = seq.warnings();
        for t in THREADS {
            let mut par = ParSessionReader::open_with(&dir, limits, t).unwrap();
            let got: Vec<Record> = par.by_ref().collect();
            assert!(got == want, "{what}, {t} threads: records differ");
            assert_eq!(par.warnings(), want_w, "{what}, {t} threads");
        }
        if what == "defaults" {
            assert!(
                want_w
                    .iter()
                    .any(|w| w.contains("identical to an earlier block")),
                "{what}: {want_w:?}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn files_read_the_same_from_disk() {
    let a = generated(3_000, 200);
    let mut damaged = a.clone();
    let at = damaged.len() / 2;
    damaged[at] ^= 0x5a;
    let dir = session_of(&[a, damaged], "disk");
    for f in session::trace_files(&dir).unwrap() {
        let mut seq = TraceReader::open(&f).unwrap();
        let want: Vec<Record> = seq.by_ref().collect();
        for t in THREADS {
            let mut par = ParTraceReader::open(&f, t).unwrap();
            let got: Vec<Record> = par.by_ref().collect();
            assert!(got == want, "{}, {t} threads", f.display());
            assert_eq!(par.warnings(), seq.warnings());
            assert_eq!(par.decompressed_bytes(), seq.decompressed_bytes());
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A file of a rolling session as the recorder writes it after a rotation: its header and stream
/// records closed as a first block (the same bytes in every file), then timed records.
fn rolled_file(h: &Header, first_start: u64, n: usize) -> Vec<u8> {
    let mut w = TraceWriter::new(Vec::new(), h).unwrap();
    w.write(&Record::Stream(StreamInfo {
        ctx: 1,
        stream: 7,
        role: StreamRole::default(),
    }))
    .unwrap();
    w.end_block().unwrap();
    let name = w.intern_str("k").unwrap();
    for i in 0..n as u64 {
        w.write(&Record::Kernel(Kernel {
            name,
            start: first_start + i * 10,
            end: first_start + i * 10 + 5,
            ..Kernel::default()
        }))
        .unwrap();
    }
    w.finish(0, "rotated").unwrap()
}

#[test]
fn the_header_block_that_opens_each_rolled_file_is_not_a_duplicate() {
    let h = Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        session_id: "roll".into(),
        ..Header::default()
    };
    let (a, b) = (rolled_file(&h, 1_000, 40), rolled_file(&h, 9_000, 30));
    // The two files' first blocks are the same bytes.
    let (la, lb) = (
        gpufl_trace_first_frame_len(&a),
        gpufl_trace_first_frame_len(&b),
    );
    assert_eq!(a[..la], b[..lb]);
    let dir = session_of(&[a.clone(), b], "rolled");
    let mut seq = SessionReader::open(&dir).unwrap();
    let recs: Vec<Record> = seq.by_ref().collect();
    assert_eq!(seq.warnings(), Vec::<String>::new());
    let headers = recs
        .iter()
        .filter(|r| matches!(r, Record::Header(_)))
        .count();
    let kernels = recs
        .iter()
        .filter(|r| matches!(r, Record::Kernel(_)))
        .count();
    assert_eq!((headers, kernels), (2, 70));
    for t in THREADS {
        let mut par = ParSessionReader::open(&dir, t).unwrap();
        let got: Vec<Record> = par.by_ref().collect();
        assert!(got == recs, "{t} threads");
        assert_eq!(par.warnings(), Vec::<String>::new(), "{t} threads");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    // The same file twice is still a duplicate past its first block.
    let dir = session_of(&[a.clone(), a], "rolled-copy");
    let mut seq = SessionReader::open(&dir).unwrap();
    let kernels = seq
        .by_ref()
        .filter(|r| matches!(r, Record::Kernel(_)))
        .count();
    assert_eq!(kernels, 40);
    assert!(seq
        .warnings()
        .iter()
        .any(|w| w.contains("identical to an earlier block")));
    std::fs::remove_dir_all(&dir).unwrap();
}
