//! The rules, one file each, and the one table that names them ([`RULES`]): each rule's name,
//! category, cause ([`Cause`]: findings of one line with the same cause merge), exactness in always-on sessions, section in docs/insights.md, and the function that
//! runs it. The analysis runs the table ([`crate::analyze_on`], through `session_rules`), the
//! sampling summary reads its exactness ([`crate::sampling::rule_is_exact`]), the server its
//! category ([`spec`]), and a test checks it against docs/insights.md.
//!
//! A rule file imports the contract ([`crate::insight`]), the shared machinery
//! (`crate::shared`) and the lower modules, never another rule. A rule's own figures are its
//! `Data`, one variant of [`RuleData`]: adding a rule is its file, a row here (and a variant), and
//! its section in docs/insights.md.

pub(crate) mod bank_conflicts;
pub mod blocking_call;
pub(crate) mod blocking_copy;
pub mod collective_wait;
pub(crate) mod default_stream_barrier;
pub(crate) mod device_wide_sync;
pub(crate) mod ecc_errors;
pub(crate) mod gpu_idle;
pub(crate) mod graph_replay_gaps;
pub(crate) mod host_read;
pub(crate) mod in_loop_sync;
pub(crate) mod launch_bound;
pub(crate) mod low_occupancy;
pub(crate) mod low_utilization;
pub mod memory_leak;
pub mod memory_peak;
pub(crate) mod memory_pressure;
#[cfg(test)]
mod memory_tests;
pub(crate) mod no_copy_compute_overlap;
pub mod out_of_memory;
pub(crate) mod pageable_async_copy;
pub(crate) mod register_spill;
pub(crate) mod stall_reasons;
pub(crate) mod sync_attribution;
pub(crate) mod throttling;
pub mod torch_compile;
pub(crate) mod uncoalesced_access;
pub(crate) mod under_filled_grid;
pub(crate) mod warp_divergence;

use crate::insight::Insight;
use crate::kernels::KernelTable;
use crate::shared::graphs::GraphSummary;
use crate::shared::idle::IdleScan;
use crate::shared::{Ctx, Inputs};
use serde::Serialize;

/// Where a rule's insights are listed (the server's dashboard groups them so).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Category {
    Synchronization,
    StreamsAndTransfers,
    IdleGpu,
    Kernels,
    System,
}

impl Category {
    /// `SYNCHRONIZATION`, `STREAMS & TRANSFERS`, `IDLE GPU`, `KERNELS`, `SYSTEM`.
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Synchronization => "SYNCHRONIZATION",
            Category::StreamsAndTransfers => "STREAMS & TRANSFERS",
            Category::IdleGpu => "IDLE GPU",
            Category::Kernels => "KERNELS",
            Category::System => "SYSTEM",
        }
    }
}

/// What a finding is about, beyond its rule: findings at the same line with the same cause are
/// one finding (`shared::finish::merge`), the highest impact's rule its headline and the others
/// its facets (docs/insights.md, "One finding per cause"). Several rules share a cause where they
/// look at the same thing from different sides: the host waiting for the GPU at a line
/// (sync-attribution, in-loop-sync, host-read, blocking-copy, device-wide-sync), the GPU waiting
/// for the host (gpu-idle, low-utilization).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Cause {
    /// The host waits for the GPU at the line: a synchronization, a blocking copy, a read of a value.
    HostWaits,
    /// A call that blocks the host (cudaFree, cudaMalloc, empty_cache) and starves the GPU.
    BlockingCall,
    /// The legacy default stream serializes the other streams.
    DefaultStream,
    /// Asynchronous copies from pageable memory run synchronously.
    PageableMemory,
    /// Copies and kernels that could overlap run one after the other.
    SerialCopies,
    /// The GPU waits for the host to issue work.
    GpuStarved,
    /// Kernels shorter than their launch.
    LaunchOverhead,
    /// torch.compile compiling.
    Compilation,
    /// Gaps between CUDA graph replays.
    GraphGaps,
    /// Clocks held down.
    Clocks,
    /// Device memory nearly full.
    DeviceMemory,
    /// ECC errors.
    Ecc,
    /// Few warps per SM.
    Occupancy,
    /// Local memory: spills or local arrays.
    Spills,
    /// Grids that leave SMs idle.
    GridSize,
    /// Divergent warps.
    Divergence,
    /// Uncoalesced global memory access.
    MemoryAccess,
    /// Shared memory bank conflicts.
    BankConflicts,
    /// Where the warps stall.
    Stalls,
    /// A rank the others wait for in collectives.
    LateRank,
}

