"""``environment.pass_env`` on the sandbox (issue 34): a secret in the submitting shell reaches both
ranks through sbatch's ``--export=ALL`` default, again after the job requeued itself (Slurm keeps the
submit-time environment), and no file under the run directory holds it."""

from __future__ import annotations

import hashlib
import os
import re
import sys
from pathlib import Path

import pytest
from lib import wait_for
from lib.own_project import git
from lib.slurm_jobs import logs

pytestmark = pytest.mark.slurm

SECRET = "sk-slurm-1a2b3c4d5e6f"

# First start: record the key's digest, say ready, wait for the requeue signal (no handler: it ends
# the rank). Second start: record the digest again.
TRAIN = """\
import hashlib, os, pathlib, signal, sys
rank = os.environ["RANK"]
digest = hashlib.sha256(os.environ.get("WANDB_API_KEY", "").encode()).hexdigest()
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
start = "second" if (out / f"ready-{rank}").exists() else "first"
(out / f"key-{start}-{rank}.sha256").write_text(digest)
if start == "first":
    (out / f"ready-{rank}").write_text("")
    signal.pause()
    sys.exit(1)
"""


def test_pass_env_secret_reaches_the_ranks_before_and_after_a_requeue(slurm_sandbox, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / ".gitignore").write_text("out/\n")
    (project / "job.yaml").write_text(
        "name: secrets-slurm\nslurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
        "train: {command: python train.py}\nrequeue: {signal_delay_s: 60}\n"
        "environment: {pass_env: [WANDB_API_KEY]}\n"
    )
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "project")
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["WANDB_API_KEY"] = SECRET
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(project / "job.yaml"), "--backend", "sbatch"]
    r = slurm_sandbox.run([*cmd, "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted job (\d+)", r.stdout).group(1)

    def show() -> str:
        return slurm_sandbox.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout

    def why() -> str:
        return show() + logs(run_dir)

    out = project / "out"
    wait_for(lambda: all((out / f"ready-{r}").exists() for r in (0, 1)), 180, "both ranks' first start", why)
    r = slurm_sandbox.run(["scancel", "--batch", "--signal=USR2", job_id], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: "JobState=COMPLETED" in show(), 240, f"job {job_id} to complete after its requeue", why)
    assert "Restarts=1" in show(), why()
    want = hashlib.sha256(SECRET.encode()).hexdigest()
    for start in ("first", "second"):
        for rank in (0, 1):
            assert (out / f"key-{start}-{rank}.sha256").read_text() == want, (start, rank, why())
    holding = [p for p in run_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert holding == []
