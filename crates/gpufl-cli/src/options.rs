//! What `gpufl` reads from its environment, read here and nowhere else in the CLI.
//!
//! A `GPUFL_*` variable that stands for one argument is that argument's clap `env` (so `--help`
//! shows it): `GPUFL_SERVER` and `GPUFL_API_KEY` (upload), `GPUFL_DATA`, `GPUFL_DB` and
//! `GPUFL_STORE` (serve, admin). The others are read by the functions below: `GPUFL_USER_PATHS`
//! (added to `--user-path`, not replaced by it), `GPUFL_CAPTURE_LIB`, `GPUFL_EXPORTER_SOCKET`, and
//! the fuzzing pass's `GPUFL_FUZZ_*` knobs (tests only); `GPUFL_THREADS` is read by
//! `gpufl_trace::default_threads`. `NO_COLOR` and `NVTX_INJECTION64_PATH` are read here too.
//! The `GPUFL_*` variables `gpufl record` sets for the recorded program are written in
//! `record.rs`, never read.

use gpufl_analysis::{Config, FrameFilter};
use std::path::PathBuf;

/// The analysis settings of `--include`, `--exclude`, `--user-path` and `GPUFL_USER_PATHS`.
pub(crate) fn analysis_config(
    include: &[String],
    exclude: &[String],
    user_path: &[String],
) -> Config {
    // Unset or not Unicode: no patterns.
    let var = std::env::var("GPUFL_USER_PATHS").ok();
    config_of(include, exclude, user_path, var.as_deref())
}

/// User code is `--include`'s patterns, then `--user-path`'s, then those of `GPUFL_USER_PATHS`
/// (`user_paths_var`: colon-separated, empty parts skipped).
fn config_of(
    include: &[String],
    exclude: &[String],
    user_path: &[String],
    user_paths_var: Option<&str>,
) -> Config {
    let mut filter = FrameFilter::default();
    filter.include.extend(include.iter().cloned());
    filter.include.extend(user_path.iter().cloned());
    if let Some(v) = user_paths_var {
        filter
            .include
            .extend(v.split(':').filter(|p| !p.is_empty()).map(str::to_string));
    }
    filter.exclude.extend(exclude.iter().cloned());
    Config { filter }
}

/// `--threads N`, else `GPUFL_THREADS`, else every available core.
pub(crate) fn threads(arg: Option<usize>) -> usize {
    match arg {
        Some(n) if n > 0 => n.min(gpufl_trace::par::MAX_THREADS),
        _ => gpufl_trace::default_threads(),
    }
}

/// `GPUFL_CAPTURE_LIB`: the capture library `gpufl record` injects, where `--lib` is not given.
pub(crate) fn capture_lib() -> Option<PathBuf> {
    std::env::var_os("GPUFL_CAPTURE_LIB").map(PathBuf::from)
}

/// `GPUFL_EXPORTER_SOCKET` (unless empty): the socket `gpufl exporter` listens on, where
/// `--socket` is not given.
pub(crate) fn exporter_socket() -> Option<PathBuf> {
    std::env::var_os(gpufl_trace::feed::ENV_SOCKET)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
}

/// Whether `NO_COLOR` is set (to anything): no colours unless `--color always`.
pub(crate) fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some()
}

/// Whether `NVTX_INJECTION64_PATH` is set: `gpufl record` then leaves it to the recorded program.
pub(crate) fn nvtx_injection_set() -> bool {
    std::env::var_os("NVTX_INJECTION64_PATH").is_some()
}

/// The knobs of the fuzzing pass (`fuzz.rs`).
#[cfg(test)]
pub(crate) mod fuzz {
    use std::path::PathBuf;

    fn u64_of(name: &str) -> Option<u64> {
        std::env::var(name).ok()?.trim().parse().ok()
    }

    /// `GPUFL_FUZZ_SECS`: how long the random run lasts.
    pub(crate) fn secs() -> Option<u64> {
        u64_of("GPUFL_FUZZ_SECS")
    }

    /// `GPUFL_FUZZ_SEED`: the first input's seed.
    pub(crate) fn seed() -> Option<u64> {
        u64_of("GPUFL_FUZZ_SEED")
    }

    /// `GPUFL_FUZZ_INPUTS`: at most this many inputs.
    pub(crate) fn inputs() -> Option<u64> {
        u64_of("GPUFL_FUZZ_INPUTS")
    }

    /// `GPUFL_FUZZ_KEEP`: a directory every input is also written to.
    pub(crate) fn keep() -> Option<PathBuf> {
        std::env::var_os("GPUFL_FUZZ_KEEP").map(PathBuf::from)
    }

    /// Whether `GPUFL_FUZZ_VERBOSE` is set: a line per input.
    pub(crate) fn verbose() -> bool {
        std::env::var_os("GPUFL_FUZZ_VERBOSE").is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::config_of;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn user_paths_add_to_the_arguments() {
        let (inc, exc, up) = (strings(&["inc"]), strings(&["exc"]), strings(&["a", "b"]));
        let c = config_of(&inc, &exc, &up, Some("x::y:"));
        assert_eq!(c.filter.include, strings(&["inc", "a", "b", "x", "y"]));
        assert_eq!(
            c.filter.exclude.last(),
            Some(&"exc".to_string()),
            "after the built-in ones"
        );
        let c = config_of(&[], &[], &up, None);
        assert_eq!(c.filter.include, strings(&["a", "b"]));
        let c = config_of(&[], &[], &[], Some(""));
        assert!(c.filter.include.is_empty());
    }
}
