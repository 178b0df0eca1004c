"""``slurm_ddp.tracking`` without a job: the submit-time package check (one line, exit 2, the pip
command, nothing written), the variables an own script gets, the metrics of metrics.jsonl's rows, the
torch- and tracker-free import, and the no-step-twice rule against the real MLflow (a SQLite store)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ddp.cli import main
from slurm_ddp.config import config_from_dict
from slurm_ddp.rundir import TRACKING_NAME
from slurm_ddp.tracking import Tracker, _metrics_of, describe, prepare_run, rank_env

JOB = {
    "name": "tracked",
    "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
    "train": {"command": ["python", "train.py"]},
}


@pytest.mark.parametrize("section", ["mlflow", "wandb"])
def test_a_tracker_that_is_not_installed_fails_at_submit_with_the_pip_command(
    section: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, section, None)  # importlib.util.find_spec: not importable
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(JOB))
    before = sorted(p.name for p in tmp_path.iterdir())
    rc = main(["submit", str(job), "--backend", "local", "--set", f"tracking.{section}.enabled=true", "--dry-run"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "", (rc, out, err)
    assert err.count("\n") == 1 and f"pip install 'slurm-ddp[{section}]'" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_rank_env_gives_the_trackers_own_variables(tmp_path: Path) -> None:
    assert rank_env(tmp_path) == {}
    record = {
        "mlflow": {"tracking_uri": "sqlite:////x/mlflow.db", "experiment": "e", "experiment_id": "1", "run_id": "abc"},
        "wandb": {"run_id": "w1", "project": "p", "entity": "", "mode": "offline", "group": "g", "name": "g/000"},
    }
    (tmp_path / TRACKING_NAME).write_text(json.dumps(record))
    assert rank_env(tmp_path) == {
        "MLFLOW_TRACKING_URI": "sqlite:////x/mlflow.db",
        "MLFLOW_EXPERIMENT_NAME": "e",
        "MLFLOW_RUN_ID": "abc",
        "WANDB_RUN_ID": "w1",
        "WANDB_RESUME": "allow",
        "WANDB_DIR": str(tmp_path.resolve()),
        "WANDB_PROJECT": "p",
        "WANDB_MODE": "offline",
        "WANDB_RUN_GROUP": "g",
        "WANDB_NAME": "g/000",
    }
    assert describe(tmp_path) == ["mlflow run abc (experiment 'e', sqlite:////x/mlflow.db)", "wandb run p/w1 (offline)"]


def test_the_metrics_of_each_metrics_row() -> None:
    train = {"event": "train", "step": 5, "epoch": 0, "loss": 0.5, "steps_per_s": 3.0, "lr": 0.1, "time": 1.0}
    assert _metrics_of(train) == {"loss": 0.5, "lr": 0.1, "steps_per_s": 3.0, "epoch": 0.0}
    ev = {"event": "eval", "step": 5, "loss": 0.5, "eval_accuracy": 0.9, "eval_samples": 360, "time": 1.0}
    assert _metrics_of(ev) == {"eval_accuracy": 0.9, "eval_samples": 360.0}  # the repeated train loss left out
    ck = {"event": "checkpoint", "step": 5, "reason": "periodic", "blocked_s": 0.02, "background": True}
    assert _metrics_of(ck) == {"checkpoint_blocked_s": 0.02}
    assert _metrics_of({"event": "resume", "step": 5, "restart": 1}) == {}


def test_import_slurm_ddp_needs_no_tracker_and_no_torch() -> None:
    code = (
        "import sys, slurm_ddp, slurm_ddp.tracking, slurm_ddp.cli, slurm_ddp.launch, slurm_ddp.backends\n"
        "bad = {'mlflow', 'wandb', 'torch'} & set(sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_resume_from_an_older_checkpoint_logs_no_step_twice(tmp_path: Path) -> None:
    """Steps 1..6 logged, then a start that resumed at step 3 logs 4..9: MLflow holds 1..9, each once."""
    mlflow = pytest.importorskip("mlflow")
    cfg = config_from_dict({**JOB, "tracking": {"mlflow": {"enabled": True}}})
    record = prepare_run(cfg, tmp_path)
    assert prepare_run(cfg, tmp_path) == record  # a resubmit keeps the run
    for first, last, restart in ((1, 6, 0), (4, 9, 1)):
        tracker = Tracker.open(tmp_path, cfg, job_id="7", restart=restart, host="n1")
        assert tracker is not None
        for step in range(first, last + 1):
            tracker.log({"event": "train", "step": step, "loss": float(step), "lr": 0.1, "time": 0.0})
        if last == 9:
            tracker.log({"event": "finished", "step": last})
        tracker.close()
    client = mlflow.MlflowClient(record["mlflow"]["tracking_uri"])
    history = client.get_metric_history(record["mlflow"]["run_id"], "loss")
    assert sorted(m.step for m in history) == list(range(1, 10))
    run = client.get_run(record["mlflow"]["run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["slurm_ddp.restarts"] == "1"
    assert len(client.search_runs([record["mlflow"]["experiment_id"]])) == 1


def test_turning_a_tracker_on_keeps_the_run_directorys_hashes() -> None:
    """A run directory resubmitted with tracking on resumes (same hashes) instead of being refused."""
    off = config_from_dict(JOB)
    on = config_from_dict({**JOB, "tracking": {"wandb": {"enabled": True, "project": "p"}}})
    assert on.config_hash() == off.config_hash() and on.training_hash() == off.training_hash()
