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
Run:    python bench/trainer_bench.py --mode bare [--steps 120] [--warmup 20] [--profiler]
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


class StepClock(TrainerCallback):
    """Wall time at the end of each step (the Trainer synchronizes each step: logging_steps=1)."""

    def __init__(self):
        self.t = {}

    def on_step_end(self, args, state, control, **kwargs):
        self.t[state.global_step] = time.perf_counter()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", required=True)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--profiler", action="store_true")
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
    clock = StepClock()
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
    steady = (clock.t[a.steps] - clock.t[a.warmup]) * 1e3
    print(json.dumps({"mode": a.mode, "steps": a.steps, "warmup": a.warmup,
                      "wall_ms_all": [round(steady, 3)], "train_ms": round((t1 - t0) * 1e3, 3),
                      "loss": round(result.training_loss, 6)}), flush=True)


if __name__ == "__main__":
    main()
