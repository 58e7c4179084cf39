//! The [`Model`]: a compact, columnar copy of one recorded session, built by streaming records.

use crate::fold::{ModelFold, Part, K_API, K_COPY, K_KERNEL, K_SYNC};
use crate::ids::{CorrId, StackIx};
use crate::store::{Col, IdMap, Spares, NONE};
use crate::views::*;
use gpufl_trace::{
    FrameId, FrameKind, GraphNode, Header, Item, Items, Record, StackId, StrId, StreamRole,
};
use std::collections::HashMap;
use std::sync::Arc;

/// A frame with global string ids.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameRow {
    pub(crate) kind: FrameKind,
    pub(crate) inlined: bool,
    pub(crate) module: u32,
    pub(crate) func: u32,
    pub(crate) file: u32,
    pub(crate) line: u32,
    pub(crate) offset: Option<u64>,
    /// Source text of the line (string id, [`NONE`] when not recorded).
    pub(crate) text: u32,
}

/// Kernels, column by column: 36 bytes per kernel. `launch` indexes [`Model::launches`], the
/// distinct (name, launch configuration) pairs.
#[derive(Debug, Default)]
pub(crate) struct Kernels {
    pub(crate) start: Col<u64>,
    pub(crate) end: Col<u64>,
    pub(crate) corr: Col<u32>,
    pub(crate) launch: Col<u32>,
    pub(crate) stream: Col<u32>,
    pub(crate) ctx: Col<u32>,
    pub(crate) dev: Col<u32>,
}

/// Graph nodes kept at most (a hostile trace cannot grow the map).
pub const MAX_GRAPH_NODES: usize = 1_000_000;

/// Generated sources kept at most (one per kernel name; a hostile trace cannot grow the map).
pub const MAX_KERNEL_SOURCES: usize = 100_000;

/// Memcpys and memsets: 43 bytes per record (`op` is the copy kind, or [`OP_MEMSET`]).
#[derive(Debug, Default)]
pub(crate) struct Copies {
    pub(crate) start: Col<u64>,
    pub(crate) end: Col<u64>,
    pub(crate) bytes: Col<u64>,
    pub(crate) corr: Col<u32>,
    pub(crate) ctx: Col<u32>,
    pub(crate) stream: Col<u32>,
    pub(crate) dev: Col<u32>,
    pub(crate) op: Col<u8>,
    pub(crate) src: Col<u8>,
    pub(crate) dst: Col<u8>,
}

/// Synchronizations: 45 bytes per record.
#[derive(Debug, Default)]
pub(crate) struct Syncs {
    pub(crate) start: Col<u64>,
    pub(crate) end: Col<u64>,
    pub(crate) tid: Col<u64>,
    pub(crate) corr: Col<u32>,
    pub(crate) ctx: Col<u32>,
    pub(crate) stream: Col<u32>,
    pub(crate) event: Col<u32>,
    pub(crate) stack: Col<u32>,
    pub(crate) kind: Col<u8>,
}

/// Host API calls (`api` records): 36 bytes per record.
#[derive(Debug, Default)]
pub(crate) struct Apis {
    pub(crate) start: Col<u64>,
    pub(crate) end: Col<u64>,
    pub(crate) tid: Col<u64>,
    pub(crate) corr: Col<u32>,
    pub(crate) name: Col<u32>,
    pub(crate) cbid: Col<u32>,
}

/// CUDA calls that held their thread (`hostcall` records): 48 bytes per record. `ctx` and
/// `stack` are [`NONE`] when absent, `bytes` is `u64::MAX` when the call's size is unknown.
#[derive(Debug, Default)]
pub(crate) struct Hostcalls {
    pub(crate) start: Col<u64>,
    pub(crate) end: Col<u64>,
    pub(crate) tid: Col<u64>,
    pub(crate) bytes: Col<u64>,
    pub(crate) corr: Col<u32>,
    pub(crate) name: Col<u32>,
    pub(crate) ctx: Col<u32>,
    pub(crate) stack: Col<u32>,
}

/// One allocation, free or failed allocation (`mem` record), as the analysis keeps it: rare
/// records (an allocation is not a launch), kept as rows in file order.
#[derive(Debug, Clone, PartialEq)]
pub struct MemRow {
    pub ts: u64,
    pub op: gpufl_trace::MemOp,
    pub addr: u64,
    pub bytes: u64,
    pub kind: gpufl_trace::MemoryKind,
    pub dev: u32,
    pub corr: u32,
    pub stream: Option<u32>,
    pub pool: Option<u64>,
    pub pool_bytes: Option<u64>,
    /// The API function's name (string index), when the record names it.
    pub api: Option<u32>,
    pub tid: Option<u64>,
    pub stack: Option<StackIx>,
    /// Failed allocations: the device's free bytes at the last telemetry sample.
    pub free: Option<u64>,
    /// An allocation a rolling file started with (`carried`) whose original was not read (its
    /// file deleted): live before the session's first record; `ts` is that first record's time.
    pub carried: bool,
}

/// Host samples (`hsample` records): 33 bytes per sample. `stack` and `call` are [`NONE`] when
/// absent; `state` is a `HostState` byte.
#[derive(Debug, Default)]
pub(crate) struct Hsamples {
    pub(crate) ts: Col<u64>,
    pub(crate) tid: Col<u64>,
    pub(crate) period: Col<u64>,
    pub(crate) stack: Col<u32>,
    pub(crate) call: Col<u32>,
    pub(crate) state: Col<u8>,
}

