//! The reader's limits on untrusted input (issue 13): duplicate blocks, blocks too large to hold,
//! per-block, per-session and per-line caps.

use super::*;

fn kernel(i: u64) -> Record {
    Record::Kernel(Kernel {
        name: StrId(0),
        start: 1_000 + i * 10,
        end: 1_005 + i * 10,
        corr: i as u32,
        grid: [128, 1, 1],
        block: [256, 1, 1],
        ..Kernel::default()
    })
}

/// One trace file whose kernels are all in one block of about `n` × 200 bytes.
fn one_big_block(n: u64) -> (Vec<u8>, Vec<Record>) {
    let header = minimal_header("big");
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    let mut expected = vec![Record::Header(Box::new(header.clone()))];
    let name = w.intern_str("a_kernel_with_a_name").unwrap();
    expected.push(Record::Str(StrRecord {
        id: name,
        s: "a_kernel_with_a_name".into(),
    }));
    for i in 0..n {
        let k = kernel(i);
        w.write(&k).unwrap();
        expected.push(k);
    }
    let bytes = w.finish(1, "test").unwrap();
    (bytes, expected)
}

fn read_with(bytes: &[u8], limits: ReadLimits) -> (Vec<Record>, Vec<String>) {
    let mut r = TraceReader::from_bytes_with(bytes.to_vec(), "t", limits).unwrap();
    let recs: Vec<Record> = r.by_ref().collect();
    (recs, r.warnings())
}

#[test]
fn a_block_seen_twice_is_skipped_with_a_warning() {
    let (bytes, expected, boundaries) = multi_block_trace(4);
    // Blocks 1 and 2, then block 2 again, then the rest.
    let (b1, b2) = (boundaries[1].0, boundaries[2].0);
    let spliced = [&bytes[..b2], &bytes[b1..b2], &bytes[b2..]].concat();
    let (got, warnings) = read_with(&spliced, ReadLimits::default());
    assert_eq!(got, expected, "the duplicate adds nothing");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("1 block(s) identical to an earlier block")),
        "{warnings:?}"
    );
    // Without the duplicate: no such warning, and the end counts agree.
    let (got, warnings) = read_with(&bytes, ReadLimits::default());
    assert_eq!(got, expected);
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn a_block_too_large_to_hold_is_read_as_it_decodes_with_the_same_records() {
    // About 24 MB in one block: more than the 16 MiB the reader holds whole.
    let (bytes, expected) = one_big_block(120_000);
    let plain: usize = zstd::decode_all(&bytes[..]).unwrap().len();
    assert!(plain > 16 << 20, "{plain}");
    let (got, warnings) = read_with(&bytes, ReadLimits::default());
    assert_eq!(got.len(), expected.len() + 1, "every record and the end");
    assert_eq!(&got[..expected.len()], &expected[..]);
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn a_block_over_the_limit_stops_reading_with_what_came_before() {
    let (bytes, expected) = one_big_block(120_000);
    let limits = ReadLimits {
        max_block_bytes: 8 << 20,
        ..ReadLimits::default()
    };
    let (got, warnings) = read_with(&bytes, limits);
    assert_prefix(&got, &expected, "block limit");
    assert!(got.len() < expected.len());
    assert!(
        warnings.iter().any(|w| w.contains(
            "block 1 decompresses to more than 8 MiB, the limit per block (GPUFL_MAX_BLOCK_MB raises it)"
        )),
        "{warnings:?}"
    );
}

#[test]
fn a_corrupt_streamed_block_keeps_the_records_before_the_damage() {
    let (mut bytes, expected) = one_big_block(120_000);
    // The block's checksum (its last 4 bytes): the damage is found only at the block's end, long
    // after the reader began releasing it.
    let n = bytes.len();
    bytes[n - 2] ^= 0x55;
    let (got, warnings) = read_with(&bytes, ReadLimits::default());
    // Records released before the damage are the ones written (zstd detected the damage in the
    // block it sits in; what decoded before it is intact).
    assert_prefix(&got, &expected, "streamed corrupt");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("is corrupt after its first") && w.contains("read unverified")),
        "{warnings:?}"
    );
}

#[test]
fn the_session_limit_covers_every_file() {
    let dir = TempDir::new("session-limit");
    let a = write_trace_file(&dir.join("trace-0000.ndjson.zst"), "a", 1_000, 50);
    let b = write_trace_file(&dir.join("trace-0001.ndjson.zst"), "a", 9_000_000, 50);
    let first = {
        let mut r = TraceReader::open(&dir.join("trace-0000.ndjson.zst")).unwrap();
        r.by_ref().count();
        r.decompressed_bytes()
    };
    assert!(first > 0);
    // Room for the first file and a little of the second.
    let limits = ReadLimits {
        max_session_bytes: first + 10,
        ..ReadLimits::default()
    };
    let mut r = SessionReader::open_with(dir.path(), limits).unwrap();
    let got: Vec<Record> = r.by_ref().collect();
    let w = r.warnings();
    assert_eq!(&got[..a.len()], &a[..], "the first file whole");
    assert!(got.len() < a.len() + b.len());
    assert!(w.iter().any(|w| w.contains("limit per session")), "{w:?}");
}

#[test]
fn lines_over_the_limit_are_skipped_without_being_held() {
    let limits = ReadLimits {
        max_line_bytes: 1 << 20,
        ..ReadLimits::default()
    };
    let hdr = serde_json::to_string(&Record::Header(Box::new(minimal_header("l")))).unwrap();
    let long = format!(
        "{{\"t\":\"notice\",\"level\":\"info\",\"message\":\"{}\"}}",
        "x".repeat(3 << 20)
    );
    let ok = r#"{"t":"notice","level":"info","message":"after"}"#;
    let text = format!("{hdr}\n{long}\n{ok}\n");
    // Plain (lines span the input's buffers) and zstd (the line sits in one held block).
    for bytes in [
        text.clone().into_bytes(),
        zstd::encode_all(text.as_bytes(), 1).unwrap(),
    ] {
        let (got, warnings) = read_with(&bytes, limits);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(matches!(&got[1], Record::Notice(n) if n.message == "after"));
        assert!(
            warnings
                .iter()
                .any(|w| w.contains("skipped 1 line(s) longer than 1 MiB")),
            "{warnings:?}"
        );
    }
}

#[test]
fn a_repeated_block_of_untimed_records_is_kept() {
    // Two blocks that hold the same two `dropped` records, byte for byte: legitimate (nothing in
    // them is timed), so both are read and the end counts agree.
    let header = minimal_header("rep");
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    w.end_block().unwrap();
    let d = |source: &str| {
        Record::Dropped(Dropped {
            source: source.into(),
            count: 3,
        })
    };
    for _ in 0..2 {
        w.write(&d("cupti")).unwrap();
        w.write(&d("buffer_pool")).unwrap();
        w.end_block().unwrap();
    }
    let bytes = w.finish(1, "test").unwrap();
    let (got, warnings) = read_with(&bytes, ReadLimits::default());
    let dropped: u64 = got
        .iter()
        .map(|r| match r {
            Record::Dropped(d) => d.count,
            _ => 0,
        })
        .sum();
    assert_eq!(dropped, 12);
    assert!(warnings.is_empty(), "{warnings:?}");
}
