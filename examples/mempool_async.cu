// mempool_async.cu - gpufl example: stream-ordered allocations from the device's memory pool.
//
// Phases on one stream, 64 MiB blocks (argv[1] blocks per phase, default 16):
//   1. cudaMallocAsync N blocks (marker `pool-alloc`), a kernel fills each; sync;
//   2. cudaFreeAsync every other block (marker `pool-free`); sync; trim the pool to 0;
//   3. cudaMallocAsync N/2 more; sync;
//   4. free everything; sync; trim.
// The pool's release threshold is left at its default (0: memory goes back at each sync and
// trim), so the device's used memory follows the live allocations. After each phase the program
// prints the device's used memory (cudaMemGetInfo, what NVML counts) minus its value before the
// first allocation, and its own live bytes: the analysis's memory over time should match within
// 5 %.
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/mempool_async examples/mempool_async.cu
// Run:   build/mempool_async [blocks=16]
// Prints: "mempool_async: baseline_unix_ms=T" (when the baseline was read; 400 ms without
//         allocations follow), "mempool_async: phase P live=L MiB used_delta=D MiB" per phase, then
//         "mempool_async: peak_live=L MiB peak_used_delta=D MiB"; exit 0 (1 on a CUDA error).
#include <cstdio>
#include <cstdlib>
#include <time.h>
#include <unistd.h>
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
        p[i] = v;
}

static long long used_bytes() {
    size_t f = 0, t = 0;
    CHECK(cudaMemGetInfo(&f, &t));
    return (long long)(t - f);
}

int main(int argc, char **argv) {
    int blocks = argc > 1 ? atoi(argv[1]) : 16;
    const size_t bytes = 64u << 20;
    cudaStream_t s;
    CHECK(cudaStreamCreate(&s));
    cudaMemPool_t pool;
    CHECK(cudaDeviceGetDefaultMemPool(&pool, 0));
    long long base = used_bytes();
    // The moment the baseline was read (the context exists, nothing allocated yet), then a pause
    // nothing allocates in: NVML samples of it are the context-only baseline.
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    printf("mempool_async: baseline_unix_ms=%lld\n", (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
    fflush(stdout);
    usleep(400 * 1000);
    long long live = 0, peak_live = 0, peak_delta = 0;
    std::vector<float *> bufs;
    auto report = [&](int phase) {
        CHECK(cudaStreamSynchronize(s));
        long long d = used_bytes() - base;
        if (live > peak_live) peak_live = live;
        if (d > peak_delta) peak_delta = d;
        printf("mempool_async: phase %d live=%lld MiB used_delta=%lld MiB\n", phase, live >> 20,
               d >> 20);
        fflush(stdout);
        usleep(300000);  // let nvidia-smi sample this phase
    };
    for (int i = 0; i < blocks; i++) {
        float *p = nullptr;
        CHECK(cudaMallocAsync((void **)&p, bytes, s));  // gpufl-example: pool-alloc
        fill<<<264, 256, 0, s>>>(p, bytes / sizeof(float), 1.0f);
        bufs.push_back(p);
        live += bytes;
    }
    report(1);
    for (size_t i = 0; i < bufs.size(); i += 2) {
        CHECK(cudaFreeAsync(bufs[i], s));  // gpufl-example: pool-free
        bufs[i] = nullptr;
        live -= bytes;
    }
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemPoolTrimTo(pool, 0));
    report(2);
    for (int i = 0; i < blocks / 2; i++) {
        float *p = nullptr;
        CHECK(cudaMallocAsync((void **)&p, bytes, s));
        fill<<<264, 256, 0, s>>>(p, bytes / sizeof(float), 2.0f);
        bufs.push_back(p);
        live += bytes;
    }
    report(3);
    for (float *p : bufs)
        if (p) CHECK(cudaFreeAsync(p, s));
    live = 0;
    CHECK(cudaStreamSynchronize(s));
    CHECK(cudaMemPoolTrimTo(pool, 0));
    report(4);
    printf("mempool_async: peak_live=%lld MiB peak_used_delta=%lld MiB\n", peak_live >> 20,
           peak_delta >> 20);
    return 0;
}
