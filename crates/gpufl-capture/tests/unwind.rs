//! Tests for the native stack capture (`gpufl_capture::unwind`).
#![cfg(all(target_os = "linux", target_arch = "x86_64"))]

use std::ffi::{c_void, CString};
use std::hint::black_box;
use std::path::PathBuf;
use std::sync::{Arc, Barrier};

use gpufl_capture::unwind::{capture_native, invalidate_modules, module_of, MAX_NATIVE_FRAMES};

/// Resolve each return address (addr - 1) to the innermost symbol name.
fn names(addrs: &[u64]) -> Vec<String> {
    addrs
        .iter()
        .map(|&a| {
            let mut name = String::from("?");
            backtrace::resolve((a - 1) as *mut c_void, |sym| {
                if name == "?" {
                    if let Some(n) = sym.name() {
                        name = format!("{n:#}");
                    }
                }
            });
            name
        })
        .collect()
}

/// Index of the first name (at or after `from`) that ends with `suffix`.
fn find(names: &[String], suffix: &str, from: usize) -> Option<usize> {
    (from..names.len()).find(|&i| names[i].ends_with(suffix))
}

fn dump(addrs: &[u64], names: &[String]) -> String {
    addrs
        .iter()
        .zip(names)
        .map(|(a, n)| format!("  {a:#x} {n}\n"))
        .collect()
}

// ---- (1) nested chain, compared with backtrace::trace ------------------------------------

struct Captured {
    ours: Vec<u64>,
    theirs: Vec<u64>,
}

#[inline(never)]
fn chain_c() -> Captured {
    let mut buf = [0u64; MAX_NATIVE_FRAMES];
    let n = capture_native(&mut buf, 0);
    let mut theirs = Vec::new();
    backtrace::trace(|f| {
        theirs.push(f.ip() as u64);
        true
    });
    black_box(Captured {
        ours: buf[..n].to_vec(),
        theirs,
    })
}

#[inline(never)]
fn chain_b() -> Captured {
    black_box(chain_c())
}

#[inline(never)]
fn chain_a() -> Captured {
    black_box(chain_b())
}

#[test]
fn nested_chain_matches_backtrace() {
    let Captured { ours, theirs } = chain_a();
    let ours_names = names(&ours);
    let report = dump(&ours, &ours_names);
    assert!(ours.len() >= 5, "too few frames:\n{report}");
    let c = find(&ours_names, "chain_c", 0).expect(&report);
    assert_eq!(c, 0, "out[0] must be inside the caller:\n{report}");
    let b = find(&ours_names, "chain_b", c + 1).expect(&report);
    let a = find(&ours_names, "chain_a", b + 1).expect(&report);
    assert!(b == c + 1 && a == b + 1, "{report}");
    // The chain reaches the libtest harness (or the process entry).
    assert!(
        ours_names
            .iter()
            .skip(a + 1)
            .any(|n| n.contains("__rust_begin_short_backtrace")
                || n.contains("run_test")
                || n.contains("lang_start")),
        "harness not reached:\n{report}"
    );
    // Every return address from chain_b outwards equals libgcc's unwind of the same stack.
    let pos = theirs
        .iter()
        .position(|&x| x == ours[1])
        .unwrap_or_else(|| panic!("{:#x} not in backtrace::trace\n{report}", ours[1]));
    let common = (ours.len() - 1).min(theirs.len() - pos);
    assert!(common >= 4, "{report}");
    // The outermost frame may legitimately differ (end-of-stack detection).
    assert_eq!(ours[1..common], theirs[pos..pos + common - 1], "\n{report}");
}

#[inline(never)]
fn capture_twice() -> (Vec<u64>, Vec<u64>) {
    let mut a = [0u64; MAX_NATIVE_FRAMES];
    let mut b = [0u64; MAX_NATIVE_FRAMES];
    let na = capture_native(&mut a, 0);
    let nb = capture_native(&mut b, 1);
    black_box((a[..na].to_vec(), b[..nb].to_vec()))
}

