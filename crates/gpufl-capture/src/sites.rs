//! Call-site stacks of launches, graph launches, copies and memsets (`callsite` records), and the
//! default streams of each context (`stream` records).
//!
//! Which callback ids are launches or copies is read from CUPTI's own function names at start
//! (`cuptiGetCallbackName`), so new `_ptsz` / `_v2` variants are covered without a table of ids.
//!
//! Cost control on the hot path (the API-entry callback):
//! - **Schedule.** A launch's stack is captured on the first [`EVERY_LAUNCH_UNTIL`] launches of a
//!   kernel function by a thread, then at powers of two, then every [`LAUNCH_PERIOD`]th launch;
//!   a graph launch (`cudaGraphLaunch` / `cuGraphLaunch`) likewise per executable graph (its
//!   replays); copies and memsets every time. The kernels a graph replay runs carry a graph
//!   launch's correlation id — CUPTI documents the driver's (`cuGraphLaunch`), while the call
//!   site is taken at the outermost call (`cudaGraphLaunch` around it): the analysis joins them
//!   through the enclosing `api` record (`gpufl-analysis`, `insights/graphs.rs`).
//! - **Budget.** Captures due by the schedule are then limited by a per-thread budget of time:
//!   each thread earns [`BUDGET_PPM`] (1 %) of the time that passes (up to [`BURST_NS`] saved),
//!   and each capture spends what it measurably cost. Cheap captures (a warm Python call site)
//!   are taken more often than expensive ones; a thread never spends more than ~1 % of its time
//!   on call-site stacks after its first [`BURST_NS`]. `GPUFL_SITE_BUDGET` sets the share (percent).
//! - **Weights.** Each `callsite` record carries the calls it stands for: the launches (or copies)
//!   of its key on its thread since the key's previous capture, this one included, so calls per
//!   line can be estimated from the sample (`callsite.weight`).
//! - **Bounded walks.** The native part of a call-site stack is walked for at most
//!   [`crate::stack::site_unwind_ns`] (5 µs), never rebuilding the module list on the hot path.
//!
//! The per-thread state is fixed-size (no allocation, no lock).

use crate::cupti::{self, Cupti};
use crate::stack::{self, Sample};
use crossbeam_queue::ArrayQueue;
use gpufl_trace::StreamRole;
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Launches of one kernel function (per thread) that are all captured.
pub const EVERY_LAUNCH_UNTIL: u32 = 4;
/// After the powers of two, a launch is captured every this many launches of its function.
pub const LAUNCH_PERIOD: u32 = 1024;
/// Share of a thread's time its call-site captures may take, parts per million (1 %).
pub const BUDGET_PPM: u64 = 10_000;
/// Budget a thread may save up (and starts with), ns.
pub const BURST_NS: u64 = 2_000_000;

/// The budget's share in ppm: `GPUFL_SITE_BUDGET` (percent, 0 < p ≤ 100) or [`BUDGET_PPM`].
pub fn budget_ppm() -> u64 {
    crate::options::knobs().site_budget_ppm
}

/// Callback ids above this are not classified (CUPTI's tables end well below).
pub(crate) const MAX_CBID: usize = 1200;

/// What an API function is, for call-site capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteKind {
    /// A kernel launch; the kernel function handle is parameter `.0` (0 or 1) of the call.
    Launch(u8),
    /// A memcpy or memset.
    Copy,
    /// A graph launch (`cudaGraphLaunch`, `cuGraphLaunch`); the executable graph handle is
    /// parameter 0 of the call.
    GraphLaunch,
}

impl SiteKind {
    /// The name of the kind in the benchmark knob `GPUFL_SITE_KINDS` (`launch`, `graph`, `copy`).
    pub fn knob_name(self) -> &'static str {
        match self {
            SiteKind::Launch(_) => "launch",
            SiteKind::GraphLaunch => "graph",
            SiteKind::Copy => "copy",
        }
    }
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
    if base == "cudaGraphLaunch" || base == "cuGraphLaunch" {
        return Some(SiteKind::GraphLaunch);
    }
    let is_copy = ["cudaMemcpy", "cuMemcpy", "cudaMemset", "cuMemset"]
        .iter()
        .any(|p| name.starts_with(p));
    is_copy.then_some(SiteKind::Copy)
}

