"""The real-Slurm tier for a ``train.command`` script that saves and exits 0 on SIGTERM (issue 33).

tests/local/graceful_task.py, 2 nodes × 1 task, each rank waiting at epoch 2 on its first start
(the handshake: every stop is sent only then). Each way of stopping it must leave the run
unfinished, and the next start must resume every rank from its save and finish all epochs:

* ``slurm-ddp cancel`` (SIGTERM; the ranks exit 0), then ``slurm-ddp requeue``;
* ``scancel --signal=USR2 JOBID``: the requeue signal to the ranks only (the batch shell never
  sees it), srun launcher, the script exits 0 on it: the job requeues itself;
* the same under the torchrun launcher, the script dying of the signal (no handler for it);
* a partition preemption (SIGTERM; Slurm requeues the job itself).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any, List

import pytest
from lib import wait_for
from lib.slurm_jobs import cli

from slurm_ddp.rundir import read_finished

pytestmark = pytest.mark.slurm

TASK = Path(__file__).resolve().parents[1] / "local" / "graceful_task.py"
EPOCHS = 4


class Job:
    def __init__(self, sandbox: Any, run_dir: Path, job_id: str):
        self.sb, self.run_dir, self.id = sandbox, run_dir, job_id

    def field(self, name: str) -> str:
        out = self.sb.run(["scontrol", "show", "job", "-o", self.id], capture_output=True, text=True, timeout=20)
        m = re.search(rf"\b{name}=(\S*)", out.stdout)
        return m.group(1) if m else "?"

    def log(self, rank: int) -> str:
        p = self.run_dir / "logs" / f"rank-{rank}.log"
        return p.read_text(errors="replace") if p.exists() else ""

    def why(self) -> str:
        d = self.run_dir / "logs"
        logs = "\n".join(f"==> {p.name} <==\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(d.glob("*")))
        return f"JobState={self.field('JobState')} Restarts={self.field('Restarts')}\n{logs}"

    def wait_all(self, line: str, timeout_s: float = 180) -> None:
        wait_for(lambda: all(line in self.log(r) for r in (0, 1)), timeout_s, f"both ranks: {line!r}", self.why)

    def wait_done(self, timeout_s: float = 240) -> None:
        self.wait_all(f"done: {EPOCHS} epochs", timeout_s)
        wait_for(lambda: self.field("JobState") == "COMPLETED", 60, f"job {self.id} to complete", self.why)

    def check_resumed(self) -> None:
        """Every rank started again once, at the epoch it saved at, finished, and the run is finished."""
        assert read_finished(self.run_dir) is not None, self.why()
        for rank in (0, 1):
            text = self.log(rank)
            assert f"[rank {rank}] start 2 at epoch 2" in text, text
            state = json.loads((self.run_dir / "state" / f"rank-{rank}.json").read_text())
            assert state == {"epoch": EPOCHS, "starts": 2}, state


def submit(sandbox: Any, tmp_path: Path, *sets: str) -> Job:
    shutil.copy(TASK, tmp_path / TASK.name)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: graceful\n"
        "slurm: {nodes: 2, tasks_per_node: 1, time: '00:10:00'}\n"
        f"train: {{command: 'python {TASK.name} --state-dir $SLURM_DDP_RUN_DIR/state --epochs {EPOCHS} --wait-at 2'}}\n"
        "requeue: {signal_delay_s: 60}\n"
    )
    run_dir = tmp_path / "run"
    args: List[str] = ["submit", str(job), "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    r = cli(sandbox, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    return Job(sandbox, run_dir, m.group(1))


def test_cancel_then_requeue_resumes_and_finishes(slurm_sandbox, tmp_path: Path) -> None:
    job = submit(slurm_sandbox, tmp_path)
    job.wait_all("waiting at epoch 2")
    r = cli(slurm_sandbox, "cancel", str(job.run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    job.wait_all("got SIGTERM at epoch 2: saved, exiting 0")
    wait_for(lambda: job.field("JobState") == "CANCELLED", 60, "the cancelled job to end", job.why)
    assert read_finished(job.run_dir) is None, job.why()
    r = cli(slurm_sandbox, "requeue", str(job.run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    job.wait_done()
    job.check_resumed()
    status = cli(slurm_sandbox, "status", str(job.run_dir)).stdout
    assert re.search(r"restarts:\s+1;", status), status  # the run's starts, not 0 as for a script before


@pytest.mark.parametrize(
    "launcher, script_on_usr2",
    [("srun", "exits 0"), ("torchrun", "dies of it")],
)
def test_usr2_to_the_ranks_only_requeues_and_resumes(
    slurm_sandbox, tmp_path: Path, launcher: str, script_on_usr2: str
) -> None:
    sets = [f"slurm.launcher={launcher}"]
    if script_on_usr2 == "exits 0":
        sets.append(
            "train.command=python graceful_task.py --state-dir $SLURM_DDP_RUN_DIR/state "
            f"--epochs {EPOCHS} --wait-at 2 --exit-on-requeue-signal"
        )
    job = submit(slurm_sandbox, tmp_path, *sets)
    job.wait_all("waiting at epoch 2")
    r = slurm_sandbox.run(["scancel", "--signal=USR2", job.id], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    job.wait_done()
    job.check_resumed()
    batch = "".join(p.read_text() for p in sorted((job.run_dir / "logs").glob("batch-*.out")))
    assert "received SIGUSR2" not in batch, batch  # the batch shell never saw it
    assert "requeueing (restart 1 of at most" in batch, batch


def test_partition_preemption_resumes_and_finishes(slurm_sandbox, tmp_path: Path) -> None:
    job = submit(slurm_sandbox, tmp_path, "slurm.partition=debug")
    job.wait_all("waiting at epoch 2")
    hi = slurm_sandbox.run(
        ["sbatch", "--parsable", "--partition=high", "--nodes=2", "--ntasks-per-node=2"]
        + [f"--output={tmp_path}/high-%j.out", "--wrap", "sleep 1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert hi.returncode == 0, hi.stderr
    job.wait_all("got SIGTERM at epoch 2: saved, exiting 0")
    job.wait_done(timeout_s=300)
    job.check_resumed()
