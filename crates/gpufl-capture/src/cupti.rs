//! CUPTI, loaded at run time from one exact library (so gpufl builds and its tests run without CUDA).
//!
//! Types and struct layouts come from `cudarc::cupti::sys`; the functions are looked up here with
//! dlsym on the library we chose, so a missing symbol (an older CUPTI) is an `Option`, never a panic,
//! and return codes are read as plain integers (an unknown code is not undefined behaviour).
//! This is the one place CUPTI's entry points are looked up: [`Cupti`] holds all of them (the
//! recorder's, NVTX's injection entry point, kernel detail's SASS metrics and PC sampling); the
//! other modules call through it. The CUDA driver's are in [`crate::driver`].

use crate::dl::{self, Lib};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::Path;

pub use cudarc::cupti::sys;

/// CUPTI_SUCCESS.
pub const SUCCESS: u32 = 0;
/// CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: another tool (nsys, torch.profiler…) holds CUPTI.
pub const ERROR_MULTIPLE_SUBSCRIBERS: u32 = 39;

/// Callback domains.
pub const DOMAIN_DRIVER: u32 = 1;
pub const DOMAIN_RUNTIME: u32 = 2;
pub const DOMAIN_RESOURCE: u32 = 3;

/// Resource callback ids.
pub const CBID_RESOURCE_CONTEXT_CREATED: u32 = 1;
pub const CBID_RESOURCE_CONTEXT_DESTROY_STARTING: u32 = 2;
pub const CBID_RESOURCE_MODULE_LOADED: u32 = 6;
pub const CBID_RESOURCE_MODULE_UNLOAD_STARTING: u32 = 7;
pub const CBID_RESOURCE_GRAPHNODE_CREATED: u32 = 13;
pub const CBID_RESOURCE_GRAPHNODE_CLONED: u32 = 20;

/// Activity kinds we use.
pub const KIND_MEMCPY: u32 = 1;
pub const KIND_MEMSET: u32 = 2;
pub const KIND_DRIVER: u32 = 4;
pub const KIND_RUNTIME: u32 = 5;
pub const KIND_CONCURRENT_KERNEL: u32 = 10;
pub const KIND_OVERHEAD: u32 = 17;
pub const KIND_SYNCHRONIZATION: u32 = 38;
/// CUPTI_ACTIVITY_KIND_MEMORY2: one record per allocation and per free (`mem` records).
pub const KIND_MEMORY2: u32 = 49;

/// CUPTI_ACTIVITY_FLAG_FLUSH_FORCED.
pub const FLUSH_FORCED: u32 = 1;
/// CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM: thread ids are gettid() values.
pub const THREAD_ID_TYPE_SYSTEM: u32 = 1;
/// `CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER` (CUDA 12.3+; value: `uint8_t`).
pub const ATTR_PER_THREAD_ACTIVITY_BUFFER: u32 = 9;

pub type CallbackFn = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
pub type BufferRequestedFn = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
pub type BufferCompletedFn = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);

