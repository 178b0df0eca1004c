"""The real-Slurm tier of experiment tracking (``slurm_ddp.tracking``, issue 22) and of the goodput report
(``slurm-ddp report``, issue 23): the digits task worker with MLflow (its default SQLite store in the run
directory) and W&B (offline) on — stopped by USR2 at the steps (it checkpoints and requeues itself), then
its ranks all killed with ``kill -9`` some steps after a later periodic checkpoint (the job fails: a crash
is not requeued), then submitted again and finished. Read back with the real libraries: one MLflow run
whose ``loss`` history has every step once (the steps the kill made run twice included); one W&B run id
for the three starts, its ``.wandb`` history every step once. The report: 3 starts (preempted, killed,
finished), the redone steps, phases adding up to each start's wall time, goodput as computed by hand."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import List

import pytest
from lib import require_module, wait_for
from lib.goodput import by_hand
from lib.slurm_jobs import submit_digits

from slurm_ddp.rundir import latest_checkpoint_step, read_metrics
from slurm_ddp.tracking import offline_runs, wandb_history

mlflow = require_module("mlflow", "pip install 'slurm-ddp[mlflow]'")
require_module("wandb", "pip install 'slurm-ddp[wandb]'")

pytestmark = pytest.mark.slurm

EVERY = 20
MAX_STEPS = 120
SETS = (
    "slurm.nodes=1",
    "slurm.tasks_per_node=2",
    "train.snapshot=false",
    f"train.max_steps={MAX_STEPS}",  # the stop at ~10 and the kill at ~40 leave 80 steps for the last start
    "train.log_every=1",  # every step's time in metrics.jsonl: the redone steps are exact
    f"checkpoint.every_steps={EVERY}",
    "tracking.mlflow.enabled=true",
    "tracking.wandb.enabled=true",
)


def ranks_of(run_dir: Path) -> List[int]:
    """The pids of the task worker's ranks of ``run_dir`` (the sandbox's nodes are this machine's
    processes): an interpreter running ``-m slurm_ddp.worker`` (not srun's or the rank wrapper's
    command line, which name it too) with ``SLURM_DDP_RUN_DIR`` naming the run."""
    want = b"SLURM_DDP_RUN_DIR=" + os.fsencode(run_dir)
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if b"-m" not in argv or argv[argv.index(b"-m") + 1 :][:1] != [b"slurm_ddp.worker"]:
                continue
            if want in (proc / "environ").read_bytes().split(b"\0"):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


def stopped(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) in "tT"
    except OSError:
        return True


def steps_since(run_dir: Path, t0: float) -> List[int]:
    return [m["step"] for m in read_metrics(run_dir) if m.get("event") == "train" and m["time"] >= t0]


def kill_every_rank_after_a_checkpoint(run_dir: Path, after: int, t0: float) -> int:
    """Once a periodic checkpoint newer than step ``after`` is committed and at least 3 steps after it
    are logged, ``kill -9`` every rank; the ranks are frozen (SIGSTOP) while that is checked, so no newer
    checkpoint lands in between. Returns that checkpoint's step."""
    step = after + EVERY + 3
    while True:
        wait_for(lambda step=step: max(steps_since(run_dir, t0), default=0) >= step, 180, f"step {step}")
        ranks = wait_for(lambda: (lambda r: r if len(r) == 2 else None)(ranks_of(run_dir)), 60, "the 2 ranks")
        for pid in ranks:
            os.kill(pid, signal.SIGSTOP)
        wait_for(lambda ranks=ranks: all(stopped(p) for p in ranks), 60, "the ranks to stop", interval_s=0.01)
        committed, logged = latest_checkpoint_step(run_dir) or 0, max(steps_since(run_dir, t0))
        if committed > after and committed % EVERY == 0 and logged >= committed + 3:
            for pid in ranks:
                os.kill(pid, signal.SIGKILL)
            return committed
        for pid in ranks:
            os.kill(pid, signal.SIGCONT)
        step = logged + 1


