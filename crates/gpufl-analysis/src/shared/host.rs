//! The join of GPU idle gaps with the host: what the host was doing while a device waited, from
//! the `hostcall` and `hsample` records (docs/insights.md, "What the host was doing"). Shared,
//! not a rule: `gpu-idle`, `launch-bound` and `collective-wait` explain their gaps with it, and
//! `blocking-call` reads the compilation and implicit-synchronizer tables.
//!
//! - **Threads that matter** for a gap ([`HostGap::tid`]): the thread that issued the op that
//!   ended it (the launching thread; for a `sync` gap the blocked thread), and the thread driving
//!   it: the thread whose Python frames that thread's stacks carry (`via_tid`: cross-thread Python
//!   attribution), else the process's main thread (its id is the header's `pid`). A gap whose
//!   issuing thread is unknown is looked at on the main thread.
//! - **Exact intervals first:** the threads' CUDA calls that overlap the gap, with their
//!   durations: `hostcall` records, blocking synchronizations and `api` records (the launching
//!   thread's before the driving thread's; of two calls over one instant, the first counts).
//!   Each covers its part of the gap at its line (the call's stack; an API call's line as the
//!   timeline rules find it).
//! - **Then the host samples** for the rest of the gap: a sample of a thread at `ts` with
//!   `start <= ts < end` (a sample on the gap's end belongs to what follows) that no exact
//!   interval covers stands for its `period_ns`. Samples of one round (one `ts`) count once: the
//!   launching thread's when it has a stack or is in a CUDA call, else the driving thread's when
//!   it has a stack, else the launching thread's. The sampled time of a set of gaps is at most the
//!   time the exact intervals leave (scaled down to it when the samples' periods sum to more).
//! - **What:** each piece of time is a (host line, activity): the line is the user location of
//!   the call's or sample's stack, with the library line beside it (none for a thread that ran no
//!   Python: native-only threads have no sampled stack); the activity a CUDA call (its name), a
//!   synchronization (its kind), compilation, or the sample's state (on CPU, waiting on a lock or
//!   the GIL, sleeping or in I/O, idle-waiting, a CUDA call by name).
//! - **Compilation** ([`Compiler`]): a sample whose Python stack is in XLA/JAX's compiler
//!   (`jax/_src/compiler.py`, lowering and `cache_miss` in `pjit.py`, `pxla.py`, `mlir.py`),
//!   Dynamo's frame compiler (`torch/_dynamo/convert_frame.py`) or Inductor's
//!   (`torch/_inductor/compile_fx.py`, `codecache.py`, `select_algorithm.py`, autotuning in its
//!   Triton heuristics), Triton's compiler or autotuner; a module or library load hostcall
//!   (`cuModuleLoad*`, `cuLibraryLoad*`, …); and the time inside an `XlaCompile` scope (any
//!   thread) that no call covers, at the line of the samples in it (else the finding's line).
//! - **Framework overhead:** CPU and lock time of samples spread over at least
//!   [`OVERHEAD_MIN_LINES`] host lines, none holding half of it, is summarized as framework
//!   overhead with its top lines and the user's call most of it sits under.
//! - **The host line** of a set of gaps: the line holding the most of their time, when it holds
//!   at least [`RELOCATE_PCT`] % of it: the finding is then located there, and the line of the
//!   launch that ended the gaps stays as "gap ended at".

use crate::ids::{LocIx, StackIx};
use crate::model::Model;
use crate::shared::advice::{advice, Fix, Program};
use crate::shared::timeline::Locator;
use crate::shared::Ctx;
use crate::text::{fmt_duration, share};
use crate::userframe::SourceLoc;
use crate::views::sync_kind_from_u8;

pub(crate) mod calls;
use gpufl_trace::{HostState, StrId};
use serde::Serialize;
use std::collections::HashMap;

/// A finding moves to the host line that holds at least this share of its gaps' time, percent.
pub const RELOCATE_PCT: u64 = 50;
/// Host lines listed per finding.
pub const MAX_LINES: usize = 8;
/// CPU time spread over at least this many lines (none holding half) is framework overhead.
pub const OVERHEAD_MIN_LINES: usize = 3;
/// Overhead lines listed.
const OVERHEAD_TOP: usize = 5;
/// Calls looked at per thread and gap (a thread's calls do not overlap; this bounds odd data).
const MAX_CALLS_PER_GAP: usize = 256;

/// A gap to explain: `[start, end)` on the trace clock, and the thread that issued the op that
/// ended it (None: unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostGap {
    pub start: u64,
    pub end: u64,
    pub tid: Option<u64>,
}

/// What kind of compilation.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Compiler {
    /// XLA / JAX: tracing, lowering and compiling a jitted function (`XlaCompile` scopes).
    Xla,
    /// `torch.compile`: Dynamo's frame compiler and Inductor.
    TorchCompile,
    /// Triton's compiler and autotuner.
    Triton,
    /// CUDA module and library loads (lazy loading of kernels included).
    ModuleLoad,
}

impl Compiler {
    /// How prose names it ("compiling (XLA)").
    pub fn label(self) -> &'static str {
        match self {
            Compiler::Xla => "compiling (XLA)",
            Compiler::TorchCompile => "compiling (torch.compile)",
            Compiler::Triton => "compiling or autotuning (Triton)",
            Compiler::ModuleLoad => "loading CUDA modules",
        }
    }
}

/// What the host was doing in a piece of gap time.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Doing {
    /// Inside a CUDA call (a hostcall or API call timed exactly, or a sample in state `cuda`).
    Call,
    /// Blocked in a synchronization.
    Sync,
    /// Compiling ([`Compiler`]).
    Compile,
    /// Sampled on a CPU.
    Cpu,
    /// Sampled waiting on a lock (the GIL included).
    Lock,
    /// Sampled sleeping or in I/O.
    Sleep,
    /// Sampled in an idle wait of Python's standard library (a queue, a thread join).
    Idle,
    /// Sampled in an unknown state.
    Unknown,
}

