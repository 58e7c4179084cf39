//! Stack capture on the hot path (inside CUPTI API-entry callbacks).
//!
//! A capture unwinds the native stack with [`crate::unwind`] (DWARF CFI over the process's own
//! memory, no allocation, no lock), reads the Python stack with [`crate::pyframes`] when the thread
//! runs Python, and merges them: native frames up to the first interpreter frame, then the Python
//! frames. The result is a [`Sample`] of raw entries pushed onto a bounded lock-free queue; the
//! writer thread symbolizes each distinct address once. Python frames get an id here, through a
//! per-thread cache keyed by code object and instruction (checked against the code object's
//! identity); a first sighting is queued with that identity and resolved (file, function, line) on
//! the writer thread with fault-tolerant reads, so the hot path reads no strings or line tables and
//! takes no lock ([`resolve_pending`]; inline when the safe reader is refused, or the queue is full).

use crate::pyframes::{self, PyFrameInfo, PyFrameRaw};
use crate::unwind;
use crossbeam_queue::ArrayQueue;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Entries kept per stack (native + Python).
pub const MAX_FRAMES: usize = 96;
/// Native frames unwound per capture.
const MAX_NATIVE: usize = 64;
/// Python frames read per capture.
const MAX_PYTHON: usize = 48;
/// Entries with this bit set are Python frame ids (see [`python_frame`]), others native addresses.
pub const PY_TAG: u64 = 1 << 63;
/// Capacity of the sample queue between the hot path and the writer thread.
const QUEUE_CAPACITY: usize = 4096;
/// Per-thread Python cache entries before it is cleared.
const PY_CACHE_MAX: usize = 1 << 16;
/// In a thread running Python, the native frames (driver, CUDA runtime, framework C++) under a
/// given Python call site are unwound on its first sighting and then once every `NATIVE_EVERY`
/// sightings; in between only the Python frames are read. A synchronization's native unwind
/// under PyTorch's Python frames (40-50 frames) took 60-100 µs on the H100 machine even after the
/// first (Trainer, 2026-11-25: the 34 synchronization captures over 10 µs of 1,594 were these
/// walks at every 64th sighting), the Python frames well under 1 µs; the frames under a Python
/// line rarely change, so they are refreshed every 1024th sighting.
/// `GPUFL_NATIVE_EVERY=1` unwinds every time.
pub const NATIVE_EVERY: u32 = 1024;

/// One synchronization call seen by the API callbacks: its interval, what it waited on, and the
/// CPU stack at its entry.
#[derive(Clone, Copy)]
pub struct Sample {
    /// Correlation id of the API call.
    pub corr: u32,
    /// CUPTI callback domain and id of the API call.
    pub domain: u32,
    pub cbid: u32,
    /// CUPTI context id.
    pub ctx: u32,
    /// CUPTI stream id waited on (stream sync / wait event), if known.
    pub stream: Option<u32>,
    /// gettid() of the caller.
    pub tid: u64,
    /// Trace-clock time at API entry (the capture) and exit.
    pub ts: u64,
    pub end: u64,
    /// Whether a stack was captured.
    pub has_stack: bool,
    pub len: u16,
    /// True when the native part was not unwound because this Python call site was seen before
    /// (see [`NATIVE_EVERY`]); the writer reuses the native frames of its last full capture.
    pub native_elided: bool,
    /// True when the native walk was cut short by its bound ([`unwind::Bound`]): the native part
    /// holds the innermost frames only (the writer does not reuse it for elided captures).
    pub native_cut: bool,
    /// Calls this capture stands for (call sites sampled by [`crate::sites`]); 0 or 1: itself.
    pub weight: u32,
    /// A copy of the thread's stack ([`unwind::copy_stack`]) whose native frames the writer is to
    /// walk ([`complete_native`]): slot + 1, or 0 (the native frames, if any, are in `frames`).
    pub native_copy: u8,
    /// When the calling thread ran no Python: the OS id of the thread whose Python frames the
    /// stack carries (the thread inferred to drive the call, `pyframes::capture_other_thread`);
    /// 0 otherwise.
    pub via_tid: u64,
    /// A CUDA graph node this call created (graph id, node id): the sample is the node's creation
    /// stack (a `gnode` record), not a call site.
    pub graph_node: Option<(u32, u64)>,
    /// A CUDA call that held its thread past the hostcall threshold ([`crate::hostcalls`]): the
    /// sample is a `hostcall` record (`ts`..`end` the call), not a call site.
    pub hostcall: Option<HostcallFacts>,
    /// An allocation call whose stack goes with its `mem` record, or that failed for want of
    /// memory ([`crate::memcalls`]).
    pub mem: Option<crate::memcalls::MemFacts>,
    /// Innermost first. Native return addresses, or `PY_TAG | python frame id`.
    pub frames: [u64; MAX_FRAMES],
}

impl Sample {
    /// An empty sample.
    pub const fn empty() -> Sample {
        Sample {
            corr: 0,
            domain: 0,
            cbid: 0,
            ctx: 0,
            stream: None,
            tid: 0,
            ts: 0,
            end: 0,
            has_stack: false,
            len: 0,
            native_elided: false,
            native_cut: false,
            weight: 0,
            native_copy: 0,
            via_tid: 0,
            graph_node: None,
            hostcall: None,
            mem: None,
            frames: [0; MAX_FRAMES],
        }
    }

    /// The captured entries.
    pub fn entries(&self) -> &[u64] {
        &self.frames[..(self.len as usize).min(MAX_FRAMES)]
    }
}

