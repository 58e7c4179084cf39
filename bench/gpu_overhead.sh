#!/usr/bin/env bash
# GPU-machine benchmark (see docs/benchmarks.md): wall time of the launch-bound loop bare, under
# gpufl record (full), kernels only, and under torch.profiler; per-sync stack-capture cost; bytes
# on disk per record. Prints tables last. Env: BENCH_ROUNDS (8), BENCH_REPEAT (8), BENCH_STEPS (200),
# BENCH_PROFILER (1).
exec bash "$(dirname "$0")/../scripts/gpu-check.sh" bench
