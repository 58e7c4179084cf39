//! Live bytes, the peak's holders, growth and churn per line, and the post-mortem of a failed
//! allocation, over sessions built record by record.

use super::*;
use crate::intervals::DeviceBusy;
use crate::model::Model;
use crate::shared::host::tests::S;
use crate::Config;
use gpufl_trace::{Mem, MemOp, MemoryKind, Record, StackId};

const USER: &str = "/app/train.py";
const MIB: u64 = 1 << 20;

fn alloc(s: &mut S, ts: u64, addr: u64, bytes: u64, stack: Option<StackId>) {
    s.recs.push(Record::Mem(Mem {
        ts,
        op: MemOp::Alloc,
        addr,
        bytes,
        mem_kind: MemoryKind::Device,
        stack,
        tid: stack.map(|_| 1),
        ..Mem::default()
    }));
}

fn free(s: &mut S, ts: u64, addr: u64, bytes: u64) {
    s.recs.push(Record::Mem(Mem {
        ts,
        op: MemOp::Free,
        addr,
        bytes,
        mem_kind: MemoryKind::Device,
        ..Mem::default()
    }));
}

fn failed(s: &mut S, ts: u64, bytes: u64, stack: StackId, free: Option<u64>) {
    s.recs.push(Record::Mem(Mem {
        ts,
        op: MemOp::AllocFailed,
        bytes,
        mem_kind: MemoryKind::Device,
        stack: Some(stack),
        free,
        ..Mem::default()
    }));
}

/// The scan of a session, and the `file:line` of each location it names.
fn scanned(s: &S) -> (MemScan, impl Fn(Option<LocIx>) -> String) {
    let m = Model::load(s.recs.clone());
    let busy = DeviceBusy::new(&m);
    let cx = Ctx::new(&m, &Config::default(), &busy, 1_000_000);
    let scan = scan(&cx);
    let names: HashMap<LocIx, String> = cx
        .stack_locs()
        .iter()
        .map(|&l| (l, cx.loc(l).short()))
        .collect();
    let name = move |l: Option<LocIx>| l.map_or("-".into(), |l| names[&l].clone());
    (scan, name)
}

/// A loop where line 10 keeps what it allocates (8 MiB per iteration) and line 20 frees its
/// 64 MiB each iteration.
fn leak_and_churn(iters: u64) -> S {
    let mut s = S::new();
    let keep = s.py(&[("step", USER, 10)], None);
    let temp = s.py(&[("step", USER, 20)], None);
    for i in 0..iters {
        let t = i * 1_000_000;
        alloc(&mut s, t, 0x1000_0000 + i * 8 * MIB, 8 * MIB, Some(keep));
        alloc(&mut s, t + 10, 0x9000_0000, 64 * MIB, Some(temp));
        free(&mut s, t + 500_000, 0x9000_0000, 64 * MIB);
    }
    s
}

#[test]
fn live_bytes_follow_allocations_and_frees_by_address() {
    let mut s = S::new();
    alloc(&mut s, 10, 0xa, 100, None);
    alloc(&mut s, 20, 0xb, 50, None);
    free(&mut s, 30, 0xa, 100);
    // A free of an address never seen allocated is ignored, and so is a second free.
    free(&mut s, 40, 0xdead, 1 << 30);
    free(&mut s, 50, 0xa, 100);
    alloc(&mut s, 60, 0xc, 10, None);
    let (m, _) = scanned(&s);
    let d = &m.devices[0];
    assert_eq!(
        d.series,
        vec![(10, 100), (20, 150), (30, 50), (60, 60)],
        "one point per change"
    );
    assert_eq!((d.peak_bytes, d.peak_ts, d.end_bytes), (150, 20, 60));
    assert_eq!((d.allocs, d.frees), (3, 1));
}

#[test]
fn the_peak_names_its_holders_by_line() {
    let s = leak_and_churn(10);
    let (m, name) = scanned(&s);
    let d = &m.devices[0];
    // The peak: the 10th iteration, after line 20's allocation and before its free.
    assert_eq!(d.peak_bytes, 80 * MIB + 64 * MIB);
    assert_eq!(d.peak_ts, 9_000_010);
    let h: Vec<(String, u64, u64)> = d
        .holders
        .iter()
        .map(|h| (name(h.loc), h.bytes, h.allocs))
        .collect();
    assert_eq!(
        h,
        vec![
            ("train.py:10".to_string(), 80 * MIB, 10),
            ("train.py:20".to_string(), 64 * MIB, 1)
        ]
    );
    assert_eq!(d.end_bytes, 80 * MIB);
}

