//! Rule `stall-reasons`: where a kernel's warps wait, and on what, from PC sampling.
//!
//! - **From** the kernel's `kstall` samples (crate::kdetail): per line inside the kernel, the
//!   samples and their stall reasons (CUPTI's names: `long_scoreboard`, `barrier`, …).
//! - **Fires** for each kernel that matters ([`MIN_BUSY_PCT`](crate::shared::kernel_site::MIN_BUSY_PCT) %
//!   of its device's busy time, not a vendor library's) with at least [`MIN_SAMPLES`] samples:
//!   one insight at the line with the most samples, naming its dominant stall reasons in plain
//!   words with a fix, and the next lines in the detail.
//! - **Severity:** from the impact's share of the session's time, as every rule's
//!   (docs/insights.md, "Ranking and severity").

use crate::insight::Insight;
use crate::kdetail::{KernelStalls, StallLine};
use crate::kernels::{KernelRow, KernelTable};
use crate::shared::detail_site::{self, describe, launched, short, Site};
use crate::shared::kernel_site::matters;
use crate::shared::timeline::Locator;
use crate::shared::Ctx;
use serde::Serialize;

pub(crate) const RULE: &str = "stall-reasons";
/// Samples a kernel needs for an insight.
pub const MIN_SAMPLES: u64 = 50;
/// A kernel is heavy from this share of its device's busy time, percent.
pub const HEAVY_BUSY_PCT: u64 = 20;
/// The memory-dependency stall.
pub const MEMORY_STALL: &str = "long_scoreboard";
/// Lines listed in the detail and the data.
const LINES: usize = 3;
/// Reasons named per line.
const REASONS: usize = 3;

/// One line's samples and its leading reasons.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct LineStalls {
    pub file: String,
    pub line: u32,
    pub samples: u64,
    /// Share of the kernel's samples.
    pub share: f64,
    /// Its reasons with most samples (at most 3): (reason, samples).
    pub reasons: Vec<(String, u64)>,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    #[serde(flatten)]
    pub site: Site,
    pub samples: u64,
    pub unmapped_samples: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub period_log2: Option<u32>,
    /// The located line's dominant stall (reasons that are not stalls — `selected`,
    /// `not_selected` — left out) and its samples there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dominant: Option<String>,
    pub dominant_samples: u64,
    /// The lines with most samples (at most 3).
    pub lines: Vec<LineStalls>,
    /// Whether the MEDIUM condition holds (see the module's doc).
    pub memory_bound_line: bool,
    pub recoverable_ns: u64,
}

/// A stall reason in plain words, and what to do about it.
pub fn explain(reason: &str) -> (&'static str, &'static str) {
    match reason {
        "long_scoreboard" => (
            "waiting on memory: a global, local or texture load's result (memory dependency)",
            "touch fewer sectors (coalesce the accesses), load earlier or several values per thread before using them (unroll), keep reused data in shared memory or registers; more resident warps hide the latency too",
        ),
        "short_scoreboard" => (
            "waiting on a shared-memory or special-function (sin, exp, reciprocal) result",
            "fewer shared-memory round trips (bank conflicts lengthen them), values kept in registers, cheaper math where precision allows",
        ),
        "wait" => (
            "waiting a fixed latency for an arithmetic result the next instruction needs (execution dependency)",
            "more independent instructions between a result and its use (unroll, interleave independent work), or more resident warps",
        ),
        "barrier" => (
            "waiting at __syncthreads() for the block's other warps",
            "balance the work of a block's warps, fewer barriers, or smaller blocks; warp-level primitives (__shfl_sync) where a warp alone must agree",
        ),
        "mio_throttle" => (
            "the memory input/output queue (shared memory, special math, dynamic branches) is full",
            "fewer shared-memory instructions (wider accesses: float4), fewer bank conflicts, fewer special-function calls",
        ),
        "lg_throttle" => (
            "the local/global memory queue is full: too many memory instructions",
            "fewer, wider memory instructions (vector loads such as float4) and fewer local-memory accesses (register spills)",
        ),
        "math_pipe_throttle" => (
            "the arithmetic pipe it needs is busy (compute-bound there)",
            "fewer or cheaper operations (lower precision, tensor cores for matrix work): the pipe is used fully",
        ),
        "branch_resolving" => (
            "waiting for a branch's target to resolve (divergent branches)",
            "fewer divergent branches (see warp-divergence), branch-free code (a select) for short ones",
        ),
        "tex_throttle" => (
            "the texture/L1 queue is full",
            "fewer texture or L1 requests: coalesce, wider accesses",
        ),
        "membar" => (
            "waiting at a memory fence (__threadfence)",
            "fewer fences, or a narrower scope (the block's rather than the device's)",
        ),
        "drain" => (
            "waiting for its stores to drain before the warp exits",
            "fewer, coalesced stores at the end of the kernel",
        ),
        "no_instructions" => (
            "no instruction fetched (an instruction cache miss, or just after a branch)",
            "less code in hot loops (less unrolling, fewer inlined paths)",
        ),
        "imc_miss" => (
            "waiting for a constant-cache miss",
            "constants read by all lanes at the same address, fewer distinct constant addresses",
        ),
        "sleeping" => (
            "sleeping (__nanosleep) or yielding",
            "shorter sleeps, or work instead of polling",
        ),
        "dispatch_stall" => (
            "the dispatcher could not issue (a pipeline conflict)",
            "nothing in the source usually; look at the instruction mix",
        ),
        "selected" => (
            "issuing an instruction (not a stall)",
            "nothing: the warp is working",
        ),
        "not_selected" => (
            "ready, but another warp issued (not a stall: warps to spare)",
            "nothing: the scheduler has enough ready warps",
        ),
        _ => (
            "a stall reason gpufl does not describe",
            "see CUPTI's documentation of the PC sampling stall reasons",
        ),
    }
}

