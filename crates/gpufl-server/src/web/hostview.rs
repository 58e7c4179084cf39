//! The host's side of the dashboard (issue 35): on the line page, the host samples whose stack
//! names the line (count, time, thread states, threads) and the CUDA calls that held their thread
//! there (call, count, host time) — from the `hostlines` document
//! (gpufl_analysis::hostlines); on the session page, the idle breakdown: what the host was doing
//! while the GPU idled, merged over the `gpu-idle` findings' `data.host` (else the `launch-bound`
//! ones'; gpufl-analysis's join of the
//! gaps with host calls and samples: the host lines with their share of the gap time, compilation,
//! framework overhead).
//!
//! Values are plain text: the templates escape them.

use super::cards::Chip;
use super::{fmt, url_encode};
use crate::store::InsightRow;
use serde::Deserialize;
use std::collections::HashMap;

/// Host lines listed in the idle breakdown.
pub const BREAKDOWN_LINES: usize = 10;
/// Rules whose `data.host` the idle breakdown merges, in order of preference: the first that has
/// any (a `launch-bound` finding's gaps can be a `gpu-idle` finding's too, so they are not summed;
/// `gpu-idle` findings are one per line, over disjoint gaps).
pub const IDLE_RULES: [&str; 2] = ["gpu-idle", "launch-bound"];

