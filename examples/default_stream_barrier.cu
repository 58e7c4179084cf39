// default_stream_barrier.cu - gpufl example: a hidden default-stream copy serializes two streams.
//
// After the "default stream trap in practice" of the CUDA streams tutorial (seed
// streams.md): two blocking streams s1 and s2 (cudaStreamCreate), and a utility
// prepare_data() that uploads kernel B's input with a plain cudaMemcpy, i.e. on
// the legacy default stream. Each of N iterations:
//   kernel A on s1 (~1 ms) -> prepare_data (4 MiB, pinned) -> kernel B on s2 (~1 ms).
// Each kernel runs 64 blocks (half of an H100's SMs), so A and B could run side
// by side; but the default-stream copy waits for all prior work of s1 and s2
// (this iteration's A and the previous iteration's B) and holds back all later
// work, and cudaMemcpy also blocks the host meanwhile: every iteration drains
// both streams, A and B of one iteration never overlap, and the copy itself
// never overlaps a kernel (measured on an H100: ~1.16 ms per iteration for
// ~1.04 ms kernels; B(i) still overlaps A(i+1)). The copy inside prepare_data()
// is the planted line (its gpufl-example comment names the rule
// default-stream-barrier). Fix: cudaMemcpyAsync(..., s2) there.
// One cudaDeviceSynchronize at the end.
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/default_stream_barrier examples/default_stream_barrier.cu
// Run:   build/default_stream_barrier [iters=20] [kernel_iters=7000]
//        gpufl record -o DIR -- build/default_stream_barrier 20
// Prints: "default_stream_barrier: iters=N n=1048576 kernel_iters=K checksum_a=A checksum_b=B ok";
//         exit 0 (exit 1 on a CUDA error or when sampled results differ from the host's).
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
static const int GRID = 64;  // half of the H100's 132 SMs: room for a second kernel

// Dependent FMA chain per element (v -> 0.9999 v + 0.0001), grid-stride over n.
// With 64 blocks each thread walks n / 16384 elements, so the time is
// latency-bound: about n / 16384 * iters * 4 cycles.
__global__ void work(float* x, int n, int iters) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.9999f, 0.0001f);
        x[i] = v;
    }
}

// The same chain on the host (fmaf is correctly rounded on both sides). The map
// is monotone, so once a value stops changing it is a fixed point: stop there.
static float chain_host(float v, long long iters) {
    for (long long k = 0; k < iters; ++k) {
        const float nv = std::fmaf(v, 0.9999f, 0.0001f);
        if (nv == v) break;
        v = nv;
    }
    return v;
}

static float input_value(int i) { return (float)(i % 4096) / 4096.0f; }

// A utility that "just uploads the data": its cudaMemcpy runs on the legacy
// default stream, which synchronizes with every blocking stream.
void prepare_data(float* d, const float* h, size_t bytes) {
    CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));  // gpufl-example: default-stream-barrier
}

int main(int argc, char** argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 20;
    const int kiters = argc > 2 ? atoi(argv[2]) : 7000;
    if (iters <= 0 || kiters < 0) {
        fprintf(stderr, "usage: %s [iters>0, default 20] [kernel_iters, default 7000]\n", argv[0]);
        return 2;
    }
    const int n = 1 << 20;  // 4 MiB per buffer
    const size_t bytes = (size_t)n * sizeof(float);

    float *h_b, *h_a_out, *h_b_out, *d_a, *d_b;
    CHECK(cudaMallocHost(&h_b, bytes));
    CHECK(cudaMallocHost(&h_a_out, bytes));
    CHECK(cudaMallocHost(&h_b_out, bytes));
    CHECK(cudaMalloc(&d_a, bytes));
    CHECK(cudaMalloc(&d_b, bytes));
    for (int i = 0; i < n; ++i) {
        h_b[i] = input_value(i);
        h_a_out[i] = input_value(n - 1 - i);  // staging for d_a's initial values
    }

    cudaStream_t s1, s2;
    CHECK(cudaStreamCreate(&s1));  // blocking streams: they sync with the legacy default stream
    CHECK(cudaStreamCreate(&s2));
    CHECK(cudaMemcpyAsync(d_a, h_a_out, bytes, cudaMemcpyHostToDevice, s1));
    CHECK(cudaStreamSynchronize(s1));

    for (int it = 0; it < iters; ++it) {
        work<<<GRID, BLOCK, 0, s1>>>(d_a, n, kiters);  // kernel A, ~1 ms
        CHECK(cudaGetLastError());
        prepare_data(d_b, h_b, bytes);                 // hidden default-stream copy
        work<<<GRID, BLOCK, 0, s2>>>(d_b, n, kiters);  // kernel B, ~1 ms
        CHECK(cudaGetLastError());
    }

    CHECK(cudaMemcpyAsync(h_a_out, d_a, bytes, cudaMemcpyDeviceToHost, s1));
    CHECK(cudaMemcpyAsync(h_b_out, d_b, bytes, cudaMemcpyDeviceToHost, s2));
    CHECK(cudaDeviceSynchronize());  // the one sync, after the loop

    double sum_a = 0.0, sum_b = 0.0;
    for (int i = 0; i < n; ++i) {
        sum_a += h_a_out[i];
        sum_b += h_b_out[i];
    }
    bool ok = true;
    for (int i = 0; i < n; i += n / 16 + 1) {
        if (h_a_out[i] != chain_host(input_value(n - 1 - i), (long long)iters * kiters)) ok = false;
        if (h_b_out[i] != chain_host(input_value(i), kiters)) ok = false;
    }
    printf("default_stream_barrier: iters=%d n=%d kernel_iters=%d checksum_a=%.4f checksum_b=%.4f %s\n",
           iters, n, kiters, sum_a, sum_b, ok ? "ok" : "MISMATCH");

    CHECK(cudaStreamDestroy(s1));
    CHECK(cudaStreamDestroy(s2));
    CHECK(cudaFreeHost(h_b));
    CHECK(cudaFreeHost(h_a_out));
    CHECK(cudaFreeHost(h_b_out));
    CHECK(cudaFree(d_a));
    CHECK(cudaFree(d_b));
    return ok ? 0 : 1;
}
