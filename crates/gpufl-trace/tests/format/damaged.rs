//! Damaged and foreign input: truncated files, corrupt blocks, bit flips, garbage lines.

use super::*;

// ---------------------------------------------------------------------------------------------
// Truncation and corruption
// ---------------------------------------------------------------------------------------------

#[test]
fn truncated_file_yields_prefix_and_warnings() {
    let (bytes, expected, boundaries) = multi_block_trace(6);
    assert_eq!(boundaries.len(), 7);
    let dir = TempDir::new("trunc");

    let mut cuts: Vec<usize> = (0..bytes.len()).step_by(13).collect();
    for &(b, _) in &boundaries {
        for c in [b.saturating_sub(1), b, b + 1, b + 3, b + 4, b + 5, b + 12] {
            if c <= bytes.len() {
                cuts.push(c);
            }
        }
    }
    cuts.push(bytes.len());
    cuts.sort_unstable();
    cuts.dedup();

    let mut lossy_cuts = 0;
    let mut silent = Vec::new();
    for &cut in &cuts {
        let ctx = format!("cut at {cut}/{}", bytes.len());
        let result = std::panic::catch_unwind(|| read_bytes(&dir, "t.ndjson.zst", &bytes[..cut]));
        let result = result.unwrap_or_else(|_| panic!("{ctx}: reader panicked"));
        let (got, warnings) = match result {
            Ok(x) => x,
            // A few bytes of zstd magic are not recognizable as anything; refusing is fine.
            Err(TraceError::NotATrace { .. }) if (1..4).contains(&cut) => continue,
            Err(e) => panic!("{ctx}: open failed: {e}"),
        };
        assert_prefix(&got, &expected, &ctx);
        // Every record of every block that ends at or before the cut must be there.
        let complete = boundaries
            .iter()
            .filter(|(end, _)| *end <= cut)
            .map(|&(_, n)| n)
            .max()
            .unwrap_or(0);
        assert!(
            got.len() >= complete,
            "{ctx}: only {} records, but the complete blocks before the cut hold {complete}",
            got.len()
        );
        if cut == bytes.len() {
            assert_eq!(got, expected, "{ctx}: untruncated file");
            assert!(
                warnings.is_empty(),
                "{ctx}: warnings on a complete file: {warnings:?}"
            );
        } else {
            // Only a cut inside the last block's 4-byte checksum can keep every record.
            assert!(
                got.len() < expected.len() || cut + 4 >= bytes.len(),
                "{ctx}: nothing was lost?"
            );
            lossy_cuts += 1;
            if warnings.is_empty() {
                silent.push(format!(
                    "{ctx}: {} of {} records lost, file damaged, no warning",
                    expected.len() - got.len(),
                    expected.len()
                ));
            }
        }
    }
    assert!(lossy_cuts > 50, "too few cuts tested ({lossy_cuts})");
    assert!(silent.is_empty(), "silent losses:\n{}", silent.join("\n"));
}

#[test]
fn corrupt_bytes_in_last_block_yield_prefix_and_warning() {
    let (bytes, expected, boundaries) = multi_block_trace_opt(4, false);
    let dir = TempDir::new("corrupt");
    // Last block: from the end of the second-to-last boundary to the end of the file.
    let last_start = boundaries[boundaries.len() - 2].0;
    let before_last = boundaries[boundaries.len() - 2].1;
    let last_len = bytes.len() - last_start;
    assert!(
        last_len > 64,
        "last block too small to corrupt meaningfully ({last_len})"
    );
    for frac in [3usize, 4, 5, 6, 7] {
        // Overwrite a run of bytes around the middle of the last block.
        let mid = last_start + last_len * frac / 10;
        let mut bad = bytes.clone();
        for b in &mut bad[mid..mid + 8] {
            *b ^= 0xA5;
        }
        let ctx = format!(
            "corruption at {mid} (last block {last_start}..{})",
            bytes.len()
        );
        let (got, warnings) = read_bytes(&dir, "c.ndjson.zst", &bad).unwrap();
        assert_prefix(&got, &expected, &ctx);
        assert!(
            got.len() >= before_last,
            "{ctx}: records of intact blocks lost ({} < {before_last})",
            got.len()
        );
        assert!(
            got.len() < expected.len(),
            "{ctx}: corruption went unnoticed"
        );
        assert!(!warnings.is_empty(), "{ctx}: no warning");
    }
}

