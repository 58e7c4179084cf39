//! Always-on: CUPTI detached and attached again after each window of GPU activity.
//!
//! Once CUPTI's kernel tracing has been on in a process, the launching thread keeps paying for it
//! after it is turned off — globally or per context, flushed or not: ~0.5–1 µs a launch on the
//! H100, 15–20 % of a launch-bound C++ loop, for the rest of the run after the first window
//! (`scripts/probe/kernlinger.cu`, docs/benchmarks.md). Only detaching CUPTI (`cuptiFinalize`)
//! takes it away. So, some time after a window closes (its kernels have run), the writer asks for
//! a detach ([`request`]); the next CUDA runtime call to return on any thread of the program does
//! it at its exit callsite, as CUPTI asks (buffers flushed, then `cuptiFinalize`: [`on_api_exit`]).
//! While a detach is pending the recorder's threads make no CUPTI call (the trace clock reads
//! CLOCK_REALTIME, which CUPTI's timestamps follow) and callbacks record nothing;
//! the writer then subscribes again and turns the mode's collection back on
//! (`collection::detach_cycle`). Nothing is collected between the two (a few ms: a
//! synchronization or NVTX range in that gap is missed); the end notice gives the count and cost.
//!
//! No thread detaches before the writer's own CUPTI calls for the request are done ([`arm`]), nor
//! while a callback or recorder call into CUPTI begun before the request is under way ([`enter`]:
//! counted only where a detach may happen, whose trace clock never asks CUPTI).
//!
//! **Callbacks are never switched off while attached.** CUPTI 13.0 corrupts its own heap when a
//! callback a program thread may be dispatching is switched off and CUPTI is detached later
//! (`scripts/probe/detachloop.cu` case 12, CUPTI alone); so where a detach may happen
//! ([`possible`]) gpufl switches callbacks on but never off (`collection::switch_callback`), and
//! their handlers drop what is off in name until the next detach removes them.
//!
//! Always-on's default; `GPUFL_DETACH=0` keeps CUPTI attached (docs/benchmarks.md).

use crate::cupti::{self, Cupti};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Nothing asked.
const IDLE: u8 = 0;
/// The writer asks: callbacks record nothing and make no CUPTI call; the writer is still
/// turning on the runtime callbacks, so no thread may detach yet.
const REQUESTED: u8 = 1;
/// The writer's CUPTI calls are done: the next runtime API exit detaches.
const ARMED: u8 = 5;
/// A program thread is detaching.
const FINALIZING: u8 = 2;
/// Detached: the writer attaches again.
const DETACHED: u8 = 3;
/// `cuptiFinalize` failed or was not tried: CUPTI is still attached.
const FAILED: u8 = 4;

/// How long a detaching thread waits for other threads' callbacks (and recorder threads' CUPTI
/// calls) begun before the request to end; past it, it does not detach.
const QUIET_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// The detach handshake (the module's one static; atomics only).
struct Handshake {
    /// [`possible`].
    possible: AtomicBool,
    state: AtomicU8,
    /// Callbacks and recorder calls into CUPTI under way, counted only where a detach
    /// may happen ([`enter`]): `cuptiFinalize` runs only once none is.
    in_flight: AtomicU32,
    /// How long the program's thread spent detaching (ns), for the writer.
    finalize_ns: AtomicU64,
    /// The correlation id of the call that detached (CUPTI numbers calls afresh after a detach).
    last_corr: AtomicU32,
    /// Added to every correlation id CUPTI gives, so that ids stay unique across detaches.
    corr_base: AtomicU32,
    /// Detaches so far ([`generation`]).
    generation: AtomicU32,
}

static HANDSHAKE: Handshake = Handshake {
    possible: AtomicBool::new(false),
    state: AtomicU8::new(IDLE),
    in_flight: AtomicU32::new(0),
    finalize_ns: AtomicU64::new(0),
    last_corr: AtomicU32::new(0),
    corr_base: AtomicU32::new(0),
    generation: AtomicU32::new(0),
};

/// Room left above the detaching call's correlation id for calls other threads made meanwhile.
const CORR_MARGIN: u32 = 1 << 16;

