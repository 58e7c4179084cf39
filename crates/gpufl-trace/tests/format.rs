//! Integration tests of trace format v1: round trip, interning, tolerance to truncation, corruption
//! and newer versions, session directory helpers and symbol resolution.

use gpufl_trace::reader::{SessionReader, TraceReader};
use gpufl_trace::session::{
    find_sessions, is_session_dir, session_dir_name, trace_files, utc_compact, FIRST_TRACE_FILE,
};
use gpufl_trace::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU32, Ordering};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A temporary directory removed on drop; unique per process and per call.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let p =
            std::env::temp_dir().join(format!("gpufl-trace-test-{}-{n}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `Write` whose bytes can be inspected while a `TraceWriter` owns it.
#[derive(Clone, Default)]
struct SharedBuf(Rc<RefCell<Vec<u8>>>);

impl SharedBuf {
    fn len(&self) -> usize {
        self.0.borrow().len()
    }
    fn bytes(&self) -> Vec<u8> {
        self.0.borrow().clone()
    }
}

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn sample_header() -> Header {
    Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        gpufl_version: "0.1.0".into(),
        session_id: "train-4242-20231114T221320Z".into(),
        app_name: "train".into(),
        host: "node01".into(),
        pid: 4242,
        ppid: 1,
        command_line: vec!["python".into(), "train.py".into(), "--lr=3e-4".into()],
        start_unix_ns: 1_700_000_000_123_456_789,
        clock: ClockSync {
            trace_ns: 5_000_000_000,
            unix_ns: 1_700_000_000_000_000_000,
        },
        gpus: vec![
            Gpu {
                index: 0,
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: "GPU-0a1b2c3d-0000-1111-2222-333344445555".into(),
                sm_count: 132,
                cc_major: 9,
                cc_minor: 0,
                total_mem_bytes: 85_045_870_592,
                limits: Some(GpuLimits {
                    max_threads_per_block: 1024,
                    max_threads_per_sm: 2048,
                    max_blocks_per_sm: 32,
                    regs_per_sm: 65536,
                    regs_per_block: 65536,
                    smem_per_sm: 233_472,
                    smem_per_block: 49_152,
                    smem_per_block_optin: 232_448,
                    smem_reserved_per_block: 1024,
                    warp_size: 32,
                    l2_bytes: 52_428_800,
                    sm_clock_khz: Some(1_980_000),
                    mem_clock_khz: Some(2_619_000),
                    mem_bus_bits: Some(5120),
                    mem_bandwidth: Some(GpuLimits::peak_bandwidth(2_619_000, 5120)),
                }),
            },
            // A GPU as recorders before device limits wrote it.
            Gpu {
                index: 1,
                name: "NVIDIA H100 80GB HBM3".into(),
                uuid: "GPU-ffffffff-0000-1111-2222-333344445555".into(),
                sm_count: 132,
                cc_major: 9,
                cc_minor: 0,
                total_mem_bytes: 85_045_870_592,
                limits: None,
            },
        ],
        driver_version: Some(13000),
        cupti_version: Some(26),
        python_version: Some("3.12".into()),
        rank: Some(1),
        local_rank: Some(1),
        world_size: Some(2),
        run_id: Some("train-4100-20231114T221319Z".into()),
        options: CaptureOptions {
            enable_synchronization: true,
            enable_stack_trace: true,
            api_records: "sync".into(),
            log_path: "/tmp/gpufl".into(),
            started_by: "test".into(),
            telemetry_ms: Some(100),
            mode: None,
            call_sites: None,
            host_samples_hz: None,
            hostcall_us: None,
            mem_records: None,
            mem_stack_bytes: None,
        },
        capture: CaptureStatus {
            status: "partial".into(),
            reason: Some("python frames unavailable".into()),
        },
    }
}

/// Header with every optional field absent.
fn minimal_header(app: &str) -> Header {
    Header {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        app_name: app.into(),
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    }
}

/// Drives a `TraceWriter` and keeps, in parallel, the list of records the trace must contain.
/// Interning is modelled independently (first use writes a record, ids dense from 0) and the ids the
/// writer returns are checked against the model.
struct Recorder<W: Write> {
    w: TraceWriter<W>,
    expected: Vec<Record>,
    strs: HashMap<String, StrId>,
    frames: HashMap<FrameData, FrameId>,
    stacks: HashMap<Vec<FrameId>, StackId>,
}

impl<W: Write> Recorder<W> {
    fn new(out: W, header: &Header) -> Self {
        let w = TraceWriter::new(out, header).unwrap();
        let mut h = header.clone();
        h.format = FORMAT_NAME.into();
        h.version = FORMAT_VERSION;
        Recorder {
            w,
            expected: vec![Record::Header(Box::new(h))],
            strs: HashMap::new(),
            frames: HashMap::new(),
            stacks: HashMap::new(),
        }
    }

    fn str(&mut self, s: &str) -> StrId {
        let id = self.w.intern_str(s).unwrap();
        match self.strs.get(s) {
            Some(&known) => assert_eq!(id, known, "re-interning {s:?} changed its id"),
            None => {
                assert_eq!(id, StrId(self.strs.len() as u32), "str ids must be dense");
                self.strs.insert(s.to_owned(), id);
                self.expected
                    .push(Record::Str(StrRecord { id, s: s.into() }));
            }
        }
        id
    }

    fn frame(&mut self, f: FrameData) -> FrameId {
        let id = self.w.intern_frame(f.clone()).unwrap();
        match self.frames.get(&f) {
            Some(&known) => assert_eq!(id, known, "re-interning a frame changed its id"),
            None => {
                assert_eq!(
                    id,
                    FrameId(self.frames.len() as u32),
                    "frame ids must be dense"
                );
                self.frames.insert(f.clone(), id);
                self.expected.push(Record::Frame(Frame {
                    id,
                    kind: f.kind,
                    module: f.module,
                    offset: f.offset,
                    func: f.func,
                    file: f.file,
                    line: f.line,
                    inlined: f.inlined,
                    text: None,
                }));
            }
        }
        id
    }

    fn stack(&mut self, frames: &[FrameId]) -> StackId {
        let id = self.w.intern_stack(frames).unwrap();
        match self.stacks.get(frames) {
            Some(&known) => assert_eq!(id, known, "re-interning a stack changed its id"),
            None => {
                assert_eq!(
                    id,
                    StackId(self.stacks.len() as u32),
                    "stack ids must be dense"
                );
                self.stacks.insert(frames.to_vec(), id);
                self.expected.push(Record::Stack(Stack {
                    id,
                    frames: frames.to_vec(),
                    via_tid: None,
                }));
            }
        }
        id
    }

    fn rec(&mut self, r: Record) {
        self.w.write(&r).unwrap();
        self.expected.push(r);
    }

    /// Finish the trace; returns the writer's output and the full expected record list.
    fn finish(mut self, end_unix_ns: u64, reason: &str) -> (W, Vec<Record>) {
        let mut counts = Counts::default();
        for r in &self.expected {
            counts.add(r);
        }
        self.expected.push(Record::End(End {
            end_unix_ns,
            reason: reason.into(),
            counts,
        }));
        let out = self.w.finish(end_unix_ns, reason).unwrap();
        (out, self.expected)
    }
}

fn native(module: StrId, offset: u64, func: Option<StrId>) -> FrameData {
    FrameData {
        kind: FrameKind::Native,
        module: Some(module),
        offset: Some(offset),
        func,
        file: None,
        line: None,
        inlined: false,
        text: None,
    }
}

fn python(func: StrId, file: StrId, line: u32) -> FrameData {
    FrameData {
        kind: FrameKind::Python,
        module: None,
        offset: None,
        func: Some(func),
        file: Some(file),
        line: Some(line),
        inlined: false,
        text: None,
    }
}

/// One batch of records of every type. `i` varies the values so batches differ.
fn write_batch<W: Write>(r: &mut Recorder<W>, i: u64) {
    let t0 = 5_000_000_000 + i * 1_000_000;
    let kname = r.str(&format!(
        "void gemm_kernel<float, {}>(float const*, float*)",
        i % 3
    ));
    r.rec(Record::Kernel(Kernel {
        name: kname,
        start: t0,
        end: t0 + 12_345,
        dev: (i % 2) as u32,
        ctx: 1,
        stream: 7 + (i % 2) as u32,
        corr: 100 + i as u32,
        grid: [128, 2, 1],
        block: [256, 1, 1],
        regs: 96,
        smem_static: 16_384,
        smem_dynamic: 49_152,
        local_mem: (i % 2) as u32 * 64,
        smem_executed: (!i.is_multiple_of(3)).then_some(233_472),
        graph: None,
    }));
    r.rec(Record::Function(Function {
        name: kname,
        module: 3 + i as u32,
        frame: Some(568 * (i % 2) as u32),
        stack: (!i.is_multiple_of(3)).then_some(568 + 16 * i as u32),
        source: None,
    }));
    r.rec(Record::Memcpy(Memcpy {
        kind: CopyKind::HtoD,
        src_kind: MemoryKind::Pageable,
        dst_kind: MemoryKind::Device,
        bytes: 1 << 20,
        start: t0 + 20_000,
        end: t0 + 120_000,
        dev: 0,
        ctx: 1,
        stream: 7,
        corr: 200 + i as u32,
        graph: None,
    }));
    r.rec(Record::Memset(Memset {
        bytes: 4096,
        value: 0,
        mem_kind: MemoryKind::DeviceStatic,
        start: t0 + 130_000,
        end: t0 + 131_000,
        dev: 0,
        ctx: 1,
        stream: 7,
        corr: 300 + i as u32,
        graph: None,
    }));
    // A sync with a stack (python frame on top of two native frames, one inlined).
    let libcudart = r.str("/usr/lib/x86_64-linux-gnu/libcudart.so.12");
    let sync_fn = r.str("cudaStreamSynchronize");
    let step = r.str("train_step");
    let train_py = r.str("/home/u/train.py");
    let f0 = r.frame(native(libcudart, 0x1a2b0, Some(sync_fn)));
    let mut inl = native(libcudart, 0x1a2b0, Some(sync_fn));
    inl.inlined = true;
    let f1 = r.frame(inl);
    let f2 = r.frame(python(step, train_py, 40 + (i % 4) as u32));
    let stack = r.stack(&[f0, f1, f2]);
    let tid = 31337 + i;
    r.rec(Record::Sync(Sync {
        kind: SyncKind::StreamSynchronize,
        start: t0 + 140_000,
        end: t0 + 900_000,
        ctx: 1,
        stream: Some(7),
        event: None,
        corr: 400 + i as u32,
        tid: Some(tid),
        stack: Some(stack),
    }));
    // And one without.
    r.rec(Record::Sync(Sync {
        kind: SyncKind::ContextSynchronize,
        start: t0 + 900_100,
        end: t0 + 950_000,
        ctx: 1,
        stream: None,
        event: None,
        corr: 500 + i as u32,
        tid: None,
        stack: None,
    }));
    r.rec(Record::Api(Api {
        domain: ApiDomain::Runtime,
        name: sync_fn,
        cbid: 131,
        start: t0 + 139_000,
        end: t0 + 901_000,
        tid,
        corr: 400 + i as u32,
        ret: 0,
    }));
    let launch = r.str("cuLaunchKernel");
    r.rec(Record::Callsite(Callsite {
        corr: 600 + i as u32,
        api: launch,
        tid,
        ts: t0 + 5,
        stack,
        weight: None,
    }));
    let free = r.str("cudaFree");
    r.rec(Record::Hostcall(Hostcall {
        domain: ApiDomain::Runtime,
        name: free,
        cbid: 4,
        start: t0 + 6,
        end: t0 + 2_006,
        tid,
        corr: 700 + i as u32,
        ctx: Some(1),
        bytes: None,
        ret: 0,
        stack: Some(stack),
    }));
    let malloc = r.str("cudaMalloc");
    r.rec(Record::Mem(Mem {
        ts: t0 + 7,
        op: MemOp::Alloc,
        addr: 0x7f00_0000_0000 + (i << 24),
        bytes: 256 << 20,
        mem_kind: MemoryKind::Device,
        dev: 0,
        ctx: 1,
        corr: 800 + i as u32,
        stream: None,
        pool: None,
        pool_bytes: None,
        api: Some(malloc),
        tid: Some(tid),
        stack: Some(stack),
        free: None,
        carried: false,
    }));
    r.rec(Record::Mem(Mem {
        ts: t0 + 8,
        op: MemOp::Free,
        addr: 0x7f00_0000_0000 + (i << 24),
        bytes: 256 << 20,
        mem_kind: MemoryKind::Device,
        dev: 0,
        ctx: 1,
        corr: 801 + i as u32,
        stream: Some(7),
        pool: Some(0x7e00_0000_0000),
        pool_bytes: Some(512 << 20),
        ..Mem::default()
    }));
    r.rec(Record::Mem(Mem {
        ts: t0 + 9,
        op: MemOp::AllocFailed,
        bytes: 80 << 30,
        mem_kind: MemoryKind::Device,
        corr: 802 + i as u32,
        api: Some(malloc),
        tid: Some(tid),
        stack: Some(stack),
        free: Some(1 << 30),
        ..Mem::default()
    }));
    r.rec(Record::Hsample(Hsample {
        ts: t0 + 10,
        tid,
        state: HostState::Cuda,
        period_ns: 10_000_000,
        stack: Some(stack),
        call: Some(free),
    }));
    r.rec(Record::Gnode(Gnode {
        graph: 2,
        node: 7_000 + i,
        stack: Some(stack),
        tid: Some(tid),
        from: None,
    }));
    r.rec(Record::Gnode(Gnode {
        graph: 3,
        node: 9_000 + i,
        from: Some(GraphNode(2, 7_000 + i)),
        ..Gnode::default()
    }));
    r.rec(Record::Stream(StreamInfo {
        ctx: 1,
        stream: 7,
        role: if i.is_multiple_of(2) {
            StreamRole::LegacyDefault
        } else {
            StreamRole::PerThreadDefault
        },
    }));
    r.rec(Record::Capture(CaptureState {
        ts: t0 + 950_000,
        recording: i.is_multiple_of(2),
    }));
    let fwd = r.str("forward");
    for (ts, end) in [(t0 + 100, false), (t0 + 940_000, true)] {
        r.rec(Record::Scope(Scope {
            ts,
            tid,
            name: fwd,
            depth: 0,
            end,
            source: ScopeSource::Api,
        }));
    }
    r.rec(Record::Overhead(Overhead {
        kind: "activity_buffer_flush".into(),
        start: t0 + 960_000,
        end: t0 + 961_000,
    }));
}

/// A trace with every record type, `batches` batches, one zstd block per batch. Returns the file
/// bytes, the expected records, and the block boundaries: (byte offset of the block's end, number
/// of records in the stream up to and including that block).
fn multi_block_trace(batches: u64) -> (Vec<u8>, Vec<Record>, Vec<(usize, usize)>) {
    multi_block_trace_opt(batches, true)
}

/// As [`multi_block_trace`]; with `close_last` false the last batch shares its block with `end`.
fn multi_block_trace_opt(
    batches: u64,
    close_last: bool,
) -> (Vec<u8>, Vec<Record>, Vec<(usize, usize)>) {
    let buf = SharedBuf::default();
    let mut r = Recorder::new(buf.clone(), &sample_header());
    let mut boundaries = Vec::new();
    for i in 0..batches {
        write_batch(&mut r, i);
        if i == 1 {
            r.rec(Record::Dropped(Dropped {
                source: "cupti".into(),
                count: 17,
            }));
            r.rec(Record::Notice(Notice {
                level: "warning".into(),
                message: "python frames unavailable:\n\"quoted\" \\ ü 🚀".into(),
            }));
        }
        if close_last || i + 1 < batches {
            r.w.end_block().unwrap();
            boundaries.push((buf.len(), r.expected.len()));
        }
    }
    let (_, expected) = r.finish(1_700_000_100_000_000_000, "shutdown");
    boundaries.push((buf.len(), expected.len()));
    (buf.bytes(), expected, boundaries)
}

fn read_file(path: &Path) -> (Vec<Record>, Vec<String>) {
    let mut rd = TraceReader::open(path).unwrap();
    let recs: Vec<Record> = rd.by_ref().collect();
    (recs, rd.warnings())
}

fn read_bytes(
    dir: &TempDir,
    name: &str,
    bytes: &[u8],
) -> Result<(Vec<Record>, Vec<String>), TraceError> {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    let mut rd = TraceReader::open(&p)?;
    let recs: Vec<Record> = rd.by_ref().collect();
    Ok((recs, rd.warnings()))
}

fn assert_prefix(got: &[Record], all: &[Record], ctx: &str) {
    assert!(
        got.len() <= all.len(),
        "{ctx}: read {} records, more than the {} written",
        got.len(),
        all.len()
    );
    for (i, (g, e)) in got.iter().zip(all).enumerate() {
        assert_eq!(g, e, "{ctx}: record {i} differs from the one written");
    }
}

/// Ids referenced by a record: (strs, frames, stacks).
fn refs(r: &Record) -> (Vec<StrId>, Vec<FrameId>, Vec<StackId>) {
    match r {
        Record::Frame(f) => (
            [f.module, f.func, f.file].into_iter().flatten().collect(),
            vec![],
            vec![],
        ),
        Record::Stack(s) => (vec![], s.frames.clone(), vec![]),
        Record::Kernel(k) => (vec![k.name], vec![], vec![]),
        Record::Function(f) => (vec![f.name], vec![], vec![]),
        Record::Api(a) => (vec![a.name], vec![], vec![]),
        Record::Sync(s) => (vec![], vec![], s.stack.into_iter().collect()),
        Record::Callsite(c) => (vec![c.api], vec![], vec![c.stack]),
        Record::Hostcall(h) => (vec![h.name], vec![], h.stack.into_iter().collect()),
        Record::Mem(m) => (
            m.api.into_iter().collect(),
            vec![],
            m.stack.into_iter().collect(),
        ),
        Record::Hsample(h) => (
            h.call.into_iter().collect(),
            vec![],
            h.stack.into_iter().collect(),
        ),
        _ => (vec![], vec![], vec![]),
    }
}

// ---------------------------------------------------------------------------------------------
// Round trip
// ---------------------------------------------------------------------------------------------

#[test]
fn round_trip_every_record_type_through_a_file() {
    let dir = TempDir::new("roundtrip");
    let path = dir.join(FIRST_TRACE_FILE);
    let file = std::fs::File::create(&path).unwrap();
    // The header passed in has a wrong format/version: the writer must stamp its own.
    let mut h = sample_header();
    h.format = "bogus".into();
    h.version = 99;
    let mut r = Recorder::new(file, &h);
    write_batch(&mut r, 0);
    r.rec(Record::Dropped(Dropped {
        source: "cupti".into(),
        count: 5,
    }));
    r.rec(Record::Dropped(Dropped {
        source: "stack_queue".into(),
        count: 2,
    }));
    r.rec(Record::Notice(Notice {
        level: "info".into(),
        message: "multi\nline \"message\"\twith \\ escapes, ü and 🚀".into(),
    }));
    // Extreme values must survive JSON (no float conversion).
    r.rec(Record::Memcpy(Memcpy {
        kind: CopyKind::PtoP,
        src_kind: MemoryKind::Managed,
        dst_kind: MemoryKind::Pinned,
        bytes: u64::MAX,
        start: u64::MAX - 1,
        end: u64::MAX,
        dev: u32::MAX,
        ctx: 0,
        stream: 0,
        corr: u32::MAX,
        graph: None,
    }));
    r.rec(Record::Sync(Sync {
        kind: SyncKind::EventSynchronize,
        start: 1,
        end: 2,
        ctx: 3,
        stream: None,
        event: Some(9),
        corr: 4,
        tid: Some(u64::MAX),
        stack: None,
    }));
    r.rec(Record::Telemetry(Box::new(telemetry::full_telemetry())));
    let (file, expected) = r.finish(1_700_000_100_000_000_000, "exit");
    drop(file);

    let (got, warnings) = read_file(&path);
    assert!(
        warnings.is_empty(),
        "clean trace gave warnings: {warnings:?}"
    );
    assert_eq!(got.len(), expected.len(), "record count");
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "record {i}");
    }

    // Header: stamped format/version, the rest as given.
    let Record::Header(hdr) = &got[0] else {
        panic!("first record is not a header: {:?}", got[0]);
    };
    assert_eq!(hdr.format, FORMAT_NAME);
    assert_eq!(hdr.version, FORMAT_VERSION);
    assert_eq!(hdr.python_version.as_deref(), Some("3.12"));
    assert_eq!(hdr.options.telemetry_ms, Some(100));
    assert_eq!(
        (hdr.rank, hdr.local_rank, hdr.world_size),
        (Some(1), Some(1), Some(2))
    );
    assert_eq!(hdr.run_id.as_deref(), Some("train-4100-20231114T221319Z"));

    // Every type is present.
    let types: HashSet<&str> = got.iter().map(|r| r.type_name()).collect();
    for t in [
        "header",
        "str",
        "frame",
        "stack",
        "gnode",
        "kernel",
        "function",
        "memcpy",
        "memset",
        "sync",
        "api",
        "callsite",
        "hostcall",
        "hsample",
        "mem",
        "telemetry",
        "stream",
        "capture",
        "scope",
        "overhead",
        "dropped",
        "notice",
        "end",
    ] {
        assert!(types.contains(t), "no {t} record in the round trip");
    }

    // End counts.
    let Some(Record::End(end)) = got.last() else {
        panic!("last record is not end");
    };
    assert_eq!(end.reason, "exit");
    assert_eq!(end.end_unix_ns, 1_700_000_100_000_000_000);
    let n = |t: &str| got.iter().filter(|r| r.type_name() == t).count() as u64;
    assert_eq!(
        end.counts,
        Counts {
            kernels: 1,
            memcpys: 2,
            memsets: 1,
            syncs: 3,
            apis: 1,
            stacks: 1,
            dropped: 7,
        }
    );
    assert_eq!(end.counts.kernels, n("kernel"));
    assert_eq!(end.counts.memcpys, n("memcpy"));
    assert_eq!(end.counts.syncs, n("sync"));
    assert_eq!(end.counts.stacks, n("stack"));
}

