//! `gpufl report` over a run: the sessions of one `gpufl record` of several processes (a run
//! directory with `run.json`), or sessions whose headers carry ranks. The run view: the run record,
//! the ranks side by side, the processes without CUDA work in one line, the clock alignment, the
//! cross-rank insights; then each rank's own report.

use super::insight::render_insight;
use super::session::render;
use super::style::{cut, secs, Style};
use super::SessionReport;
use crate::term::{esc, esc_path};
use anyhow::Result;
use gpufl_analysis::run::Folded;
use gpufl_analysis::{analyze_run, Config, Model, RunAnalysis, RunMember};
use gpufl_trace::run::{is_run_dir, read_run, RunRecord};
use serde::Serialize;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// The run directories among `paths` and directly under them (as `find_sessions` looks).
pub(crate) fn run_dirs(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for p in paths {
        if is_run_dir(p) {
            out.push(p.clone());
        } else if !gpufl_trace::session::is_session_dir(p) {
            let mut sub: Vec<PathBuf> = std::fs::read_dir(p)
                .into_iter()
                .flatten()
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|d| d.is_dir() && is_run_dir(d))
                .collect();
            sub.sort();
            out.extend(sub);
        }
    }
    out
}

/// Whether the sessions make a run view: two or more, from a run directory or with ranks.
pub(crate) fn is_run(run_dirs: &[PathBuf], models: &[Model]) -> bool {
    let ranked = models
        .iter()
        .filter(|m| m.header().is_some_and(|h| h.rank.is_some()))
        .count();
    models.len() >= 2 && (!run_dirs.is_empty() || ranked >= 2)
}

/// A run directory's record, as `--json` prints it.
#[derive(Serialize)]
pub(crate) struct RunDir {
    dir: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    record: Option<RunRecord>,
    /// Why the record could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// The run view's data.
#[derive(Serialize)]
pub(crate) struct Run {
    runs: Vec<RunDir>,
    #[serde(flatten)]
    analysis: RunAnalysis,
}

fn name_of(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string())
}

pub(crate) fn analyze(
    run_dirs: &[PathBuf],
    reports: &[SessionReport],
    models: &[Model],
    cfg: &Config,
) -> Run {
    let runs = run_dirs
        .iter()
        .map(|d| {
            let (record, error) = match read_run(d) {
                Ok(r) => (r, None),
                Err(e) => (None, Some(e.to_string())),
            };
            RunDir {
                dir: d.display().to_string(),
                record,
                error,
            }
        })
        .collect();
    let members: Vec<RunMember> = reports
        .iter()
        .zip(models)
        .map(|(r, m)| RunMember {
            name: name_of(&r.session),
            model: m,
            analysis: &r.analysis,
        })
        .collect();
    let mut analysis = analyze_run(&members, cfg);
    if run_dirs.len() > 1 {
        analysis.warnings.push(format!(
            "{} runs given together: their ranks are shown side by side and matched as one job",
            run_dirs.len()
        ));
    }
    Run { runs, analysis }
}

/// `--json` of a run: the run view, then every session's report.
pub(crate) fn render_json(run: &Run, reports: &[SessionReport]) -> Result<String> {
    let mut s =
        serde_json::to_string_pretty(&serde_json::json!({ "run": run, "sessions": reports }))?;
    s.push('\n');
    Ok(s)
}

