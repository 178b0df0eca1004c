"""submitit's failures are one line and a status, as the sbatch backend's (issue 28, bug 5).

A fake ``sbatch`` refuses the job as Slurm does for a partition that does not exist; submitit
raises ``FailedJobError`` for it (and prints sbatch's stderr itself). A host without ``srun`` is
one where submitit refuses to build its executor at all (``RuntimeError``): a submit there is one
line, and a sweep's ``--dry-run`` prints the script as a single run's does.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import List

import pytest
from lib import require_module

from slurm_ddp import cli, rundir
from slurm_ddp.backends import sbatch as sbatch_backend
from slurm_ddp.errors import ClusterError

REPO = Path(__file__).resolve().parents[2]
JOB_YAML = REPO / "examples" / "digits" / "job.yaml"
SWEEP_YAML = REPO / "examples" / "digits" / "sweep.yaml"
REFUSAL = "sbatch: error: Batch job submission failed: Invalid partition name specified"


def _bin(tmp_path: Path, *, srun: bool, sbatch_body: str) -> Path:
    """A directory with a fake ``sbatch`` (and ``srun``), and links to ``git`` and this Python."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("git",):
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    (bindir / "sbatch").write_text(f"#!/bin/bash\n{sbatch_body}\n")
    (bindir / "sbatch").chmod(0o755)
    if srun:
        (bindir / "srun").write_text("#!/bin/bash\nexit 0\n")
        (bindir / "srun").chmod(0o755)
    return bindir


@pytest.fixture
def refusing_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sbatch`` refuses every job with Slurm's "Invalid partition" lines, exit 1."""
    require_module("submitit", "the submitit backend")
    body = f"echo 'sbatch: error: invalid partition specified: gpuu' >&2\necho '{REFUSAL}' >&2\nexit 1"
    bindir = _bin(tmp_path, srun=True, sbatch_body=body)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")


def _one_error_line(err: str, start: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"slurm-ddp: error: {start}"), err


def test_a_refused_submitit_job_is_one_line(refusing_sbatch, tmp_path: Path, capsys) -> None:
    argv = ["submit", str(JOB_YAML), "--backend", "submitit", "--run-dir", str(tmp_path / "run")]
    rc = cli.main([*argv, "--no-check-task", "--set", "slurm.partition=gpuu"])
    err = capsys.readouterr().err
    assert rc == ClusterError.exit_code, err  # as the sbatch backend's refusal
    _one_error_line(err, f"sbatch refused the job (exit 1): {REFUSAL}")


def test_a_refused_submitit_sweep_is_one_line(refusing_sbatch, tmp_path: Path, capsys) -> None:
    argv = ["submit", str(SWEEP_YAML), "--backend", "submitit", "--run-dir", str(tmp_path / "sweep")]
    rc = cli.main([*argv, "--no-check-task", "--set", "slurm.partition=gpuu"])
    err = capsys.readouterr().err
    assert rc == ClusterError.exit_code, err
    _one_error_line(err, f"sbatch refused the job array (exit 1): {REFUSAL}")


def test_unreadable_sbatch_answer_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    require_module("submitit", "the submitit backend")
    bindir = _bin(tmp_path, srun=True, sbatch_body="echo 'sbatch: queued somewhere'")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    argv = ["submit", str(JOB_YAML), "--backend", "submitit", "--run-dir", str(tmp_path / "run")]
    rc = cli.main([*argv, "--no-check-task"])
    err = capsys.readouterr().err
    assert rc == ClusterError.exit_code, err
    _one_error_line(err, "sbatch printed no job id for the job")


