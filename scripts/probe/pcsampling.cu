// pcsampling.cu - probe for issue 19: does CUPTI's PC sampling API work on the device machine,
// what does it cost, and can its PCs be mapped to source lines? Not part of gpufl.
//
// Runs the divergent kernel and the strided load of examples/kernel_detail.cu with PC sampling
// enabled in kernel-serialized mode, reads the samples after each kernel, maps each PC to its
// source line through the cubin CUPTI hands over at module load (cuptiGetSassToSourceCorrelation),
// and prints per line: samples and the top stall reasons. Then the same launches without PC
// sampling, for the cost.
//
// Build (device): nvcc -g -O2 -lineinfo -I$CUPTI/include -o build/pcsampling scripts/probe/pcsampling.cu \
//                   -L$CUPTI/lib64 -lcupti -lcuda
// Run:            build/pcsampling [launches=10] [period=12] [scratch MB=64] [bare]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>
#include <chrono>
#include <algorithm>
#include <functional>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>
#include <cupti_pcsampling.h>

#define CU(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { std::printf("%s:%d: CUDA driver error %d\n", __FILE__, __LINE__, (int)r_); std::exit(1); } } while (0)
#define RT(x) do { cudaError_t r_ = (x); if (r_ != cudaSuccess) { std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(r_)); std::exit(1); } } while (0)
#define CP(x) do { CUptiResult r_ = (x); if (r_ != CUPTI_SUCCESS) { const char* s_ = nullptr; cuptiGetResultString(r_, &s_); std::printf("%s:%d: %s: CUPTI error %d %s\n", __FILE__, __LINE__, #x, (int)r_, s_ ? s_ : ""); std::exit(2); } } while (0)

// The kernels of examples/kernel_detail.cu (divergent, strided_load, ...), without its main.
#define KERNEL_DETAIL_NO_MAIN
#include "../../examples/kernel_detail.cu"

// Cubins seen at module load: (crc, bytes).
static std::vector<std::pair<uint64_t, std::vector<char>>> g_cubins;

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
            g_cubins.push_back({p.cubinCrc, std::vector<char>(md->pCubin, md->pCubin + md->cubinSize)});
            std::printf("module loaded: cubin %zu bytes, crc %llx\n", md->cubinSize, (unsigned long long)p.cubinCrc);
        }
    }
}

struct Line { uint64_t samples = 0; std::map<std::string, uint64_t> reasons; };

