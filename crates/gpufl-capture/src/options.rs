//! Recorder options: the seed's `InitOptions`, each also settable by an environment variable
//! (the variable wins, so a build need not change to flip an option), and every other `GPUFL_*`
//! knob ([`Knobs`], read once, at the first use of any: the recorder's start reads them).
//!
//! This module is the only place the recorder reads a `GPUFL_*` variable; the other modules read
//! the parsed values here.

use std::sync::OnceLock;
use std::time::Duration;

/// Which API calls get `api` records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiRecords {
    /// None.
    None,
    /// Synchronization calls only.
    Sync,
    /// Launches, copies, memsets, syncs, allocations, event records, graph launches (the default).
    Default,
    /// Every runtime and driver call except the noisy query calls (costly: see docs/benchmarks.md).
    All,
}

impl ApiRecords {
    pub fn as_str(self) -> &'static str {
        match self {
            ApiRecords::None => "none",
            ApiRecords::Sync => "sync",
            ApiRecords::Default => "default",
            ApiRecords::All => "all",
        }
    }
    fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "off" | "0" => Some(ApiRecords::None),
            "sync" => Some(ApiRecords::Sync),
            "default" | "on" | "1" => Some(ApiRecords::Default),
            "all" => Some(ApiRecords::All),
            _ => None,
        }
    }
}

/// Recording mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every kernel, copy and memset, API records, every sync with its stack.
    #[default]
    Default,
    /// For production: every sync with its stack, sampled call sites with their counts,
    /// telemetry; GPU activity only inside windows chosen by a cost budget, or asked for
    /// (`gpufl trigger`, the trigger signal, `gpufl_capture_window`); disk bounded by rolling files.
    AlwaysOn,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Default => "default",
            Mode::AlwaysOn => "always-on",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "default" | "full" => Some(Mode::Default),
            "always-on" | "always_on" | "alwayson" => Some(Mode::AlwaysOn),
            _ => None,
        }
    }
}

/// Default disk bound of an always-on session, MiB (`GPUFL_MAX_DISK_MB`).
pub const DEFAULT_ALWAYS_ON_DISK_MB: u64 = 256;

/// Options of one recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Name of the application (session directory prefix). Default: the program's name.
    pub app_name: String,
    /// Directory in which the session directory is created. Default: `./gpufl-sessions`.
    pub log_path: String,
    /// Record synchronizations (activity + API callbacks). Default on.
    pub enable_synchronization: bool,
    /// Capture CPU stacks at synchronization calls. Default off in the API (as the seed says),
    /// on under `gpufl record`.
    pub enable_stack_trace: bool,
    pub api_records: ApiRecords,
    /// Print nothing on stderr except errors.
    pub quiet: bool,
    /// Period of the NVML telemetry samples, ms (`GPUFL_TELEMETRY_MS`); 0 turns telemetry off,
    /// values under [`MIN_TELEMETRY_MS`] are raised to it. Default [`DEFAULT_TELEMETRY_MS`].
    pub telemetry_ms: u32,
    /// Server URL and key (used by upload; kept for the seed's API).
    pub backend_url: String,
    pub api_key: String,
    /// Recording mode (`GPUFL_MODE`).
    pub mode: Mode,
    /// Disk bound of the session, bytes (`GPUFL_MAX_DISK_MB`; 0: none): older trace files are
    /// deleted to stay under it. Default: none, 256 MiB in always-on mode.
    pub max_disk_bytes: u64,
    /// Kernel detail (docs/kernel-detail.md; `GPUFL_KERNEL_DETAIL` wins): "N" the top N kernels by GPU
    /// time, else comma-separated name fragments; None: off.
    pub kernel_detail: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            app_name: default_app_name(),
            log_path: "gpufl-sessions".into(),
            enable_synchronization: true,
            enable_stack_trace: false,
            api_records: ApiRecords::Default,
            quiet: false,
            telemetry_ms: DEFAULT_TELEMETRY_MS,
            backend_url: String::new(),
            api_key: String::new(),
            mode: Mode::Default,
            max_disk_bytes: 0,
            kernel_detail: None,
        }
    }
}

/// Default period of the telemetry samples, ms.
pub const DEFAULT_TELEMETRY_MS: u32 = 100;
/// Shortest telemetry period, ms: NVML's utilization counters themselves update every 1/6 s to 1 s,
/// and each round of queries costs tens of µs per GPU.
pub const MIN_TELEMETRY_MS: u32 = 10;

/// Parse a telemetry period: milliseconds, `0`/`off` for none; raised to [`MIN_TELEMETRY_MS`].
pub fn parse_telemetry_ms(s: &str) -> Option<u32> {
    let t = s.trim().to_ascii_lowercase();
    if t == "off" || t == "false" || t == "no" {
        return Some(0);
    }
    match t.parse::<u32>().ok()? {
        0 => Some(0),
        ms => Some(ms.max(MIN_TELEMETRY_MS)),
    }
}

