//! The C ABI (`include/gpufl/gpufl.h`, wrapped by `gpufl.hpp`) and CUDA's injection entry point.
//! No function here lets a panic cross into C.

use crate::options::Options;
use crate::recorder::{self, InitError, StartedBy};
use std::ffi::{c_char, c_int, CStr};

/// Options as C passes them. `struct_size` lets the struct grow compatibly.
#[repr(C)]
pub struct GpuflOptions {
    /// sizeof(gpufl_options) as compiled by the caller.
    pub struct_size: u32,
    pub app_name: *const c_char,
    pub log_path: *const c_char,
    pub enable_synchronization: c_int,
    pub enable_stack_trace: c_int,
    pub backend_url: *const c_char,
    pub api_key: *const c_char,
    /// 0: default mode, 1: always-on. Read only when `struct_size` covers it (callers compiled
    /// against an older header pass a smaller struct).
    pub mode: c_int,
    /// Kernel detail (docs/kernel-detail.md): NULL off, "N" the top N kernels by
    /// GPU time, else comma-separated name fragments. Read only when `struct_size` covers it.
    pub kernel_detail: *const c_char,
}

/// Size of the struct before `mode` was added.
const OPTIONS_V1_SIZE: usize = std::mem::offset_of!(GpuflOptions, mode);

/// Result codes of `gpufl_init`.
pub const GPUFL_OK: c_int = 0;
pub const GPUFL_ALREADY_RUNNING: c_int = 1;
pub const GPUFL_DISABLED: c_int = 2;
pub const GPUFL_INTERNAL_ERROR: c_int = 3;

fn opt_str(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller passes NUL-terminated strings or NULL.
    let s = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    (!s.is_empty()).then_some(s)
}

/// Build [`Options`] from the C struct (NULL means all defaults).
fn options_from_c(o: *const GpuflOptions) -> Options {
    let mut opts = Options::default();
    if o.is_null() {
        return opts;
    }
    // SAFETY: non-null pointer to a caller-owned struct of at least struct_size bytes.
    let o = unsafe { &*o };
    if (o.struct_size as usize) < OPTIONS_V1_SIZE {
        return opts;
    }
    if let Some(s) = opt_str(o.app_name) {
        opts.app_name = s;
    }
    if let Some(s) = opt_str(o.log_path) {
        opts.log_path = s;
    }
    opts.enable_synchronization = o.enable_synchronization != 0;
    opts.enable_stack_trace = o.enable_stack_trace != 0;
    opts.backend_url = opt_str(o.backend_url).unwrap_or_default();
    opts.api_key = opt_str(o.api_key).unwrap_or_default();
    let covers = |end: usize| (o.struct_size as usize) >= end;
    if covers(std::mem::offset_of!(GpuflOptions, mode) + std::mem::size_of::<c_int>())
        && o.mode == 1
    {
        opts.mode = crate::options::Mode::AlwaysOn;
    }
    if covers(
        std::mem::offset_of!(GpuflOptions, kernel_detail) + std::mem::size_of::<*const c_char>(),
    ) {
        opts.kernel_detail = opt_str(o.kernel_detail);
    }
    opts
}

/// Start recording this process. Returns GPUFL_OK, GPUFL_ALREADY_RUNNING, GPUFL_DISABLED (capture
/// cannot run here; one line on stderr says why and the program runs on unchanged) or
/// GPUFL_INTERNAL_ERROR.
///
/// # Safety
/// `opts` is NULL or points at a valid `gpufl_options`.
#[no_mangle]
pub unsafe extern "C" fn gpufl_init(opts: *const GpuflOptions) -> c_int {
    std::panic::catch_unwind(|| {
        let opts = options_from_c(opts);
        crate::upload::remember_init(&opts);
        match recorder::start(opts, StartedBy::Api) {
            Ok(_) => GPUFL_OK,
            Err(InitError::AlreadyRunning(_)) => GPUFL_ALREADY_RUNNING,
            Err(InitError::Disabled(_)) => GPUFL_DISABLED,
        }
    })
    .unwrap_or(GPUFL_INTERNAL_ERROR)
}

