//! The memory rules (`out-of-memory`, `memory-leak`, `memory-peak`) over sessions built record by
//! record, and their place in the analysis's ranking.

use crate::insight::{Insight, Severity};
use crate::intervals::DeviceBusy;
use crate::model::Model;
use crate::rules::RuleData;
use crate::shared::host::tests::S;
use crate::shared::Ctx;
use crate::Config;
use gpufl_trace::{Mem, MemOp, MemoryKind, Record, StackId, Telemetry};

const USER: &str = "/app/oom.py";
const MIB: u64 = 1 << 20;

fn mem(s: &mut S, ts: u64, op: MemOp, addr: u64, bytes: u64, stack: Option<StackId>) {
    s.recs.push(Record::Mem(Mem {
        ts,
        op,
        addr,
        bytes,
        mem_kind: MemoryKind::Device,
        stack,
        ..Mem::default()
    }));
}

/// A loop of `iters` steps: line 12 keeps 256 MiB per step, line 13 allocates and frees 64 MiB;
/// then, with `oom`, line 14 fails to allocate 256 MiB with 100 MiB free.
fn session(iters: u64, oom: bool) -> S {
    let mut s = S::new();
    let s12 = s.py(&[("main", USER, 12)], None);
    let s13 = s.py(&[("main", USER, 13)], None);
    let s14 = s.py(&[("main", USER, 14)], None);
    s.kernel(0, 10);
    for i in 0..iters {
        let t = i * 10_000_000;
        mem(
            &mut s,
            t,
            MemOp::Alloc,
            0x1_0000_0000 + i * 256 * MIB,
            256 * MIB,
            Some(s12),
        );
        mem(
            &mut s,
            t + 1,
            MemOp::Alloc,
            0xf_0000_0000,
            64 * MIB,
            Some(s13),
        );
        mem(&mut s, t + 2, MemOp::Free, 0xf_0000_0000, 64 * MIB, None);
    }
    s.recs.push(Record::Telemetry(Box::new(Telemetry {
        ts: iters * 10_000_000,
        dev: 0,
        mem_used: Some(80_000 * MIB - 100 * MIB),
        mem_total: Some(80_000 * MIB),
        ..Telemetry::default()
    })));
    if oom {
        let api = s.s("cudaMalloc");
        s.recs.push(Record::Mem(Mem {
            ts: iters * 10_000_000 + 5,
            op: MemOp::AllocFailed,
            bytes: 256 * MIB,
            mem_kind: MemoryKind::Device,
            api: Some(api),
            stack: Some(s14),
            free: Some(100 * MIB),
            ..Mem::default()
        }));
    }
    s
}

fn insights(s: &S) -> Vec<Insight> {
    let m = Model::load(s.recs.clone());
    let busy = DeviceBusy::new(&m);
    let wall = m.time_range().1 - m.time_range().0;
    let cx = Ctx::new(&m, &Config::default(), &busy, wall);
    let mut v = super::out_of_memory::run(&cx);
    v.extend(super::memory_leak::run(&cx));
    v.extend(super::memory_peak::run(&cx));
    let session = crate::shared::finish::session_ns(&m, wall);
    crate::shared::finish::rate(&mut v, session);
    crate::shared::finish::rank(&mut v);
    v
}

