//! `gpufl record -- CMD ARGS…`: run CMD with the capture library injected through
//! `CUDA_INJECTION64_PATH`; CMD's output and exit code pass through unchanged.

use crate::{summary, term};
use anyhow::{bail, Context, Result};
use clap::Args;
use gpufl_trace::run::RunRecord;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

#[derive(Args)]
pub struct RecordArgs {
    /// Directory for the run directories: each `gpufl record` makes one,
    /// `run-<app>-<pid>-<UTC start>`, with its run record (run.json) and one session directory
    /// per recorded process (the command and its children).
    #[arg(short = 'o', long = "output", default_value = "gpufl-sessions")]
    output: PathBuf,
    /// Do not capture CPU stacks at synchronizations (totals only, lowest overhead).
    #[arg(long)]
    no_stacks: bool,
    /// Which API calls get records: none, sync, default, all.
    #[arg(long, default_value = "default", value_parser = ["none", "sync", "default", "all"])]
    api_records: String,
    /// GPU telemetry (NVML) every MS milliseconds; 0 turns it off (default 100).
    #[arg(long, value_name = "MS")]
    telemetry_ms: Option<u32>,
    /// Path of libgpufl_capture.so (default: $GPUFL_CAPTURE_LIB, else next to the gpufl binary,
    /// else the one the gpufl wheel installed with it).
    #[arg(long)]
    lib: Option<PathBuf>,
    /// Always-on mode, for production: every sync with its stack, sampled call sites, telemetry;
    /// GPU activity in windows set by a cost budget; disk bounded (GPUFL_MAX_DISK_MB, default
    /// 256); full detail on demand with `gpufl trigger PID`.
    #[arg(long)]
    always_on: bool,
    /// Look inside kernels (opt-in; docs/kernel-detail.md): stall reasons (PC sampling) and
    /// instruction-level counters (divergence, global sectors per request, shared-memory bank
    /// conflicts; CUPTI's SASS metrics) per source line, on a few launches of the TOP_N kernels
    /// by GPU time (default 5) or of the kernels whose names contain one of NAMES
    /// (comma-separated). Build kernels with `-lineinfo` for source lines. Tuning:
    /// GPUFL_KERNEL_DETAIL_SAMPLES (launches per kernel, 3), GPUFL_KERNEL_DETAIL_GAP_MS (1000),
    /// GPUFL_KERNEL_DETAIL_BUDGET (share of time, 0.05), GPUFL_KERNEL_DETAIL_STALLS=0.
    #[arg(long, value_name = "TOP_N|NAMES", num_args = 0..=1, default_missing_value = "5")]
    kernel_detail: Option<String>,
    /// Host samples per second per thread (default 100): what each thread that issues CUDA work,
    /// and each Python thread, is doing (on a CPU, waiting on a lock or the GIL, in a CUDA call,
    /// sleeping) and where, within 1 % of one core (GPUFL_HOST_SAMPLE_BUDGET, percent).
    #[arg(long, value_name = "HZ", conflicts_with = "no_host_samples")]
    host_samples: Option<u32>,
    /// No host samples.
    #[arg(long)]
    no_host_samples: bool,
    /// Record the other CUDA calls (allocations and frees, pinned memory, module loads, stream,
    /// event and graph creation, limits…) that held their thread at least US microseconds, with
    /// their stack (default 20; 0 turns them off).
    #[arg(long, value_name = "US")]
    hostcall_us: Option<u32>,
    /// Give allocations of at least N bytes their call-site stack in `mem` records (default
    /// 1048576; failed allocations always get theirs).
    #[arg(long, value_name = "N", conflicts_with = "no_mem_records")]
    mem_stack_bytes: Option<u64>,
    /// No `mem` records (allocations, frees, failed allocations).
    #[arg(long)]
    no_mem_records: bool,
    /// Print nothing of gpufl's own (the summary included).
    #[arg(short, long)]
    quiet: bool,
    /// The command to record.
    #[arg(last = true, required = true)]
    command: Vec<OsString>,
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Find the capture library.
fn find_lib(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = crate::options::capture_lib() {
        return Ok(p);
    }
    let exe = std::env::current_exe().context("cannot locate the gpufl binary")?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let near = [
        dir.join("libgpufl_capture.so"),
        dir.join("../lib/libgpufl_capture.so"),
    ];
    if let Some(p) = near.into_iter().chain(wheel_libs(dir)).find(|p| p.exists()) {
        return Ok(p);
    }
    bail!(
        "libgpufl_capture.so not found next to {} (build it with `cargo build --release`, or pass --lib)",
        exe.display()
    )
}

/// Where the gpufl wheel puts the capture library when it puts the command in `bin`:
/// `bin/../lib{,64}/python3.*/{site,dist}-packages/gpufl/`, newest Python first (a venv, a
/// `pip install --user` under ~/.local, a system prefix).
fn wheel_libs(bin: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(rd) = std::fs::read_dir(bin.join("..").join(lib)) else {
            continue;
        };
        let mut pys: Vec<(Vec<u32>, PathBuf)> = rd
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let ver = name.strip_prefix("python")?;
                let key = ver
                    .split('.')
                    .map(|n| n.parse().ok())
                    .collect::<Option<_>>()?;
                Some((key, e.path()))
            })
            .collect();
        pys.sort_by(|a, b| b.0.cmp(&a.0));
        for (_, py) in pys {
            for site in ["site-packages", "dist-packages"] {
                out.push(py.join(site).join("gpufl/libgpufl_capture.so"));
            }
        }
    }
    out
}