/// The CUPTI entry points gpufl uses.
#[allow(clippy::type_complexity)]
pub struct Cupti {
    pub lib: Lib,
    pub get_version: unsafe extern "C" fn(*mut u32) -> u32,
    pub get_result_string: Option<unsafe extern "C" fn(u32, *mut *const c_char) -> u32>,
    pub subscribe: unsafe extern "C" fn(*mut *mut c_void, CallbackFn, *mut c_void) -> u32,
    pub unsubscribe: unsafe extern "C" fn(*mut c_void) -> u32,
    pub enable_callback: unsafe extern "C" fn(u32, *mut c_void, u32, u32) -> u32,
    pub enable_domain: unsafe extern "C" fn(u32, *mut c_void, u32) -> u32,
    pub activity_register_callbacks:
        unsafe extern "C" fn(BufferRequestedFn, BufferCompletedFn) -> u32,
    pub activity_enable: unsafe extern "C" fn(u32) -> u32,
    pub activity_disable: unsafe extern "C" fn(u32) -> u32,
    pub activity_enable_runtime_api: Option<unsafe extern "C" fn(u32, u8) -> u32>,
    pub activity_enable_driver_api: Option<unsafe extern "C" fn(u32, u8) -> u32>,
    pub activity_flush_all: unsafe extern "C" fn(u32) -> u32,
    pub activity_get_next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut c_void) -> u32,
    pub activity_get_num_dropped_records: unsafe extern "C" fn(*mut c_void, u32, *mut usize) -> u32,
    pub get_timestamp: unsafe extern "C" fn(*mut u64) -> u32,
    pub get_callback_name: Option<unsafe extern "C" fn(u32, u32, *mut *const c_char) -> u32>,
    pub set_thread_id_type: Option<unsafe extern "C" fn(u32) -> u32>,
    pub get_stream_id_ex:
        Option<unsafe extern "C" fn(*mut c_void, *mut c_void, u8, *mut u32) -> u32>,
    pub activity_set_attribute: Option<unsafe extern "C" fn(u32, *mut usize, *mut c_void) -> u32>,
    pub activity_flush_period: Option<unsafe extern "C" fn(u32) -> u32>,
    /// `cuptiActivityEnableHWTrace` (CUPTI 12.8+; benchmark knob `GPUFL_HW_TRACE=1`).
    pub activity_enable_hw_trace: Option<unsafe extern "C" fn(u8) -> u32>,
    /// `cuptiFinalize` (always-on's detach after a window: crate::detach).
    pub finalize: Option<unsafe extern "C" fn() -> u32>,
    /// `cuptiGetGraphId(CUgraph, uint32_t*)` and `cuptiGetGraphNodeId(CUgraphNode, uint64_t*)`.
    pub get_graph_id: Option<unsafe extern "C" fn(*mut c_void, *mut u32) -> u32>,
    pub get_graph_node_id: Option<unsafe extern "C" fn(*mut c_void, *mut u64) -> u32>,
    /// `cuptiGetDeviceId(CUcontext, uint32_t*)`.
    pub get_device_id: Option<unsafe extern "C" fn(*mut c_void, *mut u32) -> u32>,
    /// CUPTI's `InitializeInjectionNvtx2` (NVTX's injection signature; [`crate::nvtx`]).
    pub initialize_injection_nvtx2: Option<unsafe extern "C" fn(*const c_void) -> c_int>,
    /// Kernel detail's SASS metrics API, or which symbol this CUPTI lacks.
    pub sass: Result<SassApi, String>,
    /// Kernel detail's PC Sampling API (stall reasons), when this CUPTI has all of it.
    pub pc_sampling: Option<PcSamplingApi>,
}

/// The SASS metrics API and the calls kernel detail makes with it ([`crate::kernel_detail`]).
#[derive(Clone, Copy)]
pub struct SassApi {
    pub set_config: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsSetConfig_Params) -> u32,
    pub enable: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsEnable_Params) -> u32,
    pub disable: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsDisable_Params) -> u32,
    pub get_data_properties:
        unsafe extern "C" fn(*mut sys::CUpti_SassMetricsGetDataProperties_Params) -> u32,
    pub flush_data: unsafe extern "C" fn(*mut sys::CUpti_SassMetricsFlushData_Params) -> u32,
    pub get_properties:
        unsafe extern "C" fn(*mut sys::CUpti_SassMetrics_GetProperties_Params) -> u32,
    pub chip_name: unsafe extern "C" fn(*mut sys::CUpti_Device_GetChipName_Params) -> u32,
    pub profiler_init:
        Option<unsafe extern "C" fn(*mut sys::CUpti_Profiler_Initialize_Params) -> u32>,
    pub cubin_crc: unsafe extern "C" fn(*mut sys::CUpti_GetCubinCrcParams) -> u32,
}

/// The PC Sampling API ([`crate::kernel_stall`]).
#[derive(Clone, Copy)]
pub struct PcSamplingApi {
    pub enable: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingEnableParams) -> u32,
    pub disable: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingDisableParams) -> u32,
    pub start: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingStartParams) -> u32,
    pub stop: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingStopParams) -> u32,
    pub get_data: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingGetDataParams) -> u32,
    pub num_reasons:
        unsafe extern "C" fn(*mut sys::CUpti_PCSamplingGetNumStallReasonsParams) -> u32,
    pub reasons: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingGetStallReasonsParams) -> u32,
    pub set_config: unsafe extern "C" fn(*mut sys::CUpti_PCSamplingConfigurationInfoParams) -> u32,
}