/// Upload options as C passes them (`gpufl_upload_options`). `struct_size` lets the struct grow
/// compatibly: a field past the caller's `struct_size` is taken as not given.
#[repr(C)]
pub struct GpuflUploadOptions {
    /// sizeof(gpufl_upload_options) as compiled by the caller.
    pub struct_size: u32,
    /// Directory searched for sessions; NULL or "": `gpufl_init`'s log_path (GPUFL_LOG_PATH),
    /// else ./gpufl-sessions.
    pub log_path: *const c_char,
    /// NULL or "": `gpufl_init`'s backend_url (GPUFL_BACKEND_URL), else GPUFL_SERVER.
    pub backend_url: *const c_char,
    /// NULL or "": `gpufl_init`'s api_key (GPUFL_API_KEY).
    pub api_key: *const c_char,
}

/// Read the C upload options (NULL: nothing given).
fn upload_given_from_c(o: *const GpuflUploadOptions) -> crate::upload::Given {
    let mut g = crate::upload::Given::default();
    if o.is_null() {
        return g;
    }
    // SAFETY: non-null pointer to a caller-owned struct of at least struct_size bytes.
    let o = unsafe { &*o };
    let covers =
        |off: usize| (o.struct_size as usize) >= off + std::mem::size_of::<*const c_char>();
    if covers(std::mem::offset_of!(GpuflUploadOptions, log_path)) {
        g.log_path = opt_str(o.log_path);
    }
    if covers(std::mem::offset_of!(GpuflUploadOptions, backend_url)) {
        g.backend_url = opt_str(o.backend_url);
    }
    if covers(std::mem::offset_of!(GpuflUploadOptions, api_key)) {
        g.api_key = opt_str(o.api_key);
    }
    g
}

/// Upload the sessions under the log directory to a gpufl server (crate `gpufl-upload`, as
/// `gpufl upload` does; see [`crate::upload`]): every session found there, not only this
/// process's (the server stores each once). Meant for after `gpufl_shutdown`; called while
/// recording, it sends what is closed and a later call sends the rest. Never touches CUDA.
///
/// Returns the number of sessions that failed (0: all stored), or below 0 before any upload:
/// -1 no server or key configured, -2 an unusable server address, -3 no session under the log
/// directory (or it cannot be read), -4 an internal error. Prints one line per session on stderr,
/// prefixed `gpufl: ` (failures only with GPUFL_QUIET=1).
///
/// # Safety
/// `opts` is NULL or points at a valid `gpufl_upload_options`.
#[no_mangle]
pub unsafe extern "C" fn gpufl_upload_logs(opts: *const GpuflUploadOptions) -> c_int {
    std::panic::catch_unwind(|| {
        let given = upload_given_from_c(opts);
        crate::upload::upload_logs(&given)
    })
    .unwrap_or(crate::upload::INTERNAL_ERROR)
}

/// Stop recording: flush everything and close the session. Safe to call twice or without init.
#[no_mangle]
pub extern "C" fn gpufl_shutdown() {
    let _ = std::panic::catch_unwind(|| {
        recorder::stop("shutdown");
    });
}

/// Pause recording: nothing is collected until `gpufl_resume`, and the session marks the paused
/// interval. Returns GPUFL_OK, or GPUFL_DISABLED when this process is not recording.
#[no_mangle]
pub extern "C" fn gpufl_pause() -> c_int {
    std::panic::catch_unwind(|| {
        if recorder::set_recording(false) {
            GPUFL_OK
        } else {
            GPUFL_DISABLED
        }
    })
    .unwrap_or(GPUFL_INTERNAL_ERROR)
}

/// Resume recording after `gpufl_pause`. Returns GPUFL_OK, or GPUFL_DISABLED when this process is
/// not recording.
#[no_mangle]
pub extern "C" fn gpufl_resume() -> c_int {
    std::panic::catch_unwind(|| {
        if recorder::set_recording(true) {
            GPUFL_OK
        } else {
            GPUFL_DISABLED
        }
    })
    .unwrap_or(GPUFL_INTERNAL_ERROR)
}

/// In always-on mode, record everything the default mode records for the next `seconds` (a
/// full-detail window; 10 when `seconds` <= 0 or not finite; at most 3600). Returns GPUFL_OK, or
/// GPUFL_DISABLED when this process is not recording in always-on mode (the default mode records
/// everything already).
#[no_mangle]
pub extern "C" fn gpufl_capture_window(seconds: f64) -> c_int {
    std::panic::catch_unwind(|| {
        if crate::always_on::request_window(seconds, crate::always_on::Reason::Api) {
            GPUFL_OK
        } else {
            GPUFL_DISABLED
        }
    })
    .unwrap_or(GPUFL_INTERNAL_ERROR)
}

