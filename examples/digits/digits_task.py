"""Digits: a small CNN with BatchNorm on scikit-learn's bundled handwritten digits.

The data are the 1,797 8×8 grey-level images of the UCI "optdigits" test set that ship
inside the scikit-learn wheel (``sklearn.datasets.load_digits``): no download. Split
(fixed, documented): ``train_test_split(test_size=360, stratify=labels, random_state=0)``
→ 1,437 training and 360 evaluation images. Pixels (0..16) are scaled to [0, 1].

The split is cached as a small tensor file (``$XDG_CACHE_HOME/slurm_ddp_examples``, else
``~/.cache/slurm_ddp_examples``; ``DIGITS_CACHE_DIR`` overrides, empty turns the cache off), keyed by the
scikit-learn version and the split's constants, so a rank that starts later loads the same tensors
without importing scikit-learn (about a second of CPU per process, as much as ``import torch``).

Training augmentation (``args.augment``, default true): a random shift of up to one
pixel in each direction (zero-filled), drawn from torch's global RNG — which the worker
seeds for each batch from (seed, rank, epoch, batch), so a resumed run draws the same shifts.
Dropout before the head (``args.dropout``, default 0) draws in the training step, whose random
streams the worker seeds from (seed, rank, step): the same masks after any resume.
``args.step_sleep_s`` (default 0): seconds each training batch sleeps after its loss (with gradient
accumulation: each micro-batch), a stand-in for a slower model — a run that only waits for an event (the time-limit signal) then leaves the CPU to others.

Nothing here is distributed: the worker does that.
"""

from __future__ import annotations

import os
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from slurm_ddp.task import Task

EVAL_SIZE = 360
SPLIT_SEED = 0


def _cache_file() -> Optional[Path]:
    where = os.environ.get("DIGITS_CACHE_DIR")
    if where is None:
        where = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "slurm_ddp_examples")
    if not where:
        return None
    try:
        sklearn_version = metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        return None
    return Path(where) / f"digits-split-sklearn{sklearn_version}-eval{EVAL_SIZE}-seed{SPLIT_SEED}.pt"


def load_split():
    """``(x_train [1437,1,8,8] float32, y_train [1437] int64, x_eval [360,1,8,8], y_eval [360])``,
    from the cache when it holds them (see the module's docstring), else from scikit-learn (then cached:
    written to a temporary name and renamed, so concurrent ranks never read half a file)."""
    cache = _cache_file()
    if cache is not None and cache.exists():
        try:
            return tuple(torch.load(cache, weights_only=True))
        except Exception:  # unreadable: split again and rewrite it
            pass
    split = _split()
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_name(f"{cache.name}.{os.getpid()}.tmp")
            torch.save(list(split), tmp)
            os.replace(tmp, cache)
        except OSError:
            pass  # a read-only home: no cache, same tensors
    return split


def _split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.int64)
    idx_train, idx_eval = train_test_split(
        torch.arange(len(y)).numpy(), test_size=EVAL_SIZE, stratify=y.numpy(), random_state=SPLIT_SEED
    )
    return x[idx_train], y[idx_train], x[idx_eval], y[idx_eval]


class ShiftAugmented(Dataset):
    """Images shifted by a random (dy, dx) in {-1, 0, 1}², zero-filled."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, max_shift: int = 1):
        self.x, self.y, self.max_shift = x, y, max_shift

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        dy, dx = torch.randint(-self.max_shift, self.max_shift + 1, (2,)).tolist()
        img = F.pad(self.x[i], (1, 1, 1, 1))
        img = img[:, 1 + dy : 9 + dy, 1 + dx : 9 + dx]
        return img, self.y[i]


class DigitsNet(nn.Module):
    """[B, 1, 8, 8] → [B, 10] logits: three 3×3 conv+BatchNorm+ReLU blocks, one 2×2 max-pool, then
    dropout (probability ``dropout``, 0: none) before the linear head."""

    def __init__(self, width: int = 16, dropout: float = 0.0):
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.features = nn.Sequential(
            block(1, width), block(width, 2 * width), nn.MaxPool2d(2), block(2 * width, 2 * width)
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.features(x).mean(dim=(2, 3))))


class DigitsTask(Task):
    """``train.args``: ``width`` (default 16), ``augment`` (default true), ``dropout`` (default 0),
    ``step_sleep_s`` (default 0: seconds each training batch sleeps)."""

    def build_model(self) -> nn.Module:
        return DigitsNet(width=int(self.args.get("width", 16)), dropout=float(self.args.get("dropout", 0.0)))

    def build_datasets(self):
        x_tr, y_tr, x_ev, y_ev = load_split()
        train = ShiftAugmented(x_tr, y_tr) if self.args.get("augment", True) else TensorDataset(x_tr, y_tr)
        return train, TensorDataset(x_ev, y_ev)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        sleep_s = float(self.args.get("step_sleep_s", 0.0))
        if sleep_s > 0:
            time.sleep(sleep_s)
        return super().loss(outputs, targets)

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.train.lr, weight_decay=1e-4)

    def build_scheduler(self, optimizer: torch.optim.Optimizer):
        # Cosine decay to 0 over the run (stepped once per optimizer step).
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.train.max_steps)