/// Parse a boolean environment value: 1/true/yes/on and 0/false/no/off.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl Options {
    /// Apply `GPUFL_*` environment variables on top of `self`. Returns warnings for values that
    /// could not be parsed (they are ignored).
    pub fn apply_env_from(&mut self, get: impl Fn(&str) -> Option<String>) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(v) = get("GPUFL_APP_NAME").filter(|v| !v.is_empty()) {
            self.app_name = v;
        }
        if let Some(v) = get("GPUFL_LOG_PATH").filter(|v| !v.is_empty()) {
            self.log_path = v;
        }
        let mut flag = |name: &str, slot: &mut bool| {
            if let Some(v) = get(name) {
                match parse_bool(&v) {
                    Some(b) => *slot = b,
                    None => warnings.push(format!("{name}={v:?} is not a boolean; ignored")),
                }
            }
        };
        flag(
            "GPUFL_ENABLE_SYNCHRONIZATION",
            &mut self.enable_synchronization,
        );
        flag("GPUFL_ENABLE_STACK_TRACE", &mut self.enable_stack_trace);
        flag("GPUFL_QUIET", &mut self.quiet);
        if let Some(v) = get("GPUFL_API_RECORDS") {
            match ApiRecords::parse(&v) {
                Some(a) => self.api_records = a,
                None => warnings.push(format!(
                    "GPUFL_API_RECORDS={v:?} is not one of none|sync|default|all; ignored"
                )),
            }
        }
        if let Some(v) = get("GPUFL_TELEMETRY_MS") {
            match parse_telemetry_ms(&v) {
                Some(ms) => self.telemetry_ms = ms,
                None => warnings.push(format!(
                    "GPUFL_TELEMETRY_MS={v:?} is not a period in ms (or 0/off); ignored"
                )),
            }
        }
        if let Some(v) = get("GPUFL_MODE").filter(|v| !v.is_empty()) {
            match Mode::parse(&v) {
                Some(m) => self.mode = m,
                None => warnings.push(format!(
                    "GPUFL_MODE={v:?} is not one of default|always-on; ignored"
                )),
            }
        }
        if self.mode == Mode::AlwaysOn && self.max_disk_bytes == 0 {
            self.max_disk_bytes = DEFAULT_ALWAYS_ON_DISK_MB << 20;
        }
        if let Some(v) = get("GPUFL_MAX_DISK_MB") {
            match v.trim().parse::<u64>() {
                Ok(mb) => self.max_disk_bytes = mb << 20,
                Err(_) => warnings.push(format!(
                    "GPUFL_MAX_DISK_MB={v:?} is not a number of MiB (0: no bound); ignored"
                )),
            }
        }
        if let Some(v) = get("GPUFL_BACKEND_URL") {
            self.backend_url = v;
        }
        if let Some(v) = get("GPUFL_API_KEY") {
            self.api_key = v;
        }
        warnings
    }

    /// Apply the process environment.
    pub fn apply_env(&mut self) -> Vec<String> {
        self.apply_env_from(|k| std::env::var(k).ok())
    }
}

/// A comma-separated benchmark knob naming what to keep (`A,B`; unset or empty: everything).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keep(Vec<String>);

impl Keep {
    /// The list from a variable's value (unset and empty are the same).
    pub fn parse(value: Option<&str>) -> Keep {
        match value.unwrap_or_default() {
            "" => Keep(Vec::new()),
            list => Keep(list.split(',').map(|x| x.trim().to_string()).collect()),
        }
    }

    /// Whether it keeps `item` (all when the list is empty).
    pub fn keeps(&self, item: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|x| x == item)
    }
}

/// Benchmark knob `GPUFL_DISCARD`: `1` returns CUPTI's buffers untouched; `iterate` walks their
/// records with `cuptiActivityGetNextRecord` only; `decode` also decodes them; none is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discard {
    No,
    Untouched,
    Iterate,
    Decode,
}

/// `GPUFL_TRIGGER_SIGNAL` (always-on): the signal that asks for a full-detail window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriggerSignal {
    /// `0`, empty or `NONE`: no trigger signal.
    Off,
    /// This signal (`SIGUSR2` when unset).
    Signal(i32),
    /// Not a signal: no trigger signal, and this notice.
    Invalid(String),
}

