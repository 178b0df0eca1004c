"""Settings that do nothing get one warning line each, the same from every entry point (issues 42, 43).

The shared worker's keys in a ``train.command`` job (``train.lr``, ``train.amp``, ``checkpoint.*``), and a
setting whose feature is off without its switch (``tracking.wandb.project`` without ``enabled: true``,
``tracking.mlflow.tracking_uri`` likewise, ``environment.container.python`` without a runtime,
``recovery.max_restarts`` without spares or ``min_nodes``): ``render``, ``submit`` (``--dry-run`` too),
``env --explain`` and the Python API say so; the job is still rendered and submitted. Only keys the job gave
count (``JobConfig.given_keys``: YAML, ``--set``, ``--sweep``), never the defaults.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, List, Tuple

import pytest
import yaml

import slurm_ddp
from slurm_ddp.cli import main
from slurm_ddp.config import config_from_dict, dump_config, load_config, read_yaml, unused_settings
from slurm_ddp.errors import SlurmDDPWarning

COMMAND_JOB = {"name": "own", "slurm": {"tasks_per_node": 2}, "train": {"command": "python train.py"}}
WORKER_SETS = ["train.lr=0.1", "train.amp=bf16", "checkpoint.every_steps=10"]

#: (the job's additions, --set overrides, the one line's beginning)
CASES = {
    "worker-keys": (
        {},
        WORKER_SETS,
        "train.lr, train.amp, checkpoint.every_steps do nothing for a train.command job",
    ),
    "wandb-project": (
        {"tracking": {"wandb": {"project": "mine"}}},
        [],
        "tracking.wandb.project does nothing without tracking.wandb.enabled: nothing is logged to W&B",
    ),
    "mlflow-uri": (
        {},
        ["tracking.mlflow.tracking_uri=file:///tmp/mlruns"],
        "tracking.mlflow.tracking_uri does nothing without tracking.mlflow.enabled: nothing is logged to MLflow",
    ),
    "container-python": (
        {"environment": {"container": {"python": "python3.11"}}},
        [],
        "environment.container.python does nothing without environment.container.runtime",
    ),
    "max-restarts": (
        {"recovery": {"max_restarts": 5}},
        [],
        "recovery.max_restarts does nothing without recovery.spare_nodes or recovery.min_nodes",
    ),
}


def _job(tmp_path: Path, extra: Any) -> str:
    (tmp_path / "train.py").write_text("print('hi')\n")
    doc = {**COMMAND_JOB, **extra}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


@pytest.fixture
def fake_sbatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``sbatch`` on PATH that accepts every job as 4242 and records its argv."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    sbatch = bindir / "sbatch"
    sbatch.write_text(f'#!/bin/sh\necho "$@" >> {bindir / "sbatch.argv"}\necho 4242\n')
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return bindir


def _cli_lines(argv: List[str], capsys: pytest.CaptureFixture[str], where: str = "err") -> Tuple[List[str], str]:
    assert main(argv) == 0
    out, err = capsys.readouterr()
    text = out if where == "out" else err
    return [line for line in text.splitlines() if "does nothing" in line or "do nothing" in line], out


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("entry", ["render", "dry-run", "submit", "explain", "api"])
def test_a_setting_that_does_nothing_is_one_warning_line_from_every_entry_point(
    case: str, entry: str, tmp_path: Path, fake_sbatch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra, sets, expected = CASES[case]
    job = _job(tmp_path, extra)
    set_args = [w for s in sets for w in ("--set", s)]
    run = ["--run-dir", str(tmp_path / "run")]
    if entry == "api":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_obj = slurm_ddp.submit(
                job, overrides=sets, run_dir=tmp_path / "run", backend="sbatch", check_task=False
            )
        ours = [w for w in caught if issubclass(w.category, SlurmDDPWarning)]
        assert [str(w.message) for w in ours if str(w.message).startswith(expected)] != [], [
            str(w.message) for w in caught
        ]
        assert len([w for w in ours if expected in str(w.message)]) == 1
        assert all(w.filename == __file__ for w in ours)  # attributed to the caller's line
        assert run_obj.job_ids == ["4242"]
        return
    argv = {
        "render": ["render", job, *run, *set_args],
        "dry-run": ["submit", job, "--backend", "sbatch", "--dry-run", "--no-check-task", *run, *set_args],
        "submit": ["submit", job, "--backend", "sbatch", "--no-check-task", *run, *set_args],
        "explain": ["env", job, "--explain", *set_args],
    }[entry]
    lines, out = _cli_lines(argv, capsys, "out" if entry == "explain" else "err")
    assert len(lines) == 1, lines
    prefix = "warning: " if entry == "explain" else "slurm-ddp: warning: "
    assert lines[0].startswith(prefix + expected), lines
    assert "\n" not in lines[0]
    if entry == "submit":
        assert (fake_sbatch / "sbatch.argv").exists()  # a warning, not an error: the job was submitted


def test_a_sweep_of_a_worker_key_in_a_command_job_is_refused_in_one_line_not_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a sweep of a key the script cannot see would run N identical jobs: refused (sweep.py), pointing at train.args
    job = _job(tmp_path, {})
    assert main(["render", job, "--sweep", "train.lr=0.1,0.2", "--run-dir", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("slurm-ddp: error: sweep key 'train.lr' does not reach a train.command")
    assert "train.args.lr" in err[0]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    "doc",
    [
        {"train": {"command": "python train.py", "workdir": ".", "snapshot": False, "num_workers": 2}},
        {"train": {"command": "python train.py", "args": {"lr": 0.1}}},  # the script's own parameters
        {"train": {"task": "mypkg:Task", "lr": 0.1, "amp": "bf16"}, "checkpoint": {"every_steps": 10}},
        {"train": {"task": "mypkg:Task"}, "tracking": {"wandb": {"enabled": True, "project": "p"}}},
        {"train": {"task": "mypkg:Task"}, "tracking": {"wandb": {"enabled": False, "project": "p"}}},  # off on purpose
        {"train": {"task": "mypkg:Task"}, "environment": {"container": {"runtime": "none", "python": "python3"}}},
        {"train": {"task": "mypkg:Task"}, "slurm": {"nodes": 2}, "recovery": {"spare_nodes": 1, "max_restarts": 3}},
        {"train": {"task": "mypkg:Task"}, "recovery": {"spare_nodes": 0, "max_restarts": 3}},  # off on purpose
    ],
)
def test_settings_that_apply_or_whose_switch_was_given_are_not_warned(doc: Any) -> None:
    assert unused_settings(config_from_dict({"name": "x", **doc})) == ()


def test_only_the_keys_a_job_gives_count_not_the_defaults(tmp_path: Path) -> None:
    cfg = config_from_dict({"name": "x", "train": {"command": "python t.py", "lr": 0.1}})
    assert cfg.given_keys == {"name", "train.command", "train.lr"}
    assert unused_settings(config_from_dict({"name": "x", "train": {"command": "python t.py"}})) == ()
    # the given keys are no config key: not written, not hashed, not compared
    again = config_from_dict(read_yaml_text(dump_config(cfg), tmp_path))
    assert "given_keys" not in dump_config(cfg) and again == cfg and again.config_hash() == cfg.config_hash()
    assert "given_keys" not in slurm_ddp.config.describe_keys()
    with pytest.raises(slurm_ddp.errors.ConfigError, match="unknown config key 'given_keys'"):
        config_from_dict({"name": "x", "train": {"task": "a:B"}, "given_keys": ["name"]})
    path = tmp_path / "job.yaml"
    path.write_text("name: x\ntrain: {command: python t.py}\n")
    assert load_config(path, ["checkpoint.keep_last=3"]).given_keys == {"name", "train.command", "checkpoint.keep_last"}


def read_yaml_text(text: str, tmp_path: Path) -> Any:
    path = tmp_path / "dumped.yaml"
    path.write_text(text)
    return read_yaml(path)


@pytest.mark.parametrize(
    "extra, sets",
    [({}, WORKER_SETS), ({"tracking": {"wandb": {"project": "mine"}}}, []), ({}, [])],
    ids=["worker-keys", "wandb-project", "nothing-unused"],
)
def test_resubmitting_the_run_directorys_config_yaml_warns_as_the_job_did(
    extra: Any, sets: List[str], tmp_path: Path, fake_sbatch: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # cancel's "continue later with: slurm-ddp submit RUN/config.yaml": that file holds every key, defaults too
    job, run = _job(tmp_path, extra), tmp_path / "run"
    set_args = [w for s in sets for w in ("--set", s)]
    first, _ = _cli_lines(
        ["submit", job, "--backend", "sbatch", "--no-check-task", "--run-dir", str(run), *set_args], capsys
    )
    assert len(first) == (0 if not extra and not sets else 1), first
    written = run / "config.yaml"
    again, _ = _cli_lines(
        ["submit", str(written), "--backend", "sbatch", "--no-check-task", "--run-dir", str(run)], capsys
    )
    assert again == first
    rendered, _ = _cli_lines(["render", str(written)], capsys)
    assert rendered == first
    cfg = load_config(written)
    assert cfg.given_keys == load_config(job, sets).given_keys
    # --set on top of it counts as given, as on the original file
    more, _ = _cli_lines(["render", str(written), "--set", "train.amp=bf16"], capsys)
    assert more == _cli_lines(["render", job, *set_args, "--set", "train.amp=bf16"], capsys)[0]
    assert any("train.amp" in line for line in more), more
    # a sweep of it: the swept train.args key is the script's, nothing new warned
    swept, _ = _cli_lines(
        ["render", str(written), "--sweep", "train.args.lr=1e-4,3e-4", "--run-dir", str(tmp_path / "s")], capsys
    )
    assert swept == first


def test_an_edited_config_yaml_counts_every_key_it_holds_as_given(tmp_path: Path) -> None:
    # the comment names the job's keys only for the mapping written with it: an edit (train.lr: 0.5 that
    # the user expects to apply) is warned about with the rest of the file's keys
    cfg = config_from_dict({**COMMAND_JOB}, base_dir=tmp_path)
    text = dump_config(cfg)
    assert (
        text.startswith("# ")
        and "# given keys (mapping " in text
        and "): name, slurm.tasks_per_node, train.command\n" in text
    )
    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert load_config(path).given_keys == cfg.given_keys and unused_settings(load_config(path)) == ()
    path.write_text(text.replace("  lr: 0.001\n", "  lr: 0.5\n"))
    edited = load_config(path)
    assert "train.lr" in edited.given_keys and "train.lr" in unused_settings(edited)[0]
