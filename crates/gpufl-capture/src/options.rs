//! Recorder options: the seed's `InitOptions`, each also settable by an environment variable
//! (the variable wins, so a build need not change to flip an option).

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