/// One recorded session, compact and columnar: the header, the interned strings / frames / stacks
/// of every trace file (remapped to one id space), kernels, copies and memsets, synchronizations.
/// API, overhead and callsite records only widen the session's time range; `dropped` records are
/// summed; notices become warnings; telemetry samples become one series per device (94 bytes per
/// sample). `hostcall` records (which widen the time range, as API calls) and host samples
/// (`hsample`, which do not, as telemetry) are kept in file order. Memory is proportional to the
/// session: 36 bytes per kernel, 43 per copy or memset, 45 per synchronization, 48 per hostcall,
/// 33 per host sample, plus the interned tables.
#[derive(Debug, Default)]
pub struct Model {
    header: Option<Header>,
    files: u32,
    pub(crate) strings: Vec<Option<Box<str>>>,
    pub(crate) frames: Vec<Option<FrameRow>>,
    pub(crate) stacks: Vec<Option<Box<[FrameId]>>>,
    /// Stacks whose Python frames were read from another thread: the stack → that thread.
    pub(crate) stack_via: HashMap<StackIx, u64>,
    pub(crate) kernels: Kernels,
    pub(crate) copies: Copies,
    pub(crate) syncs: Syncs,
    pub(crate) apis: Apis,
    pub(crate) hostcalls: Hostcalls,
    pub(crate) hsamples: Hsamples,
    /// `mem` records, in file order.
    pub(crate) mems: Vec<MemRow>,
    /// (device, address, time) of each allocation read, while loading: a `carried` copy of one is
    /// skipped.
    mem_allocs: std::collections::HashSet<(u32, u64, u64)>,
    /// `callsite` records, sorted by corr after loading.
    pub(crate) callsites: Vec<Callsite>,
    /// Distinct kernel launch configurations, in order of first use.
    pub(crate) configs: Vec<LaunchConfig>,
    /// Distinct (kernel name string id, index into `configs`) pairs, in order of first use.
    pub(crate) launches: Vec<(u32, u32)>,
    /// Stack frame per thread of each function name (`function` records: the frame, else the
    /// stack with callees; the largest when several modules have the name), bytes.
    pub(crate) stack_frames: HashMap<u32, u32>,
    /// CUDA graph nodes (`gnode` records) by node id: the stack of the call that created it, and
    /// the node it was cloned from.
    pub(crate) graph_nodes: HashMap<u64, (Option<StackIx>, Option<u64>)>,
    /// Generated source of a function name (`function` records with a `source`): (file string,
    /// line, note string or NONE).
    pub(crate) kernel_sources: HashMap<u32, (u32, u32, u32)>,
    memsets: u64,
    dropped: u64,
    /// The `end` record's reason (the last one's), None without one.
    end_reason: Option<String>,
    first_ns: u64,
    last_ns: u64,
    /// Role of each (ctx, stream) whose role the recorder wrote (the first record wins).
    stream_roles: HashMap<(u32, u32), StreamRole>,
    /// `capture` records (ts, recording), in file order until loaded; then see `paused`.
    capture_marks: Vec<(u64, bool)>,
    /// Intervals in which recording was paused, sorted and disjoint (end `u64::MAX`: never resumed).
    paused: Vec<(u64, u64)>,
    /// Always-on session (`options.mode` "always-on" in a header).
    always_on: bool,
    /// Call sites recorded inside windows only (`options.call_sites` "windows" in a header).
    sites_in_windows: bool,
    /// Some callsite record carried a weight.
    weighted: bool,
    /// `window` records, sorted by start after loading.
    windows: Vec<Window>,
    /// Intervals in which the GPU was not observed, sorted and disjoint: paused intervals, and in
    /// an always-on session everything outside its windows (and outside its GPU records).
    unobserved: Vec<(u64, u64)>,
    /// Device of each context seen on GPU records (the first seen), and the last (ctx, dev) pair
    /// (records come in runs of one context).
    ctx_dev: HashMap<u32, u32>,
    last_ctx_dev: Option<(u32, u32)>,
    /// GPU records (and telemetry samples) of devices beyond the first [`MAX_DEVICES`]: ignored.
    beyond_devices: u64,
    /// NVML samples, one series per device (`telemetry` records; they do not widen the session's
    /// time range: the sampler runs from the recorder's start to its end).
    telemetry: crate::telemetry::SeriesSet,
    devices: Vec<u32>,
    inverted: u64,
    warnings: Vec<String>,
    scope_raw: Vec<crate::scopes::RawScope>,
    pub(crate) scopes: Vec<crate::scopes::ScopeSpan>,
    /// Start/end ranges, as read.
    pub(crate) ranges: Vec<crate::scopes::RangeSpan>,
    /// Kernels a CUDA graph launch ran: (index into `kernels`, graph node), in index order.
    pub(crate) graph_kernels: Vec<(u32, GraphNode)>,
    /// Copies and memsets a CUDA graph launch ran: (index into `copies`, graph node), in order.
    pub(crate) graph_copies: Vec<(u32, GraphNode)>,
    /// `kdetail` and `kstall` records while loading; merged into `kernel_details` and
    /// `kernel_stalls` at the end.
    detail_store: crate::kdetail::DetailStore,
    kernel_details: Vec<crate::kdetail::KernelDetail>,
    kernel_stalls: Vec<crate::kdetail::KernelStalls>,
}

/// A `callsite` record: the stack captured at the API call with correlation id `corr`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Callsite {
    pub(crate) corr: CorrId,
    pub(crate) stack: StackIx,
    /// The API's name (model string id).
    pub(crate) api: u32,
    /// The calls the capture stands for (absent in the record: 1; saturates).
    pub(crate) weight: u32,
}

/// Distinct device ids a session may have (far more GPUs than any machine has): records of further
/// devices are left out with a warning, so per-device work stays bounded whatever the trace.
pub const MAX_DEVICES: usize = 64;

/// Per-file id maps and lookup tables, alive only while loading.
#[derive(Default)]
struct Loader {
    strs: IdMap,
    frames: IdMap,
    stacks: IdMap,
    /// Index of each distinct launch configuration, and of each (name, configuration) pair.
    config_index: HashMap<LaunchConfig, u32>,
    launch_index: HashMap<(u32, u32), u32>,
    /// The last (name, configuration) pair of each kernel name (global string id): launches of
    /// one kernel nearly always repeat its configuration, so most kernels skip the hash lookups.
    last_launch: Vec<u32>,
}

impl Model {
    /// Stream records into the model, in any order a writer produces (interned records may even
    /// come after their first use). Never panics on odd input: ids never defined resolve to `?` and
    /// are counted in [`Model::warnings`]; a second `header` starts a new trace file, whose ids
    /// restart at 0.
    pub fn load(records: impl IntoIterator<Item = Record>) -> Model {
        let mut m = Model {
            first_ns: u64::MAX,
            ..Model::default()
        };
        let mut ld = Loader::default();
        for rec in records {
            m.observe(&mut ld, rec);
        }
        m.finish();
        m
    }

    /// [`Model::load`] from a reader that decodes on several threads: its workers also fold the
    /// runs of the blocks' records into parts of the model (see [`gpufl_trace::BlockFold`]), which are joined
    /// here in file order. The same model as [`Model::load`] over the reader's records.
    pub fn load_items(reader: &mut impl Items) -> Model {
        Self::load_items_with(reader, Arc::new(Spares::default()))
    }

