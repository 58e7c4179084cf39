//! The join of gaps with the host: exact intervals, samples, rounds of two threads, boundaries,
//! compilation, overhead.

use super::*;
use crate::intervals::DeviceBusy;
use crate::Config;
use gpufl_trace::*;

/// A session built record by record (strings, frames and stacks interned as the writer does).
/// Other shared modules' tests build theirs with it.
pub(crate) struct S {
    pub(crate) recs: Vec<Record>,
    strs: Vec<String>,
    frames: u32,
    stacks: u32,
}

impl S {
    pub(crate) fn new() -> S {
        let header = Header {
            session_id: "host-100-20261127T000000Z".into(),
            pid: 100,
            ..Header::default()
        };
        S {
            recs: vec![Record::Header(Box::new(header))],
            strs: Vec::new(),
            frames: 0,
            stacks: 0,
        }
    }

    pub(crate) fn s(&mut self, s: &str) -> StrId {
        if let Some(i) = self.strs.iter().position(|x| x == s) {
            return StrId(i as u32);
        }
        self.strs.push(s.into());
        let id = StrId(self.strs.len() as u32 - 1);
        self.recs.push(Record::Str(StrRecord { id, s: s.into() }));
        id
    }

    /// A stack of Python frames (innermost first): (func, file, line).
    pub(crate) fn py(&mut self, frames: &[(&str, &str, u32)], via: Option<u64>) -> StackId {
        let mut ids = Vec::new();
        for &(func, file, line) in frames {
            let f = Frame {
                id: FrameId(self.frames),
                kind: FrameKind::Python,
                module: None,
                offset: None,
                func: Some(self.s(func)),
                file: Some(self.s(file)),
                line: Some(line),
                inlined: false,
                text: None,
            };
            self.frames += 1;
            self.recs.push(Record::Frame(f));
            ids.push(FrameId(self.frames - 1));
        }
        let id = StackId(self.stacks);
        self.stacks += 1;
        self.recs.push(Record::Stack(Stack {
            id,
            frames: ids,
            via_tid: via,
        }));
        id
    }

    pub(crate) fn kernel(&mut self, start: u64, end: u64) {
        let name = self.s("k");
        self.recs.push(Record::Kernel(Kernel {
            name,
            start,
            end,
            ctx: 1,
            stream: 7,
            corr: 0,
            ..Kernel::default()
        }));
    }

    /// A stream synchronization ending at `end`, with its stack.
    pub(crate) fn sync(&mut self, start: u64, end: u64, stack: StackId) {
        self.recs.push(Record::Sync(Sync {
            kind: SyncKind::StreamSynchronize,
            start,
            end,
            ctx: 1,
            stream: Some(7),
            event: None,
            corr: 0,
            tid: Some(1),
            stack: Some(stack),
        }));
    }

    fn hostcall(&mut self, name: &str, tid: u64, start: u64, end: u64, stack: Option<StackId>) {
        let name = self.s(name);
        self.recs.push(Record::Hostcall(Hostcall {
            name,
            start,
            end,
            tid,
            stack,
            ..Hostcall::default()
        }));
    }

    fn sample(&mut self, tid: u64, ts: u64, state: HostState, period: u64, stack: Option<StackId>) {
        self.recs.push(Record::Hsample(Hsample {
            ts,
            tid,
            state,
            period_ns: period,
            stack,
            call: None,
        }));
    }

    /// The join of `gaps` over this session.
    fn join(&self, gaps: &[HostGap]) -> (HostActivity, Option<String>, Option<Compiler>) {
        let m = Model::load(self.recs.clone());
        let busy = DeviceBusy::new(&m);
        let cx = Ctx::new(&m, &Config::default(), &busy, 1_000_000);
        let locator = Locator::new(&cx);
        let j = cx.host().explain(&cx, &locator, gaps, None);
        let line = j
            .line
            .map(|t| format!("{} {}", cx.loc(t.loc).short(), t.phrase));
        (j.activity, line, j.compiling)
    }
}

fn gap(start: u64, end: u64, tid: u64) -> HostGap {
    HostGap {
        start,
        end,
        tid: Some(tid),
    }
}

