// sassmetrics.cu - probe for issue 19: CUPTI's SASS metrics API (instruction-level counters by
// patching the kernel's SASS) on the planted kernels of examples/kernel_detail.cu. Not part of gpufl.
//
// What it answers: which SASS metrics this chip offers (listed), whether their per-kernel sums
// give Nsight Compute's figures (threads per warp instruction, global sectors per request, shared
// wavefronts and bank conflicts), which source line each patched PC maps to
// (cuptiGetSassToSourceCorrelation on the cubin CUPTI hands over at module load: the golden data
// for gpufl's own line-table reader), what an instrumented launch costs against a bare one, and
// whether disabling the patching returns kernels to their bare speed.
//
// Build (device): nvcc -O2 -lineinfo -I$CUPTI/include -o build/sassmetrics scripts/probe/sassmetrics.cu \
//                   -L$CUPTI/lib64 -lcupti -lcuda
// Run:            build/sassmetrics OUTDIR [pattern ...]   (metrics whose names contain a pattern)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>
#include <chrono>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cupti_target.h>
#include <cupti_profiler_target.h>
#include <cupti_sass_metrics.h>
#include <cupti_pcsampling.h>

#define CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { std::printf("%s:%d: CUDA driver error %d\n", __FILE__, __LINE__, (int)r_); std::exit(1); } } while (0)
#define RT(x) do { cudaError_t r_ = (x); if (r_ != cudaSuccess) { std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(r_)); std::exit(1); } } while (0)
#define CP(x) do { CUptiResult r_ = (x); if (r_ != CUPTI_SUCCESS) { const char* s_ = nullptr; cuptiGetResultString(r_, &s_); std::printf("%s:%d: %s: CUPTI error %d %s\n", __FILE__, __LINE__, #x, (int)r_, s_ ? s_ : ""); std::exit(2); } } while (0)

#define KERNEL_DETAIL_NO_MAIN
#include "../../examples/kernel_detail.cu"

static std::vector<std::pair<uint32_t, std::vector<char>>> g_cubins;

static void CUPTIAPI on_callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED) {
        auto* rd = (const CUpti_ResourceData*)data;
        auto* md = (const CUpti_ModuleResourceData*)rd->resourceDescriptor;
        if (!md || !md->pCubin || !md->cubinSize) return;
        CUpti_GetCubinCrcParams p = {};
        p.size = CUpti_GetCubinCrcParamsSize;
        p.cubinSize = md->cubinSize;
        p.cubin = md->pCubin;
        if (cuptiGetCubinCrc(&p) == CUPTI_SUCCESS) {
            g_cubins.push_back({(uint32_t)p.cubinCrc, std::vector<char>(md->pCubin, md->pCubin + md->cubinSize)});
            std::printf("module loaded: cubin %zu bytes, crc %llx\n", md->cubinSize, (unsigned long long)p.cubinCrc);
        }
    }
}

static const int NK = 6;
static const char* kname[NK] = {"divergent", "uniform", "strided_load", "coalesced_load", "bank_conflict", "padded_shared"};

static void launch(int k, float* in, float* out) {
    dim3 grid(N / BLOCK);
    switch (k) {
        case 0: divergent<<<grid, BLOCK>>>(in, out); break;
        case 1: uniform<<<grid, BLOCK>>>(in, out); break;
        case 2: strided_load<<<grid, BLOCK>>>(in, out); break;
        case 3: coalesced_load<<<grid, BLOCK>>>(in, out); break;
        case 4: bank_conflict<<<grid, BLOCK>>>(in, out); break;
        case 5: padded_shared<<<grid, BLOCK>>>(in, out); break;
    }
}

