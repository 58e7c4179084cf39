// Probe: what one kernel launch costs the launching thread, in a tight C++ loop (no Python):
// ROUNDS x BATCH launches of an empty kernel, a cudaStreamSynchronize after each batch; prints the
// median ns per launch over the rounds. Run under each recording mode by scripts/probe/launch-cost.sh.
// LC_TOGGLE=1 under `gpufl record`: rounds in cycles of three — recorded, paused, paused
// (gpufl_pause / gpufl_resume of the injected capture library) — and the median recorded / second
// paused ratio, for the rounds that start in the first LC_EARLY_S seconds (default 2.5: while the
// driver call-site callbacks are still on for their first look) and for those after.
// LC_EXTRA=N: after each launch, N calls each of cudaGetLastError and cudaGetDevice (what PyTorch
// makes around its launches), to see what recording costs the calls it does not record.
// LC_TIMELINE=S: the median ns per launch of each S-second stretch of the run, in order (does a
// cost stay after an always-on window has opened and closed?).
//   nvcc -O2 -o launchcost launchcost.cu -ldl && ./launchcost [rounds] [batch]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <dlfcn.h>
#include <vector>

__global__ void empty(int *p) {
    if (p && threadIdx.x == 1024) *p = 1;
}

static double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 40, batch = argc > 2 ? atoi(argv[2]) : 2000;
    int (*pause)() = nullptr, (*resume)() = nullptr;
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) { fprintf(stderr, "no CUDA\n"); return 1; }
    const char *inj = getenv("CUDA_INJECTION64_PATH"), *tg = getenv("LC_TOGGLE");
    if (inj && tg && *tg == '1') {
        void *h = dlopen(inj, RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            pause = (int (*)())dlsym(h, "gpufl_pause");
            resume = (int (*)())dlsym(h, "gpufl_resume");
        }
        if (!pause || !resume) { fprintf(stderr, "LC_TOGGLE: no gpufl_pause in %s\n", inj); return 1; }
    }
    int extra = getenv("LC_EXTRA") ? atoi(getenv("LC_EXTRA")) : 0, dev = 0;
    double early_s = getenv("LC_EARLY_S") ? atof(getenv("LC_EARLY_S")) : 2.5;
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 2000; i++) empty<<<1, 32, 0, s>>>(nullptr);
    cudaStreamSynchronize(s);
    std::vector<double> per, ratio_early, ratio_late, bucket;
    double tl = getenv("LC_TIMELINE") ? atof(getenv("LC_TIMELINE")) : 0;
    int bucket_no = 0;
    double on = 0;
    for (int r = 0; r < rounds; r++) {
        int phase = r % 3;
        if (pause) {
            if (phase == 0) resume();
            if (phase == 1) pause();
        }
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < batch; i++) {
            empty<<<1, 32, 0, s>>>(nullptr);
            for (int k = 0; k < extra; k++) {
                if (cudaGetLastError() != cudaSuccess || cudaGetDevice(&dev) != cudaSuccess) return 1;
            }
        }
        auto t1 = std::chrono::steady_clock::now();
        cudaStreamSynchronize(s);
        double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / batch;
        per.push_back(ns);
        if (tl > 0) {
            int b = (int)(std::chrono::duration<double>(t0 - start).count() / tl);
            if (b != bucket_no && !bucket.empty()) {
                printf("LC_TIMELINE %5.1f s: %.0f ns (n=%zu)\n", bucket_no * tl, median(bucket), bucket.size());
                bucket.clear();
            }
            bucket_no = b;
            bucket.push_back(ns);
        }
        if (phase == 0) on = ns;
        if (pause && phase == 2) {
            double at = std::chrono::duration<double>(t0 - start).count();
            (at < early_s ? ratio_early : ratio_late).push_back(on / ns);
        }
    }
    if (tl > 0 && !bucket.empty())
        printf("LC_TIMELINE %5.1f s: %.0f ns (n=%zu)\n", bucket_no * tl, median(bucket), bucket.size());
    if (resume) resume();
    if (cudaGetLastError() != cudaSuccess) { fprintf(stderr, "launch failed\n"); return 1; }
    if (pause) {
        printf("toggle on/off2: first %.1f s %.3f (n=%zu), after %.3f (n=%zu); paused launch ns %.0f\n",
               early_s, median(ratio_early), ratio_early.size(), median(ratio_late),
               ratio_late.size(), median(per));
        return 0;
    }
    std::sort(per.begin(), per.end());
    printf("launch ns: median %.0f p10 %.0f p90 %.0f (%d rounds of %d)\n", per[per.size() / 2],
           per[per.size() / 10], per[per.size() * 9 / 10], rounds, batch);
    return 0;
}