#[test]
fn skip_and_small_buffers() {
    let (a, b) = capture_twice();
    assert!(a.len() >= 5);
    assert_eq!(
        &a[1..],
        &b[..],
        "skip=1 must drop exactly the caller's frame"
    );
    let mut small = [0u64; 3];
    assert_eq!(capture_native(&mut small, 0), 3);
    assert_eq!(capture_native(&mut [], 0), 0);
    assert_eq!(capture_native(&mut small, 10_000), 0);
}

// ---- (2) four threads, distinct chains ------------------------------------------------------

macro_rules! thread_chain {
    ($id:literal, $outer:ident, $mid:ident, $inner:ident) => {
        // black_box($id) makes the bodies differ, so release builds cannot merge the chains.
        #[inline(never)]
        fn $inner(out: &mut [u64]) -> usize {
            let n = black_box(capture_native(out, 0));
            black_box($id);
            n
        }
        #[inline(never)]
        fn $mid(out: &mut [u64]) -> usize {
            let n = black_box($inner(out));
            black_box($id);
            n
        }
        #[inline(never)]
        fn $outer(out: &mut [u64]) -> usize {
            let n = black_box($mid(out));
            black_box($id);
            n
        }
    };
}
thread_chain!(0u32, t0_outer, t0_mid, t0_inner);
thread_chain!(1u32, t1_outer, t1_mid, t1_inner);
thread_chain!(2u32, t2_outer, t2_mid, t2_inner);
thread_chain!(3u32, t3_outer, t3_mid, t3_inner);

#[test]
fn four_threads_see_their_own_stacks() {
    type Chain = fn(&mut [u64]) -> usize;
    let chains: [(usize, Chain); 4] = [(0, t0_outer), (1, t1_outer), (2, t2_outer), (3, t3_outer)];
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = chains
        .into_iter()
        .map(|(id, chain)| {
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                let mut first: Option<Vec<u64>> = None;
                for _ in 0..2000 {
                    // One call site, so every capture must be identical.
                    let mut buf = [0u64; MAX_NATIVE_FRAMES];
                    let m = chain(&mut buf);
                    match &first {
                        None => first = Some(buf[..m].to_vec()),
                        Some(f) => assert_eq!(&buf[..m], &f[..], "thread {id}: unstable capture"),
                    }
                }
                (id, first.unwrap())
            })
        })
        .collect();
    for h in handles {
        let (id, addrs) = h.join().unwrap();
        let ns = names(&addrs);
        let report = dump(&addrs, &ns);
        let want = [
            format!("t{id}_inner"),
            format!("t{id}_mid"),
            format!("t{id}_outer"),
        ];
        for (i, w) in want.iter().enumerate() {
            assert!(ns[i].ends_with(w.as_str()), "thread {id}: {w}\n{report}");
        }
        for other in (0..4).filter(|&o| o != id) {
            assert!(
                !ns.iter().any(|n| n.contains(&format!("t{other}_"))),
                "thread {id} saw thread {other}'s frames:\n{report}"
            );
        }
        assert!(addrs.len() >= 5, "{report}");
        assert!(
            ns.iter()
                .any(|n| n.contains("start_thread") || n.contains("thread")),
            "thread entry not reached:\n{report}"
        );
    }
}

// ---- (3) CFI through a foreign -O2 -fomit-frame-pointer C library --------------------------

const C_SRC: &str = r#"
typedef unsigned long (*cb_t)(unsigned long);
__attribute__((noinline)) unsigned long gpufl_c_inner(cb_t cb, unsigned long x) {
    volatile unsigned long pad[8];
    for (int i = 0; i < 8; i++) pad[i] = x + i;
    /* Clobber rbp so that any frame-pointer walk through this frame is broken:
       only DWARF CFI can recover the caller. */
    __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
    unsigned long r = cb(x + pad[3]);
    return r + pad[5];
}
__attribute__((noinline)) unsigned long gpufl_c_outer(cb_t cb, unsigned long x) {
    unsigned long r = gpufl_c_inner(cb, x * 3);
    return r ^ x;
}
"#;