#[test]
fn calls_are_exact_and_samples_fill_the_rest() {
    let mut s = S::new();
    s.kernel(0, 1_000);
    s.kernel(2_000, 3_000);
    let free = s.py(&[("main", "/app/free_loop.py", 17)], None);
    let prep = s.py(&[("prep", "/app/free_loop.py", 9)], None);
    // cudaFree from before the gap to 1 400: 400 of the gap exactly.
    s.hostcall("cudaFree", 1, 900, 1_400, Some(free));
    // One sample in the rest (600 ns left), standing for 500.
    s.sample(1, 1_500, HostState::Cpu, 500, Some(prep));
    // A sample inside the call counts nothing (the call is timed exactly).
    s.sample(1, 1_200, HostState::Cuda, 500, Some(free));
    // Another thread's sample is not the launching thread's.
    s.sample(7, 1_600, HostState::Cpu, 500, Some(prep));
    let (a, line, _) = s.join(&[gap(1_000, 2_000, 1)]);
    assert_eq!(
        (a.gaps, a.gap_ns, a.exact_ns, a.sampled_ns),
        (1, 1_000, 400, 500)
    );
    assert_eq!((a.samples, a.unseen_gaps), (1, 0));
    assert_eq!(a.threads, vec![1, 100], "the main thread drives");
    let l: Vec<(String, u64, String)> = a
        .lines
        .iter()
        .map(|l| {
            let at = l.location.as_ref().map(|x| x.short()).unwrap_or_default();
            (l.what.clone(), l.ns, at)
        })
        .collect();
    assert_eq!(
        l,
        vec![
            ("on CPU".into(), 500, "free_loop.py:9".into()),
            ("cudaFree".into(), 400, "free_loop.py:17".into()),
        ]
    );
    assert_eq!(
        line,
        Some("free_loop.py:9 on CPU".into()),
        "500 of 1000: 50 %"
    );
    let text = a.sentence("the launching thread");
    assert!(
        text.starts_with("during 1 gaps (1.0µs) the launching thread was 50% on CPU @ free_loop.py:9, 40% in cudaFree @ free_loop.py:17"),
        "{text}"
    );
    assert!(
        text.contains("40% timed exactly, 50% estimated from 1 host sample"),
        "{text}"
    );
}

#[test]
fn a_gap_without_samples_or_calls_is_unseen() {
    let mut s = S::new();
    s.kernel(0, 1_000);
    s.kernel(5_000, 6_000);
    let st = s.py(&[("main", "/app/a.py", 3)], None);
    s.sample(1, 4_000, HostState::Cpu, 1_000, Some(st));
    let (a, line, _) = s.join(&[gap(1_000, 2_000, 1), gap(3_000, 5_000, 1)]);
    assert_eq!(
        (a.gaps, a.gap_ns, a.unseen_gaps, a.samples),
        (2, 3_000, 1, 1)
    );
    assert_eq!(a.sampled_ns, 1_000);
    assert_eq!(line, None, "1 000 of 3 000 is under half");
    assert!(a
        .sentence("the launching thread")
        .contains("1 gap with neither"));
}

#[test]
fn two_threads_sampled_in_one_round_count_once() {
    let mut s = S::new();
    s.kernel(0, 1_000);
    s.kernel(11_000, 12_000);
    // Thread 2 launches (no Python: its stacks carry thread 1's frames); thread 1 drives it.
    let via = s.py(&[("step", "/app/train.py", 40)], Some(1));
    s.hostcall("cudaMalloc", 2, 10_500, 11_000, Some(via));
    let main = s.py(&[("step", "/app/train.py", 33)], None);
    for k in 0..5u64 {
        let ts = 1_000 + k * 2_000;
        // Both threads in each round: the launching thread without a stack, the driving one with.
        s.sample(2, ts, HostState::Cpu, 2_000, None);
        s.sample(1, ts, HostState::Cpu, 2_000, Some(main));
    }
    let (a, line, _) = s.join(&[gap(1_000, 11_000, 2)]);
    assert_eq!(a.threads, vec![2, 1]);
    assert_eq!(a.samples, 5, "one per round");
    // 10 000 of gap: 500 exact, 5 × 2 000 sampled scaled to the 9 500 left.
    assert_eq!((a.exact_ns, a.sampled_ns), (500, 9_500));
    assert_eq!(a.lines[0].location.as_ref().unwrap().short(), "train.py:33");
    assert_eq!(a.lines[0].ns, 9_500);
    assert_eq!(line, Some("train.py:33 on CPU".into()));
    // The launching thread's own sample wins when it says something (a CUDA call).
    let mut s2 = S::new();
    s2.kernel(0, 1_000);
    s2.kernel(3_000, 4_000);
    let m2 = s2.py(&[("step", "/app/train.py", 33)], None);
    let cuda_free = s2.s("cudaFree");
    s2.recs.push(Record::Hsample(Hsample {
        ts: 2_000,
        tid: 2,
        state: HostState::Cuda,
        period_ns: 1_000,
        stack: None,
        call: Some(cuda_free),
    }));
    s2.sample(1, 2_000, HostState::Cpu, 1_000, Some(m2));
    let (a, _, _) = s2.join(&[gap(1_000, 3_000, 2)]);
    assert_eq!((a.samples, a.lines.len()), (1, 1));
    assert_eq!(
        (a.lines[0].what.as_str(), a.lines[0].doing),
        ("cudaFree", Doing::Call)
    );
}

