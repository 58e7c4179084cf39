// kernlinger.cu - probe for issue 35: does the launching thread keep paying for CUPTI's kernel
// tracing after it is turned off? (gpufl's always-on opens a 200-ms window of GPU activity 2 s
// in, then the C++ launch loop costs ~0.6-1.0 us more per launch for the rest of the run.)
// Not part of gpufl. Each case is a forked process: a loop of batches of 2000 empty launches and a
// stream synchronize, for 5 s, printing the median ns per launch of each 0.5 s; at 2.0 s (cases
// 2-9) something is turned on, and off again at 2.2 s:
//   0 no CUPTI                          1 subscribed, the sync callback on, nothing at 2 s
//   2 CONCURRENT_KERNEL on/off          3 as 2, per-thread activity buffers (as gpufl sets them)
//   4 as 3, cuptiActivityEnableContext / DisableContext instead of the global switch
//   5 as 3, then cuptiFinalize and subscribe again (callback back on) after the off
//   6 the launch callback (cudaLaunchKernel) on/off, no activity
//   7 MEMCPY activity on/off (no kernels)
//   8 as 3, hardware tracing asked for (cuptiActivityEnableHWTrace(1)) before the on
//   9 as 3, and the launch callback too (what a gpufl window turns on)
// Build and run (device): bash scripts/probe/run-probe.sh kernlinger [cases...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cupti.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "probe_common.h"

static long records = 0;
static void CUPTIAPI request(uint8_t **buf, size_t *size, size_t *max) {
    *size = 8 << 20;
    *buf = (uint8_t *)aligned_alloc(8, *size);
    *max = 0;
}
static void CUPTIAPI complete(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid) {
    CUpti_Activity *rec = nullptr;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) records++;
    free(buf);
}
static void CUPTIAPI callback(void *, CUpti_CallbackDomain, CUpti_CallbackId, const void *) {}

static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static CUpti_SubscriberHandle sub;
static void subscribe() {
    CK(cuptiSubscribe(&sub, (CUpti_CallbackFunc)callback, nullptr));
    CK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                           CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020));
}

static void run_case(int c) {
    cudaStream_t s;
    cudaFree(0);
    if (cudaStreamCreate(&s) != cudaSuccess) { printf("no CUDA\n"); return; }
    CUcontext ctx;
    cuCtxGetCurrent(&ctx);
    if (c >= 1) subscribe();
    if (c == 3 || c == 4 || c == 5 || c == 8 || c == 9) {
        uint8_t on = 1;
        size_t sz = 1;
        CK(cuptiActivitySetAttribute(CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER, &sz, &on));
    }
    if (c >= 2) CK(cuptiActivityRegisterCallbacks(request, complete));
    auto start = std::chrono::steady_clock::now();
    auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
    for (int i = 0; i < 2000; i++) empty<<<1, 32, 0, s>>>(nullptr);
    cudaStreamSynchronize(s);
    std::vector<double> bucket;
    std::vector<double> out;
    int bno = 0;
    bool on_done = false, off_done = false;
    const int batch = 2000;
    while (since() < 5.0) {
        double at = since();
        if (!on_done && at >= 2.0) {
            on_done = true;
            switch (c) {
            case 2: case 3: case 5: CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)); break;
            case 4: CK(cuptiActivityEnableContext(ctx, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)); break;
            case 6: CK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000)); break;
            case 7: CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY)); break;
            case 8: CK(cuptiActivityEnableHWTrace(1)); CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)); break;
            case 9:
                CK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000));
                CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
                break;
            }
        }
        if (on_done && !off_done && at >= 2.2) {
            off_done = true;
            auto t0 = std::chrono::steady_clock::now();
            switch (c) {
            case 2: case 3: case 5: case 8: CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)); break;
            case 4: CK(cuptiActivityDisableContext(ctx, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)); break;
            case 6: CK(cuptiEnableCallback(0, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000)); break;
            case 7: CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY)); break;
            case 9:
                CK(cuptiEnableCallback(0, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000));
                CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
                break;
            }
            if (c >= 2) CK(cuptiActivityFlushAll(0));
            if (c == 5) {
                CK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
                CK(cuptiUnsubscribe(sub));
                CK(cuptiFinalize());
                subscribe();
                CK(cuptiActivityRegisterCallbacks(request, complete));
            }
            printf("  off at %.2f s took %.2f ms\n", at,
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        }
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < batch; i++) empty<<<1, 32, 0, s>>>(nullptr);
        auto t1 = std::chrono::steady_clock::now();
        cudaStreamSynchronize(s);
        int b = (int)(at / 0.5);
        if (b != bno && !bucket.empty()) { out.push_back(median(bucket)); bucket.clear(); }
        bno = b;
        bucket.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / batch);
    }
    if (!bucket.empty()) out.push_back(median(bucket));
    if (c >= 2) CK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    printf("case %d:", c);
    for (double v : out) printf(" %.0f", v);
    printf("   (records %ld)\n", records);
    fflush(stdout);
}

int main(int argc, char **argv) {
    std::vector<int> cases;
    for (int i = 1; i < argc; i++) cases.push_back(atoi(argv[i]));
    if (cases.empty()) cases = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    for (int c : cases) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            alarm(30);
            run_case(c);
            fflush(stdout);
            _exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (st) printf("case %d: status %d\n", c, st);
    }
    return 0;
}
