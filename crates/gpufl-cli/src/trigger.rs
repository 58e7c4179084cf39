//! `gpufl trigger PID [--seconds N]`: ask an always-on recording for a full-detail window.
//!
//! Sends the recorder's trigger signal (SIGUSR2, or `--signal`) with the window's length queued
//! alongside (`sigqueue`, in ms). Before sending it checks that the process exists, has the capture
//! library loaded, and catches that signal — a process that does not would be killed by it.

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct TriggerArgs {
    /// The recorded process.
    pid: i32,
    /// Length of the window, seconds (default 10, at most 3600).
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// The trigger signal the recorder was started with (GPUFL_TRIGGER_SIGNAL): USR2 or USR1, or
    /// a number.
    #[arg(long, default_value = "USR2")]
    signal: String,
}

fn parse_signal(s: &str) -> Option<i32> {
    match s
        .trim()
        .trim_start_matches("SIG")
        .to_ascii_uppercase()
        .as_str()
    {
        "USR1" => Some(libc::SIGUSR1),
        "USR2" => Some(libc::SIGUSR2),
        n => n.parse::<i32>().ok().filter(|&k| k > 0 && k < 65),
    }
}

/// Whether `/proc/PID/status` says the process catches `sig` (its `SigCgt` mask).
pub fn catches(status: &str, sig: i32) -> Option<bool> {
    let line = status.lines().find(|l| l.starts_with("SigCgt:"))?;
    let mask = u64::from_str_radix(line["SigCgt:".len()..].trim(), 16).ok()?;
    Some(mask & (1u64 << (sig - 1)) != 0)
}

pub fn run(args: TriggerArgs) -> Result<i32> {
    let Some(sig) = parse_signal(&args.signal) else {
        bail!(
            "--signal {:?} is not a signal (USR1, USR2 or a number)",
            args.signal
        );
    };
    if !(args.seconds.is_finite() && args.seconds > 0.0 && args.seconds <= 3600.0) {
        bail!("--seconds must be in (0, 3600], not {}", args.seconds);
    }
    let pid = args.pid;
    if pid <= 0 {
        bail!("{pid} is not a process id");
    }
    let status = match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => s,
        Err(_) => bail!("no process {pid}"),
    };
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    if !maps.is_empty() && !maps.contains("libgpufl_capture") {
        bail!("process {pid} is not recorded by gpufl (no libgpufl_capture loaded)");
    }
    if catches(&status, sig) != Some(true) {
        bail!(
            "process {pid} does not catch {}: it is not recording in always-on mode (start it with \
             `gpufl record --always-on`), or its recorder uses another trigger signal; not sent \
             (the signal's default action would end it)",
            gpufl_trace::signals::signal_name(sig)
        );
    }
    let ms = (args.seconds * 1000.0).round() as usize;
    let value = libc::sigval {
        sival_ptr: ms as *mut libc::c_void,
    };
    // SAFETY: sigqueue with a plain value.
    let rc = unsafe { libc::sigqueue(pid, sig, value) };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            bail!("not allowed to signal process {pid} (another user's?)");
        }
        bail!("cannot signal process {pid}: {e}");
    }
    crate::term::eprint_line(&format!(
        "gpufl: asked process {pid} for a {}-second full-detail window",
        args.seconds
    ));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_mask() {
        // SIGUSR2 (12) is bit 11; SIGINT (2) bit 1.
        let st = "Name:\tx\nSigCgt:\t0000000000000802\n";
        assert_eq!(catches(st, 12), Some(true));
        assert_eq!(catches(st, 2), Some(true));
        assert_eq!(catches(st, 10), Some(false));
        assert_eq!(catches("Name:\tx\n", 12), None);
    }

    #[test]
    fn signals() {
        assert_eq!(parse_signal("USR2"), Some(libc::SIGUSR2));
        assert_eq!(parse_signal("SIGUSR1"), Some(libc::SIGUSR1));
        assert_eq!(parse_signal("40"), Some(40));
        assert_eq!(parse_signal("KILL9"), None);
    }
}
