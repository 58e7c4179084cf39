//! Call-site stacks of launches, copies and memsets (`callsite` records), and the default streams
//! of each context (`stream` records).
//!
//! Which callback ids are launches or copies is read from CUPTI's own function names at start
//! (`cuptiGetCallbackName`), so new `_ptsz` / `_v2` variants are covered without a table of ids.
//!
//! Cost control on the hot path (the API-entry callback): a launch's stack is captured on the
//! first [`EVERY_LAUNCH_UNTIL`] launches of a kernel function by a thread, then at powers of two,
//! then every [`LAUNCH_PERIOD`]th launch; copies and memsets every time. Both are then limited by a
//! per-thread token bucket ([`BURST`] captures, refilled one per [`REFILL_NS`]), so a program that
//! launches or copies at a high rate spends at most ~3 % of a core on captures. The per-thread
//! state is fixed-size (no allocation, no lock).

use crate::cupti::{self, Cupti};
use crate::stack::{self, Sample};
use crossbeam_queue::ArrayQueue;
use gpufl_trace::StreamRole;
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Launches of one kernel function (per thread) that are all captured.
pub const EVERY_LAUNCH_UNTIL: u32 = 4;
/// After the powers of two, a launch is captured every this many launches of its function.
pub const LAUNCH_PERIOD: u32 = 1024;
/// Token bucket: captures a thread may make in a burst…
pub const BURST: u32 = 256;
/// …and the time that earns one more capture (50 µs: at ~1.5 µs a capture, ≤ 3 % of a core).
pub const REFILL_NS: u64 = 50_000;

/// Callback ids above this are not classified (CUPTI's tables end well below).
const MAX_CBID: usize = 1200;

/// What an API function is, for call-site capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteKind {
    /// A kernel launch; the kernel function handle is parameter `.0` (0 or 1) of the call.
    Launch(u8),
    /// A memcpy or memset.
    Copy,
}

/// Classify an API function by its name (version suffix stripped, e.g. `cudaLaunchKernel_ptsz`).
pub fn classify(name: &str) -> Option<SiteKind> {
    let launch_first = [
        "cudaLaunchKernel",
        "cudaLaunchCooperativeKernel",
        "__cudaLaunchKernel",
        "cuLaunchKernel",
        "cuLaunchCooperativeKernel",
    ];
    let launch_ex = ["cudaLaunchKernelExC", "cuLaunchKernelEx"];
    let base = name.strip_suffix("_ptsz").unwrap_or(name);
    if launch_ex.contains(&base) {
        return Some(SiteKind::Launch(1));
    }
    if launch_first.contains(&base) {
        return Some(SiteKind::Launch(0));
    }
    let is_copy = ["cudaMemcpy", "cuMemcpy", "cudaMemset", "cuMemset"]
        .iter()
        .any(|p| name.starts_with(p));
    is_copy.then_some(SiteKind::Copy)
}

/// Callback ids of launches / copies per domain, from CUPTI's names.
pub struct SiteTable {
    runtime: Box<[Option<SiteKind>]>,
    driver: Box<[Option<SiteKind>]>,
}

impl SiteTable {
    pub fn build(c: &Cupti) -> SiteTable {
        let names = |domain: u32| -> Box<[Option<SiteKind>]> {
            (0..=MAX_CBID as u32)
                .map(|id| c.callback_name(domain, id).and_then(|n| classify(&n)))
                .collect()
        };
        SiteTable {
            runtime: names(cupti::DOMAIN_RUNTIME),
            driver: names(cupti::DOMAIN_DRIVER),
        }
    }

    pub fn kind(&self, domain: u32, cbid: u32) -> Option<SiteKind> {
        let t = match domain {
            cupti::DOMAIN_RUNTIME => &self.runtime,
            cupti::DOMAIN_DRIVER => &self.driver,
            _ => return None,
        };
        t.get(cbid as usize).copied().flatten()
    }

    /// Every classified (domain, cbid).
    pub fn ids(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        let f = |domain: u32, t: &'_ [Option<SiteKind>]| {
            t.iter()
                .enumerate()
                .filter(|(_, k)| k.is_some())
                .map(move |(i, _)| (domain, i as u32))
                .collect::<Vec<_>>()
        };
        f(cupti::DOMAIN_RUNTIME, &self.runtime)
            .into_iter()
            .chain(f(cupti::DOMAIN_DRIVER, &self.driver))
    }
}

/// Slots of a thread's launch-count table.
const SLOTS: usize = 256;
const PROBES: usize = 8;

