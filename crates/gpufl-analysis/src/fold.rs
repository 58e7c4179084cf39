//! Loading the [`Model`](crate::Model) on the reader's workers: each worker folds the runs of
//! records of the blocks it decoded into [`Part`]s (columns with the trace file's own ids, the distinct
//! launch configurations, the ids in order of first reference), and the caller joins the parts
//! in file order ([`Model::absorb`](crate::Model)), so that the model is the one
//! [`Model::load`](crate::Model::load) builds record by record: the same global ids in the same
//! order (strings, stacks and launches are numbered in order of first reference, which the part
//! keeps), the same columns, the same counts.
//!
//! A part holds the timed records and API calls only (kernels, copies, memsets,
//! synchronizations, `api` and `overhead` records): any other record (interned strings, frames,
//! stacks, call sites, hostcalls and host samples, telemetry, …) ends a run and is handed out by
//! itself, between the parts of its block, and the records of a run shorter than 64 come one by
//! one.
//! A part also keeps the order of its records (one byte each), so that a part whose devices go
//! beyond [`MAX_DEVICES`](crate::model::MAX_DEVICES) can be replayed record by record.

use crate::store::{Spares, NONE};
use crate::views::{copy_kind_to_u8, mem_kind_to_u8, sync_kind_to_u8, LaunchConfig, OP_MEMSET};
use gpufl_trace::{BlockFold, BlockFolding, Record};
use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::thread::ThreadId;

/// Record kinds of a part, in file order (see [`Part::order`]).
pub(crate) const K_KERNEL: u8 = 0;
pub(crate) const K_COPY: u8 = 1;
pub(crate) const K_SYNC: u8 = 2;
pub(crate) const K_API: u8 = 3;
pub(crate) const K_OTHER: u8 = 4;

/// Local ids below this are looked up in a vector, others in a hash set.
const DENSE_IDS: u32 = 1 << 16;

/// A set of ids that remembers the order in which they were first added.
#[derive(Default)]
pub(crate) struct FirstSeen {
    dense: Vec<bool>,
    sparse: HashSet<u32>,
    pub(crate) order: Vec<u32>,
}

impl FirstSeen {
    #[inline]
    fn note(&mut self, id: u32) {
        let new = if id < DENSE_IDS {
            let i = id as usize;
            if i >= self.dense.len() {
                self.dense.resize(i + 1, false);
            }
            !std::mem::replace(&mut self.dense[i], true)
        } else {
            self.sparse.insert(id)
        };
        if new {
            self.order.push(id);
        }
    }
}

