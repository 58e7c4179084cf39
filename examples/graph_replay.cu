// graph_replay.cu - gpufl example: a CUDA graph replayed in a loop, beside direct launches.
//
// The main thread captures 5 small kernels (g_add, g_mul, g_xor, g_rot, mix; one 64K-element
// buffer) issued on a created stream into a graph (cudaStreamBeginCapture / cudaStreamEndCapture
// in capture_graph()), instantiates it, and replays it N times (argv[1], default 40) in
// replay_loop(), with a cudaStreamSynchronize after each replay on a line of its own. Beside it, 4
// std::threads each launch `mix` directly K times (argv[2], default 90) on their own streams
// (direct_worker()). `mix` is both the graph's last node and the directly launched kernel: which
// line a `mix` kernel belongs to must come from its correlation id, not from its name.
//
// What a user should see (lines marked with a "gpufl-example" comment below, each name once):
//   - graph-launch: the cudaGraphLaunch line; the 5 x N graph kernels are its kernels (one
//     replay = 5 kernels), not launches of their own;
//   - sync-after-replay: the stream sync after each replay (N syncs, one replay between each);
//   - direct-launch: the 4 x K direct `mix` launches;
//   - capture-node-1 .. capture-node-5: the launch lines inside the capture, where the graph's
//     nodes were made (called once, no kernel runs at them), and begin-capture.
// Should not be said: "capture the loop into a CUDA graph" for the graph kernels, or a launch
// time for them.
//
// Build: mkdir -p build && nvcc -g -O2 -lineinfo -o build/graph_replay examples/graph_replay.cu
// Run:   build/graph_replay [replays=40] [direct_launches=90]
//        gpufl record -o DIR -- build/graph_replay 40 90
// Prints: "graph_replay: replays=N direct=4x K kernels=T graph_checksum=G direct_checksum=D OK";
//         exit 0 (FAIL and exit 1 on a CUDA error or a wrong result).
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
#include <cuda_runtime.h>

#define CHECK(call)                                                        \
    do {                                                                   \
        cudaError_t err_ = (call);                                         \
        if (err_ != cudaSuccess) {                                         \
            fprintf(stderr, "CUDA error at %s:%d: %s (%s)\n", __FILE__,    \
                    __LINE__, cudaGetErrorString(err_), #call);            \
            printf("graph_replay: FAIL\n");                                \
            exit(1);                                                       \
        }                                                                  \
    } while (0)

static const int N_ELEMS = 1 << 16;
static const int BLOCK = 256;
static const int GRID = N_ELEMS / BLOCK;
static const int WORKERS = 4;

// The five graph nodes, in order; integer arithmetic so the host can check the result exactly.
__host__ __device__ inline unsigned f_add(unsigned v) { return v + 0x9e37u; }
__host__ __device__ inline unsigned f_mul(unsigned v) { return v * 2654435761u; }
__host__ __device__ inline unsigned f_xor(unsigned v) { return v ^ (v >> 13); }
__host__ __device__ inline unsigned f_rot(unsigned v) { return (v << 7) | (v >> 25); }
__host__ __device__ inline unsigned f_mix(unsigned v, unsigned k) {
    return v * 1664525u + 1013904223u + k;
}

__global__ void g_add(unsigned* x) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = f_add(x[i]);
}
__global__ void g_mul(unsigned* x) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = f_mul(x[i]);
}
__global__ void g_xor(unsigned* x) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = f_xor(x[i]);
}
__global__ void g_rot(unsigned* x) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = f_rot(x[i]);
}
__global__ void mix(unsigned* x, unsigned k) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = f_mix(x[i], k);
}

// Record the 5 launches into a graph (nothing runs here) and instantiate it.
cudaGraphExec_t capture_graph(cudaStream_t s, unsigned* d_x) {
    cudaGraph_t graph;
    // Thread-local mode: the workers' CUDA calls on other threads do not disturb the capture.
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));  // gpufl-example: begin-capture
    g_add<<<GRID, BLOCK, 0, s>>>(d_x);  // gpufl-example: capture-node-1
    g_mul<<<GRID, BLOCK, 0, s>>>(d_x);  // gpufl-example: capture-node-2
    g_xor<<<GRID, BLOCK, 0, s>>>(d_x);  // gpufl-example: capture-node-3
    g_rot<<<GRID, BLOCK, 0, s>>>(d_x);  // gpufl-example: capture-node-4
    mix<<<GRID, BLOCK, 0, s>>>(d_x, 7u);  // gpufl-example: capture-node-5
    CHECK(cudaGetLastError());
    CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec;
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CHECK(cudaGraphDestroy(graph));
    return exec;
}