/// Open a named scope on the calling thread (closed by `gpufl_scope_pop`). Scopes nest per thread;
/// the name is copied (once per thread and distinct name). NULL is taken as "". Does nothing when
/// this process is not recording.
///
/// # Safety
/// `name` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn gpufl_scope_push(name: *const c_char) {
    let _ = std::panic::catch_unwind(|| {
        let bytes: &[u8] = if name.is_null() {
            b""
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            unsafe { CStr::from_ptr(name) }.to_bytes()
        };
        crate::scopes::push(bytes, gpufl_trace::ScopeSource::Api);
    });
}

/// Close the calling thread's innermost scope. A pop with no open scope is counted and reported
/// as a warning in the session; it never fails.
#[no_mangle]
pub extern "C" fn gpufl_scope_pop() {
    let _ = std::panic::catch_unwind(|| {
        crate::scopes::pop(gpufl_trace::ScopeSource::Api);
    });
}

/// Copy the session directory into `buf` (NUL-terminated). Returns its length, 0 if not recording,
/// or -(needed size) if `buf` is too small.
///
/// # Safety
/// `buf` points at `len` writable bytes (or is NULL with len 0).
#[no_mangle]
pub unsafe extern "C" fn gpufl_session_dir(buf: *mut c_char, len: usize) -> isize {
    std::panic::catch_unwind(|| {
        let dir = match recorder::get() {
            Some(r) => &r.session_dir,
            None => match crate::scopes::standalone_dir() {
                Some(d) => d,
                None => return 0,
            },
        };
        let s = dir.display().to_string();
        // SAFETY: forwarded from the caller.
        unsafe { copy_out(&s, buf, len) }
    })
    .unwrap_or(-1)
}

/// Copy `s` into a C buffer. Returns bytes written (without NUL) or -(needed).
///
/// # Safety
/// `buf` points at `len` writable bytes (or is NULL with len 0).
pub unsafe fn copy_out(s: &str, buf: *mut c_char, len: usize) -> isize {
    let needed = s.len() + 1;
    if buf.is_null() || len < needed {
        return -(needed as isize);
    }
    // SAFETY: len >= needed bytes are writable.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr() as *const c_char, buf, s.len());
        *buf.add(s.len()) = 0;
    }
    s.len() as isize
}

/// CUDA's injection entry point: the driver calls it during cuInit when `CUDA_INJECTION64_PATH`
/// names this library (that is how `gpufl record` works). Options come from `GPUFL_*` variables.
/// Returns 1 ("success" for the driver) even when capture cannot run: the program must go on.
#[no_mangle]
pub extern "C" fn InitializeInjection() -> c_int {
    let _ = std::panic::catch_unwind(|| {
        // Under `gpufl record` stacks are on unless the user turned them off.
        let opts = Options {
            enable_stack_trace: true,
            ..Options::default()
        };
        let _ = recorder::start(opts, StartedBy::Injection);
    });
    1
}

/// Test entry point: capture "the stack here" through the same code as a synchronization callback
/// (native unwind + Python frames, merged), symbolize it, and write it as a JSON array of
/// `{"kind","function","file","line","module"}` into `buf`. Returns bytes written, or -(needed).
///
/// # Safety
/// `buf` points at `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gpufl_test_capture_stack_json(buf: *mut c_char, len: usize) -> isize {
    std::panic::catch_unwind(|| {
        let json = crate::stack::capture_here_json();
        // SAFETY: forwarded from the caller.
        unsafe { copy_out(&json, buf, len) }
    })
    .unwrap_or(-1)
}

/// Test entry point: capture on a new native thread that runs no Python, through the same code as
/// a CUDA callback on such a thread (cross-thread Python attribution), and write
/// `{"via_tid", "frames": [...], "cost_ns"}` into `buf`. The caller's thread waits (a ctypes call
/// releases the GIL, as `loss.backward()` does while the autograd thread launches). Returns bytes
/// written, or -(needed).
///
/// # Safety
/// `buf` points at `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gpufl_test_capture_on_native_thread(
    buf: *mut c_char,
    len: usize,
) -> isize {
    std::panic::catch_unwind(|| {
        let json = crate::stack::capture_on_native_thread_json();
        // SAFETY: forwarded from the caller.
        unsafe { copy_out(&json, buf, len) }
    })
    .unwrap_or(-1)
}