// ---------------------------------------------------------------------------------------------
// Stored shapes, only the fields read
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct LocDoc {
    pub file: String,
    pub line: Option<u32>,
    pub function: Option<String>,
    pub text: Option<String>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct StateDoc {
    pub state: String,
    pub samples: u64,
    pub ns: u64,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct CallDoc {
    pub call: String,
    pub count: u64,
    pub host_ns: u64,
    pub max_ns: u64,
}

/// One entry of the `hostlines` document (gpufl_analysis::hostlines::HostLineDetail).
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
pub struct HostLineDoc {
    pub location: LocDoc,
    pub samples: u64,
    pub sample_ns: u64,
    pub states: Vec<StateDoc>,
    pub threads: Vec<u64>,
    pub calls: Vec<CallDoc>,
}

/// `data.host` of an idle finding (gpufl_analysis's HostActivity).
#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct ActivityDoc {
    threads: Vec<u64>,
    gaps: u64,
    gap_ns: u64,
    exact_ns: u64,
    sampled_ns: u64,
    samples: u64,
    unseen_gaps: u64,
    compile_ns: u64,
    lines: Vec<HostLineTime>,
    states: Vec<DoingDoc>,
    overhead: Option<OverheadDoc>,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct HostLineTime {
    location: Option<LocDoc>,
    doing: String,
    what: String,
    ns: u64,
    exact_ns: u64,
    samples: u64,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct DoingDoc {
    doing: String,
    ns: u64,
}

#[derive(Deserialize, Default, Clone)]
#[serde(default)]
struct OverheadDoc {
    ns: u64,
    lines: u64,
    under: Option<LocDoc>,
}

// ---------------------------------------------------------------------------------------------
// The line page
// ---------------------------------------------------------------------------------------------

pub struct StateRow {
    pub state: String,
    pub samples: String,
    pub time: String,
    pub share: String,
}

pub struct CallRow {
    pub call: String,
    pub count: String,
    pub host: String,
    pub max: String,
}

/// The host at one line.
pub struct HostAtLine {
    pub samples: u64,
    /// `12 samples standing for 120.0ms on 2 threads (759, 790)`.
    pub summary: String,
    pub states: Vec<StateRow>,
    pub calls: Vec<CallRow>,
}

/// How the page names a thread state (the trace format's spelling in, prose out).
pub fn state_name(s: &str) -> &'static str {
    match s {
        "cpu" => "on CPU",
        "cuda" => "in a CUDA call",
        "lock" => "waiting on a lock (the GIL included)",
        "sleep" => "sleeping or in I/O",
        "idle" => "idle-waiting",
        _ => "unknown",
    }
}

/// The host at `file:line`, or None when nothing of the host names it.
pub fn at_line(docs: &[HostLineDoc], file: &str, line: u32) -> Option<HostAtLine> {
    let here: Vec<&HostLineDoc> = docs
        .iter()
        .filter(|d| d.location.file == file && d.location.line == Some(line))
        .collect();
    if here.is_empty() {
        return None;
    }
    let samples: u64 = here.iter().map(|d| d.samples).sum();
    let sample_ns: u64 = here.iter().map(|d| d.sample_ns).sum();
    let mut states: HashMap<&str, (u64, u64)> = HashMap::new();
    let mut calls: HashMap<&str, (u64, u64, u64)> = HashMap::new();
    let mut threads: Vec<u64> = Vec::new();
    for d in &here {
        for s in &d.states {
            let e = states.entry(s.state.as_str()).or_default();
            e.0 += s.samples;
            e.1 = e.1.saturating_add(s.ns);
        }
        for c in &d.calls {
            let e = calls.entry(c.call.as_str()).or_default();
            e.0 += c.count;
            e.1 = e.1.saturating_add(c.host_ns);
            e.2 = e.2.max(c.max_ns);
        }
        for &t in &d.threads {
            if !threads.contains(&t) {
                threads.push(t);
            }
        }
    }
    let mut states: Vec<(&str, (u64, u64))> = states.into_iter().collect();
    states.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut calls: Vec<(&str, (u64, u64, u64))> = calls.into_iter().collect();
    calls.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(a.0.cmp(b.0)));
    let tids: Vec<String> = threads.iter().map(u64::to_string).collect();
    let summary = if samples == 0 {
        String::new()
    } else {
        format!(
            "{} host sample{} standing for {} on {} thread{} ({})",
            fmt::count(samples.min(i64::MAX as u64) as i64),
            if samples == 1 { "" } else { "s" },
            fmt::dur_u(sample_ns),
            tids.len(),
            if tids.len() == 1 { "" } else { "s" },
            tids.join(", ")
        )
    };
    Some(HostAtLine {
        samples,
        summary,
        states: states
            .into_iter()
            .map(|(s, (n, ns))| StateRow {
                state: state_name(s).to_string(),
                samples: fmt::count(n.min(i64::MAX as u64) as i64),
                time: fmt::dur_u(ns),
                share: fmt::pct(100.0 * n as f64 / samples.max(1) as f64),
            })
            .collect(),
        calls: calls
            .into_iter()
            .map(|(c, (n, ns, max))| CallRow {
                call: c.to_string(),
                count: fmt::count(n.min(i64::MAX as u64) as i64),
                host: fmt::dur_u(ns),
                max: fmt::dur_u(max),
            })
            .collect(),
    })
}

/// The line's location as the host lines name it (for a line only the host names: its
/// function and text).
pub fn location_at<'a>(docs: &'a [HostLineDoc], file: &str, line: u32) -> Option<&'a LocDoc> {
    docs.iter()
        .map(|d| &d.location)
        .find(|l| l.file == file && l.line == Some(line))
}

// ---------------------------------------------------------------------------------------------
// The session page
// ---------------------------------------------------------------------------------------------

pub struct DoingRow {
    pub doing: String,
    pub time: String,
    pub share: String,
}

pub struct IdleLineRow {
    pub chip: Option<Chip>,
    /// Where there is no line: why.
    pub place: String,
    pub what: String,
    pub time: String,
    pub share: String,
    /// `exact` (timed CUDA calls, compilation scopes), `12 samples`, or both.
    pub how: String,
}

/// What the host was doing during the GPU's idle gaps.
pub struct IdleBreakdown {
    pub summary: String,
    pub doing: Vec<DoingRow>,
    pub lines: Vec<IdleLineRow>,
    /// Compilation and framework overhead, as sentences.
    pub notes: Vec<String>,
}

