//! The writer thread's side: turns activity buffers and stack samples into trace records.
//!
//! Everything slow happens here, off the application's threads: decoding, kernel-name demangling,
//! symbolization (once per distinct address), stack interning, the correlation join that attaches
//! a stack to its `sync` record, compression and file I/O.

use crate::activity::{self, Decoded};
use crate::cupti::{self, Cupti};
use crate::stack::{self, Sample, PY_TAG};
use crate::symbolize::Symbolizer;
use gpufl_trace::*;
use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::fs::File;
use std::io::BufWriter;
use std::sync::atomic::{AtomicU64, Ordering};

/// Modules unloaded so far (counted by the recorder's resource callback, before the unload).
pub static MODULE_UNLOADS: AtomicU64 = AtomicU64::new(0);

/// Python call sites whose native frames the writer remembers for elided captures.
const NATIVE_UNDER_MAX: usize = 1 << 16;

/// Session writer state.
pub struct Sink {
    /// Added to the correlation ids of the buffer being decoded (crate::detach::corr_base).
    corr_base: u32,
    /// The buffer being decoded was completed while CUPTI was detaching: its kernels' name
    /// pointers may point into freed memory, and are not read.
    names_stale: bool,
    w: TraceWriter<BufWriter<File>>,
    cupti: Option<&'static Cupti>,
    symbolizer: Symbolizer,
    source_text: crate::srctext::SourceText,
    /// CUPTI shares one name string among all records of a kernel: its address finds the id
    /// without reading the name. Cleared when a module is unloaded (its memory may be reused).
    kernel_by_ptr: HashMap<usize, StrId>,
    /// [`MODULE_UNLOADS`] when `kernel_by_ptr` was last cleared.
    unloads_seen: u64,
    api_names: HashMap<(u32, u32), StrId>,
    addr_frames: HashMap<u64, Vec<FrameId>>,
    py_frames: HashMap<u32, FrameId>,
    stacks: HashMap<(Vec<u64>, Option<u64>), StackId>,
    /// (Python part of a stack, read from another thread) → native frames under it at its last
    /// full capture (at most [`NATIVE_UNDER_MAX`] entries).
    native_under: HashMap<(Vec<u64>, bool), Vec<u64>>,
    frame_buf: Vec<FrameId>,
    /// The frames of an address resolved provisionally (not kept in `addr_frames`).
    frame_scratch: Vec<FrameId>,
    /// The stack being interned holds a provisional frame ([`Symbolizer::resolve_now`]).
    provisional: bool,
    /// Default streams already written (ctx, stream).
    streams: HashMap<(u32, u32), StreamRole>,
    pub dirty: bool,
    /// The writer's uncompressed byte count when the last block closed.
    blocked_bytes: u64,
    /// GPU activity records left out because their times were not filled in (work still in
    /// flight at a forced flush).
    pub incomplete: u64,
    /// The exporter's feed (off unless the recorder turns it on).
    pub feed: crate::metrics_feed::Feed,
    /// Benchmark knob `GPUFL_API_DISCARD=1`: API records CUPTI delivers are counted and dropped
    /// instead of written (what CUPTI's API records cost the program without the writer's work).
    discard_api: bool,
    /// GPU time per kernel function, for kernel detail's top-N choice (when it is on).
    pub kd_tally: Option<crate::kernel_detail::Tally>,
    /// API records dropped by `discard_api`.
    pub discarded_api: u64,
    /// Launch `api` records made from the call-site callbacks (`GPUFL_API_FROM=callbacks`).
    pub api_from_callbacks: u64,
    /// `hostcall` and `hsample` records written, and those lost on the way (queues full).
    pub hostcalls: u64,
    pub hostcalls_lost: u64,
    pub hsamples: u64,
    pub hsamples_lost: u64,
    /// `mem` records written.
    pub mems: u64,
    /// Allocation stacks waiting for their memory activity record, and each device's free memory
    /// at its last telemetry sample (crate::memcalls).
    mem_join: crate::memcalls::StackJoin,
    device_free: crate::memcalls::DeviceFree,
    /// The allocations written and not yet freed (the feed's live bytes; carried into each new
    /// rolling file).
    pub live: crate::memcalls::LiveSet,
    /// Inductor's cache index, made at the first Triton kernel.
    inductor: Option<crate::inductor::Index>,
    /// Kernel names whose generated source was looked up (ids of the current file).
    sourced: std::collections::HashSet<StrId>,
    /// Of those, the ones not found yet, looked up again by [`Sink::retry_sources`].
    pending_sources: Vec<(StrId, String)>,
}

/// How long always-on leaves large libraries' symbol tables unloaded: loading one costs the
/// program's threads ~0.1 s once (the first step of a PyTorch Trainer, docs/benchmarks.md), which
/// the default always-on budget (0.5 % of the run) covers after ~30 s.
pub const DEFER_LARGE_SYMBOLS: std::time::Duration = std::time::Duration::from_secs(30);

/// Names waiting for a later scan of Inductor's cache, at most.
const MAX_PENDING_SOURCES: usize = 4096;

impl Sink {
    /// Always-on: large libraries' symbols are loaded only once the recording is
    /// [`DEFER_LARGE_SYMBOLS`] old ([`Symbolizer::defer_large`]).
    pub fn defer_large_symbols(&mut self) {
        self.symbolizer
            .defer_large(std::time::Instant::now() + DEFER_LARGE_SYMBOLS);
    }

    pub fn new(w: TraceWriter<BufWriter<File>>, cupti: Option<&'static Cupti>) -> Sink {
        Sink {
            w,
            cupti,
            symbolizer: Symbolizer::new(),
            source_text: crate::srctext::SourceText::from_env(),
            kernel_by_ptr: HashMap::new(),
            corr_base: 0,
            names_stale: false,
            unloads_seen: 0,
            api_names: HashMap::new(),
            addr_frames: HashMap::new(),
            py_frames: HashMap::new(),
            stacks: HashMap::new(),
            native_under: HashMap::new(),
            frame_buf: Vec::new(),
            frame_scratch: Vec::new(),
            provisional: false,
            streams: HashMap::new(),
            dirty: false,
            blocked_bytes: 0,
            incomplete: 0,
            feed: crate::metrics_feed::Feed::off(),
            discard_api: crate::options::knobs().api_discard,
            kd_tally: crate::kernel_detail::config()
                .filter(|c| matches!(c.select, crate::kernel_detail::Select::Top(_)))
                .map(|_| crate::kernel_detail::Tally::default()),
            discarded_api: 0,
            api_from_callbacks: 0,
            hostcalls: 0,
            hostcalls_lost: 0,
            hsamples: 0,
            hsamples_lost: 0,
            mems: 0,
            mem_join: Default::default(),
            live: Default::default(),
            device_free: Default::default(),
            inductor: None,
            sourced: std::collections::HashSet::new(),
            pending_sources: Vec::new(),
        }
    }

