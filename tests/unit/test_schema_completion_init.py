"""``slurm-ddp schema`` (the job YAML's JSON Schema, from the config's field metadata), shell
completion (argcomplete: bash, zsh, fish; each loaded in its shell, which completes ``slurm-ddp sub`` to
``submit``; a shell that is missing skips, or fails under ``SLURM_DDP_REQUIRE_SLURM=1``) and ``slurm-ddp init``.

The schema and the loader must agree: every example YAML is valid for both, every doc of ``BAD`` is
rejected by both, and ``LOADER_ONLY`` lists the checks across keys a schema cannot say (the schema
accepts them, the loader refuses them: the schema is never stricter than the loader).
"""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict

import pytest
from lib import require_executable, wait_for

from slurm_ddp.cli import main
from slurm_ddp.config import config_from_dict, read_yaml
from slurm_ddp.errors import UserError
from slurm_ddp.jobschema import SCHEMA_FILE, job_schema, schema_text
from slurm_ddp.scaffold import job_yaml, parse_sinfo
from slurm_ddp.sweep import sweep_from_data

jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(REPO.glob("examples/*/*.yaml"))
MODELINE = "# yaml-language-server: $schema="
OK = {"name": "x", "train": {"task": "m:T"}}


def validator():
    return jsonschema.Draft202012Validator(job_schema())


def loader_accepts(doc: Dict[str, Any]) -> bool:
    try:
        if "sweep" in doc or "array_parallelism" in (doc.get("slurm") or {}):
            sweep_from_data(json.loads(json.dumps(doc)), (), ())
        else:
            config_from_dict(doc)
    except UserError:
        return False
    return True


def with_(path: str, value: Any) -> Dict[str, Any]:
    doc = json.loads(json.dumps(OK))
    *parents, last = path.split(".")
    node = doc
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = value
    return doc


GOOD = [
    OK,
    {"name": "x", "train": {"command": "python train.py --epochs 5"}},
    {"name": "x", "train": {"command": ["python", "t.py"]}, "slurm": {"nodes": "2-4", "time": 30}},
    with_("slurm.time", "1-00:00"),
    with_("slurm.nodes", 2),
    with_("slurm.gpus_per_node", 4),
    with_("slurm.extra", {"mail-type": "END", "hint": True}),
    with_("environment.pass_env", "HF_TOKEN"),
    with_("environment.env", {"OMP_SCHEDULE": "static", "N": 3}),
    with_("requeue.signal", "sigusr1"),
    with_("tracking.wandb", {"enabled": True, "mode": "online"}),
    with_("slurm.partition", None),
    with_("checkpoint", None),
    {**OK, "sweep": {"grid": {"train.lr": [0.1, 0.2]}}, "slurm": {"array_parallelism": 2}},
    with_("train.lr", "3e-4"),  # a float written as text: the loader reads it (issue 43)
    with_("slurm.mem_gb", " 1_000 "),
]

BAD = {
    "unknown top-level key": {**OK, "trian": {}},
    "unknown slurm key": with_("slurm.node", 2),
    "unknown nested key": with_("tracking.mlflow.uri", "x"),
    "no name": {"train": {"task": "m:T"}},
    "empty name": with_("name", " "),
    "nodes a float": with_("slurm.nodes", 1.5),
    "nodes a word": with_("slurm.nodes", "two"),
    "tasks_per_node 0": with_("slurm.tasks_per_node", 0),
    "integer as text": with_("train.batch_size", "32"),
    "float as a word": with_("train.lr", "fast"),
    "float as .nan text": with_("train.lr", ".nan"),
    "bool for an int": with_("train.max_steps", True),
    "cpu_bind not a choice": with_("environment.cpu_bind", "sockets"),
    "amp not a choice": with_("train.amp", "fp8"),
    "time not a time": with_("slurm.time", "an hour"),
    "signal unknown": with_("requeue.signal", "KILL"),
    "signal_delay_s over the max": with_("requeue.signal_delay_s", 70000),
    "poll interval under the min": with_("watchdog.poll_interval_s", 0.01),
    "pass_env item not a string": with_("environment.pass_env", [1]),
    "extra value a list": with_("slurm.extra", {"a": [1]}),
    "partition with a space": with_("slurm.partition", "a b"),
    "task not module:Class": with_("train.task", "mytask"),
    "wandb mode": with_("tracking.wandb.mode", "cloud"),
    "section a list": {**OK, "slurm": [1]},
    "array_parallelism 0": {**OK, "slurm": {"array_parallelism": 0}},
    "sweep unknown part": {**OK, "sweep": {"product": {"train.lr": [1]}}},
}

