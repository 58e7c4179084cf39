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
//! Where things are:
//!
//! - [`insight`]: the contract between the rules and their readers: [`Insight`] (built with a
//!   constructor and setters), [`Severity`], and the prose helpers (`fmt_duration`,
//!   `short_function`, `share`, which live in the lower module `text` so that [`model`],
//!   [`kernels`] and [`telemetry`] use them without depending on the rules).
//! - `shared`: what the rules share and nothing that is a rule: the context (`Ctx`: every stack's
//!   user location), the device timelines and call-site location (`timeline`), copies and
//!   streams (`copies`), every device's idle gaps and utilization (`idle`: the [`DeviceIdle`] of
//!   `gpu_idle` in the analysis), what the host was doing during idle gaps (`host`: the join of
//!   the gaps with `hostcall` and `hsample` records, a [`HostActivity`]), the kernel rules' sites (`kernel_site`, `detail_site`), the CUDA
//!   graph summary (`graphs`), the [`Analysis::attribution`], and what is done to the insights
//!   after the rules (`finish`: scopes, cross-thread locations, severity, ranking, one finding per
//!   line and cause).
//! - [`rules`]: one file per rule, each importing only the contract, `shared` and the lower
//!   modules, and the one rule table, [`rules::RULES`] (name, category, exactness in always-on
//!   sessions, doc anchor, the function that runs it; [`rules::spec`] finds a row), which
//!   [`analyze_on`] runs, [`sampling::rule_is_exact`] reads, and a test checks against
//!   `docs/insights.md`. Each rule's own figures are a variant of [`RuleData`].
//! - [`insights`]: the earlier paths (`insights::collective_wait`, `insights::attribution`, …),
//!   re-exported.
//!
//! Rules (documented in their files and in `docs/insights.md`): `sync-attribution`,
//! `in-loop-sync`, and the streams seed's `pageable-async-copy`, `blocking-copy`,
//! `default-stream-barrier`, `device-wide-sync`, `no-copy-compute-overlap`, `host-read`;
//! `gpu-idle` (over every device's idle gaps), `launch-bound` and `low-utilization` (the idle
//! gaps' low chunks and what the host did then, with NVML's utilization as a second opinion when
//! recorded), `torch-compile`; from GPU telemetry, `throttling`, `memory-pressure` and
//! `ecc-errors` (with a per-device telemetry summary); and the kernel rules `low-occupancy`,
//! `register-spill` and `under-filled-grid`, over the kernel table ([`kernels`], with theoretical
//! occupancy from [`occupancy`]; communication kernels, [`comm`], left out); over the counters
//! and PC samples from inside kernels ([`kdetail`]), `warp-divergence`, `uncoalesced-access`,
//! `bank-conflicts` and `stall-reasons`; over the CUDA graph summary, `graph-replay-gaps`. Over
//! the sessions of a run (one per rank), [`analyze_run`] summarizes the ranks side by side and
//! runs the cross-rank rule `collective-wait`.
//!
//! The model's records name each other with typed handles ([`ids`]): a correlation id
//! ([`CorrId`]), the model's stack ([`StackIx`], not a trace file's `StackId`) and, in the rules,
//! a user location of the context ([`LocIx`]); "none" is an `Option` of one (4 bytes, as the
//! handle), never a sentinel value.
//!
//! [`frames`] says which leading frames of a stack are shown ([`frames::first_shown_frame`]: not
//! the recorder's, CUPTI's, the driver's nor the CUDA runtime's internals), for every view of a stack.
//! [`headline`]: the session's headline figures, computed once for every view ([`Headline`], in
//! the analysis; [`headline_on`] without the rules).
//!
//! [`diff`] compares two analysed sessions (`gpufl diff`): a [`diff::Profile`] of each, then a
//! typed [`diff::Diff`] of totals, kernels, sync and copy time per line, and insights.

