"""Failures inside a job on the local backend: a dead rank, a hung rank, a task that does not import.

A rank that dies (kill -9) takes the whole job down quickly and the local supervisor names it; a rank
that hangs (SIGSTOP) makes its peers fail at ``train.pg_timeout_s`` with a message that says a
peer stopped responding; the last good checkpoint survives both.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest
from lib import wait_process

from slurm_ddp.checkpoint import CheckpointManager
from slurm_ddp.rundir import latest_checkpoint_step, read_metrics

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"


def cmd(run_dir: Path, *sets: str) -> List[str]:
    out = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in ("train.max_steps=100000", "train.log_every=5", "checkpoint.every_steps=20", "train.eval_every=0", *sets):
        out += ["--set", s]
    return out


def rank_pids(supervisor_pid: int) -> List[int]:
    out = subprocess.run(["pgrep", "-P", str(supervisor_pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def max_train_step(run_dir: Path) -> int:
    return max((m["step"] for m in read_metrics(run_dir) if m.get("event") == "train"), default=0)


def wait_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    """Wait until training logged ``step`` and the checkpoint of step 20 is committed (the async
    writer may still be writing it a few steps later), so that it is there to survive the failure."""
    wait_process(
        proc,
        lambda: max_train_step(run_dir) >= step and (latest_checkpoint_step(run_dir) or 0) >= 20,
        timeout_s,
        f"step {step} and the checkpoint of step 20",
        lambda: proc.communicate()[1],
    )


def rank_of(pid: int) -> int:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int([e for e in env if e.startswith(b"SLURM_PROCID=")][0].split(b"=", 1)[1])


def test_killed_rank_ends_the_job_and_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(cmd(run_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_step(run_dir, 25, proc)
        pids = {rank_of(p): p for p in rank_pids(proc.pid)}
        t0 = time.monotonic()
        os.kill(pids[1], signal.SIGKILL)
        out, err = proc.communicate(timeout=90)
        gone_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    print(f"TIMING rank death → every rank gone: {gone_s:.2f} s")
    assert proc.returncode not in (0, 75)
    assert "rank 1 exited with status -9" in err, err
    assert all(
        not Path(f"/proc/{p}").exists() or "zombie" in Path(f"/proc/{p}/status").read_text().lower()
        for p in pids.values()
    )
    info = CheckpointManager(run_dir / "checkpoints").latest()
    assert info is not None and info.step >= 20


def test_hung_rank_fails_peers_at_the_timeout_with_a_clear_message(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        cmd(run_dir, "train.pg_timeout_s=8"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pids = {}
    try:
        wait_step(run_dir, 25, proc)
        pids = {rank_of(p): p for p in rank_pids(proc.pid)}
        os.kill(pids[1], signal.SIGSTOP)
        out, err = proc.communicate(timeout=120)
    finally:
        for p in pids.values():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode not in (0, 75)
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    assert "a peer rank stopped responding or died" in rank0, rank0[-3000:]
    assert "train.pg_timeout_s=8" in rank0
    assert "rank 0 exited with status 1" in err, err
    assert CheckpointManager(run_dir / "checkpoints").latest() is not None


def test_task_that_does_not_import_is_one_clear_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = subprocess.run(
        cmd(run_dir, "train.task=no_such_module:Task", "train.max_steps=10"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    text = r.stderr + (run_dir / "logs" / "rank-0.log").read_text() if (run_dir / "logs").exists() else r.stderr
    assert "no_such_module" in text and "train.task" in text, text
    assert "Traceback" not in text
