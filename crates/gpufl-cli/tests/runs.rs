//! `gpufl report` over a run directory: the synthetic 2-rank DDP run of
//! `crates/gpufl-analysis/tests/common/ddp_run.rs` (a straggler on rank 1, and its balanced twin).

#[path = "../../gpufl-analysis/tests/common/ddp_run.rs"]
mod ddp_run;

use ddp_run::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn gpufl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpufl"))
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run gpufl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

struct Root(PathBuf);
impl Root {
    fn new(tag: &str) -> Root {
        let p = std::env::temp_dir().join(format!("gpufl-runs-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Root(p)
    }
}
impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn report(root: &Path, args: &[&str]) -> String {
    let (code, out, err) = run(gpufl().current_dir(root).arg("report").args(args));
    assert_eq!(code, 0, "{err}");
    out
}

#[test]
fn run_report_names_the_straggler_and_its_line() {
    let root = Root::new("straggler");
    write_run_dir(&root.0, Plan::straggler());
    let text = report(&root.0, &["--color", "never", RUN_ID]);
    // The run: its command, the ranks side by side, the launcher folded into one line.
    assert!(
        text.starts_with(&format!("gpufl run · {RUN_ID}\n")),
        "{text}"
    );
    assert!(text.contains("torchrun --nproc_per_node=2"), "{text}");
    assert!(
        text.contains("3 processes: 2 with CUDA work, 1 without"),
        "{text}"
    );
    assert!(
        text.contains("1 process without CUDA work: torchrun (pid 4100)"),
        "{text}"
    );
    // The cross-rank insight: rank 1, 4 ms late, the stretch before its forward launch.
    let cw = text
        .lines()
        .find(|l| l.contains("[collective-wait]"))
        .unwrap_or_else(|| panic!("no collective-wait: {text}"));
    assert!(
        cw.contains("rank 1 arrives 4.00ms late at AllReduce"),
        "{cw}"
    );
    assert!(cw.contains("@ ddp_train.py:61"), "{cw}");
    // No communication kernel is called under-filled in any rank's report.
    assert!(
        !text
            .lines()
            .any(|l| l.contains("[under-filled-grid]") && l.contains("nccl")),
        "{text}"
    );
    // Then each rank's own report, in rank order.
    let r0 = text.find("── rank 0 ──").expect("rank 0 detail");
    let r1 = text.find("── rank 1 ──").expect("rank 1 detail");
    assert!(r0 < r1);
    insta::assert_snapshot!("run_report_text_ddp_straggler", text);

    // --run-only: the run view alone.
    let only = report(&root.0, &["--color", "never", "--run-only", RUN_ID]);
    assert!(only.contains("[collective-wait]") && !only.contains("── rank 0 ──"));
    // The output directory (holding the run directory) reads the same way.
    assert_eq!(
        report(&root.0, &["--color", "never", "."]).lines().nth(1),
        text.lines().nth(1)
    );
    // --no-run: one report per session, as for unrelated sessions: the overview of the three,
    // then their reports.
    let plain = report(&root.0, &["--color", "never", "--no-run", RUN_ID]);
    assert!(plain.starts_with("gpufl report · 3 sessions, by their top finding's impact"));
    assert!(!plain.contains("collective-wait") && plain.matches("gpufl report · ").count() == 4);

    // JSON: the run (its record, ranks, clock, insights), then every session.
    let json = report(&root.0, &["--json", RUN_ID]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let r = &v["run"];
    assert_eq!(r["runs"][0]["record"]["run_id"], RUN_ID);
    assert_eq!(r["runs"][0]["record"]["exit_code"], 0);
    assert_eq!(r["ranks"][1]["rank"], 1);
    assert_eq!(r["ranks"][1]["gpu"]["index"], 1);
    assert_eq!(r["clock"]["method"], "same_host");
    assert_eq!(r["insights"][0]["data"]["late_rank"], 1);
    assert_eq!(r["insights"][0]["location"]["line"], FORWARD_LINE);
    assert_eq!(v["sessions"].as_array().unwrap().len(), 3);
    insta::assert_snapshot!("run_report_json_ddp_straggler", json);
}

#[test]
fn balanced_run_has_no_cross_rank_insight() {
    let root = Root::new("balanced");
    write_run_dir(&root.0, Plan::balanced());
    let text = report(&root.0, &["--color", "never", "--run-only", RUN_ID]);
    assert!(text.contains("No cross-rank insights."), "{text}");
    assert!(!text.contains("collective-wait"), "{text}");
    assert!(text.contains("60 collectives matched"), "{text}");
}

#[test]
fn sessions_without_a_run_record_still_read_as_before() {
    // A directory of sessions without run.json and without ranks: no run view.
    let root = Root::new("plain");
    let dir = write_run_dir(&root.0, Plan::straggler());
    std::fs::remove_file(dir.join("run.json")).unwrap();
    let launcher = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("torchrun-")
        })
        .unwrap();
    let text = report(&root.0, &["--color", "never", launcher.to_str().unwrap()]);
    assert!(text.starts_with("gpufl report · "), "{text}");
    // Sessions with ranks make a run even without run.json.
    let text = report(&root.0, &["--color", "never", "--run-only", RUN_ID]);
    assert!(text.contains("[collective-wait]"), "{text}");
}

#[test]
fn a_run_exports_to_one_file_with_its_ranks_named() {
    let root = Root::new("export");
    write_run_dir(&root.0, Plan::straggler());
    let out = root.0.join("run.json.trace");
    let (code, _, err) = run(gpufl()
        .current_dir(&root.0)
        .args(["export", "--format", "chrome", "-q", "-o"])
        .arg(&out)
        .arg(RUN_ID));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let mut names: Vec<&str> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "process_name")
        .filter_map(|e| e["args"]["name"].as_str())
        .collect();
    names.sort();
    // Every process of the run in one file: the launcher (no rank) and both ranks.
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("rank 0/2 · ")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n.starts_with("rank 1/2 · ")),
        "{names:?}"
    );
    assert_eq!(names.iter().filter(|n| n.starts_with("rank ")).count(), 2);
}

