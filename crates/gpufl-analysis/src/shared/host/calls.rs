//! CUDA calls that hold the host (`hostcall` records): what each is ([`CallKind`]: the known
//! implicit synchronizers, allocations, module loads, …) with its fix, and the Python API behind
//! a call when its stack says (`torch.cuda.empty_cache()`). Read by `blocking-call`, and by the
//! idle findings when the host line they move to is in such a call.

use crate::ids::StackIx;
use crate::shared::advice::Fix;
use crate::shared::Ctx;
use serde::Serialize;

/// What a blocking call is.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum CallKind {
    /// `cudaFree`, `cuMemFree`: waits for the device to finish all its work.
    Free,
    /// `cudaMalloc`, `cuMemAlloc`, `cudaMallocAsync`, virtual memory mapping, …
    Alloc,
    /// `cudaMallocHost`, `cudaHostAlloc`, `cuMemHostAlloc`: pinned host memory.
    PinnedAlloc,
    /// `cudaFreeHost`, `cuMemFreeHost`.
    PinnedFree,
    /// `cudaHostRegister` / `Unregister`, `cuMemHostRegister` / `Unregister`.
    HostRegister,
    /// Module and library loads (the first use of a kernel under lazy loading included).
    ModuleLoad,
    /// CUDA graph instantiation, update, upload, destruction.
    Graph,
    /// Context, stream and event creation and destruction.
    Lifecycle,
    /// Device limits and configuration.
    Config,
    Other,
}

impl CallKind {
    /// The kind of a CUDA function by name.
    pub fn of(name: &str) -> CallKind {
        let starts = |ps: &[&str]| ps.iter().any(|p| name.starts_with(p));
        if starts(&["cudaFreeHost", "cuMemFreeHost"]) {
            CallKind::PinnedFree
        } else if starts(&[
            "cudaMallocHost",
            "cudaHostAlloc",
            "cuMemHostAlloc",
            "cuMemAllocHost",
        ]) {
            CallKind::PinnedAlloc
        } else if starts(&[
            "cudaHostRegister",
            "cudaHostUnregister",
            "cuMemHostRegister",
            "cuMemHostUnregister",
        ]) {
            CallKind::HostRegister
        } else if starts(&["cudaFreeAsync", "cuMemFreeAsync"]) {
            CallKind::Alloc
        } else if starts(&["cudaFree", "cuMemFree"]) {
            CallKind::Free
        } else if starts(&[
            "cudaMalloc",
            "cuMemAlloc",
            "cuMemCreate",
            "cuMemRelease",
            "cuMemMap",
            "cuMemUnmap",
            "cuMemSetAccess",
            "cuMemAddress",
            "cudaMemPoolTrimTo",
            "cuMemPoolTrimTo",
        ]) {
            CallKind::Alloc
        } else if super::is_module_load(name)
            || starts(&["cuModuleUnload", "cuLibraryUnload", "cudaLibraryUnload"])
        {
            CallKind::ModuleLoad
        } else if name.contains("Graph") {
            CallKind::Graph
        } else if starts(&["cuCtxCreate", "cuCtxDestroy", "cuDevicePrimaryCtx"])
            || name.contains("StreamCreate")
            || name.contains("StreamDestroy")
            || name.contains("EventCreate")
            || name.contains("EventDestroy")
        {
            CallKind::Lifecycle
        } else if starts(&[
            "cudaDeviceSetLimit",
            "cuCtxSetLimit",
            "cudaDeviceSetCacheConfig",
            "cudaDeviceReset",
            "cudaSetDevice",
            "cudaInitDevice",
        ]) {
            CallKind::Config
        } else {
            CallKind::Other
        }
    }

    /// Whether the call synchronizes with the device (an implicit synchronization).
    pub fn synchronizes(self) -> bool {
        matches!(
            self,
            CallKind::Free
                | CallKind::PinnedAlloc
                | CallKind::PinnedFree
                | CallKind::HostRegister
                | CallKind::Config
        )
    }

