"""One real run of 3 starts — a SIGUSR2 stop, a ``kill -9`` of every rank some steps after a periodic
checkpoint, and a finish (2 gloo ranks, the digits example, local backend, MLflow and W&B on) — read by
two tests, so the suite trains it once (a module fixture; the tests share an xdist group):

- ``slurm-ddp report``: what it says is checked against the run directory's raw records: 3 starts ending
  preempted / killed / finished; ``redone_steps`` equal to the steps the killed start logged after the
  checkpoint the third start resumed from (±1); each start's phases adding up to its wall time (within 2 %);
  and a goodput in (0, 1) equal to a computation by hand from ``jobs.jsonl`` (the launches), ``ends.jsonl``
  (their ends) and ``metrics.jsonl`` (steps, evals, checkpoints, the stop).
- The trackers (``slurm_ddp.tracking``), against the real MLflow (a SQLite store in the run directory) and
  W&B (offline mode) libraries: one MLflow run whose ``loss`` history has every logged step once (the steps
  the kill made run twice included), its last value the run's last logged loss; the three starts' W&B
  offline runs carry one run id and hold every step once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, NamedTuple

import pytest
from lib import require_module, wait_for, wait_process
from lib.goodput import by_hand

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import latest_checkpoint_step, read_metrics
from slurm_ddp.tracking import wandb_history

# one worker runs both tests, so the module fixture trains the run once
pytestmark = [pytest.mark.local, pytest.mark.xdist_group("stop_kill_finish")]

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
EVERY = 20
SETS = [
    "train.max_steps=120",
    "train.log_every=1",  # every step's time is in metrics.jsonl: the redone steps are exact
    "train.eval_every=40",
    "train.args.width=16",
    f"checkpoint.every_steps={EVERY}",
    "checkpoint.keep_last=2",
    "train.snapshot=false",  # not the subject; the checkout may change while the test runs
    "tracking.mlflow.enabled=true",
    "tracking.wandb.enabled=true",
]


def submit(run_dir: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in SETS:
        cmd += ["--set", s]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc.since = len(read_metrics(run_dir))  # type: ignore[attr-defined]
    return proc


def max_step(run_dir: Path, since: int) -> int:
    return max((m["step"] for m in read_metrics(run_dir)[since:] if m.get("event") == "train"), default=0)


def wait_step(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    wait_process(proc, lambda: max_step(run_dir, proc.since) >= step, 300, f"step {step}", lambda: proc.stderr.read())


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
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "tT":
                return False
        except OSError:
            continue
    return True


def kill_every_rank_after_a_checkpoint(run_dir: Path, after: int) -> int:
    """Start a launch and, once a periodic checkpoint newer than step ``after`` is committed and at
    least 3 steps after it are logged, ``kill -9`` every rank (the local supervisor survives and records the
    end). The ranks are frozen (SIGSTOP) while the run directory is read, so no newer checkpoint is
    committed between the check and the kill. Returns that checkpoint's step."""
    proc = submit(run_dir)
    step = after + EVERY + 3
    try:
        while True:
            wait_step(proc, run_dir, step)
            out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout
            ranks = [int(p) for p in out.split()]
            assert len(ranks) == 2, ranks
            for pid in ranks:
                os.kill(pid, signal.SIGSTOP)
            wait_for(lambda ranks=ranks: all(stopped(p) for p in ranks), 60, "the ranks to stop", interval_s=0.01)
            committed, logged = latest_checkpoint_step(run_dir) or 0, max_step(run_dir, proc.since)
            if committed > after and committed % EVERY == 0 and logged >= committed + 3:
                for pid in ranks:
                    os.kill(pid, signal.SIGKILL)
                break
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
            step = logged + 1
    finally:
        status = finish(proc)
    assert status == 128 + 9, status  # a rank killed: the local supervisor's status is 137
    return committed


def report_json(run_dir: Path) -> Dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "report", str(run_dir), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


class ThreeStarts(NamedTuple):
    run_dir: Path
    first_stop: int  # the step the SIGUSR2 stop saved
    committed: int  # the checkpoint the killed start had committed (the third start resumes from it)