// Mean ms of `n` launches of kernel k, each timed alone (synchronized).
static double time_ms(int k, int n, float* in, float* out) {
    double sum = 0;
    for (int i = 0; i < n; ++i) {
        RT(cudaDeviceSynchronize());
        auto t0 = std::chrono::steady_clock::now();
        launch(k, in, out);
        RT(cudaDeviceSynchronize());
        sum += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    return sum / n;
}

static double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int main(int argc, char** argv) {
    const char* outdir = argc > 1 ? argv[1] : ".";
    std::vector<std::string> pats;
    for (int i = 2; i < argc; ++i) pats.push_back(argv[i]);
    if (pats.empty()) pats = {"inst_executed", "sectors", "bank", "wavefront", "request", "ideal", "theoretical", "shared", "global"};

    CUpti_SubscriberHandle sub;
    CP(cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_callback, nullptr));
    CP(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RESOURCE));
    RT(cudaFree(0));
    CUcontext ctx;
    CU(cuCtxGetCurrent(&ctx));

    CUpti_Profiler_Initialize_Params pi = {CUpti_Profiler_Initialize_Params_STRUCT_SIZE};
    CUptiResult pir = cuptiProfilerInitialize(&pi);
    std::printf("cuptiProfilerInitialize: %d\n", (int)pir);
    CUpti_Device_GetChipName_Params cn = {CUpti_Device_GetChipName_Params_STRUCT_SIZE};
    cn.deviceIndex = 0;
    CP(cuptiDeviceGetChipName(&cn));
    std::printf("chip: %s\n", cn.pChipName);

    CUpti_SassMetrics_GetNumOfMetrics_Params nm = {CUpti_SassMetrics_GetNumOfMetrics_Params_STRUCT_SIZE};
    nm.pChipName = cn.pChipName;
    CP(cuptiSassMetricsGetNumOfMetrics(&nm));
    std::vector<CUpti_SassMetrics_MetricDetails> all(nm.numOfMetrics);
    CUpti_SassMetrics_GetMetrics_Params gm = {CUpti_SassMetrics_GetMetrics_Params_STRUCT_SIZE};
    gm.pChipName = cn.pChipName;
    gm.numOfMetrics = all.size();
    gm.pMetricsList = all.data();
    CP(cuptiSassMetricsGetMetrics(&gm));
    std::string listpath = std::string(outdir) + "/sass-metrics-list.txt";
    FILE* lf = std::fopen(listpath.c_str(), "w");
    std::vector<CUpti_SassMetrics_Config> cfg;
    std::map<uint64_t, std::string> names;
    for (auto& m : all) {
        if (lf) std::fprintf(lf, "%llu\t%s\t%s\n", (unsigned long long)m.metricId, m.pMetricName, m.pMetricDescription ? m.pMetricDescription : "");
        std::string n = m.pMetricName;
        bool want = false;
        for (auto& p : pats) want = want || n.find(p) != std::string::npos;
        if (want) {
            cfg.push_back({m.metricId, (uint8_t)CUPTI_SASS_METRICS_OUTPUT_GRANULARITY_GPU});
            names[m.metricId] = n;
        }
    }
    if (lf) std::fclose(lf);
    std::printf("%zu SASS metrics on this chip; %zu selected:\n", all.size(), cfg.size());
    for (auto& kv : names) std::printf("  %s\n", kv.second.c_str());

    float *in, *out;
    RT(cudaMalloc(&in, N * sizeof(float)));
    RT(cudaMalloc(&out, N * sizeof(float)));
    RT(cudaMemset(in, 0, N * sizeof(float)));
    double bare[NK];
    for (int k = 0; k < NK; ++k) { launch(k, in, out); }  // loads the module
    RT(cudaDeviceSynchronize());
    for (int k = 0; k < NK; ++k) bare[k] = time_ms(k, 5, in, out);

    CUpti_SassMetricsSetConfig_Params sc = {CUpti_SassMetricsSetConfig_Params_STRUCT_SIZE};
    sc.deviceIndex = 0;
    sc.numOfMetricConfig = cfg.size();
    sc.pConfigs = cfg.data();
    CP(cuptiSassMetricsSetConfig(&sc));

    std::string pcpath = std::string(outdir) + "/sass-pcs.tsv";
    FILE* pf = std::fopen(pcpath.c_str(), "w");
    if (pf) {
        std::fprintf(pf, "kernel\tfunction\tpc_offset\tfile\tline");
        for (auto& kv : names) std::fprintf(pf, "\t%s", kv.second.c_str());
        std::fprintf(pf, "\n");
    }
    double t_enable = 0;
    for (int k = 0; k < NK; ++k) {
        double t0 = now_ms();
        CUpti_SassMetricsEnable_Params en = {CUpti_SassMetricsEnable_Params_STRUCT_SIZE};
        en.ctx = ctx;
        en.enableLazyPatching = 1;
        CP(cuptiSassMetricsEnable(&en));
        t_enable = now_ms() - t0;
        double first = time_ms(k, 1, in, out);
        // Read the first launch's data, then time 4 more instrumented launches.
        CUpti_SassMetricsGetDataProperties_Params dp = {CUpti_SassMetricsGetDataProperties_Params_STRUCT_SIZE};
        dp.ctx = ctx;
        CP(cuptiSassMetricsGetDataProperties(&dp));
        std::vector<CUpti_SassMetrics_Data> data(dp.numOfPatchedInstructionRecords);
        std::vector<CUpti_SassMetrics_InstanceValue> vals(dp.numOfPatchedInstructionRecords * dp.numOfInstances);
        for (size_t i = 0; i < data.size(); ++i) {
            data[i].structSize = sizeof(CUpti_SassMetrics_Data);
            data[i].pInstanceValues = &vals[i * dp.numOfInstances];
        }
        double tf0 = now_ms();
        CUpti_SassMetricsFlushData_Params fd = {CUpti_SassMetricsFlushData_Params_STRUCT_SIZE};
        fd.ctx = ctx;
        fd.numOfPatchedInstructionRecords = dp.numOfPatchedInstructionRecords;
        fd.numOfInstances = dp.numOfInstances;
        fd.pMetricsData = data.data();
        CP(cuptiSassMetricsFlushData(&fd));
        double t_flush = now_ms() - tf0;
        std::map<std::string, uint64_t> tot;
        std::map<std::string, std::map<std::string, uint64_t>> per_line;
        for (size_t i = 0; i < data.size(); ++i) {
            auto& d = data[i];
            std::string fn = d.functionName ? d.functionName : "?";
            std::string file = "?";
            uint32_t line = 0;
            for (auto& cb : g_cubins) {
                if (cb.first != d.cubinCrc) continue;
                CUpti_GetSassToSourceCorrelationParams s2 = {};
                s2.size = CUpti_GetSassToSourceCorrelationParamsSize;
                s2.cubin = cb.second.data();
                s2.cubinSize = cb.second.size();
                s2.functionName = d.functionName;
                s2.pcOffset = d.pcOffset;
                if (cuptiGetSassToSourceCorrelation(&s2) == CUPTI_SUCCESS) {
                    file = s2.fileName ? s2.fileName : "?";
                    line = s2.lineNumber;
                    std::free(s2.fileName);
                    std::free(s2.dirName);
                }
                break;
            }
            std::string base = file.substr(file.rfind('/') == std::string::npos ? 0 : file.rfind('/') + 1);
            std::string where = base + ":" + std::to_string(line);
            if (pf) std::fprintf(pf, "%s\t%s\t%u\t%s\t%u", kname[k], fn.c_str(), d.pcOffset, file.c_str(), line);
            std::map<uint64_t, uint64_t> byid;
            for (size_t j = 0; j < dp.numOfInstances; ++j) byid[d.pInstanceValues[j].metricId] += d.pInstanceValues[j].value;
            for (auto& kv : names) {
                uint64_t v = byid.count(kv.first) ? byid[kv.first] : 0;
                if (pf) std::fprintf(pf, "\t%llu", (unsigned long long)v);
                tot[kv.second] += v;
                per_line[where][kv.second] += v;
            }
            if (pf) std::fprintf(pf, "\n");
        }
        double inst = time_ms(k, 4, in, out);
        CUpti_SassMetricsDisable_Params dis = {CUpti_SassMetricsDisable_Params_STRUCT_SIZE};
        dis.ctx = ctx;
        double td0 = now_ms();
        CP(cuptiSassMetricsDisable(&dis));
        double t_disable = now_ms() - td0;
        double after = time_ms(k, 5, in, out);
        std::printf("\n== %s: %zu patched PCs, %zu instances; bare %.3f ms, first instrumented %.3f ms, next 4 %.3f ms, after disable %.3f ms; enable %.2f ms flush %.2f ms disable %.2f ms dropped %zu\n",
                    kname[k], data.size(), (size_t)dp.numOfInstances, bare[k], first, inst, after, t_enable, t_flush, t_disable, dis.numOfDroppedRecords);
        for (auto& kv : tot) if (kv.second) std::printf("  total %s = %llu\n", kv.first.c_str(), (unsigned long long)kv.second);
        for (auto& pl : per_line) {
            std::string s;
            for (auto& kv : pl.second) if (kv.second) s += " " + kv.first + "=" + std::to_string(kv.second);
            if (!s.empty()) std::printf("  line %s:%s\n", pl.first.c_str(), s.c_str());
        }
    }
    if (pf) std::fclose(pf);
    for (auto& cb : g_cubins) {
        char p[512];
        std::snprintf(p, sizeof p, "%s/cubin-%08x.cubin", outdir, cb.first);
        FILE* f = std::fopen(p, "wb");
        if (f) { std::fwrite(cb.second.data(), 1, cb.second.size(), f); std::fclose(f); }
    }
    CUpti_SassMetricsUnsetConfig_Params us = {CUpti_SassMetricsUnsetConfig_Params_STRUCT_SIZE};
    us.deviceIndex = 0;
    cuptiSassMetricsUnsetConfig(&us);
    std::printf("done\n");
    return 0;
}
