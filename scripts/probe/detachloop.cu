// detachloop.cu - probe for issue 35: does detaching CUPTI (cuptiFinalize) and attaching it again
// every 0.5 s corrupt a launch loop's process with CUPTI alone, no gpufl? gpufl's always-on
// detach aborted 3 of 8 launch loops (its call sites switched off: case 12). Not part of gpufl. Each case is a forked
// process: the main thread launches batches of 2000 empty kernels and synchronizes for 10 s; a
// helper thread, every 0.5 s, attaches (subscribe, buffer callbacks, CONCURRENT_KERNEL on for
// 200 ms, then off) and detaches:
//   0 at the next runtime API exit on the launching thread (flush forced, then cuptiFinalize:
//     CUPTI's documented way, and gpufl's), per-thread activity buffers on (as gpufl sets them)
//   1 as 0, CUPTI's default buffers (the attribute not set)
//   2 as 0, no activity at all (callbacks only): does finalize alone do it?
//   3 as 0, the detach at a driver API exit (cuLaunchKernel inside cudaLaunchKernel)
//   4 as 0, without the forced flush in the callback (the helper flushed before asking)
//   5 as 0, with the system thread id type set (as gpufl sets it)
//   6 as 0, each buffer's records read later (cuptiActivityGetNextRecord on the helper thread),
//     those of the buffers completed by the detach after CUPTI is attached again (as gpufl's
//     writer did before it read them on the detaching thread)
//   7 as 6, read after the detach, before attaching again
//   8 as 0, and the stream synchronize callback on, asking cuptiGetStreamIdEx for the stream
//     at its entry (as gpufl's sync records do)
//   9 as 0, and the launching thread asks cuptiGetStreamIdEx after each batch
//  10 as 0, the window turning on what gpufl's does: kernels, memcpy, memset and overhead
//  11 as 0, and memory activity (MEMORY2) on from each attach to its detach (as gpufl's mem
//     records)
//  12 as 0, and the window turns the launch callbacks on and off with the kernel activity
//     (cudaLaunchKernel and cuLaunchKernel, cuptiEnableCallback: as gpufl's call sites did):
//     died of heap corruption (H200, CUDA 13.0: 1 of 2 processes)
//  13 as 12, the launch callbacks turned on with the window and never off: the detach removes
//     them (as gpufl's call sites do when it detaches)
// Buffers are never freed: each handed-over buffer's bytes are checksummed when CUPTI returns it
// and again at the end, to catch CUPTI writing into a buffer it gave back.
// Build and run (device): nvcc -O2 -o build/detachloop scripts/probe/detachloop.cu -lcupti -lcuda
//   build/detachloop [cases...] [--reps N]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda.h>
#include <cupti.h>
#include <mutex>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include "probe_common.h"

static const size_t BUF = 4 << 20;
struct Handed {
    uint8_t *buf;
    uint64_t sum;
};
static std::mutex handed_mu;
static std::vector<Handed> handed;
static std::atomic<long> records{0};

static uint64_t checksum(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    const uint64_t *w = (const uint64_t *)p;
    for (size_t i = 0; i < n / 8; i++) h = (h ^ w[i]) * 1099511628211ull;
    return h;
}
static void CUPTIAPI request(uint8_t **buf, size_t *size, size_t *max) {
    *size = BUF;
    *buf = (uint8_t *)aligned_alloc(8, BUF);
    memset(*buf, 0xA5, BUF);
    *max = 0;
}
static int the_case = 0;
static std::vector<std::pair<uint8_t *, size_t>> deferred;
static void read_records(uint8_t *buf, size_t valid) {
    CUpti_Activity *rec = nullptr;
    long n = 0;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) n++;
    records += n;
    std::lock_guard<std::mutex> g(handed_mu);
    handed.push_back({buf, checksum(buf, BUF)});
}
static void read_deferred() {
    std::vector<std::pair<uint8_t *, size_t>> now;
    {
        std::lock_guard<std::mutex> g(handed_mu);
        now.swap(deferred);
    }
    for (auto &b : now) read_records(b.first, b.second);
}
static void CUPTIAPI complete(CUcontext, uint32_t, uint8_t *buf, size_t, size_t valid) {
    if (!buf) return;
    if (the_case >= 6) {
        std::lock_guard<std::mutex> g(handed_mu);
        deferred.push_back({buf, valid});
        return;
    }
    read_records(buf, valid);
}

static std::atomic<int> want_detach{0};  // 0 idle, 1 asked, 2 done
static std::atomic<long> detaches{0};
static CUpti_SubscriberHandle sub;

static std::atomic<long> stream_asks{0};
static void CUPTIAPI callback(void *, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                              const void *data) {
    const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
    if (the_case == 8 && domain == CUPTI_CB_DOMAIN_RUNTIME_API && cb->callbackSite == CUPTI_API_ENTER &&
        cbid == CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020 && want_detach.load() == 0) {
        auto *p = (const cudaStreamSynchronize_v3020_params *)cb->functionParams;
        uint32_t id = 0;
        if (cuptiGetStreamIdEx(cb->context, (CUstream)p->stream, 0, &id) == CUPTI_SUCCESS) stream_asks++;
    }
    if (cb->callbackSite != CUPTI_API_EXIT) return;
    CUpti_CallbackDomain want = the_case == 3 ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
    if (domain != want) return;
    int one = 1;
    if (!want_detach.compare_exchange_strong(one, 3)) return;
    if (the_case != 4) CK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
    CK(cuptiFinalize());
    detaches++;
    want_detach.store(2);
}

