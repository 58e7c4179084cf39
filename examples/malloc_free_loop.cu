// malloc_free_loop.cu - gpufl example: cudaMalloc and cudaFree in the loop hold the host.
//
// Each of N iterations (argv[1], default 300) allocates a 16 MiB scratch buffer with
// cudaMalloc, launches a kernel (~100 us) that fills it and adds it into a persistent
// accumulator, and frees the buffer with cudaFree. cudaFree waits for the device to finish the
// work in flight before it returns, so every iteration the host blocks in cudaFree for the
// kernel, then pays cudaMalloc before the next launch: the GPU idles between kernels while the
// host is inside the allocator. Nothing else synchronizes in the loop; one cudaMemcpy at the end
// checks the result. Markers: `blocking-call` on the cudaFree line, `alloc-in-loop` on the
// cudaMalloc line, `launch` on the kernel launch.
// Fix: allocate the scratch buffer once, before the loop (or use cudaMallocAsync/cudaFreeAsync on
// the stream, or a pool).
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/malloc_free_loop examples/malloc_free_loop.cu
// Run:   build/malloc_free_loop [iters=300] [kernel_iters=400]
//        gpufl record -o DIR -- build/malloc_free_loop 300
// Prints: "malloc_free_loop: iters=N n=4194304 checksum=C ok"; exit 0
//         (exit 1 on a CUDA error or when sampled results differ from the host's).
#include <cmath>
#include <cstdio>
#include <cstdlib>
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

static const int N = 1 << 22;  // 16 MiB of floats
static const int BLOCK = 256;

// scratch[i] = chain^iters(i-th input, step); acc[i] += scratch[i]. Whole GPU, ~100 us with
// 400 iterations on an H100.
__global__ void fill_and_add(float* scratch, float* acc, int n, int iters, int step) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = (float)(i % 1024) * (1.0f / 1024.0f) + (float)step * 1e-3f;
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.999f, 0.001f);
        scratch[i] = v;
        acc[i] += v;
    }
}

static float expected(int i, int iters, int steps) {
    double sum = 0.0;
    for (int s = 0; s < steps; ++s) {
        float v = (float)(i % 1024) * (1.0f / 1024.0f) + (float)s * 1e-3f;
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.999f, 0.001f);
        sum += v;
    }
    return (float)sum;
}

int main(int argc, char** argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 300;
    int kernel_iters = argc > 2 ? atoi(argv[2]) : 400;
    float* acc = nullptr;
    CHECK(cudaMalloc(&acc, N * sizeof(float)));
    CHECK(cudaMemset(acc, 0, N * sizeof(float)));
    for (int step = 0; step < iters; ++step) {
        float* scratch = nullptr;
        CHECK(cudaMalloc(&scratch, N * sizeof(float)));  // gpufl-example: alloc-in-loop
        fill_and_add<<<(N + BLOCK - 1) / BLOCK, BLOCK>>>(scratch, acc, N, kernel_iters, step);  // gpufl-example: launch
        CHECK(cudaGetLastError());
        CHECK(cudaFree(scratch));  // gpufl-example: blocking-call
    }
    float* host = (float*)malloc(N * sizeof(float));
    CHECK(cudaMemcpy(host, acc, N * sizeof(float), cudaMemcpyDeviceToHost));
    double checksum = 0.0;
    bool ok = true;
    for (int i = 0; i < N; ++i) checksum += host[i];
    for (int i = 0; i < N; i += N / 16 + 7) {
        float want = expected(i, kernel_iters, iters);
        if (fabsf(host[i] - want) > 1e-3f * fmaxf(1.0f, fabsf(want))) {
            fprintf(stderr, "mismatch at %d: %f vs %f\n", i, host[i], want);
            ok = false;
        }
    }
    printf("malloc_free_loop: iters=%d n=%d checksum=%.3f %s\n", iters, N, checksum,
           ok ? "ok" : "FAIL");
    free(host);
    CHECK(cudaFree(acc));
    return ok ? 0 : 1;
}
