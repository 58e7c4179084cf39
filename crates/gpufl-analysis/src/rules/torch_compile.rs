//! Rule `torch-compile`: time the host spent compiling with `torch.compile` (Dynamo and Inductor)
//! while the GPU waited, at the user's line that triggered it — the first compilation, and the
//! recompilations (a guard failed: a new shape, dtype or Python value) or new graphs (after a
//! graph break) that came later and cost GPU time in the middle of a run.
//!
//! - **Compiling calls:** CUDA calls (synchronizations, and API calls with a `callsite` stack)
//!   whose Python stack holds Dynamo's frame compiler (`torch/_dynamo/convert_frame.py`): Dynamo
//!   enters it only when a frame has no compiled code that fits (a cache miss), never when
//!   compiled code runs. A stack cut short inside CUDA is left out.
//! - **Episodes:** per thread, a run of compiling calls with no other CUDA call between them is
//!   one compilation. The recorder sees the host only at CUDA calls, so an episode spans from
//!   the end of the thread's last CUDA call before it to the start of its first CUDA call after
//!   it (tracing, code generation and Triton's compilation make no CUDA call): *up to* that long.
//!   The GPU's idle time inside the span (any device) is the cost.
//! - **Line:** the most frequent user line of the episode's compiling calls (the call of the
//!   compiled function or module).
//! - **Fires** per line with a compilation whose span is at least [`MIN_SPAN_NS`]. A compilation
//!   is a **recompilation** when the compiled code had already run at that line (a non-compiling
//!   CUDA call there, on any thread, before it): a first compilation that hit Inductor's caches
//!   may make no CUDA call and go unseen. The first compilation alone is LOW with no impact (a
//!   one-off at startup, listed last; worth caching); recompilations raise it to MEDIUM (HIGH
//!   when their GPU idle is over half the session's wall time), their GPU idle time the impact.

use crate::ids::{LocIx, StackIx};
use crate::insight::{fmt_duration, in_function, Insight};
use crate::shared::timeline::most_frequent_per_key;
use crate::shared::Ctx;
use crate::userframe::SourceLoc;
use serde::Serialize;
use std::collections::HashMap;

pub(crate) const RULE: &str = "torch-compile";
/// Shortest compilation span reported, ns.
pub const MIN_SPAN_NS: u64 = 1_000_000;
/// Episodes kept in the rule's data per line (the longest).
pub const MAX_EPISODES: usize = 16;
/// A Python frame in this file means Dynamo is compiling the frame.
const COMPILING_FILE: &str = "/torch/_dynamo/convert_frame.py";

const FIX: &str = "Compile once, before the work you time, and keep it compiled: find what made \
Dynamo compile again with TORCH_LOGS=recompiles (a guard on a shape, dtype or Python value that \
changes between calls) and TORCH_LOGS=graph_breaks (a graph break compiles the code after it \
as a graph of its own); mark sizes that change as dynamic (torch._dynamo.mark_dynamic, \
torch.compile(dynamic=True)) or pad them to a few fixed sizes, pass changing Python numbers as \
tensors, and use fullgraph=True to find breaks. Keep Inductor's caches (FX graph and autotuning \
caches; a persistent TORCHINDUCTOR_CACHE_DIR) so that a restart does not compile from scratch, \
and warm up with the shapes you will see.";

/// One compilation.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Episode {
    /// Start of the span, ns from the session's first record.
    pub start_ns: u64,
    /// Host time from the thread's last CUDA call before the compilation to its first after it.
    pub span_ns: u64,
    /// The GPU's idle time inside the span (all devices together).
    pub gpu_idle_ns: u64,
    /// Compiling CUDA calls in it.
    pub calls: u64,
    pub tid: u64,
}

/// The rule's own figures.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Data {
    /// Compilations at this line, and those after the first.
    pub compilations: u64,
    pub recompilations: u64,
    /// Summed spans and GPU idle of all of them, and of those after the first.
    pub compile_ns: u64,
    pub gpu_idle_ns: u64,
    pub recompile_ns: u64,
    pub recompile_gpu_idle_ns: u64,
    /// The longest compilations (at most [`MAX_EPISODES`]), in time order.
    pub episodes: Vec<Episode>,
}

/// A CUDA call with a stack: (start, end, thread, stack).
type Call = (u64, u64, u64, StackIx);