#[test]
fn info_on_a_run_directory_summarizes_the_run_first() {
    let root = Root::new("info");
    write_run_dir(&root.0, Plan::straggler());
    let (code, text, err) = run(gpufl().current_dir(&root.0).args(["info", RUN_ID]));
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = text.lines().collect();
    // The run first: its id and directory, its command, host, start, duration and exit.
    assert_eq!(lines[0], format!("run {RUN_ID}  ({RUN_ID})"), "{text}");
    assert_eq!(
        lines[1],
        format!("  command: torchrun --nproc_per_node=2 {SCRIPT}"),
        "{text}"
    );
    assert!(lines[2].starts_with("  host node01  started "), "{text}");
    assert!(lines[2].ends_with(" UTC  ran 2.00 s  exit 0"), "{text}");
    assert_eq!(lines[3], "  3 processes:", "{text}");
    // One line per process: the ranks in rank order, then the launcher, which has no rank.
    let procs = &lines[4..7];
    assert!(
        procs[0].starts_with("    rank 0/2 (local 0)  pid 4101     ddp_train  "),
        "{text}"
    );
    assert!(
        procs[1].starts_with("    rank 1/2 (local 1)  pid 4102     ddp_train  "),
        "{text}"
    );
    assert_eq!(
        procs[2], "    no rank             pid 4100     torchrun  0 kernels, 0 syncs",
        "{text}"
    );
    for p in &procs[..2] {
        let kernels: u64 = p
            .split("ddp_train  ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no kernel count: {p}"));
        assert!(kernels > 0, "{p}");
        assert!(p.ends_with(" syncs") && !p.ends_with(" 0 syncs"), "{p}");
    }
    // Then every session's own info, as before.
    assert_eq!(text.matches("\n  command: ").count(), 4, "{text}");
    assert!(
        text.contains(&format!("  command: python3 {SCRIPT} --straggle-ms 4")),
        "{text}"
    );
    let run_at = text.find(&format!("run {RUN_ID}")).unwrap();
    let first_session = text.find("/ddp_train-4101-").expect("rank 0's session");
    assert!(run_at < first_session);

    // The output directory holding the run reads the same way.
    let (code, from_root, err) = run(gpufl().current_dir(&root.0).args(["info", "."]));
    assert_eq!(code, 0, "{err}");
    assert!(
        from_root.starts_with(&format!("run {RUN_ID}  (./{RUN_ID})\n")),
        "{from_root}"
    );
    assert_eq!(
        from_root.lines().skip(1).take(6).collect::<Vec<_>>(),
        lines[1..7],
        "{from_root}"
    );

    // Without run.json, the sessions' run id and ranks still make a run.
    std::fs::remove_file(root.0.join(RUN_ID).join("run.json")).unwrap();
    let (code, text, err) = run(gpufl().current_dir(&root.0).args(["info", RUN_ID]));
    assert_eq!(code, 0, "{err}");
    assert!(
        text.starts_with(&format!("run {RUN_ID}\n  no run record")),
        "{text}"
    );
    assert!(text.contains("    rank 1/2 (local 1)  pid 4102 "), "{text}");
    // A single session is not a run.
    let one = root.0.join(RUN_ID).join(
        std::fs::read_dir(root.0.join(RUN_ID))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .find(|n| n.to_string_lossy().starts_with("ddp_train-4101-"))
            .unwrap(),
    );
    let (code, text, err) = run(gpufl().arg("info").arg(&one));
    assert_eq!(code, 0, "{err}");
    assert!(!text.starts_with("run "), "{text}");
}

