//! What the recorder collects, and switching it: the one-time setup of activity collection, the
//! activity kinds, API records and API callbacks turned on or off together (at start, and by
//! `gpufl_pause` / `gpufl_resume`), and the paused state.

use crate::cbids;
use crate::cupti::{self, Cupti};
use crate::hostcalls::HostcallTable;
use crate::options::knobs;
use crate::options::Options;
use crate::recorder::{buffer_completed, buffer_requested, is_disabled, Msg};
use crate::sites::SiteTable;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

/// What is being collected and how it was switched (the module's one static).
struct Collection {
    /// Launch / copy / memset callback ids (call-site stacks), when enabled.
    sites: OnceLock<SiteTable>,
    /// Hostcall callback ids (`hostcall` records), unless `GPUFL_HOSTCALL_US=0`.
    hostcalls: OnceLock<HostcallTable>,
    /// Hostcall ids whose callbacks the cost guard turned off for good
    /// ([`crate::hostcalls::MutePolicy`]), one bit each: runtime ids, then driver ids.
    muted: [AtomicU64; MUTED_WORDS],
    /// Whether the driver domain's call-site callbacks are on. They are turned off when the
    /// driver launches and copies they see are made inside runtime calls (the runtime's callback
    /// already decided for those, so they only cost: ~2 % of a launch-bound PyTorch loop), except
    /// for driver functions seen called directly, and back on for a while every so often to look
    /// again ([`crate::sites::DriverSitePolicy`]).
    driver_sites: AtomicBool,
    /// Whether the call-site callbacks are on in name (always-on: a window is open). Where a
    /// detach may happen they are never switched off in CUPTI while attached ([`switch_callback`]);
    /// their callbacks then drop what comes while this is off ([`site_wanted`]).
    sites_on: AtomicBool,
    /// The GPU activity kinds are on (kernel detail turns the kernel kind off around a sampled
    /// launch, and back on only if they still are).
    gpu_kinds_on: AtomicBool,
    /// An always-on window of GPU activity: 0 none open, 1 sampled, 2 full detail.
    window: AtomicU8,
    /// Set while the program has paused recording (`pause`).
    paused: AtomicBool,
    /// Serializes pause/resume (never taken on a CUPTI callback path).
    pause_lock: Mutex<()>,
}

const MUTED_WORDS: usize = 2 * (crate::hostcalls::MAX_CBID + 1).div_ceil(64);

static COLLECTION: Collection = Collection {
    sites: OnceLock::new(),
    hostcalls: OnceLock::new(),
    muted: [const { AtomicU64::new(0) }; MUTED_WORDS],
    driver_sites: AtomicBool::new(true),
    sites_on: AtomicBool::new(false),
    gpu_kinds_on: AtomicBool::new(false),
    window: AtomicU8::new(0),
    paused: AtomicBool::new(false),
    pause_lock: Mutex::new(()),
};

/// The call-site callback ids, when call-site stacks are collected (read by every API callback).
#[inline]
pub(crate) fn site_table() -> Option<&'static SiteTable> {
    COLLECTION.sites.get()
}

/// The hostcall callback ids, when `hostcall` records are on (read by every API callback).
#[inline]
pub(crate) fn hostcall_table() -> Option<&'static HostcallTable> {
    COLLECTION.hostcalls.get()
}

/// The bit of a hostcall id in `Collection::muted`.
fn muted_bit(domain: u32, cbid: u32) -> Option<(usize, u64)> {
    let per_domain = (crate::hostcalls::MAX_CBID + 1).div_ceil(64);
    let base = if domain == cupti::DOMAIN_RUNTIME {
        0
    } else {
        per_domain
    };
    let word = cbid as usize / 64;
    (word < per_domain).then(|| (base + word, 1u64 << (cbid % 64)))
}

pub(crate) fn is_muted(domain: u32, cbid: u32) -> bool {
    muted_bit(domain, cbid)
        .is_some_and(|(w, b)| COLLECTION.muted[w].load(Ordering::Relaxed) & b != 0)
}

