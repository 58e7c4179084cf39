//! Deferred upload from the recorded program (`gpufl_upload_logs`, `gpufl::uploadLogs`,
//! `gpufl.upload()`): the sessions under a log directory sent to a gpufl server with
//! [`gpufl_upload`], as `gpufl upload` does, after the workload (never during it: nothing here
//! touches CUDA or the recorder's threads).
//!
//! **Every** session found under the log directory is uploaded (searched as `gpufl upload`
//! searches), not only this process's: the server stores a session once, so sessions uploaded
//! before answer `unchanged` at the cost of one status request and the hashing of their files, and
//! the sessions of other processes writing to the same directory (DDP ranks, earlier runs) go up
//! too. A session still being recorded (this process's, when called before `gpufl_shutdown`, or
//! another process's) is sent up to its last closed block; a later upload sends the rest.
//!
//! What is not given falls back to what `gpufl_init` was given (`InitOptions::backend_url`,
//! `api_key`, `log_path`, after the `GPUFL_*` variables that override them: `GPUFL_BACKEND_URL`,
//! `GPUFL_API_KEY`, `GPUFL_LOG_PATH`), then to `GPUFL_SERVER` for the server and
//! `./gpufl-sessions` for the directory.

use crate::options::Options;
use gpufl_upload::{Event, Outcome, UploadOptions, Uploader};
use std::ffi::c_int;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Results of `gpufl_upload_logs` below 0 (0 and above: the number of sessions that failed).
/// No server or no key: neither given nor in `gpufl_init`'s options nor in the environment.
pub const NOT_CONFIGURED: c_int = -1;
/// The server's address is unusable (not `http://` or `https://`).
pub const BAD_OPTIONS: c_int = -2;
/// The log directory cannot be read, or holds no session.
pub const NO_SESSION: c_int = -3;
/// An internal error (a panic, caught).
pub const INTERNAL_ERROR: c_int = -4;

/// What the caller gave (`None`: not given, fall back).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Given {
    pub log_path: Option<String>,
    pub backend_url: Option<String>,
    pub api_key: Option<String>,
}

/// What an upload will do.
#[derive(Clone, PartialEq, Eq)]
pub struct Plan {
    pub log_path: PathBuf,
    pub server: String,
    pub api_key: String,
    /// `GPUFL_QUIET`: only failures are printed.
    pub quiet: bool,
}

/// The key stays out of debug output.
impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("log_path", &self.log_path)
            .field("server", &self.server)
            .field("api_key", &if self.api_key.is_empty() { "" } else { "…" })
            .field("quiet", &self.quiet)
            .finish()
    }
}

/// The options `gpufl_init` was last given (before the environment), for the fallbacks of an
/// upload when no recorder runs (capture disabled, or never started).
static INIT_OPTIONS: Mutex<Option<Options>> = Mutex::new(None);

/// Remember the options given to `gpufl_init`.
pub fn remember_init(opts: &Options) {
    *INIT_OPTIONS.lock().unwrap_or_else(|e| e.into_inner()) = Some(opts.clone());
}

/// The options an upload falls back to: the running (or stopped) recorder's, which hold the
/// environment's overrides already; else those given to `gpufl_init` (or the defaults) with the
/// environment applied.
fn fallback_options() -> Options {
    if let Some(r) = crate::recorder::get() {
        return r.opts.clone();
    }
    let mut o = INIT_OPTIONS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .unwrap_or_default();
    // Warnings about bad values were printed by gpufl_init (or concern recording only).
    let _ = o.apply_env();
    o
}

