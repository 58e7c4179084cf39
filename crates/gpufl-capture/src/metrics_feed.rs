//! The recorder's side of the node-local metrics feed (`gpufl exporter`): a tally of what the
//! writer thread writes, sent about once a second as one small datagram
//! ([`gpufl_trace::feed::Status`]) to the exporter's Unix socket.
//!
//! - Off the application's threads: the tally is updated by the writer (or the scopes-only
//!   thread) as it writes records — a few integer updates per record — and the datagram is built
//!   and sent on that thread.
//! - Never blocks: one non-blocking `sendto` per target per second; no exporter (no socket, or
//!   nobody behind it) is an immediate error, a full exporter queue drops the datagram. Since
//!   every figure is cumulative, a lost datagram costs only freshness.
//! - Bounded: per-GPU tallies for at most [`feed::MAX_GPUS`] devices, at most [`MAX_LINES`]
//!   distinct sync lines (beyond: `<other>`), [`MAX_CALLS`] CUDA functions of `hostcall` records
//!   (the host time inside them by call), [`MAX_CTX`] contexts; the GPU busy time is a union of
//!   intervals kept exact within [`HORIZON_NS`] of the latest end, in at most [`RECENT`] pieces.
//! - `GPUFL_EXPORTER_FEED=0` turns it off; `GPUFL_EXPORTER_SOCKET` names the one socket to send to
//!   (default: `/tmp/gpufl-<uid>/exporter.sock` and `/run/gpufl/exporter.sock`).

use gpufl_trace::feed::{self, CallStatus, GpuStatus, LineStatus, Status};
use gpufl_trace::{FrameId, Record, StackId, StrId};
use std::collections::{HashMap, VecDeque};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often a datagram goes out.
pub const PERIOD: Duration = Duration::from_secs(1);
/// Distinct sync lines tallied per process.
pub const MAX_LINES: usize = 4096;
/// Distinct CUDA functions tallied for the host time inside them (the hostcall list is a few
/// dozen functions; beyond: `<other>`).
pub const MAX_CALLS: usize = 256;
/// Contexts remembered (context → GPU).
const MAX_CTX: usize = 64;
/// Intervals kept unmerged for the busy-time union.
const RECENT: usize = 64;
/// Records that arrive this much behind the latest end are still merged exactly.
const HORIZON_NS: u64 = 2_000_000_000;

/// Line labels that are not a source line.
pub const NO_STACK: &str = "<no stack>";
pub const DRIVER_INTERNAL: &str = "<driver-internal>";
pub const OTHER: &str = "<other>";

/// Frames that are not the user's code: the built-in excludes of `gpufl report`, as substrings.
const NOT_USER: &[&str] = gpufl_trace::userpaths::NOT_USER_CODE;

/// Whether a frame with this file and module is the user's: it has a source file and neither
/// names a library.
pub fn is_user(file: Option<&str>, module: Option<&str>) -> bool {
    let Some(f) = file else { return false };
    !NOT_USER
        .iter()
        .any(|p| f.contains(p) || module.is_some_and(|m| m.contains(p)))
}

/// `train.py:42` from a path and line.
fn line_label(file: &str, line: Option<u32>) -> String {
    let base = file.rsplit('/').next().unwrap_or(file);
    match line {
        Some(l) => format!("{base}:{l}"),
        None => base.to_string(),
    }
}

/// The union of busy intervals of one GPU: exact for records that arrive out of order by less
/// than [`HORIZON_NS`]; O(1) amortized for records in order.
#[derive(Default, Debug)]
pub struct Union {
    /// Total of the intervals retired from `recent`.
    done: u64,
    /// Everything before this is retired (later records are clipped to it).
    retired_to: u64,
    /// Disjoint, sorted.
    recent: VecDeque<(u64, u64)>,
    max_end: u64,
}

