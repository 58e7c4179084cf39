//! `gpufl diff` over pairs of bundled sessions of the same program: the deltas it prints are
//! checked against the two sessions' own `gpufl report --json`, its exit status against the
//! regressions those reports imply, and its output against snapshots (tests/snapshots/).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn gpufl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpufl"));
    c.current_dir(root());
    c
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `testdata/sessions/<the one session whose name starts with prefix>`, relative to the root.
fn session(prefix: &str) -> String {
    let mut found: Vec<String> = std::fs::read_dir(root().join("testdata/sessions"))
        .expect("testdata/sessions")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    assert_eq!(found.len(), 1, "sessions {prefix}*: {found:?}");
    format!("testdata/sessions/{}", found.remove(0))
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run gpufl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn report(dir: &str) -> Value {
    let (code, out, err) = run(gpufl().args(["report", "--json", dir]));
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("report JSON");
    v["sessions"][0].clone()
}

fn diff_json(base: &str, new: &str, extra: &[&str]) -> (i32, Value) {
    let (code, out, err) = run(gpufl()
        .args(["diff", "--json"])
        .args(extra)
        .args([base, new]));
    assert!(code == 0 || code == 3, "exit {code}: {err}");
    (code, serde_json::from_str(&out).expect("diff JSON"))
}

const TRAIN: &str = "pytorch_train_sync-1304";
const HEAVY: &str = "pytorch_train_sync_heavy-1382";
const ITEM: &str = "pytorch_transfers-1063";
const CPU: &str = "pytorch_transfers-1122";
const PAGEABLE: &str = "pytorch_transfers-1187";

/// The pairs of one program compared here, both ways.
fn pairs() -> Vec<(&'static str, &'static str)> {
    let one_way = [
        (TRAIN, HEAVY),
        (ITEM, CPU),
        (CPU, PAGEABLE),
        (ITEM, PAGEABLE),
    ];
    one_way
        .iter()
        .flat_map(|&(a, b)| [(a, b), (b, a)])
        .collect()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a u64: {v}"))
}

/// Kernel name → (launches, GPU time) from a report's kernel table, summed over devices.
fn kernels(r: &Value) -> BTreeMap<String, (u64, u64)> {
    let mut m = BTreeMap::new();
    for row in r["kernels"]["rows"].as_array().into_iter().flatten() {
        let e = m
            .entry(row["name"].as_str().unwrap().to_string())
            .or_insert((0, 0));
        e.0 += u(&row["launches"]);
        e.1 += u(&row["total_ns"]);
    }
    m
}

/// (file, line, function) of a location.
fn place(l: &Value) -> (String, u64, String) {
    (
        l["file"].as_str().unwrap_or("").to_string(),
        l["line"].as_u64().unwrap_or(0),
        l["function"].as_str().unwrap_or("").to_string(),
    )
}

/// Per line: (syncs, host time blocked) from a report's sync-attribution insights (one per line
/// and sync kind, every synchronization with a stack).
fn sync_lines(r: &Value) -> BTreeMap<(String, u64, String), (u64, u64)> {
    let mut m = BTreeMap::new();
    for i in r["insights"].as_array().unwrap() {
        if i["rule"] != "sync-attribution" {
            continue;
        }
        let e = m.entry(place(&i["location"])).or_insert((0, 0));
        e.0 += u(&i["count"]);
        if i["sync_kind"] != "stream_wait_event" {
            e.1 += u(&i["blocked_ns"]);
        }
    }
    m
}

/// What tells an insight from the others: rule, location, sync kind, and its subject.
fn insight_key(i: &Value) -> String {
    let d = &i["data"];
    format!(
        "{} {:?} {} {} {} {} {}",
        i["rule"],
        place(&i["location"]),
        i["sync_kind"],
        d["kernel"],
        d["device"],
        d["api"],
        d["class"]
    )
}

/// Insight key → (severity, count, impact).
fn insights(r: &Value) -> BTreeMap<String, (String, u64, u64)> {
    let mut m = BTreeMap::new();
    for i in r["insights"].as_array().unwrap() {
        let v = (
            i["severity"].as_str().unwrap().to_string(),
            u(&i["count"]),
            u(&i["impact_ns"]),
        );
        assert!(m.insert(insight_key(i), v).is_none(), "two alike: {i}");
    }
    m
}

/// With --threshold 0 every difference shows: the diff's totals, kernels, sync time per line
/// and insights are what the two reports say, and the unchanged ones are hidden.
#[test]
fn deltas_are_the_differences_of_the_two_reports() {
    for (b, n) in pairs() {
        let (bd, nd) = (session(b), session(n));
        let (rb, rn) = (report(&bd), report(&nd));
        let (_, d) = diff_json(&bd, &nd, &["--threshold", "0"]);
        let ctx = format!("{b} → {n}");
        assert_eq!(d["base"]["session"], bd.as_str());
        assert_eq!(d["new"]["session"], nd.as_str());

        // The headline's figures (as `gpufl report --json` has them), copies and memsets of the
        // totals.
        for (f, of) in [
            ("wall_ns", "headline"),
            ("gpu_busy_ns", "headline"),
            ("kernels", "headline"),
            ("copies", "totals"),
            ("memsets", "totals"),
            ("syncs", "headline"),
            ("sync_blocked_ns", "headline"),
            ("copy_blocked_ns", "headline"),
            ("host_blocked_ns", "headline"),
            ("gpu_idle_ns", "headline"),
        ] {
            let t = &d["totals"][f];
            let (eb, en) = (u(&rb[of][f]), u(&rn[of][f]));
            assert_eq!((u(&t["base"]), u(&t["new"])), (eb, en), "{ctx} {f}");
            assert_eq!(
                t["delta"].as_i64().unwrap(),
                en as i64 - eb as i64,
                "{ctx} {f}"
            );
            if eb > 0 {
                let pct = (en as f64 - eb as f64) * 100.0 / eb as f64;
                assert!((t["pct"].as_f64().unwrap() - pct).abs() < 1e-9, "{ctx} {f}");
            }
        }

        // Kernels: the union of both tables, by name.
        let (kb, kn) = (kernels(&rb), kernels(&rn));
        let mut expected = BTreeMap::new();
        let mut unchanged = 0;
        for name in kb.keys().chain(kn.keys()).collect::<BTreeSet<_>>() {
            let status = match (kb.get(name), kn.get(name)) {
                (Some(_), None) => "gone",
                (None, Some(_)) => "new",
                (x, y) if x == y => {
                    unchanged += 1;
                    continue;
                }
                _ => "changed",
            };
            let (lb, tb) = kb.get(name).copied().unwrap_or_default();
            let (ln, tn) = kn.get(name).copied().unwrap_or_default();
            expected.insert(name.clone(), (status.to_string(), lb, ln, tb, tn));
        }
        let got: BTreeMap<String, (String, u64, u64, u64, u64)> = d["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["name"].as_str().unwrap().to_string(),
                    (
                        k["status"].as_str().unwrap().to_string(),
                        u(&k["launches"]["base"]),
                        u(&k["launches"]["new"]),
                        u(&k["total_ns"]["base"]),
                        u(&k["total_ns"]["new"]),
                    ),
                )
            })
            .collect();
        assert_eq!(got, expected, "{ctx}");
        assert_eq!(u(&d["kernels_hidden"]), unchanged, "{ctx}");
        // Most GPU time moved first.
        let moved: Vec<u64> = d["kernels"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["total_ns"]["delta"].as_i64().unwrap().unsigned_abs())
            .collect();
        assert!(moved.windows(2).all(|w| w[0] >= w[1]), "{ctx}: {moved:?}");

        // Sync time per line: the reports' sync-attribution insights, line by line.
        let (sb, sn) = (sync_lines(&rb), sync_lines(&rn));
        let lines: BTreeMap<_, _> = d["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| (place(&l["location"]), l))
            .collect();
        for at in sb.keys().chain(sn.keys()).collect::<BTreeSet<_>>() {
            let (eb, en) = (
                sb.get(at).copied().unwrap_or_default(),
                sn.get(at).copied().unwrap_or_default(),
            );
            match lines.get(at) {
                Some(l) => {
                    assert_eq!(
                        (u(&l["syncs"]["base"]), u(&l["syncs"]["new"])),
                        (eb.0, en.0),
                        "{ctx} {at:?}"
                    );
                    assert_eq!(
                        (
                            u(&l["sync_blocked_ns"]["base"]),
                            u(&l["sync_blocked_ns"]["new"])
                        ),
                        (eb.1, en.1),
                        "{ctx} {at:?}"
                    );
                    let status = match (sb.contains_key(at), sn.contains_key(at)) {
                        (true, false) => "gone",
                        (false, true) => "new",
                        _ => "changed",
                    };
                    // A line may also have copies: it is new or gone only if neither it has.
                    if status == "changed" || u(&l["copies"]["base"]) + u(&l["copies"]["new"]) == 0
                    {
                        assert_eq!(l["status"], status, "{ctx} {at:?}");
                    }
                }
                None => assert_eq!(eb, en, "{ctx} {at:?}: hidden but changed"),
            }
        }

        // Insights: new, gone, changed (severity, count or impact), the others hidden.
        let (ib, inn) = (insights(&rb), insights(&rn));
        let mut expected: BTreeMap<(String, String), usize> = BTreeMap::new();
        let mut unchanged = 0;
        for k in ib.keys().chain(inn.keys()).collect::<BTreeSet<_>>() {
            let status = match (ib.get(k), inn.get(k)) {
                (Some(_), None) => "gone",
                (None, Some(_)) => "new",
                (x, y) if x == y => {
                    unchanged += 1;
                    continue;
                }
                _ => "changed",
            };
            let rule = k.split(' ').next().unwrap().trim_matches('"').to_string();
            *expected.entry((status.to_string(), rule)).or_default() += 1;
        }
        let mut got: BTreeMap<(String, String), usize> = BTreeMap::new();
        for i in d["insights"].as_array().unwrap() {
            let k = (
                i["status"].as_str().unwrap().to_string(),
                i["rule"].as_str().unwrap().to_string(),
            );
            *got.entry(k).or_default() += 1;
        }
        assert_eq!(got, expected, "{ctx}");
        assert_eq!(u(&d["insights_hidden"]), unchanged, "{ctx}");
    }
}

