"""Experiment trackers across requeues (``slurm_ddp.tracking``), against the real MLflow (a SQLite store in
the run directory) and W&B (offline mode) libraries, local backend, gloo on CPU.

- The task worker stopped by USR2, then killed with ``kill -9``, then finished: one MLflow run, one W&B
  run id (tests/local/test_stop_kill_finish_local.py, which shares that run with the report's test).
- W&B, ``kill -9`` right after ``run.log`` returned (the row in W&B's buffers, not yet in its ``.wandb``
  file), then a stop, then a finish: the offline runs' history, read back from the ``.wandb`` files with
  wandb's protobuf ``Record``, holds every step once.
- A plain script calling ``mlflow.start_run()`` / ``wandb.init()`` with no arguments, started twice (a
  stop, then a finish): one MLflow run, one W&B run id. (A third start re-read the same ``tracking.json``
  as the second and showed nothing more; the 3-start stop/kill/finish runs are in
  tests/local/test_stop_kill_finish_local.py and tests/slurm/test_tracking_slurm.py.)
- A sweep of 2 elements: 2 tracker runs, grouped (MLflow parent run + tag; W&B group = the sweep's name); two
  elements show the grouping and that each element has its own run as well as four did, at half the starts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, List

import pytest
from lib import require_module

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.tracking import wandb_history


def _mlflow() -> Any:
    return require_module("mlflow", "pip install 'slurm-ddp[mlflow]'")


@pytest.fixture(autouse=True)
def _trackers_installed() -> None:
    """Both trackers' clients (and torch), imported when a test runs, not at collection (seconds every xdist
    worker paid)."""
    _mlflow()
    require_module("wandb", "pip install 'slurm-ddp[wandb]'")
    require_module("torch")


pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "tracked_script.py"
TRACKER_START = Path(__file__).resolve().parent / "tracker_start.py"


def submit(job: Path, run_dir: Path, sets: List[str], *extra: str) -> List[str]:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    return [*cmd, *extra]


def wandb_ids(run_dir: Path) -> List[str]:
    """The run id of each W&B offline run (one per start) in ``run_dir``, oldest first."""
    return [p.name.rsplit("-", 1)[1] for p in sorted((run_dir / "wandb").glob("offline-run-*"))]


def test_wandb_killed_right_after_run_log_holds_every_step_once(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    env = {**os.environ, "WANDB_SILENT": "true", "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}

    def start(first: int, last: int, kill_at: int, finish: int) -> int:
        argv = [sys.executable, str(TRACKER_START), str(rd), str(first), str(last), str(kill_at), str(finish)]
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode in (0, -signal.SIGKILL), r.stderr[-3000:]
        return r.returncode

    # killed inside the window: step 25's row handed to W&B, checkpoint 20 the last
    assert start(1, 30, 25, 0) == -signal.SIGKILL
    assert start(21, 35, 0, 0) == 0  # resumed from 20; stopped at 35 (its rows after checkpoint 30 in W&B)
    assert start(31, 40, 0, 1) == 0  # resumed from 30: 31..35 are already in W&B
    run_id = json.loads((rd / "tracking.json").read_text())["wandb"]["run_id"]
    assert wandb_ids(rd) == [run_id] * 3
    history = [r for r in wandb_history(rd, run_id) if "loss" in r]
    assert sorted(r["_step"] for r in history) == list(range(1, 41)), [r["_step"] for r in history]
    assert all(r["loss"] == 1.0 / r["_step"] for r in history)


def own_job(tmp_path: Path, name: str) -> Path:
    job = tmp_path / f"{name}.yaml"
    job.write_text(
        f"name: {name}\n"
        "slurm: {nodes: 1, tasks_per_node: 1, time: '00:10:00'}\n"
        f"train: {{command: python {SCRIPT}, snapshot: false}}\n"
        "tracking: {mlflow: {enabled: true}, wandb: {enabled: true}}\n"
    )
    return job


def seen(run_dir: Path) -> List[dict]:
    return [json.loads(line) for line in (run_dir / "seen.jsonl").read_text().splitlines()]


def test_own_script_with_no_arguments_requeued_is_one_tracker_run(tmp_path: Path) -> None:
    job, rd = own_job(tmp_path, "own"), tmp_path / "run"
    sets = [f"train.command=python {SCRIPT} 1"]  # stopped (75) on its first start, finished on its second
    for expected in (PREEMPTED_EXIT_CODE, 0):
        r = subprocess.run(submit(job, rd, sets), capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert r.returncode == expected, r.stdout[-2000:] + r.stderr[-2000:]
    record = json.loads((rd / "tracking.json").read_text())
    starts = seen(rd)
    assert [s["start"] for s in starts] == [0, 1]
    assert {s["mlflow"] for s in starts} == {record["mlflow"]["run_id"]}
    assert {s["wandb"] for s in starts} == {record["wandb"]["run_id"]}
    client = _mlflow().MlflowClient(record["mlflow"]["tracking_uri"])
    runs = client.search_runs([record["mlflow"]["experiment_id"]])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "start")] == [0, 1]
    assert wandb_ids(rd) == [record["wandb"]["run_id"]] * 2
    dry = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "sync", str(rd), "--dry-run"], capture_output=True, text=True, timeout=120
    )
    assert dry.returncode == 0, dry.stderr
    assert f"would sync W&B run {record['wandb']['run_id']}: 2 offline start(s)" in dry.stdout, dry.stdout


def test_sweep_of_two_elements_is_two_grouped_tracker_runs(tmp_path: Path) -> None:
    job, sd = own_job(tmp_path, "tsweep"), tmp_path / "sweep"
    sets = [f"train.command=python {SCRIPT} 0"]
    r = subprocess.run(
        submit(job, sd, sets, "--sweep", "train.args.seed=1,2"),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    parent = json.loads((sd / "tracking.json").read_text())["mlflow"]
    client = _mlflow().MlflowClient(parent["tracking_uri"])
    runs = client.search_runs([parent["experiment_id"]])
    children = [x for x in runs if x.info.run_id != parent["run_id"]]
    assert len(runs) == 3 and len(children) == 2
    assert {x.data.tags.get("mlflow.parentRunId") for x in children} == {parent["run_id"]}
    assert {x.data.tags.get("slurm_ddp.sweep") for x in runs} == {"tsweep"}
    elements = sorted(p for p in sd.iterdir() if (p / "seen.jsonl").exists())
    assert len(elements) == 2
    views = [seen(e)[0] for e in elements]
    assert sorted(v["mlflow"] for v in views) == sorted(x.info.run_id for x in children)
    assert len({v["wandb"] for v in views}) == 2 and {v["group"] for v in views} == {"tsweep"}
    assert {v["project"] for v in views} == {"tsweep"}