impl Union {
    pub fn add(&mut self, start: u64, end: u64) {
        let start = start.max(self.retired_to);
        if end <= start {
            return;
        }
        self.max_end = self.max_end.max(end);
        // Where it goes: after every interval that ends before it starts (searched from the back:
        // records mostly come in order).
        let mut i = self.recent.len();
        while i > 0 && self.recent[i - 1].1 >= start {
            i -= 1;
        }
        // `recent[i..]` end at or after `start`; merge those that begin at or before `end`.
        let (mut s, mut e) = (start, end);
        while i < self.recent.len() && self.recent[i].0 <= e {
            let (a, b) = self.recent[i];
            s = s.min(a);
            e = e.max(b);
            self.recent.remove(i);
        }
        self.recent.insert(i, (s, e));
        while let Some(&(a, b)) = self.recent.front() {
            if self.recent.len() <= RECENT && b.saturating_add(HORIZON_NS) >= self.max_end {
                break;
            }
            self.done += b - a;
            self.retired_to = b;
            self.recent.pop_front();
        }
    }

    /// Busy nanoseconds so far.
    pub fn total(&self) -> u64 {
        self.done + self.recent.iter().map(|(a, b)| b - a).sum::<u64>()
    }
}

#[derive(Default, Debug)]
struct Gpu {
    dev: u32,
    busy: Union,
    kernels: u64,
    copies: u64,
}

/// The tally and the sender.
pub struct Feed {
    on: bool,
    base: Status,
    started: Instant,
    targets: Vec<PathBuf>,
    sock: Option<UnixDatagram>,
    last_sent: Option<Instant>,
    seq: u64,
    sync_ns: u64,
    syncs: u64,
    scopes: u64,
    gpus: Vec<Gpu>,
    ctx_dev: HashMap<u32, u32>,
    ctx_sync: HashMap<u32, (u64, u64)>,
    /// User frames only: frame → line index.
    frame_line: HashMap<FrameId, u32>,
    stack_line: HashMap<StackId, u32>,
    line_names: Vec<String>,
    line_index: HashMap<String, u32>,
    /// Per line index: (ns, count).
    line_tally: Vec<(u64, u64)>,
    /// CUDA ordinal → UUID, from the session header.
    uuids: Vec<(u32, String)>,
    /// API function names of this trace file: string id → call index.
    call_of: HashMap<StrId, u32>,
    call_names: Vec<String>,
    /// Per call index: (host ns, calls) of its `hostcall` records.
    call_tally: Vec<(u64, u64)>,
    /// (device, live bytes, peak bytes) of the writer's live allocations ([`Feed::set_mem`]).
    mem: Vec<(u32, u64, u64)>,
}

impl Default for Feed {
    fn default() -> Self {
        Feed::off()
    }
}

impl Feed {
    /// A feed that tallies nothing and sends nothing (tests, benchmarks, `GPUFL_EXPORTER_FEED=0`).
    pub fn off() -> Feed {
        Feed {
            on: false,
            base: Status::default(),
            started: Instant::now(),
            targets: Vec::new(),
            sock: None,
            last_sent: None,
            seq: 0,
            sync_ns: 0,
            syncs: 0,
            scopes: 0,
            gpus: Vec::new(),
            ctx_dev: HashMap::new(),
            ctx_sync: HashMap::new(),
            frame_line: HashMap::new(),
            stack_line: HashMap::new(),
            line_names: Vec::new(),
            line_index: HashMap::new(),
            line_tally: Vec::new(),
            uuids: Vec::new(),
            call_of: HashMap::new(),
            call_names: Vec::new(),
            call_tally: Vec::new(),
            mem: Vec::new(),
        }
    }

    /// The feed of this process's session (`app`, `session`: the header's), sending to the targets
    /// the environment names; off when `GPUFL_EXPORTER_FEED=0`.
    pub fn start(app: &str, session: &str) -> Feed {
        let knobs = crate::options::knobs();
        if !knobs.exporter_feed {
            return Feed::off();
        }
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let targets = feed::send_targets(uid, knobs.exporter_socket.as_deref());
        Feed::to(targets, app, session)
    }

    /// A feed sending to `targets`.
    pub fn to(targets: Vec<PathBuf>, app: &str, session: &str) -> Feed {
        let job = &crate::options::knobs().job_id;
        let mut f = Feed::off();
        f.on = true;
        f.targets = targets;
        f.base = Status {
            v: feed::FEED_VERSION,
            pid: std::process::id(),
            app: feed::bounded(app, feed::MAX_LABEL).to_string(),
            job: feed::bounded(job, feed::MAX_LABEL).to_string(),
            session: feed::bounded(session, feed::MAX_LABEL).to_string(),
            ..Status::default()
        };
        f
    }