/// Every `GPUFL_*` variable that is not an [`Options`] field, parsed: benchmark knobs and
/// settings of single features. Read once ([`knobs`]); each keeps the name, accepted values and
/// default documented where it is used.
#[derive(Debug, Clone, PartialEq)]
pub struct Knobs {
    // --- the recorder's CUPTI setup (recorder.rs, collection.rs, cupti.rs)
    /// `GPUFL_CUPTI_LIB`: the one CUPTI library to load.
    pub cupti_lib: Option<String>,
    /// How often the writer asks CUPTI for completed buffers (`GPUFL_FLUSH_MS`, 0: never).
    pub cupti_flush_period: Option<Duration>,
    /// `GPUFL_FLUSH_MODE=cupti`: CUPTI's own worker flushes every period.
    pub cupti_flushes_itself: bool,
    /// Call-site stacks of launches, copies and memsets (with stacks), unless `GPUFL_SITE_STACKS=0`.
    pub site_stacks: bool,
    /// `GPUFL_DISCARD`.
    pub discard: Discard,
    /// `GPUFL_API_DISCARD=1`: API records are dropped unwritten.
    pub api_discard: bool,
    /// System thread ids in activity records, unless `GPUFL_THREAD_ID_TYPE=default`.
    pub system_thread_ids: bool,
    /// Per-thread activity buffers, unless `GPUFL_PER_THREAD_BUFFERS=0`.
    pub per_thread_buffers: bool,
    /// `GPUFL_HW_TRACE=1`: hardware-based kernel tracing asked for.
    pub hw_trace: bool,
    /// `GPUFL_ACTIVITY_KINDS=kernels,memcpy,…`: the only activity kinds collected (when set).
    pub activity_kinds: Option<Vec<String>>,
    /// `GPUFL_CALLBACK_DOMAINS=runtime|driver`: the synchronization callbacks' domains.
    pub callback_domains: Keep,
    /// `GPUFL_SITE_DOMAINS=runtime|driver`: the call-site callbacks' domains.
    pub site_domains: Keep,
    /// `GPUFL_SITE_KINDS=launch|graph|copy`: the call-site callbacks' kinds.
    pub site_kinds: Keep,
    /// `GPUFL_API_DOMAINS=runtime|driver`: the domains whose API records are selected.
    pub api_domains: Keep,
    // --- call sites (sites.rs)
    /// The call-site budget's share in ppm (`GPUFL_SITE_BUDGET`, percent).
    pub site_budget_ppm: u64,
    /// `GPUFL_API_FROM=callbacks`: launch `api` records made by the call-site callbacks.
    pub api_from_callbacks: bool,
    /// `GPUFL_DRIVER_SITES=1`: the driver domain's call-site callbacks stay on.
    pub driver_sites: bool,
    // --- stack capture (stack.rs, pyframes/xthread.rs)
    /// Python frames resolved on the writer thread, unless `GPUFL_PY_DEFER=0`.
    pub py_defer: bool,
    /// A synchronization's native frames walked from a copy, unless `GPUFL_SYNC_NATIVE_DEFER=0`.
    pub sync_native_defer: bool,
    /// Bound of the native walk of a synchronization made from Python, ns
    /// (`GPUFL_SYNC_PY_UNWIND_US`).
    pub sync_py_unwind_ns: u64,
    /// Bound of a call site's native walk, ns (`GPUFL_SITE_UNWIND_US`).
    pub site_unwind_ns: u64,
    /// How long another thread's Python frames are reused, ns (`GPUFL_XTHREAD_REUSE_US`).
    pub xthread_reuse_ns: u64,
    /// Cross-thread Python attribution, unless `GPUFL_CROSS_THREAD=0`.
    pub cross_thread: bool,
    /// A Python call site's native frames every this many sightings (`GPUFL_NATIVE_EVERY`).
    pub native_every: u32,
    /// `GPUFL_SITE_NATIVE=1`: call sites made from Python get their native frames too.
    pub site_native: bool,
    /// `GPUFL_DEBUG_COST=1`: the capture cost breakdown.
    pub debug_cost: bool,
    /// The loaded modules' function frames (`function` records), unless `GPUFL_MODULE_FRAMES=0`
    /// (a benchmark knob: no module-loaded callback at all).
    pub module_frames: bool,
    /// Native frames symbolized on the writer thread, unless `GPUFL_SYMBOLIZE=0` (a benchmark
    /// knob: module and offset only).
    pub symbolize: bool,
    /// Always-on defers loading large libraries' symbols past its start, unless
    /// `GPUFL_DEFER_SYMBOLS=0` (a benchmark knob).
    pub defer_symbols: bool,
    /// `GPUFL_XTHREAD_READ=pipe`: fault-tolerant reads through a pipe first.
    pub xthread_read_pipe: bool,
    /// Direct loads of the main thread's stack, unless `GPUFL_XTHREAD_DIRECT=0`.
    pub xthread_direct: bool,
    // --- writer side (srctext.rs, crash.rs, metrics_feed.rs, procinfo.rs)
    /// Source line text, unless `GPUFL_SOURCE_TEXT=0`.
    pub source_text: bool,
    /// Fatal-signal handlers, unless `GPUFL_SIGNALS=0`.
    pub signals: bool,
    /// Always-on: CUPTI detached after each window (crate::detach), unless `GPUFL_DETACH=0`.
    pub detach: bool,
    /// `GPUFL_DETACH_SETTLE_MS`: how long the writer waits after a detach before attaching CUPTI
    /// again (default 1).
    pub detach_settle_ms: u64,
    /// The exporter feed, unless `GPUFL_EXPORTER_FEED=0`.
    pub exporter_feed: bool,
    /// `GPUFL_EXPORTER_SOCKET`: the one socket the feed sends to.
    pub exporter_socket: Option<String>,
    /// A job id: `GPUFL_JOB`, else the batch system's (`SLURM_JOB_ID`, `PBS_JOBID`, `LSB_JOBID`);
    /// empty if none.
    pub job_id: String,
    /// Rank, world size and `GPUFL_RUN_ID` from the launcher's variables.
    pub job: crate::procinfo::Job,
    // --- always-on (always_on.rs)
    /// `GPUFL_ALWAYS_ON_BUDGET`, percent.
    pub always_on_budget_pct: f64,
    /// `GPUFL_WINDOW_MS`.
    pub window: Duration,
    /// `GPUFL_WINDOW_PERIOD_MS`: a fixed period between windows.
    pub window_period: Option<Duration>,
    /// `GPUFL_TRIGGER_SIGNAL`.
    pub trigger_signal: TriggerSignal,
    // --- kernel detail (kernel_detail.rs), as given: combined there with the init option
    /// `GPUFL_KERNEL_DETAIL`, `_SAMPLES`, `_GAP_MS`, `_BUDGET`.
    pub kernel_detail: Option<String>,
    pub kernel_detail_samples: Option<String>,
    pub kernel_detail_gap_ms: Option<String>,
    pub kernel_detail_budget: Option<String>,
    /// Stall reasons, unless `GPUFL_KERNEL_DETAIL_STALLS` is false.
    pub kernel_detail_stalls: bool,
    // --- host time (hostcalls.rs, hostsampler.rs)
    /// `GPUFL_HOSTCALL_US`: a CUDA call of the hostcall list that held its thread at least this
    /// long gets a `hostcall` record, µs (0: no hostcall callbacks).
    pub hostcall_us: u32,
    /// `GPUFL_HOST_SAMPLES`: the host sampler's rate, samples per second per thread (0: off).
    pub host_samples_hz: u32,
    /// `GPUFL_HOST_SAMPLE_BUDGET`: share of one core the host sampler may use, percent.
    pub host_sample_budget_pct: f64,
    // --- memory (memcalls.rs)
    /// `GPUFL_MEM_RECORDS`: `mem` records (CUPTI's memory activity, failed allocations), unless
    /// false.
    pub mem_records: bool,
    /// `GPUFL_MEM_STACK_BYTES`: allocations of at least this many bytes get their call-site
    /// stack (0: every allocation whose size the call gives).
    pub mem_stack_bytes: u64,
    /// One line per variable above set to a value it does not accept ([`knob_warnings`]): the
    /// recorder writes each as a warning notice (and on stderr); the default stands.
    pub warnings: Vec<String>,
}