/// How a rule over one session runs: its function, by what it reads beside the context (the
/// analysis schedules the rules that read the idle scan, the longest shared product, after the
/// others, so that those run while it is computed).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Run {
    /// The context only.
    Ctx(fn(&Ctx) -> Vec<Insight>),
    /// The kernel table.
    Kernels(fn(&Ctx, &KernelTable) -> Vec<Insight>),
    /// Every device's idle gaps.
    Idle(fn(&Ctx, &IdleScan) -> Vec<Insight>),
    /// The CUDA graph summary.
    Graphs(fn(&Ctx, &[GraphSummary]) -> Vec<Insight>),
}

impl Run {
    /// Whether the rule reads every device's idle gaps.
    pub(crate) fn reads_idle(self) -> bool {
        matches!(self, Run::Idle(_))
    }

    /// The rule's insights (a product it reads is computed on first need, or waited for).
    pub(crate) fn call(self, i: &Inputs) -> Vec<Insight> {
        match self {
            Run::Ctx(f) => f(i.cx),
            Run::Kernels(f) => f(i.cx, i.kernels),
            Run::Idle(f) => f(i.cx, i.idle()),
            Run::Graphs(f) => f(i.cx, i.graphs()),
        }
    }
}

/// One row of the rule table.
#[derive(Clone, Copy, Debug)]
pub struct RuleSpec {
    /// The rule's name, as in [`Insight::rule`] (`"gpu-idle"`).
    pub name: &'static str,
    pub category: Category,
    /// What its findings are about: findings of one line with the same cause merge.
    pub cause: Cause,
    /// Whether its figures come only from records kept all the time in an always-on session
    /// (exact), rather than from the GPU activity inside its windows (estimated).
    pub exact: bool,
    /// The anchor of its section in docs/insights.md (`rule-gpu-idle`).
    pub anchor: &'static str,
    /// How it runs over one session; None for a run rule, over the sessions of several ranks
    /// (run by [`crate::analyze_run`]).
    pub(crate) run: Option<Run>,
}

impl RuleSpec {
    /// A run rule: it reads the sessions of several ranks, not one.
    pub fn is_cross_rank(&self) -> bool {
        self.run.is_none()
    }
}

use Category::*;

