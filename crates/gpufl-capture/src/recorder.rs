//! The recorder: one per process. Subscribes to CUPTI, owns the writer thread, and stops cleanly
//! on `shutdown()`, at process exit, or never starts (one clear line, then out of the way).

use crate::cbids;
use crate::collection::enable_collection;
pub use crate::collection::{is_paused, set_recording};
use crate::cupti::{self, cb_field, Cupti};
use crate::options::{Discard, Options};
use crate::pool;
use crate::procinfo;
use crate::pyframes;
use crate::sink::Sink;
use crate::stack::{self, Sample};
use gpufl_trace::*;
use std::ffi::c_void;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How often the writer thread asks CUPTI for completed buffers (`GPUFL_FLUSH_MS`, 0 = never:
/// CUPTI then delivers only full buffers, and a crash can lose more than a second; read in
/// [`crate::options::Knobs::cupti_flush_period`]). Benchmark knob `GPUFL_FLUSH_MODE=cupti`
/// ([`crate::options::Knobs::cupti_flushes_itself`]): CUPTI's own worker flushes every period
/// (`cuptiActivityFlushPeriod`) instead of the writer thread calling `cuptiActivityFlushAll`.
pub(crate) const CUPTI_FLUSH_PERIOD: Duration = Duration::from_millis(250);

/// How often the writer closes a compressed block (bounds what a crash loses: with CUPTI's buffers
/// asked for every [`CUPTI_FLUSH_PERIOD`], a record is on disk at most ~0.75 s after CUPTI
/// completed it).
const BLOCK_PERIOD: Duration = Duration::from_millis(500);
/// Longest wait for the writer at shutdown.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// How the recorder was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartedBy {
    /// `CUDA_INJECTION64_PATH` (`gpufl record`).
    Injection,
    /// `gpufl::init` / `gpufl_init`.
    Api,
}

impl StartedBy {
    fn as_str(self) -> &'static str {
        match self {
            StartedBy::Injection => "injection",
            StartedBy::Api => "api",
        }
    }
}

/// Why recording is not running.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("already recording to {0}")]
    AlreadyRunning(PathBuf),
    #[error("{0}")]
    Disabled(String),
}

pub(crate) enum Msg {
    Buffer {
        ptr: usize,
        valid: usize,
        dropped: u64,
        /// False for a buffer completed while CUPTI was being detached: not used again (nor its
        /// kernel names read).
        recycle: bool,
        /// Added to its records' correlation ids (crate::detach::corr_base).
        corr_base: u32,
    },
    Stop {
        reason: &'static str,
        ack: Sender<Option<Counts>>,
    },
    /// Recording paused (`recording: false`) or resumed at `ts`.
    Capture { ts: u64, recording: bool },
    /// From the telemetry thread.
    Telemetry(crate::telemetry::Report),
}

/// The running recorder.
pub struct Recorder {
    pub opts: Options,
    pub session_dir: PathBuf,
    pub(crate) cupti: &'static Cupti,
    pub(crate) subscriber: AtomicPtr<c_void>,
    pub(crate) tx: Sender<Msg>,
    pub(crate) stopped: AtomicBool,
    python: bool,
    pub(crate) pid: u32,
}

/// The recorder's process-wide state (the module's one static).
struct RecorderState {
    /// The running recorder (set once).
    recorder: OnceLock<Recorder>,
    /// Serializes [`start`].
    start_lock: Mutex<()>,
    /// CUPTI, once loaded.
    cupti: OnceLock<Cupti>,
    /// Set in a forked child (CUPTI state does not survive fork) and after stop: callbacks return
    /// at once.
    disabled: AtomicBool,
    /// Set when a CUDA context is being destroyed: the writer closes a block promptly.
    flush_request: AtomicBool,
    /// The exit and fork hooks are registered once.
    exit_hooks: std::sync::Once,
}

static STATE: RecorderState = RecorderState {
    recorder: OnceLock::new(),
    start_lock: Mutex::new(()),
    cupti: OnceLock::new(),
    disabled: AtomicBool::new(false),
    flush_request: AtomicBool::new(false),
    exit_hooks: std::sync::Once::new(),
};

/// Whether the recorder's callbacks are off for good (a forked child, or after stop).
#[inline]
pub(crate) fn is_disabled() -> bool {
    STATE.disabled.load(Ordering::Relaxed)
}

/// The recorder, if running.
pub fn get() -> Option<&'static Recorder> {
    STATE.recorder.get()
}

/// Now, on the trace clock: CUPTI's timestamp when CUPTI is loaded, else CLOCK_REALTIME in ns
/// (what `cuptiGetTimestamp` returns on Linux: its values match the wall clock to ~1 µs).
pub fn trace_clock() -> u64 {
    STATE
        .cupti
        .get()
        .map_or_else(procinfo::unix_ns, |c| c.timestamp())
}

/// CUPTI, loaded now if it was not yet (NVTX's injection entry point may run before cuInit).
pub fn cupti_loaded() -> Option<&'static Cupti> {
    if let Some(c) = STATE.cupti.get() {
        return Some(c);
    }
    let c = Cupti::load().ok()?;
    Some(STATE.cupti.get_or_init(|| c))
}

/// Print one line on stderr, prefixed "gpufl: ".
fn say(quiet: bool, msg: &str) {
    if !quiet {
        eprintln!("gpufl: {msg}");
    }
}