    /// [`Model::load_items`], the columns' chunks taken from `spares` while it has some.
    pub(crate) fn load_items_with(reader: &mut impl Items, spares: Arc<Spares>) -> Model {
        reader.set_fold(Arc::new(ModelFold {
            spares: spares.clone(),
            caller: std::thread::current().id(),
        }));
        let mut m = Model {
            first_ns: u64::MAX,
            ..Model::default()
        };
        let mut ld = Loader::default();
        while let Some(item) = reader.next_item() {
            match item {
                Item::Record(rec) => m.observe(&mut ld, rec),
                Item::Folded(part) => {
                    if let Ok(p) = part.downcast::<Part>() {
                        m.absorb(&mut ld, *p, &spares);
                    }
                }
            }
        }
        #[cfg(test)]
        crate::fold::tests::SPARES_TAKEN.with(|c| c.set(c.get() + spares.lock().taken));
        spares.clear();
        m.finish();
        m
    }

    /// Take a block's part: what [`Model::observe`] does with each of its records, column by
    /// column (record by record when some device of the part is one too many).
    fn absorb(&mut self, ld: &mut Loader, mut p: Part, spares: &Spares) {
        #[cfg(test)]
        crate::fold::tests::ABSORBED.with(|c| c.set(c.get() + 1));
        let beyond = p
            .devs
            .iter()
            .any(|d| self.devices.binary_search(d).is_err() && self.devices.len() >= MAX_DEVICES);
        if beyond {
            self.replay(ld, &p);
            return;
        }
        for &d in &p.devs {
            if let Err(i) = self.devices.binary_search(&d) {
                if self.devices.len() >= MAX_DEVICES {
                    // Not reached: checked above.
                    self.replay(ld, &p);
                    return;
                }
                self.devices.insert(i, d);
            }
        }
        for &(ctx, dev) in &p.ctx_devs {
            self.ctx_dev.entry(ctx).or_insert(dev);
        }
        self.last_ctx_dev = None;
        // Ids in order of first reference: numbered as record by record.
        for &s in &p.strs.order {
            self.str_ref(ld, StrId(s));
        }
        for &s in &p.stacks.order {
            self.stack_ref(ld, StackId(s));
        }
        if p.inverted > 0 {
            self.inverted += p.inverted;
        }
        if p.first_ns <= p.last_ns {
            self.first_ns = self.first_ns.min(p.first_ns);
            self.last_ns = self.last_ns.max(p.last_ns);
        }
        let map: Vec<u32> = p
            .launches
            .iter()
            .map(|&(name, cfg)| {
                let name = self.str_ref(ld, StrId(name));
                self.launch_ref(ld, name, cfg)
            })
            .collect();
        for l in p.k_launch.iter_mut() {
            *l = map[*l as usize];
        }
        let k = &mut self.kernels;
        k.start.extend_spared(&p.k_start, spares);
        k.end.extend_spared(&p.k_end, spares);
        k.corr.extend_spared(&p.k_corr, spares);
        k.launch.extend_spared(&p.k_launch, spares);
        k.stream.extend_spared(&p.k_stream, spares);
        k.ctx.extend_spared(&p.k_ctx, spares);
        k.dev.extend_spared(&p.k_dev, spares);
        let c = &mut self.copies;
        c.start.extend_spared(&p.c_start, spares);
        c.end.extend_spared(&p.c_end, spares);
        c.bytes.extend_spared(&p.c_bytes, spares);
        c.corr.extend_spared(&p.c_corr, spares);
        c.ctx.extend_spared(&p.c_ctx, spares);
        c.stream.extend_spared(&p.c_stream, spares);
        c.dev.extend_spared(&p.c_dev, spares);
        c.op.extend_spared(&p.c_op, spares);
        c.src.extend_spared(&p.c_src, spares);
        c.dst.extend_spared(&p.c_dst, spares);
        self.memsets += p.memsets;
        for s in p.s_stack.iter_mut() {
            if *s != NONE {
                *s = ld.stacks.get(*s).unwrap_or(NONE);
            }
        }
        let y = &mut self.syncs;
        y.start.extend_spared(&p.s_start, spares);
        y.end.extend_spared(&p.s_end, spares);
        y.tid.extend_spared(&p.s_tid, spares);
        y.corr.extend_spared(&p.s_corr, spares);
        y.ctx.extend_spared(&p.s_ctx, spares);
        y.stream.extend_spared(&p.s_stream, spares);
        y.event.extend_spared(&p.s_event, spares);
        y.stack.extend_spared(&p.s_stack, spares);
        y.kind.extend_spared(&p.s_kind, spares);
        for n in p.a_name.iter_mut() {
            *n = ld.strs.get(*n).unwrap_or(NONE);
        }
        let a = &mut self.apis;
        a.start.extend_spared(&p.a_start, spares);
        a.end.extend_spared(&p.a_end, spares);
        a.tid.extend_spared(&p.a_tid, spares);
        a.corr.extend_spared(&p.a_corr, spares);
        a.name.extend_spared(&p.a_name, spares);
        a.cbid.extend_spared(&p.a_cbid, spares);
    }