/// One run's kernels, copies, memsets, synchronizations and API calls, with the trace file's
/// ids (kernel launches: indexes into `launches`).
#[derive(Default)]
pub(crate) struct Part {
    pub(crate) k_start: Vec<u64>,
    pub(crate) k_end: Vec<u64>,
    pub(crate) k_corr: Vec<u32>,
    pub(crate) k_launch: Vec<u32>,
    pub(crate) k_stream: Vec<u32>,
    pub(crate) k_ctx: Vec<u32>,
    pub(crate) k_dev: Vec<u32>,
    /// Distinct (file string id of the name, configuration) pairs, in order of first use.
    pub(crate) launches: Vec<(u32, LaunchConfig)>,
    pub(crate) c_start: Vec<u64>,
    pub(crate) c_end: Vec<u64>,
    pub(crate) c_bytes: Vec<u64>,
    pub(crate) c_corr: Vec<u32>,
    pub(crate) c_ctx: Vec<u32>,
    pub(crate) c_stream: Vec<u32>,
    pub(crate) c_dev: Vec<u32>,
    pub(crate) c_op: Vec<u8>,
    pub(crate) c_src: Vec<u8>,
    pub(crate) c_dst: Vec<u8>,
    pub(crate) memsets: u64,
    pub(crate) s_start: Vec<u64>,
    pub(crate) s_end: Vec<u64>,
    pub(crate) s_tid: Vec<u64>,
    pub(crate) s_corr: Vec<u32>,
    pub(crate) s_ctx: Vec<u32>,
    pub(crate) s_stream: Vec<u32>,
    pub(crate) s_event: Vec<u32>,
    /// File stack id, or [`NONE`].
    pub(crate) s_stack: Vec<u32>,
    pub(crate) s_kind: Vec<u8>,
    pub(crate) a_start: Vec<u64>,
    pub(crate) a_end: Vec<u64>,
    pub(crate) a_tid: Vec<u64>,
    pub(crate) a_corr: Vec<u32>,
    /// File string id.
    pub(crate) a_name: Vec<u32>,
    pub(crate) a_cbid: Vec<u32>,
    /// File string ids in order of first reference (kernel and API names).
    pub(crate) strs: FirstSeen,
    /// File stack ids in order of first reference.
    pub(crate) stacks: FirstSeen,
    /// Devices in order of first appearance, and distinct (ctx, device) pairs likewise.
    pub(crate) devs: Vec<u32>,
    pub(crate) ctx_devs: Vec<(u32, u32)>,
    /// The kind of each record (`K_*`), in file order.
    pub(crate) order: Vec<u8>,
    /// Earliest start, latest end (or start), records that end before they start.
    pub(crate) first_ns: u64,
    pub(crate) last_ns: u64,
    pub(crate) inverted: u64,
}

impl Part {
    #[inline]
    fn span(&mut self, start: u64, end: u64) {
        if end < start {
            self.inverted += 1;
        }
        self.first_ns = self.first_ns.min(start);
        self.last_ns = self.last_ns.max(end.max(start));
    }
}

/// Builds [`Part`]s on the reader's workers.
pub(crate) struct ModelFold {
    /// Where the workers leave the chunks the caller's columns will fill (see [`Spares`]).
    pub(crate) spares: Arc<Spares>,
    /// The caller's thread: a block it folds itself makes no spare chunks (touching them there
    /// costs what the join's page faults would); a worker makes them later.
    pub(crate) caller: ThreadId,
}

/// A worker's lookups while folding one run.
struct Folding {
    p: Part,
    /// Index in `p.launches` of each (name, configuration), and the last one of each name.
    launch_index: HashMap<(u32, LaunchConfig), u32>,
    last_launch: Vec<u32>,
    seen_pairs: HashSet<(u32, u32)>,
    last_pair: Option<(u32, u32)>,
    /// Where to make (on a worker) or count (on the caller) the chunks the part will fill.
    spares: Arc<Spares>,
    worker: bool,
}

impl Folding {
    #[inline]
    fn gpu(&mut self, ctx: u32, dev: u32) {
        if self.last_pair == Some((ctx, dev)) {
            return;
        }
        self.last_pair = Some((ctx, dev));
        if self.seen_pairs.insert((ctx, dev)) {
            self.p.ctx_devs.push((ctx, dev));
            if !self.p.devs.contains(&dev) {
                self.p.devs.push(dev);
            }
        }
    }

    #[inline]
    fn launch(&mut self, name: u32, cfg: LaunchConfig) -> u32 {
        if let Some(&l) = self.last_launch.get(name as usize) {
            if l != NONE && self.p.launches[l as usize].1 == cfg {
                return l;
            }
        }
        self.p.strs.note(name);
        let launches = &mut self.p.launches;
        let l = *self.launch_index.entry((name, cfg)).or_insert_with(|| {
            launches.push((name, cfg));
            (launches.len() - 1) as u32
        });
        if name < DENSE_IDS {
            let slot = name as usize;
            if slot >= self.last_launch.len() {
                self.last_launch.resize(slot + 1, NONE);
            }
            self.last_launch[slot] = l;
        }
        l
    }

