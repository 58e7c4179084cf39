//! `gpufl report` on a session with CUDA graph replays (issue 18): the graphs section, the
//! `graph-replay-gaps` insight at the sync's line, the kernel table's graph runs and a generated
//! kernel's source, JSON, and strings from the trace escaped in the new lines.

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("run gpufl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// 40 replays of a 3-node graph (graph 3) launched at replay.cu:40, each followed by a stream
/// sync at replay.cu:42 and 50 µs of host work; one node's name holds an escape sequence.
fn write_graph_session(root: &Path) -> PathBuf {
    use gpufl_trace::*;
    let name = "graph_replay-777-20261126T010000Z";
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let header = Header {
        session_id: name.into(),
        app_name: "graph_replay".into(),
        command_line: vec!["build/graph_replay".into()],
        gpus: vec![Gpu {
            index: 0,
            name: "NVIDIA H100 80GB HBM3".into(),
            sm_count: 132,
            cc_major: 9,
            ..Gpu::default()
        }],
        capture: CaptureStatus {
            status: "ok".into(),
            reason: None,
        },
        ..Header::default()
    };
    let file = std::fs::File::create(dir.join("trace-0000.ndjson.zst")).unwrap();
    let mut w = TraceWriter::new(file, &header).unwrap();
    let file_id = w.intern_str("/work/examples/replay.cu").unwrap();
    let func = w.intern_str("replay_loop(int)").unwrap();
    let module = w.intern_str("/work/build/graph_replay").unwrap();
    let stack_at = |w: &mut TraceWriter<std::fs::File>, line: u32| {
        let f = w
            .intern_frame(FrameData {
                kind: FrameKind::Native,
                module: Some(module),
                offset: Some(0x1000 + line as u64),
                func: Some(func),
                file: Some(file_id),
                line: Some(line),
                inlined: false,
                text: None,
            })
            .unwrap();
        w.intern_stack(&[f]).unwrap()
    };
    let launch_at = stack_at(&mut w, 40);
    let sync_at = stack_at(&mut w, 42);
    let graph_launch = w.intern_str("cudaGraphLaunch").unwrap();
    let nodes = [
        w.intern_str("scale(float*, int)").unwrap(),
        w.intern_str("add\x1b[2J(float*, int)").unwrap(),
        w.intern_str("reduce(float*, int)").unwrap(),
    ];
    // A generated kernel's source, as the recorder writes it for Inductor's Triton kernels.
    let src_file = w.intern_str("/tmp/torchinductor_u/ab/cab.py").unwrap();
    let note = w
        .intern_str("Topologically Sorted Source Nodes: [relu]\x1b]0;x")
        .unwrap();
    w.write(&Record::Function(Function {
        name: nodes[2],
        module: 0,
        frame: None,
        stack: None,
        source: Some(FunctionSource {
            file: src_file,
            line: 18,
            note: Some(note),
        }),
    }))
    .unwrap();
    // Captured at replay.cu:30-32 (nodes 1000-1002 of graph 1), instantiated as nodes 10-12.
    for n in 0..3u32 {
        let st = stack_at(&mut w, 30 + n);
        w.write(&Record::Gnode(Gnode {
            graph: 1,
            node: 1000 + n as u64,
            stack: Some(st),
            tid: Some(11),
            from: None,
        }))
        .unwrap();
        w.write(&Record::Gnode(Gnode {
            graph: 3,
            node: 10 + n as u64,
            from: Some(GraphNode(1, 1000 + n as u64)),
            ..Gnode::default()
        }))
        .unwrap();
    }
    let mut t = 1_000_000_000u64;
    for r in 0..40u32 {
        let corr = 2 * r + 1;
        w.write(&Record::Api(Api {
            domain: ApiDomain::Runtime,
            name: graph_launch,
            cbid: 311,
            start: t,
            end: t + 6_000,
            tid: 11,
            corr,
            ret: 0,
        }))
        .unwrap();
        w.write(&Record::Callsite(Callsite {
            corr,
            api: graph_launch,
            tid: 11,
            ts: t,
            stack: launch_at,
            weight: None,
        }))
        .unwrap();
        let mut g = t + 8_000;
        for (n, &k) in nodes.iter().enumerate() {
            let d = 30_000 * (n as u64 + 1);
            w.write(&Record::Kernel(Kernel {
                name: k,
                start: g,
                end: g + d,
                dev: 0,
                ctx: 1,
                stream: 9,
                corr,
                grid: [132, 1, 1],
                block: [256, 1, 1],
                regs: 32,
                graph: Some(GraphNode(3, 10 + n as u64)),
                ..Kernel::default()
            }))
            .unwrap();
            g += d;
        }
        w.write(&Record::Sync(Sync {
            kind: SyncKind::StreamSynchronize,
            start: t + 6_500,
            end: g + 2_000,
            ctx: 1,
            stream: Some(9),
            corr: corr + 1,
            tid: Some(11),
            stack: Some(sync_at),
            ..Sync::default()
        }))
        .unwrap();
        t = g + 2_000 + 50_000;
    }
    w.finish(0, "exit").unwrap();
    dir
}

#[test]
fn report_shows_the_graphs_and_their_replay_gaps() {
    let root = std::env::temp_dir().join(format!("gpufl-graphs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let dir = write_graph_session(&root);
    let (code, text, err) = run(Command::new(env!("CARGO_BIN_EXE_gpufl")).args([
        "report",
        "--color",
        "never",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("CUDA graphs (1, most GPU time first)"),
        "{text}"
    );
    assert!(
        text.contains(
            "graph 3 on GPU 0 · 40 replays at replay.cu:40 in replay_loop() · 180.0µs per replay"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "the host waited in a sync in 39 of 39 gaps at replay.cu:42 in replay_loop()"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "most time: reduce 50 % from replay.cu:32, add\\u{1b}[2J 33 % from replay.cu:31"
        ),
        "{text}"
    );
    assert!(text.contains("captured at replay.cu:3"), "{text}");
    assert!(text.contains("[graph-replay-gaps]"), "{text}");
    assert!(
        text.contains("a host sync after each @ replay.cu:42"),
        "{text}"
    );
    assert!(text.contains("· 40 in CUDA graphs"), "{text}");
    // No launch-bound advice for graph kernels; the escape sequence is shown escaped.
    assert!(!text.contains("[launch-bound]"), "{text}");
    assert!(!text.contains('\x1b'), "raw escape in the report");
    assert!(text.contains("add\\u{1b}[2J"), "{text}");
    assert!(
        text.contains(
            "source /tmp/torchinductor_u/ab/cab.py:18 · Topologically Sorted Source Nodes: [relu]\\u{1b}]0;x"
        ),
        "{text}"
    );

    let (code, json, err) = run(Command::new(env!("CARGO_BIN_EXE_gpufl")).args([
        "report",
        "--json",
        dir.to_str().unwrap(),
    ]));
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let g = &v["sessions"][0]["graphs"][0];
    assert_eq!(g["graph"], 3);
    assert_eq!(g["replays"], 40);
    assert_eq!(g["nodes"], 3);
    assert_eq!(g["gaps_with_sync"], 39);
    assert_eq!(g["launch_location"]["line"], 40);
    assert_eq!(g["sync_location"]["line"], 42);
    assert_eq!(g["top"][0]["created_at"]["line"], 32);
    // JSON keeps the name exact.
    assert!(g["top"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["name"] == "add\x1b[2J(float*, int)"));
    let rows = v["sessions"][0]["kernels"]["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["graph_runs"] == 40), "{rows:?}");
    let reduce = rows
        .iter()
        .find(|r| r["name"] == "reduce(float*, int)")
        .unwrap();
    assert_eq!(reduce["source"]["line"], 18);
    assert_eq!(reduce["source"]["file"], "/tmp/torchinductor_u/ab/cab.py");
    assert!(rows.iter().filter(|r| r.get("source").is_some()).count() == 1);
    let _ = std::fs::remove_dir_all(&root);
}

/// `examples/torch_compile_graphs.py --steps 100 --reshape-at 50` recorded on the H100
/// (testdata/sessions/torch_compile_recompile-1287-…): half-size batches from step 50 make Dynamo
/// compile again mid-run. The report names that recompilation at the `compiled(x)` line (61),
/// MEDIUM, with the GPU idle it cost, and shows the CUDA graphs recorded for each shape.
#[test]
fn a_recorded_recompilation_is_named_at_the_compiled_call() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/sessions/torch_compile_recompile-1287-20261126T044458Z");
    let (code, out, err) = run(Command::new(env!("CARGO_BIN_EXE_gpufl"))
        .arg("report")
        .arg("--json")
        .arg(&dir));
    assert_eq!(code, 0, "{err}");
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = &j["sessions"][0];
    let tc: Vec<&serde_json::Value> = s["insights"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["rule"] == "torch-compile")
        .collect();
    assert_eq!(tc.len(), 1, "{}", s["insights"]);
    let (i, d) = (tc[0], &tc[0]["data"]);
    assert!(i["location"]["file"]
        .as_str()
        .unwrap()
        .ends_with("examples/torch_compile_graphs.py"));
    assert_eq!(i["location"]["line"], 61);
    assert_eq!(i["severity"], "MEDIUM", "{i}");
    assert_eq!(d["recompilations"], 1, "{d}");
    // The recompilation came after 50 timed steps (+9.1 s) and kept the GPU idle for most of
    // its span (3.2 s).
    let e = d["episodes"].as_array().unwrap().last().unwrap();
    assert!(e["start_ns"].as_u64().unwrap() > 5_000_000_000, "{e}");
    let (span, idle) = (
        e["span_ns"].as_u64().unwrap(),
        e["gpu_idle_ns"].as_u64().unwrap(),
    );
    assert!(span > 1_000_000_000 && idle * 10 > span * 9, "{e}");
    assert_eq!(i["impact_ns"], d["recompile_gpu_idle_ns"]);
    // One CUDA graph per input shape (cudagraph trees record again for the new shape).
    assert!(
        s["graphs"].as_array().unwrap().len() >= 2,
        "{}",
        s["graphs"]
    );
}
