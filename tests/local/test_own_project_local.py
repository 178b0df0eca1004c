"""A researcher's own project on the local backend (tests/lib/own_project.py): the ranks run in the
project directory, so data in a ``.gitignore``d directory is read by its relative path and outputs land
in the project, while the code comes from the snapshot taken at submit, for ``python train.py`` and
``python -m pkg`` alike. An edit to the checkout after submit does not run: on the local backend the
"requeue" is the next submit, which refuses the edited code in one line (the reproducibility rule of
the snapshot); with the checkout restored it resumes and finishes (the real-Slurm tier requeues with
the edit in place)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from lib import wait_process
from lib.own_project import COMMANDS, check_results, edit_checkout, git, make_project

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished

pytestmark = pytest.mark.local


@pytest.mark.parametrize("kind", sorted(COMMANDS))
def test_own_project_reads_its_ignored_data_writes_into_the_project_and_resumes_the_submitted_code(
    tmp_path: Path, kind: str
) -> None:
    job = make_project(tmp_path, COMMANDS[kind])
    project, run_dir = job.parent, tmp_path / "run"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        wait_process(
            proc,
            lambda: all((project / "out" / f"ready-{r}").exists() for r in (0, 1)),
            240,
            "both ranks' first start",
            lambda: proc.stdout.read(),
        )
        edit_checkout(project)
        proc.send_signal(signal.SIGUSR2)  # the requeue signal: the local supervisor passes it on to the ranks
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    assert read_finished(run_dir) is None
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert refused.returncode == 2 and "the code now differs" in refused.stderr, refused.stdout + refused.stderr
    assert not list((project / "out").glob("result-*")), "the edited checkout ran"
    git(project, "checkout", "--", ".")
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    check_results(project, run_dir)
    assert read_finished(run_dir) is not None
