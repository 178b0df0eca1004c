"""``environment.env`` values with ``$NAME``: expanded at rank start in the rank's environment, by the rank
wrapper, with ``train.command``'s one rule (``config.expand_variables``): ``$$`` a literal ``$``, an unset name
one line and exit 2. Real processes: ``python -m slurm_ddp.launch`` as srun, torchrun, the local supervisor and
submitit start every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence

import pytest

from slurm_ddp.config import dump_config, env_as_written
from slurm_ddp.env import synthetic_slurm_env
from slurm_ddp.errors import ConfigError

SHOW = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %r}))"


def _run_dir(tmp_path: Path, cfg: Any) -> Path:
    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    (rd / "config.yaml").write_text(dump_config(cfg))
    return rd


def _launch(rd: Path, names: List[str], extra: Dict[str, str], inner: Sequence[str] = ()) -> Any:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_", "KMP_", "TORCHELASTIC"))}
    env.update(synthetic_slurm_env(rank=1, nodes=1, tasks_per_node=2))
    env.update(extra)
    wrapper = [sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(rd), "--"]
    cmd = [*wrapper, *inner, sys.executable, "-c", SHOW % names]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def test_the_rank_sees_env_values_expanded_in_its_environment(tmp_path: Path, make_config: Any) -> None:
    env = {
        "HF_HOME": "$SCRATCH/hf",
        "RANK_LOG": "${SLURM_DDP_RUN_DIR}/rank$RANK.log",
        "PRICE": "cost$$5 and $$SCRATCH",
        "PATH": "/opt/tools/bin:$PATH",
        "PLAIN": "as written",
    }
    cfg = make_config({"environment": {"env": env}})
    assert env_as_written(cfg.environment.env) == {"PLAIN": "as written"}  # what the batch shell exports
    rd = _run_dir(tmp_path, cfg)
    path = os.environ["PATH"]
    # the batch shell exported PLAIN (as written); the wrapper sets the rest at rank start
    r = _launch(rd, [*env, "SLURM_DDP_ENV_EXPANDED"], {"SCRATCH": "/scratch/me", "PLAIN": "as written"})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["HF_HOME"] == "/scratch/me/hf"
    assert got["RANK_LOG"] == f"{rd.resolve()}/rank1.log"  # the rank's own variables, as in train.command
    assert got["PRICE"] == "cost$5 and $SCRATCH"  # $$ is a literal $
    # the ranks' interpreter's directory first (launch.python_first_on_path), before environment.env's additions
    ranks_path = f"{os.path.dirname(sys.executable)}:/opt/tools/bin:{path}"
    assert got["PATH"] == ranks_path
    assert got["PLAIN"] == "as written"

    # a rank that starts through the wrapper twice (submitit's train.command) expands once
    again = [sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(rd), "--"]
    r = _launch(rd, ["PATH", "HF_HOME"], {"SCRATCH": "/scratch/me"}, inner=again)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"PATH": ranks_path, "HF_HOME": "/scratch/me/hf"}


def test_an_unset_name_stops_the_rank_with_one_line(tmp_path: Path, make_config: Any) -> None:
    rd = _run_dir(tmp_path, make_config({"environment": {"env": {"HF_HOME": "$SCRATCH_NEVER_SET/hf"}}}))
    r = _launch(rd, ["HF_HOME"], {})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(
        "slurm_ddp launch: error: environment.env.HF_HOME names $SCRATCH_NEVER_SET, which is not set in the rank's "
        "environment"
    ), lines
    assert "write $$ for a literal $" in lines[0]


@pytest.mark.parametrize("value", ["a$", "$(date)", "${NAME-x}", "cost $5"])
def test_a_dollar_that_starts_no_name_is_a_config_error_without_the_value(make_config: Any, value: str) -> None:
    with pytest.raises(ConfigError) as e:
        make_config({"environment": {"env": {"API_TOKEN": value}}})
    msg = str(e.value)
    assert msg.startswith("config key 'environment.env.API_TOKEN': a '$' must start $NAME or ${NAME}; write $$")
    assert value not in msg and "\n" not in msg  # a value may be a credential: never shown


def test_the_local_backend_and_submitit_leave_dollar_values_to_the_wrapper(tmp_path: Path, make_config: Any) -> None:
    from slurm_ddp.backends import plan_submit
    from slurm_ddp.backends.local import rank_environ
    from slurm_ddp.backends.submitit_backend import config_parameters

    cfg = make_config({"train": {"snapshot": False}, "environment": {"env": {"A": "$HOME/a", "B": "b"}}})
    plan = plan_submit(cfg, "local", str(tmp_path / "run"))
    env = rank_environ(plan, 0, "1", 29500, 0, base={"HOME": "/home/me"})
    assert env["B"] == "b" and "A" not in env
    setup = config_parameters(cfg)["setup"]
    assert "export B=b" in setup and not any(line.startswith("export A=") for line in setup)


def test_env_explain_says_which_values_are_expanded_at_rank_start(make_config: Any) -> None:
    from slurm_ddp.explain import environment_lines

    cfg = make_config({"environment": {"env": {"HF_HOME": "$SCRATCH/hf", "A": "b"}}})
    assert environment_lines(cfg, {}) == [
        "environment: env A=b HF_HOME='$SCRATCH/hf' (HF_HOME: $NAME expanded in each rank's environment at its start)"
    ]
