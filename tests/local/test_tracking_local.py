"""Experiment trackers across requeues (``slurm_ddp.tracking``), against the real MLflow (a SQLite store in
the run directory) and W&B (offline mode) libraries, local backend, gloo on CPU.

- The task worker stopped by USR2, then killed with ``kill -9`` after a later checkpoint (with steps
  logged after it, trained again on the next start), then finished: one MLflow run whose ``loss``
  history has every logged step once, its last value the run's last logged loss; the three starts'
  W&B offline runs carry one run id.
- W&B, ``kill -9`` right after ``run.log`` returned (the row in W&B's buffers, not yet in its ``.wandb``
  file), then a stop, then a finish: the offline runs' history, read back from the ``.wandb`` files with
  wandb's protobuf ``Record``, holds every step once.
- A plain script calling ``mlflow.start_run()`` / ``wandb.init()`` with no arguments, started three
  times: one MLflow run, one W&B run id.
- A sweep of 4 elements: 4 tracker runs, grouped (MLflow parent run + tag; W&B group = the sweep's name).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from lib import require_module, wait_for, wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import latest_checkpoint_step, read_metrics
from slurm_ddp.tracking import wandb_history

mlflow = require_module("mlflow", "pip install 'slurm-ddp[mlflow]'")
require_module("wandb", "pip install 'slurm-ddp[wandb]'")
require_module("torch")

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
SCRIPT = Path(__file__).resolve().parent / "tracked_script.py"
TRACKER_START = Path(__file__).resolve().parent / "tracker_start.py"
TRACKING = ["tracking.mlflow.enabled=true", "tracking.wandb.enabled=true"]
SETS = [
    "train.max_steps=120",
    "train.log_every=1",
    "train.eval_every=40",
    "train.args.width=16",
    "checkpoint.every_steps=20",
    "train.snapshot=false",  # not the subject; the checkout may change while the test runs
    *TRACKING,
]


def submit(job: Path, run_dir: Path, sets: List[str], *extra: str) -> List[str]:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    return [*cmd, *extra]


def train_steps(run_dir: Path, since: int = 0) -> List[dict]:
    return [r for r in read_metrics(run_dir)[since:] if r.get("event") == "train"]


def start(run_dir: Path) -> subprocess.Popen:
    since = len(read_metrics(run_dir))
    proc = subprocess.Popen(submit(JOB, run_dir, SETS), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc.since = since
    return proc


def wait_step(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    def reached() -> bool:
        return max((r["step"] for r in train_steps(run_dir, proc.since)), default=0) >= step

    wait_process(proc, reached, 300, f"step {step}", lambda: proc.stderr.read()[-3000:])


def finish(proc: subprocess.Popen) -> int:
    try:
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


def stopped(pid: int) -> bool:
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in "tT":
            return False
    return True


def kill_after_a_later_checkpoint(run_dir: Path, after: int) -> int:
    """``kill -9`` the launcher (its ranks die with it) once a periodic checkpoint newer than ``after`` is
    committed and steps after it are logged; the ranks are frozen (SIGSTOP) while that is checked.
    Returns that checkpoint's step."""
    proc = start(run_dir)
    step = after + 1
    try:
        while True:
            wait_step(proc, run_dir, step)
            out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
            ranks = [int(p) for p in out.split()]
            for pid in ranks:
                os.kill(pid, signal.SIGSTOP)
            wait_for(lambda ranks=ranks: all(stopped(p) for p in ranks), 60, "the ranks to stop", interval_s=0.01)
            committed = latest_checkpoint_step(run_dir) or 0
            logged = max(r["step"] for r in train_steps(run_dir, proc.since))
            if committed > after and committed % 20 == 0 and logged > committed:
                os.kill(proc.pid, signal.SIGKILL)
                break
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
            step = logged + 1
    finally:
        returncode = finish(proc)
    assert returncode == -signal.SIGKILL, returncode
    return committed


def wandb_ids(run_dir: Path) -> List[str]:
    """The run id of each W&B offline run (one per start) in ``run_dir``, oldest first."""
    return [p.name.rsplit("-", 1)[1] for p in sorted((run_dir / "wandb").glob("offline-run-*"))]