/// Resolve what to upload: each field given, else `base`'s (the init options with the
/// environment), else `env_server` (`GPUFL_SERVER`: [`crate::options::server_from_env`]) for the
/// server. `Err((code, message))` when no server or no key is configured.
pub fn resolve(
    given: &Given,
    base: &Options,
    env_server: Option<String>,
) -> Result<Plan, (c_int, String)> {
    let pick = |g: &Option<String>, b: &str| -> Option<String> {
        g.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .or(Some(b.trim()).filter(|s| !s.is_empty()))
            .map(str::to_string)
    };
    let server = pick(&given.backend_url, &base.backend_url).or_else(|| {
        env_server
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    });
    let api_key = pick(&given.api_key, &base.api_key);
    let Some(server) = server else {
        return Err((
            NOT_CONFIGURED,
            "upload: no server: set UploadOptions::backend_url (or InitOptions::backend_url, \
             GPUFL_SERVER)"
                .into(),
        ));
    };
    let Some(api_key) = api_key else {
        return Err((
            NOT_CONFIGURED,
            "upload: no key: set UploadOptions::api_key (or InitOptions::api_key, GPUFL_API_KEY)"
                .into(),
        ));
    };
    let log_path = given
        .log_path
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or(&base.log_path);
    let log_path = if log_path.is_empty() {
        "gpufl-sessions"
    } else {
        log_path
    };
    Ok(Plan {
        log_path: PathBuf::from(log_path),
        server,
        api_key,
        quiet: base.quiet,
    })
}

/// `gpufl_upload_logs`: resolve, upload, print one line per session on stderr.
pub fn upload_logs(given: &Given) -> c_int {
    let base = fallback_options();
    let quiet = base.quiet;
    let plan = match resolve(given, &base, crate::options::server_from_env()) {
        Ok(p) => p,
        Err((code, msg)) => {
            say(&msg);
            return code;
        }
    };
    let mut out = |line: &str, error: bool| {
        if error || !quiet {
            say(line);
        }
    };
    run(&plan, &mut out)
}

/// One line on stderr, prefixed `gpufl: ` (a closed stderr is no error).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "gpufl: {line}");
}

/// Upload every session under `plan.log_path`; `out(line, is_error)` hears one line per session
/// (and per retry). Returns the number of sessions that failed (those left untried after a
/// failure that would fail them all, a refused key or an unreachable server, included), or a
/// negative code for an error before any upload.
pub fn run(plan: &Plan, out: &mut dyn FnMut(&str, bool)) -> c_int {
    let opts = UploadOptions::new(plan.server.clone(), plan.api_key.clone());
    let uploader = match Uploader::new(&opts) {
        Ok(u) => u,
        Err(e) => {
            out(&format!("upload: {}", esc(&e.to_string())), true);
            return BAD_OPTIONS;
        }
    };
    let sessions = match gpufl_upload::find_sessions(std::slice::from_ref(&plan.log_path)) {
        Ok(s) if s.is_empty() => {
            out(
                &format!(
                    "upload: no gpufl session under {}",
                    esc(&plan.log_path.display().to_string())
                ),
                true,
            );
            return NO_SESSION;
        }
        Ok(s) => s,
        Err(e) => {
            out(&format!("upload: {}", esc(&e.to_string())), true);
            return NO_SESSION;
        }
    };
    let n = sessions.len();
    let mut failed = 0usize;
    for (i, dir) in sessions.iter().enumerate() {
        let name = session_name(dir);
        let res = uploader.upload(dir, &mut |p| {
            if let Event::Retry(r) = &p.event {
                out(
                    &format!(
                        "upload {name}: {}: retry {}/{} in {:.1} s: {}",
                        esc(&r.what),
                        r.attempt,
                        r.retries,
                        r.wait.as_secs_f64(),
                        esc(&r.why)
                    ),
                    false,
                );
            }
        });
        match res {
            Ok(o) => out(&stored_line(&o), false),
            Err(e) => {
                failed += 1;
                out(
                    &format!("upload of {name} failed: {}", esc(&e.to_string())),
                    true,
                );
                if let Some(why) = e.stops_the_rest() {
                    let left = n - i - 1;
                    if left > 0 {
                        out(
                            &format!("upload: {why}: the {left} other session(s) were not tried"),
                            true,
                        );
                        failed += left;
                    }
                    break;
                }
            }
        }
    }
    c_int::try_from(failed).unwrap_or(c_int::MAX)
}

fn session_name(dir: &Path) -> String {
    esc(&dir
        .file_name()
        .map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into()))
}