/// What a knob accepts: a check of its value and the words that say it.
type Accepts = (fn(&str) -> bool, &'static str);

fn one_of(v: &str, values: &[&str]) -> bool {
    values.contains(&v)
}

fn is_01(v: &str) -> bool {
    one_of(v, &["0", "1"])
}

fn is_bool(v: &str) -> bool {
    parse_bool(v).is_some()
}

fn is_uint(v: &str) -> bool {
    v.trim().parse::<u64>().is_ok()
}

fn is_uint_at_least_1(v: &str) -> bool {
    v.trim().parse::<u64>().is_ok_and(|n| n >= 1)
}

fn is_count_or_off(v: &str) -> bool {
    parse_count_or_off(v).is_some()
}

fn is_non_negative_number(v: &str) -> bool {
    v.trim()
        .parse::<f64>()
        .is_ok_and(|x| x.is_finite() && x >= 0.0)
}

fn is_percent(v: &str) -> bool {
    v.trim()
        .parse::<f64>()
        .is_ok_and(|x| x.is_finite() && x > 0.0 && x <= 100.0)
}

/// A comma-separated list whose items are all in `values` (empty items and an empty list too).
fn list_of(v: &str, values: &[&str]) -> bool {
    v.split(',')
        .map(str::trim)
        .all(|x| x.is_empty() || values.contains(&x))
}

/// The [`Knobs`] variables and what each accepts (`GPUFL_TRIGGER_SIGNAL` has its own notice,
/// [`TriggerSignal::Invalid`]; `GPUFL_CUPTI_LIB`, `GPUFL_EXPORTER_SOCKET`, `GPUFL_JOB` and
/// `GPUFL_KERNEL_DETAIL` take any text).
const KNOBS_ACCEPT: &[(&str, Accepts)] = &[
    ("GPUFL_FLUSH_MS", (is_uint, "a number of ms (0: never)")),
    (
        "GPUFL_FLUSH_MODE",
        (|v| one_of(v, &["cupti", "writer"]), "one of cupti|writer"),
    ),
    ("GPUFL_SITE_STACKS", (is_01, "0 or 1")),
    (
        "GPUFL_DISCARD",
        (
            |v| one_of(v, &["0", "1", "iterate", "decode"]),
            "one of 0|1|iterate|decode",
        ),
    ),
    ("GPUFL_API_DISCARD", (is_01, "0 or 1")),
    (
        "GPUFL_THREAD_ID_TYPE",
        (
            |v| one_of(v, &["default", "system"]),
            "one of default|system",
        ),
    ),
    ("GPUFL_PER_THREAD_BUFFERS", (is_01, "0 or 1")),
    ("GPUFL_HW_TRACE", (is_01, "0 or 1")),
    (
        "GPUFL_ACTIVITY_KINDS",
        (
            |v| v == "none" || list_of(v, &["kernels", "memcpy", "memset", "overhead"]),
            "none or a comma-separated list of kernels|memcpy|memset|overhead",
        ),
    ),
    (
        "GPUFL_CALLBACK_DOMAINS",
        (
            |v| list_of(v, &["runtime", "driver"]),
            "a comma-separated list of runtime|driver",
        ),
    ),
    (
        "GPUFL_SITE_DOMAINS",
        (
            |v| list_of(v, &["runtime", "driver"]),
            "a comma-separated list of runtime|driver",
        ),
    ),
    (
        "GPUFL_SITE_KINDS",
        (
            |v| list_of(v, &["launch", "graph", "copy"]),
            "a comma-separated list of launch|graph|copy",
        ),
    ),
    (
        "GPUFL_API_DOMAINS",
        (
            |v| list_of(v, &["runtime", "driver"]),
            "a comma-separated list of runtime|driver",
        ),
    ),
    (
        "GPUFL_SITE_BUDGET",
        (is_percent, "a percentage in (0, 100]"),
    ),
    (
        "GPUFL_API_FROM",
        (
            |v| one_of(v, &["callbacks", "activity"]),
            "one of callbacks|activity",
        ),
    ),
    ("GPUFL_DRIVER_SITES", (is_01, "0 or 1")),
    ("GPUFL_PY_DEFER", (is_01, "0 or 1")),
    (
        "GPUFL_SYNC_NATIVE_DEFER",
        (is_bool, "a boolean (1|true|yes|on, 0|false|no|off)"),
    ),
    (
        "GPUFL_SYNC_PY_UNWIND_US",
        (is_uint_at_least_1, "a number of µs, at least 1"),
    ),
    (
        "GPUFL_SITE_UNWIND_US",
        (is_uint_at_least_1, "a number of µs, at least 1"),
    ),
    ("GPUFL_XTHREAD_REUSE_US", (is_uint, "a number of µs")),
    ("GPUFL_CROSS_THREAD", (is_01, "0 or 1")),
    (
        "GPUFL_NATIVE_EVERY",
        (is_uint_at_least_1, "a whole number, at least 1"),
    ),
    ("GPUFL_SITE_NATIVE", (is_01, "0 or 1")),
    ("GPUFL_DEBUG_COST", (is_01, "0 or 1")),
    ("GPUFL_MODULE_FRAMES", (is_01, "0 or 1")),
    ("GPUFL_SYMBOLIZE", (is_01, "0 or 1")),
    ("GPUFL_DEFER_SYMBOLS", (is_01, "0 or 1")),
    (
        "GPUFL_XTHREAD_READ",
        (|v| one_of(v, &["pipe", "readv"]), "one of pipe|readv"),
    ),
    ("GPUFL_XTHREAD_DIRECT", (is_01, "0 or 1")),
    ("GPUFL_SOURCE_TEXT", (is_01, "0 or 1")),
    ("GPUFL_SIGNALS", (is_01, "0 or 1")),
    ("GPUFL_DETACH", (is_01, "0 or 1")),
    (
        "GPUFL_DETACH_SETTLE_MS",
        (is_uint, "a whole number of milliseconds"),
    ),
    (gpufl_trace::feed::ENV_FEED, (is_01, "0 or 1")),
    (
        "GPUFL_ALWAYS_ON_BUDGET",
        (
            is_non_negative_number,
            "a percentage (0: no sampled windows)",
        ),
    ),
    (
        "GPUFL_WINDOW_MS",
        (is_uint_at_least_1, "a number of ms, at least 1"),
    ),
    (
        "GPUFL_WINDOW_PERIOD_MS",
        (is_uint, "a number of ms (0: none)"),
    ),
    (
        "GPUFL_KERNEL_DETAIL_SAMPLES",
        (is_non_negative_number, "a number of launches"),
    ),
    (
        "GPUFL_KERNEL_DETAIL_GAP_MS",
        (is_non_negative_number, "a number of ms"),
    ),
    (
        "GPUFL_KERNEL_DETAIL_BUDGET",
        (is_non_negative_number, "a share of time (0.05 = 5 %)"),
    ),
    (
        "GPUFL_KERNEL_DETAIL_STALLS",
        (is_bool, "a boolean (1|true|yes|on, 0|false|no|off)"),
    ),
    (
        "GPUFL_HOSTCALL_US",
        (is_count_or_off, "a number of µs (0 or off: none)"),
    ),
    (
        "GPUFL_HOST_SAMPLES",
        (is_count_or_off, "a rate per second (0 or off: none)"),
    ),
    (
        "GPUFL_HOST_SAMPLE_BUDGET",
        (is_percent, "a percentage in (0, 100]"),
    ),
    (
        "GPUFL_MEM_RECORDS",
        (is_bool, "a boolean (1|true|yes|on, 0|false|no|off)"),
    ),
    ("GPUFL_MEM_STACK_BYTES", (is_uint, "a number of bytes")),
];

/// A line for each knob set to a value it does not accept: the variable, the value, what it
/// accepts (the value, or a list's unknown items, are ignored).
pub fn knob_warnings(get: impl Fn(&str) -> Option<String>) -> Vec<String> {
    KNOBS_ACCEPT
        .iter()
        .filter_map(|&(name, (ok, accepted))| {
            let v = get(name)?;
            (!ok(&v)).then(|| format!("{name}={v:?} is not {accepted}; ignored"))
        })
        .collect()
}

/// Default threshold of `hostcall` records, µs (`GPUFL_HOSTCALL_US`).
pub const DEFAULT_HOSTCALL_US: u32 = 20;
/// Default size from which an allocation gets its call-site stack, bytes
/// (`GPUFL_MEM_STACK_BYTES`): 1 MiB.
pub const DEFAULT_MEM_STACK_BYTES: u64 = 1 << 20;
/// Default rate of the host sampler, per second per thread (`GPUFL_HOST_SAMPLES`).
pub const DEFAULT_HOST_SAMPLES_HZ: u32 = 100;
/// Highest rate of the host sampler, per second per thread.
pub const MAX_HOST_SAMPLES_HZ: u32 = 1000;
/// Default share of one core the host sampler may use, percent (`GPUFL_HOST_SAMPLE_BUDGET`).
pub const DEFAULT_HOST_SAMPLE_BUDGET_PCT: f64 = 1.0;

/// A rate or threshold knob: a non-negative integer, `off`/`false`/`no` for 0; None when the value
/// is neither (the default then stands).
pub fn parse_count_or_off(v: &str) -> Option<u32> {
    let t = v.trim().to_ascii_lowercase();
    if matches!(t.as_str(), "off" | "false" | "no") {
        return Some(0);
    }
    t.parse::<u32>().ok()
}

/// A duration in ms from a variable's value (a positive integer), else None.
fn positive_ms(v: Option<&str>) -> Option<Duration> {
    v?.trim()
        .parse::<u64>()
        .ok()
        .filter(|&v| v > 0)
        .map(Duration::from_millis)
}

/// `GPUFL_TRIGGER_SIGNAL`'s value (None: unset).
fn trigger_signal(v: Option<String>) -> TriggerSignal {
    let Some(v) = v else {
        return TriggerSignal::Signal(libc::SIGUSR2);
    };
    match v
        .trim()
        .trim_start_matches("SIG")
        .to_ascii_uppercase()
        .as_str()
    {
        "0" | "" | "NONE" => TriggerSignal::Off,
        "USR1" => TriggerSignal::Signal(libc::SIGUSR1),
        "USR2" => TriggerSignal::Signal(libc::SIGUSR2),
        n => match n.parse::<i32>() {
            Ok(k) if k > 0 && k < 65 => TriggerSignal::Signal(k),
            _ => TriggerSignal::Invalid(format!(
                "GPUFL_TRIGGER_SIGNAL={v:?} is not a signal; no trigger signal"
            )),
        },
    }
}

impl Knobs {
    /// The knobs from an environment lookup.
    pub fn from_env_with(get: impl Fn(&str) -> Option<String>) -> Knobs {
        let is = |k: &str, want: &str| get(k).is_some_and(|v| v == want);
        let not = |k: &str, off: &str| get(k).is_none_or(|v| v != off);
        let us_at_least_1 = |k: &str, default_ns: u64| {
            get(k)
                .and_then(|v| v.parse::<u64>().ok())
                .filter(|&n| n >= 1)
                .map_or(default_ns, |us| us * 1000)
        };
        let not_false = |k: &str| get(k).and_then(|v| parse_bool(&v)) != Some(false);
        Knobs {
            cupti_lib: get("GPUFL_CUPTI_LIB"),
            cupti_flush_period: match get("GPUFL_FLUSH_MS").and_then(|v| v.parse::<u64>().ok()) {
                Some(0) => None,
                Some(ms) => Some(Duration::from_millis(ms)),
                None => Some(crate::recorder::CUPTI_FLUSH_PERIOD),
            },
            cupti_flushes_itself: is("GPUFL_FLUSH_MODE", "cupti"),
            site_stacks: not("GPUFL_SITE_STACKS", "0"),
            discard: match get("GPUFL_DISCARD").as_deref() {
                Some("1") => Discard::Untouched,
                Some("iterate") => Discard::Iterate,
                Some("decode") => Discard::Decode,
                _ => Discard::No,
            },
            api_discard: is("GPUFL_API_DISCARD", "1"),
            system_thread_ids: not("GPUFL_THREAD_ID_TYPE", "default"),
            per_thread_buffers: not("GPUFL_PER_THREAD_BUFFERS", "0"),
            hw_trace: is("GPUFL_HW_TRACE", "1"),
            activity_kinds: get("GPUFL_ACTIVITY_KINDS")
                .map(|only| only.split(',').map(|k| k.trim().to_string()).collect()),
            callback_domains: Keep::parse(get("GPUFL_CALLBACK_DOMAINS").as_deref()),
            site_domains: Keep::parse(get("GPUFL_SITE_DOMAINS").as_deref()),
            site_kinds: Keep::parse(get("GPUFL_SITE_KINDS").as_deref()),
            api_domains: Keep::parse(get("GPUFL_API_DOMAINS").as_deref()),
            site_budget_ppm: get("GPUFL_SITE_BUDGET")
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|p| *p > 0.0 && *p <= 100.0)
                .map_or(crate::sites::BUDGET_PPM, |p| (p * 10_000.0) as u64),
            api_from_callbacks: is("GPUFL_API_FROM", "callbacks"),
            driver_sites: is("GPUFL_DRIVER_SITES", "1"),
            py_defer: not("GPUFL_PY_DEFER", "0"),
            sync_native_defer: not_false("GPUFL_SYNC_NATIVE_DEFER"),
            sync_py_unwind_ns: us_at_least_1(
                "GPUFL_SYNC_PY_UNWIND_US",
                crate::stack::SYNC_PY_UNWIND_NS,
            ),
            site_unwind_ns: us_at_least_1("GPUFL_SITE_UNWIND_US", crate::stack::SITE_UNWIND_NS),
            xthread_reuse_ns: get("GPUFL_XTHREAD_REUSE_US")
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(crate::stack::OTHER_REUSE_NS, |us| us.saturating_mul(1000)),
            cross_thread: not("GPUFL_CROSS_THREAD", "0"),
            native_every: get("GPUFL_NATIVE_EVERY")
                .and_then(|v| v.parse().ok())
                .filter(|&n: &u32| n >= 1)
                .unwrap_or(crate::stack::NATIVE_EVERY),
            site_native: is("GPUFL_SITE_NATIVE", "1"),
            debug_cost: is("GPUFL_DEBUG_COST", "1"),
            module_frames: not("GPUFL_MODULE_FRAMES", "0"),
            symbolize: not("GPUFL_SYMBOLIZE", "0"),
            defer_symbols: not("GPUFL_DEFER_SYMBOLS", "0"),
            xthread_read_pipe: is("GPUFL_XTHREAD_READ", "pipe"),
            xthread_direct: not("GPUFL_XTHREAD_DIRECT", "0"),
            source_text: not("GPUFL_SOURCE_TEXT", "0"),
            signals: not("GPUFL_SIGNALS", "0"),
            detach: not_false("GPUFL_DETACH"),
            detach_settle_ms: get("GPUFL_DETACH_SETTLE_MS")
                .and_then(|v| v.parse().ok())
                .unwrap_or(1),
            exporter_feed: not(gpufl_trace::feed::ENV_FEED, "0"),
            exporter_socket: get(gpufl_trace::feed::ENV_SOCKET),
            job_id: ["GPUFL_JOB", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID"]
                .iter()
                .find_map(|k| get(k).filter(|v| !v.is_empty()))
                .unwrap_or_default(),
            job: crate::procinfo::Job::from_env_with(&get),
            always_on_budget_pct: get("GPUFL_ALWAYS_ON_BUDGET")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v >= 0.0)
                .unwrap_or(crate::always_on::DEFAULT_BUDGET_PCT),
            window: positive_ms(get("GPUFL_WINDOW_MS").as_deref())
                .unwrap_or(Duration::from_millis(crate::always_on::WINDOW_MS)),
            window_period: positive_ms(get("GPUFL_WINDOW_PERIOD_MS").as_deref()),
            trigger_signal: trigger_signal(get("GPUFL_TRIGGER_SIGNAL")),
            kernel_detail: get("GPUFL_KERNEL_DETAIL"),
            kernel_detail_samples: get("GPUFL_KERNEL_DETAIL_SAMPLES"),
            kernel_detail_gap_ms: get("GPUFL_KERNEL_DETAIL_GAP_MS"),
            kernel_detail_budget: get("GPUFL_KERNEL_DETAIL_BUDGET"),
            kernel_detail_stalls: not_false("GPUFL_KERNEL_DETAIL_STALLS"),
            hostcall_us: get("GPUFL_HOSTCALL_US")
                .and_then(|v| parse_count_or_off(&v))
                .unwrap_or(DEFAULT_HOSTCALL_US),
            host_samples_hz: get("GPUFL_HOST_SAMPLES")
                .and_then(|v| parse_count_or_off(&v))
                .map_or(DEFAULT_HOST_SAMPLES_HZ, |hz| hz.min(MAX_HOST_SAMPLES_HZ)),
            host_sample_budget_pct: get("GPUFL_HOST_SAMPLE_BUDGET")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && *v > 0.0 && *v <= 100.0)
                .unwrap_or(DEFAULT_HOST_SAMPLE_BUDGET_PCT),
            mem_records: not_false("GPUFL_MEM_RECORDS"),
            mem_stack_bytes: get("GPUFL_MEM_STACK_BYTES")
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(DEFAULT_MEM_STACK_BYTES),
            warnings: knob_warnings(&get),
        }
    }
}