impl Doing {
    fn of_state(s: HostState) -> Doing {
        match s {
            HostState::Cpu => Doing::Cpu,
            HostState::Cuda => Doing::Call,
            HostState::Lock => Doing::Lock,
            HostState::Sleep => Doing::Sleep,
            HostState::Idle => Doing::Idle,
            HostState::Unknown => Doing::Unknown,
        }
    }
}

/// The internal key of a piece's activity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Act {
    /// A CUDA call by name (model string id).
    Call(u32),
    /// A synchronization by kind byte.
    Sync(u8),
    Compile(Compiler),
    /// A sampled state other than `cuda` (`HostState` byte order of [`Doing`]).
    State(Doing),
}

impl Act {
    fn doing(self) -> Doing {
        match self {
            Act::Call(_) => Doing::Call,
            Act::Sync(_) => Doing::Sync,
            Act::Compile(_) => Doing::Compile,
            Act::State(d) => d,
        }
    }

    fn what(self, m: &Model) -> String {
        match self {
            Act::Call(n) => m.str(StrId(n)).to_string(),
            Act::Sync(k) => sync_kind_from_u8(k).display_name().to_string(),
            Act::Compile(c) => c.label().to_string(),
            Act::State(d) => match d {
                Doing::Cpu => HostState::Cpu.display_name(),
                Doing::Lock => HostState::Lock.display_name(),
                Doing::Sleep => HostState::Sleep.display_name(),
                Doing::Idle => "idle-waiting",
                _ => "in an unknown state",
            }
            .to_string(),
        }
    }
}

/// Time of one (host line, activity) during the gaps.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct HostLine {
    /// The user line (with the library line beside it); None for a thread that ran no Python
    /// and a call whose line is unknown.
    pub location: Option<SourceLoc>,
    pub doing: Doing,
    /// The call's name, the synchronization's kind, the compiler, or the state.
    pub what: String,
    /// Time, ns: exact, plus the samples' estimate.
    pub ns: u64,
    /// `ns` over the gaps' time, 0..1.
    pub share: f64,
    /// Of `ns`, timed exactly (CUDA calls, compilation scopes).
    pub exact_ns: u64,
    /// Host samples counted.
    pub samples: u64,
    /// Where the line's function was called from (the next user frame outward, in another
    /// function, of a stack at this line), when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caller: Option<SourceLoc>,
}

/// Time of one activity during the gaps.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct DoingTime {
    pub doing: Doing,
    pub ns: u64,
    pub share: f64,
}

/// Python and framework CPU time spread over many lines.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Overhead {
    pub ns: u64,
    /// Of the gaps' time, 0..1.
    pub share: f64,
    /// Distinct host lines it is spread over.
    pub lines: u64,
    /// The user's call most of it sits under (at least half of it), its library lines inside.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub under: Option<SourceLoc>,
    /// Its top lines (at most 5).
    pub top: Vec<HostLine>,
}

/// What the host was doing during a set of GPU idle gaps (`data.host` of the idle findings).
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct HostActivity {
    /// The threads looked at (OS thread ids, the launching threads first).
    pub threads: Vec<u64>,
    pub gaps: u64,
    /// The gaps' time, ns.
    pub gap_ns: u64,
    /// Of it, covered by the threads' CUDA calls and compilation scopes (exact).
    pub exact_ns: u64,
    /// Of it, estimated from host samples (each standing for its period; at most the rest).
    pub sampled_ns: u64,
    /// Host samples counted (one per sampling round).
    pub samples: u64,
    /// Gaps with neither a call nor a sample of their threads (too short for the sampler's rate,
    /// or not recorded).
    pub unseen_gaps: u64,
    /// Time spent compiling (exact and sampled).
    pub compile_ns: u64,
    /// Time by (host line, activity), most first (at most [`MAX_LINES`]).
    pub lines: Vec<HostLine>,
    /// Time by activity, most first.
    pub states: Vec<DoingTime>,
    /// CPU time spread over many lines, summarized.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
}

/// The join's answer for a set of gaps: the plain data, and the host line a finding moves to.
pub(crate) struct Join {
    pub activity: HostActivity,
    /// The line holding at least [`RELOCATE_PCT`] % of the gaps' time.
    pub line: Option<HostTop>,
    /// Compilation holds at least [`RELOCATE_PCT`] % of the gaps' time: its main kind.
    pub compiling: Option<Compiler>,
    /// No line holds enough, but two lines together do (each at least [`PAIR_MIN_PCT`] %):
    /// each line with its main activity as prose and its share.
    pub pair: Option<[(LocIx, String, f64); 2]>,
    /// Every host line's time in the gaps (all its activities), most first.
    pub by_loc: Vec<(LocIx, u64)>,
}

/// Each of two lines that hold [`RELOCATE_PCT`] % of the gaps' time together holds at least
/// this share, percent, for the finding to name both.
pub const PAIR_MIN_PCT: u64 = 20;

/// The host line holding most of a set of gaps' time.
pub(crate) struct HostTop {
    pub loc: LocIx,
    /// Its share of the gaps' time (all its activities), 0..1.
    pub share: f64,
    /// Its main activity as prose after "was": `in cudaFree`, `compiling (XLA)`, `on CPU`.
    pub phrase: String,
    doing: Doing,
    /// The call's name (a CUDA call), or the compiler.
    call: Option<String>,
    compiler: Option<Compiler>,
}