    /// What the call does to the host, for prose (after the call's name).
    pub(crate) fn what(self) -> &'static str {
        match self {
            CallKind::Free => {
                "waits for the device to finish all its work before it frees (an implicit \
                 synchronization of the whole device)"
            }
            CallKind::Alloc => {
                "allocates or maps device memory, which costs host time (and may wait for the \
                 device) at every call"
            }
            CallKind::PinnedAlloc => {
                "page-locks host memory, which is slow and synchronizes with the device"
            }
            CallKind::PinnedFree => {
                "synchronizes the device before it unpins and frees host memory"
            }
            CallKind::HostRegister => {
                "page-locks (or unlocks) existing host memory, which is slow and synchronizes \
                 with the device"
            }
            CallKind::ModuleLoad => {
                "loads a CUDA module (an explicit load, the first use of a kernel under lazy \
                 loading, or JIT-compiled code)"
            }
            CallKind::Graph => {
                "instantiates, updates or destroys a CUDA graph, which costs host time with its \
                 nodes"
            }
            CallKind::Lifecycle => "creates or destroys a context, stream or event",
            CallKind::Config => "changes the device's configuration, which synchronizes the device",
            CallKind::Other => "held the host",
        }
    }

    /// The fix, in each program's words.
    pub(crate) fn fix(self) -> &'static Fix {
        match self {
            CallKind::Free | CallKind::Alloc => &FIX_ALLOC,
            CallKind::PinnedAlloc | CallKind::PinnedFree | CallKind::HostRegister => &FIX_PINNED,
            CallKind::ModuleLoad => &FIX_MODULE_LOAD,
            CallKind::Graph => &FIX_GRAPH,
            CallKind::Lifecycle => &FIX_LIFECYCLE,
            CallKind::Config => &FIX_CONFIG,
            CallKind::Other => &FIX_CALL,
        }
    }
}

const FIX_ALLOC: Fix = Fix {
    native: "Allocate outside the loop and reuse the buffer; where sizes vary, use stream-ordered \
allocation (cudaMallocAsync / cudaFreeAsync on the stream, with a memory pool whose release \
threshold keeps memory cached: cudaMemPoolAttrReleaseThreshold) or a caching allocator \
(RMM), which return memory without waiting for the device.",
    python: None,
    torch: Some("Reuse memory across steps: PyTorch's caching allocator keeps freed blocks, so cudaMalloc / \
cudaFree in the loop mean it had to grow or hand memory back (torch.cuda.empty_cache(), \
sizes that change every step, fragmentation): keep tensor sizes steady (pad to a few sizes), \
allocate buffers once and reuse them, and set \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against fragmentation."),
    jax: None,
    cupy: Some("Reuse memory across steps: keep CuPy's memory pool (don't free its blocks in the loop) and \
reuse arrays; where sizes vary, use the stream-ordered pool (cupy.cuda.MemoryAsyncPool with \
cupy.cuda.set_allocator), which returns memory without waiting for the device."),
};

const FIX_PINNED: Fix = Fix {
    native: "Pin host buffers once and reuse them (a pool of pinned staging buffers allocated at startup \
with cudaHostAlloc), and free them at the end.",
    python: None,
    torch: Some("Pin host buffers once and reuse them (pinned tensors reused across steps, or \
DataLoader(pin_memory=True) rather than .pin_memory() per batch), and free them at the end."),
    jax: None,
    cupy: Some("Pin host buffers once and reuse them (cupyx.empty_pinned buffers allocated at startup; \
CuPy's pinned memory pool keeps them cached), and free them at the end."),
};

const FIX_MODULE_LOAD: Fix = Fix {
    native: "Load modules once, before the work you time: warm up every kernel (one call of each, or \
CUDA_MODULE_LOADING=EAGER), keep JIT-compiled code cached (CUDA's compute cache, \
CUDA_CACHE_PATH), and do not load or unload modules in the loop.",
    python: Some("Load modules once, before the work you time: warm up every kernel (one call of each, or \
CUDA_MODULE_LOADING=EAGER), keep JIT-compiled code cached (the framework's compilation \
cache), and do not load or unload modules in the loop."),
    torch: Some("Load modules once, before the work you time: run a warm-up step of the model first (PyTorch \
turns on CUDA's lazy loading: each kernel's module loads on its first launch; \
CUDA_MODULE_LOADING=EAGER loads them all at startup), keep compiled code cached \
(torch.compile's TORCHINDUCTOR_CACHE_DIR), and do not load or unload modules in the loop."),
    jax: Some("Load modules once, before the work you time: call every jitted function once with each shape \
it will see before timing (XLA compiles and loads its kernels on the first call), keep \
compiled code across runs (jax.config jax_compilation_cache_dir), and do not load or unload \
modules in the loop."),
    cupy: None,
};