/// Callback ids of launches / graph launches / copies per domain, from CUPTI's names.
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

/// Tag of graph-launch keys (top bits): executable graphs are counted apart from kernel functions
/// (a launch key is a function handle with its callback id, below 2^59) and from copies (`0xc0`).
const GRAPH_TAG: u64 = 0xa0 << 56;

/// The sampler key of a call and whether every call of it is captured: a launch's kernel function
/// or a graph launch's executable graph (`handle`, with the callback id: the runtime and driver
/// functions count apart), on the launch schedule; copies and memsets one key per API function,
/// every call.
pub fn site_key(kind: SiteKind, cbid: u32, handle: u64) -> (u64, bool) {
    match kind {
        SiteKind::Copy => ((0xc0 << 56) | cbid as u64, true),
        SiteKind::Launch(_) => (handle ^ ((cbid as u64) << 48), false),
        SiteKind::GraphLaunch => (GRAPH_TAG | (handle ^ ((cbid as u64) << 44)), false),
    }
}

/// Slots of a thread's launch-count table.
const SLOTS: usize = 256;
const PROBES: usize = 8;

/// Per-thread sampler state (fixed size).
pub struct Sampler {
    keys: [u64; SLOTS],
    counts: [u32; SLOTS],
    /// Calls of the slot's key since its last capture.
    pending: [u32; SLOTS],
    budget: TimeBudget,
}

/// A thread's time budget for stack captures: it earns a share of the time that passes (up to
/// [`BURST_NS`] saved, which it starts with), and each capture spends what it measurably cost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeBudget {
    /// Time the thread may still spend on captures, ns (negative: in debt).
    budget_ns: i64,
    /// When the budget was last topped up (trace clock, ns); 0 before the first call.
    last_ns: u64,
}

impl TimeBudget {
    pub const fn new() -> TimeBudget {
        TimeBudget {
            budget_ns: BURST_NS as i64,
            last_ns: 0,
        }
    }

    /// Whether the thread can afford a capture at `now_ns` (trace clock), earning `ppm` of the
    /// time since the last call first.
    pub fn afford(&mut self, now_ns: u64, ppm: u64) -> bool {
        if self.last_ns == 0 {
            self.last_ns = now_ns;
        }
        let elapsed = now_ns.saturating_sub(self.last_ns);
        let earned = (elapsed as u128 * ppm as u128 / 1_000_000) as u64;
        if earned > 0 {
            self.budget_ns = self
                .budget_ns
                .saturating_add(earned.min(BURST_NS) as i64)
                .min(BURST_NS as i64);
            self.last_ns = now_ns;
        }
        self.budget_ns > 0
    }

    /// Charge a capture's measured cost.
    pub fn spend(&mut self, cost_ns: u64) {
        self.budget_ns = self
            .budget_ns
            .saturating_sub(cost_ns.min(i64::MAX as u64) as i64);
    }
}

impl Default for TimeBudget {
    fn default() -> Self {
        TimeBudget::new()
    }
}

impl Sampler {
    pub const fn new() -> Sampler {
        Sampler {
            keys: [0; SLOTS],
            counts: [0; SLOTS],
            pending: [0; SLOTS],
            budget: TimeBudget::new(),
        }
    }

    /// Whether this launch of kernel function `key` is due for a capture by the schedule
    /// (before the budget). A full neighbourhood evicts the home slot (its count restarts).
    pub fn launch_due(&mut self, key: u64) -> bool {
        self.observe(key, false).1
    }

