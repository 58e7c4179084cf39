//! One-pass totals of a session (the full analysis lives in gpufl-analysis).

use crate::term::{esc, esc_path};
use anyhow::{bail, Result};
use gpufl_analysis::{headline_on, Config, Headline, Model};
use gpufl_trace::{run, session, Header, ParSessionReader, Record};
use std::path::{Path, PathBuf};

/// Totals of one session.
#[derive(Debug, Default)]
pub struct Summary {
    pub header: Option<Header>,
    pub kernels: u64,
    pub kernel_ns: u64,
    pub memcpys: u64,
    pub memsets: u64,
    pub syncs: u64,
    pub sync_ns: u64,
    pub syncs_with_stack: u64,
    pub apis: u64,
    pub dropped: u64,
    /// `telemetry` records (NVML samples, one per GPU per period).
    pub telemetry: u64,
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    pub ended: Option<String>,
    pub warnings: Vec<String>,
}

impl Summary {
    fn span(&mut self, start: u64, end: u64) {
        if start == 0 {
            return;
        }
        self.first_ns = Some(self.first_ns.map_or(start, |f| f.min(start)));
        self.last_ns = Some(self.last_ns.map_or(end, |l| l.max(end)));
    }

    /// Seconds from the first to the last timed record.
    pub fn duration_s(&self) -> f64 {
        match (self.first_ns, self.last_ns) {
            (Some(a), Some(b)) if b > a => (b - a) as f64 / 1e9,
            _ => 0.0,
        }
    }

    /// One line: "12.3 s, 2862 kernels, 55 syncs (3.21 s blocked in syncs, 55 with stacks)".
    pub fn one_line(&self) -> String {
        let mut s = format!(
            "{:.2} s, {} kernels, {} syncs ({:.3} s blocked in syncs, {} with stacks)",
            self.duration_s(),
            self.kernels,
            self.syncs,
            self.sync_ns as f64 / 1e9,
            self.syncs_with_stack
        );
        if self.memcpys + self.memsets > 0 {
            s += &format!(", {} copies, {} memsets", self.memcpys, self.memsets);
        }
        s += &self.tail();
        s
    }

    /// What follows the counts in [`Summary::one_line`] and `gpufl info`'s counts line: telemetry
    /// samples, dropped records, a capture that did not work, a missing end record.
    fn tail(&self) -> String {
        let mut s = String::new();
        if self.telemetry > 0 {
            s += &format!(", {} telemetry samples", self.telemetry);
        }
        if self.dropped > 0 {
            s += &format!(", {} records DROPPED", self.dropped);
        }
        if let Some(h) = &self.header {
            if h.capture.status != "ok" {
                s += &format!(
                    " [capture {}: {}]",
                    h.capture.status,
                    h.capture.reason.as_deref().unwrap_or("?")
                );
            }
        }
        if self.ended.is_none() {
            s += " [no end record: the process was killed or is still running]";
        }
        s
    }
}

/// A session loaded for `gpufl info`: its totals, from the model, and the analysis's headline
/// ([`gpufl_analysis::headline_on`]: the figures `gpufl report` shows, without the rules).
pub fn load_info(dir: &Path, threads: usize) -> Result<(Summary, Headline)> {
    let mut reader = ParSessionReader::open(dir, threads)?;
    let mut m = Model::load_items(&mut reader);
    m.add_warnings(reader.warnings());
    drop(reader);
    let h = headline_on(&m, &Config::default(), threads);
    let (first, last) = m.time_range();
    // No timed record: (0, 0).
    let timed = (first, last) != (0, 0);
    let mut s = Summary {
        header: m.header().cloned(),
        kernels: m.kernel_count() as u64,
        kernel_ns: m
            .kernels()
            .fold(0u64, |a, k| a.saturating_add(k.end.saturating_sub(k.start))),
        memcpys: (m.copy_count() - m.memset_count()) as u64,
        memsets: m.memset_count() as u64,
        syncs: m.sync_count() as u64,
        sync_ns: h.sync_blocked_ns,
        syncs_with_stack: m.syncs_with_stack(),
        apis: m.api_count(),
        dropped: m.dropped(),
        telemetry: m.telemetry().iter().map(|t| t.len() as u64).sum(),
        first_ns: timed.then_some(first),
        last_ns: timed.then_some(last),
        ended: m.end_reason().map(str::to_string),
        warnings: m.warnings().to_vec(),
    };
    if s.header.is_none() {
        s.warnings
            .push(format!("{}: no header record", dir.display()));
    }
    Ok((s, h))
}

