//! Inside the kernel (issue 19, opt-in): instruction-level counters and stall reasons of chosen
//! kernels, per source line, on a sample of their launches.
//!
//! **How.** `GPUFL_KERNEL_DETAIL` (`gpufl record --kernel-detail[=TOP_N|NAMES]`) turns it on: a
//! number N chooses the N kernel functions with the most GPU time so far (the writer tallies the
//! kernel records and publishes the top N every [`PUBLISH_NS`] (a short loop's kernels become
//! the top while it runs); nothing is sampled before its first
//! tally), anything else is a comma-separated list of name fragments (matched against the
//! mangled and the plain name). A chosen function's launch that is due is sampled by the
//! launching thread, between the entry and the exit of its outermost launch call:
//! - its **first** sample takes PC-sampling stall reasons ([`crate::kernel_stall`]: started at
//!   the entry, stopped and read at the exit after waiting for the launch's stream);
//! - the **others** take SASS counters: at the entry SASS patching goes on for the launch's
//!   context (`cuptiSassMetricsEnable`, lazy patching: the function is patched as it is
//!   launched); at the exit, after waiting for the launch's stream, the counters are read
//!   (`cuptiSassMetricsFlushData`) and patching goes off (`cuptiSassMetricsDisable`): the next
//!   launches run unpatched at full speed (docs/kernel-detail.md).
//!
//! That order matters: once SASS patching has run a function, PC sampling gives no PCs for it.
//! CUPTI returns every SASS counter as 0 while its concurrent-kernel activity kind is on
//! (scripts/probe/sasscallback.cu), so that kind is off around a counter sample (whose launch then
//! has no kernel record), and PC sampling is disabled first (with it enabled, the kind could not
//! be turned on again). A launch inside a stream capture is never sampled. Counters and samples
//! are per SASS PC; each PC is mapped to its source line through the cubin's line table
//! ([`crate::cubin_lines`], read when the module is loaded). When every counter reads 0 the
//! recorder says so in a notice and writes no `kdetail` record.
//!
//! **Cost.** A patched launch runs 20-160x slower than bare (the probe's figures); enabling PC
//! sampling and its first start take ~0.1 s and ~0.3 s (later starts ~0.1 ms, a stop 2-5 ms); and
//! the wait costs the launching thread its pipelining once per sample. So a function is sampled at most
//! [`Config::max_samples`] times, at least [`Config::min_gap_ns`] apart, and after each sample
//! the next one anywhere waits until the time spent sampling is at most [`Config::budget`] of the
//! time elapsed (default 5 %).
//!
//! Parameter structs carry CUPTI's `*_STRUCT_SIZE` (the offset of their last field plus its
//! size), not Rust's `size_of` (padded): CUPTI rejects a size it does not know.
//!
//! **Safety.** Every CUPTI or driver error turns the feature off for the rest of the run with one
//! notice; the recorder's own calls made here are hidden from its other callbacks ([`busy`]).

use crate::clock::mono_ns;
use crate::cubin_lines::LineTable;
use crate::cupti::{self, cb_field, sys, Cupti};
use crate::sink::Sink;
use crossbeam_queue::SegQueue;
use gpufl_trace::{
    Kdetail, KdetailLine, Kstall, KstallLine, Notice, Record, SassCounts, TraceError,
};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_void, CStr};
use std::mem::offset_of;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Which kernels to look inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Select {
    /// The N functions with the most GPU time so far.
    Top(usize),
    /// Functions whose name contains one of these.
    Names(Vec<String>),
}

/// Settings (`GPUFL_KERNEL_DETAIL`, `GPUFL_KERNEL_DETAIL_SAMPLES`, `GPUFL_KERNEL_DETAIL_GAP_MS`,
/// `GPUFL_KERNEL_DETAIL_BUDGET`).
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub select: Select,
    /// Sampled launches per function at most.
    pub max_samples: u32,
    /// Time between two samples of one function at least, ns.
    pub min_gap_ns: u64,
    /// Share of the elapsed time the samples may take (0 < budget ≤ 1).
    pub budget: f64,
}

/// Top kernels chosen when `GPUFL_KERNEL_DETAIL` is on without a number.
pub const DEFAULT_TOP: usize = 5;
/// Most functions a top-N selection holds.
pub const MAX_TOP: usize = 32;

impl Config {
    /// The settings from the variables' values (`None`: off).
    pub fn parse(
        select: Option<&str>,
        samples: Option<&str>,
        gap_ms: Option<&str>,
        budget: Option<&str>,
    ) -> Option<Config> {
        let s = select?.trim();
        let select = match s.to_ascii_lowercase().as_str() {
            "" | "0" | "off" | "no" | "false" => return None,
            "1" | "on" | "yes" | "true" | "top" => Select::Top(DEFAULT_TOP),
            _ => match s.parse::<usize>() {
                Ok(n) => Select::Top(n.clamp(1, MAX_TOP)),
                Err(_) => Select::Names(
                    s.split(',')
                        .map(|x| x.trim().to_string())
                        .filter(|x| !x.is_empty())
                        .collect(),
                ),
            },
        };
        let num = |v: Option<&str>, d: f64| {
            v.and_then(|x| x.trim().parse::<f64>().ok())
                .filter(|x| x.is_finite() && *x >= 0.0)
                .unwrap_or(d)
        };
        Some(Config {
            select,
            max_samples: num(samples, 3.0).clamp(1.0, 1e6) as u32,
            min_gap_ns: (num(gap_ms, 1000.0) * 1e6) as u64,
            budget: num(budget, 0.05).clamp(1e-4, 1.0),
        })
    }

    /// The settings from the knobs, `GPUFL_KERNEL_DETAIL` winning over the init option.
    fn from_env() -> Option<Config> {
        let k = crate::options::knobs();
        Config::parse(
            k.kernel_detail
                .clone()
                .or_else(|| KD.option.get().cloned())
                .as_deref(),
            k.kernel_detail_samples.as_deref(),
            k.kernel_detail_gap_ms.as_deref(),
            k.kernel_detail_budget.as_deref(),
        )
    }
}

/// Kernel detail's process-wide state: the settings, the entry points, what the launch callbacks
/// and the writer share, and the counters of the closing notices ([`Stats`]). One instance,
/// [`KD`]; every field is an atomic, a lock-free queue, a once-set cell or a lock taken off the
/// plain launch path (as before it was gathered here).
struct KernelDetail {
    /// The settings, read once.
    config: OnceLock<Option<Config>>,
    /// The init option (`InitOptions::kernel_detail`), given before the settings are first read.
    option: OnceLock<String>,
    /// On (configured, CUPTI has the API, no error so far).
    on: AtomicBool,
    /// The entry points; set when kernel detail starts.
    api: OnceLock<Api>,
    /// What kernel detail was asked to do (the closing notice repeats it).
    description: OnceLock<String>,
    /// Devices whose metric configuration is set: device → metric ids in [`METRICS`] order (0:
    /// not on this chip).
    devices: Mutex<BTreeMap<i32, [u64; 12]>>,
    /// Line tables of the loaded cubins, by CUPTI's CRC (low 32 bits, as SASS records carry it).
    tables: Mutex<BTreeMap<u32, Arc<LineTable>>>,
    /// Why it stopped (written once as a notice).
    failed: Mutex<Option<String>>,
    /// Samples taken, and what they found, for the writer.
    done: SegQueue<Sampled>,
    /// What the first sample read (debug notice).
    first: Mutex<Option<String>>,
    /// No sample before this time (monotonic ns): the budget's pause.
    next_ns: AtomicU64,
    /// Samples per function key: (count, last time).
    per_kernel: Mutex<BTreeMap<u64, (u32, u64)>>,
    /// Top-N selection published by the writer (keys; 0 = empty), and whether it has been.
    top: [AtomicU64; MAX_TOP],
    top_ready: AtomicBool,
    /// Bumped when collection is turned off (launch callbacks then stop mid-call): threads start
    /// counting their depth again.
    epoch: AtomicU32,
    /// The first distinct names of launches met while due and not chosen, and the names last
    /// published as the top N (for the debug notice: a selection that never meets its launches).
    unchosen_names: Mutex<Vec<String>>,
    unchosen_full: AtomicBool,
    top_names: Mutex<Vec<String>>,
    /// The context whose patching is on (and whether the kernel activity kind was turned off for
    /// it): taken by the sampled launch's exit, or by [`abandon`] when that exit will not come.
    open: Mutex<Option<(usize, bool, Kind)>>,
    /// PC sampling failed (stall reasons stopped), and why.
    stalls_failed: AtomicBool,
    stalls_why: Mutex<Option<String>>,
    /// A sample is in progress: no other is started.
    pending_on: AtomicBool,
    /// What was sampled, for the closing notices.
    stats: Stats,
}

