//! Cross-thread Python attribution: the Python stack of the thread that drives a CUDA call made on a
//! thread that runs no Python.
//!
//! PyTorch's autograd engine launches `loss.backward()`'s kernels from its own C++ thread; XLA
//! issues JAX's launches, copies and waits from its worker threads while the Python thread is
//! blocked in `float(loss)`. Those threads have no Python frames, so their stacks would end in the
//! framework's C++. When the calling thread has no Python frame, the recorder reads the Python
//! stack of another thread of the interpreter, chosen by the rule in docs/insights.md
//! ("Cross-thread Python attribution"):
//!
//! - candidates: every other thread state of the main interpreter (`threads.head` → `next`, at
//!   most [`MAX_THREADS`]) with at least one Python frame;
//! - ranked by (1) not idle: a thread whose innermost Python frame is an idle wait of the standard
//!   library (`threading`, `queue`, `selectors`, `socket`, `multiprocessing.connection`,
//!   `concurrent.futures`: a tqdm monitor or a pin-memory thread) ranks last; (2) the GIL released:
//!   a thread blocked in a C call (inside `run_backward`, inside JAX's `float()`) before one running
//!   Python; (3) the main thread before others; (4) the interpreter's list order (newest first).
//!
//! Another thread's frames can be popped and freed while we look at them, so none of its memory
//! is dereferenced directly: every read is a copy the kernel makes ([`SafeMem`]: through a pipe of
//! the calling thread, or `process_vm_readv` on our own process), which fails with EFAULT instead
//! of faulting, and every pointer and type is validated as for the own
//! thread. If both ways are refused (seccomp, a sandbox), cross-thread attribution is off and
//! [`unavailable_reason`] says why. Nothing here takes the GIL or a lock, or calls interpreter code
//! other than `PyInterpreterState_Head` / `_PyThreadState_UncheckedGet` (a load each).
//!
//! Cost: a candidate's stack is re-walked only when it changed since this calling thread last
//! looked (a per-thread cache; each stack checked by reading back, in one copy, the
//! thread state and the address, caller and instruction of its innermost [`CHAIN_CHECK`] frames,
//! as at most [`MAX_RANGES`] address ranges):
//! a thread blocked in `backward()` is walked once and then costs one copy (two system calls
//! through the pipe) per capture.

use super::{plausible, runtime, Mem, PyFrameRaw, Runtime, CODEUNIT, OB_SIZE};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Thread states looked at per capture.
pub const MAX_THREADS: usize = 64;
/// Frames walked (shims included) per thread.
const MAX_WALK: usize = 512;
/// Python frames kept per stack (the caller's buffer may be smaller).
pub const MAX_FRAMES: usize = 48;
/// Cached stacks per calling thread.
const CACHE_SLOTS: usize = 8;
/// Bytes of a `_PyInterpreterFrame` read (its fixed part; `owner` is at 69 or 70).
const FRAME_BYTES: usize = 72;

/// Reads this process's memory so that an unmapped or unreadable address is an error, never a
/// fault, in one of two ways ([`Via`]).
pub(crate) struct SafeMem {
    pid: libc::pid_t,
    via: Via,
}

/// How [`SafeMem`] reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `process_vm_readv` on our own process: one system call per read, but the kernel takes
    /// the process's memory-map lock for it, which a busy program's other threads (`mmap`,
    /// `munmap`, `mprotect`) hold often: 0.9 µs idle, 20–60 µs inside a HuggingFace Trainer on
    /// the H100 machine.
    VmReadv,
    /// `writev` of the addresses into a pipe of the calling thread, then `readv` back: two system
    /// calls, and the kernel copies from our memory as from any `write` buffer, taking no lock
    /// while the pages are present (an unmapped address ends the write: EFAULT or a short count).
    Pipe,
}

/// The calling thread's pipe for [`Via::Pipe`] (both ends non-blocking, closed on exec and at
/// the thread's exit); `gen` is the fork generation it was made in (a forked child makes its own).
struct ThreadPipe {
    r: libc::c_int,
    w: libc::c_int,
    gen: u64,
}

impl Drop for ThreadPipe {
    fn drop(&mut self) {
        // SAFETY: both descriptors are ours, opened by `pipe2` and closed only here.
        unsafe {
            libc::close(self.r);
            libc::close(self.w);
        }
    }
}

thread_local! {
    static PIPE: RefCell<Option<ThreadPipe>> = const { RefCell::new(None) };
}

/// The cross-thread path's process-wide state (the module's one static).
struct Xthread {
    /// Bumped in a forked child (`crate::recorder`'s fork hook, [`note_fork`]): a pipe made
    /// before is shared with the parent and is not used again.
    fork_gen: AtomicU64,
    /// The fault-tolerant reader, probed once ([`safe_mem`]).
    safe: OnceLock<Result<SafeMem, String>>,
    /// What cross-thread captures did ([`stats`]).
    stats: [AtomicU64; 5],
    /// The interpreter's main thread state and its OS thread id, as last seen by a full look (0:
    /// not yet); checked against the thread state's ids before use.
    main_ts: AtomicUsize,
    main_tid: AtomicU64,
    /// The main thread's `thread_id` (`_PyRuntime.main_thread`), read once (0: not yet).
    main_id: AtomicUsize,
    /// The main thread's C stack ([`main_stack`]), read once.
    main_stack: OnceLock<(usize, usize)>,
}

static XT: Xthread = Xthread {
    fork_gen: AtomicU64::new(0),
    safe: OnceLock::new(),
    stats: [const { AtomicU64::new(0) }; 5],
    main_ts: AtomicUsize::new(0),
    main_tid: AtomicU64::new(0),
    main_id: AtomicUsize::new(0),
    main_stack: OnceLock::new(),
};

/// In a forked child (`crate::recorder`'s fork hook): pipes made before the fork are shared with
/// the parent and are not used again.
pub(crate) fn note_fork() {
    XT.fork_gen.fetch_add(1, Ordering::SeqCst);
}

/// Copy `n` ranges of this process's memory (`src[i]` → `dst[i]`, the same lengths, `total` bytes)
/// through the calling thread's pipe; true only when every byte came.
fn pipe_copy(src: &[libc::iovec], dst: &[libc::iovec], total: usize) -> bool {
    PIPE.try_with(|p| {
        let Ok(mut p) = p.try_borrow_mut() else {
            return false;
        };
        let gen = XT.fork_gen.load(Ordering::Relaxed);
        if p.as_ref().is_some_and(|t| t.gen != gen) {
            // Made before a fork: the parent holds the same pipe. Leave its descriptors to this
            // process's copy of them (closing them here does not touch the parent's).
            *p = None;
        }
        if p.is_none() {
            let mut fds = [0 as libc::c_int; 2];
            // SAFETY: `fds` has room for the two descriptors.
            if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
                return false;
            }
            *p = Some(ThreadPipe {
                r: fds[0],
                w: fds[1],
                gen,
            });
        }
        let Some(t) = p.as_ref() else { return false };
        let n = src.len() as libc::c_int;
        // SAFETY: the iovecs describe memory of this process; the kernel copies from it into the
        // pipe and stops with EFAULT (nothing written) or a short count at an unreadable byte.
        let put = unsafe { libc::writev(t.w, src.as_ptr(), n) };
        if put <= 0 {
            return false;
        }
        // SAFETY: `dst` describes buffers we own mutably, `total` ≥ `put` bytes in all.
        let got = unsafe { libc::readv(t.r, dst.as_ptr(), n) };
        if got != put {
            // Something is left in the pipe (or it failed): a fresh pipe next time.
            *p = None;
            return false;
        }
        put as usize == total
    })
    .unwrap_or(false)
}

