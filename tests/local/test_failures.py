"""Failures inside a job on the local backend: a dead rank, a hung rank, a task that does not import.

A rank that dies (kill -9) takes the whole job down quickly and the launcher names it; a rank
that hangs (SIGSTOP) makes its peers fail at ``train.pg_timeout_s`` with a message that says a
peer stopped responding; the last good checkpoint survives both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from slurm_ddp.checkpoint import CheckpointManager

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"


def cmd(run_dir: Path, *sets: str) -> List[str]:
    out = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in ("train.max_steps=100000", "train.log_every=5", "checkpoint.every_steps=20", "train.eval_every=0", *sets):
        out += ["--set", s]
    return out


def rank_pids(launcher_pid: int) -> List[int]:
    out = subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def wait_step(run_dir: Path, step: int, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        p = run_dir / "metrics.jsonl"
        if p.exists():
            steps = [json.loads(x)["step"] for x in p.read_text().splitlines() if '"train"' in x]
            if steps and max(steps) >= step:
                return
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached in {timeout_s} s")


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
    assert all(not Path(f"/proc/{p}").exists() or "zombie" in Path(f"/proc/{p}/status").read_text().lower()
               for p in pids.values())
    info = CheckpointManager(run_dir / "checkpoints").latest()
    assert info is not None and info.step >= 20


def test_hung_rank_fails_peers_at_the_timeout_with_a_clear_message(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(cmd(run_dir, "train.pg_timeout_s=8"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
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
    r = subprocess.run(cmd(run_dir, "train.task=no_such_module:Task", "train.max_steps=10"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    text = r.stderr + (run_dir / "logs" / "rank-0.log").read_text() if (run_dir / "logs").exists() else r.stderr
    assert "no_such_module" in text and "train.task" in text, text
    assert "Traceback" not in text