/// Why CUPTI could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("CUPTI library not found (searched: {0}); set GPUFL_CUPTI_LIB to its path")]
    NotFound(String),
    #[error("{path} lacks {symbol}: CUPTI too old for gpufl (CUDA 12.x or newer needed)")]
    MissingSymbol { path: String, symbol: String },
}

macro_rules! req {
    ($lib:expr, $name:literal) => {
        // SAFETY: the field's type is the documented signature of this CUPTI function.
        match unsafe { dl::func(&$lib, $name) } {
            Some(f) => f,
            None => {
                return Err(LoadError::MissingSymbol {
                    path: $lib.path.clone(),
                    symbol: $name.to_string_lossy().into_owned(),
                })
            }
        }
    };
}

macro_rules! opt {
    ($lib:expr, $name:literal) => {
        // SAFETY: as in req!.
        unsafe { dl::func(&$lib, $name) }
    };
}

/// Look up a function kernel detail needs: a missing one is `Err("<path> lacks <name>")`.
macro_rules! need {
    ($lib:expr, $name:literal) => {
        // SAFETY: the field's type is the documented signature of this CUPTI function.
        match unsafe { dl::func(&$lib, $name) } {
            Some(f) => f,
            None => return Err(format!("{} lacks {}", $lib.path, $name.to_string_lossy())),
        }
    };
}

impl SassApi {
    fn load(lib: &Lib) -> Result<SassApi, String> {
        Ok(SassApi {
            set_config: need!(lib, c"cuptiSassMetricsSetConfig"),
            enable: need!(lib, c"cuptiSassMetricsEnable"),
            disable: need!(lib, c"cuptiSassMetricsDisable"),
            get_data_properties: need!(lib, c"cuptiSassMetricsGetDataProperties"),
            flush_data: need!(lib, c"cuptiSassMetricsFlushData"),
            get_properties: need!(lib, c"cuptiSassMetricsGetProperties"),
            chip_name: need!(lib, c"cuptiDeviceGetChipName"),
            profiler_init: opt!(lib, c"cuptiProfilerInitialize"),
            cubin_crc: need!(lib, c"cuptiGetCubinCrc"),
        })
    }
}

impl PcSamplingApi {
    fn load(lib: &Lib) -> Option<PcSamplingApi> {
        Some(PcSamplingApi {
            enable: opt!(lib, c"cuptiPCSamplingEnable")?,
            disable: opt!(lib, c"cuptiPCSamplingDisable")?,
            start: opt!(lib, c"cuptiPCSamplingStart")?,
            stop: opt!(lib, c"cuptiPCSamplingStop")?,
            get_data: opt!(lib, c"cuptiPCSamplingGetData")?,
            num_reasons: opt!(lib, c"cuptiPCSamplingGetNumStallReasons")?,
            reasons: opt!(lib, c"cuptiPCSamplingGetStallReasons")?,
            set_config: opt!(lib, c"cuptiPCSamplingSetConfigurationAttribute")?,
        })
    }
}

