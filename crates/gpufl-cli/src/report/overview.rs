//! The first screen of `gpufl report` over several sessions: one line per session — its name,
//! wall, and its top finding by impact (severity, impact, title, location) — sessions ordered by
//! that finding's impact, largest first (sessions without a finding last, by name). The
//! sessions' reports follow it.

use super::style::{clip, Style};
use super::SessionReport;
use crate::term::esc;
use gpufl_analysis::fmt_duration;
use std::path::Path;

/// Characters of a session's name and of a finding's title on its line.
const NAME_CHARS: usize = 45;
const TITLE_CHARS: usize = 72;

/// The sessions in the overview's order: indices into `reports`.
pub(super) fn order(reports: &[SessionReport]) -> Vec<usize> {
    let mut ix: Vec<usize> = (0..reports.len()).collect();
    let impact = |i: usize| reports[i].analysis.insights.first().map(|f| f.impact_ns);
    ix.sort_by(|&a, &b| {
        impact(b)
            .cmp(&impact(a))
            .then_with(|| name(&reports[a]).cmp(&name(&reports[b])))
    });
    ix
}

/// A session's name: its directory's.
fn name(r: &SessionReport) -> String {
    Path::new(&r.session)
        .file_name()
        .map_or_else(|| r.session.clone(), |n| n.to_string_lossy().into_owned())
}

/// The overview, then a blank line.
pub(super) fn render(out: &mut String, reports: &[SessionReport], st: &Style) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "{}",
        st.paint(
            "1",
            &format!(
                "gpufl report · {} sessions, by their top finding's impact (details below)",
                reports.len()
            )
        )
    );
    let _ = writeln!(
        out,
        "  {:<w$}  {:>9}  {:<6}  {:>9}  top finding",
        "session",
        "wall",
        "",
        "impact",
        w = NAME_CHARS + 1
    );
    for i in order(reports) {
        let r = &reports[i];
        let n = clip(&name(r), NAME_CHARS);
        let wall = fmt_duration(r.analysis.headline.wall_ns);
        match r.analysis.insights.first() {
            Some(f) => {
                let at = f.location.short();
                let title = clip(&f.title, TITLE_CHARS);
                let at = if f.title.contains(&at) {
                    String::new()
                } else {
                    format!("  at {}", esc(&at))
                };
                let _ = writeln!(
                    out,
                    "  {:<w$}  {wall:>9}  {}  {:>9}  {}{at}",
                    esc(&n),
                    st.severity(f.severity),
                    fmt_duration(f.impact_ns),
                    esc(&title),
                    w = NAME_CHARS + 1
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  {:<w$}  {wall:>9}  {:<6}  {:>9}  no findings",
                    esc(&n),
                    "",
                    "",
                    w = NAME_CHARS + 1
                );
            }
        }
    }
    out.push('\n');
}
