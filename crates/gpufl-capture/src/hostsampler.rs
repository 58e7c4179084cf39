//! The host sampler (`hsample` records): what the threads that issue CUDA work, and the Python
//! threads that drive them, are doing — on a CPU, waiting on a lock (the GIL included), in a CUDA
//! call, sleeping or in I/O, parked in an idle wait — and where.
//!
//! One thread (`gpufl-hostsampler`), started with the recorder (always-on included), every
//! period (`GPUFL_HOST_SAMPLES` per second, default [`DEFAULT_HOST_SAMPLES_HZ`]; 0: off) samples:
//! - every thread state of the interpreter with Python frames, its stack read with the
//!   cross-thread reader of `pyframes/xthread.rs` ([`crate::pyframes::xthread::sample_threads`]:
//!   fault-tolerant copies of this process's memory only; no GIL taken, no interpreter code run,
//!   no signal sent), its OS thread id from the thread state's `native_thread_id`;
//! - every thread of the call-marker registry ([`crate::callmark`]: the threads that made a CUDA
//!   call) without Python, with no stack (native frames are not read: walking another thread's
//!   native stack without stopping it is not safe enough here).
//!
//! **State.** `cuda` when the thread's call marker says it is inside a CUDA call (the call's name
//! with it); else from `/proc/self/task/TID/syscall` (one `pread` of a file kept open per
//! thread; `…/stat` where it cannot be opened): `running` → `cpu`; blocked → `idle` when its
//! innermost Python frame is in an idle wait of the standard library (`threading`, `queue`,
//! `selectors`, … — written with its stack: a main thread parked in the DataLoader's `queue.get()`
//! explains a gap as well as a busy one), else `lock` in `futex` (a lock, a condition variable,
//! the GIL), else `sleep`. A thread still parked in the same idle wait as at the last round (its
//! stack proven unchanged) is not read again.
//!
//! **Cost.** The sampler measures its own CPU time (`CLOCK_THREAD_CPUTIME_ID`) over windows of
//! [`WINDOW_NS`]: above its budget (`GPUFL_HOST_SAMPLE_BUDGET`, percent of one core, default 1)
//! it halves its rate; under half the budget it doubles it again, up to the rate asked for
//! ([`RateControl`]). Each sample's `period_ns` is the period in force when it was taken. Samples
//! go to the writer on a bounded queue (full: counted as dropped); the writer interns their
//! stacks and writes the records. The session's closing notice gives the sampler's figures.
//!
//! While the program has paused recording (`gpufl_pause`) the sampler takes no samples.
//!
//! **Fork.** The sampler thread does not exist in a forked child; its handle belongs to the
//! parent's writer, and a handle asked to stop in another process returns at once.

use crate::callmark;
use crate::pyframes::{self, PyFrameRaw};
use crate::stack::PY_TAG;
use crossbeam_queue::ArrayQueue;
use gpufl_trace::HostState;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use crate::options::DEFAULT_HOST_SAMPLES_HZ;

/// Python frames kept per sample.
pub const MAX_FRAMES: usize = pyframes::xthread::MAX_FRAMES;
/// Capacity of the queue between the sampler and the writer.
const QUEUE_CAPACITY: usize = 4096;
/// The window over which the sampler's CPU share is measured, ns.
pub const WINDOW_NS: u64 = 1_000_000_000;
/// Longest period the rate control goes to, ns (0.1 sample a second).
pub const MAX_PERIOD_NS: u64 = 10_000_000_000;
/// A thread not seen for this many rounds has its /proc files closed.
const FORGET_ROUNDS: u64 = 100;
/// Distinct threads counted for the closing notice, at most.
const THREADS_COUNTED: usize = 1 << 16;
/// Longest wait for the sampler thread at shutdown.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// One sample of one thread.
#[derive(Clone, Copy)]
pub struct HostSample {
    /// Trace-clock time of the round.
    pub ts: u64,
    pub tid: u64,
    pub state: HostState,
    /// The period in force, ns: the host time the sample stands for.
    pub period_ns: u64,
    /// The CUDA call the thread was inside (state `cuda`): CUPTI domain and callback id.
    pub call: Option<(u32, u32)>,
    pub len: u8,
    /// Innermost first: `PY_TAG | python frame id` (the stack's entries, as a sample's).
    pub frames: [u64; MAX_FRAMES],
}