@pytest.fixture
def no_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A PATH with ``git`` and a ``sbatch`` but no ``srun`` (nor any other Slurm command)."""
    require_module("submitit", "the submitit backend")
    bindir = _bin(tmp_path, srun=False, sbatch_body="echo 'Submitted batch job 5'")
    (bindir / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(bindir))


def test_sweep_dry_run_needs_no_srun_as_a_single_runs(no_srun, tmp_path: Path, capsys) -> None:
    for yaml_path, name in ((JOB_YAML, "run"), (SWEEP_YAML, "sweep")):
        rc = cli.main(
            ["submit", str(yaml_path), "--backend", "submitit", "--run-dir", str(tmp_path / name), "--dry-run"]
        )
        out, err = capsys.readouterr()
        assert rc == 0, err
        assert "# backend: submitit" in out and "#SBATCH" in out, out
        assert not (tmp_path / name).exists()
    assert "submitit.core._submit" in out  # the sweep's script is submitit's own


@pytest.mark.parametrize("yaml_path", [JOB_YAML, SWEEP_YAML], ids=["run", "sweep"])
def test_submit_without_srun_is_one_line_and_writes_nothing(no_srun, tmp_path: Path, capsys, yaml_path) -> None:
    run_dir = tmp_path / "out"
    rc = cli.main(["submit", str(yaml_path), "--backend", "submitit", "--run-dir", str(run_dir), "--no-check-task"])
    err = capsys.readouterr().err
    assert rc == ClusterError.exit_code, err
    _one_error_line(err, "srun is not on PATH")
    assert not run_dir.exists()


def test_submitit_dry_run_without_submitit_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """``--backend submitit --dry-run`` on a machine without submitit: the backend's one-line error (what
    to install), not a traceback of the import of submitit's script writer; nothing written."""
    for name in [m for m in sys.modules if m == "submitit" or m.startswith("submitit.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "submitit", None)  # `import submitit` raises ImportError
    argv = ["submit", str(JOB_YAML), "--backend", "submitit", "--dry-run", "--no-check-task"]
    assert cli.main([*argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["slurm-ddp: error: --backend submitit needs submitit: pip install 'slurm-ddp[submitit]'"], err
    assert not (tmp_path / "run").exists()


@pytest.fixture
def hung_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``sbatch`` that never answers (a controller that does not reply: it sleeps, its PID appended to the
    returned file first), ``squeue`` that prints ``tmp_path/squeue.out``; submit waits 0.5 s for sbatch."""
    require_module("submitit", "the submitit backend")
    calls = tmp_path / "sbatch-pids"
    bindir = _bin(tmp_path, srun=True, sbatch_body=f"echo $$ >> {calls}\nexec sleep 600")
    (bindir / "squeue").write_text(f"#!/bin/bash\ncat {tmp_path / 'squeue.out'} 2>/dev/null\nexit 0\n")
    (bindir / "squeue").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(sbatch_backend, "SBATCH_TIMEOUT_S", 0.5)
    return calls


def _killed(calls: Path) -> List[int]:
    """The PIDs of the sbatch runs, each asserted gone (submit killed and reaped it)."""
    pids = [int(p) for p in calls.read_text().split()]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    return pids


@pytest.mark.parametrize("yaml_path,what", [(JOB_YAML, "the job"), (SWEEP_YAML, "the job array")], ids=["run", "sweep"])
def test_a_hung_sbatch_is_a_lost_answer_in_one_line_not_a_hang(hung_sbatch, tmp_path: Path, capsys, yaml_path, what):
    """sbatch under submitit waits at most ``sbatch.SBATCH_TIMEOUT_S`` (the sbatch backend's limit) for a job and
    a sweep's array alike: then it is killed and its answer counts as lost: squeue is asked for the job it may have
    made (none here): one line, nothing recorded, the intent kept for the next submit."""
    out_dir = tmp_path / "out"
    rc = cli.main(["submit", str(yaml_path), "--backend", "submitit", "--run-dir", str(out_dir), "--no-check-task"])
    err = capsys.readouterr().err
    assert rc == ClusterError.exit_code, err
    _one_error_line(
        err, f"sbatch did not answer within 0.5 s: the controller may or may not have made {what}, and squeue shows"
    )
    assert "squeue shows no such job; nothing was recorded" in err, err
    assert len(_killed(hung_sbatch)) == 1
    assert rundir.read_submit_intent(out_dir) is not None and not rundir.read_jobs(out_dir)


def test_the_job_a_hung_sbatch_made_is_found_and_never_submitted_twice(hung_sbatch, tmp_path: Path, capsys) -> None:
    """The lost-answer protection of the sbatch backend, through submitit: the job squeue shows for the run
    (user, job name, directory) is the one the hung sbatch made: recorded with a note, rc 0; a later submit
    into a run directory whose intent names a job Slurm has records it and refuses a second one."""
    from test_own_job import squeue_line

    user = sbatch_backend.current_user()
    found, later = tmp_path / "found", tmp_path / "later"
    lines = [squeue_line(job_id, "PENDING", d / "submitit", user=user) for job_id, d in (("77", found), ("78", later))]
    argv = ["submit", str(JOB_YAML), "--backend", "submitit", "--no-check-task", "--run-dir"]
    (tmp_path / "squeue.out").write_text(lines[0])
    assert cli.main([*argv, str(found)]) == 0
    err = capsys.readouterr().err
    assert "sbatch did not answer within 0.5 s; found the job it made: 77 (not submitted twice)" in err, err
    assert "Traceback" not in err and rundir.read_jobs(found)[-1]["job_id"] == "77"
    assert rundir.read_jobs(found)[-1]["found_after_lost_answer"] is True and not rundir.read_submit_intent(found)

    (tmp_path / "squeue.out").write_text("")  # the controller does not have it yet: the intent stays
    assert cli.main([*argv, str(later)]) == ClusterError.exit_code
    capsys.readouterr()
    (tmp_path / "squeue.out").write_text(lines[1])  # now it does: the next submit records it, submits nothing
    rc = cli.main([*argv, str(later)])
    err = capsys.readouterr().err
    assert rc == 2, err
    _one_error_line(err, f"run directory {str(later)!r} already has job 78, made by an earlier submit whose sbatch")
    assert rundir.read_jobs(later)[-1]["job_id"] == "78" and len(_killed(hung_sbatch)) == 2  # sbatch ran twice