/// Kernel detail's counters (for the closing notices).
struct Stats {
    /// Samples taken.
    samples: AtomicUsize,
    /// PC records read in all, and samples that read none.
    pc_records: AtomicU64,
    empty: AtomicU64,
    /// Kernels folded with counters, and written.
    folded: AtomicU64,
    written: AtomicU64,
    /// Launches chosen and due, and those turned down for a capture in progress on their stream.
    armed: AtomicU64,
    capturing: AtomicU64,
    /// Launches of chosen functions seen at a launch entry when sampling was not paused; those
    /// whose stream or context could not be read; those turned down by `arm` (capture, no device).
    chosen_seen: AtomicU64,
    no_layout: AtomicU64,
    turned_down: AtomicU64,
    /// Outermost launch calls met while sampling was due (chosen or not): with `chosen_seen`,
    /// where a recording that sampled nothing lost its launches.
    due: AtomicU64,
    /// Launches sampled for stall reasons, PC records read for them, kstall records written.
    stall_n: AtomicU64,
    stall_pcs: AtomicU64,
    stall_written: AtomicU64,
    /// Time the launching threads spent sampling (all samples; stall samples), and enabling PC
    /// sampling at context creation, ns.
    spent_ns: AtomicU64,
    stall_spent_ns: AtomicU64,
    prepare_ns: AtomicU64,
    /// Samples abandoned when collection was turned off.
    abandoned: AtomicU64,
}

impl KernelDetail {
    const fn new() -> KernelDetail {
        KernelDetail {
            config: OnceLock::new(),
            option: OnceLock::new(),
            on: AtomicBool::new(false),
            api: OnceLock::new(),
            description: OnceLock::new(),
            devices: Mutex::new(BTreeMap::new()),
            tables: Mutex::new(BTreeMap::new()),
            failed: Mutex::new(None),
            done: SegQueue::new(),
            first: Mutex::new(None),
            next_ns: AtomicU64::new(0),
            per_kernel: Mutex::new(BTreeMap::new()),
            top: [const { AtomicU64::new(0) }; MAX_TOP],
            top_ready: AtomicBool::new(false),
            epoch: AtomicU32::new(0),
            unchosen_names: Mutex::new(Vec::new()),
            unchosen_full: AtomicBool::new(false),
            top_names: Mutex::new(Vec::new()),
            open: Mutex::new(None),
            stalls_failed: AtomicBool::new(false),
            stalls_why: Mutex::new(None),
            pending_on: AtomicBool::new(false),
            stats: Stats {
                samples: AtomicUsize::new(0),
                pc_records: AtomicU64::new(0),
                empty: AtomicU64::new(0),
                folded: AtomicU64::new(0),
                written: AtomicU64::new(0),
                armed: AtomicU64::new(0),
                capturing: AtomicU64::new(0),
                chosen_seen: AtomicU64::new(0),
                no_layout: AtomicU64::new(0),
                turned_down: AtomicU64::new(0),
                due: AtomicU64::new(0),
                stall_n: AtomicU64::new(0),
                stall_pcs: AtomicU64::new(0),
                stall_written: AtomicU64::new(0),
                spent_ns: AtomicU64::new(0),
                stall_spent_ns: AtomicU64::new(0),
                prepare_ns: AtomicU64::new(0),
                abandoned: AtomicU64::new(0),
            },
        }
    }
}

/// Kernel detail's state (the module's one static).
static KD: KernelDetail = KernelDetail::new();

/// The init option's value (the environment variable still wins). Call before [`config`].
pub fn set_option(value: Option<&str>) {
    if let Some(v) = value {
        let _ = KD.option.set(v.to_string());
    }
}

/// The settings, read once.
pub fn config() -> Option<&'static Config> {
    KD.config.get_or_init(Config::from_env).as_ref()
}

/// Whether kernel detail was started (its launch callbacks must run, even after an error turned
/// it off, so that a launch that turned patching on also turns it off).
#[inline]
pub fn active() -> bool {
    KD.api.get().is_some()
}

/// Whether kernel detail is being collected.
#[inline]
pub fn on() -> bool {
    KD.on.load(Ordering::Relaxed)
}

thread_local! {
    /// The recorder's own CUDA calls are in progress on this thread.
    static BUSY: Cell<bool> = const { Cell::new(false) };
    /// Launch calls this thread is inside (runtime and driver nest).
    static DEPTH: Cell<Depth> = const { Cell::new(Depth { runtime: 0, driver: 0, epoch: 0 }) };
    /// This thread turned patching on at the entry of its outermost launch call.
    static ARMED: Cell<Option<Armed>> = const { Cell::new(None) };
}

/// Whether this thread is inside one of kernel detail's own CUDA calls (callbacks then ignore it).
#[inline]
pub fn busy() -> bool {
    BUSY.with(|b| b.get())
}

/// Turn the concurrent-kernel activity kind back on after a sample, if it was turned off for it
/// and GPU activity is still being collected.
fn restore_kinds(c: &Cupti, kinds_off: bool) {
    if kinds_off && crate::collection::gpu_kinds_on() {
        // SAFETY: plain CUPTI call.
        unsafe { (c.activity_enable)(cupti::KIND_CONCURRENT_KERNEL) };
    }
}

/// What a sampled launch collects: PC-sampling stall reasons (a function's first sample, when
/// CUPTI has the PC Sampling API) or SASS counters (the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Sass,
    Stalls,
}

#[derive(Clone, Copy)]
struct Armed {
    kind: Kind,
    /// The concurrent-kernel activity kind was turned off for this sample.
    kinds_off: bool,
    ctx: *mut c_void,
    stream: *mut c_void,
    t0_ns: u64,
    key: u64,
    trace_t0: u64,
}

/// The entry points used here: CUPTI's ([`Cupti::sass`]) and the driver's
/// ([`crate::driver::Driver`]), taken from their tables once.
struct Api {
    cupti: &'static Cupti,
    sass_set_config: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsSetConfig_Params) -> u32,
    sass_enable: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsEnable_Params) -> u32,
    sass_disable: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsDisable_Params) -> u32,
    sass_props: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsGetDataProperties_Params) -> u32,
    sass_flush: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsFlushData_Params) -> u32,
    sass_metric: unsafe extern "C" fn(*mut sys::CUpti_SassMetrics_GetProperties_Params) -> u32,
    chip_name: unsafe extern "C" fn(*mut sys::CUpti_Device_GetChipName_Params) -> u32,
    profiler_init: Option<unsafe extern "C" fn(*mut sys::CUpti_Profiler_Initialize_Params) -> u32>,
    cubin_crc: unsafe extern "C" fn(*mut sys::CUpti_GetCubinCrcParams) -> u32,
    stream_is_capturing: unsafe extern "C" fn(*mut c_void, *mut u32) -> u32,
    ctx_get_device: unsafe extern "C" fn(*mut i32) -> u32,
    stream_sync: unsafe extern "C" fn(*mut c_void) -> u32,
    /// PC sampling (stall reasons), when this CUPTI has it.
    pc: Option<crate::kernel_stall::PcApi>,
    /// Where each launch entry point keeps its stream.
    streams: HashMap<(u32, u32), StreamAt>,
}

/// Where a launch call's parameters hold its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamAt {
    /// A field of the params struct, at this offset.
    Field(usize),
    /// A pointer to a launch config at this offset, whose stream is at the second offset.
    Config(usize, usize),
}

fn stream_at(name: &str) -> Option<StreamAt> {
    let base = cupti::strip_version_suffix(name);
    let base = base.strip_suffix("_ptsz").unwrap_or(base);
    Some(match base {
        "cudaLaunchKernel" | "cudaLaunchCooperativeKernel" => {
            StreamAt::Field(offset_of!(sys::cudaLaunchKernel_v7000_params_st, stream))
        }
        "cudaLaunchKernelExC" => StreamAt::Config(
            offset_of!(sys::cudaLaunchKernelExC_v11060_params_st, config),
            // cudaLaunchConfig_t: dim3 gridDim, dim3 blockDim, size_t dynamicSmemBytes,
            // cudaStream_t stream, ...
            32,
        ),
        "cuLaunchKernel" | "cuLaunchCooperativeKernel" => {
            StreamAt::Field(offset_of!(sys::cuLaunchKernel_params_st, hStream))
        }
        "cuLaunchKernelEx" => StreamAt::Config(
            offset_of!(sys::cuLaunchKernelEx_params_st, config),
            // CUlaunchConfig: unsigned gridDimX..blockDimZ (6), unsigned sharedMemBytes, then
            // CUstream hStream at 32 (aligned).
            32,
        ),
        _ => return None,
    })
}