#: checks across keys: the loader refuses these, a JSON Schema cannot say why (it accepts them)
LOADER_ONLY = {
    "task and command": with_("train.command", "python t.py"),
    "neither task nor command": {"name": "x", "train": {}},
    "signal_delay_s >= time": {**OK, "slurm": {"time": "00:01:00"}, "requeue": {"signal_delay_s": 120}},
    "tasks_per_node != gpus_per_node": {**OK, "slurm": {"gpus_per_node": 4, "tasks_per_node": 2}},
    "nccl on a CPU job": with_("train.backend", "nccl"),
    "an sbatch flag slurm_ddp sets": with_("slurm.extra", {"time": "10"}),
    "sbatch options sbatch refuses together": {**OK, "slurm": {"mem_gb": 4, "extra": {"mem-per-gpu": "8G"}}},
    "shell syntax in train.command": {"name": "x", "train": {"command": "python t.py > log.txt"}},
}


def test_schema_is_a_valid_draft_2020_12_schema_with_no_unknown_keys():
    schema = job_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["additionalProperties"] is False
    slurm = schema["properties"]["slurm"]
    assert slurm["additionalProperties"] is False
    assert slurm["properties"]["tasks_per_node"] == {
        "description": slurm["properties"]["tasks_per_node"]["description"],
        "type": ["integer"],
        "default": 1,
        "minimum": 1,
    }
    assert schema["properties"]["environment"]["properties"]["cpu_bind"]["enum"] == ["none", "cores", "numa"]
    assert schema["properties"]["tracking"]["properties"]["wandb"]["properties"]["mode"]["default"] == "offline"


def test_the_shipped_schema_file_is_the_generated_one():
    shipped = (REPO / "slurm_ddp" / SCHEMA_FILE).read_text()
    assert shipped == schema_text(), "regenerate: python -m slurm_ddp schema > slurm_ddp/job.schema.json"


def test_schema_verb_prints_it(capsys):
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == schema_text()


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_example_carries_the_modeline_and_is_valid(path):
    text = path.read_text()
    first = text.splitlines()[0]
    assert first.startswith(MODELINE), f"{path}: first line must be the yaml-language-server modeline"
    target = (path.parent / first[len(MODELINE) :]).resolve()
    assert target == (REPO / "slurm_ddp" / SCHEMA_FILE).resolve()
    doc = read_yaml(path)
    assert not list(validator().iter_errors(doc))
    assert loader_accepts(doc)


@pytest.mark.parametrize("doc", GOOD, ids=[json.dumps(d)[:60] for d in GOOD])
def test_schema_and_loader_accept_the_good_docs(doc):
    assert [e.message for e in validator().iter_errors(doc)] == []
    assert loader_accepts(doc)


@pytest.mark.parametrize("why", sorted(BAD))
def test_schema_and_loader_reject_the_bad_docs(why):
    doc = BAD[why]
    assert list(validator().iter_errors(doc)), f"the schema accepts {why}: {doc}"
    assert not loader_accepts(doc), f"the loader accepts {why}: {doc}"


@pytest.mark.parametrize("why", sorted(LOADER_ONLY))
def test_checks_across_keys_are_the_loaders(why):
    doc = LOADER_ONLY[why]
    assert not list(validator().iter_errors(doc))
    assert not loader_accepts(doc)