pub(crate) fn run(cx: &Ctx) -> Vec<Insight> {
    let calls = calls(cx);
    if !calls.iter().any(|c| c.1) {
        return Vec::new();
    }
    let mut found = episodes(cx, &calls);
    let first_run = first_runs(cx, &calls);
    found.sort_by_key(|(l, e)| (*l, e.start_ns));
    found
        .chunk_by(|a, b| a.0 == b.0)
        .map(|line| line_insight(cx, line, &first_run))
        .collect()
}

/// The CUDA calls with a stack (synchronizations, and API calls with a `callsite` stack not cut
/// short inside CUDA), each with whether it is compiling, by (thread, start, end).
fn calls(cx: &Ctx) -> Vec<(Call, bool)> {
    let m = cx.m;
    // Which stacks are compiling, on first need (a stack is looked at once).
    let mut compiling: HashMap<StackIx, bool> = HashMap::new();
    let mut is_compiling = |stack: StackIx| -> bool {
        *compiling.entry(stack).or_insert_with(|| {
            m.stack(stack).is_some_and(|frames| {
                frames.iter().any(|&f| {
                    m.frame(f)
                        .is_some_and(|fr| fr.file.is_some_and(|p| p.contains(COMPILING_FILE)))
                })
            })
        })
    };
    let mut calls: Vec<(Call, bool)> = Vec::new();
    for i in 0..m.sync_count() {
        let s = m.sync(i);
        let (Some(tid), Some(st)) = (s.tid, s.stack) else {
            continue;
        };
        calls.push(((s.start, s.end.max(s.start), tid, st), is_compiling(st)));
    }
    for &crate::model::Callsite { corr, stack, .. } in &m.callsites {
        if cx.stack_is_cut(stack) {
            continue;
        }
        let Some(a) = cx.api(corr) else { continue };
        calls.push((
            (a.start, a.end.max(a.start), a.tid, stack),
            is_compiling(stack),
        ));
    }
    calls.sort_unstable_by_key(|c| (c.0 .2, c.0 .0, c.0 .1));
    calls
}

/// The compilations, per thread: (line, episode) of each run of compiling calls with no other
/// CUDA call between them, spanning at least [`MIN_SPAN_NS`], at a user line.
fn episodes(cx: &Ctx, calls: &[(Call, bool)]) -> Vec<(LocIx, Episode)> {
    let origin = cx.m.time_range().0;
    let all_busy = cx.busy.intervals(None);
    let mut found: Vec<(LocIx, Episode)> = Vec::new();
    for thread in calls.chunk_by(|a, b| a.0 .2 == b.0 .2) {
        let mut i = 0;
        while i < thread.len() {
            if !thread[i].1 {
                i += 1;
                continue;
            }
            let j = i + thread[i..].iter().take_while(|c| c.1).count();
            let run = &thread[i..j];
            let from = match i.checked_sub(1) {
                Some(p) => thread[p].0 .1,
                None => run[0].0 .0,
            };
            let to = thread.get(j).map_or(run[run.len() - 1].0 .1, |c| c.0 .0);
            let span = to.saturating_sub(from);
            let votes: Vec<(u32, LocIx)> = run
                .iter()
                .filter_map(|c| cx.stack_loc(c.0 .3))
                .filter(|&l| !cx.is_driver_internal(l))
                .map(|l| (0, l))
                .collect();
            let line = most_frequent_per_key(votes).first().map(|v| v.1);
            if let Some(line) = line.filter(|_| span >= MIN_SPAN_NS) {
                found.push((
                    line,
                    Episode {
                        start_ns: from.saturating_sub(origin),
                        span_ns: span,
                        gpu_idle_ns: span
                            .saturating_sub(crate::intervals::overlap_ns(all_busy, from, to)),
                        calls: run.len() as u64,
                        tid: run[0].0 .2,
                    },
                ));
            }
            i = j;
        }
    }
    found
}

/// Per line, the first time the compiled code ran there (a non-compiling call, on any thread).
/// A compilation after it is a recompilation (or a new graph), whatever its rank: a first
/// compilation that hit Inductor's caches can make no CUDA call and go unseen, while a later one
/// that autotunes new kernels is seen.
fn first_runs(cx: &Ctx, calls: &[(Call, bool)]) -> HashMap<LocIx, u64> {
    let mut first_run: HashMap<LocIx, u64> = HashMap::new();
    for &((start, _, _, st), comp) in calls {
        if comp {
            continue;
        }
        if let Some(l) = cx.stack_loc(st) {
            let e = first_run.entry(l).or_insert(start);
            *e = (*e).min(start);
        }
    }
    first_run
}