    /// A part record by record, in file order, as [`Model::observe`] takes the records.
    fn replay(&mut self, ld: &mut Loader, p: &Part) {
        #[cfg(test)]
        crate::fold::tests::REPLAYED.with(|c| c.set(c.get() + 1));
        let (mut k, mut c, mut y, mut a) = (0, 0, 0, 0);
        for &kind in &p.order {
            match kind {
                K_KERNEL => {
                    let i = k;
                    k += 1;
                    if !self.gpu(p.k_ctx[i], p.k_dev[i]) {
                        continue;
                    }
                    self.span(p.k_start[i], p.k_end[i]);
                    let (name, cfg) = p.launches[p.k_launch[i] as usize];
                    let name = self.str_ref(ld, StrId(name));
                    let launch = self.launch_ref(ld, name, cfg);
                    let c = &mut self.kernels;
                    c.launch.push(launch);
                    c.start.push(p.k_start[i]);
                    c.end.push(p.k_end[i]);
                    c.corr.push(p.k_corr[i]);
                    c.stream.push(p.k_stream[i]);
                    c.ctx.push(p.k_ctx[i]);
                    c.dev.push(p.k_dev[i]);
                }
                K_COPY => {
                    let i = c;
                    c += 1;
                    if !self.gpu(p.c_ctx[i], p.c_dev[i]) {
                        continue;
                    }
                    self.span(p.c_start[i], p.c_end[i]);
                    if p.c_op[i] == OP_MEMSET {
                        self.memsets += 1;
                    }
                    self.push_copy(
                        p.c_start[i],
                        p.c_end[i],
                        p.c_bytes[i],
                        [p.c_corr[i], p.c_ctx[i], p.c_stream[i], p.c_dev[i]],
                        [p.c_op[i], p.c_src[i], p.c_dst[i]],
                    );
                }
                K_SYNC => {
                    let i = y;
                    y += 1;
                    self.span(p.s_start[i], p.s_end[i]);
                    let s = p.s_stack[i];
                    let stack = if s == NONE {
                        NONE
                    } else {
                        StackIx::to_raw(Some(self.stack_ref(ld, StackId(s))))
                    };
                    let c = &mut self.syncs;
                    c.start.push(p.s_start[i]);
                    c.end.push(p.s_end[i]);
                    c.tid.push(p.s_tid[i]);
                    c.corr.push(p.s_corr[i]);
                    c.ctx.push(p.s_ctx[i]);
                    c.stream.push(p.s_stream[i]);
                    c.event.push(p.s_event[i]);
                    c.stack.push(stack);
                    c.kind.push(p.s_kind[i]);
                }
                K_API => {
                    let i = a;
                    a += 1;
                    self.span(p.a_start[i], p.a_end[i]);
                    let name = self.str_ref(ld, StrId(p.a_name[i]));
                    let c = &mut self.apis;
                    c.start.push(p.a_start[i]);
                    c.end.push(p.a_end[i]);
                    c.tid.push(p.a_tid[i]);
                    c.corr.push(p.a_corr[i]);
                    c.name.push(name);
                    c.cbid.push(p.a_cbid[i]);
                }
                _ => {}
            }
        }
    }

    /// Take one record: GPU work, synchronizations and API calls into the columns, the interned
    /// tables, and what the other records say about the session.
    #[inline]
    fn observe(&mut self, ld: &mut Loader, rec: Record) {
        match rec {
            Record::Kernel(k) => self.take_kernel(ld, k),
            Record::Memcpy(r) => self.take_memcpy(r),
            Record::Memset(r) => self.take_memset(r),
            Record::Sync(s) => self.take_sync(ld, s),
            Record::Api(a) => self.take_api(ld, a),
            Record::Callsite(c) => self.take_callsite(ld, c),
            Record::Gnode(g) => self.take_gnode(ld, g),
            Record::Function(f) => self.take_function(ld, f),
            Record::Capture(c) => self.capture_marks.push((c.ts, c.recording)),
            Record::Window(w) => self.windows.push(Window {
                start: w.start,
                end: w.end.max(w.start),
                reason: WindowReason::parse(&w.reason),
            }),
            Record::Range(r) => self.take_range(ld, r),
            Record::Scope(sc) => self.take_scope(ld, sc),
            Record::Stream(s) => {
                self.stream_roles.entry((s.ctx, s.stream)).or_insert(s.role);
            }
            Record::Str(s) => {
                let g = self.str_ref(ld, s.id);
                self.strings[g as usize] = Some(s.s.into_boxed_str());
            }
            Record::Frame(f) => self.take_frame(ld, f),
            Record::Stack(s) => self.take_stack(ld, s),
            Record::Header(h) => self.take_header(ld, h),
            Record::Dropped(d) => self.dropped = self.dropped.saturating_add(d.count),
            // Debug notices (the recorder's diagnostics) stay in the trace (`gpufl dump --type notice`).
            Record::Notice(n) if n.level != "info" && n.level != "debug" => self
                .warnings
                .push(format!("recorder {}: {}", n.level, n.message)),
            Record::Telemetry(t) => {
                if !self.telemetry.push(&t, MAX_DEVICES) {
                    self.beyond_devices += 1;
                }
            }
            Record::Kdetail(k) => {
                let name = self.str_ref(ld, k.name);
                let files = self.detail_files(ld, k.lines.iter().map(|l| l.file));
                self.detail_store.add_detail(&k, name, &files);
            }
            Record::Kstall(k) => {
                let name = self.str_ref(ld, k.name);
                let files = self.detail_files(ld, k.lines.iter().map(|l| l.file));
                self.detail_store.add_stalls(&k, name, &files);
            }
            Record::Hostcall(h) => self.take_hostcall(ld, h),
            Record::Hsample(h) => self.take_hsample(ld, h),
            Record::Mem(m) => self.take_mem(ld, m),
            Record::End(e) => self.end_reason = Some(e.reason),
            Record::Notice(_) | Record::Overhead(_) => {}
        }
    }

    #[inline]
    fn take_kernel(&mut self, ld: &mut Loader, k: gpufl_trace::Kernel) {
        if !self.gpu(k.ctx, k.dev) {
            return;
        }
        self.span(k.start, k.end);
        let name = self.str_ref(ld, k.name);
        let cfg = LaunchConfig {
            grid: k.grid,
            block: k.block,
            regs: k.regs,
            smem_static: k.smem_static,
            smem_dynamic: k.smem_dynamic,
            local_mem: k.local_mem,
            smem_executed: k.smem_executed,
        };
        let launch = self.launch_ref(ld, name, cfg);
        let c = &mut self.kernels;
        c.launch.push(launch);
        c.start.push(k.start);
        c.end.push(k.end);
        c.corr.push(k.corr);
        c.stream.push(k.stream);
        c.ctx.push(k.ctx);
        c.dev.push(k.dev);
        if let Some(g) = k.graph {
            let i = c.start.len() - 1;
            self.graph_kernels.push((i as u32, g));
        }
    }

    #[inline]
    fn take_memcpy(&mut self, r: gpufl_trace::Memcpy) {
        if !self.gpu(r.ctx, r.dev) {
            return;
        }
        self.span(r.start, r.end);
        let (op, src, dst) = (
            copy_kind_to_u8(r.kind),
            mem_kind_to_u8(r.src_kind),
            mem_kind_to_u8(r.dst_kind),
        );
        self.push_copy(
            r.start,
            r.end,
            r.bytes,
            [r.corr, r.ctx, r.stream, r.dev],
            [op, src, dst],
        );
        self.graph_copy(r.graph);
    }

    #[inline]
    fn take_memset(&mut self, r: gpufl_trace::Memset) {
        if !self.gpu(r.ctx, r.dev) {
            return;
        }
        self.span(r.start, r.end);
        self.memsets += 1;
        let mk = mem_kind_to_u8(r.mem_kind);
        self.push_copy(
            r.start,
            r.end,
            r.bytes,
            [r.corr, r.ctx, r.stream, r.dev],
            [OP_MEMSET, mk, 0],
        );
        self.graph_copy(r.graph);
    }

