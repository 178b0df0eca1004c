"""A sweep through ``--backend submitit`` on the real sandbox: 2 elements as ONE submitit job
array (``--array=0-1%2``), each a small digits run that finishes in its own run directory,
recorded as ``ARRAYJOBID_TASKID``; submitting the sweep again then has nothing to run. The same when
sbatch's answer was lost: the array is found, not submitted twice, and its tasks get their pickles.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Dict

import pytest
from lib import require_module, wait_for
from lib.slurm_jobs import cli

from slurm_ddp.rundir import is_finished, read_jobs, read_sweep_jobs

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "examples" / "digits" / "sweep.yaml"
SETS = (
    "slurm.nodes=1",
    "slurm.tasks_per_node=1",
    "train.max_steps=30",
    "train.eval_every=0",
    "train.log_every=10",
    "checkpoint.every_steps=10",
    "slurm.time=00:05:00",
)


def _logs(sweep_dir: Path) -> str:
    files = sorted(sweep_dir.glob("submitit/*/*.out")) + sorted(sweep_dir.glob("*/logs/*"))
    return "\n".join(f"==> {p} <==\n{p.read_text(errors='replace')[-2000:]}" for p in files)


def held_and_lost_sbatch(slurm_sandbox, bin_dir: Path) -> Dict[str, str]:
    """The environment of a ``submit`` whose sbatch makes the job (held) but loses its answer: a wrapper
    that says "Socket timed out", as sbatch does when the controller's reply never came."""
    real = shutil.which("sbatch", path=slurm_sandbox.client_env().get("PATH"))
    assert real, "sbatch is not on PATH"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        f'#!/bin/sh\n"{real}" --hold "$@" >/dev/null || exit $?\n'
        'echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2\nexit 1\n'
    )
    (bin_dir / "sbatch").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}


def test_submitit_sweep_is_one_array_and_every_element_finishes(slurm_sandbox, tmp_path: Path) -> None:
    """Even when sbatch made the (held) array and its answer was lost: ``submit`` finds the array instead of
    submitting another, moves each task's pickle where submitit would have, and, released, both elements
    finish (the answered path: the own-script sweep below)."""
    require_module("submitit", "the submitit backend")
    sweep_dir = tmp_path / "sweep"
    args = ["submit", str(SWEEP), "--backend", "submitit", "--run-dir", str(sweep_dir), "--sweep", "train.seed=0"]
    for s in SETS:
        args += ["--set", s]
    r = cli(slurm_sandbox, *args, env=held_and_lost_sbatch(slurm_sandbox, tmp_path / "bin"))
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job array (\d+) through submitit \(--array=0-1%2\)", r.stdout)
    assert m, r.stdout
    array_id = m.group(1)
    assert [j["job_id"] for j in read_sweep_jobs(sweep_dir)] == [array_id]  # ONE sbatch
    elems = [sweep_dir / f"{i:03d}" for i in range(2)]
    for i, e in enumerate(elems):
        assert [j["job_id"] for j in read_jobs(e)] == [f"{array_id}_{i}"]
    assert f"found the job it made: {array_id} (not submitted twice)" in r.stderr, r.stderr
    assert read_sweep_jobs(sweep_dir)[-1]["found_after_lost_answer"] is True
    for i in range(2):
        assert (sweep_dir / "submitit" / f"{array_id}_{i}" / f"{array_id}_{i}_submitted.pkl").is_file()
    slurm_sandbox.run(["scontrol", "release", array_id], capture_output=True, timeout=20, check=True)
    wait_for(lambda: all(is_finished(e) for e in elems), 240, "both elements finished", lambda: _logs(sweep_dir))
    again = cli(slurm_sandbox, *args)
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout + again.stderr


SEEN = "import json, os, sys\njson.dump({'argv': sys.argv[1:], 'cwd': os.getcwd()}, open('seen.json', 'w'))\n"


def test_a_submitit_sweep_of_an_own_script_gives_each_element_its_args_and_workdir(
    slurm_sandbox, tmp_path: Path
) -> None:
    """``--sweep train.args.lr`` over a plain ``python seen.py`` (no torch: cheap starts): each element's
    script gets its own ``--lr=VALUE`` and runs in its own ``RUN_DIR/work``, where it writes ``seen.json``."""
    require_module("submitit", "the submitit backend")
    import json

    import yaml

    (tmp_path / "seen.py").write_text(SEEN)
    job = {"name": "seen", "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:05:00", "array_parallelism": 2}}
    job["train"] = {"command": "python seen.py --epochs 1"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    sweep_dir = tmp_path / "sweep"
    args = ["submit", str(tmp_path / "job.yaml"), "--backend", "submitit", "--run-dir", str(sweep_dir)]
    r = cli(slurm_sandbox, *args, "--sweep", "train.args.lr=0.1,0.2")
    assert r.returncode == 0, r.stdout + r.stderr
    elems = [sweep_dir / f"{i:03d}" for i in range(2)]
    wait_for(lambda: all(is_finished(e) for e in elems), 240, "both elements finished", lambda: _logs(sweep_dir))
    for lr, e in zip(("0.1", "0.2"), elems):
        seen = json.loads((e / "work" / "seen.json").read_text())
        assert seen == {"argv": ["--epochs", "1", f"--lr={lr}"], "cwd": str(e / "work")}, seen
    assert not (tmp_path / "seen.json").exists()
