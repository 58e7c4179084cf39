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

Prints one JSON line: {"mode", "steps", "warmup", "wall_ms_all": [steady ms], "step_med_ms_all":
[the median step's ms over the same steps], "thread_cpu_ms_all": [the main thread's CPU ms over
them], "process_cpu_ms_all": [the process's CPU ms, all threads], "step_ms": [each step's ms],
"train_ms", "warmup_ms" (train()'s start to the end of its warm-up steps, where start-up costs
fall: lazy module loads, the allocator's growth, library set-up), "warm_step_ms", "loss"} (the shape
bench/summarize.py reads). The window's total takes every pause in
(the recorder's and the machine's alike); the median step is the steady per-step cost, robust to a
few steps slowed by a neighbour on a shared host — the two are reported side by side.

In-process A/B (`--toggle K`, under `gpufl record`): after the warm-up, the steps run in cycles of
three segments of K steps — recording on, paused (OFF1), paused again (OFF2) — switched with
gpufl_pause()/gpufl_resume() at step ends; prints the segment times in the shape of
bench/launch_bound.py --toggle ({"toggle": true, "on_ms", "off1_ms", "off2_ms"}, and each
segment's median step as "on_med_ms", "off1_med_ms", "off2_med_ms"), which
bench/summarize_toggle.py reads. Not recorded, the switch does nothing: the method's own bias.
Forked rounds (`--fork N`): the imports done once, then N interleaved rounds of `--fork-modes`
(default bare, gpufl-always-on, bare-again; gpufl-default too), each mode a child process forked
before CUDA is initialized — the recorded ones with the environment `gpufl record` sets
(`--gpufl-lib`, sessions under `--fork-out`) — so the recorder, CUDA's start and `train()` are a
fresh process's, without ~15 s of imports per process: ~6 s a process instead of ~20.

Run:    python bench/trainer_bench.py --mode bare [--steps 120] [--warmup 20] [--profiler]
        gpufl record -- python bench/trainer_bench.py --mode gpufl --steps 320 --toggle 10
        python bench/trainer_bench.py --fork 20 --gpufl-lib .device-bin/libgpufl_capture.so
"""
import time

T_START = time.perf_counter()
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

T_IMPORTED = time.perf_counter()
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
        self.cpu = {}  # step -> (main thread CPU s, process CPU s) at the end of the step
        self.t0 = {}  # step -> after the switch that follows it (toggle)
        self.warmup, self.toggle = warmup, toggle
        self.lib = gpufl_lib() if toggle else None
        self.paused = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.toggle:
            torch.cuda.synchronize()  # segments end when their work has run
        step = state.global_step
        self.t[step] = time.perf_counter()
        self.cpu[step] = (time.thread_time(), time.process_time())
        if self.toggle and step >= self.warmup and self.lib is not None:
            phase = ((step - self.warmup) // self.toggle) % 3  # the phase the next step is in
            if (step - self.warmup) % self.toggle == 0 and phase in (0, 1):
                rc = self.lib.gpufl_resume() if phase == 0 else self.lib.gpufl_pause()
                self.paused = self.paused or (phase == 1 and rc == 0)
        self.t0[step] = time.perf_counter()  # the switch is not timed

    def segments(self, steps, median=False):
        """(on, off1, off2) ms per whole cycle: each segment's total, or (`median`) its median
        step (a step's time runs from the switch after the step before to its end)."""
        on, off1, off2 = [], [], []
        k, s = self.toggle, self.warmup
        while s + 3 * k <= steps:
            if median:
                seg = [statistics.median((self.t[j] - self.t0[j - 1]) * 1e3
                                         for j in range(s + i * k + 1, s + (i + 1) * k + 1))
                       for i in range(3)]
            else:
                seg = [(self.t[s + (i + 1) * k] - self.t0[s + i * k]) * 1e3 for i in range(3)]
            on.append(seg[0]), off1.append(seg[1]), off2.append(seg[2])
            s += 3 * k
        return on, off1, off2


# What `gpufl record` puts in the environment of the command it runs (crates/gpufl-cli/src/record.rs),
# per forked mode: the recorder is injected at CUDA's initialization, which the forked child does.
# A mode may add variables after `+` (`gpufl-always-on+GPUFL_HOST_SAMPLES=0`); `LIB=path` there
# names another capture library (an older build, for a before/after in the same rounds).
def recorded_env(mode, lib, out):
    base, *extra = mode.split("+")
    extra = dict(x.split("=", 1) for x in extra)
    lib = os.path.abspath(extra.pop("LIB", lib))
    env = {"CUDA_INJECTION64_PATH": lib, "NVTX_INJECTION64_PATH": lib, "GPUFL_LOG_PATH": out,
           "GPUFL_ENABLE_STACK_TRACE": "1", "GPUFL_API_RECORDS": "default", "GPUFL_QUIET": "1"}
    if base == "gpufl-always-on":
        env["GPUFL_MODE"] = "always-on"
    elif base != "gpufl-default":
        raise SystemExit(f"--fork: unknown mode {mode}")
    env.update(extra)
    return env


def forked(a):
    """`--fork N`: N interleaved rounds of the modes, one process per mode per round, each forked
    from this one after the imports (which take ~15 s a process and are no part of `train()`):
    a fresh process for CUDA, the recorder and the training, many more rounds per minute."""
    modes = a.fork_modes.split(",")
    for r in range(1, a.fork + 1):
        print(json.dumps({"round": r}), flush=True)
        order = modes if r % 2 else modes[::-1]
        for m in order:
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    if m.startswith("gpufl-"):
                        # Named by the mode's place in --fork-modes (not in this round's order,
                        # which even rounds reverse), so that a directory names one mode.
                        out = os.path.join(a.fork_out, f"{r}-{m.split('+')[0]}-{modes.index(m)}")
                        os.makedirs(out, exist_ok=True)
                        os.environ.update(recorded_env(m, a.gpufl_lib, out))
                    a.mode = m
                    run(a)
                except BaseException as e:  # noqa: BLE001 - a child reports and exits
                    print(json.dumps({"mode": m, "error": repr(e)}), flush=True)
                    code = 1
                # os._exit runs no atexit handler: close the session as a normal exit would (its
                # end record and closing notices), after train() was timed.
                lib = gpufl_lib() if m.startswith("gpufl-") else None
                if lib is not None:
                    lib.gpufl_shutdown()
                sys.stdout.flush()
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            if status:
                print(json.dumps({"mode": m, "round": r, "exit_status": status}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="bare")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--profiler", action="store_true")
    ap.add_argument("--toggle", type=int, default=0, metavar="K",
                    help="in-process A/B: cycles of K steps recorded, K paused, K paused")
    ap.add_argument("--fork", type=int, default=0, metavar="N",
                    help="N interleaved rounds of --fork-modes, each mode a process forked after the imports")
    ap.add_argument("--fork-modes", default="bare,gpufl-always-on,bare-again")
    ap.add_argument("--gpufl-lib", default="", help="the capture library (--fork's recorded modes)")
    ap.add_argument("--fork-out", default="/tmp/trainer_bench_fork", help="sessions of --fork's recorded modes")
    a = ap.parse_args()
    if a.fork:
        forked(a)
    else:
        run(a)


def run(a):
    t_run = time.perf_counter()
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
        mon, moff1, moff2 = clock.segments(a.steps, median=True)
        r = lambda v: [round(w, 3) for w in v]
        print(json.dumps({"mode": a.mode, "toggle": True, "on_ms": r(on), "off1_ms": r(off1),
                          "off2_ms": r(off2), "on_med_ms": r(mon), "off1_med_ms": r(moff1),
                          "off2_med_ms": r(moff2), "paused_by_gpufl": clock.paused,
                          "steps": a.toggle}), flush=True)
        return
    steady = (clock.t[a.steps] - clock.t[a.warmup]) * 1e3
    step_ms = [(clock.t[s] - clock.t[s - 1]) * 1e3 for s in range(a.warmup + 1, a.steps + 1)]
    cpu = [(clock.cpu[a.steps][i] - clock.cpu[a.warmup][i]) * 1e3 for i in (0, 1)]
    print(json.dumps({"mode": a.mode, "steps": a.steps, "warmup": a.warmup,
                      "wall_ms_all": [round(steady, 3)],
                      "step_med_ms_all": [round(statistics.median(step_ms), 4)],
                      "thread_cpu_ms_all": [round(cpu[0], 3)],
                      "process_cpu_ms_all": [round(cpu[1], 3)],
                      "step_ms": [round(v, 3) for v in step_ms],
                      "train_ms": round((t1 - t0) * 1e3, 3),
                      "warmup_ms": round((clock.t[a.warmup] - t0) * 1e3, 3),
                      "warm_step_ms": [round((clock.t[s] - clock.t.get(s - 1, t0)) * 1e3, 3)
                                       for s in range(1, a.warmup + 1)],
                      "import_ms": round((T_IMPORTED - T_START) * 1e3, 1),
                      "setup_ms": round((t0 - t_run) * 1e3, 1),
                      "loss": round(result.training_loss, 6)}), flush=True)


if __name__ == "__main__":
    main()
