"""The batch script checks at job start that it can requeue itself (scontrol on PATH)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.config import config_from_dict
from slurm_ddp.render import render


def path_without_scontrol(tmp_path: Path, srun_rc: int) -> str:
    """A PATH with this machine's commands except scontrol, plus an srun stub."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = bindir / name
            if name in ("scontrol", "srun") or target.exists() or target.is_symlink():
                continue
            target.symlink_to(os.path.join(d, name))
    srun = bindir / "srun"
    srun.write_text(f"#!/bin/bash\necho srun-started\nexit {srun_rc}\n")
    srun.chmod(0o755)
    return str(bindir)


def test_missing_scontrol_is_reported_at_start_not_at_preemption(tmp_path: Path) -> None:
    cfg = config_from_dict({"name": "t", "train": {"task": "m:T"}})
    script = tmp_path / "job.sbatch"
    script.write_text(render(cfg, str(tmp_path / "run"), command=["x"], python=sys.executable).script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    env.update(
        PATH=path_without_scontrol(tmp_path, PREEMPTED_EXIT_CODE),
        SLURM_JOB_ID="7",
        SLURM_JOB_NODELIST="n1",
        SLURM_RESTART_COUNT="0",
    )
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    warning = text.find("scontrol is not on PATH")
    assert 0 <= warning < text.find("srun-started"), text
    assert "scontrol is missing: cannot requeue" in text
    assert out.returncode == PREEMPTED_EXIT_CODE
