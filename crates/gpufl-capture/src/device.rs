//! GPU facts for the session header, read through the CUDA driver API (loaded at run time).

use crate::dl::{self, Lib};
use gpufl_trace::Gpu;
use std::ffi::c_char;

type CuInit = unsafe extern "C" fn(u32) -> i32;
type CuDriverGetVersion = unsafe extern "C" fn(*mut i32) -> i32;
type CuDeviceGetCount = unsafe extern "C" fn(*mut i32) -> i32;
type CuDeviceGet = unsafe extern "C" fn(*mut i32, i32) -> i32;
type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, i32, i32) -> i32;
type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], i32) -> i32;
type CuDeviceGetAttribute = unsafe extern "C" fn(*mut i32, i32, i32) -> i32;
type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, i32) -> i32;

const ATTR_MULTIPROCESSOR_COUNT: i32 = 16;
const ATTR_COMPUTE_CAPABILITY_MAJOR: i32 = 75;
const ATTR_COMPUTE_CAPABILITY_MINOR: i32 = 76;

/// What the driver told us.
#[derive(Debug, Default)]
pub struct DeviceInfo {
    pub driver_version: Option<u32>,
    pub gpus: Vec<Gpu>,
    /// Why the list may be empty.
    pub error: Option<String>,
}

/// Query every visible GPU. Calls cuInit(0), which waits for an initialization in progress on
/// another thread; safe to call from a background thread at any time.
pub fn query() -> DeviceInfo {
    let Some(lib) = Lib::already_loaded("libcuda.so.1").or_else(|| Lib::open("libcuda.so.1"))
    else {
        return DeviceInfo {
            error: Some("CUDA driver (libcuda.so.1) not found".into()),
            ..Default::default()
        };
    };
    // SAFETY: the types match the CUDA driver API signatures.
    unsafe { query_with(&lib) }
}

unsafe fn query_with(lib: &Lib) -> DeviceInfo {
    let mut info = DeviceInfo::default();
    let (Some(init), Some(count), Some(get)) = (
        unsafe { dl::func::<CuInit>(lib, c"cuInit") },
        unsafe { dl::func::<CuDeviceGetCount>(lib, c"cuDeviceGetCount") },
        unsafe { dl::func::<CuDeviceGet>(lib, c"cuDeviceGet") },
    ) else {
        info.error = Some("CUDA driver lacks cuInit/cuDeviceGetCount".into());
        return info;
    };
    let rc = unsafe { init(0) };
    if rc != 0 {
        info.error = Some(format!("cuInit failed with CUresult {rc}"));
        return info;
    }
    if let Some(f) = unsafe { dl::func::<CuDriverGetVersion>(lib, c"cuDriverGetVersion") } {
        let mut v = 0;
        if unsafe { f(&mut v) } == 0 {
            info.driver_version = Some(v as u32);
        }
    }
    let name_f = unsafe { dl::func::<CuDeviceGetName>(lib, c"cuDeviceGetName") };
    let uuid_f = unsafe { dl::func::<CuDeviceGetUuid>(lib, c"cuDeviceGetUuid_v2") }
        .or_else(|| unsafe { dl::func::<CuDeviceGetUuid>(lib, c"cuDeviceGetUuid") });
    let attr_f = unsafe { dl::func::<CuDeviceGetAttribute>(lib, c"cuDeviceGetAttribute") };
    let mem_f = unsafe { dl::func::<CuDeviceTotalMem>(lib, c"cuDeviceTotalMem_v2") };
    let mut n = 0;
    if unsafe { count(&mut n) } != 0 {
        info.error = Some("cuDeviceGetCount failed".into());
        return info;
    }
    for ordinal in 0..n.max(0) {
        let mut dev = 0;
        if unsafe { get(&mut dev, ordinal) } != 0 {
            continue;
        }
        let mut g = Gpu {
            index: ordinal as u32,
            ..Default::default()
        };
        if let Some(f) = name_f {
            let mut buf = [0 as c_char; 256];
            if unsafe { f(buf.as_mut_ptr(), buf.len() as i32, dev) } == 0 {
                g.name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        if let Some(f) = uuid_f {
            let mut u = [0u8; 16];
            if unsafe { f(&mut u, dev) } == 0 {
                g.uuid = format_uuid(&u);
            }
        }
        if let Some(f) = attr_f {
            let attr = |a| {
                let mut v = 0;
                (unsafe { f(&mut v, a, dev) } == 0).then_some(v.max(0) as u32)
            };
            g.sm_count = attr(ATTR_MULTIPROCESSOR_COUNT).unwrap_or(0);
            g.cc_major = attr(ATTR_COMPUTE_CAPABILITY_MAJOR).unwrap_or(0);
            g.cc_minor = attr(ATTR_COMPUTE_CAPABILITY_MINOR).unwrap_or(0);
        }
        if let Some(f) = mem_f {
            let mut m = 0usize;
            if unsafe { f(&mut m, dev) } == 0 {
                g.total_mem_bytes = m as u64;
            }
        }
        info.gpus.push(g);
    }
    info
}

/// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: Vec<String> = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn uuid_format_matches_nvidia_smi() {
        let u = [
            0x9f, 0x1e, 0x27, 0x5c, 0x8a, 0x31, 0x4b, 0x02, 0x91, 0x7d, 0x00, 0x11, 0x22, 0x33,
            0x44, 0x55,
        ];
        assert_eq!(
            super::format_uuid(&u),
            "GPU-9f1e275c-8a31-4b02-917d-001122334455"
        );
    }
}