#[test]
fn a_line_that_keeps_grows_and_a_line_that_frees_churns() {
    let s = leak_and_churn(20);
    let (m, name) = scanned(&s);
    let line = |n: &str| m.lines.iter().find(|l| name(l.loc) == n).unwrap().clone();
    let keep = line("train.py:10");
    assert_eq!((keep.allocs, keep.frees, keep.new_highs), (20, 0, 20));
    assert_eq!((keep.first_live, keep.end_live), (8 * MIB, 160 * MIB));
    assert_eq!(keep.growth(), 152 * MIB);
    let temp = line("train.py:20");
    assert_eq!((temp.allocs, temp.frees, temp.new_highs), (20, 20, 1));
    assert_eq!(
        (temp.max_live, temp.end_live, temp.growth()),
        (64 * MIB, 0, 0)
    );
    // 40 operations from 10 ns to 19.5 ms.
    let span = 19_500_000 - 10;
    assert!((temp.churn_per_s() - 40.0 * 1e9 / span as f64).abs() < 1e-6);
}

#[test]
fn the_post_mortem_of_a_failed_allocation() {
    let mut s = leak_and_churn(5);
    let oom = s.py(&[("step", USER, 30)], None);
    // A cache released just before the failure (line 20's last block, freed at 4.5 ms), and a
    // failure at 4.9 ms asking for 1 GiB with 512 MiB free.
    failed(&mut s, 4_900_000, 1 << 30, oom, Some(512 * MIB));
    // After the failure: what happens next is not what was alive at it.
    alloc(&mut s, 5_000_000, 0xf000_0000, 4 << 30, None);
    let (m, name) = scanned(&s);
    assert_eq!(m.failures.len(), 1);
    let f = &m.failures[0];
    assert_eq!(name(f.loc), "train.py:30");
    assert_eq!(
        (f.bytes, f.free, f.live_bytes),
        (1 << 30, Some(512 * MIB), 40 * MIB)
    );
    assert_eq!(f.holders.len(), 1);
    assert_eq!(
        (name(f.holders[0].loc), f.holders[0].bytes),
        ("train.py:10".into(), 40 * MIB)
    );
    // Frees in the second before it: line 20's five blocks.
    assert_eq!(f.freed_before.len(), 1);
    let fb = &f.freed_before[0];
    assert_eq!(
        (name(fb.loc), fb.bytes, fb.allocs),
        ("train.py:20".into(), 5 * 64 * MIB, 5)
    );
    // The failure is no allocation: the device's counts are the successful ones.
    assert_eq!(m.devices[0].allocs, 11);
}

#[test]
fn thinning_keeps_the_highest_point_of_each_bucket() {
    let series: Vec<(u64, u64)> = (0..1000)
        .map(|i| (i, if i == 537 { 9999 } else { i % 7 }))
        .collect();
    let t = thin(&series, 100);
    assert_eq!(t.len(), 100);
    assert!(t.contains(&(537, 9999)));
    assert_eq!(thin(&series[..5], 100), series[..5].to_vec());
}

#[test]
fn no_mem_records_no_memory() {
    let mut s = S::new();
    let st = s.py(&[("step", USER, 1)], None);
    s.sync(0, 10, st);
    let (m, _) = scanned(&s);
    assert_eq!(m, MemScan::default());
}

