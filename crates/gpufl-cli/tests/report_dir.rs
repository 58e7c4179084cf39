//! `gpufl report DIR` over several sessions starts with the answer (issue 37): a one-screen
//! overview, one line per session (name, wall, its top finding by impact with severity and
//! location), sessions ordered by that finding's impact; then each session's report. `--top N`
//! keeps each session's first N findings.

use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn gpufl(args: &[&str]) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_gpufl"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "gpufl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn sessions_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/sessions")
        .to_str()
        .unwrap()
        .to_string()
}

/// A finding as the overview shows it: severity, impact, title.
type Finding = (String, u64, String);

/// Per session (directory name): its findings in report order.
fn findings(json: &str) -> Vec<(String, Vec<Finding>)> {
    let v: Value = serde_json::from_str(json).unwrap();
    v["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let name = Path::new(s["session"].as_str().unwrap())
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .to_string();
            let f = s["insights"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    (
                        i["severity"].as_str().unwrap().to_string(),
                        i["impact_ns"].as_u64().unwrap(),
                        i["title"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            (name, f)
        })
        .collect()
}

#[test]
fn a_directory_report_starts_with_each_sessions_top_finding_by_impact() {
    let dir = sessions_dir();
    let all = findings(&gpufl(&["report", "--json", &dir]));
    assert!(all.len() > 30, "{} sessions", all.len());
    let text = gpufl(&["report", "--color", "never", &dir]);
    let mut lines = text.lines();
    let first = lines.next().unwrap();
    assert_eq!(
        first,
        format!(
            "gpufl report · {} sessions, by their top finding's impact (details below)",
            all.len()
        )
    );
    assert!(lines.next().unwrap().trim_start().starts_with("session"));
    let rows: Vec<&str> = lines.by_ref().take_while(|l| !l.is_empty()).collect();
    assert_eq!(rows.len(), all.len(), "one line per session");
    // The details follow: the first session's report right after the overview.
    assert!(lines.next().unwrap().starts_with("gpufl report · "));
    // Each line: the session (its name, cut at 45 characters), then its top finding.
    let mut impacts = Vec::new();
    for row in &rows {
        let (name, f) = all
            .iter()
            .find(|(n, _)| {
                let shown: String = n.chars().take(45).collect();
                row.trim_start().starts_with(&shown)
            })
            .unwrap_or_else(|| panic!("no session for {row}"));
        match f.first() {
            Some((sev, impact, title)) => {
                assert!(row.contains(&format!(" {sev} ")), "{name}: {row}");
                assert!(
                    row.contains(&gpufl_analysis::fmt_duration(*impact)),
                    "{name}: {row}"
                );
                let head: String = title.chars().take(40).collect();
                assert!(row.contains(&head), "{name}: {row} vs {title}");
                impacts.push(*impact);
            }
            None => {
                assert!(row.ends_with("no findings"), "{row}");
                impacts.push(0);
            }
        }
    }
    // Ordered by the top finding's impact, largest first.
    assert!(
        impacts.windows(2).all(|w| w[0] >= w[1]),
        "not by impact: {impacts:?}"
    );
    assert!(impacts[0] > impacts[impacts.len() - 1]);
}

#[test]
fn top_n_keeps_each_sessions_first_findings() {
    let dir = sessions_dir();
    let all = findings(&gpufl(&["report", "--json", &dir]));
    let top = findings(&gpufl(&["report", "--json", "--top", "1", &dir]));
    assert_eq!(top.len(), all.len());
    let mut cut = 0;
    for ((name, f), (tname, t)) in all.iter().zip(&top) {
        assert_eq!(name, tname);
        assert_eq!(t.len(), f.len().min(1), "{name}");
        assert_eq!(t.first(), f.first(), "{name}");
        cut += (f.len() > 1) as usize;
    }
    assert!(cut > 10, "sessions with several findings: {cut}");
    // The text: one finding per session, the rest counted.
    let text = gpufl(&["report", "--color", "never", "--top", "1", &dir]);
    let numbered = |n: &str| text.lines().filter(|l| l.starts_with(n)).count();
    let with_findings = all.iter().filter(|(_, f)| !f.is_empty()).count();
    assert_eq!(numbered("   1. "), with_findings);
    assert_eq!(numbered("   2. "), 0);
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("  … ") && l.ends_with("(--top 1)"))
            .count(),
        cut
    );
}
