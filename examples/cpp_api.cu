// The seed's C++ API: gpufl::init / gpufl::shutdown around a workload, no injection needed.
// Build: nvcc -g -O2 -lineinfo -I crates/gpufl-capture/include -o build/cpp_api examples/cpp_api.cu \
//          -L target/release -lgpufl_capture -Xlinker -rpath -Xlinker "$PWD/target/release"
// Run:   build/cpp_api [iters]    (writes a session under ./gpufl-sessions)
// Upload: with GPUFL_SERVER and GPUFL_API_KEY set (a `gpufl serve` and an upload key), the
//         sessions under ./gpufl-sessions are then sent with gpufl::uploadLogs (one line each on
//         stderr; stdout is unchanged).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <gpufl/gpufl.hpp>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)

__global__ void bump(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * 0.5f + 1.0f;
}

static void wait_for(cudaEvent_t ev) {
    CHECK(cudaEventSynchronize(ev));  // gpufl-example: event sync
}

int main(int argc, char** argv) {
    int iters = argc > 1 ? std::atoi(argv[1]) : 20;
    gpufl::InitOptions opts;
    opts.app_name = "cpp_api";
    opts.enable_synchronization = true;
    opts.enable_stack_trace = true;
    opts.backend_url = std::getenv("GPUFL_SERVER");  // may be NULL
    opts.api_key = std::getenv("GPUFL_API_KEY");  // may be NULL
    gpufl::InitResult r = gpufl::init(opts);
    std::fprintf(stderr, "gpufl::init -> %d, session %s\n", static_cast<int>(r), gpufl::session_dir().c_str());

    const int n = 1 << 20;
    float* d = nullptr;
    CHECK(cudaMalloc(&d, n * sizeof(float)));
    CHECK(cudaMemset(d, 0, n * sizeof(float)));
    cudaEvent_t ev;
    CHECK(cudaEventCreate(&ev));
    for (int i = 0; i < iters; ++i) {
        for (int k = 0; k < 4; ++k) bump<<<(n + 255) / 256, 256>>>(d, n);
        CHECK(cudaGetLastError());
        CHECK(cudaEventRecord(ev));
        wait_for(ev);
    }
    CHECK(cudaDeviceSynchronize());  // gpufl-example: device sync
    float h = 0;
    CHECK(cudaMemcpy(&h, d, sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("cpp_api: iters=%d x[0]=%.4f\n", iters, h);
    CHECK(cudaFree(d));
    gpufl::shutdown();

    if (std::getenv("GPUFL_SERVER") && std::getenv("GPUFL_API_KEY")) {
        // Deferred upload — runs post-shutdown, never during the workload.
        gpufl::UploadOptions uopts;
        uopts.log_path = opts.log_path;
        uopts.backend_url = opts.backend_url;
        uopts.api_key = opts.api_key;
        gpufl::UploadResult u = gpufl::uploadLogs(uopts);
        std::fprintf(stderr, "gpufl::uploadLogs -> %d\n", u.code);
    }
    return 0;
}
