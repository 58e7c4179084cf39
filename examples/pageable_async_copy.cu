// pageable_async_copy.cu - gpufl example: cudaMemcpyAsync from pageable (malloc) host memory.
//
// The host input is a plain malloc buffer (pageable). Each of N iterations
// uploads it (16 MiB) with cudaMemcpyAsync on a created stream, runs a kernel
// on it and downloads the result into a pinned buffer (cudaMallocHost), then
// waits for the stream once. The upload is the planted line (its gpufl-example
// comment names the rule pageable-async-copy): from pageable memory the driver
// first copies the data through a pinned staging buffer, so the "async" call
// blocks the host and cannot overlap anything. Fix: allocate the input with
// cudaMallocHost / cudaHostAlloc (or cudaHostRegister the malloc buffer).
// The download goes to pinned memory, so it is a true async copy and must not
// be flagged.
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/pageable_async_copy examples/pageable_async_copy.cu
// Run:   build/pageable_async_copy [iters=20]
//        gpufl record -o DIR -- build/pageable_async_copy 20
// Prints: "pageable_async_copy: iters=N n=4194304 checksum=C ok"; exit 0
//         (exit 1 on a CUDA error or when the results differ from the host's).
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

// x = a * x + b (one fused multiply-add per element, memory-bound, ~10 us for 16 MiB).
__global__ void scale_add(float* x, int n, float a, float b) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = fmaf(x[i], a, b);
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters <= 0) {
        fprintf(stderr, "usage: %s [iters>0, default 20]\n", argv[0]);
        return 2;
    }
    const int n = 1 << 22;  // 16 MiB
    const size_t bytes = (size_t)n * sizeof(float);
    const int block = 256, grid = (n + block - 1) / block;

    float* h_src = (float*)malloc(bytes);  // pageable: the pitfall
    if (!h_src) {
        fprintf(stderr, "malloc failed\n");
        return 1;
    }
    for (int i = 0; i < n; ++i) h_src[i] = (float)(i % 1000) * 0.001f;
    float *h_dst, *d_x;
    CHECK(cudaMallocHost(&h_dst, bytes));  // pinned: the download is fine
    CHECK(cudaMalloc(&d_x, bytes));

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));

    double consumed = 0.0;  // the host uses each iteration's result
    for (int it = 0; it < iters; ++it) {
        CHECK(cudaMemcpyAsync(d_x, h_src, bytes, cudaMemcpyHostToDevice, stream));  // gpufl-example: pageable-async-copy
        scale_add<<<grid, block, 0, stream>>>(d_x, n, 0.5f, (float)it);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(h_dst, d_x, bytes, cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        consumed += h_dst[(it * 7919) % n];
    }

    // Last iteration: h_dst = 0.5 * h_src + (iters - 1), exactly as fmaf computes it.
    bool ok = true;
    double checksum = consumed;
    for (int i = 0; i < n; ++i) {
        if (h_dst[i] != std::fmaf(h_src[i], 0.5f, (float)(iters - 1))) ok = false;
        checksum += h_dst[i];
    }
    printf("pageable_async_copy: iters=%d n=%d checksum=%.3f %s\n", iters, n, checksum,
           ok ? "ok" : "MISMATCH");

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFreeHost(h_dst));
    CHECK(cudaFree(d_x));
    free(h_src);
    return ok ? 0 : 1;
}