mod access;
pub mod comm;
mod corrs;
pub mod diff;
pub mod error;
mod fold;
pub mod frames;
pub mod headline;
pub mod hostlines;
pub mod ids;
pub mod insight;
pub mod insights;
pub mod intervals;
pub mod kdetail;
pub mod kernels;
pub mod lines;
pub mod memview;
pub mod model;
pub mod occupancy;
pub mod pipeline;
pub mod rules;
pub mod run;
pub mod sampling;
pub mod scopes;
mod shared;
mod store;
pub mod telemetry;
mod text;
pub mod totals;
pub mod userframe;
pub mod views;
mod work;

pub use error::AnalysisError;
pub use headline::{headline_on, DeviceHeadline, Headline};
pub use ids::{CorrId, LocIx, StackIx};
pub use insight::{fmt_bytes, fmt_duration, Insight, Severity};
pub use intervals::{union_ns, DeviceBusy};
pub use kernels::{KernelRow, KernelSource, KernelTable};
pub use model::{MemRow, Model, Window, WindowReason};
pub use occupancy::{Limiter, Occupancy, SmLimits};
pub use rules::in_loop_sync::{MIN_MEDIAN_KERNELS, MIN_SYNCS};
pub use rules::RuleData;
pub use run::{analyze_run, RunAnalysis, RunMember};
pub use sampling::{Basis, BasisKind, CallsPerLine, Sampling};
pub use scopes::{rollup_path, RangeRollup, RangeSpan, ScopeRollup, ScopeSpan, MAX_SCOPE_DEPTH};
pub use shared::graphs::{GraphOp, GraphSummary};
pub use shared::host::calls::CallKind;
pub use shared::host::{Compiler, Doing, DoingTime, HostActivity, HostLine, Overhead};
pub use shared::idle::utilization::{ChunkIdle, ChunkLine};
pub use shared::idle::{ClassTotal, DeviceIdle, Gap, IdleByClass, IdleClass, UtilChunk};
pub use telemetry::{DeviceTelemetry, EccCounts, Stat, ThrottleTime};
pub use totals::{totals, Totals};
pub use userframe::{
    user_frame, FrameFilter, FrameOrigin, SourceLoc, BUILTIN_EXCLUDES, DRIVER_INTERNAL,
};
pub use views::{
    ApiRec, CopyOp, CopyRec, FrameView, HostcallRec, HsampleRec, KernelRec, LaunchConfig, SyncRec,
};

use serde::Serialize;

/// Analysis settings.
#[derive(Clone, Debug, Default)]
pub struct Config {
    /// Which frames are the user's code.
    pub filter: FrameFilter,
}

/// What one task of [`analyze_on`] returns.
enum Done {
    /// A product the rules share, kept in [`shared::Inputs`].
    Shared,
    Attribution(shared::attribution::Attribution),
    Scopes(Vec<scopes::ScopeRollup>, Vec<scopes::RangeRollup>),
    Sampling(Option<sampling::Sampling>),
    /// The insights of the rule at this index of the session rules.
    Found(usize, Vec<Insight>),
}

/// Tasks of [`analyze_on`] before the rules'.
const PRODUCTS: usize = 5;

