//! Cost of `capture_native` at ~15 and ~40 total frames, with glibc `backtrace()` and the
//! `backtrace` crate (libgcc `_Unwind_Backtrace`) at the same depth for comparison.
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use gpufl_capture::unwind::{capture_native, MAX_NATIVE_FRAMES};

/// Recurse `depth` extra frames, then run `f` (which captures) at the bottom.
#[inline(never)]
fn recurse<R>(depth: usize, f: &mut dyn FnMut() -> R) -> R {
    if depth == 0 {
        f()
    } else {
        black_box(recurse(depth - 1, f))
    }
}

fn ours(buf: &mut [u64; MAX_NATIVE_FRAMES]) -> usize {
    capture_native(buf, 0)
}

fn glibc(buf: &mut [*mut libc::c_void; MAX_NATIVE_FRAMES]) -> usize {
    // SAFETY: buf has MAX_NATIVE_FRAMES slots.
    unsafe { libc::backtrace(buf.as_mut_ptr(), MAX_NATIVE_FRAMES as i32) as usize }
}

fn crate_trace(buf: &mut [u64; MAX_NATIVE_FRAMES]) -> usize {
    let mut n = 0;
    backtrace::trace(|f| {
        buf[n] = f.ip() as u64;
        n += 1;
        n < buf.len()
    });
    n
}

/// Extra recursion needed so that the stack seen by capture_native has `total` frames.
fn depth_for(total: usize) -> usize {
    let mut buf = [0u64; MAX_NATIVE_FRAMES];
    let base = recurse(0, &mut || ours(&mut buf));
    total.saturating_sub(base)
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("capture");
    for total in [15usize, 40] {
        let depth = depth_for(total);
        let mut buf = [0u64; MAX_NATIVE_FRAMES];
        let n = recurse(depth, &mut || ours(&mut buf));
        eprintln!("target {total} frames: recursion {depth}, capture_native sees {n} frames");
        assert!(n >= total - 1, "unwinding stopped early: {n} < {total}");

        g.bench_with_input(BenchmarkId::new("capture_native", n), &depth, |b, &d| {
            b.iter(|| recurse(d, &mut || ours(&mut buf)))
        });
        let mut gbuf = [std::ptr::null_mut(); MAX_NATIVE_FRAMES];
        g.bench_with_input(BenchmarkId::new("glibc_backtrace", n), &depth, |b, &d| {
            b.iter(|| recurse(d, &mut || glibc(&mut gbuf)))
        });
        g.bench_with_input(BenchmarkId::new("backtrace_crate", n), &depth, |b, &d| {
            b.iter(|| recurse(d, &mut || crate_trace(&mut buf)))
        });
        // Baseline: the recursion alone.
        g.bench_with_input(BenchmarkId::new("recursion_only", n), &depth, |b, &d| {
            b.iter(|| recurse(d, &mut || black_box(0usize)))
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
