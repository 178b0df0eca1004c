"""A sweep on the local backend, the README's one command: examples/digits/sweep.yaml runs its
elements one after another (kept short here: 2 elements x 60 steps), each in its own run
directory; submitting again runs nothing; ``status``, ``runs`` and ``plot`` take the sweep."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "examples" / "digits" / "sweep.yaml"


def test_local_sweep_runs_every_element_then_nothing(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "runs" / "digits-sweep"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(SWEEP), "--backend", "local", "--run-dir", str(sweep_dir)]
    cmd += ["--sweep", "train.lr=0.003", "--set", "train.max_steps=60", "--set", "train.eval_every=30"]
    cmd += ["--set", "checkpoint.every_steps=30"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "2 of 2 element(s) run finished" in r.stdout, r.stdout[-2000:]
    for i, seed in enumerate((0, 1)):
        d = sweep_dir / f"{i:03d}"
        finished = json.loads((d / "FINISHED").read_text())
        assert finished["step"] == 60
        assert f"seed: {seed}" in (d / "config.yaml").read_text()
        assert (d / "final_model.pt").exists() and (d / "logs" / "rank-1.log").exists()

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout + again.stderr

    st = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(sweep_dir), "--sort", "eval_accuracy"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert st.returncode == 0, st.stderr
    assert "2 done, 0 running, 0 pending, 0 failed" in st.stdout, st.stdout
    assert len(re.findall(r"^\d\s+lr=0\.003,seed=\d\s+local:\d+\s+COMPLETED\s+60/60", st.stdout, re.M)) == 2, st.stdout

    runs = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "runs", str(tmp_path / "runs")], capture_output=True, text=True, timeout=60
    )
    assert re.search(r"digits-sweep\s+-\s+2\s+2\s+0\s+0\s+0", runs.stdout), runs.stdout
    assert "000" not in runs.stdout.split("SWEEP")[0]  # elements are not listed as separate runs

    pytest.importorskip("matplotlib")
    png = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "plot", str(sweep_dir)], capture_output=True, text=True, timeout=120
    )
    assert png.returncode == 0, png.stderr
    assert (sweep_dir / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
