//! The Chrome JSON export checked against the Trace Event Format: `{"traceEvents": [...]}` with
//! `ph` among X (complete: `ts`, `dur` in µs), i (instant, with scope `s`), C (counter: numeric
//! `args`), s / f (flow start / end: matching `id`, `f` with `bp: "e"`), M (metadata: process and
//! thread names, sort indices); `pid` / `tid` integers; `args` objects. Then the content: every
//! GPU work record once on its stream's thread, flows between existing slices, sync stacks,
//! counters, insights.

mod common;

use common::*;
use gpufl_export::{export, Format, Options};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};

fn chrome(dirs: &[std::path::PathBuf]) -> Value {
    let mut out = Vec::new();
    let opts = Options {
        format: Format::Chrome,
        ..Options::default()
    };
    export(dirs, &mut out, &opts).unwrap();
    serde_json::from_slice(&out).expect("valid JSON")
}

/// Schema check of one event; returns its ph.
fn schema(e: &Value) -> String {
    let o = e.as_object().expect("event object");
    let ph = o["ph"].as_str().expect("ph").to_string();
    assert!(o["pid"].is_u64() && o["tid"].is_u64(), "{e}");
    assert!(o["name"].is_string(), "{e}");
    if ph != "M" {
        assert!(o["ts"].is_number(), "{e}");
    }
    match ph.as_str() {
        "X" => {
            assert!(o["dur"].as_f64().unwrap() >= 0.0);
            assert!(o["cat"].is_string() && o["args"].is_object());
        }
        "i" => assert!(matches!(o["s"].as_str(), Some("t" | "p" | "g"))),
        "C" => {
            let args = o["args"].as_object().unwrap();
            assert!(
                !args.is_empty() && args.values().all(|v| v.is_number()),
                "{e}"
            );
        }
        "s" => assert!(o["id"].is_u64()),
        "f" => {
            assert!(o["id"].is_u64());
            assert_eq!(o["bp"], "e");
        }
        "M" => {
            assert!(matches!(
                o["name"].as_str().unwrap(),
                "process_name" | "thread_name" | "process_sort_index" | "thread_sort_index"
            ));
            assert!(o["args"].is_object());
        }
        other => panic!("unexpected ph {other}"),
    }
    ph
}

/// A slice on a thread: start, end (ns), category.
type Span<'a> = (i128, i128, &'a str);

/// ts in ns (relative to the base), from the µs with three decimals.
fn ns(v: &Value) -> i128 {
    (v.as_f64().unwrap() * 1000.0).round() as i128
}

