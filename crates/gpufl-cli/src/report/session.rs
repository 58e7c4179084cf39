//! One session's text report: the headline, the always-on line, where time is attributed, GPU idle
//! and utilization, telemetry, scopes, warnings, the insights, calls per line, graphs and kernels.

use super::insight::render_insight;
use super::style::{secs, Style};
use super::SessionReport;
use crate::term::esc;

pub(super) fn render(out: &mut String, r: &SessionReport, st: &Style) {
    use std::fmt::Write;
    let a = &r.analysis;
    let _ = writeln!(
        out,
        "{}",
        st.paint("1", &format!("gpufl report · {}", esc(&r.session)))
    );
    if !r.command.is_empty() {
        let _ = writeln!(out, "  command   {}", esc(&r.command.join(" ")));
    }
    if !r.gpus.is_empty() {
        let _ = writeln!(out, "  GPU       {}", esc(&r.gpus.join(", ")));
    }
    // Always-on: busy share and kernels are the windows' only (the line says so).
    let _ = writeln!(out, "  {}", crate::headline::line(&a.headline));
    if let Some(s) = &a.sampling {
        let _ = writeln!(out, "  {}", sampling_line(s));
    }
    if a.has_stacks {
        render_attribution(out, &a.attribution);
    }
    for d in &a.gpu_idle {
        render_idle(out, d, st);
    }
    for d in &a.telemetry {
        super::telemetry::render(out, d);
    }
    super::scopes::render(out, &a.scopes);
    super::scopes::render_ranges(out, &a.ranges);
    for w in &a.warnings {
        let _ = writeln!(out, "  {} {}", st.paint("33", "warning:"), esc(w));
    }
    if !a.has_stacks {
        let _ = writeln!(
            out,
            "\n  No CPU stacks in this session, so no source lines: record with `gpufl record` (stacks on \
             by default) or set enable_stack_trace = true / GPUFL_ENABLE_STACK_TRACE=1."
        );
    }
    if a.insights.is_empty() {
        let _ = writeln!(out, "\n  No insights.");
    } else {
        let _ = writeln!(out);
        for (i, ins) in a.insights.iter().enumerate() {
            render_insight(out, i + 1, ins, st);
        }
    }
    if r.findings_not_shown > 0 {
        let _ = writeln!(
            out,
            "  … {} more finding{} (--top {})",
            r.findings_not_shown,
            if r.findings_not_shown == 1 { "" } else { "s" },
            a.insights.len()
        );
    }
    if let Some(s) = &a.sampling {
        render_calls(out, s);
    }
    super::graphs::render(out, &a.graphs);
    super::kernels::render(out, &a.kernels);
}

/// The line under the headline of an always-on session.
fn sampling_line(s: &gpufl_analysis::Sampling) -> String {
    let mut kinds = vec![
        format!("{} sampled", s.sampled),
        format!("{} triggered", s.triggered),
    ];
    if s.api > 0 {
        kinds.push(format!("{} by the API", s.api));
    }
    let files = if s.files > 1 {
        format!(" · {} trace files", s.files)
    } else {
        String::new()
    };
    format!(
        "always-on: GPU activity observed in {} window{} ({}), {} of {} ({:.1} %); sync insights exact, GPU insights estimated{files}",
        s.windows,
        if s.windows == 1 { "" } else { "s" },
        kinds.join(", "),
        secs(s.observed_ns),
        secs(s.span_ns),
        s.coverage * 100.0
    )
}

/// Calls shown in the calls-per-line table.
const CALL_LINES: usize = 10;

/// Calls per user line and API, estimated from the sampled call sites' weights.
fn render_calls(out: &mut String, s: &gpufl_analysis::Sampling) {
    use std::fmt::Write;
    if s.calls_per_line.is_empty() {
        return;
    }
    let shown = s.calls_per_line.len().min(CALL_LINES);
    let of = if s.calls_per_line.len() > shown {
        format!("top {shown} of {}, ", s.calls_per_line.len())
    } else {
        String::new()
    };
    if s.call_sites == "windows" {
        let _ = writeln!(
            out,
            "\n  Calls per line ({of}counted in the windows only: {:.1} % of the run)",
            s.coverage * 100.0
        );
    } else {
        let _ = writeln!(
            out,
            "\n  Calls per line ({of}estimated from sampled call sites)"
        );
    }
    let _ = writeln!(
        out,
        "    {:>10} {:>8}  {:<22} line",
        "calls", "captures", "API"
    );
    for c in s.calls_per_line.iter().take(shown) {
        let mut at = c.location.short();
        if let Some(f) = &c.location.function {
            at += &format!("  {f}");
        }
        let _ = writeln!(
            out,
            "    {:>10} {:>8}  {:<22} {}",
            c.calls,
            c.captures,
            esc(&c.api),
            esc(&at)
        );
    }
}