#[test]
fn crash_after_a_closed_block_keeps_it_and_warns() {
    let buf = SharedBuf::default();
    let mut r = Recorder::new(buf.clone(), &sample_header());
    write_batch(&mut r, 0);
    r.w.end_block().unwrap();
    let kept = r.expected.clone();
    write_batch(&mut r, 1);
    // The process dies: the writer is never finished, the open block never closed.
    drop(r);
    let dir = TempDir::new("crash");
    let (got, warnings) = read_bytes(&dir, FIRST_TRACE_FILE, &buf.bytes()).unwrap();
    assert_eq!(got, kept);
    assert!(
        warnings.iter().any(|w| w.contains("no end record")),
        "{warnings:?}"
    );

    // Died before the first block was closed: an empty file.
    let (got, warnings) = read_bytes(&dir, "empty.ndjson.zst", b"").unwrap();
    assert!(got.is_empty());
    assert!(warnings.iter().any(|w| w.contains("empty")), "{warnings:?}");
}

#[test]
fn blocks_carry_a_checksum_and_blocks_without_one_still_read() {
    let (bytes, expected, boundaries) = multi_block_trace(3);
    let mut start = 0;
    for &(end, _) in &boundaries {
        // Frame_Header_Descriptor, bit 2: Content_Checksum_flag.
        assert_ne!(
            bytes[start + 4] & 0x04,
            0,
            "block at {start} has no checksum"
        );
        start = end;
    }
    // A trace compressed by another tool (no checksums, different frame split) reads the same.
    let text = zstd::decode_all(&bytes[..]).unwrap();
    let mid = text
        .iter()
        .take(text.len() / 2)
        .rposition(|&b| b == b'\n')
        .unwrap()
        + 1;
    let mut other = zstd::encode_all(&text[..mid], 19).unwrap();
    other.extend(zstd::encode_all(&text[mid..], 1).unwrap());
    let dir = TempDir::new("nochecksum");
    let (got, warnings) = read_bytes(&dir, "o.ndjson.zst", &other).unwrap();
    assert_eq!(got, expected);
    assert!(warnings.is_empty(), "{warnings:?}");
}

#[test]
fn corruption_late_in_a_large_block_never_yields_altered_records() {
    // A block much larger than any read buffer: a streaming decoder would hand out most of it
    // before reaching the damage (or the checksum that reveals it).
    let buf = SharedBuf::default();
    let mut r = Recorder::new(buf.clone(), &sample_header());
    write_batch(&mut r, 0);
    r.w.end_block().unwrap();
    let first_block = (buf.len(), r.expected.len());
    let name = r.str("k");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..6000u32 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        r.rec(Record::Kernel(Kernel {
            name,
            start: x >> 20,
            end: (x >> 20) + (x & 0xffff),
            dev: (x >> 60) as u32,
            stream: (x >> 50) as u32 & 0xff,
            corr: i,
            grid: [(x & 0x3ff) as i32, 1, 1],
            block: [256, 1, 1],
            ..Kernel::default()
        }));
    }
    let (bytes, expected) = {
        let (_, expected) = r.finish(1, "shutdown");
        (buf.bytes(), expected)
    };
    let last_len = bytes.len() - first_block.0;
    assert!(
        last_len > 100_000,
        "last block too small ({last_len} bytes)"
    );
    let dir = TempDir::new("bigblock");
    for k in 0..24 {
        // Spread over the second half of the block, short of the 4-byte checksum.
        let pos = first_block.0 + last_len / 2 + k * (last_len / 2 - 8) / 24;
        let mut bad = bytes.clone();
        bad[pos] ^= 0x10;
        let ctx = format!("flip at byte {pos}/{}", bytes.len());
        let (got, warnings) = read_bytes(&dir, "b.ndjson.zst", &bad).unwrap();
        assert_prefix(&got, &expected, &ctx);
        assert!(got.len() >= first_block.1, "{ctx}: intact block lost");
        if got.len() < expected.len() {
            assert!(!warnings.is_empty(), "{ctx}: loss without a warning");
        }
    }
}

