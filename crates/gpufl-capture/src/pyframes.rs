//! Python stack capture for the current thread, without the GIL.
//!
//! The recorder runs inside a CUDA callback on the thread that called e.g.
//! `cudaStreamSynchronize`; that thread usually released the GIL around the
//! sync, so we must not take it (a multi-threaded program could deadlock) and
//! must not call interpreter APIs that allocate. Instead we read CPython's own
//! structures for *this* thread: they cannot change while this thread is
//! blocked in our callback, because only the owning thread pushes/pops frames.
//!
//! Supported: CPython 3.11 and 3.12 (x86-64, default non-debug build). The
//! runtime is located in-process with `dlsym` (`Py_Version`,
//! `PyGILState_GetThisThreadState`, `Py_IsInitialized`, and the type objects
//! `PyCode_Type` / `PyUnicode_Type` / `PyBytes_Type` used to validate every
//! object before trusting it). 3.13+ changed the frame layout (`f_executable`,
//! `instr_ptr`, no `_PyCFrame`) and is reported as unsupported.
//!
//! Line numbers: we decode `co_linetable` ourselves (format: CPython
//! `Objects/locations.md`, identical in 3.11 and 3.12, mirroring
//! `Objects/codeobject.c: advance()/get_line_delta()`), rather than calling
//! `PyCode_Addr2Line`, so that nothing here ever executes interpreter code.
//! This only happens in [`resolve`], not in the hot path.
//!
//! Every offset below was checked against the real headers: 3.11 by compiling
//! `offsetof()` against the 3.11.7 headers; 3.12 against the 3.12 headers and
//! empirically on a 3.12.3 interpreter (python/tests/test_pyframes.py runs the
//! end-to-end checks on whatever interpreter executes it).

use std::ffi::{c_char, c_int, c_ulong, c_void, CStr};
use std::sync::OnceLock;

pub mod xthread;
pub use xthread::unavailable_reason as cross_thread_unavailable;
pub use xthread::{capture_other_thread, capture_other_thread_with, Resolver};
pub use xthread::{choose, is_idle_wait_file, rank_key, Candidate};

/// A reader of this process's memory: direct loads for the calling thread's own frames, or
/// fault-tolerant reads (`xthread::SafeMem`) for another thread's.
pub(crate) trait Mem {
    /// Copy `buf.len()` bytes from `addr`; false if they could not be read.
    fn read_into(&self, addr: usize, buf: &mut [u8]) -> bool;

    /// A plain integer at `addr`.
    fn get<T: Copy + Default>(&self, addr: usize) -> Option<T> {
        let mut v = T::default();
        // SAFETY: `v` is a plain integer (Copy + Default, no invalid bit patterns among the types
        // used here: integers and usize); we overwrite exactly its bytes.
        let b = unsafe {
            std::slice::from_raw_parts_mut(&mut v as *mut T as *mut u8, std::mem::size_of::<T>())
        };
        self.read_into(addr, b).then_some(v)
    }
}

/// Direct loads: only for the calling thread's own, live frames and the objects they reference
/// (the contract of [`resolve`]).
struct Direct;

impl Mem for Direct {
    fn read_into(&self, addr: usize, buf: &mut [u8]) -> bool {
        if addr < 4096 {
            return false;
        }
        // SAFETY: per the contract of the callers, `addr..addr+len` lies in a live object.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, buf.as_mut_ptr(), buf.len()) };
        true
    }
}

/// One captured Python frame: the code object address and the byte offset of
/// the current instruction inside `co_code_adaptive`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PyFrameRaw {
    pub code: usize,
    pub instr_offset: i32,
}

/// A resolved Python frame. `line` is 0 when the instruction has no location.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PyFrameInfo {
    pub file: String,
    pub function: String,
    pub line: u32,
    pub first_line: u32,
}

/// Upper bound on frames walked (including skipped shim frames) per capture.
const MAX_WALK: usize = 1024;
/// Upper bound on code points copied out of one `str`.
const MAX_STR: usize = 4096;
/// Upper bound on the size of a line table we are willing to scan.
const MAX_LINETABLE: usize = 1 << 24;