#[test]
fn an_out_of_memory_ranks_first_and_names_the_growing_line() {
    let v = insights(&session(30, true));
    let rules: Vec<&str> = v.iter().map(|i| i.rule).collect();
    assert_eq!(rules, ["out-of-memory", "memory-leak", "memory-peak"]);
    let oom = &v[0];
    assert_eq!(oom.location.short(), "oom.py:14");
    assert_eq!(oom.severity, Severity::High);
    assert_eq!(oom.share_of_wall, 1.0);
    assert!(
        oom.title.contains("cudaMalloc of 256.0 MiB"),
        "{}",
        oom.title
    );
    let Some(RuleData::OutOfMemory(d)) = &oom.data else {
        panic!("no out-of-memory data");
    };
    assert_eq!(
        (d.requested_bytes, d.free_bytes, d.failures),
        (256 * MIB, Some(100 * MIB), 1)
    );
    assert_eq!(d.live_bytes, 30 * 256 * MIB);
    assert_eq!(d.holders.len(), 1);
    assert_eq!(
        (
            d.holders[0].location.as_str(),
            d.holders[0].bytes,
            d.holders[0].allocs
        ),
        ("oom.py:12", 30 * 256 * MIB, 30)
    );
    // Line 13's last block was freed 10 ms before the failure.
    assert_eq!(d.freed_before.len(), 1);
    assert_eq!(d.freed_before[0].location, "oom.py:13");
    assert!(
        oom.detail.contains("oom.py:12 7.50 GiB (30 allocations)"),
        "{}",
        oom.detail
    );
    let leak = &v[1];
    assert_eq!(leak.location.short(), "oom.py:12");
    assert_eq!(
        leak.severity,
        Severity::Low,
        "a risk, no time lost: out-of-memory carries the crash"
    );
    let Some(RuleData::MemoryLeak(l)) = &leak.data else {
        panic!("no memory-leak data");
    };
    assert_eq!((l.allocs, l.frees), (30, 0));
    assert_eq!(
        (l.growth_bytes, l.growth_per_alloc),
        (29 * 256 * MIB, 256 * MIB)
    );
}

#[test]
fn a_line_that_frees_is_no_leak_and_without_a_failure_no_post_mortem() {
    let v = insights(&session(30, false));
    let rules: Vec<&str> = v.iter().map(|i| i.rule).collect();
    assert_eq!(rules, ["memory-leak", "memory-peak"]);
    assert_eq!(v[0].location.short(), "oom.py:12");
    // 7.5 GiB of 78.1 GiB: under a tenth.
    assert_eq!(v[0].severity, Severity::Low);
    let Some(RuleData::MemoryPeak(p)) = &v[1].data else {
        panic!("no memory-peak data");
    };
    assert_eq!(p.peak_bytes, 30 * 256 * MIB + 64 * MIB);
    assert_eq!(p.holders[0].location, "oom.py:12");
    assert_eq!(p.holders[1].location, "oom.py:13");
    assert_eq!(p.total_bytes, Some(80_000 * MIB));
    assert_eq!(v[1].severity, Severity::Low);
    let churn = p.churn.as_ref().expect("a churning line");
    assert_eq!(
        (churn.location.as_str(), churn.allocs, churn.frees),
        ("oom.py:13", 30, 30)
    );
    assert_eq!(p.series.len(), 90);
    assert_eq!(
        p.series.iter().map(|x| x[1]).max(),
        Some(p.peak_bytes as i64)
    );
}

#[test]
fn a_short_or_returning_history_is_no_leak() {
    // Four allocations: too few to call a trend.
    let v = insights(&session(4, false));
    assert!(v.iter().all(|i| i.rule != "memory-leak"));
    // Memory that is freed at the end returns.
    let mut s = session(30, false);
    for i in 0..30 {
        mem(
            &mut s,
            400_000_000 + i,
            MemOp::Free,
            0x1_0000_0000 + i * 256 * MIB,
            256 * MIB,
            None,
        );
    }
    let v = insights(&s);
    assert!(v.iter().all(|i| i.rule != "memory-leak"));
    assert!(v.iter().any(|i| i.rule == "memory-peak"));
}

#[test]
fn a_peak_near_the_device_capacity_says_so() {
    let mut s = S::new();
    let st = s.py(&[("main", USER, 5)], None);
    mem(&mut s, 1, MemOp::Alloc, 0x1000, 75_000 * MIB, Some(st));
    s.recs.push(Record::Telemetry(Box::new(Telemetry {
        ts: 2,
        dev: 0,
        mem_used: Some(76_000 * MIB),
        mem_total: Some(80_000 * MIB),
        ..Telemetry::default()
    })));
    let v = insights(&s);
    assert_eq!(v.len(), 1);
    assert_eq!(
        v[0].severity,
        Severity::Low,
        "no time lost: the one formula"
    );
    assert!(
        v[0].title
            .contains("(94% of the device: close to running out)"),
        "{}",
        v[0].title
    );
}