impl Mem for SafeMem {
    fn read_into(&self, addr: usize, buf: &mut [u8]) -> bool {
        if buf.is_empty() {
            return true;
        }
        if addr < 4096 || addr.checked_add(buf.len()).is_none() {
            return false;
        }
        let local = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut c_void,
            iov_len: buf.len(),
        };
        let remote = libc::iovec {
            iov_base: addr as *mut c_void,
            iov_len: buf.len(),
        };
        if self.via == Via::Pipe {
            return pipe_copy(&[remote], &[local], buf.len());
        }
        // SAFETY: `local` describes `buf`, which we own mutably; the kernel validates `remote`
        // and returns an error (EFAULT) for memory this process cannot read.
        let n = unsafe { libc::process_vm_readv(self.pid, &local, 1, &remote, 1, 0) };
        n == buf.len() as isize
    }
}

impl SafeMem {
    /// Several reads in one system call (two through a pipe): true only when every buffer was
    /// filled (a failing address stops the transfer there, so a partial result is refused as a
    /// whole).
    fn read_many(&self, reads: &mut [(usize, &mut [u8])]) -> bool {
        const MAX: usize = CHAIN_CHECK + 2;
        if reads.is_empty() || reads.len() > MAX {
            return false;
        }
        let empty = libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        };
        let (mut local, mut remote) = ([empty; MAX], [empty; MAX]);
        let mut total = 0usize;
        for (i, (addr, buf)) in reads.iter_mut().enumerate() {
            if *addr < 4096 || addr.checked_add(buf.len()).is_none() {
                return false;
            }
            local[i] = libc::iovec {
                iov_base: buf.as_mut_ptr() as *mut c_void,
                iov_len: buf.len(),
            };
            remote[i] = libc::iovec {
                iov_base: *addr as *mut c_void,
                iov_len: buf.len(),
            };
            total += buf.len();
        }
        let k = reads.len();
        if self.via == Via::Pipe {
            return pipe_copy(&remote[..k], &local[..k], total);
        }
        let n = k as libc::c_ulong;
        // SAFETY: each local iovec describes a buffer we own mutably; the kernel validates the
        // remote ones and stops at the first it cannot read (EFAULT or a short count).
        let got =
            unsafe { libc::process_vm_readv(self.pid, local.as_ptr(), n, remote.as_ptr(), n, 0) };
        got == total as isize
    }
}

/// Whether `m` refuses to read a page this process cannot read (an inaccessible page mapped for
/// the test), instead of faulting or reading it.
fn refuses_unreadable(m: &SafeMem) -> bool {
    // SAFETY: a fresh anonymous mapping of one page with no access, unmapped below; nothing else
    // refers to it.
    unsafe {
        let page = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if page == libc::MAP_FAILED {
            return false;
        }
        let mut got = [0u8; 8];
        let refused = !m.read_into(page as usize, &mut got);
        libc::munmap(page, 4096);
        refused
    }
}

/// How the fault-tolerant reads are made: `GPUFL_XTHREAD_READ=pipe|readv`, else
/// [`Via::VmReadv`]. The pipe is faster (1.1 against 2.3 µs for 4 pieces on the H100 machine,
/// idle) but holds two descriptors per thread, which a program that closes every descriptor it
/// did not open (a daemon, a `closerange` before `exec`) would close under us — and a file it then
/// opened under the same number would receive our writes. Since the main thread's stack is
/// checked without a system call ([`direct_unchanged`]), reads are rare: the safe way is the
/// default, the pipe a benchmark knob.
fn chosen_via() -> Via {
    if crate::options::knobs().xthread_read_pipe {
        Via::Pipe
    } else {
        Via::VmReadv
    }
}

/// The fault-tolerant reader, probed once; Err says why cross-thread attribution is off.
pub(crate) fn safe_mem() -> Result<&'static SafeMem, &'static str> {
    XT.safe
        .get_or_init(|| {
            // SAFETY: getpid cannot fail.
            let pid = unsafe { libc::getpid() };
            let probe: u64 = 0x6770_7566_6c21;
            let works = |m: &SafeMem| {
                let mut got = [0u8; 8];
                m.read_into(&probe as *const u64 as usize, &mut got)
                    && u64::from_ne_bytes(got) == probe
                    && refuses_unreadable(m)
            };
            // The chosen way first, the other when it is refused (a sandbox may forbid one).
            let first = chosen_via();
            let other = if first == Via::Pipe {
                Via::VmReadv
            } else {
                Via::Pipe
            };
            let mut why = Vec::new();
            for via in [first, other] {
                let m = SafeMem { pid, via };
                if works(&m) {
                    return Ok(m);
                }
                why.push(format!("{via:?}: {}", std::io::Error::last_os_error()));
            }
            Err(format!(
                "cross-thread Python attribution off: no fault-tolerant read ({})",
                why.join("; ")
            ))
        })
        .as_ref()
        .map_err(|e| e.as_str())
}

/// Why cross-thread attribution is unavailable (Python present but the safe reader refused).
pub fn unavailable_reason() -> Option<&'static str> {
    runtime().ok()?;
    safe_mem().err()
}

/// One candidate thread, for [`rank_key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The innermost Python frame is an idle wait of the standard library.
    pub idle: bool,
    /// The thread does not hold the GIL (blocked in a C call, or waiting for the GIL).
    pub gil_released: bool,
    /// The interpreter's main thread.
    pub main: bool,
}

/// Ranking key: larger wins; ties go to the earlier thread of the interpreter's list.
pub fn rank_key(c: &Candidate) -> (bool, bool, bool) {
    (!c.idle, c.gil_released, c.main)
}

/// Index of the winning candidate (first of the best), None when there is none.
pub fn choose(cands: &[Candidate]) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, c) in cands.iter().enumerate() {
        if best.is_none_or(|b| rank_key(c) > rank_key(&cands[b])) {
            best = Some(i);
        }
    }
    best
}

/// Whether a file of the standard library whose frames are idle waits: a thread whose innermost
/// frame is in one is parked, not driving GPU work.
pub fn is_idle_wait_file(file: &str) -> bool {
    const IDLE: &[&str] = &[
        "/threading.py",
        "/queue.py",
        "/selectors.py",
        "/socket.py",
        "/multiprocessing/connection.py",
        "/multiprocessing/queues.py",
        "/multiprocessing/synchronize.py",
        "/concurrent/futures/_base.py",
        "/concurrent/futures/thread.py",
        "/asyncio/base_events.py",
        "/subprocess.py",
    ];
    let stdlib = file.contains("/lib/python3.") || file.starts_with("<frozen");
    stdlib && IDLE.iter().any(|s| file.ends_with(s))
}

/// Frames of a cached chain checked at each capture (the innermost ones, shims included): a
/// change deeper than this with the innermost ones all unchanged goes unseen.
const CHAIN_CHECK: usize = 32;
/// The checked frames are read as a few address ranges, not one piece each: `process_vm_readv`
/// costs ~0.3 µs per piece on the H100 machine (0.9 µs for one, 11 µs for 32), while frames of
/// one thread sit next to each other in its data stack. At most this many ranges…
const MAX_RANGES: usize = 4;
/// …each spanning at most this many bytes, frames at most this far apart joining one…
const RANGE_SPAN_MAX: usize = 8192;
const RANGE_GAP: usize = 2048;
/// …and this many bytes in all (the check stops at the first frame that does not fit).
const CHECK_BYTES_MAX: usize = 16384;