    /// One call of `key`: its slot, and whether it is due for a capture (`always`: every call,
    /// as copies; otherwise the launch schedule). The call is added to the slot's pending weight.
    pub fn observe(&mut self, key: u64, always: bool) -> (usize, bool) {
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
            self.pending[slot] = 0;
        }
        let n = self.counts[slot];
        self.counts[slot] = n.saturating_add(1);
        self.pending[slot] = self.pending[slot].saturating_add(1);
        let due = always
            || n < EVERY_LAUNCH_UNTIL
            || n.is_power_of_two()
            || n.is_multiple_of(LAUNCH_PERIOD);
        (slot, due)
    }

    /// Whether the thread can afford a capture at `now_ns` (trace clock), earning `ppm` of the
    /// time since the last call first.
    pub fn afford(&mut self, now_ns: u64, ppm: u64) -> bool {
        self.budget.afford(now_ns, ppm)
    }

    /// Charge a capture's measured cost.
    pub fn spend(&mut self, cost_ns: u64) {
        self.budget.spend(cost_ns)
    }

    /// The calls a capture in `slot` stands for (pending since the slot's last capture, this
    /// one included); the slot starts again at 0.
    pub fn take_weight(&mut self, slot: usize) -> u32 {
        let w = self.pending[slot % SLOTS];
        self.pending[slot % SLOTS] = 0;
        w.max(1)
    }
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler::new()
    }
}

/// Depth of a thread's runtime launch/copy calls in progress (driver calls inside them are the
/// same call), counted from the callbacks' entries and exits. The callbacks can be switched off
/// while a call is in progress (pause, an always-on window closing): its exit is then never seen,
/// and a depth left at 1 would make every later call of the thread look nested — never sampled
/// again. So the count belongs to an epoch of the callbacks (`Shared::epoch`, bumped whenever they
/// are switched), and a thread meeting a newer epoch starts again from 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeDepth {
    pub depth: u32,
    pub epoch: u32,
}

impl RuntimeDepth {
    /// A runtime call's entry in `epoch`: true when it is the outermost call.
    pub fn enter(&mut self, epoch: u32) -> bool {
        self.renew(epoch);
        self.depth += 1;
        self.depth == 1
    }

    /// A runtime call's exit in `epoch`: true when it closes the outermost call.
    pub fn exit(&mut self, epoch: u32) -> bool {
        self.renew(epoch);
        self.depth = self.depth.saturating_sub(1);
        self.depth == 0
    }

    /// Whether a runtime call is in progress (a driver call now is inside it).
    pub fn inside(&mut self, epoch: u32) -> bool {
        self.renew(epoch);
        self.depth > 0
    }

    fn renew(&mut self, epoch: u32) {
        if self.epoch != epoch {
            *self = RuntimeDepth { depth: 0, epoch };
        }
    }
}

/// What the call-site callbacks of every thread share with the writer (the module's one static):
/// lock-free queues, counters and flags.
struct Shared {
    /// Bumped whenever the call-site callbacks are switched (see [`RuntimeDepth`]).
    epoch: AtomicU32,
    /// Launch calls timed by the callbacks ([`api_queue`]), and those lost because it was full.
    api_calls: OnceLock<ArrayQueue<ApiCall>>,
    api_dropped: AtomicU64,
    /// Captures due by the schedule but skipped for the budget (their calls are in the next
    /// capture's weight).
    rate_limited: AtomicU64,
    /// Default streams seen by the callbacks ([`stream_queue`]).
    streams: OnceLock<ArrayQueue<(u32, u32, StreamRole)>>,
    /// Seen by the call-site callbacks: a runtime launch/copy, a driver one inside a runtime call.
    /// Set once (read first: no shared write on the hot path after that).
    runtime_seen: AtomicBool,
    driver_nested_seen: AtomicBool,
    /// Driver callback ids seen called directly (not inside a runtime call), one bit each.
    driver_direct: [AtomicU64; MAX_CBID.div_ceil(64)],
}

static SHARED: Shared = Shared {
    epoch: AtomicU32::new(0),
    api_calls: OnceLock::new(),
    api_dropped: AtomicU64::new(0),
    rate_limited: AtomicU64::new(0),
    streams: OnceLock::new(),
    runtime_seen: AtomicBool::new(false),
    driver_nested_seen: AtomicBool::new(false),
    driver_direct: [const { AtomicU64::new(0) }; MAX_CBID.div_ceil(64)],
};

