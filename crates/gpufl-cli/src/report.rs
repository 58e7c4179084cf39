//! `gpufl report`: the insights of one or more sessions, ranked by time impact.

use crate::summary::expand_sessions;
use anyhow::Result;
use clap::Args;
use gpufl_analysis::{
    analyze, Analysis, Config, FrameFilter, FrameOrigin, Insight, Model, Severity,
};
use gpufl_trace::SessionReader;
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
    /// Colours: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, default_value = "auto")]
    color: String,
}

/// One session's report, as `--json` prints it.
#[derive(Serialize)]
struct SessionReport {
    session: String,
    command: Vec<String>,
    gpus: Vec<String>,
    #[serde(flatten)]
    analysis: Analysis,
}

pub fn run(args: ReportArgs) -> Result<i32> {
    let dirs = expand_sessions(&args.sessions)?;
    let mut filter = FrameFilter::default();
    filter.include.extend(args.include.iter().cloned());
    filter.exclude.extend(args.exclude.iter().cloned());
    let cfg = Config { filter };
    let mut reports = Vec::new();
    for dir in dirs {
        let mut reader = SessionReader::open(&dir)?;
        let mut model = Model::load(reader.by_ref());
        model.add_warnings(reader.warnings());
        let analysis = analyze(&model, &cfg);
        let header = model.header();
        reports.push(SessionReport {
            session: dir.display().to_string(),
            command: header.map(|h| h.command_line.clone()).unwrap_or_default(),
            gpus: header
                .map(|h| h.gpus.iter().map(|g| g.name.clone()).collect())
                .unwrap_or_default(),
            analysis,
        });
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "sessions": reports }))?
        );
        return Ok(0);
    }
    let color = match args.color.as_str() {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
    };
    let mut out = String::new();
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        render(&mut out, r, &Style { color });
    }
    print!("{out}");
    Ok(0)
}

struct Style {
    color: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    fn severity(&self, s: Severity) -> String {
        match s {
            Severity::High => self.paint("1;31", "HIGH  "),
            Severity::Medium => self.paint("1;33", "MEDIUM"),
            Severity::Low => self.paint("2", "LOW   "),
        }
    }
}

fn secs(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else {
        format!("{:.1} µs", s * 1e6)
    }
}

fn render(out: &mut String, r: &SessionReport, st: &Style) {
    use std::fmt::Write;
    let a = &r.analysis;
    let t = &a.totals;
    let _ = writeln!(
        out,
        "{}",
        st.paint("1", &format!("gpufl report · {}", r.session))
    );
    if !r.command.is_empty() {
        let _ = writeln!(out, "  command   {}", r.command.join(" "));
    }
    if !r.gpus.is_empty() {
        let _ = writeln!(out, "  GPU       {}", r.gpus.join(", "));
    }
    let _ = writeln!(
        out,
        "  wall {} · GPU busy {:.1} % · {} kernels · {} syncs · {} blocked in syncs",
        secs(t.wall_ns),
        t.gpu_busy_pct,
        t.kernels,
        t.syncs,
        secs(t.sync_blocked_ns)
    );
    for d in &a.gpu_idle {
        render_idle(out, d, st);
    }
    for d in &a.telemetry {
        crate::report_telemetry::render(out, d);
    }
    crate::report_scopes::render(out, &a.scopes);
    for w in &a.warnings {
        let _ = writeln!(out, "  {} {w}", st.paint("33", "warning:"));
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
    crate::kernel_table::render(out, &a.kernels);
}

/// One line per device: idle time by class, then the utilization series as a bar per chunk
/// (nsys-style 30 chunks; chunks under 50 % busy are the low ones).
fn render_idle(out: &mut String, d: &gpufl_analysis::DeviceIdle, st: &Style) {
    use std::fmt::Write;
    let c = &d.by_class;
    let recorded = d.active_ns - d.paused_ns;
    let pct = |ns: u64| {
        if recorded == 0 {
            0.0
        } else {
            ns as f64 * 100.0 / recorded as f64
        }
    };
    let _ = writeln!(
        out,
        "  GPU {} idle {} of {} active ({:.0} %): host launching late {} · host blocked {} · queued {} · between kernels {}",
        d.device,
        secs(d.idle_ns),
        secs(d.active_ns),
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
    if !d.utilization.is_empty() {
        const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
        let bars: String = d
            .utilization
            .iter()
            .map(|u| BARS[((u.busy_share.clamp(0.0, 1.0) * 7.0).round()) as usize])
            .collect();
        let _ = writeln!(
            out,
            "  GPU {} utilization {}  ({} of {} chunks under 50 %)",
            d.device,
            st.paint("36", &bars),
            d.low_utilization_chunks,
            d.utilization.len()
        );
    }
}

fn render_insight(out: &mut String, n: usize, ins: &Insight, st: &Style) {
    use std::fmt::Write;
    let _ = writeln!(
        out,
        "  {n:>2}. {} {}  {}",
        st.severity(ins.severity),
        st.paint("1", &ins.title),
        st.paint("2", &format!("[{}]", ins.rule))
    );
    if !ins.detail.is_empty() {
        let _ = writeln!(out, "             {}", ins.detail);
    }
    let loc = &ins.location;
    if loc.origin == gpufl_analysis::FrameOrigin::Device {
        let _ = writeln!(
            out,
            "             at {} (the whole device: no source line)",
            st.paint("36", &loc.file)
        );
        let _ = writeln!(out, "             fix: {}", ins.fix);
        return;
    }
    if loc.origin == FrameOrigin::Kernel {
        // No launch line: the kernel's name stands for it (already in the title).
        let _ = writeln!(
            out,
            "             at kernel {} (no launch call site recorded)",
            st.paint("36", &loc.file)
        );
        let _ = writeln!(out, "             fix: {}", ins.fix);
        return;
    }
    let mut at = loc.file.clone();
    if let Some(l) = loc.line {
        at += &format!(":{l}");
    }
    if let Some(f) = &loc.function {
        at += &format!("  {f}");
    }
    let _ = writeln!(out, "             at {}", st.paint("36", &at));
    if let Some(path) = &ins.scope {
        let _ = writeln!(
            out,
            "             in scope {}",
            st.paint("35", &path.join(" > "))
        );
    }
    let _ = writeln!(out, "             fix: {}", ins.fix);
}