def test_worker_stopped_killed_and_finished_is_one_tracker_run_and_its_report(slurm_sandbox, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    job = submit_digits(slurm_sandbox, run_dir, *SETS)
    job.wait_step(10)
    job.scancel("--signal=USR2")
    wait_for(lambda: job.restarts() >= 1, 120, "the job to requeue itself", job.diag)
    wait_for(lambda: "resume" in [m["event"] for m in read_metrics(run_dir)], 180, "the requeued start", job.diag)
    first_stop = [m["step"] for m in read_metrics(run_dir) if m["event"] == "resume"][0]
    t0 = [m["time"] for m in read_metrics(run_dir) if m["event"] == "resume"][0]
    committed = kill_every_rank_after_a_checkpoint(run_dir, first_stop, t0)
    assert job.wait_ended(timeout_s=180) == "FAILED", job.diag()  # a crash on a healthy node: not requeued
    again = submit_digits(slurm_sandbox, run_dir, *SETS)
    assert again.id != job.id
    again.wait_finished(timeout_s=420)

    metrics = read_metrics(run_dir)
    rows = [m for m in metrics if m.get("event") == "train"]
    resumed = [0] + [m["step"] for m in metrics if m["event"] == "resume"]
    assert resumed[1:] == [first_stop, committed], resumed
    redone = {s["step"] for s in rows if [x["step"] for x in rows].count(s["step"]) > 1}
    assert redone and min(redone) > committed, "kill -9 should have made steps after the checkpoint run twice"

    # the trackers: one run for the three starts
    record = json.loads((run_dir / "tracking.json").read_text())
    client = mlflow.MlflowClient(record["mlflow"]["tracking_uri"])
    runs = client.search_runs([record["mlflow"]["experiment_id"]])
    assert [x.info.run_id for x in runs] == [record["mlflow"]["run_id"]]
    assert runs[0].info.status == "FINISHED"
    assert runs[0].data.tags["slurm_ddp.job_id"] == again.id
    history = client.get_metric_history(runs[0].info.run_id, "loss")
    logged = [m.step for m in history]
    assert sorted(logged) == sorted(set(logged)) == list(range(1, MAX_STEPS + 1)), logged
    assert max(history, key=lambda m: m.step).value == rows[-1]["loss"]
    for m in history:  # the redone steps: the same (exact resume) values, logged once
        assert m.value == [x["loss"] for x in rows if x["step"] == m.step][-1]
    starts = offline_runs(run_dir)
    assert len(starts) == 3, starts
    assert {p.name.rsplit("-", 1)[1] for p in starts} == {record["wandb"]["run_id"]}
    wandb_steps = [r["_step"] for r in wandb_history(run_dir, record["wandb"]["run_id"]) if "loss" in r]
    assert sorted(wandb_steps) == list(range(1, MAX_STEPS + 1)), wandb_steps

    # the report of the same three starts
    r = slurm_sandbox.run(
        [sys.executable, "-m", "slurm_ddp", "report", str(run_dir), "--json"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    cut = [i for i, m in enumerate(metrics) if m["event"] == "resume"]
    killed_last = max(m["step"] for m in metrics[cut[0] : cut[1]] if m["event"] == "train")
    assert [s["ended"] for s in rep["starts"]] == ["preempted", "killed", "finished"], [
        s["reason"] for s in rep["starts"]
    ]
    assert abs(rep["redone_steps"] - (killed_last - committed)) <= 1, (rep["redone_steps"], killed_last, committed)
    for s in rep["starts"]:
        assert sum(s["phases_s"].values()) == pytest.approx(s["wall_s"], rel=0.02), s
        assert s["phases_s"]["startup"] > 0 and s["phases_s"]["train_kept"] > 0, s
    assert 0 < rep["goodput"] < 1
    launches = [s["time"] for s in json.loads((run_dir / "provenance.json").read_text())["starts"]]
    assert len(launches) == 3, launches
    assert rep["goodput"] == pytest.approx(by_hand(run_dir, resumed, launches), rel=0.01), rep
