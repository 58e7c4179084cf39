// copy_compute_pipeline.cu - gpufl example: copy -> compute -> copy, sequential or chunked.
//
// The same work - upload MiB of input, a dependent-FMA kernel over it, download
// MiB of output (pinned host memory, cudaMemcpyAsync) - done either
//   streams=1: on ONE created stream as one chunk: the copies and the kernel
//              run strictly one after the other (the upload in run_one_stream()
//              is the planted line; its gpufl-example comment names the rule
//              no-copy-compute-overlap), or
//   streams=S: split into S equal chunks, chunk c on stream c, so chunk c+1's
//              upload overlaps chunk c's kernel and so on.
// Each of R repeats is timed with CUDA events and ends with cudaDeviceSynchronize.
// The 1-stream run's stage times are what gpufl's pipeline model predicts from;
// the S-stream runs are the measurement the prediction is checked against.
// Defaults: 64 MiB each way and kernel_iters=2000 make the three stages about
// equal on an H100 (~1.2 ms each).
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/copy_compute_pipeline examples/copy_compute_pipeline.cu
// Run:   build/copy_compute_pipeline [streams=1] [repeats=3] [MiB=64] [kernel_iters=2000]
//        gpufl record -o DIR -- build/copy_compute_pipeline 1 3
// Prints: streams=1: "streams=1 repeats=R best_ms=X h2d_ms=a kernel_ms=b d2h_ms=c" (stages of
//         the best repeat); streams=S>1: "streams=S repeats=R best_ms=X"; then "checksum ok";
//         exit 0 (exit 1 on a CUDA error or when sampled results differ from the host's).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
static const int MAX_STREAMS = 64;

// Bounded dependent FMA chain: v -> 0.9999 v + 0.0001 (as in two_stream_overlap.cu).
__global__ void process(const float* in, float* out, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = in[i];
        for (int k = 0; k < iters; ++k) v = fmaf(v, 0.9999f, 0.0001f);
        out[i] = v;
    }
}

static float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms;
}

// One stream, one chunk: upload, kernel, download, strictly in order.
static float run_one_stream(const float* h_in, float* h_out, float* d_in, float* d_out, int n,
                            int iters, cudaStream_t s, cudaEvent_t ev[4], float stage_ms[3]) {
    const size_t bytes = (size_t)n * sizeof(float);
    CHECK(cudaEventRecord(ev[0], s));
    CHECK(cudaMemcpyAsync(d_in, h_in, bytes, cudaMemcpyHostToDevice, s));  // gpufl-example: no-copy-compute-overlap
    CHECK(cudaEventRecord(ev[1], s));
    process<<<(n + BLOCK - 1) / BLOCK, BLOCK, 0, s>>>(d_in, d_out, n, iters);
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(ev[2], s));
    CHECK(cudaMemcpyAsync(h_out, d_out, bytes, cudaMemcpyDeviceToHost, s));
    CHECK(cudaEventRecord(ev[3], s));
    CHECK(cudaDeviceSynchronize());
    for (int i = 0; i < 3; ++i) stage_ms[i] = elapsed_ms(ev[i], ev[i + 1]);
    return elapsed_ms(ev[0], ev[3]);
}

// S streams, S chunks: chunk c's upload, kernel and download on stream c. The
// other streams wait for `start` (recorded on stream 0) and stream 0 waits for
// their `done` events before `stop`, so [start, stop] spans all chunks.
static float run_streams(const float* h_in, float* h_out, float* d_in, float* d_out, int n,
                         int iters, int ns, cudaStream_t* st, cudaEvent_t start, cudaEvent_t stop,
                         cudaEvent_t* done) {
    const int chunk = n / ns;
    const size_t chunk_bytes = (size_t)chunk * sizeof(float);
    CHECK(cudaEventRecord(start, st[0]));
    for (int c = 1; c < ns; ++c) CHECK(cudaStreamWaitEvent(st[c], start, 0));
    for (int c = 0; c < ns; ++c) {
        const size_t off = (size_t)c * chunk;
        CHECK(cudaMemcpyAsync(d_in + off, h_in + off, chunk_bytes, cudaMemcpyHostToDevice, st[c]));
        process<<<(chunk + BLOCK - 1) / BLOCK, BLOCK, 0, st[c]>>>(d_in + off, d_out + off, chunk,
                                                                  iters);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpyAsync(h_out + off, d_out + off, chunk_bytes, cudaMemcpyDeviceToHost, st[c]));
        CHECK(cudaEventRecord(done[c], st[c]));
    }
    for (int c = 1; c < ns; ++c) CHECK(cudaStreamWaitEvent(st[0], done[c], 0));
    CHECK(cudaEventRecord(stop, st[0]));
    CHECK(cudaDeviceSynchronize());
    return elapsed_ms(start, stop);
}

