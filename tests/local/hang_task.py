"""The digits task with a hang, a slow evaluation or a slow checkpoint on purpose (hang-watchdog tests).

``train.args`` (besides the digits task's):

- ``hang_rank`` (int, default -1 = none) and ``hang_at_step`` (int): that rank blocks for good in its
  dataset's ``__getitem__`` (data loading) once the run has completed ``hang_at_step`` steps. The
  step count is the task's own (``loss`` calls, saved in its ``state_dict``), so a resumed run hangs
  at the same step again;
- ``hang_restarts`` (list of int, default: every restart): hang only in these ``SLURM_RESTART_COUNT``
  values (a flaky node: the requeued job does not hang);
- ``slow_eval_s`` (float): every evaluation sleeps this long on every rank (in ``eval_sums``);
- ``slow_checkpoint_s`` (float): every checkpoint's state sleeps this long on rank 0 (``state_dict``).

Needs ``train.num_workers: 0`` (the dataset reads the task's live step count).
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, Tuple

import torch
from digits_task import DigitsTask  # examples/digits, on train.pythonpath
from torch.utils.data import Dataset


class HangingDataset(Dataset):
    def __init__(self, inner: Dataset, task: HangTask):
        self.inner, self.task = inner, task

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def __getitem__(self, i: int) -> Any:
        if self.task.should_hang():
            while True:
                time.sleep(3600)  # HANG-HERE: rank blocked for good in data loading
        return self.inner[i]


class HangTask(DigitsTask):
    def __init__(self, train: Any):
        super().__init__(train)
        self.steps = 0  # loss calls = optimizer steps (grad_accum_steps 1)

    def should_hang(self) -> bool:
        a = self.args
        if int(a.get("hang_rank", -1)) != int(os.environ.get("RANK", "-1")):
            return False
        restarts = a.get("hang_restarts")
        if restarts is not None and int(os.environ.get("SLURM_RESTART_COUNT") or 0) not in [int(r) for r in restarts]:
            return False
        return self.steps >= int(a.get("hang_at_step", 0))

    def build_datasets(self) -> Tuple[Dataset, Any]:
        train, ev = super().build_datasets()
        return HangingDataset(train, self), ev

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        return super().loss(outputs, targets)

    def eval_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        time.sleep(float(self.args.get("slow_eval_s", 0.0)))
        return super().eval_sums(outputs, targets)

    def state_dict(self) -> Dict[str, Any]:
        time.sleep(float(self.args.get("slow_checkpoint_s", 0.0)))
        return {"steps": self.steps}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.steps = int(state.get("steps", 0))
