// occupancy_check.cu - the CUDA runtime's occupancy figures, to check gpufl's calculation.
//
// For kernels with controlled register use (N floats kept live per thread, with and without
// __launch_bounds__ caps that force fewer registers) and with static and dynamic shared memory,
// prints one JSON line per (kernel, block size, dynamic shared memory): the registers, static
// shared memory and local memory of cudaFuncGetAttributes, and the blocks per SM of
// cudaOccupancyMaxActiveBlocksPerMultiprocessor. The first line describes the device (its
// limits, as cudaDeviceGetAttribute reports them). gpufl's occupancy unit test
// (crates/gpufl-analysis/tests/analysis/occupancy_runtime.rs) reads these lines from
// testdata/occupancy/h100.jsonl and compares its own blocks per SM with the runtime's.
//
// With "launch" as argument, also launches each configuration once (one block), so that a
// recording (gpufl record) holds each configuration with the shared-memory carveout the driver
// chose for it (kernel records' smem_executed).
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -arch=sm_90 -o build/occupancy_check examples/occupancy_check.cu
// Run:   build/occupancy_check [launch] > occupancy.jsonl
// Prints: JSON lines; the last is {"cases": N, "launched": L, "errors": E}; exit 0 (1 on a CUDA
//         error outside the occupancy queries, whose errors are reported in their lines).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