/// A thread state's stack as last walked by this calling thread, with what proves it unchanged:
/// the state's `cframe`, and the address, caller and instruction of each of the innermost
/// [`CHAIN_CHECK`] frames.
#[derive(Clone, Copy)]
struct Cached {
    ts: usize,
    cframe: usize,
    chain_len: usize,
    chain: [usize; CHAIN_CHECK],
    prevs: [usize; CHAIN_CHECK],
    instrs: [usize; CHAIN_CHECK],
    /// The address ranges read to check the first `check_len` frames of the chain, and where each
    /// of those frames lies in their concatenation.
    ranges: [(usize, usize); MAX_RANGES],
    n_ranges: usize,
    check_len: usize,
    offs: [u32; CHAIN_CHECK],
    /// Every checked frame lies in the thread's root data-stack chunk and its `cframe` in the
    /// main thread's C stack or in the thread state: the check may read them directly
    /// ([`direct_unchanged`]).
    direct: bool,
    idle: bool,
    n: usize,
    frames: [PyFrameRaw; MAX_FRAMES],
    /// The identity of each frame's code object (`co_firstlineno`, `co_filename`), when the walk
    /// read it ([`walk_windowed`]; (0, 0): not read).
    idents: [(u32, usize); MAX_FRAMES],
    /// The frames' ids as the caller resolved them (u32::MAX: none), once `ids_ready`.
    ids: [u32; MAX_FRAMES],
    ids_ready: bool,
}

impl Cached {
    /// An entry for thread state `ts` whose `cframe` was read, before its walk.
    fn new(ts: usize, cframe: usize) -> Cached {
        Cached {
            ts,
            cframe,
            chain_len: 0,
            chain: [0; CHAIN_CHECK],
            prevs: [0; CHAIN_CHECK],
            instrs: [0; CHAIN_CHECK],
            ranges: [(0, 0); MAX_RANGES],
            n_ranges: 0,
            check_len: 0,
            offs: [0; CHAIN_CHECK],
            direct: false,
            idle: false,
            n: 0,
            frames: [PyFrameRaw::default(); MAX_FRAMES],
            idents: [(0, 0); MAX_FRAMES],
            ids: [u32::MAX; MAX_FRAMES],
            ids_ready: false,
        }
    }
}

struct Cache {
    slots: Vec<Cached>,
    next: usize,
    /// Where [`still_valid`] reads the ranges (allocated once per thread).
    buf: Vec<u8>,
    /// Stacks kept (0: [`CACHE_SLOTS`]).
    cap: usize,
    /// Where [`walk_windowed`] reads the data stack.
    win: Vec<u8>,
    /// Whether a file (by the address of its `str`) is an idle wait, as last read ([`idle_of`]).
    idle_files: Vec<(usize, bool)>,
}

thread_local! {
    static CACHE: RefCell<Cache> = const {
        RefCell::new(Cache {
            slots: Vec::new(),
            next: 0,
            buf: Vec::new(),
            cap: 0,
            win: Vec::new(),
            idle_files: Vec::new(),
        })
    };
    /// The host sampler's cache: one stack per thread it samples ([`sample_threads`]).
    static SAMPLER_CACHE: RefCell<Cache> = const {
        RefCell::new(Cache {
            slots: Vec::new(),
            next: 0,
            buf: Vec::new(),
            cap: MAX_THREADS,
            win: Vec::new(),
            idle_files: Vec::new(),
        })
    };
}

/// Group the chain's frames into the ranges [`still_valid`] reads (see [`MAX_RANGES`]).
fn plan_ranges(e: &mut Cached) {
    let (mut n, mut total, mut len) = (0usize, 0usize, 0usize);
    for i in 0..e.chain_len {
        let (a, b) = (e.chain[i], e.chain[i] + FRAME_BYTES);
        let mut placed = false;
        for r in e.ranges[..n].iter_mut() {
            let (lo, hi) = (r.0.min(a), (r.0 + r.1).max(b));
            let near = a <= r.0 + r.1 + RANGE_GAP && b + RANGE_GAP >= r.0;
            if near && hi - lo <= RANGE_SPAN_MAX && total - r.1 + (hi - lo) <= CHECK_BYTES_MAX {
                total = total - r.1 + (hi - lo);
                *r = (lo, hi - lo);
                placed = true;
                break;
            }
        }
        if !placed {
            if n == MAX_RANGES || total + FRAME_BYTES > CHECK_BYTES_MAX {
                break;
            }
            e.ranges[n] = (a, FRAME_BYTES);
            n += 1;
            total += FRAME_BYTES;
        }
        len = i + 1;
    }
    e.n_ranges = n;
    e.check_len = len;
    for i in 0..len {
        let a = e.chain[i];
        let mut base = 0usize;
        for r in &e.ranges[..n] {
            if r.0 <= a && a + FRAME_BYTES <= r.0 + r.1 {
                e.offs[i] = (base + (a - r.0)) as u32;
                break;
            }
            base += r.1;
        }
    }
}

fn rd_at<T: Copy>(buf: &[u8], off: usize) -> Option<T> {
    let sz = std::mem::size_of::<T>();
    let b = buf.get(off..off + sz)?;
    // SAFETY: `b` holds exactly size_of::<T>() initialized bytes; T is a plain integer type.
    Some(unsafe { std::ptr::read_unaligned(b.as_ptr() as *const T) })
}

fn read_usize(m: &SafeMem, addr: usize) -> Option<usize> {
    let mut b = [0u8; 8];
    m.read_into(addr, &mut b).then(|| usize::from_ne_bytes(b))
}

/// Walk another thread's frames from `frame` (safe reads only), innermost first, into `e.frames`;
/// the first [`CHAIN_CHECK`] frames read go into `e.chain` / `e.prevs` / `e.instrs`.
fn walk(m: &SafeMem, rt: &Runtime, mut frame: usize, e: &mut Cached) {
    let l = rt.layout;
    let mut fb = [0u8; FRAME_BYTES];
    let mut cb = [0u8; 24];
    let (mut n, mut steps) = (0usize, 0usize);
    e.chain_len = 0;
    while n < e.frames.len() && steps < MAX_WALK && plausible(frame) {
        steps += 1;
        if !m.read_into(frame, &mut fb) {
            break;
        }
        let previous = rd_at::<usize>(&fb, l.fr_previous).unwrap_or(0);
        let instr_ptr = rd_at::<usize>(&fb, l.fr_prev_instr).unwrap_or(0);
        if e.chain_len < CHAIN_CHECK {
            e.chain[e.chain_len] = frame;
            e.prevs[e.chain_len] = previous;
            e.instrs[e.chain_len] = instr_ptr;
            e.chain_len += 1;
        }
        let Some(owner) = rd_at::<u8>(&fb, l.fr_owner) else {
            break;
        };
        if owner > l.owner_max {
            break;
        }
        if Some(owner) != l.owner_cstack {
            let Some(code) = rd_at::<usize>(&fb, l.fr_code) else {
                break;
            };
            if !plausible(code) || !m.read_into(code, &mut cb) {
                break;
            }
            if rd_at::<usize>(&cb, super::OB_TYPE) != Some(rt.code_type) {
                break;
            }
            let size = rd_at::<i64>(&cb, OB_SIZE).unwrap_or(0);
            let nbytes = size.saturating_mul(CODEUNIT as i64);
            let base = (code + l.co_code_adaptive) as i64;
            let off = (instr_ptr as i64).wrapping_sub(base);
            if (0..nbytes).contains(&off) && off <= i32::MAX as i64 {
                e.frames[n] = PyFrameRaw {
                    code,
                    instr_offset: off as i32,
                };
                n += 1;
            } else if off >= nbytes {
                break;
            }
        }
        frame = previous;
    }
    e.n = n;
}

/// Whether the innermost frame of `frames` is an idle wait (its code's file, read safely).
fn innermost_idle(m: &SafeMem, rt: &Runtime, frames: &[PyFrameRaw]) -> bool {
    let Some(f) = frames.first() else {
        return false;
    };
    let Some(p) = read_usize(m, f.code + rt.layout.co_filename) else {
        return false;
    };
    // SAFETY: read_str_with only reads through `m`, which never faults.
    let file = unsafe { super::read_str_with(m, rt, p) };
    file.is_some_and(|s| is_idle_wait_file(&s))
}