fn build_c_lib() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpufl-unwind-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("cb.c");
    let lib = dir.join("libgpufl_unwind_cb.so");
    std::fs::write(&src, C_SRC).unwrap();
    let status = std::process::Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("running cc");
    assert!(status.success(), "cc failed");
    lib
}

/// Size of a dynamic symbol in the ELF file.
fn symbol_size(lib: &std::path::Path, name: &str) -> u64 {
    use object::{Object, ObjectSymbol};
    let data = std::fs::read(lib).unwrap();
    let file = object::File::parse(&*data).unwrap();
    file.dynamic_symbols()
        .find(|s| s.name() == Ok(name))
        .map(|s| s.size())
        .expect("symbol in dynsym")
}

static mut CB_FRAMES: [u64; MAX_NATIVE_FRAMES] = [0; MAX_NATIVE_FRAMES];
static mut CB_COUNT: usize = 0;

#[inline(never)]
extern "C" fn rust_callback(x: u64) -> u64 {
    let mut buf = [0u64; MAX_NATIVE_FRAMES];
    let n = capture_native(&mut buf, 0);
    // SAFETY: only the single test thread below calls into the C library.
    unsafe {
        CB_FRAMES = buf;
        CB_COUNT = n;
    }
    black_box(x + 1)
}

type COuter = unsafe extern "C" fn(extern "C" fn(u64) -> u64, u64) -> u64;

#[inline(never)]
fn rust_calls_c(outer: COuter) -> Vec<u64> {
    // SAFETY: gpufl_c_outer has this signature (see C_SRC).
    let r = unsafe { outer(rust_callback, 7) };
    black_box(r);
    // SAFETY: written by rust_callback on this thread.
    unsafe {
        let frames = &*std::ptr::addr_of!(CB_FRAMES);
        frames[..CB_COUNT].to_vec()
    }
}

#[test]
fn cfi_through_foreign_c_code() {
    let lib = build_c_lib();
    // Make sure a module snapshot exists *before* the dlopen below.
    assert!(capture_native(&mut [0u64; 8], 0) > 0);
    let path = CString::new(lib.to_str().unwrap()).unwrap();
    // SAFETY: plain dlopen/dlsym of the library just built.
    let (outer, inner) = unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW);
        assert!(!h.is_null(), "dlopen failed");
        let o = libc::dlsym(h, c"gpufl_c_outer".as_ptr());
        let i = libc::dlsym(h, c"gpufl_c_inner".as_ptr());
        assert!(!o.is_null() && !i.is_null());
        (o as u64, i as u64)
    };
    let outer_range = outer..outer + symbol_size(&lib, "gpufl_c_outer");
    let inner_range = inner..inner + symbol_size(&lib, "gpufl_c_inner");
    // SAFETY: the symbol has the COuter signature.
    let outer_fn: COuter = unsafe { std::mem::transmute::<u64, COuter>(outer) };

    // No invalidate_modules(): the first walks meet PCs in an unknown module, which must
    // trigger the (rate-limited, 100 ms) automatic rescan.
    let mut frames = Vec::new();
    for _ in 0..20 {
        frames = rust_calls_c(outer_fn);
        if frames.iter().any(|a| outer_range.contains(a)) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(60));
    }
    let ns = names(&frames);
    let report = dump(&frames, &ns);
    let in_inner = frames.iter().position(|a| inner_range.contains(a));
    let in_outer = frames.iter().position(|a| outer_range.contains(a));
    let (Some(i), Some(o)) = (in_inner, in_outer) else {
        panic!("C frames missing (inner {inner_range:x?}, outer {outer_range:x?}):\n{report}");
    };
    assert!(ns[0].ends_with("rust_callback"), "{report}");
    assert!(i < o, "{report}");
    let rc = find(&ns, "rust_calls_c", o + 1).expect(&report);
    let t = find(&ns, "cfi_through_foreign_c_code", rc + 1).expect(&report);
    assert!(frames.len() > t + 1, "{report}");

    let (m, range) = module_of(inner_range.start + 1).expect("module of C function");
    assert!(m.contains("libgpufl_unwind_cb.so"), "{m}");
    assert!(range.contains(&inner_range.start));

    // Explicit invalidation keeps captures working.
    // (Frames outside rust_calls_c differ: another call site in this function.)
    invalidate_modules();
    let again = rust_calls_c(outer_fn);
    assert_eq!(again[..=rc], frames[..=rc]);
    let _ = std::fs::remove_dir_all(lib.parent().unwrap());
}

