"""The real-Slurm tier for the PyTorch Lightning example (``examples/lightning``, ``SlurmDDPCallback``).

2 nodes × 1 rank under srun (Lightning's ``SLURMEnvironment``, auto-requeue off by ``cluster_plugins``).
One run is stopped three times, once in each of the three ways, one epoch apart:

* ``scancel --signal=USR2 JOBID`` (the requeue signal, to the ranks only): the job requeues itself;
* ``slurm-ddp cancel`` (SIGTERM, which Lightning alone would turn into exit 0 and a FINISHED run),
  then ``slurm-ddp requeue``;
* a partition preemption (SIGTERM; Slurm requeues the job itself).

Each time both ranks stop at one optimizer step with ``last.ckpt``, the run is not finished, the next
start resumes from that step, and in the end it has trained every epoch; ``status`` shows the restarts.
(One run, not three: each start of a Lightning rank costs ~7 CPU-s of imports.)
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any, Callable, List

import pytest
from lib import require_module, wait_for
from lib.slurm_jobs import cli

from slurm_ddp.rundir import read_finished, read_metrics

pytestmark = pytest.mark.slurm

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning"
EPOCHS = 5
STEPS_PER_EPOCH = 23  # 1,437 training images over 2 ranks, batch 32 per rank
STOPS = ("usr2-to-ranks", "cancel-then-requeue", "partition-preemption")  # in epochs 2, 3 and 4


def test_a_lightning_run_stopped_three_ways_is_never_finished_early_and_resumes_from_last_ckpt(
    slurm_sandbox: Any, tmp_path: Path
) -> None:
    require_module("lightning", "the Lightning example")
    shutil.copy(EXAMPLE / "train.py", tmp_path / "train.py")
    job = tmp_path / "job.yaml"
    job.write_text(
        (EXAMPLE / "job.yaml")
        .read_text()
        .replace("nodes: 1, tasks_per_node: 2", "nodes: 2, tasks_per_node: 1")
        .replace("--epochs 10", f"--epochs {EPOCHS} --step-sleep 0.1")
    )
    run_dir = tmp_path / "run"
    # the debug partition: a job of the higher-priority partition preempts it (the third stop)
    r = cli(slurm_sandbox, "submit", str(job), "--run-dir", str(run_dir), "--set", "slurm.partition=debug")
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    job_id = m.group(1)

    def state() -> str:
        out = slurm_sandbox.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=20)
        found = re.search(r"\bJobState=(\S*)", out.stdout)
        return found.group(1) if found else "?"

    def why() -> str:
        logs = "\n".join(
            f"==> {p.name} <==\n{p.read_text(errors='replace')[-2500:]}" for p in sorted((run_dir / "logs").glob("*"))
        )
        return f"JobState={state()}\n{logs}"

    def events(name: str) -> List[dict]:
        return [e for e in read_metrics(run_dir) if e.get("event") == name]

    def trained_past(step: int) -> Callable[[], bool]:
        return lambda: any(int(e["step"]) > step for e in events("train"))

    for n, stop in enumerate(STOPS, start=1):
        wait_for(trained_past(n * STEPS_PER_EPOCH), 300, f"a train event of epoch {n + 1} (before: {stop})", why)
        if stop == "usr2-to-ranks":
            r2 = slurm_sandbox.run(["scancel", "--signal=USR2", job_id], capture_output=True, text=True, timeout=20)
            assert r2.returncode == 0, r2.stderr
        elif stop == "cancel-then-requeue":
            r2 = cli(slurm_sandbox, "cancel", str(run_dir))
            assert r2.returncode == 0, r2.stdout + r2.stderr
            wait_for(lambda: state() == "CANCELLED", 120, "the cancelled job to end", why)
            assert read_finished(run_dir) is None, why()
            r2 = cli(slurm_sandbox, "requeue", str(run_dir))
            assert r2.returncode == 0, r2.stdout + r2.stderr
        else:  # a job of the higher-priority partition takes both nodes: SIGTERM, and Slurm requeues ours
            hi = slurm_sandbox.run(
                ["sbatch", "--parsable", "--partition=high", "--nodes=2", "--ntasks-per-node=2"]
                + [f"--output={tmp_path}/high-%j.out", "--wrap", "sleep 1"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert hi.returncode == 0, hi.stderr
        wait_for(lambda n=n: len(events("resume")) == n, 300, f"the resume after the {stop} stop", why)
        assert read_finished(run_dir) is None, f"finished after the {stop} stop\n{why()}"

    wait_for(lambda: read_finished(run_dir) is not None, 400, "the run to finish after its last requeue", why)
    wait_for(lambda: state() == "COMPLETED", 60, f"job {job_id} to complete", why)
    preempted, resumes = events("preempted"), events("resume")
    assert len(preempted) == len(resumes) == len(STOPS), read_metrics(run_dir)
    for n, (p, res) in enumerate(zip(preempted, resumes), start=1):
        # each stop at an optimizer step of the epoch it was sent in, and resumed exactly there
        assert n * STEPS_PER_EPOCH < res["step"] == p["step"] < (n + 2) * STEPS_PER_EPOCH, (n, p, res)
        assert res["checkpoint"].endswith("last.ckpt"), res
    assert [res["restart"] for res in resumes] == [1, 2, 3], resumes
    evals = [e["step"] for e in events("eval")]
    assert evals[-1] == EPOCHS * STEPS_PER_EPOCH, evals  # every epoch trained and validated
    assert not list((run_dir / "lightning").glob("hpc_ckpt_*.ckpt"))  # Lightning's own requeue stayed off
    status = cli(slurm_sandbox, "status", str(run_dir)).stdout
    assert re.search(r"restarts:\s+3\b", status), status
    assert re.search(r"last eval:\s+acc=0\.\d+", status), status
