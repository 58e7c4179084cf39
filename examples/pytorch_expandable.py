"""pytorch_expandable.py - gpufl example: PyTorch's expandable segments.

Run with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the caching allocator then reserves
virtual address space once and maps physical memory into it as it grows (cuMemCreate + cuMemMap)
instead of one cudaMalloc per segment. Phases: allocate `--blocks` tensors of 64 MiB (marker
`gpufl-example: expand`), free half and empty the cache, allocate half again, free everything and
empty the cache. After each phase it prints torch's allocated and reserved bytes and the device's
used memory (torch.cuda.mem_get_info, what NVML counts) minus its value before the first
allocation: the analysis's memory over time should match within 5 %.

Run:    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python examples/pytorch_expandable.py
        gpufl record -o DIR -- env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python examples/pytorch_expandable.py
Prints: "pytorch_expandable: baseline_unix_ms=T" (when the baseline was read; 400 ms without
        allocations follow), "pytorch_expandable: phase P allocated A MiB reserved R MiB used_delta D MiB" per phase,
        then "pytorch_expandable: peak_reserved=R MiB peak_used_delta=D MiB"; exit 0.
"""
import argparse
import time

import torch


def used():
    free, total = torch.cuda.mem_get_info()
    return total - free


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=16)
    args = p.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    base = used()
    # When the baseline was read (the context exists, nothing allocated yet), then a pause nothing
    # allocates in: NVML samples of it are the context-only baseline.
    print(f"pytorch_expandable: baseline_unix_ms={int(time.time() * 1000)}", flush=True)
    time.sleep(0.4)
    peak = {"reserved": 0, "delta": 0}

    def report(phase):
        torch.cuda.synchronize()
        a, r, d = torch.cuda.memory_allocated(), torch.cuda.memory_reserved(), used() - base
        peak["reserved"] = max(peak["reserved"], r)
        peak["delta"] = max(peak["delta"], d)
        print(f"pytorch_expandable: phase {phase} allocated {a >> 20} MiB reserved {r >> 20} MiB "
              f"used_delta {d >> 20} MiB", flush=True)
        time.sleep(0.3)  # let nvidia-smi sample this phase

    blocks = [torch.ones(16 << 20, device="cuda") for _ in range(args.blocks)]  # gpufl-example: expand
    report(1)
    del blocks[::2]
    torch.cuda.empty_cache()
    report(2)
    blocks += [torch.ones(16 << 20, device="cuda") for _ in range(args.blocks // 2)]
    report(3)
    del blocks
    torch.cuda.empty_cache()
    report(4)
    print(f"pytorch_expandable: peak_reserved={peak['reserved'] >> 20} MiB "
          f"peak_used_delta={peak['delta'] >> 20} MiB")


if __name__ == "__main__":
    main()
