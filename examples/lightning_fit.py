"""lightning_fit.py - gpufl example: a PyTorch Lightning `fit` of a small MLP.

A LightningModule (3 x Linear(1024, 1024) + ReLU, batch 256, SGD) on random data, fitted
for `--steps` steps (default 150) by `lightning.pytorch.Trainer` (marker
`gpufl-example: fit`), logging the loss every step with `self.log(..., prog_bar=True)`
(marker `gpufl-example: log`). The syncs happen inside Lightning's loop (turning logged
tensors into numbers for the progress bar and the logger), not in the user's code; gpufl
should name the Lightning line that syncs, with the user's `trainer.fit()` beside it.

Run:    python examples/lightning_fit.py [--steps 150]
        gpufl record -o DIR -- python examples/lightning_fit.py --steps 150
Prints: Lightning's own lines, then "lightning_fit: steps=N final loss X.XXXX". Exit 0.
"""
import argparse
import warnings

import torch
import torch.nn as nn

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl

WIDTH, BATCH, SEED = 1024, 256, 0


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.ReLU(),
            nn.Linear(WIDTH, WIDTH), nn.ReLU(),
            nn.Linear(WIDTH, WIDTH),
        )
        self.last = None

    def training_step(self, batch, _idx):
        x, y = batch
        loss = (self.net(x) - y).square().mean()
        self.log("train_loss", loss, prog_bar=True)  # gpufl-example: log
        self.last = loss.detach()
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main(steps):
    torch.manual_seed(SEED)
    x = torch.randn(BATCH * 8, WIDTH)
    y = torch.randn(BATCH * 8, WIDTH).mul_(0.1)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=BATCH)
    model = Regressor()
    trainer = pl.Trainer(
        max_steps=steps,
        accelerator="gpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, loader)  # gpufl-example: fit
    return float(model.last)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    a = ap.parse_args()
    loss = main(a.steps)
    print(f"lightning_fit: steps={a.steps} final loss {loss:.4f}")
