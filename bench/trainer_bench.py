"""trainer_bench.py - the cost of recording on a real training program: a HuggingFace Trainer run.

The same model and data as examples/hf_trainer.py (a 4-layer GPT-2 built from a config, random
tokens, bf16, batch 16, logging_steps=1: nothing downloaded), timed from inside the process with a
TrainerCallback: the wall time from the end of step `--warmup` to the end of the last step (the
steady state: imports, model build, CUDA start-up and the first steps' lazy initialisation are
left out, as they are paid once), and the whole `trainer.train()` for reference.

One process per mode; the harness (scripts/gpu-phases/trainerbench.sh) runs the modes in
interleaved rounds and bench/summarize.py gives the median of the per-round paired ratios:
    bare / bare-again     not recorded (two processes per round: the noise control)
    gpufl-default         under `gpufl record`
    gpufl-always-on       under `gpufl record --always-on`
    torch-profiler        trainer.train() inside torch.profiler.profile(CPU, CUDA), as a user would

Prints one JSON line: {"mode", "steps", "warmup", "wall_ms_all": [steady ms], "train_ms",
"loss"} (the shape bench/summarize.py reads).

In-process A/B (`--toggle K`, under `gpufl record`): after the warm-up, the steps run in cycles of
three segments of K steps — recording on, paused (OFF1), paused again (OFF2) — switched with
gpufl_pause()/gpufl_resume() at step ends; prints the segment times in the shape of
bench/launch_bound.py --toggle ({"toggle": true, "on_ms", "off1_ms", "off2_ms"}), which
bench/summarize_toggle.py reads. Not recorded, the switch does nothing: the method's own bias.
Run:    python bench/trainer_bench.py --mode bare [--steps 120] [--warmup 20] [--profiler]
        gpufl record -- python bench/trainer_bench.py --mode gpufl --steps 320 --toggle 10
"""
import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

VOCAB, CTX, SEED = 8192, 128, 0


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(0, VOCAB, (n, CTX), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def gpufl_lib():
    """The gpufl capture library when this process is recorded, else None."""
    import ctypes
    path = os.environ.get("CUDA_INJECTION64_PATH") or os.environ.get("GPUFL_CAPTURE_LIB")
    if not path or "gpufl" not in os.path.basename(path):
        return None
    try:
        lib = ctypes.CDLL(path)
        return lib if hasattr(lib, "gpufl_pause") else None
    except OSError:
        return None


class StepClock(TrainerCallback):
    """Wall time at the end of each step (the Trainer synchronizes each step: logging_steps=1);
    with `toggle` K, switches recording at step ends: on, off, off for K steps each, after
    `warmup` steps."""

    def __init__(self, warmup=0, toggle=0):
        self.t = {}  # step -> end of the step
        self.t0 = {}  # step -> after the switch that follows it (toggle)
        self.warmup, self.toggle = warmup, toggle
        self.lib = gpufl_lib() if toggle else None
        self.paused = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.toggle:
            torch.cuda.synchronize()  # segments end when their work has run
        step = state.global_step
        self.t[step] = time.perf_counter()
        if self.toggle and step >= self.warmup and self.lib is not None:
            phase = ((step - self.warmup) // self.toggle) % 3  # the phase the next step is in
            if (step - self.warmup) % self.toggle == 0 and phase in (0, 1):
                rc = self.lib.gpufl_resume() if phase == 0 else self.lib.gpufl_pause()
                self.paused = self.paused or (phase == 1 and rc == 0)
        self.t0[step] = time.perf_counter()  # the switch is not timed

    def segments(self, steps):
        """(on, off1, off2) ms per whole cycle."""
        on, off1, off2 = [], [], []
        k, s = self.toggle, self.warmup
        while s + 3 * k <= steps:
            seg = [(self.t[s + (i + 1) * k] - self.t0[s + i * k]) * 1e3 for i in range(3)]
            on.append(seg[0]), off1.append(seg[1]), off2.append(seg[2])
            s += 3 * k
        return on, off1, off2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", required=True)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--profiler", action="store_true")
    ap.add_argument("--toggle", type=int, default=0, metavar="K",
                    help="in-process A/B: cycles of K steps recorded, K paused, K paused")
    a = ap.parse_args()
    torch.manual_seed(SEED)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=256, n_layer=4, n_head=4)
    model = GPT2LMHeadModel(cfg)
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="trainer_bench_"),
        max_steps=a.steps,
        per_device_train_batch_size=16,
        learning_rate=3e-4,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        bf16=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_level="error",
        seed=SEED,
    )
    clock = StepClock(a.warmup, a.toggle)
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(16 * a.steps),
                      callbacks=[clock])
    t0 = time.perf_counter()
    if a.profiler:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            result = trainer.train()
    else:
        result = trainer.train()
    t1 = time.perf_counter()
    if a.toggle:
        if clock.lib is not None:
            clock.lib.gpufl_resume()
        on, off1, off2 = clock.segments(a.steps)
        r = lambda v: [round(w, 3) for w in v]
        print(json.dumps({"mode": a.mode, "toggle": True, "on_ms": r(on), "off1_ms": r(off1),
                          "off2_ms": r(off2), "paused_by_gpufl": clock.paused,
                          "steps": a.toggle}), flush=True)
        return
    steady = (clock.t[a.steps] - clock.t[a.warmup]) * 1e3
    print(json.dumps({"mode": a.mode, "steps": a.steps, "warmup": a.warmup,
                      "wall_ms_all": [round(steady, 3)], "train_ms": round((t1 - t0) * 1e3, 3),
                      "loss": round(result.training_loss, 6)}), flush=True)


if __name__ == "__main__":
    main()