// Offsets common to 3.11 and 3.12 (Include/object.h, Include/cpython/*.h).
/// `PyObject.ob_type` (after `ob_refcnt`).
const OB_TYPE: usize = 8;
/// `PyVarObject.ob_size`; for a code object it is the number of `_Py_CODEUNIT`s
/// (`_PyCode_NBYTES(co) == Py_SIZE(co) * sizeof(_Py_CODEUNIT)`).
const OB_SIZE: usize = 16;
/// `PyASCIIObject.length` (code points).
const STR_LENGTH: usize = 16;
/// `PyASCIIObject.state` (bitfield: interned:2, kind:3, compact:1, ascii:1, ...).
const STR_STATE: usize = 32;
/// `PyBytesObject.ob_sval` (after `PyObject_VAR_HEAD` and `ob_shash`).
const BYTES_SVAL: usize = 32;
/// `_Py_CODEUNIT` size in bytes.
const CODEUNIT: isize = 2;

/// Version-specific offsets (x86-64, non-debug builds).
#[derive(Debug)]
struct Layout {
    ts_cframe: usize,         // PyThreadState.cframe (_PyCFrame *)
    cframe_current: usize,    // _PyCFrame.current_frame (_PyInterpreterFrame *)
    fr_code: usize,           // _PyInterpreterFrame.f_code
    fr_previous: usize,       // _PyInterpreterFrame.previous
    fr_prev_instr: usize,     // _PyInterpreterFrame.prev_instr (_Py_CODEUNIT *)
    fr_owner: usize,          // _PyInterpreterFrame.owner (char, enum _frameowner)
    owner_max: u8,            // largest valid enum _frameowner value
    owner_cstack: Option<u8>, // FRAME_OWNED_BY_CSTACK (3.12 entry shim), if any
    co_firstlineno: usize,    // PyCodeObject.co_firstlineno (int)
    co_filename: usize,       // PyCodeObject.co_filename (str)
    co_name: usize,           // PyCodeObject.co_name (str)
    co_qualname: usize,       // PyCodeObject.co_qualname (str)
    co_linetable: usize,      // PyCodeObject.co_linetable (bytes)
    co_code_adaptive: usize,  // PyCodeObject.co_code_adaptive == _PyCode_CODE(co)
    ascii_size: usize,        // sizeof(PyASCIIObject): compact ASCII data follows
    compact_size: usize,      // sizeof(PyCompactUnicodeObject): UCS1/2/4 data follows
    // Cross-thread attribution (see `capture_other_thread`).
    ts_next: usize,             // PyThreadState.next
    ts_status: Option<usize>,   // PyThreadState._status (3.12: bitfield, `active` = bit 4)
    ts_thread_id: usize,        // PyThreadState.thread_id (pthread_t)
    ts_native_thread_id: usize, // PyThreadState.native_thread_id (gettid())
    interp_threads_head: usize, // PyInterpreterState.threads.head
    rt_main_thread: usize,      // _PyRuntimeState.main_thread (pthread_t)
    ts_datastack_chunk: usize,  // PyThreadState.datastack_chunk (_PyStackChunk *)
}

/// CPython 3.11 (Include/cpython/pystate.h, Include/internal/pycore_frame.h,
/// Include/cpython/code.h, Include/cpython/unicodeobject.h).
const LAYOUT_311: Layout = Layout {
    // struct _ts { prev, next, interp; int _initialized, _static,
    //   recursion_remaining, recursion_limit, recursion_headroom, tracing,
    //   tracing_what; _PyCFrame *cframe; ... }
    ts_cframe: 56,
    // struct _PyCFrame { uint8_t use_tracing; _PyInterpreterFrame *current_frame; ... }
    cframe_current: 8,
    // struct _PyInterpreterFrame { f_func, f_globals, f_builtins, f_locals,
    //   f_code@32, frame_obj@40, previous@48, prev_instr@56, int stacktop@64,
    //   bool is_entry@68, char owner@69, localsplus[] }
    fr_code: 32,
    fr_previous: 48,
    fr_prev_instr: 56,
    fr_owner: 69,
    // THREAD=0, GENERATOR=1, FRAME_OBJECT=2. No shim frames in 3.11: an entry
    // frame (is_entry) is a real Python frame whose `previous` links to the
    // caller's frame in the enclosing _PyEval_EvalFrameDefault, so we simply
    // keep following `previous` across is_entry boundaries.
    owner_max: 2,
    owner_cstack: None,
    // _PyCode_DEF: VAR_HEAD(24) co_consts@24 co_names@32 co_exceptiontable@40
    //   int co_flags@48, short co_warmup@52, short _co_linearray_entry_size@54,
    //   co_argcount@56 .. co_stacksize@68, co_firstlineno@72, ...,
    //   co_localsplusnames@96, co_localspluskinds@104, co_filename@112,
    //   co_name@120, co_qualname@128, co_linetable@136, co_weakreflist@144,
    //   _co_code@152, _co_linearray@160, _co_firsttraceable@168, co_extra@176,
    //   co_code_adaptive@184
    co_firstlineno: 72,
    co_filename: 112,
    co_name: 120,
    co_qualname: 128,
    co_linetable: 136,
    co_code_adaptive: 184,
    // PyASCIIObject { HEAD(16), length, hash, state(4, padded), wchar_t *wstr } = 48
    // PyCompactUnicodeObject { _base, utf8_length, utf8, wstr_length } = 72
    ascii_size: 48,
    compact_size: 72,
    // Checked with offsetof() against the 3.11.7 headers (scripts/probe/pyoffsets.c).
    ts_next: 8,
    ts_status: None,
    ts_thread_id: 152,
    ts_native_thread_id: 160,
    interp_threads_head: 16,
    rt_main_thread: 80,
    // scripts/probe/pyoffsets.c against the 3.11.2 headers.
    ts_datastack_chunk: 296,
};