impl HostSample {
    fn new(ts: u64, tid: u64, state: HostState, period_ns: u64) -> HostSample {
        HostSample {
            ts,
            tid,
            state,
            period_ns,
            call: None,
            len: 0,
            frames: [0; MAX_FRAMES],
        }
    }

    /// The stack's entries.
    pub fn entries(&self) -> &[u64] {
        &self.frames[..usize::from(self.len).min(MAX_FRAMES)]
    }
}

/// The queue of samples, and those lost because it was full (the module's one static).
struct Queue {
    samples: OnceLock<ArrayQueue<HostSample>>,
    dropped: AtomicU64,
}

static QUEUE: Queue = Queue {
    samples: OnceLock::new(),
    dropped: AtomicU64::new(0),
};

/// The samples waiting for the writer.
pub fn queue() -> &'static ArrayQueue<HostSample> {
    QUEUE
        .samples
        .get_or_init(|| ArrayQueue::new(QUEUE_CAPACITY))
}

/// Samples lost since the last call (the queue was full).
pub fn take_dropped() -> u64 {
    QUEUE.dropped.swap(0, Ordering::Relaxed)
}

fn push(s: HostSample) -> bool {
    let ok = queue().push(s).is_ok();
    if !ok {
        QUEUE.dropped.fetch_add(1, Ordering::Relaxed);
    }
    ok
}

// ---------------------------------------------------------------------------------------------
// A thread's state from /proc
// ---------------------------------------------------------------------------------------------

/// The state letter of a `/proc/…/stat` line: the field after the command name, which is in
/// parentheses and may itself hold spaces and parentheses (so the last `)` ends it).
pub fn stat_state(buf: &[u8]) -> Option<u8> {
    let close = buf.iter().rposition(|&b| b == b')')?;
    buf.get(close + 2)
        .copied()
        .filter(|b| b.is_ascii_alphabetic())
}

/// The system call of a `/proc/…/syscall` line: its number, first; None for `running` (the
/// thread is on a CPU) or anything unreadable.
pub fn syscall_nr(buf: &[u8]) -> Option<i64> {
    let end = buf
        .iter()
        .position(|b| b.is_ascii_whitespace() || *b == 0)
        .unwrap_or(buf.len());
    std::str::from_utf8(&buf[..end]).ok()?.parse().ok()
}

/// `futex` and `futex_waitv`: a thread blocked in one waits on a lock or a condition variable
/// (pthread mutexes and condition variables, CPython's GIL).
pub fn is_futex(nr: i64) -> bool {
    #[cfg(target_arch = "x86_64")]
    const FUTEX: i64 = 202;
    #[cfg(target_arch = "aarch64")]
    const FUTEX: i64 = 98;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    const FUTEX: i64 = libc::SYS_futex as i64;
    const FUTEX_WAITV: i64 = 449;
    nr == FUTEX || nr == FUTEX_WAITV
}

/// A thread's state from its `/proc` state letter and, when it is blocked, its system call
/// (`syscall`: None when unknown).
pub fn proc_state(letter: u8, syscall: Option<i64>) -> HostState {
    match letter {
        b'R' => HostState::Cpu,
        b'S' | b'D' => {
            if syscall.is_some_and(is_futex) {
                HostState::Lock
            } else {
                HostState::Sleep
            }
        }
        _ => HostState::Unknown,
    }
}

/// The state a `/proc/…/syscall` line gives: `running` (on a CPU, or runnable) → `cpu`; a
/// system call number (the thread is blocked in it) → `lock` for `futex`, else `sleep`; -1
/// (blocked outside a system call: a page fault) → `sleep`. None when unreadable.
pub fn syscall_state(buf: &[u8]) -> Option<HostState> {
    if buf.starts_with(b"running") {
        return Some(HostState::Cpu);
    }
    syscall_nr(buf).map(|nr| {
        if is_futex(nr) {
            HostState::Lock
        } else {
            HostState::Sleep
        }
    })
}

/// A sampled thread's open /proc file: its `syscall` (one read gives the state), or, where that
/// cannot be opened, its `stat` (the state letter: no lock / sleep distinction).
struct Task {
    file: File,
    syscall: bool,
    /// The round it was last sampled in, and the state it had then.
    seen: u64,
    last: HostState,
}

