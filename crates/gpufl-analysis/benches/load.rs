//! Analysis throughput: decode a synthetic 10-million-record session held in memory (NDJSON in
//! zstd blocks, written by `TraceWriter`), build the `Model`, run `analyze`.
//!
//! `cargo bench -p gpufl-analysis --bench load` (GPUFL_BENCH_RECORDS=N for another size; the
//! parallel runs use GPUFL_THREADS threads, default every core). Before
//! criterion's runs it prints a one-shot breakdown: time per phase and memory, counted by a global
//! allocator (model bytes per record = heap the model keeps; peak = the most heap held at once
//! while decoding, loading and analysing, the input bytes excluded).

use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};
use gpufl_analysis::{analyze, analyze_on, Config, Model};
use gpufl_trace::*;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

mod common;
use common::{generate, records, CURRENT, PEAK};

#[global_allocator]
static GLOBAL: common::Counting = common::Counting;

fn decode(bytes: &[u8]) -> TraceReader {
    TraceReader::from_bytes(bytes.to_vec(), "bench").unwrap()
}

fn pipeline(bytes: &[u8]) -> (Model, usize) {
    let mut r = decode(bytes);
    let mut m = Model::load(r.by_ref());
    m.add_warnings(r.warnings());
    let a = analyze(&m, &Config::default());
    let n = a.insights.len();
    (m, n)
}

/// The same on `threads` threads: the parallel reader and `analyze_on` (the input shared, not
/// copied).
fn pipeline_on(bytes: &std::sync::Arc<Vec<u8>>, threads: usize) -> usize {
    let mut r = ParTraceReader::from_shared(bytes.clone(), "bench", threads).unwrap();
    let mut m = Model::load(r.by_ref());
    m.add_warnings(r.warnings());
    analyze_on(&m, &Config::default(), threads).insights.len()
}

fn breakdown(bytes: &[u8], n: usize) {
    let per_s = |d: Duration| n as f64 / d.as_secs_f64() / 1e6;
    let t = Instant::now();
    let count = decode(bytes).count();
    let d_decode = t.elapsed();
    assert!(count >= n, "decoded {count} records");

    let base = CURRENT.load(Relaxed);
    PEAK.store(base, Relaxed);
    let t = Instant::now();
    let mut r = decode(bytes);
    let m = Model::load(r.by_ref());
    drop(r);
    let d_load = t.elapsed();
    let kept = CURRENT.load(Relaxed) - base;
    let t = Instant::now();
    let a = analyze(&m, &Config::default());
    let d_analyze = t.elapsed();
    let peak = PEAK.load(Relaxed) - base;
    let records = m.kernel_count() + m.copy_count() + m.sync_count();
    eprintln!(
        "gpufl-analysis bench: {n} records, {:.1} MB of zstd ({:.1} bytes/record)\n  \
         decode only        {:>7.2} s  {:>5.2} M records/s\n  \
         decode + load      {:>7.2} s  {:>5.2} M records/s\n  \
         analyze            {:>7.2} s\n  \
         decode+load+analyze{:>7.2} s  {:>5.2} M records/s\n  \
         model heap {:.1} MB = {:.1} bytes/record (columns {:.1} bytes/record); peak heap {:.1} MB = {:.1} bytes/record\n  \
         {} insights: {}",
        bytes.len() as f64 / 1e6,
        bytes.len() as f64 / n as f64,
        d_decode.as_secs_f64(),
        per_s(d_decode),
        d_load.as_secs_f64(),
        per_s(d_load),
        d_analyze.as_secs_f64(),
        (d_load + d_analyze).as_secs_f64(),
        per_s(d_load + d_analyze),
        kept as f64 / 1e6,
        kept as f64 / records as f64,
        m.column_bytes() as f64 / records as f64,
        peak as f64 / 1e6,
        peak as f64 / records as f64,
        a.insights.len(),
        a.insights.iter().map(|i| i.title.as_str()).collect::<Vec<_>>().join(" | "),
    );
}

fn bench(c: &mut Criterion) {
    let n = records();
    let t = Instant::now();
    let bytes = generate(n);
    eprintln!(
        "generated {n} records in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    breakdown(&bytes, n);
    let mut g = c.benchmark_group("analysis");
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(20));
    g.throughput(Throughput::Elements(n as u64));
    g.bench_with_input(BenchmarkId::new("decode", n), &bytes, |b, bytes| {
        b.iter(|| decode(bytes).count())
    });
    g.bench_with_input(
        BenchmarkId::new("decode+load+analyze", n),
        &bytes,
        |b, bytes| b.iter(|| pipeline(bytes).1),
    );
    // The parallel reader and analysis on 1 thread and on every core (GPUFL_THREADS to choose):
    // the standalone `decodebench` example measures 1..N threads and the peak heap of each.
    let shared = std::sync::Arc::new(bytes);
    let mut threads = vec![1, gpufl_trace::default_threads()];
    threads.dedup();
    for t in threads {
        g.bench_with_input(
            BenchmarkId::new(format!("parallel {t} threads: decode+load+analyze"), n),
            &shared,
            |b, bytes| b.iter(|| pipeline_on(bytes, t)),
        );
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
