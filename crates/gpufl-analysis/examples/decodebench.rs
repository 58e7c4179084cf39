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
//! target/release/examples/decodebench --scaling [--threads 1,2,4,8,16]   # the machine alone
//! target/release/examples/decodebench --floor [--input FILE] [--repeat R]  # zstd's share, 1 thread
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
    scaling: bool,
    floor: bool,
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
        scaling: false,
        floor: false,
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
            "--scaling" => a.scaling = true,
            "--floor" => a.floor = true,
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

/// One run's figures.
struct Run {
    decode_load_s: f64,
    analyze_s: f64,
    total_s: f64,
    per_s: f64,
    peak_per_record: f64,
}

fn run(reader: Reader, bytes: &Arc<Vec<u8>>, n: usize, rep: usize, decode_only: bool) -> Run {
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
    let cpu0 = cpu_times();
    let t = Instant::now();
    let m = match reader {
        Reader::Sequential => Model::load(reader.records(bytes)),
        Reader::Parallel(t) => Model::load_items(
            &mut ParTraceReader::from_shared(bytes.clone(), "bench", t).expect("a trace"),
        ),
    };
    let load_s = t.elapsed().as_secs_f64();
    let kept = CURRENT.load(Relaxed).saturating_sub(base);
    let load_peak = PEAK.load(Relaxed).saturating_sub(base);
    let t = Instant::now();
    let a = analyze_on(&m, &Config::default(), threads);
    let analyze_s = t.elapsed().as_secs_f64();
    // CPU time of the process (every thread) over decode + load + analyze.
    let (user_s, sys_s) = match (cpu0, cpu_times()) {
        (Some(a), Some(b)) => (b.0 - a.0, b.1 - a.1),
        _ => (f64::NAN, f64::NAN),
    };
    let peak = PEAK.load(Relaxed).saturating_sub(base);
    let records = m.kernel_count() + m.copy_count() + m.sync_count();
    assert_eq!(records, n, "timed records in the model");
    let total = load_s + analyze_s;
    let per_s = n as f64 / total;
    println!(
        "{{\"reader\":\"{name}\",\"threads\":{threads},\"rep\":{rep},\"records\":{n},\
         \"decode_only_s\":{decode_s:.4},\"decode_load_s\":{load_s:.4},\"analyze_s\":{analyze_s:.4},\
         \"total_s\":{total:.4},\"user_s\":{user_s:.2},\"sys_s\":{sys_s:.2},\"records_per_s\":{per_s:.0},\"model_bytes_per_record\":{:.1},\
         \"load_peak_bytes_per_record\":{:.1},\"peak_bytes_per_record\":{:.1},\"insights\":{}}}",
        kept as f64 / n as f64,
        load_peak as f64 / n as f64,
        peak as f64 / n as f64,
        a.insights.len()
    );
    eprintln!(
        "{name:>10} {threads:>3} threads  decode {decode_s:6.3} s  decode+load {load_s:6.3} s  \
         analyze {analyze_s:6.3} s  total {total:6.3} s (cpu {user_s:5.2} user {sys_s:4.2} sys)  {:6.2} M records/s  peak {:5.1} B/record",
        per_s / 1e6,
        peak as f64 / n as f64
    );
    Run {
        decode_load_s: load_s,
        analyze_s,
        total_s: total,
        per_s,
        peak_per_record: peak as f64 / n as f64,
    }
}

/// User and system CPU time of this process so far, seconds (Linux: `/proc/self/stat`, in
/// clock ticks of 1/100 s); None elsewhere.
fn cpu_times() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces): state is the first, utime the 12th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    let ticks = |i: usize| f.get(i)?.parse::<f64>().ok().map(|t| t / 100.0);
    Some((ticks(11)?, ticks(12)?))
}

/// The median of `v` (by total time).
fn median(mut v: Vec<Run>) -> Run {
    v.sort_by(|a, b| a.total_s.total_cmp(&b.total_s));
    let mid = v.len() / 2;
    v.swap_remove(mid)
}

/// `--scaling`: how the machine itself scales with threads, independent of gpufl's parallel
/// reader: each of T threads does the same fixed work at once — a register-only loop (compute),
/// 40 sums over a 64 MiB array of its own (memory bandwidth; the array's page faults included), and the sequential reader over a 1 M
/// record trace of its own (gpufl's single-threaded decoding, T copies side by side) — and the
/// speed-up is T × (1 thread's time) / (T threads' time): T when the cores are independent.
fn scaling(threads: &[usize]) {
    let trace = Arc::new(generate(1_000_000));
    let work = |kind: &str| -> f64 {
        match kind {
            "compute" => {
                let mut x = 0x9e37_79b9_7f4a_7c15u64;
                for i in 0..400_000_000u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x = x.wrapping_add(i);
                }
                std::hint::black_box(x);
                0.0
            }
            "memory" => {
                let v: Vec<u64> = (0..(8u64 << 20)).collect();
                let mut sum = 0u64;
                for _ in 0..40 {
                    sum = sum.wrapping_add(std::hint::black_box(&v).iter().sum::<u64>());
                }
                std::hint::black_box(sum);
                0.0
            }
            _ => {
                let n = TraceReader::from_bytes((*trace).clone(), "scaling")
                    .expect("a trace")
                    .count();
                n as f64
            }
        }
    };
    eprintln!("machine scaling: T threads doing the same fixed work at once (speed-up = T x 1-thread time / T-thread time)");
    eprintln!("| work | threads | s | speed-up |");
    eprintln!("|---|---|---|---|");
    for kind in ["compute", "memory", "decode"] {
        let mut one = f64::NAN;
        for &t in threads {
            let start = Instant::now();
            std::thread::scope(|sc| {
                for _ in 0..t {
                    sc.spawn(|| work(kind));
                }
            });
            let secs = start.elapsed().as_secs_f64();
            if t == 1 {
                one = secs;
            }
            let speedup = t as f64 * one / secs;
            println!("{{\"scaling\":\"{kind}\",\"threads\":{t},\"s\":{secs:.4},\"speedup\":{speedup:.3}}}");
            eprintln!("| {kind} | {t} | {secs:.3} | {speedup:.2}x |");
        }
    }
}

