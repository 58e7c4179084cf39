//! CUPTI callback ids gpufl subscribes to. Values are CUPTI's (`cupti_runtime_cbid.h`,
//! `cupti_driver_cbid.h`); they never change between CUDA versions, new functions get new ids.

/// Runtime synchronization entry points: the sync callbacks capture stacks here.
pub const RUNTIME_SYNC: &[u32] = &[
    126, // cudaThreadSynchronize_v3020
    131, // cudaStreamSynchronize_v3020
    137, // cudaEventSynchronize_v3020
    147, // cudaStreamWaitEvent_v3020
    165, // cudaDeviceSynchronize_v3020
    239, // cudaStreamSynchronize_ptsz_v7000
    247, // cudaStreamWaitEvent_ptsz_v7000
    534, // cudaExecutionCtxSynchronize_v13010
    544, // cudaExecutionCtxWaitEvent_v13010
];

/// Driver synchronization entry points (programs using the driver API directly: CuPy, Triton, JAX).
pub const DRIVER_SYNC: &[u32] = &[
    17,  // cuCtxSynchronize
    121, // cuEventSynchronize
    126, // cuStreamSynchronize
    295, // cuStreamWaitEvent
    436, // cuStreamWaitEvent_ptsz
    440, // cuStreamSynchronize_ptsz
    800, // cuCtxSynchronize_v2
];

/// Runtime calls recorded as `api` records with `api_records = default` (besides the syncs):
/// launches, copies, memsets, allocations, event records, graph launches.
pub const RUNTIME_DEFAULT: &[u32] = &[
    20, 22, 25, 26, 27, // cudaMalloc, cudaFree, cudaMallocHost, cudaFreeHost, cudaHostAlloc
    31, 32, 41, 49,
    51,  // cudaMemcpy, cudaMemcpy2D, cudaMemcpyAsync, cudaMemset, cudaMemsetAsync
    135, // cudaEventRecord
    211, 214, // cudaLaunchKernel(_ptsz)
    215, 225, // cudaMemcpy_ptds, cudaMemcpyAsync_ptsz
    269, 270, // cudaLaunchCooperativeKernel(_ptsz)
    311, 312, // cudaGraphLaunch(_ptsz)
    373, 374, 375, 376, // cudaMallocAsync, cudaFreeAsync (+_ptsz)
    430, 431, // cudaLaunchKernelExC(_ptsz)
    505, 506, // __cudaLaunchKernel(_ptsz) (CUDA 13)
];

/// Driver calls recorded with `api_records = default`: launches, copies, memsets, allocations.
pub const DRIVER_DEFAULT: &[u32] = &[
    115, 116, 117, // cuLaunch, cuLaunchGrid, cuLaunchGridAsync
    119, // cuEventRecord
    216, 220, 249, 251, // cuMemsetD8Async, cuMemsetD32Async, cuMemsetD8, cuMemsetD32
    243, 245, // cuMemAlloc, cuMemFree
    276, 277, 278, 279, 280, 281, // cuMemcpyHtoD/DtoH/DtoD (+Async)
    305, 306, 307, // cuMemcpy, cuMemcpyAsync, cuLaunchKernel
    397, 398, 408, 411, 413, 418, 421, 422, 428, 430, 442, // _ptds/_ptsz variants
    477, 514, 515, 598, 652,
    653, // cooperative, graph launch, cuMemAllocAsync, cuLaunchKernelEx
];

/// Runtime query calls skipped even with `api_records = all`: PyTorch makes several per kernel.
pub const RUNTIME_NOISY: &[u32] = &[
    3,   // cudaGetDeviceCount
    10,  // cudaGetLastError
    11,  // cudaPeekAtLastError
    17,  // cudaGetDevice
    132, // cudaStreamQuery
    138, // cudaEventQuery
    200, // cudaDeviceGetAttribute
    240, // cudaStreamQuery_ptsz
    324, 325, 409, 410, 461, 462, // cudaStreamGetCaptureInfo variants
];

/// Driver query calls skipped even with `api_records = all`.
pub const DRIVER_NOISY: &[u32] = &[
    3,   // cuDeviceGet
    4,   // cuDeviceGetCount
    9,   // cuDeviceGetAttribute
    16,  // cuCtxGetDevice
    85,  // cuFuncGetAttribute
    120, // cuEventQuery
    125, // cuStreamQuery
    303, // cuCtxSetCurrent
    304, // cuCtxGetCurrent
    310, // cuPointerGetAttribute
    323, 324, // cuCtxPushCurrent, cuCtxPopCurrent
    386, // cuDevicePrimaryCtxRetain
    439, // cuStreamQuery_ptsz
    450, // cuPointerGetAttributes
    536, 537, 629, 630, 729, 730, // cuStreamGetCaptureInfo variants
];

