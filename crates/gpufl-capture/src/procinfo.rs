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

/// Where the process stands in a distributed job, from its launcher's environment, and the
/// `gpufl record` run it belongs to (header fields `rank`, `local_rank`, `world_size`, `run_id`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Job {
    pub rank: Option<u32>,
    pub local_rank: Option<u32>,
    pub world_size: Option<u32>,
    pub run_id: Option<String>,
}

/// Variables that carry the global rank, in order of preference: torchrun (and most Python
/// launchers), Open MPI, MPICH / Intel MPI (PMI), SLURM.
pub const RANK_VARS: [&str; 4] = ["RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"];
/// The rank on this host.
pub const LOCAL_RANK_VARS: [&str; 4] = [
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
];
/// The number of processes.
pub const WORLD_SIZE_VARS: [&str; 4] = [
    "WORLD_SIZE",
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "SLURM_NTASKS",
];
/// The run id `gpufl record` sets.
pub const RUN_ID_VAR: &str = "GPUFL_RUN_ID";

impl Job {
    /// From an environment lookup (the process's is read once: [`crate::options::Knobs::job`]):
    /// the first variable of each list that holds a number (a value
    /// that is not one is skipped, so a stray `RANK=abc` does not hide `SLURM_PROCID`).
    pub fn from_env_with(get: impl Fn(&str) -> Option<String>) -> Job {
        let num = |vars: &[&str]| {
            vars.iter()
                .find_map(|v| get(v).and_then(|s| s.trim().parse::<u32>().ok()))
        };
        Job {
            rank: num(&RANK_VARS),
            local_rank: num(&LOCAL_RANK_VARS),
            world_size: num(&WORLD_SIZE_VARS),
            run_id: get(RUN_ID_VAR)
                .map(|s| s.trim().chars().take(128).collect::<String>())
                .filter(|s| !s.is_empty()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn job_from_launcher_variables() {
        assert_eq!(Job::from_env_with(env(&[])), Job::default());
        let torchrun = [
            ("RANK", "1"),
            ("LOCAL_RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("GPUFL_RUN_ID", "run-7"),
        ];
        let j = Job::from_env_with(env(&torchrun));
        assert_eq!(
            (j.rank, j.local_rank, j.world_size, j.run_id.as_deref()),
            (Some(1), Some(1), Some(2), Some("run-7"))
        );
        let mpi = [
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ];
        let j = Job::from_env_with(env(&mpi));
        assert_eq!(
            (j.rank, j.local_rank, j.world_size),
            (Some(3), Some(1), Some(4))
        );
        // torchrun's variables win over SLURM's (torchrun inside an allocation); a value that is
        // not a number is skipped.
        let both = [
            ("RANK", "x"),
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("WORLD_SIZE", "2"),
        ];
        let j = Job::from_env_with(env(&both));
        assert_eq!((j.rank, j.world_size), (Some(5), Some(2)));
        assert_eq!(
            Job::from_env_with(env(&[("GPUFL_RUN_ID", "  ")])).run_id,
            None
        );
    }
}