// ---- (4) module_of ---------------------------------------------------------------------------

#[test]
fn module_of_libc_and_self() {
    // SAFETY: dlsym with RTLD_DEFAULT and a static C string.
    let getpid = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()) } as u64;
    assert_ne!(getpid, 0);
    let (path, range) = module_of(getpid).expect("libc known");
    assert!(path.contains("libc"), "{path}");
    assert!(range.contains(&getpid));

    let me = module_of_libc_and_self as *const () as u64;
    let (path, range) = module_of(me).expect("test binary known");
    assert!(range.contains(&me));
    let exe = std::env::current_exe().unwrap();
    assert_eq!(path, exe.to_string_lossy(), "main executable path");
    assert!(module_of(8).is_none());
}

// ---- allocation-free steady state, thread exit ---------------------------------------------

struct CountingAlloc;
static ALLOCS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
thread_local! {
    // const-initialised, no destructor: accessing it never allocates.
    static ARMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

// SAFETY: forwards to the system allocator; only adds a counter.
unsafe impl std::alloc::GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        if ARMED.with(|a| a.get()) {
            ALLOCS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

#[test]
fn steady_state_does_not_allocate() {
    let mut buf = [0u64; MAX_NATIVE_FRAMES];
    assert!(capture_native(&mut buf, 0) >= 5); // first call per thread may allocate
                                               // Another test may dlopen concurrently (a module-set change may allocate): retry rounds.
    let clean_round = (0..5).any(|_| {
        ALLOCS.store(0, std::sync::atomic::Ordering::Relaxed);
        ARMED.with(|a| a.set(true));
        for _ in 0..1000 {
            black_box(capture_native(&mut buf, 0));
        }
        ARMED.with(|a| a.set(false));
        ALLOCS.load(std::sync::atomic::Ordering::Relaxed) == 0
    });
    assert!(clean_round, "capture_native allocated in steady state");
}

struct CaptureOnDrop;
impl Drop for CaptureOnDrop {
    fn drop(&mut self) {
        // Runs during thread teardown: the unwinder's TLS may already be gone (then 0).
        let n = capture_native(&mut [0u64; MAX_NATIVE_FRAMES], 0);
        assert!(n <= MAX_NATIVE_FRAMES);
    }
}
thread_local! {
    static ON_EXIT: CaptureOnDrop = const { CaptureOnDrop };
}

#[test]
fn capture_during_thread_exit_is_safe() {
    for order in 0..2 {
        std::thread::spawn(move || {
            // Register ON_EXIT's destructor before or after the unwinder's thread state.
            if order == 0 {
                ON_EXIT.with(|_| ());
            }
            assert!(capture_native(&mut [0u64; 16], 0) > 0);
            ON_EXIT.with(|_| ());
        })
        .join()
        .unwrap();
    }
}

// ---- bounded walks ------------------------------------------------------------------------

#[inline(never)]
fn recurse_then(depth: u32, f: &mut dyn FnMut() -> (usize, bool)) -> (usize, bool) {
    if depth == 0 {
        return black_box(f());
    }
    let r = recurse_then(black_box(depth - 1), f);
    black_box(depth);
    r
}

#[test]
fn a_time_bound_cuts_a_deep_walk_and_says_so() {
    use gpufl_capture::unwind::{capture_native_bounded, Bound};
    let mut buf = [0u64; MAX_NATIVE_FRAMES];
    // Unbounded: the walk fills the buffer (the recursion is deeper than it), not cut.
    let (full, cut) = recurse_then(300, &mut || {
        capture_native_bounded(&mut buf, 0, Bound::NONE)
    });
    assert_eq!(full, MAX_NATIVE_FRAMES);
    assert!(!cut);
    // A bound of 1 ns: the clock, read every 4 frames, stops the walk at the first reading.
    let tiny = Bound {
        time_ns: 1,
        defer_rescan: true,
    };
    let (n, cut) = recurse_then(300, &mut || capture_native_bounded(&mut buf, 0, tiny));
    assert!(cut, "a 1 ns bound must cut a 300-frame walk");
    assert!(n < 8, "{n} frames walked past a 1 ns bound");
    // The frames kept are the innermost ones, the same as an unbounded walk's.
    let mut again = [0u64; MAX_NATIVE_FRAMES];
    let (m, _) = recurse_then(300, &mut || {
        capture_native_bounded(&mut again, 0, Bound::NONE)
    });
    assert!(m >= n);
    // A generous bound walks as far as no bound.
    let wide = Bound {
        time_ns: 10_000_000_000,
        defer_rescan: true,
    };
    let (w, cut) = recurse_then(300, &mut || capture_native_bounded(&mut buf, 0, wide));
    assert_eq!((w, cut), (MAX_NATIVE_FRAMES, false));
}

// ---- stack copies walked on another thread (deferred native frames) -----------------------

#[inline(never)]
fn copy_c() -> (Option<usize>, Vec<u64>) {
    let slot = gpufl_capture::unwind::copy_stack();
    let mut buf = [0u64; MAX_NATIVE_FRAMES];
    let n = capture_native(&mut buf, 0);
    black_box((slot, buf[..n].to_vec()))
}

#[inline(never)]
fn copy_b() -> (Option<usize>, Vec<u64>) {
    black_box(copy_c())
}

#[inline(never)]
fn copy_a() -> (Option<usize>, Vec<u64>) {
    black_box(copy_b())
}

#[test]
fn a_stack_copy_walked_on_another_thread_gives_the_live_callers() {
    let (slot, live) = copy_a();
    let slot = slot.expect("a free copy slot");
    // Walked later, elsewhere, while this thread's stack has moved on.
    let (walked, stopped) = std::thread::spawn(move || {
        let mut buf = [0u64; MAX_NATIVE_FRAMES];
        let (n, stopped) = gpufl_capture::unwind::walk_copy(slot, &mut buf);
        (buf[..n].to_vec(), stopped)
    })
    .join()
    .unwrap();
    let (wn, ln) = (names(&walked), names(&live));
    // Both start in copy_c (return addresses after two different calls), then the same callers.
    let (wc, lc) = (find(&wn, "copy_c", 0), find(&ln, "copy_c", 0));
    assert_eq!(wc, Some(0), "walked:\n{}", dump(&walked, &wn));
    assert_eq!(lc, Some(0), "live:\n{}", dump(&live, &ln));
    let b = find(&wn, "copy_b", 1).expect("copy_b in the walked copy");
    let a = find(&wn, "copy_a", b + 1).expect("copy_a in the walked copy");
    assert_eq!(
        walked[1..=a],
        live[1..=a],
        "walked:\n{}live:\n{}",
        dump(&walked, &wn),
        dump(&live, &ln)
    );
    // 16 KiB of a test thread's stack does not reach its start: the walk stops at the copy's end,
    // or goes on to the same frames as the live one.
    let common = walked.len().min(live.len());
    assert_eq!(walked[1..common], live[1..common]);
    assert!(stopped || walked.len() == live.len());
    // The slot is free again: every slot can be taken once more, and given back.
    let taken: Vec<usize> = (0..gpufl_capture::unwind::COPY_SLOTS)
        .filter_map(|_| gpufl_capture::unwind::copy_stack())
        .collect();
    assert!(taken.contains(&slot));
    for s in taken {
        gpufl_capture::unwind::release_copy(s);
    }
}
