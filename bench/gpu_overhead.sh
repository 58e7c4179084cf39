#!/usr/bin/env bash
# GPU-machine benchmark (see docs/benchmarks.md): wall time of the launch-bound loop bare, under
# gpufl record (full), kernels only, and under torch.profiler; per-sync stack-capture cost; bytes
# on disk per record. Prints a table last. Env: BENCH_ROUNDS (3), BENCH_REPEAT (5).
exec bash "$(dirname "$0")/../scripts/gpu-check.sh" bench