/// The metrics asked for, in this order (the names CUPTI gives on Hopper).
const METRICS: [&str; 12] = [
    "smsp__sass_inst_executed",
    "smsp__sass_thread_inst_executed",
    "smsp__sass_branch_targets_threads_uniform",
    "smsp__sass_branch_targets_threads_divergent",
    "smsp__sass_inst_executed_op_global_ld",
    "smsp__sass_inst_executed_op_global_st",
    "smsp__sass_sectors_mem_global",
    "smsp__sass_sectors_mem_global_ideal",
    "smsp__sass_inst_executed_op_shared_ld",
    "smsp__sass_inst_executed_op_shared_st",
    "smsp__sass_l1tex_pipe_lsu_wavefronts_mem_shared",
    "smsp__sass_l1tex_pipe_lsu_wavefronts_mem_shared_ideal",
];

fn fail(why: String) {
    KD.on.store(false, Ordering::Relaxed);
    let mut f = KD.failed.lock().unwrap_or_else(|e| e.into_inner());
    if f.is_none() {
        *f = Some(why);
    }
}

/// FNV-1a of a kernel function's mangled name: the key the launch callbacks and the writer share.
pub fn key(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h | 1
}

fn load_api(c: &'static Cupti) -> Result<Api, String> {
    let cuda = crate::driver::get().ok_or("the CUDA driver (libcuda.so.1) was not found")?;
    let mut streams = HashMap::new();
    for domain in [cupti::DOMAIN_RUNTIME, cupti::DOMAIN_DRIVER] {
        for id in 0..=crate::cbids::MAX_CBID {
            if let Some(at) = c.callback_name(domain, id).and_then(|n| stream_at(&n)) {
                streams.insert((domain, id), at);
            }
        }
    }
    let sass = c.sass.as_ref().map_err(|e| e.clone())?;
    let lacks = |name: &str| format!("{} lacks {name}", cuda.lib.path);
    Ok(Api {
        cupti: c,
        sass_set_config: sass.set_config,
        sass_enable: sass.enable,
        sass_disable: sass.disable,
        sass_props: sass.get_data_properties,
        sass_flush: sass.flush_data,
        sass_metric: sass.get_properties,
        chip_name: sass.chip_name,
        profiler_init: sass.profiler_init,
        cubin_crc: sass.cubin_crc,
        stream_is_capturing: cuda
            .stream_is_capturing
            .ok_or_else(|| lacks("cuStreamIsCapturing"))?,
        ctx_get_device: cuda.ctx_get_device.ok_or_else(|| lacks("cuCtxGetDevice"))?,
        stream_sync: cuda
            .stream_synchronize
            .ok_or_else(|| lacks("cuStreamSynchronize"))?,
        pc: crate::kernel_stall::PcApi::load(c, cuda).filter(|_| stalls_wanted()),
        streams,
    })
}

/// Stall reasons are collected unless `GPUFL_KERNEL_DETAIL_STALLS=0`.
fn stalls_wanted() -> bool {
    crate::options::knobs().kernel_detail_stalls
}

/// At the recorder's start (after CUPTI is loaded and call-site callbacks are set up): turn kernel
/// detail on if configured. Returns why it cannot, when it cannot (the capture is then partial).
pub fn start(c: &'static Cupti, launch_callbacks: bool) -> Option<String> {
    let cfg = config()?;
    if !launch_callbacks {
        return Some(
            "kernel detail is off: it needs the launch callbacks of call-site stacks (stack traces on, GPUFL_SITE_STACKS not 0)"
                .into(),
        );
    }
    match load_api(c) {
        Ok(api) => {
            let _ = KD.api.set(api);
            KD.on.store(true, Ordering::Relaxed);
            let _ = KD.description.set(format!(
                "kernel detail on: {}; at most {} sampled launches per kernel, {} ms apart, {:.1} % of the time",
                match &cfg.select {
                    Select::Top(n) => format!("the top {n} kernels by GPU time"),
                    Select::Names(v) => format!("kernels named like {}", v.join(", ")),
                },
                cfg.max_samples,
                cfg.min_gap_ns / 1_000_000,
                cfg.budget * 100.0
            ));
            None
        }
        Err(e) => Some(format!("kernel detail is off: {e}")),
    }
}

/// Whether stall reasons are being collected (kernel detail on, CUPTI has PC sampling, no error).
pub fn stalls_on() -> bool {
    on() && KD.api.get().is_some_and(|a| a.pc.is_some())
        && !KD.stalls_failed.load(Ordering::Relaxed)
}

/// A context was created: enable PC sampling on it now, before its modules load, so that the
/// first stall sample's start is cheap.
///
/// # Safety
/// `data` must be the `CUpti_ResourceData` CUPTI passed for this callback.
pub unsafe fn on_context_created(data: *const c_void) {
    if !stalls_on() {
        return;
    }
    let Some(api) = KD.api.get() else { return };
    let Some(pc) = api.pc.as_ref() else { return };
    // SAFETY: CUpti_ResourceData's first field is the context.
    let ctx: *mut c_void = unsafe { cb_field(data, offset_of!(sys::CUpti_ResourceData, context)) };
    if ctx.is_null() {
        return;
    }
    BUSY.with(|b| b.set(true));
    let t0 = mono_ns();
    let r = crate::kernel_stall::prepare(api.cupti, pc, ctx);
    KD.stats
        .prepare_ns
        .fetch_add(mono_ns().saturating_sub(t0), Ordering::Relaxed);
    BUSY.with(|b| b.set(false));
    if let Err(e) = r {
        stalls_fail(e);
    }
}

/// A module was loaded: keep its line table (when kernel detail is on). `image` is valid only
/// during the call.
pub fn on_module_image(image: &[u8]) {
    if !on() {
        return;
    }
    let Some(api) = KD.api.get() else { return };
    let mut p: sys::CUpti_GetCubinCrcParams = unsafe { std::mem::zeroed() };
    p.size = std::mem::size_of::<sys::CUpti_GetCubinCrcParams>();
    p.cubinSize = image.len();
    p.cubin = image.as_ptr().cast();
    // SAFETY: a valid params struct over the image.
    if unsafe { (api.cubin_crc)(&mut p) } != cupti::SUCCESS {
        return;
    }
    let table = LineTable::parse(image).unwrap_or_default();
    KD.tables
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(p.cubinCrc as u32, Arc::new(table));
}

/// A launch call's entry or exit (runtime or driver domain, a kernel launch entry point).
///
/// # Safety
/// `data` must be the `CUpti_CallbackData` CUPTI passed for this callback.
pub unsafe fn on_launch(domain: u32, cbid: u32, data: *const c_void) {
    type D = sys::CUpti_CallbackData;
    // SAFETY: CUpti_CallbackData field offsets.
    let exit: u32 = unsafe { cb_field(data, offset_of!(D, callbackSite)) };
    let runtime = domain == cupti::DOMAIN_RUNTIME;
    let epoch = KD.epoch.load(Ordering::Relaxed);
    let mut d = DEPTH.with(|x| x.get());
    if d.epoch != epoch {
        // Collection was turned off since: exits of calls open then were not seen.
        d = Depth {
            runtime: 0,
            driver: 0,
            epoch,
        };
    }
    if exit == 0 {
        let outermost = d.runtime == 0 && d.driver == 0;
        d = d.enter(runtime);
        DEPTH.with(|x| x.set(d));
        if outermost && on() {
            // SAFETY: as above.
            unsafe { maybe_arm(domain, cbid, data) };
        }
    } else {
        d = d.exit(runtime);
        DEPTH.with(|x| x.set(d));
        if d.runtime == 0 && d.driver == 0 {
            if let Some(a) = ARMED.with(|x| x.take()) {
                finish(a);
            }
        }
    }
}

/// Launch calls a thread is inside, by domain (a runtime launch calls a driver launch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Depth {
    pub runtime: u32,
    pub driver: u32,
    /// The module state's `epoch` when counted.
    pub epoch: u32,
}

impl Depth {
    pub fn enter(self, runtime: bool) -> Depth {
        if runtime {
            Depth {
                runtime: self.runtime + 1,
                ..self
            }
        } else {
            Depth {
                driver: self.driver + 1,
                ..self
            }
        }
    }

    /// A call's exit. A driver exit may be missing (the driver domain's callbacks turned off
    /// while a call was in progress: a pause, or crate::collection::set_driver_sites when kernel
    /// detail did not keep them on): the exit of the outermost runtime call closes every driver
    /// call inside it.
    pub fn exit(self, runtime: bool) -> Depth {
        if runtime {
            let r = self.runtime.saturating_sub(1);
            Depth {
                runtime: r,
                driver: if r == 0 { 0 } else { self.driver },
                ..self
            }
        } else {
            Depth {
                driver: self.driver.saturating_sub(1),
                ..self
            }
        }
    }
}

/// Functions whose names a thread has matched against a name selection, at most.
const MAX_NAME_CHOICES: usize = 4096;

