//! Integration tests for `gpufl_capture::symbolize`.
//!
//! A small C shared library is compiled at test time (needs `cc`), dlopen'ed, and
//! addresses with known source lines are resolved.

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use gpufl_capture::symbolize::{SymFrame, Symbolizer};

/// -O0 translation unit. Markers in comments let the test find line numbers.
/// The call is the last instruction of its line, so resolving the return
/// address itself (without the `- 1`) would land on the next line.
const SRC_O0: &str = r#"
void *gpufl_last_ra;
__attribute__((noinline)) void gpufl_record_ra(void) {
    gpufl_last_ra = __builtin_return_address(0);
}

void *gpufl_caller_o0(void) {
    gpufl_record_ra(); /* MARK_CALL_O0 */
    return gpufl_last_ra; /* MARK_AFTER_O0 */
}
"#;

/// -O2 translation unit with an always-inline helper.
const SRC_O2: &str = r#"
extern void *gpufl_last_ra;
void gpufl_record_ra(void);
volatile int gpufl_sink;

static inline __attribute__((always_inline)) void gpufl_inl_helper(void) {
    gpufl_record_ra(); /* MARK_CALL_INL */
    gpufl_sink++;
}

void *gpufl_outer_o2(void) {
    gpufl_inl_helper(); /* MARK_CALL_OUTER */
    gpufl_sink++;
    return gpufl_last_ra;
}
"#;

/// Library without DWARF: function names must come from the ELF symbol tables.
const SRC_NODEBUG: &str = r#"
static int gpufl_hidden_static(int x) { return x * 3 + 1; }
void *gpufl_hidden_addr(void) { return (void *)&gpufl_hidden_static; }
int gpufl_exported_nodbg(int x) { return gpufl_hidden_static(x) + 2; }
"#;

struct TestLib {
    dir: PathBuf,
    handle: usize,
}

