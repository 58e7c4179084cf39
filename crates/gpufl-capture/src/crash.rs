//! Fatal signals: write what the recorder holds, then let the signal do what it would have done.
//!
//! On SIGABRT (`abort()`, and so `std::terminate`'s default handler), SIGSEGV, SIGBUS, SIGFPE,
//! SIGILL, SIGTERM and SIGINT the handler asks the recorder's writer thread to drain what it
//! holds (CUPTI's buffers with a forced flush, the stack and scope queues), write a `notice`
//! naming the signal and close a block, and waits for it at most [`FLUSH_DEADLINE`]. Then it
//! chains to the action the program had installed before the recorder (its handler, called with
//! the same arguments) or, if that was the default, restores the default action and lets it
//! happen: a fault raised by the hardware re-executes the faulting instruction when the handler
//! returns, any other signal is raised again, so the exit status and the core dump are the
//! program's. A signal the program ignored stays ignored.
//!
//! The handler does only async-signal-safe things: atomics, `getpid`/`gettid`, `clock_gettime`,
//! `futex`, `sigaction`, `raise`. It waits only when it runs in the recording process (a forked
//! child inherits the handler but not the writer thread: it chains at once), not on the writer
//! thread itself (a crash there must not wait for itself), and for one signal at a time (a second
//! thread crashing while the first waits chains at once). A writer that cannot finish in time —
//! blocked on a lock the crashing thread holds, say — is abandoned: the program goes on dying.
//! No `end` record is written: after SIGINT or SIGTERM a program handler may let it continue, and
//! its session then ends as usual at exit.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// Longest wait for the writer in a signal handler.
pub const FLUSH_DEADLINE: Duration = Duration::from_millis(1500);

/// The signals handled.
pub const SIGNALS: [i32; 7] = [
    libc::SIGABRT,
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGFPE,
    libc::SIGILL,
    libc::SIGTERM,
    libc::SIGINT,
];

const IDLE: u32 = 0;
const REQUESTED: u32 = 1;
const DONE: u32 = 2;

/// The actions the program had before ours, per signal number (written once, before our
/// handlers are installed; read only by the handler).
struct Saved(std::cell::UnsafeCell<[libc::sigaction; 65]>);
// SAFETY: written once under `install`'s Once before any handler can run, read-only afterwards.
unsafe impl Sync for Saved {}

/// What the signal handlers and the writer share (the module's one static): atomics only (and the
/// saved actions, written once before any handler runs), so the handlers stay async-signal-safe.
struct Crash {
    /// The futex word: IDLE, REQUESTED (by a handler) or DONE (by the writer).
    state: AtomicU32,
    /// The signal of the pending request.
    signo: AtomicI32,
    /// A handler is waiting (one at a time).
    busy: AtomicBool,
    /// The process that installed the handlers (the recording one).
    owner_pid: AtomicI32,
    /// The writer thread's id (0: none yet).
    writer_tid: AtomicI32,
    /// Set once the handlers are installed.
    installed: AtomicBool,
    /// The last hardware fault: its thread, instruction and address (0: none), for the writer's
    /// notice.
    fault_tid: AtomicI32,
    fault_pc: AtomicU64,
    fault_addr: AtomicU64,
    /// The program's actions before ours.
    saved: Saved,
    /// The handlers are installed once per process.
    install_once: std::sync::Once,
}

static CRASH: Crash = Crash {
    state: AtomicU32::new(IDLE),
    signo: AtomicI32::new(0),
    busy: AtomicBool::new(false),
    owner_pid: AtomicI32::new(0),
    writer_tid: AtomicI32::new(0),
    installed: AtomicBool::new(false),
    fault_tid: AtomicI32::new(0),
    fault_pc: AtomicU64::new(0),
    fault_addr: AtomicU64::new(0),
    // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, no flags).
    saved: Saved(std::cell::UnsafeCell::new(unsafe { std::mem::zeroed() })),
    install_once: std::sync::Once::new(),
};

pub use gpufl_trace::signals::signal_name;

/// The calling thread is the one that answers flush requests (the writer thread).
pub fn set_writer_thread() {
    CRASH
        .writer_tid
        .store(crate::procinfo::gettid() as i32, Ordering::SeqCst);
}