/// CPython 3.12 (same headers as 3.11).
const LAYOUT_312: Layout = Layout {
    // struct _ts { prev, next, interp; _status(4 bytes bitfield)@24;
    //   int py_recursion_remaining@28, py_recursion_limit@32,
    //   c_recursion_remaining@36, recursion_headroom@40, tracing@44,
    //   what_event@48; _PyCFrame *cframe@56; ... }
    ts_cframe: 56,
    // struct _PyCFrame { _PyInterpreterFrame *current_frame; _PyCFrame *previous; }
    cframe_current: 0,
    // struct _PyInterpreterFrame { f_code@0, previous@8, f_funcobj@16,
    //   f_globals@24, f_builtins@32, f_locals@40, frame_obj@48, prev_instr@56,
    //   int stacktop@64, uint16_t return_offset@68, char owner@70, localsplus[] }
    fr_code: 0,
    fr_previous: 8,
    fr_prev_instr: 56,
    fr_owner: 70,
    // THREAD=0, GENERATOR=1, FRAME_OBJECT=2, CSTACK=3 (the entry shim that
    // _PyEval_EvalFrameDefault pushes; its f_code is the interpreter trampoline).
    owner_max: 3,
    owner_cstack: Some(3),
    // _PyCode_DEF: VAR_HEAD(24) co_consts@24 co_names@32 co_exceptiontable@40
    //   int co_flags@48, co_argcount@52, co_posonlyargcount@56,
    //   co_kwonlyargcount@60, co_stacksize@64, co_firstlineno@68,
    //   co_nlocalsplus@72, co_framesize@76, co_nlocals@80, co_ncellvars@84,
    //   co_nfreevars@88, uint32_t co_version@92, co_localsplusnames@96,
    //   co_localspluskinds@104, co_filename@112, co_name@120, co_qualname@128,
    //   co_linetable@136, co_weakreflist@144, _co_cached@152,
    //   _co_instrumentation_version@160, _co_monitoring@168,
    //   _co_firsttraceable@176, co_extra@184, co_code_adaptive@192
    co_firstlineno: 68,
    co_filename: 112,
    co_name: 120,
    co_qualname: 128,
    co_linetable: 136,
    co_code_adaptive: 192,
    // PyASCIIObject { HEAD(16), length, hash, state(4, padded) } = 40 (no wstr)
    // PyCompactUnicodeObject { _base, utf8_length, utf8 } = 56
    ascii_size: 40,
    compact_size: 56,
    // Checked with offsetof() against the 3.12.1 headers and the device's 3.12.3 ones
    // (scripts/probe/pyoffsets.c): `_status.active` is bit 4 of its first byte.
    ts_next: 8,
    ts_status: Some(24),
    ts_thread_id: 136,
    ts_native_thread_id: 144,
    interp_threads_head: 72,
    rt_main_thread: 64,
    // scripts/probe/pyoffsets.c against the device's 3.12.3 headers.
    ts_datastack_chunk: 232,
};

type GetTstateFn = unsafe extern "C" fn() -> *mut c_void;
type IsInitializedFn = unsafe extern "C" fn() -> c_int;

