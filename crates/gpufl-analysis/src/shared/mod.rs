//! What the rules share, and nothing that is a rule: a rule file imports the contract
//! ([`crate::insight`]), these modules and the lower modules (model, kernel table, telemetry…),
//! never another rule.
//!
//! - [`Ctx`] (`ctx.rs`): the model, wall time, busy intervals and every stack's user location.
//! - [`advice`]: the program's kind (C/C++, PyTorch, JAX, CuPy, other Python; [`Ctx::program`])
//!   and the one function that picks a fix's text in that program's words.
//! - [`timeline`]: each device's GPU ops in start order, the API call that issued an op, busy
//!   intervals, the kernels graph launches ran, and [`timeline::Locator`], the user line of a
//!   launch or copy (its call site, the kernel's sampled call sites, or the next sync).
//! - [`copies`]: copies and memsets per API call, "copy then wait" pairs, every GPU op with its
//!   stream, and a line's severity window (the copy and stream rules).
//! - [`idle`]: each device's idle gaps, classified by what the host was doing, with the
//!   utilization series ([`idle::utilization`]); gpu-idle's insights and low-utilization read it.
//! - [`kernel_site`] and [`detail_site`]: which kernels the kernel rules look at, where a kernel
//!   is launched, how it is described.
//! - [`host`]: the join of idle gaps with the host (`hostcall` and `hsample` records): what the
//!   host was doing while a device waited, by host line and activity (gpu-idle, launch-bound and
//!   collective-wait explain their gaps with it).
//! - [`steps`]: the steps of a loop a library runs under one user call (the decode steps of
//!   `generate()`), from the synchronizations under the call; gpu-idle's roll-up reads it.
//! - [`memory`]: memory over time from `mem` records: each device's live bytes, the peak and
//!   its holders by allocating line, each line's growth and churn, the out-of-memory post-mortem
//!   (the memory rules read it).
//! - [`graphs`]: CUDA graphs as units (the `graphs` of the analysis; graph-replay-gaps reads it).
//! - [`attribution`]: where the session's sync and GPU time is attributed (an analysis output).
//! - [`finish`]: what is done to the insights once every rule has run (scopes, cross-thread
//!   locations, ranking).
//!
//! [`Inputs`] is what a rule of the table ([`crate::rules::RULES`]) is given: the context, the
//! kernel table, and the products computed once on first need (every device's idle gaps, the CUDA
//! graph summary).

pub(crate) mod advice;
pub mod attribution;
pub(crate) mod copies;
mod ctx;
pub(crate) mod detail_site;
pub(crate) mod finish;
pub mod graphs;
pub mod host;
pub(crate) mod idle;
pub(crate) mod kernel_site;
pub mod memory;
pub(crate) mod steps;
pub(crate) mod timeline;

pub(crate) use ctx::Ctx;

use crate::kernels::KernelTable;
use graphs::GraphSummary;
use idle::IdleScan;
use std::sync::OnceLock;

/// What the rules of one session read: the context, the kernel table, and the products computed
/// once, on first need, whichever thread needs them first (every device's idle gaps, the CUDA
/// graph summary): a rule that asks for one while another thread computes it waits for it, the
/// rules that read neither run meanwhile.
pub(crate) struct Inputs<'a> {
    pub cx: &'a Ctx<'a>,
    pub kernels: &'a KernelTable,
    idle: OnceLock<IdleScan>,
    graphs: OnceLock<Vec<GraphSummary>>,
}

impl<'a> Inputs<'a> {
    pub fn new(cx: &'a Ctx<'a>, kernels: &'a KernelTable) -> Inputs<'a> {
        Inputs {
            cx,
            kernels,
            idle: OnceLock::new(),
            graphs: OnceLock::new(),
        }
    }

    /// Every device's idle gaps ([`idle::scan`]).
    pub fn idle(&self) -> &IdleScan {
        self.idle.get_or_init(|| idle::scan(self.cx))
    }

    /// The CUDA graph summary ([`graphs::summarize`]).
    pub fn graphs(&self) -> &[GraphSummary] {
        self.graphs.get_or_init(|| graphs::summarize(self.cx))
    }

    /// The idle gaps and the graph summary, for the analysis's output.
    pub fn into_products(self) -> (IdleScan, Vec<GraphSummary>) {
        let cx = self.cx;
        (
            self.idle.into_inner().unwrap_or_else(|| idle::scan(cx)),
            self.graphs
                .into_inner()
                .unwrap_or_else(|| graphs::summarize(cx)),
        )
    }
}