impl Cupti {
    /// Find and load CUPTI (see [`candidate_paths`]).
    pub fn load() -> Result<Cupti, LoadError> {
        let candidates = candidate_paths();
        let lib = candidates
            .iter()
            .find_map(|p| Lib::open(p))
            .ok_or_else(|| LoadError::NotFound(candidates.join(", ")))?;
        let mut lib = lib;
        lib.path = lib.real_path();
        Ok(Cupti {
            get_version: req!(lib, c"cuptiGetVersion"),
            get_result_string: opt!(lib, c"cuptiGetResultString"),
            subscribe: req!(lib, c"cuptiSubscribe"),
            unsubscribe: req!(lib, c"cuptiUnsubscribe"),
            enable_callback: req!(lib, c"cuptiEnableCallback"),
            enable_domain: req!(lib, c"cuptiEnableDomain"),
            activity_register_callbacks: req!(lib, c"cuptiActivityRegisterCallbacks"),
            activity_enable: req!(lib, c"cuptiActivityEnable"),
            activity_disable: req!(lib, c"cuptiActivityDisable"),
            activity_enable_runtime_api: opt!(lib, c"cuptiActivityEnableRuntimeApi"),
            activity_enable_driver_api: opt!(lib, c"cuptiActivityEnableDriverApi"),
            activity_flush_all: req!(lib, c"cuptiActivityFlushAll"),
            activity_get_next_record: req!(lib, c"cuptiActivityGetNextRecord"),
            activity_get_num_dropped_records: req!(lib, c"cuptiActivityGetNumDroppedRecords"),
            get_timestamp: req!(lib, c"cuptiGetTimestamp"),
            get_callback_name: opt!(lib, c"cuptiGetCallbackName"),
            set_thread_id_type: opt!(lib, c"cuptiSetThreadIdType"),
            get_stream_id_ex: opt!(lib, c"cuptiGetStreamIdEx"),
            activity_set_attribute: opt!(lib, c"cuptiActivitySetAttribute"),
            activity_flush_period: opt!(lib, c"cuptiActivityFlushPeriod"),
            activity_enable_hw_trace: opt!(lib, c"cuptiActivityEnableHWTrace"),
            finalize: opt!(lib, c"cuptiFinalize"),
            get_graph_id: opt!(lib, c"cuptiGetGraphId"),
            get_graph_node_id: opt!(lib, c"cuptiGetGraphNodeId"),
            get_device_id: opt!(lib, c"cuptiGetDeviceId"),
            initialize_injection_nvtx2: opt!(lib, c"InitializeInjectionNvtx2"),
            sass: SassApi::load(&lib),
            pc_sampling: PcSamplingApi::load(&lib),
            lib,
        })
    }

    /// Human-readable text of a CUPTI result code.
    pub fn result_string(&self, code: u32) -> String {
        let mut p: *const c_char = std::ptr::null();
        if let Some(f) = self.get_result_string {
            // SAFETY: f writes a pointer to a static string into p.
            if unsafe { f(code, &mut p) } == SUCCESS && !p.is_null() {
                // SAFETY: CUPTI returns a NUL-terminated static string.
                return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            }
        }
        format!("CUPTI error {code}")
    }

    /// CUPTI's timestamp now (ns); CLOCK_REALTIME, which it follows to ~1 µs, where CUPTI may
    /// be detached (always-on: no CUPTI call from any thread may race `cuptiFinalize`,
    /// crate::detach).
    pub fn timestamp(&self) -> u64 {
        if crate::detach::possible() {
            return crate::procinfo::unix_ns();
        }
        let mut t = 0u64;
        // SAFETY: writes one u64.
        unsafe { (self.get_timestamp)(&mut t) };
        t
    }

    /// CUPTI's id of a stream (as in activity records), if it can tell.
    ///
    /// # Safety
    /// `ctx` and `stream` are the context and stream handles an API callback received.
    pub unsafe fn stream_id(
        &self,
        ctx: *mut c_void,
        stream: *mut c_void,
        per_thread: bool,
    ) -> Option<u32> {
        let f = self.get_stream_id_ex?;
        let mut id = 0u32;
        // SAFETY: plain CUPTI query with the context and stream handle the API call received.
        (unsafe { f(ctx, stream, per_thread as u8, &mut id) } == SUCCESS).then_some(id)
    }

    /// The device ordinal of a context, if CUPTI can tell.
    ///
    /// # Safety
    /// `ctx` is a context handle an API callback received (or null).
    pub unsafe fn device_id(&self, ctx: *mut c_void) -> Option<u32> {
        let f = self.get_device_id?;
        if ctx.is_null() {
            return None;
        }
        let mut id = 0u32;
        // SAFETY: plain CUPTI query with the context handle the API call received.
        (unsafe { f(ctx, &mut id) } == SUCCESS).then_some(id)
    }

    /// Name of an API function by domain and callback id.
    pub fn callback_name(&self, domain: u32, cbid: u32) -> Option<String> {
        // CUPTI names carry a version suffix ("cudaLaunchKernel_v7000"); drop it.
        let s = self.callback_name_raw(domain, cbid)?;
        Some(strip_version_suffix(&s).to_string())
    }

