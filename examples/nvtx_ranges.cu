// NVTX the way libraries use it, recorded by `gpufl record` without code changes: a domain with
// registered strings (as PyTorch and NCCL register their range names once), push/pop ranges whose
// message is a registered handle, and a start/end range that starts on the main thread and ends
// on a worker thread (a "data load" handed over between threads).
// Build: nvcc -g -O2 -lineinfo -o build/nvtx_ranges examples/nvtx_ranges.cu -ldl
// Run:   gpufl record -o DIR -- build/nvtx_ranges [steps]
// The report's scope table must show "train_step" > "forward" (registered strings, not
// "<registered>"), and its ranges table "data load" × steps with every range crossing threads.
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#define CHECK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); std::exit(1); } } while (0)

__global__ void scale(float* x, int n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = x[i] * a + 1.0f;
}

static void push_registered(nvtxDomainHandle_t d, nvtxStringHandle_t s) {
    nvtxEventAttributes_t a = {};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = s;
    nvtxDomainRangePushEx(d, &a);
}

int main(int argc, char** argv) {
    int steps = argc > 1 ? std::atoi(argv[1]) : 20;
    const int n = 1 << 22;
    float* x;
    CHECK(cudaMalloc(&x, n * sizeof(float)));
    CHECK(cudaMemset(x, 0, n * sizeof(float)));
    nvtxDomainHandle_t dom = nvtxDomainCreateA("gpufl-example");
    nvtxStringHandle_t step_name = nvtxDomainRegisterStringA(dom, "train_step");
    nvtxStringHandle_t fwd_name = nvtxDomainRegisterStringA(dom, "forward");
    for (int s = 0; s < steps; ++s) {
        nvtxRangeId_t load = nvtxRangeStartA("data load");
        std::thread worker([load] {
            std::this_thread::sleep_for(std::chrono::microseconds(200));
            nvtxRangeEnd(load);  // ends on another thread
        });
        push_registered(dom, step_name);
        push_registered(dom, fwd_name);
        for (int k = 0; k < 4; ++k) scale<<<(n + 255) / 256, 256>>>(x, n, 0.5f);
        nvtxDomainRangePop(dom);
        CHECK(cudaDeviceSynchronize());  // gpufl-example: nvtx step sync
        nvtxDomainRangePop(dom);
        worker.join();
    }
    float h = 0;
    CHECK(cudaMemcpy(&h, x, sizeof(float), cudaMemcpyDeviceToHost));
    std::printf("x[0] = %.3f after %d steps\n", h, steps);
    CHECK(cudaFree(x));
    return 0;
}
