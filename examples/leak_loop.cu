// leak_loop.cu - gpufl example: a cudaMalloc per iteration that is never freed.
//
// Each of N iterations (argv[1], default 200) allocates an 8 MiB buffer (argv[2] MiB) with
// cudaMalloc (marker `leak`), launches a kernel that fills it, and forgets it: nothing frees it.
// The process's device memory grows by 8 MiB per iteration. The session's `memory-leak` finding
// names the marked line with its growth per allocation (8 MiB) and in all.
// Fix: allocate once before the loop and reuse the buffer (or free it each iteration).
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/leak_loop examples/leak_loop.cu
// Run:   build/leak_loop [iters=200] [mib=8]
//        gpufl record -o DIR -- build/leak_loop 200
// Prints: "leak_loop: iters=N mib=M used_before=X MiB used_after=Y MiB"; exit 0 (1 on a CUDA error).
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        cudaError_t err_ = (call);                                                     \
        if (err_ != cudaSuccess) {                                                     \
            fprintf(stderr, "CUDA error at %s:%d: %s\n", __FILE__, __LINE__,           \
                    cudaGetErrorString(err_));                                         \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

__global__ void fill(float *p, size_t n, float v) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        p[i] = v * (float)(i % 97);
}

static size_t used_mib() {
    size_t free_b = 0, total_b = 0;
    CHECK(cudaMemGetInfo(&free_b, &total_b));
    return (total_b - free_b) >> 20;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 200;
    size_t mib = argc > 2 ? (size_t)atoi(argv[2]) : 8;
    CHECK(cudaFree(0));
    size_t before = used_mib();
    size_t n = (mib << 20) / sizeof(float);
    for (int i = 0; i < iters; i++) {
        float *buf = nullptr;
        CHECK(cudaMalloc(&buf, n * sizeof(float)));  // gpufl-example: leak
        fill<<<264, 256>>>(buf, n, (float)i);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaDeviceSynchronize());
    printf("leak_loop: iters=%d mib=%zu used_before=%zu MiB used_after=%zu MiB\n", iters, mib,
           before, used_mib());
    return 0;
}
