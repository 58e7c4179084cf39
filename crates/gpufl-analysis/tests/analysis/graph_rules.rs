//! CUDA graphs (issue 18): replays as units (the shared graph summary), rule `graph-replay-gaps`,
//! and graph kernels left out of `launch-bound`.

use super::*;

const GRAPH: u32 = 3;
const NODES: u64 = 5;
/// Each node's kernel, ns (a replay is NODES of them back to back).
const NODE_NS: u64 = 20_000;
const T1: u64 = 1;

struct Plan {
    replays: u64,
    /// A stream sync on T1 after each replay (at graph.cu:42).
    sync_after: bool,
    /// Host time between the end of one replay (or of its sync) and the next launch, ns.
    host_gap: u64,
    /// Node kernel duration, ns.
    node_ns: u64,
    /// Launch call duration, ns.
    launch_ns: u64,
    /// Directly launched short kernels after the replays (for launch-bound).
    direct: u64,
    /// Graph work carries the correlation id of the driver's cuGraphLaunch inside the runtime's
    /// cudaGraphLaunch (which has the call site), as CUPTI documents for graph launches.
    driver_corr: bool,
}

impl Plan {
    fn new(replays: u64) -> Plan {
        Plan {
            replays,
            sync_after: true,
            host_gap: 30_000,
            node_ns: NODE_NS,
            launch_ns: 8_000,
            direct: 0,
            driver_corr: false,
        }
    }
}

fn api(b: &mut B, name: &str, start: u64, end: u64) -> u32 {
    let corr = b.next_corr();
    let name = b.s(name);
    b.recs.push(Record::Api(Api {
        domain: ApiDomain::Runtime,
        name,
        cbid: 311,
        start,
        end,
        tid: T1,
        corr,
        ret: 0,
    }));
    corr
}

fn session(p: &Plan) -> B {
    let mut b = B::new();
    let launch_at = b.user_stack("graph.cu", 40, "replay_loop");
    let sync_at = b.user_stack("graph.cu", 42, "replay_loop");
    let direct_at = b.user_stack("graph.cu", 60, "direct_loop");
    let names: Vec<StrId> = (0..NODES)
        .map(|n| b.s(&format!("node_kernel_{n}")))
        .collect();
    let mut t = 1_000_000u64;
    for _ in 0..p.replays {
        let corr = api(&mut b, "cudaGraphLaunch", t, t + p.launch_ns);
        let api_name = b.s("cudaGraphLaunch");
        b.recs.push(Record::Callsite(Callsite {
            corr,
            api: api_name,
            tid: T1,
            ts: t,
            stack: launch_at,
            weight: None,
        }));
        let corr = if p.driver_corr {
            api(&mut b, "cuGraphLaunch", t + 1_000, t + p.launch_ns - 1_000)
        } else {
            corr
        };
        let mut g = t + p.launch_ns + 2_000;
        for (n, &name) in names.iter().enumerate() {
            b.recs.push(Record::Kernel(Kernel {
                name,
                start: g,
                end: g + p.node_ns,
                dev: 0,
                ctx: 1,
                stream: 9,
                corr,
                graph: Some(GraphNode(GRAPH, 100 + n as u64)),
                ..Kernel::default()
            }));
            g += p.node_ns;
        }
        t = if p.sync_after {
            let corr = b.next_corr();
            b.recs.push(Record::Sync(Sync {
                kind: SyncKind::StreamSynchronize,
                start: t + p.launch_ns,
                end: g + 1_000,
                ctx: 1,
                stream: Some(9),
                corr,
                tid: Some(T1),
                stack: Some(sync_at),
                ..Sync::default()
            }));
            g + 1_000 + p.host_gap
        } else {
            (t + p.launch_ns + p.host_gap).max(t + p.launch_ns)
        };
    }
    // Directly launched short kernels: 2 µs each, 9 µs launch calls, back to back on the host.
    let direct = b.s("direct_kernel");
    for i in 0..p.direct {
        let sampled = (i < 4).then_some(direct_at);
        direct_launch(
            &mut b,
            direct,
            (t, t + 9_000),
            (t + 10_000, t + 12_000),
            sampled,
        );
        t += 9_500;
    }
    b
}