/// The fix when the host was on a CPU at a line during the gaps.
const FIX_HOST_CPU: Fix = Fix {
    native:
        "Move the host work at that line off the launching thread or overlap it with GPU work: \
prepare data in a background thread, prefetch the next batch while the GPU runs this one, \
vectorize the preparation or do it on the GPU, and issue the next GPU work before the CPU \
work where the order allows.",
    python: Some(
        "Move the host work at that line off the launching thread or overlap it with GPU work: \
prepare data in worker processes or a background thread, prefetch the next batch while the \
GPU runs this one, vectorize the preparation or do it on the GPU, and issue the next GPU \
work before the CPU work where the order allows.",
    ),
    torch: Some(
        "Move the host work at that line off the launching thread or overlap it with GPU work: \
prepare data in DataLoader workers (num_workers > 0) or a background thread, prefetch the \
next batch while the GPU runs this one, vectorize the preparation or do it on the GPU, and \
issue the next GPU work before the CPU work where the order allows.",
    ),
    jax: None,
    cupy: None,
};
/// The fix when the host was waiting (I/O, a queue, another thread) at a line.
const FIX_HOST_WAIT: Fix = Fix {
    native: "The host was waiting at that line (I/O, a queue, another thread) while the GPU had nothing \
to do: prefetch (a background loader thread), read ahead, and queue GPU work before waiting.",
    python: Some("The host was waiting at that line (I/O, a queue, another thread) while the GPU had nothing \
to do: prefetch (worker processes or a background loader), read ahead, and queue GPU work \
before waiting."),
    torch: Some("The host was waiting at that line (I/O, a queue, another thread) while the GPU had nothing \
to do: prefetch (DataLoader workers with prefetch_factor, a background loader), read ahead, \
and queue GPU work before waiting."),
    jax: None,
    cupy: None,
};

impl Compiler {
    /// The fix when compilation held the gaps (a module load's in the `program`'s words).
    pub(crate) fn fix(self, program: Program) -> &'static str {
        match self {
            Compiler::Xla => {
                "Compile once: keep shapes static (pad batches to a few fixed sizes, drop the last partial batch), keep Python values that change out of static arguments, warm up with every shape you will see before the work you time, and keep compiled code across runs (jax.config jax_compilation_cache_dir)."
            }
            Compiler::TorchCompile => {
                "Compile once: find what makes Dynamo compile again (TORCH_LOGS=recompiles), mark sizes that change as dynamic or pad them to a few fixed sizes, warm up with the shapes you will see, and keep Inductor's caches (TORCHINDUCTOR_CACHE_DIR)."
            }
            Compiler::Triton => {
                "Autotune and compile once: warm up with the shapes you will see, keep Triton's cache (TRITON_CACHE_DIR), and narrow the autotuner's configurations or key."
            }
            Compiler::ModuleLoad => advice(program, calls::CallKind::ModuleLoad.fix()),
        }
    }
}

impl Join {
    /// The fix for what held the gaps, when the join names it (a call, compilation, CPU work or
    /// a wait at a line); None to keep the finding's own.
    pub(crate) fn fix(&self, program: Program) -> Option<String> {
        if let Some(t) = &self.line {
            let f = match t.doing {
                Doing::Call => t
                    .call
                    .as_deref()
                    .map(calls::CallKind::of)
                    .filter(|k| *k != calls::CallKind::Other)
                    .map(|k| advice(program, k.fix())),
                Doing::Compile => t.compiler.map(|c| c.fix(program)),
                Doing::Cpu | Doing::Lock => Some(advice(program, &FIX_HOST_CPU)),
                Doing::Sleep | Doing::Idle => Some(advice(program, &FIX_HOST_WAIT)),
                Doing::Sync | Doing::Unknown => None,
            };
            return f.map(str::to_string);
        }
        self.compiling.map(|c| c.fix(program).to_string())
    }
}

/// The compiler whose frames a Python stack is in, if any (innermost frame that says so).
pub(crate) fn stack_compiler(m: &Model, stack: StackIx) -> Option<Compiler> {
    let frames = m.stack(stack)?;
    frames.iter().find_map(|&f| {
        let fr = m.frame(f)?;
        frame_compiler(fr.file?, fr.func.unwrap_or(""))
    })
}

/// The compiler a Python frame (file, function) belongs to.
fn frame_compiler(file: &str, func: &str) -> Option<Compiler> {
    let any = |names: &[&str]| names.iter().any(|n| func.contains(n));
    if file.ends_with("jax/_src/compiler.py") || file.ends_with("jax/_src/interpreters/mlir.py") {
        return Some(Compiler::Xla);
    }
    if (file.ends_with("jax/_src/interpreters/pxla.py") && any(&["compile", "lower", "from_hlo"]))
        || (file.ends_with("jax/_src/pjit.py") && any(&["cache_miss", "lower", "compile"]))
    {
        return Some(Compiler::Xla);
    }
    if file.ends_with("torch/_dynamo/convert_frame.py")
        || file.ends_with("torch/_inductor/compile_fx.py")
        || file.ends_with("torch/_inductor/codecache.py")
        || file.ends_with("torch/_inductor/select_algorithm.py")
        || file.ends_with("torch/_inductor/async_compile.py")
        || (file.ends_with("torch/_inductor/runtime/triton_heuristics.py")
            && any(&["autotune", "benchmark", "precompile"]))
    {
        return Some(Compiler::TorchCompile);
    }
    if file.ends_with("triton/compiler/compiler.py")
        || (file.ends_with("triton/runtime/autotuner.py") && any(&["_bench", "prune"]))
    {
        return Some(Compiler::Triton);
    }
    None
}