thread_local! {
    /// A name selection's decision per function key, on this thread.
    static NAME_CHOICE: std::cell::RefCell<HashMap<u64, bool>> =
        std::cell::RefCell::new(HashMap::new());
}

fn chosen(cfg: &Config, k: u64, mangled: &[u8]) -> bool {
    match &cfg.select {
        // Demangling is too slow for every launch: each thread decides once per function.
        Select::Names(names) => {
            let decide = || {
                let m = String::from_utf8_lossy(mangled);
                let plain = crate::sink::demangle(&m);
                names
                    .iter()
                    .any(|n| m.contains(n.as_str()) || plain.contains(n.as_str()))
            };
            NAME_CHOICE
                .try_with(|c| {
                    let mut c = c.try_borrow_mut().ok()?;
                    if let Some(&yes) = c.get(&k) {
                        return Some(yes);
                    }
                    let yes = decide();
                    if c.len() >= MAX_NAME_CHOICES {
                        c.clear();
                    }
                    c.insert(k, yes);
                    Some(yes)
                })
                .ok()
                .flatten()
                .unwrap_or_else(decide)
        }
        // Nothing before the first tally: the first kernels launched (initialisation,
        // random fills) are rarely the ones that matter, and a sample's pause would delay those.
        Select::Top(_) => {
            KD.top_ready.load(Ordering::Relaxed)
                && KD.top.iter().any(|t| t.load(Ordering::Relaxed) == k)
        }
    }
}

