"""A node lost mid-run, on a private 3-node sandbox with short Slurm timeouts.

A 2-node digits job loses (1) its second node, (2) its first node — the batch shell and rank 0
die with it. "Lost" is a power cut: the node's slurmd and every process of the job on it are
SIGKILLed (``SlurmSandbox.kill_node``). Slurm marks the node DOWN when it misses its pings
(``SlurmdTimeout=10``, ``MessageTimeout=2`` here: ~9-18 s; ~80 s with ``SlurmdTimeout=60``), fails
the job with NODE_FAIL and requeues it (``#SBATCH --requeue``); the job starts again on the two healthy nodes and resumes from the newest periodic checkpoint
(``checkpoint.every_steps``), losing the steps trained since. Neither may hang: every wait has
its own deadline. A rank that crashes on a healthy node is a crash, not a loss: the job fails
and is not requeued, and no node goes down.

Timings (loss → resumed step, steps lost) are printed (``pytest -s``) and appended to
``$SLURM_DDP_TIMINGS`` when that is set.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Iterator, List

import pytest
from lib.slurm_jobs import DigitsJob, committed_steps, node_state, record_timing, submit_digits, train_steps

from slurm_ddp.rundir import read_metrics
from slurm_ddp.sandbox import SlurmSandbox
from slurm_ddp.testing import running_sandbox, wait_for

# one worker runs the module: its three tests share one private 3-node sandbox
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("node_loss")]

EVERY_STEPS = 20  # checkpoint.every_steps: bounds the steps a node loss costs
# enough steps that the test sees a committed checkpoint and kills a node before the run ends: 120 steps took
# ~1 s on an idle machine (the job finished before the first poll saw a checkpoint and 10 steps after it)
MAX_STEPS = 600
# A dead node is DOWN after two failed pings (every SlurmdTimeout/3 s); each fails after about
# MessageTimeout s (slurmctld retries a refused connection once a second): ~9-18 s here, ~80 s by default.
# SlurmdTimeout >= 5 x MessageTimeout, else Slurm 24.11 sets healthy nodes DOWN too (sandbox.layout)
SLURMD_TIMEOUT_S = 10
MESSAGE_TIMEOUT_S = 2


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    with running_sandbox(
        tmp_path_factory.mktemp("node-loss"),
        nodes=3,
        cpus_per_node=2,
        slurmd_timeout_s=SLURMD_TIMEOUT_S,
        message_timeout_s=MESSAGE_TIMEOUT_S,
        kill_wait_s=2,
    ) as sb:
        yield sb


def hosts_of_restart(job: DigitsJob, restart: int) -> List[str]:
    """The hosts the ranks of ``restart`` ran on, from their start lines in the rank logs."""
    hosts = []
    for rank in (0, 1):
        found = re.findall(rf"host (\S+) \(\S+\) rank {rank}/2 .* restart {restart} pid", job.rank_log(rank))
        hosts += found[-1:]
    return hosts


def submit(cluster: SlurmSandbox, run_dir: Path, *sets: str) -> DigitsJob:
    return submit_digits(
        cluster,
        run_dir,
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        f"train.max_steps={MAX_STEPS}",
        "train.log_every=5",
        f"checkpoint.every_steps={EVERY_STEPS}",
        "train.pg_timeout_s=60",
        *sets,
    )


@pytest.mark.parametrize("lost", ["second", "first"])
def test_node_lost_requeues_and_resumes_on_healthy_nodes(cluster: SlurmSandbox, tmp_path: Path, lost: str) -> None:
    job = submit(cluster, tmp_path / "run")
    victim = ""
    try:
        wait_for(
            lambda: (
                committed_steps(job.run_dir)
                and max(train_steps(job.run_dir), default=-1) >= committed_steps(job.run_dir)[-1] + 10
            ),
            180,
            "a committed periodic checkpoint and 10 steps after it",
            job.diag,
        )
        info = job.show()
        nodes = cluster.run(
            ["scontrol", "show", "hostnames", info["NodeList"]], capture_output=True, text=True, timeout=20
        ).stdout.split()
        assert len(nodes) == 2 and info["BatchHost"] == nodes[0], info
        victim = nodes[1] if lost == "second" else nodes[0]

        t_loss = time.time()
        killed = cluster.kill_node(victim)
        assert killed, f"no process in {victim}'s namespace"
        newest = committed_steps(job.run_dir)[-1]  # what survives the loss

        wait_for(lambda: "DOWN" in node_state(cluster, victim), 60, f"{victim} to be marked DOWN", job.diag)
        record_timing(f"node lost ({lost}) → node DOWN", time.time() - t_loss)
        wait_for(lambda: job.restarts() >= 1, 60, "Slurm to requeue the job (NODE_FAIL)", job.diag)
        wait_for(
            lambda: [m for m in read_metrics(job.run_dir) if m["event"] == "resume" and m["time"] > t_loss],
            120,
            "the requeued job to resume",
            job.diag,
        )
        events = read_metrics(job.run_dir)
        resume = [m for m in events if m["event"] == "resume" and m["time"] > t_loss][0]
        before = [m["step"] for m in events if m["event"] == "train" and m["time"] < resume["time"]]
        # a save in flight at the loss (the surviving rank's) may still commit after it, before Slurm ends the
        # job: the resume takes a checkpoint no older than the newest committed at the loss, of a step trained
        # before it (a manifest's "created" is no witness: a later save of the same step rewrites it)
        resumed_from = resume["step"]
        assert resumed_from >= newest, (resume, newest)
        assert resumed_from <= max(before), (resume, max(before))
        lost_steps = max(before) - resume["step"]
        record_timing(f"node lost ({lost}) → resumed step", resume["time"] - t_loss)
        record_timing(f"steps lost (node lost, {lost}; checkpoint.every_steps={EVERY_STEPS})", lost_steps, "steps")
        assert 0 <= lost_steps < 2 * EVERY_STEPS, (before[-5:], resume)

        finished = job.wait_finished(timeout_s=300)
        assert finished["step"] == MAX_STEPS and finished["eval_accuracy"] >= 0.9, finished
        assert job.state() == "COMPLETED" and job.restarts() == 1, job.show()
        healthy = hosts_of_restart(job, 1)
        assert len(healthy) == 2 and victim not in healthy, (victim, healthy)
        assert re.findall(r"resumed from checkpoint of step (\d+)", job.rank_log(0)) == [str(resumed_from)]
        assert "restart 1" in job.batch_log()
        # Slurm's SIGTERM to the batch step on NODE_FAIL can end the requeue decision: that is said, not an ERROR
        assert "the requeue decision failed" not in job.batch_log(), job.batch_log()
        jobcomp = (cluster.log_dir / "jobcomp.txt").read_text()
        assert re.search(rf"JobId={job.id} .*JobState=NODE_FAIL", jobcomp), jobcomp
    finally:
        if job.state() not in ("COMPLETED", "FAILED", "CANCELLED"):
            job.scancel()
        if victim:
            cluster.restart_node(victim)


def test_rank_crash_on_a_healthy_node_is_not_requeued(cluster: SlurmSandbox, tmp_path: Path) -> None:
    """kill -9 of rank 1 (its node stays up): the job fails, is not requeued, and no node goes DOWN."""
    job = submit(cluster, tmp_path / "run", "train.max_steps=100000")
    try:
        job.wait_step(20)
        nodes = cluster.run(
            ["scontrol", "show", "hostnames", job.show()["NodeList"]], capture_output=True, text=True, timeout=20
        ).stdout.split()
        rank1 = []
        for pid in cluster.node_pids(nodes[1]):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"slurm_ddp.worker" in cmd and b"SLURM_PROCID=1" in env:
                rank1.append(pid)
        assert len(rank1) == 1, rank1
        os.kill(rank1[0], 9)
        assert job.wait_ended() == "FAILED", job.diag()
        assert job.restarts() == 0, job.show()
        assert all("DOWN" not in node_state(cluster, n) for n in cluster.node_names)
        assert re.search(r"task 1.*(Killed|signal 9)", job.batch_log() + job.rank_log(1)), job.batch_log()
    finally:
        if job.state() not in ("COMPLETED", "FAILED", "CANCELLED"):
            job.scancel()
