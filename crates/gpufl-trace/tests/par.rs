//! The parallel reader yields exactly the records and warnings of the sequential one, with 1, 2, 4
//! and 7 threads: on every session of testdata/, on a generated multi-block trace, and on damaged
//! copies of it (truncated, flipped bytes, a line split across two blocks, garbage after the last
//! block, plain NDJSON).

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
