"""A submit from inside a job: the caller's job and step variables stay out of the new job (issue 50).

``slurm_ddp.submitenv`` is the rule; the sbatch, submitit and local backends and the batch script ask it.
The step environment below is the one a task of ``srun -c1 --mem=500M --cpu-bind=map_cpu:0`` saw on the
sandbox (Slurm 22.05, shortened).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any, Dict, List

import pytest
from lib import require_module

from slurm_ddp.backends import plan_submit
from slurm_ddp.render import render, sbatch_options
from slurm_ddp.submitenv import SRUN_INPUT, batch_unset, caller_job_variables, in_job, submit_environ
from slurm_ddp.supervise import drop_inherited, plan_of_script

STEP_ENV = {
    "SLURMD_NODENAME": "n2",
    "SLURM_CLUSTER_NAME": "sdb629ece",
    "SLURM_CONF": "/srv/cluster/etc/slurm.conf",
    "SLURM_CPUS_ON_NODE": "1",
    "SLURM_CPUS_PER_TASK": "1",
    "SLURM_CPU_BIND": "quiet,map_cpu:0",
    "SLURM_CPU_BIND_LIST": "0",
    "SLURM_CPU_BIND_TYPE": "map_cpu:",
    "SLURM_DISTRIBUTION": "cyclic",
    "SLURM_JOBID": "2",
    "SLURM_JOB_ID": "2",
    "SLURM_JOB_NODELIST": "n2",
    "SLURM_MEM_PER_NODE": "500",
    "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_SRUN_COMM_HOST": "10.202.154.253",
    "SLURM_UMASK": "0022",
    "SLURM_WORKING_CLUSTER": "sdb629ece:10.202.154.254:22410:9728:109",
    "SRUN_DEBUG": "3",
    # a rank of a slurm_ddp job that submits the next one (a chain)
    "SLURM_DDP_BACKEND": "submitit",
    "SLURM_DDP_RUN_DIR": "/home/me/runs/first",
    "MASTER_ADDR": "n2",
    "MASTER_PORT": "15002",
    "RANK": "0",
    "WORLD_SIZE": "2",
    # sbatch's and the user's own settings
    "SBATCH_MEM_BIND": "local",
    "SBATCH_PARTITION": "gpu",
    "SLURM_TIME_FORMAT": "relative",
    "SLURM_DDP_PREFLIGHT_CACHE": "0",
    "WANDB_API_KEY": "k",
    "PATH": "/usr/bin",
    "HOME": "/home/me",
}


def test_a_step_s_variables_are_cleared_and_the_client_s_settings_kept() -> None:
    assert in_job(STEP_ENV)
    cleared = caller_job_variables(STEP_ENV)
    for name in (
        "SLURM_CPU_BIND",
        "SLURM_DISTRIBUTION",
        "SLURM_MEM_PER_NODE",
        "SLURM_JOB_ID",
        "SLURM_CPUS_PER_TASK",
        "SLURMD_NODENAME",
        "SRUN_DEBUG",
        "SLURM_WORKING_CLUSTER",
        "SLURM_DDP_BACKEND",
        "SLURM_DDP_RUN_DIR",
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "SBATCH_MEM_BIND",  # Slurm sets it in a job; sbatch reads it as --mem-bind
    ):
        assert name in cleared, name
    env = submit_environ(STEP_ENV)
    assert env == {
        "SLURM_CONF": "/srv/cluster/etc/slurm.conf",
        "SBATCH_PARTITION": "gpu",
        "SLURM_TIME_FORMAT": "relative",
        "SLURM_DDP_PREFLIGHT_CACHE": "0",
        "WANDB_API_KEY": "k",
        "PATH": "/usr/bin",
        "HOME": "/home/me",
    }
    assert cleared == sorted(cleared) and not set(cleared) & set(env)


def test_pass_env_keeps_a_name_on_purpose() -> None:
    env = submit_environ(STEP_ENV, keep=["SLURM_MEM_PER_NODE", "MASTER_PORT"])
    assert env["SLURM_MEM_PER_NODE"] == "500" and env["MASTER_PORT"] == "15002"
    assert "SLURM_CPU_BIND" not in env


def test_from_a_login_shell_nothing_is_left_out() -> None:
    login = {
        "MASTER_PORT": "29500",
        "SBATCH_MEM_BIND": "local",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_MPI_TYPE": "pmix",  # a site's module sets it for srun
        "X": "1",
    }
    assert not in_job(login)
    assert caller_job_variables(login) == []
    assert submit_environ(login, submit_dir="/runs/a") == {**login, "SLURM_DDP_SUBMIT_DIR": "/runs/a"}
    # a local rank's synthetic job: every Slurm and rank variable of the caller counts
    assert caller_job_variables(login, inside=True) == ["MASTER_PORT", "SBATCH_MEM_BIND", "SLURM_MPI_TYPE"]


def test_the_batch_script_unsets_only_what_its_own_request_does_not_set(make_config: Any) -> None:
    cfg = make_config({"slurm": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 2}})
    names = batch_unset(sbatch_options(cfg))
    assert {"SLURM_CPU_BIND", "SLURM_DISTRIBUTION", "SLURM_MEM_PER_NODE", "SLURM_GPUS_PER_TASK"} <= set(names)
    # the job's own (Slurm sets them from its #SBATCH lines), its identity, the cluster
    for own in ("SLURM_CPUS_PER_TASK", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_ID", "SLURM_NNODES", "SLURM_CONF"):
        assert own not in names, own
    assert set(names) <= SRUN_INPUT
    gpu = make_config({"slurm": {"mem_gb": 4, "gpus_per_task": 1, "extra": {"distribution": "block"}}})
    kept = set(SRUN_INPUT) - set(batch_unset(sbatch_options(gpu), keep=["SLURM_MPI_TYPE"]))
    assert {"SLURM_MEM_PER_NODE", "SLURM_GPUS_PER_TASK", "SLURM_DISTRIBUTION", "SLURM_MPI_TYPE"} <= kept


def _script_env(script: str, env: Dict[str, str]) -> Dict[str, str]:
    """The SLURM_* variables the job's supervisor holds, started by the batch script with ``env``, before the
    script's exports of environment.env (``supervise.drop_inherited`` with the script's plan)."""
    held = {"PATH": os.environ["PATH"], **env}
    drop_inherited(plan_of_script(script), held)
    return {k: v for k, v in held.items() if k.startswith("SLURM_")}


def test_a_script_started_by_hand_drops_an_inherited_srun_option_and_keeps_its_own(
    tmp_path: Path, make_config: Any
) -> None:
    cfg = make_config(
        {"slurm": {"cpus_per_task": 2}, "environment": {"env": {"SLURM_MPI_TYPE": "pmix"}, "pass_env": ["SLURM_HINT"]}}
    )
    run_dir = tmp_path / "run dir"
    script = render(cfg, str(run_dir)).script
    inherited = {
        "SLURM_DISTRIBUTION": "cyclic",
        "SLURM_CPU_BIND": "quiet,map_cpu:0",
        "SLURM_MEM_PER_NODE": "500",
        "SLURM_CPUS_PER_TASK": "2",  # Slurm's, from this job's --cpus-per-task
        "SLURM_JOB_ID": "7",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_HINT": "nomultithread",  # environment.pass_env
        "SLURM_MPI_TYPE": "pmi2",  # the export of environment.env comes later, and wins
    }
    assert _script_env(script, inherited) == {
        "SLURM_CPUS_PER_TASK": "2",
        "SLURM_JOB_ID": "7",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SLURM_HINT": "nomultithread",
        "SLURM_MPI_TYPE": "pmi2",
    }
    # submitted by slurm-ddp submit (its environment names this run directory): nothing is unset, so what a
    # login shell handed on (a site's SLURM_MPI_TYPE, ...) reaches srun as it always did
    submitted = submit_environ(inherited, submit_dir=str(run_dir), inside=False)
    assert _script_env(script, submitted) == {**inherited, "SLURM_DDP_SUBMIT_DIR": str(run_dir)}
    # ... but a marker of another run directory (a rank of another run that ran sbatch by hand) is not this one
    assert "SLURM_DISTRIBUTION" not in _script_env(script, {**inherited, "SLURM_DDP_SUBMIT_DIR": "/other"})


@pytest.fixture
def in_a_step(monkeypatch: pytest.MonkeyPatch) -> Dict[str, str]:
    for k, v in STEP_ENV.items():
        monkeypatch.setenv(k, v)
    return STEP_ENV


def test_sbatch_runs_without_the_caller_s_job(tmp_path: Path, make_config: Any, in_a_step: Dict[str, str]) -> None:
    from slurm_ddp.backends.sbatch import schedule

    cfg = make_config({"train": {"snapshot": False}, "environment": {"pass_env": ["WANDB_API_KEY", "SLURM_HINT"]}})
    os.environ["SLURM_HINT"] = "nomultithread"
    seen: List[Dict[str, str]] = []

    def fake_sbatch(argv: Any, **kw: Any) -> subprocess.CompletedProcess:
        seen.append(kw["env"])
        return subprocess.CompletedProcess(argv, 0, stdout="4242\n", stderr="")

    assert schedule(plan_submit(cfg, "sbatch", str(tmp_path / "run")), run=fake_sbatch) == "4242"
    (env,) = seen
    assert not any(k.startswith(("SLURM_JOB", "SLURM_CPU", "SLURM_DIST", "SRUN_", "SLURMD_")) for k in env), env
    assert "MASTER_ADDR" not in env and "SLURM_DDP_BACKEND" not in env
    assert env["SLURM_CONF"] == STEP_ENV["SLURM_CONF"] and env["WANDB_API_KEY"] == "k"
    assert env["SLURM_HINT"] == "nomultithread" and env["PATH"] == os.environ["PATH"]
    assert env["SLURM_DDP_SUBMIT_DIR"] == str(tmp_path / "run")  # the batch script then unsets nothing
    assert os.environ["SLURM_JOB_ID"] == "2"  # this process's own environment is untouched


def test_submitit_s_sbatch_runs_without_the_caller_s_job(
    tmp_path: Path, make_config: Any, in_a_step: Dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    require_module("submitit", "the submitit backend")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    dump = tmp_path / "sbatch-env"
    (bindir / "sbatch").write_text(f"#!/bin/bash\nenv > {dump}\necho 'Submitted batch job 4343'\n")
    (bindir / "srun").write_text("#!/bin/sh\necho 'fake srun: a unit test ran srun' >&2\nexit 1\n")
    for name in ("sbatch", "srun"):
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    from slurm_ddp.backends.submitit_backend import schedule

    cfg = make_config({"train": {"snapshot": False}, "environment": {"pass_env": ["WANDB_API_KEY"]}})
    assert schedule(plan_submit(cfg, "submitit", str(tmp_path / "run"))) == "4343"
    env = dict(line.split("=", 1) for line in dump.read_text().splitlines() if "=" in line)
    assert "SLURM_CPU_BIND" not in env and "SLURM_JOB_ID" not in env and "MASTER_ADDR" not in env
    assert env["SLURM_CONF"] == STEP_ENV["SLURM_CONF"] and env["WANDB_API_KEY"] == "k"
    assert os.environ["SLURM_CPU_BIND"] == "quiet,map_cpu:0"  # given back after the submit


def test_a_local_rank_gets_none_of_the_caller_s_job(tmp_path: Path, make_config: Any) -> None:
    from slurm_ddp.backends.local import rank_environ

    cfg = make_config({"slurm": {"tasks_per_node": 2}, "train": {"snapshot": False}})
    plan = plan_submit(cfg, "local", str(tmp_path / "run"))
    env = rank_environ(plan, 1, "9", 29501, 0, base=dict(STEP_ENV))
    assert env["SLURM_PROCID"] == "1" and env["SLURM_JOB_ID"] == "9" and env["MASTER_PORT"] == "29501"
    assert "SLURM_CPU_BIND" not in env and "SLURM_DISTRIBUTION" not in env and "SRUN_DEBUG" not in env
    assert "RANK" not in env and env["SLURM_CONF"] == STEP_ENV["SLURM_CONF"]
    login = rank_environ(plan, 0, "9", 29501, 0, base={"SLURM_CPU_BIND": "cores", "MASTER_ADDR": "x", "HOME": "/h"})
    assert "SLURM_CPU_BIND" not in login and login["MASTER_ADDR"] == "127.0.0.1" and login["HOME"] == "/h"
