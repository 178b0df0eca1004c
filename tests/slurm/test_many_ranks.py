"""More ranks than two: the digits job on 3 nodes × 2 tasks = 6 ranks of a private 3-node sandbox
(more than 2 nodes and more than one rank per node; 3 nodes, not 4: each rank start costs ~3 CPU-s of imports).

SIGUSR2 at the batch shell mid-run (the time-limit signal's path): the shell forwards it to srun,
srun to the 6 ranks on 3 nodes, they agree at a step boundary, rank 0 commits the checkpoint of
that step, the job requeues itself, resumes at exactly that step on 6 ranks and finishes. The
16-rank run on 8 nodes is the benchmark ``benchmarks/scale_slurm.py`` (benchmarks/README.md).

The sandbox's nodes advertise 2 CPUs each (``SlurmdParameters=config_overrides`` lets them claim
more than the machine's 2 cores); batches are tiny: the point is the machinery, not speed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Iterator

import pytest
from lib.slurm_jobs import record_timing, submit_digits, train_steps

from slurm_ddp.rundir import read_metrics, read_preempted
from slurm_ddp.sandbox import SlurmSandbox
from slurm_ddp.testing import running_sandbox, wait_for

pytestmark = pytest.mark.slurm

NODES, TASKS_PER_NODE = 3, 2
MAX_STEPS = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    with running_sandbox(tmp_path_factory.mktemp("many-ranks"), nodes=NODES, cpus_per_node=TASKS_PER_NODE) as sb:
        yield sb


def test_six_ranks_on_three_nodes_signal_requeue_resume(cluster: SlurmSandbox, tmp_path: Path) -> None:
    world = NODES * TASKS_PER_NODE
    t_submit = time.time()
    job = submit_digits(
        cluster,
        tmp_path / "run",
        f"slurm.nodes={NODES}",
        f"slurm.tasks_per_node={TASKS_PER_NODE}",
        "slurm.cpus_per_task=1",
        f"train.max_steps={MAX_STEPS}",
        "train.batch_size=8",
        "train.log_every=1",
        "checkpoint.every_steps=0",
        "train.pg_timeout_s=120",
    )
    try:
        job.wait_step(5, timeout_s=240)
        record_timing(f"sbatch→first step ({world} ranks)", read_metrics(job.run_dir)[0]["time"] - t_submit)
        t_signal = time.time()
        job.scancel("--batch", "--signal=USR2")
        wait_for(lambda: read_preempted(job.run_dir), 120, "the preemption checkpoint", job.diag)
        stopped = read_preempted(job.run_dir)
        assert stopped is not None and stopped.signal == "SIGUSR2"
        record_timing(f"signal at the batch shell→checkpoint committed ({world} ranks)", time.time() - t_signal)
        assert stopped.step < MAX_STEPS, "the run ended before the signal: raise MAX_STEPS"

        finished = job.wait_finished(timeout_s=300)
        assert finished["step"] == MAX_STEPS and finished["world_size"] == world, finished
        assert job.restarts() == 1, job.show()
        events = read_metrics(job.run_dir)
        pre = [m for m in events if m["event"] == "preempted"][-1]
        res = [m for m in events if m["event"] == "resume"][-1]
        assert res["step"] == pre["step"] == stopped.step
        record_timing(f"checkpoint→resumed step (requeue + restart, {world} ranks)", res["time"] - pre["time"])
        steps = train_steps(job.run_dir)
        assert steps == list(range(1, MAX_STEPS + 1)), steps  # none lost, none repeated

        assert "received SIGUSR2; forwarding it to the ranks" in job.batch_log()
        assert re.findall(r"resumed from checkpoint of step (\d+)", job.rank_log(0)) == [str(stopped.step)]
        for restart in (0, 1):
            places = set()
            for rank in range(world):
                found = re.findall(
                    rf"host (\S+) \(\S+\) rank {rank}/{world} local_rank (\d)/{TASKS_PER_NODE} node_rank (\d+) "
                    rf".* restart {restart} pid",
                    job.rank_log(rank),
                )
                assert len(found) == 1, (rank, restart, job.rank_log(rank)[-2000:])
                places.add(found[0])
            assert len(places) == world
            assert {host for host, _, _ in places} == set(cluster.node_names)
    finally:
        if job.state() not in ("COMPLETED", "FAILED", "CANCELLED"):
            job.scancel()