    fn record(&mut self, rec: Record) {
        match rec {
            Record::Kernel(k) => {
                self.p.order.push(K_KERNEL);
                self.gpu(k.ctx, k.dev);
                self.p.span(k.start, k.end);
                let cfg = LaunchConfig {
                    grid: k.grid,
                    block: k.block,
                    regs: k.regs,
                    smem_static: k.smem_static,
                    smem_dynamic: k.smem_dynamic,
                    local_mem: k.local_mem,
                    smem_executed: k.smem_executed,
                };
                let l = self.launch(k.name.0, cfg);
                let p = &mut self.p;
                p.k_launch.push(l);
                p.k_start.push(k.start);
                p.k_end.push(k.end);
                p.k_corr.push(k.corr);
                p.k_stream.push(k.stream);
                p.k_ctx.push(k.ctx);
                p.k_dev.push(k.dev);
            }
            Record::Memcpy(r) => {
                self.gpu(r.ctx, r.dev);
                let ops = [
                    copy_kind_to_u8(r.kind),
                    mem_kind_to_u8(r.src_kind),
                    mem_kind_to_u8(r.dst_kind),
                ];
                self.copy(
                    (r.start, r.end, r.bytes),
                    [r.corr, r.ctx, r.stream, r.dev],
                    ops,
                );
            }
            Record::Memset(r) => {
                self.gpu(r.ctx, r.dev);
                self.p.memsets += 1;
                let ops = [OP_MEMSET, mem_kind_to_u8(r.mem_kind), 0];
                self.copy(
                    (r.start, r.end, r.bytes),
                    [r.corr, r.ctx, r.stream, r.dev],
                    ops,
                );
            }
            Record::Sync(s) => {
                let p = &mut self.p;
                p.order.push(K_SYNC);
                p.span(s.start, s.end);
                let stack = s.stack.map_or(NONE, |id| {
                    p.stacks.note(id.0);
                    id.0
                });
                p.s_start.push(s.start);
                p.s_end.push(s.end);
                p.s_tid.push(s.tid.unwrap_or(u64::MAX));
                p.s_corr.push(s.corr);
                p.s_ctx.push(s.ctx);
                p.s_stream.push(s.stream.unwrap_or(NONE));
                p.s_event.push(s.event.unwrap_or(NONE));
                p.s_stack.push(stack);
                p.s_kind.push(sync_kind_to_u8(s.kind));
            }
            Record::Api(a) => {
                let p = &mut self.p;
                p.order.push(K_API);
                p.span(a.start, a.end);
                p.strs.note(a.name.0);
                p.a_start.push(a.start);
                p.a_end.push(a.end);
                p.a_tid.push(a.tid);
                p.a_corr.push(a.corr);
                p.a_name.push(a.name.0);
                p.a_cbid.push(a.cbid);
            }
            // Only what `takes` accepts comes here; the rest (overhead) changes nothing.
            _ => self.p.order.push(K_OTHER),
        }
    }

    fn copy(&mut self, (start, end, bytes): (u64, u64, u64), ids: [u32; 4], ops: [u8; 3]) {
        let p = &mut self.p;
        p.order.push(K_COPY);
        p.span(start, end);
        p.c_start.push(start);
        p.c_end.push(end);
        p.c_bytes.push(bytes);
        p.c_corr.push(ids[0]);
        p.c_ctx.push(ids[1]);
        p.c_stream.push(ids[2]);
        p.c_dev.push(ids[3]);
        p.c_op.push(ops[0]);
        p.c_src.push(ops[1]);
        p.c_dst.push(ops[2]);
    }
}

impl BlockFold for ModelFold {
    fn takes(&self, rec: &Record) -> bool {
        match rec {
            // Work a CUDA graph ran comes record by record (the model keeps its graph node
            // aside; rare next to launched work).
            Record::Kernel(k) => k.graph.is_none(),
            Record::Memcpy(r) => r.graph.is_none(),
            Record::Memset(r) => r.graph.is_none(),
            Record::Api(_) | Record::Overhead(_) => true,
            // A stack id of `NONE` (never written) would read as no stack.
            Record::Sync(s) => s.stack.is_none_or(|id| id.0 != NONE),
            // Hostcalls and host samples (rare next to GPU work: a few hundred a second) come
            // record by record, as every other record.
            _ => false,
        }
    }

