//! `gpufl`: record CUDA programs and read the recordings.

mod diff;
mod dump;
mod export;
mod exporter;
#[cfg(test)]
mod fuzz;
mod headline;
mod options;
mod record;
mod report;
mod serve;
mod summary;
mod term;
mod trigger;
mod upload;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "gpufl",
    version,
    about = "GPU flight recorder: record any CUDA process, find where it stalls"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a command and record it (and its child processes), one session directory per process.
    Record(record::RecordArgs),
    /// Summarize sessions: header, counts, time blocked in syncs, warnings.
    Info {
        /// Session directories, or directories containing sessions.
        #[arg(required = true)]
        sessions: Vec<PathBuf>,
    },
    /// Where the GPU stalls: insights ranked by time impact, each with its source line and fix.
    Report(report::ReportArgs),
    /// Print a session's records as NDJSON, with interned ids resolved (stacks as frame lists).
    Dump(dump::DumpArgs),
    /// Ask a process recorded in always-on mode for a full-detail window (everything recorded for
    /// N seconds).
    Trigger(trigger::TriggerArgs),
    /// Serve Prometheus metrics for this node: the GPUs (NVML, dcgm-exporter's names) and the
    /// processes gpufl records here (time blocked in syncs, the top sync line, GPU busy).
    Exporter(exporter::ExporterArgs),
    /// Write sessions as a timeline: Perfetto's protobuf trace or Chrome's JSON trace events
    /// (threads, GPU streams, launch → kernel flows, scopes, telemetry counters, insights).
    Export(export::ExportArgs),
    /// Send sessions to a gpufl server (`gpufl serve`): resumable, only what the server lacks.
    Upload(upload::UploadArgs),
    /// Compare two sessions: wall, GPU busy, kernels, sync and copy time per line, insights new /
    /// gone / changed. Exit status 3 with --fail-on-regression when something regressed beyond it.
    Diff(diff::DiffArgs),
    /// Serve a team's sessions: uploads with API keys, analysis, the JSON API (docs/server-api.md).
    Serve(serve::ServeArgs),
    /// Projects and API keys of a `gpufl serve` database.
    Admin(serve::AdminArgs),
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        // The reader of our output went away (`| head`): done, quietly.
        Err(e) if term::is_closed_pipe(&e) => 0,
        Err(e) => {
            term::eprint_line(&format!("gpufl: error: {}", term::esc(&format!("{e:#}"))));
            2
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> Result<i32> {
    match cli.cmd {
        Cmd::Record(args) => record::run(args),
        Cmd::Info { sessions } => summary::info(&sessions),
        Cmd::Dump(args) => dump::run(args),
        Cmd::Report(args) => report::run(args),
        Cmd::Trigger(args) => trigger::run(args),
        Cmd::Exporter(args) => exporter::run(args),
        Cmd::Export(args) => export::run(args),
        Cmd::Upload(args) => upload::run(args),
        Cmd::Diff(args) => diff::run(args),
        Cmd::Serve(args) => serve::serve(args),
        Cmd::Admin(args) => serve::admin(args),
    }
}