/// A direct launch of kernel `name` on stream 8: the launch call over `call`, the kernel over
/// `run`, a `callsite` record with `stack` when the launch was sampled.
fn direct_launch(
    b: &mut B,
    name: StrId,
    call: (u64, u64),
    run: (u64, u64),
    stack: Option<StackId>,
) {
    let corr = api(b, "cudaLaunchKernel", call.0, call.1);
    if let Some(stack) = stack {
        let api_name = b.s("cudaLaunchKernel");
        b.recs.push(Record::Callsite(Callsite {
            corr,
            api: api_name,
            tid: T1,
            ts: call.0,
            stack,
            weight: None,
        }));
    }
    b.recs.push(Record::Kernel(Kernel {
        name,
        start: run.0,
        end: run.1,
        dev: 0,
        ctx: 1,
        stream: 8,
        corr,
        ..Kernel::default()
    }));
}

/// (correlation id, start) of each replay's first node kernel.
fn first_nodes(b: &B) -> Vec<(u32, u64)> {
    b.recs
        .iter()
        .filter_map(|r| match r {
            Record::Kernel(k) if k.graph.map(|g| g.1) == Some(100) => Some((k.corr, k.start)),
            _ => None,
        })
        .collect()
}

#[test]
fn replays_are_units_with_their_launch_line_and_the_syncs_between_them() {
    let a = session(&Plan::new(40)).analyze();
    assert_eq!(a.graphs.len(), 1);
    let g = &a.graphs[0];
    assert_eq!((g.graph, g.device, g.replays), (GRAPH, 0, 40));
    assert_eq!((g.nodes, g.ops), (NODES, 40 * NODES));
    assert_eq!(g.replay_median_ns, NODES * NODE_NS);
    assert_eq!(g.replay_total_ns, 40 * NODES * NODE_NS);
    assert_eq!(g.busy_ns, 40 * NODES * NODE_NS);
    assert_eq!((g.gaps, g.gaps_with_sync), (39, 39));
    // Each gap: 1 µs of sync tail + 30 µs of host work + 8 µs launch + 2 µs to the first node.
    assert_eq!(g.gap_median_ns, 41_000);
    assert_eq!(g.gap_idle_ns, 39 * 41_000);
    assert_eq!(g.launch_call_median_ns, Some(8_000));
    assert_eq!(g.launch_location.as_ref().unwrap().short(), "graph.cu:40");
    assert_eq!(g.sync_location.as_ref().unwrap().short(), "graph.cu:42");
    assert_eq!(g.top.len(), NODES as usize);
    assert!((g.top[0].share - 0.2).abs() < 1e-9);
    assert_eq!(g.top[0].count, 40);
}

#[test]
fn a_sync_after_each_replay_fires_at_the_sync_line() {
    let a = session(&Plan::new(40)).analyze();
    let found = rule(&a, "graph-replay-gaps");
    assert_eq!(found.len(), 1, "{:#?}", a.insights);
    let i = found[0];
    assert_eq!(i.location.short(), "graph.cu:42");
    assert!(i.title.contains("host sync after each"), "{}", i.title);
    assert!(i.detail.contains("graph.cu:40"), "{}", i.detail);
    assert_eq!(i.impact_ns, 39 * 41_000);
    assert_eq!(i.count, 40);
    // Idle is 41 of every 141 µs: MEDIUM.
    assert_eq!(window_level(i), Severity::Medium);
    // No launch-bound advice for kernels that already are in a graph.
    assert!(rule(&a, "launch-bound").is_empty(), "{:#?}", a.insights);
}

#[test]
fn tiny_replays_without_syncs_fire_at_the_launch_line() {
    let mut p = Plan::new(40);
    p.sync_after = false;
    p.node_ns = 4_000; // 20 µs replays
    p.host_gap = 200_000;
    let a = session(&p).analyze();
    let found = rule(&a, "graph-replay-gaps");
    assert_eq!(found.len(), 1, "{:#?}", a.insights);
    let i = found[0];
    assert_eq!(i.location.short(), "graph.cu:40");
    assert!(i.title.contains("tiny replays"), "{}", i.title);
    assert_eq!(i.severity, Severity::High);
    assert_eq!(a.graphs[0].gaps_with_sync, 0);
}