/// Per-thread sampler state (fixed size).
pub struct Sampler {
    keys: [u64; SLOTS],
    counts: [u32; SLOTS],
    tokens: u32,
    last_refill: u64,
}

impl Sampler {
    pub const fn new() -> Sampler {
        Sampler {
            keys: [0; SLOTS],
            counts: [0; SLOTS],
            tokens: BURST,
            last_refill: 0,
        }
    }

    /// Whether this launch of kernel function `key` is due for a capture by the schedule
    /// (before the rate limit). A full neighbourhood evicts the home slot (its count restarts).
    pub fn launch_due(&mut self, key: u64) -> bool {
        let key = key | 1; // 0 marks a free slot
        let h = (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % SLOTS;
        let mut slot = h;
        for i in 0..PROBES {
            let s = (h + i) % SLOTS;
            if self.keys[s] == key || self.keys[s] == 0 {
                slot = s;
                break;
            }
        }
        if self.keys[slot] != key {
            self.keys[slot] = key;
            self.counts[slot] = 0;
        }
        let n = self.counts[slot];
        self.counts[slot] = n.saturating_add(1);
        n < EVERY_LAUNCH_UNTIL || n.is_power_of_two() || n.is_multiple_of(LAUNCH_PERIOD)
    }

    /// Take a token at time `now_ns` (trace clock); false when the thread is over its rate.
    pub fn take_token(&mut self, now_ns: u64) -> bool {
        if self.last_refill == 0 {
            self.last_refill = now_ns;
        }
        let earned = now_ns.saturating_sub(self.last_refill) / REFILL_NS;
        if earned > 0 {
            self.tokens = (self.tokens as u64 + earned).min(BURST as u64) as u32;
            self.last_refill += earned * REFILL_NS;
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::new()
    }
}

struct ThreadState {
    sampler: Sampler,
    /// Depth of runtime launch/copy calls in progress (driver calls inside them are the same call).
    runtime_depth: u32,
    /// Context uid whose default streams this thread already reported.
    last_ctx: u32,
}

thread_local! {
    static STATE: RefCell<ThreadState> = const {
        RefCell::new(ThreadState {
            sampler: Sampler::new(),
            runtime_depth: 0,
            last_ctx: u32::MAX,
        })
    };
}

/// Captures skipped by the rate limit (written to the trace as a `dropped` record).
static RATE_LIMITED: AtomicU64 = AtomicU64::new(0);

/// Captures skipped by the rate limit since the last call.
pub fn take_rate_limited() -> u64 {
    RATE_LIMITED.swap(0, Ordering::Relaxed)
}

/// Default streams seen by the callbacks: (ctx uid, CUPTI stream id, role), deduplicated by the
/// writer.
pub fn stream_queue() -> &'static ArrayQueue<(u32, u32, StreamRole)> {
    static Q: OnceLock<ArrayQueue<(u32, u32, StreamRole)>> = OnceLock::new();
    Q.get_or_init(|| ArrayQueue::new(256))
}

/// What the callback needs from the recorder.
pub struct SiteCall<'a> {
    pub cupti: &'a Cupti,
    pub kind: SiteKind,
    pub domain: u32,
    pub cbid: u32,
    pub python: bool,
}