    #[inline]
    fn take_sync(&mut self, ld: &mut Loader, s: gpufl_trace::Sync) {
        self.span(s.start, s.end);
        let stack = StackIx::to_raw(s.stack.map(|id| self.stack_ref(ld, id)));
        let c = &mut self.syncs;
        c.start.push(s.start);
        c.end.push(s.end);
        c.tid.push(s.tid.unwrap_or(u64::MAX));
        c.corr.push(s.corr);
        c.ctx.push(s.ctx);
        c.stream.push(s.stream.unwrap_or(NONE));
        c.event.push(s.event.unwrap_or(NONE));
        c.stack.push(stack);
        c.kind.push(sync_kind_to_u8(s.kind));
    }

    #[inline]
    fn take_api(&mut self, ld: &mut Loader, a: gpufl_trace::Api) {
        self.span(a.start, a.end);
        let name = self.str_ref(ld, a.name);
        let c = &mut self.apis;
        c.start.push(a.start);
        c.end.push(a.end);
        c.tid.push(a.tid);
        c.corr.push(a.corr);
        c.name.push(name);
        c.cbid.push(a.cbid);
    }

    fn take_hostcall(&mut self, ld: &mut Loader, h: gpufl_trace::Hostcall) {
        self.span(h.start, h.end);
        let name = self.str_ref(ld, h.name);
        let stack = StackIx::to_raw(h.stack.map(|id| self.stack_ref(ld, id)));
        let c = &mut self.hostcalls;
        c.start.push(h.start);
        c.end.push(h.end);
        c.tid.push(h.tid);
        c.bytes.push(h.bytes.unwrap_or(u64::MAX));
        c.corr.push(h.corr);
        c.name.push(name);
        c.ctx.push(h.ctx.unwrap_or(NONE));
        c.stack.push(stack);
    }

    /// An allocation, free or failed allocation: kept, widening the session's time range (an
    /// out-of-memory may be the last thing the program did).
    fn take_mem(&mut self, ld: &mut Loader, m: gpufl_trace::Mem) {
        if m.carried {
            // Written again at a rolling file's start: the original was read, or its file is
            // gone (then it was live before what is left; it does not widen the time range).
            if m.op != gpufl_trace::MemOp::Alloc || self.mem_allocs.contains(&(m.dev, m.addr, m.ts))
            {
                return;
            }
        } else {
            self.span(m.ts, m.ts);
        }
        if m.op == gpufl_trace::MemOp::Alloc {
            self.mem_allocs.insert((m.dev, m.addr, m.ts));
        }
        let stack = m.stack.map(|id| self.stack_ref(ld, id));
        let api = m.api.map(|id| self.str_ref(ld, id));
        self.mems.push(MemRow {
            ts: m.ts,
            op: m.op,
            addr: m.addr,
            bytes: m.bytes,
            kind: m.mem_kind,
            dev: m.dev,
            corr: m.corr,
            stream: m.stream,
            pool: m.pool,
            pool_bytes: m.pool_bytes,
            api,
            tid: m.tid,
            stack,
            free: m.free,
            carried: m.carried,
        });
    }

    /// A host sample: kept, without widening the session's time range (the sampler runs from the
    /// recorder's start to its end, as telemetry).
    fn take_hsample(&mut self, ld: &mut Loader, h: gpufl_trace::Hsample) {
        let stack = StackIx::to_raw(h.stack.map(|id| self.stack_ref(ld, id)));
        let call = h.call.map_or(NONE, |id| self.str_ref(ld, id));
        let c = &mut self.hsamples;
        c.ts.push(h.ts);
        c.tid.push(h.tid);
        c.period.push(h.period_ns);
        c.stack.push(stack);
        c.call.push(call);
        c.state.push(host_state_to_u8(h.state));
    }

    #[inline]
    fn take_callsite(&mut self, ld: &mut Loader, c: gpufl_trace::Callsite) {
        self.span(c.ts, c.ts);
        let stack = self.stack_ref(ld, c.stack);
        let api = self.str_ref(ld, c.api);
        let w = u32::try_from(c.weight.unwrap_or(1)).unwrap_or(u32::MAX);
        self.weighted |= c.weight.is_some();
        self.callsites.push(Callsite {
            corr: CorrId(c.corr),
            stack,
            api,
            weight: w,
        });
    }

    fn take_gnode(&mut self, ld: &mut Loader, g: gpufl_trace::Gnode) {
        if self.graph_nodes.len() < MAX_GRAPH_NODES {
            let stack = g.stack.map(|id| self.stack_ref(ld, id));
            let from = g.from.map(|f| f.1);
            // A node may have two records (created at instantiation, with a stack, and
            // cloned from the captured node): keep the first of each field.
            let e = self.graph_nodes.entry(g.node).or_insert((None, None));
            if e.0.is_none() {
                e.0 = stack;
            }
            if e.1.is_none() {
                e.1 = from;
            }
        }
    }

    fn take_function(&mut self, ld: &mut Loader, f: gpufl_trace::Function) {
        if let Some(b) = f.frame.or(f.stack) {
            let name = self.str_ref(ld, f.name);
            let e = self.stack_frames.entry(name).or_insert(b);
            *e = (*e).max(b);
        }
        if let Some(src) = f.source {
            let name = self.str_ref(ld, f.name);
            let file = self.str_ref(ld, src.file);
            let note = src.note.map_or(NONE, |n| self.str_ref(ld, n));
            // The first record of a name wins.
            if self.kernel_sources.len() < MAX_KERNEL_SOURCES {
                self.kernel_sources
                    .entry(name)
                    .or_insert((file, src.line, note));
            }
        }
    }

    fn take_range(&mut self, ld: &mut Loader, r: gpufl_trace::Range) {
        self.span(r.start, r.end.max(r.start));
        let name = self.str_ref(ld, r.name);
        self.ranges.push(crate::scopes::RangeSpan {
            name,
            start: r.start,
            end: r.end.max(r.start),
            tid: r.tid,
            end_tid: r.end_tid,
        });
    }

    fn take_scope(&mut self, ld: &mut Loader, sc: gpufl_trace::Scope) {
        self.span(sc.ts, sc.ts);
        let name = self.str_ref(ld, sc.name);
        self.scope_raw.push(crate::scopes::RawScope {
            tid: sc.tid,
            ts: sc.ts,
            name,
            end: sc.end,
            nvtx: sc.source == gpufl_trace::ScopeSource::Nvtx,
        });
    }

