"""examples/api/notebook.py, run whole on the local backend as a user would run it.

It submits a 3-point sweep through the Python API, waits, prints the table, and chains an
evaluation (``train.command``: examples/api/evaluate.py) ``after=`` the best element. Checked: it
exits 0; the table has the three elements, best first; the evaluation started only after the best
element finished, and the accuracy it computed from that element's ``final_model.pt`` is the one
the worker's own final eval recorded (the same 360 images; at most one prediction may differ, by
float rounding across batch sizes).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_ddp
from slurm_ddp.rundir import read_jobs

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = REPO / "examples" / "api" / "notebook.py"


def test_the_api_notebook_runs_a_sweep_then_evaluates_its_best_element(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    env = {**os.environ, "API_EXAMPLE_RUNS": str(runs), "API_EXAMPLE_BACKEND": "local"}
    done = subprocess.run(
        [sys.executable, str(NOTEBOOK)], capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    table = re.findall(r"^element (\d) +lr (\S+) +(\S+) +eval_accuracy (\S+)$", done.stdout, re.M)
    assert sorted(lr for _, lr, _, _ in table) == ["0.001", "0.003", "0.01"], done.stdout
    assert {state for _, _, state, _ in table} == {"COMPLETED"}, done.stdout
    accs = [float(a) for _, _, _, a in table]
    assert accs == sorted(accs, reverse=True), done.stdout  # best first

    sweep = slurm_ddp.Sweep(runs / "api-lr-sweep")
    best = sweep.element(int(table[0][0]))
    evaluation = slurm_ddp.Run(runs / "api-eval")
    assert evaluation.status().state == "COMPLETED"
    result = json.loads((evaluation.path / "accuracy.json").read_text())
    assert result["run"] == str(best.path) and result["samples"] == 360
    assert abs(result["correct"] - round(best.final().metrics["eval_accuracy"] * 360)) <= 1, (result, best.final())
    assert f"accuracy of {best.path}: " in done.stdout
    # after=: the evaluation's ranks started once the best element had finished
    assert read_jobs(evaluation.path)[0]["time"] >= best.final().metrics["time"]
