//! `gpufl report`: the insights of one or more sessions, ranked by time impact.
//!
//! The command (arguments, loading, JSON) is here; the text is drawn by the modules below: one
//! session's report ([`session`]), the run view over several ranks ([`run`]), one insight
//! ([`insight`]), the overview that starts a report of several sessions ([`overview`]), the sections ([`graphs`], [`scopes`], [`telemetry`], [`kernels`]) and the look
//! ([`style`]).

mod graphs;
mod insight;
mod kernels;
mod overview;
mod run;
mod scopes;
mod session;
pub(crate) mod style;
mod telemetry;

use crate::options;
use crate::summary::expand_sessions;
use anyhow::Result;
use clap::Args;
use gpufl_analysis::{analyze_on, Analysis, Config, Model};
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
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
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
    /// Show at most N findings per session (the top N by impact; text and --json). Default: all.
    #[arg(long, value_name = "N")]
    top: Option<usize>,
}

/// One session's report, as `--json` prints it.
#[derive(Serialize)]
pub(crate) struct SessionReport {
    pub(crate) session: String,
    command: Vec<String>,
    gpus: Vec<String>,
    /// Findings left out by `--top` (absent when none).
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) findings_not_shown: usize,
    #[serde(flatten)]
    pub(crate) analysis: Analysis,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `--top N`: each session's first N findings (the ranked list's top), the others counted.
fn keep_top(reports: &mut [SessionReport], top: Option<usize>) {
    let Some(n) = top else {
        return;
    };
    for r in reports {
        let all = r.analysis.insights.len();
        r.analysis.insights.truncate(n);
        r.findings_not_shown = all - r.analysis.insights.len();
    }
}

pub fn run(args: ReportArgs) -> Result<i32> {
    let dirs = expand_sessions(&args.sessions)?;
    let cfg = options::analysis_config(&args.include, &args.exclude, &args.user_path);
    let threads = options::threads(args.threads);
    let run_dirs = run::run_dirs(&args.sessions);
    let mut reports = Vec::new();
    let mut models = Vec::new();
    for dir in dirs {
        let (r, m) = load_with_model(&dir, &cfg, threads)?;
        reports.push(r);
        models.push(m);
    }
    if !args.no_run && run::is_run(&run_dirs, &models) {
        let run = run::analyze(&run_dirs, &reports, &models, &cfg);
        drop(models);
        keep_top(&mut reports, args.top);
        if args.json {
            crate::term::print(&run::render_json(&run, &reports)?)?;
            return Ok(0);
        }
        let color = color_of(&args.color);
        let st = style::Style { color };
        crate::term::print(&run::render_text(&run, &reports, args.run_only, &st))?;
        return Ok(0);
    }
    drop(models);
    keep_top(&mut reports, args.top);
    if args.json {
        crate::term::print(&render_json(&reports)?)?;
        return Ok(0);
    }
    crate::term::print(&render_text(&reports, color_of(&args.color)))?;
    Ok(0)
}

fn color_of(arg: &str) -> bool {
    match arg {
        "always" => true,
        "never" => false,
        _ => std::io::stdout().is_terminal() && !crate::options::no_color(),
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
        findings_not_shown: 0,
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

/// The text report: with several sessions, the overview first ([`overview`]: each session's top
/// finding, sessions by its impact), then each session's report.
pub(crate) fn render_text(reports: &[SessionReport], color: bool) -> String {
    let mut out = String::new();
    if reports.len() > 1 {
        overview::render(&mut out, reports, &style::Style { color });
    }
    for (i, r) in reports.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        session::render(&mut out, r, &style::Style { color });
    }
    out
}
