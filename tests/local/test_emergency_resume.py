"""An emergency checkpoint resumes exactly: a run whose rank 1 is killed (kill -9) or stopped (SIGSTOP,
a frozen node) mid-training, whose rank 0 then commits the last completed step alone (in-job recovery's
survivor save: no per-rank RNG states in it) — after its failed collective, or when its hang watchdog
is about to end it — and which is submitted again on the same world size, ends bitwise equal to an
uninterrupted run of the same config: with dropout, so the training step itself draws random numbers
on every rank, BatchNorm, whose running statistics the failed step's forward changed, and no periodic
checkpoint, so only the emergency checkpoint can explain the resume.

Exact because each optimizer step's random streams derive from ``(train.seed, rank, step)``
(``slurm_ddp.worker.runtime.step_seed``): the lost rank's stream at the step boundary is known without
its state. Two gloo ranks, local backend (the in-job restart itself is the Slurm tier's,
``tests/slurm/test_node_recovery.py``).
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
from lib import wait_process

from slurm_ddp.checkpoint import CheckpointManager
from slurm_ddp.rundir import read_metrics

pytestmark = [pytest.mark.local, pytest.mark.xdist_group("emergency_resume")]  # one reference run for both

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
MAX_STEPS = 60
KILL_AFTER = 20  # steps logged before rank 1 is killed
SETS = [
    f"train.max_steps={MAX_STEPS}",
    "train.log_every=1",
    "train.eval_every=0",
    "train.args.width=16",
    "train.args.dropout=0.3",
    "train.pg_timeout_s=30",
    "watchdog.timeout_floor_s=5",  # a stopped rank 1: the watchdogs end the job after ~5 s, not the 30 s timeout
    "watchdog.poll_interval_s=0.5",
    "checkpoint.every_steps=0",
    # two one-rank "nodes" that may shrink to one: in-job recovery is on, so a survivor saves alone
    "slurm.nodes=2",
    "slurm.tasks_per_node=1",
    "recovery.min_nodes=1",
]


def submit(run_dir: Path, out: Path) -> subprocess.Popen:
    """``slurm-ddp submit`` of the job into ``run_dir``, its output to the file ``out``."""
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in SETS:
        cmd += ["--set", s]
    with open(out, "w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, text=True)


def train_losses(run_dir: Path) -> Dict[int, List[float]]:
    out: Dict[int, List[float]] = {}
    for r in read_metrics(run_dir):
        if r["event"] == "train":
            out.setdefault(r["step"], []).append(r["loss"])
    return out


def rank_pid(supervisor: int, rank: int) -> int:
    """The pid of ``rank`` among the local supervisor's children (its ``RANK`` variable)."""
    pids = subprocess.run(["pgrep", "-P", str(supervisor)], capture_output=True, text=True).stdout.split()
    for pid in pids:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if f"RANK={rank}".encode() in env:
            return int(pid)
    raise AssertionError(f"no rank {rank} among the children {pids} of {supervisor}")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run directory of an uninterrupted run of the job."""
    base = tmp_path_factory.mktemp("uninterrupted")
    ref = submit(base / "run", base / "submit.out")
    assert ref.wait(timeout=400) == 0, (base / "submit.out").read_text()[-3000:]
    return base / "run"


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_an_emergency_checkpoint_resumes_bitwise_exact_on_the_same_world_size(
    how: int, uninterrupted: Path, tmp_path: Path
) -> None:
    base, inter = uninterrupted, tmp_path / "interrupted"
    outs = [tmp_path / f"submit-{i}.out" for i in range(3)]

    proc = submit(inter, outs[1])
    try:
        wait_process(
            proc,
            lambda: max(train_losses(inter), default=0) >= KILL_AFTER,
            240,
            f"step {KILL_AFTER}",
            lambda: outs[1].read_text()[-3000:],
        )
        rank1 = rank_pid(proc.pid, 1)
        os.kill(rank1, how)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode not in (0, None), outs[1].read_text()[-3000:]

    killed_at = max(train_losses(inter))
    (ckpt,) = CheckpointManager(inter / "checkpoints").committed()
    assert ckpt.emergency is not None and ckpt.emergency["rank"] == 0, ckpt
    assert ckpt.rank_states in (0, None), ckpt  # one survivor's save: no per-rank RNG states
    assert KILL_AFTER <= ckpt.step <= killed_at, (ckpt.step, killed_at)
    # rank 0's answer to its hang watchdog (rundir.hangs): stopped, rank 1 was ended only after rank 0
    # had committed (and never commits itself); killed, no watchdog found a hang
    answers = {p.name: p.read_text().splitlines() for p in inter.glob("hangs/*/rank-*.save")}
    if how == signal.SIGSTOP:
        assert answers.get("rank-0.save") == ["saving", f"committed step {ckpt.step}"], answers
        assert all(not a[-1].startswith("committed") for n, a in answers.items() if n != "rank-0.save"), answers
        # issue 50: each hang report names the step its rank got to, not one its watchdog saw a poll before the
        # stop (172 vs 200): rank 0 completed the committed step; rank 1, stopped after it or inside it (its
        # gradients given, its count not yet raised), that step or the one before
        reports = [json.loads(p.read_text()) for p in inter.glob("hangs/*/rank-*.json")]
        steps = {r["rank"]: r["step"] for r in reports}
        assert steps.get(0) == ckpt.step and steps.get(1) in (ckpt.step - 1, ckpt.step), (steps, ckpt.step)
    else:
        assert answers == {}, answers

    again = submit(inter, outs[2])
    assert again.wait(timeout=400) == 0, outs[2].read_text()[-3000:]
    (resume,) = [m for m in read_metrics(inter) if m["event"] == "resume"]
    assert resume["emergency"] and resume["step"] == ckpt.step and resume["world_size"] == 2, resume

    a = torch.load(base / "final_model.pt", weights_only=True)
    b = torch.load(inter / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"
    la, lb = train_losses(base), train_losses(inter)
    assert sorted(la) == sorted(lb) == list(range(1, MAX_STEPS + 1))
    for step, values in lb.items():  # the steps after the emergency checkpoint, trained twice, alike
        assert all(v == la[step][0] for v in values), f"step {step}: {values} != {la[step]}"
