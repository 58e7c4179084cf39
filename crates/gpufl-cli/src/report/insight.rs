//! One insight of the text report (a session's or the run's cross-rank ones): severity, title,
//! detail, the basis of an always-on estimate, the source line (library line and the user's call),
//! the thread it was inferred through, what the host was doing during the gaps (the join of host
//! samples and CUDA calls, and a late rank's extra GPU work), the scope and the fix.

use super::style::{secs, Style};
use crate::term::esc;
use gpufl_analysis::{FrameOrigin, Insight};

/// How an always-on session's insight rests on its data: exact, or estimated from the windows.
fn basis_line(b: &gpufl_analysis::Basis, impact_ns: u64) -> String {
    match b.kind {
        gpufl_analysis::BasisKind::Exact => {
            "exact: from records kept throughout the run (always-on)".to_string()
        }
        gpufl_analysis::BasisKind::Estimated => {
            let mut s = format!(
                "estimated from windows covering {:.1} % of the run ({} observed): figures measured in the windows only",
                b.coverage * 100.0,
                secs(b.observed_ns)
            );
            if let Some(x) = b.extrapolated_impact_ns {
                s += &format!(
                    "; {} there, ≈ {} over the whole run if the windows are typical",
                    secs(impact_ns),
                    secs(x)
                );
            }
            s
        }
    }
}

/// Insight number `n` of a list, as it reads under "Insights" or "Cross-rank insights".
pub(super) fn render_insight(out: &mut String, n: usize, ins: &Insight, st: &Style) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "  {n:>2}. {} {}  {}",
        st.severity(ins.severity),
        st.paint("1", &esc(&ins.title)),
        st.paint("2", &format!("[{}]", ins.rule))
    );
    if !ins.detail.is_empty() {
        let _ = writeln!(out, "             {}", esc(&ins.detail));
    }
    if let Some(b) = &ins.basis {
        let _ = writeln!(
            out,
            "             {}",
            st.paint("2", &basis_line(b, ins.impact_ns))
        );
    }
    let loc = &ins.location;
    if loc.origin == gpufl_analysis::FrameOrigin::Device {
        let _ = writeln!(
            out,
            "             at {} (the whole device: no source line)",
            st.paint("36", &esc(&loc.file))
        );
        facet_lines(out, ins, st);
        let _ = writeln!(out, "             fix: {}", esc(&ins.fix));
        return;
    }
    if loc.origin == FrameOrigin::Kernel {
        // No launch line: the kernel's name stands for it (already in the title).
        let _ = writeln!(
            out,
            "             at kernel {} (no launch call site recorded)",
            st.paint("36", &esc(&loc.file))
        );
        facet_lines(out, ins, st);
        let _ = writeln!(out, "             fix: {}", esc(&ins.fix));
        return;
    }
    let describe = |file: &str, l: &gpufl_analysis::SourceLoc| {
        let mut at = file.to_string();
        if let Some(line) = l.line {
            at += &format!(":{line}");
        }
        if let Some(f) = &l.function {
            at += &format!("  {f}");
        }
        esc(&at).into_owned()
    };
    let text = |out: &mut String, t: &Option<String>| {
        if let Some(t) = t {
            let _ = writeln!(
                out,
                "                 {}",
                st.paint("2", &format!("│ {}", esc(t)))
            );
        }
    };
    if let Some(lib) = &loc.library {
        let _ = writeln!(
            out,
            "             at {}  {}",
            st.paint("36", &describe(lib.package_path(), lib)),
            st.paint("2", "(library line that issued the call)")
        );
        text(out, &lib.text);
        if loc.origin == FrameOrigin::DriverInternal {
            let _ = writeln!(out, "              ← (no frame of your code in the stack)");
        } else {
            let _ = writeln!(
                out,
                "              ← {}  {}",
                st.paint("36", &describe(&loc.file, loc)),
                st.paint("2", "(your call)")
            );
            text(out, &loc.text);
        }
    } else {
        let _ = writeln!(
            out,
            "             at {}",
            st.paint("36", &describe(&loc.file, loc))
        );
        text(out, &loc.text);
    }
    if let Some(inf) = &ins.inferred {
        let tids: Vec<String> = inf.via_tids.iter().map(|t| t.to_string()).collect();
        let part = if inf.via_stacks < inf.stacks {
            format!(" ({} of {} stacks here)", inf.via_stacks, inf.stacks)
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "             {}",
            st.paint(
                "2",
                &format!(
                    "via thread {} (inferred: the calling thread ran no Python; docs/insights.md#cross-thread-python-attribution){part}",
                    tids.join(", ")
                )
            )
        );
    }
    host_block(out, ins, st);
    if let Some(path) = &ins.scope {
        let p: Vec<String> = path.iter().map(|s| esc(s).into_owned()).collect();
        let _ = writeln!(
            out,
            "             in scope {}",
            st.paint("35", &p.join(" > "))
        );
    }
    facet_lines(out, ins, st);
    let _ = writeln!(out, "             fix: {}", esc(&ins.fix));
}

