"""hf_generate.py - gpufl example: HuggingFace generate() on a small, randomly initialised GPT-2.

A 6-layer GPT-2 (n_embd 512, 8 heads, context 512) built from a config -- nothing is downloaded
-- generates `--new-tokens` tokens (default 64) greedily for a batch of 4 prompts of 32 random
token ids, `--rounds` times (default 4), with the KV cache, in `model.generate(...)` (marker
`gpufl-example: generate`). Each new token is one small forward pass: a few dozen short kernels
launched by transformers' and PyTorch's Python code, then the next token read back to the host
(stopping criteria, logits processors). The GPU is mostly idle between tokens, waiting for the
host; what the host spends each token on is the question (transformers' lines under the user's
`generate()` call).

Run:    python examples/hf_generate.py [--rounds 4] [--new-tokens 64]
        gpufl record -o DIR -- python examples/hf_generate.py
Prints: transformers' warnings, if any, then "hf_generate: rounds=R tokens=T checksum=C" (C: the
sum of the generated ids). Exit 0.
"""
import argparse
import os

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

VOCAB, CTX, PROMPT, BATCH, SEED = 8192, 512, 32, 4, 0


def main(rounds, new_tokens):
    torch.manual_seed(SEED)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=CTX, n_embd=512, n_layer=6, n_head=8,
                     bos_token_id=0, eos_token_id=None, pad_token_id=0)
    model = GPT2LMHeadModel(cfg).to("cuda").eval()
    g = torch.Generator().manual_seed(SEED)
    prompts = torch.randint(1, VOCAB, (BATCH, PROMPT), generator=g).to("cuda")
    mask = torch.ones_like(prompts)
    checksum, tokens = 0, 0
    with torch.no_grad():
        for _ in range(rounds):
            out = model.generate(prompts, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)  # gpufl-example: generate
            new = out[:, PROMPT:]
            checksum += int(new.sum())
            tokens += new.numel()
    return tokens, checksum


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=64)
    a = ap.parse_args()
    tokens, checksum = main(a.rounds, a.new_tokens)
    print(f"hf_generate: rounds={a.rounds} tokens={tokens} checksum={checksum}")
