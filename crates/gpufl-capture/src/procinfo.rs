//! Facts about the current process and host for the session header.

/// argv of this process, from /proc/self/cmdline.
pub fn command_line() -> Vec<String> {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// Wall clock, ns since the Unix epoch.
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// OS thread id of the caller.
pub fn gettid() -> u64 {
    thread_local! {
        static TID: u64 = {
            // SAFETY: gettid has no preconditions.
            (unsafe { libc::syscall(libc::SYS_gettid) }) as u64
        };
    }
    TID.try_with(|t| *t).unwrap_or_else(|_| {
        // SAFETY: as above (thread-local storage already torn down).
        (unsafe { libc::syscall(libc::SYS_gettid) }) as u64
    })
}

/// Parent pid.
pub fn ppid() -> u32 {
    // SAFETY: getppid has no preconditions.
    unsafe { libc::getppid() as u32 }
}