/// Test entry point: as [`gpufl_test_capture_on_native_thread`], on one native thread kept from
/// call to call (what it keeps between captures is exercised).
///
/// # Safety
/// `buf` points at `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gpufl_test_capture_on_persistent_native_thread(
    buf: *mut c_char,
    len: usize,
) -> isize {
    std::panic::catch_unwind(|| {
        let json = crate::stack::capture_on_persistent_native_thread_json();
        // SAFETY: forwarded from the caller.
        unsafe { copy_out(&json, buf, len) }
    })
    .unwrap_or(-1)
}

/// Benchmark entry point: mean ns of one `process_vm_readv` of `iovecs` pieces (1..=32) of this
/// process's memory, over `iters` calls (-1: refused).
#[no_mangle]
pub extern "C" fn gpufl_test_readv_cost(iovecs: u32, iters: u32) -> f64 {
    std::panic::catch_unwind(|| crate::pyframes::xthread::readv_cost(iovecs as usize, iters))
        .unwrap_or(-1.0)
}

/// Test entry point: the cross-thread counters (kept only with `GPUFL_DEBUG_COST=1`) into `out`
/// (`n` of them at most: main thread directly, full looks, unchanged by a read, walked,
/// unchanged without a system call); returns how many were written.
///
/// # Safety
/// `out` points at `n` writable u64.
#[no_mangle]
pub unsafe extern "C" fn gpufl_test_xthread_stats(out: *mut u64, n: usize) -> usize {
    let stats = crate::pyframes::xthread::stats();
    let k = n.min(stats.len());
    if out.is_null() {
        return 0;
    }
    for (i, a) in stats.iter().take(k).enumerate() {
        // SAFETY: i < k ≤ n, within the caller's buffer.
        unsafe { *out.add(i) = a.load(std::sync::atomic::Ordering::Relaxed) };
    }
    k
}

/// Test/benchmark entry point: on one new native thread (no Python), a cold capture and then
/// `iters` warm ones through the callback's capture code; writes [cold ns, mean warm ns, via_tid]
/// into `out` (3 doubles). The caller waits in C with the GIL released.
///
/// # Safety
/// `out` points at 3 writable doubles.
#[no_mangle]
pub unsafe extern "C" fn gpufl_test_cross_thread_cost(iters: u32, out: *mut f64) -> c_int {
    std::panic::catch_unwind(|| {
        if out.is_null() {
            return -1;
        }
        let r = crate::stack::cross_thread_cost(iters);
        // SAFETY: forwarded from the caller.
        unsafe { std::ptr::copy_nonoverlapping(r.as_ptr(), out, 3) };
        0
    })
    .unwrap_or(-1)
}

/// Test entry point: run the host sampler for `ms` milliseconds at `hz` samples a second (no
/// recorder, no GPU needed) and write its samples as JSON (`hostsampler::test_samples_json`) into
/// `buf`. The caller's thread waits in C (a ctypes call releases the GIL). Returns bytes written,
/// or -(needed).
///
/// # Safety
/// `buf` points at `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn gpufl_test_host_samples(
    hz: u32,
    ms: u32,
    buf: *mut c_char,
    len: usize,
) -> isize {
    std::panic::catch_unwind(|| {
        let json = crate::hostsampler::test_samples_json(hz, ms);
        // SAFETY: forwarded from the caller.
        unsafe { copy_out(&json, buf, len) }
    })
    .unwrap_or(-1)
}

/// Test entry point: mark the calling thread as entering (`enter` ≠ 0) or leaving the CUDA call of
/// CUPTI `domain` / `cbid`, as the recorder's callbacks do ([`crate::callmark`]); returns 1 when
/// the call is (or closes) the thread's outermost.
#[no_mangle]
pub extern "C" fn gpufl_test_callmark(enter: c_int, domain: u32, cbid: u32) -> c_int {
    std::panic::catch_unwind(|| {
        let outer = if enter != 0 {
            crate::callmark::enter(domain, cbid, crate::sites::epoch())
        } else {
            crate::callmark::exit(domain, cbid)
        };
        c_int::from(outer)
    })
    .unwrap_or(-1)
}

