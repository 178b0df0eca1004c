"""``environment.pass_env`` on the local backend (issue 34): a secret in the submitting shell reaches
both ranks of a real 2-rank run, and no file under the run directory holds it, nor does ``status``."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lib.own_project import git

pytestmark = pytest.mark.local

SECRET = "sk-local-9f8e7d6c5b4a"

TRAIN = """\
import hashlib, os, pathlib
rank = os.environ["RANK"]
value = os.environ.get("WANDB_API_KEY", "")
out = pathlib.Path("out")
out.mkdir(exist_ok=True)
(out / f"key-{rank}.sha256").write_text(hashlib.sha256(value.encode()).hexdigest())
print(f"[rank {rank}] got a key of {len(value)} characters", flush=True)
"""


def test_pass_env_secret_reaches_every_rank_and_no_file_of_the_run(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text(TRAIN)
    (project / ".gitignore").write_text("out/\n")
    (project / "job.yaml").write_text(
        "name: secrets-local\nslurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
        "train: {command: python train.py}\nenvironment: {pass_env: [WANDB_API_KEY]}\n"
    )
    git(project, "init", "-q")
    git(project, "add", "-A")
    git(project, "commit", "-qm", "project")
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_API_KEY": SECRET}
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(project / "job.yaml"), "--backend", "local"]
    r = subprocess.run([*cmd, "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    want = hashlib.sha256(SECRET.encode()).hexdigest()
    for rank in (0, 1):
        assert (project / "out" / f"key-{rank}.sha256").read_text() == want, rank
        assert (
            f"[rank {rank}] got a key of {len(SECRET)} characters"
            in (run_dir / "logs" / f"rank-{rank}.log").read_text()
        )
    holding = [p for p in run_dir.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert holding == []
    assert SECRET not in r.stdout + r.stderr
    for extra in ([], ["--json"]):
        st = subprocess.run(
            [sys.executable, "-m", "slurm_ddp", "status", str(run_dir), *extra],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert st.returncode == 0 and SECRET not in st.stdout + st.stderr, st.stdout + st.stderr
