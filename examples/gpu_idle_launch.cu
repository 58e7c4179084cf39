// gpu_idle_launch.cu - gpufl example: the GPU idles because the host launches too slowly.
//
// Each of N iterations the host does ~300 us of CPU work (a xorshift loop of
// 2-3.5 ns a step whose result feeds the kernel, so it cannot be optimized away)
// and then launches a short kernel (~55 us) on a created stream. Nothing waits
// inside the loop, yet the GPU is busy only ~55 of every ~300 us: it sits idle
// waiting for the next launch. The launch is the planted line (its gpufl-example comment names
// the rule gpu-idle). Fix: move the CPU work off the launching thread, batch
// more GPU work per launch, or move the CPU work to the GPU.
// One cudaStreamSynchronize at the end.
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/gpu_idle_launch examples/gpu_idle_launch.cu
// Run:   build/gpu_idle_launch [iters=500] [host_steps=120000] [kernel_iters=1300]
//        gpufl record -o DIR -- build/gpu_idle_launch 500
// Prints: "gpu_idle_launch: iters=N host=H checksum=C ok"; exit 0
//         (exit 1 on a CUDA error or when sampled results differ from the host's).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
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

static const int N = 1 << 20;  // 4 MiB
static const int BLOCK = 256;

// x = chain^iters(x + bias), chain: v -> 0.9999 v + 0.0001. Whole GPU, ~54 us
// with 1300 iterations on an H100.
__global__ void step_kernel(float* x, int n, int iters, float bias) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i] + bias;
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.9999f, 0.0001f);
        x[i] = v;
    }
}

// The host's per-iteration work: a dependent xorshift64 chain (2-3.5 ns a step on the H100 host).
static uint64_t host_work(uint64_t x, int steps) {
    for (int k = 0; k < steps; ++k) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    return x;
}

static float bias_of(uint64_t h) { return (float)(h & 1023) * (1.0f / 1048576.0f); }
static float input_value(int i) { return (float)(i % 4096) / 4096.0f; }

// Host version of one launch for one element (monotone map: stop at a fixed point).
static float step_host(float v, int iters, float bias) {
    v = v + bias;
    for (int k = 0; k < iters; ++k) {
        const float nv = std::fmaf(v, 0.9999f, 0.0001f);
        if (nv == v) break;
        v = nv;
    }
    return v;
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 500;
    const int host_steps = argc > 2 ? atoi(argv[2]) : 120000;
    const int kiters = argc > 3 ? atoi(argv[3]) : 1300;
    if (iters <= 0 || host_steps < 0 || kiters < 0) {
        fprintf(stderr, "usage: %s [iters>0, default 500] [host_steps=120000] [kernel_iters=1300]\n",
                argv[0]);
        return 2;
    }
    const size_t bytes = (size_t)N * sizeof(float);
    const int grid = (N + BLOCK - 1) / BLOCK;

    float *h_x, *d_x;
    CHECK(cudaMallocHost(&h_x, bytes));
    CHECK(cudaMalloc(&d_x, bytes));
    for (int i = 0; i < N; ++i) h_x[i] = input_value(i);

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMemcpyAsync(d_x, h_x, bytes, cudaMemcpyHostToDevice, stream));

    const int samples[4] = {0, 12345, N / 2 + 777, N - 1};
    float expect[4];
    for (int s = 0; s < 4; ++s) expect[s] = input_value(samples[s]);

    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int it = 0; it < iters; ++it) {
        h = host_work(h + (uint64_t)it, host_steps);  // ~300 us of CPU work
        const float bias = bias_of(h);
        step_kernel<<<grid, BLOCK, 0, stream>>>(d_x, N, kiters, bias);  // gpufl-example: gpu-idle
        CHECK(cudaGetLastError());
        for (int s = 0; s < 4; ++s) expect[s] = step_host(expect[s], kiters, bias);
    }

    CHECK(cudaMemcpyAsync(h_x, d_x, bytes, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));  // the one sync, after the loop

    bool ok = true;
    for (int s = 0; s < 4; ++s)
        if (h_x[samples[s]] != expect[s]) ok = false;
    double checksum = 0.0;
    for (int i = 0; i < N; ++i) checksum += h_x[i];
    printf("gpu_idle_launch: iters=%d host=%016llx checksum=%.4f %s\n", iters,
           (unsigned long long)h, checksum, ok ? "ok" : "MISMATCH");

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFreeHost(h_x));
    CHECK(cudaFree(d_x));
    return ok ? 0 : 1;
}
