/* Probe: the cost of reading the clock (clock_gettime per clock id, a plain system call for scale,
 * rdtsc, and cuptiGetTimestamp when a libcupti path is given). Run by scripts/probe/clock-cost.sh.
 *   cc -O2 -o clockcost clockcost.c -ldl && ./clockcost [libcupti.so] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <x86intrin.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#define N 1000000
static volatile uint64_t sink;

int main(int argc, char **argv) {
    struct { const char *name; clockid_t id; } clocks[] = {
        {"CLOCK_MONOTONIC", CLOCK_MONOTONIC}, {"CLOCK_MONOTONIC_RAW", CLOCK_MONOTONIC_RAW},
        {"CLOCK_REALTIME", CLOCK_REALTIME}, {"CLOCK_MONOTONIC_COARSE", CLOCK_MONOTONIC_COARSE}};
    for (unsigned c = 0; c < sizeof clocks / sizeof clocks[0]; c++) {
        struct timespec t;
        double t0 = now_ns();
        for (int i = 0; i < N; i++) { clock_gettime(clocks[c].id, &t); sink += t.tv_nsec; }
        printf("clock_gettime(%s): %.1f ns\n", clocks[c].name, (now_ns() - t0) / N);
    }
    double t0 = now_ns();
    for (int i = 0; i < N / 10; i++) sink += syscall(SYS_getppid);
    printf("syscall(getppid), for scale: %.1f ns\n", (now_ns() - t0) / (N / 10));
    t0 = now_ns();
    for (int i = 0; i < N; i++) sink += __rdtsc();
    printf("rdtsc: %.1f ns\n", (now_ns() - t0) / N);
    if (argc > 1) {
        void *h = dlopen(argv[1], RTLD_NOW);
        int (*ts)(uint64_t *) = h ? (int (*)(uint64_t *))dlsym(h, "cuptiGetTimestamp") : 0;
        if (!ts) { printf("cuptiGetTimestamp: %s not loaded (%s)\n", argv[1], dlerror()); return 0; }
        uint64_t v;
        t0 = now_ns();
        for (int i = 0; i < N; i++) { ts(&v); sink += v; }
        printf("cuptiGetTimestamp (%s): %.1f ns\n", argv[1], (now_ns() - t0) / N);
    }
    return 0;
}
