//! The rule table against docs/insights.md: every rule of the table has its section (a
//! `## Rule `name`` heading, whose anchor is the table's), and every rule documented there is in
//! the table. And the table's other columns: categories, exactness, which rules run per session.

use gpufl_analysis::rules::{self, Category, RULES};
use std::collections::BTreeSet;

/// The anchor GitHub gives a heading: lower case, punctuation other than `-` and `_` dropped,
/// spaces made `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The `## ` headings of docs/insights.md: (the rule's name for a `Rule `name`` heading, anchor).
fn documented() -> Vec<(Option<String>, String)> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/insights.md");
    let text = std::fs::read_to_string(path).expect("docs/insights.md");
    text.lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            let rule = h
                .strip_prefix("Rule `")
                .and_then(|r| r.strip_suffix('`'))
                .map(str::to_string);
            (rule, anchor(h))
        })
        .collect()
}

#[test]
fn every_rule_of_the_table_is_documented_under_its_anchor() {
    let docs = documented();
    let anchors: BTreeSet<&str> = docs.iter().map(|d| d.1.as_str()).collect();
    for r in RULES {
        assert!(
            anchors.contains(r.anchor),
            "rule {}: no heading with anchor #{} in docs/insights.md",
            r.name,
            r.anchor
        );
        assert_eq!(r.anchor, format!("rule-{}", r.name), "rule {}", r.name);
    }
}

#[test]
fn every_documented_rule_is_in_the_table() {
    let docs = documented();
    let documented: Vec<(&str, &str)> = docs
        .iter()
        .filter_map(|(rule, a)| Some((rule.as_deref()?, a.as_str())))
        .collect();
    assert!(documented.len() >= 24, "{documented:?}");
    for (name, a) in documented {
        let spec = rules::spec(name)
            .unwrap_or_else(|| panic!("docs/insights.md documents rule {name}: not in the table"));
        assert_eq!(spec.anchor, a, "rule {name}");
    }
}

#[test]
fn names_are_unique_and_spec_finds_each() {
    let names: BTreeSet<&str> = RULES.iter().map(|r| r.name).collect();
    assert_eq!(names.len(), RULES.len());
    for r in RULES {
        assert_eq!(rules::spec(r.name).map(|s| s.name), Some(r.name));
    }
    assert!(rules::spec("no-such-rule").is_none());
}

#[test]
fn categories_are_the_dashboards() {
    let of = |name: &str| rules::spec(name).map(|s| s.category.as_str());
    for (names, category) in [
        (
            &[
                "sync-attribution",
                "in-loop-sync",
                "blocking-call",
                "host-read",
                "graph-replay-gaps",
            ][..],
            "SYNCHRONIZATION",
        ),
        (
            &[
                "pageable-async-copy",
                "blocking-copy",
                "default-stream-barrier",
                "device-wide-sync",
                "no-copy-compute-overlap",
                "collective-wait",
            ][..],
            "STREAMS & TRANSFERS",
        ),
        (
            &[
                "gpu-idle",
                "launch-bound",
                "low-utilization",
                "torch-compile",
            ][..],
            "IDLE GPU",
        ),
        (
            &[
                "low-occupancy",
                "register-spill",
                "under-filled-grid",
                "warp-divergence",
                "uncoalesced-access",
                "bank-conflicts",
                "stall-reasons",
            ][..],
            "KERNELS",
        ),
        (
            &["throttling", "memory-pressure", "ecc-errors"][..],
            "SYSTEM",
        ),
    ] {
        for n in names {
            assert_eq!(of(n), Some(category), "{n}");
        }
    }
    assert_eq!(
        Category::StreamsAndTransfers.as_str(),
        "STREAMS & TRANSFERS"
    );
}

#[test]
fn only_collective_wait_runs_across_ranks() {
    let cross: Vec<&str> = RULES
        .iter()
        .filter(|r| r.is_cross_rank())
        .map(|r| r.name)
        .collect();
    assert_eq!(cross, ["collective-wait"]);
}