/// Turn a hostcall id's callback off for the rest of the session (writer thread, the cost guard
/// of `hostcalls.rs`); a later resume leaves it off.
pub(crate) fn mute_hostcall(domain: u32, cbid: u32) {
    let Some(r) = crate::recorder::get() else {
        return;
    };
    if r.pid != std::process::id() || is_disabled() {
        return;
    }
    let _guard = hold_changes();
    if let Some((w, b)) = muted_bit(domain, cbid) {
        COLLECTION.muted[w].fetch_or(b, Ordering::Relaxed);
    }
    if COLLECTION.paused.load(Ordering::SeqCst) || r.stopped.load(Ordering::SeqCst) {
        return;
    }
    // SAFETY: plain CUPTI call with valid arguments.
    unsafe {
        switch_callback(
            r.cupti,
            r.subscriber.load(Ordering::SeqCst),
            false,
            domain,
            cbid,
        )
    };
}

/// Switch one API callback of our subscriber on or off. Where a detach may happen
/// ([`crate::detach::possible`]) a callback is never switched off in CUPTI while it stays
/// attached: CUPTI 13.0 corrupts its own heap when a callback that a program thread may be
/// dispatching is switched off and CUPTI is detached later (`scripts/probe/detachloop.cu`
/// case 12, no gpufl in it; turned on only, and removed by the detach: case 13). It stays on
/// until the next detach removes it; its handler drops what comes meanwhile (paused or stopped:
/// `recorder::handle_callback`; [`site_wanted`]; [`is_muted`]).
///
/// # Safety
/// `sub` is our CUPTI subscriber.
unsafe fn switch_callback(c: &Cupti, sub: *mut c_void, on: bool, domain: u32, id: u32) {
    if on || !crate::detach::possible() {
        // SAFETY: plain CUPTI call with valid arguments.
        unsafe { (c.enable_callback)(u32::from(on), sub, domain, id) };
    }
}

/// Whether a call-site callback that came is wanted now: the call-site callbacks are on in name
/// and, for the driver domain's, those are not left to the runtime's ([`Collection::driver_sites`]).
/// Only needed where a detach may happen ([`switch_callback`]); CUPTI switches them otherwise.
#[inline]
pub(crate) fn site_wanted(domain: u32, cbid: u32) -> bool {
    COLLECTION.sites_on.load(Ordering::Relaxed)
        && (domain == cupti::DOMAIN_RUNTIME
            || COLLECTION.driver_sites.load(Ordering::Relaxed)
            || crate::sites::driver_direct(cbid))
}