static void attach() {
    CK(cuptiSubscribe(&sub, (CUpti_CallbackFunc)callback, nullptr));
    if (the_case == 5) CK(cuptiSetThreadIdType(CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM));
    if (the_case != 1 && the_case != 2) {
        uint8_t on = 1;
        size_t sz = 1;
        CK(cuptiActivitySetAttribute(CUPTI_ACTIVITY_ATTR_PER_THREAD_ACTIVITY_BUFFER, &sz, &on));
    }
    if (the_case != 2) CK(cuptiActivityRegisterCallbacks(request, complete));
    if (the_case == 8)
        CK(cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API,
                               CUPTI_RUNTIME_TRACE_CBID_cudaStreamSynchronize_v3020));
}

// Case 12: the launch callbacks on or off, as a gpufl window switches its call sites.
static void launch_callbacks(uint32_t on) {
    CK(cuptiEnableCallback(on, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000));
    CK(cuptiEnableCallback(on, sub, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel));
}

static void helper(std::atomic<bool> *stop) {
    using namespace std::chrono;
    while (!stop->load()) {
        attach();
        if (the_case == 6) read_deferred();
        if (the_case == 11) CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMORY2));
        if (the_case != 2) CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
        if (the_case == 12 || the_case == 13) launch_callbacks(1);
        if (the_case == 10) {
            CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
            CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
            CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_OVERHEAD));
        }
        std::this_thread::sleep_for(milliseconds(200));
        if (the_case == 12) launch_callbacks(0);
        if (the_case == 10) {
            CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY));
            CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET));
            CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_OVERHEAD));
        }
        if (the_case != 2) {
            CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
            CK(cuptiActivityFlushAll(0));
        }
        if (the_case >= 6) read_deferred();
        std::this_thread::sleep_for(milliseconds(100));
        if (the_case != 2) CK(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED));
        if (the_case >= 6) read_deferred();
        CK(cuptiEnableDomain(1, sub, the_case == 3 ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API));
        want_detach.store(1);
        auto t0 = steady_clock::now();
        while (want_detach.load() != 2 && !stop->load() && steady_clock::now() - t0 < seconds(2))
            std::this_thread::sleep_for(microseconds(200));
        if (want_detach.load() != 2) {
            int one = 1;
            if (want_detach.compare_exchange_strong(one, 0)) break;  // never taken: stop here
            while (want_detach.load() != 2) std::this_thread::sleep_for(microseconds(200));
        }
        want_detach.store(0);
        if (the_case == 7) read_deferred();
        std::this_thread::sleep_for(milliseconds(200));
    }
}

static void run_case(int c) {
    the_case = c;
    cudaStream_t s;
    cudaFree(0);
    if (cudaStreamCreate(&s) != cudaSuccess) { printf("no CUDA\n"); return; }
    std::atomic<bool> stop{false};
    std::thread h(helper, &stop);
    auto start = std::chrono::steady_clock::now();
    long launches = 0;
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
        for (int i = 0; i < 2000; i++) empty<<<1, 32, 0, s>>>(nullptr);
        cudaStreamSynchronize(s);
        launches += 2000;
        if (the_case == 9 && want_detach.load() == 0) {
            CUcontext ctx = nullptr;
            cuCtxGetCurrent(&ctx);
            uint32_t id = 0;
            if (cuptiGetStreamIdEx(ctx, (CUstream)s, 0, &id) == CUPTI_SUCCESS) stream_asks++;
        }
    }
    stop.store(true);
    h.join();
    read_deferred();
    int changed = 0;
    {
        std::lock_guard<std::mutex> g(handed_mu);
        for (auto &b : handed) changed += checksum(b.buf, BUF) != b.sum;
    }
    printf("case %d: %ld detaches, %ld launches, %ld records, %zu buffers handed back, %d changed after, %ld stream ids\n",
           c, detaches.load(), launches, records.load(), handed.size(), changed, stream_asks.load());
    fflush(stdout);
}

int main(int argc, char **argv) {
    std::vector<int> cases;
    int reps = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else cases.push_back(atoi(argv[i]));
    }
    if (cases.empty()) cases = {0, 1, 2, 3, 4, 5};
    for (int r = 0; r < reps; r++)
        for (int c : cases) {
            fflush(stdout);
            pid_t pid = fork();
            if (pid == 0) {
                alarm(40);
                run_case(c);
                fflush(stdout);
                _exit(0);
            }
            int st = 0;
            waitpid(pid, &st, 0);
            if (st) printf("case %d: FAILED, status %d%s\n", c, st, WIFSIGNALED(st) ? " (signal)" : "");
        }
    return 0;
}