static float chain_host(float v, int iters) {
    for (int k = 0; k < iters; ++k) v = std::fmaf(v, 0.9999f, 0.0001f);
    return v;
}

int main(int argc, char** argv) {
    const int ns = argc > 1 ? atoi(argv[1]) : 1;
    const int repeats = argc > 2 ? atoi(argv[2]) : 3;
    const int mib = argc > 3 ? atoi(argv[3]) : 64;
    const int iters = argc > 4 ? atoi(argv[4]) : 2000;
    const int n = mib * (1 << 18);
    if (ns < 1 || ns > MAX_STREAMS || repeats <= 0 || mib <= 0 || mib > 1024 || iters < 0 ||
        n % ns != 0) {
        fprintf(stderr, "usage: %s [streams=1 (1..64, dividing MiB*2^18)] [repeats=3] "
                        "[MiB=64 (1..1024)] [kernel_iters=2000]\n", argv[0]);
        return 2;
    }
    const size_t bytes = (size_t)n * sizeof(float);

    float *h_in, *h_out, *d_in, *d_out;
    CHECK(cudaMallocHost(&h_in, bytes));
    CHECK(cudaMallocHost(&h_out, bytes));
    CHECK(cudaMalloc(&d_in, bytes));
    CHECK(cudaMalloc(&d_out, bytes));
    for (int i = 0; i < n; ++i) h_in[i] = (float)(i % 4096) / 4096.0f;

    cudaStream_t st[MAX_STREAMS];
    cudaEvent_t ev[4], done[MAX_STREAMS];
    for (int c = 0; c < ns; ++c) {
        CHECK(cudaStreamCreate(&st[c]));
        CHECK(cudaEventCreate(&done[c]));
    }
    for (int i = 0; i < 4; ++i) CHECK(cudaEventCreate(&ev[i]));

    // Warm-up: load the kernel (lazy module loading) outside the timed runs.
    process<<<1, 32, 0, st[0]>>>(d_in, d_out, 32, 1);
    CHECK(cudaGetLastError());
    CHECK(cudaStreamSynchronize(st[0]));

    // Expected values of a sample of elements (the input repeats every 4096).
    static float expect[4096];
    for (int j = 0; j < 4096; ++j) expect[j] = chain_host((float)j / 4096.0f, iters);

    bool ok = true;
    float best = 0.0f, best_stage[3] = {0.0f, 0.0f, 0.0f};
    for (int r = 0; r < repeats; ++r) {
        memset(h_out, 0, bytes);  // each repeat must produce its own output
        float stage[3] = {0.0f, 0.0f, 0.0f};
        const float ms = ns == 1
            ? run_one_stream(h_in, h_out, d_in, d_out, n, iters, st[0], ev, stage)
            : run_streams(h_in, h_out, d_in, d_out, n, iters, ns, st, ev[0], ev[3], done);
        if (r == 0 || ms < best) {
            best = ms;
            memcpy(best_stage, stage, sizeof(stage));
        }
        for (int i = 0; i < n; i += 997)
            if (h_out[i] != expect[i % 4096]) ok = false;
        if (h_out[n - 1] != expect[(n - 1) % 4096]) ok = false;
    }
    if (ns == 1)
        printf("streams=1 repeats=%d best_ms=%.3f h2d_ms=%.3f kernel_ms=%.3f d2h_ms=%.3f\n", repeats,
               best, best_stage[0], best_stage[1], best_stage[2]);
    else
        printf("streams=%d repeats=%d best_ms=%.3f\n", ns, repeats, best);
    puts(ok ? "checksum ok" : "checksum MISMATCH");

    for (int c = 0; c < ns; ++c) {
        CHECK(cudaStreamDestroy(st[c]));
        CHECK(cudaEventDestroy(done[c]));
    }
    for (int i = 0; i < 4; ++i) CHECK(cudaEventDestroy(ev[i]));
    CHECK(cudaFreeHost(h_in));
    CHECK(cudaFreeHost(h_out));
    CHECK(cudaFree(d_in));
    CHECK(cudaFree(d_out));
    return ok ? 0 : 1;
}
