// ping_pong.cu - gpufl example: the ping-pong (double-buffer) pattern, done right.
//
// After the ping-pong pattern of the CUDA streams tutorial (seed streams.md):
// two pinned input and two pinned output buffers, two streams; frame f uses
// buffer f % 2 on stream f % 2. At the top of each frame the host waits for
// that stream only (cudaStreamSynchronize): its previous frame (f - 2) must be
// done before the host reads that frame's results and overwrites the input
// buffer. Meanwhile the other stream's frame keeps the GPU busy, so copies of
// one frame overlap the kernel of the other and the GPU never waits for the host.
// This is the "good" example: gpufl must raise no HIGH insight on it (there is
// no gpufl-example marker in this file).
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/ping_pong examples/ping_pong.cu
// Run:   build/ping_pong [frames=100] [kernel_iters=30000]
//        gpufl record -o DIR -- build/ping_pong
// Prints: "ping_pong: frames=F n=1048576 kernel_iters=K checksum=C ok"; exit 0
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

static const int N = 1 << 20;  // 4 MiB per frame
static const int BLOCK = 256;

// One frame's processing: a dependent FMA chain per element.
__global__ void process_frame(const float* in, float* out, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = in[i];
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.9999f, 0.0001f);
        out[i] = v;
    }
}

// Frame f's input ("the sensor read"): a pattern shifted by the frame number.
static float frame_value(int f, int j) { return (float)((j + 7 * f) & 4095) * (1.0f / 4096.0f); }

static void fill_frame(float* h, int f) {
    for (int j = 0; j < N; ++j) h[j] = frame_value(f, j);
}

static float chain_host(float v, int iters) {
    for (int k = 0; k < iters; ++k) v = std::fmaf(v, 0.9999f, 0.0001f);
    return v;
}

// The host consumes frame f's results: a sampled sum and one exact check.
static bool consume(const float* out, int f, int iters, double* checksum) {
    double s = 0.0;
    for (int j = f % 1021; j < N; j += 1021) s += out[j];
    *checksum += s;
    const int a = (f * 10007) % N;
    return out[a] == chain_host(frame_value(f, a), iters);
}

int main(int argc, char** argv) {
    const int frames = argc > 1 ? atoi(argv[1]) : 100;
    const int iters = argc > 2 ? atoi(argv[2]) : 30000;
    if (frames <= 0 || iters < 0) {
        fprintf(stderr, "usage: %s [frames>0, default 100] [kernel_iters=30000]\n", argv[0]);
        return 2;
    }
    const size_t bytes = (size_t)N * sizeof(float);

    float *h_in[2], *h_out[2], *d_in[2], *d_out[2];
    cudaStream_t streams[2];
    for (int b = 0; b < 2; ++b) {
        CHECK(cudaMallocHost(&h_in[b], bytes));
        CHECK(cudaMallocHost(&h_out[b], bytes));
        CHECK(cudaMalloc(&d_in[b], bytes));
        CHECK(cudaMalloc(&d_out[b], bytes));
        CHECK(cudaStreamCreate(&streams[b]));
    }

    bool ok = true;
    double checksum = 0.0;
    for (int f = 0; f < frames; ++f) {
        const int b = f % 2;
        cudaStream_t s = streams[b];
        // Wait for this buffer's previous frame only; the other stream keeps running.
        CHECK(cudaStreamSynchronize(s));
        if (f >= 2 && !consume(h_out[b], f - 2, iters, &checksum)) ok = false;
        fill_frame(h_in[b], f);
        CHECK(cudaMemcpyAsync(d_in[b], h_in[b], bytes, cudaMemcpyHostToDevice, s));
        process_frame<<<(N + BLOCK - 1) / BLOCK, BLOCK, 0, s>>>(d_in[b], d_out[b], N, iters);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(h_out[b], d_out[b], bytes, cudaMemcpyDeviceToHost, s));
    }
    CHECK(cudaDeviceSynchronize());
    // The last one or two frames are still unconsumed.
    for (int f = frames >= 2 ? frames - 2 : 0; f < frames; ++f)
        if (!consume(h_out[f % 2], f, iters, &checksum)) ok = false;

    printf("ping_pong: frames=%d n=%d kernel_iters=%d checksum=%.4f %s\n", frames, N, iters,
           checksum, ok ? "ok" : "MISMATCH");

    for (int b = 0; b < 2; ++b) {
        CHECK(cudaStreamDestroy(streams[b]));
        CHECK(cudaFreeHost(h_in[b]));
        CHECK(cudaFreeHost(h_out[b]));
        CHECK(cudaFree(d_in[b]));
        CHECK(cudaFree(d_out[b]));
    }
    return ok ? 0 : 1;
}
