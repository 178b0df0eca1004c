"""A ``train.command`` script that saves and exits 0 on SIGTERM, on the local backend (issue 33).

Covers: Ctrl-C stops both ranks (they exit 0 from their handlers) and the run is NOT finished:
``submit`` exits 75 and the next ``submit`` resumes every rank from its save and finishes, and
``status`` counts that restart; ``$SLURM_DDP_RUN_DIR`` in ``train.command`` reaches the script
expanded; a stop signal that reaches the ranks after the script stated the run finished
(``preemption.mark_finished``) ends the local supervisor with 0, not 143.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from lib import wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished, read_rank_stops

pytestmark = pytest.mark.local

TASK = Path(__file__).resolve().parent / "graceful_task.py"


def write_job(tmp_path: Path, args: str) -> Path:
    shutil.copy(TASK, tmp_path / TASK.name)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: graceful\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
        f"train: {{command: 'python {TASK.name} --state-dir $SLURM_DDP_RUN_DIR/state {args}'}}\n"
    )
    return job


def submit(job: Path, run_dir: Path) -> List[str]:
    return [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]


def rank_log(run_dir: Path, rank: int) -> str:
    p = run_dir / "logs" / f"rank-{rank}.log"
    return p.read_text() if p.exists() else ""


def start_and_wait_for(job: Path, run_dir: Path, line: str) -> subprocess.Popen:
    proc = subprocess.Popen(submit(job, run_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_process(
        proc,
        lambda: all(line in rank_log(run_dir, r) for r in (0, 1)),
        120,
        f"both ranks to print {line!r}",
        lambda: rank_log(run_dir, 0) + rank_log(run_dir, 1),
    )
    return proc


def test_ctrl_c_with_a_graceful_exit_is_a_stop_and_the_next_submit_resumes(tmp_path: Path) -> None:
    job, run_dir = write_job(tmp_path, "--epochs 4 --wait-at 2"), tmp_path / "run"
    proc = start_and_wait_for(job, run_dir, "waiting at epoch 2")
    proc.send_signal(signal.SIGINT)  # Ctrl-C: the local supervisor asks the ranks to stop (SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == PREEMPTED_EXIT_CODE, out + err
    assert "the ranks were told to stop (SIGTERM) and exited with status 0" in err, err
    assert read_finished(run_dir) is None, "a stopped run was marked finished"
    for rank in (0, 1):
        assert f"[rank {rank}] got SIGTERM at epoch 2: saved, exiting 0" in rank_log(run_dir, rank)
    job_id = json.loads((run_dir / "jobs.jsonl").read_text().splitlines()[0])["job_id"]
    assert read_rank_stops(run_dir, job_id, 0).signals == ("SIGTERM",)

    again = subprocess.run(submit(job, run_dir), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_finished(run_dir) is not None
    for rank in (0, 1):
        text = rank_log(run_dir, rank)
        # $SLURM_DDP_RUN_DIR in train.command reached the script expanded
        assert f"[rank {rank}] start 2 at epoch 2; state dir {run_dir.resolve()}/state" in text, text
        assert f"[rank {rank}] done: 4 epochs" in text, text
        assert json.loads((run_dir / "state" / f"rank-{rank}.json").read_text())["epoch"] == 4
    status = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert re.search(r"restarts:\s+1\n", status.stdout), status.stdout  # counted from the run's starts


def test_a_stop_signal_after_the_script_said_finished_is_success(tmp_path: Path) -> None:
    job, run_dir = write_job(tmp_path, "--epochs 2 --mark-finished"), tmp_path / "run"
    proc = start_and_wait_for(job, run_dir, "finished; waiting for a late signal")
    assert read_finished(run_dir) is not None
    proc.send_signal(signal.SIGINT)  # the ranks die of the SIGTERM (default action) after FINISHED
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "came from a stop signal that arrived after the run finished" in err, err


def test_an_undefined_variable_in_train_command_is_one_line_on_the_rank(tmp_path: Path) -> None:
    shutil.copy(TASK, tmp_path / TASK.name)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: graceful\nslurm: {nodes: 1, tasks_per_node: 2}\n"
        f"train: {{command: 'python {TASK.name} --state-dir $NO_SUCH_VARIABLE_H33/state'}}\n"
    )
    r = subprocess.run(submit(job, tmp_path / "run"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    text = rank_log(tmp_path / "run", 0)
    assert "slurm_ddp launch: error: train.command word" in text and "$NO_SUCH_VARIABLE_H33" in text, text
    assert "Traceback" not in text, text
