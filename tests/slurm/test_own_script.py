"""The real-Slurm tier for ``train.command``: examples/own_script on the 2-node sandbox.

Four jobs, each reused for every check it can honestly make:

* the plain script (knows nothing of slurm_ddp), 2 nodes × 1 task (srun launcher), given the
  time-limit signal at the batch shell after its first snapshot: dies of it, is requeued, resumes
  from its own snapshot and finishes every epoch on both ranks;
* the plain script, 2 nodes × 2 processes under the torchrun launcher: finishes every epoch;
* the preemption-API variant, 2 nodes × 2 processes under torchrun, signalled at the batch shell:
  every rank stops after the same step, the job is requeued (the stop recorded by rank 0's marker)
  and resumes mid-epoch, and finishes;
* a script that crashes: not requeued;
* the plain script through ``--backend submitit``, 2 nodes × 1 task: finishes every epoch.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import List, Set

import pytest
from lib import require_module, wait_for

from slurm_ddp.rundir import read_handlers

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own_script"


def logs(run_dir: Path) -> str:
    d = run_dir / "logs"
    return "\n".join(
        f"==> {p.name} <==\n{p.read_text(errors='replace')[-2500:]}" for p in sorted(d.glob("*")) if d.exists()
    )


def batch_log(run_dir: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("batch-*.out")))


def rank_log(run_dir: Path, rank: int) -> str:
    p = run_dir / "logs" / f"rank-{rank}.log"
    return p.read_text(errors="replace") if p.exists() else ""


class Job:
    def __init__(self, sandbox, run_dir: Path, job_id: str):
        self.sb, self.run_dir, self.id = sandbox, run_dir, job_id

    def show(self) -> str:
        return self.sb.run(
            ["scontrol", "show", "job", "-o", self.id], capture_output=True, text=True, timeout=20
        ).stdout

    def field(self, name: str) -> str:
        m = re.search(rf"\b{name}=(\S*)", self.show())
        return m.group(1) if m else "?"

    def why(self) -> str:
        return f"{self.show()}\n{logs(self.run_dir)}"

    def wait_log(self, rank: int, pattern: str, timeout_s: float = 180) -> None:
        wait_for(
            lambda: re.search(pattern, rank_log(self.run_dir, rank)), timeout_s, f"rank {rank}: {pattern}", self.why
        )

    def wait_ended(self, timeout_s: float = 300) -> str:
        wait_for(
            lambda: self.field("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
            timeout_s,
            f"job {self.id} to end",
            self.why,
        )
        return self.field("JobState")

    def signal_batch_shell(self) -> None:
        r = self.sb.run(["scancel", "--batch", "--signal=USR2", self.id], capture_output=True, text=True, timeout=20)
        assert r.returncode == 0, r.stderr


def submit(sandbox, job: str, run_dir: Path, *sets: str, backend: str = "sbatch") -> Job:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(EXAMPLE / job), "--backend", backend]
    cmd += ["--run-dir", str(run_dir)]
    for s in ("slurm.time=00:10:00", "requeue.signal_delay_s=60", *sets):
        cmd += ["--set", s]
    r = sandbox.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    return Job(sandbox, run_dir, m.group(1))


def handler_ranks(job: Job, restart: int) -> Set[int]:
    """The ranks of ``job``'s start ``restart`` that have installed their stop handler (their handler record)."""
    return {r.rank for r in read_handlers(job.run_dir) if r.job_id == job.id and r.restart == restart}


def hosts(run_dir: Path, ranks: int) -> List[str]:
    found = [re.search(rf"\[rank {r}\] host (\S+)", rank_log(run_dir, r)) for r in range(ranks)]
    assert all(found), logs(run_dir)
    return [m.group(1) for m in found if m]