struct Runtime {
    version: (u8, u8),
    layout: &'static Layout,
    get_tstate: GetTstateFn,
    is_initialized: IsInitializedFn,
    code_type: usize,
    unicode_type: usize,
    bytes_type: usize,
    /// `PyInterpreterState_Head` (a load of `_PyRuntime.interpreters.head`, no lock).
    interp_head: Option<GetTstateFn>,
    /// 3.11 only: `_PyThreadState_UncheckedGet`, which in 3.11 loads the global
    /// `_PyRuntime.gilstate.tstate_current` (the thread state holding the GIL).
    gil_holder: Option<GetTstateFn>,
    /// Address of `_PyRuntime`.
    py_runtime: usize,
    /// `_Py_IsFinalizing` (a load of `_PyRuntime._finalizing`), when exported.
    is_finalizing: Option<IsInitializedFn>,
}

static RUNTIME: OnceLock<Result<Runtime, &'static str>> = OnceLock::new();

fn runtime() -> Result<&'static Runtime, &'static str> {
    RUNTIME.get_or_init(detect).as_ref().map_err(|e| *e)
}

/// Detect the interpreter in-process once (cached); None if absent/unsupported.
/// Returns e.g. (3, 12).
pub fn python_version() -> Option<(u8, u8)> {
    runtime().ok().map(|r| r.version)
}

/// Why python frames are unavailable (for a one-time log line).
pub fn unavailable_reason() -> Option<&'static str> {
    runtime().err()
}

/// Look `name` up in `handle`; null if absent.
fn sym(handle: *mut c_void, name: &CStr) -> *mut c_void {
    // SAFETY: dlsym only reads the NUL-terminated name and the loader's tables.
    unsafe { libc::dlsym(handle, name.as_ptr()) }
}

/// Find the handle that exports the CPython API: the global scope first (the
/// `python` executable or a libpython it links), then an already-loaded
/// libpython opened RTLD_LOCAL by an embedder (RTLD_NOLOAD never loads).
fn find_python_handle() -> Option<*mut c_void> {
    if !sym(libc::RTLD_DEFAULT, c"Py_IsInitialized").is_null() {
        return Some(libc::RTLD_DEFAULT);
    }
    let names: [&CStr; 4] = [
        c"libpython3.12.so.1.0",
        c"libpython3.11.so.1.0",
        c"libpython3.13.so.1.0",
        c"libpython3.so",
    ];
    for name in names {
        // SAFETY: RTLD_NOLOAD only returns a handle to an already-loaded object.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY) };
        if !h.is_null() && !sym(h, c"Py_IsInitialized").is_null() {
            return Some(h);
        }
    }
    None
}

fn detect() -> Result<Runtime, &'static str> {
    let h = find_python_handle().ok_or("no Python runtime in process")?;
    let ver = sym(h, c"Py_Version");
    if ver.is_null() {
        return Err("Python older than 3.11 not supported (no Py_Version)");
    }
    // SAFETY: Py_Version is `const unsigned long Py_Version = PY_VERSION_HEX`.
    let hex = unsafe { *(ver as *const c_ulong) };
    let version = ((hex >> 24) as u8, (hex >> 16) as u8);
    let layout = match version {
        (3, 11) => &LAYOUT_311,
        (3, 12) => &LAYOUT_312,
        (maj, min) => {
            let msg = format!("Python {maj}.{min} not supported");
            return Err(Box::leak(msg.into_boxed_str()));
        }
    };
    let get = sym(h, c"PyGILState_GetThisThreadState");
    let init = sym(h, c"Py_IsInitialized");
    let code_type = sym(h, c"PyCode_Type") as usize;
    let unicode_type = sym(h, c"PyUnicode_Type") as usize;
    let bytes_type = sym(h, c"PyBytes_Type") as usize;
    if get.is_null() || init.is_null() || code_type == 0 || unicode_type == 0 || bytes_type == 0 {
        return Err("Python runtime is missing required symbols");
    }
    // SAFETY: both symbols are C functions with exactly these signatures:
    // `PyThreadState *PyGILState_GetThisThreadState(void)` and
    // `int Py_IsInitialized(void)`; neither needs the GIL (a TLS read and a
    // load of `_PyRuntime.initialized`).
    let (get_tstate, is_initialized) = unsafe {
        (
            std::mem::transmute::<*mut c_void, GetTstateFn>(get),
            std::mem::transmute::<*mut c_void, IsInitializedFn>(init),
        )
    };
    let fnp = |name: &CStr| {
        let p = sym(h, name);
        // SAFETY: both names are `PyThreadState *f(void)` / `PyInterpreterState *f(void)`
        // functions of the CPython API that only load a global.
        (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, GetTstateFn>(p) })
    };
    let interp_head = fnp(c"PyInterpreterState_Head");
    let gil_holder = if version == (3, 11) {
        fnp(c"_PyThreadState_UncheckedGet")
    } else {
        None
    };
    Ok(Runtime {
        version,
        layout,
        get_tstate,
        is_initialized,
        code_type,
        unicode_type,
        bytes_type,
        interp_head,
        gil_holder,
        py_runtime: sym(h, c"_PyRuntime") as usize,
        is_finalizing: {
            let p = sym(h, c"_Py_IsFinalizing");
            // SAFETY: `int _Py_IsFinalizing(void)` of CPython 3.11/3.12: a load of a global.
            (!p.is_null())
                .then(|| unsafe { std::mem::transmute::<*mut c_void, IsInitializedFn>(p) })
        },
    })
}

