//! `telemetry` records: round trips, the documented line, throttle bits.

use super::*;

// ---------------------------------------------------------------------------------------------
// Telemetry
// ---------------------------------------------------------------------------------------------

/// A telemetry sample with every field present, at the edges of its types.
pub(crate) fn full_telemetry() -> Telemetry {
    Telemetry {
        ts: u64::MAX - 7,
        dev: 3,
        gpu_util: Some(100),
        mem_util: Some(0),
        mem_used: Some(85_045_870_592),
        mem_total: Some(u64::MAX),
        temp_c: Some(71),
        power_mw: Some(u32::MAX),
        sm_mhz: Some(1980),
        mem_mhz: Some(2619),
        sm_max_mhz: Some(1980),
        throttle: Some(u64::MAX),
        ecc_corr: Some(0),
        ecc_uncorr: Some(u64::MAX),
        pcie_tx_kbs: Some(12_345_678),
        pcie_rx_kbs: Some(0),
    }
}

#[test]
fn telemetry_round_trips_with_every_field_and_with_none() {
    let buf = SharedBuf::default();
    let mut r = Recorder::new(buf.clone(), &sample_header());
    let bare = Telemetry {
        ts: 42,
        dev: 0,
        ..Telemetry::default()
    };
    r.rec(Record::Telemetry(Box::new(full_telemetry())));
    r.rec(Record::Telemetry(Box::new(bare.clone())));
    let (_, expected) = r.finish(7, "shutdown");
    let text = String::from_utf8(zstd::decode_all(&buf.bytes()[..]).unwrap()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let full_line = lines[1];
    let bare_line = lines[2];
    assert!(full_line.starts_with(r#"{"t":"telemetry","ts":18446744073709551608,"dev":3,"#));
    // Absent metrics are not written at all (never as null or 0).
    assert_eq!(bare_line, r#"{"t":"telemetry","ts":42,"dev":0}"#);
    // Zero is a value, written as such.
    assert!(full_line.contains(r#""mem_util":0"#) && full_line.contains(r#""ecc_corr":0"#));
    let got: Vec<Record> =
        TraceReader::from_reader(std::io::Cursor::new(text.clone().into_bytes()), "mem").collect();
    assert_eq!(got, expected);
    assert_eq!(got[1], Record::Telemetry(Box::new(full_telemetry())));
    assert_eq!(got[2], Record::Telemetry(Box::new(bare)));
    // Telemetry is not one of the counted kinds.
    let Some(Record::End(end)) = got.last() else {
        panic!("no end record")
    };
    assert_eq!(end.counts, Counts::default());
}

#[test]
fn telemetry_line_decodes_field_by_field() {
    // As docs/trace-format.md documents it, keys in any order, plus a field of a newer recorder.
    let text = concat!(
        r#"{"t":"telemetry","ts":1234000100000,"dev":1,"gpu_util":97,"mem_util":41,"mem_used":2147483648,"#,
        r#""mem_total":85899345920,"temp_c":64,"power_mw":512345,"sm_mhz":1755,"mem_mhz":2619,"sm_max_mhz":1980,"#,
        r#""throttle":4,"ecc_corr":2,"ecc_uncorr":0,"pcie_tx_kbs":1500,"pcie_rx_kbs":250000,"nvlink_kbs":9}"#,
        "\n",
        r#"{"dev":0,"t":"telemetry","temp_c":30,"ts":5}"#,
        "\n",
        // Required fields missing or mistyped: skipped as invalid lines.
        r#"{"t":"telemetry","dev":0}"#,
        "\n",
        r#"{"t":"telemetry","ts":5,"dev":0,"gpu_util":"high"}"#,
        "\n",
        r#"{"t":"telemetry","ts":5,"dev":0,"temp_c":-3}"#,
        "\n",
    );
    let mut rd = TraceReader::from_reader(std::io::Cursor::new(text.as_bytes().to_vec()), "mem");
    let got: Vec<Record> = rd.by_ref().collect();
    assert_eq!(
        got,
        vec![
            Record::Telemetry(Box::new(Telemetry {
                ts: 1_234_000_100_000,
                dev: 1,
                gpu_util: Some(97),
                mem_util: Some(41),
                mem_used: Some(2 << 30),
                mem_total: Some(80 << 30),
                temp_c: Some(64),
                power_mw: Some(512_345),
                sm_mhz: Some(1755),
                mem_mhz: Some(2619),
                sm_max_mhz: Some(1980),
                throttle: Some(throttle::SW_POWER_CAP),
                ecc_corr: Some(2),
                ecc_uncorr: Some(0),
                pcie_tx_kbs: Some(1500),
                pcie_rx_kbs: Some(250_000),
            })),
            Record::Telemetry(Box::new(Telemetry {
                ts: 5,
                dev: 0,
                temp_c: Some(30),
                ..Telemetry::default()
            })),
        ]
    );
    let w = rd.warnings();
    assert!(
        w.iter().any(|w| w.contains("skipped 3 line(s)")),
        "bad telemetry lines are counted: {w:?}"
    );
    assert!(rd.unknown_types().is_empty());
}

#[test]
fn throttle_bits_are_nvml_values_and_groups_are_disjoint_where_documented() {
    // nvml.h: nvmlClocksEventReason* / nvmlClocksThrottleReason*.
    assert_eq!(throttle::GPU_IDLE, 0x1);
    assert_eq!(throttle::SW_POWER_CAP, 0x4);
    assert_eq!(throttle::HW_SLOWDOWN, 0x8);
    assert_eq!(throttle::SW_THERMAL_SLOWDOWN, 0x20);
    assert_eq!(throttle::HW_THERMAL_SLOWDOWN, 0x40);
    assert_eq!(throttle::HW_POWER_BRAKE_SLOWDOWN, 0x80);
    assert_eq!(throttle::POWER & throttle::THERMAL, 0);
    assert_eq!(throttle::THROTTLING & throttle::GPU_IDLE, 0);
    assert_eq!(
        throttle::THROTTLING & (throttle::APPLICATIONS_CLOCKS_SETTING | throttle::SYNC_BOOST),
        0
    );
    assert_eq!(
        throttle::THROTTLING,
        throttle::POWER | throttle::THERMAL | throttle::HW_SLOWDOWN
    );
}

#[test]
fn header_without_telemetry_period_reads_as_before() {
    // A header written before telemetry existed (no options.telemetry_ms) decodes with None, and
    // a trace without telemetry records gives no warning.
    let text = concat!(
        r#"{"t":"header","format":"gpufl-trace","version":1,"gpufl_version":"0.1.0","session_id":"s","app_name":"a","host":"h","pid":1,"ppid":0,"command_line":["a"],"start_unix_ns":10,"clock":{"trace_ns":1,"unix_ns":2},"gpus":[],"options":{"enable_synchronization":true,"enable_stack_trace":false,"api_records":"none","log_path":"/l","started_by":"api"},"capture":{"status":"ok"}}"#,
        "\n",
        r#"{"t":"end","end_unix_ns":20,"reason":"shutdown","counts":{"kernels":0,"memcpys":0,"memsets":0,"syncs":0,"apis":0,"stacks":0,"dropped":0}}"#,
        "\n"
    );
    let mut rd = TraceReader::from_reader(std::io::Cursor::new(text.as_bytes().to_vec()), "old");
    let got: Vec<Record> = rd.by_ref().collect();
    assert_eq!(got.len(), 2);
    let Record::Header(h) = &got[0] else {
        panic!("no header")
    };
    assert_eq!(h.options.telemetry_ms, None);
    assert!(rd.warnings().is_empty(), "{:?}", rd.warnings());
    // Written back, the absent period is not invented.
    let line = serde_json::to_string(&got[0]).unwrap();
    assert!(!line.contains("telemetry_ms"), "{line}");
}
