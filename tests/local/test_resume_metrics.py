"""A resumed run logs the same numbers as an uninterrupted one, not only the same weights.

2 gloo ranks train the digits task with ``train.log_every=5``, stopped twice between log steps:
once for preemption after step 1 (SIGUSR2, sync checkpoint of step 1) and once by a failure in
step 12, after which it resumes from the periodic (background-written) checkpoint of step 7. Each
stop is at a known step (see ``resume_metrics_task.py``), none on a ``log_every`` boundary, so each
resumed log window began before the stop: every logged train loss (an average over the window's
steps) and every eval event's ``loss`` (the last logged train loss) must equal the uninterrupted
run's at the same step. Nothing here waits on time: every run ends by itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from slurm_ddp import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
MAX_STEPS = 30
LOG_EVERY = 5
SETS = [
    "train.task=resume_metrics_task:StoppingDigitsTask",
    f"train.pythonpath=[{REPO / 'examples' / 'digits'}, {Path(__file__).resolve().parent}]",
    f"train.max_steps={MAX_STEPS}",
    f"train.log_every={LOG_EVERY}",
    "train.eval_every=4",  # the eval of step 8, after the resume at 7, reports the loss logged at step 5
    "train.grad_accum_steps=1",
    "train.args.width=16",
    "checkpoint.every_steps=7",  # 7, 14, 21, 28: none on a log step
    "checkpoint.keep_last=2",
]
STOP_ENV = ("RESUME_METRICS_PREEMPT_AT_START", "RESUME_METRICS_FAIL_AT_STEP")


def submit(run_dir: Path, **env: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in SETS:
        cmd += ["--set", s]
    environ = {k: v for k, v in os.environ.items() if k not in STOP_ENV}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400, env={**environ, **env})


def logged(run_dir: Path) -> Dict[Tuple[str, int], List[Optional[float]]]:
    """(event, step) -> the ``loss`` of each train/eval record, in order (a redone step twice)."""
    out: Dict[Tuple[str, int], List[Optional[float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["event"] in ("train", "eval"):
            out.setdefault((r["event"], r["step"]), []).append(r["loss"])
    return out


def test_a_run_resumed_off_a_log_step_logs_the_uninterrupted_losses(tmp_path: Path) -> None:
    base, inter = tmp_path / "uninterrupted", tmp_path / "interrupted"
    r = submit(base)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    r = submit(inter, RESUME_METRICS_PREEMPT_AT_START="1")
    assert r.returncode == PREEMPTED_EXIT_CODE, r.stdout[-2000:] + r.stderr[-2000:]
    assert (inter / "PREEMPTED").read_text().split()[2] == "1"
    r = submit(inter, RESUME_METRICS_FAIL_AT_STEP="12")
    assert r.returncode not in (0, PREEMPTED_EXIT_CODE), r.stdout[-2000:] + r.stderr[-2000:]
    assert "StopRequested" in (inter / "logs" / "rank-0.log").read_text()
    r = submit(inter)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    rank0 = (inter / "logs" / "rank-0.log").read_text()
    resumed = [int(s) for s in re.findall(r"resumed from checkpoint of step (\d+)", rank0)]
    assert resumed == [1, 7], resumed
    assert all(s % LOG_EVERY for s in resumed)

    want, got = logged(base), logged(inter)
    train_steps = sorted(s for e, s in want if e == "train")
    assert train_steps == list(range(LOG_EVERY, MAX_STEPS + 1, LOG_EVERY))
    assert all(len(v) == 1 for v in want.values())
    assert all(want[("train", s)][0] is not None for s in train_steps) and want[("eval", 8)][0] is not None
    assert sorted(got) == sorted(want)
    for key, values in sorted(got.items()):
        assert all(v == want[key][0] for v in values), f"{key}: {values} != {want[key]}"
    assert len(got[("train", 10)]) == 2  # logged before the failure, and again after the resume at 7