/// Set up activity collection once (buffers, thread ids, flush period, resource callbacks), then
/// turn collection on. Returns notices for what could not be enabled.
pub(crate) fn enable_collection(c: &Cupti, sub: *mut c_void, opts: &Options) -> Vec<String> {
    let mut notices = Vec::new();
    let knobs = knobs();
    // SAFETY (whole function): plain CUPTI calls with valid arguments; results are checked.
    unsafe {
        // Benchmark knob: GPUFL_THREAD_ID_TYPE=default leaves CUPTI's default thread ids.
        if knobs.system_thread_ids {
            if let Some(f) = c.set_thread_id_type {
                f(cupti::THREAD_ID_TYPE_SYSTEM);
            }
        }
        // Per-thread activity buffers (CUPTI 12.3+, CUPTI's default from 13.x): no lock shared
        // between the application's launching threads. Must precede the buffer callbacks and the
        // activity kinds. Older CUPTI rejects the attribute; nothing is lost then.
        // Benchmark knob: GPUFL_PER_THREAD_BUFFERS=0 leaves CUPTI's default.
        if knobs.per_thread_buffers {
            if let Some(f) = c.activity_set_attribute {
                let mut on: u8 = 1;
                let mut size = std::mem::size_of::<u8>();
                let _ = f(
                    cupti::ATTR_PER_THREAD_ACTIVITY_BUFFER,
                    &mut size,
                    (&mut on as *mut u8).cast(),
                );
            }
        }
        let rc = (c.activity_register_callbacks)(buffer_requested, buffer_completed);
        if rc != cupti::SUCCESS {
            notices.push(format!(
                "cuptiActivityRegisterCallbacks: {}",
                c.result_string(rc)
            ));
        }
        if knobs.cupti_flushes_itself {
            let ms = knobs.cupti_flush_period.map_or(0, |p| p.as_millis() as u32);
            match c.activity_flush_period {
                Some(f) => {
                    let rc = f(ms);
                    if rc != cupti::SUCCESS {
                        notices.push(format!("cuptiActivityFlushPeriod: {}", c.result_string(rc)));
                    }
                }
                None => notices.push("cuptiActivityFlushPeriod unavailable".into()),
            }
        }
        // Benchmark knob: GPUFL_HW_TRACE=1 asks CUPTI for hardware-based kernel tracing (CUPTI
        // 12.8+, where the GPU supports it); the answer is written as a notice.
        if knobs.hw_trace {
            match c.activity_enable_hw_trace {
                Some(f) => {
                    let rc = f(1);
                    notices.push(format!(
                        "hardware tracing requested: {}",
                        c.result_string(rc)
                    ));
                }
                None => notices.push("cuptiActivityEnableHWTrace unavailable".into()),
            }
        }
        // Call-site stacks of launches, copies and memsets: on with stacks, unless
        // GPUFL_SITE_STACKS=0.
        if opts.enable_stack_trace && knobs.site_stacks {
            COLLECTION
                .sites
                .get_or_init(|| crate::sites::SiteTable::build(c));
        }
        // Hostcall records (other CUDA calls that held their thread): unless GPUFL_HOSTCALL_US=0.
        // The same callbacks of the allocating functions give `mem` records their stacks and
        // failures (crate::memcalls), unless GPUFL_MEM_RECORDS=0.
        if knobs.hostcall_us > 0 || knobs.mem_records {
            COLLECTION.hostcalls.get_or_init(|| HostcallTable::build(c));
        }
        if let Some(cupti) = crate::recorder::cupti_loaded() {
            if let Some(n) = crate::kernel_detail::start(cupti, COLLECTION.sites.get().is_some()) {
                notices.push(n);
            }
        }
        set_collection(c, sub, opts, true, &mut notices);
        (c.enable_callback)(
            1,
            sub,
            cupti::DOMAIN_RESOURCE,
            cupti::CBID_RESOURCE_CONTEXT_DESTROY_STARTING,
        );
        // Kernel detail's stall reasons: PC sampling enabled as a context is created, before its
        // modules load (a first start is then ~0.1 ms instead of ~0.3 s: crate::kernel_stall).
        if crate::kernel_detail::stalls_on() {
            (c.enable_callback)(
                1,
                sub,
                cupti::DOMAIN_RESOURCE,
                cupti::CBID_RESOURCE_CONTEXT_CREATED,
            );
        }
        (c.enable_callback)(
            1,
            sub,
            cupti::DOMAIN_RESOURCE,
            cupti::CBID_RESOURCE_MODULE_UNLOAD_STARTING,
        );
        // Where CUDA graph nodes come from (crate::graphnodes): with call-site stacks only.
        if COLLECTION.sites.get().is_some() {
            for id in [
                cupti::CBID_RESOURCE_GRAPHNODE_CREATED,
                cupti::CBID_RESOURCE_GRAPHNODE_CLONED,
            ] {
                (c.enable_callback)(1, sub, cupti::DOMAIN_RESOURCE, id);
            }
        }
        // Stack frames of the loaded modules' functions (crate::modules), unless
        // GPUFL_MODULE_FRAMES=0.
        if knobs.module_frames {
            (c.enable_callback)(
                1,
                sub,
                cupti::DOMAIN_RESOURCE,
                cupti::CBID_RESOURCE_MODULE_LOADED,
            );
        }
    }
    notices
}

/// The activity kinds the recorder collects.
fn activity_kinds() -> Vec<(u32, &'static str)> {
    let mut kinds = vec![
        (cupti::KIND_CONCURRENT_KERNEL, "kernels"),
        (cupti::KIND_MEMCPY, "memcpy"),
        (cupti::KIND_MEMSET, "memset"),
        (cupti::KIND_OVERHEAD, "overhead"),
    ];
    // Synchronizations come from API callbacks (below), not from CUPTI's SYNCHRONIZATION
    // activity kind, which costs 25-45 % on a launch-bound PyTorch loop (docs/benchmarks.md).
    // Benchmark knob: GPUFL_ACTIVITY_KINDS=kernels,memcpy,… restricts the activity kinds.
    if let Some(only) = &knobs().activity_kinds {
        kinds.retain(|(_, name)| only.iter().any(|k| k.as_str() == *name));
    }
    kinds
}

