//! The streams-seed examples as recorded on the H100 (`testdata/sessions/…`, commands in
//! `testdata/README.md`): each report names the planted line (`gpufl-example: <rule>` in the
//! example) with the right rule, and the seed's well-behaved programs raise no HIGH insight.

use super::*;

/// The insight of `rule` at the example's planted line (`marker` found in `file`).
fn planted<'a>(a: &'a Analysis, rule_name: &str, file: &str, marker: &str) -> &'a Insight {
    let line = example_line(file, marker);
    let v = rule(a, rule_name);
    v.iter()
        .copied()
        .find(|i| {
            i.location.file.ends_with(&format!("examples/{file}")) && i.location.line == Some(line)
        })
        .unwrap_or_else(|| panic!("no {rule_name} at {file}:{line}: {:#?}", a.insights))
}

fn no_high(a: &Analysis) {
    let high: Vec<_> = a
        .insights
        .iter()
        .filter(|i| i.severity == Severity::High)
        .map(|i| &i.title)
        .collect();
    assert!(high.is_empty(), "{high:#?}");
}

#[test]
fn testdata_default_stream_barrier_names_the_cudamemcpy_inside_the_helper() {
    let a = session("default_stream_barrier-832-");
    let i = planted(
        &a,
        "default-stream-barrier",
        "default_stream_barrier.cu",
        "gpufl-example: default-stream-barrier",
    );
    assert_eq!(window_level(i), Severity::High);
    assert_eq!(
        i.location
            .function
            .as_deref()
            .map(|f| f.starts_with("prepare_data")),
        Some(true)
    );
    assert!(i.count >= 19, "{}", i.count);
    assert!(i.impact_ns > 10_000_000, "{}", i.impact_ns);
}

#[test]
fn testdata_pageable_async_copy_names_the_copy_from_malloc_memory() {
    let a = session("pageable_async_copy-858-");
    let i = planted(
        &a,
        "pageable-async-copy",
        "pageable_async_copy.cu",
        "gpufl-example: pageable-async-copy",
    );
    assert_eq!(window_level(i), Severity::High);
    assert_eq!(i.count, 20);
    // The pinned device-to-host copy of the same loop is not flagged.
    assert_eq!(rule(&a, "pageable-async-copy").len(), 1);
}

#[test]
fn testdata_blocking_copy_names_the_large_copy_not_the_small_upload() {
    let a = session("blocking_copy-884-");
    let i = planted(
        &a,
        "blocking-copy",
        "blocking_copy.cu",
        "gpufl-example: blocking-copy",
    );
    assert_eq!(window_level(i), Severity::High);
    assert_eq!(i.count, 20);
    let small = example_line("blocking_copy.cu", "gpufl-example: small-h2d-not-flagged");
    assert!(rule(&a, "blocking-copy")
        .iter()
        .all(|i| i.location.line != Some(small)));
}

#[test]
fn testdata_device_wide_sync_names_the_sledgehammer() {
    let a = session("device_wide_sync-908-");
    let i = planted(
        &a,
        "device-wide-sync",
        "device_wide_sync.cu",
        "gpufl-example: device-wide-sync",
    );
    assert_eq!(window_level(i), Severity::High);
    assert_eq!(i.count, 20);
}

/// The prediction check of the streams issue: the rule's 2-stream prediction from the recorded
/// 1-stream run, against the same work split over 2 streams measured without the recorder on the
/// same H100 (`copy_compute_pipeline 2 5`: best 2.536 ms, testdata/README.md).
#[test]
fn testdata_copy_compute_pipeline_prediction_is_within_20_percent_of_two_streams_measured() {
    let a = session("copy_compute_pipeline-934-");
    let i = planted(
        &a,
        "no-copy-compute-overlap",
        "copy_compute_pipeline.cu",
        "gpufl-example: no-copy-compute-overlap",
    );
    let d = serde_json::to_value(&i.data).unwrap();
    let seqs = d["sequences"].as_u64().unwrap();
    assert_eq!(seqs, 3);
    let per_seq_2 = d["two_streams"]["time_ns"].as_u64().unwrap() as f64 / seqs as f64;
    let measured_2 = 2_536_000.0;
    let err = (per_seq_2 - measured_2) / measured_2;
    assert!(
        err.abs() <= 0.20,
        "predicted {per_seq_2} ns vs measured {measured_2} ns: {err}"
    );
    let s4 = d["four_streams"]["speedup"].as_f64().unwrap();
    let s2 = d["two_streams"]["speedup"].as_f64().unwrap();
    assert!(s4 > s2 && s2 > 1.3, "{s2} {s4}");
}

#[test]
fn testdata_gpu_idle_names_the_late_launch() {
    let a = session("gpu_idle_launch-984-");
    let i = planted(
        &a,
        "gpu-idle",
        "gpu_idle_launch.cu",
        "gpufl-example: gpu-idle",
    );
    assert_eq!(window_level(i), Severity::High);
    assert!(i.count >= 400, "{}", i.count);
    assert_eq!(a.insights[0].rule, "gpu-idle", "ranked first");
    let d = &a.gpu_idle[0];
    assert_eq!(d.utilization.len(), 30);
    assert!(d.utilization.iter().filter(|c| c.low).count() >= 25);
}

#[test]
fn testdata_launch_bound_names_the_tiny_kernel_launch() {
    let a = session("launch_bound-1009-");
    let i = planted(
        &a,
        "launch-bound",
        "launch_bound.cu",
        "gpufl-example: launch-bound",
    );
    assert_eq!(window_level(i), Severity::High);
    assert_eq!(i.count, 5000);
    // The GPU's idle time between the tiny kernels is the launches' too, at the same line.
    planted(
        &a,
        "gpu-idle",
        "launch_bound.cu",
        "gpufl-example: launch-bound",
    );
}

#[test]
fn testdata_overlapped_and_ping_pong_raise_no_high_insight() {
    no_high(&session("ping_pong-959-"));
    let a = session("two_stream_overlap-1034-");
    no_high(&a);
    // Its sequential part is found, and only it.
    let i = planted(
        &a,
        "no-copy-compute-overlap",
        "two_stream_overlap.cu",
        "cudaMemcpy(d_in, h_in, bytes, cudaMemcpyHostToDevice)",
    );
    assert_eq!(i.count, 1);
}

#[test]
fn testdata_pytorch_item_is_a_copy_then_wait_at_its_line() {
    let a = session("pytorch_transfers-1063-");
    let i = planted(
        &a,
        "blocking-copy",
        "pytorch_transfers.py",
        "gpufl-example: item",
    );
    assert_eq!(i.count, 30);
    assert_eq!(i.location.origin, FrameOrigin::Python);
    assert!(i.detail.contains("copy then wait"), "{}", i.detail);
}

#[test]
fn testdata_pytorch_cpu_is_a_high_blocking_copy() {
    let a = session("pytorch_transfers-1122-");
    let i = planted(
        &a,
        "blocking-copy",
        "pytorch_transfers.py",
        "gpufl-example: cpu",
    );
    assert_eq!(window_level(i), Severity::High);
    assert_eq!(a.insights[0].location.line, i.location.line, "ranked first");
}

#[test]
fn testdata_pytorch_non_blocking_from_pageable_memory_is_flagged() {
    let a = session("pytorch_transfers-1187-");
    let i = planted(
        &a,
        "pageable-async-copy",
        "pytorch_transfers.py",
        "gpufl-example: pageable",
    );
    assert_eq!(i.count, 30);
    assert!(window_level(i) >= Severity::Medium);
}