fn open_task_file(tid: u64, name: &str) -> std::io::Result<File> {
    // std opens with O_CLOEXEC.
    File::open(format!("/proc/self/task/{tid}/{name}"))
}

/// The thread's state from /proc, its file opened at the first sample and kept (read with
/// `pread`); None when the thread no longer exists.
fn read_proc_state(tasks: &mut HashMap<u64, Task>, tid: u64, round: u64) -> Option<HostState> {
    let task = match tasks.entry(tid) {
        std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
        std::collections::hash_map::Entry::Vacant(v) => {
            let (file, syscall) = match open_task_file(tid, "syscall") {
                Ok(f) => (f, true),
                Err(_) => (open_task_file(tid, "stat").ok()?, false),
            };
            v.insert(Task {
                file,
                syscall,
                seen: round,
                last: HostState::Unknown,
            })
        }
    };
    task.seen = round;
    let mut buf = [0u8; 512];
    let n = match task.file.read_at(&mut buf, 0) {
        Ok(n) if n > 0 => n,
        // ESRCH: the thread has exited (its tid may come back as another thread's).
        _ => {
            tasks.remove(&tid);
            return None;
        }
    };
    let state = if task.syscall {
        syscall_state(&buf[..n]).unwrap_or(HostState::Unknown)
    } else {
        stat_state(&buf[..n]).map_or(HostState::Unknown, |l| proc_state(l, None))
    };
    task.last = state;
    Some(state)
}

/// The state a thread had at its last sample, when sampled in the round before `round`.
fn last_state(tasks: &HashMap<u64, Task>, tid: u64, round: u64) -> Option<HostState> {
    tasks
        .get(&tid)
        .filter(|t| t.seen + 1 == round)
        .map(|t| t.last)
}

/// Note a state decided without reading /proc.
fn note_state(tasks: &mut HashMap<u64, Task>, tid: u64, round: u64, state: HostState) {
    if let Some(t) = tasks.get_mut(&tid) {
        t.seen = round;
        t.last = state;
    }
}

// ---------------------------------------------------------------------------------------------
// Rate control
// ---------------------------------------------------------------------------------------------

/// The sampler's period under its CPU budget: halved rate (doubled period) after a window above
/// the budget, restored step by step after a window under half of it.
#[derive(Debug, Clone)]
pub struct RateControl {
    base_ns: u64,
    period_ns: u64,
    budget_ppm: u64,
    /// Wall and CPU time at the start of the current window, ns.
    start: Option<(u64, u64)>,
    /// Times the period changed, and the longest period used.
    pub changes: u32,
    pub longest_ns: u64,
}

impl RateControl {
    /// `hz` samples a second (≥ 1), within `budget_pct` percent of one core.
    pub fn new(hz: u32, budget_pct: f64) -> RateControl {
        let base_ns = 1_000_000_000 / u64::from(hz.max(1));
        RateControl {
            base_ns,
            period_ns: base_ns,
            budget_ppm: (budget_pct * 10_000.0).max(1.0) as u64,
            start: None,
            changes: 0,
            longest_ns: base_ns,
        }
    }

    /// The period in force, ns.
    pub fn period_ns(&self) -> u64 {
        self.period_ns
    }

    /// After a round: the sampler's wall and CPU time so far (any origin, ns). At the end of each
    /// window of [`WINDOW_NS`] the period may change; true when it did.
    pub fn observe(&mut self, wall_ns: u64, cpu_ns: u64) -> bool {
        let Some((w0, c0)) = self.start else {
            self.start = Some((wall_ns, cpu_ns));
            return false;
        };
        let wall = wall_ns.saturating_sub(w0);
        if wall < WINDOW_NS {
            return false;
        }
        let cpu = cpu_ns.saturating_sub(c0);
        self.start = Some((wall_ns, cpu_ns));
        let share_ppm = (cpu as u128 * 1_000_000 / wall as u128) as u64;
        let next = if share_ppm > self.budget_ppm {
            (self.period_ns * 2).min(MAX_PERIOD_NS)
        } else if share_ppm * 2 < self.budget_ppm {
            (self.period_ns / 2).max(self.base_ns)
        } else {
            self.period_ns
        };
        if next == self.period_ns {
            return false;
        }
        self.period_ns = next;
        self.longest_ns = self.longest_ns.max(next);
        self.changes += 1;
        true
    }
}

