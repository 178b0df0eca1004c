"""The real-Slurm tier: the digits job through sbatch and submitit on the 2-node sandbox.

Covers 2-node DDP training, USR2 at the steps, one node × 2 tasks and the batch shell's forwarding (both
in the time-limit test),
max_requeues, requeue of a finished run, partition preemption (SIGTERM → checkpoint →
Slurm requeues → resume), the submitit path, and the real ``--signal=B:USR2@…`` path
before a short time limit. Every wait has its own timeout. Timings measured on the way
(sbatch→first step, signal→checkpoint committed, requeue→resumed step, steps lost) are
printed (``pytest -s``) and appended to ``$SLURM_DDP_TIMINGS`` when that is set.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from lib import require_module, wait_for
from lib.slurm_jobs import DigitsJob as Job
from lib.slurm_jobs import logs, record_timing, train_steps
from lib.slurm_jobs import submit_digits as submit

from slurm_ddp.rundir import read_metrics as metrics

pytestmark = pytest.mark.slurm


def preempted_step(run_dir: Path) -> int:
    return int((run_dir / "PREEMPTED").read_text().split()[2])


def rank_log(run_dir: Path, rank: int) -> str:
    """Rank ``rank``'s log: logs/rank-N.log (sbatch), or submitit's per-task logs across requeues."""
    p = run_dir / "logs" / f"rank-{rank}.log"
    if p.exists():
        return p.read_text()
    return "".join(q.read_text() for q in sorted((run_dir / "submitit").glob(f"*/*_{rank}_log.out")))


def check_resumed(job: Job, stopped: int) -> None:
    """Rank 0 resumed from exactly the step it stopped at; no step trained twice or skipped."""
    rank0 = rank_log(job.run_dir, 0)
    assert re.findall(r"resumed from checkpoint of step (\d+)", rank0) == [str(stopped)], rank0[-4000:]
    steps = train_steps(job.run_dir)
    assert steps == sorted(set(steps)) and steps[-1] == 200, steps


def signal_and_measure(job: Job, *scancel_args: str, at_step: int = 40) -> int:
    """Send a signal once training passed ``at_step``; returns the step the ranks stopped at."""
    job.wait_step(at_step)
    t_signal = time.time()
    job.scancel(*scancel_args)
    wait_for(
        lambda: (job.run_dir / "PREEMPTED").exists(),
        90,
        "the preemption checkpoint",
        lambda: f"{job.show()}\n{logs(job.run_dir)}",
    )
    ck = [m for m in metrics(job.run_dir) if m["event"] == "checkpoint" and m["reason"].startswith("preemption")]
    assert ck, metrics(job.run_dir)[-5:]
    record_timing(f"signal→checkpoint committed ({' '.join(scancel_args)})", ck[-1]["time"] - t_signal)
    stopped = preempted_step(job.run_dir)
    last_trained = max(s for s in train_steps(job.run_dir) if s <= stopped) if train_steps(job.run_dir) else 0
    assert stopped >= last_trained  # the saved step is the last completed step
    return stopped


def measure_resume(job: Job) -> None:
    ev = metrics(job.run_dir)
    pre = [m for m in ev if m["event"] == "preempted"][-1]
    res = [m for m in ev if m["event"] == "resume" and m["time"] > pre["time"]][0]
    record_timing("checkpoint→resumed step (requeue + restart)", res["time"] - pre["time"])
    record_timing("steps lost per preemption", res["step"] - pre["step"], unit="steps")
    assert res["step"] == pre["step"]


# --------------------------------------------------------------------------- tests
def test_two_nodes_signal_at_steps_then_finished_requeue(slurm_sandbox, tmp_path: Path) -> None:
    t_submit = time.time()
    job = submit(slurm_sandbox, tmp_path / "run", "slurm.nodes=2", "slurm.tasks_per_node=1")
    job.wait_step(10)
    first = [m for m in metrics(job.run_dir) if m["event"] == "train"][0]
    record_timing("sbatch→first logged step (10 steps)", first["time"] - t_submit)

    stopped = signal_and_measure(job, "--signal=USR2")
    wait_for(lambda: job.restarts() >= 1, 60, "the job to requeue itself", lambda: logs(job.run_dir))
    finished = job.wait_finished()
    assert finished["eval_accuracy"] >= 0.97, finished
    check_resumed(job, stopped)
    measure_resume(job)

    hosts = set()
    for rank in (0, 1):
        text = (job.run_dir / "logs" / f"rank-{rank}.log").read_text()
        facts = re.findall(
            rf"host (\S+) \(\S+\) rank {rank}/2 local_rank 0/1 node_rank {rank} master (\S+):(\d+)", text
        )
        assert facts, text[-2000:]
        hosts.add(facts[0][0])
        assert facts[0][1] == "n1"
    assert hosts == {"n1", "n2"}
    batch = "".join(p.read_text() for p in (job.run_dir / "logs").glob("batch-*.out"))
    assert "requeueing (restart 1" in batch
    assert "process group formed in" in (job.run_dir / "logs" / "rank-0.log").read_text()

    # A finished run that is requeued exits at once without training again.
    n_train = len(train_steps(job.run_dir))
    r = slurm_sandbox.run(["scontrol", "requeue", job.id], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    wait_for(
        lambda: "already finished" in "".join(p.read_text() for p in (job.run_dir / "logs").glob("batch-*.out")),
        90,
        "the requeued finished job to run",
        lambda: f"{job.show()}\n{logs(job.run_dir)}",
    )
    job.wait_ended()
    assert len(train_steps(job.run_dir)) == n_train


def test_max_requeues_is_honoured(slurm_sandbox, tmp_path: Path) -> None:
    job = submit(
        slurm_sandbox,
        tmp_path / "run",
        "slurm.nodes=1",
        "slurm.tasks_per_node=1",
        "requeue.max_requeues=0",
        "train.max_steps=100000",
    )
    signal_and_measure(job, "--signal=USR2", at_step=20)
    job.wait_ended()
    assert job.restarts() == 0
    assert not (job.run_dir / "FINISHED").exists()
    batch = "".join(p.read_text() for p in (job.run_dir / "logs").glob("batch-*.out"))
    assert "max_requeues=0 reached" in batch, batch


def test_partition_preemption_requeues_and_resumes(slurm_sandbox, tmp_path: Path) -> None:
    # Two DataLoader workers per rank: slurmctld's SIGTERM reaches every process of the step, the loader
    # workers too; they must leave the stop to their rank (signals.ignore_in_loader_workers).
    job = submit(
        slurm_sandbox,
        tmp_path / "run",
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "slurm.partition=debug",
        "train.num_workers=2",
    )
    job.wait_step(40)
    t0 = time.time()
    # Needs every CPU of both nodes: the scheduler must preempt the training job.
    hi = slurm_sandbox.run(
        [
            "sbatch",
            "--parsable",
            "--partition=high",
            "--nodes=2",
            "--ntasks-per-node=2",
            f"--output={tmp_path}/high-%j.out",
            "--wrap",
            "sleep 3",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert hi.returncode == 0, hi.stderr
    wait_for(
        lambda: (job.run_dir / "PREEMPTED").exists(),
        60,
        "the preempted job's checkpoint",
        lambda: f"{job.show()}\n{logs(job.run_dir)}",
    )
    record_timing(
        "preemption (high job submitted)→checkpoint committed",
        [m for m in metrics(job.run_dir) if m["event"] == "preempted"][-1]["time"] - t0,
    )
    stopped = preempted_step(job.run_dir)
    assert (job.run_dir / "PREEMPTED").read_text().split()[3] == "SIGTERM"
    finished = job.wait_finished(timeout_s=300)
    assert finished["eval_accuracy"] >= 0.97
    assert job.restarts() >= 1
    check_resumed(job, stopped)
    measure_resume(job)


def test_submitit_backend_trains_and_requeues(slurm_sandbox, tmp_path: Path) -> None:
    require_module("submitit", "the submitit backend")
    job = submit(slurm_sandbox, tmp_path / "run", "slurm.nodes=2", "slurm.tasks_per_node=1", backend="submitit")
    stopped = signal_and_measure(job, "--signal=USR2")
    finished = job.wait_finished()
    assert finished["eval_accuracy"] >= 0.97
    assert job.restarts() == 1
    check_resumed(job, stopped)


def test_time_limit_signal_requeues(slurm_sandbox, tmp_path: Path) -> None:
    """The real path: #SBATCH --signal=B:USR2@60 with --time=2 arrives at the batch shell, which forwards
    it to the ranks of one node × 2 tasks. This run is also the suite's batch-shell forwarding and one-node ×
    2-tasks test (it was a separate ``scancel --batch --signal=USR2`` run); a run that finishes after a
    requeue, at its accuracy, is test_two_nodes_signal_at_steps_then_finished_requeue's."""
    job = submit(
        slurm_sandbox,
        tmp_path / "run",
        "slurm.nodes=1",
        "slurm.tasks_per_node=2",
        "slurm.time=2",
        "requeue.signal_delay_s=60",
        "requeue.max_requeues=1",
        "train.max_steps=1000000",
        "checkpoint.every_steps=0",
        "train.args.step_sleep_s=0.05",  # 60-90 s of waiting for the signal: at ~15 steps/s, not all the CPUs
    )
    wait_for(
        lambda: job.restarts() >= 1,
        150,
        "the time-limit signal to requeue the job",
        lambda: f"{job.show()}\n{logs(job.run_dir)}",
    )
    stopped = preempted_step(job.run_dir)
    wait_for(
        lambda: re.findall(r"resumed from checkpoint of step (\d+)", (job.run_dir / "logs" / "rank-0.log").read_text()),
        90,
        "the requeued job to resume",
        lambda: logs(job.run_dir),
    )
    rank0 = (job.run_dir / "logs" / "rank-0.log").read_text()
    assert re.findall(r"resumed from checkpoint of step (\d+)", rank0) == [str(stopped)]
    steps = train_steps(job.run_dir)
    assert steps == sorted(set(steps)), steps  # no step trained twice across the requeue
    batch = "".join(p.read_text() for p in (job.run_dir / "logs").glob("batch-*.out"))
    assert "received SIGUSR2; forwarding it to the ranks" in batch, batch
    for rank in (0, 1):
        assert f"rank {rank}/2 local_rank {rank}/2" in (job.run_dir / "logs" / f"rank-{rank}.log").read_text()
    job.scancel()
    job.wait_ended()