/// Whether a reason is a stall (not an issuing or ready warp).
fn is_stall(reason: &str) -> bool {
    !matches!(reason, "selected" | "not_selected")
}

/// A line's reason with most samples among stalls.
fn dominant(l: &StallLine) -> Option<&(String, u64)> {
    l.stalls.iter().find(|(r, n)| is_stall(r) && *n > 0)
}

/// Whether the kernel's counters show the line's global accesses coalesced: requests, an ideal
/// from the recorder, and fewer than 2 × its sectors, for loads and stores alike.
fn coalesced_at(cx: &Ctx, row: &KernelRow, l: &StallLine) -> bool {
    let Some(d) = cx.m.kernel_detail(&row.name, row.device) else {
        return false;
    };
    let Some(dl) = d
        .lines
        .iter()
        .find(|x| x.file == l.file && x.line == l.line)
    else {
        return false;
    };
    let ld = dl.counts.global(false);
    let st = dl.counts.global(true);
    let ok = |a: &crate::kdetail::Access| {
        a.requests == 0 || (!a.assumed && (a.sectors as u128) < 2 * a.ideal as u128)
    };
    ld.requests + st.requests > 0 && ok(&ld) && ok(&st)
}

fn line_stalls(l: &StallLine, total: u64) -> LineStalls {
    LineStalls {
        file: l.file.clone(),
        line: l.line,
        samples: l.samples,
        share: crate::insight::share(l.samples, total),
        reasons: l.stalls.iter().take(REASONS).cloned().collect(),
    }
}

/// The leading stall among the kernel's unmapped samples (not `selected` / `not_selected`).
fn unmapped_dominant(s: &KernelStalls) -> Option<(String, u64)> {
    s.unmapped_reasons
        .iter()
        .filter(|(r, n)| is_stall(r) && **n > 0)
        .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
        .map(|(r, n)| (r.clone(), *n))
}

/// ` Over the kernel: long_scoreboard 61% (…), …` for the unmapped samples' leading reasons.
fn unmapped_text(s: &KernelStalls, total: u64) -> String {
    let mut v: Vec<(&String, &u64)> = s.unmapped_reasons.iter().filter(|(_, n)| **n > 0).collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    if v.is_empty() {
        return String::new();
    }
    let parts: Vec<String> = v
        .iter()
        .take(REASONS)
        .map(|(r, n)| {
            format!(
                "{r} {} ({})",
                detail_site::pct(**n, total.max(1)),
                explain(r).0
            )
        })
        .collect();
    format!(" Over the kernel: {}.", parts.join(", "))
}

fn base(file: &str) -> &str {
    file.rsplit('/').next().unwrap_or(file)
}

/// `long_scoreboard 91% (waiting on memory …)` for a line's leading reasons.
fn reasons_text(l: &StallLine) -> String {
    let parts: Vec<String> = l
        .stalls
        .iter()
        .take(REASONS)
        .map(|(r, n)| {
            format!(
                "{r} {} ({})",
                detail_site::pct(*n, l.samples.max(1)),
                explain(r).0
            )
        })
        .collect();
    parts.join(", ")
}

pub(crate) fn run(cx: &Ctx, table: &KernelTable) -> Vec<Insight> {
    let locator = Locator::new(cx);
    let mut out = Vec::new();
    for (row, s) in detail_site::with_stalls(cx, table) {
        if !matters(row) || s.total < MIN_SAMPLES {
            continue;
        }
        out.push(insight(cx, &locator, row, s));
    }
    out
}

