//! Issue 37's acceptance over every bundled session (testdata/sessions) and run (testdata/runs),
//! through the `gpufl` binary: one ranked list whose severities never rise, one finding per line
//! and cause.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

mod common;
use common::root;

fn bundled() -> Vec<PathBuf> {
    common::bundled_all()
}

fn gpufl(args: &[&str], dir: &Path) -> String {
    String::from_utf8(common::gpufl_on(args, dir)).expect("utf-8")
}

/// `gpufl report --json` of every bundled directory, computed once for the tests of this file.
fn reports() -> &'static [(PathBuf, Value)] {
    static R: OnceLock<Vec<(PathBuf, Value)>> = OnceLock::new();
    R.get_or_init(|| {
        bundled()
            .into_iter()
            .map(|d| {
                let v = serde_json::from_str(&gpufl(&["report", "--json"], &d)).expect("json");
                (d, v)
            })
            .collect()
    })
}

/// Each insight list of a report (`name`, list): the sessions', and the run's cross-rank one.
fn lists(v: &Value) -> Vec<(String, &Vec<Value>)> {
    let mut out = Vec::new();
    if let Some(l) = v.pointer("/run/insights").and_then(Value::as_array) {
        out.push(("run".to_string(), l));
    }
    for s in v["sessions"].as_array().expect("sessions") {
        let name = s["session"].as_str().unwrap_or_default().to_string();
        out.push((name, s["insights"].as_array().expect("insights")));
    }
    out
}

fn rank_of(severity: &str) -> u8 {
    match severity {
        "HIGH" => 2,
        "MEDIUM" => 1,
        "LOW" => 0,
        s => panic!("severity {s}"),
    }
}

#[test]
fn severities_never_rise_down_the_ranked_list() {
    let (mut lists_seen, mut insights, mut not_low) = (0, 0, 0);
    for (dir, v) in reports() {
        for (name, list) in lists(v) {
            lists_seen += 1;
            let mut last: Option<(u64, u8)> = None;
            for (n, i) in list.iter().enumerate() {
                insights += 1;
                let impact = i["impact_ns"].as_u64().expect("impact_ns");
                let sev = rank_of(i["severity"].as_str().expect("severity"));
                not_low += usize::from(sev > 0);
                if let Some((li, ls)) = last {
                    assert!(
                        impact <= li && sev <= ls,
                        "{} {name}: insight {} ({}, {}) after one of impact {li}, severity {ls}",
                        dir.display(),
                        n + 1,
                        i["title"],
                        i["severity"]
                    );
                }
                last = Some((impact, sev));
            }
        }
    }
    // The bundled sessions have findings, and some that matter.
    assert!(
        lists_seen > 30 && insights > 100 && not_low > 5,
        "{lists_seen} {insights} {not_low}"
    );
}

/// A finding's line: its file and line, and its library line.
fn line_key(loc: &Value) -> String {
    let lib = &loc["library"];
    format!(
        "{}:{}|{}:{}",
        loc["file"].as_str().unwrap_or_default(),
        loc["line"],
        lib["file"].as_str().unwrap_or_default(),
        lib["line"]
    )
}

#[test]
fn one_finding_per_line_and_cause() {
    let mut merged = 0;
    for (dir, v) in reports() {
        for (name, list) in lists(v) {
            let mut seen = std::collections::HashSet::new();
            for i in list {
                let cause = i["cause"].as_str().expect("every finding has a cause");
                let key = (line_key(&i["location"]), cause.to_string());
                assert!(
                    seen.insert(key.clone()),
                    "{} {name}: two findings at {key:?}",
                    dir.display()
                );
                merged += i["facets"].as_array().map_or(0, Vec::len);
            }
        }
    }
    assert!(merged > 0, "no finding holds facets");
}

#[test]
fn hf_trainer_item_at_trainer_2175_is_one_finding() {
    let (_, v) = reports()
        .iter()
        .find(|(d, _)| {
            d.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("hf_trainer-1609")
        })
        .expect("hf_trainer-1609");
    let list = lists(v).remove(0).1;
    let at: Vec<&Value> = list
        .iter()
        .filter(|i| {
            let l = &i["location"]["library"];
            l["file"]
                .as_str()
                .is_some_and(|f| f.ends_with("transformers/trainer.py"))
                && l["line"] == 2175
        })
        .collect();
    assert_eq!(at.len(), 1, "{at:#?}");
    let mut rules: Vec<&str> = vec![at[0]["rule"].as_str().unwrap()];
    for f in at[0]["facets"].as_array().into_iter().flatten() {
        rules.push(f["rule"].as_str().unwrap());
    }
    // The `.item()`: a blocking copy and its sync (and the loop it is in), said once.
    for r in ["blocking-copy", "sync-attribution"] {
        assert!(rules.contains(&r), "{rules:?}");
    }
    // The report text says the fix once for it.
    let text = gpufl(
        &["report", "--color", "never"],
        &root().join("testdata/sessions").join(
            std::fs::read_dir(root().join("testdata/sessions"))
                .unwrap()
                .filter_map(|e| e.ok())
                .map(|e| e.file_name())
                .find(|n| n.to_string_lossy().starts_with("hf_trainer-1609"))
                .unwrap(),
        ),
    );
    let headers = text
        .lines()
        .filter(|l| l.contains("trainer.py:2175") && l.trim_start().starts_with("at "))
        .count();
    assert_eq!(headers, 1, "{text}");
}