    fn start(&self, bytes: usize) -> Box<dyn BlockFolding> {
        // Kernel lines are ~150-250 bytes and most of a trace; the other columns grow as needed.
        let (k, c, s, a) = (bytes / 200 + 1, 0, 0, 0);
        Box::new(Folding {
            p: Part {
                k_start: Vec::with_capacity(k),
                k_end: Vec::with_capacity(k),
                k_corr: Vec::with_capacity(k),
                k_launch: Vec::with_capacity(k),
                k_stream: Vec::with_capacity(k),
                k_ctx: Vec::with_capacity(k),
                k_dev: Vec::with_capacity(k),
                c_start: Vec::with_capacity(c),
                c_end: Vec::with_capacity(c),
                c_bytes: Vec::with_capacity(c),
                c_corr: Vec::with_capacity(c),
                c_ctx: Vec::with_capacity(c),
                c_stream: Vec::with_capacity(c),
                c_dev: Vec::with_capacity(c),
                c_op: Vec::with_capacity(c),
                c_src: Vec::with_capacity(c),
                c_dst: Vec::with_capacity(c),
                s_start: Vec::with_capacity(s),
                s_end: Vec::with_capacity(s),
                s_tid: Vec::with_capacity(s),
                s_corr: Vec::with_capacity(s),
                s_ctx: Vec::with_capacity(s),
                s_stream: Vec::with_capacity(s),
                s_event: Vec::with_capacity(s),
                s_stack: Vec::with_capacity(s),
                s_kind: Vec::with_capacity(s),
                a_start: Vec::with_capacity(a),
                a_end: Vec::with_capacity(a),
                a_tid: Vec::with_capacity(a),
                a_corr: Vec::with_capacity(a),
                a_name: Vec::with_capacity(a),
                a_cbid: Vec::with_capacity(a),
                order: Vec::with_capacity(k + c + s + a),
                first_ns: u64::MAX,
                ..Part::default()
            },
            launch_index: HashMap::new(),
            last_launch: Vec::new(),
            seen_pairs: HashSet::new(),
            last_pair: None,
            spares: self.spares.clone(),
            worker: std::thread::current().id() != self.caller,
        })
    }
}

impl BlockFolding for Folding {
    fn push(&mut self, rec: Record) {
        self.record(rec);
    }