/// Turn collection on or off: activity kinds, API records, and the API callbacks (call sites and
/// synchronizations). What fails is added to `notices` (only meaningful when turning on).
fn set_collection(
    c: &Cupti,
    sub: *mut c_void,
    opts: &Options,
    on: bool,
    notices: &mut Vec<String>,
) {
    // Always-on: GPU activity only inside an open window, API records only in a full-detail one.
    let aon = opts.mode == crate::options::Mode::AlwaysOn;
    let window = COLLECTION.window.load(Ordering::SeqCst);
    let gpu_on = on && (!aon || window > 0);
    let api_on = on && (!aon || window == 2);
    if !gpu_on {
        // A sampled launch whose exit callback may now never come: its patching goes off.
        crate::kernel_detail::abandon();
    }
    set_gpu_kinds(c, gpu_on, notices);
    set_mem_kind(c, on && knobs().mem_records, notices);
    enable_api_records(c, opts, api_on, notices);
    // Always-on: call-site callbacks inside windows only (like GPU activity).
    set_site_callbacks(c, sub, on && (!aon || window > 0));
    // SAFETY (whole function): plain CUPTI calls with valid arguments.
    unsafe {
        // Hostcalls, all the time (always-on too, like synchronizations); ids the cost guard
        // turned off stay off.
        if let Some(t) = COLLECTION.hostcalls.get() {
            let k = knobs();
            for (domain, id) in t.enabled_ids(k.hostcall_us > 0, k.mem_records) {
                switch_callback(c, sub, on && !is_muted(domain, id), domain, id);
            }
        }
        if opts.enable_synchronization {
            // Benchmark knob: GPUFL_CALLBACK_DOMAINS=runtime|driver (default both).
            let want = &knobs().callback_domains;
            if want.keeps("runtime") {
                for &id in cbids::RUNTIME_SYNC {
                    switch_callback(c, sub, on, cupti::DOMAIN_RUNTIME, id);
                }
            }
            if want.keeps("driver") {
                for &id in cbids::DRIVER_SYNC {
                    switch_callback(c, sub, on, cupti::DOMAIN_DRIVER, id);
                }
            }
        }
    }
    // A call in progress across the switch may have its exit unseen: threads' call markers
    // (crate::callmark) from before are stale.
    crate::sites::callbacks_switched();
}

/// Turn CUPTI's memory activity (`mem` records, crate::memcalls) on or off: in every mode, all
/// the time, while recording.
fn set_mem_kind(c: &Cupti, on: bool, notices: &mut Vec<String>) {
    // SAFETY: plain CUPTI calls with valid arguments.
    unsafe {
        if on {
            let rc = (c.activity_enable)(cupti::KIND_MEMORY2);
            if rc != cupti::SUCCESS {
                notices.push(format!(
                    "memory activity (mem records): {}",
                    c.result_string(rc)
                ));
            }
        } else {
            (c.activity_disable)(cupti::KIND_MEMORY2);
        }
    }
}

/// Turn the call-site callbacks (launches, graph launches, copies, memsets) on or off; the driver domain's stay
/// off while `Collection::driver_sites` says they are redundant.
fn set_site_callbacks(c: &Cupti, sub: *mut c_void, on: bool) {
    let Some(table) = COLLECTION.sites.get() else {
        return;
    };
    // Benchmark knobs: GPUFL_SITE_DOMAINS=runtime|driver and GPUFL_SITE_KINDS=launch|graph|copy
    // (comma-separated; `graph`: cudaGraphLaunch / cuGraphLaunch) restrict the call-site
    // callbacks (default: all).
    let (domains, kinds) = (&knobs().site_domains, &knobs().site_kinds);
    COLLECTION.sites_on.store(on, Ordering::SeqCst);
    let driver_on = COLLECTION.driver_sites.load(Ordering::SeqCst);
    for (domain, id) in table.ids() {
        let dom = if domain == cupti::DOMAIN_RUNTIME {
            "runtime"
        } else {
            "driver"
        };
        let kind = table.kind(domain, id).map_or("launch", |k| k.knob_name());
        if domains.keeps(dom) && kinds.keeps(kind) {
            let flag = on
                && (domain == cupti::DOMAIN_RUNTIME
                    || driver_on
                    || crate::sites::driver_direct(id));
            // SAFETY: plain CUPTI call with valid arguments.
            unsafe { switch_callback(c, sub, flag, domain, id) };
        }
    }
    // A call in progress across the switch may have its exit (or entry) unseen: threads count
    // their launch depth afresh.
    crate::sites::callbacks_switched();
}