/// Start recording this process. Safe to call more than once (later calls report AlreadyRunning).
pub fn start(mut opts: Options, by: StartedBy) -> Result<&'static Recorder, InitError> {
    let _guard = STATE.start_lock.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = STATE.recorder.get() {
        return Err(InitError::AlreadyRunning(r.session_dir.clone()));
    }
    // Every GPUFL_* knob, read now rather than by the first callback that needs one.
    // A value a variable does not accept is said on stderr and kept as a warning notice.
    let mut env_warnings = opts.apply_env();
    env_warnings.extend(crate::options::knobs().warnings.iter().cloned());
    for w in &env_warnings {
        say(false, w);
    }
    let start_unix_ns = procinfo::unix_ns();
    let pid = std::process::id();
    let dir_name = session::session_dir_name(&opts.app_name, pid, start_unix_ns);
    let session_dir = Path::new(&opts.log_path).join(&dir_name);
    if let Err(e) = std::fs::create_dir_all(&session_dir) {
        let msg = format!(
            "cannot create {}: {e}; not recording",
            session_dir.display()
        );
        say(false, &msg);
        return Err(InitError::Disabled(msg));
    }
    let mut header = base_header(&opts, by, &dir_name, start_unix_ns);

    let cupti = match STATE.cupti.get() {
        Some(c) => Ok(c),
        None => Cupti::load().map(|c| STATE.cupti.get_or_init(|| c)),
    };
    let cupti = match cupti {
        Ok(c) => c,
        Err(e) => return Err(disabled(&opts, &session_dir, header, e.to_string(), by)),
    };
    let mut version = 0u32;
    // SAFETY: writes one u32.
    unsafe { (cupti.get_version)(&mut version) };
    header.cupti_version = Some(version);
    // Always-on detaches CUPTI after its windows (crate::detach), unless GPUFL_DETACH=0.
    crate::detach::set_possible(
        crate::options::knobs().detach
            && opts.mode == crate::options::Mode::AlwaysOn
            && opts.kernel_detail.is_none()
            && cupti.finalize.is_some(),
    );

    let mut sub: *mut c_void = std::ptr::null_mut();
    // SAFETY: on_callback has the CUpti_CallbackFunc signature and never unwinds.
    let rc = unsafe { (cupti.subscribe)(&mut sub, on_callback, std::ptr::null_mut()) };
    if rc != cupti::SUCCESS {
        let why = if rc == cupti::ERROR_MULTIPLE_SUBSCRIBERS {
            "another profiler (Nsight Systems, torch.profiler, …) already holds CUPTI in this process; \
             CUPTI accepts one subscriber per process on CUDA <= 13.2"
                .to_string()
        } else {
            format!("cuptiSubscribe failed: {}", cupti.result_string(rc))
        };
        return Err(disabled(&opts, &session_dir, header, why, by));
    }

    let mut notices = Vec::new();
    let python = opts.enable_stack_trace && pyframes::python_version().is_some();
    if let Some((maj, min)) = pyframes::python_version() {
        header.python_version = Some(format!("{maj}.{min}"));
        if let Some(why) = pyframes::cross_thread_unavailable().filter(|_| python) {
            notices.push(why.to_string());
        } else if python {
            pyframes::xthread::prepare();
        }
    } else if opts.enable_stack_trace {
        if let Some(why) = pyframes::unavailable_reason() {
            if !why.contains("no Python") {
                notices.push(format!("Python frames not captured: {why}"));
            }
        }
    }
    // This thread's unwinding state now, not at its first capture (see unwind::prepare_thread).
    crate::unwind::prepare_thread();
    crate::kernel_detail::set_option(opts.kernel_detail.as_deref());
    notices.extend(enable_collection(cupti, sub, &opts));
    notices.extend(crate::nvtx::enable(cupti, sub));
    if !notices.is_empty() {
        header.capture.status = "partial".into();
        header.capture.reason = Some(notices.join("; "));
    }
    // After the capture's status: a bad option does not make the capture partial.
    notices.extend(env_warnings);
    header.clock = ClockSync {
        trace_ns: cupti.timestamp(),
        unix_ns: procinfo::unix_ns(),
    };

    let (tx, rx) = channel();
    let file_path = session_dir.join(session::FIRST_TRACE_FILE);
    let quiet = opts.quiet;
    let rec = STATE.recorder.get_or_init(|| Recorder {
        opts,
        session_dir: session_dir.clone(),
        cupti,
        subscriber: AtomicPtr::new(sub),
        tx,
        stopped: AtomicBool::new(false),
        python,
        pid,
    });
    crate::scopes::set_enabled(true);
    let spawned = std::thread::Builder::new()
        .name("gpufl-writer".into())
        .spawn(move || writer_thread(rx, file_path, header, notices, cupti));
    if let Err(e) = spawned {
        STATE.disabled.store(true, Ordering::SeqCst);
        crate::scopes::set_enabled(false);
        say(
            false,
            &format!("cannot start the writer thread: {e}; not recording"),
        );
        return Err(InitError::Disabled(e.to_string()));
    }
    register_exit_hooks();
    if let Some(n) = crate::crash::install() {
        say(quiet, &n);
    }
    if rec.opts.mode == crate::options::Mode::AlwaysOn {
        if let Some(n) = crate::always_on::install_trigger_signal() {
            say(quiet, &n);
        }
    }
    say(quiet, &format!("recording to {}", session_dir.display()));
    Ok(rec)
}

fn base_header(opts: &Options, by: StartedBy, dir_name: &str, start_unix_ns: u64) -> Header {
    let job = crate::options::knobs().job.clone();
    Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        gpufl_version: env!("CARGO_PKG_VERSION").into(),
        session_id: dir_name.into(),
        app_name: opts.app_name.clone(),
        host: procinfo::hostname(),
        pid: std::process::id(),
        ppid: procinfo::ppid(),
        command_line: procinfo::command_line(),
        start_unix_ns,
        clock: ClockSync {
            trace_ns: 0,
            unix_ns: start_unix_ns,
        },
        gpus: Vec::new(),
        driver_version: None,
        cupti_version: None,
        python_version: None,
        rank: job.rank,
        local_rank: job.local_rank,
        world_size: job.world_size,
        run_id: job.run_id,
        options: CaptureOptions {
            enable_synchronization: opts.enable_synchronization,
            enable_stack_trace: opts.enable_stack_trace,
            api_records: opts.api_records.as_str().into(),
            log_path: opts.log_path.clone(),
            started_by: by.as_str().into(),
            telemetry_ms: Some(opts.telemetry_ms),
            mode: Some(opts.mode.as_str().into()),
            call_sites: Some(
                if opts.mode == crate::options::Mode::AlwaysOn {
                    "windows"
                } else {
                    "always"
                }
                .into(),
            ),
            host_samples_hz: Some(crate::options::knobs().host_samples_hz),
            hostcall_us: Some(crate::options::knobs().hostcall_us),
            mem_records: Some(crate::options::knobs().mem_records),
            mem_stack_bytes: Some(crate::options::knobs().mem_stack_bytes),
        },
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
    }
}

