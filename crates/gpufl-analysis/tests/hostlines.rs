//! gpufl_analysis::hostlines on the real hostgaps sessions: the host samples and the CUDA calls
//! that held the thread, per user line.

use gpufl_analysis::hostlines::host_line_details;
use gpufl_analysis::{Config, Model};
use gpufl_trace::{HostState, SessionReader};
use std::path::PathBuf;

fn model(name: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../testdata/sessions")
        .join(name);
    Model::load(SessionReader::open(&dir).unwrap())
}

#[test]
fn empty_cache_line_holds_its_cuda_frees_and_samples_name_lines() {
    let m = model("pytorch_empty_cache-759-20261127T204130Z");
    let d = host_line_details(&m, &Config::default());
    let at = |line: u32| {
        d.iter()
            .find(|l| {
                l.location.file.ends_with("pytorch_empty_cache.py") && l.location.line == Some(line)
            })
            .unwrap_or_else(|| panic!("no line {line}"))
    };
    // torch.cuda.empty_cache() at line 45: its cudaFree calls (205 of the session's 206), and the
    // samples there, all inside that call.
    let l45 = at(45);
    let free = l45
        .calls
        .iter()
        .find(|c| c.call == "cudaFree")
        .expect("cudaFree at 45");
    assert_eq!(free.count, 206 - 1);
    assert!(free.host_ns > 0 && free.max_ns <= free.host_ns);
    assert!(l45.samples > 100);
    assert_eq!(l45.states[0].state, HostState::Cuda);
    assert_eq!(l45.states[0].samples, l45.samples);
    // Samples: counted per line with their states and threads; their times sum.
    let sampled: Vec<_> = d.iter().filter(|l| l.samples > 0).collect();
    assert!(!sampled.is_empty());
    for l in &sampled {
        assert_eq!(l.states.iter().map(|s| s.samples).sum::<u64>(), l.samples);
        assert_eq!(l.states.iter().map(|s| s.ns).sum::<u64>(), l.sample_ns);
        assert!(!l.threads.is_empty());
        assert!(l.location.library.is_none());
    }
    let total: u64 = d.iter().map(|l| l.samples).sum();
    let with_stack = m.hsamples().filter(|s| s.stack.is_some()).count() as u64;
    assert!(total <= with_stack && total > 0);
    assert!(sampled
        .iter()
        .any(|l| l.states.iter().any(|s| s.state == HostState::Cpu)));
}

#[test]
fn a_native_program_without_python_frames_has_calls_but_no_sampled_lines() {
    let m = model("malloc_free_loop-613-20261127T204121Z");
    let d = host_line_details(&m, &Config::default());
    assert!(
        d.iter().all(|l| l.samples == 0),
        "native threads have no sampled stack"
    );
    let frees: u64 = d
        .iter()
        .flat_map(|l| &l.calls)
        .filter(|c| c.call == "cudaFree")
        .map(|c| c.count)
        .sum();
    assert_eq!(frees, 301, "every cudaFree at a line of the program");
    let l70 = d
        .iter()
        .find(|l| l.location.line == Some(70))
        .expect("the loop's cudaFree line");
    assert_eq!(
        (l70.calls[0].call.as_str(), l70.calls[0].count),
        ("cudaFree", 300)
    );
}