/// The insight of one line's compilations (in time order).
fn line_insight(cx: &Ctx, line: &[(LocIx, Episode)], first_run: &HashMap<LocIx, u64>) -> Insight {
    let origin = cx.m.time_range().0;
    let loc = cx.loc(line[0].0).clone();
    let eps: Vec<&Episode> = line.iter().map(|(_, e)| e).collect();
    let (compile_ns, idle_ns) = (sum(&eps, |e| e.span_ns), sum(&eps, |e| e.gpu_idle_ns));
    let ran_from = first_run
        .get(&line[0].0)
        .map_or(u64::MAX, |&t| t.saturating_sub(origin));
    // The first compilation unless the function had already run at this line before it.
    let n_first = usize::from(eps[0].start_ns < ran_from);
    let later = &eps[n_first..];
    let (re_ns, re_idle) = (sum(later, |e| e.span_ns), sum(later, |e| e.gpu_idle_ns));
    let mut kept: Vec<Episode> = eps.iter().map(|e| (*e).clone()).collect();
    if kept.len() > MAX_EPISODES {
        kept.sort_by(|a, b| b.span_ns.cmp(&a.span_ns).then(a.start_ns.cmp(&b.start_ns)));
        kept.truncate(MAX_EPISODES);
        kept.sort_by_key(|e| e.start_ns);
    }
    let title = if later.is_empty() {
        format!(
            "torch.compile compiling @ {} · up to {} once, GPU idle {}",
            loc.short(),
            fmt_duration(compile_ns),
            fmt_duration(idle_ns)
        )
    } else {
        format!(
            "torch.compile compiling × {} @ {} · {} recompilation(s) up to {}, GPU idle {}",
            eps.len(),
            loc.short(),
            later.len(),
            fmt_duration(re_ns),
            fmt_duration(re_idle)
        )
    };
    let detail = detail(&loc, &eps, n_first, (re_ns, re_idle));
    // The first compilation is a one-off at startup (gpu-idle leaves such pauses out too):
    // listed, not ranked by its idle time; recompilations are what the loop pays again.
    let (impact, window) = if later.is_empty() {
        (0, compile_ns)
    } else {
        (re_idle, re_ns)
    };
    Insight::new(RULE, loc, title, detail, FIX)
        .count(eps.len() as u64)
        .impact(impact, window, cx.wall_ns)
        .gpu_idle(idle_ns)
        .data(Data {
            compilations: eps.len() as u64,
            recompilations: later.len() as u64,
            compile_ns,
            gpu_idle_ns: idle_ns,
            recompile_ns: re_ns,
            recompile_gpu_idle_ns: re_idle,
            episodes: kept,
        })
}

/// Σ `f` over episodes, saturating.
fn sum(eps: &[&Episode], f: fn(&Episode) -> u64) -> u64 {
    eps.iter().fold(0u64, |a, e| a.saturating_add(f(e)))
}

/// The detail of a line's insight: its compilations, the first (`n_first` 1) and the later ones
/// (their summed span and GPU idle in `re`).
fn detail(
    loc: &SourceLoc,
    eps: &[&Episode],
    n_first: usize,
    (re_ns, re_idle): (u64, u64),
) -> String {
    let later = &eps[n_first..];
    let times = match eps.len() {
        1 => "once".to_string(),
        n => format!("{n} times"),
    };
    let mut detail = format!(
        "Dynamo compiled at {}{} {times}",
        loc.short(),
        in_function(loc)
    );
    if let Some(first) = eps.first().filter(|_| n_first == 1) {
        detail.push_str(&format!(
            ": first at +{} for up to {} (GPU idle {}, {} compiling CUDA calls)",
            fmt_duration(first.start_ns),
            fmt_duration(first.span_ns),
            fmt_duration(first.gpu_idle_ns),
            first.calls
        ));
    }
    if !later.is_empty() {
        let longest = later.iter().map(|e| e.span_ns).max().unwrap_or(0);
        detail.push_str(&format!(
            "{}{} after the compiled code had run at this line — recompilations (a guard \
             failed) or new graphs (after a graph break) — for up to {} in all (longest {}, \
             the first at +{}), with the GPU idle {} meanwhile",
            if n_first == 1 { "; then " } else { ": " },
            later.len(),
            fmt_duration(re_ns),
            fmt_duration(longest),
            fmt_duration(later[0].start_ns),
            fmt_duration(re_idle)
        ));
    }
    detail.push_str(
        ". A span runs from the thread's last CUDA call before compiling to its first after \
         it: the recorder sees the host only at CUDA calls.",
    );
    detail
}