    fn take_frame(&mut self, ld: &mut Loader, f: gpufl_trace::Frame) {
        let opt = |m: &mut Self, ld: &mut Loader, id: Option<StrId>| {
            id.map_or(NONE, |id| m.str_ref(ld, id))
        };
        let row = FrameRow {
            kind: f.kind,
            inlined: f.inlined,
            module: opt(self, ld, f.module),
            func: opt(self, ld, f.func),
            file: opt(self, ld, f.file),
            line: f.line.unwrap_or(NONE),
            offset: f.offset,
            text: opt(self, ld, f.text),
        };
        let g = self.frame_ref(ld, f.id);
        self.frames[g as usize] = Some(row);
    }

    fn take_stack(&mut self, ld: &mut Loader, s: gpufl_trace::Stack) {
        let frames: Box<[FrameId]> = s
            .frames
            .iter()
            .map(|&f| FrameId(self.frame_ref(ld, f)))
            .collect();
        let g = self.stack_ref(ld, s.id);
        self.stacks[g.index()] = Some(frames);
        if let Some(t) = s.via_tid {
            self.stack_via.insert(g, t);
        }
    }

    fn take_header(&mut self, ld: &mut Loader, h: Box<Header>) {
        self.files += 1;
        if self.files > 1 {
            // A new trace file: its interning starts again at 0.
            ld.strs.clear();
            ld.frames.clear();
            ld.stacks.clear();
        }
        self.always_on |= h.options.mode.as_deref() == Some("always-on");
        self.sites_in_windows |= h.options.call_sites.as_deref() == Some("windows");
        match &self.header {
            None => self.header = Some(*h),
            Some(first) if first.session_id != h.session_id => self.warnings.push(format!(
                "records of another session ({}) are mixed into {}",
                h.session_id, first.session_id
            )),
            Some(_) => {}
        }
    }

    /// Model string ids of a kernel-detail record's files; once the store holds all the lines it
    /// keeps, ids not yet seen are not given a slot ([`NONE`]).
    fn detail_files(&mut self, ld: &mut Loader, files: impl Iterator<Item = StrId>) -> Vec<u32> {
        if self.detail_store.lines_full() {
            files.map(|f| ld.strs.get(f.0).unwrap_or(NONE)).collect()
        } else {
            files.map(|f| self.str_ref(ld, f)).collect()
        }
    }

    /// The index in `launches` of the kernel's (name, configuration), adding either the first time.
    fn launch_ref(&mut self, ld: &mut Loader, name: u32, cfg: LaunchConfig) -> u32 {
        let slot = name as usize;
        if let Some(&l) = ld.last_launch.get(slot) {
            if let Some(&(_, c)) = self.launches.get(l as usize) {
                if self.configs[c as usize] == cfg {
                    return l;
                }
            }
        }
        let configs = &mut self.configs;
        let c = *ld.config_index.entry(cfg).or_insert_with(|| {
            configs.push(cfg);
            (configs.len() - 1) as u32
        });
        let launches = &mut self.launches;
        let l = *ld.launch_index.entry((name, c)).or_insert_with(|| {
            launches.push((name, c));
            (launches.len() - 1) as u32
        });
        if slot >= ld.last_launch.len() {
            ld.last_launch.resize(slot + 1, NONE);
        }
        ld.last_launch[slot] = l;
        l
    }

    fn push_copy(&mut self, start: u64, end: u64, bytes: u64, ids: [u32; 4], kinds: [u8; 3]) {
        let c = &mut self.copies;
        c.start.push(start);
        c.end.push(end);
        c.bytes.push(bytes);
        c.corr.push(ids[0]);
        c.ctx.push(ids[1]);
        c.stream.push(ids[2]);
        c.dev.push(ids[3]);
        c.op.push(kinds[0]);
        c.src.push(kinds[1]);
        c.dst.push(kinds[2]);
    }

    /// Note the graph node of the copy or memset just pushed.
    fn graph_copy(&mut self, g: Option<GraphNode>) {
        if let (Some(g), Some(i)) = (g, self.copies.start.len().checked_sub(1)) {
            self.graph_copies.push((i as u32, g));
        }
    }

    fn span(&mut self, start: u64, end: u64) {
        if end < start {
            self.inverted += 1;
        }
        self.first_ns = self.first_ns.min(start);
        self.last_ns = self.last_ns.max(end.max(start));
    }

    /// Note a GPU record's context and device; false (the record is left out) for a device beyond
    /// the first [`MAX_DEVICES`].
    fn gpu(&mut self, ctx: u32, dev: u32) -> bool {
        if self.last_ctx_dev == Some((ctx, dev)) {
            return true;
        }
        if let Err(i) = self.devices.binary_search(&dev) {
            if self.devices.len() >= MAX_DEVICES {
                self.beyond_devices += 1;
                return false;
            }
            self.devices.insert(i, dev);
        }
        self.ctx_dev.entry(ctx).or_insert(dev);
        self.last_ctx_dev = Some((ctx, dev));
        true
    }

    fn str_ref(&mut self, ld: &mut Loader, id: StrId) -> u32 {
        let t = &mut self.strings;
        ld.strs.get_or_alloc(id.0, || {
            t.push(None);
            (t.len() - 1) as u32
        })
    }

    fn frame_ref(&mut self, ld: &mut Loader, id: FrameId) -> u32 {
        let t = &mut self.frames;
        ld.frames.get_or_alloc(id.0, || {
            t.push(None);
            (t.len() - 1) as u32
        })
    }

    fn stack_ref(&mut self, ld: &mut Loader, id: StackId) -> StackIx {
        let t = &mut self.stacks;
        let raw = ld.stacks.get_or_alloc(id.0, || {
            t.push(None);
            (t.len() - 1) as u32
        });
        // The map holds only indices it was given: never NONE.
        StackIx::at(raw as usize)
    }