/// The knobs, read from the process environment at the first call (the recorder's start makes
/// it, before any hot path; code that runs before a recorder, such as NVTX's injection entry
/// point or the test entry points, reads them at its first use).
#[inline]
pub fn knobs() -> &'static Knobs {
    static KNOBS: OnceLock<Knobs> = OnceLock::new();
    KNOBS.get_or_init(|| Knobs::from_env_with(|k| std::env::var(k).ok()))
}

/// `GPUFL_SERVER`, read when an upload runs (as [`Options::apply_env`] is for its fallback
/// options): a program may set it after the recorder started.
pub fn server_from_env() -> Option<String> {
    std::env::var("GPUFL_SERVER").ok()
}

/// The program's name; for an interpreter (`python3 train.py`), the script's name.
pub fn default_app_name() -> String {
    let args = crate::procinfo::command_line();
    app_name_from_args(&args)
}

/// See [`default_app_name`].
pub fn app_name_from_args(args: &[String]) -> String {
    let base = |s: &str| s.rsplit('/').next().unwrap_or(s).to_string();
    let Some(exe) = args.first() else {
        return "app".into();
    };
    let exe_name = base(exe);
    if exe_name.starts_with("python") {
        let mut it = args.iter().skip(1);
        while let Some(a) = it.next() {
            if a == "-m" || a == "-c" {
                return it.next().map(|m| base(m)).unwrap_or(exe_name);
            }
            if !a.starts_with('-') {
                let b = base(a);
                return b.strip_suffix(".py").map(str::to_string).unwrap_or(b);
            }
        }
    }
    exe_name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_bad_values_warn() {
        let env = |k: &str| match k {
            "GPUFL_APP_NAME" => Some("trainer".to_string()),
            "GPUFL_ENABLE_STACK_TRACE" => Some("yes".to_string()),
            "GPUFL_ENABLE_SYNCHRONIZATION" => Some("maybe".to_string()),
            "GPUFL_API_RECORDS" => Some("sync".to_string()),
            "GPUFL_TELEMETRY_MS" => Some("250".to_string()),
            _ => None,
        };
        let mut o = Options::default();
        let w = o.apply_env_from(env);
        assert_eq!(o.app_name, "trainer");
        assert!(o.enable_stack_trace);
        assert!(
            o.enable_synchronization,
            "unparsable value keeps the default"
        );
        assert_eq!(o.api_records, ApiRecords::Sync);
        assert_eq!(o.telemetry_ms, 250);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("GPUFL_ENABLE_SYNCHRONIZATION"));
    }

    #[test]
    fn mode_and_disk_bound() {
        let mut o = Options::default();
        assert!(o.apply_env_from(|_| None).is_empty());
        assert_eq!((o.mode, o.max_disk_bytes), (Mode::Default, 0));
        let mut o = Options::default();
        o.apply_env_from(|k| (k == "GPUFL_MODE").then(|| "always-on".to_string()));
        assert_eq!(o.mode, Mode::AlwaysOn);
        assert_eq!(o.max_disk_bytes, DEFAULT_ALWAYS_ON_DISK_MB << 20);
        let mut o = Options::default();
        let w = o.apply_env_from(|k| match k {
            "GPUFL_MODE" => Some("ALWAYS-ON".into()),
            "GPUFL_MAX_DISK_MB" => Some("32".into()),
            _ => None,
        });
        assert!(w.is_empty());
        assert_eq!(o.max_disk_bytes, 32 << 20);
        let mut o = Options::default();
        let w = o.apply_env_from(|k| match k {
            "GPUFL_MODE" => Some("sometimes".into()),
            "GPUFL_MAX_DISK_MB" => Some("lots".into()),
            _ => None,
        });
        assert_eq!(w.len(), 2, "{w:?}");
        assert_eq!((o.mode, o.max_disk_bytes), (Mode::Default, 0));
    }

    #[test]
    fn telemetry_period_default_off_floor_and_bad_values() {
        assert_eq!(Options::default().telemetry_ms, DEFAULT_TELEMETRY_MS);
        assert_eq!(parse_telemetry_ms("0"), Some(0));
        assert_eq!(parse_telemetry_ms(" OFF "), Some(0));
        assert_eq!(parse_telemetry_ms("1000"), Some(1000));
        assert_eq!(parse_telemetry_ms("1"), Some(MIN_TELEMETRY_MS));
        assert_eq!(parse_telemetry_ms("-5"), None);
        assert_eq!(parse_telemetry_ms("0.5"), None);
        let mut o = Options::default();
        let w = o.apply_env_from(|k| (k == "GPUFL_TELEMETRY_MS").then(|| "fast".to_string()));
        assert_eq!(
            o.telemetry_ms, DEFAULT_TELEMETRY_MS,
            "a bad value keeps the default"
        );
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("GPUFL_TELEMETRY_MS"));
    }

    #[test]
    fn knobs_defaults() {
        let k = Knobs::from_env_with(|_| None);
        assert_eq!(k.cupti_lib, None);
        assert_eq!(
            k.cupti_flush_period,
            Some(crate::recorder::CUPTI_FLUSH_PERIOD)
        );
        assert!(!k.cupti_flushes_itself && k.site_stacks && k.discard == Discard::No);
        assert!(!k.api_discard && k.system_thread_ids && k.per_thread_buffers && !k.hw_trace);
        assert_eq!(k.activity_kinds, None);
        for keep in [
            &k.callback_domains,
            &k.site_domains,
            &k.site_kinds,
            &k.api_domains,
        ] {
            assert!(keep.keeps("runtime") && keep.keeps("graph"));
        }
        assert_eq!(k.site_budget_ppm, crate::sites::BUDGET_PPM);
        assert!(!k.api_from_callbacks && !k.driver_sites);
        assert!(k.py_defer && k.sync_native_defer && k.cross_thread && k.xthread_direct);
        assert_eq!(k.sync_py_unwind_ns, crate::stack::SYNC_PY_UNWIND_NS);
        assert_eq!(k.site_unwind_ns, crate::stack::SITE_UNWIND_NS);
        assert_eq!(k.xthread_reuse_ns, crate::stack::OTHER_REUSE_NS);
        assert_eq!(k.native_every, crate::stack::NATIVE_EVERY);
        assert!(!k.site_native && !k.debug_cost && !k.xthread_read_pipe);
        assert!(
            k.source_text
                && k.signals
                && k.exporter_feed
                && k.detach
                && k.module_frames
                && k.symbolize
        );
        assert!(k.defer_symbols);
        assert_eq!(k.detach_settle_ms, 1);
        let k = Knobs::from_env_with(|v| (v == "GPUFL_DETACH_SETTLE_MS").then(|| "200".into()));
        assert_eq!(k.detach_settle_ms, 200);
        assert_eq!(
            (k.exporter_socket.as_deref(), k.job_id.as_str()),
            (None, "")
        );
        assert_eq!(k.job, crate::procinfo::Job::default());
        assert_eq!(k.always_on_budget_pct, crate::always_on::DEFAULT_BUDGET_PCT);
        assert_eq!(k.window, Duration::from_millis(crate::always_on::WINDOW_MS));
        assert_eq!(k.window_period, None);
        assert_eq!(k.trigger_signal, TriggerSignal::Signal(libc::SIGUSR2));
        assert_eq!(k.kernel_detail, None);
        assert!(k.kernel_detail_stalls);
        assert_eq!(
            (k.hostcall_us, k.host_samples_hz, k.host_sample_budget_pct),
            (20, 100, 1.0)
        );
    }

    #[test]
    fn host_time_knobs() {
        let one = |name: &'static str, v: &'static str| {
            Knobs::from_env_with(move |k| (k == name).then(|| v.to_string()))
        };
        assert_eq!(one("GPUFL_HOSTCALL_US", "0").hostcall_us, 0);
        assert_eq!(one("GPUFL_HOSTCALL_US", " 50 ").hostcall_us, 50);
        assert_eq!(one("GPUFL_HOSTCALL_US", "soon").hostcall_us, 20);
        assert!(one("GPUFL_HOSTCALL_US", "soon").mem_records);
        assert!(!one("GPUFL_MEM_RECORDS", "0").mem_records);
        assert_eq!(one("GPUFL_MEM_STACK_BYTES", "0").mem_stack_bytes, 0);
        assert_eq!(one("GPUFL_MEM_STACK_BYTES", "x").mem_stack_bytes, 1 << 20);
        assert_eq!(one("GPUFL_HOST_SAMPLES", "off").host_samples_hz, 0);
        assert_eq!(one("GPUFL_HOST_SAMPLES", "250").host_samples_hz, 250);
        assert_eq!(one("GPUFL_HOST_SAMPLES", "99999").host_samples_hz, 1000);
        assert_eq!(one("GPUFL_HOST_SAMPLES", "-3").host_samples_hz, 100);
        let b = |v: &'static str| one("GPUFL_HOST_SAMPLE_BUDGET", v).host_sample_budget_pct;
        assert_eq!((b("2.5"), b("0"), b("nan"), b("500")), (2.5, 1.0, 1.0, 1.0));
    }

    #[test]
    fn an_always_on_budget_of_zero_means_no_sampled_windows() {
        let b = |v: &'static str| {
            Knobs::from_env_with(move |k| (k == "GPUFL_ALWAYS_ON_BUDGET").then(|| v.to_string()))
        };
        assert_eq!(b("0").always_on_budget_pct, 0.0);
        assert!(b("0").warnings.is_empty());
        assert_eq!(b("2").always_on_budget_pct, 2.0);
        let bad = b("-1");
        assert_eq!(
            bad.always_on_budget_pct,
            crate::always_on::DEFAULT_BUDGET_PCT
        );
        assert_eq!(bad.warnings.len(), 1, "{:?}", bad.warnings);
    }

    #[test]
    fn knobs_parse_as_their_modules_did() {
        let with = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Knobs::from_env_with(move |k| {
                pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
            })
        };
        let k = with(&[
            ("GPUFL_FLUSH_MS", "0"),
            ("GPUFL_SITE_STACKS", "0"),
            ("GPUFL_DISCARD", "iterate"),
            ("GPUFL_THREAD_ID_TYPE", "default"),
            ("GPUFL_ACTIVITY_KINDS", "kernels, memcpy"),
            ("GPUFL_SITE_KINDS", "launch, copy"),
            ("GPUFL_API_DOMAINS", ""),
            ("GPUFL_SITE_BUDGET", "2"),
            ("GPUFL_SYNC_NATIVE_DEFER", "off"),
            ("GPUFL_SYNC_PY_UNWIND_US", "0"),
            ("GPUFL_SITE_UNWIND_US", "7"),
            ("GPUFL_XTHREAD_REUSE_US", "0"),
            ("GPUFL_NATIVE_EVERY", "0"),
            ("GPUFL_SOURCE_TEXT", "0"),
            ("GPUFL_EXPORTER_FEED", "0"),
            ("SLURM_JOB_ID", "77"),
            ("GPUFL_RUN_ID", "run-7"),
            ("GPUFL_WINDOW_MS", " 50 "),
            ("GPUFL_WINDOW_PERIOD_MS", "0"),
            ("GPUFL_TRIGGER_SIGNAL", "SIGUSR1"),
            ("GPUFL_KERNEL_DETAIL_STALLS", "no"),
        ]);
        assert_eq!(k.cupti_flush_period, None);
        assert!(!k.site_stacks && !k.system_thread_ids);
        assert_eq!(k.discard, Discard::Iterate);
        assert_eq!(
            k.activity_kinds,
            Some(vec!["kernels".to_string(), "memcpy".to_string()])
        );
        assert!(k.site_kinds.keeps("copy") && !k.site_kinds.keeps("graph"));
        assert!(k.api_domains.keeps("driver"), "empty keeps everything");
        assert_eq!(k.site_budget_ppm, 20_000);
        assert!(!k.sync_native_defer);
        assert_eq!(k.sync_py_unwind_ns, crate::stack::SYNC_PY_UNWIND_NS);
        assert_eq!(k.site_unwind_ns, 7_000);
        assert_eq!(k.xthread_reuse_ns, 0);
        assert_eq!(k.native_every, crate::stack::NATIVE_EVERY);
        assert!(!k.source_text && !k.exporter_feed);
        assert_eq!(k.job_id, "77");
        assert_eq!(k.job.run_id.as_deref(), Some("run-7"));
        assert_eq!(k.window, Duration::from_millis(50));
        assert_eq!(k.window_period, None);
        assert_eq!(k.trigger_signal, TriggerSignal::Signal(libc::SIGUSR1));
        assert!(!k.kernel_detail_stalls);
        // A set but empty activity list keeps no kind.
        assert_eq!(
            with(&[("GPUFL_ACTIVITY_KINDS", "")]).activity_kinds,
            Some(vec![String::new()])
        );
        assert_eq!(
            with(&[("GPUFL_TRIGGER_SIGNAL", "none")]).trigger_signal,
            TriggerSignal::Off
        );
        assert!(matches!(
            with(&[("GPUFL_TRIGGER_SIGNAL", "99")]).trigger_signal,
            TriggerSignal::Invalid(n) if n.contains("GPUFL_TRIGGER_SIGNAL=\"99\"")
        ));
    }

    #[test]
    fn knobs_with_values_they_do_not_accept_warn() {
        let env = |k: &str| {
            match k {
                "GPUFL_DISCARD" => Some("everything"),
                "GPUFL_SITE_KINDS" => Some("launch,kernel"),
                "GPUFL_HOST_SAMPLES" => Some("-3"),
                "GPUFL_SITE_STACKS" => Some("off"),
                "GPUFL_SITE_DOMAINS" => Some("runtime, driver"),
                "GPUFL_HOSTCALL_US" => Some("off"),
                "GPUFL_SYNC_NATIVE_DEFER" => Some("no"),
                "GPUFL_ACTIVITY_KINDS" => Some("none"),
                _ => None,
            }
            .map(str::to_string)
        };
        let k = Knobs::from_env_with(env);
        assert_eq!(
            k.warnings,
            [
                "GPUFL_SITE_STACKS=\"off\" is not 0 or 1; ignored",
                "GPUFL_DISCARD=\"everything\" is not one of 0|1|iterate|decode; ignored",
                "GPUFL_SITE_KINDS=\"launch,kernel\" is not a comma-separated list of \
                 launch|graph|copy; ignored",
                "GPUFL_HOST_SAMPLES=\"-3\" is not a rate per second (0 or off: none); ignored",
            ]
        );
        assert!(Knobs::from_env_with(|_| None).warnings.is_empty());
        // Every knob of the table is one the knobs read.
        for (name, _) in KNOBS_ACCEPT {
            let seen = std::cell::Cell::new(false);
            let _ = Knobs::from_env_with(|k| {
                if k == *name {
                    seen.set(true);
                }
                None
            });
            assert!(seen.get(), "{name}");
        }
    }

    #[test]
    fn app_name_of_python_script_and_module() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            app_name_from_args(&s(&["/usr/bin/python3", "-u", "examples/train.py"])),
            "train"
        );
        assert_eq!(
            app_name_from_args(&s(&["python3.12", "-m", "torch.distributed.run"])),
            "torch.distributed.run"
        );
        assert_eq!(
            app_name_from_args(&s(&["./build/stream_sync_loop", "200"])),
            "stream_sync_loop"
        );
        assert_eq!(app_name_from_args(&[]), "app");
    }
}
