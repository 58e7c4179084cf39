// stream_sync_loop.cu - gpufl example (b): a cudaStreamSynchronize inside a hot loop.
//
// Each of N iterations launches 3 small kernels (saxpy, scale, add) on one
// created stream and then blocks the host with cudaStreamSynchronize in step().
// The sync line is the planted "in-loop sync" that gpufl should attribute to
// this file and line (marked below with "gpufl-example: in-loop sync").
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/stream_sync_loop examples/stream_sync_loop.cu
// Run:   build/stream_sync_loop [iters=200]
//        gpufl record -o DIR -- build/stream_sync_loop 200
// Prints: "stream_sync_loop: iters=N n=1048576 checksum=C (expected E) ok"; exit 0
//         (exit 1 on any CUDA error or a checksum mismatch).
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

__global__ void saxpy(int n, float a, const float* x, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

__global__ void scale(int n, float s, float* y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = s * y[i];
}

__global__ void add(int n, const float* a, const float* b, float* c) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

// One iteration: y = 0.5 * (x + y); z = x + y; then wait for the stream.
void step(cudaStream_t stream, int n, const float* x, float* y, float* z) {
    const int block = 256;
    const int grid = (n + block - 1) / block;
    saxpy<<<grid, block, 0, stream>>>(n, 1.0f, x, y);
    CHECK(cudaGetLastError());
    scale<<<grid, block, 0, stream>>>(n, 0.5f, y);
    CHECK(cudaGetLastError());
    add<<<grid, block, 0, stream>>>(n, x, y, z);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(stream));  // gpufl-example: in-loop sync
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 200;
    if (iters <= 0) {
        fprintf(stderr, "usage: %s [iters>0, default 200]\n", argv[0]);
        return 2;
    }
    const int n = 1 << 20;  // 4 MiB per buffer: each kernel is a few us
    const size_t bytes = (size_t)n * sizeof(float);

    std::vector<float> h_x(n), h_z(n);
    double sum_x = 0.0;
    for (int i = 0; i < n; ++i) {
        h_x[i] = (float)(i % 1000) * 0.001f;
        sum_x += h_x[i];
    }

    float *d_x = nullptr, *d_y = nullptr, *d_z = nullptr;
    CHECK(cudaMalloc(&d_x, bytes));
    CHECK(cudaMalloc(&d_y, bytes));
    CHECK(cudaMalloc(&d_z, bytes));
    CHECK(cudaMemcpy(d_x, h_x.data(), bytes, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(d_y, 0, bytes));

    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));

    for (int it = 0; it < iters; ++it) step(stream, n, d_x, d_y, d_z);

    CHECK(cudaMemcpy(h_z.data(), d_z, bytes, cudaMemcpyDeviceToHost));
    double checksum = 0.0;
    for (int i = 0; i < n; ++i) checksum += h_z[i];

    // Closed form: y_k = x * (1 - 0.5^k), so z = x * (2 - 0.5^iters).
    const double expected = sum_x * (2.0 - std::pow(0.5, (double)iters));
    const bool ok = std::fabs(checksum - expected) <= 1e-4 * std::fabs(expected);
    printf("stream_sync_loop: iters=%d n=%d checksum=%.3f (expected %.3f) %s\n",
           iters, n, checksum, expected, ok ? "ok" : "MISMATCH");

    CHECK(cudaStreamDestroy(stream));
    CHECK(cudaFree(d_x));
    CHECK(cudaFree(d_y));
    CHECK(cudaFree(d_z));
    return ok ? 0 : 1;
}
