"""The hang watchdog on the local backend (``slurm_ddp.watchdog``, ``slurm_ddp.progress``).

A rank blocked for good in data loading is found with the default settings, named with its host,
step and phase in one line, its stack (at the blocking line) and its peer's are in their logs, and
every process of the run is gone; a slow evaluation and a slow checkpoint are not taken for a hang.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from slurm_ddp.rundir import HANGS_DIR, read_jsonl, read_metrics

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
TASK_FILE = Path(__file__).resolve().parent / "hang_task.py"


def submit_cmd(run_dir: Path, *sets: str) -> List[str]:
    out = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    base = (
        "train.task=hang_task:HangTask",
        f"train.pythonpath=[{REPO / 'examples' / 'digits'}, {TASK_FILE.parent}]",
        "train.log_every=5",
        "train.num_workers=0",
    )
    for s in (*base, *sets):
        out += ["--set", s]
    return out


def processes_of(run_dir: Path) -> List[str]:
    """Command lines of live processes that mention ``run_dir`` (ranks, watchdogs, local supervisor)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            cmdline = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(run_dir) in cmdline and state != "Z":
            found.append(f"{p.name}: {cmdline}")
    return found


def blocking_line() -> int:
    return next(i for i, line in enumerate(TASK_FILE.read_text().splitlines(), 1) if "HANG-HERE" in line)


def test_rank_blocked_in_data_loading_is_found_named_and_ended(tmp_path: Path) -> None:
    """The watchdog on by default (not enabled here), its floor lowered from the default 45 s to 15 s (the
    test waits the floor out; the rule is the same): rank 1 blocks in its dataset after 5 steps."""
    run_dir = tmp_path / "run"
    cmd = submit_cmd(
        run_dir,
        "watchdog.timeout_floor_s=15",
        "train.max_steps=100000",
        "checkpoint.every_steps=0",
        "train.args.hang_rank=1",
        "train.args.hang_at_step=5",
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=600)  # a safety net, not a speed limit
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    ended = time.time()
    assert proc.returncode not in (0, 75), err
    line = [ln for ln in err.splitlines() if "hang:" in ln]
    assert line and "rank 1 on local0 stopped progressing at step 5 in data loading" in line[0], err
    rank1 = (run_dir / "logs" / "rank-1.log").read_text()
    rank0 = (run_dir / "logs" / "rank-0.log").read_text()
    assert "slurm_ddp watchdog: rank 1 on local0: no progress for" in rank1, rank1[-3000:]
    assert f'hang_task.py", line {blocking_line()} in __getitem__' in rank1, rank1[-3000:]
    assert "slurm_ddp watchdog: rank 0 on local0" in rank0, rank0[-3000:]  # by itself, or after rank 1
    assert "Current thread" in rank0 or "Thread 0x" in rank0, rank0[-3000:]
    assert processes_of(run_dir) == []
    reports = [json.loads(p.read_text()) for p in sorted((run_dir / HANGS_DIR).glob("*/rank-*.json"))]
    culprit = next(r for r in reports if r["rank"] == 1)
    hung_at = culprit["time"] - culprit["idle_s"]
    last_step = max(m["time"] for m in read_metrics(run_dir) if m.get("event") == "train")
    print(
        f"TIMING hang → detected {culprit['time'] - hung_at:.1f} s, → every process gone {ended - hung_at:.1f} s "
        f"(last logged step → gone {ended - last_step:.1f} s)"
    )


def test_slow_evaluation_and_slow_checkpoint_are_not_hangs(tmp_path: Path) -> None:
    """With a 2 s step allowance, evaluations of ~5 s and checkpoint saves of 3 s finish the run."""
    run_dir = tmp_path / "run"
    cmd = submit_cmd(
        run_dir,
        "train.max_steps=40",
        "train.eval_every=20",
        "checkpoint.every_steps=15",
        "train.args.slow_eval_s=0.8",
        "train.args.slow_checkpoint_s=3",
        "watchdog.timeout_floor_s=2",
        "watchdog.step_time_factor=2",
        "watchdog.eval_s=60",
        "watchdog.checkpoint_s=60",
        "watchdog.poll_interval_s=0.2",
    )
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + (run_dir / "logs" / "rank-1.log").read_text()[-3000:]
    assert not (run_dir / HANGS_DIR).exists()
    events = read_jsonl(run_dir / "metrics.jsonl")
    assert [e["step"] for e in events if e.get("event") == "eval"] == [20, 40]
    assert sum(1 for e in events if e.get("event") == "checkpoint") == 3
    # both took longer than the 2 s step allowance (else this would prove nothing)
    assert all(e["blocked_s"] > 2 for e in events if e.get("event") == "checkpoint"), events
    evals = [i for i, e in enumerate(events) if e.get("event") == "eval"]
    assert all(events[i]["time"] - events[i - 1]["time"] > 2 for i in evals), events
