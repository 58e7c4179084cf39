// launch_bound.cu - gpufl example: many tiny kernels, launch overhead dominates.
//
// N launches (default 20000) of a trivial kernel (1 block of 32 threads, a few
// instructions, ~2 us on the GPU) back to back on one created stream, one sync
// at the end. Each kernel does far less work than it costs to launch, so the
// run is bounded by the launch rate, not by the GPU. The launch is the planted
// line (its gpufl-example comment names the rule launch-bound). Fix: fuse the
// work into fewer, larger kernels, or capture the sequence into a CUDA graph.
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/launch_bound examples/launch_bound.cu
// Run:   build/launch_bound [launches=20000]
//        gpufl record -o DIR -- build/launch_bound 20000
// Prints: "launch_bound: launches=N checksum=0xC (expected 0xE) ok"; exit 0
//         With GPUFL_EXAMPLE_TIMING set, also one JSON line on stderr with the time per
//         launch of the loop (launches + the final copy and sync).
//         (exit 1 on a CUDA error or a checksum mismatch).
#include <chrono>
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

static const int THREADS = 32;

// One LCG step per thread: a few instructions.
__global__ void tick(unsigned* acc, unsigned k) {
    const unsigned t = threadIdx.x;
    acc[t] = acc[t] * 1664525u + 1013904223u + k;
}

int main(int argc, char** argv) {
    const int launches = argc > 1 ? atoi(argv[1]) : 20000;
    if (launches <= 0) {
        fprintf(stderr, "usage: %s [launches>0, default 20000]\n", argv[0]);
        return 2;
    }
    const size_t bytes = THREADS * sizeof(unsigned);
    unsigned *h_acc, *d_acc, expect[THREADS];
    CHECK(cudaMallocHost(&h_acc, bytes));  // pinned: the copies are truly async
    CHECK(cudaMalloc(&d_acc, bytes));
    for (int t = 0; t < THREADS; ++t) h_acc[t] = expect[t] = (unsigned)t;

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    CHECK(cudaMemcpyAsync(d_acc, h_acc, bytes, cudaMemcpyHostToDevice, stream));

    CHECK(cudaStreamSynchronize(stream));
    auto t0 = std::chrono::steady_clock::now();
    for (int k = 0; k < launches; ++k) {
        tick<<<1, THREADS, 0, stream>>>(d_acc, (unsigned)k);  // gpufl-example: launch-bound
    }
    // A failed launch stays reported by cudaGetLastError until it is read, so
    // one check after the loop keeps the loop itself launch-only.
    CHECK(cudaGetLastError());
    CHECK(cudaMemcpyAsync(h_acc, d_acc, bytes, cudaMemcpyDeviceToHost, stream));
    CHECK(cudaStreamSynchronize(stream));  // the one sync, after the loop
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    // Benchmarks (bench/launch_split.sh) read the launch rate from stderr; off by default so the
    // output is the same with and without the recorder.
    if (getenv("GPUFL_EXAMPLE_TIMING"))
        fprintf(stderr, "{\"launches\": %d, \"us_per_launch\": %.4f}\n", launches, us / launches);

    for (int k = 0; k < launches; ++k)
        for (int t = 0; t < THREADS; ++t) expect[t] = expect[t] * 1664525u + 1013904223u + (unsigned)k;
    unsigned sum = 0, want = 0;
    for (int t = 0; t < THREADS; ++t) {
        sum = sum * 31u + h_acc[t];
        want = want * 31u + expect[t];
    }
    const bool ok = sum == want;
    printf("launch_bound: launches=%d checksum=0x%08x (expected 0x%08x) %s\n", launches, sum, want,
           ok ? "ok" : "MISMATCH");

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFreeHost(h_acc));
    CHECK(cudaFree(d_acc));
    return ok ? 0 : 1;
}