/// Install the handlers (once per process; `GPUFL_SIGNALS=0` leaves the program's signals alone).
/// Returns a notice when some could not be installed.
pub fn install() -> Option<String> {
    if !crate::options::knobs().signals {
        return None;
    }
    let mut failed = Vec::new();
    CRASH.install_once.call_once(|| {
        // SAFETY: getpid has no preconditions.
        CRASH
            .owner_pid
            .store(unsafe { libc::getpid() }, Ordering::SeqCst);
        for sig in SIGNALS {
            // SAFETY: plain sigaction calls; `CRASH.saved` is written here only, before the handler
            // for `sig` exists.
            unsafe {
                let saved = &mut (*CRASH.saved.0.get())[sig as usize];
                if libc::sigaction(sig, std::ptr::null(), saved) != 0 {
                    failed.push(signal_name(sig));
                    continue;
                }
                if saved.sa_sigaction == libc::SIG_IGN {
                    continue; // ignored by the program: it stays ignored, nothing to flush
                }
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_signal as *const () as usize;
                act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
                libc::sigemptyset(&mut act.sa_mask);
                if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
                    failed.push(signal_name(sig));
                }
            }
        }
        CRASH.installed.store(true, Ordering::SeqCst);
    });
    if failed.is_empty() {
        None
    } else {
        Some(format!(
            "crash flush not installed for {}",
            failed.join(", ")
        ))
    }
}

/// For the writer thread: the signal of a pending flush request, if any.
pub fn pending() -> Option<i32> {
    (CRASH.state.load(Ordering::Acquire) == REQUESTED).then(|| CRASH.signo.load(Ordering::Acquire))
}

/// For the writer thread: the request is served (the handler may go on).
pub fn served() {
    if CRASH
        .state
        .compare_exchange(REQUESTED, DONE, Ordering::AcqRel, Ordering::Acquire)
        .is_ok()
    {
        futex_wake(&CRASH.state);
    }
}

/// A hardware fault's thread, instruction and address, if one was caught.
pub fn last_fault() -> Option<(i32, u64, u64)> {
    let tid = CRASH.fault_tid.load(Ordering::Acquire);
    (tid != 0).then(|| {
        (
            tid,
            CRASH.fault_pc.load(Ordering::Relaxed),
            CRASH.fault_addr.load(Ordering::Relaxed),
        )
    })
}

/// Where the hardware fault being flushed for happened: ` (thread T, pc 0x… in MODULE at +0x…,
/// address 0x…)`, empty for a signal sent by `kill`.
pub fn fault_text() -> String {
    let Some((tid, pc, addr)) = last_fault() else {
        return String::new();
    };
    let place = match crate::unwind::module_of(pc) {
        Some((path, r)) => format!(" in {path} (+0x{:x} from its code's start)", pc - r.start),
        None => String::new(),
    };
    format!(" (thread {tid}, pc 0x{pc:x}{place}, address 0x{addr:x})")
}

/// A fault raised by the hardware (not `kill`): its instruction and address.
///
/// # Safety
/// `info` and `uctx` are the kernel's arguments to a SA_SIGINFO handler (or null).
unsafe fn fault_of(
    sig: i32,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) -> Option<(u64, u64)> {
    if info.is_null()
        || !matches!(
            sig,
            libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL
        )
    {
        return None;
    }
    // SAFETY: non-null siginfo from the kernel.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as u64) };
    if code <= 0 {
        return None;
    }
    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    let pc = if uctx.is_null() {
        0
    } else {
        // SAFETY: the kernel's ucontext for this signal.
        unsafe {
            (*(uctx as *const libc::ucontext_t)).uc_mcontext.gregs[libc::REG_RIP as usize] as u64
        }
    };
    #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
    let pc = {
        let _ = uctx;
        0
    };
    Some((pc, addr))
}

/// Say on stderr where a hardware fault happened, with async-signal-safe calls only: the
/// signal, the thread (id and name), the instruction and the address, and the mapping of the
/// instruction from /proc/self/maps (`path+offset`), so that a crash under the recorder can be
/// told apart from the program's own and located.
fn report_fault(sig: i32, tid: i32, pc: u64, addr: u64) {
    let mut b = Buf::new();
    b.s("gpufl: ");
    // No allocation here: the names of the faults this runs for.
    b.s(match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        _ => "SIGILL",
    });
    b.s(" on thread ");
    b.u(tid as u64);
    b.s(" (");
    let mut comm = [0u8; 32];
    let n = read_file(b"/proc/thread-self/comm\0", &mut comm);
    b.bytes(trim_nl(&comm[..n]));
    b.s(") at pc 0x");
    b.x(pc);
    b.s(", address 0x");
    b.x(addr);
    if let Some((path, off)) = mapping_of(pc) {
        b.s(" in ");
        b.bytes(&path.0[..path.1]);
        b.s("+0x");
        b.x(off);
    }
    if tid == CRASH.writer_tid.load(Ordering::Relaxed) {
        b.s(" [the recorder's writer thread]");
    }
    b.s("\n");
    // SAFETY: write(2) to stderr.
    unsafe { libc::write(2, b.buf.as_ptr().cast(), b.len) };
}