// ---------------------------------------------------------------------------------------------
// One round
// ---------------------------------------------------------------------------------------------

/// The sampler's state between rounds (on its own thread).
pub struct Sampler {
    tasks: HashMap<u64, Task>,
    round: u64,
    marks: Vec<(u64, u64)>,
    done: Vec<u64>,
    /// Distinct threads sampled (up to [`THREADS_COUNTED`]).
    threads: HashSet<u64>,
    /// Samples taken.
    pub samples: u64,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::new()
    }
}

impl Sampler {
    pub fn new() -> Sampler {
        Sampler {
            tasks: HashMap::new(),
            round: 0,
            marks: Vec::new(),
            done: Vec::new(),
            threads: HashSet::new(),
            samples: 0,
        }
    }

    /// Distinct threads sampled so far.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// One round at trace time `now`, each sample standing for `period_ns`, the callbacks in
    /// `epoch` ([`crate::sites::epoch`]): every Python thread with frames, then every marked
    /// thread not among them; `emit` gets each sample. Returns how many.
    pub fn round(
        &mut self,
        now: u64,
        period_ns: u64,
        epoch: u32,
        emit: &mut dyn FnMut(HostSample),
    ) -> usize {
        self.round += 1;
        let round = self.round;
        self.marks.clear();
        let marks = &mut self.marks;
        callmark::each(|tid, w| marks.push((tid, w)));
        self.done.clear();
        let (tasks, marks, done) = (&mut self.tasks, &self.marks, &mut self.done);
        let mark_of = |tid: u64| {
            marks
                .iter()
                .find(|m| m.0 == tid)
                .and_then(|m| callmark::unpack(m.1))
                .filter(|m| m.current(epoch))
        };
        let mut n = 0usize;
        let mut id_of =
            |raw: &PyFrameRaw, ident: (u32, usize)| crate::stack::python_frame_id_known(raw, ident);
        let _ = pyframes::xthread::sample_threads(&mut id_of, &mut |t| {
            if done.contains(&t.tid) {
                return;
            }
            done.push(t.tid);
            let mark = mark_of(t.tid);
            // Still parked in the same idle wait: the stack is unchanged since the last round,
            // when the thread was blocked in it (no /proc read).
            let still_idle = mark.is_none()
                && t.idle
                && !t.walked
                && last_state(tasks, t.tid, round) == Some(HostState::Idle);
            let state = match mark {
                Some(_) => HostState::Cuda,
                None if still_idle => {
                    note_state(tasks, t.tid, round, HostState::Idle);
                    HostState::Idle
                }
                None => match read_proc_state(tasks, t.tid, round) {
                    // Blocked in an idle wait of the standard library (a frame in `threading`
                    // that is running, `Event.is_set` in a busy loop, is on a CPU).
                    Some(HostState::Lock | HostState::Sleep) if t.idle => {
                        note_state(tasks, t.tid, round, HostState::Idle);
                        HostState::Idle
                    }
                    Some(s) => s,
                    None => return,
                },
            };
            let mut s = HostSample::new(now, t.tid, state, period_ns);
            s.call = mark.map(|m| (m.domain, m.cbid));
            for &id in t.ids {
                if id != u32::MAX && usize::from(s.len) < MAX_FRAMES {
                    s.frames[usize::from(s.len)] = PY_TAG | u64::from(id);
                    s.len += 1;
                }
            }
            emit(s);
            n += 1;
        });
        for &(tid, w) in marks.iter() {
            if done.contains(&tid) {
                continue;
            }
            done.push(tid);
            let mark = callmark::unpack(w).filter(|m| m.current(epoch));
            let state = match mark {
                Some(_) => HostState::Cuda,
                None => match read_proc_state(tasks, tid, round) {
                    Some(s) => s,
                    None => {
                        // Gone without giving its slot back.
                        callmark::forget(tid);
                        continue;
                    }
                },
            };
            let mut s = HostSample::new(now, tid, state, period_ns);
            s.call = mark.map(|m| (m.domain, m.cbid));
            emit(s);
            n += 1;
        }
        for &tid in done.iter() {
            if self.threads.len() < THREADS_COUNTED {
                self.threads.insert(tid);
            }
        }
        if round.is_multiple_of(FORGET_ROUNDS) {
            self.tasks
                .retain(|_, t| round.saturating_sub(t.seen) < FORGET_ROUNDS);
        }
        self.samples += n as u64;
        n
    }
}