/// What a `hostcall` record holds besides a sample's common fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostcallFacts {
    /// Bytes asked for (allocation calls whose parameters give the size).
    pub bytes: Option<u64>,
    /// The call's return code (`cudaError_t` / `CUresult`).
    pub ret: u32,
}

/// Stack capture's process-wide state (the module's one static): the queues to the writer, the
/// Python frame registry, what is looked up once, the cost tables.
struct Stacks {
    /// Captured samples ([`queue`]), and those dropped because it was full.
    queue: OnceLock<ArrayQueue<Sample>>,
    dropped: AtomicU64,
    /// Registry of Python frames ([`PyRegistry`]).
    py_registry: Mutex<Option<PyRegistry>>,
    /// Next Python frame id.
    next_py_id: AtomicU32,
    /// Python frames waiting for the writer to resolve them ([`Pending`]).
    pending: OnceLock<ArrayQueue<Pending>>,
    /// Whether first sightings of Python frames are resolved on the writer ([`defer_enabled`]).
    defer: OnceLock<bool>,
    /// This library's and the interpreter's text ranges ([`ranges`]).
    ranges: OnceLock<Ranges>,
    /// The breakdown of the first captures' cost (`GPUFL_DEBUG_COST=1`), and the captures seen.
    debug_cost: Mutex<Vec<String>>,
    debug_seen: AtomicU64,
    /// Durations of the first captures of each [`Purpose`].
    site_cost: CostTable,
    sync_cost: CostTable,
    hostcall_cost: CostTable,
    /// The long-lived native thread of [`capture_on_persistent_native_thread_json`] (tests).
    test_worker: OnceLock<Option<Mutex<TestChan>>>,
}

/// Requests to, and answers from, the test worker thread.
type TestChan = (
    std::sync::mpsc::Sender<()>,
    std::sync::mpsc::Receiver<String>,
);

static STACKS: Stacks = Stacks {
    queue: OnceLock::new(),
    dropped: AtomicU64::new(0),
    py_registry: Mutex::new(None),
    next_py_id: AtomicU32::new(0),
    pending: OnceLock::new(),
    defer: OnceLock::new(),
    ranges: OnceLock::new(),
    debug_cost: Mutex::new(Vec::new()),
    debug_seen: AtomicU64::new(0),
    site_cost: CostTable::new(),
    sync_cost: CostTable::new(),
    hostcall_cost: CostTable::new(),
    test_worker: OnceLock::new(),
};

/// The queue of captured samples (created on first use).
pub fn queue() -> &'static ArrayQueue<Sample> {
    STACKS.queue.get_or_init(|| ArrayQueue::new(QUEUE_CAPACITY))
}

/// Push a sample; when the writer falls behind the sample is counted as dropped, never blocking.
pub fn push(s: Sample) {
    if !try_push(s) {
        STACKS.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// Push a sample; false when the queue is full (the sample is dropped, its stack copy given back,
/// and the caller counts it).
pub fn try_push(s: Sample) -> bool {
    match queue().push(s) {
        Ok(()) => true,
        Err(s) => {
            if s.native_copy != 0 {
                unwind::release_copy(usize::from(s.native_copy - 1));
            }
            false
        }
    }
}

/// Give back the stack copy a sample holds (one captured and never pushed), if any.
pub fn forget_copy(s: &mut Sample) {
    if s.native_copy != 0 {
        unwind::release_copy(usize::from(s.native_copy - 1));
        s.native_copy = 0;
    }
}

/// Samples dropped since the last call (the queue was full).
pub fn take_dropped() -> u64 {
    STACKS.dropped.swap(0, Ordering::Relaxed)
}

/// Registry of Python frames: id → what it resolved to (None: its code object was gone or
/// changed by the time the writer resolved it). Ids are handed out by `Stacks::next_py_id`; the
/// writer fills the registry from `Stacks::pending` (deferred resolution), the hot path only when
/// deferring is off or the queue is full.
struct PyRegistry {
    infos: HashMap<u32, Option<PyFrameInfo>>,
}

/// Capacity of the queue of Python frames waiting for the writer to resolve them.
const PENDING_CAPACITY: usize = 4096;

/// A Python frame seen for the first time on the hot path: its id, raw frame and the identity of
/// its code object there. The writer resolves it with fault-tolerant reads and keeps it only when
/// the identity still matches (the code object may have been freed since).
#[derive(Clone, Copy)]
struct Pending {
    id: u32,
    raw: PyFrameRaw,
    identity: (u32, usize),
}

fn pending() -> &'static ArrayQueue<Pending> {
    STACKS
        .pending
        .get_or_init(|| ArrayQueue::new(PENDING_CAPACITY))
}

/// Whether first sightings of Python frames are resolved on the writer thread (default) rather
/// than on the hot path: needs the fault-tolerant reader (`process_vm_readv` on this process);
/// `GPUFL_PY_DEFER=0` turns it off.
fn defer_enabled() -> bool {
    *STACKS
        .defer
        .get_or_init(|| crate::options::knobs().py_defer && pyframes::safe_reads_available())
}

fn registry_get(id: u32) -> Option<Option<PyFrameInfo>> {
    let reg = STACKS.py_registry.lock().ok()?;
    reg.as_ref()?.infos.get(&id).cloned()
}

fn registry_put(id: u32, info: Option<PyFrameInfo>) {
    if let Ok(mut guard) = STACKS.py_registry.lock() {
        guard
            .get_or_insert_with(|| PyRegistry {
                infos: HashMap::new(),
            })
            .infos
            .insert(id, info);
    }
}

/// Resolve every Python frame waiting in the queue (writer thread): fault-tolerant reads, kept
/// only when the code object's identity is still the one seen at capture. Returns how many.
pub fn resolve_pending() -> usize {
    let q = pending();
    let mut n = 0;
    while let Some(p) = q.pop() {
        let info = (pyframes::code_identity_other(&p.raw) == Some(p.identity))
            .then(|| pyframes::resolve_other(&p.raw))
            .flatten();
        registry_put(p.id, info);
        n += 1;
    }
    n
}

/// The Python frame with this id (for the writer thread); resolves queued first sightings when
/// the id is not known yet (a sample is queued after the frames it refers to).
pub fn python_frame(id: u32) -> Option<PyFrameInfo> {
    if let Some(info) = registry_get(id) {
        return info;
    }
    resolve_pending();
    registry_get(id).flatten()
}

/// A new id for a frame resolved now (hot path, when deferring is off or its queue is full).
fn register_python(info: PyFrameInfo) -> Option<u32> {
    let id = STACKS.next_py_id.fetch_add(1, Ordering::Relaxed);
    registry_put(id, Some(info));
    Some(id)
}

/// A new id for a frame to be resolved by the writer, or None when the queue is full.
fn defer_python(raw: &PyFrameRaw, identity: (u32, usize)) -> Option<u32> {
    let id = STACKS.next_py_id.fetch_add(1, Ordering::Relaxed);
    pending()
        .push(Pending {
            id,
            raw: *raw,
            identity,
        })
        .ok()
        .map(|()| id)
}

#[derive(Clone, Copy)]
struct PyCacheEntry {
    identity: (u32, usize),
    id: u32,
}

/// A small, fast hasher for the hot path's per-thread maps (keys are addresses, not attacker
/// controlled, so SipHash's protection is not needed).
#[derive(Default, Clone, Copy)]
pub struct FastHasher(u64);

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64);
    }
}

