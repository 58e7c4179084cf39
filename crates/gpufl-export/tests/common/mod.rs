//! Shared by the export tests: what a session holds (read with gpufl-trace, independently of the
//! exporter), the testdata sessions, and a synthetic always-on session with hostile strings.

#![allow(dead_code)]

use gpufl_trace::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub fn testdata(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
    gpufl_trace::session::find_sessions(&root)
        .into_iter()
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with(name))
        .unwrap_or_else(|| panic!("no testdata session {name}"))
}

/// The sessions the tests export.
pub fn sessions() -> Vec<PathBuf> {
    vec![
        testdata("pytorch_train_sync-1304"),
        testdata("hf_trainer"),
        testdata("nvtx_ranges"),
        testdata("malloc_free_loop-613-20261127T204121Z"),
        testdata("pytorch_empty_cache-759-20261127T204130Z"),
        synthetic(),
    ]
}

/// GPU work expected on a stream track: (dev, stream, category, name, ts Unix ns, dur ns).
pub type GpuWork = (u32, u32, &'static str, String, u64, u64);

#[derive(Default, Debug)]
pub struct Expected {
    pub gpu: Vec<GpuWork>,
    pub syncs: usize,
    pub syncs_with_stack: usize,
    pub telemetry_values: usize,
    pub scope_opens: usize,
    pub ranges: usize,
    pub pid: u32,
    /// Hostcalls: (tid, call name, ts Unix ns, dur ns).
    pub hostcalls: Vec<(u64, String, u64, u64)>,
    /// Host samples: (tid, ts Unix ns, state as the format spells it, call name).
    pub hsamples: Vec<(u64, u64, String, Option<String>)>,
}

/// Read the session as the format defines it.
pub fn expected(dir: &Path) -> Expected {
    let mut e = Expected::default();
    let mut sym = Symbols::default();
    let mut clock: Option<ClockSync> = None;
    let unix = |c: &Option<ClockSync>, t: u64| match c {
        Some(c) => (c.unix_ns as i128 + t as i128 - c.trace_ns as i128) as u64,
        None => t,
    };
    for rec in SessionReader::open(dir).unwrap() {
        if sym.observe(&rec) {
            continue;
        }
        match rec {
            Record::Header(h) => {
                if clock.is_none() {
                    e.pid = h.pid;
                }
                clock = Some(h.clock);
            }
            Record::Kernel(k) => e.gpu.push((
                k.dev,
                k.stream,
                "kernel",
                sym.str(k.name).to_string(),
                unix(&clock, k.start),
                k.end.saturating_sub(k.start),
            )),
            Record::Memcpy(c) => e.gpu.push((
                c.dev,
                c.stream,
                "memcpy",
                format!(
                    "memcpy {}",
                    serde_json::to_value(c.kind).unwrap().as_str().unwrap()
                ),
                unix(&clock, c.start),
                c.end.saturating_sub(c.start),
            )),
            Record::Memset(s) => e.gpu.push((
                s.dev,
                s.stream,
                "memset",
                "memset".into(),
                unix(&clock, s.start),
                s.end.saturating_sub(s.start),
            )),
            Record::Sync(s) => {
                e.syncs += 1;
                e.syncs_with_stack += s.stack.is_some() as usize;
            }
            Record::Telemetry(t) => {
                e.telemetry_values += [
                    t.gpu_util.is_some(),
                    t.mem_util.is_some(),
                    t.mem_used.is_some(),
                    t.temp_c.is_some(),
                    t.power_mw.is_some(),
                    t.sm_mhz.is_some(),
                    t.mem_mhz.is_some(),
                    t.pcie_tx_kbs.is_some(),
                    t.pcie_rx_kbs.is_some(),
                ]
                .iter()
                .filter(|&&b| b)
                .count()
            }
            Record::Scope(s) if !s.end => e.scope_opens += 1,
            Record::Range(_) => e.ranges += 1,
            Record::Hostcall(h) => e.hostcalls.push((
                h.tid,
                sym.str(h.name).to_string(),
                unix(&clock, h.start),
                h.end.saturating_sub(h.start),
            )),
            Record::Hsample(h) => e.hsamples.push((
                h.tid,
                unix(&clock, h.ts),
                serde_json::to_value(h.state)
                    .unwrap()
                    .as_str()
                    .unwrap()
                    .to_string(),
                h.call.map(|c| sym.str(c).to_string()),
            )),
            _ => {}
        }
    }
    e.gpu.sort();
    e.hostcalls.sort();
    e.hsamples.sort();
    e
}

/// Insights gpufl-analysis finds in the session.
pub fn insight_count(dir: &Path) -> usize {
    let m = gpufl_analysis::Model::load(SessionReader::open(dir).unwrap());
    gpufl_analysis::analyze(&m, &gpufl_analysis::Config::default())
        .insights
        .len()
}

/// Multiset helper.
pub fn counts<T: Ord>(it: impl IntoIterator<Item = T>) -> BTreeMap<T, usize> {
    let mut m = BTreeMap::new();
    for x in it {
        *m.entry(x).or_insert(0) += 1;
    }
    m
}

/// An always-on session (windows, telemetry, scopes left open, a pause) with launches of every
/// shape: api + kernel, call site only, api without GPU work, a graph launch (two kernels, one
/// correlation id), a copy and a memset; names with quotes, newlines, control and bidi
/// characters. Written once per test process under the target directory.
pub fn synthetic() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "export-synthetic-{}/always_on-77-20261125T000000Z",
        std::process::id()
    ));
    if dir.exists() {
        return dir;
    }
    std::fs::create_dir_all(&dir).unwrap();
    let t0 = 1_000_000_000u64;
    let header = Header {
        session_id: "always_on-77-20261125T000000Z".into(),
        app_name: "always\"on\n\u{1b}[31m".into(),
        pid: 77,
        clock: ClockSync {
            trace_ns: t0,
            unix_ns: 1_795_000_000_000_000_000,
        },
        gpus: vec![gpufl_trace::Gpu {
            index: 0,
            name: "synthetic GPU".into(),
            ..gpufl_trace::Gpu::default()
        }],
        options: CaptureOptions {
            mode: Some("always-on".into()),
            telemetry_ms: Some(100),
            ..CaptureOptions::default()
        },
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    };
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &header).unwrap();
    let k1 = w
        .intern_str("void k<\"q\">(int)\n\t\u{0}\u{202e}evil")
        .unwrap();
    let k2 = w.intern_str("graph_kernel").unwrap();
    let launch = w.intern_str("cudaLaunchKernel").unwrap();
    let malloc = w.intern_str("cudaMalloc").unwrap();
    let scope = w.intern_str("step \"1\"").unwrap();
    let inner = w.intern_str("forward").unwrap();
    let file_s = w.intern_str("/src/train\\x.py").unwrap();
    let func = w.intern_str("train_step").unwrap();
    let fr = w
        .intern_frame(FrameData {
            kind: FrameKind::Python,
            module: None,
            offset: None,
            func: Some(func),
            file: Some(file_s),
            line: Some(42),
            inlined: false,
            text: None,
        })
        .unwrap();
    let st = w.intern_stack(&[fr]).unwrap();
    let kernel = |name, start, corr, stream| {
        Record::Kernel(Kernel {
            name,
            start,
            end: start + 5_000,
            dev: 0,
            ctx: 1,
            stream,
            corr,
            grid: [1, 1, 1],
            block: [32, 1, 1],
            ..Kernel::default()
        })
    };
    let api = |name, start, corr| {
        Record::Api(Api {
            domain: ApiDomain::Runtime,
            name,
            cbid: 211,
            start,
            end: start + 2_000,
            tid: 500,
            corr,
            ret: 0,
        })
    };
    let recs = vec![
        Record::Window(Window {
            start: t0,
            end: t0 + 1_000_000,
            reason: "sampled".into(),
        }),
        Record::Scope(Scope {
            ts: t0 + 10,
            tid: 500,
            name: scope,
            depth: 0,
            end: false,
            source: ScopeSource::Api,
        }),
        Record::Scope(Scope {
            ts: t0 + 20,
            tid: 500,
            name: inner,
            depth: 1,
            end: false,
            source: ScopeSource::Nvtx,
        }),
        // The kernel arrives before its launch's api record.
        kernel(k1, t0 + 10_000, 1, 7),
        api(launch, t0 + 1_000, 1),
        Record::Callsite(Callsite {
            corr: 1,
            api: launch,
            tid: 500,
            ts: t0 + 1_100,
            stack: st,
            weight: None,
        }),
        // Call site only.
        Record::Callsite(Callsite {
            corr: 2,
            api: launch,
            tid: 500,
            ts: t0 + 20_000,
            stack: st,
            weight: Some(3),
        }),
        kernel(k1, t0 + 30_000, 2, 7),
        // No GPU work.
        api(malloc, t0 + 40_000, 3),
        // A graph launch: two kernels, one correlation id.
        api(launch, t0 + 50_000, 4),
        kernel(k2, t0 + 60_000, 4, 9),
        kernel(k2, t0 + 70_000, 4, 9),
        // GPU work whose launch was not recorded.
        kernel(k2, t0 + 80_000, 5, 9),
        Record::Memcpy(Memcpy {
            kind: CopyKind::HtoD,
            src_kind: MemoryKind::Pageable,
            dst_kind: MemoryKind::Device,
            bytes: 4096,
            start: t0 + 90_000,
            end: t0 + 95_000,
            dev: 0,
            ctx: 1,
            stream: 7,
            corr: 6,
            graph: None,
        }),
        api(launch, t0 + 85_000, 6),
        Record::Memset(Memset {
            bytes: 64,
            value: 0,
            mem_kind: MemoryKind::Device,
            start: t0 + 96_000,
            end: t0 + 97_000,
            dev: 0,
            ctx: 1,
            stream: 7,
            corr: 7,
            // A node of CUDA graph 7.
            graph: Some(GraphNode(7, 42)),
        }),
        Record::Sync(Sync {
            kind: SyncKind::StreamSynchronize,
            start: t0 + 100_000,
            end: t0 + 150_000,
            ctx: 1,
            stream: Some(7),
            corr: 8,
            tid: Some(500),
            stack: Some(st),
            ..Sync::default()
        }),
        Record::Scope(Scope {
            ts: t0 + 200_000,
            tid: 500,
            name: inner,
            depth: 1,
            end: true,
            source: ScopeSource::Nvtx,
        }),
        // A close with nothing open on its thread.
        Record::Scope(Scope {
            ts: t0 + 200_001,
            tid: 501,
            name: inner,
            depth: 0,
            end: true,
            source: ScopeSource::Api,
        }),
        Record::Capture(CaptureState {
            ts: t0 + 300_000,
            recording: false,
        }),
        Record::Telemetry(Box::new(Telemetry {
            ts: t0 + 100,
            dev: 0,
            gpu_util: Some(97),
            power_mw: Some(412_000),
            mem_used: Some(1 << 30),
            ..Telemetry::default()
        })),
        Record::Telemetry(Box::new(Telemetry {
            ts: t0 + 100_100,
            dev: 0,
            gpu_util: Some(12),
            temp_c: Some(50),
            ..Telemetry::default()
        })),
        Record::Range(Range {
            id: 9,
            name: scope,
            start: t0 + 5,
            end: t0 + 250_000,
            tid: 500,
            end_tid: Some(501),
            source: ScopeSource::Nvtx,
        }),
    ];
    for r in &recs {
        w.write(r).unwrap();
    }
    w.finish(1_795_000_000_001_000_000, "exit").unwrap();
    dir
}