# --------------------------------------------------------------------------- completion


@pytest.fixture
def slurm_ddp_on_path(tmp_path, monkeypatch):
    """A ``slurm-ddp`` on PATH that runs this checkout's package with this interpreter."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "slurm-ddp"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m slurm_ddp "$@"\n')
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    return exe


def bash_complete(script: Path, line: str, cwd: Path) -> list:
    """What bash's TAB at the end of ``line`` offers, through the loaded completion script."""
    probe = (
        f"source {script}\n"
        'COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}; read -ra COMP_WORDS <<< "$COMP_LINE"\n'
        '[[ $COMP_LINE == *" " ]] && COMP_WORDS+=("")\n'
        "COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); COMP_TYPE=9\n"
        "_python_argcomplete slurm-ddp\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    out = subprocess.run(
        ["bash", "-c", probe, "probe", line], cwd=cwd, capture_output=True, text=True, timeout=60, check=True
    )
    return [w.strip() for w in out.stdout.splitlines() if w.strip()]


def test_bash_completion_loads_and_completes_verbs_keys_and_runs(tmp_path, slurm_ddp_on_path):
    script = tmp_path / "slurm-ddp.bash"
    script.write_text(
        subprocess.run([slurm_ddp_on_path, "completion", "bash"], capture_output=True, text=True, check=True).stdout
    )
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert bash_complete(script, "slurm-ddp sub", tmp_path) == ["submit"]
    assert bash_complete(script, "slurm-ddp render job.yaml --set slurm.nod", tmp_path) == ["slurm.nodes="]
    assert "--dry-run" in bash_complete(script, "slurm-ddp submit job.yaml --d", tmp_path)
    run = tmp_path / "runs" / "digits"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("name: digits\n")
    assert "digits" in bash_complete(script, "slurm-ddp status d", tmp_path)
    assert "runs/digits" in bash_complete(script, "slurm-ddp status runs/", tmp_path)


def zsh_complete(script: Path, line: str, tmp_path: Path) -> str:
    """The command line after TAB at the end of ``line`` in an interactive zsh (on a pty) that ran
    ``compinit`` and evaluated ``script``, as ``~/.zshrc`` would: a key bound to a widget then writes
    ZLE's ``$BUFFER`` to a file, which the test waits for. The zsh is killed by its pid."""
    out, zdotdir = tmp_path / "zsh-buffer", tmp_path / "zdotdir"
    zdotdir.mkdir(exist_ok=True)
    out.unlink(missing_ok=True)
    (zdotdir / ".zshrc").write_text(
        "autoload -U compinit && compinit -u -D\n"
        f"source {script}\n"
        f'_dump() {{ print -r -- "$BUFFER" > {out}.part && mv {out}.part {out}; }}\n'
        "zle -N _dump && bindkey '^X' _dump\n"
    )
    master, slave = pty.openpty()
    env = {**os.environ, "ZDOTDIR": str(zdotdir), "TERM": "dumb"}
    shell = subprocess.Popen(
        ["zsh", "-d", "-i"], stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env, start_new_session=True
    )
    os.close(slave)
    seen = bytearray()

    def drained() -> bool:  # keep the pty's buffer empty so that zsh never blocks on its output
        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return out.exists()
            if not chunk:
                break
            seen.extend(chunk)
        return out.exists()

    try:
        os.write(master, line.encode() + b"\t\x18")  # TAB, then Ctrl-X: the widget
        wait_for(drained, 60, f"zsh to complete {line!r}", lambda: seen.decode(errors="replace")[-2000:])
        return out.read_text().rstrip("\n")
    finally:
        shell.kill()
        shell.wait(timeout=30)
        os.close(master)


