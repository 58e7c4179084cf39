// sasscallback.cu - probe for issue 19: from where can CUPTI's SASS metrics be enabled and read?
// Not part of gpufl. gpufl's recorder enabled patching in a launch's entry callback and read the
// counters in its exit callback: every counter came back 0; reading on another thread hung.
// Each case runs in its own forked process with a 20 s alarm, so a hang is reported, not fatal:
//   1 enable in the launch's entry callback, read in main after cudaDeviceSynchronize
//   2 enable in main, read in the launch's exit callback (after cuStreamSynchronize)
//   3 enable in the entry callback, read in the exit callback (what the recorder did)
//   4 enable in main, read on a second thread while main waits outside any callback (join)
//   5 enable in main, read on a second thread while main waits inside the exit callback (join)
//   6 enable in the entry callback, read in the entry callback of the NEXT launch, after
//     cuStreamSynchronize there (patching stays on for that next launch)
//   7 as 1, then a second launch read the same way: do the counters reset after a flush?
//   8 as 3, with CUPTI's concurrent-kernel activity records enabled (as gpufl's recorder has)
//   9 as 3, with gpufl's 12 metrics configured instead of 2
//  10 as 8, but the concurrent-kernel activity kind is disabled in the entry callback before
//     enabling SASS patching and enabled again after the read in the exit callback
// Prints per case: inst_executed, thread_inst_executed, their ratio (16.18 expected for
// `divergent`), or how the child ended.
//
// Build (device): nvcc -O2 -lineinfo -I$CUPTI/include -o build/sasscallback scripts/probe/sasscallback.cu \
//                   -L$CUPTI/lib64 -lcupti -lcuda
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#include <unistd.h>
#include <signal.h>
#include <sys/wait.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cupti_target.h>
#include <cupti_profiler_target.h>
#include <cupti_sass_metrics.h>

#define KERNEL_DETAIL_NO_MAIN
#include "../../examples/kernel_detail.cu"

static int g_case = 0;
static CUcontext g_ctx = nullptr;
static uint64_t g_ids[2];
static int g_launch = 0;
static bool g_read_done = false;

static void enable() {
    CUpti_SassMetricsEnable_Params en = {CUpti_SassMetricsEnable_Params_STRUCT_SIZE};
    en.ctx = g_ctx;
    en.enableLazyPatching = 1;
    CUptiResult r = cuptiSassMetricsEnable(&en);
    if (r != CUPTI_SUCCESS) std::printf("  enable: error %d\n", (int)r);
}

static void read_and_disable(const char* where) {
    CUpti_SassMetricsGetDataProperties_Params dp = {CUpti_SassMetricsGetDataProperties_Params_STRUCT_SIZE};
    dp.ctx = g_ctx;
    CUptiResult r = cuptiSassMetricsGetDataProperties(&dp);
    if (r != CUPTI_SUCCESS) { std::printf("  %s: props error %d\n", where, (int)r); return; }
    size_t n = dp.numOfPatchedInstructionRecords, per = dp.numOfInstances ? dp.numOfInstances : 1;
    std::vector<CUpti_SassMetrics_Data> data(n);
    std::vector<CUpti_SassMetrics_InstanceValue> vals(n * per);
    for (size_t i = 0; i < n; ++i) { data[i].structSize = sizeof(CUpti_SassMetrics_Data); data[i].pInstanceValues = &vals[i * per]; }
    CUpti_SassMetricsFlushData_Params fd = {CUpti_SassMetricsFlushData_Params_STRUCT_SIZE};
    fd.ctx = g_ctx; fd.numOfPatchedInstructionRecords = n; fd.numOfInstances = per; fd.pMetricsData = data.data();
    r = cuptiSassMetricsFlushData(&fd);
    if (r != CUPTI_SUCCESS) { std::printf("  %s: flush error %d\n", where, (int)r); return; }
    unsigned long long inst = 0, thr = 0;
    for (auto& v : vals) { if (v.metricId == g_ids[0]) inst += v.value; if (v.metricId == g_ids[1]) thr += v.value; }
    std::printf("  %s: %zu records, inst %llu, thread_inst %llu, ratio %.2f\n", where, n, inst, thr, inst ? (double)thr / inst : 0.0);
    if (g_case != 7) {
        CUpti_SassMetricsDisable_Params dis = {CUpti_SassMetricsDisable_Params_STRUCT_SIZE};
        dis.ctx = g_ctx;
        cuptiSassMetricsDisable(&dis);
    }
    std::fflush(stdout);
}

