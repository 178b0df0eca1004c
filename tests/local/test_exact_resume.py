"""Exact resume: a run interrupted 3 times (SIGUSR2, kill -9, SIGUSR2) ends bitwise equal to an
uninterrupted run of the same config — 2 gloo ranks, DataLoader ``num_workers=2``, random
augmentation — and logs the same loss at every step (including the steps redone after kill -9).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from lib import wait_for, wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.checkpoint import CheckpointManager
from slurm_ddp.rundir import latest_checkpoint_step

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
# The last stop is asked for at step 87: a stop lands up to ~0.7 s later (the poll here, the local
# launcher's forwarding loop, StepAgreement's ~0.5 s interval, one step), ~30 steps at full speed on
# an idle 2-core machine, so the run must have more than that left after step 87 (110 was too tight).
MAX_STEPS = 140
SETS = [
    f"train.max_steps={MAX_STEPS}",
    "train.num_workers=2",
    "train.log_every=1",
    "train.eval_every=40",
    "train.args.augment=true",
    "train.args.width=16",
    "checkpoint.every_steps=20",
    "checkpoint.keep_last=2",
]


def cmd(run_dir: Path) -> List[str]:
    out = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in SETS:
        out += ["--set", s]
    return out


def records(run_dir: Path) -> List[dict]:
    p = run_dir / "metrics.jsonl"
    out = []
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # the line a kill -9 cut short
    return out


def max_step(run_dir: Path, since: int = 0) -> int:
    """The highest step trained, in the records from the ``since``-th on."""
    return max((r["step"] for r in records(run_dir)[since:] if r["event"] == "train"), default=0)


def start(run_dir: Path) -> subprocess.Popen:
    """A submit of the run; ``proc.since``: the records its predecessors wrote."""
    since = len(records(run_dir))
    proc = subprocess.Popen(cmd(run_dir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc.since = since
    return proc


def wait_step(proc: subprocess.Popen, run_dir: Path, step: int) -> None:
    """Wait until this submit (not an earlier one) trained step ``step``."""
    wait_process(proc, lambda: max_step(run_dir, proc.since) >= step, 240, f"step {step}", lambda: proc.stderr.read())


def finish(proc: subprocess.Popen) -> int:
    """Wait for ``proc`` (kill it if it does not end) and return its exit status."""
    try:
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode


def run_until(run_dir: Path, step: int, then: int) -> int:
    """Start a submit, wait until training passed ``step``, send ``then``; returns its exit status."""
    proc = start(run_dir)
    try:
        wait_step(proc, run_dir, step)
        os.kill(proc.pid, then)
    finally:
        returncode = finish(proc)
    return returncode


def stopped(pid: int) -> bool:
    """Every thread of ``pid`` is stopped (SIGSTOP acts on each thread at its next return to user mode)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue  # a thread that just exited
        if state not in "tT":
            return False
    return True


def kill_between_checkpoints(run_dir: Path, step: int, after: int) -> int:
    """Start a submit and ``kill -9`` its launcher (its ranks die with it: PR_SET_PDEATHSIG) at a
    moment training passed ``step``, a periodic checkpoint newer than step ``after`` is committed,
    and steps after that checkpoint are logged (they will be trained again). Returns that
    checkpoint's step, the one the next submit must resume from.

    The ranks are frozen (SIGSTOP) while the run directory is read, so that no newer checkpoint
    can be committed between the check and the kill; if the moment is not right (the newest
    checkpoint is still being written, or nothing was logged after it), they go on and the
    check is repeated a few steps later.
    """
    proc = start(run_dir)
    try:
        while True:
            wait_step(proc, run_dir, step)
            ranks = [
                int(p)
                for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            ]
            assert len(ranks) == 2, ranks
            for pid in ranks:
                os.kill(pid, signal.SIGSTOP)
            wait_for(lambda ranks=ranks: all(stopped(pid) for pid in ranks), 60, "the ranks to stop", interval_s=0.01)
            committed, logged = latest_checkpoint_step(run_dir) or 0, max_step(run_dir, proc.since)
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


def losses(run_dir: Path) -> Dict[int, List[float]]:
    out: Dict[int, List[float]] = {}
    for r in records(run_dir):
        if r["event"] == "train":
            out.setdefault(r["step"], []).append(r["loss"])
    return out


def test_interrupted_run_is_bitwise_equal_to_uninterrupted(tmp_path: Path) -> None:
    base, inter = tmp_path / "uninterrupted", tmp_path / "interrupted"
    r = subprocess.run(cmd(base), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    assert run_until(inter, 13, signal.SIGUSR2) == PREEMPTED_EXIT_CODE
    first_stop = int((inter / "PREEMPTED").read_text().split()[2])
    # kill -9 of the launcher (its ranks die with it) mid-interval: the periodic checkpoint is
    # the fallback and the steps since it are trained again.
    killed_after = kill_between_checkpoints(inter, 52, first_stop)
    assert run_until(inter, 87, signal.SIGUSR2) == PREEMPTED_EXIT_CODE
    # a corrupt rank file of the newest checkpoint: every rank falls back to the one before (rank 0
    # verifies, the others take its choice), and the run still ends bitwise equal
    ckpts = CheckpointManager(inter / "checkpoints").committed()
    assert len(ckpts) == 2, [c.step for c in ckpts]
    rank1_file = CheckpointManager(inter / "checkpoints").rank_state_path(ckpts[-1].step, 1)
    data = bytearray(rank1_file.read_bytes())
    data[-1] ^= 0xFF
    rank1_file.write_bytes(bytes(data))
    r = subprocess.run(cmd(inter), capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]

    rank0 = (inter / "logs" / "rank-0.log").read_text()
    resumed = [int(x) for x in __import__("re").findall(r"resumed from checkpoint of step (\d+)", rank0)]
    assert len(resumed) == 3 and resumed[0] == first_stop, resumed
    assert resumed[1] == killed_after and resumed[1] % 20 == 0  # after kill -9: a periodic checkpoint
    assert resumed[2] == ckpts[0].step, (resumed, [c.step for c in ckpts])
    rank1 = (inter / "logs" / "rank-1.log").read_text()
    # one verification per start: the corrupt file is reported by rank 0 only
    assert rank0.count("is invalid") == 1 and "is invalid" not in rank1, rank0

    a = torch.load(base / "final_model.pt", weights_only=True)
    b = torch.load(inter / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"

    la, lb = losses(base), losses(inter)
    assert sorted(la) == list(range(1, MAX_STEPS + 1))
    assert sorted(lb) == sorted(la)
    redone = [s for s, v in lb.items() if len(v) > 1]
    assert redone, "kill -9 should have made some steps run twice"
    for step, values in lb.items():
        assert all(v == la[step][0] for v in values), f"step {step}: {values} != {la[step]}"

    fa = json.loads((base / "FINISHED").read_text())
    fb = json.loads((inter / "FINISHED").read_text())
    assert fa["eval_accuracy"] == fb["eval_accuracy"] and fa["eval_loss"] == fb["eval_loss"]
