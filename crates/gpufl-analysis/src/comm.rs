//! Communication kernels: the kernels of collective and point-to-point communication libraries
//! (NCCL, RCCL, MSCCL, NVSHMEM, vLLM's custom all-reduce, PyTorch symmetric memory, DeepEP,
//! Transformer Engine's userbuffers). Their time is mostly spent waiting for the other ranks, and
//! their grid is sized for the number of channels, not for the GPU: the kernel rules
//! (`under-filled-grid`, `low-occupancy`, `launch-bound`) leave them out, and the run rule
//! `collective-wait` reads them (docs/insights.md).

/// Prefixes of a communication kernel's name (after a leading `void ` and `::`), case-sensitive:
/// NCCL's `ncclKernel_…` / `ncclDevKernel_…` (RCCL keeps NCCL's names), MSCCL's `mscclKernel_…`.
pub const COMM_PREFIXES: [&str; 3] = ["nccl", "msccl", "rccl"];

/// Substrings of a communication kernel's name, matched case-insensitively.
pub const COMM_SUBSTRINGS: [&str; 6] = [
    "nvshmem",
    "cross_device_reduce",
    "symmetric_memory",
    "deep_ep::",
    "userbuffers",
    "c10d::",
];

/// Whether a kernel name is a communication library's.
pub fn is_comm_kernel(name: &str) -> bool {
    let n = name.trim_start();
    let n = n
        .strip_prefix("void ")
        .unwrap_or(n)
        .trim_start_matches("::");
    if COMM_PREFIXES.iter().any(|p| n.starts_with(p)) {
        return true;
    }
    let lower = n.to_ascii_lowercase();
    COMM_SUBSTRINGS.iter().any(|p| lower.contains(p))
}

/// Operations named in communication kernels, longest first so that `AllReduce` is not read as
/// `Reduce`.
const OPS: [&str; 10] = [
    "ReduceScatter",
    "AllReduce",
    "AllGather",
    "AllToAll",
    "Broadcast",
    "SendRecv",
    "Reduce",
    "Send",
    "Recv",
    "all_reduce",
];

/// The operation a communication kernel's name names (`ncclDevKernel_AllReduce_Sum_f32_RING_LL`
/// → `AllReduce`), if any.
pub fn collective_op(name: &str) -> Option<&'static str> {
    OPS.iter().copied().find(|op| name.contains(op))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn communication_kernels_by_name() {
        for n in [
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
            "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)",
            "void ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)",
            "mscclKernel_Sum_float_LL(int, int, mscclAlgo*, mscclWork*)",
            "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, int)",
            "nvshmemi_proxy_kernel",
            "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 2>(float**)",
        ] {
            assert!(is_comm_kernel(n), "{n}");
        }
        for n in [
            "ampere_sgemm_128x64_tn",
            "void at::native::vectorized_elementwise_kernel<4, float>(int, float)",
            "block_allreduce(float*, int)",
            "my_ncclish_kernel(float*)",
        ] {
            assert!(!is_comm_kernel(n), "{n}");
        }
        assert_eq!(
            collective_op("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)"),
            Some("AllReduce")
        );
        assert_eq!(
            collective_op("ncclKernel_ReduceScatter_RING_LL_Sum_float(x)"),
            Some("ReduceScatter")
        );
        assert_eq!(collective_op("nvshmemi_proxy_kernel"), None);
    }
}
