//! One-pass totals of a session (the full analysis lives in gpufl-analysis).

use crate::term::{esc, esc_path};
use anyhow::{bail, Result};
use gpufl_trace::{session, Header, ParSessionReader, Record};
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

    /// One line: "12.3 s, 2862 kernels, 55 syncs (3.21 s blocked, 55 with stacks)".
    pub fn one_line(&self) -> String {
        let mut s = format!(
            "{:.2} s, {} kernels, {} syncs ({:.3} s blocked, {} with stacks)",
            self.duration_s(),
            self.kernels,
            self.syncs,
            self.sync_ns as f64 / 1e9,
            self.syncs_with_stack
        );
        if self.memcpys + self.memsets > 0 {
            s += &format!(", {} copies, {} memsets", self.memcpys, self.memsets);
        }
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

/// Read a session and total it.
pub fn summarize(dir: &Path) -> Result<Summary> {
    let mut reader = ParSessionReader::open(dir, gpufl_trace::default_threads())?;
    let mut s = Summary::default();
    for rec in reader.by_ref() {
        match rec {
            Record::Header(h) if s.header.is_none() => s.header = Some(*h),
            Record::Kernel(k) => {
                s.kernels += 1;
                s.kernel_ns += k.end.saturating_sub(k.start);
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
                    s.sync_ns += y.end.saturating_sub(y.start);
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

/// `gpufl info`. Every string from a trace is escaped for the terminal ([`esc`]).
pub fn info(paths: &[PathBuf]) -> Result<i32> {
    for dir in expand_sessions(paths)? {
        crate::term::print(&info_text(&dir)?)?;
    }
    Ok(0)
}

/// What `gpufl info` prints for one session.
pub fn info_text(dir: &Path) -> Result<String> {
    use std::fmt::Write;
    let s = summarize(dir)?;
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
    let _ = writeln!(o, "  {}", esc(&s.one_line()));
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
    Ok(o)
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
