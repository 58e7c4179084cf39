"""torch_profiler_count.py - reference kernel counts for examples/pytorch_train_sync.py.

Runs pytorch_train_sync.main(steps, warmup) under torch.profiler with
activities=[CUDA] and counts GPU kernel events, to compare with what gpufl
records for `python examples/pytorch_train_sync.py --steps S --warmup W`.

Default (whole run, the fair comparison with gpufl, which records the whole
process): the profiler is entered BEFORE model/data creation and left after
the last step, so warmup steps and setup kernels are counted too. With
--measured-only the profiler is started after warmup (via main's after_warmup
callback) and covers only the --steps measured steps.

Kernel events: prof.events() entries with device_type == DeviceType.CUDA whose
name does not start with "Memcpy"/"Memset" (counted separately) nor is a CUDA
sync record. kernel_time_us is the sum of their durations (time_range, in us).

Run:    python bench/torch_profiler_count.py [--steps 50] [--warmup 5] [--measured-only]
Prints: one JSON line {"scope", "steps", "warmup", "final_loss", "kernels",
        "kernel_time_us", "distinct_kernel_names", "memcpy_events",
        "memset_events", "other_cuda_events"}.
"""
import argparse
import json
import os
import sys
import warnings

from torch.profiler import DeviceType, ProfilerActivity, profile

# Recent torch (seen on 2.11) warns once per profiler that events are not kept across cycles.
warnings.filterwarnings("ignore", message="Warning: Profiler clears events")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import pytorch_train_sync as pts  # noqa: E402

SYNC_NAMES = ("Context Sync", "Stream Sync", "Event Sync", "Stream Wait Event")


def count(events):
    kernels, memcpy, memset, other = [], 0, 0, 0
    for evt in events:
        if evt.device_type != DeviceType.CUDA:
            continue
        if evt.name.startswith("Memcpy"):
            memcpy += 1
        elif evt.name.startswith("Memset"):
            memset += 1
        elif evt.name.startswith(SYNC_NAMES):
            other += 1
        else:
            kernels.append(evt)
    return {
        "kernels": len(kernels),
        "kernel_time_us": round(sum(e.time_range.elapsed_us() for e in kernels), 3),
        "distinct_kernel_names": len({e.name for e in kernels}),
        "memcpy_events": memcpy,
        "memset_events": memset,
        "other_cuda_events": other,
    }


def main():
    ap = argparse.ArgumentParser(description="count CUDA kernels of pytorch_train_sync")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--measured-only", action="store_true",
                    help="profile only the measured steps (after warmup)")
    args = ap.parse_args()

    if args.measured_only:
        prof = profile(activities=[ProfilerActivity.CUDA])
        loss = pts.main(args.steps, args.warmup, after_warmup=prof.start)
        prof.stop()  # main() ended with a synchronize: all kernels are done
    else:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            loss = pts.main(args.steps, args.warmup)

    out = {"scope": "measured-steps" if args.measured_only else "whole-run",
           "steps": args.steps, "warmup": args.warmup, "final_loss": round(loss, 6)}
    out.update(count(prof.events()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
