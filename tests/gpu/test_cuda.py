"""The CUDA tier: the digits job with NCCL on every GPU of this machine, the fast path (bf16 +
channels_last + torch.compile), and exact resume with ``train.deterministic: true``.

Runs where ``torch.cuda.is_available()``; elsewhere the whole module is skipped with that reason —
with ``pytest.skip``, not ``lib.missing_prerequisite``: CI machines have no GPU, so this skip must
not become a failure under ``SLURM_DDP_REQUIRE_SLURM=1``. Ranks start through the local backend
(one per GPU, ``slurm.gpus_per_node`` = the GPU count), so each rank's device comes from
``slurm_ddp.devices.select_device`` (all GPUs visible → ``cuda:LOCAL_RANK``).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
import torch
from lib import wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_metrics

if not torch.cuda.is_available():
    pytest.skip(
        "CUDA is not available here (torch.cuda.is_available() is false): the CUDA tier needs a GPU",
        allow_module_level=True,
    )

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
GPUS = torch.cuda.device_count()


def cmd(run_dir: Path, *sets: str) -> List[str]:
    out = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--backend", "local", "--run-dir", str(run_dir)]
    for s in (
        "slurm.nodes=1",
        f"slurm.gpus_per_node={GPUS}",
        f"slurm.tasks_per_node={GPUS}",
        "slurm.cpus_per_task=1",
        "train.backend=nccl",
        "train.max_steps=300",
        "train.log_every=10",
        *sets,
    ):
        out += ["--set", s]
    return out


def run(run_dir: Path, *sets: str) -> dict:
    r = subprocess.run(cmd(run_dir, *sets), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((run_dir / "FINISHED").read_text())


def devices_logged(run_dir: Path) -> List[str]:
    out = []
    for rank in range(GPUS):
        text = (run_dir / "logs" / f"rank-{rank}.log").read_text()
        out += re.findall(r"device (cuda:\d+) \(physical GPU", text)[:1]
    return out


def test_digits_with_nccl_on_every_gpu(tmp_path: Path) -> None:
    finished = run(tmp_path / "run")
    assert finished["eval_accuracy"] >= 0.97, finished
    assert devices_logged(tmp_path / "run") == [f"cuda:{k}" for k in range(GPUS)]
    assert "backend nccl" in (tmp_path / "run" / "logs" / "rank-0.log").read_text()


def test_bf16_channels_last_compile(tmp_path: Path) -> None:
    finished = run(tmp_path / "run", "train.amp=bf16", "train.channels_last=true", "train.compile=true")
    assert finished["eval_accuracy"] >= 0.97, finished


def test_exact_resume_with_deterministic_is_bitwise_equal(tmp_path: Path) -> None:
    sets = ("train.deterministic=true", "train.max_steps=120", "checkpoint.every_steps=40", "train.log_every=1")
    base, inter = tmp_path / "base", tmp_path / "inter"
    run(base, *sets)

    proc = subprocess.Popen(cmd(inter, *sets), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:

        def step() -> int:
            return max((m["step"] for m in read_metrics(inter) if m["event"] == "train"), default=0)

        wait_process(proc, lambda: step() >= 50, 600, "step 50", lambda: proc.stderr.read())
        proc.send_signal(signal.SIGUSR2)
        assert proc.wait(timeout=300) == PREEMPTED_EXIT_CODE
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    run(inter, *sets)

    a = torch.load(base / "final_model.pt", weights_only=True)
    b = torch.load(inter / "final_model.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs after resume"
