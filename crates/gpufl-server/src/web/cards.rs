//! Insight cards, as the session page's findings list and the kernel page show them: severity,
//! title, impact, the fix, and the source-line chip that opens the line's detail (with the
//! library's line beside it when the cause sits in a library). Templates include
//! `templates/card.html` inside `{% for card in … %}`.

use super::{fmt, url_encode};
use crate::store::InsightRow;
use serde_json::Value;

/// A link to a line's detail (a user line's, or the library line inside it), or a label.
#[derive(Debug, Clone)]
pub struct Chip {
    /// `/sessions/{id}/line?file=…&line=…`; empty for a label.
    pub href: String,
    /// `file:line` with the file shortened.
    pub text: String,
    /// The whole path, line and function.
    pub title: String,
}

/// One insight as a card.
#[derive(Debug, Clone)]
pub struct Card {
    pub severity: &'static str,
    pub severity_class: &'static str,
    pub category: String,
    pub rule: String,
    pub title: String,
    /// `73.58s blocked across 50 calls`, or the time the rule attributes and its share of the run
    /// (always-on, estimated from the windows: of the time they observed, which severity is
    /// rated on).
    pub impact: String,
    pub detail: String,
    pub fix: String,
    /// The user's line (None when the insight has none, e.g. `<driver-internal>`).
    pub chip: Option<Chip>,
    /// The library's line inside it.
    pub lib: Option<Chip>,
    /// `in train_step()`.
    pub function: String,
    /// The text of the line, when the recorder stored it.
    pub code: String,
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("")
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

/// A chip's `file:line` (no line when 0).
fn loc_text(file: &str, line: u64) -> String {
    fmt::loc(file, u32::try_from(line).ok().filter(|l| *l > 0), 48)
}

impl Card {
    /// The card of a stored insight of session `session`.
    pub fn from_row(r: &InsightRow, session: &str) -> Card {
        let b = &r.body;
        let loc = b.get("location").cloned().unwrap_or(Value::Null);
        let file = s(&loc, "file");
        let line = u(&loc, "line");
        let function = s(&loc, "function");
        // A line to open: a kernel rule's location names the kernel, with no line.
        let has_file = !file.is_empty() && !file.starts_with('<') && line > 0;
        let chip = has_file.then(|| Chip {
            href: format!(
                "/sessions/{}/line?file={}&line={line}",
                url_encode(session),
                url_encode(file)
            ),
            text: loc_text(file, line),
            title: if function.is_empty() {
                format!("{file}:{line}")
            } else {
                format!("{file}:{line} in {function}()")
            },
        });
        let lib = loc.get("library").filter(|l| l.is_object()).map(|l| Chip {
            href: if s(l, "file").is_empty() || u(l, "line") == 0 {
                String::new()
            } else {
                format!(
                    "/sessions/{}/line?file={}&line={}",
                    url_encode(session),
                    url_encode(s(l, "file")),
                    u(l, "line")
                )
            },
            text: match u(l, "line") {
                0 => fmt::lib_path(s(l, "file"), 48),
                n => format!("{}:{n}", fmt::lib_path(s(l, "file"), 48)),
            },
            title: format!(
                "{}:{} in {}()",
                s(l, "file"),
                u(l, "line"),
                s(l, "function")
            ),
        });
        let count = u(b, "count");
        let blocked = u(b, "blocked_ns");
        let detail = s(b, "detail");
        let impact = if blocked > 0 {
            format!(
                "{} blocked across {} call{}",
                fmt::dur_u(blocked),
                fmt::count(count as i64),
                if count == 1 { "" } else { "s" }
            )
        } else if r.impact_ns <= 0 {
            String::new()
        } else {
            match b.get("basis").filter(|x| s(x, "kind") == "estimated") {
                // Always-on: measured in the windows, and rated on the time they observed.
                Some(basis) if u(basis, "observed_ns") > 0 => {
                    let observed = u(basis, "observed_ns");
                    let coverage = basis.get("coverage").and_then(Value::as_f64).unwrap_or(0.0);
                    format!(
                        "{} ({} of the {} observed; windows cover {} of the run)",
                        fmt::dur(r.impact_ns),
                        fmt::pct(r.impact_ns.max(0) as f64 * 100.0 / observed as f64),
                        fmt::dur_u(observed),
                        fmt::pct(coverage * 100.0)
                    )
                }
                _ => {
                    let share = b
                        .get("share_of_wall")
                        .and_then(Value::as_f64)
                        .unwrap_or(0.0);
                    format!(
                        "{} ({} of the run)",
                        fmt::dur(r.impact_ns),
                        fmt::pct(share * 100.0)
                    )
                }
            }
        };
        // The sync rules' detail opens with the same sentence: said once.
        let impact = if !impact.is_empty() && detail.starts_with(&impact) {
            String::new()
        } else {
            impact
        };
        Card {
            severity: fmt::severity(r.severity),
            severity_class: fmt::severity_class(r.severity),
            category: r.category.clone(),
            rule: r.rule.clone(),
            title: r.title.clone(),
            impact,
            detail: detail.to_string(),
            fix: s(b, "fix").to_string(),
            chip,
            lib,
            function: if function.is_empty() {
                String::new()
            } else {
                format!("in {function}()")
            },
            code: s(&loc, "text").to_string(),
        }
    }
}

/// The categories present among `rows` with their counts, the category of the highest-ranked
/// finding first (the rows are in the analysis's order): the session page's filters.
pub fn categories(rows: &[InsightRow]) -> Vec<(&str, usize)> {
    let mut out: Vec<(&str, usize)> = Vec::new();
    for r in rows {
        match out.iter_mut().find(|(c, _)| *c == r.category) {
            Some((_, n)) => *n += 1,
            None => out.push((r.category.as_str(), 1)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(body: Value, impact_ns: i64) -> InsightRow {
        InsightRow {
            ord: 0,
            severity: 3,
            category: "SYNCHRONIZATION".into(),
            rule: "in-loop-sync".into(),
            title: "In-loop sync × 50".into(),
            file: String::new(),
            line: 0,
            impact_ns,
            body,
        }
    }

    #[test]
    fn a_card_links_its_line_and_names_the_library_line_beside_it() {
        let c = Card::from_row(
            &row(
                json!({
                    "location": {"file": "/w/a b&c.py", "line": 90, "function": "train_step",
                                 "library": {"file": "/site-packages/transformers/trainer.py",
                                             "line": 2612, "function": "_inner_training_loop"}},
                    "count": 50, "blocked_ns": 73_580_000_000u64,
                    "detail": "the GPU then sat idle", "fix": "move .item() out of the loop"
                }),
                73_580_000_000,
            ),
            "s/1",
        );
        let chip = c.chip.expect("a chip");
        assert_eq!(
            chip.href,
            "/sessions/s%2F1/line?file=%2Fw%2Fa%20b%26c.py&line=90"
        );
        assert_eq!(chip.text, "/w/a b&c.py:90");
        assert_eq!(c.impact, "73.58s blocked across 50 calls");
        assert_eq!(c.function, "in train_step()");
        let lib = c.lib.expect("the library's line");
        assert_eq!(lib.text, "transformers/trainer.py:2612");
        assert_eq!(
            lib.href,
            "/sessions/s%2F1/line?file=%2Fsite-packages%2Ftransformers%2Ftrainer.py&line=2612"
        );
        assert_eq!(c.severity_class, "sev-high");
    }

    #[test]
    fn no_chip_without_a_line_and_no_sentence_said_twice_or_empty() {
        let k = Card::from_row(
            &row(
                json!({"location": {"file": "gemm_kernel"}, "share_of_wall": 0.0}),
                0,
            ),
            "s",
        );
        assert!(k.chip.is_none(), "a kernel's location has no line to open");
        assert_eq!(k.impact, "", "no `0ns (0.0% of the run)`");
        let d = Card::from_row(
            &row(
                json!({"location": {"file": "<driver-internal>"}, "count": 2, "blocked_ns": 5_000,
                       "detail": "5.0µs blocked across 2 calls at x.cu:3 in main()"}),
                5_000,
            ),
            "s",
        );
        assert!(d.chip.is_none());
        assert_eq!(d.impact, "", "the detail already opens with it");
        assert!(d.detail.starts_with("5.0µs blocked across 2 calls"));
    }

    #[test]
    fn an_estimated_insight_gives_its_share_of_the_observed_time() {
        let c = Card::from_row(
            &row(
                json!({"location": {"file": "a.py", "line": 3}, "share_of_wall": 0.037,
                       "basis": {"kind": "estimated", "observed_ns": 800_000_000u64,
                                 "coverage": 0.073}}),
                400_000_000,
            ),
            "s",
        );
        assert_eq!(
            c.impact,
            "400.00ms (50.0% of the 800.00ms observed; windows cover 7.3% of the run)"
        );
        let e = Card::from_row(
            &row(
                json!({"location": {"file": "a.py", "line": 3}, "share_of_wall": 0.037,
                       "basis": {"kind": "exact", "observed_ns": 800_000_000u64, "coverage": 1.0}}),
                400_000_000,
            ),
            "s",
        );
        assert_eq!(e.impact, "400.00ms (3.7% of the run)");
    }
}
