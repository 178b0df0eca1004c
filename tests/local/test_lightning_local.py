"""The PyTorch Lightning example (``examples/lightning``, ``slurm_ddp.lightning.SlurmDDPCallback``) on the
local backend: 2 gloo ranks on CPU.

Covers: the requeue signal (SIGUSR2 to the local supervisor, which forwards it to the ranks as srun does)
stops both ranks after the same optimizer step with ``last.ckpt`` written by Lightning, ``submit`` exits
75 and the run is not finished; the next ``submit`` resumes from that step and trains every epoch;
``status`` shows the step, the eval accuracy and ``restarts: 1``; ``slurm-ddp plot`` draws the run.
Ctrl-C (SIGINT to the local supervisor: SIGTERM to the ranks) is a stop too, never ``FINISHED``, and resumes.
Both stops are made to one run, an epoch apart (each start of a Lightning rank costs ~7 CPU-s of imports).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from lib import require_module, wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished, read_metrics, read_preempted

pytestmark = pytest.mark.local

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "lightning"
EPOCHS = 4
STEPS_PER_EPOCH = 23  # 1,437 training images over 2 ranks, batch 32 per rank


def write_job(tmp_path: Path) -> Path:
    require_module("lightning", "the Lightning example")
    shutil.copy(EXAMPLE / "train.py", tmp_path / "train.py")
    job = tmp_path / "job.yaml"
    job.write_text((EXAMPLE / "job.yaml").read_text().replace("--epochs 10", f"--epochs {EPOCHS} --step-sleep 0.05"))
    assert f"--epochs {EPOCHS}" in job.read_text()
    return job


def submit(job: Path, run_dir: Path) -> List[str]:
    return [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]


def train_steps(run_dir: Path) -> List[int]:
    return [int(m["step"]) for m in read_metrics(run_dir) if m.get("event") == "train"]


def stop_mid_run(job: Path, run_dir: Path, sig: int, epoch: int = 2) -> str:
    """Start (or resume) the example, send ``sig`` to the local supervisor once it logged a step of epoch ``epoch``
    (1-based), and return the local supervisor's stderr; it must exit 75 (preempted) with the run unfinished."""
    proc = subprocess.Popen(submit(job, run_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_process(
            proc,
            lambda: any(s > (epoch - 1) * STEPS_PER_EPOCH for s in train_steps(run_dir)),
            300,
            f"a train event of epoch {epoch} in metrics.jsonl",
        )
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == PREEMPTED_EXIT_CODE, out + err
    assert read_finished(run_dir) is None, "a stopped run was marked finished"
    assert (run_dir / "lightning" / "last.ckpt").is_file()
    return err


def resume_and_finish(job: Path, run_dir: Path) -> List[int]:
    """Submit again: it must resume from last.ckpt and train every epoch; returns the resumed steps."""
    again = subprocess.run(submit(job, run_dir), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert read_finished(run_dir) is not None
    resumes = [m for m in read_metrics(run_dir) if m.get("event") == "resume"]
    assert all(m["checkpoint"].endswith("last.ckpt") for m in resumes), resumes
    assert f"done: {EPOCHS} epochs, step {EPOCHS * STEPS_PER_EPOCH}" in again.stdout + again.stderr
    return [int(m["step"]) for m in resumes]


def test_requeue_signal_then_ctrl_c_stop_at_a_step_and_the_next_submit_resumes_from_last_ckpt(tmp_path: Path) -> None:
    job, run_dir = write_job(tmp_path), tmp_path / "run"
    # the requeue signal in epoch 2
    stop_mid_run(job, run_dir, signal.SIGUSR2, epoch=2)
    marker = read_preempted(run_dir)
    assert marker is not None and marker.signal == "SIGUSR2", marker
    events = read_metrics(run_dir)
    (preempted,) = [m for m in events if m.get("event") == "preempted"]
    stop_step = preempted["step"]
    assert marker.step == stop_step and STEPS_PER_EPOCH < stop_step < EPOCHS * STEPS_PER_EPOCH, events
    assert {"event": "checkpoint", "step": stop_step, "reason": "preemption"}.items() <= events[-2].items()

    # the next submit resumes; Ctrl-C in epoch 3 (the local supervisor sends SIGTERM to the ranks) is a stop too
    stop_mid_run(job, run_dir, signal.SIGINT, epoch=3)
    marker = read_preempted(run_dir)
    assert marker is not None and marker.signal == "SIGTERM", marker
    assert 2 * STEPS_PER_EPOCH < marker.step < EPOCHS * STEPS_PER_EPOCH, marker

    # each resume from its stop's step, not the epoch's start
    assert resume_and_finish(job, run_dir) == [stop_step, marker.step]
    status = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert status.returncode == 0, status.stdout + status.stderr
    assert re.search(rf"step:\s+{EPOCHS * STEPS_PER_EPOCH}\n", status.stdout), status.stdout
    assert f"restarts:   2 (resumed at step {stop_step}, {marker.step})\n" in status.stdout, status.stdout
    assert re.search(r"last eval:\s+acc=0\.\d+ at step", status.stdout), status.stdout

    require_module("matplotlib", "slurm-ddp plot")
    png = tmp_path / "run.png"
    plot = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "plot", str(run_dir), "-o", str(png)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plot.returncode == 0, plot.stdout + plot.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_hung_lightning_rank_is_caught_by_the_watchdog(tmp_path: Path) -> None:
    """Rank 1 blocks in its dataset in the first epoch: the watchdog (10 s allowance) names it, in data
    loading, with its stack at the blocking line in its log, and every process of the run ends."""
    require_module("lightning", "the Lightning example")
    hang_script = Path(__file__).resolve().parent / "lightning_hang_train.py"
    shutil.copy(EXAMPLE / "train.py", tmp_path / "train.py")
    shutil.copy(hang_script, tmp_path / hang_script.name)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: lightning-hang\n"
        "slurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
        f"train: {{command: 'python {hang_script.name} --hang-rank 1 --hang-after 160 --epochs 2'}}\n"
        "watchdog: {timeout_floor_s: 10, step_time_factor: 2, poll_interval_s: 0.2}\n"
    )
    run_dir = tmp_path / "run"
    r = subprocess.run(submit(job, run_dir), capture_output=True, text=True, timeout=600)
    assert r.returncode not in (0, PREEMPTED_EXIT_CODE), r.stdout + r.stderr
    line = [ln for ln in r.stderr.splitlines() if "hang:" in ln]
    assert line and re.search(r"rank 1 on local0 stopped progressing at step \d+ in data loading", line[0]), r.stderr
    rank1 = (run_dir / "logs" / "rank-1.log").read_text()
    blocking = next(i for i, t in enumerate(hang_script.read_text().splitlines(), 1) if "HANG-HERE" in t)
    assert f'{hang_script.name}", line {blocking} in __getitem__' in rank1, rank1[-3000:]
    assert read_finished(run_dir) is None