#[test]
fn optional_fields_absent_round_trip_and_are_not_written() {
    let buf = SharedBuf::default();
    let mut r = Recorder::new(buf.clone(), &minimal_header("x"));
    let f = r.frame(FrameData {
        kind: FrameKind::Unknown,
        module: None,
        offset: None,
        func: None,
        file: None,
        line: None,
        inlined: false,
        text: None,
    });
    r.rec(Record::Sync(Sync::default()));
    r.rec(Record::Kernel(Kernel::default()));
    let (_, expected) = r.finish(0, "shutdown");
    assert_eq!(f, FrameId(0));
    let text = String::from_utf8(zstd::decode_all(&buf.bytes()[..]).unwrap()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), expected.len());
    for key in [
        "driver_version",
        "cupti_version",
        "python_version",
        "\"rank\"",
        "local_rank",
        "world_size",
        "run_id",
        "reason\":null",
        "\"module\"",
        "\"inlined\"",
        "\"stack\"",
        "\"tid\"",
        "\"event\"",
        "\"limits\"",
        "smem_executed",
        "null",
    ] {
        assert!(
            !text.contains(key),
            "absent optional written as {key}: {text}"
        );
    }
    let got: Vec<Record> =
        TraceReader::from_reader(std::io::Cursor::new(text.into_bytes()), "mem").collect();
    assert_eq!(got, expected);
}