def test_plain_script_srun_two_nodes_time_limit_signal_requeues_and_resumes(slurm_sandbox, tmp_path: Path) -> None:
    job = submit(
        slurm_sandbox,
        "job.yaml",
        tmp_path / "run",
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "train.command=python train.py --epochs 6 --sleep 2",
    )
    job.wait_log(0, r"snapshot of epoch 0 saved")
    job.signal_batch_shell()  # what Slurm does signal_delay_s before the time limit (#SBATCH --signal=B:USR2@…)
    wait_for(lambda: int(job.field("Restarts") or 0) >= 1, 120, "the job to requeue itself", job.why)
    assert job.wait_ended() == "COMPLETED"
    assert (job.run_dir / "FINISHED").exists(), job.why()
    batch = batch_log(job.run_dir)
    assert "received SIGUSR2; forwarding it to the ranks" in batch, batch
    assert "the ranks got the time-limit signal" in batch and "requeueing (restart 1 of at most 3)" in batch, batch
    # what that requeue trains from, said by the batch log: nothing passes this script its snapshot (it loads it)
    assert "its script's checkpoints are not passed to it (train.resume unset): the next start trains" in batch, batch
    resumed = re.findall(r"\[rank 0\] resuming from snapshot \S+ at epoch (\d+)", rank_log(job.run_dir, 0))
    assert len(resumed) == 1 and int(resumed[0]) >= 1, rank_log(job.run_dir, 0)
    for rank in (0, 1):
        assert f"[rank {rank}] done: 6 epochs" in rank_log(job.run_dir, rank), logs(job.run_dir)
        assert "local_rank 0 of world 2" in rank_log(job.run_dir, rank)
    assert sorted(set(hosts(job.run_dir, 2))) == ["n1", "n2"]
    assert read_handlers(job.run_dir) == []  # no stop handler: cancel/requeue/status say its ranks are killed


def test_plain_script_torchrun_two_nodes_two_processes(slurm_sandbox, tmp_path: Path) -> None:
    """Also (issue 43): a setup line that reads an unset variable runs (no ``set -u``), and an
    ``environment.env`` value's ``$NAME`` is the rank's environment at rank start (``$$`` a literal ``$``)."""
    job = submit(
        slurm_sandbox,
        "job.yaml",
        tmp_path / "run",
        "slurm.nodes=2",
        "slurm.tasks_per_node=2",
        "slurm.launcher=torchrun",
        "environment.setup=echo ${SLURM_DDP_TEST_NEVER_SET}setup-ran",
        "environment.env.SNAPSHOT_FILE=$SLURM_DDP_RUN_DIR/snap$$shot.pt",
        "train.command=python train.py --epochs 2 --snapshot $SNAPSHOT_FILE",
    )
    assert job.wait_ended() == "COMPLETED", job.why()
    assert (job.run_dir / "FINISHED").exists()
    assert "\nsetup-ran\n" in batch_log(job.run_dir), job.why()
    assert (job.run_dir / "snap$shot.pt").exists(), job.why()
    for rank in range(4):
        text = rank_log(job.run_dir, rank)
        assert f"[rank {rank}] done: 2 epochs" in text, logs(job.run_dir)
        assert f"local_rank {rank % 2} of world 4" in text, text
    assert hosts(job.run_dir, 4) == ["n1", "n1", "n2", "n2"]
    assert (job.run_dir / "logs" / "torchrun-node-0.log").exists() and (
        job.run_dir / "logs" / "torchrun-node-1.log"
    ).exists()


