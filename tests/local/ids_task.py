"""A task whose training samples are their own ids, logged by every rank (``test_resize_resume.py``).

The dataset has ``args.samples`` items ``(features(i), i)``; the loss trains a tiny linear model on
``i % 4`` and, when ``IDS_DIR`` is set, appends the ids of each micro-batch it is given to
``IDS_DIR/seg-<IDS_SEGMENT>-rank<RANK>.txt`` (one line per micro-batch, in training order; without
``IDS_SEGMENT``, the segment is ``step<SLURM_STEP_ID>``: each srun step of a job, e.g. an in-job
restart's, writes its own files, ``tests/slurm/test_node_recovery.py``). Each
micro-batch sleeps ``IDS_SLEEP_S`` (default 0) so that an optimizer step of 3+ micro-batches is slower
than ``StepAgreement``'s 0.5 s and the ranks check the stop flag after every step. With
``IDS_STOP_AFTER_CALLS=K`` rank 0 sends itself SIGUSR2 in its K-th loss call of the process: the run
stops for preemption right after the step that call belongs to. With ``IDS_DIE_AFTER_CALLS=K`` rank
``IDS_DIE_RANK`` (default 1) SIGKILLs itself in its K-th loss call, as a lost node's rank would vanish
in the middle of a step. With ``IDS_SPARE_FAILS=1`` a warm spare of an in-process step (``RANK=-1``) fails as
it builds its datasets, as one whose node lacks the data would (``tests/slurm/test_in_process_recovery.py``).
With ``IDS_CRASH_FILE=PATH``, once PATH exists every loss call raises (a deterministic failure of the code or
its data, the same on every rank and every restart).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, Tuple

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from slurm_ddp.task import Task


class Ids(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Tuple[torch.Tensor, int]:
        return torch.tensor([i / self.n, (i % 7) / 7, (i % 3) / 3, 1.0]), i


class IdsTask(Task):
    def __init__(self, train: Any):
        super().__init__(train)
        self.calls = 0

    def build_model(self) -> torch.nn.Module:
        return torch.nn.Linear(4, 4)

    def build_datasets(self):
        if os.environ.get("IDS_SPARE_FAILS") == "1" and os.environ.get("RANK") == "-1":
            raise FileNotFoundError("IDS_SPARE_FAILS: no data on this warm spare's node")
        return Ids(int(self.args.get("samples", 48))), None

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = os.environ.get("IDS_DIR")
        if out:
            segment = os.environ.get("IDS_SEGMENT") or f"step{os.environ['SLURM_STEP_ID']}"
            path = os.path.join(out, f"seg-{segment}-rank{os.environ['RANK']}.txt")
            with open(path, "a") as f:
                f.write(" ".join(str(int(t)) for t in targets) + "\n")
        time.sleep(float(os.environ.get("IDS_SLEEP_S", "0")))
        crash = os.environ.get("IDS_CRASH_FILE")
        if crash and os.path.exists(crash):
            raise RuntimeError(f"IDS_CRASH_FILE: {crash} exists: a deterministic failure")
        if os.environ.get("RANK") == "0" and str(self.calls) == os.environ.get("IDS_STOP_AFTER_CALLS"):
            os.kill(os.getpid(), signal.SIGUSR2)
        if os.environ.get("RANK") == os.environ.get("IDS_DIE_RANK", "1") and str(self.calls) == os.environ.get(
            "IDS_DIE_AFTER_CALLS"
        ):
            os.kill(os.getpid(), signal.SIGKILL)
        return F.cross_entropy(outputs, targets % 4)