#[test]
fn function_record_reads_from_its_documented_line() {
    let text = concat!(
        r#"{"t":"function","name":4,"module":2,"frame":568,"stack":600}"#,
        "\n",
        r#"{"t":"function","name":5,"module":2}"#,
        "\n",
    );
    let got: Vec<Record> =
        TraceReader::from_reader(std::io::Cursor::new(text.as_bytes().to_vec()), "mem").collect();
    assert_eq!(
        got,
        vec![
            Record::Function(Function {
                name: StrId(4),
                module: 2,
                frame: Some(568),
                stack: Some(600),
                source: None,
            }),
            Record::Function(Function {
                name: StrId(5),
                module: 2,
                frame: None,
                stack: None,
                source: None,
            }),
        ]
    );
    let lines: Vec<String> = got
        .iter()
        .map(|r| serde_json::to_string(r).unwrap())
        .collect();
    assert_eq!(
        lines.join("\n") + "\n",
        text,
        "absent sizes are not written"
    );
}

#[test]
fn every_line_is_one_json_object_with_t_first() {
    let (bytes, expected, _) = multi_block_trace(3);
    let text = String::from_utf8(zstd::decode_all(&bytes[..]).unwrap()).unwrap();
    assert!(text.ends_with('\n'));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), expected.len(), "one line per record");
    for (line, rec) in lines.iter().zip(&expected) {
        let prefix = format!("{{\"t\":\"{}\"", rec.type_name());
        assert!(
            line.starts_with(&prefix),
            "line does not start with {prefix}: {line}"
        );
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(v.is_object());
    }
}