/// The 2-rank DDP run recorded on the H200 machine (testdata/runs/, `bash scripts/gpu-check.sh
/// ddp`: `torchrun --nproc_per_node=2 examples/ddp_straggler.py --straggle-ms 4 --steps 50`):
/// rank 1 does 4 ms of host work before each step's forward. DDP's gradient buckets make the first
/// collective of each step late by the whole delay and the later ones by a little each; the run
/// report names rank 1 and the stretch from `loss.item()` (line 77) to `out = model(x)` (line 73),
/// which holds the host work (line 71), and no communication kernel is called under-filled.
#[test]
fn recorded_ddp_run_names_rank_1_and_the_stretch_that_holds_its_host_work() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/runs/run-torchrun-755-20261126T042539Z");
    let (code, out, err) = run(gpufl().arg("report").arg("--json").arg(&dir));
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let run = &j["run"];
    let ranks: Vec<(u64, u64)> = run["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["rank"].as_u64().unwrap(),
                r["comm_kernels"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(ranks, vec![(0, 223), (1, 223)]);
    assert_eq!(run["clock"]["method"], "same_host");
    let cw: Vec<&serde_json::Value> = run["insights"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["rule"] == "collective-wait")
        .collect();
    assert_eq!(cw.len(), 1, "{}", run["insights"]);
    let (i, d) = (cw[0], &cw[0]["data"]);
    assert_eq!(d["late_rank"], 1);
    assert_eq!(d["host_bound"], true, "{d}");
    assert!(i["location"]["file"]
        .as_str()
        .unwrap()
        .ends_with("examples/ddp_straggler.py"));
    assert_eq!(i["location"]["line"], 73, "{i}");
    assert_eq!(d["gap_before"]["line"], 77, "{d}");
    // The stretch is the planted 4 ms (and a little), not the short ones between backward's
    // launches before the later buckets.
    let gap = d["host_gap_median_ns"].as_u64().unwrap();
    assert!((4_000_000..5_000_000).contains(&gap), "{gap}");
    // The title's lateness is that of the collectives the host made late (~4 ms), not the median
    // over all late ones (~0.36 ms: the later buckets).
    let title = i["title"].as_str().unwrap();
    assert!(title.contains("rank 1 arrives 4."), "{title}");
    for s in j["sessions"].as_array().unwrap() {
        for i in s["insights"].as_array().unwrap() {
            let rule = i["rule"].as_str().unwrap();
            let title = i["title"].as_str().unwrap().to_lowercase();
            assert!(
                !(["under-filled-grid", "low-occupancy", "launch-bound"].contains(&rule)
                    && title.contains("nccl")),
                "{rule}: {title}"
            );
        }
    }
}

/// The collective-wait insight of a bundled run's `gpufl report --json` (exactly one).
fn collective_wait_of(run_dir: &str) -> serde_json::Value {
    let run = run_json_of(run_dir);
    let cw = collective_waits(&run);
    assert_eq!(cw.len(), 1, "{}", run["insights"]);
    cw[0].clone()
}

/// Issue 35's DDP runs (2 ranks, host samples): (d) rank 1 spends 20 ms per step in
/// busy_host_work() (line 38, called at line 71), a line with no CUDA call: the insight is
/// located there from rank 1's samples; (e) rank 1 runs extra matmuls (extra_gpu_work(), line
/// 106): located at that launch line, with the kernels only rank 1 runs.
#[test]
fn recorded_ddp_stragglers_are_named_at_the_host_line_and_the_extra_work() {
    let i = collective_wait_of("run-torchrun-726-20261127T195651Z");
    let d = &i["data"];
    assert_eq!(d["late_rank"], 1);
    assert_eq!(d["host_bound"], true);
    assert_eq!(i["location"]["line"], 38, "{}", i["title"]);
    let top = &d["host"]["lines"][0];
    assert_eq!(top["location"]["line"], 38);
    assert_eq!(top["caller"]["line"], 71);
    assert!(top["share"].as_f64().unwrap() >= 0.5, "{top}");
    assert_eq!(d["gap_ended_at"]["line"], 73);

    let i = collective_wait_of("run-torchrun-1492-20261127T195712Z");
    let d = &i["data"];
    assert_eq!(d["late_rank"], 1);
    assert_eq!(d["host_bound"], false);
    assert_eq!(i["location"]["line"], 106, "{}", i["title"]);
    // Its title's lateness is the extra work's per step (~4.5 ms), neither the later buckets'
    // (median 0.23 ms) nor the first steps' set-up (four collectives 44–72 ms late).
    let heavy = d["weighted_late_ns"].as_u64().unwrap();
    assert!((3_500_000..6_000_000).contains(&heavy), "{heavy}");
    let extra = d["extra_kernels"].as_array().unwrap();
    assert!(!extra.is_empty());
    assert!(
        extra
            .iter()
            .any(|k| k["launch_line"]["line"] == 106
                && k["per_late_collective_ns"].as_u64() > Some(0))
    );
    assert!(
        extra[0]["name"].as_str().unwrap().contains("cutlass"),
        "{}",
        extra[0]
    );
    // A one-off kernel only rank 1 ran (setup) is not its per-step work.
    let late = d["late_collectives"].as_u64().unwrap();
    assert!(
        extra
            .iter()
            .all(|k| k["others_launches"] != 0 || k["launches"].as_u64().unwrap() * 2 >= late),
        "{extra:?}"
    );
}

/// `gpufl report --json` of a bundled run: its `run` object.
fn run_json_of(run_dir: &str) -> serde_json::Value {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/runs")
        .join(run_dir);
    let (code, out, err) = run(gpufl().arg("report").arg("--json").arg(&dir));
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    j["run"].clone()
}

/// The run's collective-wait insights.
fn collective_waits(run: &serde_json::Value) -> Vec<serde_json::Value> {
    run["insights"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["rule"] == "collective-wait")
        .cloned()
        .collect()
}

/// The DDP runs recorded always-on on the H200 x2 machine (2026-11-28; testdata/README.md): a
/// sampled window every 500 ms in each rank, opened at each rank's own times. Matched by order
/// (the n-th recorded kernel of each rank), the straggler run paired collectives of different
/// steps (their ends 72.86 ms apart) and named rank 0, 72 ms late. Matched by end time inside the
/// windows both ranks had open, the same collectives end within µs of each other on both ranks,
/// and the late rank is rank 1, late by the planted 4 ms at each step's first collective (the
/// p90: DDP's later buckets are late by much less). Sampled windows record no API calls, so its
/// host's time is not placed (no stretch, not host-bound).
#[test]
fn recorded_always_on_ddp_straggler_is_rank_1_matched_by_time() {
    let run = run_json_of("run-torchrun-788-20261128T141045Z");
    let clock = &run["clock"];
    assert_eq!(clock["method"], "same_host");
    let w = &clock["windows"];
    assert!(w["with_collectives"].as_u64().unwrap() >= 3, "{clock}");
    assert!(
        w["with_collectives"].as_u64() <= w["windows"].as_u64(),
        "{clock}"
    );
    let spread = clock["end_spread_ns"].as_u64().unwrap();
    assert!(spread < 50_000, "{clock}");
    let cw = collective_waits(&run);
    assert_eq!(cw.len(), 1, "{}", run["insights"]);
    let (i, d) = (&cw[0], &cw[0]["data"]);
    assert_eq!(d["late_rank"], 1, "{}", i["title"]);
    assert_eq!(d["waiting_ranks"], serde_json::json!([0]));
    let p90 = d["p90_late_ns"].as_u64().unwrap();
    assert!((3_500_000..6_000_000).contains(&p90), "{p90}");
    assert_eq!(d["windows"], *w);
    // The title gives the planted delay (the lateness where most of the late time lies), not the
    // median over all late collectives (~0.47 ms: the later buckets).
    let heavy = d["weighted_late_ns"].as_u64().unwrap();
    assert!((3_500_000..6_000_000).contains(&heavy), "{heavy}");
    assert!(d["median_late_ns"].as_u64().unwrap() < 1_000_000, "{d}");
    let title = i["title"].as_str().unwrap();
    assert!(title.contains("rank 1 arrives 4."), "{title}");
    // Rated on the time both ranks observed (the shared windows, where rank 0's wait was
    // measured: about half of it), not on the run's 12 s: rank 0's wait of ~0.44 s is HIGH.
    let observed = w["observed_ns"].as_u64().unwrap();
    let impact = i["impact_ns"].as_u64().unwrap();
    assert_eq!(i["severity"], "HIGH", "{impact} of {observed}");
    let share = i["share_of_session"].as_f64().unwrap();
    assert!(
        (share - impact as f64 / observed as f64).abs() < 1e-6,
        "{share} vs {impact}/{observed}"
    );
    // Its share of the run is over the run's span (the longest rank's wall time), not the windows.
    let wall = run["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["wall_ns"].as_u64())
        .max()
        .unwrap();
    let of_wall = i["share_of_wall"].as_f64().unwrap();
    assert!(
        (of_wall - impact as f64 / wall as f64).abs() < 1e-6,
        "{of_wall} vs {impact}/{wall}"
    );
    assert!(d["host_gap_median_ns"].is_null(), "{d}");
    assert_eq!(d["host_bound"], false);
    assert_eq!(i["basis"]["kind"], "estimated");
    let detail = i["detail"].as_str().unwrap();
    assert!(detail.contains("matched by end time"), "{detail}");
    assert!(detail.contains("host time cannot be placed"), "{detail}");
    assert!(
        !run["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("different numbers")),
        "{}",
        run["warnings"]
    );
}

/// Its balanced twin (`--straggle-ms 0`): matched by time too, and no collective-wait. In the
/// windows both ranks had open rank 1 starts the collectives a median 0.39 ms after rank 0 (p90
/// 0.70 ms; most right after its own window opened) — on collectives whose ends agree within µs,
/// not pairs of unrelated ones; the rule asks an always-on run for a p90 lateness of at least
/// `MIN_SAMPLED_P90_NS` (1 ms), beyond what opening a window costs a rank by itself.
#[test]
fn recorded_always_on_ddp_balanced_twin_raises_no_collective_wait() {
    let run = run_json_of("run-torchrun-1499-20261128T141108Z");
    let clock = &run["clock"];
    assert!(clock["windows"]["with_collectives"].as_u64().unwrap() >= 1);
    assert!(clock["end_spread_ns"].as_u64().unwrap() < 50_000, "{clock}");
    let found: Vec<String> = collective_waits(&run)
        .iter()
        .map(|i| i["title"].to_string())
        .collect();
    assert!(found.is_empty(), "{found:?}");
}
