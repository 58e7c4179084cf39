//! Reading on several threads and analysing on several threads change nothing: the model and the
//! analysis (as JSON) of every testdata session and of a generated multi-block session are those
//! of the sequential reader and `analyze`, with 1, 2, 3 and 4 threads.

use gpufl_analysis::{analyze, analyze_on, Config, Model};
use gpufl_trace::*;
use std::path::Path;

/// Everything observable of a model and its analysis.
fn fingerprint(m: &Model, threads: usize) -> String {
    let a = analyze_on(m, &Config::default(), threads);
    format!(
        "{} {} {} {} {} {} {:?} {:?} {:?} {:?} {:?}\n{}",
        m.kernel_count(),
        m.copy_count(),
        m.sync_count(),
        m.api_count(),
        m.callsite_count(),
        m.files(),
        m.time_range(),
        m.devices(),
        m.warnings(),
        m.hostcalls().collect::<Vec<_>>(),
        m.hsamples().collect::<Vec<_>>(),
        serde_json::to_string(&a).unwrap()
    )
}

fn check(name: &str, seq: impl Fn() -> Model, par: impl Fn(usize) -> Model) {
    let m = seq();
    let json = |a| serde_json::to_string(&a).unwrap();
    assert!(json(analyze(&m, &Config::default())) == json(analyze_on(&m, &Config::default(), 1)));
    let want = fingerprint(&m, 1);
    for t in [1, 2, 3, 4] {
        let got = fingerprint(&par(t), t);
        assert!(got == want, "{name}: {t} threads differ");
    }
}

#[test]
fn testdata_sessions_load_and_analyse_the_same_on_any_number_of_threads() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/sessions");
    let dirs = session::find_sessions(&root);
    assert!(dirs.len() >= 20);
    for dir in dirs {
        check(
            &dir.display().to_string(),
            || {
                let mut r = SessionReader::open(&dir).unwrap();
                let mut m = Model::load(r.by_ref());
                m.add_warnings(r.warnings());
                m
            },
            |t| {
                let mut r = ParSessionReader::open(&dir, t).unwrap();
                let mut m = Model::load(r.by_ref());
                m.add_warnings(r.warnings());
                m
            },
        );
    }
}

#[test]
fn generated_multi_block_session_loads_and_analyses_the_same() {
    let header = Header {
        session_id: "par-1-20261125T000000Z".into(),
        gpus: vec![Gpu {
            sm_count: 132,
            ..Gpu::default()
        }],
        ..Header::default()
    };
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    let file = w.intern_str("/app/train.py").unwrap();
    let mut t = 1_000_000u64;
    for i in 0..60_000u32 {
        t += 900 + (i as u64 * 7919) % 2000;
        // Strings and stacks first used deep into the session, in later blocks.
        let name = w.intern_str(&format!("k{}", i % 97)).unwrap();
        // Host records among the GPU work: a hostcall (with a stack) and host samples.
        if i % 500 == 7 {
            let f = w
                .intern_frame(FrameData {
                    kind: FrameKind::Python,
                    module: None,
                    offset: None,
                    func: Some(name),
                    file: Some(file),
                    line: Some(30 + i % 3),
                    inlined: false,
                    text: None,
                })
                .unwrap();
            let stack = w.intern_stack(&[f]).unwrap();
            let cuda_free = w.intern_str("cudaFree").unwrap();
            w.write(&Record::Hostcall(Hostcall {
                name: cuda_free,
                start: t,
                end: t + 400,
                tid: 1,
                corr: 1_000_000 + i,
                stack: Some(stack),
                bytes: (i % 1000 == 7).then_some(4096),
                ..Hostcall::default()
            }))
            .unwrap();
            w.write(&Record::Hsample(Hsample {
                ts: t + 200,
                tid: 1,
                state: if i % 1000 == 7 {
                    HostState::Cuda
                } else {
                    HostState::Cpu
                },
                period_ns: 10_000_000,
                stack: Some(stack),
                call: (i % 1000 == 7).then_some(cuda_free),
            }))
            .unwrap();
        }
        let rec = if i % 40 == 3 {
            let f = w
                .intern_frame(FrameData {
                    kind: FrameKind::Python,
                    module: None,
                    offset: None,
                    func: Some(name),
                    file: Some(file),
                    line: Some(10 + i % 7),
                    inlined: false,
                    text: None,
                })
                .unwrap();
            let stack = w.intern_stack(&[f]).unwrap();
            Record::Sync(Sync {
                kind: SyncKind::StreamSynchronize,
                start: t,
                end: t + 3_000,
                ctx: 1,
                stream: Some(7),
                corr: i,
                tid: Some(1),
                stack: Some(stack),
                ..Sync::default()
            })
        } else {
            Record::Kernel(Kernel {
                name,
                start: t,
                end: t + 1_500 + (i as u64 % 5) * 400,
                dev: 0,
                ctx: 1,
                stream: 7 + i % 2,
                corr: i,
                grid: [1 + (i % 3) as i32 * 40, 1, 1],
                block: [256, 1, 1],
                regs: 32,
                // Runs of graph replays here and there (not folded: they come one by one).
                graph: (i % 3000 < 200).then_some(GraphNode(2 + i / 30_000, (i % 5) as u64)),
                ..Kernel::default()
            })
        };
        w.write(&rec).unwrap();
        if i % 1_000 == 999 {
            w.end_block().unwrap();
        }
    }
    let bytes = w.finish(0, "exit").unwrap();
    check(
        "generated",
        || Model::load(TraceReader::from_bytes(bytes.clone(), "g").unwrap()),
        |t| Model::load(ParTraceReader::from_bytes(bytes.clone(), "g", t).unwrap()),
    );
    // Folded on the reader's workers: the same.
    check(
        "generated, folded",
        || Model::load(TraceReader::from_bytes(bytes.clone(), "g").unwrap()),
        |t| Model::load_items(&mut ParTraceReader::from_bytes(bytes.clone(), "g", t).unwrap()),
    );
    let m = Model::load(TraceReader::from_bytes(bytes.clone(), "g").unwrap());
    assert_eq!((m.hostcall_count(), m.hsample_count()), (120, 120));
    let h = m.hostcall(1);
    assert_eq!(
        (m.str(h.name), h.duration_ns(), h.bytes),
        ("cudaFree", 400, None)
    );
    assert!(h.stack.is_some());
    let s = m.hsample(2);
    assert_eq!((s.state, s.period_ns), (HostState::Cuda, 10_000_000));
    assert_eq!(s.call.map(|c| m.str(c)), Some("cudaFree"));
    let graphs = analyze(&m, &Config::default()).graphs;
    assert_eq!(graphs.len(), 2, "{graphs:?}");
    assert_eq!(graphs.iter().map(|g| g.nodes).sum::<u64>(), 10);
}
