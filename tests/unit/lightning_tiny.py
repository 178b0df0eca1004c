"""A one-CPU-rank Lightning fit for ``test_lightning_callback.py``, imported by its ``lt`` fixture only:
Lightning's import (scipy and matplotlib with it) costs seconds, which every xdist worker paid at collection."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from slurm_ddp import lightning as sl

__all__ = ["SLURMEnvironment", "Tiny", "fit", "loader", "sl", "torch"]  # what the tests reach through the fixture


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self.net(x)
        self.log("val_loss", F.cross_entropy(logits, y))
        self.log("val_accuracy", (logits.argmax(1) == y).float().mean())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 4, generator=g)
    return DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=4)  # 10 steps per epoch


def fit(run_dir: Path, epochs: int) -> pl.Trainer:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice (srun, workers, no last checkpoint yet, ...)
        return _fit(run_dir, epochs)


def _fit(run_dir: Path, epochs: int) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        log_every_n_steps=3,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=1,
        callbacks=[ModelCheckpoint(dirpath=run_dir / "lightning", save_last=True), sl.SlurmDDPCallback()],
    )
    trainer.fit(Tiny(), train_dataloaders=loader(), val_dataloaders=loader(), ckpt_path="last")
    return trainer