/// Turn the driver domain's call-site callbacks on or off (writer thread). Takes effect now when
/// call sites are being collected (not paused; in always-on, inside a window), else at the next
/// change of collection.
pub(crate) fn set_driver_sites(on: bool) {
    let Some(r) = crate::recorder::get() else {
        return;
    };
    if r.pid != std::process::id() || is_disabled() {
        return;
    }
    let _guard = hold_changes();
    if COLLECTION.driver_sites.swap(on, Ordering::SeqCst) == on {
        return;
    }
    if COLLECTION.paused.load(Ordering::SeqCst) || r.stopped.load(Ordering::SeqCst) {
        return;
    }
    let aon = r.opts.mode == crate::options::Mode::AlwaysOn;
    if aon && COLLECTION.window.load(Ordering::SeqCst) == 0 {
        return;
    }
    set_site_callbacks(r.cupti, r.subscriber.load(Ordering::SeqCst), true);
}

/// Turn the GPU activity kinds (kernels, copies, memsets, CUPTI overhead) on or off.
fn set_gpu_kinds(c: &Cupti, on: bool, notices: &mut Vec<String>) {
    COLLECTION.gpu_kinds_on.store(on, Ordering::SeqCst);
    for (k, name) in activity_kinds() {
        // SAFETY: plain CUPTI calls.
        let rc = unsafe {
            if on {
                (c.activity_enable)(k)
            } else {
                (c.activity_disable)(k)
            }
        };
        if rc != cupti::SUCCESS {
            notices.push(format!(
                "{name} records unavailable: {}",
                c.result_string(rc)
            ));
        }
    }
}

/// Whether the GPU activity kinds are on now.
pub(crate) fn gpu_kinds_on() -> bool {
    COLLECTION.gpu_kinds_on.load(Ordering::SeqCst)
}

/// Open (`open`, `detail`: a full-detail window) or close the always-on window. Returns the
/// window's edge on the trace clock — taken after collection is on when opening, before it goes
/// off when closing, so the window holds every GPU record of its span — or None when no window
/// can open (paused, stopped, not recording). Closing flushes what CUPTI completed to the writer.
pub(crate) fn set_window(open: bool, detail: bool) -> Option<u64> {
    let r = crate::recorder::get()?;
    if r.pid != std::process::id() || is_disabled() {
        return None;
    }
    let _guard = hold_changes();
    let mut ignored = Vec::new();
    if open {
        if COLLECTION.paused.load(Ordering::SeqCst) || r.stopped.load(Ordering::SeqCst) {
            return None;
        }
        COLLECTION
            .window
            .store(if detail { 2 } else { 1 }, Ordering::SeqCst);
        set_site_callbacks(r.cupti, r.subscriber.load(Ordering::SeqCst), true);
        set_gpu_kinds(r.cupti, true, &mut ignored);
        if detail {
            window_api_records(r.cupti, &r.opts, true);
        }
        Some(r.cupti.timestamp())
    } else {
        let ts = r.cupti.timestamp();
        let was = COLLECTION.window.swap(0, Ordering::SeqCst);
        if !COLLECTION.paused.load(Ordering::SeqCst) && !r.stopped.load(Ordering::SeqCst) {
            set_gpu_kinds(r.cupti, false, &mut ignored);
            set_site_callbacks(r.cupti, r.subscriber.load(Ordering::SeqCst), false);
            if was == 2 {
                window_api_records(r.cupti, &r.opts, false);
            }
            // SAFETY: plain CUPTI call: hands the window's completed records to the writer.
            unsafe { (r.cupti.activity_flush_all)(0) };
        }
        Some(ts)
    }
}

/// Hold collection changes and detaches back: no other thread changes what CUPTI collects
/// (pause, resume, windows, muting), or detaches it, until the guard drops.
pub(crate) fn hold_changes() -> std::sync::MutexGuard<'static, ()> {
    COLLECTION
        .pause_lock
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// How long a detach request waits for a CUDA call to return on some thread of the program.
const DETACH_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a thread may take to detach before the writer stops waiting.
const FINALIZE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// What [`detach_cycle`] did.
#[derive(Debug)]
pub enum DetachOutcome {
    /// Detached and attached again: the program's thread's time detaching, and the time from
    /// the detach to collection on again (ns).
    Done { finalize_ns: u64, gap_ns: u64 },
    /// No CUDA call returned in time: still attached, collection as it was (the runtime
    /// callbacks on until a detach succeeds).
    Missed,
    /// Other threads' callbacks were still under way, or `cuptiFinalize` refused: still attached,
    /// as with `Missed`.
    Refused,
    /// Detached, but CUPTI could not be attached again: nothing more is collected.
    Lost(String),
}

