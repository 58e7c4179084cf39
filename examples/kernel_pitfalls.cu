// kernel_pitfalls.cu - gpufl example: three kernel-level pitfalls, one kernel each.
//
//   regs_heavy  keeps ~120 floats live per thread (~128 registers): at 256 threads a block
//               the register file holds 2 blocks per SM = 16 of 64 warps, 25 % theoretical
//               occupancy (rule low-occupancy, limited by registers; the fix it prints:
//               registers → <= 64 with __launch_bounds__(256, 4)).
//   spills      the same work under __launch_bounds__(256, 4): the compiler must fit 64
//               registers, so it spills the rest to local memory (rule register-spill;
//               `nvcc --resource-usage` shows the spill stores and the stack frame).
//   small_grid  a long, latency-bound loop run by only 32 blocks: 100 of the H100's 132 SMs
//               have nothing to do for the whole kernel (rule under-filled-grid).
//
// Each runs R times (argv[1], default 20) on one created stream, about a third of the GPU time
// each; one sync at the end. The three launch lines are the planted lines (their gpufl-example
// comments name the rules). Results of a sample of threads are checked against the host.
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -arch=sm_90 -o build/kernel_pitfalls examples/kernel_pitfalls.cu
// Registers and spills: nvcc -arch=sm_90 --resource-usage -c -o /dev/null examples/kernel_pitfalls.cu
// Run:   build/kernel_pitfalls [reps=20] [iters=200] [grid_iters=1000000]
//        gpufl record -o DIR -- build/kernel_pitfalls 20
// Prints: "kernel_pitfalls: reps=R iters=I grid_iters=G checksum=C ok"; exit 0
//         (exit 1 on a CUDA error or when sampled results differ from the host's).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
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

static const int LIVE = 120;         // floats each thread keeps live in regs_heavy / spills
static const int BLOCK = 256;
static const int BIG_GRID = 132 * 16;  // 2112 blocks: many waves at any occupancy
static const int SMALL_GRID = 32;      // fewer blocks than the H100's 132 SMs
static const int IN = 4096;            // input values, reused by every thread

__host__ __device__ inline float input_value(int i) { return (float)(i % 1000) / 1000.0f; }

// The shared body: LIVE values per thread, each step replaced by the mean of itself and its
// neighbour (bounded: no overflow, no denormals), all of them live across the loop.
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

// No register cap: the compiler keeps every value in a register (~128 per thread).
__global__ void regs_heavy(const float* __restrict__ in, float* __restrict__ out, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = relax<LIVE>(in, t, iters);
}

// At most 64 registers per thread (4 blocks of 256 threads per SM): the rest spill.
__global__ void __launch_bounds__(256, 4)
    spills(const float* __restrict__ in, float* __restrict__ out, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    out[t] = relax<LIVE>(in, t, iters);
}

// A dependent chain per thread: long, latency-bound, and only SMALL_GRID blocks of it.
__global__ void small_grid(float* __restrict__ x, int iters) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    float v = x[t];
    for (int k = 0; k < iters; ++k) v = fmaf(v, 0.9999f, 0.0001f);
    x[t] = v;
}

// Host versions for a sample of threads (same operations in the same order: exact).
static float relax_host(const std::vector<float>& in, int t, int iters) {
    float acc[LIVE];
    for (int i = 0; i < LIVE; ++i) acc[i] = in[(t + i * 7) % IN];
    for (int k = 0; k < iters; ++k)
        for (int i = 0; i < LIVE; ++i) acc[i] = fmaf(acc[i], 0.5f, 0.5f * acc[(i + 1) % LIVE]);
    float s = 0.0f;
    for (int i = 0; i < LIVE; ++i) s += acc[i];
    return s;
}

static float chain_host(float v, int iters, int reps) {
    for (int r = 0; r < reps; ++r)
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.9999f, 0.0001f);
    return v;
}

int main(int argc, char** argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 20;
    const int iters = argc > 2 ? atoi(argv[2]) : 200;
    const int grid_iters = argc > 3 ? atoi(argv[3]) : 1000000;
    if (reps <= 0 || iters <= 0 || grid_iters <= 0) {
        fprintf(stderr, "usage: %s [reps>0] [iters>0] [grid_iters>0]\n", argv[0]);
        return 2;
    }
    const int big = BIG_GRID * BLOCK, small = SMALL_GRID * BLOCK;
    std::vector<float> h_in(IN), h_x(small);
    for (int i = 0; i < IN; ++i) h_in[i] = input_value(i);
    for (int i = 0; i < small; ++i) h_x[i] = input_value(i);
    float *d_in, *d_a, *d_b, *d_x;
    CHECK(cudaMalloc(&d_in, IN * sizeof(float)));
    CHECK(cudaMalloc(&d_a, big * sizeof(float)));
    CHECK(cudaMalloc(&d_b, big * sizeof(float)));
    CHECK(cudaMalloc(&d_x, small * sizeof(float)));
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaMemcpyAsync(d_in, h_in.data(), IN * sizeof(float), cudaMemcpyHostToDevice, s));
    CHECK(cudaMemcpyAsync(d_x, h_x.data(), small * sizeof(float), cudaMemcpyHostToDevice, s));

    for (int r = 0; r < reps; ++r) {
        regs_heavy<<<BIG_GRID, BLOCK, 0, s>>>(d_in, d_a, iters);  // gpufl-example: low-occupancy
        spills<<<BIG_GRID, BLOCK, 0, s>>>(d_in, d_b, iters);  // gpufl-example: register-spill
        small_grid<<<SMALL_GRID, BLOCK, 0, s>>>(d_x, grid_iters);  // gpufl-example: under-filled-grid
    }
    CHECK(cudaGetLastError());
    std::vector<float> a(big), b(big), x(small);
    CHECK(cudaMemcpyAsync(a.data(), d_a, big * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaMemcpyAsync(b.data(), d_b, big * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaMemcpyAsync(x.data(), d_x, small * sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK(cudaStreamSynchronize(s));  // the one sync, after the loop

    bool ok = true;
    double checksum = 0.0;
    for (int t = 0; t < big; t += 9973) {
        const float want = relax_host(h_in, t, iters);
        ok = ok && a[t] == want && b[t] == want;
        checksum += a[t];
    }
    for (int t = 0; t < small; t += 2048) {
        const float want = chain_host(h_x[t], grid_iters, reps);
        ok = ok && fabsf(x[t] - want) <= 1e-6f * fabsf(want) + 1e-6f;
        checksum += x[t];
    }
    printf("kernel_pitfalls: reps=%d iters=%d grid_iters=%d checksum=%.4f %s\n", reps, iters,
           grid_iters, checksum, ok ? "ok" : "MISMATCH");

    CHECK(cudaStreamDestroy(s));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    CHECK(cudaFree(d_x));
    return ok ? 0 : 1;
}
