"""The hang watchdog on real Slurm: a private 3-node sandbox (a hung job is requeued without its node,
so a 2-node job needs a third node to go on).

Two 2-node jobs (one task per node) run side by side, rank 1 blocking for good in data loading at
step 8: in one only in its first run (a flaky node: the requeued job runs without that node, resumes
from its last checkpoint and finishes), in the other in every run (the same hang at the same step on
another node: the run stops with a one-line reason, no loop).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest
from lib import wait_for

from slurm_ddp.rundir import read_metrics
from slurm_ddp.sandbox import SlurmSandbox
from slurm_ddp.testing import running_sandbox

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
TASKS = REPO / "tests" / "local"


@pytest.fixture(scope="module")
def sandbox3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmSandbox]:
    with running_sandbox(
        tmp_path_factory.mktemp("slurm-sandbox3"), timeout_s=90, nodes=3, cpus_per_node=2, gpus_per_node=0
    ) as sb:
        yield sb


def show(sb: SlurmSandbox, job_id: str) -> Dict[str, str]:
    r = sb.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=20)
    return dict(re.findall(r"(\w+)=(\S*)", r.stdout))


def logs(run_dir: Path) -> str:
    parts = []
    for p in sorted((run_dir / "logs").glob("*")) if (run_dir / "logs").exists() else []:
        parts.append(f"==> {p.name} <==\n{p.read_text(errors='replace')[-4000:]}")
    return "\n".join(parts)


def submit(sb: SlurmSandbox, run_dir: Path, *sets: str) -> str:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "sbatch", "--run-dir", str(run_dir)]
    for s in (
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "slurm.cpus_per_task=1",
        "slurm.time=00:10:00",
        "train.task=hang_task:HangTask",
        f"train.pythonpath=[{REPO / 'examples' / 'digits'}, {TASKS}]",
        "train.num_workers=0",
        "train.max_steps=30",
        "train.eval_every=0",
        "train.log_every=2",
        "checkpoint.every_steps=5",
        "train.args.hang_rank=1",
        "train.args.hang_at_step=8",
        "watchdog.timeout_floor_s=10",
        "watchdog.poll_interval_s=0.5",
        *sets,
    ):
        cmd += ["--set", s]
    r = sb.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    return m.group(1)


def rank_hosts(run_dir: Path) -> List[Tuple[int, int, str]]:
    """(restart, rank, host) of every rank start, from the rank logs' first lines."""
    out = []
    for p in (run_dir / "logs").glob("rank-*.log"):
        for m in re.finditer(r"rank\d+ INFO host (\S+) .*? rank (\d+)/\d+ .*? restart (\d+)", p.read_text()):
            out.append((int(m.group(3)), int(m.group(2)), m.group(1)))
    return sorted(out)


def test_hang_requeues_without_the_node_and_a_repeated_hang_stops(sandbox3: SlurmSandbox, tmp_path: Path) -> None:
    flaky, buggy = tmp_path / "flaky", tmp_path / "buggy"
    flaky_id = submit(sandbox3, flaky, "train.args.hang_restarts=[0]")
    buggy_id = submit(sandbox3, buggy)
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

    # the flaky node: requeued without it, resumed, finished
    wait_for(
        lambda: (flaky / "FINISHED").exists() and show(sandbox3, flaky_id).get("JobState") in ended,
        420,
        f"job {flaky_id} to finish after its hang",
        lambda: f"{show(sandbox3, flaky_id)}\n{logs(flaky)}",
    )
    info = show(sandbox3, flaky_id)
    starts = rank_hosts(flaky)
    hung_node = next(h for restart, rank, h in starts if restart == 0 and rank == 1)
    text = logs(flaky)
    assert info["Restarts"] == "1" and hung_node in info.get("ExcNodeList", ""), (info, text)
    assert all(h != hung_node for restart, _, h in starts if restart == 1), (starts, text)
    assert f"hang: rank 1 on {hung_node} stopped progressing at step 8 in data loading" in text, text
    assert f"node {hung_node} is left out of the requeued job" in text, text
    resumes = [m["step"] for m in read_metrics(flaky) if m.get("event") == "resume"]
    assert resumes and resumes[0] >= 5, resumes

    # the bug: the same hang at step 8 on another node stops the run
    wait_for(
        lambda: show(sandbox3, buggy_id).get("JobState") in ended and show(sandbox3, buggy_id).get("Restarts") == "1",
        420,
        f"job {buggy_id} to stop after its second hang",
        lambda: f"{show(sandbox3, buggy_id)}\n{logs(buggy)}",
    )
    info = show(sandbox3, buggy_id)
    text = logs(buggy)
    assert info["JobState"] == "FAILED" and not (buggy / "FINISHED").exists(), (info, text)
    reason = [ln for ln in text.splitlines() if "the same hang at step 8" in ln]
    assert len(reason) == 1 and "not a node; not requeueing" in reason[0], text
