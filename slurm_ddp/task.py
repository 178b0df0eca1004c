"""The user's side of the worker: a ``Task`` builds the model, data, optimizer and loss.

A task contains nothing distributed — no process group, sampler, DDP wrap or rank
checks; the worker does all of that. Name it in the job YAML as ``train.task:
module:Class``; the worker constructs ``Class(train_config)`` and calls the methods
below. Batches are ``(inputs, targets)`` pairs (what a map-style ``Dataset`` of
``(x, y)`` items collates to).

Side effects: none; imports torch (only the worker and user code import this module).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .errors import UserError


class Task:
    """Base class of a training task. Override ``build_model`` and ``build_datasets``."""

    def __init__(self, train: Any):
        #: the job's ``train`` section (``TrainConfig``): ``lr``, ``batch_size``, ``seed``, …
        self.train = train
        #: ``train.args``: the task's own arguments from the YAML
        self.args: Mapping[str, Any] = train.args

    def build_model(self) -> torch.nn.Module:
        """The model, on the CPU. Called after the worker seeded every rank identically."""
        raise NotImplementedError

    def build_datasets(self) -> Tuple[torch.utils.data.Dataset[Any], Optional[torch.utils.data.Dataset[Any]]]:
        """``(train_dataset, eval_dataset)``; eval may be None. Same content on every rank."""
        raise NotImplementedError

    def build_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        """Default: AdamW with ``train.lr``."""
        return torch.optim.AdamW(model.parameters(), lr=self.train.lr)

    def build_scheduler(self, optimizer: torch.optim.Optimizer) -> Optional[Any]:
        """An LR scheduler stepped once per optimizer step, or None (default)."""
        return None

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Scalar training loss. Default: cross-entropy (outputs ``[B, C]`` logits, targets ``[B]``)."""
        return F.cross_entropy(outputs, targets)

    def eval_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Per-batch *sums* of eval metrics; the worker adds them over all ranks and divides
        by the number of eval samples. Default: ``accuracy`` (correct count) and ``loss``
        (summed cross-entropy) — reported as ``eval_accuracy`` and ``eval_loss``."""
        return {
            "accuracy": (outputs.argmax(dim=1) == targets).sum(),
            "loss": F.cross_entropy(outputs, targets, reduction="sum"),
        }

    def state_dict(self) -> Dict[str, Any]:
        """Extra state of the task saved in each checkpoint (tensors, numbers, strings, containers)."""
        return {}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


def load_task_class(path: str, pythonpath: Sequence[str] = ()) -> type:
    """Import ``'package.module:Class'``, with ``pythonpath`` entries put first on ``sys.path``.

    Raises ``UserError`` saying why the import failed.
    """
    module_name, _, attr = path.partition(":")
    for p in reversed(list(pythonpath)):
        if p not in sys.path:
            sys.path.insert(0, p)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(
            f"train.task {path!r}: cannot import module {module_name!r}: {e} "
            f"(searched train.pythonpath={list(pythonpath)} and sys.path)"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UserError(f"train.task {path!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, Task)):
        raise UserError(f"train.task {path!r}: {attr} is not a subclass of slurm_ddp.task.Task")
    return obj