#[test]
fn every_bit_flip_is_detected_or_harmless() {
    let (bytes, expected, boundaries) = multi_block_trace_opt(4, false);
    let dir = TempDir::new("flips");
    let last_start = boundaries[boundaries.len() - 2].0;
    // Every byte of the last block, every third byte of the blocks before it.
    let positions = (0..last_start).step_by(3).chain(last_start..bytes.len());
    let mut detected = 0;
    for pos in positions {
        for flip in [0x01u8, 0x80] {
            let mut bad = bytes.clone();
            bad[pos] ^= flip;
            let ctx = format!("bit flip {flip:#x} at byte {pos}/{}", bytes.len());
            let Ok((got, warnings)) = read_bytes(&dir, "f.ndjson.zst", &bad) else {
                assert!(pos < 4, "{ctx}: open failed");
                continue;
            };
            // Never an altered record: what is returned is a prefix of what was written.
            assert_prefix(&got, &expected, &ctx);
            // Records of the blocks before the damaged one are all there.
            let intact = boundaries
                .iter()
                .filter(|(end, _)| *end <= pos)
                .map(|&(_, n)| n)
                .max()
                .unwrap_or(0);
            assert!(got.len() >= intact, "{ctx}: {} < {intact}", got.len());
            if got.len() < expected.len() {
                assert!(
                    !warnings.is_empty(),
                    "{ctx}: records lost without a warning"
                );
                detected += 1;
            }
        }
    }
    assert!(detected > 1000, "too few damaging flips ({detected})");
}

#[test]
fn garbage_lines_in_plain_ndjson_are_skipped_and_counted() {
    let dir = TempDir::new("garbage");
    let hdr = serde_json::to_string(&Record::Header(Box::new(minimal_header("g")))).unwrap();
    let s0 = serde_json::to_string(&Record::Str(StrRecord {
        id: StrId(0),
        s: "k".into(),
    }))
    .unwrap();
    let k = |start| {
        serde_json::to_string(&Record::Kernel(Kernel {
            start,
            end: start + 1,
            ..Kernel::default()
        }))
        .unwrap()
    };
    // The end record counts the three kernels that are read (the garbage lines are not records).
    let mut end = End::default();
    end.counts.kernels = 3;
    let end = serde_json::to_string(&Record::End(end)).unwrap();
    let text = [
        hdr.as_str(),
        &s0,
        &k(1),
        "this is not json at all",
        "",
        "   ",
        r#"{"t":"kernel","name":0,"start":"#,
        r#"{"t":"kernel","name":0}"#,
        r#"{"no_tag":1}"#,
        r#"[1,2,3]"#,
        &k(2),
        "\u{0}\u{1}binary\u{ff}",
        &k(3),
        &end,
    ]
    .join("\n")
        + "\n";
    let p = dir.join("trace-0000.ndjson");
    std::fs::write(&p, &text).unwrap();
    let (got, warnings) = read_file(&p);
    let starts: Vec<u64> = got
        .iter()
        .filter_map(|r| {
            if let Record::Kernel(k) = r {
                Some(k.start)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        starts,
        vec![1, 2, 3],
        "good lines after the garbage are still read"
    );
    assert_eq!(got.len(), 6);
    assert!(matches!(got[0], Record::Header(_)));
    assert!(matches!(got[5], Record::End(_)));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("skipped 6 line(s)"),
        "bad lines not counted right: {warnings:?}"
    );
}

#[test]
fn trailing_partial_line_in_plain_ndjson_is_dropped_with_warning() {
    let hdr = serde_json::to_string(&Record::Header(Box::new(minimal_header("p")))).unwrap();
    let text = format!("{hdr}\n{{\"t\":\"kernel\",\"name\":0,\"st");
    let mut rd = TraceReader::from_reader(std::io::Cursor::new(text.into_bytes()), "mem");
    let got: Vec<Record> = rd.by_ref().collect();
    assert_eq!(got.len(), 1);
    let w = rd.warnings();
    assert!(w.iter().any(|w| w.contains("truncated")), "{w:?}");
}

#[test]
fn file_that_is_neither_zstd_nor_ndjson_is_refused() {
    let dir = TempDir::new("notatrace");
    let p = dir.join("trace-0000.ndjson.zst");
    std::fs::write(&p, b"PK\x03\x04 a zip file").unwrap();
    assert!(matches!(
        TraceReader::open(&p),
        Err(TraceError::NotATrace { .. })
    ));
    assert!(matches!(
        TraceReader::open(&dir.join("missing")),
        Err(TraceError::Io { .. })
    ));
}
