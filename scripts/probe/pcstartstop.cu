// pcstartstop.cu - probe for issue 19: can gpufl's recorder take PC-sampling stall reasons on a
// few chosen launches? Not part of gpufl. PC sampling has to be enabled before the module loads
// (scripts/probe/pcsampling.cu), so the recorder would enable it at context creation with CUPTI's
// start/stop control, and start it only around a chosen launch. Questions:
//   - does an enabled but stopped context slow kernels or launches (per launch, bare kernels and a
//     launch-bound loop of empty kernels)?
//   - does a start / launch / synchronize / stop around one launch give its samples, at its lines?
//   - do CUPTI's concurrent-kernel activity records still arrive (as gpufl collects them)?
//   - can SASS metrics (the other half of --kernel-detail) still be read on that context?
// Cases, each in its own forked process with a 30 s alarm; concurrent-kernel activity is on in all:
//   1 no PC sampling (the baseline)
//   2 PC sampling enabled in the context-created callback, start/stop control, continuous mode
//   3 as 2, kernel-serialized mode
//   4 as 2, then one SASS-metrics launch of `divergent` (threads per warp instruction, 16.18)
//   5 as 2, enabled in main after context creation but before the module's first launch
//   6 as 2, then one SASS-metrics launch with the concurrent-kernel activity kind left on
//   7 no PC sampling at context creation: after the module is loaded, each sampled launch is
//     enable + configure, start, launch, synchronize, stop, read, disable; then the kernel
//     activity kind is turned off and on again (as the SASS path does)
//   8 as 7, but enabled and started in the launch's entry callback, stopped and read in its exit
//     callback after cuStreamSynchronize (as gpufl's recorder does)
//   9 as 7, after one SASS-metrics launch of `divergent` (profiler initialized, patching on/off)
// Build (device): nvcc -O2 -lineinfo -I$CUPTI/include -o build/pcstartstop scripts/probe/pcstartstop.cu \
//                   -L$CUPTI/lib64 -lcupti -lcuda
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>
#include <algorithm>
#include <unistd.h>
#include <signal.h>
#include <sys/wait.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cupti_pcsampling.h>
#include <cupti_target.h>
#include <cupti_profiler_target.h>
#include <cupti_sass_metrics.h>

#define KERNEL_DETAIL_NO_MAIN
#include "../../examples/kernel_detail.cu"

__global__ void empty_kernel() {}

static int g_case = 0;
static CUcontext g_ctx = nullptr;
static std::vector<std::pair<uint64_t, std::vector<char>>> g_cubins;
static std::vector<uint32_t> g_reason_idx;
static std::map<uint32_t, std::string> g_reason_name;
static CUpti_PCSamplingData g_buf, g_buf2;
static uint64_t g_kernel_records = 0;
static const size_t MAXPCS = 8192;

#define CPW(x) do { CUptiResult r_ = (x); if (r_ != CUPTI_SUCCESS) { const char* s_ = nullptr; cuptiGetResultString(r_, &s_); std::printf("  %s: error %d %s\n", #x, (int)r_, s_ ? s_ : ""); } } while (0)

static void alloc_buffer(CUpti_PCSamplingData& b, size_t nreasons) {
    b = {};
    b.size = sizeof(CUpti_PCSamplingData);
    b.collectNumPcs = MAXPCS;
    b.pPcData = (CUpti_PCSamplingPCData*)std::calloc(MAXPCS, sizeof(CUpti_PCSamplingPCData));
    for (size_t p = 0; p < MAXPCS; ++p) {
        b.pPcData[p].size = sizeof(CUpti_PCSamplingPCData);
        b.pPcData[p].stallReason = (CUpti_PCSamplingStallReason*)std::calloc(nreasons, sizeof(CUpti_PCSamplingStallReason));
    }
}