@pytest.fixture(scope="module")
def three_starts(tmp_path_factory: pytest.TempPathFactory) -> ThreeStarts:
    # the run is tracked by both (imported here, not at collection: seconds every xdist worker paid)
    require_module("mlflow", "pip install 'slurm-ddp[mlflow]'")
    require_module("wandb", "pip install 'slurm-ddp[wandb]'")
    run_dir = tmp_path_factory.mktemp("stop_kill_finish") / "run"
    proc = submit(run_dir)
    try:
        wait_step(proc, run_dir, 8)
        os.kill(proc.pid, signal.SIGUSR2)  # the local supervisor passes it on to the ranks, as srun does
    finally:
        assert finish(proc) == PREEMPTED_EXIT_CODE, proc.stderr.read()[-3000:]
    first_stop = int((run_dir / "PREEMPTED").read_text().split()[2])
    committed = kill_every_rank_after_a_checkpoint(run_dir, first_stop)
    proc = submit(run_dir)
    assert finish(proc) == 0, proc.stderr.read()[-3000:]
    return ThreeStarts(run_dir, first_stop, committed)


def test_report_of_a_stop_a_kill_and_a_finish(three_starts: ThreeStarts) -> None:
    run_dir, first_stop, committed = three_starts
    metrics = read_metrics(run_dir)
    resumed = [0] + [m["step"] for m in metrics if m["event"] == "resume"]
    assert resumed[1:] == [first_stop, committed], resumed
    # the killed start's steps: from its resume event to the next one
    cut = [i for i, m in enumerate(metrics) if m["event"] == "resume"]
    killed_last = max(m["step"] for m in metrics[cut[0] : cut[1]] if m["event"] == "train")

    rep = report_json(run_dir)
    starts = rep["starts"]
    assert [s["ended"] for s in starts] == ["preempted", "killed", "finished"], [s["reason"] for s in starts]
    assert abs(rep["redone_steps"] - (killed_last - committed)) <= 1, (rep["redone_steps"], killed_last, committed)
    assert starts[1]["redone_steps"] == rep["redone_steps"] and starts[1]["phases_s"]["train_redone"] > 0
    assert rep["restarts"] == 2 and rep["allocated_source"] == "run directory"
    for s in starts:
        total = sum(s["phases_s"].values())
        assert abs(total - s["wall_s"]) <= 0.02 * s["wall_s"], s
        assert s["phases_s"]["startup"] > 0 and s["phases_s"]["train_kept"] > 0, s
    assert starts[0]["phases_s"]["stop"] > 0 and starts[2]["phases_s"]["eval"] > 0
    assert 0 < rep["goodput"] < 1
    assert rep["goodput"] == pytest.approx(by_hand(run_dir, resumed), rel=0.01), rep
    assert rep["allocated_node_s"] == pytest.approx(sum(s["wall_s"] for s in starts), rel=1e-6)
    assert 1 <= len(rep["losses"]) <= 3 and all(loss["words"] for loss in rep["losses"])

    table = subprocess.run([sys.executable, "-m", "slurm_ddp", "report", str(run_dir)], capture_output=True, text=True)
    assert table.returncode == 0 and "goodput" in table.stdout and "killed" in table.stdout, table.stdout
    require_module("matplotlib", "slurm-ddp plot --timeline")
    png = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "plot", str(run_dir), "--timeline"], capture_output=True, text=True
    )
    assert png.returncode == 0, png.stderr
    assert (run_dir / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def wandb_ids(run_dir: Path) -> List[str]:
    """The run id of each W&B offline run (one per start) in ``run_dir``, oldest first."""
    return [p.name.rsplit("-", 1)[1] for p in sorted((run_dir / "wandb").glob("offline-run-*"))]


def test_worker_stopped_killed_and_finished_is_one_tracker_run(three_starts: ThreeStarts) -> None:
    rd = three_starts.run_dir
    rows = [m for m in read_metrics(rd) if m.get("event") == "train"]
    redone = {s["step"] for s in rows if [x["step"] for x in rows].count(s["step"]) > 1}
    assert redone and min(redone) > three_starts.committed, (
        "kill -9 should have made steps after the checkpoint run twice"
    )
    record = json.loads((rd / "tracking.json").read_text())
    mlflow = require_module("mlflow", "pip install 'slurm-ddp[mlflow]'")
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
