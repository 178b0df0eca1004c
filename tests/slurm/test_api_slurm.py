"""The Python API and a chain on the real Slurm sandbox.

A long digits run, and an evaluation-sized run ``after=`` it (``afterany``): the second is PENDING
with Reason=Dependency on the first's job (seen in ``scontrol show job``) although a node is free,
starts only after the first ended (its ``StartTime`` is not before the first's ``EndTime``), and
``Run.wait()`` returns its COMPLETED status; ``submit --wait`` of a third run exits 0 once it finished.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict

import pytest

import slurm_ddp
from slurm_ddp.testing import wait_for

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
ONE_RANK = ["slurm.nodes=1", "slurm.tasks_per_node=1", "slurm.time=00:10:00", "train.log_every=10"]
LONG = [*ONE_RANK, "train.max_steps=100000", "train.eval_every=0", "checkpoint.every_steps=50"]
SHORT = [*ONE_RANK, "train.max_steps=30", "train.eval_every=30"]


def show_job(sandbox, job_id: str) -> Dict[str, str]:
    out = sandbox.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=20).stdout
    return dict(re.findall(r"(?:^|\s)([A-Za-z/:_]+)=(\S*)", out))


def test_after_chain_starts_the_second_job_only_after_the_first_ended(slurm_sandbox, tmp_path, monkeypatch) -> None:
    for k, v in slurm_sandbox.env.items():
        monkeypatch.setenv(k, v)
    first = slurm_ddp.submit(JOB, overrides=LONG, run_dir=tmp_path / "train", backend="sbatch", check_task=False)
    assert isinstance(first, slurm_ddp.Run)
    jid1 = first.job_ids[-1]
    second = None
    try:
        wait_for(lambda: first.status().state == "RUNNING", 60, "the first job to run")
        second = slurm_ddp.submit(
            JOB, overrides=SHORT, run_dir=tmp_path / "eval", backend="sbatch", after=[f"{first.path}:afterany"]
        )
        assert isinstance(second, slurm_ddp.Run)
        jid2 = second.job_ids[-1]
        rec = wait_for(
            lambda: (lambda r: r if r.get("Reason") == "Dependency" else None)(show_job(slurm_sandbox, jid2)),
            30,
            "the second job to wait on its dependency",
        )
        assert rec["JobState"] == "PENDING" and rec["Dependency"].startswith(f"afterany:{jid1}"), rec
        assert second.status().slurm.dependency.startswith(f"afterany:{jid1}")

        first.cancel()
        st1 = first.wait(timeout_s=120, poll_s=1)
        assert st1.state == "CANCELLED", st1
        st2 = second.wait(timeout_s=300, poll_s=1)
        assert st2.state == "COMPLETED" and second.final().metrics["step"] == 30, st2
        r1, r2 = show_job(slurm_sandbox, jid1), show_job(slurm_sandbox, jid2)
        assert r2["StartTime"] >= r1["EndTime"], (r1, r2)  # ISO times compare as text
    finally:
        for r in (first, second):
            if r is not None:
                slurm_sandbox.run(["scancel", *r.job_ids], capture_output=True, timeout=20)

    # submit --wait: blocks until the run ended; exit 0 because it finished
    proc = slurm_sandbox.run(
        [
            sys.executable,
            "-m",
            "slurm_ddp",
            "submit",
            str(JOB),
            "--backend",
            "sbatch",
            "--no-check-task",
            "--wait",
            "--run-dir",
            str(tmp_path / "waited"),
            *[a for s in SHORT for a in ("--set", s)],
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ended: COMPLETED" in proc.stderr and (tmp_path / "waited" / "FINISHED").exists()