/// Whether a hostcall loads a CUDA module or library (or looks a kernel up, which loads its
/// module under lazy loading when the call is slow).
pub(crate) fn is_module_load(name: &str) -> bool {
    [
        "cuModuleLoad",
        "cuLibraryLoad",
        "cudaLibraryLoad",
        "cuLinkComplete",
        "cuModuleGetFunction",
        "cuLibraryGetKernel",
        "cudaLibraryGetKernel",
        "cudaFuncGetAttributes",
    ]
    .iter()
    .any(|p| name.starts_with(p))
}

/// The idle time of device `dev` (all devices together when None) inside `[s, e)`: the time no
/// op of it ran, within its active range (first op's start to last op's end), GPU-unobserved
/// time left out — the GPU idle a host call over `[s, e)` coincided with.
pub(crate) fn gpu_idle_in(cx: &Ctx, dev: Option<u32>, s: u64, e: u64) -> u64 {
    let iv = cx.busy.intervals(dev);
    let (Some(first), Some(last)) = (iv.first(), iv.last()) else {
        return 0;
    };
    let (a, b) = (s.max(first.0), e.min(last.1));
    if b <= a {
        return 0;
    }
    let busy = crate::intervals::overlap_ns(iv, a, b);
    (b - a)
        .saturating_sub(busy)
        .saturating_sub(cx.m.unobserved_in(a, b))
}

/// An exact interval: a CUDA call of a thread.
#[derive(Clone, Copy)]
struct Exact {
    tid: u64,
    start: u64,
    end: u64,
    what: Timed,
}

#[derive(Clone, Copy)]
enum Timed {
    Hostcall(u32),
    Sync(u32),
    Api(u32),
}

impl Timed {
    /// Of two calls over one instant of one thread, the lower counts.
    fn rank(self) -> u8 {
        match self {
            Timed::Hostcall(_) => 0,
            Timed::Sync(_) => 1,
            Timed::Api(_) => 2,
        }
    }
}

/// The host records indexed for the join (built once per analysis, on first need).
pub(crate) struct HostIndex {
    /// Exact intervals, by (thread, start).
    calls: Vec<Exact>,
    /// Running max of `end` within each thread's run of `calls`.
    max_end: Vec<u64>,
    /// Host samples (index into the model's) by (thread, ts).
    samples: Vec<(u64, u64, u32)>,
    /// (thread, the thread whose Python frames its stacks carry: the most frequent), by thread.
    drivers: Vec<(u64, u64)>,
    /// The process's main thread (the header's pid).
    main: Option<u64>,
    /// `XlaCompile` scopes of every thread, merged.
    compile_scopes: Vec<(u64, u64)>,
    /// Per model stack: the compiler its frames are in (samples' stacks only; else None).
    stack_compiler: Vec<Option<Compiler>>,
}

impl HostIndex {
    /// Index the model's host records (empty without any: the join then has nothing to say).
    pub(crate) fn new(cx: &Ctx) -> HostIndex {
        let m = cx.m;
        let mut idx = HostIndex {
            calls: Vec::new(),
            max_end: Vec::new(),
            samples: Vec::new(),
            drivers: Vec::new(),
            main: m.header().map(|h| h.pid as u64).filter(|&p| p != 0),
            compile_scopes: Vec::new(),
            stack_compiler: Vec::new(),
        };
        if !m.has_host_records() {
            return idx;
        }
        let mut calls: Vec<Exact> = Vec::new();
        let mut via: Vec<(u64, u64)> = Vec::new();
        for i in 0..m.hostcall_count() {
            let h = m.hostcall(i);
            calls.push(Exact {
                tid: h.tid,
                start: h.start,
                end: h.end.max(h.start),
                what: Timed::Hostcall(i as u32),
            });
            if let Some(v) = h.stack.and_then(|s| m.stack_via(s)) {
                via.push((h.tid, v));
            }
        }
        for i in 0..m.sync_count() {
            let s = m.sync(i);
            let Some(tid) = s.tid else { continue };
            if let Some(v) = s.stack.and_then(|st| m.stack_via(st)) {
                via.push((tid, v));
            }
            if !s.kind.blocks_host() {
                continue;
            }
            calls.push(Exact {
                tid,
                start: s.start,
                end: s.end.max(s.start),
                what: Timed::Sync(i as u32),
            });
        }
        for i in 0..m.api_count() as usize {
            let a = m.api(i);
            calls.push(Exact {
                tid: a.tid,
                start: a.start,
                end: a.end.max(a.start),
                what: Timed::Api(i as u32),
            });
        }
        // Launch call sites: the launching thread is its API call's.
        for c in &m.callsites {
            if let (Some(v), Some(a)) = (m.stack_via(c.stack), cx.api(c.corr)) {
                via.push((a.tid, v));
            }
        }
        calls.sort_unstable_by_key(|c| (c.tid, c.start, c.what.rank(), c.end));
        let mut max_end = Vec::with_capacity(calls.len());
        for (i, c) in calls.iter().enumerate() {
            let prev = match i.checked_sub(1) {
                Some(p) if calls[p].tid == c.tid => max_end[p],
                _ => 0,
            };
            max_end.push(c.end.max(prev));
        }
        idx.calls = calls;
        idx.max_end = max_end;
        // The most frequent via thread of each thread (ties: the smallest).
        via.retain(|&(t, v)| t != v);
        via.sort_unstable();
        for run in via.chunk_by(|a, b| a.0 == b.0) {
            let best = run
                .chunk_by(|a, b| a.1 == b.1)
                .max_by_key(|r| (r.len(), std::cmp::Reverse(r[0].1)))
                .map(|r| r[0].1);
            if let Some(v) = best {
                idx.drivers.push((run[0].0, v));
            }
        }
        let mut compilers: Vec<Option<Option<Compiler>>> = vec![None; m.stack_count()];
        for i in 0..m.hsample_count() {
            let s = m.hsample(i);
            idx.samples.push((s.tid, s.ts, i as u32));
            if let Some(st) = s.stack {
                if let Some(slot) = compilers.get_mut(st.index()) {
                    if slot.is_none() {
                        *slot = Some(stack_compiler(m, st));
                    }
                }
            }
        }
        idx.samples.sort_unstable();
        idx.stack_compiler = compilers.into_iter().map(|c| c.flatten()).collect();
        let mut scopes: Vec<(u64, u64)> = m
            .scopes()
            .iter()
            .filter(|s| m.str(StrId(s.name)).starts_with("XlaCompile"))
            .map(|s| (s.start, s.end))
            .collect();
        let n = crate::intervals::merge(&mut scopes).len();
        scopes.truncate(n);
        idx.compile_scopes = scopes;
        idx
    }

