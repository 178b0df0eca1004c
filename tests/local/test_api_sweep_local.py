"""``Sweep.table()`` and ``submit --wait`` of a sweep on the local backend, with real ranks.

A sweep whose every element finishes: ``submit --wait`` exits 0 and the table has one row per
element (index, the swept value, COMPLETED, the best eval accuracy — the one its FINISHED record
holds). A sweep with an element that fails (a negative model width): ``submit --wait`` exits
non-zero, and the table says which element FAILED and has no metric for it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

import slurm_ddp
from slurm_ddp.errors import UserError

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
SHORT = ["slurm.tasks_per_node=1", "train.max_steps=20", "train.eval_every=10", "train.log_every=10"]


def submit_wait(sweep_dir: Path, sweep: List[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--wait"]
    cmd += ["--run-dir", str(sweep_dir), "--no-check-task", *[a for s in SHORT for a in ("--set", s)]]
    cmd += [a for s in sweep for a in ("--sweep", s)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=sweep_dir.parent)


def test_submit_wait_of_a_sweep_that_finished_exits_0_and_its_table(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "lr"
    done = submit_wait(sweep_dir, ["train.lr=0.003,0.01"])
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "2 of 2 element(s) run finished" in done.stdout, done.stdout

    sw = slurm_ddp.Sweep(sweep_dir)
    rows = sw.table()
    assert [(r["index"], r["train.lr"], r["state"]) for r in rows] == [(0, 0.003, "COMPLETED"), (1, 0.01, "COMPLETED")]
    for row, run in zip(rows, sw.runs):
        evals = [m["eval_accuracy"] for m in run.metrics() if m.get("event") == "eval"]
        assert len(evals) == 2 and row["eval_accuracy"] == max(evals), (row, evals)
        assert 0.0 <= row["eval_accuracy"] <= 1.0 and run.final().weights is not None
    losses = sw.table(metric="eval_loss")
    assert all("eval_accuracy" not in r and isinstance(r["eval_loss"], float) for r in losses), losses
    assert sw.wait(timeout_s=5).sweep.path == sweep_dir.resolve()  # ended already: returns at once
    assert [sw.element(i).path for i in (0, 1)] == [r.path for r in sw.runs]
    with pytest.raises(UserError, match="has no element 2; it has 0..1"):
        sw.element(2)


def test_submit_wait_of_a_sweep_with_a_failed_element_exits_non_zero(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "width"
    done = submit_wait(sweep_dir, ["train.args.width=8,-1"])
    assert done.returncode != 0, done.stdout + done.stderr[-3000:]
    assert "1 of 2 element(s) run finished" in done.stdout, done.stdout
    assert "element 1 (" in done.stderr and "ended with status" in done.stderr, done.stderr[-3000:]

    sw = slurm_ddp.Sweep(sweep_dir)
    rows = sw.table()
    assert [(r["index"], r["train.args.width"], r["state"]) for r in rows] == [(0, 8, "COMPLETED"), (1, -1, "FAILED")]
    assert isinstance(rows[0]["eval_accuracy"], float) and rows[1]["eval_accuracy"] is None, rows
    with pytest.raises(UserError, match="has not finished"):
        sw.runs[1].final()
