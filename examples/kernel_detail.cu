// kernel_detail.cu - gpufl example (issue 19): three pitfalls inside a kernel, each planted on a
// line of its own and each beside a clean twin that does the same work without it.
//
//   divergent      lanes of one warp take two paths (odd and even lanes): half the lanes idle on
//                  each path (line marked "divergent-branch");
//   uniform        the same two paths chosen per warp: no divergence;
//   strided_load   lane i reads element i*32: each lane's 4 bytes in a sector of its own, 32
//                  sectors per request where 4 would do (line marked "strided-load");
//   coalesced_load lane i reads element i: 4 sectors per request;
//   bank_conflict  lane i reads shared word i*32: all 32 lanes in bank 0, a 32-way conflict (line
//                  marked "bank-conflict");
//   padded_shared  lane i reads shared word i*33: 32 banks, no conflict.
//
// Build:  nvcc -g -O2 -lineinfo -o build/kernel_detail examples/kernel_detail.cu
// Run:    build/kernel_detail [iterations=20] [which=all|divergent|uniform|strided|coalesced|bank|padded]
// Prints: "kernel_detail: iterations=N checksum=C OK" (C: a sum over every output, the same for a
//         kernel and its twin since both compute the same values).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <cuda_runtime.h>

#ifndef CHECK
#define CHECK(x)                                                                   \
    do {                                                                           \
        cudaError_t e_ = (x);                                                      \
        if (e_ != cudaSuccess) {                                                   \
            std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            std::exit(1);                                                          \
        }                                                                          \
    } while (0)
#endif

constexpr int N = 1 << 22;  // elements
constexpr int BLOCK = 256;
constexpr int ROUNDS = 64;  // arithmetic per path, so that a path takes time

// Two paths of different shape and length, so that the compiler cannot merge them into one
// instruction stream with selected constants (it did with two loops of the same shape).
__device__ __noinline__ float path_a(float v) {
    for (int r = 0; r < ROUNDS; ++r) v = __sinf(v) * 1.0001f + 0.5f;
    return v;
}

__device__ __noinline__ float path_b(float v) {
    for (int r = 0; r < 2 * ROUNDS; ++r) v = v / (1.0f + v * v) - 0.25f;
    return v;
}

__global__ void divergent(const float* in, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float v = in[i];
    if (threadIdx.x & 1) {  // gpufl-example: divergent-branch
        v = path_a(v);
    } else {
        v = path_b(v);
    }
    out[i] = v;
}

__global__ void uniform(const float* in, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float v = in[i];
    if ((threadIdx.x >> 5) & 1) {  // the same choice for the 32 lanes of a warp
        v = path_a(v);
    } else {
        v = path_b(v);
    }
    out[i] = v;
}

__global__ void strided_load(const float* in, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    // A permutation of 0..N-1: (i * 32) mod N, plus i / (N / 32) to visit every element once.
    int j = (int)(((long long)i * 32) % N) + i / (N / 32);
    out[i] = in[j] * 2.0f;  // gpufl-example: strided-load
}

__global__ void coalesced_load(const float* in, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    // Every element once, in order (the same sum as strided_load's outputs).
    out[i] = in[i] * 2.0f;
}

__global__ void bank_conflict(const float* in, float* out) {
    __shared__ float s[32 * 33];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        for (int k = 0; k < 32; ++k) s[lane * 32 + k] = in[(blockIdx.x * 32 + k) % N];
    }
    __syncthreads();
    if (i >= N) return;
    float acc = 0.0f;
    // Word lane*32 + r is in bank r for every lane: the 32 lanes of a warp in one bank.
    for (int r = 0; r < ROUNDS; ++r) acc += s[lane * 32 + (r & 31)];  // gpufl-example: bank-conflict
    out[i] = acc;
}

__global__ void padded_shared(const float* in, float* out) {
    __shared__ float s[32 * 33];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        for (int k = 0; k < 32; ++k) s[lane * 33 + k] = in[(blockIdx.x * 32 + k) % N];
    }
    __syncthreads();
    if (i >= N) return;
    float acc = 0.0f;
    // Word lane*33 + r is in bank (lane + r) mod 32: the 32 lanes in 32 banks.
    for (int r = 0; r < ROUNDS; ++r) acc += s[lane * 33 + (r & 31)];
    out[i] = acc;
}

#ifndef KERNEL_DETAIL_NO_MAIN  // scripts/probe/pcsampling.cu includes the kernels alone
static double checksum(const float* d, int n) {
    std::vector<float> h(n);
    CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    double s = 0;
    for (int k = 0; k < n; ++k) s += h[k];
    return s;
}

int main(int argc, char** argv) {
    int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    const char* which = argc > 2 ? argv[2] : "all";
    auto want = [&](const char* k) { return !std::strcmp(which, "all") || !std::strcmp(which, k); };
    float *in, *out;
    CHECK(cudaMalloc(&in, N * sizeof(float)));
    CHECK(cudaMalloc(&out, N * sizeof(float)));
    std::vector<float> h(N);
    for (int k = 0; k < N; ++k) h[k] = (float)(k % 1000) / 1000.0f;
    CHECK(cudaMemcpy(in, h.data(), N * sizeof(float), cudaMemcpyHostToDevice));
    dim3 grid((N + BLOCK - 1) / BLOCK);
    double sum = 0;
    for (int it = 0; it < iters; ++it) {
        if (want("divergent")) divergent<<<grid, BLOCK>>>(in, out);
        if (want("uniform")) uniform<<<grid, BLOCK>>>(in, out);
        if (want("strided")) strided_load<<<grid, BLOCK>>>(in, out);
        if (want("coalesced")) coalesced_load<<<grid, BLOCK>>>(in, out);
        if (want("bank")) bank_conflict<<<grid, BLOCK>>>(in, out);
        if (want("padded")) padded_shared<<<grid, BLOCK>>>(in, out);
        CHECK(cudaGetLastError());
    }
    CHECK(cudaDeviceSynchronize());
    sum = checksum(out, N);
    std::printf("kernel_detail: iterations=%d which=%s checksum=%.3f OK\n", iters, which, sum);
    CHECK(cudaFree(in));
    CHECK(cudaFree(out));
    return 0;
}
#endif  // KERNEL_DETAIL_NO_MAIN