    /// Look generated kernels up in this index of Inductor's cache instead of the one
    /// [`crate::inductor::Index::from_env`] finds.
    pub fn with_inductor(mut self, ix: crate::inductor::Index) -> Sink {
        self.inductor = Some(ix);
        self
    }

    pub fn writer(&mut self) -> &mut TraceWriter<BufWriter<File>> {
        &mut self.w
    }

    pub fn write(&mut self, rec: &Record) -> Result<(), TraceError> {
        self.dirty = true;
        self.feed.observe(rec);
        match rec {
            Record::Telemetry(t) => self.device_free.observe(t),
            Record::Mem(m) => self.live.note(m),
            _ => {}
        }
        self.w.write(rec)
    }

    /// Drain the hot path's sample queue.
    pub fn drain_samples(&mut self) -> Result<(), TraceError> {
        while let Some(s) = stack::queue().pop() {
            self.take_sample(&s)?;
        }
        while let Some((ctx, stream, role)) = crate::sites::stream_queue().pop() {
            if self.streams.insert((ctx, stream), role).is_none() {
                self.write(&Record::Stream(StreamInfo { ctx, stream, role }))?;
            }
        }
        self.retry_sources()?;
        while let Some(c) = crate::graphnodes::clone_queue().pop() {
            self.write(&Record::Gnode(Gnode {
                graph: c.graph,
                node: c.node,
                from: Some(GraphNode(c.from_graph, c.from_node)),
                ..Gnode::default()
            }))?;
        }
        self.write_lost("graph_node_queue", crate::graphnodes::take_dropped())?;
        while let Some(c) = crate::sites::api_queue().pop() {
            let name = self.api_name(c.domain, c.cbid)?;
            self.api_from_callbacks += 1;
            self.write(&Record::Api(gpufl_trace::Api {
                domain: if c.domain == cupti::DOMAIN_RUNTIME {
                    ApiDomain::Runtime
                } else {
                    ApiDomain::Driver
                },
                name,
                cbid: c.cbid,
                start: c.start,
                end: c.end,
                tid: c.tid,
                corr: c.corr,
                ret: c.ret,
            }))?;
        }
        self.write_lost("api_queue", crate::sites::take_api_dropped())?;
        while let Some(h) = crate::hostsampler::queue().pop() {
            self.take_host_sample(&h)?;
        }
        let lost = crate::hostsampler::take_dropped();
        self.hsamples_lost += lost;
        self.write_lost("host_sample_queue", lost)?;
        let lost = crate::hostcalls::take_dropped();
        self.hostcalls_lost += lost;
        self.write_lost("hostcall_queue", lost)?;
        self.write_lost("stack_queue", stack::take_dropped())
    }

    /// An `hsample` record from the host sampler's sample.
    pub fn take_host_sample(
        &mut self,
        h: &crate::hostsampler::HostSample,
    ) -> Result<(), TraceError> {
        let stack = if h.len > 0 {
            Some(self.intern_raw_stack(h.entries())?)
        } else {
            None
        };
        let call = match h.call {
            Some((domain, cbid)) => Some(self.api_name(domain, cbid)?),
            None => None,
        };
        self.hsamples += 1;
        self.write(&Record::Hsample(Hsample {
            ts: h.ts,
            tid: h.tid,
            state: h.state,
            period_ns: h.period_ns,
            stack,
            call,
        }))
    }

    /// A `dropped` record for what a hot-path queue lost, if anything.
    fn write_lost(&mut self, source: &str, count: u64) -> Result<(), TraceError> {
        if count == 0 {
            return Ok(());
        }
        self.write(&Record::Dropped(Dropped {
            source: source.into(),
            count,
        }))
    }

    fn take_sample(&mut self, s: &Sample) -> Result<(), TraceError> {
        // Native frames deferred to the writer: walked from the sample's stack copy now.
        let completed;
        let s = if s.native_copy != 0 {
            completed = stack::complete_native(s);
            &completed
        } else {
            s
        };
        let sync = crate::cbids::sync_kind(s.domain, s.cbid);
        let stack = if s.has_stack {
            let entries = s.entries();
            let split = entries
                .iter()
                .position(|e| e & PY_TAG != 0)
                .unwrap_or(entries.len());
            // Python frames of another thread under this thread's native frames (`via`).
            let via = (s.via_tid != 0).then_some(s.via_tid);
            let key = (entries[split..].to_vec(), via.is_some());
            Some(if split < entries.len() && s.native_elided {
                // Reuse the native frames of this Python call site's last full capture.
                let mut full = self.native_under.get(&key).cloned().unwrap_or_default();
                full.extend_from_slice(&entries[split..]);
                self.intern_raw_stack_via(&full, via)?
            } else {
                if split < entries.len() && !s.native_cut {
                    if self.native_under.len() >= NATIVE_UNDER_MAX {
                        self.native_under.clear();
                    }
                    self.native_under.insert(key, entries[..split].to_vec());
                }
                self.intern_raw_stack_via(entries, via)?
            })
        } else {
            None
        };
        if let Some(m) = s.mem {
            self.take_mem_sample(s, m, stack)?;
            if s.hostcall.is_none() {
                return Ok(());
            }
        }
        if let Some((graph, node)) = s.graph_node {
            return self.write(&Record::Gnode(Gnode {
                graph,
                node,
                stack,
                tid: Some(s.tid),
                from: None,
            }));
        }
        if let Some(h) = s.hostcall {
            let name = self.api_name(s.domain, s.cbid)?;
            self.hostcalls += 1;
            return self.write(&Record::Hostcall(Hostcall {
                domain: if s.domain == cupti::DOMAIN_RUNTIME {
                    ApiDomain::Runtime
                } else {
                    ApiDomain::Driver
                },
                name,
                cbid: s.cbid,
                start: s.ts,
                end: s.end.max(s.ts),
                tid: s.tid,
                corr: s.corr,
                ctx: (s.ctx != 0).then_some(s.ctx),
                bytes: h.bytes,
                ret: h.ret,
                stack,
            }));
        }
        let Some((kind, _, _)) = sync else {
            // A launch, copy or memset call site.
            let Some(stack) = stack else { return Ok(()) };
            let api = self.api_name(s.domain, s.cbid)?;
            return self.write(&Record::Callsite(Callsite {
                corr: s.corr,
                api,
                tid: s.tid,
                ts: s.ts,
                stack,
                weight: (s.weight > 1).then_some(u64::from(s.weight)),
            }));
        };
        self.write(&Record::Sync(Sync {
            kind,
            start: s.ts,
            end: s.end.max(s.ts),
            ctx: s.ctx,
            stream: s.stream,
            event: None,
            corr: s.corr,
            tid: Some(s.tid),
            stack,
        }))
    }