/// Every rule. The session rules run in this order (their insights concatenated so before
/// ranking, which keeps it among equals: the order they have always run in).
pub static RULES: &[RuleSpec] = &[
    RuleSpec {
        name: sync_attribution::RULE,
        category: Synchronization,
        cause: Cause::HostWaits,
        exact: true,
        anchor: "rule-sync-attribution",
        run: Some(Run::Ctx(sync_attribution::run)),
    },
    RuleSpec {
        name: torch_compile::RULE,
        category: IdleGpu,
        cause: Cause::Compilation,
        exact: false,
        anchor: "rule-torch-compile",
        run: Some(Run::Ctx(torch_compile::run)),
    },
    RuleSpec {
        name: in_loop_sync::RULE,
        category: Synchronization,
        cause: Cause::HostWaits,
        exact: true,
        anchor: "rule-in-loop-sync",
        run: Some(Run::Ctx(in_loop_sync::run)),
    },
    RuleSpec {
        name: host_read::RULE,
        category: Synchronization,
        cause: Cause::HostWaits,
        exact: false,
        anchor: "rule-host-read",
        run: Some(Run::Ctx(host_read::run)),
    },
    RuleSpec {
        name: blocking_call::RULE,
        category: Synchronization,
        cause: Cause::BlockingCall,
        exact: false,
        anchor: "rule-blocking-call",
        run: Some(Run::Ctx(blocking_call::run)),
    },
    RuleSpec {
        name: default_stream_barrier::RULE,
        category: StreamsAndTransfers,
        cause: Cause::DefaultStream,
        exact: false,
        anchor: "rule-default-stream-barrier",
        run: Some(Run::Ctx(default_stream_barrier::run)),
    },
    RuleSpec {
        name: pageable_async_copy::RULE,
        category: StreamsAndTransfers,
        cause: Cause::PageableMemory,
        exact: false,
        anchor: "rule-pageable-async-copy",
        run: Some(Run::Ctx(pageable_async_copy::run)),
    },
    RuleSpec {
        name: blocking_copy::RULE,
        category: StreamsAndTransfers,
        cause: Cause::HostWaits,
        exact: false,
        anchor: "rule-blocking-copy",
        run: Some(Run::Ctx(blocking_copy::run)),
    },
    RuleSpec {
        name: device_wide_sync::RULE,
        category: StreamsAndTransfers,
        cause: Cause::HostWaits,
        exact: false,
        anchor: "rule-device-wide-sync",
        run: Some(Run::Ctx(device_wide_sync::run)),
    },
    RuleSpec {
        name: no_copy_compute_overlap::RULE,
        category: StreamsAndTransfers,
        cause: Cause::SerialCopies,
        exact: false,
        anchor: "rule-no-copy-compute-overlap",
        run: Some(Run::Ctx(no_copy_compute_overlap::run)),
    },
    RuleSpec {
        name: gpu_idle::RULE,
        category: IdleGpu,
        cause: Cause::GpuStarved,
        exact: false,
        anchor: "rule-gpu-idle",
        run: Some(Run::Idle(gpu_idle::run)),
    },
    RuleSpec {
        name: launch_bound::RULE,
        category: IdleGpu,
        cause: Cause::LaunchOverhead,
        exact: false,
        anchor: "rule-launch-bound",
        run: Some(Run::Ctx(launch_bound::run)),
    },
    RuleSpec {
        name: low_utilization::RULE,
        category: IdleGpu,
        cause: Cause::GpuStarved,
        exact: false,
        anchor: "rule-low-utilization",
        run: Some(Run::Idle(|cx, idle| {
            low_utilization::run(cx, &idle.devices)
        })),
    },
    RuleSpec {
        name: throttling::RULE,
        category: System,
        cause: Cause::Clocks,
        exact: true,
        anchor: "rule-throttling",
        run: Some(Run::Ctx(throttling::run)),
    },
    RuleSpec {
        name: memory_pressure::RULE,
        category: System,
        cause: Cause::DeviceMemory,
        exact: true,
        anchor: "rule-memory-pressure",
        run: Some(Run::Ctx(memory_pressure::run)),
    },
    RuleSpec {
        name: out_of_memory::RULE,
        category: System,
        cause: Cause::DeviceMemory,
        exact: true,
        anchor: "rule-out-of-memory",
        run: Some(Run::Ctx(out_of_memory::run)),
    },
    RuleSpec {
        name: memory_leak::RULE,
        category: System,
        cause: Cause::DeviceMemory,
        exact: true,
        anchor: "rule-memory-leak",
        run: Some(Run::Ctx(memory_leak::run)),
    },
    RuleSpec {
        name: memory_peak::RULE,
        category: System,
        cause: Cause::DeviceMemory,
        exact: true,
        anchor: "rule-memory-peak",
        run: Some(Run::Ctx(memory_peak::run)),
    },
    RuleSpec {
        name: ecc_errors::RULE,
        category: System,
        cause: Cause::Ecc,
        exact: true,
        anchor: "rule-ecc-errors",
        run: Some(Run::Ctx(ecc_errors::run)),
    },
    RuleSpec {
        name: low_occupancy::RULE,
        category: Kernels,
        cause: Cause::Occupancy,
        exact: false,
        anchor: "rule-low-occupancy",
        run: Some(Run::Kernels(low_occupancy::run)),
    },
    RuleSpec {
        name: register_spill::RULE,
        category: Kernels,
        cause: Cause::Spills,
        exact: false,
        anchor: "rule-register-spill",
        run: Some(Run::Kernels(register_spill::run)),
    },
    RuleSpec {
        name: under_filled_grid::RULE,
        category: Kernels,
        cause: Cause::GridSize,
        exact: false,
        anchor: "rule-under-filled-grid",
        run: Some(Run::Kernels(under_filled_grid::run)),
    },
    RuleSpec {
        name: warp_divergence::RULE,
        category: Kernels,
        cause: Cause::Divergence,
        exact: false,
        anchor: "rule-warp-divergence",
        run: Some(Run::Kernels(warp_divergence::run)),
    },
    RuleSpec {
        name: uncoalesced_access::RULE,
        category: Kernels,
        cause: Cause::MemoryAccess,
        exact: false,
        anchor: "rule-uncoalesced-access",
        run: Some(Run::Kernels(uncoalesced_access::run)),
    },
    RuleSpec {
        name: bank_conflicts::RULE,
        category: Kernels,
        cause: Cause::BankConflicts,
        exact: false,
        anchor: "rule-bank-conflicts",
        run: Some(Run::Kernels(bank_conflicts::run)),
    },
    RuleSpec {
        name: stall_reasons::RULE,
        category: Kernels,
        cause: Cause::Stalls,
        exact: false,
        anchor: "rule-stall-reasons",
        run: Some(Run::Kernels(stall_reasons::run)),
    },
    RuleSpec {
        name: graph_replay_gaps::RULE,
        category: Synchronization,
        cause: Cause::GraphGaps,
        exact: false,
        anchor: "rule-graph-replay-gaps",
        run: Some(Run::Graphs(graph_replay_gaps::run)),
    },
    RuleSpec {
        name: collective_wait::RULE,
        category: StreamsAndTransfers,
        cause: Cause::LateRank,
        exact: false,
        anchor: "rule-collective-wait",
        run: None,
    },
];