#[test]
fn a_sample_on_the_gap_start_counts_and_one_on_its_end_does_not() {
    let mut s = S::new();
    s.kernel(0, 1_000);
    s.kernel(2_000, 3_000);
    let st = s.py(&[("main", "/app/a.py", 3)], None);
    s.sample(1, 1_000, HostState::Cpu, 300, Some(st));
    s.sample(1, 2_000, HostState::Sleep, 300, Some(st));
    let (a, _, _) = s.join(&[gap(1_000, 2_000, 1)]);
    assert_eq!(a.samples, 1);
    assert_eq!(a.lines[0].doing, Doing::Cpu);
    // A call that ends where the gap starts covers nothing.
    let mut s = S::new();
    s.kernel(0, 1_000);
    s.hostcall("cudaFree", 1, 500, 1_000, None);
    let (a, _, _) = s.join(&[gap(1_000, 2_000, 1)]);
    assert_eq!((a.exact_ns, a.unseen_gaps), (0, 1));
}

#[test]
fn overlapping_calls_of_two_threads_count_once_the_launching_threads_first() {
    let mut s = S::new();
    s.kernel(0, 1_000);
    let a_st = s.py(&[("f", "/app/a.py", 1)], None);
    let b_st = s.py(&[("g", "/app/a.py", 2)], None);
    s.hostcall("cudaFree", 100, 1_000, 1_600, Some(b_st));
    s.hostcall("cudaMalloc", 2, 1_400, 1_800, Some(a_st));
    let (a, _, _) = s.join(&[gap(1_000, 2_000, 2)]);
    assert_eq!(a.exact_ns, 800);
    let got: Vec<(&str, u64)> = a.lines.iter().map(|l| (l.what.as_str(), l.ns)).collect();
    assert_eq!(got, vec![("cudaMalloc", 400), ("cudaFree", 400)]);
}

#[test]
fn compilation_is_named_at_the_calling_line() {
    let mut s = S::new();
    s.kernel(0, 1_000);
    let comp = s.py(
        &[
            (
                "backend_compile",
                "/venv/lib/python3.12/site-packages/jax/_src/compiler.py",
                300,
            ),
            (
                "cache_miss",
                "/venv/lib/python3.12/site-packages/jax/_src/pjit.py",
                200,
            ),
            ("main", "/app/jax_recompile.py", 58),
        ],
        None,
    );
    for k in 0..8u64 {
        s.sample(1, 1_000 + k * 1_000, HostState::Cpu, 1_000, Some(comp));
    }
    let (a, line, compiling) = s.join(&[gap(1_000, 10_000, 1)]);
    assert_eq!(compiling, Some(Compiler::Xla));
    assert_eq!(a.compile_ns, 8_000);
    assert_eq!(line, Some("jax_recompile.py:58 compiling (XLA)".into()));
    // An XlaCompile scope covers its time exactly; the samples in it name the line.
    let mut s = S::new();
    s.kernel(0, 1_000);
    let user = s.py(&[("main", "/app/jax_recompile.py", 58)], None);
    let name = s.s("XlaCompile:#module=jit_train_step#");
    s.recs.push(Record::Scope(Scope {
        tid: 5,
        ts: 2_000,
        name,
        end: false,
        ..Scope::default()
    }));
    s.recs.push(Record::Scope(Scope {
        tid: 5,
        ts: 9_000,
        name,
        end: true,
        ..Scope::default()
    }));
    s.sample(1, 3_000, HostState::Lock, 1_000, Some(user));
    let (a, line, compiling) = s.join(&[gap(1_000, 10_000, 1)]);
    assert_eq!((a.compile_ns, a.exact_ns, a.samples), (7_000, 7_000, 0));
    assert_eq!(compiling, Some(Compiler::Xla));
    assert_eq!(line, Some("jax_recompile.py:58 compiling (XLA)".into()));
    // Module loads are compilation too.
    let mut s = S::new();
    s.kernel(0, 1_000);
    s.hostcall("cuModuleLoadData", 1, 1_000, 2_000, None);
    let (a, _, compiling) = s.join(&[gap(1_000, 2_000, 1)]);
    assert_eq!(
        (a.compile_ns, compiling),
        (1_000, Some(Compiler::ModuleLoad))
    );
}