    fn finish(&mut self) {
        // Stable: of two callsites with one corr (never written by the recorder), the first wins.
        self.callsites.sort_by_key(|c| c.corr);
        self.telemetry.finish();
        if self.first_ns > self.last_ns {
            (self.first_ns, self.last_ns) = (0, 0);
        }
        self.mem_allocs = Default::default();
        let first = self.first_ns;
        for r in self.mems.iter_mut().filter(|r| r.carried) {
            r.ts = r.ts.max(first);
        }
        self.paused = paused_ranges(std::mem::take(&mut self.capture_marks));
        self.windows.sort_by_key(|w| (w.start, w.end));
        self.unobserved = self.unobserved_ranges();
        if !self.detail_store.is_empty() {
            let store = std::mem::take(&mut self.detail_store);
            let (details, stalls, w) = store.finish(|id| self.str(StrId(id)).to_string());
            self.kernel_details = details;
            self.kernel_stalls = stalls;
            self.warnings.extend(w);
        }
        let (scopes, scope_warnings) =
            crate::scopes::build(std::mem::take(&mut self.scope_raw), self.last_ns);
        self.scopes = scopes;
        self.warnings.extend(scope_warnings);
        let undefined = |n: usize, what: &str| (n > 0).then(|| format!("{n} {what}"));
        let missing: Vec<String> = [
            undefined(
                self.strings.iter().filter(|s| s.is_none()).count(),
                "string(s)",
            ),
            undefined(
                self.frames.iter().filter(|s| s.is_none()).count(),
                "frame(s)",
            ),
            undefined(
                self.stacks.iter().filter(|s| s.is_none()).count(),
                "stack(s)",
            ),
        ]
        .into_iter()
        .flatten()
        .collect();
        if !missing.is_empty() {
            self.warnings.push(format!(
                "{} referenced but never defined (a lost block?): shown as '?'",
                missing.join(", ")
            ));
        }
        if self.beyond_devices > 0 {
            self.warnings.push(format!(
                "{} GPU record(s) and telemetry sample(s) of devices beyond the first {MAX_DEVICES} device ids: ignored (a corrupt trace?)",
                self.beyond_devices
            ));
        }
        if self.inverted > 0 {
            self.warnings.push(format!(
                "{} record(s) end before they start: counted as zero-length",
                self.inverted
            ));
        }
        if self.dropped > 0 {
            self.warnings.push(format!(
                "{} record(s) were lost while recording: counts and times are lower bounds",
                self.dropped
            ));
        }
        if let Some(h) = &self.header {
            if h.capture.status != "ok" {
                let why = h.capture.reason.as_deref().unwrap_or("no reason given");
                self.warnings
                    .push(format!("capture {}: {why}", h.capture.status));
            }
        }
    }

    /// The GPU's not-observed intervals: the paused ones, and in an always-on session the
    /// complement of its windows; a GPU record outside every window (collected as a window
    /// closed) counts as observed over its own span.
    fn unobserved_ranges(&self) -> Vec<(u64, u64)> {
        if !self.always_on {
            return self.paused.clone();
        }
        let mut seen: Vec<(u64, u64)> = self.windows.iter().map(|w| (w.start, w.end)).collect();
        let inside = |w: &[(u64, u64)], s: u64, e: u64| {
            let i = w.partition_point(|x| x.1 < e);
            w.get(i).is_some_and(|x| x.0 <= s)
        };
        let mut extra = Vec::new();
        {
            let merged = crate::intervals::merge(&mut seen);
            let k = &self.kernels;
            let c = &self.copies;
            let spans = k
                .start
                .iter()
                .zip(k.end.iter())
                .chain(c.start.iter().zip(c.end.iter()));
            for (s, e) in spans {
                let e = e.max(s);
                if !inside(merged, s, e) {
                    extra.push((s, e));
                }
            }
            let n = merged.len();
            seen.truncate(n);
        }
        seen.extend(extra);
        let n = crate::intervals::merge(&mut seen).len();
        seen.truncate(n);
        // The complement of what was seen, then the paused intervals added.
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(seen.len() + 1 + self.paused.len());
        let mut at = 0u64;
        for &(s, e) in &seen {
            if s > at {
                out.push((at, s));
            }
            at = e;
        }
        if at < u64::MAX {
            out.push((at, u64::MAX));
        }
        out.extend(self.paused.iter().copied());
        let n = crate::intervals::merge(&mut out).len();
        out.truncate(n);
        out
    }

    /// Whether the session was recorded in always-on mode (`options.mode` "always-on" in a
    /// header): GPU activity only inside [`Model::windows`].
    pub fn is_always_on(&self) -> bool {
        self.always_on
    }

    /// Whether launch and copy call sites were recorded inside the windows only (always-on
    /// recorders from 2026-11-25), not throughout the run.
    pub fn call_sites_in_windows(&self) -> bool {
        self.sites_in_windows
    }

    /// The session's `window` records (always-on), by start.
    pub fn windows(&self) -> &[Window] {
        &self.windows
    }

    /// Whether some `callsite` record carried a `weight` (sampled call sites).
    pub fn has_callsite_weights(&self) -> bool {
        self.weighted
    }

    /// Intervals (ns, trace clock) in which the GPU was not observed, sorted and disjoint: the
    /// paused intervals, and in an always-on session everything outside its windows. GPU idle time
    /// there is unknown; synchronizations there are recorded all the same (unless paused).
    pub fn unobserved(&self) -> &[(u64, u64)] {
        &self.unobserved
    }

    /// Time inside `[a, b)` in which the GPU was not observed, ns (= [`Model::paused_in`] in a
    /// default-mode session).
    pub fn unobserved_in(&self, a: u64, b: u64) -> u64 {
        crate::intervals::overlap_ns(&self.unobserved, a, b)
    }

    /// The GPU-observed intervals inside the session's time range, sorted and disjoint.
    pub fn observed(&self) -> Vec<(u64, u64)> {
        let (first, last) = self.time_range();
        let mut out = Vec::new();
        let mut at = first;
        let i = self.unobserved.partition_point(|p| p.1 <= first);
        for &(s, e) in &self.unobserved[i..] {
            if s >= last {
                break;
            }
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
        }
        if at < last {
            out.push((at, last));
        }
        out
    }

    /// GPU-observed time inside the session's time range, ns: the time range less
    /// [`Model::unobserved`].
    pub fn observed_ns(&self) -> u64 {
        let (first, last) = self.time_range();
        (last - first).saturating_sub(self.unobserved_in(first, last))
    }

    /// [`Model::observed_ns`] over the session's time range, 0..1 (1 for an empty range).
    pub fn coverage(&self) -> f64 {
        let (first, last) = self.time_range();
        if last <= first {
            1.0
        } else {
            self.observed_ns() as f64 / (last - first) as f64
        }
    }

    /// The first trace file's header (None if no header was read).
    pub fn header(&self) -> Option<&Header> {
        self.header.as_ref()
    }

    /// Problems met while loading, then those the caller added (the reader's, with
    /// [`Model::add_warnings`]).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Append warnings (typically `SessionReader::warnings()` once the reader is exhausted).
    pub fn add_warnings(&mut self, w: impl IntoIterator<Item = String>) {
        self.warnings.extend(w);
    }

