// probe_common.h - what the CUPTI probes under scripts/probe share (not part of gpufl): the empty
// kernel their launch loops launch, and CK, which prints a CUPTI call's failure and goes on.
#pragma once
#include <cstdio>
#include <cupti.h>

__global__ void empty(int *p) {
    if (p && threadIdx.x == 1024) *p = 1;
}

#define CK(x)                                                                                 \
    do {                                                                                      \
        CUptiResult r_ = (x);                                                                 \
        if (r_ != CUPTI_SUCCESS) {                                                            \
            const char *s_ = "";                                                              \
            cuptiGetResultString(r_, &s_);                                                    \
            printf("  %s: %s\n", #x, s_);                                                     \
        }                                                                                     \
    } while (0)