    fn finish(self: Box<Self>) -> Box<dyn Any + Send> {
        let p = &self.p;
        let (k, c, s, a) = (
            p.k_start.len(),
            p.c_start.len(),
            p.s_start.len(),
            p.a_start.len(),
        );
        // The part's elements of each type, column by column (see `Model::absorb`).
        self.spares.provide(
            [
                2 * k + 3 * c + 3 * s + 3 * a,
                5 * k + 4 * c + 5 * s + 3 * a,
                3 * c + s,
            ],
            self.worker,
        );
        Box::new(self.p)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::ModelFold;
    use crate::store::Spares;
    use crate::{analyze, Config, Model};
    use gpufl_trace::*;
    use std::cell::Cell;
    use std::sync::Arc;

    thread_local! {
        /// Parts taken (and of them replayed record by record) on this thread.
        pub(crate) static ABSORBED: Cell<usize> = const { Cell::new(0) };
        pub(crate) static REPLAYED: Cell<usize> = const { Cell::new(0) };
        /// Spare chunks the columns took while joining parts (see `store::Spares`).
        pub(crate) static SPARES_TAKEN: Cell<usize> = const { Cell::new(0) };
    }

    /// A trace of `blocks` blocks of kernels (names first used inside later blocks), copies,
    /// memsets, synchronizations with and without stacks, API calls and overhead records, on
    /// `devs` devices; the block of the middle holds a string record halfway (two runs folded),
    /// the next one a string record after its 10th record (those 10 come one by one, then a run).
    fn trace(blocks: usize, devs: u32) -> Vec<u8> {
        let header = Header {
            session_id: "fold-1".into(),
            pid: devs,
            ..Header::default()
        };
        let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
        let file = w.intern_str("/app/x.cu").unwrap();
        let frame = w
            .intern_frame(FrameData {
                kind: FrameKind::Native,
                module: Some(file),
                offset: Some(1),
                func: None,
                file: Some(file),
                line: Some(3),
                inlined: false,
                text: None,
            })
            .unwrap();
        let stack = w.intern_stack(&[frame]).unwrap();
        let mut names = vec![w.intern_str("kern_a").unwrap()];
        let api = w.intern_str("cudaLaunchKernel").unwrap();
        w.end_block().unwrap();
        let mut t = 1_000u64;
        let mut corr = 0;
        for b in 0..blocks {
            for i in 0..500u32 {
                if (b == blocks / 2 && i == 250) || (b == blocks / 2 + 1 && i == 10) {
                    names.push(w.intern_str(&format!("kern_{b}")).unwrap());
                }
                t += 100 + (i as u64 * 37) % 300;
                corr += 1;
                let dev = (i + b as u32) % devs;
                let rec = match i % 10 {
                    0 => Record::Sync(Sync {
                        start: t,
                        end: t + 50,
                        ctx: 1,
                        stream: Some(7),
                        corr,
                        tid: Some(9),
                        stack: (i % 20 == 0).then_some(stack),
                        ..Sync::default()
                    }),
                    1 => Record::Memcpy(Memcpy {
                        bytes: 4096,
                        start: t,
                        end: t + 300,
                        dev,
                        ctx: 1 + dev,
                        stream: 13,
                        corr,
                        ..Memcpy::default()
                    }),
                    2 => Record::Memset(Memset {
                        bytes: 64,
                        start: t + 10,
                        end: t,
                        dev,
                        ctx: 1 + dev,
                        corr,
                        ..Memset::default()
                    }),
                    3 => Record::Api(Api {
                        name: api,
                        start: t,
                        end: t + 20,
                        tid: 9,
                        corr,
                        ..Api::default()
                    }),
                    _ => Record::Kernel(Kernel {
                        name: names[(i as usize / 3) % names.len()],
                        start: t,
                        end: t + 400 + (i as u64 % 7) * 100,
                        dev,
                        ctx: 1 + dev,
                        stream: 7 + i % 2,
                        corr,
                        grid: [1 + (i % 3) as i32 * 100, 1, 1],
                        block: [128, 1, 1],
                        regs: 32,
                        ..Kernel::default()
                    }),
                };
                w.write(&rec).unwrap();
            }
            w.end_block().unwrap();
        }
        w.finish(0, "exit").unwrap()
    }

    /// Loads `bytes` both ways, checks the models are the same; the parts folded and replayed.
    fn same(bytes: Vec<u8>, threads: usize) -> (usize, usize) {
        ABSORBED.with(|c| c.set(0));
        REPLAYED.with(|c| c.set(0));
        let one = Model::load(TraceReader::from_bytes(bytes.clone(), "t").unwrap());
        let mut r = ParTraceReader::from_bytes(bytes, "t", threads).unwrap();
        let par = Model::load_items(&mut r);
        assert!(!r.is_sequential());
        for (a, b) in [
            (format!("{:?}", one.kernels), format!("{:?}", par.kernels)),
            (format!("{:?}", one.copies), format!("{:?}", par.copies)),
            (format!("{:?}", one.syncs), format!("{:?}", par.syncs)),
            (format!("{:?}", one.apis), format!("{:?}", par.apis)),
            (format!("{:?}", one.strings), format!("{:?}", par.strings)),
            (format!("{:?}", one.stacks), format!("{:?}", par.stacks)),
            (format!("{:?}", one.launches), format!("{:?}", par.launches)),
            (format!("{:?}", one.configs), format!("{:?}", par.configs)),
        ] {
            assert_eq!(a, b);
        }
        assert_eq!(one.devices(), par.devices());
        assert_eq!(one.time_range(), par.time_range());
        assert_eq!(one.memset_count(), par.memset_count());
        assert_eq!(one.warnings(), par.warnings());
        for d in 0..100 {
            assert_eq!(one.device_of_ctx(d), par.device_of_ctx(d));
        }
        let cfg = Config::default();
        let (a, b) = (analyze(&one, &cfg), analyze(&par, &cfg));
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
        (ABSORBED.with(|c| c.get()), REPLAYED.with(|c| c.get()))
    }

    #[test]
    fn folded_load_is_record_by_record_load() {
        for threads in [1, 2, 3] {
            let (folded, replayed) = same(trace(12, 2), threads);
            // Every block but the first (interned records), the middle one in two runs, on one
            // thread as on several (the caller folds them).
            assert_eq!(folded, 11 + 2, "{threads} threads");
            assert_eq!(replayed, 0);
        }
    }

    #[test]
    fn folded_load_of_a_session_of_two_files_is_record_by_record_load() {
        // The second file's ids restart at 0: its parts map them to the model's anew.
        let dir = std::env::temp_dir().join(format!("gpufl-fold-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("trace-0000.ndjson.zst"), trace(9, 1)).unwrap();
        std::fs::write(dir.join("trace-0001.ndjson.zst"), trace(4, 2)).unwrap();
        let one = Model::load(SessionReader::open(&dir).unwrap());
        for threads in [1, 3] {
            ABSORBED.with(|c| c.set(0));
            let mut r = ParSessionReader::open(&dir, threads).unwrap();
            let par = Model::load_items(&mut r);
            assert_eq!(ABSORBED.with(|c| c.get()), (8 + 2) + (3 + 2));
            assert_eq!(one.files(), 2);
            assert_eq!(format!("{:?}", one.kernels), format!("{:?}", par.kernels));
            assert_eq!(format!("{:?}", one.strings), format!("{:?}", par.strings));
            assert_eq!(format!("{:?}", one.launches), format!("{:?}", par.launches));
            assert_eq!(format!("{:?}", one.apis), format!("{:?}", par.apis));
            assert_eq!(format!("{:?}", one.syncs), format!("{:?}", par.syncs));
            let cfg = Config::default();
            assert_eq!(
                serde_json::to_string(&analyze(&one, &cfg)).unwrap(),
                serde_json::to_string(&analyze(&par, &cfg)).unwrap()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn folded_load_into_spare_chunks_is_record_by_record_load() {
        // More kernels than a chunk of a column: the columns' later chunks come from the spares,
        // on one thread as on several.
        let bytes = trace(300, 2);
        let one = Model::load(TraceReader::from_bytes(bytes.clone(), "t").unwrap());
        assert!(one.kernels.start.len() > 1 << crate::store::CHUNK_BITS);
        for threads in [1, 3] {
            let spares = Arc::new(Spares::default());
            spares.provide([1 << 30; 3], true);
            SPARES_TAKEN.with(|c| c.set(0));
            let mut r = ParTraceReader::from_bytes(bytes.clone(), "t", threads).unwrap();
            let par = Model::load_items_with(&mut r, spares.clone());
            assert!(SPARES_TAKEN.with(|c| c.get()) >= 2, "{threads} threads");
            // What was left is dropped.
            assert!(spares.lock().u64s_len() == 0);
            for (a, b) in [
                (format!("{:?}", one.kernels), format!("{:?}", par.kernels)),
                (format!("{:?}", one.copies), format!("{:?}", par.copies)),
                (format!("{:?}", one.syncs), format!("{:?}", par.syncs)),
                (format!("{:?}", one.apis), format!("{:?}", par.apis)),
                (format!("{:?}", one.launches), format!("{:?}", par.launches)),
            ] {
                assert!(a == b, "{threads} threads");
            }
        }
    }

    #[test]
    fn parts_folded_on_a_worker_provide_spare_chunks() {
        // A fold started on another thread than the caller's makes the chunks its part fills.
        let spares = Arc::new(Spares::default());
        let caller = std::thread::spawn(|| std::thread::current().id())
            .join()
            .unwrap();
        let fold = ModelFold {
            spares: spares.clone(),
            caller,
        };
        let mut f = fold.start(1 << 20);
        for i in 0..70_000u64 {
            f.push(Record::Kernel(Kernel {
                start: i,
                end: i + 1,
                ..Kernel::default()
            }));
        }
        let _part = f.finish();
        // 2 u64 and 5 u32 columns of 70 000 kernels: 2 and 5 whole chunks' worth.
        assert_eq!(spares.lock().u64s_len(), 2);
        // The caller's own folds make none.
        let fold = ModelFold {
            spares: Arc::new(Spares::default()),
            caller: std::thread::current().id(),
        };
        let mut f = fold.start(1 << 20);
        for i in 0..70_000u64 {
            f.push(Record::Kernel(Kernel {
                start: i,
                ..Kernel::default()
            }));
        }
        let _part = f.finish();
        assert_eq!(fold.spares.lock().u64s_len(), 0);
        // A worker's next part makes them.
        fold.spares.provide([0; 3], true);
        assert_eq!(fold.spares.lock().u64s_len(), 2);
    }

    #[test]
    fn folded_load_replays_a_part_with_a_device_too_many() {
        // 70 devices: the parts that bring devices past the limit are taken record by record.
        let (folded, replayed) = same(trace(12, 70), 3);
        assert_eq!(folded, 13);
        assert!(replayed > 0 && replayed < folded, "{replayed}");
    }
}

#[cfg(test)]
mod threads_tests {
    use crate::{analyze_on, Config, Model};
    use gpufl_trace::*;

    #[test]
    fn analysis_on_many_threads_is_the_one_thread_analysis() {
        // More kernels than one piece of a pass (work::PIECE_ROWS), on two devices, a few out of
        // start order (a slot swept again), small grids (under-filled-grid's passes run).
        let header = Header {
            gpus: vec![Gpu {
                index: 0,
                sm_count: 132,
                ..Gpu::default()
            }],
            ..Header::default()
        };
        let mut recs = vec![Record::Header(Box::new(header))];
        for (i, name) in ["a", "b", "c"].iter().enumerate() {
            recs.push(Record::Str(StrRecord {
                id: StrId(i as u32),
                s: name.to_string(),
            }));
        }
        let mut t = 1_000u64;
        for i in 0..600_000u64 {
            t += 30_000 + (i * 7919) % 900;
            let start = if i % 100_003 == 7 { t - 200_000 } else { t };
            recs.push(Record::Kernel(Kernel {
                name: StrId((i % 3) as u32),
                start,
                end: start + 20_000 + (i % 11) * 700,
                dev: (i % 5 == 0) as u32,
                ctx: 1,
                stream: 7 + (i % 2) as u32,
                corr: i as u32,
                grid: [4 + (i % 3) as i32, 1, 1],
                block: [128, 1, 1],
                regs: 32,
                ..Kernel::default()
            }));
        }
        let m = Model::load(recs);
        let cfg = Config::default();
        let one = serde_json::to_string(&analyze_on(&m, &cfg, 1)).unwrap();
        for t in [2, 4, 7] {
            assert_eq!(
                one,
                serde_json::to_string(&analyze_on(&m, &cfg, t)).unwrap(),
                "{t} threads"
            );
        }
        assert!(one.contains("under-filled-grid"), "the rule ran");
    }
}