/// Always-on, after a window has closed and its kernels have run: detach CUPTI at the program's
/// next API exit and attach it again with the mode's collection (crate::detach). None when it
/// does not apply ([`detach_applies`]; paused, a window open).
pub(crate) fn detach_cycle() -> Option<DetachOutcome> {
    if !detach_applies() {
        return None;
    }
    let r = crate::recorder::get()?;
    let _guard = hold_changes();
    if COLLECTION.paused.load(Ordering::SeqCst)
        || r.stopped.load(Ordering::SeqCst)
        || COLLECTION.window.load(Ordering::SeqCst) != 0
    {
        return None;
    }
    let c = r.cupti;
    let sub = r.subscriber.load(Ordering::SeqCst);
    crate::detach::request();
    // SAFETY: plain CUPTI call on our own subscriber: every runtime callback for a moment, so
    // that the next runtime call to return on any thread detaches.
    unsafe { (c.enable_domain)(1, sub, cupti::DOMAIN_RUNTIME) };
    // Only now may a thread detach: no CUPTI call of this thread races it.
    crate::detach::arm();
    let t0 = std::time::Instant::now();
    // Not detached after all: the runtime callbacks stay on until the next detach removes them
    // (never switched off while attached: [`switch_callback`]); their handler drops those the
    // mode does not collect.
    let restore = || {
        let mut ignored = Vec::new();
        set_collection(c, sub, &r.opts, true, &mut ignored);
    };
    loop {
        match crate::detach::answer() {
            crate::detach::Answer::Waiting => {
                if (t0.elapsed() > DETACH_WAIT || r.stopped.load(Ordering::SeqCst))
                    && crate::detach::withdraw()
                {
                    restore();
                    return Some(DetachOutcome::Missed);
                }
            }
            crate::detach::Answer::Finalizing => {
                if t0.elapsed() > FINALIZE_WAIT {
                    return Some(DetachOutcome::Lost(
                        "a thread took over 30 s to detach CUPTI".into(),
                    ));
                }
            }
            crate::detach::Answer::Failed => {
                restore();
                crate::detach::done();
                return Some(DetachOutcome::Refused);
            }
            crate::detach::Answer::Detached(finalize_ns) => {
                let gap0 = std::time::Instant::now();
                // The detaching thread is still on its way out of CUPTI's dispatch.
                std::thread::sleep(std::time::Duration::from_millis(knobs().detach_settle_ms));
                crate::detach::advance_corr_base();
                let attached = attach_again(r);
                crate::detach::done();
                return Some(match attached {
                    Ok(()) => DetachOutcome::Done {
                        finalize_ns,
                        gap_ns: gap0.elapsed().as_nanos() as u64,
                    },
                    Err(why) => DetachOutcome::Lost(why),
                });
            }
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}

/// Whether this recording detaches CUPTI after its windows now: it may
/// ([`crate::detach::possible`]: always-on, unless `GPUFL_DETACH=0`, not kernel detail, a CUPTI
/// with `cuptiFinalize`), in the recording process, buffers left to hold back.
pub(crate) fn detach_applies() -> bool {
    crate::detach::possible()
        && crate::recorder::get().is_some_and(|r| {
            r.pid == std::process::id()
                && !is_disabled()
                && crate::pool::retired() < crate::pool::MAX_RETIRED
        })
}

/// After a detach: subscribe again and turn the mode's collection back on (what start did).
fn attach_again(r: &crate::recorder::Recorder) -> Result<(), String> {
    let c = r.cupti;
    let mut sub: *mut c_void = std::ptr::null_mut();
    // SAFETY: on_callback has the CUpti_CallbackFunc signature and never unwinds.
    let rc = unsafe { (c.subscribe)(&mut sub, crate::recorder::on_callback, std::ptr::null_mut()) };
    if rc != cupti::SUCCESS {
        return Err(format!(
            "CUPTI could not be attached again after a window ({}): nothing more is collected",
            c.result_string(rc)
        ));
    }
    r.subscriber.store(sub, Ordering::SeqCst);
    let _ = enable_collection(c, sub, &r.opts);
    let _ = crate::nvtx::enable(c, sub);
    Ok(())
}

/// API records of a full-detail window (always-on). Selecting functions with
/// `cuptiActivityEnableRuntimeApi` / `…DriverApi` alone, after the start, gave no records on the
/// H100 (CUDA 13; phase apiwin): the window turns the runtime and driver API activity kinds on
/// and then keeps only the functions the options select (every other id off).
fn window_api_records(c: &Cupti, opts: &Options, on: bool) {
    use crate::options::ApiRecords;
    let (rt, drv): (Vec<u32>, Vec<u32>) = match opts.api_records {
        ApiRecords::None => return,
        ApiRecords::All => {
            let mut ignored = Vec::new();
            return enable_api_records(c, opts, on, &mut ignored);
        }
        ApiRecords::Default => (
            [cbids::RUNTIME_SYNC, cbids::RUNTIME_DEFAULT].concat(),
            [cbids::DRIVER_SYNC, cbids::DRIVER_DEFAULT].concat(),
        ),
        ApiRecords::Sync => (cbids::RUNTIME_SYNC.to_vec(), cbids::DRIVER_SYNC.to_vec()),
    };
    // Without per-function selection the kinds would record every API call: none then.
    let (Some(frt), Some(fdrv)) = (c.activity_enable_runtime_api, c.activity_enable_driver_api)
    else {
        return;
    };
    // SAFETY: plain CUPTI calls; ids unknown to this CUPTI are rejected and ignored.
    unsafe {
        if !on {
            (c.activity_disable)(cupti::KIND_RUNTIME);
            (c.activity_disable)(cupti::KIND_DRIVER);
            return;
        }
        (c.activity_enable)(cupti::KIND_RUNTIME);
        (c.activity_enable)(cupti::KIND_DRIVER);
        // Callback ids of both domains end well below this (CUDA 13).
        for id in 1..1200u32 {
            frt(id, u8::from(rt.contains(&id)));
            fdrv(id, u8::from(drv.contains(&id)));
        }
    }
}

fn enable_api_records(c: &Cupti, opts: &Options, on: bool, notices: &mut Vec<String>) {
    use crate::options::ApiRecords;
    let (rt, drv): (Vec<u32>, Vec<u32>) = match opts.api_records {
        ApiRecords::None => return,
        ApiRecords::All => {
            // SAFETY: plain CUPTI calls.
            unsafe {
                if !on {
                    (c.activity_disable)(cupti::KIND_RUNTIME);
                    (c.activity_disable)(cupti::KIND_DRIVER);
                    return;
                }
                (c.activity_enable)(cupti::KIND_RUNTIME);
                (c.activity_enable)(cupti::KIND_DRIVER);
                for &id in cbids::RUNTIME_NOISY {
                    if let Some(f) = c.activity_enable_runtime_api {
                        f(id, 0);
                    }
                }
                for &id in cbids::DRIVER_NOISY {
                    if let Some(f) = c.activity_enable_driver_api {
                        f(id, 0);
                    }
                }
            }
            return;
        }
        ApiRecords::Sync => (cbids::RUNTIME_SYNC.to_vec(), cbids::DRIVER_SYNC.to_vec()),
        ApiRecords::Default => (
            [cbids::RUNTIME_SYNC, cbids::RUNTIME_DEFAULT].concat(),
            [cbids::DRIVER_SYNC, cbids::DRIVER_DEFAULT].concat(),
        ),
    };
    // Benchmark knob: GPUFL_API_DOMAINS=runtime|driver keeps the selected functions of those
    // domains only (default both).
    let want = &knobs().api_domains;
    let rt = if want.keeps("runtime") {
        rt
    } else {
        Vec::new()
    };
    let drv = if want.keeps("driver") {
        drv
    } else {
        Vec::new()
    };
    // Benchmark knob GPUFL_API_FROM=callbacks: kernel launches' api records come from the
    // call-site callbacks (crate::sites), not from CUPTI (graph launches keep CUPTI's: graph work
    // carries the driver graph launch's correlation id). Default-mode selection only: always-on
    // detail windows select their API records themselves.
    let (rt, drv) = match COLLECTION.sites.get() {
        Some(t) if crate::sites::api_from_callbacks() => {
            let keep = |domain: u32| {
                move |id: &u32| {
                    !matches!(t.kind(domain, *id), Some(crate::sites::SiteKind::Launch(_)))
                }
            };
            (
                rt.into_iter().filter(keep(cupti::DOMAIN_RUNTIME)).collect(),
                drv.into_iter().filter(keep(cupti::DOMAIN_DRIVER)).collect(),
            )
        }
        _ => (rt, drv),
    };
    let (Some(frt), Some(fdrv)) = (c.activity_enable_runtime_api, c.activity_enable_driver_api)
    else {
        if on {
            notices
                .push("this CUPTI cannot select API records per function; api records off".into());
        }
        return;
    };
    // SAFETY: plain CUPTI calls; ids unknown to this CUPTI are rejected and ignored.
    unsafe {
        for id in rt {
            frt(id, u8::from(on));
        }
        for id in drv {
            fdrv(id, u8::from(on));
        }
    }
}

/// Whether recording is paused by the program.
pub fn is_paused() -> bool {
    COLLECTION.paused.load(Ordering::Relaxed)
}

/// Pause (`recording = false`) or resume recording. While paused nothing is collected: no activity
/// kind, API record or API callback is enabled, so the program runs as if only subscribed — but
/// where always-on may detach, the API callbacks stay on in CUPTI and drop what comes
/// (`switch_callback`) until the next detach, after the first window once resumed. A
/// `capture` record marks each change. Returns false when no recorder runs (not started, stopped,
/// or in a forked child); pausing twice or resuming a running recorder does nothing.
pub fn set_recording(recording: bool) -> bool {
    let Some(r) = crate::recorder::get() else {
        return false;
    };
    if r.pid != std::process::id() || is_disabled() {
        return false;
    }
    let _guard = hold_changes();
    if r.stopped.load(Ordering::SeqCst) {
        return false;
    }
    if COLLECTION.paused.load(Ordering::SeqCst) != recording {
        return true;
    }
    let sub = r.subscriber.load(Ordering::SeqCst);
    let mut ignored = Vec::new();
    // The paused interval covers everything not collected: it starts before collection stops
    // and ends after it restarts.
    let ts = if recording {
        set_collection(r.cupti, sub, &r.opts, true, &mut ignored);
        COLLECTION.paused.store(false, Ordering::SeqCst);
        r.cupti.timestamp()
    } else {
        let ts = r.cupti.timestamp();
        COLLECTION.paused.store(true, Ordering::SeqCst);
        set_collection(r.cupti, sub, &r.opts, false, &mut ignored);
        // SAFETY: plain CUPTI call: hands what was collected so far to the writer.
        unsafe { (r.cupti.activity_flush_all)(0) };
        ts
    };
    let _ = r.tx.send(Msg::Capture { ts, recording });
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_sites_switched_off_in_name_are_dropped_by_their_handler() {
        // Where a detach may happen, call-site callbacks stay on in CUPTI after a window; their
        // handler asks `site_wanted`. Ids high in the table, which no other test marks.
        let top = crate::sites::MAX_CBID as u32;
        let (launch, direct) = (top - 2, top - 1);
        COLLECTION.sites_on.store(false, Ordering::SeqCst);
        assert!(!site_wanted(cupti::DOMAIN_RUNTIME, launch));
        assert!(!site_wanted(cupti::DOMAIN_DRIVER, launch));
        COLLECTION.sites_on.store(true, Ordering::SeqCst);
        assert!(site_wanted(cupti::DOMAIN_RUNTIME, launch));
        // The driver domain's, left to the runtime's: dropped, but for functions seen called
        // directly.
        COLLECTION.driver_sites.store(false, Ordering::SeqCst);
        crate::sites::note_direct(direct);
        assert!(!site_wanted(cupti::DOMAIN_DRIVER, launch));
        assert!(site_wanted(cupti::DOMAIN_DRIVER, direct));
        COLLECTION.driver_sites.store(true, Ordering::SeqCst);
        assert!(site_wanted(cupti::DOMAIN_DRIVER, launch));
        COLLECTION.sites_on.store(false, Ordering::SeqCst);
    }
}
