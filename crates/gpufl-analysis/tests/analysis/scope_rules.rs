//! Scopes: nesting, unbalanced and unclosed scopes, the per-scope roll-up, and the innermost scope
//! named on insights.

use super::*;

impl B {
    fn scope(&mut self, tid: u64, ts: u64, name: &str, end: bool) {
        let name = self.s(name);
        self.recs.push(Record::Scope(Scope {
            ts,
            tid,
            name,
            depth: 0,
            end,
            source: ScopeSource::Api,
        }));
    }
}

fn roll<'a>(a: &'a Analysis, path: &[&str]) -> &'a ScopeRollup {
    (0..a.scopes.len())
        .find(|&i| gpufl_analysis::rollup_path(&a.scopes, i) == path)
        .map(|i| &a.scopes[i])
        .unwrap_or_else(|| panic!("no scope {path:?} in {:?}", a.scopes))
}

#[test]
fn nested_scopes_roll_up_syncs_kernels_and_gpu_busy() {
    let mut b = B::new();
    let st = b.user_stack("/src/train.py", 42, "step");
    for i in 0..3u64 {
        let t0 = i * 10_000;
        b.scope(1, t0, "step", false);
        b.scope(1, t0 + 100, "forward", false);
        b.kernel(t0 + 200, t0 + 2_200); // GPU busy 2000 inside forward
        b.sync(SyncKind::StreamSynchronize, t0 + 300, t0 + 2_300, Some(st));
        b.scope(1, t0 + 3_000, "forward", true);
        b.scope(1, t0 + 3_000, "backward", false);
        b.kernel(t0 + 3_100, t0 + 3_600);
        b.scope(1, t0 + 4_000, "backward", true);
        b.scope(1, t0 + 5_000, "step", true);
    }
    let a = b.analyze();
    let names: Vec<Vec<&str>> = (0..a.scopes.len())
        .map(|i| gpufl_analysis::rollup_path(&a.scopes, i))
        .collect();
    assert_eq!(
        names,
        vec![
            vec!["step"],
            vec!["step", "forward"],
            vec!["step", "backward"]
        ]
    );
    let step = roll(&a, &["step"]);
    assert_eq!((step.count, step.wall_ns), (3, 15_000));
    assert_eq!((step.syncs, step.sync_blocked_ns), (3, 6_000));
    let fwd = roll(&a, &["step", "forward"]);
    assert_eq!(fwd.depth, 1);
    assert_eq!((fwd.count, fwd.wall_ns), (3, 8_700));
    assert_eq!((fwd.syncs, fwd.sync_blocked_ns), (3, 6_000));
    assert_eq!(fwd.gpu_busy_ns, 6_000);
    assert_eq!(fwd.kernels, 3);
    assert!(
        !fwd.kernels_by_launch,
        "no api records: kernels by GPU start"
    );
    let bwd = roll(&a, &["step", "backward"]);
    assert_eq!((bwd.syncs, bwd.sync_blocked_ns, bwd.kernels), (0, 0, 3));
    assert_eq!(bwd.gpu_busy_ns, 1_500);
    // Each insight at the sync's line names the innermost scope there.
    assert!(!a.insights.is_empty());
    for ins in a.insights.iter().filter(|i| i.location.line == Some(42)) {
        assert_eq!(
            ins.scope.as_deref(),
            Some(&["step".to_string(), "forward".to_string()][..]),
            "{}",
            ins.rule
        );
    }
}

#[test]
fn syncs_of_another_thread_are_not_in_the_scope() {
    let mut b = B::new();
    b.scope(2, 0, "other_thread", false);
    b.sync(SyncKind::StreamSynchronize, 100, 900, None); // tid 1
    b.scope(2, 1_000, "other_thread", true);
    let a = b.analyze();
    let s = roll(&a, &["other_thread"]);
    assert_eq!((s.syncs, s.sync_blocked_ns), (0, 0));
}

#[test]
fn unbalanced_pops_and_unclosed_scopes_warn_without_failing() {
    let mut b = B::new();
    b.scope(1, 10, "a", true); // close with nothing open
    b.scope(1, 20, "open", false);
    b.kernel(0, 1_000);
    let m = b.model();
    let w = m.warnings().join("\n");
    assert!(w.contains("1 scope close(s) without an open scope"), "{w}");
    assert!(w.contains("1 scope(s) never closed"), "{w}");
    let spans = m.scopes();
    assert_eq!(spans.len(), 1);
    assert!(!spans[0].closed);
    assert_eq!((spans[0].start, spans[0].end), (20, 1_000));
    let a = analyze(&m, &Config::default());
    let s = roll(&a, &["open"]);
    assert_eq!((s.unclosed, s.wall_ns), (1, 980));
}

