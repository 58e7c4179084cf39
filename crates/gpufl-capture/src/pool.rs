//! Activity buffers handed to CUPTI: fixed-size, recycled, and capped so a writer that falls
//! behind makes CUPTI drop (and count) records instead of growing memory without bound.

use std::alloc::{alloc, Layout};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Bytes per buffer (as torch.profiler/Kineto uses).
pub const BUFFER_SIZE: usize = 4 << 20;
/// Most buffers alive at once (256 MiB).
pub const MAX_BUFFERS: usize = 64;
/// CUPTI requires 8-byte aligned buffers.
const ALIGN: usize = 8;

/// The buffers (the module's one static): free ones for reuse, how many are alive, and requests
/// refused at the cap.
struct Pool {
    free: Mutex<Vec<usize>>,
    live: AtomicUsize,
    refused: AtomicU64,
    retired: AtomicU64,
}

static POOL: Pool = Pool {
    free: Mutex::new(Vec::new()),
    live: AtomicUsize::new(0),
    refused: AtomicU64::new(0),
    retired: AtomicU64::new(0),
};

fn layout() -> Layout {
    // BUFFER_SIZE and ALIGN are valid constants.
    Layout::from_size_align(BUFFER_SIZE, ALIGN).unwrap_or(Layout::new::<u64>())
}

/// A buffer for CUPTI, or None when [`MAX_BUFFERS`] are already out.
pub fn take() -> Option<*mut u8> {
    if let Some(p) = POOL.free.lock().ok().and_then(|mut f| f.pop()) {
        return Some(p as *mut u8);
    }
    if POOL.live.fetch_add(1, Ordering::AcqRel) >= MAX_BUFFERS {
        POOL.live.fetch_sub(1, Ordering::AcqRel);
        POOL.refused.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    // SAFETY: layout has non-zero size.
    let p = unsafe { alloc(layout()) };
    if p.is_null() {
        POOL.live.fetch_sub(1, Ordering::AcqRel);
        POOL.refused.fetch_add(1, Ordering::Relaxed);
        return None;
    }
    Some(p)
}

/// Most buffers [`retire`] may hold back over a recording (always-on's detaches stop there).
pub const MAX_RETIRED: u64 = 32;

/// Buffers held back so far.
pub fn retired() -> u64 {
    POOL.retired.load(Ordering::Relaxed)
}

/// Hold back a buffer CUPTI handed over while it was being detached (crate::detach): it is never
/// given to CUPTI again nor freed, whatever CUPTI's finalize did with its own references to it.
/// It still counts as alive, so the cap holds.
pub fn retire(p: *mut u8) {
    if !p.is_null() {
        POOL.retired.fetch_add(1, Ordering::Relaxed);
    }
}

/// Return a buffer obtained from [`take`].
pub fn give_back(p: *mut u8) {
    if p.is_null() {
        return;
    }
    // A poisoned lock only happens after a panic elsewhere: leak the buffer rather than risk it.
    if let Ok(mut f) = POOL.free.lock() {
        f.push(p as usize);
    }
}

/// Times a buffer was refused since the last call (CUPTI then drops records, counted separately).
pub fn take_refused() -> u64 {
    POOL.refused.swap(0, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_recycled_and_capped() {
        let mut out = Vec::new();
        while let Some(p) = take() {
            out.push(p);
            assert!(out.len() <= MAX_BUFFERS);
        }
        assert_eq!(out.len(), MAX_BUFFERS);
        assert!(take_refused() >= 1);
        let first = out[0];
        for p in out.drain(..) {
            give_back(p);
        }
        let again = take().expect("a recycled buffer");
        assert!(POOL.free.lock().unwrap().len() == MAX_BUFFERS - 1);
        give_back(again);
        let _ = first;
    }
}
