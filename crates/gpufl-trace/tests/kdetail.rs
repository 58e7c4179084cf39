//! The records from inside kernels (`kdetail`, `kstall`): written and read back, read from the
//! spec's lines (docs/trace-format.md), and bounded.

use gpufl_trace::kdetail::{MAX_RECORD_LINES, MAX_STALL_REASONS};
use gpufl_trace::*;
use std::collections::BTreeMap;

fn header() -> Header {
    Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        app_name: "kd".into(),
        session_id: "kd-1-20261126T000000Z".into(),
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    }
}

fn counts(inst: u64, thread_inst: u64) -> SassCounts {
    SassCounts {
        inst: Some(inst),
        thread_inst: Some(thread_inst),
        ..SassCounts::default()
    }
}

fn read_all(bytes: Vec<u8>) -> (Vec<Record>, Vec<String>) {
    let mut rd = TraceReader::from_bytes(bytes, "mem").unwrap();
    let recs: Vec<Record> = rd.by_ref().collect();
    (recs, rd.warnings())
}

#[test]
fn kdetail_and_kstall_round_trip_through_a_trace() {
    let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
    let name = w.intern_str("strided_load(float const*, float*)").unwrap();
    let file = w.intern_str("/src/examples/kernel_detail.cu").unwrap();
    let full = SassCounts {
        inst: Some(1000),
        thread_inst: Some(32_000),
        branch_uniform: Some(90),
        branch_divergent: Some(10),
        gld_inst: Some(10),
        gld_sectors: Some(320),
        gld_sectors_ideal: Some(40),
        gst_inst: Some(10),
        gst_sectors: Some(40),
        gst_sectors_ideal: Some(40),
        shared_inst: Some(0),
        shared_wavefronts: Some(0),
        shared_wavefronts_ideal: Some(0),
    };
    let kd = Kdetail {
        name,
        dev: 0,
        start: 100,
        end: 200,
        launches: 3,
        lineinfo: true,
        totals: full,
        lines: vec![
            KdetailLine {
                file,
                line: 81,
                m: SassCounts {
                    gld_inst: Some(10),
                    gld_sectors: Some(320),
                    ..counts(500, 16_000)
                },
            },
            KdetailLine {
                file,
                line: 82,
                m: SassCounts::default(),
            },
        ],
        unmapped: Some(counts(u64::MAX, 0)),
    };
    let mut stalls = BTreeMap::new();
    stalls.insert("long_scoreboard".to_string(), 30_012);
    stalls.insert("selected".to_string(), 512);
    let ks = Kstall {
        name,
        dev: 1,
        start: 100,
        end: 200,
        launches: 2,
        period_log2: Some(17),
        lines: vec![KstallLine {
            file,
            line: 81,
            samples: 33_040,
            stalls,
        }],
        unmapped: 7,
        unmapped_stalls: [("wait".to_string(), 7)].into(),
        total: 33_047,
    };
    let bare = Kdetail {
        name,
        lineinfo: false,
        ..Kdetail::default()
    };
    let recs = vec![
        Record::Kdetail(Box::new(kd)),
        Record::Kstall(Box::new(ks)),
        Record::Kdetail(Box::new(bare)),
    ];
    for r in &recs {
        w.write(r).unwrap();
    }
    let bytes = w.finish(1, "exit").unwrap();
    let (got, warnings) = read_all(bytes);
    assert!(warnings.is_empty(), "{warnings:?}");
    let got: Vec<Record> = got
        .into_iter()
        .filter(|r| matches!(r, Record::Kdetail(_) | Record::Kstall(_)))
        .collect();
    assert_eq!(got, recs);
    assert_eq!(got[0].type_name(), "kdetail");
    assert_eq!(got[1].type_name(), "kstall");
}