#[test]
fn blocks_are_independent_zstd_frames() {
    let (bytes, expected, boundaries) = multi_block_trace(4);
    let mut start = 0;
    let mut prev_records = 0;
    let mut all = String::new();
    for &(end, n) in &boundaries {
        let block = &bytes[start..end];
        assert_eq!(
            &block[..4],
            &[0x28, 0xb5, 0x2f, 0xfd],
            "block does not start with zstd magic"
        );
        let text = String::from_utf8(zstd::decode_all(block).unwrap()).unwrap();
        assert!(text.ends_with('\n'), "a block must end on a line boundary");
        assert_eq!(text.lines().count(), n - prev_records, "records in block");
        all.push_str(&text);
        start = end;
        prev_records = n;
    }
    assert_eq!(start, bytes.len());
    assert_eq!(all.lines().count(), expected.len());
}

#[test]
fn writer_counts_and_uncompressed_bytes() {
    let buf = SharedBuf::default();
    let mut r = Recorder::new(buf.clone(), &sample_header());
    write_batch(&mut r, 0);
    write_batch(&mut r, 1);
    let c = r.w.counts().clone();
    assert_eq!(
        (c.kernels, c.memcpys, c.memsets, c.syncs, c.apis),
        (2, 2, 2, 4, 2)
    );
    // Batch 1 uses a different python line, so a second stack.
    assert_eq!(c.stacks, 2);
    let ub = r.w.uncompressed_bytes();
    r.w.end_block().unwrap();
    let decoded = zstd::decode_all(&buf.bytes()[..]).unwrap();
    assert_eq!(ub, decoded.len() as u64);
}

#[test]
fn clock_sync_converts_both_directions() {
    let c = ClockSync {
        trace_ns: 5_000,
        unix_ns: 1_700_000_000_000_000_000,
    };
    assert_eq!(c.to_unix_ns(5_000), 1_700_000_000_000_000_000);
    assert_eq!(c.to_unix_ns(6_500), 1_700_000_000_000_001_500);
    assert_eq!(c.to_unix_ns(0), 1_699_999_999_999_995_000);
}

#[test]
fn sync_kind_display_names() {
    assert_eq!(
        SyncKind::StreamSynchronize.display_name(),
        "StreamSynchronize"
    );
    assert_eq!(
        SyncKind::ContextSynchronize.display_name(),
        "ContextSynchronize"
    );
    assert_eq!(
        SyncKind::EventSynchronize.display_name(),
        "EventSynchronize"
    );
    assert_eq!(SyncKind::StreamWaitEvent.display_name(), "StreamWaitEvent");
    assert_eq!(SyncKind::Unknown.display_name(), "Synchronize");
}

// ---------------------------------------------------------------------------------------------
// Interning
// ---------------------------------------------------------------------------------------------

