// blocking_copy.cu - gpufl example: a large synchronous cudaMemcpy in a loop.
//
// Each of N iterations uploads 4 KB of parameters with cudaMemcpy, runs a
// kernel on the legacy default stream that writes 32 MiB, and downloads the
// 32 MiB with a plain cudaMemcpy into a pinned buffer. The download is the
// planted line (its gpufl-example comment names the rule blocking-copy): the
// host waits for the kernel and then for the whole transfer, and nothing can be
// queued meanwhile. Fix: cudaMemcpyAsync on a created stream into pinned memory,
// and wait (event / stream sync) only where the host reads the data.
// The 4 KB upload is also a synchronous cudaMemcpy, but small (<= 64 KB): it
// must NOT be flagged (its marker comment says so: small-h2d-not-flagged).
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/blocking_copy examples/blocking_copy.cu
// Run:   build/blocking_copy [iters=20]
//        gpufl record -o DIR -- build/blocking_copy 20
// Prints: "blocking_copy: iters=N n=8388608 checksum=C ok"; exit 0
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

static const int NPARAMS = 1024;  // 4 KB of parameters

// out[i] = (i mod 65536) * 0.001 + params[i mod 1024]; memory-bound, ~15 us for 32 MiB.
__global__ void produce(float* out, int n, const float* params) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = fmaf((float)(i & 0xffff), 0.001f, params[i & (NPARAMS - 1)]);
}

static float expected(int i, const float* params) {
    return std::fmaf((float)(i & 0xffff), 0.001f, params[i & (NPARAMS - 1)]);
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters <= 0) {
        fprintf(stderr, "usage: %s [iters>0, default 20]\n", argv[0]);
        return 2;
    }
    const int n = 1 << 23;  // 32 MiB of results per iteration
    const size_t bytes = (size_t)n * sizeof(float);
    const size_t pbytes = NPARAMS * sizeof(float);
    const int block = 256, grid = (n + block - 1) / block;

    static float params[NPARAMS];
    float *h_out, *d_out, *d_params;
    CHECK(cudaMallocHost(&h_out, bytes));  // pinned: only the synchronous call is the problem
    CHECK(cudaMalloc(&d_out, bytes));
    CHECK(cudaMalloc(&d_params, pbytes));

    bool ok = true;
    double checksum = 0.0;
    for (int it = 0; it < iters; ++it) {
        for (int j = 0; j < NPARAMS; ++j) params[j] = (float)(it + j) * 0.5f;
        CHECK(cudaMemcpy(d_params, params, pbytes, cudaMemcpyHostToDevice));  // gpufl-example: small-h2d-not-flagged
        produce<<<grid, block>>>(d_out, n, d_params);  // legacy default stream
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(h_out, d_out, bytes, cudaMemcpyDeviceToHost));  // gpufl-example: blocking-copy
        // The host uses the results: a sample of them, checked against the formula.
        for (int i = it; i < n; i += 4099) {
            if (h_out[i] != expected(i, params)) ok = false;
            checksum += h_out[i];
        }
    }
    printf("blocking_copy: iters=%d n=%d checksum=%.3f %s\n", iters, n, checksum,
           ok ? "ok" : "MISMATCH");

    CHECK(cudaFreeHost(h_out));
    CHECK(cudaFree(d_out));
    CHECK(cudaFree(d_params));
    return ok ? 0 : 1;
}