// Replay the graph `replays` times, waiting for each replay before the next.
void replay_loop(cudaGraphExec_t exec, cudaStream_t s, int replays) {
    for (int r = 0; r < replays; ++r) {
        CHECK(cudaGraphLaunch(exec, s));  // gpufl-example: graph-launch
        CHECK(cudaStreamSynchronize(s));  // gpufl-example: sync-after-replay
    }
}

// One worker: `launches` direct launches of mix on its own stream, one sync at the end.
void direct_worker(unsigned* d_y, int launches, cudaError_t* status) {
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    for (int k = 0; e == cudaSuccess && k < launches; ++k) {
        mix<<<GRID, BLOCK, 0, s>>>(d_y, (unsigned)k);  // gpufl-example: direct-launch
        e = cudaGetLastError();
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    if (e == cudaSuccess) e = cudaStreamDestroy(s);
    *status = e;
}

static unsigned long long checksum(const std::vector<unsigned>& v) {
    unsigned long long c = 0;
    for (size_t i = 0; i < v.size(); ++i) c = c * 1099511628211ull + v[i];
    return c;
}

int main(int argc, char** argv) {
    const int replays = argc > 1 ? atoi(argv[1]) : 40;
    const int launches = argc > 2 ? atoi(argv[2]) : 90;
    if (replays <= 0 || launches <= 0) {
        fprintf(stderr, "usage: %s [replays>0, default 40] [direct_launches>0, default 90]\n", argv[0]);
        return 2;
    }
    const size_t bytes = N_ELEMS * sizeof(unsigned);
    std::vector<unsigned> h_x(N_ELEMS), want_x(N_ELEMS);
    std::vector<std::vector<unsigned>> h_y(WORKERS, std::vector<unsigned>(N_ELEMS)), want_y = h_y;
    for (int i = 0; i < N_ELEMS; ++i) {
        h_x[i] = want_x[i] = (unsigned)i;
        for (int t = 0; t < WORKERS; ++t) h_y[t][i] = want_y[t][i] = (unsigned)i * 31u + (unsigned)t;
    }

    // All allocations before the capture and the threads.
    unsigned* d_x = nullptr;
    unsigned* d_y[WORKERS];
    CHECK(cudaMalloc(&d_x, bytes));
    CHECK(cudaMemcpy(d_x, h_x.data(), bytes, cudaMemcpyHostToDevice));
    for (int t = 0; t < WORKERS; ++t) {
        CHECK(cudaMalloc(&d_y[t], bytes));
        CHECK(cudaMemcpy(d_y[t], h_y[t].data(), bytes, cudaMemcpyHostToDevice));
    }
    cudaStream_t gs;
    CHECK(cudaStreamCreateWithFlags(&gs, cudaStreamNonBlocking));
    cudaGraphExec_t exec = capture_graph(gs, d_x);

    std::vector<std::thread> workers;
    cudaError_t status[WORKERS];
    for (int t = 0; t < WORKERS; ++t) workers.emplace_back(direct_worker, d_y[t], launches, &status[t]);
    replay_loop(exec, gs, replays);
    for (auto& w : workers) w.join();
    for (int t = 0; t < WORKERS; ++t) CHECK(status[t]);

    CHECK(cudaMemcpy(h_x.data(), d_x, bytes, cudaMemcpyDeviceToHost));
    for (int t = 0; t < WORKERS; ++t) CHECK(cudaMemcpy(h_y[t].data(), d_y[t], bytes, cudaMemcpyDeviceToHost));

    // The same work on the host.
    for (int i = 0; i < N_ELEMS; ++i) {
        unsigned v = want_x[i];
        for (int r = 0; r < replays; ++r) v = f_mix(f_rot(f_xor(f_mul(f_add(v)))), 7u);
        want_x[i] = v;
        for (int t = 0; t < WORKERS; ++t) {
            unsigned y = want_y[t][i];
            for (int k = 0; k < launches; ++k) y = f_mix(y, (unsigned)k);
            want_y[t][i] = y;
        }
    }
    bool ok = h_x == want_x;
    unsigned long long direct = 0;
    for (int t = 0; t < WORKERS; ++t) {
        ok = ok && h_y[t] == want_y[t];
        direct ^= checksum(h_y[t]);
    }
    printf("graph_replay: replays=%d direct=%dx%d kernels=%d graph_checksum=%016llx direct_checksum=%016llx %s\n",
           replays, WORKERS, launches, 5 * replays + WORKERS * launches, checksum(h_x), direct,
           ok ? "OK" : "FAIL");

    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaStreamDestroy(gs));
    CHECK(cudaFree(d_x));
    for (int t = 0; t < WORKERS; ++t) CHECK(cudaFree(d_y[t]));
    return ok ? 0 : 1;
}
