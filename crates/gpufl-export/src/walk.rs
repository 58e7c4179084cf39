//! Second pass over a session: every record streamed to a [`Sink`] as tracks, slices, instants,
//! flows and counters. Memory is bounded whatever the session's size: the state kept is the
//! interning tables of the reader (as every gpufl command), the open scopes of each thread (at
//! most [`MAX_DEPTH`] per thread, [`MAX_THREADS`] threads), the thread and stream sets (capped,
//! the rest going to one "other" track), the first pass's flow bits and the allocations live
//! (`mem` records: address, bytes, line; see [`mem`]).

use crate::links::{End, Links};
use crate::scan::{Clock, Scan};
use crate::sink::{Arg, Cat, Event, Metric, Sink, Track};
use crate::{ExportError, Options};
use gpufl_analysis::frames::{first_shown_frame, FrameParts};
use gpufl_analysis::userframe::FrameFilter;
use gpufl_trace::{HostState, ParSessionReader, Record, StackId, Symbols};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::Path;

#[path = "walk_mem.rs"]
mod mem;

/// Host threads with their own track per session; further threads share "other threads".
pub const MAX_THREADS: usize = 4096;
/// GPU streams with their own track per session.
pub const MAX_STREAMS: usize = 4096;
/// Open scopes kept per thread (deeper ones are counted, not shown).
pub const MAX_DEPTH: usize = 256;
/// Frames of a stack given as an argument.
pub const MAX_FRAMES: usize = 256;

/// What the second pass wrote.
#[derive(Default, Debug, Clone)]
pub struct WalkStats {
    pub events: u64,
    pub flows: u64,
    pub counters: u64,
    /// Scopes never closed, ended at the session's last time.
    pub unclosed_scopes: u64,
    /// Scope closes without an open scope, or past the depth cap.
    pub lost_scopes: u64,
}

#[derive(Default)]
struct ThreadScopes {
    open: Vec<(String, u64)>,
    deeper: u64,
}

/// A flow id unique in the export: session number and correlation id.
pub fn flow_id(sess: u32, corr: u32) -> u64 {
    ((sess as u64 + 1) << 32) | corr as u64
}

/// An enumeration's trace-format spelling.
fn spelling<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => "unknown".into(),
    }
}

struct Walker<'a> {
    sess: u32,
    sink: &'a mut dyn Sink,
    clock: Clock,
    /// The current file's start (Unix ns): an allocation carried into it from a deleted file is
    /// shown there.
    file_start: u64,
    sym: Symbols,
    threads: HashSet<u64>,
    streams: HashSet<(u32, u32)>,
    scopes: HashMap<u64, ThreadScopes>,
    /// Per thread with a host-samples track: where its last sample's slice ended.
    sampled_to: HashMap<u64, u64>,
    /// Which frames are the user's (a host sample is named by its innermost one).
    filter: &'a FrameFilter,
    /// Every frame of a stack written, not from the first shown one.
    all_frames: bool,
    stats: WalkStats,
    /// The allocations live (`mem` records) and each device's live bytes.
    mem: mem::LiveMem,
}