pub fn run(args: RecordArgs) -> Result<i32> {
    let lib = find_lib(args.lib.as_deref())?;
    let lib = lib
        .canonicalize()
        .with_context(|| format!("{} does not exist", lib.display()))?;
    // Without a loadable driver CUDA is never initialized: nothing can be recorded but the scopes
    // of a program that starts the recorder itself (gpufl_init). The command runs all the same.
    let no_driver = cuda_driver_error();
    let output_was_there = args.output.exists();
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    let (out_dir, mut run) = make_run_dir(&args.output.canonicalize()?, &args.command)?;
    let before: std::collections::HashSet<PathBuf> = gpufl_trace::session::find_sessions(&out_dir)
        .into_iter()
        .collect();

    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("CUDA_INJECTION64_PATH", &lib)
        .env("GPUFL_LOG_PATH", &out_dir)
        .env("GPUFL_RUN_ID", &run.run_id)
        .env(
            "GPUFL_ENABLE_STACK_TRACE",
            if args.no_stacks { "0" } else { "1" },
        )
        .env("GPUFL_API_RECORDS", &args.api_records)
        .env("GPUFL_QUIET", "1");
    if args.always_on {
        cmd.env("GPUFL_MODE", "always-on");
    }
    if let Some(kd) = &args.kernel_detail {
        cmd.env("GPUFL_KERNEL_DETAIL", kd);
    }
    if let Some(ms) = args.telemetry_ms {
        cmd.env("GPUFL_TELEMETRY_MS", ms.to_string());
    }
    if args.no_host_samples {
        cmd.env("GPUFL_HOST_SAMPLES", "0");
    } else if let Some(hz) = args.host_samples {
        cmd.env("GPUFL_HOST_SAMPLES", hz.to_string());
    }
    if let Some(us) = args.hostcall_us {
        cmd.env("GPUFL_HOSTCALL_US", us.to_string());
    }
    if args.no_mem_records {
        cmd.env("GPUFL_MEM_RECORDS", "0");
    } else if let Some(n) = args.mem_stack_bytes {
        cmd.env("GPUFL_MEM_STACK_BYTES", n.to_string());
    }
    if !crate::options::nvtx_injection_set() {
        // NVTX ranges become scopes: NVTX loads this library, which hands over to CUPTI (nvtx.rs).
        cmd.env("NVTX_INJECTION64_PATH", &lib);
    }
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot run {:?}", args.command[0]))?;
    CHILD.store(child.id() as i32, Ordering::SeqCst);
    // SAFETY: installing handlers: Ctrl-C reaches the child through the terminal's process group,
    // so the parent ignores it and waits; TERM/HUP sent to gpufl alone are forwarded.
    let old: Vec<(libc::c_int, libc::sighandler_t)> = unsafe {
        vec![
            (libc::SIGINT, libc::signal(libc::SIGINT, libc::SIG_IGN)),
            (libc::SIGQUIT, libc::signal(libc::SIGQUIT, libc::SIG_IGN)),
            (
                libc::SIGTERM,
                libc::signal(
                    libc::SIGTERM,
                    forward_signal as *const () as libc::sighandler_t,
                ),
            ),
            (
                libc::SIGHUP,
                libc::signal(
                    libc::SIGHUP,
                    forward_signal as *const () as libc::sighandler_t,
                ),
            ),
        ]
    };
    let status = child.wait().context("waiting for the recorded command")?;
    for (sig, h) in old {
        // SAFETY: restoring the previous handlers.
        unsafe { libc::signal(sig, h) };
    }
    use std::os::unix::process::ExitStatusExt;
    let killed_by = status.signal();
    let code = match status.code() {
        Some(c) => c,
        None => 128 + killed_by.unwrap_or(0),
    };
    run.end_unix_ns = Some(unix_ns());
    run.exit_code = status.code();
    run.signal = killed_by.map(|s| gpufl_trace::signals::signal_name(s).to_string());
    if let Err(e) = gpufl_trace::run::write_run(&out_dir, &run) {
        if !args.quiet {
            term::eprint_line(&format!(
                "gpufl: cannot update the run record: {}",
                term::esc(&e.to_string())
            ));
        }
    }
    if let (Some(sig), false) = (killed_by, args.quiet) {
        term::eprint_line(&format!(
            "gpufl: {} killed by {}{}",
            term::esc(
                &args
                    .command
                    .first()
                    .map(|c| c.to_string_lossy())
                    .unwrap_or_default()
            ),
            gpufl_trace::signals::signal_name(sig),
            if status.core_dumped() {
                " (core dumped)"
            } else {
                ""
            }
        ));
    }

    if !args.quiet {
        let new: Vec<PathBuf> = gpufl_trace::session::find_sessions(&out_dir)
            .into_iter()
            .filter(|p| !before.contains(p))
            .collect();
        if let (true, Some(why)) = (new.is_empty(), &no_driver) {
            term::eprint_line(&format!(
                "gpufl: no session recorded: {} could not be loaded ({}): the command ran without recording",
                CUDA_DRIVER,
                term::esc(why)
            ));
        } else if new.is_empty() {
            term::eprint_line(
                "gpufl: no session recorded (the command made no CUDA call, or CUDA ignored CUDA_INJECTION64_PATH)",
            );
        } else {
            term::eprint_line(&format!(
                "gpufl: {} session(s) in {}",
                new.len(),
                term::esc_path(&out_dir)
            ));
            for dir in new {
                match summary::summarize(&dir) {
                    Ok(s) => term::eprint_line(&summary::record_line(
                        &dir.file_name()
                            .map(|n| n.to_string_lossy())
                            .unwrap_or_default(),
                        &s,
                    )),
                    Err(e) => term::eprint_line(&format!(
                        "gpufl:   {}: unreadable: {}",
                        term::esc_path(&dir),
                        term::esc(&e.to_string())
                    )),
                }
            }
        }
    }
    if no_driver.is_some() {
        remove_if_empty(&out_dir, &args.output, output_was_there);
    }
    if let Some(sig) = killed_by {
        die_like(sig);
    }
    Ok(code)
}