static void enable_pc(CUcontext ctx) {
    auto t0 = std::chrono::steady_clock::now();
    CUpti_PCSamplingEnableParams en = {CUpti_PCSamplingEnableParamsSize};
    en.ctx = ctx;
    CPW(cuptiPCSamplingEnable(&en));
    size_t n = 0;
    CUpti_PCSamplingGetNumStallReasonsParams nr = {CUpti_PCSamplingGetNumStallReasonsParamsSize};
    nr.ctx = ctx;
    nr.numStallReasons = &n;
    CPW(cuptiPCSamplingGetNumStallReasons(&nr));
    g_reason_idx.assign(n, 0);
    std::vector<char*> names(n);
    for (auto& s : names) s = (char*)std::calloc(CUPTI_STALL_REASON_STRING_SIZE, 1);
    CUpti_PCSamplingGetStallReasonsParams sr = {CUpti_PCSamplingGetStallReasonsParamsSize};
    sr.ctx = ctx;
    sr.numStallReasons = n;
    sr.stallReasonIndex = g_reason_idx.data();
    sr.stallReasons = names.data();
    CPW(cuptiPCSamplingGetStallReasons(&sr));
    for (size_t r = 0; r < n; ++r) g_reason_name[g_reason_idx[r]] = names[r];
    alloc_buffer(g_buf, n);
    alloc_buffer(g_buf2, n);
    CUpti_PCSamplingConfigurationInfo cfg[6] = {};
    cfg[0].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_STALL_REASON;
    cfg[0].attributeData.stallReasonData.stallReasonCount = n;
    cfg[0].attributeData.stallReasonData.pStallReasonIndex = g_reason_idx.data();
    cfg[1].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_DATA_BUFFER;
    cfg[1].attributeData.samplingDataBufferData.samplingDataBuffer = &g_buf;
    cfg[2].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_COLLECTION_MODE;
    cfg[2].attributeData.collectionModeData.collectionMode =
        g_case == 3 ? CUPTI_PC_SAMPLING_COLLECTION_MODE_KERNEL_SERIALIZED : CUPTI_PC_SAMPLING_COLLECTION_MODE_CONTINUOUS;
    cfg[3].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD;
    cfg[3].attributeData.samplingPeriodData.samplingPeriod = 12;
    cfg[4].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SCRATCH_BUFFER_SIZE;
    cfg[4].attributeData.scratchBufferSizeData.scratchBufferSize = 16 << 20;
    cfg[5].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_ENABLE_START_STOP_CONTROL;
    cfg[5].attributeData.enableStartStopControlData.enableStartStopControl = 1;
    CUpti_PCSamplingConfigurationInfoParams cp = {CUpti_PCSamplingConfigurationInfoParamsSize};
    cp.ctx = ctx;
    cp.numAttributes = 6;
    cp.pPCSamplingConfigurationInfo = cfg;
    CPW(cuptiPCSamplingSetConfigurationAttribute(&cp));
    std::printf("  pc sampling enabled (%zu stall reasons) in %.3f ms\n", n,
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
}

static bool g_cb_sample = false, g_pc_on = false;
static void drain();
static void print_lines();
static double ms_since(std::chrono::steady_clock::time_point t0);

static void CUPTIAPI on_cb(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
    if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
        if (!g_cb_sample) return;
        auto* cd = (const CUpti_CallbackData*)data;
        auto t0 = std::chrono::steady_clock::now();
        if (cd->callbackSite == CUPTI_API_ENTER) {
            if (!g_pc_on) { enable_pc(g_ctx); g_pc_on = true; }
            CUpti_PCSamplingStartParams st = {CUpti_PCSamplingStartParamsSize};
            st.ctx = g_ctx;
            CPW(cuptiPCSamplingStart(&st));
            std::printf("  entry callback: enable + start %.3f ms\n", ms_since(t0));
        } else {
            cuStreamSynchronize(0);
            CUpti_PCSamplingStopParams sp = {CUpti_PCSamplingStopParamsSize};
            sp.ctx = g_ctx;
            CPW(cuptiPCSamplingStop(&sp));
            drain();
            std::printf("  exit callback: sync + stop + read %.3f ms\n", ms_since(t0));
            print_lines();
        }
        return;
    }
    if (domain != CUPTI_CB_DOMAIN_RESOURCE) return;
    auto* rd = (const CUpti_ResourceData*)data;
    if (cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED && (g_case == 2 || g_case == 3 || g_case == 4 || g_case == 6)) enable_pc(rd->context);
    if (cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED) {
        auto* md = (const CUpti_ModuleResourceData*)rd->resourceDescriptor;
        if (!md || !md->pCubin || !md->cubinSize) return;
        CUpti_GetCubinCrcParams p = {CUpti_GetCubinCrcParamsSize};
        p.cubinSize = md->cubinSize;
        p.cubin = md->pCubin;
        if (cuptiGetCubinCrc(&p) == CUPTI_SUCCESS)
            g_cubins.push_back({p.cubinCrc, std::vector<char>(md->pCubin, md->pCubin + md->cubinSize)});
    }
}