// ---------------------------------------------------------------------------------------------
// The thread
// ---------------------------------------------------------------------------------------------

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// What the sampler thread shares with its handle.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    done: AtomicBool,
    rounds: AtomicU64,
    samples: AtomicU64,
    threads: AtomicU64,
    cpu_ns: AtomicU64,
    wall_ns: AtomicU64,
    changes: AtomicU64,
    longest_ns: AtomicU64,
}

/// The running sampler.
pub struct Handle {
    shared: Arc<Shared>,
    thread: std::thread::Thread,
    hz: u32,
    budget_pct: f64,
    pid: u32,
}

/// Start the sampler: `hz` samples a second per thread (≥ 1) within `budget_pct` percent of one
/// core, timestamps from `clock` (the trace clock); each round's samples go through `emit`
/// (false: lost). Err when the thread cannot be started.
pub fn start_with(
    hz: u32,
    budget_pct: f64,
    clock: impl Fn() -> u64 + Send + 'static,
    mut emit: impl FnMut(HostSample) -> bool + Send + 'static,
) -> Result<Handle, String> {
    let shared = Arc::new(Shared::default());
    let s = shared.clone();
    let mut rate = RateControl::new(hz, budget_pct);
    let thread = std::thread::Builder::new()
        .name("gpufl-hostsamp".into())
        .spawn(move || {
            let mut sampler = Sampler::new();
            let t0 = Instant::now();
            let cpu0 = thread_cpu_ns();
            let mut next = Instant::now();
            while !s.stop.load(Ordering::SeqCst) {
                let period = Duration::from_nanos(rate.period_ns());
                next += period;
                let now = Instant::now();
                if next <= now {
                    // Late (a slow round, a stall): no burst of rounds to catch up.
                    next = now + period;
                }
                while !s.stop.load(Ordering::SeqCst) {
                    let left = next.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::park_timeout(left);
                }
                if s.stop.load(Ordering::SeqCst) {
                    break;
                }
                // Paused by the program (gpufl_pause): nothing is recorded, samples neither.
                if crate::collection::is_paused() {
                    continue;
                }
                let mut sent = 0u64;
                sampler.round(clock(), rate.period_ns(), crate::sites::epoch(), &mut |x| {
                    if emit(x) {
                        sent += 1;
                    }
                });
                let cpu = thread_cpu_ns().saturating_sub(cpu0);
                let wall = t0.elapsed().as_nanos() as u64;
                rate.observe(wall, cpu);
                s.rounds.fetch_add(1, Ordering::Relaxed);
                s.samples.fetch_add(sent, Ordering::Relaxed);
                s.threads.store(sampler.threads() as u64, Ordering::Relaxed);
                s.cpu_ns.store(cpu, Ordering::Relaxed);
                s.wall_ns.store(wall, Ordering::Relaxed);
                s.changes.store(u64::from(rate.changes), Ordering::Relaxed);
                s.longest_ns.store(rate.longest_ns, Ordering::Relaxed);
            }
            s.done.store(true, Ordering::SeqCst);
        })
        .map_err(|e| e.to_string())?;
    Ok(Handle {
        shared,
        thread: thread.thread().clone(),
        hz,
        budget_pct,
        pid: std::process::id(),
    })
}

/// Start the recorder's sampler (`GPUFL_HOST_SAMPLES`, `GPUFL_HOST_SAMPLE_BUDGET`): samples go
/// on the queue the writer drains. None when off (a rate of 0); Err when it cannot start.
pub fn start(clock: impl Fn() -> u64 + Send + 'static) -> Option<Result<Handle, String>> {
    let k = crate::options::knobs();
    if k.host_samples_hz == 0 {
        return None;
    }
    Some(start_with(
        k.host_samples_hz,
        k.host_sample_budget_pct,
        clock,
        push,
    ))
}