    /// An allocation call's sample: a failed allocation is written now (`alloc_failed`, with the
    /// device's free memory at the last telemetry sample); a large one's stack waits for its
    /// memory activity record.
    fn take_mem_sample(
        &mut self,
        s: &Sample,
        m: crate::memcalls::MemFacts,
        stack: Option<StackId>,
    ) -> Result<(), TraceError> {
        if !m.failed {
            if let Some(stack) = stack {
                self.mem_join.insert(s.corr, stack, s.tid, s.ts, s.end);
            }
            return Ok(());
        }
        let api = self.api_name(s.domain, s.cbid)?;
        let name = self
            .cupti
            .and_then(|c| c.callback_name(s.domain, s.cbid))
            .unwrap_or_default();
        let dev = m.dev.unwrap_or(0);
        self.mems += 1;
        self.write(&Record::Mem(Mem {
            ts: s.ts,
            op: MemOp::AllocFailed,
            addr: 0,
            bytes: m.bytes.unwrap_or(0),
            mem_kind: crate::memcalls::kind_of(&name),
            dev,
            ctx: s.ctx,
            corr: s.corr,
            api: Some(api),
            tid: Some(s.tid),
            stack,
            free: self.device_free.get(dev),
            ..Mem::default()
        }))
    }

    /// Intern a raw stack (native addresses / tagged Python ids), symbolizing new addresses.
    pub fn intern_raw_stack(&mut self, entries: &[u64]) -> Result<StackId, TraceError> {
        self.intern_raw_stack_via(entries, None)
    }

    /// [`Self::intern_raw_stack`] for a stack whose Python frames were read from thread `via`.
    fn intern_raw_stack_via(
        &mut self,
        entries: &[u64],
        via: Option<u64>,
    ) -> Result<StackId, TraceError> {
        let key = (entries.to_vec(), via);
        if let Some(id) = self.stacks.get(&key) {
            return Ok(*id);
        }
        self.provisional = false;
        let mut frames = std::mem::take(&mut self.frame_buf);
        frames.clear();
        for &e in entries {
            if e & PY_TAG != 0 {
                if let Some(f) = self.python_frame((e & !PY_TAG) as u32)? {
                    frames.push(f);
                }
            } else {
                let fs = self.native_frames(e)?;
                frames.extend_from_slice(fs);
            }
        }
        let id = self.w.intern_stack_via(&frames, via)?;
        self.feed.note_stack(id, &frames);
        self.frame_buf = frames;
        if !self.provisional {
            self.stacks.insert(key, id);
        }
        self.dirty = true;
        Ok(id)
    }

    fn python_frame(&mut self, id: u32) -> Result<Option<FrameId>, TraceError> {
        if let Some(f) = self.py_frames.get(&id) {
            return Ok(Some(*f));
        }
        let Some(info) = stack::python_frame(id) else {
            return Ok(None);
        };
        let file = self.w.intern_str(&info.file)?;
        let func = self.w.intern_str(&info.function)?;
        let text = match self.source_text.line(&info.file, info.line) {
            Some(t) => Some(self.w.intern_str(&t)?),
            None => None,
        };
        let f = self.w.intern_frame(FrameData {
            kind: FrameKind::Python,
            module: None,
            offset: None,
            func: Some(func),
            file: Some(file),
            line: Some(info.line),
            inlined: false,
            text,
        })?;
        self.feed
            .note_frame(f, Some(&info.file), Some(info.line), None);
        self.py_frames.insert(id, f);
        Ok(Some(f))
    }

    fn native_frames(&mut self, addr: u64) -> Result<&[FrameId], TraceError> {
        if !self.addr_frames.contains_key(&addr) {
            // Every kept native entry is a return address (the capture's own frames are cut).
            // Benchmark knob GPUFL_SYMBOLIZE=0: module and offset only.
            let (sym, last) = if crate::options::knobs().symbolize {
                self.symbolizer.resolve_now(addr, true)
            } else {
                (vec![self.symbolizer.locate(addr, true)], true)
            };
            // A provisional frame (a large module's, while always-on defers loading it) is
            // resolved again next time, and the stack holding it is not kept for reuse.
            self.provisional |= !last;
            let mut ids = Vec::with_capacity(sym.len());
            for f in sym {
                let module = self.w.intern_str(&f.module)?;
                let func = f
                    .function
                    .as_deref()
                    .map(|s| self.w.intern_str(s))
                    .transpose()?;
                let file = f
                    .file
                    .as_deref()
                    .map(|s| self.w.intern_str(s))
                    .transpose()?;
                let text = match (f.file.as_deref(), f.line) {
                    (Some(path), Some(line)) => match self.source_text.line(path, line) {
                        Some(t) => Some(self.w.intern_str(&t)?),
                        None => None,
                    },
                    _ => None,
                };
                let id = self.w.intern_frame(FrameData {
                    kind: FrameKind::Native,
                    module: Some(module),
                    offset: Some(f.module_offset),
                    func,
                    file,
                    line: f.line,
                    inlined: f.inlined,
                    text,
                })?;
                self.feed
                    .note_frame(id, f.file.as_deref(), f.line, Some(&f.module));
                ids.push(id);
            }
            if !last {
                self.frame_scratch = ids;
                return Ok(&self.frame_scratch);
            }
            self.addr_frames.insert(addr, ids);
        }
        Ok(self
            .addr_frames
            .get(&addr)
            .map(|v| v.as_slice())
            .unwrap_or(&[]))
    }

    /// Decode and write every record of one CUPTI activity buffer.
    ///
    /// Benchmark only: walk a buffer's records (and decode them if `decode`) without writing.
    /// Returns how many there were.
    ///
    /// # Safety
    /// As [`Sink::take_buffer`].
    pub unsafe fn walk_buffer(&mut self, buf: *mut u8, valid: usize, decode: bool) -> usize {
        let Some(c) = self.cupti else { return 0 };
        let mut n = 0;
        let count = |rec: *mut c_void| {
            if decode {
                // SAFETY: rec is a complete record returned by CUPTI.
                std::hint::black_box(unsafe { activity::decode(rec) });
            }
            n += 1;
            Ok(())
        };
        // SAFETY: as the caller guarantees.
        let _ = unsafe { each_record(c, buf, valid, count) };
        n
    }

