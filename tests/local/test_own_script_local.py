"""``train.command`` on the local backend: examples/own_script with 2 gloo ranks, as the README runs it.

Covers: the plain script finishes every epoch on both ranks (FINISHED written by the launcher,
``runs``/``status`` report it); the preemption-API variant, given SIGUSR2 at the ``submit``
process, stops every rank after the same step with status 75 and a second ``submit`` resumes
mid-epoch and finishes; a crashing script ends with its status and no FINISHED.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from lib import wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own_script"


def submit_cmd(job: str, run_dir: Path, *sets: str) -> list:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(EXAMPLE / job), "--backend", "local"]
    cmd += ["--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def rank_log(run_dir: Path, rank: int) -> str:
    p = run_dir / "logs" / f"rank-{rank}.log"
    return p.read_text() if p.exists() else ""


def test_plain_script_two_ranks_finishes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = subprocess.run(
        submit_cmd("job.yaml", run_dir, "train.command=python train.py --epochs 3"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every rank of train.command exited with status 0" in r.stdout
    rec = read_finished(run_dir)
    assert rec is not None and rec["command"] is True, rec
    for rank in (0, 1):
        text = rank_log(run_dir, rank)
        assert f"[rank {rank}] done: 3 epochs" in text and f"local_rank {rank} of world 2" in text, text
    assert (run_dir / "snapshot.pt").exists()  # the script's own snapshot, in $SLURM_DDP_RUN_DIR
    status = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert "finished:   yes, every rank of train.command exited with status 0" in status.stdout, status.stdout
    assert re.search(r"step:\s+96\n", status.stdout), status.stdout  # from the script's metrics.jsonl (3 × 32)
    again = subprocess.run(
        submit_cmd("job.yaml", run_dir, "train.command=python train.py --epochs 3"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "already finished" in again.stderr, again.stderr


def test_api_variant_stops_every_rank_with_status_75_then_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = ("train.command=python train_preemptible.py --epochs 2 --sleep 6",)
    proc = subprocess.Popen(
        submit_cmd("job_preemptible.yaml", run_dir, *sets), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_process(proc, lambda: "epoch 0 loss" in rank_log(run_dir, 0), 240, "epoch 0", lambda: proc.stdout.read())
        proc.send_signal(signal.SIGUSR2)  # the local launcher forwards it to every rank, as srun does
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The launcher returns 75 only when no rank failed (any status but 0/75 is a failure).
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    stops = [re.findall(r"stopping for preemption after epoch (\d+) batch (\d+)", rank_log(run_dir, r)) for r in (0, 1)]
    assert len(stops[0]) == 1 and stops[0] == stops[1], stops
    assert (run_dir / "PREEMPTED").read_text().split()[3] == "SIGUSR2"
    assert read_finished(run_dir) is None

    r = subprocess.run(submit_cmd("job_preemptible.yaml", run_dir, *sets), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    epoch, batch = stops[0][0]
    for rank in (0, 1):
        text = rank_log(run_dir, rank)
        assert f"at epoch {epoch} batch {batch}" in text and f"[rank {rank}] done: 2 epochs" in text, text


def test_a_crashing_script_fails_without_finishing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = subprocess.run(
        submit_cmd("job.yaml", run_dir, "train.command=[python, -c, 'raise SystemExit(3)']"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "job failed with status 3" in r.stderr
    assert read_finished(run_dir) is None