/// Files remembered by [`idle_of`] before the list starts again.
const IDLE_FILES_MAX: usize = 1024;

/// [`innermost_idle`] for a stack walked by [`walk_windowed`], whose innermost frame's file is
/// known by the address of its `str`: read once per address (a `str` freed and another made at
/// its address may be taken for it: only the `idle` state of a sample is at stake).
fn idle_of(m: &SafeMem, rt: &Runtime, known: &mut Vec<(usize, bool)>, e: &Cached) -> bool {
    let file = match e.idents.first() {
        Some(&(_, f)) if e.n > 0 && f != 0 => f,
        _ => return innermost_idle(m, rt, &e.frames[..e.n]),
    };
    if let Some(&(_, idle)) = known.iter().find(|(f, _)| *f == file) {
        return idle;
    }
    // SAFETY: read_str_with only reads through `m`, which never faults.
    let idle = unsafe { super::read_str_with(m, rt, file) }.is_some_and(|s| is_idle_wait_file(&s));
    if known.len() >= IDLE_FILES_MAX {
        known.clear();
    }
    known.push((file, idle));
    idle
}

/// Whether cached stack `e` still holds, read in one `process_vm_readv`: the thread state (into
/// `tb`), its `cframe`'s current frame and the chain's frames, each frame at the same address with
/// the same caller and instruction. A thread blocked in `backward()` keeps them for the whole
/// call: one system call per capture instead of a read per frame (~3 µs each on the H100
/// machine), and a change anywhere in the innermost [`CHAIN_CHECK`] frames is seen (a stack
/// keyed by its innermost frames alone would name the wrong outer line when the same function is
/// called from two places).
fn still_valid(m: &SafeMem, rt: &Runtime, tb: &mut [u8], e: &Cached, buf: &mut Vec<u8>) -> bool {
    let l = rt.layout;
    if e.check_len == 0 || e.n_ranges == 0 {
        return false;
    }
    let Some(cur_at) = e.cframe.checked_add(l.cframe_current) else {
        return false;
    };
    let total: usize = e.ranges[..e.n_ranges].iter().map(|r| r.1).sum();
    if buf.len() < total {
        buf.resize(CHECK_BYTES_MAX.max(total), 0);
    }
    let mut cur = [0u8; 8];
    let read = {
        let mut reads: [(usize, &mut [u8]); MAX_RANGES + 2] =
            std::array::from_fn(|_| (0, &mut [][..]));
        reads[0] = (e.ts, &mut *tb);
        reads[1] = (cur_at, &mut cur[..]);
        let mut rest = &mut buf[..total];
        for (r, range) in reads[2..].iter_mut().zip(&e.ranges[..e.n_ranges]) {
            let (piece, tail) = std::mem::take(&mut rest).split_at_mut(range.1);
            *r = (range.0, piece);
            rest = tail;
        }
        if crate::stack::debug_cost_enabled() {
            // Debug: the read alone, and a system call that does nothing (getppid) just before it,
            // as a control for what any system call costs on this thread at this moment.
            let t0 = std::time::Instant::now();
            // SAFETY: getppid cannot fail.
            let _ = unsafe { libc::getppid() };
            let t1 = std::time::Instant::now();
            let ok = m.read_many(&mut reads[..2 + e.n_ranges]);
            let t2 = std::time::Instant::now();
            DEBUG_READ.set(((t2 - t1).as_nanos() as u64, (t1 - t0).as_nanos() as u64));
            ok
        } else {
            m.read_many(&mut reads[..2 + e.n_ranges])
        }
    };
    if !read {
        return false;
    }
    if rd_at::<usize>(tb, l.ts_cframe) != Some(e.cframe) || usize::from_ne_bytes(cur) != e.chain[0]
    {
        return false;
    }
    (0..e.check_len).all(|i| {
        let Some(f) = buf.get(e.offs[i] as usize..e.offs[i] as usize + FRAME_BYTES) else {
            return false;
        };
        rd_at::<usize>(f, l.fr_previous) == Some(e.prevs[i])
            && rd_at::<usize>(f, l.fr_prev_instr) == Some(e.instrs[i])
    })
}

/// Look at thread state `ts`: its first bytes into `tb`, and the slot of this thread's cache that
/// holds its stack (checked by [`still_valid`], else walked anew). None: unreadable, or no frame.
fn look(m: &SafeMem, rt: &Runtime, c: &mut Cache, ts: usize, tb: &mut [u8]) -> Option<usize> {
    look_with(m, rt, c, ts, tb, false)
}

/// [`look`]; `windowed`: a stack walked anew is walked by [`walk_windowed`] (`tb` must then reach
/// past the thread state's `datastack_top`).
fn look_with(
    m: &SafeMem,
    rt: &Runtime,
    c: &mut Cache,
    ts: usize,
    tb: &mut [u8],
    windowed: bool,
) -> Option<usize> {
    let l = rt.layout;
    let known = c.slots.iter().position(|e| e.ts == ts);
    if let Some(i) = known {
        if still_valid(m, rt, tb, &c.slots[i], &mut c.buf) {
            count(2);
            return Some(i);
        }
    }
    count(3);
    if !m.read_into(ts, tb) {
        return None;
    }
    let cframe = rd_at::<usize>(tb, l.ts_cframe).unwrap_or(0);
    if !plausible(cframe) {
        return None;
    }
    let frame = read_usize(m, cframe.checked_add(l.cframe_current)?)?;
    if !plausible(frame) {
        return None;
    }
    let mut e = Cached::new(ts, cframe);
    if windowed {
        walk_windowed(m, rt, frame, tb, &mut e, &mut c.win);
    } else {
        walk(m, rt, frame, &mut e);
    }
    plan_ranges(&mut e);
    // The sampler's stacks are checked by a copy (still_valid), never by direct loads.
    e.direct = !windowed && directly_checkable(m, rt, &e);
    e.idle = if windowed {
        idle_of(m, rt, &mut c.idle_files, &e)
    } else {
        innermost_idle(m, rt, &e.frames[..e.n])
    };
    let cap = if c.cap == 0 { CACHE_SLOTS } else { c.cap };
    let i = match known {
        Some(i) => i,
        None if c.slots.len() < cap => {
            c.slots.push(e);
            return Some(c.slots.len() - 1);
        }
        None => {
            let i = c.next % cap;
            c.next = c.next.wrapping_add(1);
            i
        }
    };
    c.slots[i] = e;
    Some(i)
}

/// Bytes of a code object [`walk_windowed`] reads: its header through `co_filename` (at 112 in
/// 3.11 and 3.12), so that its type, size and identity come in one copy.
const CODE_BYTES: usize = 128;
/// Bytes of the current data-stack chunk, below its top, [`walk_windowed`] reads in one copy.
const WINDOW_BYTES: usize = 16 * 1024;
/// Frames whose code objects one walk reads (more than [`MAX_FRAMES`]: frames not yet started
/// are skipped).
const CANDIDATES: usize = MAX_FRAMES + 8;

