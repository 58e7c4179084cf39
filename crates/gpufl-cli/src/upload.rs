//! `gpufl upload [DIR…] --server URL --api-key KEY`: send sessions to a gpufl server
//! (docs/server-api.md). Each DIR is a session directory, or a directory searched for sessions
//! (recursively: `gpufl record`'s output directory holds `run-…/SESSION`). A session still being
//! recorded is sent up to the end of its last closed block; uploading again sends only what is new.
//!
//! On a terminal, stderr shows one progress line, rewritten; otherwise nothing but retries. Each
//! session ends with one line on stdout: `stored` or `failed` with the server's reason. Exit
//! status 0 when every session is stored, 1 when some failed.

use crate::term;
use anyhow::{bail, Result};
use clap::Args;
use gpufl_upload::{Event, Outcome, Progress, UploadOptions, Uploader};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

#[derive(Args)]
pub struct UploadArgs {
    /// Session directories, or directories searched for sessions (recursively).
    #[arg(default_value = "gpufl-sessions")]
    dirs: Vec<PathBuf>,
    /// The server's address: http(s)://host[:port].
    #[arg(long, env = "GPUFL_SERVER")]
    server: String,
    /// An upload key (gfl_up_…); GPUFL_API_KEY keeps it out of the process list.
    #[arg(long, env = "GPUFL_API_KEY", hide_env_values = true)]
    api_key: String,
    /// Retries of a request after a connection error, a 5xx or a 429 (exponential backoff).
    #[arg(long, default_value_t = 5)]
    retries: u32,
    /// How long each request keeps trying a server it cannot reach (connection refused, DNS, a
    /// connect that does not complete) before the upload fails, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 5.0, value_parser = parse_secs)]
    connect_timeout_s: f64,
}

/// A number of seconds, 0 or more.
fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds (0 to 86400)")),
    }
}

pub fn run(args: UploadArgs) -> Result<i32> {
    let mut opts = UploadOptions::new(args.server, args.api_key);
    opts.retries = args.retries;
    opts.connect_timeout = std::time::Duration::from_secs_f64(args.connect_timeout_s);
    let uploader = Uploader::new(&opts).map_err(|e| anyhow::anyhow!("{e}"))?;
    for d in &args.dirs {
        crate::summary::ensure_exists(d)?;
    }
    let sessions = gpufl_upload::find_sessions(&args.dirs).map_err(|e| anyhow::anyhow!("{e}"))?;
    if sessions.is_empty() {
        let dirs: Vec<String> = args.dirs.iter().map(|d| term::esc_path(d)).collect();
        bail!("no gpufl session under {}", dirs.join(", "));
    }
    let tty = std::io::stderr().is_terminal();
    let n = sessions.len();
    let mut tally = Tally::default();
    for (i, dir) in sessions.iter().enumerate() {
        let mut line = ProgressLine::new(tty, i + 1, n);
        let res = uploader.upload(dir, &mut |p| line.show(&p));
        line.clear();
        match res {
            Ok(o) => {
                term::print(&format!("{}\n", stored_line(&o)))?;
                tally.stored(&o);
            }
            Err(e) => {
                let name = dir
                    .file_name()
                    .map_or_else(|| term::esc_path(dir), |s| term::esc_path(s.as_ref()));
                term::print(&format!("failed  {name}  {}\n", term::esc(&e.to_string())))?;
                tally.failed += 1;
                if let Some(why) = e.stops_the_rest() {
                    let left = n - i - 1;
                    if left > 0 {
                        term::eprint_line(&format!(
                            "gpufl upload: {why}: the {left} other session(s) were not tried"
                        ));
                        tally.untried = left;
                    }
                    break;
                }
            }
        }
    }
    if n > 1 {
        term::print(&format!("{}\n", tally.line()))?;
    }
    Ok(if tally.failed + tally.untried == 0 {
        0
    } else {
        1
    })
}

/// Sessions stored, by what the server did, and failed.
#[derive(Default)]
struct Tally {
    new: usize,
    extended: usize,
    unchanged: usize,
    other: usize,
    failed: usize,
    untried: usize,
    sent: u64,
}

impl Tally {
    fn stored(&mut self, o: &Outcome) {
        use gpufl_upload::Stored;
        match o.stored {
            Stored::New => self.new += 1,
            Stored::Extended => self.extended += 1,
            Stored::Unchanged => self.unchanged += 1,
            Stored::Other(_) => self.other += 1,
        }
        self.sent += o.bytes_sent;
    }

    fn line(&self) -> String {
        let stored = self.new + self.extended + self.unchanged + self.other;
        let mut s = format!(
            "{} session(s): {stored} stored ({} new, {} extended, {} unchanged), {} sent",
            stored + self.failed + self.untried,
            self.new,
            self.extended,
            self.unchanged,
            size(self.sent)
        );
        if self.failed > 0 {
            s.push_str(&format!(", {} failed", self.failed));
        }
        if self.untried > 0 {
            s.push_str(&format!(", {} not tried", self.untried));
        }
        s
    }
}

/// A byte count as people read it.
fn size(b: u64) -> String {
    gpufl_upload::human_size(b)
}

