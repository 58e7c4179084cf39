//! NVTX ranges as scopes, without code changes.
//!
//! NVTX (the header-only library PyTorch, cuDNN, NCCL and user code call) does nothing until a
//! tool is injected: at its first call it `dlopen`s the library named by `NVTX_INJECTION64_PATH`
//! and calls that library's `InitializeInjectionNvtx2`, which fills NVTX's function table. CUPTI
//! implements that entry point and then delivers each NVTX call as a callback in
//! `CUPTI_CB_DOMAIN_NVTX`. gpufl uses CUPTI's implementation (no table of its own to maintain):
//! `gpufl record` points `NVTX_INJECTION64_PATH` at `libgpufl_capture.so` (whose path it knows;
//! the Python package does the same for in-process use), whose [`InitializeInjectionNvtx2`]
//! forwards to the loaded CUPTI's; the recorder enables the range push/pop callbacks and sends
//! each one through the same per-thread scope path as `gpufl_scope_push` (source `nvtx`).
//!
//! Callback ids: `CUpti_nvtx_api_trace_cbid` in cudarc's CUPTI bindings
//! (`cudarc-0.19.10/src/cupti/sys/mod.rs`): nvtxRangePushA = 8, nvtxRangePushW = 9,
//! nvtxRangePushEx = 10, nvtxRangePop = 11, nvtxDomainRangePushEx = 33, nvtxDomainRangePop = 34;
//! `CUPTI_CB_DOMAIN_NVTX` = 5. The callback data is `CUpti_NvtxData { functionName,
//! functionParams, functionReturnValue }` (same file). The parameter structs are CUPTI's
//! `generated_nvtx_meta.h` (not in cudarc): `nvtxRangePushA_params { const char* message }`,
//! `nvtxRangePushW_params { const wchar_t* message }`, `nvtxRangePushEx_params { const
//! nvtxEventAttributes_t* eventAttrib }`, `nvtxDomainRangePushEx_params { nvtxDomainHandle_t
//! domain; const nvtxEventAttributes_t* core_attr }`. `nvtxEventAttributes_t` (v2, NVTX 3):
//! version u16 @0, size u16 @2, category u32 @4, colorType i32 @8, color u32 @12, payloadType i32
//! @16, reserved0 i32 @20, payload (8 bytes) @24, messageType i32 @32, message (pointer) @40;
//! 48 bytes. Message types: 1 ASCII, 2 Unicode (wchar_t), 3 registered string handle.
//!
//! Registered strings (`nvtxDomainRegisterStringA/W` = 39/40, params `{ nvtxDomainHandle_t
//! domain; const char* / const wchar_t* string }`, returning an `nvtxStringHandle_t` that
//! `functionReturnValue` points at): the text is copied once into a fixed lock-free table keyed by
//! the handle ([`REGISTERED_SLOTS`] strings at most, each cut to [`MAX_NAME`] bytes); a push whose
//! message is a handle looks its text up there (no lock, no allocation) and falls back to
//! `<registered>` only for a handle the table never saw or could not hold.
//!
//! Start/end ranges (`nvtxRangeStartA/W/Ex` = 4/5/6, `nvtxDomainRangeStartEx` = 31, returning an
//! `nvtxRangeId_t` (u64) through `functionReturnValue`; `nvtxRangeEnd` = 7 `{ nvtxRangeId_t id }`,
//! `nvtxDomainRangeEnd` = 32 `{ nvtxDomainHandle_t domain; nvtxRangeId_t id }`) may end on another
//! thread and do not nest: each start and end is queued like a scope event and the writer pairs
//! them into one `range` record (`scopes::range_start` / `range_end`).

use crate::cupti::Cupti;
use gpufl_trace::ScopeSource;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

pub const DOMAIN_NVTX: u32 = 5;
pub const CBID_RANGE_PUSH_A: u32 = 8;
pub const CBID_RANGE_PUSH_W: u32 = 9;
pub const CBID_RANGE_PUSH_EX: u32 = 10;
pub const CBID_RANGE_POP: u32 = 11;
pub const CBID_DOMAIN_RANGE_PUSH_EX: u32 = 33;
pub const CBID_DOMAIN_RANGE_POP: u32 = 34;
pub const CBID_RANGE_START_A: u32 = 4;
pub const CBID_RANGE_START_W: u32 = 5;
pub const CBID_RANGE_START_EX: u32 = 6;
pub const CBID_RANGE_END: u32 = 7;
pub const CBID_DOMAIN_RANGE_START_EX: u32 = 31;
pub const CBID_DOMAIN_RANGE_END: u32 = 32;
pub const CBID_DOMAIN_REGISTER_STRING_A: u32 = 39;
pub const CBID_DOMAIN_REGISTER_STRING_W: u32 = 40;