pub(crate) fn render_text(
    run: &Run,
    reports: &[SessionReport],
    run_only: bool,
    st: &Style,
) -> String {
    let a = &run.analysis;
    let mut out = String::new();
    let title = match run.runs.as_slice() {
        [one] => format!("gpufl run · {}", esc_path(Path::new(&one.dir))),
        _ => format!("gpufl run · {} sessions", a.processes),
    };
    let _ = writeln!(out, "{}", st.paint("1", &title));
    run_records(&mut out, &run.runs, st);
    let folded = a.without_cuda_work.as_ref();
    let _ = writeln!(
        out,
        "  {} process{}: {} with CUDA work{}",
        a.processes,
        if a.processes == 1 { "" } else { "es" },
        a.ranks.len(),
        folded
            .map(|f| format!(", {} without", f.processes))
            .unwrap_or_default()
    );
    rank_table(&mut out, a, st);
    if let Some(f) = folded {
        without_cuda_work(&mut out, f);
    }
    if let Some(c) = &a.clock {
        let how = match c.method {
            gpufl_analysis::insights::collective_wait::ClockMethod::SameHost => format!(
                "one host ({}), aligned by each session's clock pair within {}",
                esc(&c.hosts.join(", ")),
                secs(c.error_bound_ns.unwrap_or(0))
            ),
            gpufl_analysis::insights::collective_wait::ClockMethod::CollectiveEnds => format!(
                "{} hosts ({}), aligned on the collectives' end times (approximate)",
                c.hosts.len(),
                esc(&c.hosts.join(", "))
            ),
        };
        let matched = match &c.windows {
            None => "matched".to_string(),
            Some(w) => format!(
                "matched by end time in {} of the {} windows all ranks had open (always-on, {} observed by all)",
                w.with_collectives,
                w.windows,
                secs(w.observed_ns)
            ),
        };
        let _ = writeln!(
            out,
            "  clocks: {how}; {} collectives {matched}, their ends {} apart across ranks (median)",
            c.collectives,
            secs(c.end_spread_ns.unwrap_or(0))
        );
    }
    for w in &a.warnings {
        let _ = writeln!(out, "  {} {}", st.paint("33", "warning:"), esc(w));
    }
    if a.insights.is_empty() {
        let _ = writeln!(out, "\n  No cross-rank insights.");
    } else {
        let _ = writeln!(out, "\n  Cross-rank insights");
        for (i, ins) in a.insights.iter().enumerate() {
            render_insight(&mut out, i + 1, ins, st);
        }
    }
    if !run_only {
        for r in &a.ranks {
            out.push('\n');
            let label = match r.rank {
                Some(x) => format!("rank {x}"),
                None => format!("pid {}", r.pid),
            };
            let _ = writeln!(out, "{}", st.paint("1", &format!("── {label} ──")));
            render(&mut out, &reports[r.member], st);
        }
    }
    out
}

/// Each run directory's record: the command, how it ended, its wall time and host; or why it could
/// not be read.
fn run_records(out: &mut String, runs: &[RunDir], st: &Style) {
    for r in runs {
        match (&r.record, &r.error) {
            (Some(rec), _) => {
                let end = match (rec.exit_code, &rec.signal) {
                    (_, Some(sig)) => format!(" · killed by {}", esc(sig)),
                    (Some(c), None) => format!(" · exit {c}"),
                    (None, None) => " · no end recorded".to_string(),
                };
                let wall = rec
                    .end_unix_ns
                    .map(|e| format!(" · {}", secs(e.saturating_sub(rec.start_unix_ns))))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "  command   {}{end}{wall} · host {}",
                    esc(&rec.command.join(" ")),
                    esc(&rec.host)
                );
            }
            (None, Some(e)) => {
                let _ = writeln!(
                    out,
                    "  {} run record unreadable: {}",
                    st.paint("33", "warning:"),
                    esc(e)
                );
            }
            (None, None) => {}
        }
    }
}

/// The ranks side by side: one row each, with its top insight.
fn rank_table(out: &mut String, a: &RunAnalysis, st: &Style) {
    let _ = writeln!(
        out,
        "\n  {:>4} {:>7}  {:<16} {:>9} {:>8} {:>8} {:>18} {:>6} {:>9}  top insight",
        "rank", "pid", "GPU", "wall", "GPU busy", "kernels", "comm kernels", "syncs", "blocked"
    );
    for r in &a.ranks {
        let rank = r.rank.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
        let gpu = r
            .gpu
            .as_ref()
            .map(|g| {
                let name = g.name.trim_start_matches("NVIDIA ");
                cut(&format!("{} {name}", g.index), 16)
            })
            .unwrap_or_else(|| "-".into());
        let top = r
            .top_insight
            .as_ref()
            .map(|t| {
                format!(
                    "{} {}",
                    st.severity(t.severity).trim_end(),
                    esc(&cut(&t.title, 60))
                )
            })
            .unwrap_or_else(|| "none".into());
        let _ = writeln!(
            out,
            "  {:>4} {:>7}  {:<16} {:>9} {:>7.1}% {:>8} {:>18} {:>6} {:>9}  {top}",
            rank,
            r.pid,
            esc(&gpu),
            secs(r.wall_ns),
            r.gpu_busy_pct,
            r.kernels,
            format!("{} ({})", r.comm_kernels, secs(r.comm_ns)),
            r.syncs,
            secs(r.sync_blocked_ns),
        );
    }
}

/// The processes without CUDA work, in one line.
fn without_cuda_work(out: &mut String, f: &Folded) {
    let pids: Vec<String> = f.pids.iter().map(|p| p.to_string()).collect();
    let _ = writeln!(
        out,
        "  {} without CUDA work: {} (pid {}) · no kernels, copies or memsets · {} telemetry samples",
        if f.processes == 1 {
            "1 process".to_string()
        } else {
            format!("{} processes", f.processes)
        },
        esc(&f.apps.join(", ")),
        pids.join(", "),
        f.telemetry_samples
    );
}