unsafe fn maybe_arm(domain: u32, cbid: u32, data: *const c_void) {
    type D = sys::CUpti_CallbackData;
    let now = mono_ns();
    if crate::kernel_stall::expired(now) && !KD.pending_on.load(Ordering::Acquire) {
        if let Some(pc) = KD.api.get().and_then(|a| a.pc.as_ref()) {
            // SAFETY: CUpti_CallbackData field offsets.
            let ctx: *mut c_void = unsafe { cb_field(data, offset_of!(D, context)) };
            BUSY.with(|b| b.set(true));
            crate::kernel_stall::disable(pc, ctx);
            BUSY.with(|b| b.set(false));
        }
    }
    if now < KD.next_ns.load(Ordering::Relaxed) || KD.pending_on.load(Ordering::Acquire) {
        return;
    }
    KD.stats.due.fetch_add(1, Ordering::Relaxed);
    let (Some(cfg), Some(api)) = (config(), KD.api.get()) else {
        return;
    };
    // SAFETY: CUpti_CallbackData field offsets; symbolName is the kernel's name at launches.
    let sym: *const c_char = unsafe { cb_field(data, offset_of!(D, symbolName)) };
    if sym.is_null() {
        return;
    }
    // SAFETY: CUPTI's NUL-terminated name, valid during the callback.
    let mangled = unsafe { CStr::from_ptr(sym) }.to_bytes();
    let k = key(mangled);
    if !chosen(cfg, k, mangled) {
        note_unchosen(mangled);
        return;
    }
    KD.stats.chosen_seen.fetch_add(1, Ordering::Relaxed);
    // Where the launch's stream and context are (checked before a sample slot is reserved).
    let Some(at) = api.streams.get(&(domain, cbid)).copied() else {
        KD.stats.no_layout.fetch_add(1, Ordering::Relaxed);
        return;
    };
    // SAFETY: the params struct of this launch entry point (the table maps names to layouts).
    let stream = unsafe {
        let params: *const u8 = cb_field(data, offset_of!(D, functionParams));
        if params.is_null() {
            KD.stats.no_layout.fetch_add(1, Ordering::Relaxed);
            return;
        }
        match at {
            StreamAt::Field(off) => params.add(off).cast::<*mut c_void>().read_unaligned(),
            StreamAt::Config(off, soff) => {
                let cfgp = params.add(off).cast::<*const u8>().read_unaligned();
                if cfgp.is_null() {
                    KD.stats.no_layout.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                cfgp.add(soff).cast::<*mut c_void>().read_unaligned()
            }
        }
    };
    // SAFETY: CUpti_CallbackData field offsets.
    let ctx: *mut c_void = unsafe { cb_field(data, offset_of!(D, context)) };
    if ctx.is_null() {
        KD.stats.no_layout.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let kind = {
        let Ok(mut per) = KD.per_kernel.try_lock() else {
            return;
        };
        let e = per.entry(k).or_insert((0, 0));
        if e.0 >= cfg.max_samples || (e.0 > 0 && now.saturating_sub(e.1) < cfg.min_gap_ns) {
            return;
        }
        if KD
            .pending_on
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // Reserved: another thread will not take the same function meanwhile.
        e.0 += 1;
        e.1 = now;
        // A function's first sample is for stall reasons: once SASS patching has run a function,
        // PC sampling counts its samples as outside user kernels and gives no PCs (device run 4:
        // "22245 samples, 0 PCs"; scripts/probe/pcstartstop.cu case 9).
        if e.0 == 1 && api.pc.is_some() && !KD.stalls_failed.load(Ordering::Relaxed) {
            Kind::Stalls
        } else {
            Kind::Sass
        }
    };
    BUSY.with(|b| b.set(true));
    let armed = arm(api, ctx, stream, now, k, kind);
    BUSY.with(|b| b.set(false));
    match armed {
        Ok(Some(a)) => {
            *KD.open.lock().unwrap_or_else(|e| e.into_inner()) =
                Some((a.ctx as usize, a.kinds_off, a.kind));
            ARMED.with(|x| x.set(Some(a)))
        }
        Ok(None) => {
            // Not sampled after all (a capture in progress, no device): the slot is given back.
            KD.stats.turned_down.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut per) = KD.per_kernel.lock() {
                if let Some(e) = per.get_mut(&k) {
                    e.0 = e.0.saturating_sub(1);
                }
            }
            KD.pending_on.store(false, Ordering::Release)
        }
        Err(e) => {
            KD.pending_on.store(false, Ordering::Release);
            fail(e)
        }
    }
}

const NAMES_KEPT: usize = 6;

fn short_name(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    s.chars().take(100).collect()
}

fn note_unchosen(mangled: &[u8]) {
    if KD.unchosen_full.load(Ordering::Relaxed) || !KD.top_ready.load(Ordering::Relaxed) {
        return;
    }
    let Ok(mut v) = KD.unchosen_names.try_lock() else {
        return;
    };
    let n = short_name(mangled);
    if !v.contains(&n) {
        v.push(n);
    }
    if v.len() >= NAMES_KEPT {
        KD.unchosen_full.store(true, Ordering::Relaxed);
    }
}

fn arm(
    api: &Api,
    ctx: *mut c_void,
    stream: *mut c_void,
    now: u64,
    k: u64,
    kind: Kind,
) -> Result<Option<Armed>, String> {
    let c = api.cupti;
    let mut capturing = 0u32;
    // SAFETY: plain driver call; a stream handle from the launch's own parameters.
    if unsafe { (api.stream_is_capturing)(stream, &mut capturing) } != 0 || capturing != 0 {
        KD.stats.capturing.fetch_add(1, Ordering::Relaxed);
        return Ok(None); // capturing (or unknown): not sampled
    }
    let mut dev = 0i32;
    // SAFETY: the launch's context is current on its thread during the callback.
    if unsafe { (api.ctx_get_device)(&mut dev) } != 0 {
        return Ok(None);
    }
    if kind == Kind::Stalls {
        let Some(pc) = api.pc.as_ref() else {
            return Ok(None);
        };
        // The kernel activity kind stays on: this launch keeps its kernel record.
        if let Err(e) = crate::kernel_stall::start(c, pc, ctx) {
            stalls_fail(e);
            return Ok(None);
        }
        KD.stats.armed.fetch_add(1, Ordering::Relaxed);
        KD.stats.stall_n.fetch_add(1, Ordering::Relaxed);
        return Ok(Some(Armed {
            kind,
            kinds_off: false,
            ctx,
            stream,
            t0_ns: now,
            key: k,
            trace_t0: c.timestamp(),
        }));
    }
    // SASS counters read 0 unless the kernel activity kind is off, and that kind cannot be
    // turned on again while PC sampling is enabled: PC sampling goes off first.
    if let Some(pc) = api.pc.as_ref() {
        crate::kernel_stall::disable(pc, ctx);
    }
    configure(api, dev)?;
    // With CUPTI's concurrent-kernel activity on, every SASS counter reads 0 (probe case 8 of
    // scripts/probe/sasscallback.cu; case 10: off around the launch, the counters are right):
    // the sampled launch gets no kernel record.
    let kinds_off = crate::collection::gpu_kinds_on()
        // SAFETY: plain CUPTI call.
        && unsafe { (c.activity_disable)(cupti::KIND_CONCURRENT_KERNEL) } == cupti::SUCCESS;
    let mut en: sys::CUpti_SassMetricsEnable_Params = unsafe { std::mem::zeroed() };
    en.structSize = sys::SassMetricsEnable_Params_STRUCT_SIZE as usize;
    en.ctx = ctx.cast();
    en.enableLazyPatching = 1;
    // SAFETY: valid params.
    let rc = unsafe { (api.sass_enable)(&mut en) };
    if rc != cupti::SUCCESS {
        restore_kinds(c, kinds_off);
        return Err(format!("cuptiSassMetricsEnable: {}", c.result_string(rc)));
    }
    KD.stats.armed.fetch_add(1, Ordering::Relaxed);
    Ok(Some(Armed {
        kind,
        kinds_off,
        ctx,
        stream,
        t0_ns: now,
        key: k,
        trace_t0: c.timestamp(),
    }))
}

/// Set the metric configuration of device `dev` once.
fn configure(api: &Api, dev: i32) -> Result<(), String> {
    let mut devs = KD.devices.lock().unwrap_or_else(|e| e.into_inner());
    if devs.contains_key(&dev) {
        return Ok(());
    }
    let c = api.cupti;
    if let Some(init) = api.profiler_init {
        let mut p: sys::CUpti_Profiler_Initialize_Params = unsafe { std::mem::zeroed() };
        p.structSize = sys::Profiler_Initialize_Params_STRUCT_SIZE as usize;
        // SAFETY: valid params; initializing twice is harmless.
        unsafe { init(&mut p) };
    }
    let mut cn: sys::CUpti_Device_GetChipName_Params = unsafe { std::mem::zeroed() };
    cn.structSize = sys::Device_GetChipName_Params_STRUCT_SIZE as usize;
    cn.deviceIndex = dev as usize;
    // SAFETY: valid params.
    let rc = unsafe { (api.chip_name)(&mut cn) };
    if rc != cupti::SUCCESS || cn.pChipName.is_null() {
        return Err(format!("cuptiDeviceGetChipName: {}", c.result_string(rc)));
    }
    let mut ids = [0u64; 12];
    let mut configs = Vec::new();
    for (i, name) in METRICS.iter().enumerate() {
        let cname = std::ffi::CString::new(*name).unwrap_or_default();
        let mut mp: sys::CUpti_SassMetrics_GetProperties_Params = unsafe { std::mem::zeroed() };
        mp.structSize = sys::SassMetrics_GetProperties_Params_STRUCT_SIZE as usize;
        mp.pChipName = cn.pChipName;
        mp.pMetricName = cname.as_ptr();
        // SAFETY: valid params; the strings outlive the call.
        if unsafe { (api.sass_metric)(&mut mp) } == cupti::SUCCESS {
            ids[i] = mp.metric.metricId;
            configs.push(sys::CUpti_SassMetrics_Config {
                metricId: mp.metric.metricId,
                outputGranularity: 0, // CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU
            });
        }
    }
    if configs.is_empty() {
        return Err("no SASS metric this gpufl knows is offered on this GPU".into());
    }
    let mut sc: sys::CUpti_SassMetricsSetConfig_Params = unsafe { std::mem::zeroed() };
    sc.structSize = sys::SassMetricsSetConfig_Params_STRUCT_SIZE as usize;
    sc.deviceIndex = dev as u32;
    sc.numOfMetricConfig = configs.len();
    sc.pConfigs = configs.as_mut_ptr();
    // SAFETY: valid params; `configs` outlives the call.
    let rc = unsafe { (api.sass_set_config)(&mut sc) };
    if rc != cupti::SUCCESS {
        return Err(format!(
            "cuptiSassMetricsSetConfig: {}",
            c.result_string(rc)
        ));
    }
    devs.insert(dev, ids);
    Ok(())
}

/// The exit of a sampled launch call: wait for it, read the counters, turn patching off.
/// Turn SASS patching off for `ctx` (what was not read is dropped); CUPTI's result.
fn disable(api: &Api, ctx: *mut c_void) -> u32 {
    let mut dis: sys::CUpti_SassMetricsDisable_Params = unsafe { std::mem::zeroed() };
    dis.structSize = sys::SassMetricsDisable_Params_STRUCT_SIZE as usize;
    dis.ctx = ctx.cast();
    // SAFETY: valid params for a context whose patching this module turned on.
    unsafe { (api.sass_disable)(&mut dis) }
}

/// Collection is being turned off (pause, stop) while a sampled launch may be between its entry
/// and exit callbacks, whose exit would then never be seen: turn its patching off now, so that
/// no later kernel runs patched. Its counters are lost.
pub fn abandon() {
    KD.epoch.fetch_add(1, Ordering::Relaxed);
    let Some(api) = KD.api.get() else { return };
    let open = KD.open.lock().unwrap_or_else(|e| e.into_inner()).take();
    BUSY.with(|b| b.set(true));
    // PC sampling goes off too (enabled, the kernel activity kind could not be turned on again
    // when collection resumes).
    if let Some(pc) = api.pc.as_ref() {
        crate::kernel_stall::disable(pc, std::ptr::null_mut());
    }
    if let Some((ctx, kinds_off, kind)) = open {
        if kind == Kind::Sass {
            disable(api, ctx as *mut c_void);
        }
        restore_kinds(api.cupti, kinds_off);
        KD.stats.abandoned.fetch_add(1, Ordering::Relaxed);
        KD.pending_on.store(false, Ordering::Release);
    }
    BUSY.with(|b| b.set(false));
}

/// PC sampling failed: stall reasons stop, counters go on (one notice).
fn stalls_fail(why: String) {
    KD.stalls_failed.store(true, Ordering::Relaxed);
    let mut f = KD.stalls_why.lock().unwrap_or_else(|e| e.into_inner());
    if f.is_none() {
        *f = Some(why);
    }
}

fn finish(a: Armed) {
    let Some(api) = KD.api.get() else { return };
    // Abandoned meanwhile (collection turned off): nothing left to read.
    if KD
        .open
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
        .is_none()
    {
        return;
    }
    // Read on the launching thread, inside its callback, after waiting for the launch's stream
    // (probe: the same values as outside callbacks; reading on the writer thread instead, after
    // an event, hung the program in one recording).
    BUSY.with(|b| b.set(true));
    // SAFETY: the launch's own stream, current context.
    let rc = unsafe { (api.stream_sync)(a.stream) };
    let r = if a.kind == Kind::Stalls {
        let tables = KD.tables.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let pc = api.pc.as_ref();
        match pc.map(|pc| crate::kernel_stall::stop_and_read(api.cupti, pc, a.ctx, a.key, &tables))
        {
            Some(Ok((stalls, pcs))) => {
                KD.stats.stall_pcs.fetch_add(pcs, Ordering::Relaxed);
                let mut dev = 0i32;
                // SAFETY: the context is current on this thread.
                unsafe { (api.ctx_get_device)(&mut dev) };
                Ok(Sampled {
                    dev,
                    start: a.trace_t0,
                    end: api.cupti.timestamp(),
                    kernels: Vec::new(),
                    stalls,
                })
            }
            Some(Err(e)) => {
                stalls_fail(e);
                Err(String::new())
            }
            None => Err(String::new()),
        }
    } else if rc == 0 {
        collect(api, &a)
    } else {
        disable(api, a.ctx);
        Err(format!(
            "cuStreamSynchronize after a sampled launch: error {rc}"
        ))
    };
    restore_kinds(api.cupti, a.kinds_off);
    BUSY.with(|b| b.set(false));
    let end = mono_ns();
    let cfg = config();
    // The budget: the next sample waits until sampling took at most `budget` of the time.
    let spent = end.saturating_sub(a.t0_ns);
    KD.stats.spent_ns.fetch_add(spent, Ordering::Relaxed);
    if a.kind == Kind::Stalls {
        KD.stats.stall_spent_ns.fetch_add(spent, Ordering::Relaxed);
    }
    let budget = cfg.map_or(0.05, |c| c.budget);
    let pause = (spent as f64 * (1.0 / budget - 1.0)) as u64;
    KD.next_ns
        .store(end.saturating_add(pause), Ordering::Relaxed);
    if let Ok(mut per) = KD.per_kernel.lock() {
        if let Some(e) = per.get_mut(&a.key) {
            e.1 = end;
        }
    }
    KD.pending_on.store(false, Ordering::Release);
    match r {
        Ok(s) => {
            KD.stats.samples.fetch_add(1, Ordering::Relaxed);
            KD.done.push(s);
        }
        Err(e) if e.is_empty() => {} // a stall sample's failure: already noted
        Err(e) => fail(e),
    }
}

/// What one sample found: per function the CUPTI data named, its counters.
pub struct Sampled {
    dev: i32,
    start: u64,
    end: u64,
    kernels: Vec<KernelCounts>,
    /// A stall sample's PC samples of the chosen function.
    stalls: Option<crate::kernel_stall::StallCounts>,
}

/// Counters of one kernel function in one sample.
#[derive(Debug, Default, Clone)]
pub struct KernelCounts {
    pub name: String,
    pub lineinfo: bool,
    pub totals: Counts,
    pub lines: BTreeMap<(String, u32), Counts>,
    pub unmapped: Counts,
}

/// The counters gpufl writes (see `gpufl_trace::SassCounts`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub inst: u64,
    pub thread_inst: u64,
    pub branch_uniform: u64,
    pub branch_divergent: u64,
    pub gld_inst: u64,
    pub gld_sectors: u64,
    pub gld_sectors_ideal: u64,
    pub gst_inst: u64,
    pub gst_sectors: u64,
    pub gst_sectors_ideal: u64,
    pub shared_inst: u64,
    pub shared_wavefronts: u64,
    pub shared_wavefronts_ideal: u64,
}