impl Walker<'_> {
    fn thread(&mut self, tid: Option<u64>) -> Track {
        let Some(tid) = tid else {
            return Track::OtherThreads;
        };
        if self.threads.contains(&tid) {
            return Track::Thread(tid);
        }
        if self.threads.len() < MAX_THREADS {
            self.threads.insert(tid);
            return Track::Thread(tid);
        }
        Track::OtherThreads
    }

    fn stream(&mut self, dev: u32, stream: u32) -> Track {
        if self.streams.contains(&(dev, stream)) || self.streams.len() < MAX_STREAMS {
            self.streams.insert((dev, stream));
            return Track::Stream { dev, stream };
        }
        Track::OtherStreams
    }

    /// A stack's frames described, innermost first, from the first shown one
    /// ([`first_shown_frame`]: not the recorder's, CUPTI's, the driver's nor the runtime's
    /// internals) unless every frame is asked for; at most [`MAX_FRAMES`].
    fn stack(&self, id: StackId) -> Vec<String> {
        match self.sym.stack(id) {
            Some(frames) => frames
                .iter()
                .skip(if self.all_frames {
                    0
                } else {
                    first_shown_frame(frames.iter().map(|&f| match self.sym.frame(f) {
                        Some(fr) => FrameParts::of_record(fr, &self.sym),
                        None => FrameParts::default(),
                    }))
                })
                .take(MAX_FRAMES)
                .map(|&f| self.sym.describe_frame(f))
                .collect(),
            None => vec![format!("<unknown stack {}>", id.0)],
        }
    }

    fn emit(&mut self, e: &Event) -> Result<(), ExportError> {
        self.stats.events += 1;
        if e.flow_in.is_some() {
            self.stats.flows += 1;
        }
        self.sink.event(self.sess, e)?;
        Ok(())
    }

    fn slice(&self, start: u64, end: u64) -> (u64, u64) {
        let a = self.clock.unix(start);
        (a, self.clock.unix(end.max(start)).saturating_sub(a))
    }

    fn gpu_flow(&mut self, links: &mut Links, corr: u32) -> Option<u64> {
        (links.take_gpu(corr) == End::Target).then(|| flow_id(self.sess, corr))
    }

    /// One record: its event(s) to the sink; interning records fill the symbol tables.
    fn record(&mut self, rec: Record, scan: &mut Scan) -> Result<(), ExportError> {
        if self.sym.observe(&rec) {
            return Ok(());
        }
        match rec {
            Record::Header(h) => {
                self.clock = Clock::from_header(&h);
                self.file_start = h.start_unix_ns;
            }
            Record::Kernel(k) => self.kernel(&k, &mut scan.links)?,
            Record::Memcpy(c) => self.memcpy(&c, &mut scan.links)?,
            Record::Memset(s) => self.memset(&s, &mut scan.links)?,
            Record::Sync(s) => self.sync(&s)?,
            Record::Api(a) => self.api(&a, &mut scan.links)?,
            Record::Hostcall(h) => self.hostcall(&h)?,
            Record::Hsample(h) => self.hsample(&h)?,
            Record::Callsite(c) => self.callsite(&c, &mut scan.links)?,
            Record::Scope(s) => self.scope(&s)?,
            Record::Range(r) => self.range(&r)?,
            Record::Window(w) => self.window(&w)?,
            Record::Capture(c) => self.capture(&c)?,
            Record::Telemetry(t) => self.telemetry(&t)?,
            Record::Mem(m) => self.mem(&m)?,
            _ => {}
        }
        Ok(())
    }

    /// A kernel: a slice on its stream, the end of its launch's flow.
    fn kernel(&mut self, k: &gpufl_trace::Kernel, links: &mut Links) -> Result<(), ExportError> {
        let (ts, dur) = self.slice(k.start, k.end);
        let track = self.stream(k.dev, k.stream);
        let flow_in = self.gpu_flow(links, k.corr);
        let grid = format!("{}×{}×{}", k.grid[0], k.grid[1], k.grid[2]);
        let block = format!("{}×{}×{}", k.block[0], k.block[1], k.block[2]);
        let name = self.sym.str(k.name).to_string();
        let mut args = vec![
            ("corr", Arg::U(k.corr as u64)),
            ("grid", Arg::S(&grid)),
            ("block", Arg::S(&block)),
            ("regs", Arg::U(k.regs as u64)),
            (
                "smem",
                Arg::U(k.smem_static.max(0) as u64 + k.smem_dynamic.max(0) as u64),
            ),
            ("local_mem", Arg::U(k.local_mem as u64)),
        ];
        graph_args(&mut args, k.graph);
        self.emit(&Event {
            track,
            ts,
            dur: Some(dur),
            name: &name,
            cat: Cat::Kernel,
            args: &args,
            flow_out: None,
            flow_in,
        })?;
        Ok(())
    }

    /// A copy: a slice on its stream, the end of its launch's flow.
    fn memcpy(&mut self, c: &gpufl_trace::Memcpy, links: &mut Links) -> Result<(), ExportError> {
        let (ts, dur) = self.slice(c.start, c.end);
        let track = self.stream(c.dev, c.stream);
        let flow_in = self.gpu_flow(links, c.corr);
        let kind = spelling(&c.kind);
        let name = format!("memcpy {kind}");
        let (src, dst) = (spelling(&c.src_kind), spelling(&c.dst_kind));
        let mut args = vec![
            ("corr", Arg::U(c.corr as u64)),
            ("bytes", Arg::U(c.bytes)),
            ("src_kind", Arg::S(&src)),
            ("dst_kind", Arg::S(&dst)),
        ];
        graph_args(&mut args, c.graph);
        self.emit(&Event {
            track,
            ts,
            dur: Some(dur),
            name: &name,
            cat: Cat::Memcpy,
            args: &args,
            flow_out: None,
            flow_in,
        })?;
        Ok(())
    }

    /// A memset: a slice on its stream, the end of its launch's flow.
    fn memset(&mut self, s: &gpufl_trace::Memset, links: &mut Links) -> Result<(), ExportError> {
        let (ts, dur) = self.slice(s.start, s.end);
        let track = self.stream(s.dev, s.stream);
        let flow_in = self.gpu_flow(links, s.corr);
        let kind = spelling(&s.mem_kind);
        let mut args = vec![
            ("corr", Arg::U(s.corr as u64)),
            ("bytes", Arg::U(s.bytes)),
            ("value", Arg::U(s.value as u64)),
            ("mem_kind", Arg::S(&kind)),
        ];
        graph_args(&mut args, s.graph);
        self.emit(&Event {
            track,
            ts,
            dur: Some(dur),
            name: "memset",
            cat: Cat::Memset,
            args: &args,
            flow_out: None,
            flow_in,
        })?;
        Ok(())
    }

    /// A synchronization: a slice on its thread, with its stack.
    fn sync(&mut self, s: &gpufl_trace::Sync) -> Result<(), ExportError> {
        let (ts, dur) = self.slice(s.start, s.end);
        let track = self.thread(s.tid);
        let kind = spelling(&s.kind);
        let name = format!("sync {kind}");
        let stack = s.stack.map(|id| self.stack(id)).unwrap_or_default();
        let mut args = vec![("corr", Arg::U(s.corr as u64)), ("kind", Arg::S(&kind))];
        if let Some(st) = s.stream {
            args.push(("stream", Arg::U(st as u64)));
        }
        if s.stack.is_some() {
            args.push(("stack", Arg::List(&stack)));
        }
        self.emit(&Event {
            track,
            ts,
            dur: Some(dur),
            name: &name,
            cat: Cat::Sync,
            args: &args,
            flow_out: None,
            flow_in: None,
        })?;
        Ok(())
    }

    /// A CUDA API call: a slice on its thread, the start of a flow to its GPU work.
    fn api(&mut self, a: &gpufl_trace::Api, links: &mut Links) -> Result<(), ExportError> {
        let (ts, dur) = self.slice(a.start, a.end);
        let track = self.thread(Some(a.tid));
        let flow_out = (links.take_api(a.corr) == End::Source).then(|| flow_id(self.sess, a.corr));
        let name = self.sym.str(a.name).to_string();
        let domain = spelling(&a.domain);
        let args = [
            ("corr", Arg::U(a.corr as u64)),
            ("domain", Arg::S(&domain)),
            ("cbid", Arg::U(a.cbid as u64)),
            ("ret", Arg::U(a.ret as u64)),
        ];
        self.emit(&Event {
            track,
            ts,
            dur: Some(dur),
            name: &name,
            cat: Cat::Api,
            args: &args,
            flow_out,
            flow_in: None,
        })?;
        Ok(())
    }

    /// A CUDA call that held its thread (`hostcall`): a slice on the thread, with its stack.
    fn hostcall(&mut self, h: &gpufl_trace::Hostcall) -> Result<(), ExportError> {
        let (ts, dur) = self.slice(h.start, h.end);
        let track = self.thread(Some(h.tid));
        let name = self.sym.str(h.name).to_string();
        let domain = spelling(&h.domain);
        let stack = h.stack.map(|id| self.stack(id)).unwrap_or_default();
        let mut args = vec![
            ("corr", Arg::U(h.corr as u64)),
            ("domain", Arg::S(&domain)),
            ("cbid", Arg::U(h.cbid as u64)),
        ];
        if let Some(b) = h.bytes {
            args.push(("bytes", Arg::U(b)));
        }
        if h.ret != 0 {
            args.push(("ret", Arg::U(h.ret as u64)));
        }
        if h.stack.is_some() {
            args.push(("stack", Arg::List(&stack)));
        }
        self.emit(&Event {
            track,
            ts,
            dur: Some(dur),
            name: &name,
            cat: Cat::Hostcall,
            args: &args,
            flow_out: None,
            flow_in: None,
        })?;
        Ok(())
    }

    /// The innermost user frame of a stack as `file:line` (the file's last component), else
    /// the innermost frame with a file.
    fn top_line(&self, id: StackId) -> Option<String> {
        let frames = self.sym.stack(id)?;
        let label = |f: &gpufl_trace::Frame| {
            let file = self.sym.opt_str(f.file)?;
            let base = file.rsplit('/').next().unwrap_or(file);
            Some(match f.line {
                Some(l) => format!("{base}:{l}"),
                None => base.to_string(),
            })
        };
        let all = || frames.iter().filter_map(|&f| self.sym.frame(f));
        all()
            .filter(|f| {
                self.filter
                    .is_user(self.sym.opt_str(f.file), self.sym.opt_str(f.module))
            })
            .find_map(label)
            .or_else(|| all().find_map(label))
    }

    /// A host sample: a slice on the thread's host-samples track, from the sample's period
    /// before it (clipped to the thread's previous sample) to the sample, named by the thread's
    /// state (the CUDA call it was in) and its innermost user line; the whole stack as an
    /// argument. Threads past the cap: an instant on "other threads".
    fn hsample(&mut self, h: &gpufl_trace::Hsample) -> Result<(), ExportError> {
        let call = h.call.map(|c| self.sym.str(c).to_string());
        let state = spelling(&h.state);
        let mut name = match (&call, h.state) {
            (Some(c), _) => format!("in {c}"),
            (None, HostState::Idle) => "idle-waiting".to_string(),
            (None, s) => s.display_name().to_string(),
        };
        if let Some(l) = h.stack.and_then(|id| self.top_line(id)) {
            name = format!("{name} @ {l}");
        }
        let stack = h.stack.map(|id| self.stack(id)).unwrap_or_default();
        let mut args = vec![
            ("state", Arg::S(&state)),
            ("period_ns", Arg::U(h.period_ns)),
        ];
        if let Some(c) = &call {
            args.push(("call", Arg::S(c)));
        }
        if h.stack.is_some() {
            args.push(("stack", Arg::List(&stack)));
        }
        let (track, ts, dur) = match self.thread(Some(h.tid)) {
            Track::Thread(tid) => {
                let last = self.sampled_to.entry(tid).or_insert(0);
                // Out of order (never expected): a point at the sample.
                let start = if h.ts >= *last {
                    h.ts.saturating_sub(h.period_ns).max(*last)
                } else {
                    h.ts
                };
                *last = (*last).max(h.ts);
                let (ts, dur) = self.slice(start, h.ts);
                (Track::HostSamples(tid), ts, Some(dur))
            }
            other => (other, self.clock.unix(h.ts), None),
        };
        self.emit(&Event {
            track,
            ts,
            dur,
            name: &name,
            cat: Cat::Hsample,
            args: &args,
            flow_out: None,
            flow_in: None,
        })?;
        Ok(())
    }

    /// A launch call site: an instant on its thread with its stack, the start of a flow to its GPU
    /// work.
    fn callsite(
        &mut self,
        c: &gpufl_trace::Callsite,
        links: &mut Links,
    ) -> Result<(), ExportError> {
        let ts = self.clock.unix(c.ts);
        let track = self.thread(Some(c.tid));
        let flow_out = (links.take_site(c.corr) == End::Source).then(|| flow_id(self.sess, c.corr));
        let name = format!("launch site: {}", self.sym.str(c.api));
        let stack = self.stack(c.stack);
        let args = [
            ("corr", Arg::U(c.corr as u64)),
            ("weight", Arg::U(c.weight.unwrap_or(1))),
            ("stack", Arg::List(&stack)),
        ];
        self.emit(&Event {
            track,
            ts,
            dur: Some(0),
            name: &name,
            cat: Cat::Callsite,
            args: &args,
            flow_out,
            flow_in: None,
        })?;
        Ok(())
    }

    /// A scope's open or close: a close makes the slice of the scope it ends, on its thread (opens
    /// kept per thread up to [`MAX_DEPTH`], threads up to [`MAX_THREADS`]).
    fn scope(&mut self, s: &gpufl_trace::Scope) -> Result<(), ExportError> {
        let ts = self.clock.unix(s.ts);
        if !self.scopes.contains_key(&s.tid) && self.scopes.len() >= MAX_THREADS {
            self.stats.lost_scopes += 1;
            return Ok(());
        }
        let th = self.scopes.entry(s.tid).or_default();
        if !s.end {
            if th.open.len() < MAX_DEPTH {
                th.open.push((self.sym.str(s.name).to_string(), ts));
            } else {
                th.deeper += 1;
            }
        } else if th.deeper > 0 {
            th.deeper -= 1;
            self.stats.lost_scopes += 1;
        } else if let Some((name, start)) = th.open.pop() {
            let source = spelling(&s.source);
            let depth = th.open.len() as u64;
            let track = self.thread(Some(s.tid));
            let args = [("source", Arg::S(&source)), ("depth", Arg::U(depth))];
            self.emit(&Event {
                track,
                ts: start,
                dur: Some(ts.saturating_sub(start)),
                name: &name,
                cat: Cat::Scope,
                args: &args,
                flow_out: None,
                flow_in: None,
            })?;
        } else {
            self.stats.lost_scopes += 1;
        }
        Ok(())
    }

    /// An NVTX start/end range: a slice on the ranges track.
    fn range(&mut self, r: &gpufl_trace::Range) -> Result<(), ExportError> {
        let (ts, dur) = self.slice(r.start, r.end);
        let name = self.sym.str(r.name).to_string();
        let mut args = vec![("id", Arg::U(r.id)), ("tid", Arg::U(r.tid))];
        if let Some(t) = r.end_tid {
            args.push(("end_tid", Arg::U(t)));
        }
        self.emit(&Event {
            track: Track::Ranges,
            ts,
            dur: Some(dur),
            name: &name,
            cat: Cat::Range,
            args: &args,
            flow_out: None,
            flow_in: None,
        })?;
        Ok(())
    }

    /// An always-on window: a slice on the capture track.
    fn window(&mut self, w: &gpufl_trace::Window) -> Result<(), ExportError> {
        let (ts, dur) = self.slice(w.start, w.end);
        let name = format!("window ({})", w.reason);
        self.emit(&Event {
            track: Track::Capture,
            ts,
            dur: Some(dur),
            name: &name,
            cat: Cat::Capture,
            args: &[],
            flow_out: None,
            flow_in: None,
        })?;
        Ok(())
    }

    /// Recording paused or resumed: an instant on the capture track.
    fn capture(&mut self, c: &gpufl_trace::CaptureState) -> Result<(), ExportError> {
        let ts = self.clock.unix(c.ts);
        let name = if c.recording {
            "recording resumed"
        } else {
            "recording paused"
        };
        self.emit(&Event {
            track: Track::Capture,
            ts,
            dur: None,
            name,
            cat: Cat::Capture,
            args: &[],
            flow_out: None,
            flow_in: None,
        })?;
        Ok(())
    }

    /// A telemetry sample: one counter per metric it has.
    fn telemetry(&mut self, t: &gpufl_trace::Telemetry) -> Result<(), ExportError> {
        let ts = self.clock.unix(t.ts);
        let samples = [
            (Metric::GpuUtil, t.gpu_util.map(f64::from)),
            (Metric::MemUtil, t.mem_util.map(f64::from)),
            (Metric::MemUsed, t.mem_used.map(|v| v as f64)),
            (Metric::Temp, t.temp_c.map(f64::from)),
            (Metric::Power, t.power_mw.map(|v| v as f64 / 1000.0)),
            (Metric::SmClock, t.sm_mhz.map(f64::from)),
            (Metric::MemClock, t.mem_mhz.map(f64::from)),
            (Metric::PcieTx, t.pcie_tx_kbs.map(|v| v as f64)),
            (Metric::PcieRx, t.pcie_rx_kbs.map(|v| v as f64)),
        ];
        for (m, v) in samples {
            if let Some(v) = v {
                self.stats.counters += 1;
                self.sink.counter(self.sess, t.dev, m, ts, v)?;
            }
        }
        Ok(())
    }

    /// Scopes still open end at the session's last time.
    fn close_scopes(&mut self, end: u64) -> Result<(), ExportError> {
        let mut open: Vec<(u64, String, u64, u64)> = Vec::new();
        for (&tid, th) in &mut self.scopes {
            while let Some((name, start)) = th.open.pop() {
                open.push((tid, name, start, th.open.len() as u64));
            }
        }
        open.sort_by_key(|a| (a.0, a.2));
        for (tid, name, start, depth) in open {
            self.stats.unclosed_scopes += 1;
            let track = self.thread(Some(tid));
            let args = [("depth", Arg::U(depth)), ("unclosed", Arg::U(1))];
            self.emit(&Event {
                track,
                ts: start,
                dur: Some(end.saturating_sub(start)),
                name: &name,
                cat: Cat::Scope,
                args: &args,
                flow_out: None,
                flow_in: None,
            })?;
        }
        Ok(())
    }

    fn insights(&mut self, scan: &Scan) -> Result<(), ExportError> {
        let t0 = scan.range.map_or(0, |r| r.0);
        for (rank, i) in scan.insights.iter().enumerate() {
            let sev = spelling(&i.severity).to_uppercase();
            let name = format!("{sev} {}", i.title);
            let mut loc = i.location.short();
            if let Some(f) = &i.location.function {
                loc = format!("{loc} in {f}");
            }
            let args = [
                ("rank", Arg::U(rank as u64 + 1)),
                ("rule", Arg::S(i.rule)),
                ("severity", Arg::S(&sev)),
                ("location", Arg::S(&loc)),
                ("detail", Arg::S(&i.detail)),
                ("fix", Arg::S(&i.fix)),
                ("count", Arg::U(i.count)),
                ("impact_ns", Arg::U(i.impact_ns)),
                ("share_of_wall", Arg::F(i.share_of_wall)),
            ];
            self.emit(&Event {
                track: Track::Insights,
                ts: t0,
                dur: None,
                name: &name,
                cat: Cat::Insight,
                args: &args,
                flow_out: None,
                flow_in: None,
            })?;
        }
        Ok(())
    }
}

