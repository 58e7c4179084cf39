//! The rules, one file each, and the one table that names them ([`RULES`]): each rule's name,
//! category, exactness in always-on sessions, section in docs/insights.md, and the function that
//! runs it. The analysis runs the table (`run_all`), the sampling summary reads its exactness
//! ([`crate::sampling::rule_is_exact`]), the server its category ([`spec`]), and a test checks
//! it against docs/insights.md.
//!
//! A rule file imports the contract ([`crate::insight`]), the shared machinery
//! (`crate::shared`) and the lower modules, never another rule. A rule's own figures are its
//! `Data`, one variant of [`RuleData`]: adding a rule is its file, a row here (and a variant), and
//! its section in docs/insights.md.

pub(crate) mod bank_conflicts;
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
pub(crate) mod memory_pressure;
pub(crate) mod no_copy_compute_overlap;
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
use crate::shared::Inputs;
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

/// A rule over one session: its insights from what the rules share.
pub(crate) type SessionRule = fn(&Inputs<'_>) -> Vec<Insight>;

/// One row of the rule table.
#[derive(Clone, Copy, Debug)]
pub struct RuleSpec {
    /// The rule's name, as in [`Insight::rule`] (`"gpu-idle"`).
    pub name: &'static str,
    pub category: Category,
    /// Whether its figures come only from records kept all the time in an always-on session
    /// (exact), rather than from the GPU activity inside its windows (estimated).
    pub exact: bool,
    /// The anchor of its section in docs/insights.md (`rule-gpu-idle`).
    pub anchor: &'static str,
    /// How it runs over one session; None for a run rule, over the sessions of several ranks
    /// (run by [`crate::analyze_run`]).
    pub(crate) run: Option<SessionRule>,
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
        exact: true,
        anchor: "rule-sync-attribution",
        run: Some(|i| sync_attribution::run(i.cx)),
    },
    RuleSpec {
        name: torch_compile::RULE,
        category: IdleGpu,
        exact: false,
        anchor: "rule-torch-compile",
        run: Some(|i| torch_compile::run(i.cx)),
    },
    RuleSpec {
        name: in_loop_sync::RULE,
        category: Synchronization,
        exact: true,
        anchor: "rule-in-loop-sync",
        run: Some(|i| in_loop_sync::run(i.cx)),
    },
    RuleSpec {
        name: host_read::RULE,
        category: Synchronization,
        exact: false,
        anchor: "rule-host-read",
        run: Some(|i| host_read::run(i.cx)),
    },
    RuleSpec {
        name: default_stream_barrier::RULE,
        category: StreamsAndTransfers,
        exact: false,
        anchor: "rule-default-stream-barrier",
        run: Some(|i| default_stream_barrier::run(i.cx)),
    },
    RuleSpec {
        name: pageable_async_copy::RULE,
        category: StreamsAndTransfers,
        exact: false,
        anchor: "rule-pageable-async-copy",
        run: Some(|i| pageable_async_copy::run(i.cx)),
    },
    RuleSpec {
        name: blocking_copy::RULE,
        category: StreamsAndTransfers,
        exact: false,
        anchor: "rule-blocking-copy",
        run: Some(|i| blocking_copy::run(i.cx)),
    },
    RuleSpec {
        name: device_wide_sync::RULE,
        category: StreamsAndTransfers,
        exact: false,
        anchor: "rule-device-wide-sync",
        run: Some(|i| device_wide_sync::run(i.cx)),
    },
    RuleSpec {
        name: no_copy_compute_overlap::RULE,
        category: StreamsAndTransfers,
        exact: false,
        anchor: "rule-no-copy-compute-overlap",
        run: Some(|i| no_copy_compute_overlap::run(i.cx)),
    },
    RuleSpec {
        name: gpu_idle::RULE,
        category: IdleGpu,
        exact: false,
        anchor: "rule-gpu-idle",
        run: Some(|i| gpu_idle::run(i.cx, i.idle)),
    },
    RuleSpec {
        name: launch_bound::RULE,
        category: IdleGpu,
        exact: false,
        anchor: "rule-launch-bound",
        run: Some(|i| launch_bound::run(i.cx)),
    },
    RuleSpec {
        name: low_utilization::RULE,
        category: IdleGpu,
        exact: false,
        anchor: "rule-low-utilization",
        run: Some(|i| low_utilization::run(i.cx, &i.idle.devices)),
    },
    RuleSpec {
        name: throttling::RULE,
        category: System,
        exact: true,
        anchor: "rule-throttling",
        run: Some(|i| throttling::run(i.cx)),
    },
    RuleSpec {
        name: memory_pressure::RULE,
        category: System,
        exact: true,
        anchor: "rule-memory-pressure",
        run: Some(|i| memory_pressure::run(i.cx)),
    },
    RuleSpec {
        name: ecc_errors::RULE,
        category: System,
        exact: true,
        anchor: "rule-ecc-errors",
        run: Some(|i| ecc_errors::run(i.cx)),
    },
    RuleSpec {
        name: low_occupancy::RULE,
        category: Kernels,
        exact: false,
        anchor: "rule-low-occupancy",
        run: Some(|i| low_occupancy::run(i.cx, i.kernels)),
    },
    RuleSpec {
        name: register_spill::RULE,
        category: Kernels,
        exact: false,
        anchor: "rule-register-spill",
        run: Some(|i| register_spill::run(i.cx, i.kernels)),
    },
    RuleSpec {
        name: under_filled_grid::RULE,
        category: Kernels,
        exact: false,
        anchor: "rule-under-filled-grid",
        run: Some(|i| under_filled_grid::run(i.cx, i.kernels)),
    },
    RuleSpec {
        name: warp_divergence::RULE,
        category: Kernels,
        exact: false,
        anchor: "rule-warp-divergence",
        run: Some(|i| warp_divergence::run(i.cx, i.kernels)),
    },
    RuleSpec {
        name: uncoalesced_access::RULE,
        category: Kernels,
        exact: false,
        anchor: "rule-uncoalesced-access",
        run: Some(|i| uncoalesced_access::run(i.cx, i.kernels)),
    },
    RuleSpec {
        name: bank_conflicts::RULE,
        category: Kernels,
        exact: false,
        anchor: "rule-bank-conflicts",
        run: Some(|i| bank_conflicts::run(i.cx, i.kernels)),
    },
    RuleSpec {
        name: stall_reasons::RULE,
        category: Kernels,
        exact: false,
        anchor: "rule-stall-reasons",
        run: Some(|i| stall_reasons::run(i.cx, i.kernels)),
    },
    RuleSpec {
        name: graph_replay_gaps::RULE,
        category: Synchronization,
        exact: false,
        anchor: "rule-graph-replay-gaps",
        run: Some(|i| graph_replay_gaps::run(i.cx, i.graphs)),
    },
    RuleSpec {
        name: collective_wait::RULE,
        category: StreamsAndTransfers,
        exact: false,
        anchor: "rule-collective-wait",
        run: None,
    },
];

/// The table's row of rule `name` (None for a name no rule has).
pub fn spec(name: &str) -> Option<&'static RuleSpec> {
    RULES.iter().find(|r| r.name == name)
}

/// Run every session rule of the table on up to `threads` threads; their insights in table
/// order.
pub(crate) fn run_all(inputs: &Inputs, threads: usize) -> Vec<Insight> {
    let rules: Vec<SessionRule> = RULES.iter().filter_map(|r| r.run).collect();
    crate::work::pieces(rules.len(), threads, |i| rules[i](inputs))
        .into_iter()
        .flatten()
        .collect()
}

/// Figures specific to one rule, as plain data (each type lives in its rule's file).
#[derive(Serialize, Clone, Debug)]
#[serde(tag = "rule", rename_all = "kebab-case")]
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
}