type FastMap<K, V> = HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;

thread_local! {
    static PY_CACHE: RefCell<FastMap<(usize, i32), PyCacheEntry>> = RefCell::new(FastMap::default());
}

/// Id of a raw Python frame: per-thread cache, checked against the code object's identity so a
/// freed-and-reused code address is not mistaken for the old one. `other`: the frame was read from
/// another thread, so its code object is read with fault-tolerant reads.
fn python_frame_id(raw: &PyFrameRaw, other: bool) -> Option<u32> {
    let identity = if other {
        pyframes::code_identity_other(raw)?
    } else {
        pyframes::code_identity(raw)?
    };
    python_frame_id_as(raw, identity, other)
}

/// [`python_frame_id`] of a frame read from another thread whose code object's identity the
/// caller read itself (the host sampler reads it with the code object's header, in one copy).
pub(crate) fn python_frame_id_known(raw: &PyFrameRaw, identity: (u32, usize)) -> Option<u32> {
    python_frame_id_as(raw, identity, true)
}

fn python_frame_id_as(raw: &PyFrameRaw, identity: (u32, usize), other: bool) -> Option<u32> {
    let key = (raw.code, raw.instr_offset);
    let cached = PY_CACHE
        .try_with(|c| c.borrow().get(&key).copied())
        .ok()
        .flatten();
    if let Some(e) = cached {
        if e.identity == identity {
            return Some(e.id);
        }
    }
    let deferred = if defer_enabled() {
        defer_python(raw, identity)
    } else {
        None
    };
    let id = match deferred {
        Some(id) => id,
        None => register_python(if other {
            pyframes::resolve_other(raw)?
        } else {
            pyframes::resolve(raw)?
        })?,
    };
    let _ = PY_CACHE.try_with(|c| {
        let mut c = c.borrow_mut();
        if c.len() >= PY_CACHE_MAX {
            c.clear();
        }
        c.insert(key, PyCacheEntry { identity, id });
    });
    Some(id)
}

/// Address ranges to cut at: our own module (frames of the capture itself are dropped) and the
/// Python interpreter's (replaced by Python frames).
struct Ranges {
    own: Option<Range<u64>>,
    interpreter: Option<Range<u64>>,
}

/// The writer's half of a capture whose native frames were deferred ([`Sample::native_copy`]):
/// walk the stack copy, keep its frames as [`capture_for`] keeps a walk's (past the recorder's
/// own frames, up to the interpreter's) and put them under the sample's Python frames. A walk
/// that ends before it reaches the interpreter is marked cut, as a bounded walk would be.
pub fn complete_native(s: &Sample) -> Sample {
    let mut done = *s;
    if s.native_copy == 0 {
        return done;
    }
    done.native_copy = 0;
    let mut native = [0u64; MAX_NATIVE];
    let (n, stopped) = unwind::walk_copy(usize::from(s.native_copy - 1), &mut native);
    // Deferred walks are those of stacks with the thread's own Python frames: cut at the
    // interpreter, under the Python frames already in the sample.
    let py = s.entries();
    let room = MAX_FRAMES.saturating_sub(py.len());
    let (kept, reached) = keep_native(&native[..n], true, &mut done.frames[..room]);
    done.frames[kept..kept + py.len()].copy_from_slice(py);
    done.len = (kept + py.len()) as u16;
    done.native_cut = !reached && stopped;
    done
}