    /// The session's GPUs (their UUIDs label the per-GPU figures).
    pub fn set_gpus(&mut self, gpus: &[gpufl_trace::Gpu]) {
        self.uuids = gpus.iter().map(|g| (g.index, g.uuid.clone())).collect();
    }

    pub fn is_on(&self) -> bool {
        self.on
    }

    fn line_id(&mut self, label: &str) -> u32 {
        if let Some(&i) = self.line_index.get(label) {
            return i;
        }
        let label = if self.line_names.len() >= MAX_LINES {
            OTHER
        } else {
            label
        };
        if let Some(&i) = self.line_index.get(label) {
            return i;
        }
        let i = self.line_names.len() as u32;
        self.line_names.push(label.to_string());
        self.line_index.insert(label.to_string(), i);
        self.line_tally.push((0, 0));
        i
    }

    /// A frame was interned (writer side, once per distinct frame).
    pub fn note_frame(
        &mut self,
        id: FrameId,
        file: Option<&str>,
        line: Option<u32>,
        module: Option<&str>,
    ) {
        if !self.on || !is_user(file, module) {
            return;
        }
        let label = line_label(file.unwrap_or("?"), line);
        let l = self.line_id(&label);
        self.frame_line.insert(id, l);
    }

    /// A stack was interned: its line is its innermost user frame's.
    pub fn note_stack(&mut self, id: StackId, frames: &[FrameId]) {
        if !self.on {
            return;
        }
        let l = match frames.iter().find_map(|f| self.frame_line.get(f)) {
            Some(&l) => l,
            None => self.line_id(DRIVER_INTERNAL),
        };
        self.stack_line.insert(id, l);
    }

    /// An API function's name was interned (writer side, once per function and trace file).
    pub fn note_call_name(&mut self, id: StrId, name: &str) {
        if !self.on {
            return;
        }
        let name = match self.call_names.iter().position(|n| n == name) {
            Some(i) => i as u32,
            None => {
                let label = if self.call_names.len() >= MAX_CALLS {
                    OTHER
                } else {
                    name
                };
                match self.call_names.iter().position(|n| n == label) {
                    Some(i) => i as u32,
                    None => {
                        self.call_names.push(label.to_string());
                        self.call_tally.push((0, 0));
                        self.call_names.len() as u32 - 1
                    }
                }
            }
        };
        self.call_of.insert(id, name);
    }

    /// The trace's ids start again (a new rolling file): forget frames, stacks and names, keep
    /// tallies.
    pub fn forget_ids(&mut self) {
        self.frame_line.clear();
        self.stack_line.clear();
        self.call_of.clear();
    }

    fn gpu(&mut self, dev: u32) -> Option<&mut Gpu> {
        let i = match self.gpus.iter().position(|g| g.dev == dev) {
            Some(i) => i,
            None if self.gpus.len() < feed::MAX_GPUS => {
                self.gpus.push(Gpu {
                    dev,
                    ..Gpu::default()
                });
                self.gpus.len() - 1
            }
            None => return None,
        };
        self.gpus.get_mut(i)
    }

    fn note_ctx(&mut self, ctx: u32, dev: u32) {
        if self.ctx_dev.len() < MAX_CTX || self.ctx_dev.contains_key(&ctx) {
            self.ctx_dev.insert(ctx, dev);
        }
    }