#[test]
fn the_specs_lines_read_and_unknown_keys_are_ignored() {
    let text = concat!(
        r#"{"t":"kdetail","name":0,"dev":0,"start":1,"end":9,"launches":3,"lineinfo":true,"#,
        r#""totals":{"inst":10,"thread_inst":160,"gld_inst":2,"gld_sectors":64,"future_metric":5},"#,
        r#""lines":[{"file":1,"line":42,"m":{"inst":10,"thread_inst":160,"new_key":[1,2]}}],"#,
        r#""unmapped":{"inst":0},"extra":{"a":1}}"#,
        "\n",
        r#"{"t":"kstall","name":0,"dev":0,"start":1,"end":9,"launches":2,"period_log2":17,"#,
        r#""lines":[{"file":1,"line":81,"samples":3,"stalls":{"long_scoreboard":2,"selected":1}}],"#,
        r#""unmapped":0,"total":3}"#,
        "\n",
        // Only the required keys.
        r#"{"t":"kdetail","name":0,"dev":0,"start":1,"end":9}"#,
        "\n"
    );
    let (got, warnings) = read_all(text.as_bytes().to_vec());
    assert_eq!(got.len(), 3, "{got:?} {warnings:?}");
    let Record::Kdetail(k) = &got[0] else {
        panic!("{:?}", got[0])
    };
    assert_eq!(k.totals.thread_inst, Some(160));
    assert_eq!(k.totals.gld_sectors_ideal, None);
    assert_eq!(k.lines[0].line, 42);
    assert_eq!(k.lines[0].m.inst, Some(10));
    assert_eq!(k.unmapped.and_then(|u| u.inst), Some(0));
    let Record::Kstall(s) = &got[1] else {
        panic!("{:?}", got[1])
    };
    assert_eq!(s.lines[0].stalls["long_scoreboard"], 2);
    assert_eq!(s.total, 3);
    let Record::Kdetail(k) = &got[2] else {
        panic!("{:?}", got[2])
    };
    assert!(k.lineinfo && k.lines.is_empty() && k.launches == 0);
    // Only the header's absence is warned about.
    assert!(
        warnings
            .iter()
            .all(|w| w.contains("no header") || w.contains("no end record")),
        "{warnings:?}"
    );
}

#[test]
fn an_over_long_lines_array_is_skipped_with_a_warning() {
    let mut text = String::from(r#"{"t":"kdetail","name":0,"dev":0,"start":1,"end":9,"lines":["#);
    for i in 0..=MAX_RECORD_LINES {
        if i > 0 {
            text.push(',');
        }
        text.push_str(r#"{"file":1,"line":1}"#);
    }
    text.push_str("]}\n");
    // A kstall line with too many stall reasons.
    text.push_str(r#"{"t":"kstall","name":0,"dev":0,"start":1,"end":9,"lines":[{"file":1,"line":2,"samples":1,"stalls":{"#);
    for i in 0..=MAX_STALL_REASONS {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&format!("\"r{i}\":1"));
    }
    text.push_str("}}]}\n");
    // Exactly at the bound: read.
    text.push_str(r#"{"t":"kdetail","name":0,"dev":0,"start":1,"end":9,"lines":["#);
    for i in 0..MAX_RECORD_LINES {
        if i > 0 {
            text.push(',');
        }
        text.push_str(r#"{"file":1,"line":1}"#);
    }
    text.push_str("]}\n");
    // Damaged: a negative count, a string id that is not a number.
    text.push_str(r#"{"t":"kdetail","name":0,"dev":0,"start":1,"end":9,"totals":{"inst":-1}}"#);
    text.push('\n');
    text.push_str(r#"{"t":"kstall","name":"x","dev":0,"start":1,"end":9}"#);
    text.push('\n');
    let (got, warnings) = read_all(text.into_bytes());
    assert_eq!(got.len(), 1, "only the record at the bound is read");
    let Record::Kdetail(k) = &got[0] else {
        panic!("{:?}", got[0])
    };
    assert_eq!(k.lines.len(), MAX_RECORD_LINES);
    let over: Vec<&String> = warnings
        .iter()
        .filter(|w| w.contains("beyond the reader's bounds"))
        .collect();
    assert_eq!(over.len(), 2, "{warnings:?}");
    assert!(over
        .iter()
        .any(|w| w.contains("skipped 1 'kdetail' record(s)")));
    assert!(over
        .iter()
        .any(|w| w.contains("skipped 1 'kstall' record(s)")));
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("skipped 2 line(s) that are not valid records")),
        "{warnings:?}"
    );
}