/// The native frames of a walk (innermost first) that a stack keeps, written to `out` (as many as
/// fit): past the recorder's own frames, and, with `to_interpreter`, up to the first frame in the
/// Python interpreter (the Python frames stand for those). Returns how many, and whether the
/// interpreter was reached.
fn keep_native(native: &[u64], to_interpreter: bool, out: &mut [u64]) -> (usize, bool) {
    let r = ranges();
    let in_range =
        |a: u64, range: &Option<Range<u64>>| range.as_ref().is_some_and(|r| r.contains(&a));
    let start = native
        .iter()
        .position(|&a| !in_range(a, &r.own))
        .unwrap_or(native.len());
    let mut len = 0;
    for &a in &native[start..] {
        if a == 0 || len >= out.len() {
            break;
        }
        if to_interpreter && in_range(a, &r.interpreter) {
            return (len, true);
        }
        out[len] = a;
        len += 1;
    }
    (len, false)
}

fn ranges() -> &'static Ranges {
    STACKS.ranges.get_or_init(|| {
        let own = unwind::module_of(capture_into as *const () as u64).map(|(_, r)| r);
        let interpreter = pyframes::python_version().and_then(|_| {
            [c"_PyEval_EvalFrameDefault", c"PyEval_EvalFrameDefault"]
                .iter()
                .find_map(|n| crate::dl::default_sym(n))
                .and_then(|a| unwind::module_of(a as u64))
                .map(|(_, r)| r)
        });
        Ranges { own, interpreter }
    })
}

/// What a capture is for: its bound and the cost table it is counted in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// A synchronization (the thread is about to wait anyway): native walk bounded by
    /// [`SYNC_UNWIND_NS`], module list rebuilt inline after a library load.
    Sync,
    /// A launch, copy or memset call site (the hot path of a launch): native walk bounded by
    /// [`site_unwind_ns`], module list rebuilds left to the writer thread.
    Site,
    /// A CUDA call that held its thread past the hostcall threshold ([`crate::hostcalls`]),
    /// captured at its exit: bounded as a synchronization's, counted apart.
    Hostcall,
}

/// Time bound of a synchronization's native walk, ns.
pub const SYNC_UNWIND_NS: u64 = 100_000;
/// Default time bound of a call site's native walk, ns (`GPUFL_SITE_UNWIND_US`).
pub const SITE_UNWIND_NS: u64 = 5_000;
/// Default time bound of the native walk of a synchronization whose line its Python frames give
/// (its own or, on a thread running no Python, those of the thread driving it), ns
/// (`GPUFL_SYNC_PY_UNWIND_US`). The native frames under Python (the interpreter, the framework's
/// C++, CUDA) are detail there: a cold first walk of them took 26-227 µs in the Trainer on the
/// H100 (always-on, 2026-11-25), the p99 of synchronization captures over 10 µs. A walk cut short
/// keeps its Python frames and the native frames walked so far; the next due sighting of the site
/// walks again, further each time as the thread's unwind-rule cache fills.
pub const SYNC_PY_UNWIND_NS: u64 = 6_000;

/// Whether a synchronization made from Python has its native frames walked by the writer from a
/// copy of the stack ([`unwind::copy_stack`]) instead of on the waiting thread:
/// `GPUFL_SYNC_NATIVE_DEFER=0` walks them in place (bounded by [`sync_py_unwind_ns`]).
pub fn sync_native_deferred() -> bool {
    crate::options::knobs().sync_native_defer
}

/// [`SYNC_PY_UNWIND_NS`], or `GPUFL_SYNC_PY_UNWIND_US` (µs, ≥ 1).
pub fn sync_py_unwind_ns() -> u64 {
    crate::options::knobs().sync_py_unwind_ns
}

/// Time bound of a call site's native walk, ns: `GPUFL_SITE_UNWIND_US` (µs, ≥ 1) or
/// [`SITE_UNWIND_NS`].
pub fn site_unwind_ns() -> u64 {
    crate::options::knobs().site_unwind_ns
}

/// Capture the calling thread's merged stack into `out` (frames and len only), for a
/// synchronization.
#[inline(never)]
pub fn capture_into(out: &mut Sample, with_python: bool) {
    capture_for(out, with_python, Purpose::Sync);
}