    /// Whether there is anything to join (the model has host records).
    pub(crate) fn is_empty(&self) -> bool {
        self.calls.is_empty() && self.samples.is_empty()
    }

    /// The threads that matter for a gap issued by `tid`: it (or the main thread when unknown),
    /// then its driving thread.
    fn threads(&self, tid: Option<u64>) -> Vec<u64> {
        let Some(p) = tid.or(self.main) else {
            return Vec::new();
        };
        let i = self.drivers.partition_point(|d| d.0 < p);
        let driver = match self.drivers.get(i) {
            Some(&(t, v)) if t == p => Some(v),
            _ => self.main.filter(|&mt| mt != p),
        };
        let mut v = vec![p];
        v.extend(driver);
        v
    }

    /// Indices of `tid`'s calls that overlap `[gs, ge)`.
    fn calls_in(&self, tid: u64, gs: u64, ge: u64) -> Vec<usize> {
        let v = &self.calls;
        let lo = v.partition_point(|c| c.tid < tid);
        let hi = lo + v[lo..].partition_point(|c| c.tid == tid && c.start < ge);
        let mut out = Vec::new();
        let mut i = hi;
        while i > lo && out.len() < MAX_CALLS_PER_GAP {
            i -= 1;
            if self.max_end[i] <= gs {
                break;
            }
            if v[i].end > gs {
                out.push(i);
            }
        }
        out.reverse();
        out
    }

    /// Samples of `tid` with `gs <= ts < ge`.
    fn samples_in(&self, tid: u64, gs: u64, ge: u64) -> &[(u64, u64, u32)] {
        let v = &self.samples;
        let lo = v.partition_point(|s| (s.0, s.1) < (tid, gs));
        let hi = v.partition_point(|s| (s.0, s.1) < (tid, ge));
        &v[lo..hi.max(lo)]
    }

    /// The line and activity of an exact interval.
    fn timed_key(&self, cx: &Ctx, locator: &Locator, t: Timed) -> (Option<LocIx>, Act) {
        let m = cx.m;
        match t {
            Timed::Hostcall(i) => {
                let h = m.hostcall(i as usize);
                let loc = h.stack.and_then(|s| cx.stack_loc(s));
                let act = if is_module_load(m.str(h.name)) {
                    Act::Compile(Compiler::ModuleLoad)
                } else {
                    Act::Call(h.name.0)
                };
                (loc, act)
            }
            Timed::Sync(i) => (
                cx.sync_loc(i as usize),
                Act::Sync(crate::views::sync_kind_to_u8(m.sync(i as usize).kind)),
            ),
            Timed::Api(i) => {
                let a = m.api(i as usize);
                let (loc, _) = locator.locate(a.corr, None, Some(&a), a.start);
                (loc, Act::Call(a.name.0))
            }
        }
    }