/// A pointer we are willing to dereference: non-null, 8-aligned, not in the
/// zero page, and in the canonical user half of the x86-64 address space.
#[inline]
fn plausible(p: usize) -> bool {
    p >= 4096 && p & 7 == 0 && p < 0x0000_8000_0000_0000
}

/// Read a `T` at `base + off`.
/// SAFETY: `base` passed `plausible()` and is a live CPython object or frame of
/// the current thread, and `off` lies within it (suitably aligned for `T`).
#[inline]
unsafe fn rd<T: Copy>(base: usize, off: usize) -> T {
    std::ptr::read((base + off) as *const T)
}

/// `obj` is a plausible pointer to an object whose exact type is `ty`.
/// SAFETY: `obj`, if plausible, must point to readable memory of >= 16 bytes
/// (true for any PyObject and any frame/code pointer we got from CPython).
#[inline]
unsafe fn is_type(obj: usize, ty: usize) -> bool {
    plausible(obj) && rd::<usize>(obj, OB_TYPE) == ty
}

/// `obj` is a plausible pointer to an object whose exact type is `ty`, read through `m`.
fn is_type_with<M: Mem>(m: &M, obj: usize, ty: usize) -> bool {
    plausible(obj) && m.get::<usize>(obj + OB_TYPE) == Some(ty)
}

/// Hot path: fill `out` with the current thread's Python frames, innermost
/// first (the innermost `out.len()` frames if the stack is deeper). No
/// allocation, no locks, no GIL. The very first call in the process runs the
/// one-time detection (dlsym); call [`python_version`] at init to pre-warm.
pub fn capture_python(out: &mut [PyFrameRaw]) -> usize {
    let Ok(rt) = runtime() else { return 0 };
    let l = rt.layout;
    if out.is_empty() {
        return 0;
    }
    // SAFETY: Py_IsInitialized / PyGILState_GetThisThreadState need no GIL.
    // The thread state, its cframe chain and the interpreter frames reachable
    // from it belong to the calling thread, which is blocked inside this
    // function, so they are neither freed nor relinked while we read them.
    // Every pointer is checked with plausible() and every code object by its
    // exact type before use; anything odd ends the walk.
    unsafe {
        if (rt.is_initialized)() == 0 {
            return 0;
        }
        let ts = (rt.get_tstate)() as usize;
        if !plausible(ts) {
            return 0;
        }
        let cframe = rd::<usize>(ts, l.ts_cframe);
        if !plausible(cframe) {
            return 0;
        }
        let mut frame = rd::<usize>(cframe, l.cframe_current);
        // A stack deeper than `out` keeps its innermost frames and its outermost OUTER_KEPT (the
        // user's script calls a framework that goes 50+ frames deep, as torch.compile's Dynamo
        // does while compiling): past the inner part, frames go round a ring in the last slots.
        let cap = out.len();
        let inner = cap - OUTER_KEPT.min(cap / 2);
        let mut n = 0;
        let mut seen = 0usize;
        let mut steps = 0;
        while steps < MAX_WALK && plausible(frame) {
            steps += 1;
            let owner = rd::<u8>(frame, l.fr_owner);
            if owner > l.owner_max {
                break;
            }
            if Some(owner) != l.owner_cstack {
                let code = rd::<usize>(frame, l.fr_code);
                if !is_type(code, rt.code_type) {
                    break;
                }
                let nbytes = rd::<i64>(code, OB_SIZE).saturating_mul(CODEUNIT as i64);
                let base = (code + l.co_code_adaptive) as isize;
                let off = (rd::<usize>(frame, l.fr_prev_instr) as isize).wrapping_sub(base) as i64;
                // A negative offset is a frame that has not started executing
                // (prev_instr == _PyCode_CODE(co) - 1): CPython itself treats
                // such "incomplete" frames as invisible, so skip it.
                if (0..nbytes).contains(&off) && off <= i32::MAX as i64 {
                    let slot = if seen < cap {
                        seen
                    } else {
                        inner + (seen - inner) % (cap - inner)
                    };
                    out[slot] = PyFrameRaw {
                        code,
                        instr_offset: off as i32,
                    };
                    seen += 1;
                    n = seen.min(cap);
                } else if off >= nbytes {
                    break;
                }
            }
            frame = rd::<usize>(frame, l.fr_previous);
        }
        if seen > cap {
            // The ring's oldest entry (the innermost frame it holds) first.
            let start = (seen - inner) % (cap - inner);
            out[inner..cap].rotate_left(start);
        }
        n
    }
}