    /// What the next buffer's records need: their correlation ids' base, and whether CUPTI
    /// completed it while being detached (its kernel names are then not read): crate::detach.
    pub fn set_buffer_context(&mut self, corr_base: u32, recycle: bool) {
        self.corr_base = corr_base;
        self.names_stale = !recycle;
    }

    /// CUPTI was detached and attached again: the addresses of its kernel names mean nothing now.
    pub fn forget_kernel_names(&mut self) {
        self.kernel_by_ptr.clear();
    }

    /// # Safety
    /// `buf[..valid]` must be a buffer CUPTI handed back through the completion callback.
    pub unsafe fn take_buffer(&mut self, buf: *mut u8, valid: usize) -> Result<(), TraceError> {
        let Some(c) = self.cupti else { return Ok(()) };
        // SAFETY: as the caller guarantees; rec is a complete record returned by CUPTI.
        unsafe {
            each_record(c, buf, valid, |rec| {
                self.take_decoded(activity::decode(rec))
            })
        }
    }

    /// Write one decoded activity record (public for the writer benchmark).
    pub fn take_decoded(&mut self, mut d: Decoded) -> Result<(), TraceError> {
        d.offset_corr(self.corr_base);
        // A forced flush (at a fatal signal, at stop) hands over records of GPU work still in
        // flight, whose end time CUPTI has not filled in: they are counted, not written.
        let (start, end) = match &d {
            Decoded::Kernel { kernel, .. } => (kernel.start, kernel.end),
            Decoded::Memcpy(m) => (m.start, m.end),
            Decoded::Memset(m) => (m.start, m.end),
            _ => (1, 1),
        };
        if start == 0 || end < start {
            self.incomplete += 1;
            return Ok(());
        }
        match d {
            Decoded::Kernel {
                name: _,
                mut kernel,
            } if self.names_stale => {
                kernel.name = self.kernel_name(b"<kernel name lost at a detach>")?;
                self.write(&Record::Kernel(kernel))
            }
            Decoded::Kernel { name, mut kernel } => {
                let unloads = MODULE_UNLOADS.load(Ordering::Acquire);
                if unloads != self.unloads_seen {
                    self.kernel_by_ptr.clear();
                    self.unloads_seen = unloads;
                }
                kernel.name = match self.kernel_by_ptr.get(&(name as usize)) {
                    Some(id) => *id,
                    None => {
                        let bytes = if name.is_null() {
                            b"<unnamed kernel>".as_slice()
                        } else {
                            // SAFETY: CUPTI's name string of a kernel outlives its records in
                            // practice (it is shared among them); gpufl reads it once per address.
                            unsafe { CStr::from_ptr(name) }.to_bytes()
                        };
                        let id = self.kernel_name(bytes)?;
                        self.kernel_by_ptr.insert(name as usize, id);
                        if let Some(t) = self.kd_tally.as_mut() {
                            let k = crate::kernel_detail::key(bytes);
                            t.add(id.0, || k, 0);
                            t.name(k, bytes);
                        }
                        if bytes.starts_with(b"triton_") {
                            self.generated_source(id, &String::from_utf8_lossy(bytes))?;
                        }
                        id
                    }
                };
                if let Some(t) = self.kd_tally.as_mut() {
                    t.add(kernel.name.0, || 0, kernel.end - kernel.start);
                }
                self.write(&Record::Kernel(kernel))
            }
            Decoded::Memcpy(m) => self.write(&Record::Memcpy(m)),
            Decoded::Memset(m) => self.write(&Record::Memset(m)),
            Decoded::Sync(s) => self.write(&Record::Sync(s)),
            Decoded::Api(_) if self.discard_api => {
                self.discarded_api += 1;
                Ok(())
            }
            Decoded::Api(mut a) => {
                let dom = if a.domain == ApiDomain::Runtime {
                    cupti::DOMAIN_RUNTIME
                } else {
                    cupti::DOMAIN_DRIVER
                };
                a.name = self.api_name(dom, a.cbid)?;
                self.write(&Record::Api(a))
            }
            Decoded::Overhead(o) => self.write(&Record::Overhead(o)),
            Decoded::Mem(mut m) => {
                self.mem_join.attach(&mut m);
                self.mems += 1;
                self.write(&Record::Mem(m))
            }
            Decoded::Other(_) => Ok(()),
        }
    }

    /// Interned, demangled kernel name (the writer interns by the demangled text).
    /// Intern a string (its `str` record written on first use).
    pub(crate) fn intern(&mut self, text: &str) -> Result<StrId, TraceError> {
        self.w.intern_str(text)
    }

    pub(crate) fn kernel_name(&mut self, mangled: &[u8]) -> Result<StrId, TraceError> {
        self.w
            .intern_str(&demangle(&String::from_utf8_lossy(mangled)))
    }

    /// A `function` record with the source of a kernel PyTorch Inductor generated, the first time
    /// its name is seen (see [`crate::inductor`]).
    fn generated_source(&mut self, name: StrId, text: &str) -> Result<(), TraceError> {
        if !self.sourced.insert(name) {
            return Ok(());
        }
        // Not found yet: kernels compiled just now may be in a later scan (at most once a second).
        if !self.try_source(name, text)? && self.pending_sources.len() < MAX_PENDING_SOURCES {
            self.pending_sources.push((name, text.to_string()));
        }
        Ok(())
    }

    /// Look the names not found so far up again (the index decides whether to scan again), until
    /// the index will scan no more.
    pub fn retry_sources(&mut self) -> Result<(), TraceError> {
        if self.pending_sources.is_empty() {
            return Ok(());
        }
        if self
            .inductor
            .as_ref()
            .is_some_and(|ix| !ix.can_scan_again())
        {
            self.pending_sources.clear();
            return Ok(());
        }
        for (name, text) in std::mem::take(&mut self.pending_sources) {
            if !self.try_source(name, &text)? {
                self.pending_sources.push((name, text));
            }
        }
        Ok(())
    }

    /// Write the `function` record of a generated kernel's source if the cache holds it.
    fn try_source(&mut self, name: StrId, text: &str) -> Result<bool, TraceError> {
        let ix = self
            .inductor
            .get_or_insert_with(crate::inductor::Index::from_env);
        let Some(found) = ix.lookup(text) else {
            return Ok(false);
        };
        let file = self.w.intern_str(&found.file.to_string_lossy())?;
        let note = match &found.note {
            Some(n) => Some(self.w.intern_str(n)?),
            None => None,
        };
        self.write(&Record::Function(gpufl_trace::Function {
            name,
            module: 0,
            frame: None,
            stack: None,
            source: Some(gpufl_trace::FunctionSource {
                file,
                line: found.line,
                note,
            }),
        }))?;
        Ok(true)
    }