impl Counts {
    /// One PC's values, in [`METRICS`] order: sectors go to loads or stores by the instruction.
    pub fn of_pc(v: &[u64; 12]) -> Counts {
        let mut c = Counts {
            inst: v[0],
            thread_inst: v[1],
            branch_uniform: v[2],
            branch_divergent: v[3],
            gld_inst: v[4],
            gst_inst: v[5],
            shared_inst: v[8] + v[9],
            shared_wavefronts: v[10],
            shared_wavefronts_ideal: v[11],
            ..Counts::default()
        };
        if v[4] > 0 {
            c.gld_sectors = v[6];
            c.gld_sectors_ideal = v[7];
        } else if v[5] > 0 {
            c.gst_sectors = v[6];
            c.gst_sectors_ideal = v[7];
        }
        c
    }

    pub fn add(&mut self, o: &Counts) {
        self.inst += o.inst;
        self.thread_inst += o.thread_inst;
        self.branch_uniform += o.branch_uniform;
        self.branch_divergent += o.branch_divergent;
        self.gld_inst += o.gld_inst;
        self.gld_sectors += o.gld_sectors;
        self.gld_sectors_ideal += o.gld_sectors_ideal;
        self.gst_inst += o.gst_inst;
        self.gst_sectors += o.gst_sectors;
        self.gst_sectors_ideal += o.gst_sectors_ideal;
        self.shared_inst += o.shared_inst;
        self.shared_wavefronts += o.shared_wavefronts;
        self.shared_wavefronts_ideal += o.shared_wavefronts_ideal;
    }

    /// As written: the keys that are not zero (`all`: every key, for totals).
    pub fn to_trace(self, all: bool) -> SassCounts {
        let f = |v: u64| (all || v != 0).then_some(v);
        SassCounts {
            inst: f(self.inst),
            thread_inst: f(self.thread_inst),
            branch_uniform: f(self.branch_uniform),
            branch_divergent: f(self.branch_divergent),
            gld_inst: f(self.gld_inst),
            gld_sectors: f(self.gld_sectors),
            gld_sectors_ideal: f(self.gld_sectors_ideal),
            gst_inst: f(self.gst_inst),
            gst_sectors: f(self.gst_sectors),
            gst_sectors_ideal: f(self.gst_sectors_ideal),
            shared_inst: f(self.shared_inst),
            shared_wavefronts: f(self.shared_wavefronts),
            shared_wavefronts_ideal: f(self.shared_wavefronts_ideal),
        }
    }

    fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

/// One PC's record as CUPTI gives it: (cubin CRC, function, PC offset) and values by metric id.
pub struct PcValues<'a> {
    pub crc: u32,
    pub function: &'a str,
    pub pc: u32,
    pub values: &'a [(u64, u64)],
}

/// Fold PC records into per-function counters, mapping PCs to lines with `tables`. `ids` are the
/// metric ids in [`METRICS`] order.
pub fn fold<'a>(
    ids: &[u64; 12],
    records: impl IntoIterator<Item = PcValues<'a>>,
    tables: &BTreeMap<u32, Arc<LineTable>>,
) -> Vec<KernelCounts> {
    // (function, pc) → values: CUPTI gives one record per (PC, metric) at GPU granularity.
    let mut pcs: BTreeMap<(&str, u32, u32), [u64; 12]> = BTreeMap::new();
    for r in records {
        let e = pcs.entry((r.function, r.crc, r.pc)).or_insert([0; 12]);
        for &(id, v) in r.values {
            if let Some(i) = ids.iter().position(|&m| m == id && m != 0) {
                e[i] = e[i].saturating_add(v);
            }
        }
    }
    let mut out: BTreeMap<&str, KernelCounts> = BTreeMap::new();
    for ((function, crc, pc), v) in pcs {
        let c = Counts::of_pc(&v);
        let k = out.entry(function).or_insert_with(|| KernelCounts {
            name: function.to_string(),
            ..KernelCounts::default()
        });
        k.totals.add(&c);
        let table = tables.get(&crc);
        if table.is_some_and(|t| t.has_lines()) {
            k.lineinfo = true;
        }
        match table.and_then(|t| t.lookup(function, pc as u64)) {
            Some((file, line)) => k.lines.entry((file.to_string(), line)).or_default().add(&c),
            None => k.unmapped.add(&c),
        }
    }
    out.into_values().collect()
}

fn collect(api: &Api, a: &Armed) -> Result<Sampled, String> {
    let c = api.cupti;
    let mut dp: sys::CUpti_SassMetricsGetDataProperties_Params = unsafe { std::mem::zeroed() };
    dp.structSize = sys::SassMetricsGetDataProperties_Params_STRUCT_SIZE as usize;
    dp.ctx = a.ctx.cast();
    // SAFETY: valid params.
    let rc = unsafe { (api.sass_props)(&mut dp) };
    if rc != cupti::SUCCESS {
        disable(api, a.ctx);
        return Err(format!(
            "cuptiSassMetricsGetDataProperties: {}",
            c.result_string(rc)
        ));
    }
    KD.stats
        .pc_records
        .fetch_add(dp.numOfPatchedInstructionRecords as u64, Ordering::Relaxed);
    if dp.numOfPatchedInstructionRecords == 0 {
        KD.stats.empty.fetch_add(1, Ordering::Relaxed);
    }
    let mut kernels = Vec::new();
    let mut dev = 0i32;
    // SAFETY: the context is current on this thread.
    unsafe { (api.ctx_get_device)(&mut dev) };
    if dp.numOfPatchedInstructionRecords > 0 {
        let n = dp.numOfPatchedInstructionRecords.min(1 << 22);
        let per = dp.numOfInstances.clamp(1, 64);
        let mut vals: Vec<sys::CUpti_SassMetrics_InstanceValue> = (0..n * per)
            .map(|_| sys::CUpti_SassMetrics_InstanceValue {
                metricId: 0,
                value: 0,
            })
            .collect();
        let mut data: Vec<sys::CUpti_SassMetrics_Data> = Vec::with_capacity(n);
        // One pointer into `vals` for all records (a reborrow per record would invalidate the
        // pointers taken before it); `vals` is not touched again until CUPTI has written it.
        let base = vals.as_mut_ptr();
        for i in 0..n {
            let mut d: sys::CUpti_SassMetrics_Data = unsafe { std::mem::zeroed() };
            d.structSize = std::mem::size_of::<sys::CUpti_SassMetrics_Data>();
            // SAFETY: i * per < n * per = vals.len().
            d.pInstanceValues = unsafe { base.add(i * per) };
            data.push(d);
        }
        let mut fd: sys::CUpti_SassMetricsFlushData_Params = unsafe { std::mem::zeroed() };
        fd.structSize = sys::SassMetricsFlushData_Params_STRUCT_SIZE as usize;
        fd.ctx = a.ctx.cast();
        fd.numOfPatchedInstructionRecords = n;
        fd.numOfInstances = per;
        fd.pMetricsData = data.as_mut_ptr();
        // SAFETY: buffers of the sizes given.
        let rc = unsafe { (api.sass_flush)(&mut fd) };
        if rc != cupti::SUCCESS {
            disable(api, a.ctx);
            return Err(format!(
                "cuptiSassMetricsFlushData: {}",
                c.result_string(rc)
            ));
        }
        let ids = KD
            .devices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&dev)
            .copied()
            .unwrap_or_default();
        let names: Vec<String> = data
            .iter()
            .map(|d| {
                if d.functionName.is_null() {
                    String::new()
                } else {
                    // SAFETY: CUPTI's NUL-terminated name.
                    unsafe { CStr::from_ptr(d.functionName) }
                        .to_string_lossy()
                        .into_owned()
                }
            })
            .collect();
        let pairs: Vec<Vec<(u64, u64)>> = (0..n)
            .map(|i| {
                vals[i * per..(i + 1) * per]
                    .iter()
                    .map(|v| (v.metricId, v.value))
                    .collect()
            })
            .collect();
        if let Ok(mut d) = KD.first.lock() {
            if d.is_none() {
                *d = Some(format!(
                    "first sample: {n} records, {per} values each, device {dev}, metric ids {ids:?}, first record {:?} {:?}",
                    names.first(),
                    pairs.first()
                ));
            }
        }
        let tables = KD.tables.lock().unwrap_or_else(|e| e.into_inner()).clone();
        kernels = fold(
            &ids,
            (0..n).map(|i| PcValues {
                crc: data[i].cubinCrc,
                function: &names[i],
                pc: data[i].pcOffset,
                values: &pairs[i],
            }),
            &tables,
        );
    }
    // SAFETY: valid params.
    let rc = disable(api, a.ctx);
    if rc != cupti::SUCCESS {
        return Err(format!("cuptiSassMetricsDisable: {}", c.result_string(rc)));
    }
    Ok(Sampled {
        dev,
        start: a.trace_t0,
        end: c.timestamp(),
        kernels,
        stalls: None,
    })
}

