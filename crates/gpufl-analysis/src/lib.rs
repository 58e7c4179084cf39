//! # gpufl-analysis
//!
//! Sans-IO analysis of a recorded session: [`Model::load`] takes the records a reader yields (it
//! never opens a file), [`analyze`] runs the insight rules and returns plain data, every output
//! type `serde::Serialize` so that tools can print stable JSON. Rendering is the caller's.
//!
//! ```no_run
//! # fn main() -> Result<(), gpufl_trace::TraceError> {
//! let mut reader = gpufl_trace::SessionReader::open(std::path::Path::new("session-dir"))?;
//! let mut model = gpufl_analysis::Model::load(reader.by_ref());
//! model.add_warnings(reader.warnings());
//! let analysis = gpufl_analysis::analyze(&model, &gpufl_analysis::Config::default());
//! for i in &analysis.insights {
//!     println!("{:?} {}", i.severity, i.title);
//! }
//! # Ok(()) }
//! ```
//!
//! Rules (one file each under `insights/`, documented there and in `docs/insights.md`):
//! `sync-attribution`, `in-loop-sync`, and the streams seed's `pageable-async-copy`,
//! `blocking-copy`, `default-stream-barrier`, `device-wide-sync`, `no-copy-compute-overlap`,
//! `gpu-idle` (with a per-device idle summary and utilization series), `launch-bound` and
//! `low-utilization` (gpu-idle's low chunks and what the host did then, with NVML's utilization as
//! a second opinion when recorded); from GPU telemetry, `throttling`, `memory-pressure` and
//! `ecc-errors` (with a per-device telemetry summary); and the kernel rules `low-occupancy`,
//! `register-spill` and `under-filled-grid`, over the kernel table ([`kernels`], with theoretical
//! occupancy from [`occupancy`]; communication kernels, [`comm`], left out); over the counters
//! and PC samples from inside kernels ([`kdetail`]), `warp-divergence`, `uncoalesced-access`,
//! `bank-conflicts` and `stall-reasons`. Over the sessions of
//! a run (one per rank), [`analyze_run`] summarizes the ranks side by side and runs the cross-rank
//! rule `collective-wait`.
//!
//! [`diff`] compares two analysed sessions (`gpufl diff`): a [`diff::Profile`] of each, then a
//! typed [`diff::Diff`] of totals, kernels, sync and copy time per line, and insights.

mod access;
pub mod comm;
mod corrs;
pub mod diff;
pub mod error;
mod fold;
pub mod insight;
pub mod insights;
pub mod intervals;
pub mod kdetail;
pub mod kernels;
pub mod lines;
pub mod model;
pub mod occupancy;
pub mod pipeline;
pub mod run;
pub mod sampling;
pub mod scopes;
mod store;
pub mod telemetry;
mod text;
pub mod totals;
pub mod userframe;
pub mod views;
mod work;

pub use error::AnalysisError;
pub use insights::gpu_idle::{ClassTotal, DeviceIdle, Gap, IdleByClass, IdleClass, UtilChunk};
pub use insights::graphs::{GraphOp, GraphSummary};
pub use insights::in_loop_sync::{MIN_MEDIAN_KERNELS, MIN_SYNCS};
pub use insights::utilization::{ChunkIdle, ChunkLine};
pub use insights::{fmt_duration, Insight, RuleData, Severity};
pub use intervals::{union_ns, DeviceBusy};
pub use kernels::{KernelRow, KernelSource, KernelTable};
pub use model::{Model, Window, WindowReason};
pub use occupancy::{Limiter, Occupancy, SmLimits};
pub use run::{analyze_run, RunAnalysis, RunMember};
pub use sampling::{Basis, BasisKind, CallsPerLine, Sampling};
pub use scopes::{rollup_path, RangeRollup, RangeSpan, ScopeRollup, ScopeSpan, MAX_SCOPE_DEPTH};
pub use telemetry::{DeviceTelemetry, EccCounts, Stat, ThrottleTime};
pub use totals::{totals, Totals};
pub use userframe::{
    user_frame, FrameFilter, FrameOrigin, SourceLoc, BUILTIN_EXCLUDES, DRIVER_INTERNAL,
};
pub use views::{ApiRec, CopyOp, CopyRec, FrameView, KernelRec, LaunchConfig, SyncRec};