/// Rolling files: an allocation still live when a new file started is written again there
/// (`carried`). Read with its original, it counts once; with its original's file deleted, it is
/// live from the session's first record on (and widens nothing).
#[test]
fn carried_allocations_count_once_and_stand_in_for_a_deleted_file() {
    let build = |with_original: bool| {
        let mut s = S::new();
        let weights = s.py(&[("load", USER, 5)], None);
        let batch = s.py(&[("step", USER, 30)], None);
        let held = Mem {
            ts: 5,
            op: MemOp::Alloc,
            addr: 0x7000_0000,
            bytes: 100 * MIB,
            mem_kind: MemoryKind::Device,
            stack: Some(weights),
            tid: Some(1),
            ..Mem::default()
        };
        if with_original {
            s.recs.push(Record::Mem(held.clone()));
        }
        s.recs.push(Record::Mem(Mem {
            carried: true,
            ..held
        }));
        alloc(&mut s, 1_000, 0x9000_0000, 10 * MIB, Some(batch));
        free(&mut s, 2_000, 0x9000_0000, 10 * MIB);
        s
    };
    for with_original in [true, false] {
        let s = build(with_original);
        let (scan, name) = scanned(&s);
        let d = &scan.devices[0];
        assert_eq!(
            (d.allocs, d.frees),
            (2, 1),
            "original read: {with_original}"
        );
        assert_eq!((d.peak_bytes, d.end_bytes), (110 * MIB, 100 * MIB));
        let held: Vec<_> = d.holders.iter().map(|h| (name(h.loc), h.bytes)).collect();
        assert_eq!(
            held,
            [
                ("train.py:5".to_string(), 100 * MIB),
                ("train.py:30".to_string(), 10 * MIB)
            ]
        );
        let m = Model::load(s.recs.clone());
        let first = m.mems().iter().map(|r| r.ts).min().unwrap();
        assert_eq!(first, if with_original { 5 } else { 1_000 });
        assert_eq!(
            m.mems().iter().filter(|r| r.carried).count(),
            usize::from(!with_original)
        );
    }
}

/// A training step's memory by what it is for, from the allocating stacks: the model moved to
/// the GPU (weights), the forward pass (activations), the backward pass (gradients), the
/// optimizer's first step (its state), and the program's own tensors (other).
#[test]
fn the_peak_by_what_the_memory_is_for() {
    const TORCH: &str = "/venv/lib/python3.12/site-packages/torch";
    let module = format!("{TORCH}/nn/modules/module.py");
    let tensor = format!("{TORCH}/_tensor.py");
    let autograd = format!("{TORCH}/autograd/__init__.py");
    let adamw = format!("{TORCH}/optim/adamw.py");
    let linear = format!("{TORCH}/nn/modules/linear.py");
    let mut s = S::new();
    let weights = s.py(
        &[
            ("Module.to.<locals>.convert", module.as_str(), 1326),
            ("Module._apply", module.as_str(), 930),
            ("Module.to", module.as_str(), 1340),
            ("<module>", USER, 12),
        ],
        None,
    );
    let acts = s.py(
        &[
            ("Linear.forward", linear.as_str(), 125),
            ("Module._call_impl", module.as_str(), 1747),
            ("<module>", USER, 20),
        ],
        None,
    );
    let grads = s.py(
        &[
            ("backward", autograd.as_str(), 347),
            ("Tensor.backward", tensor.as_str(), 581),
            ("<module>", USER, 21),
        ],
        None,
    );
    let state = s.py(
        &[
            ("AdamW._init_group", adamw.as_str(), 140),
            ("AdamW.step", adamw.as_str(), 209),
            ("<module>", USER, 22),
        ],
        None,
    );
    let own = s.py(&[("<module>", USER, 18)], None);
    alloc(&mut s, 1, 0x1000_0000, 100 * MIB, Some(weights));
    alloc(&mut s, 2, 0x2000_0000, 16 * MIB, Some(own));
    alloc(&mut s, 3, 0x3000_0000, 400 * MIB, Some(acts));
    alloc(&mut s, 4, 0x4000_0000, 100 * MIB, Some(grads));
    alloc(&mut s, 5, 0x5000_0000, 200 * MIB, Some(state));
    alloc(&mut s, 6, 0x6000_0000, 2 * MIB, None);
    free(&mut s, 7, 0x3000_0000, 400 * MIB);
    let (scan, _) = scanned(&s);
    let d = &scan.devices[0];
    assert_eq!(d.peak_bytes, 818 * MIB);
    assert_eq!(
        d.roles,
        [
            (Role::Activations, 400 * MIB),
            (Role::OptimizerState, 200 * MIB),
            (Role::Gradients, 100 * MIB),
            (Role::Weights, 100 * MIB),
            (Role::Other, 18 * MIB),
        ]
    );
}