/// [`walk`] in a few copies instead of two per frame (the host sampler walks busy threads at
/// every sample): the frames in the live part of the thread's current data-stack chunk (the
/// [`WINDOW_BYTES`] below `datastack_top`, read from `tb`) come from one copy, frames elsewhere
/// (3.12's entry frames on the C stack, generators', older chunks) one read each, and the code
/// objects' headers in batches of [`CHAIN_CHECK`]` + 2` through [`SafeMem::read_many`] — their
/// identities (`co_firstlineno`, `co_filename`) with them, into `e.idents`. The same frames as
/// [`walk`] (the checks are made once the code objects are in); the chain checked by
/// [`still_valid`] may go past a frame where `walk` would have stopped.
fn walk_windowed(
    m: &SafeMem,
    rt: &Runtime,
    mut frame: usize,
    tb: &[u8],
    e: &mut Cached,
    win: &mut Vec<u8>,
) {
    let l = rt.layout;
    let (mut wlo, mut whi) = (0usize, 0usize);
    let chunk = rd_at::<usize>(tb, l.ts_datastack_chunk).unwrap_or(0);
    let top = rd_at::<usize>(tb, l.ts_datastack_chunk + 8).unwrap_or(0);
    if plausible(chunk) && top > chunk + CHUNK_DATA && top - chunk <= ROOT_CHUNK_MAX {
        let lo = (chunk + CHUNK_DATA).max(top.saturating_sub(WINDOW_BYTES));
        if win.len() < WINDOW_BYTES {
            win.resize(WINDOW_BYTES, 0);
        }
        if m.read_into(lo, &mut win[..top - lo]) {
            (wlo, whi) = (lo, top);
        }
    }
    // The chain: each frame's code object and instruction pointer, innermost first.
    let mut cand = [(0usize, 0usize); CANDIDATES];
    let mut nc = 0usize;
    let mut fb = [0u8; FRAME_BYTES];
    let mut steps = 0usize;
    e.chain_len = 0;
    while nc < CANDIDATES && steps < MAX_WALK && plausible(frame) {
        steps += 1;
        let bytes: &[u8] = if frame >= wlo && frame + FRAME_BYTES <= whi {
            &win[frame - wlo..frame - wlo + FRAME_BYTES]
        } else if m.read_into(frame, &mut fb) {
            &fb
        } else {
            break;
        };
        let previous = rd_at::<usize>(bytes, l.fr_previous).unwrap_or(0);
        let instr_ptr = rd_at::<usize>(bytes, l.fr_prev_instr).unwrap_or(0);
        if e.chain_len < CHAIN_CHECK {
            e.chain[e.chain_len] = frame;
            e.prevs[e.chain_len] = previous;
            e.instrs[e.chain_len] = instr_ptr;
            e.chain_len += 1;
        }
        let Some(owner) = rd_at::<u8>(bytes, l.fr_owner) else {
            break;
        };
        if owner > l.owner_max {
            break;
        }
        if Some(owner) != l.owner_cstack {
            let code = rd_at::<usize>(bytes, l.fr_code).unwrap_or(0);
            if !plausible(code) {
                break;
            }
            cand[nc] = (code, instr_ptr);
            nc += 1;
        }
        frame = previous;
    }
    // The code objects, a batch at a time; the frames kept as `walk` keeps them.
    const BATCH: usize = CHAIN_CHECK + 2;
    let mut n = 0usize;
    let mut codes = [[0u8; CODE_BYTES]; BATCH];
    let mut start = 0usize;
    'batches: while start < nc && n < e.frames.len() {
        let k = (nc - start).min(BATCH);
        let ok = {
            let mut reads: [(usize, &mut [u8]); BATCH] = std::array::from_fn(|_| (0, &mut [][..]));
            for ((r, buf), c) in reads
                .iter_mut()
                .zip(codes.iter_mut())
                .zip(&cand[start..start + k])
            {
                *r = (c.0, &mut buf[..]);
            }
            m.read_many(&mut reads[..k])
        };
        for j in 0..k {
            let (code, instr_ptr) = cand[start + j];
            // A batch refused as a whole: its code objects one at a time, up to the one that fails.
            if !ok && !m.read_into(code, &mut codes[j]) {
                break 'batches;
            }
            let cb = &codes[j];
            if rd_at::<usize>(cb, super::OB_TYPE) != Some(rt.code_type) {
                break 'batches;
            }
            let size = rd_at::<i64>(cb, OB_SIZE).unwrap_or(0);
            let nbytes = size.saturating_mul(CODEUNIT as i64);
            let base = (code + l.co_code_adaptive) as i64;
            let off = (instr_ptr as i64).wrapping_sub(base);
            if (0..nbytes).contains(&off) && off <= i32::MAX as i64 {
                e.frames[n] = PyFrameRaw {
                    code,
                    instr_offset: off as i32,
                };
                let first = rd_at::<i32>(cb, l.co_firstlineno).unwrap_or(0);
                e.idents[n] = (
                    u32::try_from(first).unwrap_or(0),
                    rd_at::<usize>(cb, l.co_filename).unwrap_or(0),
                );
                n += 1;
                if n == e.frames.len() {
                    break 'batches;
                }
            } else if off >= nbytes {
                break 'batches;
            }
        }
        start += k;
    }
    e.n = n;
}

/// One thread of the interpreter as the host sampler sees it ([`sample_threads`]).
pub struct PyThread<'a> {
    /// Its OS thread id (`native_thread_id`).
    pub tid: u64,
    /// Its Python frames, innermost first, and their ids (u32::MAX: none).
    pub frames: &'a [PyFrameRaw],
    pub ids: &'a [u32],
    /// The innermost frame is an idle wait of the standard library ([`is_idle_wait_file`]).
    pub idle: bool,
    /// The stack was walked anew (false: proven unchanged since the calling thread last looked).
    pub walked: bool,
}

/// The frame id of a frame read from another thread, given its code object's identity
/// (`co_firstlineno`, `co_filename`).
pub type IdOf<'a> = &'a mut dyn FnMut(&PyFrameRaw, (u32, usize)) -> Option<u32>;

/// For the host sampler: every thread state of the main interpreter (at most [`MAX_THREADS`])
/// that has Python frames, with its stack read through [`SafeMem`] only — no GIL, no interpreter
/// code — and handed to `f`. A stack unchanged since the calling thread last looked costs one
/// copy ([`still_valid`]), one walked anew a few ([`walk_windowed`]); frame ids come from `id_of`
/// once per walk. Returns how many thread states were looked at; None without Python or the safe
/// reader.
pub fn sample_threads(id_of: IdOf<'_>, f: &mut dyn FnMut(PyThread<'_>)) -> Option<usize> {
    let rt = runtime().ok()?;
    let m = safe_mem().ok()?;
    // SAFETY: both functions are loads of globals that need no GIL.
    let interp = unsafe {
        if (rt.is_initialized)() == 0 {
            return None;
        }
        (rt.interp_head?)() as usize
    };
    if !plausible(interp) {
        return None;
    }
    let l = rt.layout;
    let ts_bytes = (l.ts_native_thread_id + 8).max(l.ts_datastack_chunk + 16);
    SAMPLER_CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            let mut tb = [0u8; 384];
            let tb = &mut tb[..ts_bytes.min(384)];
            let mut ts = read_usize(m, interp + l.interp_threads_head)?;
            let mut seen = 0usize;
            while plausible(ts) && seen < MAX_THREADS {
                seen += 1;
                tb.fill(0);
                let slot = look_with(m, rt, &mut c, ts, tb, true);
                let next = rd_at::<usize>(tb, l.ts_next).unwrap_or(0);
                if let Some(i) = slot.filter(|&i| c.slots[i].n > 0) {
                    let tid = rd_at::<u64>(tb, l.ts_native_thread_id).unwrap_or(0);
                    let e = &mut c.slots[i];
                    let walked = !e.ids_ready;
                    if !e.ids_ready {
                        for k in 0..e.n {
                            let ident = match e.idents[k] {
                                (0, 0) => super::code_identity_other(&e.frames[k]),
                                known => Some(known),
                            };
                            e.ids[k] = ident
                                .and_then(|ident| id_of(&e.frames[k], ident))
                                .unwrap_or(u32::MAX);
                        }
                        e.ids_ready = true;
                    }
                    if tid != 0 {
                        f(PyThread {
                            tid,
                            frames: &e.frames[..e.n],
                            ids: &e.ids[..e.n],
                            idle: e.idle,
                            walked,
                        });
                    }
                }
                ts = next;
            }
            Some(seen)
        })
        .ok()
        .flatten()
}