fn trim_nl(b: &[u8]) -> &[u8] {
    b.strip_suffix(b"\n").unwrap_or(b)
}

/// A fixed buffer formatter for the signal handler (no allocation).
struct Buf {
    buf: [u8; 512],
    len: usize,
}

impl Buf {
    fn new() -> Self {
        Buf {
            buf: [0; 512],
            len: 0,
        }
    }
    fn bytes(&mut self, b: &[u8]) {
        let n = b.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
    }
    fn s(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    fn u(&mut self, mut v: u64) {
        let mut d = [0u8; 20];
        let mut i = d.len();
        loop {
            i -= 1;
            d[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.bytes(&d[i..]);
    }
    fn x(&mut self, v: u64) {
        let mut d = [0u8; 16];
        let mut i = d.len();
        let mut v = v;
        loop {
            i -= 1;
            d[i] = b"0123456789abcdef"[(v & 15) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        self.bytes(&d[i..]);
    }
}

/// Read a small file (NUL-terminated path) with open/read/close.
fn read_file(path: &[u8], out: &mut [u8]) -> usize {
    // SAFETY: open/read/close are async-signal-safe; `path` is NUL-terminated.
    unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return 0;
        }
        let n = libc::read(fd, out.as_mut_ptr().cast(), out.len());
        libc::close(fd);
        n.max(0) as usize
    }
}

fn hex_val(b: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    if b.is_empty() || b.len() > 16 {
        return None;
    }
    for &c in b {
        let d = (c as char).to_digit(16)?;
        v = (v << 4) | u64::from(d);
    }
    Some(v)
}

/// The mapping of /proc/self/maps holding `pc`: its path (in a fixed buffer) and `pc`'s offset
/// in the file. Reads the file in 4 KiB pieces, carrying a partial line over.
fn mapping_of(pc: u64) -> Option<(([u8; 200], usize), u64)> {
    // SAFETY: open/read/close are async-signal-safe.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let mut buf = [0u8; 4096 + 512];
    let mut have = 0usize;
    let mut found = None;
    'outer: loop {
        // SAFETY: reading into our buffer's free tail.
        let n = unsafe { libc::read(fd, buf[have..].as_mut_ptr().cast(), buf.len() - have) };
        if n <= 0 {
            break;
        }
        have += n as usize;
        let mut start = 0;
        while let Some(nl) = buf[start..have].iter().position(|&c| c == b'\n') {
            let line = &buf[start..start + nl];
            start += nl + 1;
            // "lo-hi perms offset dev inode path"
            let mut f = line.split(|&c| c == b' ').filter(|w| !w.is_empty());
            let (Some(range), Some(_perms), Some(off)) = (f.next(), f.next(), f.next()) else {
                continue;
            };
            let Some(dash) = range.iter().position(|&c| c == b'-') else {
                continue;
            };
            let (Some(lo), Some(hi), Some(off)) = (
                hex_val(&range[..dash]),
                hex_val(&range[dash + 1..]),
                hex_val(off),
            ) else {
                continue;
            };
            if (lo..hi).contains(&pc) {
                let _dev = f.next();
                let _inode = f.next();
                let path = f.next().unwrap_or(b"[anonymous]");
                let mut p = [0u8; 200];
                let k = path.len().min(p.len());
                p[..k].copy_from_slice(&path[path.len() - k..]);
                found = Some(((p, k), pc - lo + off));
                break 'outer;
            }
        }
        // Keep the partial line; a line longer than the buffer is dropped.
        if start == 0 && have == buf.len() {
            have = 0;
        } else {
            buf.copy_within(start..have, 0);
            have -= start;
        }
    }
    // SAFETY: closing our descriptor.
    unsafe { libc::close(fd) };
    found
}

extern "C" fn on_signal(sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: errno location of this thread; restored before returning.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: getpid/gettid are async-signal-safe syscalls.
    let (pid, tid) = unsafe { (libc::getpid(), libc::syscall(libc::SYS_gettid) as i32) };
    // SAFETY: the kernel's arguments.
    if let Some((pc, addr)) = unsafe { fault_of(sig, info, uctx) } {
        CRASH.fault_pc.store(pc, Ordering::Relaxed);
        CRASH.fault_addr.store(addr, Ordering::Relaxed);
        CRASH.fault_tid.store(tid, Ordering::Release);
        report_fault(sig, tid, pc, addr);
    }
    if pid == CRASH.owner_pid.load(Ordering::Relaxed)
        && tid != CRASH.writer_tid.load(Ordering::Relaxed)
        && CRASH.writer_tid.load(Ordering::Relaxed) != 0
        && !CRASH.busy.swap(true, Ordering::AcqRel)
    {
        CRASH.signo.store(sig, Ordering::Release);
        CRASH.state.store(REQUESTED, Ordering::Release);
        wait_served(FLUSH_DEADLINE);
        CRASH.state.store(IDLE, Ordering::Release);
        CRASH.busy.store(false, Ordering::Release);
    }
    // SAFETY: chains with the arguments the kernel gave us.
    unsafe { chain(sig, info, uctx) };
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Wait (futex, bounded) until the writer marks the request served.
fn wait_served(limit: Duration) {
    let start = crate::clock::mono_ns();
    let limit = limit.as_nanos() as u64;
    while CRASH.state.load(Ordering::Acquire) == REQUESTED {
        let spent = crate::clock::mono_ns().saturating_sub(start);
        if spent >= limit {
            return; // abandoned: never a hang
        }
        let left = (limit - spent).min(50_000_000);
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: left as libc::c_long,
        };
        // SAFETY: futex wait on our own word with a relative timeout.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                CRASH.state.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                REQUESTED,
                &ts as *const libc::timespec,
            )
        };
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: futex wake on our own word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
}

/// Do what the signal would have done without the recorder.
///
/// # Safety
/// Called from the signal handler with the kernel's arguments.
unsafe fn chain(sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    // SAFETY: `CRASH.saved` is read-only once handlers run.
    let old = unsafe { &(*CRASH.saved.0.get())[sig as usize] };
    let h = old.sa_sigaction;
    if h == libc::SIG_IGN {
        return;
    }
    if h != libc::SIG_DFL {
        if old.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the program installed this as a three-argument handler.
            let f: extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, uctx);
        } else {
            // SAFETY: the program installed this as a one-argument handler.
            let f: extern "C" fn(i32) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
        return;
    }
    // The default action: restore it, then let it happen.
    // SAFETY: plain sigaction / raise calls.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut dfl.sa_mask);
        libc::sigaction(sig, &dfl, std::ptr::null_mut());
        let hardware = !info.is_null()
            && (*info).si_code > 0
            && matches!(
                sig,
                libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL
            );
        if !hardware {
            // Blocked while this handler runs: delivered, with the default action, on return.
            libc::raise(sig);
        }
        // A hardware fault re-executes the faulting instruction on return, now with the
        // default action: the same crash and core dump as without the recorder.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_libc() {
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(libc::SIGABRT), "SIGABRT");
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(libc::SIGBUS), "SIGBUS");
    }

    /// One test for the shared request word (tests run in parallel).
    #[test]
    fn requests_are_served_or_abandoned_in_time() {
        CRASH.state.store(REQUESTED, Ordering::SeqCst);
        let t = std::time::Instant::now();
        wait_served(Duration::from_millis(120));
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(100), "{waited:?}");
        assert!(waited < Duration::from_secs(2), "{waited:?}");

        CRASH.state.store(REQUESTED, Ordering::SeqCst);
        CRASH.signo.store(libc::SIGTERM, Ordering::SeqCst);
        let server = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(30));
            assert_eq!(pending(), Some(libc::SIGTERM));
            served();
        });
        let t = std::time::Instant::now();
        wait_served(Duration::from_secs(5));
        assert!(t.elapsed() < Duration::from_secs(2));
        assert_eq!(CRASH.state.load(Ordering::SeqCst), DONE);
        assert_eq!(pending(), None);
        server.join().unwrap();
        CRASH.state.store(IDLE, Ordering::SeqCst);
    }
}