/// Tally of GPU time per kernel function, kept by the writer for a top-N selection.
#[derive(Default)]
pub struct Tally {
    by_name: HashMap<u32, (u64, u64)>,
    /// Names by key (for the debug notice), at most [`MAX_NAMED`].
    names: HashMap<u64, String>,
    last_publish: u64,
}

const MAX_NAMED: usize = 4096;

/// How often the writer publishes the top N: the pace at which CUPTI hands over its buffers
/// (250 ms). Once a second missed a 300-step PyTorch loop (~1.3 s) whole: its GEMMs became the
/// top only after the loop had ended (device runs of 2026-11-26: 0 chosen launches in 15,862
/// met while due, against 4,561 in a 3,000-step run).
pub const PUBLISH_NS: u64 = 250_000_000;

impl Tally {
    /// A kernel record's time, for the function whose id is `name` (its key computed once).
    pub fn add(&mut self, name: u32, mangled: impl FnOnce() -> u64, ns: u64) {
        let e = self.by_name.entry(name).or_insert_with(|| (mangled(), 0));
        e.1 = e.1.saturating_add(ns);
    }

    /// A kernel function's name by its key, for the debug notice.
    pub fn name(&mut self, key: u64, mangled: &[u8]) {
        if self.names.len() < MAX_NAMED {
            self.names.entry(key).or_insert_with(|| short_name(mangled));
        }
    }

    /// The top N keys by time.
    pub fn top(&self, n: usize) -> Vec<u64> {
        let mut v: Vec<(u64, u64)> = self.by_name.values().map(|&(k, t)| (t, k)).collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        v.into_iter().take(n.min(MAX_TOP)).map(|(_, k)| k).collect()
    }

    /// Publish the top N for the launch callbacks (at most every [`PUBLISH_NS`] of trace time).
    pub fn publish(&mut self, now: u64) {
        let Some(Select::Top(n)) = config().map(|c| &c.select) else {
            return;
        };
        if self.by_name.is_empty() || now.saturating_sub(self.last_publish) < PUBLISH_NS {
            return;
        }
        self.last_publish = now;
        let top = self.top(*n);
        if let Ok(mut v) = KD.top_names.try_lock() {
            *v = top
                .iter()
                .map(|k| {
                    self.names
                        .get(k)
                        .cloned()
                        .unwrap_or_else(|| format!("{k:#x}"))
                })
                .collect();
        }
        for (i, slot) in KD.top.iter().enumerate() {
            slot.store(top.get(i).copied().unwrap_or(0), Ordering::Relaxed);
        }
        KD.top_ready.store(true, Ordering::Relaxed);
    }
}

/// Write the samples taken since the last call (writer thread).
pub fn drain_into(s: &mut Sink) -> Result<(), TraceError> {
    while let Some(sm) = KD.done.pop() {
        if let Some(st) = &sm.stalls {
            if st.total > 0 {
                KD.stats.stall_written.fetch_add(1, Ordering::Relaxed);
                let name = s.kernel_name(st.name.as_bytes())?;
                let mut lines = Vec::with_capacity(st.lines.len());
                for ((file, line), (samples, by)) in &st.lines {
                    lines.push(KstallLine {
                        file: s.intern(file)?,
                        line: *line,
                        samples: *samples,
                        stalls: by.clone(),
                    });
                }
                s.write(&Record::Kstall(Box::new(Kstall {
                    name,
                    dev: sm.dev.max(0) as u32,
                    start: sm.start,
                    end: sm.end,
                    launches: 1,
                    period_log2: Some(crate::kernel_stall::PERIOD + 5),
                    lines,
                    unmapped: st.unmapped,
                    unmapped_stalls: st.unmapped_by.clone(),
                    total: st.total,
                })))?;
            }
        }
        for k in sm.kernels {
            KD.stats.folded.fetch_add(1, Ordering::Relaxed);
            if k.totals.is_zero() {
                continue;
            }
            KD.stats.written.fetch_add(1, Ordering::Relaxed);
            let name = s.kernel_name(k.name.as_bytes())?;
            let mut lines = Vec::with_capacity(k.lines.len());
            for ((file, line), c) in &k.lines {
                lines.push(KdetailLine {
                    file: s.intern(file)?,
                    line: *line,
                    m: c.to_trace(false),
                });
            }
            s.write(&Record::Kdetail(Box::new(Kdetail {
                name,
                dev: sm.dev.max(0) as u32,
                start: sm.start,
                end: sm.end,
                launches: 1,
                lineinfo: k.lineinfo,
                totals: k.totals.to_trace(true),
                lines,
                unmapped: (!k.unmapped.is_zero()).then(|| k.unmapped.to_trace(false)),
            })))?;
        }
    }
    Ok(())
}

