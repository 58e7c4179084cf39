//! `gpufl report` of a session with counters and PC samples from inside kernels (`kdetail`,
//! `kstall`; issue 19): the kernel table's counter columns, the note on kernels without line
//! info, the insights at lines inside kernels, the JSON, and the same report on any number of
//! threads.

use gpufl_trace::*;
use std::path::{Path, PathBuf};
use std::process::Command;

const US: u64 = 1_000;
const SRC: &str = "/work/main/examples/kernel_detail.cu";

fn gpufl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpufl"))
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn counts(inst: u64, thread_inst: u64) -> SassCounts {
    SassCounts {
        inst: Some(inst),
        thread_inst: Some(thread_inst),
        ..SassCounts::default()
    }
}

/// `divergent` (16 of 32 lanes at line 48), `strided_load` (32 sectors a load request at line
/// 81), `coalesced_load` (clean, its cubin without line info), 20 launches each from
/// `kernel_detail.cu:143..145`; PC samples of `divergent`.
fn write_session(root: &Path) -> PathBuf {
    let name = "kernel_detail-4242-20261126T000000Z";
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let t0 = 2_000_000_000_000u64;
    let header = Header {
        session_id: name.into(),
        app_name: "kernel_detail".into(),
        clock: ClockSync {
            trace_ns: t0,
            unix_ns: 1_795_000_000_000_000_000,
        },
        options: CaptureOptions {
            enable_synchronization: true,
            enable_stack_trace: true,
            api_records: "default".into(),
            log_path: "/tmp".into(),
            started_by: "test".into(),
            ..CaptureOptions::default()
        },
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    };
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &header).unwrap();
    let src = w.intern_str(SRC).unwrap();
    let main = w.intern_str("main").unwrap();
    let app = w.intern_str("/work/main/build/kernel_detail").unwrap();
    let api = w.intern_str("cudaLaunchKernel").unwrap();
    let mut corr = 0;
    let mut t = t0;
    let kernels = [
        ("divergent(float const*, float*)", 143, 350),
        ("strided_load(float const*, float*)", 144, 100),
        ("coalesced_load(float const*, float*)", 145, 30),
    ];
    for (kname, line, len) in kernels {
        let f = w
            .intern_frame(FrameData {
                kind: FrameKind::Native,
                module: Some(app),
                offset: Some(0x1000 + line as u64),
                func: Some(main),
                file: Some(src),
                line: Some(line),
                inlined: false,
                text: None,
            })
            .unwrap();
        let stack = w.intern_stack(&[f]).unwrap();
        let name = w.intern_str(kname).unwrap();
        for i in 0..20 {
            corr += 1;
            if i == 0 {
                w.write(&Record::Callsite(Callsite {
                    corr,
                    api,
                    tid: 7,
                    ts: t,
                    stack,
                    weight: None,
                }))
                .unwrap();
            }
            w.write(&Record::Kernel(Kernel {
                name,
                start: t,
                end: t + len * US,
                dev: 0,
                ctx: 1,
                stream: 7,
                corr,
                grid: [16384, 1, 1],
                block: [256, 1, 1],
                regs: 32,
                ..Kernel::default()
            }))
            .unwrap();
            t += len * US;
        }
    }
    let w_ = |n: u64| Some(n);
    let div = w.intern_str(kernels[0].0).unwrap();
    let lines = vec![
        KdetailLine {
            file: src,
            line: 43,
            m: counts(40_000_000, 640_000_000),
        },
        KdetailLine {
            file: src,
            line: 48,
            m: counts(80_000_000, 1_280_000_000),
        },
        KdetailLine {
            file: src,
            line: 56,
            m: counts(1_000_000, 32_000_000),
        },
    ];
    w.write(&Record::Kdetail(Box::new(Kdetail {
        name: div,
        dev: 0,
        start: t0,
        end: t,
        launches: 1,
        lineinfo: true,
        totals: counts(121_000_000, 1_952_000_000),
        lines,
        unmapped: None,
    })))
    .unwrap();
    let strided = w.intern_str(kernels[1].0).unwrap();
    let wps = 131_072u64;
    let global = SassCounts {
        gld_inst: w_(wps),
        gld_sectors: w_(32 * wps),
        gld_sectors_ideal: w_(4 * wps),
        gst_inst: w_(wps),
        gst_sectors: w_(4 * wps),
        gst_sectors_ideal: w_(4 * wps),
        ..counts(600_000, 19_200_000)
    };
    w.write(&Record::Kdetail(Box::new(Kdetail {
        name: strided,
        dev: 0,
        start: t0,
        end: t,
        launches: 2,
        lineinfo: true,
        totals: global,
        lines: vec![KdetailLine {
            file: src,
            line: 81,
            m: global,
        }],
        unmapped: None,
    })))
    .unwrap();
    let coalesced = w.intern_str(kernels[2].0).unwrap();
    w.write(&Record::Kdetail(Box::new(Kdetail {
        name: coalesced,
        dev: 0,
        start: t0,
        end: t,
        launches: 1,
        lineinfo: false,
        totals: SassCounts {
            gld_inst: w_(wps),
            gld_sectors: w_(4 * wps),
            gst_inst: w_(wps),
            gst_sectors: w_(4 * wps),
            ..counts(600_000, 19_200_000)
        },
        lines: Vec::new(),
        unmapped: None,
    })))
    .unwrap();
    w.write(&Record::Kstall(Box::new(Kstall {
        name: div,
        dev: 0,
        start: t0,
        end: t,
        launches: 10,
        period_log2: Some(17),
        lines: vec![KstallLine {
            file: src,
            line: 43,
            samples: 1_000,
            stalls: [
                ("mio_throttle".to_string(), 700),
                ("selected".to_string(), 300),
            ]
            .into(),
        }],
        unmapped: 0,
        unmapped_stalls: Default::default(),
        total: 1_000,
    })))
    .unwrap();
    w.finish(1_795_000_000_100_000_000, "exit").unwrap();
    dir
}

