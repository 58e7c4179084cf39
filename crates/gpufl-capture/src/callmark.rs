//! Which CUDA call each thread is inside: a per-thread marker the host sampler reads
//! ([`crate::hostsampler`], state `cuda` of `hsample` records), and the outermost-call test of
//! the hostcall callbacks ([`crate::hostcalls`]).
//!
//! A fixed registry of [`SLOTS`] slots, each an OS thread id and a call word. A thread claims a
//! slot at its first API callback (compare-and-swap on the thread id, probing from a hash of it;
//! cold, once per thread) and gives it back when it exits (a thread-local destructor). Every
//! enabled API callback — synchronizations, launches, copies, memsets, hostcalls — marks its
//! entry and exit here: one thread-local read and write and one relaxed atomic store, no lock, no
//! allocation. The marker holds the thread's *outermost* call: a driver call made inside a
//! runtime call (`cuMemAlloc` inside `cudaMalloc`) leaves it as it is, and its exit does not clear
//! it.
//!
//! A call whose exit is never seen (its callbacks switched off while it ran: a pause, an
//! always-on window closing) would leave its marker set: a marker carries the callbacks' epoch
//! ([`crate::sites::epoch`], bumped at every switch), and one from an older epoch is stale — the
//! sampler does not believe it, and the thread's next call replaces it. Runtime calls do not nest
//! in runtime calls, nor driver calls in driver calls, so an entry of the marker's own domain
//! also replaces it.
//!
//! A thread that finds every slot taken keeps its marker in its thread-local word only (the
//! outermost-call test still holds; the sampler does not see it in a CUDA call), counted in
//! [`full`].

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Threads the registry holds at once.
pub const SLOTS: usize = 256;

/// A slot: the OS thread id that owns it (0: free) and its call word ([`pack`]; 0: in no call).
struct Slot {
    tid: AtomicU64,
    call: AtomicU64,
}

struct Registry {
    slots: [Slot; SLOTS],
    /// Threads that found no free slot.
    full: AtomicU64,
}

static REG: Registry = Registry {
    slots: [const {
        Slot {
            tid: AtomicU64::new(0),
            call: AtomicU64::new(0),
        }
    }; SLOTS],
    full: AtomicU64::new(0),
};

/// The calling thread's slot: an index, or [`UNCLAIMED`] (its first callback claims one), or
/// [`NO_SLOT`] (none was free, or the thread is exiting).
const UNCLAIMED: u32 = u32::MAX;
const NO_SLOT: u32 = u32::MAX - 1;

thread_local! {
    static SLOT: Cell<u32> = const { Cell::new(UNCLAIMED) };
    /// The thread's call word (the slot's, also kept when it has no slot).
    static CALL: Cell<u64> = const { Cell::new(0) };
    /// Gives the slot back when the thread exits (touched once, when it is claimed).
    static RELEASE: Release = const { Release };
}

struct Release;

impl Drop for Release {
    fn drop(&mut self) {
        let i = SLOT.try_with(|s| s.replace(NO_SLOT)).unwrap_or(NO_SLOT);
        if let Some(slot) = REG.slots.get(i as usize) {
            // Still ours (not given back by `forget` and claimed by another thread since).
            let tid = crate::procinfo::gettid();
            if slot.tid.load(Ordering::Relaxed) == tid {
                slot.call.store(0, Ordering::Relaxed);
                let _ = slot
                    .tid
                    .compare_exchange(tid, 0, Ordering::AcqRel, Ordering::Relaxed);
            }
        }
    }
}

/// The call a thread is inside, as its marker says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    /// CUPTI callback domain and id of the outermost call.
    pub domain: u32,
    pub cbid: u32,
    /// The callbacks' epoch at its entry (low 16 bits).
    pub epoch: u16,
}

/// The call word of a call: bit 63 (in a call), the epoch's low 16 bits at 32, the domain at 24,
/// the callback id below (CUPTI's ids end well below 2^24).
pub fn pack(domain: u32, cbid: u32, epoch: u32) -> u64 {
    (1 << 63)
        | (u64::from(epoch as u16) << 32)
        | (u64::from(domain & 0xff) << 24)
        | u64::from(cbid & 0xff_ffff)
}

/// The call of a call word, None for 0 (in no call).
pub fn unpack(w: u64) -> Option<Mark> {
    (w >> 63 == 1).then_some(Mark {
        domain: ((w >> 24) & 0xff) as u32,
        cbid: (w & 0xff_ffff) as u32,
        epoch: (w >> 32) as u16,
    })
}

impl Mark {
    /// Whether the marker is current in `epoch` (else its exit may have gone unseen).
    pub fn current(&self, epoch: u32) -> bool {
        self.epoch == epoch as u16
    }
}

/// The calling thread's slot, claimed at its first call.
#[inline]
fn slot() -> Option<&'static Slot> {
    let i = SLOT.try_with(Cell::get).unwrap_or(NO_SLOT);
    match i {
        UNCLAIMED => claim(),
        NO_SLOT => None,
        i => REG.slots.get(i as usize),
    }
}

#[cold]
fn claim() -> Option<&'static Slot> {
    let tid = crate::procinfo::gettid();
    let home = (tid.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % SLOTS;
    for k in 0..SLOTS {
        let i = (home + k) % SLOTS;
        let s = &REG.slots[i];
        if s.tid.load(Ordering::Relaxed) == 0
            && s.tid
                .compare_exchange(0, tid, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            s.call.store(0, Ordering::Relaxed);
            let _ = SLOT.try_with(|c| c.set(i as u32));
            // Registers the destructor that gives the slot back.
            let _ = RELEASE.try_with(|_| ());
            return Some(s);
        }
    }
    REG.full.fetch_add(1, Ordering::Relaxed);
    let _ = SLOT.try_with(|c| c.set(NO_SLOT));
    None
}