/// The line of a session stored.
fn stored_line(o: &Outcome) -> String {
    let files = o.manifest.files.len();
    let mut s = format!(
        "stored  {}  {} · {files} file{}, {} · sent {} in {} part(s), {} part(s) already there",
        term::esc(&o.session),
        term::esc(o.stored.as_str()),
        if files == 1 { "" } else { "s" },
        size(o.bytes),
        size(o.bytes_sent),
        o.parts_sent,
        o.parts_skipped
    );
    if o.open_bytes > 0 {
        s.push_str(&format!(
            " · {} of an open block left for a later upload",
            size(o.open_bytes)
        ));
    }
    if !o.ingest.is_empty() {
        s.push_str(&format!(" · analysis {}", term::esc(&o.ingest)));
    }
    s
}

/// The progress of one session: a line on stderr rewritten in place on a terminal; elsewhere
/// retries only.
struct ProgressLine {
    tty: bool,
    at: usize,
    of: usize,
    shown: bool,
}

impl ProgressLine {
    fn new(tty: bool, at: usize, of: usize) -> Self {
        ProgressLine {
            tty,
            at,
            of,
            shown: false,
        }
    }

    fn show(&mut self, p: &Progress) {
        let text = progress_text(p, self.at, self.of);
        if !self.tty {
            if matches!(p.event, Event::Retry(_)) {
                term::eprint_line(&format!("gpufl upload: {text}"));
            }
            return;
        }
        let text: String = text.chars().take(width().saturating_sub(1)).collect();
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "\r\x1b[K{text}").and_then(|_| e.flush());
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            let mut e = std::io::stderr().lock();
            let _ = write!(e, "\r\x1b[K").and_then(|_| e.flush());
            self.shown = false;
        }
    }
}

/// The terminal's width (stderr's), 80 when unknown.
fn width() -> usize {
    // SAFETY: TIOCGWINSZ fills a winsize; on failure it is left zeroed.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut ws) } == 0;
    if ok && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}

/// One progress line (escaped).
fn progress_text(p: &Progress, at: usize, of: usize) -> String {
    let head = format!("[{at}/{of}] {}", term::esc(&p.session));
    let pct = p.done.saturating_mul(100).checked_div(p.total).unwrap_or(0);
    let amount = format!("{pct:>3}% of {} · sent {}", size(p.total), size(p.sent));
    match &p.event {
        Event::Started => format!(
            "{head}  asking the server what it holds · {}",
            size(p.total)
        ),
        Event::Part {
            file, index, parts, ..
        } => format!(
            "{head}  {amount} · {} {}/{parts}",
            term::esc(file.strip_suffix(".ndjson.zst").unwrap_or(file)),
            index + 1
        ),
        Event::Completing => format!("{head}  {amount} · completing"),
        Event::Retry(r) => format!(
            "{head}  {}: retry {}/{} in {:.1} s: {}",
            term::esc(&r.what),
            r.attempt,
            r.retries,
            r.wait.as_secs_f64(),
            term::esc(&r.why)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufl_upload::{FileManifest, Manifest, Retry, Stored};

    fn outcome() -> Outcome {
        Outcome {
            session: "train-1-20260101T000000Z".into(),
            dir: "/x/train-1-20260101T000000Z".into(),
            stored: Stored::Extended,
            ingest: "pending".into(),
            manifest: Manifest {
                files: vec![FileManifest {
                    name: "trace-0000.ndjson.zst".into(),
                    size: 5 << 20,
                    sha256: "00".into(),
                    parts: 2,
                }],
            },
            bytes: 5 << 20,
            open_bytes: 1000,
            bytes_sent: 1 << 20,
            parts_sent: 1,
            parts_skipped: 1,
        }
    }

    #[test]
    fn the_stored_line() {
        assert_eq!(
            stored_line(&outcome()),
            "stored  train-1-20260101T000000Z  extended · 1 file, 5.0 MiB · sent 1.0 MiB in 1 \
             part(s), 1 part(s) already there · 1000 B of an open block left for a later upload · \
             analysis pending"
        );
    }

    #[test]
    fn progress_lines_are_escaped() {
        let mut p = Progress {
            session: "s".into(),
            event: Event::Part {
                file: "trace-0000.ndjson.zst".into(),
                index: 1,
                parts: 3,
                sent: true,
            },
            done: 8 << 20,
            total: 10 << 20,
            sent: 4 << 20,
        };
        assert_eq!(
            progress_text(&p, 2, 3),
            "[2/3] s   80% of 10.0 MiB · sent 4.0 MiB · trace-0000 2/3"
        );
        p.event = Event::Retry(Retry {
            what: "PUT trace-0000.ndjson.zst part 2".into(),
            attempt: 1,
            retries: 5,
            wait: std::time::Duration::from_millis(1500),
            why: "503 http_503: \x1b[2Jdown".into(),
        });
        let t = progress_text(&p, 1, 1);
        assert!(
            t.ends_with("retry 1/5 in 1.5 s: 503 http_503: \\u{1b}[2Jdown"),
            "{t}"
        );
    }

    #[test]
    fn the_tally() {
        let mut t = Tally::default();
        t.stored(&outcome());
        t.failed = 1;
        t.untried = 2;
        assert_eq!(
            t.line(),
            "4 session(s): 1 stored (0 new, 1 extended, 0 unchanged), 1.0 MiB sent, 1 failed, 2 \
             not tried"
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(size(0), "0 B");
        assert_eq!(size(1023), "1023 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 << 30), "3.00 GiB");
    }
}
