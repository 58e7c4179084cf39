"""dataloader_workers.py - gpufl example: a PyTorch loop fed by a DataLoader with 4 worker processes.

The workers are forked (the default start method on Linux with Python 3.12) from a process that
the recorder is in; they run no CUDA. gpufl should record one session, the parent's, and leave
the workers alone. Prints "dataloader: batches=N sum=S" (S: the sum of every batch's first
element, the same with and without gpufl) and exits 0.

Run:    gpufl record -o DIR -- python examples/dataloader_workers.py [--batches 200]
"""
import argparse

import torch


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        return torch.full((256,), float(i % 97)), torch.tensor(float(i % 13))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=200)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(256, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = torch.utils.data.DataLoader(Squares(), batch_size=64, num_workers=4)
    total, n = 0.0, 0
    for x, y in loader:
        total += float(x[:, 0].sum())
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n += 1
        if n == a.batches:
            break
    torch.cuda.synchronize()
    print(f"dataloader: batches={n} sum={total:.0f}", flush=True)


if __name__ == "__main__":
    main()