    /// Trace files read (headers seen).
    pub fn files(&self) -> u32 {
        self.files
    }

    /// First and last time (ns, trace clock) of any kernel, copy, memset, sync, API, callsite or
    /// scope record; `(0, 0)` when there is none. CUPTI `overhead` records are left out: they are the
    /// recorder's own buffer flushes, which can run after the program's last CUDA activity.
    pub fn time_range(&self) -> (u64, u64) {
        (self.first_ns, self.last_ns)
    }

    /// Intervals (ns, trace clock) in which the program had paused recording, sorted and disjoint;
    /// the end of one never resumed is `u64::MAX`. Nothing was recorded there: no GPU work, no
    /// API call, no synchronization.
    pub fn paused(&self) -> &[(u64, u64)] {
        &self.paused
    }

    /// Paused time inside `[a, b)`, ns.
    pub fn paused_in(&self, a: u64, b: u64) -> u64 {
        crate::intervals::overlap_ns(&self.paused, a, b)
    }

    /// Devices with at least one kernel, copy or memset, ascending.
    pub fn devices(&self) -> &[u32] {
        &self.devices
    }

    /// Device of a context, if a GPU record of that context was seen.
    pub fn device_of_ctx(&self, ctx: u32) -> Option<u32> {
        self.ctx_dev.get(&ctx).copied()
    }

    /// Whether the recorder wrote the role of any stream (`stream` records).
    pub(crate) fn has_stream_roles(&self) -> bool {
        !self.stream_roles.is_empty()
    }

    /// The role of a stream, if the recorder wrote it (`stream` records).
    pub fn stream_role(&self, ctx: u32, stream: u32) -> Option<StreamRole> {
        self.stream_roles.get(&(ctx, stream)).copied()
    }

    pub fn kernel_count(&self) -> usize {
        self.kernels.start.len()
    }
    /// Memcpys and memsets together (see [`Model::memset_count`]).
    pub fn copy_count(&self) -> usize {
        self.copies.start.len()
    }
    pub fn memset_count(&self) -> usize {
        self.memsets as usize
    }
    pub fn sync_count(&self) -> usize {
        self.syncs.start.len()
    }
    pub fn api_count(&self) -> u64 {
        self.apis.start.len() as u64
    }
    pub fn callsite_count(&self) -> usize {
        self.callsites.len()
    }
    /// `hostcall` records: CUDA calls that held their thread past the recorder's threshold.
    pub fn hostcall_count(&self) -> usize {
        self.hostcalls.start.len()
    }
    /// `mem` records (allocations, frees, failed allocations), in file order.
    pub fn mems(&self) -> &[MemRow] {
        &self.mems
    }
    /// `hsample` records: the host sampler's samples.
    pub fn hsample_count(&self) -> usize {
        self.hsamples.ts.len()
    }
    /// Whether the session has host records (`hostcall` or `hsample`): the analysis then says
    /// what the host was doing during GPU idle gaps; without them its findings are as before.
    pub fn has_host_records(&self) -> bool {
        self.hostcall_count() > 0 || self.hsample_count() > 0
    }
    /// Telemetry series, one per device that has samples, by device.
    pub fn telemetry(&self) -> &[crate::telemetry::Series] {
        &self.telemetry.series
    }
    /// Instruction-level counters of kernels (`kdetail` records), merged per kernel name and
    /// device, by name then device.
    pub fn kernel_details(&self) -> &[crate::kdetail::KernelDetail] {
        &self.kernel_details
    }

    /// The merged counters of a kernel name on a device.
    pub fn kernel_detail(&self, name: &str, dev: u32) -> Option<&crate::kdetail::KernelDetail> {
        let i = self
            .kernel_details
            .binary_search_by(|d| (d.name.as_str(), d.device).cmp(&(name, dev)))
            .ok()?;
        self.kernel_details.get(i)
    }

    /// PC sampling's stall reasons of kernels (`kstall` records), merged per kernel name and
    /// device, by name then device.
    pub fn kernel_stalls(&self) -> &[crate::kdetail::KernelStalls] {
        &self.kernel_stalls
    }

    /// The merged stall reasons of a kernel name on a device.
    pub fn kernel_stall(&self, name: &str, dev: u32) -> Option<&crate::kdetail::KernelStalls> {
        let i = self
            .kernel_stalls
            .binary_search_by(|d| (d.name.as_str(), d.device).cmp(&(name, dev)))
            .ok()?;
        self.kernel_stalls.get(i)
    }

    /// Records the recorder reported lost (sum of `dropped` records).
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Synchronizations that carry a stack.
    pub fn syncs_with_stack(&self) -> u64 {
        (0..self.sync_count())
            .filter(|&i| self.sync_stack(i).is_some())
            .count() as u64
    }

    /// How the session ended (its `end` record's reason); None without one (killed, or still
    /// running).
    pub fn end_reason(&self) -> Option<&str> {
        self.end_reason.as_deref()
    }
}

/// Why a window of an always-on session was open (`window.reason`).
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum WindowReason {
    /// The cost budget's periodic window.
    Sampled,
    /// `gpufl trigger` / the trigger signal.
    Trigger,
    /// `gpufl_capture_window`.
    Api,
    /// A reason this version does not know.
    Other,
}

impl WindowReason {
    fn parse(s: &str) -> WindowReason {
        match s {
            "sampled" => WindowReason::Sampled,
            "trigger" => WindowReason::Trigger,
            "api" => WindowReason::Api,
            _ => WindowReason::Other,
        }
    }
}

/// One `window` record: GPU activity was collected in `[start, end)` (trace clock, ns).
#[derive(serde::Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub start: u64,
    pub end: u64,
    pub reason: WindowReason,
}

/// Paused intervals from `capture` marks in any order: a pause opens one (a second pause does not
/// move it), a resume closes it (a resume while recording does nothing).
fn paused_ranges(mut marks: Vec<(u64, bool)>) -> Vec<(u64, u64)> {
    // Stable: marks at one instant keep their file order.
    marks.sort_by_key(|m| m.0);
    let mut out = Vec::new();
    let mut open: Option<u64> = None;
    for (ts, recording) in marks {
        match (open, recording) {
            (None, false) => open = Some(ts),
            (Some(from), true) => {
                out.push((from, ts));
                open = None;
            }
            _ => {}
        }
    }
    if let Some(from) = open {
        out.push((from, u64::MAX));
    }
    out
}