/// The CUDA driver library, as CUDA's runtime loads it.
const CUDA_DRIVER: &str = "libcuda.so.1";

/// Why the CUDA driver library cannot be loaded here, or None when it can (loaded and unloaded
/// again: the recorded program loads its own).
fn cuda_driver_error() -> Option<String> {
    let name = std::ffi::CString::new(CUDA_DRIVER).ok()?;
    // SAFETY: dlopen/dlclose/dlerror with a valid C string; the handle is closed at once.
    unsafe {
        let h = libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if !h.is_null() {
            libc::dlclose(h);
            return None;
        }
        let e = libc::dlerror();
        let msg = if e.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(e).to_string_lossy().into_owned()
        };
        Some(if msg.is_empty() || msg.contains("No such file") {
            "not found: no NVIDIA driver on this machine?".to_string()
        } else {
            msg
        })
    }
}

/// Remove the run directory when it holds nothing but its run record (no session, nothing the
/// command wrote there), and the output directory when this run created it and it is now empty.
fn remove_if_empty(run_dir: &Path, output: &Path, output_was_there: bool) {
    let only_run_record = std::fs::read_dir(run_dir).is_ok_and(|rd| {
        rd.flatten()
            .all(|e| e.file_name() == std::ffi::OsStr::new(gpufl_trace::run::RUN_FILE))
    });
    if only_run_record && std::fs::remove_dir_all(run_dir).is_ok() && !output_was_there {
        // Fails, as it should, unless empty.
        let _ = std::fs::remove_dir(output);
    }
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The application a command runs, for the run directory's name: the program's file name; for an
/// interpreter (`python3 train.py`, `python -m torch.distributed.run`), the script's or module's.
fn app_of(command: &[OsString]) -> String {
    let base = |s: &OsString| {
        Path::new(s)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let Some(prog) = command.first().map(base) else {
        return "app".into();
    };
    if prog.starts_with("python") {
        let mut it = command[1..].iter().map(|a| a.to_string_lossy());
        while let Some(a) = it.next() {
            if a == "-m" {
                return it.next().map(|m| m.into_owned()).unwrap_or(prog);
            }
            if !a.starts_with('-') {
                let b = base(&OsString::from(a.as_ref()));
                return b.strip_suffix(".py").map(str::to_string).unwrap_or(b);
            }
        }
    }
    prog
}

/// Create this run's directory under `out` and write its run record (the end is added when the
/// command exits).
fn make_run_dir(out: &Path, command: &[OsString]) -> Result<(PathBuf, RunRecord)> {
    let start = unix_ns();
    let pid = std::process::id();
    let name = gpufl_trace::run::run_dir_name(&app_of(command), pid, start);
    let mut dir = out.join(&name);
    let mut n = 1;
    while let Err(e) = std::fs::create_dir(&dir) {
        if e.kind() != std::io::ErrorKind::AlreadyExists || n > 100 {
            return Err(e).with_context(|| format!("cannot create {}", dir.display()));
        }
        n += 1;
        dir = out.join(format!("{name}.{n}"));
    }
    let run = RunRecord {
        format: gpufl_trace::run::RUN_FORMAT.into(),
        version: gpufl_trace::run::RUN_VERSION,
        run_id: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or(name),
        gpufl_version: env!("CARGO_PKG_VERSION").into(),
        host: std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into()),
        command: command
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid,
        start_unix_ns: start,
        ..RunRecord::default()
    };
    gpufl_trace::run::write_run(&dir, &run)
        .with_context(|| format!("cannot write the run record in {}", dir.display()))?;
    Ok((dir, run))
}

/// End this process the way the recorded command ended: by the same signal (default action, no
/// core file of gpufl's own), so a shell or CI job sees the same status as without gpufl. Returns
/// only if the signal did not end the process (then the caller exits 128 + signal).
fn die_like(sig: i32) {
    // SAFETY: plain libc calls on this process's own disposition and limits.
    unsafe {
        let no_core = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &no_core);
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::raise(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wheels_library_is_found_from_its_bin() {
        let root = std::env::temp_dir().join(format!("gpufl-wheel-libs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for d in [
            "bin",
            "lib/python3.9/site-packages/gpufl",
            "lib/python3.12/site-packages/gpufl",
            "lib/python3.12/dist-packages",
            "lib/pythonX/site-packages/gpufl",
            "lib64/python3.11/dist-packages/gpufl",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let libs = wheel_libs(&root.join("bin"));
        let rel: Vec<String> = libs
            .iter()
            .map(|p| {
                p.strip_prefix(root.join("bin/.."))
                    .unwrap()
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(
            rel,
            [
                "lib/python3.12/site-packages/gpufl/libgpufl_capture.so",
                "lib/python3.12/dist-packages/gpufl/libgpufl_capture.so",
                "lib/python3.9/site-packages/gpufl/libgpufl_capture.so",
                "lib/python3.9/dist-packages/gpufl/libgpufl_capture.so",
                "lib64/python3.11/site-packages/gpufl/libgpufl_capture.so",
                "lib64/python3.11/dist-packages/gpufl/libgpufl_capture.so",
            ]
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}