fn check(doc: &Value, dirs: &[std::path::PathBuf]) {
    let base: i128 = doc["otherData"]["base_unix_ns"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let evs = doc["traceEvents"].as_array().unwrap();
    let mut thread_names: HashMap<(u64, u64), String> = HashMap::new();
    for e in evs {
        if schema(e) == "M" && e["name"] == "thread_name" {
            thread_names.insert(
                (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()),
                e["args"]["name"].as_str().unwrap().to_string(),
            );
        }
    }
    let slices: Vec<&Value> = evs.iter().filter(|e| e["ph"] == "X").collect();
    for dir in dirs {
        let x = expected(dir);
        let pid = x.pid as u64;
        let mine: Vec<&&Value> = slices.iter().filter(|e| e["pid"] == pid).collect();
        let got: Vec<GpuWork> = mine
            .iter()
            .filter_map(|e| {
                let cat = match e["cat"].as_str()? {
                    "kernel" => "kernel",
                    "memcpy" => "memcpy",
                    "memset" => "memset",
                    _ => return None,
                };
                let tn = &thread_names[&(pid, e["tid"].as_u64().unwrap())];
                let dev = tn.strip_prefix("GPU ")?.split(' ').next()?.parse().ok()?;
                let stream = tn.rsplit("stream ").next()?.parse().ok()?;
                Some((
                    dev,
                    stream,
                    cat,
                    e["name"].as_str()?.to_string(),
                    (ns(&e["ts"]) + base) as u64,
                    ns(&e["dur"]) as u64,
                ))
            })
            .collect();
        // Times survive the double only to within a ns or so: compare them rounded to 10 ns.
        let r = |v: Vec<GpuWork>| {
            counts(
                v.into_iter()
                    .map(|g| (g.0, g.1, g.2, g.3, g.4 / 10, g.5 / 10)),
            )
        };
        let (g, w) = (r(got), r(x.gpu.clone()));
        assert_eq!(
            g.values().sum::<usize>(),
            w.values().sum::<usize>(),
            "{}",
            dir.display()
        );
        let close = g == w || {
            // Rounding can move a time across a 10 ns boundary: compare counts per (dev, stream, cat, name).
            let k = |m: &BTreeMap<_, usize>| {
                counts(
                    m.iter()
                        .flat_map(|(k, &n): (&(u32, u32, &str, String, u64, u64), _)| {
                            std::iter::repeat_n((k.0, k.1, k.2, k.3.clone()), n)
                        }),
                )
            };
            k(&g) == k(&w)
        };
        assert!(close, "{}", dir.display());
        let syncs: Vec<&&&Value> = mine.iter().filter(|e| e["cat"] == "sync").collect();
        assert_eq!(syncs.len(), x.syncs);
        let stacks = syncs
            .iter()
            .filter(|e| e["args"]["stack"].as_array().is_some_and(|a| !a.is_empty()))
            .count();
        assert_eq!(stacks, x.syncs_with_stack);
        let counters = evs
            .iter()
            .filter(|e| e["ph"] == "C" && e["pid"] == pid)
            .count();
        assert_eq!(counters, x.telemetry_values);
        let insights = evs
            .iter()
            .filter(|e| e["ph"] == "i" && e["pid"] == pid && e["cat"] == "insight")
            .count();
        assert_eq!(insights, insight_count(dir));
    }
    // Flows: one s and one f per id, each inside a slice of its thread.
    let mut ends: BTreeMap<u64, (Vec<&Value>, Vec<&Value>)> = BTreeMap::new();
    for e in evs {
        match e["ph"].as_str().unwrap() {
            "s" => ends.entry(e["id"].as_u64().unwrap()).or_default().0.push(e),
            "f" => ends.entry(e["id"].as_u64().unwrap()).or_default().1.push(e),
            _ => {}
        }
    }
    let mut by_thread: HashMap<(u64, u64), Vec<Span>> = HashMap::new();
    for s in &slices {
        let t = ns(&s["ts"]);
        by_thread
            .entry((s["pid"].as_u64().unwrap(), s["tid"].as_u64().unwrap()))
            .or_default()
            .push((t, t + ns(&s["dur"]), s["cat"].as_str().unwrap()));
    }
    let enclosing = |e: &Value, cats: &[&str]| {
        let t = ns(&e["ts"]);
        by_thread[&(e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap())]
            .iter()
            .any(|&(a, b, c)| a <= t && t <= b && cats.contains(&c))
    };
    for (id, (s, f)) in &ends {
        assert_eq!((s.len(), f.len()), (1, 1), "flow {id}");
        assert!(enclosing(s[0], &["api", "callsite"]), "flow {id} source");
        assert!(
            enclosing(f[0], &["kernel", "memcpy", "memset"]),
            "flow {id} target"
        );
    }
}

#[test]
fn testdata_sessions_follow_the_trace_event_format() {
    for dir in sessions() {
        let doc = chrome(std::slice::from_ref(&dir));
        check(&doc, std::slice::from_ref(&dir));
    }
}

#[test]
fn several_sessions_in_one_file() {
    let dirs = vec![
        testdata("pytorch_train_sync-1304"),
        testdata("hf_trainer"),
        synthetic(),
    ];
    let doc = chrome(&dirs);
    check(&doc, &dirs);
    let procs = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "process_name")
        .count();
    assert_eq!(procs, 3);
}

