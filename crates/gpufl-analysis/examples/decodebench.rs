//! Analysis throughput on 1..N threads, as a standalone binary that can be carried to a machine
//! without cargo: decode + `Model::load` + `analyze` of the `load` bench's synthetic session
//! (10 M records by default), and decoding alone, with the parallel reader on each thread count
//! asked for (and the sequential reader for comparison); peak heap per record from a counting
//! allocator.
//!
//! ```text
//! cargo build --release -p gpufl-analysis --example decodebench
//! target/release/examples/decodebench [--records N] [--threads 1,2,4] [--repeat R]
//!     [--sequential] [--save FILE | --input FILE] [--no-decode-only]
//! ```
//!
//! One JSON object per run on stdout, a summary on stderr. `--save` writes the generated trace (so
//! later runs can `--input` it instead of generating, ~1 min for 10 M records).

use gpufl_analysis::{analyze_on, Config, Model};
use gpufl_trace::{ParTraceReader, Record, TraceReader};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

#[path = "../benches/common/mod.rs"]
mod common;
use common::{generate, CURRENT, PEAK};

#[global_allocator]
static GLOBAL: common::Counting = common::Counting;

struct Args {
    records: usize,
    threads: Vec<usize>,
    repeat: usize,
    sequential: bool,
    decode_only: bool,
    save: Option<String>,
    input: Option<String>,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        records: common::records(),
        threads: vec![1, gpufl_trace::default_threads()],
        repeat: 3,
        sequential: false,
        decode_only: true,
        save: None,
        input: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "--records" => a.records = val()?.parse().map_err(|e| format!("--records: {e}"))?,
            "--threads" => {
                a.threads = val()?
                    .split(',')
                    .map(|t| {
                        t.trim()
                            .parse::<usize>()
                            .map_err(|e| format!("--threads: {e}"))
                    })
                    .collect::<Result<_, _>>()?
            }
            "--repeat" => a.repeat = val()?.parse().map_err(|e| format!("--repeat: {e}"))?,
            "--sequential" => a.sequential = true,
            "--no-decode-only" => a.decode_only = false,
            "--save" => a.save = Some(val()?),
            "--input" => a.input = Some(val()?),
            "--bench" => {} // passed by `cargo bench` to every target
            other => return Err(format!("unknown argument {other}")),
        }
    }
    a.threads.dedup();
    Ok(a)
}

/// The reader under test.
#[derive(Clone, Copy)]
enum Reader {
    Sequential,
    Parallel(usize),
}

impl Reader {
    fn records(self, bytes: &Arc<Vec<u8>>) -> Box<dyn Iterator<Item = Record>> {
        match self {
            Reader::Sequential => {
                Box::new(TraceReader::from_bytes(bytes.to_vec(), "bench").expect("a trace"))
            }
            Reader::Parallel(t) => {
                Box::new(ParTraceReader::from_shared(bytes.clone(), "bench", t).expect("a trace"))
            }
        }
    }

    fn name(self) -> (&'static str, usize) {
        match self {
            Reader::Sequential => ("sequential", 1),
            Reader::Parallel(t) => ("parallel", t),
        }
    }
}

fn run(reader: Reader, bytes: &Arc<Vec<u8>>, n: usize, rep: usize, decode_only: bool) -> f64 {
    let (name, threads) = reader.name();
    let decode_s = if decode_only {
        let t = Instant::now();
        let count = reader.records(bytes).count();
        assert!(count >= n, "decoded {count} records, expected {n}");
        t.elapsed().as_secs_f64()
    } else {
        f64::NAN
    };
    let base = CURRENT.load(Relaxed);
    PEAK.store(base, Relaxed);
    let t = Instant::now();
    let m = Model::load(reader.records(bytes));
    let load_s = t.elapsed().as_secs_f64();
    let kept = CURRENT.load(Relaxed).saturating_sub(base);
    let t = Instant::now();
    let a = analyze_on(&m, &Config::default(), threads);
    let analyze_s = t.elapsed().as_secs_f64();
    let peak = PEAK.load(Relaxed).saturating_sub(base);
    let records = m.kernel_count() + m.copy_count() + m.sync_count();
    assert_eq!(records, n, "timed records in the model");
    let total = load_s + analyze_s;
    let per_s = n as f64 / total;
    println!(
        "{{\"reader\":\"{name}\",\"threads\":{threads},\"rep\":{rep},\"records\":{n},\
         \"decode_only_s\":{decode_s:.4},\"decode_load_s\":{load_s:.4},\"analyze_s\":{analyze_s:.4},\
         \"total_s\":{total:.4},\"records_per_s\":{per_s:.0},\"model_bytes_per_record\":{:.1},\
         \"peak_bytes_per_record\":{:.1},\"insights\":{}}}",
        kept as f64 / n as f64,
        peak as f64 / n as f64,
        a.insights.len()
    );
    eprintln!(
        "{name:>10} {threads:>3} threads  decode {decode_s:6.3} s  decode+load {load_s:6.3} s  \
         analyze {analyze_s:6.3} s  total {total:6.3} s  {:6.2} M records/s  peak {:5.1} B/record",
        per_s / 1e6,
        peak as f64 / n as f64
    );
    per_s
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("decodebench: {e}");
            std::process::exit(2);
        }
    };
    let bytes = match &a.input {
        Some(p) => std::fs::read(p).unwrap_or_else(|e| {
            eprintln!("decodebench: {p}: {e}");
            std::process::exit(2)
        }),
        None => {
            let t = Instant::now();
            let b = generate(a.records);
            eprintln!(
                "generated {} records in {:.1} s: {:.1} MB of zstd",
                a.records,
                t.elapsed().as_secs_f64(),
                b.len() as f64 / 1e6
            );
            b
        }
    };
    if let Some(p) = &a.save {
        if let Err(e) = std::fs::write(p, &bytes) {
            eprintln!("decodebench: {p}: {e}");
            std::process::exit(2);
        }
    }
    let bytes = Arc::new(bytes);
    // The timed records (kernels, copies, syncs) of the input, counted once.
    let n = {
        let m =
            Model::load(ParTraceReader::from_shared(bytes.clone(), "bench", 1).expect("a trace"));
        m.kernel_count() + m.copy_count() + m.sync_count()
    };
    eprintln!(
        "{n} timed records, {:.1} bytes/record of zstd; cores available: {}",
        bytes.len() as f64 / n as f64,
        std::thread::available_parallelism().map_or(1, |c| c.get())
    );
    let mut readers = Vec::new();
    if a.sequential {
        readers.push(Reader::Sequential);
    }
    readers.extend(a.threads.iter().map(|&t| Reader::Parallel(t)));
    let mut best = Vec::new();
    for r in readers {
        let mut rates: Vec<f64> = (0..a.repeat.max(1))
            .map(|rep| run(r, &bytes, n, rep, a.decode_only))
            .collect();
        rates.sort_by(|x, y| x.total_cmp(y));
        best.push((r.name(), rates[rates.len() / 2], rates[rates.len() - 1]));
    }
    let one = best
        .iter()
        .find(|b| b.0 == ("parallel", 1))
        .map(|b| b.1)
        .unwrap_or(f64::NAN);
    eprintln!(
        "median (best) decode+load+analyze, and the median over the parallel reader on 1 thread:"
    );
    for ((name, t), median, max) in &best {
        eprintln!(
            "{name:>10} {t:>3} threads  {:6.2} M records/s ({:.2})  {:5.2}x",
            median / 1e6,
            max / 1e6,
            median / one
        );
    }
}
