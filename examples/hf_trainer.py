"""hf_trainer.py - gpufl example: a HuggingFace Trainer run on a small, randomly initialised GPT-2.

A 4-layer GPT-2 (n_embd 256, 4 heads, context 128) built from a config -- nothing is
downloaded -- trained by `transformers.Trainer` for `--steps` steps (default 120) on random
token ids, bf16, batch 16, `logging_steps=1` (marker `gpufl-example: logging_steps`). Every
call of the user's code collapses onto one line, `trainer.train()` (marker
`gpufl-example: train`); the syncs happen inside transformers' training loop (reading the
loss for the log every step, gradient-norm clipping). gpufl should name the transformers
line that syncs, with the user's `trainer.train()` beside it.

Run:    python examples/hf_trainer.py [--steps 120]
        gpufl record -o DIR -- python examples/hf_trainer.py --steps 120
Prints: transformers' own log lines, then "hf_trainer: steps=N final loss X.XXXX". Exit 0.
"""
import argparse
import os
import tempfile

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

VOCAB, CTX, SEED = 8192, 128, 0


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(SEED)
        self.ids = torch.randint(0, VOCAB, (n, CTX), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(steps):
    torch.manual_seed(SEED)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=256, n_layer=4, n_head=4)
    model = GPT2LMHeadModel(cfg)
    out = tempfile.mkdtemp(prefix="hf_trainer_")
    args = TrainingArguments(
        output_dir=out,
        max_steps=steps,
        per_device_train_batch_size=16,
        learning_rate=3e-4,
        logging_steps=1,  # gpufl-example: logging_steps
        save_strategy="no",
        report_to=[],
        bf16=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=SEED,
    )
    trainer = Trainer(model=model, args=args, train_dataset=RandomTokens(16 * steps))
    result = trainer.train()  # gpufl-example: train
    return result.training_loss


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120)
    a = ap.parse_args()
    loss = main(a.steps)
    print(f"hf_trainer: steps={a.steps} final loss {loss:.4f}")