#[test]
fn cpu_time_spread_over_library_lines_is_framework_overhead() {
    let mut s = S::new();
    s.kernel(0, 1_000);
    let lib = "/venv/lib/python3.12/site-packages/transformers/generation/utils.py";
    let mut ts = 1_000u64;
    for (line, n) in [(2500u32, 4u64), (2510, 3), (2520, 2), (2530, 1)] {
        let st = s.py(
            &[("_sample", lib, line), ("main", "/app/hf_generate.py", 30)],
            None,
        );
        for _ in 0..n {
            s.sample(1, ts, HostState::Cpu, 1_000, Some(st));
            ts += 1_000;
        }
    }
    let (a, line, _) = s.join(&[gap(1_000, 11_000, 1)]);
    assert_eq!(line, None, "no line holds half");
    let o = a.overhead.as_ref().expect("overhead");
    assert_eq!((o.ns, o.lines), (10_000, 4));
    assert_eq!(
        o.under.as_ref().map(|u| u.user_short()),
        Some("hf_generate.py:30".into())
    );
    assert_eq!(
        o.top[0].location.as_ref().unwrap().short(),
        "utils.py:2500 ← hf_generate.py:30"
    );
    let text = a.sentence("the launching thread");
    assert!(
        text.contains("framework overhead 100% spread over 4 lines under hf_generate.py:30 (utils.py:2500 40%, utils.py:2510 30%, utils.py:2520 20%)"),
        "{text}"
    );
}

#[test]
fn a_host_line_in_a_helper_names_its_caller() {
    let mut s = S::new();
    s.kernel(0, 1_000);
    let st = s.py(
        &[
            ("busy_host_work", "/app/ddp_straggler.py", 38),
            ("main", "/app/ddp_straggler.py", 71),
            ("<module>", "/app/ddp_straggler.py", 120),
        ],
        None,
    );
    let top = s.py(
        &[
            ("main", "/app/ddp_straggler.py", 73),
            ("<module>", "/app/ddp_straggler.py", 120),
        ],
        None,
    );
    s.sample(1, 1_000, HostState::Cpu, 600, Some(st));
    s.sample(1, 1_700, HostState::Cpu, 300, Some(top));
    let (a, _, _) = s.join(&[gap(1_000, 2_000, 1)]);
    assert_eq!(
        a.lines[0].caller.as_ref().map(|c| c.user_short()),
        Some("ddp_straggler.py:71".into())
    );
    assert_eq!(
        a.lines[1].caller, None,
        "main() called from the module level"
    );
    assert!(
        a.sentence("the host").contains(
            "60% on CPU @ ddp_straggler.py:38 in busy_host_work() (called at ddp_straggler.py:71), 30% on CPU @ ddp_straggler.py:73"
        ),
        "{}",
        a.sentence("the host")
    );
}

#[test]
fn frames_of_compilers() {
    let f = |file: &str, func: &str| frame_compiler(file, func);
    assert_eq!(
        f(
            "/x/site-packages/torch/_dynamo/convert_frame.py",
            "_compile"
        ),
        Some(Compiler::TorchCompile)
    );
    assert_eq!(
        f("/x/site-packages/torch/_dynamo/eval_frame.py", "_fn"),
        None
    );
    assert_eq!(
        f("/x/site-packages/jax/_src/pjit.py", "cache_miss"),
        Some(Compiler::Xla)
    );
    assert_eq!(
        f("/x/site-packages/jax/_src/pjit.py", "_pjit_call_impl"),
        None
    );
    assert_eq!(
        f("/x/site-packages/triton/runtime/autotuner.py", "_bench"),
        Some(Compiler::Triton)
    );
    assert_eq!(
        f("/x/site-packages/triton/runtime/autotuner.py", "run"),
        None
    );
    assert!(is_module_load("cuModuleLoadData") && is_module_load("cuLibraryLoadData"));
    assert!(!is_module_load("cudaFree"));
}

#[test]
fn interval_helpers() {
    let c = vec![(10, 20), (30, 40)];
    assert_eq!(uncovered(&c, 0, 50), vec![(0, 10), (20, 30), (40, 50)]);
    assert_eq!(uncovered(&c, 12, 18), vec![]);
    assert_eq!(uncovered(&c, 15, 35), vec![(20, 30)]);
    assert!(inside(&c, 10) && !inside(&c, 20) && !inside(&c, 25));
    let mut c2 = c.clone();
    insert(&mut c2, 20, 30);
    assert_eq!(c2, vec![(10, 20), (20, 30), (30, 40)]);
}