fn temp_root(tag: &str) -> PathBuf {
    let root = std::env::temp_dir().join(format!("gpufl-kd-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    root
}

#[test]
fn report_shows_the_counters_and_the_insights_inside_kernels() {
    let root = temp_root("text");
    let dir = write_session(&root);
    let (code, text, err) = run(gpufl().args(["report", "--color", "never"]).arg(&dir));
    assert_eq!(code, 0, "{err}");
    let _ = std::fs::remove_dir_all(&root);
    // The table: counter columns, one line per kernel.
    assert!(
        text.contains("occupancy   lanes ld sec/rq st sec/rq  bank  kernel"),
        "{text}"
    );
    let row = |k: &str| {
        text.lines()
            .find(|l| l.trim_end().ends_with(k) && l.contains('%'))
            .unwrap_or_else(|| panic!("no row of {k}: {text}"))
            .to_string()
    };
    assert!(
        row("divergent").contains(" 16.1         -         -     -  divergent"),
        "{}",
        row("divergent")
    );
    assert!(
        row("strided_load").contains(" 32.0    32.0/4     4.0/4     -  strided_load"),
        "{}",
        row("strided_load")
    );
    assert!(
        row("coalesced_load").contains("4.0/4*    4.0/4*"),
        "{}",
        row("coalesced_load")
    );
    assert!(
        text.contains("* ideal assumed: 4 sectors a request"),
        "{text}"
    );
    // Said once.
    assert_eq!(
        text.matches("no line info in coalesced_load: build with `nvcc -lineinfo`")
            .count(),
        1,
        "{text}"
    );
    // The insights, at lines inside the kernels, with the launch lines.
    assert!(
        text.contains(
            "Warp divergence × 20 @ kernel_detail.cu:48 · divergent: 16 of 32 lanes active there"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "at /work/main/examples/kernel_detail.cu:48  divergent(float const*, float*)"
        ),
        "{text}"
    );
    assert!(
        text.contains("Launched at kernel_detail.cu:143 in main()"),
        "{text}"
    );
    assert!(
        text.contains("Uncoalesced access × 20 @ kernel_detail.cu:81 · strided_load: loads take 32.0 sectors per request, 4.0 ideal"),
        "{text}"
    );
    assert!(text.contains("[stall-reasons]"), "{text}");
    assert!(!text.contains("coalesced_load: loads take"), "{text}");
}

#[test]
fn json_has_the_same_figures_and_threads_change_nothing() {
    let root = temp_root("json");
    let dir = write_session(&root);
    let (code, want, err) = run(gpufl()
        .env("GPUFL_THREADS", "1")
        .args(["report", "--json"])
        .arg(&dir));
    assert_eq!(code, 0, "{err}");
    for t in ["2", "3"] {
        let (_, got, _) = run(gpufl()
            .env_remove("GPUFL_THREADS")
            .args(["report", "--json", "--threads", t])
            .arg(&dir));
        assert!(got == want, "--threads {t} reports differently");
        let (_, a, _) = run(gpufl()
            .env("GPUFL_THREADS", "1")
            .args(["report", "--color", "never"])
            .arg(&dir));
        let (_, b, _) = run(gpufl()
            .env("GPUFL_THREADS", t)
            .args(["report", "--color", "never"])
            .arg(&dir));
        assert_eq!(a, b);
    }
    let _ = std::fs::remove_dir_all(&root);
    let v: serde_json::Value = serde_json::from_str(&want).unwrap();
    let s = if v["sessions"].is_array() {
        &v["sessions"][0]
    } else {
        &v
    };
    let rows = s["kernels"]["rows"].as_array().unwrap();
    let row = |k: &str| {
        rows.iter()
            .find(|r| r["name"].as_str().unwrap().starts_with(k))
            .unwrap()
    };
    let d = &row("strided_load")["detail"];
    assert_eq!(d["load_sectors_per_request"], 32.0);
    assert_eq!(d["load_ideal_per_request"], 4.0);
    assert_eq!(d["launches"], 2);
    assert_eq!(d["lineinfo"], true);
    assert_eq!(row("coalesced_load")["detail"]["lineinfo"], false);
    assert_eq!(row("coalesced_load")["detail"]["load_ideal_assumed"], true);
    let ins = s["insights"].as_array().unwrap();
    let wd = ins.iter().find(|i| i["rule"] == "warp-divergence").unwrap();
    assert_eq!(wd["location"]["line"], 48);
    assert_eq!(wd["location"]["origin"], "native");
    assert_eq!(wd["data"]["rule"], "warp-divergence");
    assert_eq!(wd["data"]["launch"]["line"], 143);
    assert_eq!(wd["data"]["line"], 48);
    assert!(wd["data"]["lanes"].as_f64().unwrap() < 16.2);
}

/// testdata/kdetail/kernel_detail-recorded: gpufl's own recording on the H100 of
/// `kernel_detail 20 all` with `--kernel-detail=<the six kernels>`, two sampled launches each (the
/// first for PC-sampling stall reasons, the second for SASS counters; device run 5 of
/// 2026-11-26, session 8): each planted line is named by its rule, the clean twins by none of the
/// three (stall reasons are LOW, informational), the stall reasons sit on the kernels' busy
/// lines, and the figures agree with Nsight Compute's for the same kernels (device run 1 of the
/// same session: 16.18 threads per warp instruction, branch efficiency 99.27 %, 32.0 and 4.0
/// sectors per load request, 29,442,253 bank conflicts of 33,636,557 wavefronts) within 5 %.
#[test]
fn real_counters_name_the_planted_lines_and_agree_with_nsight_compute() {
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/kdetail/kernel_detail-recorded");
    let (rc, out, err) = run(gpufl().arg("report").arg("--json").arg(&dir));
    assert_eq!(rc, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &v["sessions"][0];
    let detail_rules = [
        "warp-divergence",
        "uncoalesced-access",
        "bank-conflicts",
        "stall-reasons",
    ];
    let named: Vec<(String, String, u64)> = s["insights"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| detail_rules.contains(&i["rule"].as_str().unwrap()))
        .map(|i| {
            (
                i["rule"].as_str().unwrap().to_string(),
                i["location"]["file"].as_str().unwrap_or("").to_string(),
                i["location"]["line"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    let at = |rule: &str| {
        named
            .iter()
            .filter(|(r, f, _)| r == rule && f.ends_with("kernel_detail.cu"))
            .map(|(_, _, l)| *l)
            .collect::<Vec<_>>()
    };
    assert_eq!(at("warp-divergence"), vec![56], "{named:?}");
    assert_eq!(at("uncoalesced-access"), vec![81], "{named:?}");
    assert_eq!(at("bank-conflicts"), vec![102], "{named:?}");
    let counters = named
        .iter()
        .filter(|(r, _, _)| r != "stall-reasons")
        .count();
    assert_eq!(counters, 3, "the clean twins raise nothing: {named:?}");
    // Stall reasons: at the busiest line of each kernel that matters, LOW, with its dominant reason.
    let stalls: Vec<&serde_json::Value> = s["insights"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["rule"] == "stall-reasons")
        .collect();
    assert!(stalls.iter().all(|i| i["severity"] == "LOW"), "{stalls:?}");
    let stall_at = |line: u64| {
        stalls
            .iter()
            .find(|i| i["location"]["line"] == line)
            .unwrap_or_else(|| panic!("no stall-reasons insight at :{line}: {named:?}"))
    };
    let t43 = stall_at(43)["title"].as_str().unwrap().to_string();
    assert!(
        t43.contains("divergent") && t43.contains("mio_throttle"),
        "{t43}"
    );
    let t102 = stall_at(102)["title"].as_str().unwrap().to_string();
    assert!(
        t102.contains("bank_conflict") && t102.contains("short_scoreboard"),
        "{t102}"
    );
    let rows = s["kernels"]["rows"].as_array().unwrap();
    let row = |k: &str| {
        rows.iter()
            .find(|r| r["name"].as_str().unwrap().starts_with(&format!("{k}(")))
            .unwrap_or_else(|| panic!("no row {k}"))["detail"]
            .clone()
    };
    let near = |got: f64, ncu: f64| (got - ncu).abs() <= 0.05 * ncu;
    let lanes = row("divergent")["lanes"].as_f64().unwrap();
    assert!(near(lanes, 16.18), "divergent lanes {lanes}");
    let eff = row("divergent")["branch_efficiency"].as_f64().unwrap() * 100.0;
    assert!(near(eff, 99.27), "divergent branch efficiency {eff}");
    assert!(near(row("uniform")["lanes"].as_f64().unwrap(), 31.98));
    let sec = row("strided_load")["load_sectors_per_request"]
        .as_f64()
        .unwrap();
    assert!(near(sec, 32.0), "strided sectors per request {sec}");
    let sec = row("coalesced_load")["load_sectors_per_request"]
        .as_f64()
        .unwrap();
    assert!(near(sec, 4.0), "coalesced sectors per request {sec}");
    let bank = row("bank_conflict")["bank_conflict_share"]
        .as_f64()
        .unwrap();
    assert!(
        near(bank, 29_442_253.0 / 33_636_557.0),
        "bank_conflict share {bank}"
    );
    assert_eq!(
        row("padded_shared")["bank_conflict_share"].as_f64(),
        Some(0.0)
    );
}

/// The text and JSON reports of the recorded session (testdata/kdetail/kernel_detail-recorded),
/// against their snapshots: the kernel table's detail columns, the three planted insights and the
/// stall reasons as a user reads them.
#[test]
fn recorded_kernel_detail_report_snapshots() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = "testdata/kdetail/kernel_detail-recorded";
    let (rc, text, err) = run(gpufl()
        .current_dir(&root)
        .args(["report", "--color", "never", dir]));
    assert_eq!(rc, 0, "{err}");
    insta::assert_snapshot!("report_text_kernel_detail_recorded", text);
    let (rc, json, err) = run(gpufl().current_dir(&root).args(["report", "--json", dir]));
    assert_eq!(rc, 0, "{err}");
    insta::assert_snapshot!("report_json_kernel_detail_recorded", json);
}
