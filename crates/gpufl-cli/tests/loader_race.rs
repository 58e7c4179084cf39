//! The recorder walks the loaded modules (`dl_iterate_phdr`) on its writer thread while the
//! application may be loading libraries. glibc's walk reads each TLS module's slot without the
//! lock `dlopen` holds, and crashes (SIGSEGV at address 0 in ld.so) when the walking thread's
//! DTV is behind and a module is mapped but not yet registered: the writer-thread crash seen in
//! recorded HuggingFace Trainers. `dl::iterate_phdr` brings the DTV up to date inside the walk
//! (its doc says why that closes the race).
//!
//! Here, with `cc`: 140 libraries with a 4 KiB TLS block each, whose relocation takes ~3 ms (an
//! IFUNC resolver that sleeps), loaded one by one by one thread while the main thread walks the
//! modules without pause, many times per process, in 12 processes: through the capture
//! library's `gpufl_test_walk_modules` none may crash. The same program walking with a plain
//! `dl_iterate_phdr` is run as the control (both make one TLS access of their own early, the
//! state the writer thread was in), and its crashes are printed (23 of 30 on glibc 2.36; not asserted: a later glibc
//! may fix its side).

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::GPUFL;

const LIBS: usize = 140;

const LIB: &str = r#"
#include <unistd.h>
__thread char block[4096];
int touch(void) { return block[0]; }
static int impl(void) { return 1; }
static void *resolve(void) { usleep(3000); return (void *)impl; }
int slow(void) __attribute__((ifunc("resolve")));
int use(void) { return slow(); }
"#;

const DRIVER: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
static volatile int done, loaded;
static const char *dir;
static void *loader(void *a) {
  char p[4096];
  for (int i = 1; i < NLIBS; i++) {
    snprintf(p, sizeof p, "%s/libt%d.so", dir, i);
    if (!dlopen(p, RTLD_NOW)) { fprintf(stderr, "%s\n", dlerror()); exit(3); }
    loaded = i;
  }
  done = 1;
  return 0;
}
static int count(struct dl_phdr_info *i, size_t s, void *n) { ++*(long *)n; return 0; }
int main(int argc, char **argv) {
  /* argv: capture-lib dir mode (gpufl | plain) */
  dir = argv[2];
  long (*walk)(void) = 0;
  int (*touch)(void) = 0;
  char p[4096];
  if (argv[3][0] == 'g') {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 4; }
    walk = (long (*)(void))dlsym(h, "gpufl_test_walk_modules");
    if (!walk) return 5;
  }
  snprintf(p, sizeof p, "%s/libt0.so", dir);
  void *h0 = dlopen(p, RTLD_NOW);
  if (!h0) return 4;
  touch = (int (*)(void))dlsym(h0, "touch");
  pthread_t t;
  pthread_create(&t, 0, loader, 0);
  long n = 0, walks = 0;
  int touched = 0;
  while (!done) {
    /* One TLS access when about 55 libraries are in: this thread's DTV grows to cover the
       next ones, then falls behind as more load (as the writer thread's did). */
    if (!touched && loaded >= 55) { touch(); touched = 1; }
    if (walk) n += walk();
    else dl_iterate_phdr(count, &n);
    walks++;
  }
  pthread_join(t, 0);
  printf("%ld walks, %ld modules seen\n", walks, n);
  return walks > 0 ? 0 : 6;
}
"#;

fn cc(args: &[&str]) {
    let out = Command::new("cc").args(args).output().expect("cc");
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The capture library built with this test (as gpufl-cli's dev-dependency: deps/; or beside the
/// binary).
fn capture_lib() -> PathBuf {
    let bin = Path::new(GPUFL).parent().unwrap();
    [bin.join("deps"), bin.to_path_buf()]
        .into_iter()
        .map(|d| d.join("libgpufl_capture.so"))
        .find(|p| p.exists())
        .expect("libgpufl_capture.so (built as gpufl-cli's dev-dependency)")
}

#[test]
fn walking_the_modules_while_libraries_with_tls_load_does_not_crash() {
    let dir = std::env::temp_dir().join(format!("gpufl-loader-race-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("t.c");
    std::fs::write(&src, LIB).unwrap();
    let first = dir.join("libt0.so");
    let (src_s, first_s) = (src.to_str().unwrap(), first.to_str().unwrap());
    cc(&[
        "-shared",
        "-fPIC",
        "-fno-plt",
        "-O1",
        "-Wl,-z,now",
        "-o",
        first_s,
        src_s,
    ]);
    for i in 1..LIBS {
        // Copies: each path is loaded as its own module.
        std::fs::copy(&first, dir.join(format!("libt{i}.so"))).unwrap();
    }
    let drv = dir.join("driver.c");
    std::fs::write(&drv, DRIVER).unwrap();
    let exe = dir.join("driver");
    cc(&[
        &format!("-DNLIBS={LIBS}"),
        "-O1",
        "-o",
        exe.to_str().unwrap(),
        drv.to_str().unwrap(),
        "-ldl",
        "-lpthread",
    ]);
    let lib = capture_lib();
    let run = |mode: &str| {
        Command::new(&exe)
            .arg(&lib)
            .arg(&dir)
            .arg(mode)
            .output()
            .expect("driver")
    };
    let control: Vec<_> = (0..12).map(|_| run("plain")).collect();
    let crashed = control.iter().filter(|o| !o.status.success()).count();
    eprintln!("control (plain dl_iterate_phdr, DTV behind): {crashed} of 12 processes crashed");
    for i in 0..12 {
        let o = run("gpufl");
        assert!(
            o.status.success(),
            "process {i} walking through gpufl_test_walk_modules: {:?}\nstdout: {}\nstderr: {}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