/// Capture cannot run: say so once, write a session that records why, and get out of the way.
fn disabled(
    opts: &Options,
    dir: &Path,
    mut header: Header,
    why: String,
    by: StartedBy,
) -> InitError {
    say(false, &format!("not recording: {why}"));
    // Neither the host sampler nor the hostcall callbacks run without GPU capture.
    header.options.host_samples_hz = Some(0);
    header.options.hostcall_us = Some(0);
    header.capture = CaptureStatus {
        status: "disabled".into(),
        reason: Some(why.clone()),
    };
    // Started by the injection, this runs inside the program's cuInit: asking the driver now
    // (device::query calls cuInit again) makes the program's CUDA initialization fail. The
    // header then names no GPU.
    if by == StartedBy::Api {
        let info = crate::device::query();
        header.gpus = info.gpus;
        header.driver_version = info.driver_version;
    }
    let _ = opts;
    header.clock = ClockSync {
        trace_ns: trace_clock(),
        unix_ns: procinfo::unix_ns(),
    };
    let path = dir.join(session::FIRST_TRACE_FILE);
    // Scopes are still recorded (a scopes-only session); if that cannot start, header only.
    if crate::scopes::start_standalone(dir.to_path_buf(), path.clone(), &header).is_ok() {
        register_exit_hooks();
        if let Some(n) = crate::crash::install() {
            say(opts.quiet, &n);
        }
        return InitError::Disabled(why);
    }
    let written = std::fs::File::create(&path)
        .map_err(TraceError::from)
        .and_then(|f| TraceWriter::new(BufWriter::new(f), &header))
        .and_then(|w| w.finish(procinfo::unix_ns(), "disabled"));
    if let Err(e) = written {
        say(false, &format!("cannot write {}: {e}", path.display()));
    }
    InitError::Disabled(why)
}

/// CUPTI callback: API entry/exit and resource events. Never unwinds into CUPTI.
pub(crate) unsafe extern "C" fn on_callback(
    _ud: *mut c_void,
    domain: u32,
    cbid: u32,
    data: *const c_void,
) {
    let in_flight = match crate::detach::enter() {
        Ok(in_flight) => in_flight,
        Err(crate::detach::Pending) => {
            // SAFETY: CUPTI passes the callback data matching `domain`.
            let finalized = std::panic::catch_unwind(|| unsafe { while_detaching(domain, data) });
            if let Ok(Some(f)) = finalized {
                crate::detach::publish(f);
            }
            return;
        }
    };
    // Benchmark knob GPUFL_DEBUG_COST=1: the callback's time, by kind (crate::callcost).
    let timed = crate::options::knobs()
        .debug_cost
        .then(std::time::Instant::now);
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: CUPTI passes the callback data matching `domain`.
        unsafe { handle_callback(domain, cbid, data) }
    });
    if let Some(t0) = timed {
        let ns = t0.elapsed().as_nanos() as u64;
        crate::callcost::add(crate::callcost::kind_of(domain, cbid), ns);
    }
    drop(in_flight);
}

/// Always-on is detaching CUPTI (crate::detach): nothing is recorded, no CUPTI call made, until
/// a runtime call's exit detaches.
unsafe fn while_detaching(domain: u32, data: *const c_void) -> Option<crate::detach::Finalized> {
    use std::mem::offset_of;
    type D = cupti::sys::CUpti_CallbackData;
    if domain != cupti::DOMAIN_RUNTIME || data.is_null() || STATE.disabled.load(Ordering::Relaxed) {
        return None;
    }
    // SAFETY: CUPTI passes a CUpti_CallbackData for API domains.
    if unsafe { cb_field::<u32>(data, offset_of!(D, callbackSite)) } == 0 {
        return None;
    }
    let r = STATE.recorder.get()?;
    // SAFETY: CUpti_CallbackData field; a runtime API callback at its exit callsite.
    unsafe {
        let corr = cb_field::<u32>(data, offset_of!(D, correlationId));
        crate::detach::on_api_exit(r.cupti, corr)
    }
}

unsafe fn handle_callback(domain: u32, cbid: u32, data: *const c_void) {
    if STATE.disabled.load(Ordering::Relaxed)
        || data.is_null()
        || (crate::kernel_detail::active() && crate::kernel_detail::busy())
    {
        return;
    }
    match domain {
        // SAFETY: CUPTI passes a CUpti_NvtxData for the NVTX domain.
        crate::nvtx::DOMAIN_NVTX => unsafe { crate::nvtx::on_callback(cbid, data) },
        // SAFETY: CUPTI passes a CUpti_ResourceData for resource callbacks.
        cupti::DOMAIN_RESOURCE if cbid == cupti::CBID_RESOURCE_CONTEXT_CREATED => unsafe {
            crate::kernel_detail::on_context_created(data)
        },
        cupti::DOMAIN_RESOURCE if cbid == cupti::CBID_RESOURCE_CONTEXT_DESTROY_STARTING => {
            STATE.flush_request.store(true, Ordering::Relaxed);
        }
        // SAFETY: CUPTI passes a CUpti_ResourceData for resource callbacks.
        cupti::DOMAIN_RESOURCE if cbid == cupti::CBID_RESOURCE_MODULE_LOADED => unsafe {
            crate::modules::on_module_loaded(data)
        },
        cupti::DOMAIN_RESOURCE
            if cbid == cupti::CBID_RESOURCE_GRAPHNODE_CREATED
                || cbid == cupti::CBID_RESOURCE_GRAPHNODE_CLONED =>
        {
            let Some(r) = STATE.recorder.get() else {
                return;
            };
            // SAFETY: CUPTI passes a CUpti_ResourceData for resource callbacks.
            unsafe { crate::graphnodes::on_graph_node(r.cupti, r.python, cbid, data) }
        }
        cupti::DOMAIN_RESOURCE if cbid == cupti::CBID_RESOURCE_MODULE_UNLOAD_STARTING => {
            crate::sink::MODULE_UNLOADS.fetch_add(1, Ordering::Release);
        }
        cupti::DOMAIN_RUNTIME | cupti::DOMAIN_DRIVER => {
            use std::mem::offset_of;
            type D = cupti::sys::CUpti_CallbackData;
            // Where a detach may happen, API callbacks are never switched off in CUPTI while it
            // stays attached (crate::collection::switch_callback): those switched off in name
            // end here.
            let detaching = crate::detach::possible();
            if detaching
                && (crate::collection::is_paused()
                    || STATE
                        .recorder
                        .get()
                        .is_some_and(|r| r.stopped.load(Ordering::Relaxed)))
            {
                return;
            }
            // SAFETY: CUPTI passes a CUpti_CallbackData for API domains.
            let entry = unsafe { cb_field::<u32>(data, offset_of!(D, callbackSite)) } == 0;
            // Every enabled call marks the thread for the host sampler; the marker also says
            // whether this is the thread's outermost call.
            let outermost = if entry {
                crate::callmark::enter(domain, cbid, crate::sites::epoch())
            } else {
                crate::callmark::exit(domain, cbid)
            };
            if let Some(kind) = crate::collection::site_table().and_then(|t| t.kind(domain, cbid)) {
                if detaching && !crate::collection::site_wanted(domain, cbid) {
                    return;
                }
                if matches!(kind, crate::sites::SiteKind::Launch(_))
                    && crate::kernel_detail::active()
                {
                    // SAFETY: CUPTI passes a CUpti_CallbackData for API domains.
                    unsafe { crate::kernel_detail::on_launch(domain, cbid, data) }
                }
                let Some(r) = STATE.recorder.get() else {
                    return;
                };
                let call = crate::sites::SiteCall {
                    cupti: r.cupti,
                    kind,
                    domain,
                    cbid,
                    python: r.python,
                };
                // SAFETY: CUPTI passes a CUpti_CallbackData for API domains.
                unsafe { crate::sites::on_site_api(call, data) }
            } else if let Some(table) =
                crate::collection::hostcall_table().filter(|t| t.contains(domain, cbid))
            {
                if detaching && crate::collection::is_muted(domain, cbid) {
                    return;
                }
                let Some(r) = STATE.recorder.get() else {
                    return;
                };
                let call = crate::hostcalls::HostcallCall {
                    cupti: r.cupti,
                    table,
                    domain,
                    cbid,
                    entry,
                    outermost,
                    stacks: r.opts.enable_stack_trace,
                    python: r.python,
                    threshold_ns: match crate::options::knobs().hostcall_us {
                        0 => u64::MAX,
                        us => u64::from(us) * 1000,
                    },
                    mem: crate::options::knobs().mem_records,
                    mem_stack_bytes: crate::options::knobs().mem_stack_bytes,
                };
                // SAFETY: CUPTI passes a CUpti_CallbackData for API domains.
                unsafe { crate::hostcalls::on_api(call, data) }
            } else {
                // SAFETY: CUPTI passes a CUpti_CallbackData for API domains.
                unsafe { on_sync_api(domain, cbid, data) }
            }
        }
        _ => {}
    }
}