    /// Name of an API function as CUPTI gives it, version suffix included
    /// ("cudaMalloc_v3020", "cuMemAlloc_v2"): the suffix names the parameter layout.
    pub fn callback_name_raw(&self, domain: u32, cbid: u32) -> Option<String> {
        let f = self.get_callback_name?;
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: f writes a pointer to a static string.
        if unsafe { f(domain, cbid, &mut p) } != SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: static NUL-terminated string.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// "cudaStreamSynchronize_v3020" → "cudaStreamSynchronize"; "cudaMemcpyAsync_ptsz_v7000" → "cudaMemcpyAsync_ptsz".
pub fn strip_version_suffix(s: &str) -> &str {
    match s.rfind("_v") {
        Some(i) if s[i + 2..].chars().all(|c| c.is_ascii_digit()) && i + 2 < s.len() => &s[..i],
        _ => s,
    }
}

/// Read a field of CUpti_CallbackData by offset.
///
/// # Safety
/// `data` points at a CUpti_CallbackData and `off` is the offset of a field of type T.
pub unsafe fn cb_field<T: Copy>(data: *const c_void, off: usize) -> T {
    unsafe { ((data as *const u8).add(off) as *const T).read_unaligned() }
}

/// Where to look for libcupti, in order: `$GPUFL_CUPTI_LIB` (then nothing else); next to a CUDA library already loaded
/// in the process (pip wheels put CUPTI beside libcudart); `$CUDA_HOME`/`$CUDA_PATH` and
/// /usr/local/cuda `extras/CUPTI/lib64`; then the loader's default search by soname.
pub fn candidate_paths() -> Vec<String> {
    let mut out = Vec::new();
    if let Some(p) = &crate::options::knobs().cupti_lib {
        // An explicit choice is the only candidate.
        return vec![p.clone()];
    }
    for dir in loaded_cuda_lib_dirs() {
        for sub in [".", "../../cuda_cupti/lib", "../cuda_cupti/lib"] {
            let d = Path::new(&dir).join(sub);
            out.extend(cupti_files_in(&d));
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(root) = std::env::var(var) {
            out.extend(cupti_files_in(&Path::new(&root).join("extras/CUPTI/lib64")));
        }
    }
    out.extend(cupti_files_in(Path::new(
        "/usr/local/cuda/extras/CUPTI/lib64",
    )));
    for name in ["libcupti.so.13", "libcupti.so.12", "libcupti.so"] {
        out.push(name.to_string());
    }
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| seen.insert(p.clone()));
    out
}

fn cupti_files_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libcupti.so"))
        })
        .filter_map(|p| p.canonicalize().ok())
        .map(|p| p.display().to_string())
        .collect();
    v.sort();
    v.reverse();
    v
}

/// Directories of CUDA runtime/driver libraries already mapped into this process.
fn loaded_cuda_lib_dirs() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut dirs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            p.contains("libcudart.so") || p.contains("libcublas.so") || p.contains("libnvrtc")
        })
        .filter_map(|p| Path::new(p).parent().map(|d| d.display().to_string()))
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_suffixes() {
        assert_eq!(
            strip_version_suffix("cudaStreamSynchronize_v3020"),
            "cudaStreamSynchronize"
        );
        assert_eq!(
            strip_version_suffix("cudaMemcpyAsync_ptsz_v7000"),
            "cudaMemcpyAsync_ptsz"
        );
        assert_eq!(strip_version_suffix("cuCtxSynchronize"), "cuCtxSynchronize");
        assert_eq!(strip_version_suffix("cuMemcpyHtoD_v2"), "cuMemcpyHtoD");
        assert_eq!(strip_version_suffix("weird_v"), "weird_v");
    }

    #[test]
    fn missing_cupti_is_an_error_not_a_panic() {
        // No CUDA on CI machines: loading must fail cleanly with the searched paths listed.
        if let Err(e) = Cupti::load() {
            assert!(e.to_string().contains("libcupti"));
        }
    }
}