def test_api_variant_torchrun_signalled_stops_at_a_step_on_every_rank_requeues_and_finishes(
    slurm_sandbox, tmp_path: Path
) -> None:
    job = submit(
        slurm_sandbox,
        "job_preemptible.yaml",
        tmp_path / "run",
        "slurm.nodes=2",
        "slurm.tasks_per_node=2",
        "slurm.launcher=torchrun",
        "train.command=python train_preemptible.py --epochs 3 --sleep 4",
    )
    # The signal must reach the ranks while they still train: sent once every rank of this start has installed
    # its handler (preemption.install()'s record; before it the script's default action would kill the rank),
    # the whole run's training lies between it and the ranks' last should_stop(). Sent after epoch 0's
    # snapshot, only the last two epochs did (8 s): a delivery slower than that (CI under load) let every rank
    # finish first, exit after the signal, be requeued as told to stop, and resume at epoch 3 with nothing
    # left to do: no rank stopped at a step.
    wait_for(lambda: handler_ranks(job, restart=0) == set(range(4)), 180, "every rank's stop handler", job.why)
    job.signal_batch_shell()
    job.wait_log(0, r"resuming from snapshot", timeout_s=240)
    assert job.wait_ended() == "COMPLETED", job.why()
    stops = [
        re.findall(r"stopping for preemption after epoch (\d+) batch (\d+)", rank_log(job.run_dir, r)) for r in range(4)
    ]
    same_step = all(len(s) == 1 for s in stops) and len({s[0] for s in stops}) == 1  # the same step on every rank
    assert same_step, f"{stops}\n{logs(job.run_dir)}"
    epoch, batch = stops[0][0]
    for rank in range(4):
        text = rank_log(job.run_dir, rank)
        assert "resuming from snapshot" in text and f"at epoch {epoch} batch {batch}" in text, text[-3000:]
        assert f"[rank {rank}] done: 3 epochs" in text, text[-3000:]
    marker = (job.run_dir / "PREEMPTED").read_text().split()
    assert marker[0] == job.id and marker[1] == "0" and marker[3] == "SIGUSR2", marker
    batch_text = batch_log(job.run_dir)
    assert "rank 0 committed the checkpoint" in batch_text and "requeueing (restart 1" in batch_text, batch_text
    assert int(job.field("Restarts")) == 1
    # every rank of both starts left the evidence of its handler (preemption.install, under torchrun too)
    recs = read_handlers(job.run_dir)
    assert {(r.job_id, r.restart, r.rank) for r in recs} == {(job.id, s, k) for s in (0, 1) for k in range(4)}, recs
    assert all(r.via == "slurm_ddp.preemption" and {"SIGUSR2", "SIGTERM"} <= set(r.signals) for r in recs), recs


def test_a_crashing_script_is_not_requeued(slurm_sandbox, tmp_path: Path) -> None:
    job = submit(
        slurm_sandbox,
        "job.yaml",
        tmp_path / "run",
        "slurm.nodes=1",
        "slurm.tasks_per_node=1",
        "train.command=[python, -c, 'raise SystemExit(3)']",
    )
    assert job.wait_ended() == "FAILED", job.why()
    assert int(job.field("Restarts")) == 0 and not (job.run_dir / "FINISHED").exists()
    assert "not preempted (status 3): not requeueing" in batch_log(job.run_dir), batch_log(job.run_dir)


def submitit_output(run_dir: Path, rank: int) -> str:
    """Rank ``rank``'s output under the submitit backend: submitit's per-task logs, every start."""
    return "".join(p.read_text(errors="replace") for p in sorted((run_dir / "submitit").glob(f"*/*_{rank}_log.*")))


def test_plain_script_through_submitit_two_nodes_finishes(slurm_sandbox, tmp_path: Path) -> None:
    require_module("submitit", "the submitit backend")
    job = submit(
        slurm_sandbox,
        "job.yaml",
        tmp_path / "run",
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "train.command=python train.py --epochs 2",
        backend="submitit",
    )
    state = job.wait_ended()
    out = {rank: submitit_output(job.run_dir, rank) for rank in (0, 1)}
    assert state == "COMPLETED", f"{job.why()}\n{out}"
    assert (job.run_dir / "FINISHED").exists(), out  # rank 0's status 0 is the script's "done"
    for rank in (0, 1):
        assert f"[rank {rank}] done: 2 epochs" in out[rank], out[rank]
        assert "local_rank 0 of world 2" in out[rank], out[rank]
    found = sorted(m.group(1) for r in (0, 1) for m in [re.search(rf"\[rank {r}\] host (\S+)", out[r])] if m)
    assert found == ["n1", "n2"], out