/// Copy slot `i`'s frames into `out` (and their ids, resolved the first time, through `resolver`);
/// returns the count.
fn emit(c: &mut Cache, i: usize, out: &mut [PyFrameRaw], resolver: Option<Resolver<'_>>) -> usize {
    let e = &mut c.slots[i];
    let n = e.n.min(out.len());
    out[..n].copy_from_slice(&e.frames[..n]);
    if let Some((ids, resolve)) = resolver {
        if !e.ids_ready {
            for (id, f) in e.ids.iter_mut().zip(&e.frames[..e.n]) {
                *id = resolve(f).unwrap_or(u32::MAX);
            }
            e.ids_ready = true;
        }
        let k = n.min(ids.len());
        ids[..k].copy_from_slice(&e.ids[..k]);
    }
    n
}

/// Fill `out` with the Python stack of the thread inferred to drive a call made on this thread
/// (which has no Python frame of its own), innermost first; returns the frame count and that
/// thread's OS id (`native_thread_id`). None when Python is absent, the safe reader is refused, or
/// no other thread has Python frames.
pub fn capture_other_thread(out: &mut [PyFrameRaw]) -> Option<(usize, u64)> {
    capture_other_thread_with(out, None)
}

/// Frame ids resolved by the caller for the frames of a cached stack: `ids` receives one id per
/// frame (u32::MAX where `resolve` gave none); `resolve` runs only the first time a stack is seen
/// (while its frames stay the same, its code objects are the same ones).
pub type Resolver<'a> = (&'a mut [u32], &'a mut dyn FnMut(&PyFrameRaw) -> Option<u32>);

/// [`capture_other_thread`], also giving the frames' ids (see [`Resolver`]).
pub fn capture_other_thread_with(
    out: &mut [PyFrameRaw],
    resolver: Option<Resolver<'_>>,
) -> Option<(usize, u64)> {
    let rt = runtime().ok()?;
    let m = safe_mem().ok()?;
    if out.is_empty() {
        return None;
    }
    if crate::stack::debug_cost_enabled() {
        DEBUG_READ.set((0, 0));
    }
    // SAFETY: both functions are loads of globals that need no GIL.
    let (own, interp) = unsafe {
        if (rt.is_initialized)() == 0 {
            return None;
        }
        ((rt.get_tstate)() as usize, (rt.interp_head?)() as usize)
    };
    if !plausible(interp) {
        return None;
    }
    CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            capture_with_cache(m, rt, &mut c, own, interp, out, resolver)
        })
        .ok()
        .flatten()
}

fn capture_with_cache(
    m: &SafeMem,
    rt: &Runtime,
    c: &mut Cache,
    own: usize,
    interp: usize,
    out: &mut [PyFrameRaw],
    resolver: Option<Resolver<'_>>,
) -> Option<(usize, u64)> {
    let l = rt.layout;
    // SAFETY: a load of a global that needs no GIL.
    let holder = rt.gil_holder.map(|f| unsafe { f() } as usize);
    let main_id = main_thread_id(m, rt);
    let ts_bytes = l.ts_native_thread_id + 8;
    let mut tb = [0u8; 192];
    let tb = &mut tb[..ts_bytes.min(192)];
    // The main thread, not idle and not holding the GIL, has the largest key there is (one main
    // thread): when it is so, no other candidate needs looking at (one read when its stack is
    // unchanged, instead of reads of every thread).
    if let Some((i, tid)) = main_fast(m, rt, c, tb, own, holder, main_id) {
        count(0);
        let n = emit(c, i, out, resolver);
        return (n > 0).then_some((n, tid));
    }
    count(1);
    let mut ts = read_usize(m, interp + l.interp_threads_head)?;
    let mut best: Option<(Candidate, usize, u64)> = None;
    let mut seen = 0usize;
    while plausible(ts) && seen < MAX_THREADS {
        seen += 1;
        let next = if ts != own {
            let slot = look(m, rt, c, ts, tb);
            let next = rd_at::<usize>(tb, l.ts_next).unwrap_or(0);
            if let Some(i) = slot.filter(|&i| c.slots[i].n > 0) {
                let gil_released = gil_released(rt, tb, holder, ts);
                let main = main_id.is_some()
                    && rd_at::<usize>(tb, l.ts_thread_id) == main_id.filter(|&v| v != 0);
                let tid = rd_at::<u64>(tb, l.ts_native_thread_id).unwrap_or(0);
                if main {
                    XT.main_ts.store(ts, Ordering::Relaxed);
                    XT.main_tid.store(tid, Ordering::Relaxed);
                }
                let cand = Candidate {
                    idle: c.slots[i].idle,
                    gil_released,
                    main,
                };
                if best
                    .as_ref()
                    .is_none_or(|b| rank_key(&cand) > rank_key(&b.0))
                {
                    best = Some((cand, ts, tid));
                }
            }
            next
        } else if m.read_into(ts, tb) {
            rd_at::<usize>(tb, l.ts_next).unwrap_or(0)
        } else {
            0
        };
        ts = next;
    }
    let (_, ts, tid) = best?;
    // The winner's slot, looked up again (a later candidate may have taken it).
    let i = match c.slots.iter().position(|e| e.ts == ts) {
        Some(i) => i,
        None => look(m, rt, c, ts, tb)?,
    };
    let n = emit(c, i, out, resolver);
    (n > 0).then_some((n, tid))
}

thread_local! {
    /// Debug (`GPUFL_DEBUG_COST=1`): ns of this thread's last check read and of a `getppid` just
    /// before it.
    pub static DEBUG_READ: std::cell::Cell<(u64, u64)> = const { std::cell::Cell::new((0, 0)) };
}

/// What cross-thread captures did, counted only with `GPUFL_DEBUG_COST=1`: [main thread taken
/// without a full look, full looks, stacks proven unchanged by one read, stacks walked anew,
/// stacks proven unchanged by direct loads (no system call)].
pub fn stats() -> &'static [AtomicU64; 5] {
    &XT.stats
}