/// The call-site callbacks were switched on or off (collection.rs, after the switch): depths
/// counted so far may be stale (a call whose exit came, or will come, unseen).
pub fn callbacks_switched() {
    SHARED.epoch.fetch_add(1, Ordering::Relaxed);
}

/// The callbacks' current epoch (see [`RuntimeDepth`]): a thread's call marker from an older one
/// may be a call whose exit went unseen ([`crate::callmark`]).
#[inline]
pub fn epoch() -> u32 {
    SHARED.epoch.load(Ordering::Relaxed)
}

struct ThreadState {
    sampler: Sampler,
    runtime: RuntimeDepth,
    /// Context uid whose default streams this thread already reported.
    last_ctx: u32,
    /// Entry time and correlation id of the outermost launch call in progress
    /// ([`api_from_callbacks`]).
    call_start: u64,
    call_corr: u32,
}

thread_local! {
    static STATE: RefCell<ThreadState> = const {
        RefCell::new(ThreadState {
            sampler: Sampler::new(),
            runtime: RuntimeDepth { depth: 0, epoch: 0 },
            last_ctx: u32::MAX,
            call_start: 0,
            call_corr: 0,
        })
    };
}

/// A launch call timed by the call-site callbacks: what an `api` record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiCall {
    pub domain: u32,
    pub cbid: u32,
    pub start: u64,
    pub end: u64,
    pub tid: u64,
    pub corr: u32,
    pub ret: u32,
}

/// Benchmark knob `GPUFL_API_FROM=callbacks`: the `api` records of kernel and graph launches are
/// made by the call-site callbacks (entry and exit times of the outermost launch call, a driver
/// launch inside a runtime launch left out) instead of CUPTI's API activity records, which are
/// then not asked for launches (`collection.rs`). Read once.
pub fn api_from_callbacks() -> bool {
    crate::options::knobs().api_from_callbacks
}

/// Launch calls timed by the callbacks, drained by the writer.
pub fn api_queue() -> &'static ArrayQueue<ApiCall> {
    SHARED.api_calls.get_or_init(|| ArrayQueue::new(1 << 16))
}

/// Launch calls lost since the last call.
pub fn take_api_dropped() -> u64 {
    SHARED.api_dropped.swap(0, Ordering::Relaxed)
}