impl Handle {
    /// Ask the thread to end and wait (at most [`STOP_WAIT`]) until it has. True if it ended.
    /// In a forked child (the thread was the parent's) true at once.
    pub fn stop(&self) -> bool {
        if self.pid != std::process::id() {
            return true;
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        self.thread.unpark();
        let t0 = Instant::now();
        while !self.shared.done.load(Ordering::SeqCst) {
            if t0.elapsed() >= STOP_WAIT {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }

    /// The sampler's figures for the closing notice (`dropped`: samples lost on the way).
    pub fn summary(&self, dropped: u64) -> String {
        let s = &self.shared;
        let cpu = s.cpu_ns.load(Ordering::Relaxed);
        let wall = s.wall_ns.load(Ordering::Relaxed).max(1);
        let longest = s.longest_ns.load(Ordering::Relaxed).max(1);
        let changes = s.changes.load(Ordering::Relaxed);
        format!(
            "host samples: {} sample(s) of {} thread(s) in {} round(s) at {}/s per thread; the \
             sampler used {:.1} ms of CPU ({:.2} % of one core, budget {} %); rate changed {} \
             time(s){}; {} lost (queue full)",
            s.samples.load(Ordering::Relaxed),
            s.threads.load(Ordering::Relaxed),
            s.rounds.load(Ordering::Relaxed),
            self.hz,
            cpu as f64 / 1e6,
            cpu as f64 * 100.0 / wall as f64,
            self.budget_pct,
            changes,
            if changes > 0 {
                format!(" (lowest {:.1}/s)", 1e9 / longest as f64)
            } else {
                String::new()
            },
            dropped
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Test entry point
// ---------------------------------------------------------------------------------------------

/// Run a sampler for `ms` milliseconds at `hz` (no recorder needed) and describe its samples as
/// JSON: `{"rounds", "cpu_ns", "samples": [{"tid", "state", "period_ns", "call", "frames":
/// [{"file", "function", "line"}]}]}`.
pub fn test_samples_json(hz: u32, ms: u32) -> String {
    // Room for 16 threads' samples: no reallocation inside the sampler's rounds (its CPU time is
    // part of what the caller reads).
    let room = (u64::from(hz) * u64::from(ms) / 1000 * 16).min(1 << 16) as usize;
    let got = Arc::new(std::sync::Mutex::new(Vec::with_capacity(room)));
    let sink = got.clone();
    let h = start_with(hz.max(1), 100.0, crate::procinfo::unix_ns, move |s| {
        if let Ok(mut v) = sink.lock() {
            v.push(s);
        }
        true
    });
    let Ok(h) = h else {
        return "{}".into();
    };
    std::thread::sleep(Duration::from_millis(u64::from(ms)));
    h.stop();
    let samples: Vec<HostSample> = got.lock().map(|v| v.clone()).unwrap_or_default();
    let out: Vec<serde_json::Value> = samples
        .iter()
        .map(|s| {
            let frames: Vec<serde_json::Value> = s
                .entries()
                .iter()
                .filter_map(|&e| crate::stack::python_frame((e & !PY_TAG) as u32))
                .map(
                    |f| serde_json::json!({"file": f.file, "function": f.function, "line": f.line}),
                )
                .collect();
            serde_json::json!({
                "tid": s.tid,
                "state": s.state,
                "period_ns": s.period_ns,
                "call": s.call.map(|(d, c)| vec![d, c]),
                "frames": frames,
            })
        })
        .collect();
    serde_json::json!({
        "rounds": h.shared.rounds.load(Ordering::Relaxed),
        "cpu_ns": h.shared.cpu_ns.load(Ordering::Relaxed),
        "wall_ns": h.shared.wall_ns.load(Ordering::Relaxed),
        "samples": out,
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cupti::DOMAIN_RUNTIME as RT;

    #[test]
    fn proc_lines_parse() {
        assert_eq!(stat_state(b"1234 (python3) R 1 2 3"), Some(b'R'));
        // A command name with spaces and parentheses.
        assert_eq!(stat_state(b"77 (a) b (c)) S 1 2"), Some(b'S'));
        assert_eq!(stat_state(b"77 (x"), None);
        assert_eq!(stat_state(b"77 (x) "), None);
        assert_eq!(
            syscall_nr(b"202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f12\n"),
            Some(202)
        );
        assert_eq!(syscall_nr(b"running\n"), None);
        assert_eq!(syscall_nr(b"-1 0x7ffd 0x7f12\n"), Some(-1));
        assert_eq!(syscall_nr(b""), None);
    }

    #[test]
    fn states_from_the_syscall_file() {
        #[cfg(target_arch = "x86_64")]
        let futex = b"202 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f12\n";
        #[cfg(not(target_arch = "x86_64"))]
        let futex = b"98 0x7f 0x80 0x0 0x0 0x0 0x0 0x7ffd 0x7f12\n";
        assert_eq!(syscall_state(b"running\n"), Some(HostState::Cpu));
        assert_eq!(syscall_state(futex), Some(HostState::Lock));
        assert_eq!(
            syscall_state(b"7 0x1 0x2 0x0 0x0 0x0 0x0 0x7ffd 0x7f12\n"),
            Some(HostState::Sleep)
        );
        assert_eq!(syscall_state(b"-1 0x7ffd 0x7f12\n"), Some(HostState::Sleep));
        assert_eq!(syscall_state(b""), None);
    }

    #[test]
    fn states_from_proc() {
        #[cfg(target_arch = "x86_64")]
        let (futex, nanosleep) = (202, 35);
        #[cfg(not(target_arch = "x86_64"))]
        let (futex, nanosleep) = (98, 101);
        assert_eq!(proc_state(b'R', None), HostState::Cpu);
        assert_eq!(proc_state(b'S', Some(futex)), HostState::Lock);
        assert_eq!(proc_state(b'S', Some(449)), HostState::Lock);
        assert_eq!(proc_state(b'S', Some(nanosleep)), HostState::Sleep);
        assert_eq!(proc_state(b'D', Some(0)), HostState::Sleep);
        assert_eq!(proc_state(b'S', None), HostState::Sleep);
        assert_eq!(proc_state(b'T', None), HostState::Unknown);
        assert_eq!(proc_state(b'Z', Some(futex)), HostState::Unknown);
    }

    #[test]
    fn rate_halves_over_budget_and_comes_back_under_half_of_it() {
        let s = 1_000_000_000u64;
        let mut r = RateControl::new(100, 1.0);
        assert_eq!(r.period_ns(), 10_000_000);
        assert!(!r.observe(0, 0));
        // Within the window: no decision.
        assert!(!r.observe(s / 2, 50_000_000));
        // 2 % of a core over the first second: half the rate.
        assert!(r.observe(s, 20_000_000));
        assert_eq!(r.period_ns(), 20_000_000);
        // 0.8 %: between half the budget and the budget, kept.
        assert!(!r.observe(2 * s, 28_000_000));
        assert_eq!(r.period_ns(), 20_000_000);
        // 3 % twice: quartered.
        assert!(r.observe(3 * s, 58_000_000));
        assert!(r.observe(4 * s, 88_000_000));
        assert_eq!(r.period_ns(), 80_000_000);
        // 0.1 %: back one step per window, never past the rate asked for.
        for k in 5..12u64 {
            r.observe(k * s, 88_000_000 + (k - 4) * 1_000_000);
        }
        assert_eq!(r.period_ns(), 10_000_000);
        assert_eq!(r.changes, 6);
        assert_eq!(r.longest_ns, 80_000_000);
        // Never slower than MAX_PERIOD_NS.
        let mut r = RateControl::new(1, 1.0);
        let mut cpu = 0;
        r.observe(0, 0);
        for k in 1..40u64 {
            cpu += s / 2;
            r.observe(k * 20 * s, cpu);
        }
        assert_eq!(r.period_ns(), MAX_PERIOD_NS);
    }

    /// A round samples the marked threads: one inside a CUDA call (state `cuda`, the call), one
    /// sleeping in a futex (`lock`) and one on a CPU (`cpu`).
    #[test]
    fn a_round_samples_marked_threads_with_their_state() {
        use std::sync::mpsc::channel;
        use std::sync::{Condvar, Mutex};
        let stop = Arc::new(AtomicBool::new(false));
        // The waiting threads block on this until the end (no timed wake-ups: a thread woken on
        // a loaded machine is runnable, `cpu`, until it runs).
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let (tx, rx) = channel();
        let spawn = |kind: u32| {
            let (tx, stop, done) = (tx.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let epoch = crate::sites::epoch();
                assert!(callmark::enter(RT, 400 + kind, epoch));
                if kind != 0 {
                    assert!(callmark::exit(RT, 400 + kind));
                }
                tx.send((kind, crate::procinfo::gettid())).unwrap();
                match kind {
                    // In a "CUDA call" while it waits.
                    0 | 1 => {
                        let (m, c) = &*done;
                        let mut g = m.lock().unwrap();
                        while !*g {
                            g = c.wait(g).unwrap();
                        }
                    }
                    _ => {
                        let mut x = 0u64;
                        while !stop.load(Ordering::SeqCst) {
                            x = std::hint::black_box(x.wrapping_add(1));
                        }
                    }
                }
                if kind == 0 {
                    callmark::exit(RT, 400);
                }
            })
        };
        let hs: Vec<_> = (0..3).map(spawn).collect();
        // Indexed by kind, whatever order the threads got here in.
        let mut arrived: Vec<(u32, u64)> = (0..3).map(|_| rx.recv().unwrap()).collect();
        arrived.sort_unstable();
        let tids: Vec<u64> = arrived.into_iter().map(|(_, tid)| tid).collect();
        let mut in_call = None;
        std::thread::sleep(Duration::from_millis(30));
        let mut seen: HashMap<u64, Vec<HostState>> = HashMap::new();
        let mut s = Sampler::new();
        for _ in 0..20 {
            s.round(1, 10_000_000, crate::sites::epoch(), &mut |x| {
                if x.tid == tids[0] {
                    in_call = x.call;
                }
                seen.entry(x.tid).or_default().push(x.state);
            });
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, Ordering::SeqCst);
        *done.0.lock().unwrap() = true;
        done.1.notify_all();
        for h in hs {
            h.join().unwrap();
        }
        let mostly = |tid: u64, want: HostState| {
            let v = &seen[&tid];
            v.iter().filter(|s| **s == want).count() * 2 > v.len()
        };
        assert!(
            seen[&tids[0]].iter().all(|s| *s == HostState::Cuda),
            "{seen:?}"
        );
        assert_eq!(in_call, Some((RT, 400)));
        assert!(mostly(tids[1], HostState::Lock), "{:?}", seen[&tids[1]]);
        assert!(mostly(tids[2], HostState::Cpu), "{:?}", seen[&tids[2]]);
        assert!(s.threads() >= 3);
        // An exited thread is forgotten: not sampled, its slot given back.
        let mut after = Vec::new();
        s.round(2, 10_000_000, crate::sites::epoch(), &mut |x| {
            after.push(x.tid)
        });
        assert!(!tids.iter().any(|t| after.contains(t)), "{after:?}");
    }

    #[test]
    fn a_stale_marker_is_not_a_cuda_call() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            // Marked in an older epoch: a call whose exit went unseen.
            assert!(callmark::enter(
                RT,
                401,
                crate::sites::epoch().wrapping_sub(1)
            ));
            tx.send(crate::procinfo::gettid()).unwrap();
            go_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        let mut state = None;
        Sampler::new().round(1, 1, crate::sites::epoch(), &mut |x| {
            if x.tid == tid {
                state = Some((x.state, x.call));
            }
        });
        go_tx.send(()).unwrap();
        h.join().unwrap();
        assert_eq!(state.map(|s| s.1), Some(None));
        assert_ne!(state.map(|s| s.0), Some(HostState::Cuda));
    }

    #[test]
    fn the_thread_samples_and_stops() {
        let got = Arc::new(AtomicU64::new(0));
        let g = got.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            callmark::enter(RT, 402, crate::sites::epoch());
            tx.send(()).unwrap();
            go_rx.recv().unwrap();
            callmark::exit(RT, 402);
        });
        rx.recv().unwrap();
        let h = start_with(
            200,
            100.0,
            || 7,
            move |_| {
                g.fetch_add(1, Ordering::Relaxed);
                true
            },
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(h.stop());
        go_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(
            got.load(Ordering::Relaxed) >= 5,
            "{}",
            got.load(Ordering::Relaxed)
        );
        let line = h.summary(0);
        assert!(line.starts_with("host samples: "), "{line}");
        assert!(line.contains("at 200/s per thread"), "{line}");
    }
}