/// At stop: the last samples, what was sampled, and a notice if kernel detail stopped on an
/// error.
pub fn finish_into(s: &mut Sink) -> Result<(), TraceError> {
    abandon();
    drain_into(s)?;
    if active() {
        s.write(&Record::Notice(Notice {
            level: "info".into(),
            message: format!(
                "{}: {} launches sampled, {} for counters (their kernel records are not collected; {} with no counters; {} PC records read) and {} for stall reasons ({} PC records read, {} kstall records written); {} abandoned when collection was turned off, {} launches not sampled because their stream was being captured; the launching threads spent {:.1} ms sampling ({:.1} ms of it on stall samples) and {:.1} ms enabling PC sampling at context creation",
                KD.description.get().map_or("kernel detail", |d| d.as_str()),
                KD.stats.armed.load(Ordering::Relaxed),
                KD.stats.armed.load(Ordering::Relaxed).saturating_sub(KD.stats.stall_n.load(Ordering::Relaxed)),
                KD.stats.empty.load(Ordering::Relaxed),
                KD.stats.pc_records.load(Ordering::Relaxed),
                KD.stats.stall_n.load(Ordering::Relaxed),
                KD.stats.stall_pcs.load(Ordering::Relaxed),
                KD.stats.stall_written.load(Ordering::Relaxed),
                KD.stats.abandoned.load(Ordering::Relaxed),
                KD.stats.capturing.load(Ordering::Relaxed),
                KD.stats.spent_ns.load(Ordering::Relaxed) as f64 / 1e6,
                KD.stats.stall_spent_ns.load(Ordering::Relaxed) as f64 / 1e6,
                KD.stats.prepare_ns.load(Ordering::Relaxed) as f64 / 1e6,
            ),
        }))?;
        if let Some(first) = KD.first.lock().unwrap_or_else(|e| e.into_inner()).take() {
            s.write(&Record::Notice(Notice {
                level: "debug".into(),
                message: format!(
                    "kernel detail: {}; {} kernels folded, {} written",
                    first,
                    KD.stats.folded.load(Ordering::Relaxed),
                    KD.stats.written.load(Ordering::Relaxed)
                ),
            }))?;
        }
    }
    let (folded, written) = (
        KD.stats.folded.load(Ordering::Relaxed),
        KD.stats.written.load(Ordering::Relaxed),
    );
    if folded > 0 && written == 0 {
        s.write(&Record::Notice(Notice {
            level: "warning".into(),
            message: format!(
                "kernel detail: CUPTI returned every counter of the {folded} sampled kernel(s) as 0, so no kdetail record was written (experimental: docs/kernel-detail.md)"
            ),
        }))?;
    }
    if active() {
        s.write(&Record::Notice(Notice {
            level: "debug".into(),
            message: format!(
                "kernel detail: {} outermost launch calls while sampling was due, {} of them of chosen kernels, {} without a readable stream or context, {} turned down at arming; top-N published: {}",
                KD.stats.due.load(Ordering::Relaxed),
                KD.stats.chosen_seen.load(Ordering::Relaxed),
                KD.stats.no_layout.load(Ordering::Relaxed),
                KD.stats.turned_down.load(Ordering::Relaxed),
                KD.top_ready.load(Ordering::Relaxed)
            ),
        }))?;
        let names = |m: &Mutex<Vec<String>>| {
            m.lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .take(NAMES_KEPT)
                .cloned()
                .collect::<Vec<_>>()
                .join(" | ")
        };
        s.write(&Record::Notice(Notice {
            level: "debug".into(),
            message: format!(
                "kernel detail: last top-N published: {}; launches met while due and not chosen, first names: {}",
                names(&KD.top_names),
                names(&KD.unchosen_names)
            ),
        }))?;
    }
    if let Some(first) = crate::kernel_stall::take_first() {
        s.write(&Record::Notice(Notice {
            level: "debug".into(),
            message: format!("kernel detail: {first}"),
        }))?;
    }
    if let Some(why) = KD
        .stalls_why
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        s.write(&Record::Notice(Notice {
            level: "warning".into(),
            message: format!(
                "kernel detail: stall reasons (PC sampling) stopped: {why} ({} stall samples taken before); counters go on",
                KD.stats.stall_n.load(Ordering::Relaxed)
            ),
        }))?;
    }
    if let Some(why) = KD.failed.lock().unwrap_or_else(|e| e.into_inner()).take() {
        s.write(&Record::Notice(Notice {
            level: "warning".into(),
            message: format!(
                "kernel detail stopped: {why} ({} samples taken before)",
                KD.stats.samples.load(Ordering::Relaxed)
            ),
        }))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse() {
        assert_eq!(Config::parse(None, None, None, None), None);
        assert_eq!(Config::parse(Some("0"), None, None, None), None);
        let c = Config::parse(Some("1"), None, None, None).unwrap();
        assert_eq!(c.select, Select::Top(DEFAULT_TOP));
        assert_eq!((c.max_samples, c.min_gap_ns), (3, 1_000_000_000));
        assert!((c.budget - 0.05).abs() < 1e-12);
        let c = Config::parse(Some("7"), Some("5"), Some("10"), Some("0.5")).unwrap();
        assert_eq!(c.select, Select::Top(7));
        assert_eq!((c.max_samples, c.min_gap_ns), (5, 10_000_000));
        assert!((c.budget - 0.5).abs() < 1e-12);
        let c = Config::parse(Some("divergent, strided_load"), Some("x"), None, Some("-1"));
        let c = c.unwrap();
        assert_eq!(
            c.select,
            Select::Names(vec!["divergent".into(), "strided_load".into()])
        );
        assert_eq!(c.max_samples, 3);
        assert!((c.budget - 0.05).abs() < 1e-12);
        assert_eq!(
            Config::parse(Some("1000"), None, None, None)
                .unwrap()
                .select,
            Select::Top(MAX_TOP)
        );
    }

    #[test]
    fn a_missing_driver_exit_does_not_leave_the_thread_inside_a_launch() {
        let z = Depth {
            runtime: 0,
            driver: 0,
            epoch: 0,
        };
        // runtime entry, driver entry, driver exit lost (its callback turned off), runtime exit
        let d = z.enter(true).enter(false).exit(true);
        assert_eq!((d.runtime, d.driver), (0, 0));
        // the next launch is outermost again
        assert_eq!(d, z);
        // a driver exit whose entry was not seen (callback turned on mid-call)
        let d = z.enter(true).exit(false);
        assert_eq!((d.runtime, d.driver), (1, 0));
        assert_eq!(d.exit(true), z);
        // a direct driver launch
        let d = z.enter(false);
        assert_eq!(d.exit(false), z);
    }

    #[test]
    fn launch_entry_points_know_their_stream() {
        assert!(matches!(
            stream_at("cudaLaunchKernel_v7000"),
            Some(StreamAt::Field(_))
        ));
        assert!(matches!(
            stream_at("cudaLaunchKernel_ptsz_v7000"),
            Some(StreamAt::Field(_))
        ));
        assert!(matches!(
            stream_at("cuLaunchKernel"),
            Some(StreamAt::Field(_))
        ));
        assert!(matches!(
            stream_at("cuLaunchKernelEx"),
            Some(StreamAt::Config(_, 32))
        ));
        assert_eq!(stream_at("cudaMemcpyAsync"), None);
        // cudaLaunchKernel(func, dim3 grid, dim3 block, args, sharedMem, stream): the stream
        // after 8 + 12 + 12 (+ 0 padding: args aligned at 32) + 8 + 8 bytes.
        assert_eq!(stream_at("cudaLaunchKernel"), Some(StreamAt::Field(48)));
        // cuLaunchKernel(f, 6 x unsigned, sharedMemBytes, hStream, ...): 8 + 28 → 40.
        assert_eq!(stream_at("cuLaunchKernel"), Some(StreamAt::Field(40)));
    }

    #[test]
    fn the_tally_ranks_kernels_by_gpu_time_and_keys_them_once() {
        let mut t = Tally::default();
        let mut keyed = 0;
        for (id, ns) in [(1u32, 50u64), (2, 10), (3, 70), (1, 30), (2, 5)] {
            t.add(
                id,
                || {
                    keyed += 1;
                    key(format!("_Z{id}kv").as_bytes())
                },
                ns,
            );
        }
        assert_eq!(
            keyed, 3,
            "a function's key is computed at its first record only"
        );
        let k = |id: u32| key(format!("_Z{id}kv").as_bytes());
        // 1: 80 ns, 3: 70, 2: 15.
        assert_eq!(t.top(2), vec![k(1), k(3)]);
        assert_eq!(t.top(10), vec![k(1), k(3), k(2)]);
        for i in 0..100 {
            t.add(100 + i, || key(&i.to_le_bytes()), 1);
        }
        assert_eq!(t.top(1000).len(), MAX_TOP);
        assert_ne!(key(b"a"), 0, "0 marks an empty slot");
        assert_ne!(key(b""), 0);
    }

    #[test]
    fn sectors_go_to_loads_or_stores_by_the_instruction() {
        let mut v = [0u64; 12];
        v[0] = 10;
        v[1] = 320;
        v[4] = 10;
        v[6] = 320;
        v[7] = 40;
        let c = Counts::of_pc(&v);
        assert_eq!(
            (c.gld_inst, c.gld_sectors, c.gld_sectors_ideal),
            (10, 320, 40)
        );
        assert_eq!((c.gst_inst, c.gst_sectors), (0, 0));
        let mut v = [0u64; 12];
        v[5] = 4;
        v[6] = 16;
        v[7] = 16;
        let c = Counts::of_pc(&v);
        assert_eq!(
            (c.gst_inst, c.gst_sectors, c.gst_sectors_ideal),
            (4, 16, 16)
        );
        assert_eq!(c.gld_sectors, 0);
        // An atomic (neither load nor store) keeps its sectors out of both.
        let mut v = [0u64; 12];
        v[6] = 8;
        let c = Counts::of_pc(&v);
        assert_eq!((c.gld_sectors, c.gst_sectors), (0, 0));
    }

    #[test]
    fn pc_records_fold_per_function_with_unmapped_pcs_apart() {
        let ids: [u64; 12] = std::array::from_fn(|i| 100 + i as u64);
        let tables = BTreeMap::new(); // no cubin known: every PC unmapped
        let a = [(100, 5), (101, 80)];
        let b = [(100, 3), (101, 96), (104, 3), (106, 96), (107, 12)];
        let recs = vec![
            PcValues {
                crc: 1,
                function: "_Z1fv",
                pc: 0,
                values: &a[..1],
            },
            PcValues {
                crc: 1,
                function: "_Z1fv",
                pc: 0,
                values: &a[1..],
            },
            PcValues {
                crc: 1,
                function: "_Z1fv",
                pc: 16,
                values: &b,
            },
            PcValues {
                crc: 1,
                function: "_Z1gv",
                pc: 0,
                values: &[(999, 7), (100, 1)],
            },
        ];
        let out = fold(&ids, recs, &tables);
        assert_eq!(out.len(), 2);
        let f = &out[0];
        assert_eq!(f.name, "_Z1fv");
        assert!(!f.lineinfo);
        assert_eq!((f.totals.inst, f.totals.thread_inst), (8, 176));
        assert_eq!(
            (
                f.totals.gld_inst,
                f.totals.gld_sectors,
                f.totals.gld_sectors_ideal
            ),
            (3, 96, 12)
        );
        assert_eq!(f.unmapped, f.totals);
        assert!(f.lines.is_empty());
        assert_eq!(out[1].totals.inst, 1, "an unknown metric id is ignored");
    }
}