/// Test entry point: walk the loaded modules as the recorder does ([`crate::dl::iterate_phdr`])
/// and return how many there are. A test calls it from a thread that walks while another thread
/// `dlopen`s libraries with TLS (crates/gpufl-cli/tests/loader_race.rs).
#[no_mangle]
pub extern "C" fn gpufl_test_walk_modules() -> i64 {
    unsafe extern "C" fn count(
        _info: *mut libc::dl_phdr_info,
        _size: usize,
        n: *mut std::ffi::c_void,
    ) -> c_int {
        // SAFETY: `n` is the i64 below, alive for the walk.
        if let Some(n) = unsafe { n.cast::<i64>().as_mut() } {
            *n += 1;
        }
        0
    }
    let mut n: i64 = 0;
    // SAFETY: `count` only writes the counter passed with it.
    unsafe { crate::dl::iterate_phdr(count, (&mut n as *mut i64).cast()) };
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Callers compiled against an older header pass a smaller struct: the fields past its
    /// `struct_size` are never read.
    #[test]
    fn options_are_read_up_to_the_callers_struct_size() {
        let app = c"app";
        let kd = c"divergent";
        let full = |size: usize| GpuflOptions {
            struct_size: size as u32,
            app_name: app.as_ptr(),
            log_path: std::ptr::null(),
            enable_synchronization: 1,
            enable_stack_trace: 1,
            backend_url: std::ptr::null(),
            api_key: std::ptr::null(),
            mode: 1,
            kernel_detail: kd.as_ptr(),
        };
        let read = |size: usize| options_from_c(&full(size));
        let v1 = std::mem::offset_of!(GpuflOptions, mode);
        let v2 = v1 + std::mem::size_of::<c_int>();
        let v3 = std::mem::size_of::<GpuflOptions>();
        let o = read(v1);
        assert_eq!(o.app_name, "app");
        assert_eq!(
            (o.mode, o.kernel_detail.as_deref()),
            (crate::options::Mode::Default, None)
        );
        let o = read(v2);
        assert_eq!(
            (o.mode, o.kernel_detail.as_deref()),
            (crate::options::Mode::AlwaysOn, None)
        );
        let o = read(v3);
        assert_eq!(o.kernel_detail.as_deref(), Some("divergent"));
        assert_eq!(read(v1 - 1).app_name, Options::default().app_name);
    }

    /// Upload options past the caller's `struct_size` are not read; NULL and "" are not given.
    #[test]
    fn upload_options_are_read_up_to_the_callers_struct_size() {
        let (dir, url, key) = (c"logs", c"http://h", c"");
        let o = |size: usize| GpuflUploadOptions {
            struct_size: size as u32,
            log_path: dir.as_ptr(),
            backend_url: url.as_ptr(),
            api_key: key.as_ptr(),
        };
        let g = upload_given_from_c(&o(std::mem::size_of::<GpuflUploadOptions>()));
        assert_eq!(
            (g.log_path.as_deref(), g.backend_url.as_deref(), g.api_key),
            (Some("logs"), Some("http://h"), None)
        );
        let g = upload_given_from_c(&o(std::mem::offset_of!(GpuflUploadOptions, api_key)));
        assert_eq!(g.backend_url.as_deref(), Some("http://h"));
        let g = upload_given_from_c(&o(std::mem::offset_of!(GpuflUploadOptions, backend_url)));
        assert_eq!((g.log_path.as_deref(), g.backend_url), (Some("logs"), None));
        assert_eq!(upload_given_from_c(&o(4)), crate::upload::Given::default());
        assert_eq!(
            upload_given_from_c(std::ptr::null()),
            crate::upload::Given::default()
        );
    }

    #[test]
    fn pause_and_resume_without_a_recorder_say_disabled() {
        // This test binary never starts a recorder (no CUPTI here).
        assert!(recorder::get().is_none());
        assert_eq!(gpufl_pause(), GPUFL_DISABLED);
        assert_eq!(gpufl_resume(), GPUFL_DISABLED);
        assert!(!recorder::is_paused());
    }
}