/// How the breakdown names an activity of the join.
fn doing_name(d: &str) -> &'static str {
    match d {
        "call" => "in CUDA calls",
        "sync" => "in synchronizations",
        "compile" => "compiling",
        "cpu" => "on CPU",
        "lock" => "waiting on a lock (the GIL included)",
        "sleep" => "sleeping or in I/O",
        "idle" => "idle-waiting",
        _ => "unknown",
    }
}

fn line_chip(session: &str, l: &LocDoc) -> Option<Chip> {
    let line = l.line?;
    if l.file.is_empty() || l.file.starts_with('<') {
        return None;
    }
    Some(Chip {
        href: format!(
            "/sessions/{}/line?file={}&line={line}",
            url_encode(session),
            url_encode(&l.file)
        ),
        text: format!("{}:{line}", fmt::short_path(&l.file, 48)),
        title: match &l.function {
            Some(f) if !f.is_empty() => format!("{}:{line} in {f}()", l.file),
            _ => format!("{}:{line}", l.file),
        },
    })
}

fn share(part: u64, whole: u64) -> String {
    fmt::pct(100.0 * part as f64 / whole.max(1) as f64)
}

/// A host line of the breakdown: (file, line, what it was doing).
type LineKey<'a> = (&'a str, u32, &'a str);
/// Its location, time, exactly timed part and samples, summed over the findings.
type LineSum<'a> = (Option<&'a LocDoc>, u64, u64, u64);