/// Outermost Python frames a capture keeps when the stack is deeper than its buffer.
const OUTER_KEPT: usize = 16;

/// Copy a compact `str` object out (lossy for lone surrogates, capped), reading through `m`.
/// SAFETY: with [`Direct`], `obj` must be null/implausible or a live object.
unsafe fn read_str_with<M: Mem>(m: &M, rt: &Runtime, obj: usize) -> Option<String> {
    if !is_type_with(m, obj, rt.unicode_type) {
        return None;
    }
    let len = m.get::<i64>(obj + STR_LENGTH)?;
    if len < 0 {
        return None;
    }
    let n = (len as usize).min(MAX_STR);
    let state = m.get::<u32>(obj + STR_STATE)?;
    let (kind, compact, ascii) = (
        (state >> 2) & 7,
        state & (1 << 5) != 0,
        state & (1 << 6) != 0,
    );
    if !compact {
        return None; // legacy (non-compact) strings are not produced for code objects
    }
    if ascii {
        let mut data = vec![0u8; n];
        if !m.read_into(obj + rt.layout.ascii_size, &mut data) {
            return None;
        }
        return Some(String::from_utf8_lossy(&data).into_owned());
    }
    let p = obj + rt.layout.compact_size;
    let width = match kind {
        1 | 2 | 4 => kind as usize,
        _ => return None,
    };
    let mut data = vec![0u8; n * width];
    if !m.read_into(p, &mut data) {
        return None;
    }
    let s: String = match width {
        1 => data.iter().map(|&b| b as char).collect(),
        2 => data
            .chunks_exact(2)
            .map(|c| char::from_u32(u16::from_ne_bytes([c[0], c[1]]) as u32).unwrap_or('\u{fffd}'))
            .collect(),
        _ => data
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])).unwrap_or('\u{fffd}')
            })
            .collect(),
    };
    Some(s)
}

/// Read an unsigned varint (6-bit little-endian chunks, 0x40 = continue).
fn varint(t: &[u8], i: &mut usize) -> Option<u64> {
    let mut b = *t.get(*i)?;
    *i += 1;
    let mut v = (b & 63) as u64;
    let mut shift = 0;
    while b & 64 != 0 {
        b = *t.get(*i)?;
        *i += 1;
        shift += 6;
        if shift > 60 {
            return None;
        }
        v |= ((b & 63) as u64) << shift;
    }
    Some(v)
}