#[test]
fn back_to_back_replays_and_few_replays_raise_nothing() {
    // Launched ahead: each replay's kernels start when the previous replay's end.
    let mut p = Plan::new(40);
    p.sync_after = false;
    p.host_gap = 0;
    p.launch_ns = 1_000;
    let b = session(&p);
    // Rewrite the kernels' times: replays back to back on the GPU.
    let mut b2 = B::new();
    b2.recs = b.recs.clone();
    let mut t = 5_000_000u64;
    for r in b2.recs.iter_mut() {
        if let Record::Kernel(k) = r {
            k.start = t;
            k.end = t + NODE_NS;
            t += NODE_NS;
        }
    }
    let a = b2.analyze();
    assert_eq!(a.graphs[0].gap_idle_ns, 0);
    assert!(rule(&a, "graph-replay-gaps").is_empty());
    // Four replays with gaps: below MIN_REPLAYS.
    let a = session(&Plan::new(4)).analyze();
    assert_eq!(a.graphs[0].replays, 4);
    assert!(rule(&a, "graph-replay-gaps").is_empty());
}

#[test]
fn graph_kernels_are_left_out_of_launch_bound() {
    // Graph nodes shorter than the graph launch call (2 µs against 8 µs), and 300 direct launches
    // of a 2 µs kernel with 9 µs launch calls: launch-bound counts the direct launches only.
    let mut p = Plan::new(120);
    p.node_ns = 2_000;
    p.direct = 300;
    let a = session(&p).analyze();
    let found = rule(&a, "launch-bound");
    assert_eq!(found.len(), 1, "{:#?}", a.insights);
    let i = found[0];
    assert_eq!(i.location.short(), "graph.cu:60");
    match &i.data {
        Some(RuleData::LaunchBound(d)) => {
            assert_eq!(d.launches, 300);
            assert!(d.kernels.iter().all(|k| k.name == "direct_kernel"));
        }
        other => panic!("{other:?}"),
    }
    // The same session without graph ids: the nodes count as launches of their own.
    let mut b = session(&p);
    for r in b.recs.iter_mut() {
        if let Record::Kernel(k) = r {
            k.graph = None;
        }
    }
    let a = b.analyze();
    assert!(a.graphs.is_empty());
    let launches: u64 = rule(&a, "launch-bound")
        .iter()
        .filter_map(|i| match &i.data {
            Some(RuleData::LaunchBound(d)) => Some(d.launches),
            _ => None,
        })
        .sum();
    assert!(launches > 300, "{launches}");
}

#[test]
fn graph_copies_count_in_their_replay() {
    let mut b = session(&Plan::new(6));
    // A 50 µs memset node at the start of each replay (before the first kernel).
    let kernels = first_nodes(&b);
    for (corr, start) in kernels {
        b.recs.push(Record::Memset(Memset {
            bytes: 4096,
            start: start - 50_000,
            end: start,
            dev: 0,
            ctx: 1,
            stream: 9,
            corr,
            graph: Some(GraphNode(GRAPH, 99)),
            ..Memset::default()
        }));
    }
    let a = b.analyze();
    let g = &a.graphs[0];
    assert_eq!((g.replays, g.nodes, g.ops), (6, NODES + 1, 6 * (NODES + 1)));
    assert_eq!(g.replay_median_ns, NODES * NODE_NS + 50_000);
    assert_eq!((g.top[0].name.as_str(), g.top[0].count), ("[memset]", 6));
    assert!((g.top[0].share - 50.0 / 150.0).abs() < 1e-9);
}

#[test]
fn graph_work_with_the_driver_launchs_id_finds_the_runtime_calls_line() {
    let mut p = Plan::new(40);
    p.driver_corr = true;
    let a = session(&p).analyze();
    let g = &a.graphs[0];
    assert_eq!(g.replays, 40);
    assert_eq!(g.launch_location.as_ref().unwrap().short(), "graph.cu:40");
    // The runtime call's host time, not the driver call's inside it.
    assert_eq!(g.launch_call_median_ns, Some(8_000));
    assert_eq!(g.gaps_with_sync, 39);
}

/// A `gnode` record: node `node` of `graph` created by a call with stack `stack`.
fn created(b: &mut B, graph: u32, node: u64, stack: StackId) {
    b.recs.push(Record::Gnode(Gnode {
        graph,
        node,
        stack: Some(stack),
        tid: Some(T1),
        from: None,
    }));
}

/// A `gnode` record: node `node` of the replayed graph cloned from node `from` of graph 1.
fn cloned(b: &mut B, node: u64, from: u64) {
    b.recs.push(Record::Gnode(Gnode {
        graph: GRAPH,
        node,
        from: Some(GraphNode(1, from)),
        ..Gnode::default()
    }));
}