static void CUPTIAPI buf_req(uint8_t** b, size_t* size, size_t* max) {
    *size = 1 << 20; *b = (uint8_t*)aligned_alloc(8, *size); *max = 0;
}
static void CUPTIAPI buf_done(CUcontext, uint32_t, uint8_t* b, size_t, size_t valid) {
    CUpti_Activity* rec = nullptr;
    while (cuptiActivityGetNextRecord(b, valid, &rec) == CUPTI_SUCCESS)
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) ++g_kernel_records;
    free(b);
}

struct Line { uint64_t samples = 0; std::map<std::string, uint64_t> reasons; };
static std::map<std::string, Line> g_lines;
static uint64_t g_total = 0, g_dropped = 0;

static void take(CUpti_PCSamplingData& b) {
    g_total += b.totalSamples;
    g_dropped += b.droppedSamples;
    for (size_t p = 0; p < b.totalNumPcs; ++p) {
        auto& pc = b.pPcData[p];
        std::string where = pc.functionName ? pc.functionName : "?";
        for (auto& cb : g_cubins) {
            if (cb.first != pc.cubinCrc) continue;
            CUpti_GetSassToSourceCorrelationParams sc = {CUpti_GetSassToSourceCorrelationParamsSize};
            sc.cubin = cb.second.data();
            sc.cubinSize = cb.second.size();
            sc.functionName = pc.functionName;
            sc.pcOffset = pc.pcOffset;
            if (cuptiGetSassToSourceCorrelation(&sc) == CUPTI_SUCCESS) {
                const char* f = sc.fileName ? sc.fileName : "?";
                const char* base = std::strrchr(f, '/');
                where += std::string(" ") + (base ? base + 1 : f) + ":" + std::to_string(sc.lineNumber);
            }
            break;
        }
        auto& ln = g_lines[where];
        for (size_t s = 0; s < pc.stallReasonCount; ++s) {
            ln.samples += pc.stallReason[s].samples;
            ln.reasons[g_reason_name[pc.stallReason[s].pcSamplingStallReasonIndex]] += pc.stallReason[s].samples;
        }
    }
    b.totalNumPcs = 0;
    b.totalSamples = 0;
}

static void drain() {
    if (g_buf.totalNumPcs > 0) { std::printf("  config buffer: %zu PCs\n", g_buf.totalNumPcs); take(g_buf); }
    for (int k = 0; k < 64; ++k) {
        CUpti_PCSamplingGetDataParams gd = {CUpti_PCSamplingGetDataParamsSize};
        gd.ctx = g_ctx;
        gd.pcSamplingData = &g_buf2;
        CUptiResult r = cuptiPCSamplingGetData(&gd);
        if (r != CUPTI_SUCCESS) { std::printf("  getdata: error %d\n", (int)r); return; }
        bool more = g_buf2.remainingNumPcs > 0;
        if (k < 2) std::printf("  getdata: %zu PCs, %llu samples, remaining %zu\n", g_buf2.totalNumPcs,
                               (unsigned long long)g_buf2.totalSamples, g_buf2.remainingNumPcs);
        take(g_buf2);
        if (!more) return;
    }
}

static void print_lines() {
    std::vector<std::pair<uint64_t, std::string>> order;
    for (auto& [w, l] : g_lines) order.push_back({l.samples, w});
    std::sort(order.rbegin(), order.rend());
    for (size_t k = 0; k < order.size() && k < 6; ++k) {
        auto& l = g_lines[order[k].second];
        std::vector<std::pair<uint64_t, std::string>> rs;
        for (auto& [n, c] : l.reasons) if (c) rs.push_back({c, n});
        std::sort(rs.rbegin(), rs.rend());
        std::printf("  %8llu %s :", (unsigned long long)l.samples, order[k].second.c_str());
        for (size_t r = 0; r < rs.size() && r < 3; ++r) std::printf(" %s %llu", rs[r].second.c_str(), (unsigned long long)rs[r].first);
        std::printf("\n");
    }
    g_lines.clear();
    std::printf("  samples %llu dropped %llu\n", (unsigned long long)g_total, (unsigned long long)g_dropped);
    g_total = g_dropped = 0;
}

static double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