/// Pass 2 over `dir`, session number `sess` of the export.
pub fn walk(
    dir: &Path,
    scan: &mut Scan,
    sess: u32,
    sink: &mut dyn Sink,
    opts: &Options,
) -> Result<WalkStats, ExportError> {
    let reader = ParSessionReader::open(dir, opts.threads)?;
    let mut w = Walker {
        sess,
        sink,
        clock: Clock::default(),
        file_start: 0,
        sym: Symbols::default(),
        threads: HashSet::new(),
        streams: HashSet::new(),
        scopes: HashMap::new(),
        sampled_to: HashMap::new(),
        filter: &opts.config.filter,
        all_frames: opts.all_frames,
        stats: WalkStats::default(),
        mem: mem::LiveMem::default(),
    };
    w.insights(scan)?;
    for rec in reader {
        w.record(rec, scan)?;
    }
    let end = scan.range.map_or(0, |r| r.1);
    w.close_scopes(end)?;
    Ok(w.stats)
}

/// The CUDA graph node of GPU work a graph launch ran, as two arguments.
fn graph_args(args: &mut Vec<(&str, Arg)>, g: Option<gpufl_trace::GraphNode>) {
    if let Some(g) = g {
        args.push(("graph", Arg::U(g.0 as u64)));
        args.push(("graph_node", Arg::U(g.1)));
    }
}