    /// What the host was doing during `gaps`; `fallback` locates compilation time no sample
    /// names (the finding's own line).
    pub(crate) fn explain(
        &self,
        cx: &Ctx,
        locator: &Locator,
        gaps: &[HostGap],
        fallback: Option<LocIx>,
    ) -> Join {
        let m = cx.m;
        let mut acc: HashMap<(Option<LocIx>, Act), Acc> = HashMap::new();
        let mut threads: Vec<u64> = Vec::new();
        let (mut gap_ns, mut rest_ns, mut raw_sampled, mut samples) = (0u64, 0u64, 0u64, 0u64);
        let mut unseen = 0u64;
        // Compilation-scope time no call covers, and the lines of the samples in it.
        let mut scope_ns = 0u64;
        let mut scope_votes: HashMap<Option<LocIx>, u64> = HashMap::new();
        for g in gaps {
            let (gs, ge) = (g.start, g.end.max(g.start));
            if ge == gs {
                continue;
            }
            gap_ns += ge - gs;
            let ts = self.threads(g.tid);
            for &t in &ts {
                if !threads.contains(&t) {
                    threads.push(t);
                }
            }
            // Exact intervals: the launching thread's calls first.
            let mut covered: Vec<(u64, u64)> = Vec::new();
            let mut seen = false;
            for &t in &ts {
                for i in self.calls_in(t, gs, ge) {
                    let c = self.calls[i];
                    let pieces = uncovered(&covered, c.start.max(gs), c.end.min(ge));
                    if pieces.is_empty() {
                        continue;
                    }
                    let key = self.timed_key(cx, locator, c.what);
                    let e = acc.entry(key).or_default();
                    if let (None, Timed::Hostcall(i)) = (e.stack, c.what) {
                        e.stack = m.hostcall(i as usize).stack;
                    }
                    for &(s, e2) in &pieces {
                        e.exact += e2 - s;
                        insert(&mut covered, s, e2);
                    }
                    seen = true;
                }
            }
            // The rest: compilation scopes, then samples.
            let rest = uncovered(&covered, gs, ge);
            let mut in_scope: Vec<(u64, u64)> = Vec::new();
            for &(s, e) in &rest {
                let sc = &self.compile_scopes;
                let i = sc.partition_point(|p| p.1 <= s);
                for &(a, b) in sc[i..].iter().take_while(|p| p.0 < e) {
                    let (x, y) = (a.max(s), b.min(e));
                    if y > x {
                        in_scope.push((x, y));
                    }
                }
            }
            let scoped: u64 = in_scope.iter().map(|p| p.1 - p.0).sum();
            scope_ns += scoped;
            seen |= scoped > 0;
            rest_ns += rest.iter().map(|p| p.1 - p.0).sum::<u64>() - scoped;
            // Samples by round: (ts, thread order, sample).
            let mut rounds: Vec<(u64, usize, u32)> = Vec::new();
            for (k, &t) in ts.iter().enumerate() {
                for &(_, sts, si) in self.samples_in(t, gs, ge) {
                    if inside(&rest, sts) {
                        rounds.push((sts, k, si));
                    }
                }
            }
            rounds.sort_unstable();
            for round in rounds.chunk_by(|a, b| a.0 == b.0) {
                let Some(si) = self.pick(m, round) else {
                    continue;
                };
                let s = m.hsample(si as usize);
                let loc = s.stack.and_then(|st| cx.stack_loc(st));
                seen = true;
                if inside(&in_scope, s.ts) {
                    *scope_votes.entry(loc).or_default() += 1;
                    continue;
                }
                let comp = s
                    .stack
                    .and_then(|st| self.stack_compiler.get(st.index()).copied().flatten());
                let act = match (comp, s.state, s.call) {
                    (Some(c), _, _) => Act::Compile(c),
                    (None, HostState::Cuda, Some(call)) => Act::Call(call.0),
                    (None, st, _) => Act::State(Doing::of_state(st)),
                };
                let e = acc.entry((loc, act)).or_default();
                e.stack = e.stack.or(s.stack);
                e.sampled += s.period_ns;
                e.samples += 1;
                raw_sampled = raw_sampled.saturating_add(s.period_ns);
                samples += 1;
            }
            if !seen {
                unseen += 1;
            }
        }
        if scope_ns > 0 {
            let loc = scope_votes
                .iter()
                .max_by_key(|(l, n)| (**n, std::cmp::Reverse(**l)))
                .map_or(fallback, |(l, _)| *l);
            acc.entry((loc, Act::Compile(Compiler::Xla)))
                .or_default()
                .exact += scope_ns;
        }
        // The samples' estimate, at most the time the exact intervals leave.
        let scale = |v: u64| -> u64 {
            if raw_sampled <= rest_ns {
                v
            } else {
                (v as u128 * rest_ns as u128 / raw_sampled as u128) as u64
            }
        };
        let mut rows: Vec<Row> = acc
            .into_iter()
            .map(|(k, a)| {
                let s = scale(a.sampled);
                (k, a.exact + s, a.exact, a.samples, a.stack)
            })
            .filter(|r| r.1 > 0)
            .collect();
        rows.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        finish(
            cx,
            Parts {
                rows,
                threads,
                gaps: gaps.len() as u64,
                gap_ns,
                sampled: scale(raw_sampled),
                samples,
                unseen,
            },
        )
    }

    /// The sample of a round that counts: the launching thread's when it has a stack or is in a
    /// CUDA call, else the driving thread's with a stack, else the launching thread's.
    fn pick(&self, m: &Model, round: &[(u64, usize, u32)]) -> Option<u32> {
        let telling = |si: u32| {
            let s = m.hsample(si as usize);
            s.stack.is_some() || s.state == HostState::Cuda
        };
        let first = round.iter().find(|r| r.1 == 0).map(|r| r.2);
        if let Some(si) = first.filter(|&si| telling(si)) {
            return Some(si);
        }
        let driver = round
            .iter()
            .find(|r| r.1 > 0 && m.hsample(r.2 as usize).stack.is_some())
            .map(|r| r.2);
        driver.or(first).or(round.first().map(|r| r.2))
    }
}

/// Time of one (line, activity).
#[derive(Default)]
struct Acc {
    exact: u64,
    sampled: u64,
    samples: u64,
    /// A stack at this line (the first seen), for its caller.
    stack: Option<StackIx>,
}

/// ((line, activity), time, exact time, samples, a stack there).
type Row = ((Option<LocIx>, Act), u64, u64, u64, Option<StackIx>);

/// What [`finish`] makes the answer of.
struct Parts {
    /// The rows, most time first.
    rows: Vec<Row>,
    threads: Vec<u64>,
    gaps: u64,
    gap_ns: u64,
    sampled: u64,
    samples: u64,
    unseen: u64,
}