static void timing(const char* label, float* in, float* out) {
    dim3 grid(N / BLOCK);
    for (int k = 0; k < 3; ++k) {
        cudaDeviceSynchronize();
        int n = k == 2 ? 20000 : 20;
        auto t0 = std::chrono::steady_clock::now();
        for (int l = 0; l < n; ++l) {
            if (k == 0) divergent<<<grid, BLOCK>>>(in, out);
            else if (k == 1) strided_load<<<grid, BLOCK>>>(in, out);
            else empty_kernel<<<1, 32>>>();
        }
        cudaDeviceSynchronize();
        std::printf("  %s %s: %.4f ms per launch\n", label, k == 0 ? "divergent" : k == 1 ? "strided_load" : "empty x20000",
                    ms_since(t0) / n);
    }
}

static void sass_divergent(float* in, float* out, bool toggle) {
    CUpti_Profiler_Initialize_Params pi = {CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    CPW(cuptiProfilerInitialize(&pi));
    CUpti_Device_GetChipName_Params cn = {CUpti_Device_GetChipName_Params_STRUCT_SIZE};
    cn.deviceIndex = 0;
    CPW(cuptiDeviceGetChipName(&cn));
    const char* names[2] = {"smsp__sass_inst_executed", "smsp__sass_thread_inst_executed"};
    CUpti_SassMetrics_Config cfg[2];
    uint64_t ids[2];
    for (int i = 0; i < 2; ++i) {
        CUpti_SassMetrics_GetProperties_Params mp = {CUpti_SassMetrics_GetProperties_Params_STRUCT_SIZE};
        mp.pChipName = cn.pChipName;
        mp.pMetricName = names[i];
        CPW(cuptiSassMetricsGetProperties(&mp));
        ids[i] = mp.metric.metricId;
        cfg[i] = {mp.metric.metricId, (uint8_t)CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU};
    }
    CUpti_SassMetricsSetConfig_Params sc = {CUpti_SassMetricsSetConfig_Params_STRUCT_SIZE};
    sc.deviceIndex = 0; sc.numOfMetricConfig = 2; sc.pConfigs = cfg;
    CPW(cuptiSassMetricsSetConfig(&sc));
    if (toggle) CPW(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUpti_SassMetricsEnable_Params en = {CUpti_SassMetricsEnable_Params_STRUCT_SIZE};
    en.ctx = g_ctx;
    en.enableLazyPatching = 1;
    CPW(cuptiSassMetricsEnable(&en));
    divergent<<<dim3(N / BLOCK), BLOCK>>>(in, out);
    cudaDeviceSynchronize();
    CUpti_SassMetricsGetDataProperties_Params dp = {CUpti_SassMetricsGetDataProperties_Params_STRUCT_SIZE};
    dp.ctx = g_ctx;
    CPW(cuptiSassMetricsGetDataProperties(&dp));
    size_t n = dp.numOfPatchedInstructionRecords, per = dp.numOfInstances ? dp.numOfInstances : 1;
    std::vector<CUpti_SassMetrics_Data> d(n);
    std::vector<CUpti_SassMetrics_InstanceValue> v(n * per);
    for (size_t i = 0; i < n; ++i) { d[i].structSize = sizeof(CUpti_SassMetrics_Data); d[i].pInstanceValues = &v[i * per]; }
    CUpti_SassMetricsFlushData_Params fd = {CUpti_SassMetricsFlushData_Params_STRUCT_SIZE};
    fd.ctx = g_ctx; fd.numOfPatchedInstructionRecords = n; fd.numOfInstances = per; fd.pMetricsData = d.data();
    CPW(cuptiSassMetricsFlushData(&fd));
    unsigned long long inst = 0, thr = 0;
    for (auto& x : v) { if (x.metricId == ids[0]) inst += x.value; if (x.metricId == ids[1]) thr += x.value; }
    std::printf("  sass metrics with pc sampling enabled: %zu records, ratio %.2f\n", n, inst ? (double)thr / inst : 0.0);
    CUpti_SassMetricsDisable_Params dis = {CUpti_SassMetricsDisable_Params_STRUCT_SIZE};
    dis.ctx = g_ctx;
    CPW(cuptiSassMetricsDisable(&dis));
    if (toggle) CPW(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
}

static int run_case(int c) {
    g_case = c;
    cuptiActivityRegisterCallbacks(buf_req, buf_done);
    CPW(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUpti_SubscriberHandle sub;
    cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_cb, nullptr);
    cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RESOURCE);
    if (c == 8) cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    cudaFree(0);
    cuCtxGetCurrent(&g_ctx);
    if (c == 5) enable_pc(g_ctx);
    float *in, *out;
    cudaMalloc(&in, N * sizeof(float));
    cudaMalloc(&out, N * sizeof(float));
    cudaMemset(in, 0, N * sizeof(float));
    dim3 grid(N / BLOCK);
    divergent<<<grid, BLOCK>>>(in, out);  // warm-up, loads the module
    strided_load<<<grid, BLOCK>>>(in, out);
    empty_kernel<<<1, 32>>>();
    cudaDeviceSynchronize();
    timing(c == 1 ? "bare" : "stopped", in, out);
    if (c == 9) sass_divergent(in, out, true);
    if (c == 8) {
        for (int k = 0; k < 2; ++k) {
            g_cb_sample = true;
            if (k == 0) divergent<<<grid, BLOCK>>>(in, out); else strided_load<<<grid, BLOCK>>>(in, out);
            g_cb_sample = false;
            cudaDeviceSynchronize();
        }
    }
    if (c >= 2 && c != 8) {
        for (int k = 0; k < 2; ++k) {
            auto t0 = std::chrono::steady_clock::now();
            if (c == 7 || c == 9) {
                enable_pc(g_ctx);
                std::printf("  enable + configure: %.3f ms\n", ms_since(t0));
                t0 = std::chrono::steady_clock::now();
            }
            CUpti_PCSamplingStartParams st = {CUpti_PCSamplingStartParamsSize};
            st.ctx = g_ctx;
            CPW(cuptiPCSamplingStart(&st));
            double t_start = ms_since(t0);
            if (k == 0) divergent<<<grid, BLOCK>>>(in, out); else strided_load<<<grid, BLOCK>>>(in, out);
            cuStreamSynchronize(0);
            double t_run = ms_since(t0);
            CUpti_PCSamplingStopParams sp = {CUpti_PCSamplingStopParamsSize};
            sp.ctx = g_ctx;
            CPW(cuptiPCSamplingStop(&sp));
            double t_stop = ms_since(t0);
            drain();
            std::printf("  sampled %s: start %.3f ms, launch+sync %.3f, stop %.3f, read %.3f ms\n",
                        k == 0 ? "divergent" : "strided_load", t_start, t_run - t_start, t_stop - t_run, ms_since(t0) - t_stop);
            print_lines();
            if (c == 7 || c == 9) {
                auto t1 = std::chrono::steady_clock::now();
                CUpti_PCSamplingDisableParams dis = {CUpti_PCSamplingDisableParamsSize};
                dis.ctx = g_ctx;
                CPW(cuptiPCSamplingDisable(&dis));
                std::printf("  disable: %.3f ms\n", ms_since(t1));
            }
        }
        if (c == 7) {
            CPW(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
            CPW(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
            std::printf("  kernel activity kind off and on again\n");
        }
        timing("stopped again", in, out);
    }
    if (c == 4 || c == 6) sass_divergent(in, out, c == 4);
    cudaDeviceSynchronize();
    cuptiActivityFlushAll(1);
    std::printf("  kernel activity records: %llu\n", (unsigned long long)g_kernel_records);
    if (c >= 2 && c != 7 && c != 9) {
        CUpti_PCSamplingDisableParams dis = {CUpti_PCSamplingDisableParamsSize};
        dis.ctx = g_ctx;
        CPW(cuptiPCSamplingDisable(&dis));
        timing("disabled", in, out);
    }
    std::printf("  case %d finished\n", c);
    std::fflush(stdout);
    return 0;
}

int main(int argc, char** argv) {
    int first = argc > 1 ? std::atoi(argv[1]) : 1;
    int last = argc > 2 ? std::atoi(argv[2]) : 9;
    for (int c = first; c <= last; ++c) {
        std::printf("case %d\n", c);
        std::fflush(stdout);
        pid_t p = fork();
        if (p == 0) { alarm(30); std::_Exit(run_case(c)); }
        int st = 0;
        waitpid(p, &st, 0);
        if (WIFSIGNALED(st)) std::printf("  case %d: killed by signal %d%s\n", c, WTERMSIG(st), WTERMSIG(st) == SIGALRM ? " (hung: 30 s alarm)" : "");
        else if (WEXITSTATUS(st) != 0) std::printf("  case %d: exit %d\n", c, WEXITSTATUS(st));
    }
    return 0;
}