    /// A record was written.
    pub fn observe(&mut self, rec: &Record) {
        if !self.on {
            return;
        }
        match rec {
            Record::Kernel(k) => {
                self.note_ctx(k.ctx, k.dev);
                if let Some(g) = self.gpu(k.dev) {
                    g.kernels += 1;
                    g.busy.add(k.start, k.end);
                }
            }
            Record::Memcpy(m) => {
                self.note_ctx(m.ctx, m.dev);
                if let Some(g) = self.gpu(m.dev) {
                    g.copies += 1;
                    g.busy.add(m.start, m.end);
                }
            }
            Record::Memset(m) => {
                self.note_ctx(m.ctx, m.dev);
                if let Some(g) = self.gpu(m.dev) {
                    g.copies += 1;
                    g.busy.add(m.start, m.end);
                }
            }
            Record::Sync(s) => {
                let ns = s.end.saturating_sub(s.start);
                self.sync_ns += ns;
                self.syncs += 1;
                if self.ctx_sync.len() < MAX_CTX || self.ctx_sync.contains_key(&s.ctx) {
                    let t = self.ctx_sync.entry(s.ctx).or_default();
                    t.0 += ns;
                    t.1 += 1;
                }
                let l = match s.stack {
                    Some(id) => match self.stack_line.get(&id) {
                        Some(&l) => l,
                        None => self.line_id(DRIVER_INTERNAL),
                    },
                    None => self.line_id(NO_STACK),
                };
                if let Some(t) = self.line_tally.get_mut(l as usize) {
                    t.0 += ns;
                    t.1 += 1;
                }
            }
            Record::Hostcall(h) => {
                let i = match self.call_of.get(&h.name) {
                    Some(&i) => i,
                    None => {
                        // A name the writer did not announce (never expected): by its id.
                        let id = h.name;
                        self.note_call_name(id, &format!("cbid{}", h.cbid));
                        self.call_of.get(&id).copied().unwrap_or(0)
                    }
                };
                if let Some(t) = self.call_tally.get_mut(i as usize) {
                    t.0 += h.end.saturating_sub(h.start);
                    t.1 += 1;
                }
            }
            _ => {}
        }
    }

    /// `n` scope or range records were written.
    pub fn add_scopes(&mut self, n: usize) {
        self.scopes += n as u64;
    }

    /// The datagram as it would be sent now.
    pub fn status(&self, status: &str) -> Status {
        let mut gpus: Vec<GpuStatus> = self
            .gpus
            .iter()
            .map(|g| GpuStatus {
                dev: g.dev,
                uuid: String::new(),
                busy_s: g.busy.total() as f64 / 1e9,
                kernels: g.kernels,
                copies: g.copies,
                sync_s: 0.0,
                syncs: 0,
                mem_bytes: None,
                mem_peak_bytes: None,
            })
            .collect();
        for &(dev, live, peak) in &self.mem {
            if let Some(g) = gpu_row(&mut gpus, dev) {
                g.mem_bytes = Some(live);
                g.mem_peak_bytes = Some(peak);
            }
        }
        for (ctx, &(ns, n)) in &self.ctx_sync {
            let Some(&dev) = self.ctx_dev.get(ctx) else {
                continue;
            };
            if let Some(g) = gpu_row(&mut gpus, dev) {
                g.sync_s += ns as f64 / 1e9;
                g.syncs += n;
            }
        }
        gpus.sort_by_key(|g| g.dev);
        for g in &mut gpus {
            if let Some((_, u)) = self.uuids.iter().find(|(d, _)| *d == g.dev) {
                g.uuid = u.clone();
            }
        }
        // Top lines by time: one pass keeping the best few.
        let mut top: Vec<(u64, u64, usize)> = Vec::with_capacity(feed::TOP_LINES + 1);
        for (i, &(ns, n)) in self.line_tally.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let pos = top
                .iter()
                .position(|&(t, _, _)| ns > t)
                .unwrap_or(top.len());
            if pos < feed::TOP_LINES {
                top.insert(pos, (ns, n, i));
                top.truncate(feed::TOP_LINES);
            }
        }
        // CUDA calls by host time: the longest few.
        let mut calls: Vec<(u64, u64, usize)> = self
            .call_tally
            .iter()
            .enumerate()
            .filter(|(_, t)| t.1 > 0)
            .map(|(i, &(ns, n))| (ns, n, i))
            .collect();
        calls.sort_by(|a, b| b.0.cmp(&a.0).then(a.2.cmp(&b.2)));
        calls.truncate(feed::MAX_CALLS);
        Status {
            hostcalls: calls
                .into_iter()
                .map(|(ns, n, i)| CallStatus {
                    call: self.call_names[i].clone(),
                    blocked_s: ns as f64 / 1e9,
                    calls: n,
                })
                .collect(),
            status: status.to_string(),
            seq: self.seq,
            uptime_s: self.started.elapsed().as_secs_f64(),
            sync_s: self.sync_ns as f64 / 1e9,
            syncs: self.syncs,
            scopes: self.scopes,
            gpus,
            top: top
                .into_iter()
                .map(|(ns, n, i)| LineStatus {
                    line: self.line_names[i].clone(),
                    sync_s: ns as f64 / 1e9,
                    syncs: n,
                })
                .collect(),
            ..self.base.clone()
        }
    }

    /// Each device's live and peak allocated bytes (the writer's [`crate::memcalls::LiveSet`]).
    pub fn set_mem(&mut self, mem: Vec<(u32, u64, u64)>) {
        self.mem = mem;
    }

    /// Send the status if a period has passed since the last (cheap to call on every turn).
    pub fn tick(&mut self, status: &str) {
        if self.due() {
            self.send(status);
        }
    }

    /// Whether [`Feed::tick`] would send now.
    pub fn due(&self) -> bool {
        self.on && self.last_sent.is_none_or(|t| t.elapsed() >= PERIOD)
    }

    /// Send the status now (the last one: `ended`).
    pub fn send(&mut self, status: &str) {
        if !self.on {
            return;
        }
        self.last_sent = Some(Instant::now());
        if self.sock.is_none() {
            match UnixDatagram::unbound().and_then(|s| s.set_nonblocking(true).map(|_| s)) {
                Ok(s) => self.sock = Some(s),
                Err(_) => {
                    self.on = false;
                    return;
                }
            }
        }
        let bytes = self.status(status).encode();
        self.seq += 1;
        if let Some(sock) = &self.sock {
            for t in &self.targets {
                // No exporter, or a full queue: dropped (the next datagram carries the totals).
                let _ = sock.send_to(&bytes, t);
            }
        }
    }
}