#[test]
fn graph_work_carries_its_graph_node() {
    let doc = chrome(&[synthetic()]);
    let evs = doc["traceEvents"].as_array().unwrap();
    let memset = evs.iter().find(|e| e["name"] == "memset").unwrap();
    assert_eq!(memset["args"]["graph"], 7);
    assert_eq!(memset["args"]["graph_node"], 42);
    let kernel = evs.iter().find(|e| e["cat"] == "kernel").unwrap();
    assert!(kernel["args"].get("graph").is_none(), "{kernel}");
}

#[test]
fn hostile_strings_round_trip() {
    let doc = chrome(&[synthetic()]);
    let evs = doc["traceEvents"].as_array().unwrap();
    assert!(evs
        .iter()
        .any(|e| e["name"] == "void k<\"q\">(int)\n\t\u{0}\u{202e}evil"));
    assert!(evs.iter().any(|e| e["name"] == "process_name"
        && e["args"]["name"]
            .as_str()
            .unwrap()
            .starts_with("always\"on\n\u{1b}[31m")));
    let stack = evs
        .iter()
        .find(|e| e["cat"] == "sync")
        .map(|e| e["args"]["stack"][0].as_str().unwrap().to_string())
        .unwrap();
    assert_eq!(stack, "train_step (/src/train\\x.py:42)");
}

/// Hostcalls are complete events on their thread (tid = the OS thread id) with the call's name
/// and time; host samples complete events on a "host samples · thread T" thread, each ending at
/// its sample.
#[test]
fn host_calls_and_samples_are_on_their_threads() {
    let dir = testdata("pytorch_empty_cache-759-20261127T204130Z");
    let e = expected(&dir);
    let doc = chrome(std::slice::from_ref(&dir));
    check(&doc, std::slice::from_ref(&dir));
    let base: i128 = doc["otherData"]["base_unix_ns"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let evs = doc["traceEvents"].as_array().unwrap();
    let names: HashMap<u64, String> = evs
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let at = |e: &Value, k: &str| (ns(&e[k]) + base) as u64;
    // Within 10 ns (the µs doubles).
    let calls: Vec<(u64, String, u64, u64)> = evs
        .iter()
        .filter(|e| e["cat"] == "hostcall")
        .map(|e| {
            assert_eq!(e["ph"], "X");
            let tid = e["tid"].as_u64().unwrap();
            assert_eq!(names[&tid], format!("thread {tid}"));
            (
                tid,
                e["name"].as_str().unwrap().to_string(),
                at(e, "ts").div_ceil(10),
                (ns(&e["dur"]) as u64).div_ceil(10),
            )
        })
        .collect();
    let want = e
        .hostcalls
        .iter()
        .map(|(t, n, ts, d)| (*t, n.clone(), ts.div_ceil(10), d.div_ceil(10)));
    assert_eq!(calls.len(), e.hostcalls.len());
    let (got, want) = (counts(calls), counts(want));
    let close = got
        .keys()
        .zip(want.keys())
        .all(|(a, b)| a.0 == b.0 && a.1 == b.1 && a.2.abs_diff(b.2) <= 1 && a.3.abs_diff(b.3) <= 1);
    assert!(close, "hostcalls differ");
    let mut samples: Vec<(u64, u64, String)> = Vec::new();
    for s in evs.iter().filter(|e| e["cat"] == "hsample") {
        assert_eq!(s["ph"], "X");
        let track = &names[&s["tid"].as_u64().unwrap()];
        let tid: u64 = track
            .strip_prefix("host samples · thread ")
            .expect("a host-samples track")
            .parse()
            .unwrap();
        let end = (ns(&s["ts"]) + ns(&s["dur"]) + base) as u64;
        samples.push((tid, end / 1000, s["args"]["state"].as_str().unwrap().into()));
    }
    let want: Vec<(u64, u64, String)> = e
        .hsamples
        .iter()
        .map(|(t, ts, st, _)| (*t, ts / 1000, st.clone()))
        .collect();
    assert_eq!(samples.len(), want.len());
    let (g, w) = (counts(samples), counts(want));
    let near = g
        .keys()
        .zip(w.keys())
        .all(|(a, b)| a.0 == b.0 && a.1.abs_diff(b.1) <= 1 && a.2 == b.2);
    assert!(near, "host samples differ");
}