fn line_of(src: &str, marker: &str) -> u32 {
    let idx = src
        .lines()
        .position(|l| l.contains(marker))
        .expect("marker present");
    u32::try_from(idx + 1).expect("small line number")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("spawn cc");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh, unique temp dir for this test process.
/// Stale dirs of dead test processes are removed first (the libraries stay
/// mapped for the life of the process, so a run cannot clean up after itself).
fn temp_dir(tag: &str) -> PathBuf {
    const PREFIX: &str = "gpufl-symbolize-";
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix(PREFIX)
                .and_then(|r| r.split('-').nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            if let Some(pid) = pid {
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
    let dir = std::env::temp_dir().join(format!(
        "{PREFIX}{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Compiles each `(file name, source, compile flags)` to an object, links them
/// into `dir/so_name` with `link_flags`, and dlopens the result.
fn build_lib(
    dir: &Path,
    so_name: &str,
    sources: &[(&str, &str, &[&str])],
    link_flags: &[&str],
) -> TestLib {
    let mut objs = Vec::new();
    for (name, src, flags) in sources {
        let c = dir.join(name);
        std::fs::write(&c, src).expect("write c");
        let obj = c.with_extension(format!("{so_name}.o"));
        run(Command::new("cc")
            .args(*flags)
            .args(["-fPIC", "-c"])
            .arg(&c)
            .arg("-o")
            .arg(&obj));
        objs.push(obj);
    }
    let so = dir.join(so_name);
    run(Command::new("cc")
        .arg("-shared")
        .args(link_flags)
        .args(&objs)
        .arg("-o")
        .arg(&so));
    let cpath = CString::new(so.to_str().expect("utf8 path")).expect("no NUL");
    // SAFETY: loading a library we just built; it has no constructors.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!handle.is_null(), "dlopen {so:?} failed");
    TestLib {
        dir: dir.to_path_buf(),
        handle: handle as usize,
    }
}

/// The library with DWARF (-O0 and -O2 units), built once per test process.
fn test_lib() -> &'static TestLib {
    static LIB: OnceLock<TestLib> = OnceLock::new();
    LIB.get_or_init(|| {
        build_lib(
            &temp_dir("dwarf"),
            "libgpufl_symtest.so",
            &[
                ("gpufl_sym_o0.c", SRC_O0, &["-g", "-O0"]),
                ("gpufl_sym_o2.c", SRC_O2, &["-g", "-O2"]),
            ],
            &[],
        )
    })
}

/// `(no DWARF but .symtab, stripped to .dynsym only)`.
fn nodebug_libs() -> &'static (TestLib, TestLib) {
    static LIBS: OnceLock<(TestLib, TestLib)> = OnceLock::new();
    LIBS.get_or_init(|| {
        let dir = temp_dir("nodebug");
        let src: &[(&str, &str, &[&str])] = &[("gpufl_nodbg.c", SRC_NODEBUG, &["-g0", "-O0"])];
        (
            build_lib(&dir, "libgpufl_symtab.so", src, &[]),
            build_lib(&dir, "libgpufl_dynsym.so", src, &["-s"]),
        )
    })
}

fn sym(handle: *mut c_void, name: &str) -> *mut c_void {
    let cname = CString::new(name).expect("no NUL");
    // SAFETY: valid handle and NUL-terminated name.
    let p = unsafe { libc::dlsym(handle, cname.as_ptr()) };
    assert!(!p.is_null(), "dlsym {name}");
    p
}

/// Calls a `void *f(void)` exported by the test library.
fn call(lib: &TestLib, name: &str) -> u64 {
    let f = sym(lib.handle as *mut c_void, name);
    // SAFETY: the symbol is a C function of type `void *(void)`.
    let f: extern "C" fn() -> *mut c_void = unsafe { std::mem::transmute(f) };
    f() as u64
}

fn file_name(f: &SymFrame) -> Option<&str> {
    f.file
        .as_deref()
        .and_then(|p| Path::new(p).file_name())
        .and_then(|n| n.to_str())
}

#[test]
fn resolves_function_file_and_line_in_dlopened_library() {
    let lib = test_lib();
    let ra = call(lib, "gpufl_caller_o0");
    let mut s = Symbolizer::new();
    let frames = s.resolve(ra, true);
    assert_eq!(frames.len(), 1, "{frames:#?}");
    let f = &frames[0];
    assert_eq!(f.function.as_deref(), Some("gpufl_caller_o0"), "{f:#?}");
    assert_eq!(file_name(f), Some("gpufl_sym_o0.c"), "{f:#?}");
    assert_eq!(f.line, Some(line_of(SRC_O0, "MARK_CALL_O0")), "{f:#?}");
    // Looked up as a plain address it is the first instruction of the next line.
    let plain = s.resolve(ra, false);
    assert_eq!(plain[0].line, Some(line_of(SRC_O0, "MARK_AFTER_O0")));
    assert_eq!(plain[0].module_offset, f.module_offset + 1);
    assert!(!f.inlined);
    assert!(f.module.ends_with("libgpufl_symtest.so"), "{f:#?}");
    assert!(Path::new(&f.module).starts_with(&lib.dir));

    // The module offset is the file-relative address: function start in the
    // symbol table + distance from it.
    let start = sym(lib.handle as *mut c_void, "gpufl_caller_o0") as u64;
    let start_frames = s.resolve(start, false);
    assert_eq!(start_frames[0].function.as_deref(), Some("gpufl_caller_o0"));
    assert_eq!(
        f.module_offset - start_frames[0].module_offset,
        ra - 1 - start
    );

    // Cached lookup returns the identical answer.
    assert_eq!(s.resolve(ra, true), frames);
}

#[test]
fn a_large_module_is_left_unloaded_until_the_deferral_ends() {
    use std::time::{Duration, Instant};
    let lib = test_lib();
    let ra = call(lib, "gpufl_caller_o0");
    let full = Symbolizer::new().resolve(ra, true);
    // The test library is small: under the usual bound it resolves at once.
    let mut s = Symbolizer::new();
    s.defer_large(Instant::now() + Duration::from_secs(3600));
    let (frames, last) = s.resolve_now(ra, true);
    assert!(last);
    assert_eq!(frames, full);
    // Every module with symbols counts as large: module and offset only, not kept.
    let mut s = Symbolizer::new();
    s.defer_over(Instant::now() + Duration::from_secs(3600), 0);
    for _ in 0..2 {
        let (frames, last) = s.resolve_now(ra, true);
        assert!(!last, "{frames:#?}");
        assert_eq!(frames.len(), 1, "{frames:#?}");
        assert_eq!(frames[0].function, None);
        assert_eq!(frames[0].module, full[0].module);
        assert_eq!(frames[0].module_offset, full[0].module_offset);
    }
    // Once the deferral has ended the same address resolves fully, and is kept.
    s.defer_over(Instant::now(), 0);
    let (frames, last) = s.resolve_now(ra, true);
    assert!(last);
    assert_eq!(frames, full);
    assert_eq!(frames[0].function.as_deref(), Some("gpufl_caller_o0"));
}

#[test]
fn expands_inlined_frames() {
    let ra = call(test_lib(), "gpufl_outer_o2");
    let mut s = Symbolizer::new();
    let frames = s.resolve(ra, true);
    assert!(frames.len() >= 2, "{frames:#?}");
    let inner = &frames[0];
    assert!(inner.inlined, "{frames:#?}");
    assert_eq!(inner.function.as_deref(), Some("gpufl_inl_helper"));
    assert_eq!(file_name(inner), Some("gpufl_sym_o2.c"));
    assert_eq!(inner.line, Some(line_of(SRC_O2, "MARK_CALL_INL")));
    let outer = frames.last().expect("non-empty");
    assert!(!outer.inlined, "{frames:#?}");
    assert_eq!(outer.function.as_deref(), Some("gpufl_outer_o2"));
    assert_eq!(outer.line, Some(line_of(SRC_O2, "MARK_CALL_OUTER")));
    assert_eq!(frames.iter().filter(|f| !f.inlined).count(), 1);
}

#[test]
fn falls_back_to_symbol_table_without_debug_info() {
    // dlsym gives the real address inside libc (not a PLT stub).
    let getpid = sym(libc::RTLD_DEFAULT, "getpid") as u64;
    let mut s = Symbolizer::new();
    for addr in [getpid, getpid + 2] {
        let frames = s.resolve(addr, false);
        let f = frames.last().expect("non-empty");
        assert!(f.module.contains("libc"), "{frames:#?}");
        let name = f.function.as_deref().unwrap_or("");
        assert!(name.contains("getpid"), "{frames:#?}");
    }
}

#[test]
fn symbol_table_fallback_symtab_and_dynsym() {
    let (symtab, dynsym) = nodebug_libs();
    let mut s = Symbolizer::new();

    // .symtab present: both the exported and the file-local function resolve.
    let hidden = call(symtab, "gpufl_hidden_addr");
    let frames = s.resolve(hidden + 1, false);
    assert_eq!(frames.len(), 1, "{frames:#?}");
    assert_eq!(frames[0].function.as_deref(), Some("gpufl_hidden_static"));
    assert_eq!(frames[0].file, None);
    assert_eq!(frames[0].line, None);
    assert!(frames[0].module.ends_with("libgpufl_symtab.so"));
    let exported = sym(symtab.handle as *mut c_void, "gpufl_exported_nodbg") as u64;
    let frames = s.resolve(exported + 4, true);
    assert_eq!(frames[0].function.as_deref(), Some("gpufl_exported_nodbg"));

    // Only .dynsym: exported functions resolve; the static one is covered by
    // no dynamic symbol, so it must not be misattributed to a neighbour.
    let exported = sym(dynsym.handle as *mut c_void, "gpufl_exported_nodbg") as u64;
    let frames = s.resolve(exported + 4, true);
    assert_eq!(frames[0].function.as_deref(), Some("gpufl_exported_nodbg"));
    assert!(frames[0].module.ends_with("libgpufl_dynsym.so"));
    let hidden = call(dynsym, "gpufl_hidden_addr");
    let frames = s.resolve(hidden + 1, false);
    assert_eq!(frames.len(), 1, "{frames:#?}");
    assert_eq!(frames[0].function, None, "{frames:#?}");
    assert!(frames[0].module.ends_with("libgpufl_dynsym.so"));
}

#[test]
fn finds_modules_dlopened_after_first_scan() {
    let mut s = Symbolizer::new();
    let unknown = s.resolve(0x20, false);
    assert_eq!(unknown[0].module, "?"); // the module list has been scanned now
    let late = build_lib(
        &temp_dir("late"),
        "libgpufl_late.so",
        &[("gpufl_late.c", SRC_NODEBUG, &["-g0", "-O0"])],
        &[],
    );
    let f = sym(late.handle as *mut c_void, "gpufl_exported_nodbg") as u64;
    let frames = s.resolve(f + 4, true);
    assert!(
        frames[0].module.ends_with("libgpufl_late.so"),
        "{frames:#?}"
    );
    assert_eq!(frames[0].function.as_deref(), Some("gpufl_exported_nodbg"));
}

#[inline(never)]
fn rust_marker_fn() -> u64 {
    std::hint::black_box(7)
}

#[test]
fn resolves_rust_function_in_main_executable() {
    let addr = rust_marker_fn as *const () as usize as u64;
    assert_eq!(rust_marker_fn(), 7);
    let mut s = Symbolizer::new();
    let frames = s.resolve(addr, false);
    let f = frames.last().expect("non-empty");
    // Demangled, without the `::h0123..` hash suffix.
    assert_eq!(
        f.function.as_deref(),
        Some("symbolize::rust_marker_fn"),
        "{frames:#?}"
    );
    assert_eq!(file_name(f), Some("symbolize.rs"), "{frames:#?}");
    let exe = std::fs::read_link("/proc/self/exe").expect("exe");
    assert_eq!(Path::new(&f.module), exe.as_path());
}

#[test]
fn unknown_address_gives_single_empty_frame() {
    let mut s = Symbolizer::new();
    for (addr, ret) in [(0x10, false), (0x10, true), (0, true), (u64::MAX, false)] {
        let frames = s.resolve(addr, ret);
        assert_eq!(frames.len(), 1, "{frames:#?}");
        assert_eq!(frames[0].module, "?");
        assert_eq!(frames[0].module_offset, addr);
        assert_eq!(frames[0].function, None);
        assert_eq!(frames[0].line, None);
    }
}

#[test]
fn many_distinct_addresses_are_fast_after_loading() {
    let lib = test_lib();
    let start = sym(lib.handle as *mut c_void, "gpufl_caller_o0") as u64;
    let libc_fn = sym(libc::RTLD_DEFAULT, "getpid") as u64;
    let mut s = Symbolizer::new();
    s.resolve(start, false);
    s.resolve(libc_fn, false);
    let t = std::time::Instant::now();
    let mut n = 0;
    for base in [start, libc_fn] {
        for off in 0..1000 {
            let frames = s.resolve(base + off, true);
            assert!(!frames.is_empty());
            n += 1;
        }
    }
    let per_sec = n as f64 / t.elapsed().as_secs_f64();
    assert!(per_sec > 1000.0, "only {per_sec:.0} lookups/s");
}