def test_killed_rank_ends_the_whole_job(slurm_sandbox, tmp_path: Path) -> None:
    """kill -9 of one rank on node n2: srun --kill-on-bad-exit stops the others; the logs name it."""
    job = submit(
        slurm_sandbox,
        tmp_path / "run",
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "train.max_steps=100000",
        "train.pg_timeout_s=30",
    )
    job.wait_step(20)
    pids = subprocess.run(
        ["pgrep", "-f", f"slurm_ddp.worker --run-dir {job.run_dir}"], capture_output=True, text=True
    ).stdout.split()
    by_rank = {}
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        procid = [e for e in env if e.startswith(b"SLURM_PROCID=")]
        if procid:
            by_rank[int(procid[0].split(b"=")[1])] = int(pid)
    assert set(by_rank) == {0, 1}, (pids, by_rank)
    t0 = time.monotonic()
    os.kill(by_rank[1], 9)
    wait_for(
        lambda: all(not Path(f"/proc/{p}").exists() for p in by_rank.values()),
        60,
        "every rank to exit",
        lambda: logs(job.run_dir),
    )
    record_timing("rank killed → every rank gone (Slurm)", time.monotonic() - t0)
    assert job.wait_ended() == "FAILED"
    batch = "".join(p.read_text() for p in (job.run_dir / "logs").glob("batch-*.out"))
    assert re.search(r"task 1.*(Killed|signal 9)", batch + logs(job.run_dir)), batch