    /// The interned name of an API function (domain, callback id).
    pub fn api_name(&mut self, domain: u32, cbid: u32) -> Result<StrId, TraceError> {
        if let Some(id) = self.api_names.get(&(domain, cbid)) {
            return Ok(*id);
        }
        let name = self
            .cupti
            .and_then(|c| c.callback_name(domain, cbid))
            .unwrap_or_else(|| format!("cbid{cbid}"));
        let id = self.w.intern_str(&name)?;
        self.feed.note_call_name(id, &name);
        self.api_names.insert((domain, cbid), id);
        Ok(id)
    }

    /// Close the current compressed block.
    pub fn end_block(&mut self) -> Result<(), TraceError> {
        self.dirty = false;
        self.blocked_bytes = self.w.uncompressed_bytes();
        self.w.end_block()
    }

    /// Go on in a new trace file (rolling files): finish the current one with an `end` record
    /// (reason "rotated") and start `path` with `header`. Each file is self-contained, so the
    /// interning caches start again; the default streams already seen are written again.
    pub fn rotate(&mut self, path: &std::path::Path, header: &Header) -> Result<(), TraceError> {
        let f = File::create(path)?;
        let next = TraceWriter::new(BufWriter::with_capacity(1 << 20, f), header)?;
        let old = std::mem::replace(&mut self.w, next);
        old.finish(crate::procinfo::unix_ns(), "rotated")?;
        // The raw stacks of the live allocations, to intern them again in the new file.
        let mut raw: HashMap<StackId, (Vec<u64>, Option<u64>)> = HashMap::new();
        if !self.live.is_empty() {
            let wanted: std::collections::HashSet<StackId> = self.live.stacks().collect();
            for (key, id) in self.stacks.drain() {
                if wanted.contains(&id) {
                    raw.insert(id, key);
                }
            }
        }
        self.kernel_by_ptr.clear();
        self.api_names.clear();
        self.addr_frames.clear();
        self.py_frames.clear();
        self.stacks.clear();
        self.mem_join.clear();
        // String ids restart in the new file: its kernels get their source records again.
        self.sourced.clear();
        self.pending_sources.clear();
        self.feed.forget_ids();
        let streams: Vec<_> = self
            .streams
            .iter()
            .map(|(&(ctx, stream), &role)| (ctx, stream, role))
            .collect();
        for (ctx, stream, role) in streams {
            self.write(&Record::Stream(StreamInfo { ctx, stream, role }))?;
        }
        let mut live = std::mem::take(&mut self.live);
        let carried = live.carry(|id| match raw.get(&id) {
            Some((entries, via)) => self.intern_raw_stack_via(entries, *via).map(Some),
            None => Ok(None),
        });
        self.live = live;
        for m in carried? {
            self.w.write(&Record::Mem(m))?;
        }
        self.end_block()
    }

    /// Whether anything was written since the last closed block (through [`Sink::write`] or any
    /// other path into the trace writer: activity buffers, samples, telemetry, scopes).
    pub fn has_unblocked(&self) -> bool {
        self.dirty || self.w.uncompressed_bytes() != self.blocked_bytes
    }

    /// Finish the trace with its `end` record.
    pub fn finish(self, reason: &str) -> Result<Counts, TraceError> {
        let counts = self.w.counts().clone();
        self.w.finish(crate::procinfo::unix_ns(), reason)?;
        Ok(counts)
    }
}

/// Call `f` on each record of a completed activity buffer, in order, until it fails.
///
/// # Safety
/// `buf[..valid]` must be a buffer CUPTI handed back through the completion callback.
unsafe fn each_record(
    c: &Cupti,
    buf: *mut u8,
    valid: usize,
    mut f: impl FnMut(*mut c_void) -> Result<(), TraceError>,
) -> Result<(), TraceError> {
    let mut rec: *mut c_void = std::ptr::null_mut();
    // SAFETY: CUPTI iterates its own buffer; rec points into it.
    while unsafe { (c.activity_get_next_record)(buf, valid, &mut rec) } == cupti::SUCCESS
        && !rec.is_null()
    {
        f(rec)?;
    }
    Ok(())
}