/// Map a byte offset into `co_code_adaptive` to a line number using the 3.11+
/// location table (Objects/locations.md). Returns None for "no location".
fn linetable_line(t: &[u8], first_line: i64, byte_off: i32) -> Option<i64> {
    let target = byte_off as i64;
    let (mut addr, mut line, mut i) = (0i64, first_line, 0usize);
    while i < t.len() {
        let b = t[i];
        if b & 0x80 == 0 {
            return None; // not an entry start: corrupt table
        }
        let code = (b >> 3) & 15;
        let end = addr + (((b & 7) as i64) + 1) * CODEUNIT as i64;
        let mut j = i + 1;
        line += match code {
            13 | 14 => {
                // NO_COLUMNS / LONG: signed varint line delta comes first.
                let u = varint(t, &mut j)?;
                if u & 1 != 0 {
                    -((u >> 1) as i64)
                } else {
                    (u >> 1) as i64
                }
            }
            10..=12 => (code - 10) as i64, // ONE_LINE0..2
            _ => 0,                        // SHORT forms and NONE (15)
        };
        if target < end {
            return if code == 15 { None } else { Some(line) };
        }
        addr = end;
        // Skip the rest of this entry, like codeobject.c: advance().
        i += 1;
        while i < t.len() && t[i] & 0x80 == 0 {
            i += 1;
        }
    }
    None
}

/// Resolve a raw frame to file/function/line. MUST be called on the same
/// thread while the frame is still live (same callback, right after capture):
/// code objects may be freed later. Allocates the returned Strings.
pub fn resolve(raw: &PyFrameRaw) -> Option<PyFrameInfo> {
    // SAFETY: per the contract, `raw.code` is a live code object captured on this thread.
    unsafe { resolve_with(&Direct, raw) }
}

/// [`resolve`] for a frame read from another thread: every read is fault-tolerant.
pub fn resolve_other(raw: &PyFrameRaw) -> Option<PyFrameInfo> {
    let m = xthread::safe_mem().ok()?;
    // SAFETY: SafeMem never faults; every object is type-checked before its payload is read.
    unsafe { resolve_with(m, raw) }
}

/// SAFETY: with [`Direct`], `raw.code` must be a live code object (see [`resolve`]).
unsafe fn resolve_with<M: Mem>(m: &M, raw: &PyFrameRaw) -> Option<PyFrameInfo> {
    let rt = runtime().ok()?;
    let l = rt.layout;
    let code = raw.code;
    if !is_type_with(m, code, rt.code_type) {
        return None;
    }
    let first = m.get::<i32>(code + l.co_firstlineno)?;
    let file = read_str_with(m, rt, m.get::<usize>(code + l.co_filename)?)
        .unwrap_or_else(|| "<unknown>".into());
    let function = read_str_with(m, rt, m.get::<usize>(code + l.co_qualname)?)
        .or_else(|| read_str_with(m, rt, m.get::<usize>(code + l.co_name).unwrap_or(0)))
        .unwrap_or_else(|| "<unknown>".into());
    let mut line = None;
    let lt = m.get::<usize>(code + l.co_linetable).unwrap_or(0);
    if is_type_with(m, lt, rt.bytes_type) {
        let len = m.get::<i64>(lt + OB_SIZE).unwrap_or(-1);
        if (0..MAX_LINETABLE as i64).contains(&len) {
            let mut t = vec![0u8; len as usize];
            if m.read_into(lt + BYTES_SVAL, &mut t) {
                line = linetable_line(&t, first as i64, raw.instr_offset);
            }
        }
    }
    let to_u32 = |v: i64| u32::try_from(v).unwrap_or(0);
    Some(PyFrameInfo {
        file,
        function,
        line: line.map_or(0, to_u32),
        first_line: to_u32(first as i64),
    })
}

/// Whether fault-tolerant reads of this process's memory work (`process_vm_readv`), which
/// resolving a frame away from its capture needs.
pub fn safe_reads_available() -> bool {
    xthread::safe_mem().is_ok()
}

/// Cheap identity check used by callers' caches to detect a code object freed
/// and replaced at the same address: (co_firstlineno, address of co_filename).
pub fn code_identity(raw: &PyFrameRaw) -> Option<(u32, usize)> {
    // SAFETY: same contract as resolve(): `raw.code` is live, type-checked.
    unsafe { code_identity_with(&Direct, raw) }
}

/// [`code_identity`] of a frame read from another thread (fault-tolerant reads).
pub fn code_identity_other(raw: &PyFrameRaw) -> Option<(u32, usize)> {
    let m = xthread::safe_mem().ok()?;
    // SAFETY: SafeMem never faults.
    unsafe { code_identity_with(m, raw) }
}