def test_zsh_completion_loads_and_completes_a_verb(tmp_path, slurm_ddp_on_path):
    require_executable("zsh", why="zsh's completion of slurm-ddp is not checked (Debian: apt-get install zsh)")
    script = tmp_path / "_slurm-ddp"
    script.write_text(
        subprocess.run([slurm_ddp_on_path, "completion", "zsh"], capture_output=True, text=True, check=True).stdout
    )
    subprocess.run(["zsh", "-n", str(script)], check=True)
    assert zsh_complete(script, "slurm-ddp sub", tmp_path) == "slurm-ddp submit "
    assert zsh_complete(script, "slurm-ddp render job.yaml --set slurm.nod", tmp_path).endswith(" slurm.nodes=")


def fish_complete(script: Path, line: str, cwd: Path) -> list:
    """What fish offers at the end of ``line`` (``complete -C``: its own completion engine) once
    ``script`` is sourced, without the descriptions."""
    probe = f'source {script}; complete -C "{line}"'
    out = subprocess.run(
        ["fish", "--no-config", "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=60, check=True
    )
    return [w.split("\t")[0] for w in out.stdout.splitlines() if w.strip()]


def test_fish_completion_loads_and_completes_a_verb(tmp_path, slurm_ddp_on_path):
    require_executable("fish", why="fish's completion of slurm-ddp is not checked (Debian: apt-get install fish)")
    script = tmp_path / "slurm-ddp.fish"
    script.write_text(
        subprocess.run([slurm_ddp_on_path, "completion", "fish"], capture_output=True, text=True, check=True).stdout
    )
    subprocess.run(["fish", "--no-execute", str(script)], check=True)
    assert fish_complete(script, "slurm-ddp sub", tmp_path) == ["submit"]
    assert fish_complete(script, "slurm-ddp render job.yaml --set slurm.nod", tmp_path) == ["slurm.nodes="]


# --------------------------------------------------------------------------- init


def test_init_for_a_script_writes_a_config_render_accepts_and_never_overwrites(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no sinfo: the partitions line says so
    out = tmp_path / "job.yaml"
    monkeypatch.chdir(REPO)
    assert main(["init", "examples/own_script/train.py", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith(MODELINE)
    assert "command: python " in text and "no Slurm answered here" in text
    capsys.readouterr()
    assert main(["render", str(out)]) == 0
    assert "train.py" in capsys.readouterr().out
    before = out.read_text()
    assert main(["init", "examples/own_script/train.py", "-o", str(out)]) == 2
    assert "never overwrites" in capsys.readouterr().err
    assert out.read_text() == before


def test_init_in_an_empty_directory_and_the_task_template(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.chdir(tmp_path)
    assert main(["init", str(REPO / "examples/own_script/train.py"), "-o", "job.yaml"]) == 0
    assert main(["render", "job.yaml"]) == 0
    assert main(["init", "-o", "task.yaml"]) == 0
    assert "task: mytask:MyTask" in (tmp_path / "task.yaml").read_text()
    assert main(["render", "task.yaml"]) == 0
    assert not list(validator().iter_errors(read_yaml(tmp_path / "task.yaml")))
    assert main(["init", "missing.py", "-o", "x.yaml"]) == 2
    assert not (tmp_path / "x.yaml").exists()


def test_init_lists_sinfo_partitions_as_commented_choices():
    parts = parse_sinfo("debug*|1:00:00|2|2|(null)\ngpu|2-00:00:00|4|64|gpu:a100:4(S:0-1)\ngpu|2-00:00:00|1|64|gpu:8\n")
    assert [(p.name, p.default, p.nodes, p.gpus_per_node) for p in parts] == [
        ("debug", True, 2, 0),
        ("gpu", False, 5, 8),
    ]
    text = job_yaml(None, ".", parts)
    assert "  # partition: debug    # time limit 1:00:00, 2 nodes, 2 CPUs per node   (the default)" in text
    assert "  # partition: gpu    # time limit 2-00:00:00, 5 nodes, 64 CPUs per node, 8 GPUs per node" in text
    assert "# gpus_per_node: 8" in text
    assert "\n  partition:" not in text  # a choice, never a guess