#[test]
fn innermost_scope_walks_up_past_closed_siblings() {
    let mut b = B::new();
    b.scope(1, 0, "outer", false);
    for i in 0..5u64 {
        b.scope(1, 10 + i * 10, "leaf", false);
        b.scope(1, 15 + i * 10, "leaf", true);
    }
    b.scope(1, 1_000, "outer", true);
    b.scope(3, 0, "t3", false);
    b.scope(3, 5, "t3", true);
    let m = b.model();
    let leaf = m.innermost_scope(1, 12).map(|i| m.scope_path(i));
    assert_eq!(leaf, Some(vec!["outer".to_string(), "leaf".to_string()]));
    let gap = m.innermost_scope(1, 17).map(|i| m.scope_path(i));
    assert_eq!(gap, Some(vec!["outer".to_string()]));
    assert_eq!(m.innermost_scope(1, 1_000), None);
    assert_eq!(m.innermost_scope(2, 12), None);
    assert_eq!(m.innermost_scope(3, 7), None);
}

#[test]
fn sessions_without_scopes_have_no_scope_output() {
    let a = attribution_session(10_000, 6_000);
    assert!(a.scopes.is_empty());
    assert!(a.insights.iter().all(|i| i.scope.is_none()));
    let json = serde_json::to_string(&a).unwrap();
    assert!(!json.contains("\"scope"), "{json}");
}

#[test]
fn scopes_nested_deeper_than_the_limit_fold_into_their_ancestor() {
    let mut b = B::new();
    let n = gpufl_analysis::MAX_SCOPE_DEPTH as u64 + 44;
    for i in 0..n {
        b.scope(1, 10 + i, "level", false);
    }
    b.kernel(500, 600);
    for i in 0..n {
        b.scope(1, 1_000 + i, "level", true);
    }
    // A second, shallow scope after the deep chain closed is tracked again.
    b.scope(1, 5_000, "after", false);
    b.scope(1, 5_100, "after", true);
    let a = b.analyze();
    let m = b.model();
    assert_eq!(m.scopes().len(), gpufl_analysis::MAX_SCOPE_DEPTH + 1);
    let deepest = m.innermost_scope(1, 550).unwrap();
    assert_eq!(
        m.scopes()[deepest].depth as usize,
        gpufl_analysis::MAX_SCOPE_DEPTH - 1
    );
    assert_eq!(m.scope_path(deepest).len(), gpufl_analysis::MAX_SCOPE_DEPTH);
    // The folded scopes' time is in the deepest tracked one: it closes with the 44th close.
    let s = &m.scopes()[deepest];
    assert_eq!((s.start, s.end), (10 + 255, 1_000 + 44));
    assert!(
        a.warnings
            .iter()
            .any(|w| w.contains("44 scope instance(s) nested deeper than 256 levels")),
        "{:?}",
        a.warnings
    );
    assert_eq!(roll(&a, &["after"]).count, 1);
}

/// Ranges whose names are the same text under two string ids (a second trace file interns its
/// strings again) roll up as one name, the same in every run (the order was a hash map's:
/// found by the fuzzer as 1 and 3 threads reporting differently).
#[test]
fn ranges_of_one_name_under_two_ids_roll_up_as_one_in_a_stable_order() {
    let mut b = B::new();
    b.kernel(0, 10_000);
    for (id, s) in [(40u32, "step"), (41, "step"), (42, "load")] {
        b.recs.push(Record::Str(StrRecord {
            id: StrId(id),
            s: s.into(),
        }));
    }
    for (i, name) in [40u32, 41, 42, 40].into_iter().enumerate() {
        b.recs.push(Record::Range(Range {
            id: i as u64,
            name: StrId(name),
            start: 1_000 * i as u64,
            end: 1_000 * i as u64 + 500,
            tid: 1,
            end_tid: (i == 1).then_some(2),
            source: ScopeSource::Nvtx,
        }));
    }
    let first = serde_json::to_string(&b.analyze().ranges).unwrap();
    for _ in 0..20 {
        assert_eq!(serde_json::to_string(&b.analyze().ranges).unwrap(), first);
    }
    let a = b.analyze();
    let names: Vec<(&str, u64, u64)> = a
        .ranges
        .iter()
        .map(|r| (r.name.as_str(), r.count, r.cross_thread))
        .collect();
    assert_eq!(names, [("step", 3, 1), ("load", 1, 0)]);
}

/// An NVTX range pushed and never popped (NCCL's `ncclCommInitRankConfig` on the main thread of a
/// DDP rank, as recorded on the H200 machines) is not the scope of the code that runs after it; an
/// unclosed scope of gpufl's API (a crash before its end) still is.
#[test]
fn an_unclosed_nvtx_range_names_no_scope() {
    let mut b = B::new();
    let name = b.s("ncclCommInitRankConfig");
    b.recs.push(Record::Scope(Scope {
        ts: 10,
        tid: 1,
        name,
        depth: 0,
        end: false,
        source: ScopeSource::Nvtx,
    }));
    b.scope(2, 10, "train", false);
    b.kernel(0, 1_000);
    let m = b.model();
    assert_eq!(m.innermost_scope(1, 500), None);
    let i = m.innermost_scope(2, 500).expect("the API scope");
    assert_eq!(m.scope_path(i), vec!["train".to_string()]);
}