/// Entry and exit of a synchronization call (only those callbacks are enabled). The outermost
/// call of a thread is recorded: a driver sync inside a runtime sync is the same wait.
unsafe fn on_sync_api(domain: u32, cbid: u32, data: *const c_void) {
    use std::mem::offset_of;
    type D = cupti::sys::CUpti_CallbackData;
    let Some(r) = STATE.recorder.get() else {
        return;
    };
    let Some((_, param, per_thread)) = cbids::sync_kind(domain, cbid) else {
        return;
    };
    // SAFETY (all reads): CUpti_CallbackData field offsets; plain integers and pointers.
    let site: u32 = unsafe { cb_field(data, offset_of!(D, callbackSite)) };
    let _ = ACTIVE.try_with(|cell| {
        let Ok(mut active) = cell.try_borrow_mut() else {
            return;
        };
        if site == 0 {
            if !active.nest.enter(domain, cbid, crate::detach::generation()) {
                return;
            }
            let s = &mut active.sample;
            s.corr = unsafe { crate::detach::callback_corr(data) };
            s.domain = domain;
            s.cbid = cbid;
            s.ctx = unsafe { cb_field(data, offset_of!(D, contextUid)) };
            s.tid = procinfo::gettid();
            s.stream = None;
            s.has_stack = r.opts.enable_stack_trace;
            s.len = 0;
            s.native_elided = false;
            s.via_tid = 0;
            if param == cbids::SyncParam::Stream {
                let params: *const c_void =
                    unsafe { cb_field(data, offset_of!(D, functionParams)) };
                let ctx: *mut c_void = unsafe { cb_field(data, offset_of!(D, context)) };
                if !params.is_null() {
                    // The stream handle is the first parameter of every stream sync/wait entry point.
                    let stream = unsafe { (params as *const *mut c_void).read_unaligned() };
                    s.stream = unsafe { r.cupti.stream_id(ctx, stream, per_thread) };
                }
            }
            // A stack copy still held here was never handed to the writer (an entry whose exit
            // never came): give its slot back.
            stack::forget_copy(s);
            if s.has_stack {
                stack::capture_into(s, r.python);
            }
            s.ts = r.cupti.timestamp();
        } else {
            if !active.nest.exit(domain, cbid) {
                return;
            }
            active.sample.end = r.cupti.timestamp();
            stack::push(active.sample);
            // The pushed copy owns the stack copy now.
            active.sample.native_copy = 0;
        }
    });
}

/// The synchronization call a thread is inside (between its entry and exit callbacks).
struct Active {
    nest: Nesting,
    sample: Sample,
}

thread_local! {
    static ACTIVE: std::cell::RefCell<Active> = const {
        std::cell::RefCell::new(Active {
            nest: Nesting::new(),
            sample: Sample::empty(),
        })
    };
}

/// Which entry/exit callbacks of one thread open and close a recorded synchronization: the
/// outermost call only (a driver sync inside a runtime sync is the same wait).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Nesting {
    depth: u32,
    key: (u32, u32),
    /// CUPTI's attach generation (crate::detach::generation) at the outermost entry.
    epoch: u32,
}

impl Nesting {
    pub(crate) const fn new() -> Nesting {
        Nesting {
            depth: 0,
            key: (0, 0),
            epoch: 0,
        }
    }

    /// An entry callback; true if it opens a new recorded call.
    pub(crate) fn enter(&mut self, domain: u32, cbid: u32, epoch: u32) -> bool {
        // Same-domain sync calls never nest: a depth left over from an entry whose exit never came
        // (an exception unwinding through the API call) is stale, so a new call starts afresh;
        // so is one from before CUPTI was last detached (its exit may have come while CUPTI was
        // away: crate::detach).
        if self.depth > 0 && self.key.0 != domain && self.epoch == epoch {
            self.depth += 1;
            return false;
        }
        self.depth = 1;
        self.key = (domain, cbid);
        self.epoch = epoch;
        true
    }

    /// An exit callback; true if it closes the recorded call.
    pub(crate) fn exit(&mut self, domain: u32, cbid: u32) -> bool {
        if self.depth == 0 {
            return false;
        }
        self.depth -= 1;
        self.depth == 0 && self.key == (domain, cbid)
    }
}

