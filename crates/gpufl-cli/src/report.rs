//! `gpufl report`: the insights of one or more sessions, ranked by time impact.

use crate::summary::expand_sessions;
use crate::term::esc;
use anyhow::Result;
use clap::Args;
use gpufl_analysis::{
    analyze_on, Analysis, Config, FrameFilter, FrameOrigin, Insight, Model, Severity,
};
use gpufl_trace::ParSessionReader;
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;

#[derive(Args)]
pub struct ReportArgs {
    /// Session directories (or directories containing sessions, e.g. one per process).
    #[arg(required = true)]
    sessions: Vec<PathBuf>,
    /// Print the insights as JSON (stable field names) instead of text.
    #[arg(long)]
    json: bool,
    /// Count frames whose file or module contains PATTERN as user code (repeatable).
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Never pick frames whose file or module contains PATTERN as the user frame (repeatable).
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Your own code, where it would otherwise count as a library (your package installed in
    /// site-packages): frames whose file contains PATTERN are user frames (repeatable; also
    /// GPUFL_USER_PATHS, colon-separated).
    #[arg(long = "user-path", value_name = "PATTERN")]
    user_path: Vec<String>,
    /// Colours: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, default_value = "auto")]
    color: String,
    /// Threads to decode and analyse with (default: GPUFL_THREADS, else every available core).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// For a run (the sessions of one `gpufl record` of several processes): print the run view
    /// only (ranks side by side, cross-rank insights), not each session's report after it.
    #[arg(long)]
    run_only: bool,
    /// Never print the run view: one report per session, as for unrelated sessions.
    #[arg(long, conflicts_with = "run_only")]
    no_run: bool,
}

/// One session's report, as `--json` prints it.
#[derive(Serialize)]
pub(crate) struct SessionReport {
    pub(crate) session: String,
    command: Vec<String>,
    gpus: Vec<String>,
    #[serde(flatten)]
    pub(crate) analysis: Analysis,
}

pub fn run(args: ReportArgs) -> Result<i32> {
    let dirs = expand_sessions(&args.sessions)?;
    let cfg = config(&args.include, &args.exclude, &args.user_path);
    let threads = threads(args.threads);
    let run_dirs = crate::report_run::run_dirs(&args.sessions);
    let mut reports = Vec::new();
    let mut models = Vec::new();
    for dir in dirs {
        let (r, m) = load_with_model(&dir, &cfg, threads)?;
        reports.push(r);
        models.push(m);
    }
    if !args.no_run && crate::report_run::is_run(&run_dirs, &models) {
        let run = crate::report_run::analyze(&run_dirs, &reports, &models, &cfg);
        drop(models);
        if args.json {
            crate::term::print(&crate::report_run::render_json(&run, &reports)?)?;
            return Ok(0);
        }
        let color = color_of(&args.color);
        let st = Style { color };
        crate::term::print(&crate::report_run::render_text(
            &run,
            &reports,
            args.run_only,
            &st,
        ))?;
        return Ok(0);
    }
    drop(models);
    if args.json {
        crate::term::print(&render_json(&reports)?)?;
        return Ok(0);
    }
    crate::term::print(&render_text(&reports, color_of(&args.color)))?;
    Ok(0)
}

/// The analysis settings of `--include`, `--exclude`, `--user-path` and GPUFL_USER_PATHS.
pub(crate) fn config(include: &[String], exclude: &[String], user_path: &[String]) -> Config {
    let mut filter = FrameFilter::default();
    filter.include.extend(include.iter().cloned());
    filter.include.extend(user_path.iter().cloned());
    if let Ok(v) = std::env::var("GPUFL_USER_PATHS") {
        filter
            .include
            .extend(v.split(':').filter(|p| !p.is_empty()).map(str::to_string));
    }
    filter.exclude.extend(exclude.iter().cloned());
    Config { filter }
}

/// `--threads N`, else GPUFL_THREADS, else every available core.
pub(crate) fn threads(arg: Option<usize>) -> usize {
    match arg {
        Some(n) if n > 0 => n.min(gpufl_trace::par::MAX_THREADS),
        _ => gpufl_trace::default_threads(),
    }
}

fn color_of(arg: &str) -> bool {
    match arg {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    }
}

/// Read, load and analyze one session directory.
#[cfg(test)]
pub(crate) fn load(dir: &std::path::Path, cfg: &Config, threads: usize) -> Result<SessionReport> {
    load_with_model(dir, cfg, threads).map(|(r, _)| r)
}

/// Read, load and analyze one session directory; the model too (for the run view).
pub(crate) fn load_with_model(
    dir: &std::path::Path,
    cfg: &Config,
    threads: usize,
) -> Result<(SessionReport, Model)> {
    let mut reader = ParSessionReader::open(dir, threads)?;
    let mut model = Model::load_items(&mut reader);
    model.add_warnings(reader.warnings());
    let analysis = analyze_on(&model, cfg, threads);
    let header = model.header();
    let report = SessionReport {
        session: dir.display().to_string(),
        command: header.map(|h| h.command_line.clone()).unwrap_or_default(),
        gpus: header
            .map(|h| h.gpus.iter().map(|g| g.name.clone()).collect())
            .unwrap_or_default(),
        analysis,
    };
    Ok((report, model))
}

/// The `--json` output.
pub(crate) fn render_json(reports: &[SessionReport]) -> Result<String> {
    let mut s = serde_json::to_string_pretty(&serde_json::json!({ "sessions": reports }))?;
    s.push('\n');
    Ok(s)
}

/// The text report.
pub(crate) fn render_text(reports: &[SessionReport], color: bool) -> String {
    let mut out = String::new();
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render(&mut out, r, &Style { color });
    }
    out
}

