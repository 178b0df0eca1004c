"""The process entry points' one error path: ``run_main`` and the three ``python -m`` entries that
use it (rendezvous, launch, worker), each run as the batch shell or srun runs it."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurm_ddp import binding, errors, rendezvous
from slurm_ddp.entrypoint import one_line, run_main
from slurm_ddp.errors import (
    CheckpointError,
    EnvironmentMismatch,
    SlurmDDPError,
    UserError,
)

REPO = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict:
    """This environment without SLURM/MASTER variables, slurm_ddp importable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def _run(module: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, env=_env(**env), timeout=120, check=False
    )


# --------------------------------------------------------------------------- run_main


def test_run_main_returns_the_status_of_fn():
    assert run_main("prog", lambda: 0) == 0
    assert run_main("prog", lambda: 75) == 75


@pytest.mark.parametrize(
    "error, code",
    [
        (UserError("bad x"), 2),
        (CheckpointError("bad x"), 5),
        (EnvironmentMismatch("bad x"), 2),
        (SlurmDDPError("bad x"), 1),
    ],
)
def test_run_main_turns_an_error_into_one_line_and_its_exit_code(error, code):
    def fail() -> int:
        raise error

    err = io.StringIO()
    assert run_main("prog", fail, stderr=err) == code
    assert err.getvalue() == "prog: error: bad x\n"


def test_run_main_names_where_and_joins_a_message_of_several_lines():
    def fail() -> int:
        raise UserError("first\n  second\n")

    err = io.StringIO()
    assert run_main("prog", fail, where=lambda: "rank 3 on n2", stderr=err) == 2
    assert err.getvalue() == "prog: error: rank 3 on n2: first second\n"
    assert one_line("a\n\n b ") == "a b"


def test_run_main_lets_a_bug_through_unless_asked_to_report_it():
    def bug() -> int:
        raise KeyError("k")

    with pytest.raises(KeyError):
        run_main("prog", bug, stderr=io.StringIO())
    err = io.StringIO()
    assert run_main("prog", bug, where=lambda: "rank 0 on n1", report_crash=True, stderr=err) == 1
    lines = err.getvalue().splitlines()
    assert lines[0].startswith("Traceback") and lines[-1] == "prog: error: rank 0 on n1 failed: KeyError: 'k'"


def test_error_classes_live_in_errors_and_keep_their_old_names():
    assert binding.BindingError is errors.BindingError and errors.BindingError.exit_code == 2
    assert errors.PeerFailure.exit_code == 1 and errors.TrainingDiverged.exit_code == 1
    assert errors.CommandNotRunnable.exit_code == 127
    assert all(
        issubclass(c, SlurmDDPError)
        for c in (errors.BindingError, errors.PeerFailure, errors.TrainingDiverged, errors.CommandNotRunnable)
    )


# --------------------------------------------------------------------------- the three entry points


@pytest.mark.parametrize("nodelist", ["gpu-[001-", "n[3-1]", "a1,,a2"])
def test_rendezvous_with_a_malformed_nodelist_says_why_in_one_line(nodelist):
    r = _run("slurm_ddp.rendezvous", SLURM_JOB_NODELIST=nodelist, SLURM_JOB_ID="7")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].startswith("slurm_ddp rendezvous: error: bad SLURM nodelist") and repr(nodelist) in lines[0]


def test_rendezvous_prints_addr_and_port():
    r = _run("slurm_ddp.rendezvous", SLURM_JOB_NODELIST="gpu-[003-004]", MASTER_PORT="29400")
    assert (r.returncode, r.stdout, r.stderr) == (0, "gpu-003 29400\n", "")


def test_rendezvous_main_reports_a_bad_port_through_the_wrapper(monkeypatch, capsys):
    monkeypatch.setenv("MASTER_PORT", "0")
    assert rendezvous.main() == 2
    assert capsys.readouterr().err.startswith("slurm_ddp rendezvous: error: MASTER_PORT='0' is not a TCP port")


def test_launch_entry_reports_a_missing_run_dir_in_one_line(tmp_path):
    r = _run("slurm_ddp.launch", "--run-dir", str(tmp_path / "nope"), "--", "true")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    expected = (
        f"slurm_ddp launch: error: {tmp_path / 'nope' / 'config.yaml'} does not exist: "
        "--run-dir must be a run directory made by `slurm-ddp submit`"
    )
    assert r.stderr.splitlines() == [expected]


def test_launch_entry_cannot_run_the_command_is_127(tmp_path, make_config):
    from slurm_ddp.config import dump_config
    from slurm_ddp.env import synthetic_slurm_env

    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "config.yaml").write_text(dump_config(make_config({})))
    missing = str(tmp_path / "no-such-program")
    r = _run(
        "slurm_ddp.launch",
        "--run-dir",
        str(rd),
        "--",
        missing,
        **synthetic_slurm_env(rank=0, nodes=1, tasks_per_node=1),
    )
    assert r.returncode == 127 and "Traceback" not in r.stderr
    assert r.stderr.splitlines()[-1].startswith(f"slurm_ddp launch: error: cannot run {missing!r}: ")
    assert len([line for line in r.stderr.splitlines() if "error:" in line]) == 1


def test_worker_entry_outside_a_task_names_the_variable_in_one_line(tmp_path, make_config):
    from slurm_ddp.config import dump_config

    (tmp_path / "config.yaml").write_text(dump_config(make_config({})))
    r = _run("slurm_ddp.worker", "--run-dir", str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    last = r.stderr.splitlines()[-1]
    assert last.startswith("slurm_ddp worker: error: rank ? on ") and "SLURM_PROCID is not set" in last


def test_a_malformed_clustershell_config_is_one_line_not_an_import_failure(tmp_path):
    (tmp_path / "defaults.conf").write_text("not an ini file\n")
    r = _run("slurm_ddp.rendezvous", SLURM_JOB_NODELIST="n[1-2]", CLUSTERSHELL_CFGDIR=str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "ClusterShell" in lines[0] and "defaults.conf" in lines[0]
    assert _run("slurm_ddp.rendezvous", SLURM_JOB_NODELIST="n[1-2]", MASTER_PORT="29400").stdout == "n1 29400\n"


def test_a_task_s_no_restart_ends_the_process_with_the_do_not_restart_status() -> None:
    """Issue 52: ``slurm_ddp.NoRestart`` (the top-level name a task uses) is a one-line error with status 93,
    ``constants.NO_RESTART_EXIT_CODE`` (NVIDIA Resiliency Extension's ``--ft-no-restart-exit-code`` default)."""
    import io

    import slurm_ddp
    from slurm_ddp.entrypoint import run_main

    def task() -> int:
        raise slurm_ddp.NoRestart("shard 3 of the training data is missing")

    err = io.StringIO()
    assert run_main("w", task, stderr=err) == slurm_ddp.NO_RESTART_EXIT_CODE == 93
    assert err.getvalue() == "w: error: shard 3 of the training data is missing\n"
