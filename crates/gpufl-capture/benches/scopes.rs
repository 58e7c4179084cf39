//! Cost of a named scope (`gpufl_scope_push` + `gpufl_scope_pop`, the C ABI that `gpufl::Scope`,
//! `GFL_SCOPE` and the Python package call) while a session records scopes. On a machine without
//! CUPTI (this VM, CI) `gpufl_init` starts a scopes-only session whose writer thread drains the
//! queue, as it does beside CUPTI; with CUPTI it is a normal session. Also: a push/pop pair at
//! depth 3 (inside two open scopes), and the cost when no session records (the early return).
use criterion::{criterion_group, criterion_main, Criterion};
use gpufl_capture::ffi::{gpufl_init, gpufl_scope_pop, gpufl_scope_push, gpufl_shutdown};
use std::hint::black_box;
use std::time::Duration;

fn scopes(c: &mut Criterion) {
    let mut g = c.benchmark_group("scope");
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("push+pop, not recording", |b| {
        b.iter(|| {
            // SAFETY: NUL-terminated literal.
            unsafe { gpufl_scope_push(black_box(c"forward".as_ptr())) };
            gpufl_scope_pop();
        })
    });
    let dir = std::env::temp_dir().join(format!("gpufl-bench-scopes-{}", std::process::id()));
    std::env::set_var("GPUFL_LOG_PATH", dir.as_os_str());
    std::env::set_var("GPUFL_QUIET", "1");
    // SAFETY: NULL options: defaults (and the GPUFL_* variables above).
    unsafe { gpufl_init(std::ptr::null()) };
    g.bench_function("push+pop, recording", |b| {
        b.iter(|| {
            // SAFETY: NUL-terminated literal.
            unsafe { gpufl_scope_push(black_box(c"forward".as_ptr())) };
            gpufl_scope_pop();
        })
    });
    // SAFETY: NUL-terminated literals.
    unsafe {
        gpufl_scope_push(c"train_step".as_ptr());
        gpufl_scope_push(c"epoch".as_ptr());
    }
    g.bench_function("push+pop at depth 3, recording", |b| {
        b.iter(|| {
            // SAFETY: NUL-terminated literal.
            unsafe { gpufl_scope_push(black_box(c"attention".as_ptr())) };
            gpufl_scope_pop();
        })
    });
    gpufl_scope_pop();
    gpufl_scope_pop();
    g.finish();
    gpufl_shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, scopes);
criterion_main!(benches);