fn finish(cx: &Ctx, p: Parts) -> Join {
    let m = cx.m;
    let gap_ns = p.gap_ns;
    let line = |r: &Row| HostLine {
        location: r.0 .0.map(|l| cx.loc(l).clone()),
        doing: r.0 .1.doing(),
        what: r.0 .1.what(m),
        ns: r.1,
        share: share(r.1, gap_ns),
        exact_ns: r.2,
        samples: r.3,
        caller: r
            .4
            .filter(|_| r.0 .0.is_some())
            .and_then(|st| crate::userframe::user_caller(m, st, &cx.filter)),
    };
    let exact_ns: u64 = p.rows.iter().map(|r| r.2).sum();
    let compile_ns: u64 = p
        .rows
        .iter()
        .filter(|r| matches!(r.0 .1, Act::Compile(_)))
        .map(|r| r.1)
        .sum();
    let mut by_doing: HashMap<Doing, u64> = HashMap::new();
    for r in &p.rows {
        *by_doing.entry(r.0 .1.doing()).or_default() += r.1;
    }
    let mut states: Vec<DoingTime> = by_doing
        .into_iter()
        .map(|(doing, ns)| DoingTime {
            doing,
            ns,
            share: share(ns, gap_ns),
        })
        .collect();
    states.sort_by(|a, b| b.ns.cmp(&a.ns).then(a.doing.cmp(&b.doing)));
    // The line holding the most time (all its activities), when it holds enough.
    let mut by_loc: HashMap<LocIx, u64> = HashMap::new();
    for r in &p.rows {
        if let Some(l) = r.0 .0 {
            *by_loc.entry(l).or_default() += r.1;
        }
    }
    let mut locs: Vec<(LocIx, u64)> = by_loc.iter().map(|(l, ns)| (*l, *ns)).collect();
    locs.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let enough = |ns: u64, pct: u64| ns as u128 * 100 >= gap_ns as u128 * pct as u128;
    let top = locs
        .first()
        .filter(|(_, ns)| enough(*ns, RELOCATE_PCT))
        .map(|(l, _)| *l);
    let main_act = |l: LocIx| {
        p.rows
            .iter()
            .find(|r| r.0 .0 == Some(l))
            .map(|r| phrase(r.0 .1, m))
            .unwrap_or_default()
    };
    let pair = match locs.as_slice() {
        [a, b, ..]
            if top.is_none() && enough(b.1, PAIR_MIN_PCT) && enough(a.1 + b.1, RELOCATE_PCT) =>
        {
            Some([
                (a.0, main_act(a.0), share(a.1, gap_ns)),
                (b.0, main_act(b.0), share(b.1, gap_ns)),
            ])
        }
        _ => None,
    };
    let line_at = top.and_then(|l| {
        let r = p.rows.iter().find(|r| r.0 .0 == Some(l))?;
        let act = r.0 .1;
        Some(HostTop {
            loc: l,
            share: share(by_loc[&l], gap_ns),
            phrase: phrase(act, m),
            doing: act.doing(),
            call: match act {
                Act::Call(n) => Some(m.str(StrId(n)).to_string()),
                _ => None,
            },
            compiler: match act {
                Act::Compile(c) => Some(c),
                _ => None,
            },
        })
    });
    // Compilation's main kind, when it holds enough.
    let compiling = (compile_ns as u128 * 100 >= gap_ns as u128 * RELOCATE_PCT as u128)
        .then(|| {
            p.rows.iter().find_map(|r| match r.0 .1 {
                Act::Compile(c) => Some(c),
                _ => None,
            })
        })
        .flatten();
    let overhead = overhead(cx, &p.rows, gap_ns, &line);
    let activity = HostActivity {
        threads: p.threads,
        gaps: p.gaps,
        gap_ns,
        exact_ns,
        sampled_ns: p.sampled,
        samples: p.samples,
        unseen_gaps: p.unseen,
        compile_ns,
        lines: p.rows.iter().take(MAX_LINES).map(line).collect(),
        states,
        overhead,
    };
    Join {
        activity,
        line: line_at,
        compiling,
        pair,
        by_loc: locs,
    }
}

/// Sampled CPU and lock time spread over many lines: the overhead summary.
fn overhead(
    cx: &Ctx,
    rows: &[Row],
    gap_ns: u64,
    line: &dyn Fn(&Row) -> HostLine,
) -> Option<Overhead> {
    let cpu: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r.0 .0.is_some() && matches!(r.0 .1, Act::State(Doing::Cpu) | Act::State(Doing::Lock))
        })
        .collect();
    let total: u64 = cpu.iter().map(|r| r.1).sum();
    let mut per_loc: HashMap<LocIx, u64> = HashMap::new();
    for r in &cpu {
        if let Some(l) = r.0 .0 {
            *per_loc.entry(l).or_default() += r.1;
        }
    }
    let top = per_loc.values().copied().max().unwrap_or(0);
    if per_loc.len() < OVERHEAD_MIN_LINES || top.saturating_mul(2) >= total || total == 0 {
        return None;
    }
    // The user's call it sits under: the user part of the lines (library lines dropped).
    let mut under: HashMap<SourceLoc, u64> = HashMap::new();
    for (&l, &ns) in &per_loc {
        let u = SourceLoc {
            library: None,
            ..cx.loc(l).clone()
        };
        *under.entry(u).or_default() += ns;
    }
    let under = under
        .into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .filter(|(_, ns)| ns.saturating_mul(2) >= total)
        .map(|(u, _)| u)
        .filter(|u| !u.is_unattributed());
    Some(Overhead {
        ns: total,
        share: share(total, gap_ns),
        lines: per_loc.len() as u64,
        under,
        top: cpu.iter().take(OVERHEAD_TOP).map(|r| line(r)).collect(),
    })
}

/// An activity as prose after "was": `in cudaFree`, `blocked in StreamSynchronize`,
/// `compiling (XLA)`, `on CPU`.
fn phrase(a: Act, m: &Model) -> String {
    match a {
        Act::Call(_) => format!("in {}", a.what(m)),
        Act::Sync(_) => format!("blocked in {}", a.what(m)),
        _ => a.what(m),
    }
}

/// A host line as prose: `91% in cudaFree @ free_loop.cu:17`.
fn line_text(l: &HostLine) -> String {
    l.text()
}