/// Capture the calling thread's merged stack into `out` within the bounds of `purpose`; returns
/// the capture's cost, ns (also counted in the session's cost summary).
#[inline(never)]
pub fn capture_for(out: &mut Sample, with_python: bool, purpose: Purpose) -> u64 {
    let start = std::time::Instant::now();
    let debug = debug_cost_enabled();
    let mut py = [PyFrameRaw::default(); MAX_PYTHON];
    let mut pn = if with_python {
        pyframes::capture_python(&mut py)
    } else {
        0
    };
    // A thread running no Python (PyTorch's autograd thread, an XLA worker): the Python frames of
    // the thread inferred to drive it (docs/insights.md, "Cross-thread Python attribution").
    out.via_tid = 0;
    let mut other_ids = [u32::MAX; MAX_PYTHON];
    let t_own = debug.then(std::time::Instant::now);
    if with_python && pn == 0 && cross_thread_enabled() {
        if let Some((n, tid)) = reuse_other(start, &mut py, &mut other_ids) {
            pn = n;
            out.via_tid = tid;
        } else {
            let mut resolve = |p: &PyFrameRaw| python_frame_id(p, true);
            let resolver: pyframes::Resolver<'_> = (&mut other_ids, &mut resolve);
            if let Some((n, tid)) = pyframes::capture_other_thread_with(&mut py, Some(resolver)) {
                pn = n;
                out.via_tid = tid.max(1);
                keep_other(start, &py[..pn], &other_ids[..pn], out.via_tid);
            }
        }
    }
    let other = out.via_tid != 0;
    let t_other = debug.then(std::time::Instant::now);
    let mut native = [0u64; MAX_NATIVE];
    // A launch or copy made from Python: its Python frames name the line; the native frames
    // under them (CUPTI, the driver, the runtime, the framework's C++) are walked only with
    // GPUFL_SITE_NATIVE=1. Cold, such a walk took 15-25 µs per capture on the H100 machine and
    // was cut by its bound before it left CUPTI and the driver (phase trainerbench, 2026-11-25).
    let sync_like = matches!(purpose, Purpose::Sync | Purpose::Hostcall);
    let native_for_python = sync_like || site_native_enabled();
    let want_native = pn == 0 || (native_for_python && native_due(&py[..pn], other));
    // Unoptimized builds (the test suite's) walk some 50 times slower: same walks, wider bounds.
    let scale = if cfg!(debug_assertions) { 50 } else { 1 };
    let bound = match purpose {
        Purpose::Sync | Purpose::Hostcall if pn > 0 => unwind::Bound {
            time_ns: sync_py_unwind_ns() * scale,
            defer_rescan: false,
        },
        Purpose::Sync | Purpose::Hostcall => unwind::Bound {
            time_ns: SYNC_UNWIND_NS * scale,
            defer_rescan: false,
        },
        Purpose::Site => unwind::Bound {
            time_ns: site_unwind_ns() * scale,
            defer_rescan: true,
        },
    };
    // A synchronization whose line its own Python frames give: its native frames (the library
    // line beside the user's) are walked by the writer from a copy of the stack, so that the
    // waiting thread never pays for a walk's first steps through cold unwind tables (13-77 µs
    // in a Trainer, over the 6 µs bound, which is only checked between steps).
    out.native_copy = 0;
    let deferred = want_native
        && sync_like
        && pn > 0
        && !other
        && sync_native_deferred()
        && match unwind::copy_stack() {
            Some(slot) => {
                out.native_copy = slot as u8 + 1;
                true
            }
            None => false,
        };
    let (n, cut) = if want_native && !deferred {
        unwind::capture_native_bounded(&mut native, 0, bound)
    } else {
        (0, false)
    };
    // A walk cut short leaves the call site's count as it is: the next try comes with its next
    // due sighting (a cold site would otherwise pay the whole bound at every sighting).
    out.native_elided = !want_native;
    out.native_cut = cut;
    let t_native = debug.then(std::time::Instant::now);
    let (mut len, _) = keep_native(&native[..n], pn > 0 && !other, &mut out.frames);
    let mut own_ids = [u32::MAX; MAX_PYTHON];
    if !other && pn > 0 {
        own_python_ids(&py[..pn], &mut own_ids[..pn]);
    }
    for k in 0..pn {
        if len >= MAX_FRAMES {
            break;
        }
        let id = if other { other_ids[k] } else { own_ids[k] };
        if id != u32::MAX {
            out.frames[len] = PY_TAG | id as u64;
            len += 1;
        }
    }
    out.len = len as u16;
    let t3 = std::time::Instant::now();
    let cost = (t3 - start).as_nanos() as u64;
    record_cost(purpose, cost);
    if let (Some(a), Some(b), Some(c)) = (t_own, t_other, t_native) {
        debug_cost_push(
            cost,
            format_args!(
                "{purpose:?} capture {cost}ns: own python {}ns, other thread {}ns ({}), native {}ns \
                 ({n} frames{}{}), merge+resolve {}ns ({pn} python frames)",
                (a - start).as_nanos(),
                (b - a).as_nanos(),
                if other {
                    let (r, c) = pyframes::xthread::DEBUG_READ.get();
                    format!("used; last check read {r}ns, getppid before it {c}ns")
                } else {
                    "none".to_string()
                },
                (c - b).as_nanos(),
                if !want_native {
                    ", elided"
                } else if out.native_copy != 0 {
                    ", copied for the writer"
                } else {
                    ""
                },
                if cut { ", cut" } else { "" },
                (t3 - c).as_nanos(),
            ),
        );
    }
    cost
}

/// How long a thread running no Python reuses the Python frames it last read from the thread
/// driving it, ns: a thread blocked in `backward()` or `float()` keeps its frames for the whole
/// call, and reading them again costs a few `process_vm_readv` calls (µs) per capture.
pub const OTHER_REUSE_NS: u64 = 2_000_000;

/// [`OTHER_REUSE_NS`], or `GPUFL_XTHREAD_REUSE_US` (µs; 0: read every time).
fn other_reuse_ns() -> u64 {
    crate::options::knobs().xthread_reuse_ns
}

/// The Python frames this thread last read from another thread: (when, frames, ids, via tid).
struct OtherCache {
    at: Option<std::time::Instant>,
    n: usize,
    raw: [PyFrameRaw; MAX_PYTHON],
    ids: [u32; MAX_PYTHON],
    via: u64,
}

thread_local! {
    static OTHER_CACHE: RefCell<OtherCache> = const {
        RefCell::new(OtherCache {
            at: None,
            n: 0,
            raw: [PyFrameRaw { code: 0, instr_offset: 0 }; MAX_PYTHON],
            ids: [u32::MAX; MAX_PYTHON],
            via: 0,
        })
    };
}