/// The row of GPU `dev`, added when missing (at most [`feed::MAX_GPUS`] rows: None beyond).
fn gpu_row(gpus: &mut Vec<GpuStatus>, dev: u32) -> Option<&mut GpuStatus> {
    let i = match gpus.iter().position(|g| g.dev == dev) {
        Some(i) => i,
        None if gpus.len() < feed::MAX_GPUS => {
            gpus.push(GpuStatus {
                dev,
                ..GpuStatus::default()
            });
            gpus.len() - 1
        }
        None => return None,
    };
    gpus.get_mut(i)
}

// ---------------------------------------------------------------------------------------------
// The recorder's hooks (writer thread)
// ---------------------------------------------------------------------------------------------

impl crate::sink::Sink {
    /// Turn the exporter feed on for this session.
    pub fn with_feed(mut self, header: &gpufl_trace::Header) -> Self {
        self.feed = Feed::start(&header.app_name, &header.session_id);
        self.feed.set_gpus(&header.gpus);
        self
    }
}

/// The writer thread's turn: send the status when due (`recording` or `paused`).
pub fn tick(sink: Option<&mut crate::sink::Sink>) {
    if let Some(s) = sink {
        let status = if crate::collection::is_paused() {
            "paused"
        } else {
            "recording"
        };
        if s.feed.due() && s.mems > 0 {
            s.feed.set_mem(s.live.by_device());
        }
        s.feed.tick(status);
    }
}