#define CHECK(call)                                                        \
    do {                                                                   \
        cudaError_t err_ = (call);                                         \
        if (err_ != cudaSuccess) {                                         \
            fprintf(stderr, "CUDA error at %s:%d: %s (%s)\n", __FILE__,    \
                    __LINE__, cudaGetErrorString(err_), #call);            \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

static const int IN = 4096;

// N values live per thread across a loop (compile-time indices: registers unless capped).
template <int N>
__device__ __forceinline__ float relax(const float* __restrict__ in, int t, int iters) {
    float acc[N];
#pragma unroll
    for (int i = 0; i < N; ++i) acc[i] = in[(t + i * 7) % IN];
    for (int k = 0; k < iters; ++k) {
#pragma unroll
        for (int i = 0; i < N; ++i) acc[i] = fmaf(acc[i], 0.5f, 0.5f * acc[(i + 1) % N]);
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < N; ++i) s += acc[i];
    return s;
}

__global__ void light(const float* in, float* out, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = in[t % IN] * 2.0f + (float)iters;
}

// (No __restrict__ on kernel parameters here: the kernels are called through one pointer type.)
template <int N>
__global__ void pressure(const float* in, float* out, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = relax<N>(in, t, iters);
}

// Register caps: 65536 / (min blocks × max threads), rounded down by the compiler.
__global__ void __launch_bounds__(256, 2) capped_256_2(const float* in, float* out, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = relax<120>(in, t, iters);
}
__global__ void __launch_bounds__(256, 4) capped_256_4(const float* in, float* out, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = relax<120>(in, t, iters);
}
__global__ void __launch_bounds__(128, 6) capped_128_6(const float* in, float* out, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = relax<96>(in, t, iters);
}
__global__ void __launch_bounds__(1024, 1) capped_1024_1(const float* in, float* out, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = relax<96>(in, t, iters);
}

// Shared memory: 8 KiB static plus dynamic, or dynamic only. Their last argument is the
// dynamic size in bytes (they touch only what was allocated).
__device__ __forceinline__ float touch_dynamic(float v, int dyn_bytes) {
    extern __shared__ float dyn[];
    const int n = dyn_bytes / (int)sizeof(float);
    if (n > 0) {
        dyn[threadIdx.x % n] = v;
        __syncthreads();
        v += dyn[(threadIdx.x + 1) % n];
    }
    return v;
}
__global__ void smem_static(const float* in, float* out, int dyn_bytes) {
    __shared__ float buf[2048];
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    buf[threadIdx.x % 2048] = in[t % IN];
    __syncthreads();
    out[t] = touch_dynamic(buf[(threadIdx.x + 1) % blockDim.x % 2048], dyn_bytes);
}
__global__ void smem_dyn(const float* in, float* out, int dyn_bytes) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = touch_dynamic(in[t % IN], dyn_bytes);
}
// The same, with a carveout preference of 25 % of the SM's shared memory (set in main).
__global__ void smem_carve25(const float* in, float* out, int dyn_bytes) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = touch_dynamic(in[t % IN], dyn_bytes);
}

typedef void (*Kernel)(const float*, float*, int);

struct Case {
    const char* name;
    Kernel f;
    int carveout_pref;  // percent, -1: none
    bool smem;          // sweep dynamic shared memory
};

static int attr(cudaDeviceAttr a, int dev) {
    int v = -1;
    if (cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess) v = -1;
    return v;
}

int main(int argc, char** argv) {
    const bool launch = argc > 1 && strcmp(argv[1], "launch") == 0;
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, dev));
    const int optin = attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    printf("{\"device\": \"%s\", \"cc_major\": %d, \"cc_minor\": %d, \"sm_count\": %d, "
           "\"max_threads_per_block\": %d, \"max_threads_per_sm\": %d, \"max_blocks_per_sm\": %d, "
           "\"regs_per_sm\": %d, \"regs_per_block\": %d, \"smem_per_sm\": %d, \"smem_per_block\": %d, "
           "\"smem_per_block_optin\": %d, \"smem_reserved_per_block\": %d, \"warp_size\": %d, "
           "\"l2_bytes\": %d, \"sm_clock_khz\": %d, \"mem_clock_khz\": %d, \"mem_bus_bits\": %d}\n",
           p.name, p.major, p.minor, attr(cudaDevAttrMultiProcessorCount, dev),
           attr(cudaDevAttrMaxThreadsPerBlock, dev),
           attr(cudaDevAttrMaxThreadsPerMultiProcessor, dev),
           attr(cudaDevAttrMaxBlocksPerMultiprocessor, dev),
           attr(cudaDevAttrMaxRegistersPerMultiprocessor, dev),
           attr(cudaDevAttrMaxRegistersPerBlock, dev),
           attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
           attr(cudaDevAttrMaxSharedMemoryPerBlock, dev), optin,
           attr(cudaDevAttrReservedSharedMemoryPerBlock, dev), attr(cudaDevAttrWarpSize, dev),
           attr(cudaDevAttrL2CacheSize, dev), attr(cudaDevAttrClockRate, dev),
           attr(cudaDevAttrMemoryClockRate, dev), attr(cudaDevAttrGlobalMemoryBusWidth, dev));

    const Case cases[] = {
        {"light", light, -1, false},
        {"pressure<24>", pressure<24>, -1, false},
        {"pressure<40>", pressure<40>, -1, false},
        {"pressure<56>", pressure<56>, -1, false},
        {"pressure<72>", pressure<72>, -1, false},
        {"pressure<96>", pressure<96>, -1, false},
        {"pressure<120>", pressure<120>, -1, false},
        {"pressure<160>", pressure<160>, -1, false},
        {"pressure<200>", pressure<200>, -1, false},
        {"capped_256_2", capped_256_2, -1, false},
        {"capped_256_4", capped_256_4, -1, false},
        {"capped_128_6", capped_128_6, -1, false},
        {"capped_1024_1", capped_1024_1, -1, false},
        {"smem_static", smem_static, -1, true},
        {"smem_dyn", smem_dyn, -1, true},
        {"smem_carve25", smem_carve25, 25, true},
    };
    const int blocks[] = {32, 64, 96, 128, 160, 192, 256, 320, 384, 512, 640, 768, 1024};
    const int dyns[] = {0, 1024, 4096, 8192, 16384, 24576, 32768, 49152, 65536, 102400, 150000, 232448};

    float *in, *out;
    CHECK(cudaMalloc(&in, IN * sizeof(float)));
    CHECK(cudaMalloc(&out, 1024 * sizeof(float)));
    CHECK(cudaMemset(in, 0, IN * sizeof(float)));
    int n = 0, launched = 0, errors = 0;
    for (const Case& c : cases) {
        cudaFuncAttributes a;
        CHECK(cudaFuncGetAttributes(&a, c.f));
        if (c.smem) {
            // Opt in to the largest dynamic size the device allows beside the static part.
            CHECK(cudaFuncSetAttribute(c.f, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       optin - (int)a.sharedSizeBytes));
        }
        if (c.carveout_pref >= 0) {
            CHECK(cudaFuncSetAttribute(c.f, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       c.carveout_pref));
        }
        CHECK(cudaFuncGetAttributes(&a, c.f));
        for (int b : blocks) {
            if (b > a.maxThreadsPerBlock) continue;
            for (int d : dyns) {
                if (!c.smem && d != 0 && d != 16384) continue;
                if (c.smem && d > a.maxDynamicSharedSizeBytes) continue;
                // The register kernels do not use it: 16 KiB is only allocated for them.
                int per_sm = -1;
                cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, c.f, b, d);
                printf("{\"kernel\": \"%s\", \"threads\": %d, \"dyn_smem\": %d, \"regs\": %d, "
                       "\"static_smem\": %zu, \"local_bytes\": %zu, \"max_threads\": %d, "
                       "\"carveout_pref\": %d, \"blocks_per_sm\": %d",
                       c.name, b, d, a.numRegs, a.sharedSizeBytes, a.localSizeBytes,
                       a.maxThreadsPerBlock, c.carveout_pref, per_sm);
                if (e != cudaSuccess) {
                    printf(", \"error\": \"%s\"", cudaGetErrorString(e));
                    ++errors;
                    (void)cudaGetLastError();
                } else if (launch && per_sm > 0) {
                    c.f<<<1, b, d>>>(in, out, c.smem ? d : 1);
                    CHECK(cudaGetLastError());
                    printf(", \"launched\": true");
                    ++launched;
                }
                printf("}\n");
                ++n;
            }
        }
    }
    CHECK(cudaDeviceSynchronize());
    printf("{\"cases\": %d, \"launched\": %d, \"errors\": %d}\n", n, launched, errors);
    CHECK(cudaFree(in));
    CHECK(cudaFree(out));
    return 0;
}