/// Highest callback id enabled when `api_records = all` walks every id (those past the end of this
/// CUPTI's tables are rejected by CUPTI and ignored).
pub const MAX_CBID: u32 = 1200;

/// True if `cbid` of `domain` is a synchronization entry point.
pub fn is_sync(domain: u32, cbid: u32) -> bool {
    match domain {
        crate::cupti::DOMAIN_RUNTIME => RUNTIME_SYNC.contains(&cbid),
        crate::cupti::DOMAIN_DRIVER => DRIVER_SYNC.contains(&cbid),
        _ => false,
    }
}

/// What a synchronization entry point waits for, and whether its first parameter is the stream
/// (or event) handle and whether it is a per-thread-default-stream (`_ptsz`) variant.
pub fn sync_kind(domain: u32, cbid: u32) -> Option<(gpufl_trace::SyncKind, SyncParam, bool)> {
    use gpufl_trace::SyncKind::*;
    use SyncParam::*;
    let r = match (domain, cbid) {
        (crate::cupti::DOMAIN_RUNTIME, 126 | 165 | 534) => (ContextSynchronize, None, false),
        (crate::cupti::DOMAIN_RUNTIME, 131) => (StreamSynchronize, Stream, false),
        (crate::cupti::DOMAIN_RUNTIME, 239) => (StreamSynchronize, Stream, true),
        (crate::cupti::DOMAIN_RUNTIME, 137) => (EventSynchronize, Event, false),
        (crate::cupti::DOMAIN_RUNTIME, 147) => (StreamWaitEvent, Stream, false),
        (crate::cupti::DOMAIN_RUNTIME, 247) => (StreamWaitEvent, Stream, true),
        (crate::cupti::DOMAIN_RUNTIME, 544) => (StreamWaitEvent, None, false),
        (crate::cupti::DOMAIN_DRIVER, 17 | 800) => (ContextSynchronize, None, false),
        (crate::cupti::DOMAIN_DRIVER, 126) => (StreamSynchronize, Stream, false),
        (crate::cupti::DOMAIN_DRIVER, 440) => (StreamSynchronize, Stream, true),
        (crate::cupti::DOMAIN_DRIVER, 121) => (EventSynchronize, Event, false),
        (crate::cupti::DOMAIN_DRIVER, 295) => (StreamWaitEvent, Stream, false),
        (crate::cupti::DOMAIN_DRIVER, 436) => (StreamWaitEvent, Stream, true),
        _ => return Option::None,
    };
    Some(r)
}

/// Which handle the first parameter of a sync entry point is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncParam {
    None,
    Stream,
    Event,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sync_entry_point_has_a_kind() {
        for &id in RUNTIME_SYNC {
            assert!(
                sync_kind(crate::cupti::DOMAIN_RUNTIME, id).is_some(),
                "runtime {id}"
            );
        }
        for &id in DRIVER_SYNC {
            assert!(
                sync_kind(crate::cupti::DOMAIN_DRIVER, id).is_some(),
                "driver {id}"
            );
        }
        assert!(sync_kind(crate::cupti::DOMAIN_RUNTIME, 211).is_none());
    }

    #[test]
    fn graph_launch_ids_are_cuptis_and_recorded_by_default() {
        use crate::cupti::sys::CUpti_driver_api_trace_cbid_enum as Drv;
        use crate::cupti::sys::CUpti_runtime_api_trace_cbid_enum as Rt;
        let runtime = [
            Rt::CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_v10000 as u32,
            Rt::CUPTI_RUNTIME_TRACE_CBID_cudaGraphLaunch_ptsz_v10000 as u32,
        ];
        let driver = [
            Drv::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch as u32,
            Drv::CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz as u32,
        ];
        assert_eq!((runtime, driver), ([311, 312], [514, 515]));
        assert!(runtime.iter().all(|id| RUNTIME_DEFAULT.contains(id)));
        assert!(driver.iter().all(|id| DRIVER_DEFAULT.contains(id)));
    }
}