fn push_api(c: ApiCall) {
    if api_queue().push(c).is_err() {
        SHARED.api_dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// Captures skipped for the budget since the last call.
pub fn take_rate_limited() -> u64 {
    SHARED.rate_limited.swap(0, Ordering::Relaxed)
}

/// Default streams seen by the callbacks: (ctx uid, CUPTI stream id, role), deduplicated by the
/// writer.
pub fn stream_queue() -> &'static ArrayQueue<(u32, u32, StreamRole)> {
    SHARED.streams.get_or_init(|| ArrayQueue::new(256))
}

#[inline]
fn note(flag: &AtomicBool) {
    if !flag.load(Ordering::Relaxed) {
        flag.store(true, Ordering::Relaxed);
    }
}

pub(crate) fn note_direct(cbid: u32) {
    let Some(word) = SHARED.driver_direct.get(cbid as usize / 64) else {
        return;
    };
    let bit = 1u64 << (cbid % 64);
    if word.load(Ordering::Relaxed) & bit == 0 {
        word.fetch_or(bit, Ordering::Relaxed);
    }
}

/// Whether driver function `cbid` has been seen called directly: its call-site callback stays on
/// while the driver domain's others are off ([`DriverSitePolicy`]).
pub fn driver_direct(cbid: u32) -> bool {
    SHARED
        .driver_direct
        .get(cbid as usize / 64)
        .is_some_and(|w| w.load(Ordering::Relaxed) & (1u64 << (cbid % 64)) != 0)
}

fn driver_direct_count() -> u32 {
    SHARED
        .driver_direct
        .iter()
        .map(|w| w.load(Ordering::Relaxed).count_ones())
        .sum()
}

/// How long the driver domain's call-site callbacks stay on to look (at start, and each look
/// again), and how long they stay off when found redundant.
pub const DRIVER_LOOK: Duration = Duration::from_secs(2);
pub const DRIVER_OFF: Duration = Duration::from_secs(30);

/// The driver domain's call-site callbacks, decided on the writer thread. A program that launches
/// through the runtime (PyTorch, CuPy, CUDA C++) makes its driver launches inside runtime calls,
/// which the runtime's callback already handled, so after [`DRIVER_LOOK`] with such nested calls
/// seen the driver callbacks are turned off for [`DRIVER_OFF`], then on again for a look — except
/// those of driver functions seen called directly (NVRTC/jiterator kernels, Triton, JAX/XLA, the
/// driver API), which stay on ([`driver_direct`]).
pub struct DriverSitePolicy {
    state: DriverState,
    /// Time spent off before the current off period, and how many times turned off.
    off_total: Duration,
    offs: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverState {
    /// On, looking since then.
    Looking(Instant),
    /// Off (redundant) since then.
    Off(Instant),
}

/// What the policy asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverAction {
    None,
    TurnOff,
    TurnOn,
}

impl DriverSitePolicy {
    pub fn new(now: Instant) -> DriverSitePolicy {
        DriverSitePolicy {
            state: DriverState::Looking(now),
            off_total: Duration::ZERO,
            offs: 0,
        }
    }

    pub fn state(&self) -> DriverState {
        self.state
    }

    /// For the session's notices: how long the driver callbacks were off, if ever.
    pub fn summary(&self, now: Instant) -> Option<String> {
        let mut off = self.off_total;
        if let DriverState::Off(since) = self.state {
            off += now.saturating_duration_since(since);
        }
        let kept = driver_direct_count();
        (self.offs > 0).then(|| {
            format!(
                "call sites: driver-API callbacks off for {:.1} s ({} time(s)): the driver launches and copies they saw were inside runtime calls{}",
                off.as_secs_f64(),
                self.offs,
                if kept > 0 {
                    format!("; {kept} driver function(s) seen called directly kept on")
                } else {
                    String::new()
                }
            )
        })
    }

    /// One turn: `runtime`, `nested` — what the callbacks have seen so far.
    pub fn step(&mut self, now: Instant, runtime: bool, nested: bool) -> DriverAction {
        match self.state {
            DriverState::Looking(since) => {
                if runtime && nested && now.saturating_duration_since(since) >= DRIVER_LOOK {
                    self.state = DriverState::Off(now);
                    self.offs += 1;
                    DriverAction::TurnOff
                } else {
                    DriverAction::None
                }
            }
            DriverState::Off(since) => {
                if now.saturating_duration_since(since) >= DRIVER_OFF {
                    self.off_total += now.saturating_duration_since(since);
                    self.state = DriverState::Looking(now);
                    DriverAction::TurnOn
                } else {
                    DriverAction::None
                }
            }
        }
    }

    /// [`Self::step`] with what the callbacks saw, applied (writer thread). `GPUFL_DRIVER_SITES=1`
    /// (and kernel detail) keeps the driver callbacks on.
    pub fn tick(&mut self, now: Instant) {
        if crate::options::knobs().driver_sites {
            return;
        }
        // Kernel detail samples launches at their entry, whichever domain they come through
        // (cuBLASLt launches through the driver directly): its driver callbacks stay on.
        if crate::kernel_detail::active() {
            return;
        }
        let action = self.step(
            now,
            SHARED.runtime_seen.load(Ordering::Relaxed),
            SHARED.driver_nested_seen.load(Ordering::Relaxed),
        );
        match action {
            DriverAction::TurnOff => crate::collection::set_driver_sites(false),
            DriverAction::TurnOn => crate::collection::set_driver_sites(true),
            DriverAction::None => {}
        }
    }
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
        // Kernel launches only: graph work carries the driver graph launch's correlation id, whose
        // CUPTI record the analysis needs (collection.rs keeps graph launches' records).
        let timed = api_from_callbacks() && matches!(call.kind, SiteKind::Launch(_));
        let epoch = SHARED.epoch.load(Ordering::Relaxed);
        if site != 0 {
            let outermost = if runtime {
                st.runtime.exit(epoch)
            } else {
                !st.runtime.inside(epoch)
            };
            // The exit of the outermost launch call: its api record.
            let corr: u32 = unsafe { crate::detach::callback_corr(data) };
            // The exit of the call whose entry was timed (an exit without its entry, after the
            // callbacks were switched while a call was in progress, writes nothing).
            if timed && outermost && st.call_start != 0 && st.call_corr == corr {
                let ret: *const u32 =
                    unsafe { cupti::cb_field(data, offset_of!(D, functionReturnValue)) };
                push_api(ApiCall {
                    domain: call.domain,
                    cbid: call.cbid,
                    start: st.call_start,
                    end: call.cupti.timestamp(),
                    tid: crate::procinfo::gettid(),
                    corr,
                    // SAFETY: CUPTI's pointer to the call's return value, valid at exit.
                    ret: if ret.is_null() {
                        0
                    } else {
                        unsafe { ret.read_unaligned() }
                    },
                });
                st.call_start = 0;
            }
            return;
        }
        if runtime {
            if !st.runtime.enter(epoch) {
                return;
            }
            note(&SHARED.runtime_seen);
        } else if st.runtime.inside(epoch) {
            note(&SHARED.driver_nested_seen);
            return; // the driver call inside a runtime call: already decided
        } else {
            note_direct(call.cbid);
        }
        if timed {
            st.call_start = call.cupti.timestamp();
            st.call_corr = unsafe { crate::detach::callback_corr(data) };
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
        let param = match call.kind {
            SiteKind::Copy => None,
            SiteKind::Launch(p) => Some(p),
            SiteKind::GraphLaunch => Some(0),
        };
        let handle = param.map_or(0, |p| {
            let params: *const u64 =
                unsafe { cupti::cb_field(data, offset_of!(D, functionParams)) };
            if params.is_null() {
                0
            } else {
                // SAFETY: every launch entry point has its function handle as parameter 0 (1 for
                // the Ex variants), every graph launch its executable graph as parameter 0,
                // pointer-sized, in its params struct.
                unsafe { params.add(p as usize).read_unaligned() }
            }
        });
        let (key, always) = site_key(call.kind, call.cbid, handle);
        let (slot, due) = st.sampler.observe(key, always);
        if !due {
            return;
        }
        let now = call.cupti.timestamp();
        if !st.sampler.afford(now, budget_ppm()) {
            SHARED.rate_limited.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut s = Sample::empty();
        s.corr = unsafe { crate::detach::callback_corr(data) };
        s.domain = call.domain;
        s.cbid = call.cbid;
        s.ctx = ctx_uid;
        s.tid = crate::procinfo::gettid();
        s.has_stack = true;
        s.weight = st.sampler.take_weight(slot);
        let cost = stack::capture_for(&mut s, call.python, stack::Purpose::Site);
        st.sampler.spend(cost);
        s.ts = now;
        s.end = now;
        stack::push(s);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_left_open_by_switched_callbacks_does_not_make_later_calls_nested() {
        let mut d = RuntimeDepth::default();
        // A launch, and a driver call inside it.
        assert!(d.enter(0));
        assert!(d.inside(0));
        assert!(d.exit(0));
        assert!(!d.inside(0));
        // A launch whose exit is never seen: the callbacks went off while it ran.
        assert!(d.enter(0));
        // In the same epoch the next call would look nested (the bug this prevents) ...
        let mut stale = d;
        assert!(!stale.enter(0));
        // ... after the switch it is the outermost call again, and so is its nested driver call's
        // parent.
        assert!(d.enter(1));
        assert!(d.inside(1));
        assert!(d.exit(1));
        // An exit from before the switch, seen after it, does not go below zero.
        let mut e = RuntimeDepth::default();
        assert!(e.enter(3));
        assert!(e.exit(4));
        assert!(e.enter(4));
        assert_eq!(e.depth, 1);
    }

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
    fn graph_launches_classify_apart_from_kernel_launches() {
        for name in [
            "cudaGraphLaunch",
            "cudaGraphLaunch_ptsz",
            "cuGraphLaunch",
            "cuGraphLaunch_ptsz",
        ] {
            assert_eq!(classify(name), Some(SiteKind::GraphLaunch), "{name}");
        }
        // Graph calls that launch nothing.
        for name in [
            "cudaGraphInstantiate",
            "cudaGraphExecUpdate",
            "cuGraphLaunchNode",
            "cudaGraphUpload",
            "cudaStreamBeginCapture",
            "cudaStreamEndCapture",
            "cudaGraphAddKernelNode",
        ] {
            assert_eq!(classify(name), None, "{name}");
        }
        assert_eq!(SiteKind::GraphLaunch.knob_name(), "graph");
        assert_eq!(SiteKind::Launch(1).knob_name(), "launch");
        assert_eq!(SiteKind::Copy.knob_name(), "copy");
    }

    #[test]
    fn each_graph_gets_the_launch_schedule_and_its_own_weights() {
        let (exec_a, exec_b) = (0x7f00_1234_5670u64, 0x7f00_1234_9a00u64);
        let key = |exec| site_key(SiteKind::GraphLaunch, 311, exec);
        assert!(
            !key(exec_a).1,
            "graph launches are sampled, not all captured"
        );
        assert_ne!(key(exec_a).0, key(exec_b).0);
        // The same handle value as a kernel function, or a copy's key, is another key.
        assert_ne!(key(exec_a).0, site_key(SiteKind::Launch(0), 311, exec_a).0);
        assert_ne!(key(0).0, site_key(SiteKind::Copy, 311, 0).0);
        // The ptsz and driver functions count apart from cudaGraphLaunch.
        assert_ne!(
            key(exec_a).0,
            site_key(SiteKind::GraphLaunch, 312, exec_a).0
        );
        assert_ne!(
            key(exec_a).0,
            site_key(SiteKind::GraphLaunch, 514, exec_a).0
        );

        // Graph A replayed 3000 times, graph B every third replay of A: each on its own schedule.
        let mut s = Sampler::new();
        let (mut due_a, mut due_b) = (Vec::new(), Vec::new());
        let mut weight_a = Vec::new();
        let mut b_calls = 0u32;
        for n in 0..3000u32 {
            let (slot, due) = s.observe(key(exec_a).0, false);
            if due {
                due_a.push(n);
                weight_a.push(s.take_weight(slot));
            }
            if n % 3 == 0 {
                let (slot, due) = s.observe(key(exec_b).0, false);
                if due {
                    due_b.push(b_calls);
                    s.take_weight(slot);
                }
                b_calls += 1;
            }
        }
        let schedule = |upto: u32| -> Vec<u32> {
            (0..upto)
                .filter(|&n| {
                    n < EVERY_LAUNCH_UNTIL || n.is_power_of_two() || n.is_multiple_of(LAUNCH_PERIOD)
                })
                .collect()
        };
        assert_eq!(due_a, schedule(3000));
        assert_eq!(due_b, schedule(b_calls));
        // Replays since the graph's previous capture: 1024 stands for 1024-512, 2048 for 2048-1024.
        let at = |n: u32| weight_a[due_a.iter().position(|&d| d == n).unwrap()];
        assert_eq!(
            (at(0), at(3), at(4), at(1024), at(2048)),
            (1, 1, 1, 512, 1024)
        );
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
    fn budget_is_a_share_of_time_spent_by_measured_cost() {
        let mut s = Sampler::new();
        let t0 = 1_000_000_000u64;
        // The saved budget (BURST_NS) pays for captures until spent, whatever their count.
        let mut taken = 0;
        while s.afford(t0, BUDGET_PPM) {
            s.spend(100_000);
            taken += 1;
        }
        assert_eq!(taken, (BURST_NS / 100_000) as usize);
        // 1 % of 10 ms earns 100 µs: one more capture of 100 µs, not two.
        assert!(s.afford(t0 + 10_000_000, BUDGET_PPM));
        s.spend(100_000);
        assert!(!s.afford(t0 + 10_000_000, BUDGET_PPM));
        // Cheap captures are taken more often: 1 µs each, 100 of them in the next 10 ms.
        let t1 = t0 + 20_000_000;
        let mut cheap = 0;
        while s.afford(t1, BUDGET_PPM) {
            s.spend(1_000);
            cheap += 1;
        }
        assert_eq!(cheap, 100);
        // After a long pause the budget is full again, not more.
        let later = t1 + 1_000_000_000_000;
        let mut n = 0;
        while s.afford(later, BUDGET_PPM) {
            s.spend(100_000);
            n += 1;
        }
        assert_eq!(n, (BURST_NS / 100_000) as usize);
    }

    #[test]
    fn weights_count_the_calls_since_the_last_capture_per_key() {
        let mut s = Sampler::new();
        let mut captured: Vec<(u32, u32)> = Vec::new();
        let mut calls = 0u64;
        for n in 0..5000u32 {
            let (slot, due) = s.observe(0xabc0, false);
            calls += 1;
            if due {
                captured.push((n, s.take_weight(slot)));
            }
        }
        // Every call is in exactly one capture's weight, but those after the last capture.
        let last = captured.last().unwrap().0;
        let weights: u64 = captured.iter().map(|c| c.1 as u64).sum();
        assert_eq!(weights + (4999 - last) as u64, calls);
        // The first launches stand for themselves; a capture at 1024 stands for 1024 - 512.
        assert_eq!(captured[0], (0, 1));
        assert!(captured.contains(&(1024, 512)), "{captured:?}");
        // A capture skipped for the budget leaves its call pending for the next one.
        let mut s = Sampler::new();
        let (slot, _) = s.observe(7, true);
        let _ = slot; // skipped
        let (slot, _) = s.observe(7, true);
        assert_eq!(s.take_weight(slot), 2);
        // Keys are counted apart.
        let (a, _) = s.observe(8, true);
        assert_eq!(s.take_weight(a), 1);
    }

    #[test]
    fn driver_callbacks_go_off_when_nested_and_come_back_to_look() {
        let t0 = Instant::now();
        let mut p = DriverSitePolicy::new(t0);
        // Nothing seen yet, or not long enough: keep looking.
        assert_eq!(p.step(t0 + DRIVER_LOOK, false, false), DriverAction::None);
        assert_eq!(p.step(t0 + DRIVER_LOOK, true, false), DriverAction::None);
        assert_eq!(
            p.step(t0 + Duration::from_millis(100), true, true),
            DriverAction::None
        );
        // Nested driver calls seen through the whole look: off.
        let t1 = t0 + DRIVER_LOOK;
        assert_eq!(p.step(t1, true, true), DriverAction::TurnOff);
        assert_eq!(p.state(), DriverState::Off(t1));
        // Off until the next look.
        assert_eq!(
            p.step(t1 + Duration::from_secs(1), true, true),
            DriverAction::None
        );
        let t2 = t1 + DRIVER_OFF;
        assert_eq!(p.step(t2, true, true), DriverAction::TurnOn);
        assert_eq!(p.state(), DriverState::Looking(t2));
        assert!(
            p.summary(t2)
                .unwrap()
                .contains("off for 30.0 s (1 time(s))"),
            "{:?}",
            p.summary(t2)
        );
        // A program that only uses the driver (no runtime launches): never off.
        let mut q = DriverSitePolicy::new(t0);
        assert_eq!(
            q.step(t0 + DRIVER_LOOK * 5, false, false),
            DriverAction::None
        );
        assert_eq!(q.summary(t0), None);
    }

    #[test]
    fn driver_functions_called_directly_are_remembered_one_by_one() {
        assert!(!driver_direct(301));
        note_direct(301);
        note_direct(301);
        assert!(driver_direct(301));
        assert!(!driver_direct(300) && !driver_direct(302));
        note_direct(u32::MAX); // out of range: ignored
        assert!(!driver_direct(u32::MAX));
    }
}
