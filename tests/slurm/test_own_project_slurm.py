"""A researcher's own project on the sandbox (tests/lib/own_project.py), submitted with sbatch: the ranks
run in the project directory (data from its ``.gitignore``d ``data/``, outputs into ``out/``), the code
from the snapshot. The checkout is edited while the job runs; the time-limit signal at the batch shell
requeues the job, and the second start runs the submitted code, for ``python train.py`` and
``python -m pkg`` alike."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from lib import wait_for
from lib.own_project import COMMANDS, check_results, edit_checkout, make_project
from lib.slurm_jobs import cli, logs

from slurm_ddp.rundir import read_finished

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_own_project_requeued_after_an_edit_runs_the_submitted_code_in_the_project_dir(
    slurm_sandbox, tmp_path: Path, kind: str
) -> None:
    job = make_project(tmp_path, COMMANDS[kind])
    project, run_dir = job.parent, tmp_path / "run"
    r = cli(slurm_sandbox, "submit", str(job), "--backend", "sbatch", "--run-dir", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    job_id = re.search(r"submitted job (\d+)", r.stdout).group(1)

    def show() -> str:
        return slurm_sandbox.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout

    def why() -> str:
        return show() + logs(run_dir)

    wait_for(lambda: all((project / "out" / f"ready-{r}").exists() for r in (0, 1)), 180, "both ranks' start", why)
    edit_checkout(project)
    r = slurm_sandbox.run(["scancel", "--batch", "--signal=USR2", job_id], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    wait_for(lambda: "JobState=COMPLETED" in show(), 240, f"job {job_id} to complete after its requeue", why)
    assert "Restarts=1" in show(), why()
    check_results(project, run_dir)
    assert read_finished(run_dir) is not None
