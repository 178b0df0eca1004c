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

import pytest
from lib import require_module

from slurm_ddp import cli
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
