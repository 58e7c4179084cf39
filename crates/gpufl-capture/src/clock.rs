//! The monotonic clock the recorder's schedules use (sampling pauses, flush deadlines), ns.

/// `CLOCK_MONOTONIC` in ns (served by the vDSO; async-signal-safe).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
