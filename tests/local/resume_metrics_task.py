"""The digits task, with two ways to stop a run at a known step (for ``test_resume_metrics.py``).

Without its environment variables it trains exactly as ``examples/digits``' ``DigitsTask``:

- ``RESUME_METRICS_PREEMPT_AT_START=1``: rank 0 sends itself SIGUSR2 while the worker builds the
  task, after the worker installed its preemption flag. ``StepAgreement`` checks the flag at the
  first step a process trains, so the run stops, with a preemption checkpoint, after exactly one
  step beyond where it started.
- ``RESUME_METRICS_FAIL_AT_STEP=N``: every rank raises ``StopRequested`` in the loss of step ``N``
  (counted in the task's ``state_dict``, so across resumes), so the run fails there and the next
  one resumes from the newest periodic checkpoint before ``N``.
"""

from __future__ import annotations

import os
import signal
from typing import Any, Dict

import torch
from digits_task import DigitsTask  # examples/digits, on train.pythonpath


class StopRequested(Exception):
    """Raised on purpose by ``RESUME_METRICS_FAIL_AT_STEP``."""


class StoppingDigitsTask(DigitsTask):
    def __init__(self, train: Any):
        super().__init__(train)
        self.loss_calls = 0  # = optimizer steps trained (train.grad_accum_steps is 1)

    def build_datasets(self):
        if os.environ.get("RESUME_METRICS_PREEMPT_AT_START") == "1" and os.environ.get("RANK") == "0":
            os.kill(os.getpid(), signal.SIGUSR2)
        return super().build_datasets()

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.loss_calls += 1
        if str(self.loss_calls) == os.environ.get("RESUME_METRICS_FAIL_AT_STEP"):
            raise StopRequested(f"stopping in step {self.loss_calls}, as RESUME_METRICS_FAIL_AT_STEP asks")
        return super().loss(outputs, targets)

    def state_dict(self) -> Dict[str, Any]:
        return {"loss_calls": self.loss_calls}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.loss_calls = int(state.get("loss_calls", 0))