pub(crate) unsafe extern "C" fn buffer_requested(
    buf: *mut *mut u8,
    size: *mut usize,
    max_records: *mut usize,
) {
    let _ = std::panic::catch_unwind(|| {
        let p = if STATE.disabled.load(Ordering::Relaxed) {
            None
        } else {
            pool::take()
        };
        // SAFETY: CUPTI passes valid out-pointers.
        unsafe {
            *max_records = 0;
            match p {
                Some(p) => {
                    *buf = p;
                    *size = pool::BUFFER_SIZE;
                }
                None => {
                    *buf = std::ptr::null_mut();
                    *size = 0;
                }
            }
        }
    });
}

pub(crate) unsafe extern "C" fn buffer_completed(
    ctx: *mut c_void,
    stream: u32,
    buf: *mut u8,
    _size: usize,
    valid: usize,
) {
    let _ = std::panic::catch_unwind(|| {
        if buf.is_null() {
            return;
        }
        let Some(r) = STATE.recorder.get() else {
            pool::give_back(buf);
            return;
        };
        let finalizing = crate::detach::finalizing();
        let mut dropped = 0usize;
        if !finalizing {
            // SAFETY: plain CUPTI call with CUPTI's own context/stream values.
            unsafe { (r.cupti.activity_get_num_dropped_records)(ctx, stream, &mut dropped) };
        }
        let msg = Msg::Buffer {
            ptr: buf as usize,
            valid,
            dropped: dropped as u64,
            recycle: !finalizing,
            corr_base: crate::detach::corr_base(),
        };
        if r.tx.send(msg).is_err() {
            pool::give_back(buf);
        }
    });
}

/// The writer thread: opens the trace, then serves the channel and the periodic duties until a
/// stop request ([`Writer::run`]).
fn writer_thread(
    rx: Receiver<Msg>,
    path: PathBuf,
    mut header: Header,
    notices: Vec<String>,
    cupti: &'static Cupti,
) {
    let info = crate::device::query();
    header.gpus = info.gpus;
    header.driver_version = info.driver_version;
    let mut notices = notices;
    if let Some(e) = info.error {
        notices.push(format!("GPU list unavailable: {e}"));
    }
    let mut sink = open_trace(&path, &header, notices, cupti);
    // Always-on: large libraries' symbols loaded past the start (Sink::defer_large_symbols).
    if header.options.mode.as_deref() == Some(crate::options::Mode::AlwaysOn.as_str())
        && crate::options::knobs().defer_symbols
    {
        if let Some(s) = sink.as_mut() {
            s.defer_large_symbols();
        }
    }
    let telemetry = start_telemetry(&mut sink, &header, cupti);
    let host_sampler = start_host_sampler(&mut sink, cupti);
    // The module list for native stacks, built here rather than by the first capture on the hot
    // path; kept current below (libraries loaded later, rebuilds a bounded walk asked for).
    crate::unwind::service();
    let knobs = crate::options::knobs();
    let flush_period = knobs
        .cupti_flush_period
        .filter(|_| !knobs.cupti_flushes_itself);
    let last_cupti_flush = Instant::now();
    let last_block = Instant::now();
    crate::crash::set_writer_thread();
    let opts = STATE
        .recorder
        .get()
        .map(|r| r.opts.clone())
        .unwrap_or_default();
    let always_on = crate::always_on::Scheduler::new(&opts);
    let driver_sites = crate::sites::DriverSitePolicy::new(Instant::now());
    let rolling = path
        .parent()
        .and_then(|dir| crate::rolling::Rolling::new(dir, opts.max_disk_bytes));
    Writer {
        rx,
        sink,
        header,
        cupti,
        telemetry,
        host_sampler,
        hostcall_mute: crate::hostcalls::MutePolicy::new(Instant::now()),
        flush_period,
        last_cupti_flush,
        last_block,
        always_on,
        driver_sites,
        rolling,
        deferred_stop: None,
    }
    .run();
}

/// Create the trace file with `header`, write the start `notices` and close the first block, so
/// that the header reaches the disk now, not with the first periodic block: a program that
/// crashes early still leaves a session that says what was recorded. None (said once) when it
/// cannot be written: records are then discarded.
fn open_trace(
    path: &Path,
    header: &Header,
    notices: Vec<String>,
    cupti: &'static Cupti,
) -> Option<Sink> {
    let opened = std::fs::File::create(path)
        .map_err(TraceError::from)
        .and_then(|f| TraceWriter::new(BufWriter::with_capacity(1 << 20, f), header));
    let mut sink = match opened {
        Ok(w) => Some(Sink::new(w, Some(cupti)).with_feed(header)),
        Err(e) => {
            say(
                false,
                &format!(
                    "cannot write {}: {e}; records are discarded",
                    path.display()
                ),
            );
            None
        }
    };
    if let Some(s) = sink.as_mut() {
        for n in notices {
            let _ = s.write(&Record::Notice(Notice {
                level: "warning".into(),
                message: n,
            }));
        }
        let result = s.end_block();
        report(&mut sink, result);
    }
    sink
}

/// Start the telemetry thread (when the trace is open and the period is not 0); it sends its
/// rounds on the writer's channel.
fn start_telemetry(
    sink: &mut Option<Sink>,
    header: &Header,
    cupti: &'static Cupti,
) -> Option<crate::telemetry::Handle> {
    match (sink.as_mut(), STATE.recorder.get()) {
        (Some(s), Some(r)) => {
            let tx = r.tx.clone();
            let ms = header.options.telemetry_ms.unwrap_or(0);
            let clock = move || cupti.timestamp();
            let send = move |t| tx.send(Msg::Telemetry(t)).is_ok();
            crate::telemetry::start_for(s, &header.gpus, ms, clock, send)
        }
        _ => None,
    }
}

/// Start the host sampler (unless `GPUFL_HOST_SAMPLES=0`); a sampler that cannot start leaves a
/// notice.
fn start_host_sampler(
    sink: &mut Option<Sink>,
    cupti: &'static Cupti,
) -> Option<crate::hostsampler::Handle> {
    match crate::hostsampler::start(move || cupti.timestamp())? {
        Ok(h) => Some(h),
        Err(e) => {
            if let Some(s) = sink.as_mut() {
                let _ = s.write(&Record::Notice(Notice {
                    level: "warning".into(),
                    message: format!("host samples off: cannot start the sampler thread ({e})"),
                }));
            }
            None
        }
    }
}