/// The line of a session stored: `uploaded ID (new, 1 file, 608 B, sent 608 B)`.
fn stored_line(o: &Outcome) -> String {
    let files = o.manifest.files.len();
    let mut s = format!(
        "uploaded {} ({}, {files} file{}, {}, sent {}",
        esc(&o.session),
        esc(o.stored.as_str()),
        if files == 1 { "" } else { "s" },
        size(o.bytes),
        size(o.bytes_sent)
    );
    if o.open_bytes > 0 {
        s.push_str(&format!(
            "; {} of an open block left for a later upload",
            size(o.open_bytes)
        ));
    }
    s.push(')');
    s
}

/// A byte count as people read it.
fn size(b: u64) -> String {
    gpufl_upload::human_size(b)
}

/// Control characters escaped (a server's reason, a path: text from elsewhere reaching a terminal).
fn esc(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Options {
        Options {
            log_path: "init-logs".into(),
            backend_url: "http://init:8470".into(),
            api_key: "gfl_up_init".into(),
            ..Options::default()
        }
    }

    /// `GPUFL_SERVER` set.
    fn env_server() -> Option<String> {
        Some("http://env:8470".to_string())
    }

    #[test]
    fn given_fields_win_then_init_options_then_the_environment() {
        let given = Given {
            log_path: Some("mine".into()),
            backend_url: Some("https://given".into()),
            api_key: Some("gfl_up_given".into()),
        };
        let p = resolve(&given, &base(), env_server()).unwrap();
        assert_eq!(
            (p.log_path.to_str().unwrap(), &*p.server, &*p.api_key),
            ("mine", "https://given", "gfl_up_given")
        );
        // Empty strings are not given.
        let empty = Given {
            log_path: Some(String::new()),
            backend_url: Some(" ".into()),
            api_key: Some(String::new()),
        };
        for g in [Given::default(), empty] {
            let p = resolve(&g, &base(), env_server()).unwrap();
            assert_eq!(
                (p.log_path.to_str().unwrap(), &*p.server, &*p.api_key),
                ("init-logs", "http://init:8470", "gfl_up_init")
            );
        }
        // No server in the init options: GPUFL_SERVER; no log path: the default directory.
        let bare = Options {
            backend_url: String::new(),
            log_path: String::new(),
            ..base()
        };
        let p = resolve(&Given::default(), &bare, env_server()).unwrap();
        assert_eq!(
            (p.log_path.to_str().unwrap(), &*p.server),
            ("gpufl-sessions", "http://env:8470")
        );
        assert!(!format!("{p:?}").contains("gfl_up_init"));
    }

    #[test]
    fn no_server_or_no_key_is_not_configured() {
        let none = Options {
            backend_url: String::new(),
            api_key: String::new(),
            ..base()
        };
        let e = resolve(&Given::default(), &none, None).unwrap_err();
        assert_eq!(e.0, NOT_CONFIGURED);
        assert!(e.1.contains("no server"), "{}", e.1);
        let e = resolve(&Given::default(), &none, env_server()).unwrap_err();
        assert_eq!(e.0, NOT_CONFIGURED);
        assert!(e.1.contains("no key"), "{}", e.1);
    }

    #[test]
    fn errors_before_any_upload_are_negative() {
        let plan = |server: &str, dir: PathBuf| Plan {
            log_path: dir,
            server: server.into(),
            api_key: "gfl_up_x".into(),
            quiet: false,
        };
        let mut lines = Vec::new();
        let mut out = |l: &str, e: bool| lines.push((l.to_string(), e));
        let tmp = std::env::temp_dir().join(format!("gpufl-upload-api-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        assert_eq!(run(&plan("ftp://x", tmp.clone()), &mut out), BAD_OPTIONS);
        assert_eq!(run(&plan("http://x", tmp.clone()), &mut out), NO_SESSION);
        assert_eq!(
            run(&plan("http://x", tmp.join("missing")), &mut out),
            NO_SESSION
        );
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines.iter().all(|(_, e)| *e));
        assert!(lines[1].0.contains("no gpufl session under"), "{lines:?}");
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn escapes_and_sizes() {
        assert_eq!(esc("a\x1b[2Jb\n"), "a\\u{1b}[2Jb\\n");
        assert_eq!(size(608), "608 B");
        assert_eq!(size(1536), "1.5 KiB");
    }
}
