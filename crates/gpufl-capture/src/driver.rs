//! The CUDA driver (`libcuda.so.1`), loaded at run time: the one place its entry points are looked
//! up. [`Driver`] holds every driver function gpufl calls (the GPU list of [`crate::device`],
//! the stream and context calls of [`crate::kernel_detail`] and [`crate::kernel_stall`]); a
//! missing one is `None`, never a panic. CUPTI's entry points are in [`crate::cupti`].

use crate::dl::{self, Lib};
use std::ffi::{c_char, c_void};
use std::sync::OnceLock;

pub type CuInit = unsafe extern "C" fn(u32) -> i32;
pub type CuDriverGetVersion = unsafe extern "C" fn(*mut i32) -> i32;
pub type CuDeviceGetCount = unsafe extern "C" fn(*mut i32) -> i32;
pub type CuDeviceGet = unsafe extern "C" fn(*mut i32, i32) -> i32;
pub type CuDeviceGetName = unsafe extern "C" fn(*mut c_char, i32, i32) -> i32;
pub type CuDeviceGetUuid = unsafe extern "C" fn(*mut [u8; 16], i32) -> i32;
pub type CuDeviceGetAttribute = unsafe extern "C" fn(*mut i32, i32, i32) -> i32;
pub type CuDeviceTotalMem = unsafe extern "C" fn(*mut usize, i32) -> i32;
pub type CuStreamIsCapturing = unsafe extern "C" fn(*mut c_void, *mut u32) -> u32;
pub type CuCtxGetDevice = unsafe extern "C" fn(*mut i32) -> u32;
pub type CuStreamSynchronize = unsafe extern "C" fn(*mut c_void) -> u32;
pub type CuCtxPushCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
pub type CuCtxPopCurrent = unsafe extern "C" fn(*mut *mut c_void) -> u32;

/// The driver's entry points gpufl uses.
pub struct Driver {
    /// The library, as opened (`libcuda.so.1`).
    pub lib: Lib,
    pub init: Option<CuInit>,
    pub driver_get_version: Option<CuDriverGetVersion>,
    pub device_get_count: Option<CuDeviceGetCount>,
    pub device_get: Option<CuDeviceGet>,
    pub device_get_name: Option<CuDeviceGetName>,
    /// `cuDeviceGetUuid_v2`, else `cuDeviceGetUuid`.
    pub device_get_uuid: Option<CuDeviceGetUuid>,
    pub device_get_attribute: Option<CuDeviceGetAttribute>,
    /// `cuDeviceTotalMem_v2`.
    pub device_total_mem: Option<CuDeviceTotalMem>,
    pub stream_is_capturing: Option<CuStreamIsCapturing>,
    pub ctx_get_device: Option<CuCtxGetDevice>,
    pub stream_synchronize: Option<CuStreamSynchronize>,
    /// `cuCtxPushCurrent_v2` and `cuCtxPopCurrent_v2`.
    pub ctx_push_current: Option<CuCtxPushCurrent>,
    pub ctx_pop_current: Option<CuCtxPopCurrent>,
}

impl Driver {
    fn resolve(lib: Lib) -> Driver {
        // SAFETY (each): the field's type is the documented signature of the named function.
        unsafe {
            Driver {
                init: dl::func(&lib, c"cuInit"),
                driver_get_version: dl::func(&lib, c"cuDriverGetVersion"),
                device_get_count: dl::func(&lib, c"cuDeviceGetCount"),
                device_get: dl::func(&lib, c"cuDeviceGet"),
                device_get_name: dl::func(&lib, c"cuDeviceGetName"),
                device_get_uuid: dl::func(&lib, c"cuDeviceGetUuid_v2")
                    .or_else(|| dl::func(&lib, c"cuDeviceGetUuid")),
                device_get_attribute: dl::func(&lib, c"cuDeviceGetAttribute"),
                device_total_mem: dl::func(&lib, c"cuDeviceTotalMem_v2"),
                stream_is_capturing: dl::func(&lib, c"cuStreamIsCapturing"),
                ctx_get_device: dl::func(&lib, c"cuCtxGetDevice"),
                stream_synchronize: dl::func(&lib, c"cuStreamSynchronize"),
                ctx_push_current: dl::func(&lib, c"cuCtxPushCurrent_v2"),
                ctx_pop_current: dl::func(&lib, c"cuCtxPopCurrent_v2"),
                lib,
            }
        }
    }
}

/// The driver: the `libcuda.so.1` already loaded in the process, else loaded now; looked up
/// once it is found (None while it cannot be: each caller says so in its own words).
pub fn get() -> Option<&'static Driver> {
    static DRIVER: OnceLock<Driver> = OnceLock::new();
    if let Some(d) = DRIVER.get() {
        return Some(d);
    }
    let lib = Lib::already_loaded("libcuda.so.1").or_else(|| Lib::open("libcuda.so.1"))?;
    Some(DRIVER.get_or_init(|| Driver::resolve(lib)))
}
