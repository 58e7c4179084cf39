//! Names of Linux signals as gpufl writes them (in `notice` records, in `gpufl record`'s message):
//! `SIGSEGV`, or `signal N` for a number without a name here. Linux numbers (x86-64 and arm64
//! share them).

/// `SIGSEGV` for 11, `signal 40` for a number without a name.
pub fn signal_name(sig: i32) -> String {
    let n = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        _ => return format!("signal {sig}"),
    };
    n.to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn names() {
        assert_eq!(super::signal_name(11), "SIGSEGV");
        assert_eq!(super::signal_name(6), "SIGABRT");
        assert_eq!(super::signal_name(63), "signal 63");
    }
}