/// The other rules' findings merged into this one (same line, same cause): one line each.
fn facet_lines(out: &mut String, ins: &Insight, st: &Style) {
    use std::fmt::Write;
    for f in &ins.facets {
        let _ = writeln!(
            out,
            "             {} {}  {}",
            st.paint("2", "also:"),
            esc(&f.title),
            st.paint("2", &format!("[{}]", f.rule))
        );
    }
}

/// What the host was doing during an idle finding's gaps (its `data.host`), one line per host
/// line, and the line that ended them when the finding moved to the host line; a late rank's
/// extra GPU work.
fn host_block(out: &mut String, ins: &Insight, st: &Style) {
    use gpufl_analysis::{fmt_duration, RuleData};
    use std::fmt::Write;
    let (host, ended, what, ended_what, extra) = match &ins.data {
        Some(RuleData::GpuIdle(d)) => (&d.host, &d.gap_ended_at, "gaps", "gaps ended at", &[][..]),
        Some(RuleData::LaunchBound(d)) => {
            (&d.host, &d.gap_ended_at, "gaps", "gaps ended at", &[][..])
        }
        Some(RuleData::CollectiveWait(d)) => (
            &d.host,
            &d.gap_ended_at,
            "stretches without a CUDA call",
            if d.extra_kernels.is_empty() {
                "stretches ended at"
            } else {
                "late collectives launched at"
            },
            &d.extra_kernels[..],
        ),
        _ => return,
    };
    if let Some(h) = host {
        let basis = h.basis();
        let basis = if basis.is_empty() {
            String::new()
        } else {
            format!("; {basis}")
        };
        let _ = writeln!(
            out,
            "             {}",
            st.paint(
                "2",
                &format!(
                    "host during {} {what} ({}{basis}):",
                    h.gaps,
                    fmt_duration(h.gap_ns)
                )
            )
        );
        let lines = h.breakdown();
        if lines.is_empty() {
            let _ = writeln!(
                out,
                "               no call or sample covers 5% of the {what}' time"
            );
        }
        for l in lines {
            let _ = writeln!(out, "               {}", esc(&l));
        }
    }
    if let Some(RuleData::GpuIdle(d)) = &ins.data {
        if !d.library_lines.is_empty() {
            let _ = writeln!(
                out,
                "             {}",
                st.paint("2", "gaps ended by the launches of (most idle first):")
            );
            for l in d.library_lines.iter().take(5) {
                let at = l
                    .location
                    .library
                    .as_ref()
                    .map_or_else(|| l.location.short(), |lib| lib.user_short());
                let _ = writeln!(
                    out,
                    "               {:>9}  {} ({} gaps)",
                    fmt_duration(l.idle_ns),
                    esc(&at),
                    l.gaps
                );
            }
            if d.library_lines.len() > 5 {
                let _ = writeln!(
                    out,
                    "               and {} more lines",
                    d.library_lines.len() - 5
                );
            }
        }
        if let Some(s) = &d.steps {
            let site = s.site.library.as_ref().map_or_else(
                || s.site.short(),
                |l| match l.function.as_deref() {
                    Some(f) => format!("{} in {f}", l.short()),
                    None => l.short(),
                },
            );
            let _ = writeln!(
                out,
                "             {}",
                st.paint(
                    "2",
                    &esc(&format!(
                        "per step ({} steps, one sync at {site} each): {}, the GPU idle {}; host per step:",
                        s.count,
                        fmt_duration(s.step_ns),
                        fmt_duration(s.idle_ns)
                    ))
                )
            );
            for l in &s.lines {
                let _ = writeln!(
                    out,
                    "               {:>9}  {}",
                    fmt_duration(l.ns),
                    esc(&l.location.short())
                );
            }
        }
    }
    if !extra.is_empty() {
        let _ = writeln!(
            out,
            "             {}",
            st.paint(
                "2",
                "GPU work only the late rank runs, or runs longer (per late collective):"
            )
        );
        for k in extra {
            let at = k
                .launch_line
                .as_ref()
                .map(|l| format!(" @ {}", l.short()))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "               {:>9}  {} × {} (the others: {}){at}",
                fmt_duration(k.per_late_collective_ns),
                esc(gpufl_analysis::kernels::short_name(&k.name)),
                k.launches,
                k.others_launches
            );
        }
    }
    if let Some(e) = ended {
        let _ = writeln!(
            out,
            "             {} {}",
            st.paint("2", ended_what),
            st.paint("36", &esc(&e.short()))
        );
    }
}