const CBIDS: [u32; 14] = [
    CBID_RANGE_PUSH_A,
    CBID_RANGE_PUSH_W,
    CBID_RANGE_PUSH_EX,
    CBID_RANGE_POP,
    CBID_DOMAIN_RANGE_PUSH_EX,
    CBID_DOMAIN_RANGE_POP,
    CBID_RANGE_START_A,
    CBID_RANGE_START_W,
    CBID_RANGE_START_EX,
    CBID_RANGE_END,
    CBID_DOMAIN_RANGE_START_EX,
    CBID_DOMAIN_RANGE_END,
    CBID_DOMAIN_REGISTER_STRING_A,
    CBID_DOMAIN_REGISTER_STRING_W,
];

/// `CUpti_NvtxData` (cudarc, cuda-11050 and later).
#[repr(C)]
struct NvtxData {
    function_name: *const c_char,
    function_params: *const c_void,
    function_return_value: *const c_void,
}

/// Enable the NVTX range callbacks on `sub`. Returns a notice when CUPTI refuses.
pub(crate) fn enable(c: &Cupti, sub: *mut c_void) -> Option<String> {
    for cbid in CBIDS {
        // SAFETY: plain CUPTI call on our own subscriber.
        let rc = unsafe { (c.enable_callback)(1, sub, DOMAIN_NVTX, cbid) };
        if rc != crate::cupti::SUCCESS {
            return Some(format!(
                "NVTX ranges not recorded: cuptiEnableCallback(NVTX) failed: {}",
                c.result_string(rc)
            ));
        }
    }
    None
}

/// Longest name kept (bytes); longer names are cut.
const MAX_NAME: usize = 256;

/// Handle one NVTX callback (domain [`DOMAIN_NVTX`]).
///
/// # Safety
/// `data` is the `CUpti_NvtxData` CUPTI passed for `cbid`.
pub unsafe fn on_callback(cbid: u32, data: *const c_void) {
    if data.is_null() {
        return;
    }
    // SAFETY: per the contract, data is a CUpti_NvtxData.
    let (params, ret) = unsafe {
        let d = &*(data as *const NvtxData);
        (d.function_params, d.function_return_value)
    };
    match cbid {
        CBID_RANGE_POP | CBID_DOMAIN_RANGE_POP => crate::scopes::pop(ScopeSource::Nvtx),
        CBID_RANGE_PUSH_A | CBID_RANGE_PUSH_W | CBID_RANGE_PUSH_EX | CBID_DOMAIN_RANGE_PUSH_EX => {
            let mut buf = [0u8; MAX_NAME];
            // SAFETY: params is the parameter struct of this cbid (layouts in the module doc).
            let name = unsafe { push_name(cbid, params, &mut buf) };
            crate::scopes::push(name, ScopeSource::Nvtx);
        }
        CBID_RANGE_START_A
        | CBID_RANGE_START_W
        | CBID_RANGE_START_EX
        | CBID_DOMAIN_RANGE_START_EX => {
            // SAFETY: the return value of a range start is an nvtxRangeId_t.
            let Some(id) = (unsafe { read_ret_u64(ret) }) else {
                return;
            };
            let push_cbid = match cbid {
                CBID_RANGE_START_A => CBID_RANGE_PUSH_A,
                CBID_RANGE_START_W => CBID_RANGE_PUSH_W,
                CBID_RANGE_START_EX => CBID_RANGE_PUSH_EX,
                _ => CBID_DOMAIN_RANGE_PUSH_EX,
            };
            let mut buf = [0u8; MAX_NAME];
            // SAFETY: each start's params has the layout of the matching push's.
            let name = unsafe { push_name(push_cbid, params, &mut buf) };
            crate::scopes::range_start(id, name, ScopeSource::Nvtx);
        }
        CBID_RANGE_END | CBID_DOMAIN_RANGE_END => {
            if params.is_null() {
                return;
            }
            let p = params as *const u64;
            // SAFETY: nvtxRangeEnd_params { id } / nvtxDomainRangeEnd_params { domain, id }.
            let id = unsafe { *p.add(usize::from(cbid == CBID_DOMAIN_RANGE_END)) };
            crate::scopes::range_end(id, ScopeSource::Nvtx);
        }
        CBID_DOMAIN_REGISTER_STRING_A | CBID_DOMAIN_REGISTER_STRING_W => {
            // SAFETY: the return value of a registration is an nvtxStringHandle_t.
            let Some(handle) = (unsafe { read_ret_u64(ret) }) else {
                return;
            };
            if params.is_null() {
                return;
            }
            let mut buf = [0u8; MAX_NAME];
            // SAFETY: params { domain; string }: the string pointer is the second field.
            let text = unsafe {
                let s = *(params as *const *const c_void).add(1);
                if cbid == CBID_DOMAIN_REGISTER_STRING_A {
                    c_bytes(s as *const c_char)
                } else {
                    wide_bytes(s as *const i32, &mut buf)
                }
            };
            register(handle, text);
        }
        _ => {}
    }
}