/// What to add to a correlation id CUPTI gives now (0 until the first detach).
#[inline]
pub(crate) fn corr_base() -> u32 {
    HANDSHAKE.corr_base.load(Ordering::Relaxed)
}

/// The correlation id of an API callback, unique across detaches (CUPTI's own plus
/// [`corr_base`]).
///
/// # Safety
/// `data` points at the `CUpti_CallbackData` of an API callback.
#[inline]
pub(crate) unsafe fn callback_corr(data: *const std::ffi::c_void) -> u32 {
    use std::mem::offset_of;
    type D = cupti::sys::CUpti_CallbackData;
    // SAFETY: as the caller guarantees; a u32 field of CUpti_CallbackData.
    unsafe { cupti::cb_field::<u32>(data, offset_of!(D, correlationId)) }.wrapping_add(corr_base())
}

/// Detached: ids from now on continue above the last generation's (the writer, before
/// attaching again).
pub(crate) fn advance_corr_base() {
    let next = next_base(corr_base(), HANDSHAKE.last_corr.load(Ordering::Relaxed));
    HANDSHAKE.corr_base.store(next, Ordering::Relaxed);
    HANDSHAKE.generation.fetch_add(1, Ordering::Relaxed);
}

/// How many times CUPTI was detached so far: a thread's state from an older generation may
/// wait for an exit callback that never came.
#[inline]
pub(crate) fn generation() -> u32 {
    HANDSHAKE.generation.load(Ordering::Relaxed)
}

fn next_base(base: u32, last_corr: u32) -> u32 {
    base.wrapping_add(last_corr).wrapping_add(CORR_MARGIN)
}

/// Whether a detach is asked for or under way.
#[cfg(test)]
fn pending() -> bool {
    HANDSHAKE.state.load(Ordering::Relaxed) != IDLE
}

/// Whether detaching can happen in this process at all (always-on, unless `GPUFL_DETACH=0`; set
/// by the recorder's start, [`set_possible`]): then every callback and the trace clock take part
/// in the handshake ([`enter`], [`crate::cupti::Cupti::timestamp`]) and API callbacks are never
/// switched off while CUPTI stays attached (`collection::switch_callback`).
#[inline]
pub(crate) fn possible() -> bool {
    HANDSHAKE.possible.load(Ordering::Relaxed)
}

/// The recorder's start, before its first CUPTI call: whether this recording may detach.
pub(crate) fn set_possible(on: bool) {
    HANDSHAKE.possible.store(on, Ordering::Relaxed);
}

/// A callback (or a recorder thread's CUPTI call) under way: `cuptiFinalize` waits for it.
pub(crate) struct InFlight(());

