// device_wide_sync.cu - gpufl example: cudaDeviceSynchronize where one stream's sync would do.
//
// Two non-blocking streams: "background" runs a long kernel (~5 ms) launched
// every iteration, whose result nobody reads until the end; "work" runs short
// work (~0.5 ms kernel + a 64 KB download into pinned memory) whose result the
// host needs each iteration. Each of N iterations waits with
// cudaDeviceSynchronize (the planted line; its gpufl-example comment names the
// rule device-wide-sync), so the host waits for the background kernel too:
// ~5 ms per iteration instead of ~0.5 ms. Fix: cudaStreamSynchronize(work)
// (or an event recorded after the download).
// Each kernel runs 64 blocks (half of an H100's SMs), so they run side by side.
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/device_wide_sync examples/device_wide_sync.cu
// Run:   build/device_wide_sync [iters=20] [bg_iters=2200000] [work_iters=220000]
//        gpufl record -o DIR -- build/device_wide_sync 20
// Prints: "device_wide_sync: iters=N checksum_work=W checksum_bg=B ok"; exit 0
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

static const int BLOCK = 256;
static const int GRID = 64;          // half of the H100's 132 SMs per kernel
static const int N = GRID * BLOCK;   // one element per thread: latency-bound, ~iters * 4 cycles

// out[i] = chain^iters(in[i] + offset), chain: v -> 0.9999 v + 0.0001.
__global__ void chain(const float* in, float* out, int n, int iters, float offset) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = in[i] + offset;
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.9999f, 0.0001f);
        out[i] = v;
    }
}

// Host version; the map is monotone, so a value that stops changing is a fixed point.
static float chain_host(float v, long long iters) {
    for (long long k = 0; k < iters; ++k) {
        const float nv = std::fmaf(v, 0.9999f, 0.0001f);
        if (nv == v) break;
        v = nv;
    }
    return v;
}

static float input_value(int i) { return (float)(i % 1024) / 1024.0f; }

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 20;
    const int bg_iters = argc > 2 ? atoi(argv[2]) : 2200000;
    const int work_iters = argc > 3 ? atoi(argv[3]) : 220000;
    if (iters <= 0 || bg_iters < 0 || work_iters < 0) {
        fprintf(stderr, "usage: %s [iters>0, default 20] [bg_iters=2200000] [work_iters=220000]\n",
                argv[0]);
        return 2;
    }
    const size_t bytes = (size_t)N * sizeof(float);  // 64 KB

    float *h_in, *h_work, *h_bg, *d_in, *d_work, *d_bg;
    CHECK(cudaMallocHost(&h_in, bytes));
    CHECK(cudaMallocHost(&h_work, bytes));
    CHECK(cudaMallocHost(&h_bg, bytes));
    CHECK(cudaMalloc(&d_in, bytes));
    CHECK(cudaMalloc(&d_work, bytes));
    CHECK(cudaMalloc(&d_bg, bytes));
    for (int i = 0; i < N; ++i) h_in[i] = input_value(i);

    cudaStream_t bg, work;
    CHECK(cudaStreamCreateWithFlags(&bg, cudaStreamNonBlocking));
    CHECK(cudaStreamCreateWithFlags(&work, cudaStreamNonBlocking));
    CHECK(cudaMemcpyAsync(d_in, h_in, bytes, cudaMemcpyHostToDevice, work));
    CHECK(cudaMemcpyAsync(d_bg, d_in, bytes, cudaMemcpyDeviceToDevice, work));
    CHECK(cudaStreamSynchronize(work));

    bool ok = true;
    double sum_work = 0.0;
    for (int it = 0; it < iters; ++it) {
        // Background: ~5 ms, in place; nobody needs it before the end.
        chain<<<GRID, BLOCK, 0, bg>>>(d_bg, d_bg, N, bg_iters, 0.0f);
        CHECK(cudaGetLastError());
        // Work: ~0.5 ms, then the host needs its result.
        const float offset = (float)it * 0.01f;
        chain<<<GRID, BLOCK, 0, work>>>(d_in, d_work, N, work_iters, offset);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(h_work, d_work, bytes, cudaMemcpyDeviceToHost, work));
        CHECK(cudaDeviceSynchronize());  // gpufl-example: device-wide-sync
        for (int i = 0; i < N; ++i) sum_work += h_work[i];
        const int j = (it * 211) % N;
        if (h_work[j] != chain_host(input_value(j) + offset, work_iters)) ok = false;
    }

    CHECK(cudaMemcpyAsync(h_bg, d_bg, bytes, cudaMemcpyDeviceToHost, bg));
    CHECK(cudaStreamSynchronize(bg));
    double sum_bg = 0.0;
    for (int i = 0; i < N; ++i) sum_bg += h_bg[i];
    for (int i = 0; i < N; i += 997)
        if (h_bg[i] != chain_host(input_value(i), (long long)iters * bg_iters)) ok = false;
    printf("device_wide_sync: iters=%d checksum_work=%.4f checksum_bg=%.4f %s\n", iters, sum_work,
           sum_bg, ok ? "ok" : "MISMATCH");

    CHECK(cudaStreamDestroy(bg));
    CHECK(cudaStreamDestroy(work));
    CHECK(cudaFreeHost(h_in));
    CHECK(cudaFreeHost(h_work));
    CHECK(cudaFreeHost(h_bg));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_work));
    CHECK(cudaFree(d_bg));
    return ok ? 0 : 1;
}