/// The non-zero u64 `ret` points at (a range id or a string handle).
///
/// # Safety
/// `ret` is NULL or points at 8 readable bytes.
unsafe fn read_ret_u64(ret: *const c_void) -> Option<u64> {
    if ret.is_null() {
        return None;
    }
    // SAFETY: per the contract.
    let v = unsafe { std::ptr::read_unaligned(ret as *const u64) };
    (v != 0).then_some(v)
}

/// Registered strings held at most (later registrations show as `<registered>`).
pub const REGISTERED_SLOTS: usize = 4096;

/// Registered string handle → text: open addressing over atomics. A slot's key is claimed once
/// with a compare-and-swap, then its text (leaked: registrations live as long as the process) is
/// published; readers never block and never see a half-written text.
struct Registry {
    keys: [AtomicU64; REGISTERED_SLOTS],
    texts: [AtomicPtr<Box<[u8]>>; REGISTERED_SLOTS],
}

impl Registry {
    const fn new() -> Registry {
        Registry {
            keys: [const { AtomicU64::new(0) }; REGISTERED_SLOTS],
            texts: [const { AtomicPtr::new(std::ptr::null_mut()) }; REGISTERED_SLOTS],
        }
    }

    /// Remember the text of a registered string handle (first registration wins; a full table
    /// keeps nothing more).
    fn insert(&self, handle: u64, text: &[u8]) {
        let start = slot_of(handle);
        for i in 0..REGISTERED_SLOTS {
            let k = (start + i) % REGISTERED_SLOTS;
            match self.keys[k].compare_exchange(0, handle, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let b: Box<Box<[u8]>> = Box::new(text[..text.len().min(MAX_NAME)].into());
                    self.texts[k].store(Box::into_raw(b), Ordering::Release);
                    return;
                }
                Err(h) if h == handle => return,
                Err(_) => {}
            }
        }
    }

    /// The text registered for `handle`, if the table holds it.
    fn get(&self, handle: u64) -> Option<&[u8]> {
        let start = slot_of(handle);
        for i in 0..REGISTERED_SLOTS {
            let k = (start + i) % REGISTERED_SLOTS;
            match self.keys[k].load(Ordering::Acquire) {
                0 => return None,
                h if h == handle => {
                    let p = self.texts[k].load(Ordering::Acquire);
                    // SAFETY: published once from Box::into_raw, freed only with the table.
                    return (!p.is_null()).then(|| unsafe { &**p as &[u8] });
                }
                _ => {}
            }
        }
        None
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        for t in &self.texts {
            let p = t.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: from Box::into_raw in insert, taken once.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

static REGISTRY: Registry = Registry::new();

fn slot_of(handle: u64) -> usize {
    // Fibonacci hashing: handles are often pointers (aligned, clustered).
    (handle.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % REGISTERED_SLOTS
}

fn register(handle: u64, text: &[u8]) {
    REGISTRY.insert(handle, text)
}

fn registered(handle: u64) -> Option<&'static [u8]> {
    REGISTRY.get(handle)
}

/// The range name of a push call, copied into `buf` when it must be converted.
///
/// # Safety
/// `params` is NULL or the parameter struct of `cbid`.
unsafe fn push_name(cbid: u32, params: *const c_void, buf: &mut [u8; MAX_NAME]) -> &[u8] {
    if params.is_null() {
        return b"?";
    }
    // Every push struct starts with pointers; read the one that matters.
    let p = params as *const *const c_void;
    // SAFETY: see the layouts in the module doc.
    unsafe {
        match cbid {
            CBID_RANGE_PUSH_A => c_bytes(*p as *const c_char),
            CBID_RANGE_PUSH_W => wide_bytes(*p as *const i32, buf),
            CBID_RANGE_PUSH_EX => attr_name(*p, buf),
            CBID_DOMAIN_RANGE_PUSH_EX => attr_name(*p.add(1), buf),
            _ => b"?",
        }
    }
}

/// # Safety
/// `s` is NULL or NUL-terminated.
unsafe fn c_bytes<'a>(s: *const c_char) -> &'a [u8] {
    if s.is_null() {
        return b"";
    }
    // SAFETY: NUL-terminated per the contract.
    let b = unsafe { CStr::from_ptr(s) }.to_bytes();
    &b[..b.len().min(MAX_NAME)]
}

/// A wchar_t (UTF-32 on Linux) string as UTF-8, cut to fit `buf`.
///
/// # Safety
/// `s` is NULL or NUL-terminated.
unsafe fn wide_bytes(s: *const i32, buf: &mut [u8; MAX_NAME]) -> &[u8] {
    if s.is_null() {
        return b"";
    }
    let mut n = 0;
    for i in 0..MAX_NAME {
        // SAFETY: reading up to the terminator.
        let c = unsafe { *s.add(i) };
        if c == 0 {
            break;
        }
        let ch = char::from_u32(c as u32).unwrap_or('?');
        if n + ch.len_utf8() > MAX_NAME {
            break;
        }
        n += ch.encode_utf8(&mut buf[n..]).len();
    }
    &buf[..n]
}

/// The message of an `nvtxEventAttributes_t`.
///
/// # Safety
/// `attr` is NULL or points at an event attributes struct of at least its `size` bytes.
unsafe fn attr_name(attr: *const c_void, buf: &mut [u8; MAX_NAME]) -> &[u8] {
    if attr.is_null() {
        return b"?";
    }
    let base = attr as *const u8;
    // SAFETY: fields read at their documented offsets, within `size`.
    unsafe {
        let size = *(base.add(2) as *const u16);
        if size < 48 {
            return b"?";
        }
        let kind = *(base.add(32) as *const i32);
        let msg = *(base.add(40) as *const *const c_void);
        match kind {
            1 => c_bytes(msg as *const c_char),
            2 => wide_bytes(msg as *const i32, buf),
            3 => registered(msg as u64).unwrap_or(b"<registered>"),
            _ => b"?",
        }
    }
}

/// NVTX's injection entry point (`NVTX_INJECTION64_PATH` names this library): forwarded to
/// CUPTI's, which fills NVTX's table and turns NVTX calls into CUPTI callbacks. Returns 0
/// (failure: NVTX stays a no-op) when CUPTI cannot be loaded.
///
/// # Safety
/// Called by NVTX with its export-table getter, which is passed on unchanged.
#[no_mangle]
pub unsafe extern "C" fn InitializeInjectionNvtx2(get_export_table: *const c_void) -> c_int {
    std::panic::catch_unwind(|| {
        let Some(c) = crate::recorder::cupti_loaded() else {
            return 0;
        };
        let Some(f) = c.initialize_injection_nvtx2 else {
            return 0;
        };
        // SAFETY: forwarding NVTX's own argument.
        unsafe { f(get_export_table) }
    })
    .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_each_push_layout() {
        let mut buf = [0u8; MAX_NAME];
        let ascii = c"forward";
        let pa = [ascii.as_ptr() as *const c_void];
        // SAFETY: a PushA params struct.
        assert_eq!(
            unsafe { push_name(CBID_RANGE_PUSH_A, pa.as_ptr() as _, &mut buf) },
            b"forward"
        );

        let wide: Vec<i32> = "optim\u{e9}\0".chars().map(|c| c as i32).collect();
        let pw = [wide.as_ptr() as *const c_void];
        // SAFETY: a PushW params struct.
        let got = unsafe { push_name(CBID_RANGE_PUSH_W, pw.as_ptr() as _, &mut buf) }.to_vec();
        assert_eq!(got, "optimé".as_bytes());

        // nvtxEventAttributes_t v2, 48 bytes, ASCII message.
        let mut attr = [0u8; 48];
        attr[2..4].copy_from_slice(&48u16.to_ne_bytes());
        attr[32..36].copy_from_slice(&1i32.to_ne_bytes());
        let msg = c"backward";
        attr[40..48].copy_from_slice(&(msg.as_ptr() as usize).to_ne_bytes());
        let aligned: Vec<u64> = attr
            .chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        let pe = [aligned.as_ptr() as *const c_void];
        // SAFETY: a PushEx params struct.
        assert_eq!(
            unsafe { push_name(CBID_RANGE_PUSH_EX, pe.as_ptr() as _, &mut buf) },
            b"backward"
        );
        let pd = [std::ptr::null(), aligned.as_ptr() as *const c_void];
        // SAFETY: a DomainRangePushEx params struct.
        assert_eq!(
            unsafe { push_name(CBID_DOMAIN_RANGE_PUSH_EX, pd.as_ptr() as _, &mut buf) },
            b"backward"
        );
        // Too small a struct: not read.
        let small = [0u64; 6];
        let ps = [small.as_ptr() as *const c_void];
        // SAFETY: as above.
        assert_eq!(
            unsafe { push_name(CBID_RANGE_PUSH_EX, ps.as_ptr() as _, &mut buf) },
            b"?"
        );
    }

    /// An nvtxEventAttributes_t v2 whose message is of `kind`, as u64 words (aligned).
    fn attrs(kind: i32, msg: u64) -> Vec<u64> {
        let mut attr = [0u8; 48];
        attr[2..4].copy_from_slice(&48u16.to_ne_bytes());
        attr[32..36].copy_from_slice(&kind.to_ne_bytes());
        attr[40..48].copy_from_slice(&msg.to_ne_bytes());
        attr.chunks(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn registered_strings_resolve_through_the_callback() {
        // nvtxDomainRegisterStringA(domain, "aten::addmm") returned handle h, as CUPTI reports it.
        let text = c"aten::addmm";
        let handle: u64 = 0x7f00_dead_b000;
        let params = [0x1234usize as *const c_void, text.as_ptr() as *const c_void];
        let data = NvtxData {
            function_name: c"nvtxDomainRegisterStringA".as_ptr(),
            function_params: params.as_ptr() as _,
            function_return_value: &handle as *const u64 as _,
        };
        // SAFETY: a CUpti_NvtxData of a RegisterStringA call.
        unsafe { on_callback(CBID_DOMAIN_REGISTER_STRING_A, &data as *const _ as _) };
        // The same via the wide form, another handle.
        let wide: Vec<i32> = "batch \u{3b1}\0".chars().map(|c| c as i32).collect();
        let handle_w: u64 = 0x7f00_dead_b040;
        let params_w = [std::ptr::null(), wide.as_ptr() as *const c_void];
        let data_w = NvtxData {
            function_name: c"nvtxDomainRegisterStringW".as_ptr(),
            function_params: params_w.as_ptr() as _,
            function_return_value: &handle_w as *const u64 as _,
        };
        // SAFETY: a CUpti_NvtxData of a RegisterStringW call.
        unsafe { on_callback(CBID_DOMAIN_REGISTER_STRING_W, &data_w as *const _ as _) };
        // A registration without a return value is ignored (no crash).
        let data_none = NvtxData {
            function_name: std::ptr::null(),
            function_params: params.as_ptr() as _,
            function_return_value: std::ptr::null(),
        };
        // SAFETY: as above, return value absent.
        unsafe { on_callback(CBID_DOMAIN_REGISTER_STRING_A, &data_none as *const _ as _) };

        let mut buf = [0u8; MAX_NAME];
        for (h, want) in [
            (handle, "aten::addmm"),
            (handle_w, "batch \u{3b1}"),
            (0x7f00_dead_b080, "<registered>"),
        ] {
            let a = attrs(3, h);
            let pd = [std::ptr::null(), a.as_ptr() as *const c_void];
            // SAFETY: a DomainRangePushEx params struct with a registered message.
            let got = unsafe { push_name(CBID_DOMAIN_RANGE_PUSH_EX, pd.as_ptr() as _, &mut buf) };
            assert_eq!(std::str::from_utf8(got).unwrap(), want);
        }
    }

    #[test]
    fn registry_is_bounded_and_first_registration_wins() {
        // Fill well past capacity with distinct handles: nothing panics, early ones still resolve.
        let r = Box::new(Registry::new());
        let long = vec![b'x'; 1000];
        r.insert(0x5_0000_0000, &long);
        assert_eq!(r.get(0x5_0000_0000).map(<[u8]>::len), Some(MAX_NAME));
        for i in 0..(REGISTERED_SLOTS as u64 + 100) {
            r.insert(0x1_0000_0000 + i * 16, format!("s{i}").as_bytes());
        }
        r.insert(0x1_0000_0000, b"again");
        assert_eq!(r.get(0x1_0000_0000), Some(&b"s0"[..]));
        assert_eq!(r.get(0x1_0000_0000 + 16 * 4000), Some(&b"s4000"[..]));
        assert_eq!(r.get(0x2_0000_0000), None); // full table, unknown handle: not found
    }
}