/// Demangle a C++ (Itanium) kernel name; anything else is returned as is.
pub fn demangle(name: &str) -> String {
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name) {
            if let Ok(s) = sym.demangle() {
                return s;
            }
        }
    }
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink writing a trace file at `path`.
    /// The hot-path queues a sink drains (samples, API calls, graph-node clones, streams) are
    /// process-wide: a test that fills or drains them holds this, so that another test's sink does
    /// not take its records (a race seen as a missing cloned `gnode`).
    fn queues() -> std::sync::MutexGuard<'static, ()> {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        LOCK.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sink_at(path: &std::path::Path) -> Sink {
        let w = TraceWriter::new(
            BufWriter::new(File::create(path).unwrap()),
            &Header::default(),
        )
        .unwrap();
        Sink::new(w, None)
    }

    /// Feed the sink a kernel record over `[start, end]` whose name is the NUL-terminated `name`
    /// (CUPTI hands names by address).
    fn feed_kernel(sink: &mut Sink, name: &[u8], start: u64, end: u64) {
        sink.take_decoded(Decoded::Kernel {
            name: name.as_ptr().cast(),
            kernel: Kernel {
                start,
                end,
                ..Kernel::default()
            },
        })
        .unwrap();
    }

    /// The records of a trace file.
    fn read_back(path: &std::path::Path) -> Vec<Record> {
        gpufl_trace::TraceReader::open(path).unwrap().collect()
    }

    /// Kernel names are found by the address CUPTI shares among a kernel's records; after a
    /// module unload that address may hold another name, which must then be read again.
    #[test]
    fn kernel_name_cache_is_cleared_by_a_module_unload() {
        let _queues = queues();
        let path =
            std::env::temp_dir().join(format!("gpufl-sink-{}.ndjson.zst", std::process::id()));
        let mut sink = sink_at(&path);
        let mut buf = *b"_Z5firstv\0\0";
        feed_kernel(&mut sink, &buf, 1, 2);
        feed_kernel(&mut sink, &buf, 1, 2);
        buf[..10].copy_from_slice(b"_Z6secondv");
        MODULE_UNLOADS.fetch_add(1, Ordering::Release);
        feed_kernel(&mut sink, &buf, 1, 2);
        sink.take_decoded(Decoded::Kernel {
            name: std::ptr::null(),
            kernel: Kernel {
                start: 1,
                end: 2,
                ..Kernel::default()
            },
        })
        .unwrap();
        sink.finish("test").unwrap();
        let mut strings = HashMap::new();
        let mut names = Vec::new();
        for rec in read_back(&path) {
            match rec {
                Record::Str(s) => {
                    strings.insert(s.id, s.s);
                }
                Record::Kernel(k) => names.push(strings[&k.name].clone()),
                _ => {}
            }
        }
        std::fs::remove_file(&path).ok();
        assert_eq!(
            names,
            ["first()", "first()", "second()", "<unnamed kernel>"]
        );
    }

    /// Across an always-on detach (crate::detach): a buffer's correlation ids get its base, a
    /// buffer completed while detaching has its kernel names left unread, and the name cache is
    /// forgotten after the detach (CUPTI's name addresses mean nothing then).
    #[test]
    fn buffers_around_a_detach_keep_ids_unique_and_read_no_stale_name() {
        let _queues = queues();
        let path = std::env::temp_dir().join(format!(
            "gpufl-sink-detach-{}.ndjson.zst",
            std::process::id()
        ));
        let mut sink = sink_at(&path);
        let mut buf = *b"_Z5firstv\0\0";
        let kernel = |sink: &mut Sink, buf: &[u8], corr: u32| {
            sink.take_decoded(Decoded::Kernel {
                name: buf.as_ptr().cast(),
                kernel: Kernel {
                    start: 1,
                    end: 2,
                    corr,
                    ..Kernel::default()
                },
            })
            .unwrap();
        };
        kernel(&mut sink, &buf, 7);
        sink.set_buffer_context(0, false); // completed while detaching
        kernel(&mut sink, &buf, 9);
        sink.take_decoded(Decoded::Memcpy(Memcpy {
            start: 1,
            end: 2,
            corr: 10,
            ..Memcpy::default()
        }))
        .unwrap();
        sink.forget_kernel_names();
        buf[..10].copy_from_slice(b"_Z6secondv");
        sink.set_buffer_context(1000, true); // the next generation
        kernel(&mut sink, &buf, 3);
        sink.finish("test").unwrap();
        let mut strings = HashMap::new();
        let mut kernels = Vec::new();
        let mut copies = Vec::new();
        for rec in read_back(&path) {
            match rec {
                Record::Str(s) => {
                    strings.insert(s.id, s.s);
                }
                Record::Kernel(k) => kernels.push((strings[&k.name].clone(), k.corr)),
                Record::Memcpy(m) => copies.push(m.corr),
                _ => {}
            }
        }
        std::fs::remove_file(&path).ok();
        assert_eq!(
            kernels,
            [
                ("first()".to_string(), 7),
                ("<kernel name lost at a detach>".to_string(), 9),
                ("second()".to_string(), 1003)
            ]
        );
        assert_eq!(copies, [10]);
    }

    #[test]
    fn launch_calls_timed_by_the_callbacks_are_written_as_api_records() {
        let _queues = queues();
        let path =
            std::env::temp_dir().join(format!("gpufl-sink-api-{}.ndjson.zst", std::process::id()));
        let mut sink = sink_at(&path);
        let call = crate::sites::ApiCall {
            domain: cupti::DOMAIN_RUNTIME,
            cbid: 211,
            start: 100,
            end: 180,
            tid: 7,
            corr: 42,
            ret: 0,
        };
        crate::sites::api_queue().push(call).unwrap();
        crate::sites::api_queue()
            .push(crate::sites::ApiCall {
                domain: cupti::DOMAIN_DRIVER,
                corr: 43,
                ..call
            })
            .unwrap();
        sink.drain_samples().unwrap();
        assert_eq!(sink.api_from_callbacks, 2);
        sink.finish("test").unwrap();
        let apis: Vec<Api> = read_back(&path)
            .into_iter()
            .filter_map(|r| match r {
                Record::Api(a) => Some(a),
                _ => None,
            })
            .collect();
        std::fs::remove_file(&path).ok();
        assert_eq!(apis.len(), 2);
        assert_eq!(
            (
                apis[0].domain,
                apis[0].start,
                apis[0].end,
                apis[0].tid,
                apis[0].corr
            ),
            (ApiDomain::Runtime, 100, 180, 7, 42)
        );
        assert_eq!((apis[1].domain, apis[1].corr), (ApiDomain::Driver, 43));
    }

    #[test]
    fn graph_nodes_are_written_with_their_creation_stack_or_origin() {
        let _queues = queues();
        let path =
            std::env::temp_dir().join(format!("gpufl-sink-gn-{}.ndjson.zst", std::process::id()));
        let mut sink = sink_at(&path);
        let mut s = Sample::empty();
        s.tid = 9;
        s.has_stack = true;
        s.graph_node = Some((2, 77));
        s.len = 2;
        s.frames[0] = 0x1000;
        s.frames[1] = 0x2000;
        sink.take_sample(&s).unwrap();
        crate::graphnodes::clone_queue()
            .push(crate::graphnodes::Cloned {
                graph: 5,
                node: 91,
                from_graph: 2,
                from_node: 77,
            })
            .unwrap();
        sink.drain_samples().unwrap();
        sink.finish("test").unwrap();
        let nodes: Vec<Gnode> = read_back(&path)
            .into_iter()
            .filter_map(|r| match r {
                Record::Gnode(g) => Some(g),
                _ => None,
            })
            .collect();
        std::fs::remove_file(&path).ok();
        assert_eq!(nodes.len(), 2, "{nodes:?}");
        assert_eq!(
            (nodes[0].graph, nodes[0].node, nodes[0].tid),
            (2, 77, Some(9))
        );
        assert!(nodes[0].stack.is_some());
        assert_eq!((nodes[1].node, nodes[1].from), (91, Some(GraphNode(2, 77))));
        assert!(nodes[1].stack.is_none());
    }

    /// A large allocation's stack joins its memory activity record by correlation id; a free
    /// stays without; a failed allocation is written at once with its stack and the device's
    /// free memory at the last telemetry sample.
    /// The `mem` records among `recs`.
    fn mems_of(recs: &[Record]) -> Vec<&Mem> {
        recs.iter()
            .filter_map(|r| match r {
                Record::Mem(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// The exit sample of an 8 MiB `cudaMalloc` (callback id 20, correlation id 31, thread 5),
    /// with a one-frame stack.
    fn alloc_sample() -> Sample {
        let mut s = Sample::empty();
        (s.domain, s.cbid, s.corr, s.ctx, s.tid) = (cupti::DOMAIN_RUNTIME, 20, 31, 1, 5);
        (s.ts, s.end) = (1_000, 2_000);
        s.has_stack = true;
        s.len = 1;
        s.frames[0] = 0x1000;
        s.mem = crate::memcalls::facts(Some(8 << 20), 0, 1 << 20);
        s
    }

    #[test]
    fn mem_records_get_their_allocation_stacks_and_failures() {
        let path =
            std::env::temp_dir().join(format!("gpufl-sink-mem-{}.ndjson.zst", std::process::id()));
        let mut sink = sink_at(&path);
        sink.write(&Record::Telemetry(Box::new(Telemetry {
            dev: 0,
            mem_used: Some(79 << 30),
            mem_total: Some(80 << 30),
            ..Telemetry::default()
        })))
        .unwrap();
        let s = alloc_sample();
        sink.take_sample(&s).unwrap();
        let alloc = activity::synthetic_memory_record(1, 0x7f00_0000_0000, 8 << 20, 1_500, 31);
        let free = activity::synthetic_memory_record(2, 0x7f00_0000_0000, 8 << 20, 3_000, 32);
        for r in [&alloc, &free] {
            sink.take_decoded(unsafe { activity::decode(r.as_ptr()) })
                .unwrap();
        }
        let mut f = s;
        (f.corr, f.ts) = (40, 4_000);
        f.mem = crate::memcalls::facts(Some(1 << 30), crate::memcalls::OUT_OF_MEMORY, 1 << 20)
            .map(|m| crate::memcalls::MemFacts { dev: Some(0), ..m });
        sink.take_sample(&f).unwrap();
        assert_eq!(sink.mems, 3);
        assert_eq!(sink.hostcalls, 0, "a fast allocation is no hostcall");
        sink.finish("test").unwrap();
        let recs = read_back(&path);
        std::fs::remove_file(&path).ok();
        let mems = mems_of(&recs);
        assert_eq!(mems.len(), 3);
        assert_eq!(
            (mems[0].op, mems[0].corr, mems[0].tid),
            (MemOp::Alloc, 31, Some(5))
        );
        assert!(mems[0].stack.is_some());
        assert_eq!((mems[1].op, mems[1].stack), (MemOp::Free, None));
        let oom = mems[2];
        assert_eq!(
            (oom.op, oom.bytes, oom.ts),
            (MemOp::AllocFailed, 1 << 30, 4_000)
        );
        assert_eq!((oom.free, oom.stack), (Some(1 << 30), mems[0].stack));
    }

    /// A new rolling file starts with the allocations still live, each with its stack interned
    /// in that file; what was freed is not carried.
    #[test]
    fn rotation_carries_the_live_allocations_with_their_stacks() {
        let dir = std::env::temp_dir().join(format!("gpufl-sink-carry-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (p1, p2, p3) = (dir.join("1.zst"), dir.join("2.zst"), dir.join("3.zst"));
        let mut sink = sink_at(&p1);
        let s = alloc_sample();
        sink.take_sample(&s).unwrap();
        let held = activity::synthetic_memory_record(1, 0x7f00_0000_0000, 8 << 20, 1_500, 31);
        let gone = activity::synthetic_memory_record(1, 0x7f00_1000_0000, 4 << 20, 1_600, 50);
        let freed = activity::synthetic_memory_record(2, 0x7f00_1000_0000, 4 << 20, 1_700, 51);
        for r in [&held, &gone, &freed] {
            sink.take_decoded(unsafe { activity::decode(r.as_ptr()) })
                .unwrap();
        }
        assert_eq!(sink.live.by_device(), vec![(0, 8 << 20, 12 << 20)]);
        sink.rotate(&p2, &Header::default()).unwrap();
        // Twice: the kept records name the second file's stacks, which the third must map.
        sink.rotate(&p3, &Header::default()).unwrap();
        sink.finish("test").unwrap();
        for p in [&p2, &p3] {
            let recs = read_back(p);
            let mems = mems_of(&recs);
            assert_eq!(mems.len(), 1, "{}", p.display());
            let m = mems[0];
            assert_eq!(
                (m.op, m.addr, m.bytes, m.ts, m.corr, m.tid, m.carried),
                (
                    MemOp::Alloc,
                    0x7f00_0000_0000,
                    8 << 20,
                    1_500,
                    31,
                    Some(5),
                    true
                )
            );
            let id = m.stack.expect("its stack");
            assert!(
                recs.iter().any(
                    |r| matches!(r, Record::Stack(st) if st.id == id && !st.frames.is_empty())
                ),
                "stack {id:?} written in {}",
                p.display()
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[inline(never)]
    fn deferral_probe() -> u64 {
        std::hint::black_box(7)
    }

    /// Always-on leaves large libraries' symbols unloaded at first: a stack holding such a frame
    /// is written with the frame by module and offset, and interned again, symbolized, once the
    /// deferral has ended.
    #[test]
    fn a_stack_with_deferred_frames_is_symbolized_once_the_deferral_ends() {
        use std::time::{Duration, Instant};
        let path = std::env::temp_dir().join(format!(
            "gpufl-sink-defer-{}.ndjson.zst",
            std::process::id()
        ));
        let mut sink = sink_at(&path);
        // Every module counts as large (bound 0) for an hour.
        sink.symbolizer
            .defer_over(Instant::now() + Duration::from_secs(3600), 0);
        // A return address inside the probe function.
        let addr = deferral_probe as *const () as usize as u64 + 1;
        let early = sink.intern_raw_stack(&[addr]).unwrap();
        assert_eq!(sink.intern_raw_stack(&[addr]).unwrap(), early);
        sink.symbolizer.defer_over(Instant::now(), 0);
        let late = sink.intern_raw_stack(&[addr]).unwrap();
        assert_ne!(late, early);
        assert_eq!(sink.intern_raw_stack(&[addr]).unwrap(), late);
        sink.finish("test").unwrap();
        let recs = read_back(&path);
        let strs: HashMap<StrId, String> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Str(s) => Some((s.id, s.s.clone())),
                _ => None,
            })
            .collect();
        let top_func = |id: StackId| {
            let frame = recs
                .iter()
                .find_map(|r| match r {
                    Record::Stack(st) if st.id == id => st.frames.first().copied(),
                    _ => None,
                })
                .expect("the stack and a frame");
            recs.iter()
                .find_map(|r| match r {
                    Record::Frame(f) if f.id == frame => Some(f.func.map(|s| strs[&s].clone())),
                    _ => None,
                })
                .expect("the frame")
        };
        assert_eq!(top_func(early), None);
        let name = top_func(late).expect("symbolized once the deferral ended");
        assert!(name.contains("deferral_probe"), "{name}");
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn hostcalls_and_host_samples_are_written_with_their_stacks() {
        let _queues = queues();
        let path =
            std::env::temp_dir().join(format!("gpufl-sink-host-{}.ndjson.zst", std::process::id()));
        let mut sink = sink_at(&path);
        let mut s = Sample::empty();
        (s.domain, s.cbid, s.corr, s.ctx, s.tid) = (cupti::DOMAIN_RUNTIME, 22, 9, 1, 5);
        (s.ts, s.end) = (1_000, 41_000);
        s.has_stack = true;
        s.len = 1;
        s.frames[0] = 0x1000;
        s.hostcall = Some(crate::stack::HostcallFacts {
            bytes: Some(1 << 20),
            ret: 2,
        });
        // Straight to the sink: stack.rs's tests fill and empty the shared queue.
        sink.take_sample(&s).unwrap();
        let mut h = crate::hostsampler::HostSample {
            ts: 5_000,
            tid: 5,
            state: HostState::Cuda,
            period_ns: 10_000_000,
            call: Some((cupti::DOMAIN_RUNTIME, 22)),
            len: 1,
            frames: [0; crate::hostsampler::MAX_FRAMES],
        };
        h.frames[0] = 0x1000;
        crate::hostsampler::queue().push(h).ok().unwrap();
        crate::hostsampler::queue()
            .push(crate::hostsampler::HostSample {
                state: HostState::Sleep,
                call: None,
                len: 0,
                ..h
            })
            .ok()
            .unwrap();
        sink.drain_samples().unwrap();
        assert_eq!((sink.hostcalls, sink.hsamples), (1, 2));
        sink.finish("test").unwrap();
        let recs = read_back(&path);
        std::fs::remove_file(&path).ok();
        let hc: Vec<&Hostcall> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Hostcall(h) => Some(h),
                _ => None,
            })
            .collect();
        let hs: Vec<&Hsample> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Hsample(h) => Some(h),
                _ => None,
            })
            .collect();
        assert_eq!(hc.len(), 1);
        let c = hc[0];
        assert_eq!(
            (c.domain, c.cbid, c.start, c.end, c.tid, c.corr, c.ctx, c.bytes, c.ret),
            (
                ApiDomain::Runtime,
                22,
                1_000,
                41_000,
                5,
                9,
                Some(1),
                Some(1 << 20),
                2
            )
        );
        assert!(c.stack.is_some());
        assert_eq!(hs.len(), 2);
        assert_eq!(
            (hs[0].state, hs[0].period_ns, hs[0].tid),
            (HostState::Cuda, 10_000_000, 5)
        );
        assert_eq!(hs[0].stack, c.stack, "the same frames, the same stack");
        assert_eq!(hs[0].call, Some(c.name), "the call's name, interned once");
        assert_eq!(
            (hs[1].state, hs[1].stack, hs[1].call),
            (HostState::Sleep, None, None)
        );
    }

    #[test]
    fn a_kernel_compiled_after_the_first_scan_gets_its_source_from_a_later_one() {
        let _queues = queues();
        let dir = std::env::temp_dir().join(format!("gpufl-sink-ind2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.ndjson.zst");
        let mut sink = sink_at(&path).with_inductor(crate::inductor::Index::new(vec![dir.clone()]));
        let name = *b"triton_per_fused_sum_3\0";
        feed_kernel(&mut sink, &name, 1, 2);
        assert_eq!(sink.pending_sources.len(), 1);
        std::fs::write(dir.join("k.py"), "def triton_per_fused_sum_3(x):\n").unwrap();
        sink.drain_samples().unwrap(); // within a second of the first scan: not yet
        assert_eq!(sink.pending_sources.len(), 1);
        std::thread::sleep(std::time::Duration::from_millis(1_050));
        sink.drain_samples().unwrap();
        assert!(sink.pending_sources.is_empty());
        sink.finish("test").unwrap();
        let found = read_back(&path)
            .into_iter()
            .filter(|r| matches!(r, Record::Function(f) if f.source.is_some()))
            .count();
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(found, 1);
    }

    #[test]
    fn inductor_kernels_get_a_function_record_with_their_source_once() {
        let _queues = queues();
        let dir = std::env::temp_dir().join(format!("gpufl-sink-ind-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("ab")).unwrap();
        std::fs::write(
            dir.join("ab/k.py"),
            "@triton.jit\ndef triton_poi_fused_add_0(x):\n    pass\n",
        )
        .unwrap();
        let path = dir.join("t.ndjson.zst");
        let mut sink = sink_at(&path).with_inductor(crate::inductor::Index::new(vec![dir.clone()]));
        let a = *b"triton_poi_fused_add_0\0";
        let b = *b"triton_poi_fused_add_0\0"; // the same name at another address
        let c = *b"_Z5otherv\0";
        for name in [&a[..], &a[..], &b[..], &c[..]] {
            feed_kernel(&mut sink, name, 1, 2);
        }
        sink.finish("test").unwrap();
        let mut strings = HashMap::new();
        let mut sources = Vec::new();
        for rec in read_back(&path) {
            match rec {
                Record::Str(s) => {
                    strings.insert(s.id, s.s);
                }
                Record::Function(f) => {
                    let src = f.source.unwrap();
                    sources.push((
                        strings[&f.name].clone(),
                        strings[&src.file].clone(),
                        src.line,
                    ));
                }
                _ => {}
            }
        }
        std::fs::remove_dir_all(&dir).ok();
        let file = dir.join("ab/k.py").to_string_lossy().into_owned();
        assert_eq!(sources, [("triton_poi_fused_add_0".to_string(), file, 2)]);
    }

    #[test]
    fn records_of_work_in_flight_are_counted_not_written() {
        let _queues = queues();
        let path = std::env::temp_dir().join(format!(
            "gpufl-sink-inflight-{}.ndjson.zst",
            std::process::id()
        ));
        let mut sink = sink_at(&path);
        let name = b"_Z1kv\0";
        for (start, end) in [(0, 0), (5, 0), (10, 4), (7, 9)] {
            feed_kernel(&mut sink, name, start, end);
        }
        sink.take_decoded(Decoded::Memcpy(Memcpy::default()))
            .unwrap();
        assert_eq!(sink.incomplete, 4);
        let counts = sink.finish("test").unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!((counts.kernels, counts.memcpys), (1, 0));
    }

    #[test]
    fn demangles_cuda_kernel_names() {
        assert_eq!(
            demangle("_Z5saxpyifPfS_"),
            "saxpy(int, float, float*, float*)"
        );
        assert_eq!(
            super::demangle("ampere_sgemm_128x64_nn"),
            "ampere_sgemm_128x64_nn"
        );
        assert_eq!(super::demangle("_Zbroken"), "_Zbroken");
    }
}