/// The other thread's frames read less than [`OTHER_REUSE_NS`] before `now`, if any: (count, via).
fn reuse_other(
    now: std::time::Instant,
    py: &mut [PyFrameRaw; MAX_PYTHON],
    ids: &mut [u32; MAX_PYTHON],
) -> Option<(usize, u64)> {
    OTHER_CACHE
        .try_with(|c| {
            let c = c.try_borrow().ok()?;
            let at = c.at?;
            if c.n == 0 || now.saturating_duration_since(at).as_nanos() as u64 >= other_reuse_ns() {
                return None;
            }
            py[..c.n].copy_from_slice(&c.raw[..c.n]);
            ids[..c.n].copy_from_slice(&c.ids[..c.n]);
            Some((c.n, c.via))
        })
        .ok()
        .flatten()
}

fn keep_other(now: std::time::Instant, py: &[PyFrameRaw], ids: &[u32], via: u64) {
    let _ = OTHER_CACHE.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            let n = py.len().min(MAX_PYTHON).min(ids.len());
            c.raw[..n].copy_from_slice(&py[..n]);
            c.ids[..n].copy_from_slice(&ids[..n]);
            c.n = n;
            c.via = via;
            c.at = Some(now);
        }
    });
}

/// The last Python chain resolved on this thread (innermost first): raw frames, the identity of
/// their code objects and their ids.
struct LastChain {
    n: usize,
    raw: [(usize, i32); MAX_PYTHON],
    identity: [(u32, usize); MAX_PYTHON],
    ids: [u32; MAX_PYTHON],
}

thread_local! {
    static LAST_CHAIN: RefCell<LastChain> = const {
        RefCell::new(LastChain {
            n: 0,
            raw: [(0, 0); MAX_PYTHON],
            identity: [(0, 0); MAX_PYTHON],
            ids: [u32::MAX; MAX_PYTHON],
        })
    };
}

/// Ids of the calling thread's Python frames `py` (innermost first) into `ids`. The outer frames
/// that are unchanged since this thread's last capture (same code object, checked by its
/// identity, at the same instruction, all the way out) reuse that capture's ids without a lookup;
/// only the frames below them are looked up ([`python_frame_id`]).
fn own_python_ids(py: &[PyFrameRaw], ids: &mut [u32]) {
    let pn = py.len().min(ids.len());
    let done = LAST_CHAIN
        .try_with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return false;
            };
            let mut same = 0;
            while same < pn && same < c.n {
                let (p, q) = (&py[pn - 1 - same], c.n - 1 - same);
                if c.raw[q] != (p.code, p.instr_offset)
                    || c.ids[q] == u32::MAX
                    || pyframes::code_identity(p) != Some(c.identity[q])
                {
                    break;
                }
                same += 1;
            }
            let mut next_identity = [(0u32, 0usize); MAX_PYTHON];
            let mut next_ids = [u32::MAX; MAX_PYTHON];
            for k in 0..pn {
                let from_outside = pn - 1 - k;
                if from_outside < same {
                    let q = c.n - 1 - from_outside;
                    ids[k] = c.ids[q];
                    next_identity[k] = c.identity[q];
                } else {
                    ids[k] = python_frame_id(&py[k], false).unwrap_or(u32::MAX);
                    next_identity[k] = pyframes::code_identity(&py[k]).unwrap_or((0, 0));
                }
                next_ids[k] = ids[k];
            }
            for (slot, p) in c.raw.iter_mut().zip(&py[..pn]) {
                *slot = (p.code, p.instr_offset);
            }
            c.identity = next_identity;
            c.ids = next_ids;
            c.n = pn;
            true
        })
        .unwrap_or(false);
    if !done {
        for k in 0..pn {
            ids[k] = python_frame_id(&py[k], false).unwrap_or(u32::MAX);
        }
    }
}

/// `GPUFL_CROSS_THREAD=0` turns cross-thread Python attribution off.
fn cross_thread_enabled() -> bool {
    crate::options::knobs().cross_thread
}

thread_local! {
    /// Sightings per Python call site (hash of its raw frames), for [`NATIVE_EVERY`].
    static SITE_COUNTS: RefCell<FastMap<u64, u32>> = RefCell::new(FastMap::default());
}

fn native_every() -> u32 {
    crate::options::knobs().native_every
}

