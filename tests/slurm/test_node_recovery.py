"""In-job recovery from a lost node (config section ``recovery``), on a private 3-node sandbox.

A 2-node digits job with one hot spare (``recovery.spare_nodes: 1``: ``sbatch --no-kill --nodes=3``)
loses its second node as a power cut would (``SlurmSandbox.kill_node``: slurmd and every process of
the job there SIGKILLed). Slurm keeps ``SlurmdTimeout=60`` here (the default is 300): it marks the node
DOWN only ~70-80 s later, and the step runs on until then. The recovery must not wait for that: rank 0
sees its peer's socket close and leaves the peer-lost marker, the batch script ends srun, the recovery
rule (``slurm_ddp.rundir.recovery``) probes the nodes, names the dead one and starts the next step on
the batch host and the spare, in the same job: no requeue (``Restarts=0``), no queue wait. There is no
periodic checkpoint (``checkpoint.every_steps: 0``): before it exits, rank 0 commits the last completed
step alone (an emergency checkpoint), so the next step resumes at most one step back, and the run finishes.

Timings (loss → resumed step, loss → first new training step, steps redone) are printed (``pytest -s``)
and appended to ``$SLURM_DDP_TIMINGS`` when that is set.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Iterator

import pytest
from lib.slurm_jobs import cli, committed_steps, record_timing, submit_digits, train_steps

from slurm_ddp.rundir import read_metrics, read_recoveries
from slurm_ddp.sandbox import SlurmSandbox
from slurm_ddp.testing import running_sandbox, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("node_recovery")]

MAX_STEPS = 120
LOSS_AFTER = 15  # steps logged before the node is lost
SLURMD_TIMEOUT_S = 60  # Slurm's own notice comes ~70-80 s after the loss: the recovery must not wait for it


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    with running_sandbox(
        tmp_path_factory.mktemp("node-recovery"),
        nodes=3,
        cpus_per_node=2,
        slurmd_timeout_s=SLURMD_TIMEOUT_S,
        kill_wait_s=2,
    ) as sb:
        yield sb


def node_state(sb: SlurmSandbox, node: str) -> str:
    r = sb.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True, timeout=20)
    m = re.search(r"\bState=(\S+)", r.stdout)
    return m.group(1) if m else "?"


def test_lost_node_is_replaced_by_the_spare_inside_the_job(cluster: SlurmSandbox, tmp_path: Path) -> None:
    job = submit_digits(
        cluster,
        tmp_path / "run",
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "recovery.spare_nodes=1",
        f"train.max_steps={MAX_STEPS}",
        "train.log_every=1",
        "checkpoint.every_steps=0",  # no periodic checkpoint: only the emergency one can explain the resume
        "train.pg_timeout_s=30",
    )
    victim = ""
    try:
        wait_for(lambda: max(train_steps(job.run_dir), default=0) >= LOSS_AFTER, 180, f"step {LOSS_AFTER}", job.diag)
        info = job.show()
        assert info["JobState"] == "RUNNING" and info["NumNodes"] == "3", info
        m = re.search(r"training step on (\S+) \(2 nodes, in-job restart 0\)", job.batch_log())
        assert m, job.batch_log()
        step_nodes = m.group(1).split(",")
        assert step_nodes[0] == info["BatchHost"], (step_nodes, info)
        victim = step_nodes[1]
        all_nodes = cluster.run(
            ["scontrol", "show", "hostnames", info["NodeList"]], capture_output=True, text=True, timeout=20
        ).stdout.split()
        spare = [n for n in all_nodes if n not in step_nodes]
        assert len(spare) == 1, (all_nodes, step_nodes)

        # checked before the kill: right after it, the survivor's emergency checkpoint may already be there
        assert committed_steps(job.run_dir) == [], "a checkpoint before the loss"
        t_loss = time.time()
        assert cluster.kill_node(victim), f"no process in {victim}'s namespace"

        wait_for(
            lambda: [m for m in read_metrics(job.run_dir) if m["event"] == "resume" and m["time"] > t_loss],
            240,
            "the in-job restart to resume",
            job.diag,
        )
        # the job did not end, was not requeued, and Slurm need not have noticed the loss yet
        shown = job.show()
        assert shown["JobState"] == "RUNNING" and job.restarts() == 0, shown
        events = read_metrics(job.run_dir)
        resume = [m for m in events if m["event"] == "resume" and m["time"] > t_loss][0]
        record_timing("node lost (spare) → resumed step in the same job", resume["time"] - t_loss)
        record_timing(f"{victim} state when the step resumed: {node_state(cluster, victim)}", 0, "(state)")
        wait_for(
            lambda: [m for m in read_metrics(job.run_dir) if m["event"] == "train" and m["time"] > resume["time"]],
            120,
            "a training step after the in-job restart",
            job.diag,
        )
        first_train = [m for m in read_metrics(job.run_dir) if m["event"] == "train" and m["time"] > resume["time"]][0]
        record_timing("node lost (spare) → first logged training step after it", first_train["time"] - t_loss)
        # at most one step redone: the last step rank 0 logged before the loss is at most one past the resume
        last_before = max(m["step"] for m in events if m["event"] == "train" and m["time"] < resume["time"])
        assert resume["emergency"] and resume["step"] >= last_before - 1, (resume, last_before)
        assert [m["step"] for m in events if m["event"] == "emergency_checkpoint"] == [resume["step"]], events[-8:]
        record_timing("steps redone (emergency checkpoint, no periodic one)", last_before - resume["step"], "steps")

        finished = job.wait_finished(timeout_s=300)
        assert finished["step"] == MAX_STEPS and finished["eval_accuracy"] >= 0.9, finished
        assert job.state() == "COMPLETED" and job.restarts() == 0, job.show()
        recoveries = read_recoveries(job.run_dir)
        assert [(r["action"], r["bad"], r["nodes"]) for r in recoveries] == [
            ("restart", [victim], [step_nodes[0], spare[0]])
        ], recoveries
        # the new step's ranks ran on the batch host and the spare
        hosts = {h for h in re.findall(r"host (\S+) \(\S+\) rank \d/2 .* restart 0 pid", job.rank_log(1))}
        assert spare[0] in hosts, (hosts, job.rank_log(1)[-2000:])
        assert "in-job restart 1" in job.batch_log(), job.batch_log()
        # status and report show the in-job restart: the lost node, the step, the new nodes, the time
        shown_line = f"lost node {victim} at step {resume['step']}, back at step {resume['step']} on "
        status = cli(cluster, "status", str(job.run_dir)).stdout
        assert re.search(r"^in-job restarts: +1$", status, re.M) and shown_line in status, status
        report = json.loads(cli(cluster, "report", str(job.run_dir), "--json").stdout)
        assert report["in_job_restarts"] == 1 and report["restarts"] == 1, report
    finally:
        if job.state() not in ("COMPLETED", "FAILED", "CANCELLED"):
            job.scancel()
        if victim:
            cluster.restart_node(victim, timeout_s=180)
