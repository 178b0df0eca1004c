"""The traps of a user's first hour (issue 43): what ``submit`` does where Slurm is not on PATH, what a
dry run checks, and the shell syntax the rank wrapper would not run. Real processes where the finding is
about one (``slurm-ddp`` started with a PATH that has no Slurm commands)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import pytest
import yaml
from lib import require_module

SLURM_COMMANDS = ("sbatch", "srun", "salloc", "scontrol", "squeue", "scancel", "sacct", "sinfo")


def path_without_slurm(tmp_path: Path) -> str:
    """A PATH with this machine's commands except Slurm's (a login node before ``module load slurm``)."""
    bindir = tmp_path / "bin-no-slurm"
    bindir.mkdir(exist_ok=True)
    for d in (os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            target = bindir / name
            if name in SLURM_COMMANDS or target.exists() or target.is_symlink():
                continue
            target.symlink_to(os.path.join(d, name))
    return str(bindir)


def slurm_ddp(args: List[str], cwd: Path, path: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "slurm_ddp", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def write_command_job(tmp_path: Path, slurm: dict, **train) -> Path:
    (tmp_path / "train.py").write_text("open('started', 'w').write('a rank ran')\n")
    job = tmp_path / "job.yaml"
    data = {"name": "t", "slurm": {"time": "00:10:00", **slurm}, "train": {"command": "python train.py", **train}}
    job.write_text(yaml.safe_dump(data))
    return job


# --------------------------------------------------------------------------- auto without Slurm


@pytest.mark.parametrize(
    "slurm, named",
    [({"nodes": 2, "tasks_per_node": 4}, "slurm.nodes=2"), ({"partition": "gpu"}, "slurm.partition=gpu")],
    ids=["two-nodes", "partition"],
)
@pytest.mark.parametrize("dry_run", [False, True], ids=["submit", "dry-run"])
def test_auto_without_slurm_refuses_a_cluster_job(tmp_path, slurm, named, dry_run):
    job = write_command_job(tmp_path, slurm)
    args = ["submit", str(job), "--run-dir", str(tmp_path / "run")] + (["--dry-run"] if dry_run else [])
    out = slurm_ddp(args, tmp_path, path_without_slurm(tmp_path))
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--backend local" in lines[0] and named in lines[0], out.stderr
    assert "Slurm was not found" in lines[0]
    assert not (tmp_path / "started").exists() and not (tmp_path / "run").exists()


def test_auto_without_slurm_runs_a_plain_job_here_and_says_so(tmp_path):
    job = write_command_job(tmp_path, {"nodes": 1, "tasks_per_node": 1})
    out = slurm_ddp(["submit", str(job), "--dry-run"], tmp_path, path_without_slurm(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "Slurm was not found" in out.stderr and "--backend local" in out.stderr
    assert "backend: local" in out.stdout


def test_api_auto_without_slurm_refuses_a_cluster_job(tmp_path, monkeypatch):
    import slurm_ddp
    from slurm_ddp.errors import UserError

    job = write_command_job(tmp_path, {"nodes": 2})
    monkeypatch.setenv("PATH", path_without_slurm(tmp_path))
    with pytest.raises(UserError, match="--backend local"):
        slurm_ddp.submit(job, run_dir=tmp_path / "run", backend="auto")
    assert not (tmp_path / "run").exists() and not (tmp_path / "started").exists()


# --------------------------------------------------------------------------- a dry run checks what submit checks

BAD_COMMANDS = [
    ({"train.command": "python trian.py"}, "script"),
    ({"train.command": "pythn train.py"}, "'pythn' is not found"),
    ({"environment.python": "/nonexistent/python"}, "/nonexistent/python"),
    ({"train.command": "python train.py --name $(date)"}, "$("),
    ({"train.command": "python train.py > log.txt 2>&1"}, "> (a redirection)"),
]


@pytest.mark.parametrize("sets, named", BAD_COMMANDS, ids=[str(s) for s, _ in BAD_COMMANDS])
def test_dry_run_refuses_what_submit_refuses_in_one_line(tmp_path, sets, named):
    job = write_command_job(tmp_path, {"nodes": 1})
    flags = [f for k, v in sets.items() for f in ("--set", f"{k}={v}")]
    out = slurm_ddp(["submit", str(job), "--backend", "sbatch", "--dry-run", *flags], tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("slurm-ddp: error: ") and named in lines[0], out.stderr
    assert out.stdout == "" and not (tmp_path / "runs").exists()
    if "$(" in named or ">" in named:
        assert "wrapper script" in lines[0] and "exec" in lines[0]
        render = slurm_ddp(["render", str(job), *flags], tmp_path)  # render refuses it too
        assert render.returncode == 2 and render.stderr.strip() == lines[0], render.stderr


def test_dry_run_of_a_good_command_passes(tmp_path):
    job = write_command_job(tmp_path, {"nodes": 1})
    out = slurm_ddp(["submit", str(job), "--backend", "sbatch", "--dry-run"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert "#SBATCH" in out.stdout


@pytest.mark.parametrize(
    "command",
    [
        "python train.py --out '>' x.txt",  # a quoted '>' is an argument
        'python train.py --sep "a|b;c"',
        "python train.py --ckpt $SLURM_DDP_RUN_DIR/ckpt --tag rank${RANK} --cost $$5",  # the rank wrapper's $NAME
        ["python", "train.py", ">", "x"],  # a list is argv as given
    ],
)
def test_quoted_operators_and_variables_are_not_shell_syntax(command):
    from slurm_ddp.config import config_from_dict

    assert config_from_dict({"name": "x", "train": {"command": command}}).train.command[0] == "python"


@pytest.mark.parametrize(
    "command, named",
    [
        ("python a.py | tee log", "| (a pipe)"),
        ("python a.py && echo done", "&& (a command list)"),
        ("python a.py; echo x", "; (a command list)"),
        ("python a.py || true", "|| (a command list)"),
        ("python a.py `date`", "` (command substitution)"),
        ('python a.py "--at $(date)"', "$( (command substitution)"),
        ("python a.py < in.txt", "< (a redirection)"),
        (["python", "a.py", "$(date)"], "$(...)"),
        (["python", "a.py", "${A:-x}"], "$NAME or ${NAME}"),
    ],
)
def test_shell_syntax_in_train_command_is_one_line(command, named):
    from slurm_ddp.config import config_from_dict
    from slurm_ddp.errors import ConfigError

    with pytest.raises(ConfigError) as ei:
        config_from_dict({"name": "x", "train": {"command": command}})
    msg = str(ei.value)
    assert "\n" not in msg and named in msg and "train.command" in msg


# --------------------------------------------------------------------------- smaller surprises (item 8)

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "examples" / "digits" / "job.yaml"


def test_render_says_the_script_runs_only_where_submit_prepared_it(tmp_path):
    out = slurm_ddp(["render", str(DIGITS)], tmp_path)
    assert out.returncode == 0, out.stderr
    header = out.stdout.split("\nset -u\n", 1)[0]
    assert "`slurm-ddp submit` prepares" in header and "cannot run alone" in header


def test_submitit_dry_run_prints_submitits_own_script(tmp_path):
    require_module("submitit", "the submitit backend's dry run")
    args = ["submit", str(DIGITS), "--backend", "submitit", "--dry-run", "--no-check-task"]
    out = slurm_ddp([*args, "--run-dir", str(tmp_path / "run")], tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("# backend: submitit")
    assert "-m submitit.core._submit" in out.stdout and "#SBATCH --wckey=submitit" in out.stdout
    assert "# Signal plan" not in out.stdout  # the sbatch backend's script is not what submitit runs
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "slurm, key, named",
    [
        ({"mem_gb": 4, "extra": {"mem-per-gpu": "8G"}}, "slurm.extra.mem-per-gpu", "slurm.mem_gb"),
        ({"mem_gb": 4, "extra": {"mem_per_cpu": "1G"}}, "slurm.extra.mem_per_cpu", "slurm.mem_gb"),
        ({"extra": {"mem-per-cpu": "1G", "mem-per-gpu": "8G"}}, "slurm.extra.mem-per-gpu", "mem-per-cpu"),
        ({"cpus_per_task": 4, "extra": {"cpus-per-gpu": 4}}, "slurm.extra.cpus-per-gpu", "--cpus-per-task"),
    ],
)
def test_extra_options_sbatch_refuses_together_are_one_line(slurm, key, named):
    from slurm_ddp.config import config_from_dict
    from slurm_ddp.errors import ConfigError

    with pytest.raises(ConfigError) as ei:
        config_from_dict({"name": "x", "train": {"task": "m:T"}, "slurm": slurm})
    msg = str(ei.value)
    assert "\n" not in msg and f"'{key}'" in msg and named in msg
    config_from_dict({"name": "x", "train": {"task": "m:T"}, "slurm": {"extra": {"mem-per-gpu": "8G"}}})  # alone: fine


def test_no_requeue_hint_and_max_requeues_say_what_slurm_does(make_config):
    from slurm_ddp.config import describe_keys
    from slurm_ddp.errors import ConfigError

    cfg = make_config({"requeue": {"max_requeues": 0}})
    from slurm_ddp.render import sbatch_flags

    assert "--requeue" in sbatch_flags(cfg)  # Slurm's requeue (preemption, node failure) stays on
    with pytest.raises(ConfigError) as ei:
        make_config({"slurm": {"extra": {"no-requeue": True}}})
    msg = str(ei.value)
    assert "always sets --requeue" in msg and "max_requeues: 0 keeps the job from requeueing itself" in msg
    line = next(ln for ln in describe_keys().splitlines() if ln.strip().startswith("max_requeues:"))
    assert "every restart counts" in line and "SLURM_RESTART_COUNT" in line


def test_a_job_name_slurm_rewrites_is_said_in_one_line(tmp_path):
    out = slurm_ddp(["render", str(DIGITS), "--set", "name=bert base"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if "bert" in ln]
    assert len(lines) == 1 and "'bert base' becomes 'bert_base'" in lines[0]
    assert "#SBATCH --job-name=bert_base" in out.stdout
    out = slurm_ddp(["render", str(DIGITS), "--set", "name=bert-base"], tmp_path)
    assert "becomes" not in out.stderr


def test_config_keys_lists_the_sweep_keys_and_marks_name_required(tmp_path):
    out = slurm_ddp(["config-keys"], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("name:  # required:")
    slurm_block = lines[lines.index("slurm:") + 1 : lines.index("environment:")]
    assert any(ln.startswith("  array_parallelism: None  # ") for ln in slurm_block)
    sweep = lines[lines.index("sweep:") :]
    assert sweep[1].startswith("  grid: {}  # ") and sweep[2].startswith("  zip: {}  # ")


def test_readme_is_under_150_lines_with_the_two_commands():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 150
    assert "slurm-ddp submit examples/digits/job.yaml --backend local" in text and "bash .ci/run" in text


def test_env_explain_prints_the_threads_a_user_value_keeps(tmp_path):
    env_cmd = ["env", str(DIGITS), "--explain", "--cpus-per-task", "8"]
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "OMP_"))}
    out = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", *env_cmd],
        cwd=tmp_path,
        env={**child_env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    rank0 = out.stdout.split("rank 0:", 1)[1].splitlines()
    assert "threads=1" in rank0[0] and "kept (set by the user): OMP_NUM_THREADS=1" in "\n".join(rank0[:3])
    plain = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", *env_cmd], cwd=tmp_path, env=child_env, capture_output=True, text=True
    )
    assert "threads=8" in plain.stdout.split("rank 0:", 1)[1].splitlines()[0]
