"""Credentials (issue 34, ``slurm_ddp.secrets``): the name and file rules, ``environment.pass_env``'s
checks, the literal-value warning, ``***`` in every printout, owner-only modes under umask 022, and
credential files left out of the code snapshot and the saved ``git diff``.

The ranks getting a ``pass_env`` value are tested with real processes in
tests/local/test_secrets_local.py and, across a requeue, in tests/slurm/test_secrets_slurm.py.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List

import pytest
from lib import require_module
from lib.own_project import git

from slurm_ddp.backends import plan_submit
from slurm_ddp.config import load_config
from slurm_ddp.durable import atomic_write_text
from slurm_ddp.errors import ConfigError
from slurm_ddp.secrets import (
    REDACTED,
    is_credential_file,
    is_credential_name,
    literal_warning,
    redact_argv,
    redact_env,
)
from slurm_ddp.snapshot import plan_snapshot

SECRET = "sk-live-0123456789abcdef"
CREDENTIAL_FILES = [".env", ".env.local", "keys/deploy.pem", "server.key", "id_rsa", "id_rsa.pub", ".netrc"]
CREDENTIAL_FILES += [".git-credentials", ".pypirc", "sub/.env"]


@pytest.fixture
def umask022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _project(tmp_path: Path, env_block: str = "") -> Path:
    """A git project: train.py, job.yaml (2 ranks), credential files tracked and not; returns job.yaml."""
    p = tmp_path / "project"
    (p / "keys").mkdir(parents=True)
    (p / "sub").mkdir()
    (p / "train.py").write_text("print('hi')\n")
    (p / "job.yaml").write_text(
        "name: secrets\nslurm: {nodes: 1, tasks_per_node: 2, time: '00:10:00'}\n"
        f"train: {{command: python train.py}}\n{env_block}"
    )
    for rel in ("keys/deploy.pem", "id_rsa", "server.key"):  # tracked
        (p / rel).write_text(f"PRIVATE {rel}\n")
    (p / ".env").write_text("TRACKED=1\n")
    git(p, "init", "-q")
    git(p, "add", "-A")
    git(p, "commit", "-qm", "project")
    for rel in (".env.local", "id_rsa.pub", ".netrc", ".git-credentials", ".pypirc", "sub/.env"):  # untracked
        (p / rel).write_text(f"WANDB_API_KEY={SECRET}\n")
    (p / ".env").write_text(f"WANDB_API_KEY={SECRET}\n")  # tracked, now dirty: the diff must leave it out
    return p / "job.yaml"


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "slurm_ddp", *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


def _files_holding(root: Path, value: str) -> List[Path]:
    return [p for p in root.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]


def _owner_only(path: Path, top: Path) -> bool:
    """No one but the owner can read ``path``: it or a directory on the way from ``top`` is owner-only."""
    p = path
    while True:
        if stat.S_IMODE(p.stat().st_mode) & 0o077 == 0:
            return True
        if p == top:
            return False
        p = p.parent


# ---------------------------------------------------------------------------------------------- rules
@pytest.mark.parametrize(
    "name",
    ["WANDB_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "MLFLOW_TRACKING_PASSWORD", "GCP_CREDENTIALS", "my_key"],
)
def test_credential_names(name: str) -> None:
    assert is_credential_name(name)


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "KEYBOARD", "TOKENS_PER_BATCH", "NCCL_DEBUG", "MONKEY"])
def test_ordinary_names(name: str) -> None:
    assert not is_credential_name(name)


@pytest.mark.parametrize("path", CREDENTIAL_FILES + ["a/b/ID_RSA", "x/.ENV"])
def test_credential_files(path: str) -> None:
    assert is_credential_file(path)


@pytest.mark.parametrize("path", ["env.py", "environment.yaml", "keys.py", "a/.envrc", "train.py", "pem.txt"])
def test_ordinary_files(path: str) -> None:
    assert not is_credential_file(path)


def test_redaction_helpers() -> None:
    env = {"WANDB_API_KEY": SECRET, "A": "b"}
    assert redact_env(env) == {"WANDB_API_KEY": REDACTED, "A": "b"}
    argv = ["slurm-ddp", "submit", "--set", f"environment.env.WANDB_API_KEY={SECRET}", "--set", "x=b"]
    assert redact_argv(argv, env) == [*argv[:3], f"environment.env.WANDB_API_KEY={REDACTED}", "--set", "x=b"]
    line = literal_warning(env)
    assert line is not None and "\n" not in line and "environment.pass_env: [WANDB_API_KEY]" in line
    assert literal_warning({"A": "b"}) is None
    # a value naming a variable (expanded at rank start) is no literal credential; $$ is a literal $
    assert literal_warning({"HF_TOKEN": "$NODE_TOKEN", "A": "b"}) is None
    assert "HF_TOKEN" in (literal_warning({"HF_TOKEN": "abc$$def"}) or "")


# ---------------------------------------------------------------------------------- pass_env checks
@pytest.mark.parametrize(
    "sets, key",
    [
        (["environment.pass_env=[1BAD]"], "environment.pass_env[0]"),
        (["environment.pass_env=[HF_TOKEN]", "environment.env.HF_TOKEN=x"], "environment.pass_env[0]"),
        (["environment.pass_env=[HF_TOKEN]", "slurm.extra.export=NONE"], "slurm.extra.export"),
    ],
)
def test_pass_env_config_errors(tmp_path: Path, sets: List[str], key: str) -> None:
    job = _project(tmp_path)
    with pytest.raises(ConfigError) as ei:
        load_config(job, sets)
    assert f"'{key}'" in str(ei.value) and "\n" not in str(ei.value)


@pytest.mark.parametrize("export", ["ALL", "HF_TOKEN,PATH", "ALL,FOO=1"])
def test_pass_env_with_an_export_that_keeps_it(tmp_path: Path, export: str) -> None:
    cfg = load_config(_project(tmp_path), ["environment.pass_env=[HF_TOKEN]", f"slurm.extra.export={export}"])
    assert cfg.environment.pass_env == ("HF_TOKEN",)


def test_submit_refuses_a_pass_env_name_not_set_in_its_shell(tmp_path: Path) -> None:
    job = _project(tmp_path)
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    r = _cli(
        "submit",
        str(job),
        "--backend",
        "local",
        "--run-dir",
        str(run_dir),
        "--set",
        "environment.pass_env=[HF_TOKEN]",
        env=env,
    )
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "environment.pass_env names HF_TOKEN, not set in this shell" in lines[0], r.stderr
    assert not run_dir.exists()


def test_batch_script_refuses_to_start_without_a_pass_env_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job did not get the variable (SBATCH_EXPORT=NONE in the submitting shell, say): one log line, exit 1."""
    from lib.fake_slurm import make_stubs, run_script

    cfg = load_config(_project(tmp_path), ["environment.pass_env=[HF_TOKEN]"])
    from slurm_ddp.render import render

    stubs = make_stubs(tmp_path, "touch " + str(tmp_path / "srun-ran"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    proc = run_script(render(cfg, str(tmp_path / "run")).script, tmp_path, stubs)
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 1, out
    assert "environment.pass_env names HF_TOKEN, which this job did not get" in out
    assert not (tmp_path / "srun-ran").exists()


# --------------------------------------------------------------------------- warning and redaction
def test_literal_credential_is_warned_about_and_redacted_in_render_and_dry_run(tmp_path: Path) -> None:
    job = _project(tmp_path)
    secret_set = f"environment.env.WANDB_API_KEY={SECRET}"
    for args in (
        ["render", str(job), "--set", secret_set],
        [
            "submit",
            str(job),
            "--backend",
            "sbatch",
            "--dry-run",
            "--run-dir",
            str(tmp_path / "run"),
            "--set",
            secret_set,
        ],
    ):
        r = _cli(*args)
        assert r.returncode == 0, r.stderr
        assert SECRET not in r.stdout + r.stderr, args
        assert f"export WANDB_API_KEY='{REDACTED}'" in r.stdout
        assert f"--set 'environment.env.WANDB_API_KEY={REDACTED}'" in r.stdout  # the "Made by" header
        warned = [ln for ln in r.stderr.splitlines() if "looks like a credential" in ln]
        assert len(warned) == 1 and "environment.pass_env: [WANDB_API_KEY]" in warned[0], r.stderr


def test_env_explain_shows_names_and_hides_values(tmp_path: Path) -> None:
    job = _project(tmp_path)
    env = {**os.environ, "HF_TOKEN": SECRET + "-hf"}
    r = _cli(
        "env", str(job), "--explain", "--set", f"environment.env.WANDB_API_KEY={SECRET}",
        "--set", "environment.env.NCCL_IB_SECRET=" + SECRET, "--set", "environment.pass_env=[HF_TOKEN]", env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert SECRET not in r.stdout
    assert f"WANDB_API_KEY='{REDACTED}'" in r.stdout and "pass_env" in r.stdout and "HF_TOKEN(set here)" in r.stdout


def test_ordinary_values_are_shown(tmp_path: Path) -> None:
    r = _cli("render", str(_project(tmp_path)), "--set", "environment.env.DATA_ROOT=/data/x")
    assert "export DATA_ROOT=/data/x" in r.stdout and r.stderr == ""


# ------------------------------------------------------------------------------------------- modes
def test_atomic_writes_follow_the_umask_unless_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a", "x")
        atomic_write_text(tmp_path / "b", "x", private=True)
        os.umask(0o077)
        atomic_write_text(tmp_path / "c", "x")
        os.umask(0)
        atomic_write_text(tmp_path / "d", "x", private=True)
    finally:
        os.umask(old)
    modes = {n: stat.S_IMODE((tmp_path / n).stat().st_mode) for n in "abcd"}
    assert modes == {"a": 0o644, "b": 0o600, "c": 0o600, "d": 0o600}


def _submit_sbatch(job: Path, run_dir: Path, *sets: str):
    from slurm_ddp.backends.sbatch import schedule

    plan = plan_submit(load_config(job, sets), "sbatch", str(run_dir), command=["slurm-ddp", "submit", *sets])

    def fake_sbatch(argv, **kw):
        return subprocess.CompletedProcess(argv, 0, stdout="4242\n", stderr="")

    schedule(plan, run=fake_sbatch)
    return plan


def test_run_dir_modes_under_umask_022_and_where_a_literal_lands(tmp_path: Path, umask022: None) -> None:
    job = _project(tmp_path)
    run_dir = tmp_path / "run"
    plan = _submit_sbatch(job, run_dir, f"environment.env.WANDB_API_KEY={SECRET}")
    mode = {p: stat.S_IMODE((run_dir / p).stat().st_mode) for p in ("config.yaml", "job.sbatch", "provenance.json")}
    assert mode == {"config.yaml": 0o600, "job.sbatch": 0o700, "provenance.json": 0o600}
    for d in ("code", "diffs"):
        assert stat.S_IMODE((run_dir / d).stat().st_mode) == 0o700, d
    for p in ("logs", "checkpoints"):  # the rest keeps the umask: collaborators read logs and metrics
        assert stat.S_IMODE((run_dir / p).stat().st_mode) == 0o755, p
    assert stat.S_IMODE((run_dir / "snapshot.json").stat().st_mode) == 0o644
    # the literal value is where sbatch needs it (job.sbatch) and in the config copy, both owner-only;
    # provenance.json records the submit command with *** instead
    holding = _files_holding(run_dir, SECRET)
    assert run_dir / "job.sbatch" in holding and run_dir / "config.yaml" in holding
    assert run_dir / "provenance.json" not in holding
    assert all(_owner_only(p, run_dir) for p in holding), [(p, oct(p.stat().st_mode)) for p in holding]
    argv = json.loads((run_dir / "provenance.json").read_text())["submits"][0]["argv"]
    assert f"environment.env.WANDB_API_KEY={REDACTED}" in argv
    assert plan.snapshot is not None


def test_an_existing_config_copy_becomes_owner_only_on_resubmit(tmp_path: Path, umask022: None) -> None:
    job = _project(tmp_path)
    run_dir = tmp_path / "run"
    _submit_sbatch(job, run_dir)
    os.chmod(run_dir / "config.yaml", 0o644)  # as an older slurm_ddp left it
    os.chmod(run_dir / "code", 0o755)
    _submit_sbatch(job, run_dir)
    assert stat.S_IMODE((run_dir / "config.yaml").stat().st_mode) == 0o600
    assert stat.S_IMODE((run_dir / "code").stat().st_mode) == 0o700


def _submitit_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Path, sets: List[str]) -> Path:
    require_module("submitit", "the submitit backend")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text("#!/bin/bash\necho 'Submitted batch job 4343'\n")
    # submitit only looks srun up (a machine without Slurm has none): this one fails loudly if run
    (bindir / "srun").write_text("#!/bin/sh\necho 'fake srun: a unit test ran srun' >&2\nexit 1\n")
    for name in ("sbatch", "srun"):
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    from slurm_ddp.backends.submitit_backend import schedule

    run_dir = tmp_path / "run"
    schedule(plan_submit(load_config(job, sets), "submitit", str(run_dir), command=["x"]))
    return run_dir


def test_submitit_folder_in_group_mode_holds_no_pass_env_value(
    tmp_path: Path, umask022: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    job = _project(tmp_path, "environment: {run_dir_mode: group, pass_env: [WANDB_API_KEY]}\n")
    run_dir = _submitit_schedule(tmp_path, monkeypatch, job, ["requeue.signal=USR2"])
    assert stat.S_IMODE((run_dir / "submitit").stat().st_mode) == 0o750
    assert _files_holding(run_dir, SECRET) == []  # its pickles and batch script included


def test_submitit_folder_is_owner_only(tmp_path: Path, umask022: None, monkeypatch: pytest.MonkeyPatch) -> None:
    sets = [f"environment.env.WANDB_API_KEY={SECRET}", "requeue.signal=USR2"]
    run_dir = _submitit_schedule(tmp_path, monkeypatch, _project(tmp_path), sets)
    assert stat.S_IMODE((run_dir / "submitit").stat().st_mode) == 0o700
    holding = _files_holding(run_dir, SECRET)
    assert any("submitit" in p.parts for p in holding)  # its batch script exports the literal
    assert all(_owner_only(p, run_dir) for p in holding), holding


def _modes(top: Path, *rels: str) -> dict:
    return {r: oct(stat.S_IMODE((top / r).stat().st_mode)) for r in rels}


def test_every_run_dir_mode_has_modes_that_give_others_nothing() -> None:
    from slurm_ddp.constants import RUN_DIR_MODES
    from slurm_ddp.rundir import private_modes

    assert private_modes() == private_modes("private")
    for name in RUN_DIR_MODES:
        m = private_modes(name)
        assert not (m.file | m.script | m.dir) & 0o007, name
        assert (m.file, m.script, m.dir) == ((0o600, 0o700, 0o700) if name == "private" else (0o640, 0o750, 0o750))
    with pytest.raises(ValueError, match="private, group"):
        private_modes("world")


def test_apply_private_modes_sets_every_private_file_and_directory_present_and_nothing_else(tmp_path: Path) -> None:
    from slurm_ddp.rundir import apply_private_modes

    for d in ("diffs", "submitit", "logs"):
        (tmp_path / d).mkdir(mode=0o755)
    for f in ("config.yaml", "job.sbatch", "metrics.jsonl"):
        (tmp_path / f).write_text("x\n")
        os.chmod(tmp_path / f, 0o644)
    rels = ("diffs", "submitit", "config.yaml", "job.sbatch", "logs", "metrics.jsonl")
    apply_private_modes(tmp_path, "group")
    assert _modes(tmp_path, *rels) == dict(zip(rels, ("0o750", "0o750", "0o640", "0o750", "0o755", "0o644")))
    apply_private_modes(tmp_path)
    assert _modes(tmp_path, *rels) == dict(zip(rels, ("0o700", "0o700", "0o600", "0o700", "0o755", "0o644")))


def test_group_run_dir_mode_opens_the_config_files_to_the_group_only_and_pass_env_values_land_nowhere(
    tmp_path: Path, umask022: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 50: a shared project's group reads config.yaml, job.sbatch, provenance.json, code/ and diffs/
    (0640/0750, never others); the secret handed over by name is in no file; the job's own start keeps the
    mode; going back to private is the same run and closes them again."""
    from slurm_ddp.rundir.provenance import record_start

    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    job = _project(tmp_path, "environment: {run_dir_mode: group, pass_env: [WANDB_API_KEY]}\n")
    run_dir = tmp_path / "run"
    plan = _submit_sbatch(job, run_dir)
    assert plan.warnings == tuple(w for w in plan.warnings if "run_dir_mode" not in w)  # umask 022: nothing to say
    files, dirs = ("config.yaml", "provenance.json"), ("code", "diffs")
    want = {**dict.fromkeys(files, "0o640"), "job.sbatch": "0o750", **dict.fromkeys(dirs, "0o750")}
    assert _modes(run_dir, *files, "job.sbatch", *dirs) == want
    diffs = list((run_dir / "diffs").iterdir())
    assert diffs and all(_modes(d.parent, d.name)[d.name] == "0o640" for d in diffs)
    assert _files_holding(run_dir, SECRET) == []  # pass_env: the value is written nowhere
    record_start(str(run_dir), {}, job_id="4242", restart=0, world_size=2)  # rank 0 rewrites provenance.json
    assert _modes(run_dir, "provenance.json") == {"provenance.json": "0o640"}
    _submit_sbatch(job, run_dir, "environment.run_dir_mode=private")  # the same run: resubmitted, not refused
    want = {**dict.fromkeys(files, "0o600"), "job.sbatch": "0o700", **dict.fromkeys(dirs, "0o700")}
    assert _modes(run_dir, *files, "job.sbatch", *dirs) == want
    record_start(str(run_dir), {}, job_id="4243", restart=0, world_size=2)
    assert _modes(run_dir, "provenance.json") == {"provenance.json": "0o600"}


def test_group_run_dir_mode_with_a_literal_credential_is_refused_in_one_line(tmp_path: Path) -> None:
    job = _project(tmp_path, "environment: {run_dir_mode: group}\n")
    r = _cli(
        "submit",
        str(job),
        "--backend",
        "sbatch",
        "--dry-run",
        "--run-dir",
        str(tmp_path / "run"),
        "--set",
        f"environment.env.HF_TOKEN={SECRET}",
    )
    assert r.returncode == 2 and SECRET not in r.stdout + r.stderr, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "environment.run_dir_mode: group would let the group read HF_TOKEN" in lines[0]
    assert "environment.pass_env: [HF_TOKEN]" in lines[0] and not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="WANDB_API_KEY"):
        load_config(job, ["environment.env.WANDB_API_KEY=abc"])
    load_config(job, ["environment.env.HF_TOKEN=$NODE_TOKEN", "environment.env.DATA=/d"])  # no literal: allowed


def test_group_run_dir_mode_under_a_closed_umask_says_so_in_one_line(tmp_path: Path) -> None:
    job = _project(tmp_path, "environment: {run_dir_mode: group}\n")
    old = os.umask(0o077)
    try:
        plan = plan_submit(load_config(job), "sbatch", str(tmp_path / "run"))
        os.umask(0o027)
        fine = plan_submit(load_config(job), "sbatch", str(tmp_path / "run"))
    finally:
        os.umask(old)
    said = [w for w in plan.warnings if "run_dir_mode" in w]
    assert len(said) == 1 and "umask 0077" in said[0] and "umask 0027" in said[0], plan.warnings
    assert not [w for w in fine.warnings if "run_dir_mode" in w]


def test_a_sweep_in_group_mode_gives_its_scripts_configs_and_snapshot_the_group_modes(
    tmp_path: Path, umask022: None
) -> None:
    from slurm_ddp.backends.array import plan_sweep, prepare_sweep_dir
    from slurm_ddp.sweep import load_sweep

    job = _project(tmp_path, "environment: {run_dir_mode: group}\nsweep: {grid: {train.args.seed: [1, 2]}}\n")
    sw = load_sweep(job)
    assert sw is not None
    sd = tmp_path / "sweep"
    prepare_sweep_dir(plan_sweep(sw, "sbatch", str(sd)))
    assert _modes(sd, "array.sbatch", "code", "provenance.json", "000/config.yaml", "001/config.yaml") == {
        "array.sbatch": "0o750",
        "code": "0o750",
        "provenance.json": "0o640",
        "000/config.yaml": "0o640",
        "001/config.yaml": "0o640",
    }


# ---------------------------------------------------------------------------------------- snapshot
def test_snapshot_leaves_out_credential_files_tracked_or_not(tmp_path: Path, umask022: None) -> None:
    job = _project(tmp_path)
    snap = plan_snapshot(load_config(job), str(tmp_path / "run"))
    assert snap is not None
    assert sorted(snap.skipped) == sorted(CREDENTIAL_FILES)
    assert {f.rel for f in snap.files} == {"job.yaml", "train.py"}
    r = _cli("submit", str(job), "--backend", "sbatch", "--dry-run", "--run-dir", str(tmp_path / "run"))
    skipped = [ln for ln in r.stderr.splitlines() if "credential file" in ln]
    assert len(skipped) == 1 and all(name in skipped[0] for name in CREDENTIAL_FILES), r.stderr
    run_dir = tmp_path / "run"
    _submit_sbatch(job, run_dir)
    assert not [p for p in (run_dir / "code").rglob("*") if is_credential_file(p.name)]
    assert _files_holding(run_dir, SECRET) == []  # not in the snapshot, nor in the saved git diff of .env