/// Read a session and total it (one pass, no model: `gpufl record`'s summary lines).
pub fn summarize(dir: &Path) -> Result<Summary> {
    let mut reader = ParSessionReader::open(dir, gpufl_trace::default_threads())?;
    let mut s = Summary::default();
    for rec in reader.by_ref() {
        match rec {
            Record::Header(h) if s.header.is_none() => s.header = Some(*h),
            Record::Kernel(k) => {
                s.kernels += 1;
                s.kernel_ns = s.kernel_ns.saturating_add(k.end.saturating_sub(k.start));
                s.span(k.start, k.end);
            }
            Record::Memcpy(m) => {
                s.memcpys += 1;
                s.span(m.start, m.end);
            }
            Record::Memset(m) => {
                s.memsets += 1;
                s.span(m.start, m.end);
            }
            Record::Sync(y) => {
                s.syncs += 1;
                if y.kind.blocks_host() {
                    s.sync_ns = s.sync_ns.saturating_add(y.end.saturating_sub(y.start));
                }
                s.syncs_with_stack += y.stack.is_some() as u64;
                s.span(y.start, y.end);
            }
            Record::Api(a) => {
                s.apis += 1;
                s.span(a.start, a.end);
            }
            Record::Dropped(d) => s.dropped += d.count,
            Record::Telemetry(_) => s.telemetry += 1,
            Record::End(e) => s.ended = Some(e.reason),
            _ => {}
        }
    }
    s.warnings = reader.warnings();
    if s.header.is_none() {
        s.warnings
            .push(format!("{}: no header record", dir.display()));
    }
    Ok(s)
}

/// Expand arguments into session directories.
pub fn expand_sessions(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        ensure_exists(p)?;
        let found = session::find_sessions(p);
        if found.is_empty() {
            bail!(
                "{} is not a gpufl session directory (and contains none)",
                esc_path(p)
            );
        }
        out.extend(found);
    }
    Ok(out)
}

/// An error for a path named on the command line that does not exist (or cannot be looked at),
/// so that it is not reported as "not a gpufl session directory".
pub fn ensure_exists(p: &Path) -> Result<()> {
    match std::fs::metadata(p) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("{} does not exist", esc_path(p))
        }
        Err(e) => bail!("cannot read {}: {}", esc_path(p), esc(&e.to_string())),
    }
}