/// The session ends: the last status (`ended`), after everything was written.
pub fn before_end(s: &mut crate::sink::Sink) {
    if s.feed.is_on() && s.mems > 0 {
        s.feed.set_mem(s.live.by_device());
    }
    s.feed.send("ended");
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufl_trace::{Kernel, Sync};

    #[test]
    fn union_counts_overlaps_once_in_and_out_of_order() {
        let mut u = Union::default();
        u.add(0, 10);
        u.add(5, 15); // overlaps
        u.add(20, 30);
        u.add(16, 18); // out of order, disjoint
        u.add(17, 21); // bridges two
        assert_eq!(u.total(), 15 + 14); // [0,15] [16,30]
        assert_eq!(u.recent.len(), 2);
        u.add(100, 100); // empty
        assert_eq!(u.total(), 29);
    }

    #[test]
    fn union_stays_bounded_and_exact_for_ordered_gaps() {
        let mut u = Union::default();
        for i in 0..10_000u64 {
            u.add(i * 10, i * 10 + 4);
        }
        assert!(u.recent.len() <= RECENT);
        assert_eq!(u.total(), 40_000);
        // Far behind the horizon: clipped to what was retired, never counted twice.
        u.add(0, 8);
        assert_eq!(u.total(), 40_000);
    }

    fn kernel(dev: u32, ctx: u32, start: u64, end: u64) -> Record {
        Record::Kernel(Kernel {
            dev,
            ctx,
            start,
            end,
            ..Kernel::default()
        })
    }

    fn sync(ctx: u32, start: u64, end: u64, stack: Option<StackId>) -> Record {
        Record::Sync(Sync {
            ctx,
            start,
            end,
            stack,
            ..Sync::default()
        })
    }

    #[test]
    fn tallies_syncs_per_gpu_and_line() {
        let mut f = Feed::to(Vec::new(), "train", "train-1-x");
        // Frames: a torch frame (not user), the user's line, the user's outer line.
        f.note_frame(
            FrameId(1),
            Some("/venv/lib/python3.12/site-packages/torch/_tensor.py"),
            Some(10),
            None,
        );
        f.note_frame(FrameId(2), Some("/home/u/train.py"), Some(42), None);
        f.note_frame(FrameId(3), Some("/home/u/train.py"), Some(7), None);
        f.note_frame(
            FrameId(4),
            Some("cuda_runtime.cpp"),
            Some(1),
            Some("/usr/lib/libcudart.so.12"),
        );
        f.note_stack(
            StackId(1),
            &[FrameId(4), FrameId(1), FrameId(2), FrameId(3)],
        );
        f.note_stack(StackId(2), &[FrameId(4), FrameId(3)]);
        f.note_stack(StackId(3), &[FrameId(4), FrameId(1)]);
        f.observe(&kernel(1, 9, 0, 1_000_000_000));
        f.observe(&kernel(1, 9, 500_000_000, 1_500_000_000));
        for _ in 0..3 {
            f.observe(&sync(9, 0, 200_000_000, Some(StackId(1))));
        }
        f.observe(&sync(9, 0, 100_000_000, Some(StackId(2))));
        f.observe(&sync(9, 0, 50_000_000, Some(StackId(3))));
        f.observe(&sync(77, 0, 10_000_000, None)); // unknown context: no GPU
        f.add_scopes(5);
        let s = f.status("recording");
        assert_eq!(s.syncs, 6);
        assert!((s.sync_s - 0.76).abs() < 1e-9);
        assert_eq!(s.scopes, 5);
        assert_eq!(s.gpus.len(), 1);
        let g = &s.gpus[0];
        assert_eq!((g.dev, g.kernels, g.syncs), (1, 2, 5));
        assert!((g.busy_s - 1.5).abs() < 1e-9);
        assert!((g.sync_s - 0.75).abs() < 1e-9);
        let lines: Vec<(&str, u64)> = s.top.iter().map(|l| (l.line.as_str(), l.syncs)).collect();
        assert_eq!(
            lines,
            [("train.py:42", 3), ("train.py:7", 1), (DRIVER_INTERNAL, 1)]
        );
        assert!((s.top[0].sync_s - 0.6).abs() < 1e-9);
        assert_eq!((s.pid, s.app.as_str()), (std::process::id(), "train"));
    }

    #[test]
    fn tallies_host_time_by_call() {
        let mut f = Feed::to(Vec::new(), "a", "s");
        f.note_call_name(StrId(4), "cudaFree");
        f.note_call_name(StrId(9), "cudaMalloc");
        let hc = |name: u32, start: u64, end: u64| {
            Record::Hostcall(gpufl_trace::Hostcall {
                name: StrId(name),
                start,
                end,
                ..gpufl_trace::Hostcall::default()
            })
        };
        for _ in 0..3 {
            f.observe(&hc(4, 0, 500_000_000));
        }
        f.observe(&hc(9, 0, 100_000_000));
        // A new trace file: ids start again, tallies stay.
        f.forget_ids();
        f.note_call_name(StrId(0), "cudaMalloc");
        f.observe(&hc(0, 0, 100_000_000));
        let s = f.status("recording");
        let got: Vec<(&str, u64)> = s
            .hostcalls
            .iter()
            .map(|c| (c.call.as_str(), c.calls))
            .collect();
        assert_eq!(got, [("cudaFree", 3), ("cudaMalloc", 2)]);
        assert!((s.hostcalls[0].blocked_s - 1.5).abs() < 1e-9);
        assert!((s.hostcalls[1].blocked_s - 0.2).abs() < 1e-9);
        for i in 0..(MAX_CALLS as u32 + 5) {
            f.note_call_name(StrId(100 + i), &format!("cuFn{i}"));
        }
        assert_eq!(f.call_names.len(), MAX_CALLS + 1);
        assert_eq!(f.call_names.last().map(String::as_str), Some(OTHER));
    }

    #[test]
    fn memory_per_gpu_from_the_live_set() {
        let mut f = Feed::to(Vec::new(), "a", "s");
        f.observe(&kernel(1, 9, 0, 10));
        let s = f.status("recording");
        assert_eq!(
            (s.gpus[0].mem_bytes, s.gpus[0].mem_peak_bytes),
            (None, None)
        );
        // A GPU that only allocated still gets its row.
        f.set_mem(vec![(1, 100, 200), (3, 5, 7)]);
        let s = f.status("recording");
        let got: Vec<_> = s
            .gpus
            .iter()
            .map(|g| (g.dev, g.kernels, g.mem_bytes, g.mem_peak_bytes))
            .collect();
        assert_eq!(
            got,
            [(1, 1, Some(100), Some(200)), (3, 0, Some(5), Some(7))]
        );
        let back = Status::decode(&s.encode()).unwrap();
        assert_eq!(back.gpus[1].mem_peak_bytes, Some(7));
    }

    #[test]
    fn lines_are_bounded() {
        let mut f = Feed::to(Vec::new(), "a", "s");
        for i in 0..(MAX_LINES as u32 + 100) {
            f.note_frame(FrameId(i), Some("x.py"), Some(i), None);
        }
        assert_eq!(f.line_names.len(), MAX_LINES + 1);
        assert_eq!(f.line_names.last().map(String::as_str), Some(OTHER));
    }

    #[test]
    fn off_feed_tallies_nothing() {
        let mut f = Feed::off();
        f.observe(&kernel(0, 1, 0, 10));
        f.send("recording");
        assert!(f.gpus.is_empty() && f.sock.is_none());
    }

    #[test]
    fn sends_datagrams_to_a_listening_socket_and_never_blocks_without_one() {
        let dir = std::env::temp_dir().join(format!("gpufl-feed-test-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("s.sock");
        let _ = std::fs::remove_file(&path);
        let missing = dir.join("nobody.sock");
        let rx = UnixDatagram::bind(&path).unwrap();
        let mut f = Feed::to(vec![missing, path.clone()], "app", "sess");
        f.observe(&sync(1, 0, 1_000, None));
        f.tick("recording");
        f.tick("recording"); // within the period: nothing
        f.send("ended");
        let mut buf = vec![0u8; feed::MAX_DATAGRAM];
        let n = rx.recv(&mut buf).unwrap();
        let first = Status::decode(&buf[..n]).unwrap();
        assert_eq!((first.seq, first.status.as_str()), (0, "recording"));
        assert_eq!(first.top[0].line, NO_STACK);
        let n = rx.recv(&mut buf).unwrap();
        let last = Status::decode(&buf[..n]).unwrap();
        assert_eq!((last.seq, last.status.as_str()), (1, "ended"));
        rx.set_nonblocking(true).unwrap();
        assert!(rx.recv(&mut buf).is_err(), "only two datagrams");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn user_frames() {
        assert!(is_user(Some("/home/u/train.py"), None));
        assert!(is_user(
            Some("/src/app/main.cu"),
            Some("/src/app/build/app")
        ));
        assert!(!is_user(None, Some("/home/u/app")));
        assert!(!is_user(Some("/usr/lib/python3.12/threading.py"), None));
        assert!(!is_user(Some("<frozen runpy>"), None));
        assert!(!is_user(
            Some("x.cpp"),
            Some("/opt/torch/lib/libtorch_cuda.so")
        ));
    }
}
