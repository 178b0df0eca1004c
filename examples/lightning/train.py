"""A PyTorch Lightning script (digits MLP) run by slurm_ddp as ``train.command``, with SlurmDDPCallback.

Lightning starts no processes of its own here: every rank is started by slurm_ddp's rank wrapper
with ``LOCAL_RANK`` set (Lightning then treats the processes as created externally), and Lightning
reads the rank layout from the cluster environment it detects: ``SLURMEnvironment`` under srun and on
the local backend (``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NODEID``/``SLURM_NTASKS``, which slurm_ddp
sets as srun does), ``TorchElasticEnvironment`` under ``slurm.launcher: torchrun`` (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``); both use ``MASTER_ADDR``/``MASTER_PORT`` from slurm_ddp. ``devices`` and
``num_nodes`` must match them, hence ``LOCAL_WORLD_SIZE`` and ``WORLD_SIZE // LOCAL_WORLD_SIZE``.

    slurm-ddp submit examples/lightning/job.yaml --backend local      # 2 ranks on CPU (gloo)
    slurm-ddp submit examples/lightning/job.yaml --set slurm.nodes=2  # sbatch

Checkpoints go to ``$SLURM_DDP_RUN_DIR/lightning`` (the run directory survives requeues); ``fit(ckpt_path="last")``
resumes from ``last.ckpt``, written at every epoch end and, by the callback, at a stop signal.
The data are scikit-learn's bundled 8×8 digits (no download): 1,437 training and 360 validation images.
"""

from __future__ import annotations

import argparse
import os
import time

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from slurm_ddp.lightning import SlurmDDPCallback, cluster_plugins


def load_split() -> tuple[TensorDataset, TensorDataset]:
    """(train, validation) of sklearn's digits: a fixed stratified split, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    i_train, i_val = train_test_split(torch.arange(len(y)).numpy(), test_size=360, stratify=y.numpy(), random_state=0)
    return TensorDataset(x[i_train], y[i_train]), TensorDataset(x[i_val], y[i_val])


class DigitsMLP(pl.LightningModule):
    def __init__(self, lr: float = 0.1, hidden: int = 64, step_sleep: float = 0.0):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        self.step_sleep = step_sleep

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        if self.step_sleep:
            time.sleep(self.step_sleep)  # slower steps, to try a stop by hand
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y), sync_dist=True)
        self.log("val_accuracy", (logits.argmax(dim=1) == y).float().mean(), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep per training step")
    args = p.parse_args()

    pl.seed_everything(0, workers=True)
    train, val = load_split()
    run_dir = os.environ.get("SLURM_DDP_RUN_DIR", ".")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=local_world,
        num_nodes=int(os.environ.get("WORLD_SIZE", str(local_world))) // local_world,
        max_epochs=args.epochs,
        log_every_n_steps=5,
        logger=False,
        enable_progress_bar=False,
        callbacks=[ModelCheckpoint(dirpath=os.path.join(run_dir, "lightning"), save_last=True), SlurmDDPCallback()],
        plugins=cluster_plugins(),  # Lightning's own SLURM auto-requeue off: slurm_ddp requeues
    )
    trainer.fit(
        DigitsMLP(lr=args.lr, step_sleep=args.step_sleep),
        train_dataloaders=DataLoader(train, batch_size=args.batch_size, shuffle=True),
        val_dataloaders=DataLoader(val, batch_size=args.batch_size),
        ckpt_path="last",
    )
    if trainer.is_global_zero:
        print(f"done: {trainer.current_epoch} epochs, step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