/// API entry or exit of a launch / copy / memset.
///
/// # Safety
/// `data` points at the CUpti_CallbackData of this callback.
pub unsafe fn on_site_api(call: SiteCall, data: *const c_void) {
    use std::mem::offset_of;
    type D = cupti::sys::CUpti_CallbackData;
    // SAFETY (all `cb_field` reads): CUpti_CallbackData field offsets and types.
    let site: u32 = unsafe { cupti::cb_field(data, offset_of!(D, callbackSite)) };
    let runtime = call.domain == cupti::DOMAIN_RUNTIME;
    let _ = STATE.try_with(|cell| {
        let Ok(mut st) = cell.try_borrow_mut() else {
            return;
        };
        if site != 0 {
            if runtime {
                st.runtime_depth = st.runtime_depth.saturating_sub(1);
            }
            return;
        }
        if runtime {
            st.runtime_depth += 1;
            if st.runtime_depth > 1 {
                return;
            }
        } else if st.runtime_depth > 0 {
            return; // the driver call inside a runtime call: already decided
        }
        let ctx_uid: u32 = unsafe { cupti::cb_field(data, offset_of!(D, contextUid)) };
        let ctx: *mut c_void = unsafe { cupti::cb_field(data, offset_of!(D, context)) };
        if ctx_uid != st.last_ctx && !ctx.is_null() {
            st.last_ctx = ctx_uid;
            // SAFETY: the context handle this callback received; NULL is the default stream.
            unsafe {
                let q = stream_queue();
                if let Some(id) = call.cupti.stream_id(ctx, std::ptr::null_mut(), false) {
                    let _ = q.push((ctx_uid, id, StreamRole::LegacyDefault));
                }
                if let Some(id) = call.cupti.stream_id(ctx, std::ptr::null_mut(), true) {
                    let _ = q.push((ctx_uid, id, StreamRole::PerThreadDefault));
                }
            }
        }
        let due = match call.kind {
            SiteKind::Copy => true,
            SiteKind::Launch(param) => {
                let params: *const u64 =
                    unsafe { cupti::cb_field(data, offset_of!(D, functionParams)) };
                let func = if params.is_null() {
                    0
                } else {
                    // SAFETY: every launch entry point has its function handle as parameter 0 (1
                    // for the Ex variants), pointer-sized, in its params struct.
                    unsafe { params.add(param as usize).read_unaligned() }
                };
                st.sampler.launch_due(func ^ ((call.cbid as u64) << 48))
            }
        };
        if !due {
            return;
        }
        let now = call.cupti.timestamp();
        if !st.sampler.take_token(now) {
            RATE_LIMITED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut s = Sample::empty();
        s.corr = unsafe { cupti::cb_field(data, offset_of!(D, correlationId)) };
        s.domain = call.domain;
        s.cbid = call.cbid;
        s.ctx = ctx_uid;
        s.tid = crate::procinfo::gettid();
        s.has_stack = true;
        stack::capture_into(&mut s, call.python);
        s.ts = now;
        s.end = now;
        stack::push(s);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_classify_launches_and_copies() {
        assert_eq!(classify("cudaLaunchKernel"), Some(SiteKind::Launch(0)));
        assert_eq!(classify("cudaLaunchKernel_ptsz"), Some(SiteKind::Launch(0)));
        assert_eq!(classify("cudaLaunchKernelExC"), Some(SiteKind::Launch(1)));
        assert_eq!(classify("cuLaunchKernelEx_ptsz"), Some(SiteKind::Launch(1)));
        assert_eq!(classify("cuLaunchKernel"), Some(SiteKind::Launch(0)));
        assert_eq!(classify("cudaMemcpyAsync"), Some(SiteKind::Copy));
        assert_eq!(classify("cuMemcpyDtoHAsync"), Some(SiteKind::Copy));
        assert_eq!(classify("cudaMemsetAsync_ptsz"), Some(SiteKind::Copy));
        assert_eq!(classify("cudaLaunchHostFunc"), None);
        assert_eq!(classify("cudaMalloc"), None);
        assert_eq!(classify("cudaStreamSynchronize"), None);
    }

    #[test]
    fn launch_schedule_is_first_few_then_powers_of_two_then_periodic() {
        let mut s = Sampler::new();
        let due: Vec<u32> = (0..5000u32).filter(|_| s.launch_due(0xabc0)).collect();
        let mut want: Vec<u32> = (0..5000u32)
            .filter(|&n| {
                n < EVERY_LAUNCH_UNTIL || n.is_power_of_two() || n.is_multiple_of(LAUNCH_PERIOD)
            })
            .collect();
        want.dedup();
        assert_eq!(due, want);
        assert!(due.len() < 25, "{} captures for 5000 launches", due.len());
        // Another function has its own count.
        assert!(s.launch_due(0xdef0));
    }

    #[test]
    fn a_full_table_evicts_and_never_fails() {
        let mut s = Sampler::new();
        for k in 0..10_000u64 {
            s.launch_due(k * 4096);
        }
        assert!(s.launch_due(7 * 4096 + 5), "a new key starts at count 0");
    }

    #[test]
    fn token_bucket_limits_the_rate() {
        let mut s = Sampler::new();
        let t0 = 1_000_000_000;
        let burst = (0..1000).filter(|_| s.take_token(t0)).count();
        assert_eq!(burst, BURST as usize);
        assert!(!s.take_token(t0 + REFILL_NS - 1));
        assert!(s.take_token(t0 + REFILL_NS));
        assert!(!s.take_token(t0 + REFILL_NS));
        // After a long pause the bucket is full again, not more.
        let later = t0 + 1_000 * REFILL_NS * BURST as u64;
        assert_eq!(
            (0..1000).filter(|_| s.take_token(later)).count(),
            BURST as usize
        );
    }
}