fn set(w: u64) {
    let _ = CALL.try_with(|c| c.set(w));
    if let Some(s) = slot() {
        s.call.store(w, Ordering::Relaxed);
    }
}

/// A call's entry on this thread in callback epoch `epoch`: true when it is the thread's
/// outermost call (it is marked), false when it is a driver call inside a runtime call or the
/// reverse (the marker stays).
#[inline]
pub fn enter(domain: u32, cbid: u32, epoch: u32) -> bool {
    let cur = CALL.try_with(Cell::get).unwrap_or(0);
    if let Some(m) = unpack(cur) {
        if m.current(epoch) && m.domain != domain {
            return false;
        }
    }
    set(pack(domain, cbid, epoch));
    true
}

/// A call's exit on this thread: true when it closes the marked (outermost) call, which is then
/// cleared.
#[inline]
pub fn exit(domain: u32, cbid: u32) -> bool {
    let cur = CALL.try_with(Cell::get).unwrap_or(0);
    match unpack(cur) {
        Some(m) if m.domain == domain && m.cbid == cbid => {
            set(0);
            true
        }
        _ => false,
    }
}

/// The call marked on this thread, if any (tests and the hostcall callbacks).
pub fn current() -> Option<Mark> {
    unpack(CALL.try_with(Cell::get).unwrap_or(0))
}

/// Every thread in the registry with its call word: `f(tid, word)` (the sampler's read; a slot
/// claimed or given back meanwhile may be seen either way).
pub fn each(mut f: impl FnMut(u64, u64)) {
    for s in &REG.slots {
        let tid = s.tid.load(Ordering::Acquire);
        if tid != 0 {
            f(tid, s.call.load(Ordering::Relaxed));
        }
    }
}

/// Give back the slot of thread `tid`, which no longer exists (the sampler found its /proc entry
/// gone: a thread that exited without running its destructors).
pub fn forget(tid: u64) {
    for s in &REG.slots {
        if s.tid.load(Ordering::Relaxed) == tid {
            s.call.store(0, Ordering::Relaxed);
            let _ = s
                .tid
                .compare_exchange(tid, 0, Ordering::AcqRel, Ordering::Relaxed);
        }
    }
}

/// Threads that found every slot taken, so far.
pub fn full() -> u64 {
    REG.full.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cupti::{DOMAIN_DRIVER as DRV, DOMAIN_RUNTIME as RT};

    fn word_of(tid: u64) -> Option<u64> {
        let mut w = None;
        each(|t, c| {
            if t == tid {
                w = Some(c);
            }
        });
        w
    }

    #[test]
    fn words_pack_and_unpack() {
        let w = pack(RT, 20, 0x1_0007);
        assert_eq!(
            unpack(w),
            Some(Mark {
                domain: RT,
                cbid: 20,
                epoch: 7
            })
        );
        assert!(unpack(w).unwrap().current(7) && !unpack(w).unwrap().current(8));
        assert_eq!(unpack(0), None);
        assert_ne!(pack(DRV, 0, 0), 0, "a call word is never 0");
    }

    #[test]
    fn the_outermost_call_is_marked_and_seen_from_another_thread() {
        std::thread::spawn(|| {
            let tid = crate::procinfo::gettid();
            assert!(enter(RT, 20, 3)); // cudaMalloc
            assert_eq!(word_of(tid).and_then(unpack).map(|m| m.cbid), Some(20));
            // cuMemAlloc inside it: nested, the marker stays.
            assert!(!enter(DRV, 243, 3));
            assert!(!exit(DRV, 243));
            assert_eq!(current().map(|m| (m.domain, m.cbid)), Some((RT, 20)));
            assert!(exit(RT, 20));
            assert_eq!(current(), None);
            assert_eq!(word_of(tid), Some(0));
            // A driver call made directly is outermost.
            assert!(enter(DRV, 243, 3));
            assert!(exit(DRV, 243));
            // An exit without its entry closes nothing.
            assert!(!exit(RT, 22));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_stale_marker_is_replaced() {
        std::thread::spawn(|| {
            // A runtime call whose exit went unseen (callbacks switched: epoch 1 -> 2).
            assert!(enter(RT, 211, 1));
            // In the new epoch a driver call is not nested in it.
            assert!(enter(DRV, 307, 2));
            assert!(exit(DRV, 307));
            // A runtime call's entry replaces a leftover runtime marker of the same epoch.
            assert!(enter(RT, 211, 2));
            assert!(enter(RT, 22, 2));
            assert!(exit(RT, 22));
        })
        .join()
        .unwrap();
    }

    #[test]
    fn an_exiting_thread_gives_its_slot_back() {
        let tid = std::thread::spawn(|| {
            assert!(enter(RT, 31, 0));
            crate::procinfo::gettid()
        })
        .join()
        .unwrap();
        assert_eq!(word_of(tid), None, "slot of thread {tid} still held");
        // A thread that no longer exists is forgotten on request.
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let h = std::thread::spawn(move || {
            assert!(enter(RT, 31, 0));
            tx.send(crate::procinfo::gettid()).unwrap();
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        assert!(word_of(tid).is_some());
        forget(tid);
        assert_eq!(word_of(tid), None);
        done_tx.send(()).unwrap();
        h.join().unwrap();
    }
}
