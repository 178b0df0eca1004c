"""The real-Slurm tier of experiment tracking (``slurm_ddp.tracking``, issue 22): the digits task worker
with MLflow (its default SQLite store in the run directory) and W&B (offline) on, stopped by USR2 at
the steps (it checkpoints and requeues itself), then finished by its second start. Read back with the
real libraries: one MLflow run whose ``loss`` history has every logged step once; one W&B run id for
both starts, its ``.wandb`` history every step once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lib import require_module, wait_for
from lib.slurm_jobs import submit_digits, train_steps

from slurm_ddp.rundir import read_metrics
from slurm_ddp.tracking import offline_runs, wandb_history

mlflow = require_module("mlflow", "pip install 'slurm-ddp[mlflow]'")
require_module("wandb", "pip install 'slurm-ddp[wandb]'")

pytestmark = pytest.mark.slurm


def test_worker_stopped_by_usr2_requeued_then_finished_is_one_tracker_run(slurm_sandbox, tmp_path: Path) -> None:
    job = submit_digits(
        slurm_sandbox,
        tmp_path / "run",
        "slurm.nodes=1",
        "slurm.tasks_per_node=2",
        "train.snapshot=false",
        "tracking.mlflow.enabled=true",
        "tracking.wandb.enabled=true",
    )
    job.wait_step(60)  # past the checkpoint at 50
    job.scancel("--signal=USR2")
    wait_for(lambda: job.restarts() >= 1, 120, "the job to requeue itself", job.diag)
    job.wait_finished(timeout_s=420)

    rows = [r for r in read_metrics(job.run_dir) if r.get("event") == "train"]
    steps = train_steps(job.run_dir)
    assert max(steps) == 200
    record = json.loads((job.run_dir / "tracking.json").read_text())
    client = mlflow.MlflowClient(record["mlflow"]["tracking_uri"])
    runs = client.search_runs([record["mlflow"]["experiment_id"]])
    assert [x.info.run_id for x in runs] == [record["mlflow"]["run_id"]]
    assert runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["slurm_ddp.job_id"] == job.id
    assert runs[0].data.tags["slurm_ddp.restarts"] == "1"
    history = client.get_metric_history(runs[0].info.run_id, "loss")
    logged = [m.step for m in history]
    assert sorted(logged) == sorted(set(logged)) == sorted(set(steps)), (logged, steps)
    assert max(history, key=lambda m: m.step).value == rows[-1]["loss"]

    starts = offline_runs(job.run_dir)
    assert len(starts) == 2, starts
    assert {p.name.rsplit("-", 1)[1] for p in starts} == {record["wandb"]["run_id"]}
    wandb_steps = [r["_step"] for r in wandb_history(job.run_dir, record["wandb"]["run_id"]) if "loss" in r]
    assert sorted(wandb_steps) == sorted(set(steps)), wandb_steps