impl HostLine {
    /// The line as prose: `91% in cudaFree @ free_loop.cu:17`, with its function and caller
    /// when it has one (`… @ train.py:38 in busy_host_work() (called at train.py:71)`).
    pub fn text(&self) -> String {
        let l = self;
        let what = match l.doing {
            Doing::Call => format!("in {}", l.what),
            Doing::Sync => format!("blocked in {}", l.what),
            _ => l.what.clone(),
        };
        let at = match &l.location {
            Some(loc) if !loc.is_unattributed() => {
                let caller = l
                    .caller
                    .as_ref()
                    .map(|c| format!(" (called at {})", c.user_short()))
                    .unwrap_or_default();
                let func = loc
                    .function
                    .as_deref()
                    .filter(|_| l.caller.is_some())
                    .map(|f| format!(" in {}()", crate::text::short_function(f)))
                    .unwrap_or_default();
                format!(" @ {}{func}{caller}", loc.short())
            }
            Some(_) => " (no line of the program)".to_string(),
            None if matches!(l.doing, Doing::Call | Doing::Sync) => String::new(),
            None => " (no stack: a thread that ran no Python)".to_string(),
        };
        format!("{:.0}% {what}{at}", l.share * 100.0)
    }
}

impl HostActivity {
    /// The join as a sentence for a finding's detail: `during 298 gaps (27.00ms) the launching
    /// thread was 91% in cudaFree @ free_loop.cu:17, …`; `who` names the thread.
    pub(crate) fn sentence(&self, who: &str) -> String {
        let mut s = format!(
            "during {} gaps ({}) {who} was ",
            self.gaps,
            fmt_duration(self.gap_ns)
        );
        let shown: Vec<String> = self
            .lines
            .iter()
            .filter(|l| l.share >= 0.05)
            .take(3)
            .map(line_text)
            .collect();
        if shown.is_empty() {
            s += "not seen doing anything for long (no call or sample covers 5% of the gaps)";
        } else {
            s += &shown.join(", ");
        }
        let comp_shown = self
            .lines
            .iter()
            .filter(|l| l.share >= 0.05)
            .take(3)
            .any(|l| l.doing == Doing::Compile);
        if self.compile_ns > 0 && !comp_shown && share(self.compile_ns, self.gap_ns) >= 0.05 {
            s += &format!(
                "; compilation {:.0}%",
                share(self.compile_ns, self.gap_ns) * 100.0
            );
        }
        if let Some(o) = &self.overhead {
            s += &format!("; {}", o.text());
        }
        let how = self.basis();
        if !how.is_empty() {
            s += &format!(" ({how})");
        }
        s
    }

    /// How the breakdown was measured: `2% timed exactly, 98% estimated from 54 host samples,
    /// 3 gaps with neither` (empty when nothing covers the gaps).
    pub fn basis(&self) -> String {
        let mut how = Vec::new();
        if self.exact_ns > 0 {
            how.push(format!(
                "{:.0}% timed exactly",
                share(self.exact_ns, self.gap_ns) * 100.0
            ));
        }
        if self.samples > 0 {
            how.push(format!(
                "{:.0}% estimated from {} host sample{}",
                share(self.sampled_ns, self.gap_ns) * 100.0,
                self.samples,
                if self.samples == 1 { "" } else { "s" }
            ));
        }
        if self.unseen_gaps > 0 {
            how.push(format!(
                "{} gap{} with neither",
                self.unseen_gaps,
                if self.unseen_gaps == 1 { "" } else { "s" }
            ));
        }
        how.join(", ")
    }

    /// The breakdown as short lines for a text report: the lines holding at least 5% of the
    /// gaps' time (at most 5), compilation when no line shows it, and the framework overhead.
    pub fn breakdown(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .lines
            .iter()
            .filter(|l| l.share >= 0.05)
            .take(5)
            .map(HostLine::text)
            .collect();
        let comp_shown = self
            .lines
            .iter()
            .filter(|l| l.share >= 0.05)
            .take(5)
            .any(|l| l.doing == Doing::Compile);
        if self.compile_ns > 0 && !comp_shown && share(self.compile_ns, self.gap_ns) >= 0.05 {
            out.push(format!(
                "{:.0}% compiling",
                share(self.compile_ns, self.gap_ns) * 100.0
            ));
        }
        if let Some(o) = &self.overhead {
            out.push(o.text());
        }
        out
    }
}

impl Overhead {
    /// `framework overhead 74% spread over 9 lines under gen.py:40 (cache_utils.py:146 23%, …)`.
    pub fn text(&self) -> String {
        let o = self;
        let under = o
            .under
            .as_ref()
            .map(|u| format!(" under {}", u.user_short()))
            .unwrap_or_default();
        let top: Vec<String> = o
            .top
            .iter()
            .take(3)
            .map(|l| {
                let at = l.location.as_ref().map_or_else(
                    || "?".to_string(),
                    |loc| match &loc.library {
                        Some(lib) => lib.user_short(),
                        None => loc.user_short(),
                    },
                );
                format!("{at} {:.0}%", l.share * 100.0)
            })
            .collect();
        format!(
            "framework overhead {:.0}% spread over {} lines{under} ({})",
            o.share * 100.0,
            o.lines,
            top.join(", ")
        )
    }
}

/// The parts of `[s, e)` that `covered` (sorted, disjoint) does not cover.
fn uncovered(covered: &[(u64, u64)], s: u64, e: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    if e <= s {
        return out;
    }
    let mut at = s;
    let i = covered.partition_point(|p| p.1 <= s);
    for &(a, b) in covered[i..].iter().take_while(|p| p.0 < e) {
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < e {
        out.push((at, e));
    }
    out
}

/// Add `[s, e)` (disjoint from what is there) to sorted, disjoint intervals.
fn insert(covered: &mut Vec<(u64, u64)>, s: u64, e: u64) {
    let i = covered.partition_point(|p| p.0 < s);
    covered.insert(i, (s, e));
}

/// Whether `t` lies in one of the sorted, disjoint intervals.
fn inside(iv: &[(u64, u64)], t: u64) -> bool {
    let i = iv.partition_point(|p| p.1 <= t);
    iv.get(i).is_some_and(|p| p.0 <= t)
}

#[cfg(test)]
pub(crate) mod tests;