/// Where sync and GPU time is attributed: at a line (the user's, inferred from another thread, a
/// library's) or at `<driver-internal>`.
fn render_attribution(out: &mut String, a: &gpufl_analysis::insights::attribution::Attribution) {
    use std::fmt::Write;
    let part = |what: &str, s: &gpufl_analysis::insights::attribution::Shares| {
        let total = s.total_ns();
        if total == 0 {
            return None;
        }
        let cats = [
            ("your line", s.user_ns),
            ("your line via another thread", s.inferred_ns),
            ("library line", s.library_ns),
            ("<driver-internal>", s.driver_internal_ns),
            ("unlocated", s.unlocated_ns),
        ];
        let shown: Vec<String> = cats
            .iter()
            .filter(|(_, ns)| *ns > 0)
            .map(|(name, ns)| format!("{name} {:.1} %", *ns as f64 * 100.0 / total as f64))
            .collect();
        Some(format!("{what}: {}", shown.join(", ")))
    };
    let parts: Vec<String> = [part("sync time", &a.sync), part("GPU time", &a.gpu)]
        .into_iter()
        .flatten()
        .collect();
    if !parts.is_empty() {
        let _ = writeln!(out, "  attributed: {}", parts.join(" · "));
    }
}

/// One line per device: idle time by class, then the utilization series as a bar per chunk
/// (nsys-style 30 chunks) and its low chunks (under 50 % busy once one-off pauses are left out:
/// the headline's count).
fn render_idle(out: &mut String, d: &gpufl_analysis::DeviceIdle, st: &Style) {
    use std::fmt::Write;
    let c = &d.by_class;
    let recorded = d.active_ns - d.paused_ns - d.unobserved_ns;
    let pct = |ns: u64| {
        if recorded == 0 {
            0.0
        } else {
            ns as f64 * 100.0 / recorded as f64
        }
    };
    // Always-on: idle is a share of the observed part of the active range.
    let (of, what) = if d.unobserved_ns > 0 {
        (recorded, "observed")
    } else {
        (d.active_ns, "active")
    };
    let _ = writeln!(
        out,
        "  GPU {} idle {} of {} {what} ({:.0} %): host launching late {} · host blocked {} · queued {} · between kernels {}",
        d.device,
        secs(d.idle_ns),
        secs(of),
        pct(d.idle_ns),
        secs(c.launch.idle_ns),
        secs(c.sync.idle_ns),
        secs(c.other.idle_ns),
        secs(c.kernel_wait.idle_ns)
    );
    if d.paused_ns > 0 {
        let _ = writeln!(
            out,
            "  GPU {} recording paused for {} of its active range (left out of idle time)",
            d.device,
            secs(d.paused_ns)
        );
    }
    if d.unobserved_ns > 0 {
        let _ = writeln!(
            out,
            "  GPU {} not observed for {} of its active range (outside the always-on windows; left out of idle time)",
            d.device,
            secs(d.unobserved_ns)
        );
    }
    if !d.utilization.is_empty() {
        const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        // A chunk mostly not observed (paused, outside always-on windows) is `·`: nothing is known.
        let unknown = |u: &gpufl_analysis::UtilChunk| u.unobserved_ns * 2 > u.duration_ns;
        let bars: String = d
            .utilization
            .iter()
            .map(|u| {
                if unknown(u) {
                    '·'
                } else {
                    BARS[((u.busy_share.clamp(0.0, 1.0) * 7.0).round()) as usize]
                }
            })
            .collect();
        let legend = if d.utilization.iter().any(unknown) {
            ", · mostly not observed"
        } else {
            ""
        };
        let pauses = if d.one_off_pause_ns > 0 {
            format!(
                ", one-off pauses ({}) left out",
                gpufl_analysis::fmt_duration(d.one_off_pause_ns)
            )
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "  GPU {} utilization {}  ({} of {} {}{pauses}{legend})",
            d.device,
            st.paint("36", &bars),
            d.low_utilization_chunks,
            d.utilization.len(),
            gpufl_analysis::headline::names::LOW_CHUNKS
        );
    }
}