/// The writer thread's state between the turns of its loop.
struct Writer {
    rx: Receiver<Msg>,
    /// None once a write failed ([`report`]): records are then discarded, buffers recycled.
    sink: Option<Sink>,
    header: Header,
    cupti: &'static Cupti,
    telemetry: Option<crate::telemetry::Handle>,
    host_sampler: Option<crate::hostsampler::Handle>,
    /// The hostcall callbacks' cost guard.
    hostcall_mute: crate::hostcalls::MutePolicy,
    /// How often CUPTI is asked for its completed buffers (None: never, or CUPTI flushes itself).
    flush_period: Option<Duration>,
    last_cupti_flush: Instant,
    last_block: Instant,
    always_on: Option<crate::always_on::Scheduler>,
    driver_sites: crate::sites::DriverSitePolicy,
    rolling: Option<crate::rolling::Rolling>,
    /// A stop request met while taking the buffers before a detach, handled on the next turn.
    deferred_stop: Option<Msg>,
}

impl Writer {
    /// Serve the channel until a stop request (or until every sender is gone).
    fn run(mut self) {
        // A stop request met while serving a signal's flush, handled on the next turn.
        let mut deferred: Option<Msg> = None;
        loop {
            // Short waits: a fatal signal's flush request is polled here (a signal handler
            // cannot use the channel).
            let msg = match deferred.take().or_else(|| self.deferred_stop.take()) {
                Some(m) => Ok(m),
                None => self.rx.recv_timeout(Duration::from_millis(25)),
            };
            let stopping = matches!(msg, Ok(Msg::Stop { .. }));
            self.drain_queues();
            match msg {
                Ok(Msg::Buffer {
                    ptr,
                    valid,
                    dropped,
                    recycle,
                    corr_base,
                }) => take_buffer(&mut self.sink, ptr, valid, dropped, recycle, corr_base),
                Ok(Msg::Telemetry(t)) => take_telemetry(&mut self.sink, t),
                Ok(Msg::Stop { reason, ack }) => return self.stop(reason, ack),
                Ok(Msg::Capture { ts, recording }) => take_capture(&mut self.sink, ts, recording),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            self.tick();
            if let Some(sig) = crate::crash::pending() {
                deferred = flush_for_signal(&mut self.sink, &self.rx, self.cupti, sig);
                crate::crash::served();
                self.last_block = Instant::now();
                continue;
            }
            self.flush_cupti_if_due(stopping);
            self.close_block_if_due();
        }
    }

    /// Write what the hot paths queued (samples, scopes, modules, kernel detail's samples) and
    /// publish kernel detail's top N.
    fn drain_queues(&mut self) {
        let result = (|| -> Result<(), TraceError> {
            let Some(s) = self.sink.as_mut() else {
                return Ok(());
            };
            s.drain_samples()?;
            crate::scopes::drain_into(s)?;
            crate::modules::drain_into(s)?;
            crate::kernel_detail::drain_into(s)?;
            if let Some(t) = s.kd_tally.as_mut() {
                t.publish(trace_clock());
            }
            Ok(())
        })();
        report(&mut self.sink, result);
    }

    /// The periodic duties of every turn: always-on windows, the metrics feed, the driver
    /// call-site policy, the module list.
    fn tick(&mut self) {
        if let Some(a) = self.always_on.as_mut() {
            let result = a.tick(self.sink.as_mut(), Instant::now());
            report(&mut self.sink, result);
        }
        if let Some(closed) = self.always_on.as_mut().and_then(|a| a.take_detach_due()) {
            self.detach(closed);
        }
        crate::metrics_feed::tick(self.sink.as_mut());
        self.driver_sites.tick(Instant::now());
        self.hostcall_mute.tick(Instant::now());
        crate::unwind::service();
    }

    /// Always-on, after a window: every record CUPTI holds written first (their kernel names
    /// point into CUPTI, which detaching frees), then CUPTI detached and attached again
    /// (crate::detach, `collection::detach_cycle`), with correlation ids continuing above the
    /// last generation's.
    fn detach(&mut self, closed: Instant) {
        if !crate::collection::detach_applies() {
            return;
        }
        // SAFETY: plain CUPTI call on this thread, CUPTI attached: every buffer to the channel.
        unsafe { (self.cupti.activity_flush_all)(cupti::FLUSH_FORCED) };
        self.last_cupti_flush = Instant::now();
        self.deferred_stop = take_pending(&mut self.sink, &self.rx);
        let outcome = if self.deferred_stop.is_some() {
            None
        } else {
            crate::collection::detach_cycle()
        };
        if matches!(outcome, Some(crate::collection::DetachOutcome::Done { .. })) {
            if let Some(s) = self.sink.as_mut() {
                s.forget_kernel_names();
            }
        }
        if let Some(a) = self.always_on.as_mut() {
            let result = a.detached(self.sink.as_mut(), closed, outcome);
            report(&mut self.sink, result);
        }
    }

    /// Ask CUPTI for its completed buffers when the period has passed (not once stopping).
    fn flush_cupti_if_due(&mut self, stopping: bool) {
        let stopped = STATE
            .recorder
            .get()
            .is_none_or(|r| r.stopped.load(Ordering::Relaxed));
        if !stopping
            && !stopped
            && self
                .flush_period
                .is_some_and(|p| self.last_cupti_flush.elapsed() >= p)
        {
            // SAFETY: default flush: delivers completed buffers to buffer_completed on this thread.
            unsafe { (self.cupti.activity_flush_all)(0) };
            self.last_cupti_flush = Instant::now();
        }
    }

    /// Close a block every [`BLOCK_PERIOD`], or at once when a context is being destroyed (with
    /// the buffers CUPTI could not get from the pool counted first); rolling files follow.
    fn close_block_if_due(&mut self) {
        let forced = STATE.flush_request.swap(false, Ordering::Relaxed);
        let due = self.last_block.elapsed() >= BLOCK_PERIOD;
        if !(forced || due) {
            return;
        }
        let result = (|| -> Result<(), TraceError> {
            let Some(s) = self.sink.as_mut() else {
                return Ok(());
            };
            let lost = pool::take_refused();
            if lost > 0 {
                s.write(&Record::Dropped(Dropped {
                    source: "buffer_pool".into(),
                    count: lost,
                }))?;
            }
            if s.has_unblocked() || forced {
                s.end_block()?;
                if let Some(r) = self.rolling.as_mut() {
                    r.after_block(s, &self.header)?;
                }
            }
            Ok(())
        })();
        report(&mut self.sink, result);
        self.last_block = Instant::now();
    }

    /// A stop request: stop telemetry, take what is still on the channel, write the closing
    /// records and the end record, and answer with the session's counts.
    fn stop(mut self, reason: &'static str, ack: Sender<Option<Counts>>) {
        if let Some(t) = &self.telemetry {
            t.stop();
        }
        let sampler_stopped = self.host_sampler.as_ref().map(|h| h.stop());
        // A second stop request (its sender gets no answer) ends the taking as before.
        let _ = take_pending(&mut self.sink, &self.rx);
        let counts = self.sink.take().and_then(|mut s| {
            if let Some(a) = self.always_on.as_mut() {
                let _ = a.finish(&mut s);
            }
            let _ = s.drain_samples();
            let _ = crate::scopes::finish_into(&mut s);
            let _ = crate::modules::finish_into(&mut s);
            let _ = crate::kernel_detail::finish_into(&mut s);
            crate::telemetry::finish(self.telemetry.as_ref(), &mut s);
            host_time_notices(
                &mut s,
                self.host_sampler.as_ref(),
                sampler_stopped,
                &self.hostcall_mute,
            );
            closing_notices(&mut s, &self.driver_sites);
            crate::metrics_feed::before_end(&mut s);
            s.finish(reason).ok()
        });
        let _ = ack.send(counts);
    }
}

/// The notices of the host time: the host sampler's figures (samples, threads, its CPU time, rate
/// changes, losses) and the hostcall records' (recorded, without a stack, lost, callbacks turned
/// off).
fn host_time_notices(
    s: &mut Sink,
    sampler: Option<&crate::hostsampler::Handle>,
    stopped: Option<bool>,
    mute: &crate::hostcalls::MutePolicy,
) {
    let mut lines = Vec::new();
    if let Some(h) = sampler {
        lines.push(h.summary(s.hsamples_lost));
        if stopped == Some(false) {
            lines.push("host samples: the sampler thread did not stop in time".to_string());
        }
    }
    let us = crate::options::knobs().hostcall_us;
    let (written, lost) = (s.hostcalls, s.hostcalls_lost);
    let name = |d: u32, c: u32| {
        cupti_loaded()
            .and_then(|k| k.callback_name(d, c))
            .unwrap_or_else(|| format!("cbid {c}"))
    };
    let summary = crate::hostcalls::summary(us, written, lost, mute.muted(), name);
    lines.extend(summary);
    for message in lines {
        let _ = s.write(&Record::Notice(Notice {
            level: "info".into(),
            message,
        }));
    }
}

/// The notices that close a session: the capture cost breakdown, the driver call-site policy,
/// what the call-site budget skipped, records left out, the benchmark knobs' counts, the capture
/// cost summary.
fn closing_notices(s: &mut Sink, driver_sites: &crate::sites::DriverSitePolicy) {
    let (incomplete, from_callbacks, discarded) =
        (s.incomplete, s.api_from_callbacks, s.discarded_api);
    let mut say = |level: &str, message: String| {
        let _ = s.write(&Record::Notice(Notice {
            level: level.into(),
            message,
        }));
    };
    for line in stack::debug_cost_lines() {
        say("debug", line);
    }
    if let Some(line) = driver_sites.summary(Instant::now()) {
        say("info", line);
    }
    let limited = crate::sites::take_rate_limited();
    if limited > 0 {
        say("info", format!(
            "call-site stacks: {limited} launch/copy captures skipped for the time budget (their calls are counted in later captures' weights)"
        ));
    }
    if incomplete > 0 {
        say("info", format!(
            "{incomplete} GPU activity records without end times (work still in flight at a forced flush) left out"
        ));
    }
    if from_callbacks > 0 {
        say("info", format!(
            "GPUFL_API_FROM=callbacks: {from_callbacks} launch api records made by the call-site callbacks (benchmark knob)"
        ));
    }
    if discarded > 0 {
        say(
            "info",
            format!(
                "GPUFL_API_DISCARD=1: {discarded} API records dropped unwritten (benchmark knob)"
            ),
        );
    }
    if let Some(cost) = stack::cost_summary() {
        say("info", cost);
    }
    if let Some(cost) = crate::callcost::summary() {
        say("info", cost);
    }
}

/// A fatal signal arrived on another thread: write what is held (CUPTI's buffers, forced; the
/// sample, scope and module queues), a notice naming the signal, and close a block. Returns a stop
/// request met on the way, for the caller to handle next.
fn flush_for_signal(
    sink: &mut Option<Sink>,
    rx: &Receiver<Msg>,
    cupti: &'static Cupti,
    sig: i32,
) -> Option<Msg> {
    // SAFETY: delivers every buffer, complete or not, to buffer_completed (on this thread).
    unsafe { (cupti.activity_flush_all)(cupti::FLUSH_FORCED) };
    let deferred = take_pending(sink, rx);
    let result = (|| -> Result<(), TraceError> {
        let Some(s) = sink.as_mut() else {
            return Ok(());
        };
        s.drain_samples()?;
        crate::scopes::drain_into(s)?;
        crate::modules::drain_into(s)?;
        crate::kernel_detail::drain_into(s)?;
        s.write(&Record::Notice(Notice {
            level: "warning".into(),
            message: format!(
                "received {}{}: recording flushed ({} GPU records still in flight left out); the \
                 program may end here",
                crate::crash::signal_name(sig),
                crate::crash::fault_text(),
                s.incomplete
            ),
        }))?;
        s.end_block()
    })();
    report(sink, result);
    deferred
}

/// Take every message on the channel now, up to a stop request, which is returned (for the
/// caller to serve next).
fn take_pending(sink: &mut Option<Sink>, rx: &Receiver<Msg>) -> Option<Msg> {
    while let Ok(m) = rx.try_recv() {
        match m {
            Msg::Buffer {
                ptr,
                valid,
                dropped,
                recycle,
                corr_base,
            } => take_buffer(sink, ptr, valid, dropped, recycle, corr_base),
            Msg::Telemetry(t) => take_telemetry(sink, t),
            Msg::Capture { ts, recording } => take_capture(sink, ts, recording),
            stop @ Msg::Stop { .. } => return Some(stop),
        }
    }
    None
}

fn take_buffer(
    sink: &mut Option<Sink>,
    ptr: usize,
    valid: usize,
    dropped: u64,
    recycle: bool,
    corr_base: u32,
) {
    let result = (|| -> Result<(), TraceError> {
        let Some(s) = sink.as_mut() else {
            return Ok(());
        };
        match crate::options::knobs().discard {
            Discard::No => {}
            Discard::Untouched => return Ok(()),
            mode => {
                // SAFETY: as below.
                unsafe { s.walk_buffer(ptr as *mut u8, valid, mode == Discard::Decode) };
                return Ok(());
            }
        }
        s.set_buffer_context(corr_base, recycle);
        // SAFETY: ptr/valid come from CUPTI's completion callback.
        unsafe { s.take_buffer(ptr as *mut u8, valid)? };
        if dropped > 0 {
            s.write(&Record::Dropped(Dropped {
                source: "cupti".into(),
                count: dropped,
            }))?;
        }
        Ok(())
    })();
    if recycle {
        pool::give_back(ptr as *mut u8);
    } else {
        pool::retire(ptr as *mut u8);
    }
    report(sink, result);
}

fn take_capture(sink: &mut Option<Sink>, ts: u64, recording: bool) {
    if let Some(s) = sink.as_mut() {
        let result = s.write(&Record::Capture(CaptureState { ts, recording }));
        report(sink, result);
    }
}

fn take_telemetry(sink: &mut Option<Sink>, t: crate::telemetry::Report) {
    if let Some(s) = sink.as_mut() {
        let result = crate::telemetry::write(s, t);
        report(sink, result);
    }
}

/// On a write error: say it once and stop writing (records are then discarded, buffers recycled).
fn report(sink: &mut Option<Sink>, result: Result<(), TraceError>) {
    if let Err(e) = result {
        say(
            false,
            &format!("trace write failed ({e}); recording stops here"),
        );
        *sink = None;
    }
}

/// Stop recording: flush CUPTI, write the end record, close the file. Idempotent; bounded in time.
pub fn stop(reason: &'static str) -> Option<Counts> {
    let Some(r) = STATE.recorder.get() else {
        return crate::scopes::stop_standalone(reason);
    };
    if r.pid != std::process::id() {
        // A forked child: the writer thread and CUPTI state belong to the parent.
        return None;
    }
    if r.stopped.swap(true, Ordering::SeqCst) {
        return None;
    }
    // A detach under way ends first (it gives up on seeing `stopped`, or attaches again): no
    // CUPTI call below may race `cuptiFinalize`, and the subscriber is the current one.
    let held = crate::collection::hold_changes();
    let c = r.cupti;
    let sub = r.subscriber.load(Ordering::SeqCst);
    // SAFETY: plain CUPTI calls on our own subscriber.
    unsafe {
        if reason != "exit" {
            // The program goes on: stop collecting, so CUPTI stops filling buffers. (Where a
            // detach may happen the API callbacks stay on and end in their handler:
            // crate::collection::switch_callback.)
            if !crate::detach::possible() {
                (c.enable_domain)(0, sub, cupti::DOMAIN_RUNTIME);
                (c.enable_domain)(0, sub, cupti::DOMAIN_DRIVER);
            }
            for k in [
                cupti::KIND_CONCURRENT_KERNEL,
                cupti::KIND_MEMCPY,
                cupti::KIND_MEMSET,
                cupti::KIND_OVERHEAD,
                cupti::KIND_SYNCHRONIZATION,
                cupti::KIND_RUNTIME,
                cupti::KIND_DRIVER,
            ] {
                (c.activity_disable)(k);
            }
        }
        (c.activity_flush_all)(cupti::FLUSH_FORCED);
    }
    drop(held);
    let (ack_tx, ack_rx) = channel();
    if r.tx
        .send(Msg::Stop {
            reason,
            ack: ack_tx,
        })
        .is_err()
    {
        return None;
    }
    let counts = ack_rx.recv_timeout(STOP_TIMEOUT).ok().flatten();
    STATE.disabled.store(true, Ordering::SeqCst);
    if reason != "exit" {
        // SAFETY: our own subscriber; lets another tool subscribe after us.
        unsafe { (c.unsubscribe)(sub) };
    }
    if counts.is_none() {
        say(
            false,
            "the writer did not finish in time; the session may end early",
        );
    }
    counts
}

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        stop("exit");
    });
}