/// Key of a Python call site for [`native_due`]: its raw frames, and whether they were read from
/// another thread (a native thread driven by that Python call site has native frames of its own).
fn site_key(py: &[PyFrameRaw], other: bool) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ other as u64;
    for f in py {
        h = (h ^ f.code as u64).wrapping_mul(0x0100_0000_01b3);
        h = (h ^ f.instr_offset as u32 as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// `GPUFL_SITE_NATIVE=1`: call sites made from Python also get their native frames (see
/// [`capture_for`]).
fn site_native_enabled() -> bool {
    crate::options::knobs().site_native
}

/// Whether this Python call site's native frames are due for a full unwind.
fn native_due(py: &[PyFrameRaw], other: bool) -> bool {
    let every = native_every();
    if every <= 1 {
        return true;
    }
    let h = site_key(py, other);
    SITE_COUNTS
        .try_with(|c| {
            let mut c = c.borrow_mut();
            if c.len() >= PY_CACHE_MAX {
                c.clear();
            }
            let n = c.entry(h).or_insert(0);
            let due = *n % every == 0;
            *n = n.wrapping_add(1);
            due
        })
        .unwrap_or(true)
}

/// `GPUFL_DEBUG_COST=1`: keep a breakdown of the first captures' cost (for benchmarks).
pub(crate) fn debug_cost_enabled() -> bool {
    crate::options::knobs().debug_cost
}

/// Keep the breakdown of the first 8 captures and of every capture over 10 µs (the p99 target of
/// issue 12; 60 lines at most).
fn debug_cost_push(cost_ns: u64, line: std::fmt::Arguments) {
    let seen = STACKS.debug_seen.fetch_add(1, Ordering::Relaxed);
    if seen >= 8 && cost_ns < 10_000 {
        return;
    }
    if let Ok(mut v) = STACKS.debug_cost.lock() {
        if v.len() < 60 {
            v.push(format!("#{seen} {line}"));
        }
    }
}

/// The breakdown collected with `GPUFL_DEBUG_COST=1`.
pub fn debug_cost_lines() -> Vec<String> {
    let mut v = STACKS
        .debug_cost
        .lock()
        .map(|v| v.clone())
        .unwrap_or_default();
    if debug_cost_enabled() {
        v.push(pyframes::xthread::stats_line());
    }
    v
}

/// Capture the calling thread's stack with [`capture_into`] and describe it as JSON (for tests and
/// the `gpufl_test_capture_stack_json` entry point).
#[inline(never)]
pub fn capture_here_json() -> String {
    let mut s = Sample::empty();
    capture_into(&mut s, pyframes::python_version().is_some());
    let (_, frames) = describe(&s, true);
    serde_json::Value::Array(frames).to_string()
}

/// A captured sample as JSON objects: (via_tid, frames); native frames symbolized when
/// `symbolize`, else given by address only.
fn describe(s: &Sample, symbolize: bool) -> (u64, Vec<serde_json::Value>) {
    // Native frames deferred to the writer are walked here (the writer's half of the capture).
    let completed = complete_native(s);
    let s = &completed;
    let mut sym = crate::symbolize::Symbolizer::new();
    let mut out = Vec::new();
    for &e in s.entries() {
        if e & PY_TAG != 0 {
            if let Some(f) = python_frame((e & !PY_TAG) as u32) {
                out.push(serde_json::json!({
                    "kind": "python", "function": f.function, "file": f.file, "line": f.line,
                }));
            }
        } else if !symbolize {
            out.push(serde_json::json!({"kind": "native", "addr": e}));
        } else {
            for f in sym.resolve(e, true) {
                out.push(serde_json::json!({
                    "kind": "native", "function": f.function, "file": f.file, "line": f.line,
                    "module": f.module, "inlined": f.inlined,
                }));
            }
        }
    }
    (s.via_tid, out)
}

/// Capture on a new native thread (no Python thread state), as a CUDA callback on PyTorch's
/// autograd thread or an XLA worker would: `{"via_tid": N, "frames": [...], "cost_ns": N}`.
pub fn capture_on_native_thread_json() -> String {
    std::thread::Builder::new()
        .name("gpufl-test-native".into())
        .spawn(|| {
            let mut s = Sample::empty();
            let t = std::time::Instant::now();
            capture_into(&mut s, pyframes::python_version().is_some());
            let cost_ns = t.elapsed().as_nanos() as u64;
            let (via_tid, frames) = describe(&s, false);
            serde_json::json!({"via_tid": via_tid, "frames": frames, "cost_ns": cost_ns})
                .to_string()
        })
        .ok()
        .and_then(|h| h.join().ok())
        .unwrap_or_else(|| "{}".into())
}

/// A capture on one long-lived native thread (started at the first call, kept for later ones),
/// described as in [`capture_on_native_thread_json`]: successive calls exercise what that thread
/// keeps between captures (the main thread's addresses read speculatively, the cached stacks).
pub fn capture_on_persistent_native_thread_json() -> String {
    use std::sync::mpsc;
    let worker = STACKS.test_worker.get_or_init(|| {
        let (req_tx, req_rx) = mpsc::channel::<()>();
        let (resp_tx, resp_rx) = mpsc::channel::<String>();
        std::thread::Builder::new()
            .name("gpufl-test-native".into())
            .spawn(move || {
                while req_rx.recv().is_ok() {
                    let mut s = Sample::empty();
                    capture_into(&mut s, pyframes::python_version().is_some());
                    let (via_tid, frames) = describe(&s, false);
                    let json = serde_json::json!({"via_tid": via_tid, "frames": frames});
                    if resp_tx.send(json.to_string()).is_err() {
                        break;
                    }
                }
            })
            .ok()
            .map(|_| Mutex::new((req_tx, resp_rx)))
    });
    let Some(chan) = worker else {
        return "{}".into();
    };
    let Ok(chan) = chan.lock() else {
        return "{}".into();
    };
    if chan.0.send(()).is_err() {
        return "{}".into();
    }
    chan.1.recv().unwrap_or_else(|_| "{}".into())
}

/// On one new native thread: a first (cold) capture, then `iters` more; returns [cold ns, mean warm
/// ns, via_tid of the last] (benchmark and test of the cross-thread path's steady-state cost).
pub fn cross_thread_cost(iters: u32) -> [f64; 3] {
    std::thread::Builder::new()
        .name("gpufl-test-native".into())
        .spawn(move || {
            let py = pyframes::python_version().is_some();
            let mut s = Sample::empty();
            let t = std::time::Instant::now();
            capture_into(&mut s, py);
            let cold = t.elapsed().as_nanos() as f64;
            let t = std::time::Instant::now();
            for _ in 0..iters {
                capture_into(std::hint::black_box(&mut s), py);
            }
            let warm = t.elapsed().as_nanos() as f64 / iters.max(1) as f64;
            [cold, warm, s.via_tid as f64]
        })
        .ok()
        .and_then(|h| h.join().ok())
        .unwrap_or([-1.0; 3])
}

/// Durations of the first captures of each [`Purpose`] (ns), kept to report the hot path's own
/// cost per session.
const COST_SLOTS: usize = 1 << 16;

struct CostTable {
    ns: [std::sync::atomic::AtomicU32; COST_SLOTS],
    n: std::sync::atomic::AtomicUsize,
}

impl CostTable {
    const fn new() -> CostTable {
        CostTable {
            ns: [const { std::sync::atomic::AtomicU32::new(0) }; COST_SLOTS],
            n: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    fn record(&self, ns: u64) {
        let i = self.n.fetch_add(1, Ordering::Relaxed);
        if i < COST_SLOTS {
            self.ns[i].store(ns.min(u32::MAX as u64) as u32, Ordering::Relaxed);
        }
    }

    /// The timed captures' durations, ns, and the count of all captures.
    fn values(&self) -> (Vec<u32>, usize) {
        let n = self.n.load(Ordering::Relaxed);
        let v = self.ns[..n.min(COST_SLOTS)]
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect();
        (v, n)
    }
}

/// "N captures, median X ns, p99 Y ns, max Z ns, K over 10 µs" for `n` captures of which `v` (any
/// order) were timed.
fn cost_line(mut v: Vec<u32>, n: usize) -> Option<String> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
    let over = v.len() - v.partition_point(|&x| x <= 10_000);
    let timed = if n > v.len() {
        format!(" (first {} timed)", v.len())
    } else {
        String::new()
    };
    Some(format!(
        "{n} captures, median {} ns, p99 {} ns, max {} ns, {over} over 10 µs{timed}",
        q(0.5),
        q(0.99),
        v[v.len() - 1],
    ))
}

/// Record the duration of one capture (lock-free; beyond the first 65536 of a purpose only
/// counted).
pub fn record_cost(purpose: Purpose, ns: u64) {
    match purpose {
        Purpose::Site => STACKS.site_cost.record(ns),
        Purpose::Sync => STACKS.sync_cost.record(ns),
        Purpose::Hostcall => STACKS.hostcall_cost.record(ns),
    }
}

/// "stack capture cost: call sites N captures, median X ns, p99 Y ns, max Z ns, K over 10 µs;
/// synchronizations …; both …" (call sites and synchronizations), then "; hostcalls …", if any
/// capture happened.
pub fn cost_summary() -> Option<String> {
    let (sites, n_sites) = STACKS.site_cost.values();
    let (syncs, n_syncs) = STACKS.sync_cost.values();
    let (hostcalls, n_hostcalls) = STACKS.hostcall_cost.values();
    let both: Vec<u32> = sites.iter().chain(&syncs).copied().collect();
    let two = usize::from(!sites.is_empty()) + usize::from(!syncs.is_empty()) == 2;
    let parts: Vec<String> = [
        ("call sites", sites, n_sites),
        ("synchronizations", syncs, n_syncs),
    ]
    .into_iter()
    .filter_map(|(what, v, n)| cost_line(v, n).map(|s| format!("{what} {s}")))
    .collect();
    let all = two
        .then(|| cost_line(both, n_sites + n_syncs))
        .flatten()
        .map(|s| format!("; both {s}"))
        .unwrap_or_default();
    let hc = cost_line(hostcalls, n_hostcalls)
        .map(|s| format!("{}hostcalls {s}", if parts.is_empty() { "" } else { "; " }))
        .unwrap_or_default();
    (!parts.is_empty() || !hc.is_empty())
        .then(|| format!("stack capture cost: {}{all}{hc}", parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_line_quantiles_and_slow_count() {
        // 200 captures: 196 of 1 µs, 4 slow ones; p99 is the one at index round(199 × 0.99) = 197
        // of the sorted values, the second slow one.
        let mut v = vec![1_000u32; 196];
        v.extend([10_000, 10_001, 30_000, 90_000]);
        v.reverse();
        let s = cost_line(v, 250).unwrap();
        assert_eq!(
            s,
            "250 captures, median 1000 ns, p99 10001 ns, max 90000 ns, 3 over 10 µs (first 200 timed)"
        );
        assert_eq!(cost_line(Vec::new(), 0), None);
    }

    #[inline(never)]
    fn nested_capture(out: &mut Sample) {
        capture_into(out, true);
        std::hint::black_box(&out);
    }

    #[test]
    fn capture_skips_own_frames_and_finds_callers() {
        let mut s = Sample::empty();
        nested_capture(&mut s);
        // In a test binary the "own module" is the test executable itself, so every frame is ours
        // and skipped: what remains are libc/ld frames below main (or nothing). No Python here.
        assert!(s.entries().iter().all(|e| e & PY_TAG == 0));
    }

    #[test]
    fn full_queue_counts_drops() {
        let _ = take_dropped();
        let q = queue();
        let mut pushed = 0;
        while q.push(Sample::empty()).is_ok() {
            pushed += 1;
        }
        push(Sample::empty());
        push(Sample::empty());
        assert_eq!(take_dropped(), 2);
        assert_eq!(take_dropped(), 0);
        while q.pop().is_some() {}
        assert!(pushed > 0);
    }
}