use serde::Serialize;

/// Analysis settings.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Which frames are the user's code.
    pub filter: FrameFilter,
}

/// What one task of [`analyze_on`] returns.
enum Part {
    Idle(Vec<Insight>, Vec<DeviceIdle>, Vec<Insight>),
    Found(Vec<Insight>),
    Attribution(insights::attribution::Attribution),
    Scopes(Vec<scopes::ScopeRollup>, Vec<scopes::RangeRollup>),
    Sampling(Option<sampling::Sampling>),
    Graphs(Vec<GraphSummary>, Vec<Insight>),
}

/// Result of [`analyze`].
#[derive(Serialize, Clone, Debug)]
pub struct Analysis {
    pub totals: Totals,
    /// Sync and GPU time by what their locations name (a user line, inferred, a library line,
    /// `<driver-internal>`).
    pub attribution: insights::attribution::Attribution,
    /// Ranked by `impact_ns`, highest first; ties by rule, then location, then title.
    pub insights: Vec<Insight>,
    /// Whether CPU stacks were captured (some sync carries one, or the trace has stack records):
    /// without them there are no source lines and no insights.
    pub has_stacks: bool,
    /// The model's warnings (loading and the reader's), then the analysis's own.
    pub warnings: Vec<String>,
    /// Per device with GPU work: idle gaps by class, the longest gaps, utilization over time
    /// (rule `gpu-idle`, docs/insights.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpu_idle: Vec<insights::gpu_idle::DeviceIdle>,
    /// Per device with NVML samples: min / mean / max of each metric, throttling time, ECC
    /// counters (`telemetry` records; absent without them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub telemetry: Vec<telemetry::DeviceTelemetry>,
    /// Per kernel name and device: launches, GPU time, launch configuration, occupancy (absent
    /// without kernels).
    #[serde(skip_serializing_if = "KernelTable::is_empty")]
    pub kernels: KernelTable,
    /// Per named scope (gpufl API and NVTX ranges), in tree order: wall time, GPU busy, kernels,
    /// synchronizations and time blocked in them (absent without `scope` records).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<scopes::ScopeRollup>,
    /// Per start/end range name (NVTX `nvtxRangeStart*` / `nvtxRangeEnd`), longest total first
    /// (absent without `range` records).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranges: Vec<scopes::RangeRollup>,
    /// Always-on sessions: windows, GPU-observed time and coverage, calls per line estimated from
    /// the sampled call sites (absent in default-mode sessions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sampling: Option<sampling::Sampling>,
    /// Per CUDA graph (the kernels, copies and memsets graph launches ran): replays, time per
    /// replay, gaps between replays and the host syncs in them, the launch line, the operations
    /// with most time (absent without graph work).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub graphs: Vec<GraphSummary>,
}

/// Run every rule over a model, on this thread.
pub fn analyze(m: &Model, cfg: &Config) -> Analysis {
    analyze_on(m, cfg, 1)
}