static void CUPTIAPI on_cb(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
    if (cbid != CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000) return;
    auto* cd = (const CUpti_CallbackData*)data;
    bool enter = cd->callbackSite == CUPTI_API_ENTER;
    if (enter) ++g_launch;
    if (enter && g_launch == 1 && g_case == 10) std::printf("  activity disable: %d\n", (int)cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    if (enter && g_launch == 1 && (g_case == 1 || g_case == 3 || g_case == 6 || g_case == 7 || g_case >= 8)) enable();
    if (!enter && g_launch == 1) {
        if (g_case == 2 || g_case == 3 || g_case >= 8) { cuStreamSynchronize(0); read_and_disable("exit callback"); g_read_done = true; }
        if (g_case == 10) std::printf("  activity enable: %d\n", (int)cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
        if (g_case == 5) {
            cuStreamSynchronize(0);
            std::thread t([] { cuCtxSetCurrent(g_ctx); read_and_disable("second thread, main in callback"); });
            t.join();
            g_read_done = true;
        }
    }
    if (enter && g_launch == 2 && g_case == 6) { cuStreamSynchronize(0); read_and_disable("next launch's entry callback"); g_read_done = true; }
}

static void CUPTIAPI buf_req(uint8_t** b, size_t* size, size_t* max) {
    *size = 1 << 20; *b = (uint8_t*)aligned_alloc(8, *size); *max = 0;
}
static void CUPTIAPI buf_done(CUcontext, uint32_t, uint8_t* b, size_t, size_t) { free(b); }

static int run_case(int c) {
    g_case = c;
    if (c == 8 || c == 10) {
        cuptiActivityRegisterCallbacks(buf_req, buf_done);
        CUptiResult r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        std::printf("  concurrent kernel activity: %d\n", (int)r);
    }
    float *in, *out;
    CUpti_SubscriberHandle sub;
    cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_cb, nullptr);
    cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    cudaFree(0);
    cuCtxGetCurrent(&g_ctx);
    cudaMalloc(&in, N * sizeof(float));
    cudaMalloc(&out, N * sizeof(float));
    cudaMemset(in, 0, N * sizeof(float));
    CUpti_Profiler_Initialize_Params pi = {CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    cuptiProfilerInitialize(&pi);
    CUpti_Device_GetChipName_Params cn = {CUpti_Device_GetChipName_Params_STRUCT_SIZE};
    cn.deviceIndex = 0;
    cuptiDeviceGetChipName(&cn);
    const char* names[12] = {"smsp__sass_inst_executed", "smsp__sass_thread_inst_executed",
        "smsp__sass_branch_targets_threads_uniform", "smsp__sass_branch_targets_threads_divergent",
        "smsp__sass_inst_executed_op_global_ld", "smsp__sass_inst_executed_op_global_st",
        "smsp__sass_sectors_mem_global", "smsp__sass_sectors_mem_global_ideal",
        "smsp__sass_inst_executed_op_shared_ld", "smsp__sass_inst_executed_op_shared_st",
        "smsp__sass_l1tex_pipe_lsu_wavefronts_mem_shared", "smsp__sass_l1tex_pipe_lsu_wavefronts_mem_shared_ideal"};
    int nm = c == 9 ? 12 : 2;
    CUpti_SassMetrics_Config cfg[12];
    for (int i = 0; i < nm; ++i) {
        CUpti_SassMetrics_GetProperties_Params mp = {CUpti_SassMetrics_GetProperties_Params_STRUCT_SIZE};
        mp.pChipName = cn.pChipName;
        mp.pMetricName = names[i];
        if (cuptiSassMetricsGetProperties(&mp) != CUPTI_SUCCESS) { std::printf("  no metric %s\n", names[i]); return 3; }
        if (i < 2) g_ids[i] = mp.metric.metricId;
        cfg[i] = {mp.metric.metricId, (uint8_t)CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU};
    }
    CUpti_SassMetricsSetConfig_Params sc = {CUpti_SassMetricsSetConfig_Params_STRUCT_SIZE};
    sc.deviceIndex = 0; sc.numOfMetricConfig = nm; sc.pConfigs = cfg;
    if (cuptiSassMetricsSetConfig(&sc) != CUPTI_SUCCESS) { std::printf("  setconfig failed\n"); return 3; }
    dim3 grid(N / BLOCK);
    if (c == 2 || c == 4 || c == 5) enable();
    divergent<<<grid, BLOCK>>>(in, out);
    if (c == 6) divergent<<<grid, BLOCK>>>(in, out);
    cudaDeviceSynchronize();
    if (c == 1 || c == 7) read_and_disable("main after sync");
    if (c == 7) { divergent<<<grid, BLOCK>>>(in, out); cudaDeviceSynchronize(); read_and_disable("main after a second launch"); }
    if (c == 4) {
        std::thread t([] { cuCtxSetCurrent(g_ctx); read_and_disable("second thread, main outside callbacks"); });
        t.join();
    }
    cudaDeviceSynchronize();
    std::printf("  case %d finished (read %s)\n", c, (g_read_done || c == 1 || c == 4 || c == 7) ? "done" : "not done");
    std::fflush(stdout);
    return 0;
}

int main(int argc, char** argv) {
    int first = argc > 1 ? std::atoi(argv[1]) : 1;
    for (int c = first; c <= 10; ++c) {
        std::printf("case %d\n", c);
        std::fflush(stdout);
        pid_t p = fork();
        if (p == 0) { alarm(20); std::_Exit(run_case(c)); }
        int st = 0;
        waitpid(p, &st, 0);
        if (WIFSIGNALED(st)) std::printf("  case %d: killed by signal %d%s\n", c, WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (hung: 20 s alarm)" : "");
        else if (WEXITSTATUS(st) != 0) std::printf("  case %d: exit %d\n", c, WEXITSTATUS(st));
    }
    return 0;
}