/// `--floor`: what the format's decompression alone costs on one thread, against the whole
/// decode + load + analyze: every block (zstd frame) of the trace decompressed into one reused
/// buffer, its checksum checked as the reader checks it (and once more with the checksum
/// ignored), then the same with the lines counted (`memchr`), with no parsing and no model. For a
/// target of R records/s the whole pipeline has `records / R` seconds; this says how much of it
/// zstd itself takes on this core.
fn floor(bytes: &[u8], n: usize, repeat: usize) {
    use zstd::zstd_safe::{self, DCtx, DParameter};
    let frames: Vec<(usize, usize)> = {
        let mut v = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = zstd_safe::find_frame_compressed_size(&bytes[at..]).expect("zstd frames");
            v.push((at, at + len));
            at += len;
        }
        v
    };
    // Decoded through a small buffer that stays in the core's cache, as the reader's ring does
    // (one buffer of the whole block runs at memory speed instead).
    let mut dctx = DCtx::create();
    let mut out = vec![0u8; 256 << 10];
    let mut pass = |check: bool, lines: bool| -> (f64, u64, u64) {
        dctx.set_parameter(DParameter::ForceIgnoreChecksum(!check))
            .expect("a zstd parameter");
        let start = Instant::now();
        let (mut total, mut nl) = (0u64, 0u64);
        for &(a, b) in &frames {
            dctx.reset(zstd_safe::ResetDirective::SessionOnly)
                .expect("a zstd reset");
            let mut input = zstd_safe::InBuffer::around(&bytes[a..b]);
            loop {
                let mut o = zstd_safe::OutBuffer::around(&mut out[..]);
                let left = dctx
                    .decompress_stream(&mut o, &mut input)
                    .expect("a whole frame");
                let got = o.pos();
                total += got as u64;
                if lines {
                    nl += memchr::memchr_iter(b'\n', &out[..got]).count() as u64;
                }
                if left == 0 && got < out.len() {
                    break;
                }
            }
        }
        (start.elapsed().as_secs_f64(), total, nl)
    };
    let budget = n as f64 / 5e6;
    eprintln!(
        "zstd floor: {} blocks, {n} timed records, one thread; 5 M records/s leaves {budget:.3} s for decode + load + analyze",
        frames.len()
    );
    eprintln!("| pass | s (median of {repeat}) | GB/s decompressed | share of {budget:.3} s |");
    eprintln!("|---|---|---|---|");
    for (name, check, lines) in [
        ("zstd, checksum checked", true, false),
        ("zstd, checksum ignored", false, false),
        ("zstd + line ends (memchr)", true, true),
    ] {
        let mut runs: Vec<(f64, u64, u64)> =
            (0..repeat.max(1)).map(|_| pass(check, lines)).collect();
        runs.sort_by(|x, y| x.0.total_cmp(&y.0));
        let (s, total, nl) = runs[runs.len() / 2];
        println!(
            "{{\"floor\":\"{name}\",\"s\":{s:.4},\"bytes\":{total},\"lines\":{nl},\"records\":{n}}}"
        );
        eprintln!(
            "| {name} | {s:.3} | {:.2} | {:.0} % |",
            total as f64 / s / 1e9,
            100.0 * s / budget
        );
    }
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("decodebench: {e}");
            std::process::exit(2);
        }
    };
    if a.scaling {
        let mut t = a.threads.clone();
        if t.first() != Some(&1) {
            t.insert(0, 1);
        }
        scaling(&t);
        return;
    }
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
    if a.floor {
        floor(&bytes, n, a.repeat);
        return;
    }
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
    let mut rows = Vec::new();
    for r in readers {
        let runs: Vec<Run> = (0..a.repeat.max(1))
            .map(|rep| run(r, &bytes, n, rep, a.decode_only))
            .collect();
        let most_peak = runs.iter().map(|r| r.peak_per_record).fold(0.0, f64::max);
        rows.push((r.name(), median(runs), most_peak));
    }
    let one = rows
        .iter()
        .find(|r| r.0 == ("parallel", 1))
        .map(|r| r.1.per_s)
        .unwrap_or(f64::NAN);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    eprintln!();
    eprintln!(
        "decode + Model::load + analyze of {n} timed records, median of {} run(s), {cores} cores:",
        a.repeat.max(1)
    );
    eprintln!(
        "| reader | threads | decode+load s | analyze s | total s | M records/s | x 1 thread | peak B/record |"
    );
    eprintln!("|---|---|---|---|---|---|---|---|");
    for ((name, t), m, peak) in &rows {
        eprintln!(
            "| {name} | {t} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2}x | {:.1} |",
            m.decode_load_s,
            m.analyze_s,
            m.total_s,
            m.per_s / 1e6,
            m.per_s / one,
            peak
        );
    }
    eprintln!(
        "(issue 13: >= 5 M records/s on 1 thread, >= 3.5x that on 4 threads, peak <= 64 B/record; x 1 thread is over the parallel reader on 1 thread, which decodes and folds each block on the caller)"
    );
}