pub(crate) struct Style {
    pub(crate) color: bool,
}

impl Style {
    pub(crate) fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    pub(crate) fn severity(&self, s: Severity) -> String {
        match s {
            Severity::High => self.paint("1;31", "HIGH  "),
            Severity::Medium => self.paint("1;33", "MEDIUM"),
            Severity::Low => self.paint("2", "LOW   "),
        }
    }
}

pub(crate) fn secs(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

pub(crate) fn render(out: &mut String, r: &SessionReport, st: &Style) {
    use std::fmt::Write;
    let a = &r.analysis;
    let t = &a.totals;
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
    // Always-on: busy share and kernels are the windows' only.
    let (of_observed, in_windows) = if a.sampling.is_some() {
        (" of observed", " in windows")
    } else {
        ("", "")
    };
    let _ = writeln!(
        out,
        "  wall {} · GPU busy {:.1} %{of_observed} · {} kernels{in_windows} · {} syncs · {} blocked in syncs",
        secs(t.wall_ns),
        t.gpu_busy_pct,
        t.kernels,
        t.syncs,
        secs(t.sync_blocked_ns)
    );
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
        crate::report_telemetry::render(out, d);
    }
    crate::report_scopes::render(out, &a.scopes);
    crate::report_scopes::render_ranges(out, &a.ranges);
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
    if let Some(s) = &a.sampling {
        render_calls(out, s);
    }
    crate::report_graphs::render(out, &a.graphs);
    crate::kernel_table::render(out, &a.kernels);
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
/// (nsys-style 30 chunks; chunks under 50 % busy are the low ones).
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
        let _ = writeln!(
            out,
            "  GPU {} utilization {}  ({} of {} chunks under 50 %{legend})",
            d.device,
            st.paint("36", &bars),
            d.low_utilization_chunks,
            d.utilization.len()
        );
    }
}

pub(crate) fn render_insight(out: &mut String, n: usize, ins: &Insight, st: &Style) {
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
    if let Some(path) = &ins.scope {
        let p: Vec<String> = path.iter().map(|s| esc(s).into_owned()).collect();
        let _ = writeln!(
            out,
            "             in scope {}",
            st.paint("35", &p.join(" > "))
        );
    }
    let _ = writeln!(out, "             fix: {}", esc(&ins.fix));
}