unsafe fn code_identity_with<M: Mem>(m: &M, raw: &PyFrameRaw) -> Option<(u32, usize)> {
    let rt = runtime().ok()?;
    if !is_type_with(m, raw.code, rt.code_type) {
        return None;
    }
    let first = m.get::<i32>(raw.code + rt.layout.co_firstlineno)?;
    Some((
        u32::try_from(first).unwrap_or(0),
        m.get::<usize>(raw.code + rt.layout.co_filename)?,
    ))
}

fn stack_json() -> String {
    let mut raw = [PyFrameRaw::default(); 256];
    let n = capture_python(&mut raw);
    let frames: Vec<serde_json::Value> = raw[..n]
        .iter()
        .filter_map(resolve)
        .map(|f| serde_json::json!({"file": f.file, "function": f.function, "line": f.line}))
        .collect();
    serde_json::Value::Array(frames).to_string()
}

/// Test entry point. Writes a JSON array of {"file","function","line"} for the
/// CALLING thread's Python stack into `buf` (NUL-terminated) and returns the
/// number of bytes written (excluding NUL); -1 on error; `-(needed)` (needed
/// includes the NUL) if `buf` is too small.
// Signature fixed by the C ABI contract; a null `buf` is rejected and the
// caller guarantees `len` writable bytes, as for any C out-buffer.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C" fn gpufl_test_python_stack(buf: *mut c_char, len: usize) -> isize {
    std::panic::catch_unwind(|| {
        if buf.is_null() {
            return -1;
        }
        let s = stack_json();
        let needed = s.len() + 1;
        if needed > len {
            return -(needed as isize);
        }
        // SAFETY: the caller provides `len` writable bytes at `buf`.
        unsafe {
            std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, s.len());
            *buf.add(s.len()) = 0;
        }
        s.len() as isize
    })
    .unwrap_or(-1)
}

/// Test/benchmark entry point: runs `capture_python` `iters` times on the
/// calling thread and returns the mean cost in nanoseconds (0 if iters == 0),
/// or -1 if the capture saw no frames.
#[no_mangle]
pub extern "C" fn gpufl_test_python_capture_ns(iters: u32) -> f64 {
    std::panic::catch_unwind(|| {
        let mut raw = [PyFrameRaw::default(); 256];
        if iters == 0 {
            return 0.0;
        }
        if capture_python(&mut raw) == 0 {
            return -1.0;
        }
        let t = std::time::Instant::now();
        for _ in 0..iters {
            std::hint::black_box(capture_python(std::hint::black_box(&mut raw)));
        }
        t.elapsed().as_nanos() as f64 / iters as f64
    })
    .unwrap_or(-1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_python_in_plain_rust_binary() {
        assert_eq!(python_version(), None);
        assert_eq!(unavailable_reason(), Some("no Python runtime in process"));
        let mut out = [PyFrameRaw::default(); 8];
        assert_eq!(capture_python(&mut out), 0);
        let bogus = PyFrameRaw {
            code: 0x1000,
            instr_offset: 0,
        };
        assert_eq!(resolve(&bogus), None);
        assert_eq!(code_identity(&PyFrameRaw::default()), None);
        let mut buf = [0 as c_char; 8];
        assert_eq!(gpufl_test_python_stack(buf.as_mut_ptr(), buf.len()), 2); // "[]"
        assert_eq!(gpufl_test_python_stack(buf.as_mut_ptr(), 2), -3);
    }

    #[test]
    #[rustfmt::skip]
    fn linetable_decoding() {
        // firstlineno 10: entries [ONE_LINE1 len1 cols][SHORT0 len2 col][NONE len1]
        // [NO_COLUMNS len1 delta=-3][LONG len1 delta=+5 endline col endcol]
        let t = [
            0x80 | (11 << 3), 0, 4,        // bytes 0..2   -> 11
            0x80 | 1, 3,                   // bytes 2..6   -> 11
            0x80 | (15 << 3),              // bytes 6..8   -> no location
            0x80 | (13 << 3), 7,           // bytes 8..10  -> 11 - 3 = 8
            0x80 | (14 << 3), 10, 0, 1, 2, // bytes 10..12 -> 8 + 5 = 13
        ];
        let got: Vec<_> = (0..14).step_by(2).map(|o| linetable_line(&t, 10, o)).collect();
        assert_eq!(got, [Some(11), Some(11), Some(11), None, Some(8), Some(13), None]);
        let mut i = 0;
        assert_eq!(varint(&[0x41, 0x02], &mut i), Some(1 | (2 << 6)));
    }
}