/// `gpufl info`. Every string from a trace is escaped for the terminal ([`esc`]). The sessions of a
/// run (a run directory with `run.json`, or sessions sharing a `run_id` of which two or more have a
/// rank) come after a summary of the run ([`run_text`]).
pub fn info(paths: &[PathBuf]) -> Result<i32> {
    let all = expand_sessions(paths)?;
    let threads = crate::options::threads(None);
    // A session that cannot be read does not hide the others: they are printed, then its error
    // ends the command (as the first such error).
    let mut first_err = None;
    let mut dirs = Vec::with_capacity(all.len());
    let mut sums = Vec::with_capacity(all.len());
    let mut heads = Vec::with_capacity(all.len());
    for d in all {
        match load_info(&d, threads) {
            Ok((s, h)) => {
                dirs.push(d);
                sums.push(s);
                heads.push(h);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    // Each session's run: its run directory, else the run id of its header.
    let keys: Vec<Option<RunKey>> = dirs
        .iter()
        .zip(&sums)
        .map(|(d, s)| match d.parent().filter(|p| run::is_run_dir(p)) {
            Some(p) => Some(RunKey::Dir(p.to_path_buf())),
            None => s
                .header
                .as_ref()
                .and_then(|h| h.run_id.clone())
                .map(RunKey::Id),
        })
        .collect();
    let is_run = |k: &RunKey| match k {
        RunKey::Dir(_) => true,
        RunKey::Id(_) => {
            keys.iter()
                .zip(&sums)
                .filter(|(o, s)| {
                    o.as_ref() == Some(k) && s.header.as_ref().is_some_and(|h| h.rank.is_some())
                })
                .count()
                >= 2
        }
    };
    let mut done = vec![false; dirs.len()];
    for i in 0..dirs.len() {
        if done[i] {
            continue;
        }
        let members: Vec<usize> = match &keys[i] {
            Some(k) if is_run(k) => (i..dirs.len())
                .filter(|&j| keys[j].as_ref() == Some(k))
                .collect(),
            _ => vec![i],
        };
        if let Some(k) = keys[i].as_ref().filter(|k| is_run(k)) {
            let procs: Vec<(&Path, &Summary)> = members
                .iter()
                .map(|&j| (dirs[j].as_path(), &sums[j]))
                .collect();
            crate::term::print(&run_text(k, &procs))?;
        }
        for j in members {
            done[j] = true;
            crate::term::print(&info_text_of(&dirs[j], &sums[j], &heads[j]))?;
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(0),
    }
}

/// What makes sessions one run for `gpufl info`.
#[derive(Debug, PartialEq, Eq)]
pub enum RunKey {
    /// The run directory holding them (with `run.json`).
    Dir(PathBuf),
    /// The `run_id` of their headers (no run directory).
    Id(String),
}

/// A session's rank as `rank R/N (local L)`, when its header has one.
pub fn rank_label(h: &Header) -> Option<String> {
    let r = h.rank?;
    let mut s = match h.world_size {
        Some(n) => format!("rank {r}/{n}"),
        None => format!("rank {r}"),
    };
    if let Some(l) = h.local_rank {
        s += &format!(" (local {l})");
    }
    Some(s)
}

/// A Unix time in ns as `YYYY-mm-dd HH:MM:SS UTC`.
fn utc(unix_ns: u64) -> String {
    let c = session::utc_compact(unix_ns / 1_000_000_000);
    match (
        c.get(0..4),
        c.get(4..6),
        c.get(6..8),
        c.get(9..11),
        c.get(11..13),
        c.get(13..15),
    ) {
        (Some(y), Some(m), Some(d), Some(hh), Some(mm), Some(ss)) if c.len() == 16 => {
            format!("{y}-{m}-{d} {hh}:{mm}:{ss} UTC")
        }
        _ => c,
    }
}

/// The run summary of `gpufl info`: the run record (id, command, host, start, duration, how it
/// ended), then one line per process (rank, pid, app, kernels, syncs), ranks first.
pub fn run_text(key: &RunKey, procs: &[(&Path, &Summary)]) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    match key {
        RunKey::Dir(dir) => {
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            match run::read_run(dir) {
                Ok(Some(r)) => {
                    let _ = writeln!(o, "run {}  ({})", esc(&r.run_id), esc_path(dir));
                    let _ = writeln!(o, "  command: {}", esc(&r.command.join(" ")));
                    let ended = match (r.exit_code, &r.signal) {
                        (_, Some(sig)) => format!("killed by {}", esc(sig)),
                        (Some(c), None) => format!("exit {c}"),
                        (None, None) => {
                            "no end recorded (still running, or gpufl record was killed)".into()
                        }
                    };
                    let took = r
                        .end_unix_ns
                        .map(|e| {
                            format!(
                                "  ran {:.2} s",
                                e.saturating_sub(r.start_unix_ns) as f64 / 1e9
                            )
                        })
                        .unwrap_or_default();
                    let _ = writeln!(
                        o,
                        "  host {}  started {}{took}  {ended}",
                        esc(&r.host),
                        utc(r.start_unix_ns)
                    );
                }
                Ok(None) => {
                    let _ = writeln!(o, "run {}  ({})", esc(&name), esc_path(dir));
                }
                Err(e) => {
                    let _ = writeln!(o, "run {}  ({})", esc(&name), esc_path(dir));
                    let _ = writeln!(
                        o,
                        "  warning: run record unreadable: {}",
                        esc(&e.to_string())
                    );
                }
            }
        }
        RunKey::Id(id) => {
            let _ = writeln!(o, "run {}", esc(id));
            let mut hosts: Vec<&str> = procs
                .iter()
                .filter_map(|(_, s)| s.header.as_ref().map(|h| h.host.as_str()))
                .collect();
            hosts.sort_unstable();
            hosts.dedup();
            let _ = writeln!(
                o,
                "  no run record (run.json): from the sessions' headers; host {}",
                esc(&hosts.join(", "))
            );
        }
    }
    let mut order: Vec<&(&Path, &Summary)> = procs.iter().collect();
    order.sort_by_key(|(_, s)| {
        let h = s.header.as_ref();
        (
            h.and_then(|h| h.rank).map_or(u64::MAX, u64::from),
            h.map_or(u32::MAX, |h| h.pid),
        )
    });
    let _ = writeln!(
        o,
        "  {} process{}:",
        procs.len(),
        if procs.len() == 1 { "" } else { "es" }
    );
    for (dir, s) in order {
        let (label, pid, app) = match &s.header {
            Some(h) => (
                rank_label(h).unwrap_or_else(|| "no rank".into()),
                h.pid.to_string(),
                esc(&h.app_name).into_owned(),
            ),
            None => (
                "no header".into(),
                "?".into(),
                esc_path(Path::new(dir.file_name().unwrap_or_default())),
            ),
        };
        let _ = writeln!(
            o,
            "    {label:<18}  pid {pid:<7}  {app}  {} kernels, {} syncs",
            s.kernels, s.syncs
        );
    }
    o.push('\n');
    o
}

/// A session's line in `gpufl record`'s summary: its name, its rank when its header has one, its
/// totals.
pub fn record_line(name: &str, s: &Summary) -> String {
    let rank = s
        .header
        .as_ref()
        .and_then(rank_label)
        .map(|r| format!("{r} · "))
        .unwrap_or_default();
    format!("gpufl:   {}: {rank}{}", esc(name), esc(&s.one_line()))
}

/// What `gpufl info` prints for one session.
#[cfg(test)]
pub fn info_text(dir: &Path) -> Result<String> {
    let (s, h) = load_info(dir, 1)?;
    Ok(info_text_of(dir, &s, &h))
}

/// What `gpufl info` prints for one session, from its totals and headline: the header, then the
/// headline line as `gpufl report` prints it, then the counts the headline does not have.
pub fn info_text_of(dir: &Path, s: &Summary, h: &Headline) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let _ = writeln!(o, "{}", esc_path(dir));
    if let Some(h) = &s.header {
        let _ = writeln!(o, "  command: {}", esc(&h.command_line.join(" ")));
        let _ = writeln!(
            o,
            "  host {}  pid {}  gpufl {}  format v{}",
            esc(&h.host),
            h.pid,
            esc(&h.gpufl_version),
            h.version
        );
        for g in &h.gpus {
            let _ = writeln!(
                o,
                "  GPU {}: {} ({} SMs, sm_{}{}, {:.0} GiB, {})",
                g.index,
                esc(&g.name),
                g.sm_count,
                g.cc_major,
                g.cc_minor,
                g.total_mem_bytes as f64 / (1u64 << 30) as f64,
                esc(&g.uuid)
            );
            if let Some(l) = &g.limits {
                let _ = writeln!(o, "    limits: {}", limits_line(l));
            }
        }
        let drv = h
            .driver_version
            .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
        let _ = writeln!(
            o,
            "  driver {}  CUPTI {}  Python {}",
            drv.as_deref().unwrap_or("?"),
            h.cupti_version
                .map(|v| v.to_string())
                .as_deref()
                .unwrap_or("-"),
            esc(h.python_version.as_deref().unwrap_or("-"))
        );
        let telemetry = h
            .options
            .telemetry_ms
            .map(|ms| format!(" telemetry_ms={ms}"))
            .unwrap_or_default();
        let _ = writeln!(
            o,
            "  options: synchronization={} stack_trace={} api_records={} started_by={}{telemetry}",
            h.options.enable_synchronization,
            h.options.enable_stack_trace,
            esc(&h.options.api_records),
            esc(&h.options.started_by)
        );
    }
    let _ = writeln!(o, "  {}", crate::headline::line(h));
    let _ = writeln!(
        o,
        "  {} syncs with stacks, {} copies, {} memsets{}",
        s.syncs_with_stack,
        s.memcpys,
        s.memsets,
        esc(&s.tail())
    );
    if let (Some(h), Some(a), Some(b)) = (&s.header, s.first_ns, s.last_ns) {
        let _ = writeln!(
            o,
            "  records span {:.3} .. {:.3} (Unix seconds)",
            h.clock.to_unix_ns(a) as f64 / 1e9,
            h.clock.to_unix_ns(b) as f64 / 1e9
        );
    }
    let _ = writeln!(
        o,
        "  summed kernel time {:.3} ms, {} api records",
        s.kernel_ns as f64 / 1e6,
        s.apis
    );
    for w in &s.warnings {
        let _ = writeln!(o, "  warning: {}", esc(w));
    }
    o
}

/// The device limits of `gpufl info`, on one line.
fn limits_line(l: &gpufl_trace::GpuLimits) -> String {
    let kib = |b: u32| format!("{:.0} KiB", b as f64 / 1024.0);
    let mut s = format!(
        "{} threads/block, {} threads/SM, {} blocks/SM, {} regs/SM ({}/block), shared {}/SM \
         {}/block ({} opt-in, {} reserved), warp {}, L2 {:.0} MiB",
        l.max_threads_per_block,
        l.max_threads_per_sm,
        l.max_blocks_per_sm,
        l.regs_per_sm,
        l.regs_per_block,
        kib(l.smem_per_sm),
        kib(l.smem_per_block),
        kib(l.smem_per_block_optin),
        kib(l.smem_reserved_per_block),
        l.warp_size,
        l.l2_bytes as f64 / (1u64 << 20) as f64
    );
    if let Some(bw) = l.mem_bandwidth {
        s += &format!(", memory {:.2} TB/s", bw as f64 / 1e12);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_line_names_the_rank_when_the_header_has_one() {
        let mut s = Summary {
            header: Some(Header {
                rank: Some(1),
                local_rank: Some(0),
                world_size: Some(4),
                ..Header::default()
            }),
            ended: Some("exit".into()),
            ..Summary::default()
        };
        let line = record_line("train-7-20261118T110640Z", &s);
        assert!(
            line.starts_with("gpufl:   train-7-20261118T110640Z: rank 1/4 (local 0) · 0.00 s, "),
            "{line}"
        );
        s.header.as_mut().unwrap().rank = None;
        let line = record_line("a\u{1b}[2J", &s);
        assert!(line.starts_with("gpufl:   a\\u{1b}[2J: 0.00 s, "), "{line}");
    }
}