extern "C" fn in_forked_child() {
    // The host sampler thread is not in the child either: its handle, the parent writer's, is
    // never stopped here (stop() returns in a forked child before reaching the writer), and
    // would not wait (hostsampler::Handle::stop).
    STATE.disabled.store(true, Ordering::SeqCst);
    crate::pyframes::xthread::note_fork();
    crate::scopes::set_enabled(false);
}

fn register_exit_hooks() {
    STATE.exit_hooks.call_once(|| {
        // SAFETY: registering plain extern "C" functions that never unwind.
        unsafe {
            libc::atexit(at_exit);
            libc::pthread_atfork(None, None, Some(in_forked_child));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::Nesting;
    use crate::cupti::{DOMAIN_DRIVER as DRV, DOMAIN_RUNTIME as RT};

    #[test]
    fn driver_sync_inside_runtime_sync_is_recorded_once() {
        let mut n = Nesting::new();
        assert!(n.enter(RT, 131, 0)); // cudaStreamSynchronize
        assert!(!n.enter(DRV, 126, 0)); // cuStreamSynchronize inside it
        assert!(!n.exit(DRV, 126));
        assert!(n.exit(RT, 131));
        assert!(!n.exit(RT, 131), "an unmatched exit closes nothing");
    }

    #[test]
    fn driver_only_sync_is_recorded() {
        let mut n = Nesting::new();
        assert!(n.enter(DRV, 17, 0));
        assert!(n.exit(DRV, 17));
    }

    #[test]
    fn an_entry_without_exit_does_not_silence_the_thread() {
        let mut n = Nesting::new();
        assert!(n.enter(RT, 165, 0)); // its exit never comes
        assert!(n.enter(RT, 131, 0), "the next runtime sync is recorded");
        assert!(n.exit(RT, 131));
        assert!(n.enter(DRV, 17, 0));
    }

    #[test]
    fn an_exit_missed_across_a_detach_does_not_silence_the_thread() {
        let mut n = Nesting::new();
        assert!(n.enter(DRV, 17, 3)); // its exit came while CUPTI was away
        assert!(!n.enter(RT, 131, 3), "same epoch: taken as nested");
        let mut n = Nesting::new();
        assert!(n.enter(DRV, 17, 3));
        assert!(
            n.enter(RT, 131, 4),
            "after the switch the runtime sync is recorded"
        );
        assert!(!n.enter(DRV, 126, 4));
        assert!(!n.exit(DRV, 126));
        assert!(n.exit(RT, 131));
    }
}