/// The idle breakdown of a session, from its idle findings' `data.host` (those of the first of
/// [`IDLE_RULES`] that has any); None when none carries one (no host records, or an analysis
/// before the join).
pub fn idle_breakdown(insights: &[InsightRow], session: &str) -> Option<IdleBreakdown> {
    let of_rule = |rule: &str| -> Vec<ActivityDoc> {
        insights
            .iter()
            .filter(|r| r.rule == rule)
            .filter_map(|r| r.body.get("data")?.get("host"))
            .filter_map(|h| serde_json::from_value::<ActivityDoc>(h.clone()).ok())
            .filter(|a| a.gap_ns > 0)
            .collect()
    };
    let acts: Vec<ActivityDoc> = IDLE_RULES
        .iter()
        .map(|r| of_rule(r))
        .find(|a| !a.is_empty())?;
    let gap_ns: u64 = acts.iter().map(|a| a.gap_ns).sum();
    let gaps: u64 = acts.iter().map(|a| a.gaps).sum();
    let sum = |f: fn(&ActivityDoc) -> u64| acts.iter().map(f).fold(0u64, u64::saturating_add);
    let (exact, sampled, samples, unseen, compile) = (
        sum(|a| a.exact_ns),
        sum(|a| a.sampled_ns),
        sum(|a| a.samples),
        sum(|a| a.unseen_gaps),
        sum(|a| a.compile_ns),
    );
    let mut threads: Vec<u64> = Vec::new();
    let mut doing: HashMap<&str, u64> = HashMap::new();
    let mut lines: HashMap<LineKey, LineSum> = HashMap::new();
    let (mut over_ns, mut over_lines) = (0u64, 0u64);
    let mut over_under: Option<&LocDoc> = None;
    for a in &acts {
        for &t in &a.threads {
            if !threads.contains(&t) {
                threads.push(t);
            }
        }
        for s in &a.states {
            *doing.entry(s.doing.as_str()).or_default() += s.ns;
        }
        for l in &a.lines {
            let key = match &l.location {
                Some(loc) => (loc.file.as_str(), loc.line.unwrap_or(0), l.what.as_str()),
                None => ("", 0, l.what.as_str()),
            };
            let e = lines.entry(key).or_insert((l.location.as_ref(), 0, 0, 0));
            e.1 = e.1.saturating_add(l.ns);
            e.2 = e.2.saturating_add(l.exact_ns);
            e.3 += l.samples;
        }
        if let Some(o) = &a.overhead {
            over_ns = over_ns.saturating_add(o.ns);
            over_lines = over_lines.max(o.lines);
            over_under = over_under.or(o.under.as_ref());
        }
    }
    let mut doing: Vec<(&str, u64)> = doing.into_iter().collect();
    doing.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut lines: Vec<(LineKey, LineSum)> = lines.into_iter().collect();
    lines.sort_by(|a, b| b.1 .1.cmp(&a.1 .1).then(a.0.cmp(&b.0)));
    lines.truncate(BREAKDOWN_LINES);
    let findings = acts.len();
    let mut summary = format!(
        "During {} GPU idle gap{} ({}) of {} finding{}, on {} host thread{}: {} timed exactly \
         (CUDA calls, compilation scopes), {} estimated from {} host sample{}",
        fmt::count(gaps.min(i64::MAX as u64) as i64),
        if gaps == 1 { "" } else { "s" },
        fmt::dur_u(gap_ns),
        findings,
        if findings == 1 { "" } else { "s" },
        threads.len(),
        if threads.len() == 1 { "" } else { "s" },
        share(exact, gap_ns),
        share(sampled, gap_ns),
        fmt::count(samples.min(i64::MAX as u64) as i64),
        if samples == 1 { "" } else { "s" },
    );
    if unseen > 0 {
        summary.push_str(&format!(
            "; {} gap{} had neither a call nor a sample",
            fmt::count(unseen.min(i64::MAX as u64) as i64),
            if unseen == 1 { "" } else { "s" }
        ));
    }
    summary.push('.');
    let mut notes = Vec::new();
    if compile > 0 {
        notes.push(format!(
            "Compilation (XLA, torch.compile, Triton, CUDA module loads): {} ({} of the gaps).",
            fmt::dur_u(compile),
            share(compile, gap_ns)
        ));
    }
    if over_ns > 0 {
        let under = over_under
            .and_then(|l| {
                Some(format!(
                    " under {}:{}",
                    fmt::short_path(&l.file, 48),
                    l.line?
                ))
            })
            .unwrap_or_default();
        notes.push(format!(
            "Framework overhead: {} ({} of the gaps) of Python and framework CPU time spread over {} lines{under}.",
            fmt::dur_u(over_ns),
            share(over_ns, gap_ns),
            over_lines
        ));
    }
    Some(IdleBreakdown {
        summary,
        doing: doing
            .into_iter()
            .map(|(d, ns)| DoingRow {
                doing: doing_name(d).to_string(),
                time: fmt::dur_u(ns),
                share: share(ns, gap_ns),
            })
            .collect(),
        lines: lines
            .into_iter()
            .map(|(key, (loc, ns, exact, n))| {
                let chip = loc.and_then(|l| line_chip(session, l));
                let how = match (exact > 0, n > 0) {
                    (true, true) => format!("exact + {} samples", fmt::count(n as i64)),
                    (true, false) => "exact".to_string(),
                    (false, _) => format!(
                        "{} sample{}",
                        fmt::count(n as i64),
                        if n == 1 { "" } else { "s" }
                    ),
                };
                IdleLineRow {
                    place: if chip.is_none() {
                        loc.map(|l| l.file.clone())
                            .filter(|f| !f.is_empty())
                            .unwrap_or_else(|| "no Python line (native thread)".into())
                    } else {
                        String::new()
                    },
                    chip,
                    what: key.2.to_string(),
                    time: fmt::dur_u(ns),
                    share: share(ns, gap_ns),
                    how,
                }
            })
            .collect(),
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(rule: &str, host: serde_json::Value) -> InsightRow {
        InsightRow {
            ord: 0,
            severity: 3,
            category: "IDLE GPU".into(),
            rule: rule.into(),
            title: String::new(),
            file: String::new(),
            line: 0,
            impact_ns: 0,
            body: json!({ "data": { "host": host } }),
        }
    }

    fn activity(file: &str, line: u32, what: &str, ns: u64, gap_ns: u64) -> serde_json::Value {
        json!({
            "threads": [7], "gaps": 10, "gap_ns": gap_ns, "exact_ns": ns, "sampled_ns": 0,
            "samples": 0, "unseen_gaps": 1, "compile_ns": 0,
            "lines": [{ "location": { "file": file, "line": line, "origin": "python" },
                        "doing": "call", "what": what, "ns": ns, "share": 0.5,
                        "exact_ns": ns, "samples": 0 }],
            "states": [{ "doing": "call", "ns": ns, "share": 0.5 }]
        })
    }

    #[test]
    fn gpu_idle_findings_merge_and_launch_bound_is_not_added_to_them() {
        let rows = vec![
            row("gpu-idle", activity("/a/t.py", 45, "cudaFree", 600, 1000)),
            row("gpu-idle", activity("/a/t.py", 45, "cudaFree", 400, 1000)),
            row(
                "launch-bound",
                activity("/a/t.py", 9, "cudaLaunchKernel", 900, 1000),
            ),
        ];
        let b = idle_breakdown(&rows, "s-1").expect("a breakdown");
        assert!(b.summary.starts_with("During 20 GPU idle gaps (2.0µs) of 2 findings, on 1 host thread: 50.0% timed exactly"), "{}", b.summary);
        assert!(
            b.summary.contains("2 gaps had neither a call nor a sample"),
            "{}",
            b.summary
        );
        assert_eq!(
            b.lines.len(),
            1,
            "launch-bound left out when gpu-idle has host data"
        );
        let l = &b.lines[0];
        assert_eq!(
            (l.what.as_str(), l.share.as_str(), l.how.as_str()),
            ("cudaFree", "50.0%", "exact")
        );
        let c = l.chip.as_ref().expect("a chip");
        assert_eq!(c.href, "/sessions/s-1/line?file=%2Fa%2Ft.py&line=45");
        assert_eq!(b.doing[0].doing, "in CUDA calls");
        // Only launch-bound findings: theirs.
        let b = idle_breakdown(&rows[2..], "s-1").unwrap();
        assert_eq!(b.lines[0].what, "cudaLaunchKernel");
        // No host data: no breakdown.
        assert!(idle_breakdown(&[row("gpu-idle", json!(null))], "s").is_none());
    }

    #[test]
    fn the_host_at_a_line_merges_its_entries() {
        let doc = |state: &str, n: u64, call: &str, count: u64| HostLineDoc {
            location: LocDoc {
                file: "/a/t.py".into(),
                line: Some(3),
                ..LocDoc::default()
            },
            samples: n,
            sample_ns: n * 10,
            states: vec![StateDoc {
                state: state.into(),
                samples: n,
                ns: n * 10,
            }],
            threads: vec![5],
            calls: vec![CallDoc {
                call: call.into(),
                count,
                host_ns: count * 100,
                max_ns: 100,
            }],
        };
        let docs = vec![doc("cpu", 3, "cudaFree", 2), doc("lock", 1, "cudaFree", 1)];
        let h = at_line(&docs, "/a/t.py", 3).unwrap();
        assert_eq!(
            h.summary,
            "4 host samples standing for 40ns on 1 thread (5)"
        );
        let states: Vec<(&str, &str)> = h
            .states
            .iter()
            .map(|s| (s.state.as_str(), s.share.as_str()))
            .collect();
        assert_eq!(
            states,
            [
                ("on CPU", "75.0%"),
                ("waiting on a lock (the GIL included)", "25.0%")
            ]
        );
        assert_eq!(
            (h.calls[0].count.as_str(), h.calls[0].host.as_str()),
            ("3", "300ns")
        );
        assert!(at_line(&docs, "/a/t.py", 4).is_none());
    }
}