/// The table's row of rule `name` (None for a name no rule has).
pub fn spec(name: &str) -> Option<&'static RuleSpec> {
    RULES.iter().find(|r| r.name == name)
}

/// The session rules of the table, in table order ([`crate::analyze_on`] runs them).
pub(crate) fn session_rules() -> Vec<Run> {
    RULES.iter().filter_map(|r| r.run).collect()
}

/// Figures specific to one rule, as plain data (each type lives in its rule's file).
#[derive(Serialize, Clone, Debug)]
#[serde(tag = "rule", rename_all = "kebab-case")]
// A session has a few dozen insights at most: the size of the largest figures (the host join's)
// costs nothing, and boxing them would change the type every reader matches on.
#[allow(clippy::large_enum_variant)]
pub enum RuleData {
    DefaultStreamBarrier(default_stream_barrier::Data),
    PageableAsyncCopy(pageable_async_copy::Data),
    BlockingCopy(blocking_copy::Data),
    DeviceWideSync(device_wide_sync::Data),
    NoCopyComputeOverlap(no_copy_compute_overlap::Data),
    GpuIdle(gpu_idle::Data),
    LaunchBound(launch_bound::Data),
    LowUtilization(low_utilization::Data),
    Throttling(throttling::Data),
    MemoryPressure(memory_pressure::Data),
    EccErrors(ecc_errors::Data),
    LowOccupancy(low_occupancy::Data),
    RegisterSpill(register_spill::Data),
    UnderFilledGrid(under_filled_grid::Data),
    HostRead(host_read::Data),
    CollectiveWait(collective_wait::Data),
    GraphReplayGaps(graph_replay_gaps::Data),
    TorchCompile(torch_compile::Data),
    WarpDivergence(warp_divergence::Data),
    UncoalescedAccess(uncoalesced_access::Data),
    BankConflicts(bank_conflicts::Data),
    StallReasons(stall_reasons::Data),
    BlockingCall(blocking_call::Data),
    OutOfMemory(out_of_memory::Data),
    MemoryLeak(memory_leak::Data),
    MemoryPeak(memory_peak::Data),
}

/// `impl From<rule::Data> for RuleData`, so that a rule hands its figures to
/// [`Insight::data`] without naming this enum.
macro_rules! rule_data_from {
    ($($variant:ident($rule:ident)),* $(,)?) => {
        $(impl From<$rule::Data> for RuleData {
            fn from(d: $rule::Data) -> RuleData {
                RuleData::$variant(d)
            }
        })*
    };
}

rule_data_from! {
    DefaultStreamBarrier(default_stream_barrier),
    PageableAsyncCopy(pageable_async_copy),
    BlockingCopy(blocking_copy),
    DeviceWideSync(device_wide_sync),
    NoCopyComputeOverlap(no_copy_compute_overlap),
    GpuIdle(gpu_idle),
    LaunchBound(launch_bound),
    LowUtilization(low_utilization),
    Throttling(throttling),
    MemoryPressure(memory_pressure),
    EccErrors(ecc_errors),
    LowOccupancy(low_occupancy),
    RegisterSpill(register_spill),
    UnderFilledGrid(under_filled_grid),
    HostRead(host_read),
    CollectiveWait(collective_wait),
    GraphReplayGaps(graph_replay_gaps),
    TorchCompile(torch_compile),
    WarpDivergence(warp_divergence),
    UncoalescedAccess(uncoalesced_access),
    BankConflicts(bank_conflicts),
    StallReasons(stall_reasons),
    BlockingCall(blocking_call),
    OutOfMemory(out_of_memory),
    MemoryLeak(memory_leak),
    MemoryPeak(memory_peak),
}