#[test]
fn interning_is_idempotent_and_dense() {
    let buf = SharedBuf::default();
    let mut w = TraceWriter::new(buf.clone(), &minimal_header("intern")).unwrap();
    let a = w.intern_str("a").unwrap();
    let b = w.intern_str("b").unwrap();
    let a2 = w.intern_str("a").unwrap();
    let c = w.intern_str("c").unwrap();
    let empty = w.intern_str("").unwrap();
    assert_eq!(
        (a, b, a2, c, empty),
        (StrId(0), StrId(1), StrId(0), StrId(2), StrId(3))
    );

    let fa = native(a, 0x10, None);
    let fb = python(b, c, 7);
    let f0 = w.intern_frame(fa.clone()).unwrap();
    let f1 = w.intern_frame(fb.clone()).unwrap();
    let f0b = w.intern_frame(fa.clone()).unwrap();
    // Same frame but inlined is a different frame.
    let mut fa_inl = fa.clone();
    fa_inl.inlined = true;
    let f2 = w.intern_frame(fa_inl).unwrap();
    assert_eq!(
        (f0, f1, f0b, f2),
        (FrameId(0), FrameId(1), FrameId(0), FrameId(2))
    );

    let s0 = w.intern_stack(&[f0, f1]).unwrap();
    let s1 = w.intern_stack(&[f1, f0]).unwrap(); // order matters
    let s0b = w.intern_stack(&[f0, f1]).unwrap();
    let s2 = w.intern_stack(&[]).unwrap();
    assert_eq!(
        (s0, s1, s0b, s2),
        (StackId(0), StackId(1), StackId(0), StackId(2))
    );
    assert_eq!(
        w.counts().stacks,
        3,
        "a re-interned stack is not counted again"
    );
    w.finish(1, "shutdown").unwrap();

    let got: Vec<Record> = TraceReader::from_reader(
        std::io::Cursor::new(zstd::decode_all(&buf.bytes()[..]).unwrap()),
        "mem",
    )
    .collect();
    let strs: Vec<&StrRecord> = got
        .iter()
        .filter_map(|r| {
            if let Record::Str(s) = r {
                Some(s)
            } else {
                None
            }
        })
        .collect();
    let frames: Vec<&Frame> = got
        .iter()
        .filter_map(|r| {
            if let Record::Frame(f) = r {
                Some(f)
            } else {
                None
            }
        })
        .collect();
    let stacks: Vec<&Stack> = got
        .iter()
        .filter_map(|r| {
            if let Record::Stack(s) = r {
                Some(s)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        strs.iter()
            .map(|s| (s.id.0, s.s.as_str()))
            .collect::<Vec<_>>(),
        vec![(0, "a"), (1, "b"), (2, "c"), (3, "")],
        "exactly one str record per distinct string, in id order"
    );
    assert_eq!(
        frames.iter().map(|f| f.id.0).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert!(frames[2].inlined && !frames[0].inlined);
    assert_eq!(frames[1].line, Some(7));
    assert_eq!(
        stacks.iter().map(|s| s.id.0).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    assert_eq!(stacks[1].frames, vec![f1, f0]);
    assert!(stacks[2].frames.is_empty());
    let Some(Record::End(end)) = got.last() else {
        panic!("no end record");
    };
    assert_eq!(end.counts.stacks, 3);
}

#[test]
fn interned_records_precede_their_first_use() {
    let (bytes, _, _) = multi_block_trace(5);
    let dir = TempDir::new("precede");
    let (got, warnings) = read_bytes(&dir, FIRST_TRACE_FILE, &bytes).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let mut strs = HashSet::new();
    let mut frames = HashSet::new();
    let mut stacks = HashSet::new();
    let (mut next_str, mut next_frame, mut next_stack) = (0u32, 0u32, 0u32);
    let mut uses = 0;
    for (i, r) in got.iter().enumerate() {
        let (s, f, k) = refs(r);
        for id in s {
            assert!(
                strs.contains(&id),
                "record {i} ({r:?}) uses str {id:?} before its definition"
            );
            uses += 1;
        }
        for id in f {
            assert!(
                frames.contains(&id),
                "record {i} uses frame {id:?} before its definition"
            );
            uses += 1;
        }
        for id in k {
            assert!(
                stacks.contains(&id),
                "record {i} uses stack {id:?} before its definition"
            );
            uses += 1;
        }
        match r {
            Record::Str(s) => {
                assert_eq!(s.id.0, next_str, "str ids dense, in order");
                next_str += 1;
                assert!(strs.insert(s.id), "str {:?} defined twice", s.id);
            }
            Record::Frame(f) => {
                assert_eq!(f.id.0, next_frame, "frame ids dense, in order");
                next_frame += 1;
                assert!(frames.insert(f.id), "frame {:?} defined twice", f.id);
            }
            Record::Stack(s) => {
                assert_eq!(s.id.0, next_stack, "stack ids dense, in order");
                next_stack += 1;
                assert!(stacks.insert(s.id), "stack {:?} defined twice", s.id);
            }
            _ => {}
        }
    }
    assert!(uses > 30, "the walk checked too few references ({uses})");
    assert!(next_str >= 5 && next_frame >= 3 && next_stack >= 2);
}

// ---------------------------------------------------------------------------------------------
// Newer versions
// ---------------------------------------------------------------------------------------------

#[test]
fn newer_version_unknown_types_and_fields_are_tolerated() {
    let dir = TempDir::new("future");
    let text = r#"{"t":"header","format":"gpufl-trace","version":2,"gpufl_version":"9.9.9","session_id":"s","app_name":"a","host":"h","pid":1,"ppid":0,"command_line":["a"],"start_unix_ns":10,"clock":{"trace_ns":1,"unix_ns":2,"drift_ppm":0.5},"gpus":[{"index":0,"name":"G","uuid":"GPU-1","sm_count":1,"cc_major":12,"cc_minor":0,"total_mem_bytes":1,"mig":true}],"options":{"enable_synchronization":true,"enable_stack_trace":false,"api_records":"none","log_path":"/l","started_by":"api","sample_rate_hz":100},"capture":{"status":"ok"},"new_header_field":{"nested":[1,2]}}
{"t":"gpu_metric","dev":0,"ts":5,"util":0.5}
{"t":"str","id":0,"s":"k","lang":"c++"}
{"t":"kernel","name":0,"start":100,"end":200,"dev":0,"ctx":1,"stream":2,"corr":3,"grid":[1,1,1],"block":[32,1,1],"regs":8,"smem_static":0,"smem_dynamic":0,"local_mem":0,"cluster":[2,1,1],"graph_id":7}
{"t":"gpu_metric","dev":0,"ts":6,"util":0.7}
{"t":"sync","kind":"graph_synchronize","start":1,"end":2,"ctx":1,"corr":4}
{"t":"frame","id":0,"kind":"jit","func":0,"column":3}
{"t":"memcpy","kind":"HtoC","src_kind":"cxl","dst_kind":"device","bytes":1,"start":1,"end":2,"dev":0,"ctx":1,"stream":2,"corr":5}
{"t":"api","domain":"nvtx","name":0,"cbid":1,"start":1,"end":2,"tid":3,"corr":6,"ret":0}
{"t":"power_sample","w":300}
{"dev":0,"t":"memset","bytes":8,"value":0,"mem_kind":"device","start":1,"end":2,"ctx":1,"stream":2,"corr":7}
{"t":"end","end_unix_ns":20,"reason":"shutdown","counts":{"kernels":1,"memcpys":1,"memsets":1,"syncs":1,"apis":1,"stacks":0,"dropped":0,"gpu_metrics":2}}
"#;
    let p = dir.join("trace-0000.ndjson");
    std::fs::write(&p, text).unwrap();
    let (got, warnings) = read_file(&p);
    let types: Vec<&str> = got.iter().map(|r| r.type_name()).collect();
    assert_eq!(
        types,
        vec!["header", "str", "kernel", "sync", "frame", "memcpy", "api", "memset", "end"]
    );
    let Record::Header(h) = &got[0] else {
        unreachable!()
    };
    assert_eq!(h.version, 2);
    assert_eq!(
        h.clock,
        ClockSync {
            trace_ns: 1,
            unix_ns: 2
        }
    );
    assert_eq!(h.gpus[0].cc_major, 12);
    assert_eq!(h.options.started_by, "api");
    let Record::Kernel(k) = &got[2] else {
        unreachable!()
    };
    assert_eq!((k.start, k.end, k.block), (100, 200, [32, 1, 1]));
    let Record::Sync(s) = &got[3] else {
        unreachable!()
    };
    assert_eq!(s.kind, SyncKind::Unknown);
    let Record::Frame(f) = &got[4] else {
        unreachable!()
    };
    assert_eq!(f.kind, FrameKind::Unknown);
    let Record::Memcpy(m) = &got[5] else {
        unreachable!()
    };
    assert_eq!(
        (m.kind, m.src_kind, m.dst_kind),
        (CopyKind::Unknown, MemoryKind::Unknown, MemoryKind::Device)
    );
    let Record::Api(a) = &got[6] else {
        unreachable!()
    };
    assert_eq!(a.domain, ApiDomain::Unknown);
    let Record::Memset(ms) = &got[7] else {
        unreachable!()
    };
    assert_eq!(
        ms.bytes, 8,
        "a record whose \"t\" is not first is still read"
    );

    // Unknown types are counted, per type.
    let mut want = BTreeMap::new();
    want.insert("gpu_metric".to_string(), 2u64);
    want.insert("power_sample".to_string(), 1u64);
    let mut rd = TraceReader::open(&p).unwrap();
    let n = rd.by_ref().count();
    assert_eq!(n, 9);
    assert_eq!(rd.unknown_types(), &want);

    assert!(
        warnings
            .iter()
            .any(|w| w.contains("v2") && w.contains("newer")),
        "no newer-version warning: {warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("2 record(s)") && w.contains("gpu_metric")),
        "unknown type not reported: {warnings:?}"
    );
    assert!(
        warnings.iter().any(|w| w.contains("power_sample")),
        "unknown type not reported: {warnings:?}"
    );
    assert!(
        !warnings.iter().any(|w| w.contains("not valid records")),
        "known records with extra fields must not count as bad lines: {warnings:?}"
    );
}

#[test]
fn current_version_header_gives_no_version_warning() {
    let (bytes, _, _) = multi_block_trace(1);
    let dir = TempDir::new("curver");
    let (_, warnings) = read_bytes(&dir, "t.ndjson.zst", &bytes).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
}

// ---------------------------------------------------------------------------------------------
// Sessions
// ---------------------------------------------------------------------------------------------

#[test]
fn utc_formatting_of_known_instants() {
    assert_eq!(utc_compact(0), "19700101T000000Z");
    assert_eq!(utc_compact(1_700_000_000), "20231114T221320Z");
    assert_eq!(utc_compact(1_709_164_800), "20240229T000000Z"); // leap day
    assert_eq!(utc_compact(1_709_251_199), "20240229T235959Z");
    assert_eq!(utc_compact(1_709_251_200), "20240301T000000Z");
    assert_eq!(utc_compact(951_827_696), "20000229T123456Z"); // leap century
    assert_eq!(utc_compact(4_107_542_400), "21000301T000000Z"); // 2100 is not a leap year
    assert_eq!(utc_compact(946_684_799), "19991231T235959Z");
}

#[test]
fn session_dir_name_sanitizes_and_formats() {
    assert_eq!(
        session_dir_name("train", 4242, 1_700_000_000_000_000_000),
        "train-4242-20231114T221320Z"
    );
    // Sub-second part is dropped, not rounded.
    assert_eq!(
        session_dir_name("train", 1, 1_700_000_000_999_999_999),
        "train-1-20231114T221320Z"
    );
    assert_eq!(
        session_dir_name("my app/../x:ü", 7, 1_709_208_000_000_000_000),
        "my_app_.._x__-7-20240229T120000Z"
    );
    assert_eq!(
        session_dir_name("v1.2_ok-Name", 0, 0),
        "v1.2_ok-Name-0-19700101T000000Z"
    );
    assert_eq!(session_dir_name("", 3, 0), "app-3-19700101T000000Z");
    let long = "x".repeat(200);
    let name = session_dir_name(&long, 3, 0);
    assert_eq!(name, format!("{}-3-19700101T000000Z", "x".repeat(64)));
    for c in name.chars() {
        assert!(c.is_ascii_alphanumeric() || "_.-".contains(c));
    }
}

/// Write a finished trace to `path` with `n` kernels starting at `first_start`.
fn write_trace_file(path: &Path, app: &str, first_start: u64, n: u64) -> Vec<Record> {
    let file = std::fs::File::create(path).unwrap();
    let mut r = Recorder::new(file, &minimal_header(app));
    let name = r.str("k");
    for i in 0..n {
        r.rec(Record::Kernel(Kernel {
            name,
            start: first_start + i,
            end: first_start + i + 1,
            ..Kernel::default()
        }));
        if i % 2 == 1 {
            r.w.end_block().unwrap();
        }
    }
    let (_, expected) = r.finish(99, "shutdown");
    expected
}

#[test]
fn session_reader_reads_files_in_order() {
    let root = TempDir::new("sessions");
    let sdir = root.join(&session_dir_name("train", 42, 1_700_000_000_000_000_000));
    std::fs::create_dir(&sdir).unwrap();
    // Written in reverse order: the reader must sort by name, not by creation.
    let second = write_trace_file(&sdir.join("trace-0001.ndjson.zst"), "train", 1000, 5);
    let first = write_trace_file(&sdir.join(FIRST_TRACE_FILE), "train", 0, 4);
    std::fs::write(sdir.join("notes.txt"), "not a trace").unwrap();
    std::fs::write(sdir.join("trace.lock"), "").unwrap();

    let files = trace_files(&sdir).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![FIRST_TRACE_FILE, "trace-0001.ndjson.zst"]);
    assert!(is_session_dir(&sdir));

    let mut sr = SessionReader::open(&sdir).unwrap();
    let got: Vec<Record> = sr.by_ref().collect();
    let mut want = first.clone();
    want.extend(second);
    assert_eq!(got, want);
    assert!(sr.warnings().is_empty(), "{:?}", sr.warnings());

    // A second session, a non-session directory and a plain file under the same root.
    let sdir2 = root.join(&session_dir_name("eval", 7, 1_709_208_000_000_000_000));
    std::fs::create_dir(&sdir2).unwrap();
    write_trace_file(&sdir2.join(FIRST_TRACE_FILE), "eval", 0, 1);
    std::fs::create_dir(root.join("empty")).unwrap();
    std::fs::write(root.join("README"), "x").unwrap();
    assert_eq!(
        find_sessions(root.path()),
        vec![sdir2.clone(), sdir.clone()]
    );
    // A session directory itself is found as itself.
    assert_eq!(find_sessions(&sdir), vec![sdir.clone()]);
    assert!(find_sessions(&root.join("empty")).is_empty());
    assert!(find_sessions(&root.join("does-not-exist")).is_empty());
}

#[test]
fn run_directories_hold_sessions_and_a_run_record() {
    use gpufl_trace::run::{read_run, run_dir_name, write_run, RunRecord, RUN_FILE, RUN_FORMAT};
    let root = TempDir::new("runs");
    let t = 1_700_000_000_000_000_000;
    let run_dir = root.join(&run_dir_name("torchrun", 4100, t));
    assert_eq!(
        run_dir.file_name().unwrap().to_string_lossy(),
        "run-torchrun-4100-20231114T221320Z"
    );
    std::fs::create_dir(&run_dir).unwrap();
    // No run record yet: None, not an error.
    assert_eq!(read_run(&run_dir).unwrap(), None);
    let mut rec = RunRecord {
        format: RUN_FORMAT.into(),
        version: 1,
        run_id: "run-torchrun-4100-20231114T221320Z".into(),
        command: vec!["torchrun".into(), "train.py".into()],
        start_unix_ns: t,
        ..RunRecord::default()
    };
    write_run(&run_dir, &rec).unwrap();
    assert_eq!(read_run(&run_dir).unwrap().as_ref(), Some(&rec));
    rec.exit_code = Some(3);
    write_run(&run_dir, &rec).unwrap();
    assert_eq!(read_run(&run_dir).unwrap().unwrap().exit_code, Some(3));
    // Only run.json is left behind (the temporary file was renamed).
    let names: Vec<String> = std::fs::read_dir(&run_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec![RUN_FILE.to_string()]);

    // Sessions of the run, and one session beside it (an older gpufl's layout).
    let a = run_dir.join(session_dir_name("train", 4101, t));
    let b = run_dir.join(session_dir_name("train", 4102, t));
    let old = root.join(&session_dir_name("old", 7, t));
    for d in [&a, &b, &old] {
        std::fs::create_dir(d).unwrap();
        write_trace_file(&d.join(FIRST_TRACE_FILE), "train", 0, 1);
    }
    // A directory of sessions without run.json is not looked into (only run directories are).
    let plain = root.join("plain");
    std::fs::create_dir_all(plain.join("x")).unwrap();
    write_trace_file(&plain.join("x").join(FIRST_TRACE_FILE), "x", 0, 1);
    assert_eq!(
        find_sessions(root.path()),
        vec![old.clone(), a.clone(), b.clone()]
    );
    assert_eq!(find_sessions(&run_dir), vec![a.clone(), b.clone()]);

    // Not a run record: an error that says so.
    std::fs::write(run_dir.join(RUN_FILE), r#"{"format":"other","version":1}"#).unwrap();
    assert!(read_run(&run_dir).is_err());
    std::fs::write(run_dir.join(RUN_FILE), "garbage").unwrap();
    let e = read_run(&run_dir).unwrap_err().to_string();
    assert!(e.contains("not a run record"), "{e}");
}

#[test]
fn session_reader_survives_a_bad_file() {
    let dir = TempDir::new("badsession");
    let first = write_trace_file(&dir.join(FIRST_TRACE_FILE), "a", 0, 3);
    std::fs::write(dir.join("trace-0001.ndjson.zst"), b"\x00\x01garbage").unwrap();
    let mut sr = SessionReader::open(dir.path()).unwrap();
    let got: Vec<Record> = sr.by_ref().collect();
    assert_eq!(got, first);
    let w = sr.warnings();
    assert!(
        w.iter()
            .any(|w| w.contains("trace-0001") && w.contains("not a gpufl trace")),
        "{w:?}"
    );
}

#[test]
fn directory_without_trace_files_is_not_a_session() {
    let dir = TempDir::new("notsession");
    std::fs::write(dir.join("trace.txt"), "x").unwrap();
    std::fs::write(dir.join("other.ndjson.zst"), "x").unwrap();
    assert!(matches!(
        trace_files(dir.path()),
        Err(TraceError::NotASession(p)) if p == dir.path()
    ));
    assert!(matches!(
        SessionReader::open(dir.path()),
        Err(TraceError::NotASession(_))
    ));
    assert!(!is_session_dir(dir.path()));
    assert!(matches!(
        trace_files(&dir.join("missing")),
        Err(TraceError::Io { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Symbols
// ---------------------------------------------------------------------------------------------

#[test]
fn symbols_describe_frames_and_tolerate_missing_ids() {
    let mut sym = Symbols::default();
    let recs = [
        Record::Str(StrRecord {
            id: StrId(0),
            s: "train_step".into(),
        }),
        Record::Str(StrRecord {
            id: StrId(1),
            s: "/home/u/train.py".into(),
        }),
        Record::Str(StrRecord {
            id: StrId(2),
            s: "/usr/lib/x86_64-linux-gnu/libcudart.so.12".into(),
        }),
        Record::Str(StrRecord {
            id: StrId(3),
            s: "cudaStreamSynchronize".into(),
        }),
        Record::Frame(Frame {
            id: FrameId(0),
            kind: FrameKind::Python,
            module: None,
            offset: None,
            func: Some(StrId(0)),
            file: Some(StrId(1)),
            line: Some(42),
            inlined: false,
            text: None,
        }),
        Record::Frame(Frame {
            id: FrameId(1),
            kind: FrameKind::Native,
            module: Some(StrId(2)),
            offset: Some(0x1a2b),
            func: Some(StrId(3)),
            file: None,
            line: None,
            inlined: false,
            text: None,
        }),
        // References a string that was never defined.
        Record::Frame(Frame {
            id: FrameId(2),
            kind: FrameKind::Native,
            module: Some(StrId(77)),
            offset: Some(16),
            func: Some(StrId(99)),
            file: None,
            line: None,
            inlined: false,
            text: None,
        }),
        // Nothing known at all.
        Record::Frame(Frame {
            id: FrameId(3),
            kind: FrameKind::Unknown,
            module: None,
            offset: None,
            func: None,
            file: None,
            line: None,
            inlined: false,
            text: None,
        }),
        Record::Stack(Stack {
            id: StackId(0),
            frames: vec![FrameId(1), FrameId(0)],
            via_tid: None,
        }),
    ];
    for r in &recs {
        assert!(sym.observe(r));
    }
    assert!(!sym.observe(&Record::Kernel(Kernel::default())));
    assert!(!sym.observe(&Record::End(End::default())));

    assert_eq!(
        sym.describe_frame(FrameId(0)),
        "train_step (/home/u/train.py:42)"
    );
    assert_eq!(
        sym.describe_frame(FrameId(1)),
        "cudaStreamSynchronize [libcudart.so.12+0x1a2b]"
    );
    assert_eq!(sym.describe_frame(FrameId(2)), "? [?+0x10]");
    assert_eq!(sym.describe_frame(FrameId(3)), "?? [?+0x0]");
    let missing = sym.describe_frame(FrameId(1000));
    assert!(missing.contains("1000"), "{missing}");

    assert_eq!(sym.str(StrId(1)), "/home/u/train.py");
    assert_eq!(sym.str(StrId(4)), "?");
    assert_eq!(sym.str(StrId(u32::MAX)), "?");
    assert_eq!(sym.opt_str(None), None);
    assert_eq!(sym.opt_str(Some(StrId(500))), Some("?"));
    assert!(sym.frame(FrameId(4)).is_none());
    assert_eq!(sym.stack(StackId(0)), Some(&[FrameId(1), FrameId(0)][..]));
    assert!(sym.stack(StackId(1)).is_none());
    assert!(sym.stack(StackId(u32::MAX)).is_none());
}

#[test]
fn symbols_resolve_stacks_of_a_written_trace() {
    let (bytes, _, _) = multi_block_trace(2);
    let dir = TempDir::new("symtrace");
    let (got, _) = read_bytes(&dir, "t.ndjson.zst", &bytes).unwrap();
    let mut sym = Symbols::default();
    let mut described = Vec::new();
    for r in &got {
        sym.observe(r);
        if let Record::Sync(Sync {
            stack: Some(stack), ..
        }) = r
        {
            let frames = sym.stack(*stack).expect("stack defined before use");
            described.push(
                frames
                    .iter()
                    .map(|f| sym.describe_frame(*f))
                    .collect::<Vec<_>>(),
            );
        }
    }
    assert_eq!(described.len(), 2);
    assert_eq!(
        described[0],
        vec![
            "cudaStreamSynchronize [libcudart.so.12+0x1a2b0]",
            "cudaStreamSynchronize [libcudart.so.12+0x1a2b0]",
            "train_step (/home/u/train.py:40)",
        ]
    );
    assert_eq!(described[1][2], "train_step (/home/u/train.py:41)");
}

// ---------------------------------------------------------------------------------------------
// In-memory traces
// ---------------------------------------------------------------------------------------------

#[test]
fn from_bytes_reads_like_open() {
    let (bytes, expected, boundaries) = multi_block_trace(4);
    let dir = TempDir::new("frombytes");
    let mut rd = TraceReader::from_bytes(bytes.clone(), "mem").unwrap();
    let got: Vec<Record> = rd.by_ref().collect();
    assert_eq!(got, expected);
    assert!(rd.warnings().is_empty(), "{:?}", rd.warnings());
    // A cut inside the last block: the same records and warnings as reading the cut file.
    let cut = boundaries[boundaries.len() - 2].0 + 20;
    let (from_file, file_warnings) = read_bytes(&dir, "t.ndjson.zst", &bytes[..cut]).unwrap();
    let mut rd = TraceReader::from_bytes(bytes[..cut].to_vec(), "mem").unwrap();
    let got: Vec<Record> = rd.by_ref().collect();
    assert_eq!(got, from_file);
    assert_eq!(rd.warnings().len(), file_warnings.len());
    // Plain NDJSON, empty input, and bytes that are neither.
    let text = "{\"t\":\"dropped\",\"source\":\"cupti\",\"count\":2}\n";
    let got: Vec<Record> = TraceReader::from_bytes(text.as_bytes().to_vec(), "mem")
        .unwrap()
        .collect();
    assert_eq!(got.len(), 1);
    assert_eq!(
        TraceReader::from_bytes(Vec::new(), "mem").unwrap().count(),
        0
    );
    assert!(matches!(
        TraceReader::from_bytes(b"PK\x03\x04".to_vec(), "mem"),
        Err(TraceError::NotATrace { .. })
    ));
}

#[test]
fn scope_lines_are_compact_and_tolerate_new_sources() {
    let open = Record::Scope(Scope {
        ts: 5,
        tid: 9,
        name: StrId(2),
        depth: 1,
        end: false,
        source: ScopeSource::Nvtx,
    });
    let line = serde_json::to_string(&open).unwrap();
    assert_eq!(
        line,
        r#"{"t":"scope","ts":5,"tid":9,"name":2,"depth":1,"source":"nvtx"}"#
    );
    let close: Record = serde_json::from_str(
        r#"{"t":"scope","ts":6,"tid":9,"name":2,"depth":1,"end":true,"source":"roctx"}"#,
    )
    .unwrap();
    let Record::Scope(c) = close else {
        panic!("not a scope record");
    };
    assert!(c.end);
    assert_eq!(c.source, ScopeSource::Unknown);
}

#[test]
fn stream_role_from_a_newer_recorder_reads_as_other() {
    let line = br#"{"t":"stream","ctx":3,"stream":9,"role":"graph_capture"}"#;
    let rec: Record = serde_json::from_slice(line).unwrap();
    assert_eq!(
        rec,
        Record::Stream(StreamInfo {
            ctx: 3,
            stream: 9,
            role: StreamRole::Other
        })
    );
    let legacy: Record =
        serde_json::from_slice(br#"{"t":"stream","ctx":1,"stream":7,"role":"legacy_default"}"#)
            .unwrap();
    assert_eq!(legacy.type_name(), "stream");
}

#[test]
fn mem_lines_are_compact_and_tolerate_new_ops() {
    let free = Record::Mem(Mem {
        ts: 5,
        op: MemOp::Free,
        addr: 4096,
        bytes: 1 << 20,
        mem_kind: MemoryKind::Device,
        dev: 1,
        ctx: 2,
        corr: 9,
        ..Mem::default()
    });
    let line = serde_json::to_string(&free).unwrap();
    assert_eq!(
        line,
        r#"{"t":"mem","ts":5,"op":"free","addr":4096,"bytes":1048576,"mem_kind":"device","dev":1,"ctx":2,"corr":9}"#
    );
    let failed: Record = serde_json::from_str(
        r#"{"t":"mem","ts":6,"op":"alloc_failed","addr":0,"bytes":7,"mem_kind":"device","dev":0,"ctx":0,"corr":3,"stack":4,"free":100}"#,
    )
    .unwrap();
    let Record::Mem(f) = failed else {
        panic!("not a mem record");
    };
    assert_eq!(
        (f.op, f.stack, f.free),
        (MemOp::AllocFailed, Some(StackId(4)), Some(100))
    );
    assert!(!f.is_alloc());
    let newer: Record = serde_json::from_str(
        r#"{"t":"mem","ts":6,"op":"remap","addr":1,"bytes":7,"mem_kind":"tiled","dev":0,"ctx":0,"corr":3,"extra":[1]}"#,
    )
    .unwrap();
    let Record::Mem(n) = newer else {
        panic!("not a mem record");
    };
    assert_eq!((n.op, n.mem_kind), (MemOp::Unknown, MemoryKind::Unknown));
    // A carried allocation says so; an ordinary one leaves the field out.
    let carried = Record::Mem(Mem {
        op: MemOp::Alloc,
        carried: true,
        ..Mem::default()
    });
    let line = serde_json::to_string(&carried).unwrap();
    assert!(line.ends_with(r#","carried":true}"#), "{line}");
    let back: Record = serde_json::from_str(&line).unwrap();
    assert_eq!(back, carried);
}

#[path = "format/damaged.rs"]
mod damaged;
#[path = "format/limits.rs"]
mod limits;
#[path = "format/telemetry.rs"]
mod telemetry;
