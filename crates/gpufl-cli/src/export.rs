//! `gpufl export`: sessions as a Perfetto or Chrome trace (the work is in `gpufl-export`).

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use gpufl_export::{export, find_sessions, Format, Options, DEFAULT_INSIGHTS_MAX_RECORDS};
use std::path::PathBuf;

#[derive(Clone, Copy, ValueEnum)]
pub enum FormatArg {
    /// Perfetto's protobuf trace (open in ui.perfetto.dev or trace_processor).
    Perfetto,
    /// Chrome's JSON trace events (chrome://tracing, Perfetto, speedscope…).
    Chrome,
}

#[derive(Args)]
pub struct ExportArgs {
    /// Session directories, or directories holding sessions (a run): one process track group
    /// per session, all in one file.
    #[arg(required = true)]
    sessions: Vec<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "perfetto")]
    format: FormatArg,
    /// Output file.
    #[arg(short = 'o', long)]
    output: PathBuf,
    /// Compute insights only for sessions of at most N records (their analysis holds the
    /// session in memory, ~60 bytes a record); 0 = no insights.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_INSIGHTS_MAX_RECORDS)]
    insights_max_records: u64,
    /// Decoding threads (default: GPUFL_THREADS, else every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Treat frames whose file contains PATTERN as your code (as `gpufl report`).
    #[arg(long = "user-path", value_name = "PATTERN")]
    user_path: Vec<String>,
    /// Write every frame of a stack: by default the leading frames of the recorder, CUPTI, the
    /// driver and the CUDA runtime's internals are left out (the first frame written is the CUDA
    /// call the program made, e.g. `cudaStreamSynchronize`).
    #[arg(long)]
    all_frames: bool,
    /// Don't print the summary on stderr.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(args: ExportArgs) -> Result<i32> {
    for p in &args.sessions {
        crate::summary::ensure_exists(p)?;
    }
    let dirs = find_sessions(&args.sessions)?;
    let config = crate::options::analysis_config(&[], &[], &args.user_path);
    let threads = crate::options::threads(args.threads);
    let opts = Options {
        format: match args.format {
            FormatArg::Perfetto => Format::Perfetto,
            FormatArg::Chrome => Format::Chrome,
        },
        insights_max_records: args.insights_max_records,
        threads,
        config,
        all_frames: args.all_frames,
    };
    let file = std::fs::File::create(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    let summary = export(&dirs, file, &opts)
        .with_context(|| format!("export to {} failed", args.output.display()))?;
    if !args.quiet {
        for s in &summary.sessions {
            crate::term::eprint_line(&format!(
                "{}: {} records → {} events, {} flows, {} counter samples, {} insights",
                crate::term::esc(&s.dir.display().to_string()),
                s.records,
                s.stats.events,
                s.stats.flows,
                s.stats.counters,
                s.insights
            ));
            for n in &s.notes {
                crate::term::eprint_line(&format!("  note: {}", crate::term::esc(n)));
            }
        }
        crate::term::eprint_line(&format!(
            "wrote {}",
            crate::term::esc(&args.output.display().to_string())
        ));
    }
    Ok(0)
}