const FIX_GRAPH: Fix = Fix::any(
    "Instantiate a graph once and replay it; when its parameters change, update the instantiated \
     graph (cudaGraphExecUpdate, cudaGraphExecKernelNodeSetParams) instead of instantiating it again.",
);

const FIX_LIFECYCLE: Fix = Fix::any(
    "Create streams, events and contexts once at startup and reuse them; destroy them at the end.",
);

const FIX_CONFIG: Fix = Fix::any(
    "Configure the device once at startup (limits, cache configuration, the device to use), not in \
     the loop.",
);

const FIX_CALL: Fix =
    Fix::any("Move the call out of the loop, or do it once and reuse its result.");

/// The fix of `torch.cuda.empty_cache()` in a loop.
pub(crate) const FIX_EMPTY_CACHE: &str = "Don't call torch.cuda.empty_cache() in the loop: it \
hands the caching allocator's free blocks back with cudaFree, which waits for the device, and the \
next allocations must get them again with cudaMalloc. Let the allocator reuse its blocks; call \
empty_cache only where another process or library needs the memory, and fight fragmentation with \
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead.";

/// The fix of freeing CuPy's memory pool in a loop.
pub(crate) const FIX_CUPY_POOL: &str = "Don't free CuPy's memory pool in the loop \
(free_all_blocks): it frees every cached block with cudaFree, which waits for the device, and the \
next allocations must get them again. Let the pool reuse its blocks, and bound it with set_limit \
instead.";

/// The Python API behind a call, from its stack's frames: `torch.cuda.empty_cache()`, CuPy's
/// pool `free_all_blocks()`.
pub(crate) fn python_api(cx: &Ctx, stack: Option<StackIx>) -> Option<&'static str> {
    let m = cx.m;
    let frames = m.stack(stack?)?;
    frames.iter().find_map(|&f| {
        let fr = m.frame(f)?;
        let (file, func) = (fr.file?, fr.func.unwrap_or(""));
        if func == "empty_cache" && file.ends_with("torch/cuda/memory.py") {
            Some("torch.cuda.empty_cache()")
        } else if func.ends_with("free_all_blocks") && file.contains("cupy") {
            Some("CuPy's memory pool free_all_blocks()")
        } else {
            None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_by_kind() {
        for (name, kind) in [
            ("cudaFree", CallKind::Free),
            ("cuMemFree_v2", CallKind::Free),
            ("cudaFreeHost", CallKind::PinnedFree),
            ("cudaFreeAsync", CallKind::Alloc),
            ("cudaMalloc", CallKind::Alloc),
            ("cuMemAlloc_v2", CallKind::Alloc),
            ("cudaMallocHost", CallKind::PinnedAlloc),
            ("cudaHostAlloc", CallKind::PinnedAlloc),
            ("cudaHostRegister", CallKind::HostRegister),
            ("cuModuleLoadData", CallKind::ModuleLoad),
            ("cuLibraryLoadData", CallKind::ModuleLoad),
            ("cudaGraphInstantiateWithFlags", CallKind::Graph),
            ("cudaStreamCreateWithFlags", CallKind::Lifecycle),
            ("cudaEventDestroy", CallKind::Lifecycle),
            ("cudaDeviceSetLimit", CallKind::Config),
            ("cudaSomethingNew", CallKind::Other),
        ] {
            assert_eq!(CallKind::of(name), kind, "{name}");
        }
        assert!(CallKind::Free.synchronizes() && !CallKind::Alloc.synchronizes());
    }
}