/// The line that created the nodes of the graph's operation `name`, short.
fn created_line(g: &gpufl_analysis::insights::graphs::GraphSummary, name: &str) -> Option<String> {
    g.top
        .iter()
        .find(|o| o.name == name)
        .and_then(|o| o.created_at.as_ref())
        .map(|l| l.short())
}

#[test]
fn each_node_is_named_by_the_line_that_captured_it() {
    let mut b = session(&Plan::new(6));
    // Capture: node 1000+n created by the launch at model.cu:(10+n); instantiation: node 100+n
    // (the one the replays run) cloned from it. Node 104 has no recorded creation.
    for n in 0..NODES - 1 {
        let st = b.user_stack("model.cu", 10 + n as u32, "forward");
        created(&mut b, 1, 1000 + n, st);
        cloned(&mut b, 100 + n, 1000 + n);
    }
    let a = b.analyze();
    let g = &a.graphs[0];
    let line = |name: &str| created_line(g, name);
    assert_eq!(line("node_kernel_0").as_deref(), Some("model.cu:10"));
    assert_eq!(line("node_kernel_3").as_deref(), Some("model.cu:13"));
    assert_eq!(line("node_kernel_4"), None);
    assert!(g.capture_location.is_some());
    // A clone cycle (hostile input) ends without a line.
    let mut b = session(&Plan::new(6));
    b.recs.push(Record::Gnode(Gnode {
        graph: GRAPH,
        node: 100,
        from: Some(GraphNode(GRAPH, 101)),
        ..Gnode::default()
    }));
    b.recs.push(Record::Gnode(Gnode {
        graph: GRAPH,
        node: 101,
        from: Some(GraphNode(GRAPH, 100)),
        ..Gnode::default()
    }));
    let a = b.analyze();
    assert!(a.graphs[0].top.iter().all(|o| o.created_at.is_none()));
}

/// As CUDA 13 reported it on the H100/H200 machines: instantiation reports each node of the
/// executable graph as created (with the stack of the instantiating call) before it reports it
/// cloned from the captured node. The captured node's line is the one shown, and the graph's
/// capture line is its first node's; the instantiating line only where the original has no line,
/// and a walk cut short in CUDA is no line.
#[test]
fn a_node_created_by_instantiation_is_named_by_the_node_it_was_cloned_from() {
    let mut b = session(&Plan::new(6));
    let inst = b.user_stack("model.cu", 91, "capture");
    let cupti = b.native("/opt/cuda/lib64/libcupti.so.13", "??", None, None);
    let cut = b.stack(&[cupti]);
    for n in 0..NODES {
        // Node 0's capture walk was cut short; the others name their launch line.
        let st = if n == 0 {
            cut
        } else {
            b.user_stack("model.cu", 10 + n as u32, "forward")
        };
        created(&mut b, 1, 1000 + n, st);
    }
    for n in 0..NODES {
        created(&mut b, GRAPH, 100 + n, inst);
    }
    for n in 0..NODES {
        cloned(&mut b, 100 + n, 1000 + n);
    }
    let a = b.analyze();
    let g = &a.graphs[0];
    let line = |name: &str| created_line(g, name);
    assert_eq!(line("node_kernel_1").as_deref(), Some("model.cu:11"));
    assert_eq!(line("node_kernel_4").as_deref(), Some("model.cu:14"));
    // No line of its own: the instantiating call's.
    assert_eq!(line("node_kernel_0").as_deref(), Some("model.cu:91"));
    // The first captured node with a line (node 1001) names where the graph was captured.
    assert_eq!(
        g.capture_location.as_ref().map(|l| l.short()).as_deref(),
        Some("model.cu:11")
    );
}

#[test]
fn the_sync_in_a_gap_is_the_launching_threads_or_any_threads_without_api_records() {
    // The syncs after each replay moved to another thread: with API records (launch thread T1)
    // they do not count; without API records any thread's count.
    let mut b = session(&Plan::new(10));
    for r in b.recs.iter_mut() {
        if let Record::Sync(s) = r {
            s.tid = Some(99);
        }
    }
    let a = b.analyze();
    assert_eq!((a.graphs[0].gaps, a.graphs[0].gaps_with_sync), (9, 0));
    b.recs.retain(|r| !matches!(r, Record::Api(_)));
    let a = b.analyze();
    assert_eq!((a.graphs[0].gaps, a.graphs[0].gaps_with_sync), (9, 9));
    // Many threads' syncs, none inside the gaps: none found.
    for t in 0..5_000u64 {
        b.recs.push(Record::Sync(Sync {
            kind: SyncKind::StreamSynchronize,
            start: 10,
            end: 20 + t,
            ctx: 1,
            tid: Some(1_000 + t),
            ..Sync::default()
        }));
    }
    let a = b.analyze();
    assert_eq!(a.graphs[0].gaps_with_sync, 9);
}