def test_worker_stopped_killed_and_finished_is_one_tracker_run(tmp_path: Path) -> None:
    rd = tmp_path / "run"
    proc = start(rd)
    try:
        wait_step(proc, rd, 13)
        os.kill(proc.pid, signal.SIGUSR2)
    finally:
        assert finish(proc) == PREEMPTED_EXIT_CODE, proc.stderr.read()[-3000:]
    killed_at = kill_after_a_later_checkpoint(rd, latest_checkpoint_step(rd) or 0)
    r = subprocess.run(submit(JOB, rd, SETS), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]

    rows = train_steps(rd)
    redone = {s["step"] for s in rows if [x["step"] for x in rows].count(s["step"]) > 1}
    assert redone and min(redone) > killed_at, "kill -9 should have made steps after the checkpoint run twice"
    record = json.loads((rd / "tracking.json").read_text())
    client = mlflow.MlflowClient(record["mlflow"]["tracking_uri"])
    runs = client.search_runs([record["mlflow"]["experiment_id"]])
    assert [x.info.run_id for x in runs] == [record["mlflow"]["run_id"]]
    assert runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "loss")
    steps = [m.step for m in history]
    assert sorted(steps) == sorted(set(steps)) == sorted({x["step"] for x in rows}) == list(range(1, 121))
    last = max(history, key=lambda m: m.step)
    assert last.value == rows[-1]["loss"], (last.value, rows[-1])
    for m in history:  # the redone steps: the same (exact resume) values, logged once
        assert m.value == [x["loss"] for x in rows if x["step"] == m.step][-1]
    assert runs[0].data.tags["slurm_ddp.restarts"] == "2"  # the tags of the last start (local: a resubmit counts)
    ids = wandb_ids(rd)
    assert len(ids) == 3 and set(ids) == {record["wandb"]["run_id"]}, ids
    wandb_steps = [r["_step"] for r in wandb_history(rd, record["wandb"]["run_id"]) if "loss" in r]
    assert sorted(wandb_steps) == list(range(1, 121)), wandb_steps


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


def test_own_script_with_no_arguments_requeued_twice_is_one_tracker_run(tmp_path: Path) -> None:
    job, rd = own_job(tmp_path, "own"), tmp_path / "run"
    for expected in (PREEMPTED_EXIT_CODE, PREEMPTED_EXIT_CODE, 0):
        r = subprocess.run(submit(job, rd, []), capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert r.returncode == expected, r.stdout[-2000:] + r.stderr[-2000:]
    record = json.loads((rd / "tracking.json").read_text())
    starts = seen(rd)
    assert [s["start"] for s in starts] == [0, 1, 2]
    assert {s["mlflow"] for s in starts} == {record["mlflow"]["run_id"]}
    assert {s["wandb"] for s in starts} == {record["wandb"]["run_id"]}
    client = mlflow.MlflowClient(record["mlflow"]["tracking_uri"])
    runs = client.search_runs([record["mlflow"]["experiment_id"]])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "start")] == [0, 1, 2]
    assert wandb_ids(rd) == [record["wandb"]["run_id"]] * 3
    dry = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "sync", str(rd), "--dry-run"], capture_output=True, text=True, timeout=120
    )
    assert dry.returncode == 0, dry.stderr
    assert f"would sync W&B run {record['wandb']['run_id']}: 3 offline start(s)" in dry.stdout, dry.stdout


def test_sweep_of_four_elements_is_four_grouped_tracker_runs(tmp_path: Path) -> None:
    job, sd = own_job(tmp_path, "tsweep"), tmp_path / "sweep"
    sets = [f"train.command=python {SCRIPT} 0"]
    r = subprocess.run(
        submit(job, sd, sets, "--sweep", "train.seed=1,2,3,4"),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    parent = json.loads((sd / "tracking.json").read_text())["mlflow"]
    client = mlflow.MlflowClient(parent["tracking_uri"])
    runs = client.search_runs([parent["experiment_id"]])
    children = [x for x in runs if x.info.run_id != parent["run_id"]]
    assert len(runs) == 5 and len(children) == 4
    assert {x.data.tags.get("mlflow.parentRunId") for x in children} == {parent["run_id"]}
    assert {x.data.tags.get("slurm_ddp.sweep") for x in runs} == {"tsweep"}
    elements = sorted(p for p in sd.iterdir() if (p / "seen.jsonl").exists())
    assert len(elements) == 4
    views = [seen(e)[0] for e in elements]
    assert sorted(v["mlflow"] for v in views) == sorted(x.info.run_id for x in children)
    assert len({v["wandb"] for v in views}) == 4 and {v["group"] for v in views} == {"tsweep"}
    assert {v["project"] for v in views} == {"tsweep"}