fn count(i: usize) {
    if crate::stack::debug_cost_enabled() {
        XT.stats[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// "cross-thread (via): main thread directly A, full looks B, stacks unchanged C by a read and D
/// without a system call, walked E".
pub fn stats_line() -> String {
    let v: Vec<u64> = XT.stats.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    format!(
        "cross-thread ({:?}): main thread directly {}, full looks {}, stacks unchanged {} by a \
         read and {} without a system call, walked {}",
        safe_mem().map(|m| m.via).ok(),
        v[0],
        v[1],
        v[2],
        v[4],
        v[3]
    )
}

/// Mean cost of one fault-tolerant read (as `GPUFL_XTHREAD_READ` chose) of `iovecs` (1..=34)
/// 72-byte pieces of this thread's stack, ns over `iters` calls (benchmark of the system calls
/// the cross-thread path makes).
pub fn readv_cost(iovecs: usize, iters: u32) -> f64 {
    let Ok(m) = safe_mem() else {
        return -1.0;
    };
    let src = [7u8; FRAME_BYTES * CHAIN_CHECK];
    let k = iovecs.clamp(1, CHAIN_CHECK + 2).min(CHAIN_CHECK);
    let mut dst = [0u8; FRAME_BYTES * CHAIN_CHECK];
    let t = std::time::Instant::now();
    for _ in 0..iters {
        let mut reads: [(usize, &mut [u8]); CHAIN_CHECK] =
            std::array::from_fn(|_| (0, &mut [][..]));
        for (i, (r, chunk)) in reads
            .iter_mut()
            .zip(dst.chunks_mut(FRAME_BYTES))
            .enumerate()
        {
            *r = (src.as_ptr() as usize + i * FRAME_BYTES, chunk);
        }
        if !m.read_many(std::hint::black_box(&mut reads[..k])) {
            return -1.0;
        }
    }
    t.elapsed().as_nanos() as f64 / iters.max(1) as f64
}

fn main_thread_id(m: &SafeMem, rt: &Runtime) -> Option<usize> {
    let known = XT.main_id.load(Ordering::Relaxed);
    if known != 0 {
        return Some(known);
    }
    if rt.py_runtime == 0 {
        return None;
    }
    let v = read_usize(m, rt.py_runtime + rt.layout.rt_main_thread)?;
    XT.main_id.store(v, Ordering::Relaxed);
    Some(v)
}

/// Whether thread state `ts` (its first bytes in `tb`) is not holding the GIL.
fn gil_released(rt: &Runtime, tb: &[u8], holder: Option<usize>, ts: usize) -> bool {
    match (rt.layout.ts_status, holder) {
        (Some(off), _) => rd_at::<u8>(tb, off).is_some_and(|b| b & 0x10 == 0),
        (None, Some(h)) => h != ts,
        (None, None) => true,
    }
}

/// The main thread as the winner without looking at the others: its cache slot and OS id, when
/// its thread state is still the main thread's (ids checked), it runs Python, is not idle and does
/// not hold the GIL. None sends the caller to the full look.
fn main_fast(
    m: &SafeMem,
    rt: &Runtime,
    c: &mut Cache,
    tb: &mut [u8],
    own: usize,
    holder: Option<usize>,
    main_id: Option<usize>,
) -> Option<(usize, u64)> {
    let l = rt.layout;
    let main_id = main_id.filter(|&v| v != 0)?;
    let ts = XT.main_ts.load(Ordering::Relaxed);
    if !plausible(ts) || ts == own {
        return None;
    }
    let tid = XT.main_tid.load(Ordering::Relaxed);
    if let Some(i) = direct_unchanged(rt, c, ts, main_id, tid, holder) {
        count(4);
        let e = &c.slots[i];
        return (e.n > 0 && !e.idle).then_some((i, tid));
    }
    let i = look(m, rt, c, ts, tb)?;
    if rd_at::<usize>(tb, l.ts_thread_id) != Some(main_id)
        || rd_at::<u64>(tb, l.ts_native_thread_id) != Some(tid)
        || !gil_released(rt, tb, holder, ts)
    {
        return None;
    }
    let e = &c.slots[i];
    (e.n > 0 && !e.idle).then_some((i, tid))
}

/// `GPUFL_XTHREAD_DIRECT=0` turns [`direct_unchanged`] off (every check is a copy the kernel makes).
fn direct_enabled() -> bool {
    crate::options::knobs().xthread_direct
}

/// What the cross-thread path reads once per process, read now (at the recorder's start, not in
/// the first capture: /proc/self/maps of a PyTorch process takes ~2 ms to read).
pub(crate) fn prepare() {
    let _ = main_stack();
}

/// The main thread's C stack (`[stack]` of /proc/self/maps), read once: where CPython keeps the
/// `_PyCFrame` of each running evaluation loop. Empty when not found.
fn main_stack() -> (usize, usize) {
    *XT.main_stack.get_or_init(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        maps.lines()
            .find(|l| l.ends_with("[stack]"))
            .and_then(|l| {
                let (lo, rest) = l.split_once('-')?;
                let hi = rest.split_whitespace().next()?;
                Some((
                    usize::from_str_radix(lo, 16).ok()?,
                    usize::from_str_radix(hi, 16).ok()?,
                ))
            })
            .unwrap_or((0, 0))
    })
}

/// Largest root data-stack chunk believed (CPython's are 16 KiB unless a first frame needs more).
const ROOT_CHUNK_MAX: usize = 1 << 24;
/// `_PyStackChunk`: `previous`@0, `size`@8, `top`@16, `data`@24 (3.11 and 3.12).
const CHUNK_DATA: usize = 24;

/// Whether walked stack `e` may be checked by [`direct_unchanged`]: its thread state's `cframe`
/// lies in the main thread's C stack or in the thread state itself, and every checked frame in
/// the thread's root data-stack chunk (the last of the `datastack_chunk` → `previous` list, read
/// safely here) or in the main thread's C stack (3.12's entry frames). CPython never frees a thread's root chunk while its thread state lives
/// (`_PyThreadState_PopFrame`: "push_chunk ensures that the root chunk is never popped"; chunks
/// are freed with the thread state), and the C stack of the main thread is never unmapped.
fn directly_checkable(m: &SafeMem, rt: &Runtime, e: &Cached) -> bool {
    let l = rt.layout;
    if rt.is_finalizing.is_none() || e.check_len == 0 || !direct_enabled() {
        return false;
    }
    let (lo, hi) = main_stack();
    let in_ts = e.cframe >= e.ts && e.cframe < e.ts + 1024;
    if !(in_ts || (lo <= e.cframe && e.cframe + 16 <= hi)) {
        return false;
    }
    let Some(mut chunk) = read_usize(m, e.ts + l.ts_datastack_chunk) else {
        return false;
    };
    let mut steps = 0;
    loop {
        if !plausible(chunk) || steps > 64 {
            return false;
        }
        match read_usize(m, chunk) {
            Some(0) => break,
            Some(prev) => chunk = prev,
            None => return false,
        }
        steps += 1;
    }
    let Some(size) = read_usize(m, chunk + 8).filter(|&s| s > CHUNK_DATA && s <= ROOT_CHUNK_MAX)
    else {
        return false;
    };
    let (start, end) = (chunk + CHUNK_DATA, chunk + size);
    // 3.12's entry frames (owner CSTACK) are locals of the evaluation loop: on the C stack.
    e.chain[..e.check_len]
        .iter()
        .all(|&f| (f >= start && f + FRAME_BYTES <= end) || (lo <= f && f + FRAME_BYTES <= hi))
}

/// A word of this process's memory, loaded without a system call.
///
/// # Safety
/// `addr` is 8-aligned and lies in memory that stays mapped while this runs.
unsafe fn load(addr: usize) -> usize {
    // SAFETY: forwarded from the caller. The word may be written by its thread meanwhile: a
    // relaxed atomic load reads some value it held, never a fault.
    unsafe { (*(addr as *const AtomicUsize)).load(Ordering::Relaxed) }
}

/// The main thread's cached stack proven unchanged without a system call, when this calling
/// thread's cache holds it as [`directly_checkable`]: the interpreter is initialized and not
/// finalizing (the main thread state, its root chunk, lives until finalization frees it), the
/// thread state is still the main thread's and does not hold the GIL, and its current frame and
/// the checked frames' callers and instructions are those of the walk — the checks
/// [`still_valid`] makes, read directly. A system call costs 2–30 µs on a busy virtual machine
/// (the H100 machine inside a Trainer: `getppid` 2–3 µs, a check read 7–25 µs), this ~0.1 µs.
///
/// Interpreter finalization frees the main thread state's chunks only long after it marks
/// itself finalizing (garbage collection and module teardown come between); a capture that
/// found it not finalizing finishes its few loads well before.
fn direct_unchanged(
    rt: &Runtime,
    c: &Cache,
    ts: usize,
    main_id: usize,
    tid: u64,
    holder: Option<usize>,
) -> Option<usize> {
    let l = rt.layout;
    let fin = rt.is_finalizing?;
    let i = c.slots.iter().position(|e| e.ts == ts && e.direct)?;
    let e = &c.slots[i];
    // SAFETY: both are loads of globals that need no GIL. Every address loaded below was
    // checked by `directly_checkable` (8-aligned: `plausible`, and the layout's offsets are
    // multiples of 8): the main thread state and its root chunk live until finalization, which
    // has not begun; the `cframe` lies in the main thread's C stack or in the thread state.
    unsafe {
        if (rt.is_initialized)() == 0 || fin() != 0 {
            return None;
        }
        if load(ts + l.ts_cframe) != e.cframe
            || load(ts + l.ts_thread_id) != main_id
            || load(ts + l.ts_native_thread_id) as u64 != tid
        {
            return None;
        }
        let released = match (l.ts_status, holder) {
            (Some(off), _) => load(ts + off) & 0x10 == 0,
            (None, Some(h)) => h != ts,
            (None, None) => true,
        };
        if !released || load(e.cframe + l.cframe_current) != e.chain[0] {
            return None;
        }
        for k in 0..e.check_len {
            let f = e.chain[k];
            if load(f + l.fr_previous) != e.prevs[k] || load(f + l.fr_prev_instr) != e.instrs[k] {
                return None;
            }
        }
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranking_prefers_busy_released_main() {
        let c = |idle, gil_released, main| Candidate {
            idle,
            gil_released,
            main,
        };
        // The main thread blocked in backward() beats an idle monitor thread.
        assert_eq!(
            choose(&[c(true, true, false), c(false, true, true)]),
            Some(1)
        );
        // A worker blocked in a C call beats the main thread running Python.
        assert_eq!(
            choose(&[c(false, false, true), c(false, true, false)]),
            Some(1)
        );
        // Both blocked: the main thread.
        assert_eq!(
            choose(&[c(false, true, false), c(false, true, true)]),
            Some(1)
        );
        // An idle main thread loses to a busy worker holding the GIL.
        assert_eq!(
            choose(&[c(true, true, true), c(false, false, false)]),
            Some(1)
        );
        // Ties: the first.
        assert_eq!(
            choose(&[c(false, true, false), c(false, true, false)]),
            Some(0)
        );
        assert_eq!(choose(&[]), None);
    }

    fn chain_of(addrs: &[usize]) -> Cached {
        let mut e = Cached::new(0, 0);
        e.chain_len = addrs.len();
        e.chain[..addrs.len()].copy_from_slice(addrs);
        plan_ranges(&mut e);
        e
    }

    /// Every checked frame's offset points at its own bytes in the concatenated ranges.
    fn offsets_hold(e: &Cached) {
        let mut flat = Vec::new();
        for r in &e.ranges[..e.n_ranges] {
            flat.extend(r.0..r.0 + r.1);
        }
        for i in 0..e.check_len {
            assert_eq!(flat[e.offs[i] as usize], e.chain[i], "frame {i}");
            assert_eq!(
                flat[e.offs[i] as usize + FRAME_BYTES - 1],
                e.chain[i] + FRAME_BYTES - 1
            );
        }
    }

    #[test]
    fn a_data_stack_chain_is_read_as_one_range() {
        // Innermost first, at descending addresses 200-400 bytes apart, as in a data-stack chunk.
        let addrs: Vec<usize> = (0..20).map(|i| 0x7000_0000 - i * 300).collect();
        let e = chain_of(&addrs);
        assert_eq!((e.n_ranges, e.check_len), (1, 20));
        assert_eq!(
            e.ranges[0],
            (0x7000_0000 - 19 * 300, 19 * 300 + FRAME_BYTES)
        );
        offsets_hold(&e);
    }

    #[test]
    fn scattered_frames_take_a_range_each_and_the_check_stops_where_they_run_out() {
        // Two frames in one chunk, then frames a megabyte apart (generators, another chunk).
        let mut addrs = vec![0x7000_0000, 0x7000_0000 - 400];
        addrs.extend((1..6).map(|k| 0x7000_0000 + k * 0x10_0000));
        let e = chain_of(&addrs);
        assert_eq!(e.n_ranges, MAX_RANGES);
        // Frames 0-1 share a range; 2, 3 and 4 take the three others; 5 and 6 do not fit.
        assert_eq!(e.check_len, 5);
        offsets_hold(&e);
        // A span too wide for one range splits even when frames are close to each other.
        let wide: Vec<usize> = (0..CHAIN_CHECK).map(|i| 0x7000_0000 - i * 2000).collect();
        let e = chain_of(&wide);
        assert!(
            e.n_ranges > 1 && e.check_len > 4,
            "{} {}",
            e.n_ranges,
            e.check_len
        );
        let bytes: usize = e.ranges[..e.n_ranges].iter().map(|r| r.1).sum();
        assert!(bytes <= CHECK_BYTES_MAX);
        offsets_hold(&e);
    }

    #[test]
    fn idle_wait_files() {
        assert!(is_idle_wait_file("/usr/lib/python3.12/threading.py"));
        assert!(is_idle_wait_file(
            "/opt/venv/lib/python3.12/multiprocessing/connection.py"
        ));
        assert!(!is_idle_wait_file("/home/u/threading.py"), "not the stdlib");
        assert!(!is_idle_wait_file(
            "/opt/venv/lib/python3.12/site-packages/torch/autograd/__init__.py"
        ));
    }

    #[test]
    fn safe_reads_fail_instead_of_faulting() {
        let m = safe_mem().expect("a fault-tolerant read works in the test sandbox");
        let v: u64 = 42;
        let mut b = [0u8; 8];
        assert!(m.read_into(&v as *const u64 as usize, &mut b));
        assert_eq!(u64::from_ne_bytes(b), 42);
        assert!(
            !m.read_into(4096, &mut b),
            "the zero page's neighbour is unmapped"
        );
        assert!(!m.read_into(0x7fff_ffff_0000_0000, &mut b));
        assert!(!m.read_into(usize::MAX - 3, &mut b));
    }

    /// Both ways of reading: a good read, a refused one, and a batch whose middle range is
    /// inaccessible refused as a whole without leaving bytes behind for the next read.
    #[test]
    fn both_ways_read_and_refuse_alike() {
        for via in [Via::Pipe, Via::VmReadv] {
            // SAFETY: getpid cannot fail.
            let m = SafeMem {
                pid: unsafe { libc::getpid() },
                via,
            };
            assert!(refuses_unreadable(&m), "{via:?}");
            let src: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
            let mut b = [0u8; 100];
            assert!(m.read_into(src.as_ptr() as usize + 50, &mut b), "{via:?}");
            assert_eq!(&b[..], &src[50..150]);
            // SAFETY: as in refuses_unreadable; unmapped at the end of the test.
            let page = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            assert_ne!(page, libc::MAP_FAILED);
            let (mut x, mut y, mut z) = ([0u8; 40], [0u8; 8], [0u8; 40]);
            let mut reads: [(usize, &mut [u8]); 3] = [
                (src.as_ptr() as usize, &mut x[..]),
                (page as usize, &mut y[..]),
                (src.as_ptr() as usize + 100, &mut z[..]),
            ];
            assert!(!m.read_many(&mut reads), "{via:?}");
            let mut reads: [(usize, &mut [u8]); 2] = [
                (src.as_ptr() as usize + 10, &mut x[..]),
                (src.as_ptr() as usize + 200, &mut z[..]),
            ];
            assert!(m.read_many(&mut reads), "{via:?}");
            assert_eq!(
                &x[..],
                &src[10..50],
                "{via:?}: nothing left over in between"
            );
            assert_eq!(&z[..], &src[200..240]);
            // SAFETY: the page mapped above.
            unsafe { libc::munmap(page, 4096) };
        }
    }

    #[test]
    fn no_python_no_capture() {
        let mut out = [PyFrameRaw::default(); 8];
        assert_eq!(capture_other_thread(&mut out), None);
        assert_eq!(unavailable_reason(), None);
    }
}
