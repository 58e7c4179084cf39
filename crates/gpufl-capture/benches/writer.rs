//! The writer thread's cost per kernel record: decoding a CUPTI kernel record, interning its
//! name, serializing it and compressing it (`Sink::take_decoded`), against serializing and
//! compressing an already decoded record alone (`TraceWriter::write`). Records look like a PyTorch
//! training loop's: 20 kernels with long mangled names, repeating.
use std::ffi::CString;
use std::fs::File;
use std::hint::black_box;
use std::io::BufWriter;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use gpufl_capture::activity::{decode, synthetic_kernel_record, Decoded, SyntheticRecord};
use gpufl_capture::sink::Sink;
use gpufl_trace::{Header, Kernel, Record, StrId, TraceWriter};

const RECORDS: usize = 20_000;

fn names() -> Vec<CString> {
    (0..20)
        .map(|i| {
            CString::new(format!(
                "_ZN2at6native{}29vectorized_elementwise_kernelILi4ENS0_{}_GLOBAL__N_{}clamp_scalar_\
                 kernel_implERNS_18TensorIteratorBaseERKN3c106ScalarES8_EUlvE_clEvENKUlvE{}_clEvEUlfE_\
                 NS_6detail5ArrayIPcLi2EEEEEviT0_T1_{i}",
                i, i * 7, i * 13, i % 5
            ))
            .unwrap()
        })
        .collect()
}

fn temp_writer(tag: &str) -> TraceWriter<BufWriter<File>> {
    let path = std::env::temp_dir().join(format!("gpufl-bench-{tag}-{}.zst", std::process::id()));
    let f = File::create(&path).unwrap();
    std::fs::remove_file(&path).ok();
    TraceWriter::new(BufWriter::with_capacity(1 << 20, f), &Header::default()).unwrap()
}

fn bench(c: &mut Criterion) {
    let names = names();
    let recs: Vec<SyntheticRecord> = (0..RECORDS)
        .map(|i| {
            let t = 1_795_000_000_000_000_000 + i as u64 * 2_700;
            synthetic_kernel_record(
                &names[i % names.len()],
                t,
                t + 1_900 + (i as u64 * 37) % 500,
                i as u32 * 14,
            )
        })
        .collect();
    let mut g = c.benchmark_group("writer");
    g.throughput(Throughput::Elements(RECORDS as u64));
    g.measurement_time(Duration::from_secs(8));
    let mut sink = Sink::new(temp_writer("sink"), None);
    g.bench_function("decode+intern+write (Sink)", |b| {
        b.iter(|| {
            for r in &recs {
                // SAFETY: a complete synthetic record whose name outlives the loop.
                let d = unsafe { decode(r.as_ptr()) };
                sink.take_decoded(d).unwrap();
            }
        })
    });
    let decoded: Vec<Kernel> = recs
        .iter()
        .map(|r| match unsafe { decode(r.as_ptr()) } {
            Decoded::Kernel { mut kernel, .. } => {
                kernel.name = StrId(1);
                kernel
            }
            _ => unreachable!(),
        })
        .collect();
    let mut w = temp_writer("writer");
    g.bench_function("write only (TraceWriter)", |b| {
        b.iter(|| {
            for k in &decoded {
                w.write(black_box(&Record::Kernel(k.clone()))).unwrap();
            }
        })
    });
    let mut line = Vec::with_capacity(1 << 20);
    g.bench_function("serialize only (serde_json)", |b| {
        b.iter(|| {
            line.clear();
            for k in &decoded {
                serde_json::to_writer(&mut line, black_box(&Record::Kernel(k.clone()))).unwrap();
                line.push(b'\n');
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
