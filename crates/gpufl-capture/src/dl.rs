//! Minimal dlopen/dlsym wrapper: symbols resolved from one exact library, missing ones are `None`
//! (never a panic, unlike loaders that abort on a missing symbol).

use std::ffi::{c_void, CStr, CString};

/// A handle to a loaded shared library. Never closed: the recorder lives as long as the process.
#[derive(Debug)]
pub struct Lib {
    handle: *mut c_void,
    /// The path or name it was opened with.
    pub path: String,
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for Lib {}
unsafe impl Sync for Lib {}

impl Lib {
    /// dlopen(path, RTLD_NOW | RTLD_GLOBAL). `path` may be a bare soname.
    pub fn open(path: &str) -> Option<Lib> {
        let c = CString::new(path).ok()?;
        // SAFETY: c is a valid C string; dlopen has no other preconditions.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        (!handle.is_null()).then(|| Lib {
            handle,
            path: path.to_string(),
        })
    }

    /// dlopen(path, RTLD_NOW | RTLD_NOLOAD): only if already loaded in the process.
    pub fn already_loaded(path: &str) -> Option<Lib> {
        let c = CString::new(path).ok()?;
        // SAFETY: as above.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        (!handle.is_null()).then(|| Lib {
            handle,
            path: path.to_string(),
        })
    }

    /// The address of `name`, or None.
    pub fn sym_addr(&self, name: &CStr) -> Option<*mut c_void> {
        // SAFETY: handle is a live dlopen handle; name is NUL-terminated.
        let p = unsafe { libc::dlsym(self.handle, name.as_ptr()) };
        (!p.is_null()).then_some(p)
    }

    /// The real path of the loaded object (via dlinfo's link map), falling back to the open name.
    pub fn real_path(&self) -> String {
        let mut lm: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: RTLD_DI_LINKMAP writes a `struct link_map *` into lm.
        let rc = unsafe {
            libc::dlinfo(
                self.handle,
                libc::RTLD_DI_LINKMAP,
                &mut lm as *mut *mut c_void as *mut c_void,
            )
        };
        if rc == 0 && !lm.is_null() {
            // struct link_map { ElfW(Addr) l_addr; char *l_name; ... }
            // SAFETY: l_name is the second pointer-sized field of a valid link_map.
            let name = unsafe { *(lm as *const *const libc::c_char).add(1) };
            if !name.is_null() {
                // SAFETY: l_name is a NUL-terminated string owned by the loader.
                let s = unsafe { CStr::from_ptr(name) }
                    .to_string_lossy()
                    .into_owned();
                if !s.is_empty() {
                    return s;
                }
            }
        }
        self.path.clone()
    }
}

/// Look a function up and cast it to the fn-pointer type `F`.
///
/// # Safety
/// `F` must be an `unsafe extern "C" fn` type matching the symbol's real signature.
pub unsafe fn func<F: Copy>(lib: &Lib, name: &CStr) -> Option<F> {
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    lib.sym_addr(name)
        .map(|p| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// dlsym over every loaded object (RTLD_DEFAULT).
pub fn default_sym(name: &CStr) -> Option<*mut c_void> {
    // SAFETY: RTLD_DEFAULT is a valid pseudo-handle.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    (!p.is_null()).then_some(p)
}

/// The callback type of [`iterate_phdr`] (that of `dl_iterate_phdr`).
pub type PhdrCallback =
    unsafe extern "C" fn(*mut libc::dl_phdr_info, usize, *mut c_void) -> std::ffi::c_int;

std::thread_local! {
    /// Read by [`iterate_phdr`] before each walk: its only purpose is the TLS access itself.
    static DTV_TOUCH: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// `dl_iterate_phdr`, the one way the recorder walks the loaded modules (the unwinder's
/// snapshot, the symbolizer, the loader counters).
///
/// The calling thread touches a thread-local of this library before the walk and again inside
/// it, at the first module, while the walk holds the loader's list lock. This library is
/// dlopen'ed (CUDA's injection), so the access goes through `__tls_get_addr`, which brings the
/// thread's DTV up to the loader's current TLS generation when it is behind (glibc ≥ 2.34).
/// Without that, glibc's `dl_iterate_phdr` can crash: for each module with TLS it calls
/// `_dl_tls_get_addr_soft`, which, when the thread's DTV is behind, walks the TLS slotinfo list
/// to that module's id without the lock `dlopen` holds; a module that another thread's `dlopen`
/// has mapped (its TLS id given) but not yet added to that list (it is still being relocated)
/// walks it past its end, a NULL pointer. Seen on the H100 machine (glibc 2.39): a recorded
/// HuggingFace Trainer died with SIGSEGV on the recorder's writer thread at
/// `ld-linux-x86-64.so.2+0x14bb7` (that loop, address 0) 0.3 s into its recording, while PyTorch
/// was loading its libraries (about 1 run in 80).
///
/// Why the touch inside the walk closes it: a module is added to the list under the lock the
/// walk holds, so every module the walk meets was mapped before the walk began; `dlopen`s are
/// serialised, so no other one can finish while that module's is under way; the touch, made
/// after the walk began, therefore sees every generation that finished before, and the thread's
/// DTV is current for every module still being loaded. The touch before the walk allocates this
/// thread's TLS block of this library outside the lock (later touches only update the DTV).
/// A C reproduction (a thread `dlopen`ing 140 libraries with TLS whose relocation takes 3 ms,
/// another walking the list): 23 of 30 processes crash with a stale DTV, none with the touch.
///
/// # Safety
/// `cb` must only use `data` as the caller means it and must not unwind.
pub unsafe fn iterate_phdr(cb: PhdrCallback, data: *mut c_void) -> std::ffi::c_int {
    struct Walk {
        cb: PhdrCallback,
        data: *mut c_void,
        first: bool,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        size: usize,
        walk: *mut c_void,
    ) -> std::ffi::c_int {
        // SAFETY: `walk` is the `Walk` on iterate_phdr's stack, alive for the whole walk.
        let Some(w) = (unsafe { walk.cast::<Walk>().as_mut() }) else {
            return 1;
        };
        if w.first {
            w.first = false;
            DTV_TOUCH.with(|c| std::hint::black_box(c.get()));
        }
        // SAFETY: the caller's contract for `cb` and `data`.
        unsafe { (w.cb)(info, size, w.data) }
    }
    DTV_TOUCH.with(|c| std::hint::black_box(c.get()));
    let mut walk = Walk {
        cb,
        data,
        first: true,
    };
    // SAFETY: `each` only reads `walk`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut walk as *mut Walk).cast()) }
}
