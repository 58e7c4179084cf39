//! Memory in the export (issue 38) on the real out-of-memory session (pytorch_oom: a PyTorch
//! loop keeping 256 MiB tensors until cudaMalloc fails): a counter of the bytes the process holds
//! per GPU that rises to the failure, an instant per allocation and free on the GPU's allocations
//! track, and the failed allocation an instant named as such with its line. Checked against the
//! session's `mem` records and gpufl-analysis's memory view of the same session.

mod common;

use common::testdata;
use gpufl_export::{export, Format, Options};
use gpufl_trace::{MemOp, Record, SessionReader};
use serde_json::Value;

#[test]
fn pytorch_oom_memory_counter_and_allocation_instants() {
    let dir = testdata("pytorch_oom-908-20261128T010827Z");
    let mut out = Vec::new();
    let opts = Options {
        format: Format::Chrome,
        ..Options::default()
    };
    export(std::slice::from_ref(&dir), &mut out, &opts).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();

    let (mut allocs, mut frees, mut failed) = (0usize, 0usize, 0usize);
    for r in SessionReader::open(&dir).unwrap() {
        if let Record::Mem(m) = r {
            match m.op {
                MemOp::Alloc => allocs += 1,
                MemOp::Free => frees += 1,
                MemOp::AllocFailed => failed += 1,
                MemOp::Unknown => {}
            }
        }
    }
    assert!(allocs > 300 && failed > 0, "{allocs} {frees} {failed}");

    let ts = |e: &Value| e["ts"].as_f64().unwrap();
    let mut counter: Vec<(f64, f64)> = evs
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "GPU 0 memory allocated by the process (bytes)")
        .map(|e| (ts(e), e["args"]["value"].as_f64().unwrap()))
        .collect();
    counter.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mem_instants: Vec<&Value> = evs
        .iter()
        .filter(|e| e["ph"] == "i" && e["cat"] == "mem")
        .collect();
    let named = |p: &str| {
        mem_instants
            .iter()
            .filter(|e| e["name"].as_str().unwrap().starts_with(p))
            .count()
    };
    assert_eq!(named("alloc "), allocs);
    assert_eq!(named("allocation failed (out of memory): "), failed);
    // Every allocation moves the counter; frees of known allocations too.
    assert!(counter.len() >= allocs && counter.len() <= allocs + frees);

    // The failure: named with its size and line, after the counter's rise.
    let fails: Vec<&&Value> = mem_instants
        .iter()
        .filter(|e| e["name"].as_str().unwrap().starts_with("allocation failed"))
        .collect();
    let first = fails.iter().map(|e| ts(e)).fold(f64::INFINITY, f64::min);
    let name = fails[0]["name"].as_str().unwrap();
    assert!(name.contains("256.0 MiB @ pytorch_oom.py:28"), "{name}");
    assert_eq!(fails[0]["args"]["bytes"], 256u64 << 20);
    let before: Vec<f64> = counter
        .iter()
        .filter(|c| c.0 <= first)
        .map(|c| c.1)
        .collect();
    let max = counter.iter().map(|c| c.1).fold(0.0, f64::max);
    let last = *before.last().unwrap();
    assert!(last > 70.0 * (1u64 << 30) as f64, "{last}");
    assert!(last >= 0.99 * max, "{last} vs the highest {max}");
    let rises = before.windows(2).filter(|w| w[1] > w[0]).count();
    assert!(rises >= 300, "{rises} rises before the failure");

    // The same peak as gpufl-analysis's replay.
    let m = gpufl_analysis::Model::load(SessionReader::open(&dir).unwrap());
    let mv = gpufl_analysis::memview::memory_view(&m, &gpufl_analysis::Config::default());
    assert_eq!(max as u64, mv.devices[0].peak_bytes);

    // The instants sit on the GPU's allocations track.
    let tid = mem_instants[0]["tid"].as_u64().unwrap();
    assert!(evs.iter().any(|e| e["ph"] == "M"
        && e["name"] == "thread_name"
        && e["tid"].as_u64() == Some(tid)
        && e["args"]["name"] == "GPU 0 allocations"));
}