int main(int argc, char** argv) {
    int launches = argc > 1 ? std::atoi(argv[1]) : 10;
    CUpti_SubscriberHandle sub;
    CP(cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_callback, nullptr));
    CP(cuptiEnableDomain(1, sub, CUPTI_CB_DOMAIN_RESOURCE));
    RT(cudaFree(0));
    CUcontext ctx;
    CU(cuCtxGetCurrent(&ctx));
    float *in, *out;
    RT(cudaMalloc(&in, N * sizeof(float)));
    RT(cudaMalloc(&out, N * sizeof(float)));
    RT(cudaMemset(in, 0, N * sizeof(float)));
    dim3 grid(N / BLOCK);

    // Bare timing first (no PC sampling): per kernel, mean of `launches`.
    std::function<void()>* per_launch = nullptr;
    auto time_kernels = [&](const char* label) {
        for (int k = 0; k < 2; ++k) {
            RT(cudaDeviceSynchronize());
            auto t0 = std::chrono::steady_clock::now();
            for (int l = 0; l < launches; ++l) {
                if (k == 0) divergent<<<grid, BLOCK>>>(in, out); else strided_load<<<grid, BLOCK>>>(in, out);
                if (per_launch) { RT(cudaDeviceSynchronize()); (*per_launch)(); }
            }
            RT(cudaDeviceSynchronize());
            double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            std::printf("%s %s: %.3f ms per launch\n", label, k == 0 ? "divergent" : "strided_load", ms / launches);
        }
    };
    // PC sampling must be enabled before the module of the kernels loads (lazy loading: at the
    // first launch); a module loaded before is not sampled (the first probe run: samples counted,
    // no PC records). "bare" as 4th argument: no PC sampling at all, for the cost.
    bool bare = argc > 4 && !std::strcmp(argv[4], "bare");
    if (bare) {
        time_kernels("bare");
        time_kernels("bare");
        std::printf("pcsampling probe: done\n");
        return 0;
    }

    CUpti_PCSamplingEnableParams en = {};
    en.size = CUpti_PCSamplingEnableParamsSize;
    en.ctx = ctx;
    CP(cuptiPCSamplingEnable(&en));

    size_t nreasons = 0;
    CUpti_PCSamplingGetNumStallReasonsParams nr = {};
    nr.size = CUpti_PCSamplingGetNumStallReasonsParamsSize;
    nr.ctx = ctx;
    nr.numStallReasons = &nreasons;
    CP(cuptiPCSamplingGetNumStallReasons(&nr));
    std::vector<uint32_t> indices(nreasons);
    std::vector<char*> names(nreasons);
    for (auto& n : names) n = (char*)std::calloc(CUPTI_STALL_REASON_STRING_SIZE, 1);
    CUpti_PCSamplingGetStallReasonsParams sr = {};
    sr.size = CUpti_PCSamplingGetStallReasonsParamsSize;
    sr.ctx = ctx;
    sr.numStallReasons = nreasons;
    sr.stallReasonIndex = indices.data();
    sr.stallReasons = names.data();
    CP(cuptiPCSamplingGetStallReasons(&sr));
    std::printf("stall reasons: %zu\n", nreasons);
    std::map<uint32_t, std::string> reason_name;
    for (size_t r = 0; r < nreasons; ++r) reason_name[indices[r]] = names[r];

    const size_t MAXPCS = 4096;
    auto alloc_buffer = [&](CUpti_PCSamplingData& b) {
        b = {};
        b.size = sizeof(CUpti_PCSamplingData);
        b.collectNumPcs = MAXPCS;
        b.pPcData = (CUpti_PCSamplingPCData*)std::calloc(MAXPCS, sizeof(CUpti_PCSamplingPCData));
        for (size_t p = 0; p < MAXPCS; ++p) {
            b.pPcData[p].size = sizeof(CUpti_PCSamplingPCData);
            b.pPcData[p].stallReason =
                (CUpti_PCSamplingStallReason*)std::calloc(nreasons, sizeof(CUpti_PCSamplingStallReason));
        }
    };
    // The buffer given with the configuration (where kernel-serialized mode leaves each kernel's
    // PCs), and one for cuptiPCSamplingGetData.
    CUpti_PCSamplingData buf, buf2;
    alloc_buffer(buf);
    alloc_buffer(buf2);
    int period = argc > 2 ? std::atoi(argv[2]) : 12;
    size_t scratch_mb = argc > 3 ? std::atoi(argv[3]) : 64;
    std::vector<CUpti_PCSamplingConfigurationInfo> cfg(5);
    cfg[4].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SCRATCH_BUFFER_SIZE;
    cfg[4].attributeData.scratchBufferSizeData.scratchBufferSize = scratch_mb << 20;
    cfg[0].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_STALL_REASON;
    cfg[0].attributeData.stallReasonData.stallReasonCount = nreasons;
    cfg[0].attributeData.stallReasonData.pStallReasonIndex = indices.data();
    cfg[1].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_DATA_BUFFER;
    cfg[1].attributeData.samplingDataBufferData.samplingDataBuffer = &buf;
    cfg[2].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_COLLECTION_MODE;
    cfg[2].attributeData.collectionModeData.collectionMode = CUPTI_PC_SAMPLING_COLLECTION_MODE_KERNEL_SERIALIZED;
    cfg[3].attributeType = CUPTI_PC_SAMPLING_CONFIGURATION_ATTR_TYPE_SAMPLING_PERIOD;
    cfg[3].attributeData.samplingPeriodData.samplingPeriod = period;
    std::printf("sampling period %d (2^(%d+5) cycles), scratch buffer %zu MB\n", period, period, scratch_mb);
    CUpti_PCSamplingConfigurationInfoParams cp = {};
    cp.size = CUpti_PCSamplingConfigurationInfoParamsSize;
    cp.ctx = ctx;
    cp.numAttributes = cfg.size();
    cp.pPCSamplingConfigurationInfo = cfg.data();
    CP(cuptiPCSamplingSetConfigurationAttribute(&cp));

    // Sampled launches; after each kernel, drain what CUPTI holds.
    std::map<std::string, Line> lines;  // "function file:line"
    uint64_t total = 0, dropped = 0, pcs = 0;
    int drains = 0;
    auto take = [&](CUpti_PCSamplingData& buf) {
            if (drains++ < 4)
                std::printf("buffer %s: totalSamples %llu, totalNumPcs %zu, remaining %zu, range %llu\n",
                            &buf == &buf2 ? "getdata" : "config", (unsigned long long)buf.totalSamples,
                            buf.totalNumPcs, buf.remainingNumPcs, (unsigned long long)buf.rangeId);
            total += buf.totalSamples;
            dropped += buf.droppedSamples;
            pcs += buf.totalNumPcs;
            for (size_t p = 0; p < buf.totalNumPcs; ++p) {
                auto& pc = buf.pPcData[p];
                std::string where = pc.functionName ? pc.functionName : "?";
                for (auto& cb : g_cubins) {
                    if (cb.first != pc.cubinCrc) continue;
                    CUpti_GetSassToSourceCorrelationParams sc = {};
                    sc.size = CUpti_GetSassToSourceCorrelationParamsSize;
                    sc.cubin = cb.second.data();
                    sc.cubinSize = cb.second.size();
                    sc.functionName = pc.functionName;
                    sc.pcOffset = pc.pcOffset;
                    if (cuptiGetSassToSourceCorrelation(&sc) == CUPTI_SUCCESS) {
                        const char* f = sc.fileName ? sc.fileName : "?";
                        const char* base = std::strrchr(f, '/');
                        where += std::string(" ") + (base ? base + 1 : f) + ":" + std::to_string(sc.lineNumber);
                        std::free(sc.fileName);
                        std::free(sc.dirName);
                    }
                    break;
                }
                auto& ln = lines[where];
                for (size_t s = 0; s < pc.stallReasonCount; ++s) {
                    ln.samples += pc.stallReason[s].samples;
                    ln.reasons[reason_name[pc.stallReason[s].pcSamplingStallReasonIndex]] += pc.stallReason[s].samples;
                }
            }
            buf.totalNumPcs = 0;
            buf.totalSamples = 0;
    };
    auto drain = [&]() {
        if (buf.totalNumPcs > 0) take(buf);
        for (int k = 0; k < 64; ++k) {
            CUpti_PCSamplingGetDataParams gd = {};
            gd.size = CUpti_PCSamplingGetDataParamsSize;
            gd.ctx = ctx;
            gd.pcSamplingData = &buf2;
            CUptiResult r = cuptiPCSamplingGetData(&gd);
            if (r != CUPTI_SUCCESS) {
                const char* s = nullptr;
                cuptiGetResultString(r, &s);
                std::printf("cuptiPCSamplingGetData: %d %s\n", (int)r, s ? s : "");
                return;
            }
            bool more = buf2.remainingNumPcs > 0;
            take(buf2);
            if (!more) return;
        }
    };
    auto t0 = std::chrono::steady_clock::now();
    std::function<void()> each = [&]() { drain(); };
    per_launch = &each;
    time_kernels("sampled");
    per_launch = nullptr;
    drain();
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("sampled total %.3f ms incl. drain; samples %llu, dropped %llu, PC records %llu\n", ms,
                (unsigned long long)total, (unsigned long long)dropped, (unsigned long long)pcs);
    std::vector<std::pair<uint64_t, std::string>> order;
    for (auto& [w, l] : lines) order.push_back({l.samples, w});
    std::sort(order.rbegin(), order.rend());
    for (size_t k = 0; k < order.size() && k < 14; ++k) {
        auto& l = lines[order[k].second];
        std::vector<std::pair<uint64_t, std::string>> rs;
        for (auto& [n, c] : l.reasons) if (c) rs.push_back({c, n});
        std::sort(rs.rbegin(), rs.rend());
        std::printf("%8llu  %s :", (unsigned long long)l.samples, order[k].second.c_str());
        for (size_t r = 0; r < rs.size() && r < 3; ++r) std::printf(" %s %llu", rs[r].second.c_str(), (unsigned long long)rs[r].first);
        std::printf("\n");
    }
    CUpti_PCSamplingDisableParams dis = {};
    dis.size = CUpti_PCSamplingDisableParamsSize;
    dis.ctx = ctx;
    CP(cuptiPCSamplingDisable(&dis));
    time_kernels("after");
    std::printf("pcsampling probe: done\n");
    return 0;
}