impl Drop for InFlight {
    fn drop(&mut self) {
        HANDSHAKE.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A detach is pending: the caller must make no CUPTI call.
#[derive(Debug)]
pub(crate) struct Pending;

/// Before a callback's work: `Ok(None)` when detaching is off (nothing counted), `Ok(Some)` while
/// the work may call CUPTI (counted until dropped), `Err(Pending)` when a detach is asked for.
/// The count goes up before the state is read and the detaching thread sets the state before it
/// reads the count, so either this sees the request or the detach waits for this.
#[inline]
pub(crate) fn enter() -> Result<Option<InFlight>, Pending> {
    if !possible() {
        return Ok(None);
    }
    counted().map(Some)
}

fn counted() -> Result<InFlight, Pending> {
    HANDSHAKE.in_flight.fetch_add(1, Ordering::SeqCst);
    let guard = InFlight(());
    if HANDSHAKE.state.load(Ordering::SeqCst) != IDLE {
        return Err(Pending);
    }
    Ok(guard)
}

/// Whether a thread is detaching now: buffers CUPTI completes meanwhile are not used again
/// (crate::pool::retire), whatever CUPTI does with its own references to them at finalize.
#[inline]
pub(crate) fn finalizing() -> bool {
    HANDSHAKE.state.load(Ordering::SeqCst) == FINALIZING
}

/// The writer asks for a detach; no thread takes it before [`arm`].
pub(crate) fn request() {
    HANDSHAKE.finalize_ns.store(0, Ordering::Relaxed);
    HANDSHAKE.state.store(REQUESTED, Ordering::SeqCst);
}

/// The writer's own CUPTI calls for the request are done: the next API exit may detach.
pub(crate) fn arm() {
    let _ = HANDSHAKE
        .state
        .compare_exchange(REQUESTED, ARMED, Ordering::SeqCst, Ordering::SeqCst);
}

/// What the program's threads did with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Not yet taken.
    Waiting,
    /// A thread is detaching.
    Finalizing,
    /// Detached, in this many ns of that thread's time.
    Detached(u64),
    /// `cuptiFinalize` refused, or other callbacks did not end in time: still attached.
    Failed,
}

pub(crate) fn answer() -> Answer {
    match HANDSHAKE.state.load(Ordering::SeqCst) {
        FINALIZING => Answer::Finalizing,
        DETACHED => Answer::Detached(HANDSHAKE.finalize_ns.load(Ordering::Relaxed)),
        FAILED => Answer::Failed,
        _ => Answer::Waiting,
    }
}

/// Withdraw a request no thread has taken. False when a thread took it meanwhile.
pub(crate) fn withdraw() -> bool {
    [REQUESTED, ARMED].into_iter().any(|from| {
        HANDSHAKE
            .state
            .compare_exchange(from, IDLE, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    })
}

/// The request is over (attached again, or given up).
pub(crate) fn done() {
    HANDSHAKE.state.store(IDLE, Ordering::SeqCst);
}

/// Wait (bounded) until no callback or recorder call into CUPTI is under way.
fn quiet() -> bool {
    let t0 = std::time::Instant::now();
    while HANDSHAKE.in_flight.load(Ordering::SeqCst) != 0 {
        if t0.elapsed() > QUIET_WAIT {
            return false;
        }
        std::hint::spin_loop();
    }
    true
}

/// At an API callback while a detach is pending (a program thread, holding no [`InFlight`]):
/// at an exit callsite of an armed request, the first thread to get here waits for the other
/// callbacks to end, flushes CUPTI's buffers to the writer and detaches it. Returns the answer
/// for the writer, to [`publish`] once this callback has returned to CUPTI's dispatch as far
/// as it can (the writer attaches again on it).
///
/// # Safety
/// Called from a CUPTI API callback at its exit callsite, `corr` its correlation id.
pub(crate) unsafe fn on_api_exit(c: &Cupti, corr: u32) -> Option<Finalized> {
    if HANDSHAKE
        .state
        .compare_exchange(ARMED, FINALIZING, Ordering::SeqCst, Ordering::Relaxed)
        .is_err()
    {
        return None;
    }
    HANDSHAKE.last_corr.store(corr, Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    let (Some(finalize), true) = (c.finalize, quiet()) else {
        return Some(Finalized(FAILED));
    };
    // SAFETY: plain CUPTI calls at an API exit callsite, as cuptiFinalize's documentation asks,
    // with no other callback or recorder call into CUPTI under way.
    let rc = unsafe {
        (c.activity_flush_all)(cupti::FLUSH_FORCED);
        finalize()
    };
    HANDSHAKE
        .finalize_ns
        .store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    Some(Finalized(if rc == cupti::SUCCESS {
        DETACHED
    } else {
        FAILED
    }))
}

/// How a thread's detach ended, not yet told to the writer.
#[must_use]
pub(crate) struct Finalized(u8);

/// Tell the writer (last thing in the callback that detached).
pub(crate) fn publish(f: Finalized) {
    HANDSHAKE.state.store(f.0, Ordering::SeqCst);
}

/// The detaches of a recording, for the end notice.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub detached: u64,
    /// Requests no API call answered in time.
    pub missed: u64,
    /// Requests given up because other threads' callbacks were still under way (or
    /// `cuptiFinalize` refused).
    pub refused: u64,
    pub finalize_ns_total: u64,
    pub finalize_ns_max: u64,
    /// Time from the detach to collection on again, summed.
    pub gap_ns_total: u64,
}

impl Tally {
    pub fn add(&mut self, finalize_ns: u64, gap_ns: u64) {
        self.detached += 1;
        self.finalize_ns_total += finalize_ns;
        self.finalize_ns_max = self.finalize_ns_max.max(finalize_ns);
        self.gap_ns_total += gap_ns;
    }

    /// The end notice's clause, or None when nothing was asked.
    pub fn describe(&self) -> Option<String> {
        if self.detached == 0 && self.missed == 0 && self.refused == 0 {
            return None;
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut s = format!(
            "CUPTI detached after {} windows (so that tracing costs nothing between them): {:.1} ms of the program's time each on average (most {:.1} ms), {:.1} ms in all without collection",
            self.detached,
            if self.detached > 0 {
                ms(self.finalize_ns_total) / self.detached as f64
            } else {
                0.0
            },
            ms(self.finalize_ns_max),
            ms(self.gap_ns_total)
        );
        if self.missed > 0 {
            s.push_str(&format!(
                "; {} times no CUDA call came to detach at",
                self.missed
            ));
        }
        if self.refused > 0 {
            s.push_str(&format!(
                "; {} times other threads' CUDA callbacks were still running",
                self.refused
            ));
        }
        Some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_handshake_goes_round_once() {
        // No CUPTI here: a Cupti can't be built, so the thread's part is played by hand. One
        // test for the whole static, so that no other test moves it meanwhile.
        let before = counted().expect("nothing pending");
        request();
        assert!(pending());
        assert!(
            counted().is_err(),
            "a callback begun after the request calls no CUPTI"
        );
        // Not armed: no exit may take it yet.
        assert!(HANDSHAKE
            .state
            .compare_exchange(ARMED, FINALIZING, Ordering::SeqCst, Ordering::SeqCst)
            .is_err());
        arm();
        assert_eq!(answer(), Answer::Waiting);
        // A thread takes it; the writer can no longer withdraw it.
        assert!(HANDSHAKE
            .state
            .compare_exchange(ARMED, FINALIZING, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok());
        assert_eq!(answer(), Answer::Finalizing);
        assert!(!withdraw());
        // A callback begun before the request holds the detach back until it ends.
        let t0 = std::time::Instant::now();
        assert!(!quiet(), "a callback under way must keep CUPTI attached");
        assert!(t0.elapsed() >= QUIET_WAIT);
        let ended = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(5));
            drop(before);
        });
        assert!(quiet(), "once it ended, the detach goes on");
        ended.join().unwrap();
        HANDSHAKE.finalize_ns.store(1_500_000, Ordering::Relaxed);
        publish(Finalized(DETACHED));
        assert_eq!(answer(), Answer::Detached(1_500_000));
        done();
        assert!(!pending());
        assert_eq!(HANDSHAKE.in_flight.load(Ordering::SeqCst), 0);
        // Untaken, a request is withdrawn, armed or not.
        request();
        assert!(withdraw());
        assert!(!pending());
        request();
        arm();
        assert!(withdraw());
        assert!(!pending());
    }

    #[test]
    fn correlation_ids_continue_above_the_last_generation() {
        assert_eq!(next_base(0, 30_993), 30_993 + CORR_MARGIN);
        let b = next_base(0, 30_993);
        // CUPTI's next generation starts near 100: its ids land above every earlier one.
        assert!(b.wrapping_add(110) > 30_993);
        assert_eq!(next_base(u32::MAX - 5, 10), 4u32.wrapping_add(CORR_MARGIN));
    }

    #[test]
    fn the_tally_says_what_detaching_cost() {
        let mut t = Tally::default();
        assert_eq!(t.describe(), None);
        t.add(16_000_000, 20_000_000);
        t.add(18_000_000, 22_000_000);
        t.missed = 1;
        let s = t.describe().unwrap();
        assert!(s.contains("after 2 windows"), "{s}");
        assert!(s.contains("17.0 ms of the program's time each"), "{s}");
        assert!(s.contains("most 18.0 ms"), "{s}");
        assert!(s.contains("42.0 ms in all"), "{s}");
        assert!(s.contains("1 times no CUDA call"), "{s}");
    }
}