/// Result of [`analyze`].
#[derive(Serialize, Clone, Debug)]
pub struct Analysis {
    /// The figures every view shows first ([`headline`]: wall, GPU busy, kernels, syncs, host
    /// blocked in syncs and blocking copies, GPU idle, low-utilization chunks).
    pub headline: Headline,
    pub totals: Totals,
    /// Sync and GPU time by what their locations name (a user line, inferred, a library line,
    /// `<driver-internal>`).
    pub attribution: shared::attribution::Attribution,
    /// Ranked by `impact_ns`, highest first; ties by rule, then location, then title. Severity
    /// follows from `impact_ns` by one formula ([`Severity::of_impact`]), so it never rises down
    /// the list.
    pub insights: Vec<Insight>,
    /// Whether CPU stacks were captured (some sync carries one, or the trace has stack records):
    /// without them there are no source lines and no insights.
    pub has_stacks: bool,
    /// The model's warnings (loading and the reader's), then the analysis's own.
    pub warnings: Vec<String>,
    /// Per device with GPU work: idle gaps by class, the longest gaps, utilization over time
    /// (rule `gpu-idle`, docs/insights.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpu_idle: Vec<DeviceIdle>,
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

impl Analysis {
    /// Every rule's finding: each insight, then the findings merged into it as its facets (same
    /// line, same cause), in rank order within it.
    pub fn findings(&self) -> impl Iterator<Item = &Insight> {
        self.insights
            .iter()
            .flat_map(|i| std::iter::once(i).chain(i.facets.iter()))
    }
}

/// Run every rule over a model, on this thread.
pub fn analyze(m: &Model, cfg: &Config) -> Analysis {
    analyze_on(m, cfg, 1)
}

/// Run every rule over a model, on up to `threads` threads; the same analysis as [`analyze`].
/// The device busy intervals, then the kernel table, are computed piece by piece on every
/// thread; then, as tasks on the threads, what the rules share (every device's idle gaps, the
/// CUDA graph summary) and the analysis's own summaries (attribution, scopes, sampling), then
/// the rules of the table ([`rules::RULES`]), those that read the idle gaps last: the others run
/// while the idle scan (the longest task, first) does; a rule that reads a product still being
/// computed waits for it (`shared::Inputs`). The rules' insights are concatenated in the table's
/// order, the order the rules always ran in (ranking keeps it among equals).
pub fn analyze_on(m: &Model, cfg: &Config, threads: usize) -> Analysis {
    let threads = threads.max(1);
    let busy = DeviceBusy::new_on(m, threads);
    let totals = totals::totals_with(m, &busy);
    let kernels = kernels::table_on(m, &busy, threads);
    let cx = shared::Ctx::new(m, cfg, &busy, totals.wall_ns);
    let inputs = shared::Inputs::new(&cx, &kernels);
    let rules = rules::session_rules();
    // The rules in the order they are started: those that read the idle scan last.
    let mut order: Vec<usize> = (0..rules.len()).collect();
    order.sort_by_key(|&r| rules[r].reads_idle());
    let task = |i: usize| -> Done {
        match i {
            0 => {
                inputs.idle();
                Done::Shared
            }
            1 => Done::Attribution(shared::attribution::attribute(&cx)),
            2 => Done::Scopes(scopes::rollup(m, &busy), scopes::range_rollup(m, &busy)),
            3 => {
                inputs.graphs();
                Done::Shared
            }
            4 => Done::Sampling(sampling::summarize(m, cx.stack_locs(), &cx.locs)),
            i => {
                let r = order[i - PRODUCTS];
                Done::Found(r, rules[r].call(&inputs))
            }
        }
    };
    let (mut attribution, mut scopes, mut ranges, mut sampling) = Default::default();
    let mut found: Vec<Vec<Insight>> = vec![Vec::new(); rules.len()];
    for done in work::pieces(PRODUCTS + rules.len(), threads, task) {
        match done {
            Done::Shared => {}
            Done::Attribution(a) => attribution = a,
            Done::Scopes(s, r) => (scopes, ranges) = (s, r),
            Done::Sampling(s) => sampling = s,
            Done::Found(r, f) => found[r] = f,
        }
    }
    // In table order.
    let mut insights: Vec<Insight> = found.into_iter().flatten().collect();
    let (idle, graphs) = inputs.into_products();
    let headline = Headline::of(
        &totals,
        m.is_always_on(),
        &idle.devices,
        shared::copies::blocking_calls(&cx),
    );
    let origin = m.time_range().0;
    let telemetry = m
        .telemetry()
        .iter()
        .map(|s| telemetry::summarize(s, origin))
        .collect();
    shared::finish::name_scopes(&cx, &mut insights);
    shared::finish::mark_inferred(&cx, &mut insights);
    sampling::mark_basis(m, &mut insights);
    shared::finish::rate(&mut insights, shared::finish::session_ns(m, totals.wall_ns));
    shared::finish::rank(&mut insights);
    let insights = shared::finish::merge(insights);
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
        headline,
        totals,
        insights,
        has_stacks,
        warnings,
        gpu_idle: idle.devices,
        telemetry,
        kernels,
        scopes,
        ranges,
        attribution,
        sampling,
        graphs,
    }
}