/// The regressions and exit status follow from the two reports: wall, host blocked (syncs and
/// blocking copies, the headline's) or GPU busy time grown by more than the threshold, or a HIGH insight that is new; exit 3 then, else 0.
#[test]
fn exit_status_gates_on_regressions_the_reports_imply() {
    let mut seen = BTreeSet::new();
    for (b, n) in pairs() {
        let (bd, nd) = (session(b), session(n));
        let (rb, rn) = (report(&bd), report(&nd));
        let (ib, inn) = (insights(&rb), insights(&rn));
        for pct in [5.0, 10000.0] {
            let mut expected = Vec::new();
            for (metric, f) in [
                ("wall", "wall_ns"),
                ("host_blocked", "host_blocked_ns"),
                ("gpu_busy", "gpu_busy_ns"),
            ] {
                let (eb, en) = (u(&rb["headline"][f]) as f64, u(&rn["headline"][f]) as f64);
                if en > eb && (eb == 0.0 || (en - eb) * 100.0 / eb > pct) {
                    expected.push(metric.to_string());
                }
            }
            for (k, (sev, _, _)) in &inn {
                if sev == "HIGH" && !ib.contains_key(k) {
                    expected.push("new_high_insight".to_string());
                }
            }
            let arg = format!("{pct}%");
            let (code, d) = diff_json(&bd, &nd, &["--fail-on-regression", &arg]);
            let got: Vec<String> = d["regressions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["metric"].as_str().unwrap().to_string())
                .collect();
            let ctx = format!("{b} → {n} at {pct} %");
            assert_eq!(got, expected, "{ctx}");
            let regressed = !expected.is_empty();
            assert_eq!(code, if regressed { 3 } else { 0 }, "{ctx}");
            assert_eq!(d["regressed"], regressed, "{ctx}");
            assert_eq!(d["exit_status"], code, "{ctx}");
            seen.insert((regressed, expected.contains(&"new_high_insight".into())));
            // The text output exits the same way.
            let (tcode, text, _) =
                run(gpufl().args(["diff", "--fail-on-regression", &arg, &bd, &nd]));
            assert_eq!(tcode, code, "{ctx}");
            assert_eq!(text.contains("(exit status 3)"), regressed, "{ctx}");
        }
        // Without --fail-on-regression nothing gates.
        let (code, d) = diff_json(&bd, &nd, &[]);
        assert_eq!(code, 0);
        assert_eq!(d["regressions"], serde_json::json!([]));
    }
    // Both outcomes were exercised. (No bundled pair has a new HIGH insight since severity is
    // the impact's share of the whole session: the unit tests of gpufl-analysis's diff cover
    // that gate.)
    assert!(seen.contains(&(false, false)), "{seen:?}");
    assert!(seen.iter().any(|&(regressed, _)| regressed), "{seen:?}");
}

#[test]
fn the_heavier_loop_regresses_and_the_lighter_one_does_not() {
    let (light, heavy) = (session(TRAIN), session(HEAVY));
    let (code, d) = diff_json(&light, &heavy, &["--fail-on-regression", "5%"]);
    assert_eq!(code, 3);
    let metrics: Vec<&str> = d["regressions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["metric"].as_str().unwrap())
        .collect();
    assert_eq!(metrics, ["wall", "host_blocked", "gpu_busy"]);
    // The planted sync's line: same calls, far more time blocked.
    let l = d["lines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["location"]["line"] == 45)
        .expect("line 45");
    assert_eq!(l["status"], "changed");
    assert_eq!(l["syncs"]["delta"], 0);
    assert!(l["sync_blocked_ns"]["delta"].as_i64().unwrap() > 1_000_000_000);
    let (code, d) = diff_json(&heavy, &light, &["--fail-on-regression", "5%"]);
    assert_eq!(code, 0, "{:#}", d["regressions"]);
}

#[test]
fn a_session_against_itself_has_no_changes() {
    for s in [TRAIN, ITEM] {
        let dir = session(s);
        let (code, d) = diff_json(
            &dir,
            &dir,
            &["--threshold", "0", "--fail-on-regression", "0"],
        );
        assert_eq!(code, 0);
        for part in ["kernels", "lines", "insights", "regressions"] {
            assert_eq!(d[part], serde_json::json!([]), "{s} {part}");
        }
        assert!(u(&d["kernels_hidden"]) > 0 && u(&d["insights_hidden"]) > 0);
        assert_eq!(d["totals"]["wall_ns"]["delta"], 0);
        let (code, text, _) = run(gpufl().args(["diff", &dir, &dir]));
        assert_eq!(code, 0);
        assert!(text.contains("No change beyond the threshold."), "{text}");
    }
}

/// A higher threshold hides what moved less; new and gone always show.
#[test]
fn the_threshold_hides_small_changes() {
    let (b, n) = (session(ITEM), session(CPU));
    let (_, all) = diff_json(&b, &n, &["--threshold", "0"]);
    let (_, some) = diff_json(&b, &n, &["--threshold", "20%"]);
    let lines = |d: &Value| d["lines"].as_array().unwrap().len();
    assert!(
        lines(&some) < lines(&all),
        "{} vs {}",
        lines(&some),
        lines(&all)
    );
    assert_eq!(
        lines(&some) as u64 + u(&some["lines_hidden"]),
        lines(&all) as u64 + u(&all["lines_hidden"])
    );
    for l in some["lines"].as_array().unwrap() {
        if l["status"] != "changed" {
            continue;
        }
        let big = ["syncs", "sync_blocked_ns", "copies", "copy_ns"]
            .iter()
            .any(|f| l[f]["delta"] != 0 && l[f]["pct"].as_f64().is_none_or(|p| p.abs() >= 20.0));
        assert!(big, "{l}");
    }
    let news = |d: &Value| {
        d["insights"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["status"] != "changed")
            .count()
    };
    assert_eq!(news(&some), news(&all));
}

#[test]
fn diff_snapshots() {
    for (b, n) in [(TRAIN, HEAVY), (ITEM, CPU)] {
        let (bd, nd) = (session(b), session(n));
        let name = format!("{b}_vs_{n}");
        let (_, text, _) = run(gpufl().args(["diff", "--fail-on-regression", "5%", &bd, &nd]));
        insta::assert_snapshot!(format!("diff_text_{name}"), text);
        let (_, out, _) =
            run(gpufl().args(["diff", "--json", "--fail-on-regression", "5%", &bd, &nd]));
        insta::assert_snapshot!(format!("diff_json_{name}"), out);
    }
}

#[test]
fn not_one_session_or_a_bad_percentage_is_an_error() {
    let s = session(TRAIN);
    let (code, _, err) = run(gpufl().args(["diff", "testdata/sessions", &s]));
    assert_eq!(code, 2);
    assert!(
        err.contains("sessions; pass one session directory"),
        "{err}"
    );
    let (code, _, err) = run(gpufl().args(["diff", &s, "no/such/dir"]));
    assert_eq!(code, 2);
    assert!(err.contains("no/such/dir does not exist"), "{err}");
    let (code, _, err) = run(gpufl().args(["diff", &s, "crates"]));
    assert_eq!(code, 2);
    assert!(err.contains("not a gpufl session directory"), "{err}");
    for bad in [["--threshold=-1"], ["--fail-on-regression=five"]] {
        let (code, _, err) = run(gpufl().arg("diff").args(bad).args([&s, &s]));
        assert_eq!(code, 2, "{bad:?}");
        assert!(err.contains("percentage"), "{err}");
    }
}

/// The pair recorded for `gpufl diff` (scripts/gpu-phases/diffpair.sh): the same run of
/// examples/pytorch_train_sync.py, the second with `--extra-sync`, one `loss.item()` per step at
/// the line marked "planted extra sync". Kept as testdata/sessions/diffpair_base-… and
/// diffpair_new-…; ignored until they are there.
#[test]
fn planted_extra_sync_pair() {
    let (b, n) = (session("diffpair_base-"), session("diffpair_new-"));
    let (rb, rn) = (report(&b), report(&n));
    let src = std::fs::read_to_string(root().join("examples/pytorch_train_sync.py")).unwrap();
    let planted = 1 + src
        .lines()
        .position(|l| l.contains("planted extra sync"))
        .expect("the planted line") as u64;
    // One more sync and one more device-to-host copy per step (warmup included), no more kernels.
    let steps = 55;
    let (code, d) = diff_json(&b, &n, &["--fail-on-regression", "5%"]);
    assert_eq!(d["totals"]["syncs"]["delta"], steps);
    assert_eq!(d["totals"]["copies"]["delta"], steps);
    assert_eq!(d["totals"]["kernels"]["delta"], 0);
    assert_eq!(
        u(&rn["totals"]["syncs"]) - u(&rb["totals"]["syncs"]),
        steps as u64
    );
    let new_lines: Vec<&Value> = d["lines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["status"] == "new")
        .collect();
    assert_eq!(new_lines.len(), 1, "{new_lines:#?}");
    let l = new_lines[0];
    assert_eq!(l["location"]["line"], planted);
    assert_eq!(l["location"]["function"], "extra_item");
    assert_eq!(l["syncs"]["new"], steps);
    assert_eq!(l["copies"]["new"], steps);
    // Every other line is the same code: its calls did not change (times may).
    for l in d["lines"].as_array().unwrap() {
        if l["status"] == "changed" {
            assert_eq!(l["syncs"]["delta"], 0, "{l}");
            assert_eq!(l["copies"]["delta"], 0, "{l}");
        }
    }
    assert!(d["lines"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["status"] != "gone"));
    // The kernels are the same: their launches did not change.
    for k in d["kernels"].as_array().unwrap() {
        assert_eq!(k["status"], "changed", "{k}");
        assert_eq!(k["launches"]["delta"], 0, "{k}");
    }
    // New insights are at the planted line only.
    for i in d["insights"].as_array().unwrap() {
        if i["status"] == "new" {
            assert_eq!(i["location"]["line"], planted, "{i}");
        }
    }
    // Exit 3 exactly when the reports say something regressed beyond 5 %.
    let grew = |f: &str| {
        let (x, y) = (u(&rb["totals"][f]) as f64, u(&rn["totals"][f]) as f64);
        y > x && (x == 0.0 || (y - x) * 100.0 / x > 5.0)
    };
    let high_new = d["insights"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["status"] == "new" && i["new"]["severity"] == "HIGH");
    let regressed = grew("wall_ns") || grew("sync_blocked_ns") || grew("gpu_busy_ns") || high_new;
    assert_eq!(code, if regressed { 3 } else { 0 });
    let (_, text, _) = run(gpufl().args(["diff", "--fail-on-regression", "5%", &b, &n]));
    insta::assert_snapshot!("diff_text_diffpair", text);
}

/// A session of CUDA graph replays written to `root`: `replays` replays of a 2-node graph
/// (CUPTI id `graph`) launched at replay.cu:40, each node `node_ns` long, 40 µs of host time
/// between replays; with `unlined`, 5 replays of another graph (id `graph + 1`) launched without
/// a call site. One node's name holds an escape sequence.
fn write_graph_session(root: &Path, name: &str, graph: u32, node_ns: u64, unlined: bool) -> String {
    use gpufl_trace::*;
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let header = Header {
        session_id: name.into(),
        app_name: "graph_replay".into(),
        command_line: vec!["build/graph_replay".into()],
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    };
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &header).unwrap();
    let file_id = w.intern_str("/work/examples/replay.cu").unwrap();
    let func = w.intern_str("replay_loop(int)").unwrap();
    let module = w.intern_str("/work/build/graph_replay").unwrap();
    let f = w
        .intern_frame(FrameData {
            kind: FrameKind::Native,
            module: Some(module),
            offset: Some(0x1040),
            func: Some(func),
            file: Some(file_id),
            line: Some(40),
            inlined: false,
            text: None,
        })
        .unwrap();
    let launch_at = w.intern_stack(&[f]).unwrap();
    let launch = w.intern_str("cudaGraphLaunch").unwrap();
    let nodes = [
        w.intern_str("scale(float*, int)").unwrap(),
        w.intern_str("add\x1b[2J(float*, int)").unwrap(),
    ];
    let other = w.intern_str("fill\x1b]0;x(float*)").unwrap();
    let mut t = 1_000_000_000u64;
    let mut corr = 0u32;
    let graphs: Vec<(u32, u32, bool)> = [(graph, 20, true), (graph + 1, 5, false)]
        .into_iter()
        .filter(|g| g.2 || unlined)
        .collect();
    for (id, replays, lined) in graphs {
        for _ in 0..replays {
            corr += 1;
            w.write(&Record::Api(Api {
                domain: ApiDomain::Runtime,
                name: launch,
                cbid: 311,
                start: t,
                end: t + 6_000,
                tid: 11,
                corr,
                ret: 0,
            }))
            .unwrap();
            if lined {
                w.write(&Record::Callsite(Callsite {
                    corr,
                    api: launch,
                    tid: 11,
                    ts: t,
                    stack: launch_at,
                    weight: None,
                }))
                .unwrap();
            }
            let mut g = t + 8_000;
            let names: &[StrId] = if lined { &nodes } else { &[other] };
            for (n, &k) in names.iter().enumerate() {
                w.write(&Record::Kernel(Kernel {
                    name: k,
                    start: g,
                    end: g + node_ns,
                    dev: 0,
                    ctx: 1,
                    stream: 9,
                    corr,
                    grid: [132, 1, 1],
                    block: [256, 1, 1],
                    graph: Some(GraphNode(id, 10 + n as u64)),
                    ..Kernel::default()
                }))
                .unwrap();
                g += node_ns;
            }
            t = g + 40_000;
        }
    }
    w.finish(0, "exit").unwrap();
    dir.to_str().unwrap().to_string()
}

#[test]
fn graphs_are_matched_by_launch_line_and_compared() {
    let root = std::env::temp_dir().join(format!("gpufl-diff-graphs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    // The graph at replay.cu:40 is graph 3 in BASE and graph 8 in NEW, its nodes 50 % slower;
    // BASE has a second graph without a launch line, gone in NEW.
    let base = write_graph_session(&root, "graph_replay-1-20261126T010000Z", 3, 20_000, true);
    let new = write_graph_session(&root, "graph_replay-2-20261126T010100Z", 8, 30_000, false);

    let (code, text, err) = run(gpufl().args(["diff", "--fail-on-regression", "5%", &base, &new]));
    assert_eq!(code, 3, "{err}");
    assert!(
        text.contains("CUDA graphs (0 new, 1 gone, 1 changed, 0 unchanged or under the threshold; matched by launch line, else by their top operations)"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.contains("replay.cu:40"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(row.trim_start().starts_with("changed"), "{row}");
    for want in [
        "20 → 20",
        "40.0 µs → 60.0 µs",
        "+20.0 µs",
        "+50.0 %",
        "800.0 µs → 1.20 ms",
        "replay_loop(int) · graph 3 → 8",
    ] {
        assert!(row.contains(want), "{want:?} in {row}");
    }
    let gone = text
        .lines()
        .find(|l| l.contains("no launch line"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(gone.trim_start().starts_with("gone"), "{gone}");
    // The operation's name from the trace, escaped.
    assert!(
        gone.contains("5 → 0") && gone.contains("· fill\\u{1b}]0;x · graph 4"),
        "{gone}"
    );
    assert!(!text.contains('\x1b'), "raw escape in the diff");
    // Graphs do not gate by themselves: wall and GPU busy time do.
    let gate: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.contains("Regressions beyond 5 %"))
        .skip(1)
        .collect();
    assert!(gate.iter().any(|l| l.contains("GPU busy time")), "{text}");
    assert!(!gate.iter().any(|l| l.contains("graph")), "{text}");

    let (code, json, err) = run(gpufl().args(["diff", "--json", &base, &new]));
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&json).unwrap();
    let gs = v["graphs"].as_array().unwrap();
    assert_eq!(gs.len(), 2, "{gs:?}");
    let g = gs.iter().find(|g| g["status"] == "changed").unwrap();
    assert_eq!(g["matched_by"], "line");
    assert_eq!(g["launch_location"]["line"], 40);
    assert_eq!(g["base"]["graph"], 3);
    assert_eq!(g["new"]["graph"], 8);
    assert_eq!(g["replays"]["delta"], 0);
    assert_eq!(g["replay_median_ns"]["base"], 40_000);
    assert_eq!(g["replay_median_ns"]["new"], 60_000);
    assert_eq!(g["replay_median_ns"]["pct"], 50.0);
    assert_eq!(g["replay_total_ns"]["delta"], 400_000);
    assert!(g["gap_idle_ns"]["base"].as_u64().unwrap() > 0);
    // JSON keeps the names exact.
    assert!(g["ops"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o == "add\x1b[2J(float*, int)"));
    let gone = gs.iter().find(|g| g["status"] == "gone").unwrap();
    assert_eq!(gone["matched_by"], "ops");
    assert!(gone.get("launch_location").is_none() && gone.get("new").is_none());
    assert!(v.get("graphs_hidden").is_none());
    let m: Vec<&str> = v["regressions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["metric"].as_str().unwrap())
        .collect();
    assert!(m.is_empty(), "no --fail-on-regression: {m:?}");

    // Against itself: the graphs are counted as unchanged, the section stays.
    let (code, text, err) = run(gpufl().args(["diff", &base, &base]));
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("CUDA graphs (0 new, 0 gone, 0 changed, 2 unchanged or under the threshold;"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

#[test]
fn sessions_without_graphs_have_no_graph_section() {
    let (bd, nd) = (session(TRAIN), session(HEAVY));
    let (_, text, _) = run(gpufl().args(["diff", &bd, &nd]));
    assert!(!text.contains("CUDA graphs"), "{text}");
    let (_, v) = diff_json(&bd, &nd, &[]);
    assert!(v.get("graphs").is_none() && v.get("graphs_hidden").is_none());
}

/// The `memory-peak` findings' peaks of a session's report, by device.
fn report_peaks(dir: &str) -> BTreeMap<u64, u64> {
    let r = report(dir);
    r["insights"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["rule"] == "memory-peak")
        .map(|i| {
            (
                i["data"]["device"].as_u64().unwrap(),
                i["data"]["peak_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Memory (issue 38): a cudaMallocAsync pool against PyTorch's expandable segments. Each
/// device's peak is the one each session's `memory-peak` finding reports; with threshold 0 every
/// allocating line is listed and the lines' live bytes at the peak add up to each side's peak;
/// the session against itself moves nothing.
#[test]
fn memory_peaks_and_lines_between_two_sessions() {
    let (pool, exp) = (
        session("mempool_async-1273-"),
        session("pytorch_expandable-1443-"),
    );
    let (bp, np) = (report_peaks(&pool), report_peaks(&exp));
    assert!(!bp.is_empty() && !np.is_empty());
    let (_, d) = diff_json(&pool, &exp, &["--threshold", "0"]);
    let m = &d["memory"];
    for dv in m["devices"].as_array().unwrap() {
        let dev = dv["device"].as_u64().unwrap();
        let p = &dv["peak_bytes"];
        let (b, n) = (
            bp.get(&dev).copied().unwrap_or(0),
            np.get(&dev).copied().unwrap_or(0),
        );
        assert_eq!(p["base"].as_u64(), Some(b), "{dv}");
        assert_eq!(p["new"].as_u64(), Some(n), "{dv}");
        assert_eq!(p["delta"].as_i64(), Some(n as i64 - b as i64), "{dv}");
    }
    let lines = m["lines"].as_array().unwrap();
    assert_eq!(m["lines_hidden"], 0);
    let sum = |side: &str| -> u64 {
        lines
            .iter()
            .map(|l| l["peak_live"][side].as_u64().unwrap())
            .sum()
    };
    assert_eq!(sum("base"), bp.values().sum::<u64>());
    assert_eq!(sum("new"), np.values().sum::<u64>());
    // The pool's line is gone in NEW; the expandable run's segments (mapped without a stack)
    // hold its peak.
    assert!(lines.iter().any(|l| l["status"] == "gone"
        && l["location"]["file"]
            .as_str()
            .unwrap()
            .ends_with("mempool_async.cu")));
    assert!(lines
        .iter()
        .any(|l| l["location"]["location"] == "(no stack)"
            && l["peak_live"]["new"].as_u64().unwrap() >= 1 << 30));
    let (code, text, err) = run(gpufl().args(["diff", &pool, &exp]));
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("Memory: peak live bytes of the process per device"),
        "{text}"
    );
    assert!(text.contains("mempool_async.cu:67"), "{text}");

    // The same session twice: zero deltas, every line unchanged.
    let (_, d) = diff_json(&exp, &exp, &["--threshold", "0"]);
    let m = &d["memory"];
    assert!(m["devices"]
        .as_array()
        .unwrap()
        .iter()
        .all(|dv| dv["peak_bytes"]["delta"] == 0 && dv.get("status").is_none()));
    assert!(m["lines"].as_array().unwrap().is_empty());
    assert!(m["lines_hidden"].as_u64().unwrap() > 0);
}