fn insight(cx: &Ctx, locator: &Locator, row: &KernelRow, s: &KernelStalls) -> Insight {
    let total = s.total;
    let top = s.lines.first().filter(|l| l.samples > 0);
    let lineinfo = !s.lines.is_empty() || s.unmapped < total;
    let (loc, site) = detail_site::site(
        locator,
        row,
        top.map(|l| (l.file.as_str(), l.line)),
        (s.launches, s.records, lineinfo),
    );
    // Without a line, the kernel's unmapped samples still say what its warps wait on.
    let unmapped_dom = if top.is_none() {
        unmapped_dominant(s)
    } else {
        None
    };
    let dom = top.and_then(dominant).or(unmapped_dom.as_ref());
    let heavy = row.busy_ns as u128 * 100 >= row.device_busy_ns as u128 * HEAVY_BUSY_PCT as u128;
    let memory_bound_line = match (top, dom) {
        (Some(l), Some((r, n))) => {
            heavy
                && l.samples as u128 * 2 > total as u128
                && r == MEMORY_STALL
                && *n as u128 * 2 > l.samples as u128
                && !coalesced_at(cx, row, l)
        }
        _ => false,
    };
    let impact = match (memory_bound_line, dom) {
        (true, Some((_, n))) => detail_site::part(row.total_ns, crate::insight::share(*n, total)),
        _ => 0,
    };
    let title = match (top, dom) {
        (Some(l), Some((r, n))) => format!(
            "Stall reasons{} · {}: {} of its samples at this line, mostly {} ({r} {})",
            detail_site::at(&loc),
            short(row),
            detail_site::pct(l.samples, total),
            short_reason(r),
            detail_site::pct(*n, l.samples.max(1)),
        ),
        (Some(l), None) => format!(
            "Stall reasons{} · {}: {} of its samples at this line",
            detail_site::at(&loc),
            short(row),
            detail_site::pct(l.samples, total),
        ),
        (None, Some((r, n))) => format!(
            "Stall reasons{} · {}: no line inside the kernel; mostly {} ({r} {} of {total} samples)",
            detail_site::at(&loc),
            short(row),
            short_reason(r),
            detail_site::pct(*n, total),
        ),
        _ => format!(
            "Stall reasons{} · {}: {total} samples, none on a line inside the kernel",
            detail_site::at(&loc),
            short(row)
        ),
    };
    let lines: Vec<String> = s
        .lines
        .iter()
        .take(LINES)
        .map(|l| {
            format!(
                "{}:{} {} of the samples: {}",
                base(&l.file),
                l.line,
                detail_site::pct(l.samples, total),
                reasons_text(l)
            )
        })
        .collect();
    let period = s
        .period_log2
        .map(|p| format!(", one every 2^{p} cycles"))
        .unwrap_or_default();
    let unmapped = if s.unmapped > 0 {
        format!(", {} on no line", detail_site::pct(s.unmapped, total))
    } else {
        String::new()
    };
    let no_line = if top.is_none() {
        let over = unmapped_text(s, total);
        format!(
            " No sample was mapped to a line inside the kernel (a cubin without line info: build \
             with `nvcc -lineinfo`); located at its launch line.{over}"
        )
    } else {
        String::new()
    };
    let severity_text = if memory_bound_line {
        format!(
            " One line holds most of this heavy kernel's samples, waiting on memory: ~{} of its \
             time (an estimate and an upper bound).",
            crate::insight::fmt_duration(impact)
        )
    } else {
        " Informational: every kernel waits on something; gpufl claims no time.".to_string()
    };
    let detail = format!(
        "{}: PC sampling took {total} samples of its warps over {} launch(es){period}{unmapped}. \
         {}.{}{no_line}{severity_text}",
        describe(row),
        s.launches,
        if lines.is_empty() {
            "No line".to_string()
        } else {
            lines.join("; ")
        },
        launched(&site),
    );
    let fix = match dom {
        Some((r, _)) if top.is_none() => {
            let (what, fix) = explain(r);
            format!(
                "Its warps mostly stall on `{r}` ({what}): {fix}. Build it with `nvcc -lineinfo` (or the library's debug-line build) to see at which line."
            )
        }
        Some((r, _)) => {
            let (what, fix) = explain(r);
            format!("Its warps mostly stall on `{r}` at this line ({what}): {fix}.")
        }
        None => "Sample with line info (`nvcc -lineinfo`) to see where the warps wait.".to_string(),
    };
    let data = Data {
        site,
        samples: total,
        unmapped_samples: s.unmapped,
        period_log2: s.period_log2,
        dominant: dom.map(|(r, _)| r.clone()),
        dominant_samples: dom.map_or(0, |(_, n)| *n),
        lines: s
            .lines
            .iter()
            .take(LINES)
            .map(|l| line_stalls(l, total))
            .collect(),
        memory_bound_line,
        recoverable_ns: impact,
    };
    detail_site::insight(cx, RULE, row, (title, detail, fix), loc, impact).data(data)
}

/// A reason in two or three words for a title.
fn short_reason(r: &str) -> &str {
    match r {
        "long_scoreboard" => "waiting on memory",
        "short_scoreboard" => "waiting on shared memory or special math",
        "wait" => "waiting on an arithmetic result",
        "barrier" => "waiting at a barrier",
        "mio_throttle" => "waiting for the shared-memory/special-math queue",
        "lg_throttle" => "waiting for the global-memory queue",
        "math_pipe_throttle" => "waiting for a busy math pipe",
        "branch_resolving" => "resolving branches",
        "membar" => "waiting at a memory fence",
        "no_instructions" => "waiting for instructions",
        other => other,
    }
}