#[test]
fn a_graph_memcpy_is_its_own_copy_even_as_the_sessions_first() {
    let mut b = session(&Plan::new(6));
    // A 30 µs device-to-device copy node before each replay's kernels; no other copy.
    let firsts = first_nodes(&b);
    for (corr, start) in firsts {
        b.recs.push(Record::Memcpy(Memcpy {
            kind: CopyKind::DtoD,
            bytes: 1 << 20,
            start: start - 30_000,
            end: start,
            dev: 0,
            ctx: 1,
            stream: 9,
            corr,
            graph: Some(GraphNode(GRAPH, 98)),
            ..Memcpy::default()
        }));
    }
    let a = b.analyze();
    let g = &a.graphs[0];
    assert_eq!((g.replays, g.nodes, g.ops), (6, NODES + 1, 6 * (NODES + 1)));
    let copy = g.top.iter().find(|o| o.name == "[memcpy]").unwrap();
    assert_eq!((copy.count, copy.total_ns), (6, 6 * 30_000));
}

#[test]
fn gaps_holding_unobserved_time_are_left_out() {
    let mut b = session(&Plan::new(10));
    // Recording paused inside the gap after the 5th replay.
    let ends: Vec<u64> = {
        let mut by_corr: std::collections::BTreeMap<u32, u64> = Default::default();
        for r in &b.recs {
            if let Record::Kernel(k) = r {
                let e = by_corr.entry(k.corr).or_default();
                *e = (*e).max(k.end);
            }
        }
        by_corr.into_values().collect()
    };
    b.recs.push(Record::Capture(CaptureState {
        ts: ends[4] + 5_000,
        recording: false,
    }));
    b.recs.push(Record::Capture(CaptureState {
        ts: ends[4] + 20_000,
        recording: true,
    }));
    let a = b.analyze();
    assert_eq!((a.graphs[0].replays, a.graphs[0].gaps), (10, 8));
    assert_eq!(a.graphs[0].gaps_with_sync, 8);
}

/// Graph launches are sampled per executable graph: most replays have no call site. A gap ended
/// by such a replay is located by the graph's sampled launches (graph.cu:40), never by the
/// direct launches of the same kernel function elsewhere (graph.cu:60), as graph_replay.cu's
/// `mix` (a node and a directly launched kernel) would otherwise be.
#[test]
fn gaps_before_unsampled_replays_are_at_the_graph_launch_line() {
    let mut b = session(&Plan {
        sync_after: false,
        host_gap: 300_000,
        ..Plan::new(10)
    });
    // Only the first replay's launch was sampled.
    let first = b
        .recs
        .iter()
        .find_map(|r| match r {
            Record::Callsite(c) => Some(c.corr),
            _ => None,
        })
        .unwrap();
    b.recs
        .retain(|r| !matches!(r, Record::Callsite(c) if c.corr != first));
    // The first node's function, launched directly (and sampled) at graph.cu:60 afterwards,
    // each launch after a long host pause.
    let direct_at = b.user_stack("graph.cu", 60, "direct_loop");
    let name = b.s("node_kernel_0");
    let mut t = 50_000_000u64;
    for _ in 0..20 {
        direct_launch(
            &mut b,
            name,
            (t, t + 5_000),
            (t + 6_000, t + 8_000),
            Some(direct_at),
        );
        t += 400_000;
    }
    let a = b.analyze();
    let idle: Vec<(String, u64)> = a
        .insights
        .iter()
        .filter(|i| i.rule == "gpu-idle")
        .map(|i| (i.location.short(), i.count))
        .collect();
    let at = |line: &str| idle.iter().find(|(l, _)| l == line).map(|x| x.1);
    assert_eq!(at("graph.cu:40"), Some(9), "{idle:?}");
    assert!(at("graph.cu:60").is_some_and(|n| n <= 20), "{idle:?}");
}
