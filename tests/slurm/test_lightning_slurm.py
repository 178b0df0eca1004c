"""The real-Slurm tier for the PyTorch Lightning example (``examples/lightning``, ``SlurmDDPCallback``).

2 nodes × 1 rank under srun (Lightning's ``SLURMEnvironment``, auto-requeue off by ``cluster_plugins``),
stopped in the second epoch in each of three ways:

* ``scancel --signal=USR2 JOBID`` (the requeue signal, to the ranks only): the job requeues itself;
* ``slurm-ddp cancel`` (SIGTERM, which Lightning alone would turn into exit 0 and a FINISHED run),
  then ``slurm-ddp requeue``;
* a partition preemption (SIGTERM; Slurm requeues the job itself).

Each time both ranks stop at one optimizer step with ``last.ckpt``, the run is not finished, the next
start resumes from that step and trains every epoch, and ``status`` shows the restart.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from lib import require_module, wait_for
from lib.slurm_jobs import cli

from slurm_ddp.rundir import read_finished, read_metrics

pytestmark = pytest.mark.slurm

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning"
EPOCHS = 3
STEPS_PER_EPOCH = 23  # 1,437 training images over 2 ranks, batch 32 per rank


@pytest.mark.parametrize("stop", ["usr2-to-ranks", "cancel-then-requeue", "partition-preemption"])
def test_a_stopped_lightning_run_is_never_finished_early_and_resumes_from_last_ckpt(
    slurm_sandbox: Any, tmp_path: Path, stop: str
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
    sets = ["--set", "slurm.partition=debug"] if stop == "partition-preemption" else []
    r = cli(slurm_sandbox, "submit", str(job), "--run-dir", str(run_dir), *sets)
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

    def steps() -> list:
        return [int(e["step"]) for e in read_metrics(run_dir) if e.get("event") == "train"]

    wait_for(lambda: any(s > STEPS_PER_EPOCH for s in steps()), 300, "a train event of the second epoch", why)
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
    wait_for(lambda: read_finished(run_dir) is not None, 400, "the run to finish after its requeue", why)
    wait_for(lambda: state() == "COMPLETED", 60, f"job {job_id} to complete", why)
    events = read_metrics(run_dir)
    (preempted,) = [e for e in events if e.get("event") == "preempted"]
    (resume,) = [e for e in events if e.get("event") == "resume"]
    assert resume["step"] == preempted["step"] > STEPS_PER_EPOCH and resume["restart"] == 1, events
    assert resume["checkpoint"].endswith("last.ckpt"), resume
    evals = [e["step"] for e in events if e.get("event") == "eval"]
    assert evals[-1] == EPOCHS * STEPS_PER_EPOCH, events  # every epoch trained and validated
    assert not list((run_dir / "lightning").glob("hpc_ckpt_*.ckpt"))  # Lightning's own requeue stayed off
    status = cli(slurm_sandbox, "status", str(run_dir)).stdout
    assert re.search(r"restarts:\s+1\b", status), status
    assert re.search(r"last eval:\s+acc=0\.\d+", status), status