/// Run every rule over a model, on up to `threads` threads; the same analysis as [`analyze`].
/// The device busy intervals, then the kernel table, are computed piece by piece on every
/// thread; then the rules run as tasks on the threads, the longest first: GPU idle time and low
/// utilization, in-loop-sync, the kernel rules, the attribution, the other rules, the scopes,
/// the CUDA graphs, the sampling summary. Their insights are concatenated in the order the rules always ran.
pub fn analyze_on(m: &Model, cfg: &Config, threads: usize) -> Analysis {
    let threads = threads.max(1);
    let busy = DeviceBusy::new_on(m, threads);
    let totals = totals::totals_with(m, &busy);
    let kernels = kernels::table_on(m, &busy, threads);
    let cx = insights::Ctx::new(m, cfg, &busy, totals.wall_ns);
    let task = |i: usize| -> Part {
        match i {
            0 => {
                let (found, gpu_idle) = insights::gpu_idle::run(&cx);
                let low = insights::low_utilization::run(&cx, &gpu_idle);
                Part::Idle(found, gpu_idle, low)
            }
            1 => Part::Found(insights::in_loop_sync::run(&cx)),
            2 => {
                let mut found = insights::low_occupancy::run(&cx, &kernels);
                found.extend(insights::register_spill::run(&cx, &kernels));
                found.extend(insights::under_filled_grid::run(&cx, &kernels));
                found.extend(insights::warp_divergence::run(&cx, &kernels));
                found.extend(insights::uncoalesced_access::run(&cx, &kernels));
                found.extend(insights::bank_conflicts::run(&cx, &kernels));
                found.extend(insights::stall_reasons::run(&cx, &kernels));
                Part::Found(found)
            }
            3 => Part::Attribution(insights::attribution::attribute(&cx)),
            4 => {
                let mut found = insights::host_read::run(&cx);
                found.extend(insights::default_stream_barrier::run(&cx));
                found.extend(insights::pageable_async_copy::run(&cx));
                found.extend(insights::blocking_copy::run(&cx));
                found.extend(insights::device_wide_sync::run(&cx));
                found.extend(insights::no_copy_compute_overlap::run(&cx));
                Part::Found(found)
            }
            5 => {
                let mut found = insights::sync_attribution::run(&cx);
                found.extend(insights::torch_compile::run(&cx));
                Part::Found(found)
            }
            6 => Part::Found(insights::launch_bound::run(&cx)),
            7 => {
                let mut found = insights::throttling::run(&cx);
                found.extend(insights::memory_pressure::run(&cx));
                found.extend(insights::ecc_errors::run(&cx));
                Part::Found(found)
            }
            8 => Part::Scopes(scopes::rollup(m, &busy), scopes::range_rollup(m, &busy)),
            9 => {
                let graphs = insights::graphs::summarize(&cx);
                let found = insights::graph_replays::run(&cx, &graphs);
                Part::Graphs(graphs, found)
            }
            _ => Part::Sampling(sampling::summarize(m, &cx.stack_loc, &cx.locs)),
        }
    };
    let parts = <[Part; 11]>::try_from(work::pieces(11, threads, task));
    let Ok(
        [Part::Idle(idle_found, gpu_idle, low_util), Part::Found(in_loop), Part::Found(kernel_found), Part::Attribution(attribution), Part::Found(others), Part::Found(sync_attr), Part::Found(launch), Part::Found(tele), Part::Scopes(scopes, ranges), Part::Graphs(graphs, graph_found), Part::Sampling(sampling)],
    ) = parts
    else {
        unreachable!("one result per task, in task order")
    };
    // In the order the rules always ran (ranking keeps it among equals).
    let mut insights = sync_attr;
    insights.extend(in_loop);
    insights.extend(others);
    insights.extend(idle_found);
    insights.extend(launch);
    insights.extend(low_util);
    insights.extend(tele);
    let origin = m.time_range().0;
    let telemetry = m
        .telemetry()
        .iter()
        .map(|s| telemetry::summarize(s, origin))
        .collect();
    insights.extend(kernel_found);
    insights.extend(graph_found);
    insights::name_scopes(&cx, &mut insights);
    insights::mark_inferred(&cx, &mut insights);
    sampling::mark_basis(m, &mut insights);
    insights::rank(&mut insights);
    let has_stacks = totals.syncs_with_stack > 0 || m.stack_count() > 0;
    let mut warnings = m.warnings().to_vec();
    let unattributed = totals.syncs - totals.syncs_with_stack;
    if totals.syncs_with_stack > 0 && unattributed > 0 {
        warnings.push(format!(
            "{unattributed} of {} synchronizations have no stack (capture failed or was skipped): they are in the totals but in no insight",
            totals.syncs
        ));
    }
    Analysis {
        totals,
        insights,
        has_stacks,
        warnings,
        gpu_idle,
        telemetry,
        kernels,
        scopes,
        ranges,
        attribution,
        sampling,
        graphs,
    }
}
