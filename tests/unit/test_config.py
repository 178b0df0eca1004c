"""The job config: the example loads, the config is frozen, ``--set`` overrides parse, and every
kind of bad input gives a one-line ``ConfigError`` that names the key, what was given and what
is valid — also through ``slurm-ddp render`` in-process (exit 2, one stderr line, nothing written)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from slurm_ddp.cli import main
from slurm_ddp.config import (
    TIME_FORMATS,
    JobConfig,
    apply_overrides,
    config_from_dict,
    dump_config,
    load_config,
    parse_time_s,
)
from slurm_ddp.errors import ConfigError, UserError

# --------------------------------------------------------------------------- the example


def test_example_loads(example_job):
    cfg = load_config(example_job)
    assert isinstance(cfg, JobConfig)
    assert cfg.name == "digits"
    assert (cfg.slurm.nodes, cfg.slurm.tasks_per_node, cfg.slurm.cpus_per_task) == (1, 2, 1)
    assert cfg.slurm.world_size == 2
    assert cfg.slurm.time == "00:20:00" and cfg.slurm.time_s == 20 * 60
    assert cfg.train.task == "digits_task:DigitsTask"
    assert (cfg.train.max_steps, cfg.train.batch_size, cfg.train.lr) == (600, 32, 0.003)
    assert dict(cfg.train.args) == {"width": 16, "augment": True}
    assert (cfg.checkpoint.every_steps, cfg.checkpoint.keep_last) == (100, 2)
    assert (cfg.requeue.signal_name, cfg.requeue.signal_delay_s, cfg.requeue.max_requeues) == ("USR2", 120, 3)
    # the default pythonpath is the YAML's own directory, made absolute
    assert cfg.train.pythonpath == (str(example_job.parent.resolve()),)


def test_defaults_of_a_minimal_config(make_config):
    cfg = make_config()
    assert (cfg.slurm.nodes, cfg.slurm.tasks_per_node, cfg.slurm.gpus_per_node) == (1, 1, 0)
    assert cfg.slurm.partition is None and cfg.slurm.mem_gb is None
    assert cfg.requeue.signal == "USR2"
    assert cfg.environment.setup == () and dict(cfg.environment.env) == {}


@pytest.mark.parametrize(
    "slurm, tasks, node_gpus",
    [
        ({"gpus_per_node": 4}, 4, 4),  # a GPU job gets one task per GPU unless told otherwise
        ({"gres": "gpu:a100:2"}, 2, 2),
        ({"gpus_per_task": 1}, 1, 1),  # one task, as tasks_per_node's default says
        ({"gpus_per_task": 1, "tasks_per_node": 3}, 3, 3),
        ({"gpus_per_node": 2, "gpus_per_task": 1}, 2, 2),
        ({}, 1, 0),
    ],
)
def test_gpu_jobs_get_one_task_per_gpu_by_default(make_config, slurm, tasks, node_gpus):
    import yaml

    from slurm_ddp.config import config_from_dict, dump_config

    cfg = make_config({"slurm": slurm})
    assert (cfg.slurm.tasks_per_node, cfg.slurm.node_gpus, cfg.slurm.gpu_job) == (tasks, node_gpus, node_gpus > 0)
    assert config_from_dict(yaml.safe_load(dump_config(cfg))) == cfg  # the resolved count round-trips


def test_dump_and_load_round_trip(tmp_path, example_job):
    cfg = load_config(example_job, ["slurm.time=1:30:00", "slurm.extra.mail-type=END"])
    path = tmp_path / "again.yaml"
    path.write_text(dump_config(cfg))
    again = load_config(path)
    assert again == cfg
    assert again.config_hash() == cfg.config_hash()
    assert config_from_dict(cfg.to_dict()) == cfg


def test_config_hash_changes_with_the_config(make_config):
    assert make_config().config_hash() == make_config().config_hash()
    assert make_config().config_hash() != make_config({"slurm": {"nodes": 2}}).config_hash()


# --------------------------------------------------------------------------- frozen


def test_config_is_frozen(example_job):
    cfg = load_config(example_job)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.slurm.nodes = 4  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.args = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.train.args["width"] = 64  # type: ignore[index]
    with pytest.raises(TypeError):  # a default (not given in the YAML) is frozen too
        cfg.slurm.extra["mail-type"] = "END"  # type: ignore[index]
    with pytest.raises(TypeError):
        cfg.environment.env["A"] = "1"  # type: ignore[index]
    assert isinstance(cfg.environment.setup, tuple)


def test_nested_task_args_are_frozen(make_config):
    cfg = make_config({"train": {"args": {"layers": [1, 2], "opt": {"name": "sgd"}}}})
    assert cfg.train.args["layers"] == (1, 2)
    with pytest.raises(TypeError):
        cfg.train.args["opt"]["name"] = "adam"
    assert cfg.to_dict()["train"]["args"] == {"layers": [1, 2], "opt": {"name": "sgd"}}


# --------------------------------------------------------------------------- --set overrides


OVERRIDES = [
    ("slurm.nodes=2", lambda c: c.slurm.nodes, 2),
    ("slurm.exclusive=true", lambda c: c.slurm.exclusive, True),
    ("slurm.exclusive=false", lambda c: c.slurm.exclusive, False),
    ("slurm.partition=gpu", lambda c: c.slurm.partition, "gpu"),
    ("slurm.mem_gb=7.5", lambda c: c.slurm.mem_gb, 7.5),
    ("train.lr=0.1", lambda c: c.train.lr, 0.1),
    ("train.args.width=64", lambda c: c.train.args["width"], 64),
    ("train.args.augment=false", lambda c: c.train.args["augment"], False),
    ("train.args.new.deep=x", lambda c: dict(c.train.args["new"]), {"deep": "x"}),
    ("train.args.tags=[a, b]", lambda c: c.train.args["tags"], ("a", "b")),
    ("name=digits-2", lambda c: c.name, "digits-2"),
    ("requeue.signal=SIGUSR1", lambda c: c.requeue.signal_name, "USR1"),
    ("environment.env.OMP_NUM_THREADS=4", lambda c: c.environment.env["OMP_NUM_THREADS"], "4"),
    ("environment.setup=module load cuda", lambda c: c.environment.setup, ("module load cuda",)),
    # base-60 (YAML 1.1) must not turn a time into a number of minutes
    ("slurm.time=1:30:00", lambda c: (c.slurm.time, c.slurm.time_s), ("1:30:00", 5400)),
    ("slurm.time=10:00", lambda c: (c.slurm.time, c.slurm.time_s), ("10:00", 600)),
    ("slurm.time=30", lambda c: (c.slurm.time, c.slurm.time_s), ("30", 1800)),
]


@pytest.mark.parametrize("override, get, expected", OVERRIDES, ids=[o[0] for o in OVERRIDES])
def test_set_overrides_parse_values(example_job, override, get, expected):
    cfg = load_config(example_job, [override])
    assert get(cfg) == expected


def test_overrides_apply_in_order_and_leave_the_file_alone(example_job):
    before = example_job.read_bytes()
    cfg = load_config(example_job, ["slurm.nodes=2", "slurm.nodes=3", "train.args.width=8"])
    assert cfg.slurm.nodes == 3 and cfg.train.args["width"] == 8 and cfg.train.args["augment"] is True
    assert example_job.read_bytes() == before


def test_apply_overrides_returns_a_new_dict():
    data = {"slurm": {"nodes": 1}}
    out = apply_overrides(data, ["slurm.nodes=2"])
    assert out == {"slurm": {"nodes": 2}} and data == {"slurm": {"nodes": 1}}


@pytest.mark.parametrize("override", ["slurm.nodes", "=2", "slurm..nodes=2", ".nodes=2", "slurm.=2"])
def test_malformed_override(example_job, override):
    with pytest.raises(ConfigError) as ei:
        load_config(example_job, [override])
    msg = str(ei.value)
    assert "\n" not in msg
    assert repr(override) in msg and "section.key=value" in msg


@pytest.mark.parametrize(
    "override, key",
    [
        ("slurm.nodes=two", "slurm.nodes"),
        ("slurm.node=2", "slurm.node"),
        ("slurm.time=1h", "slurm.time"),
        ("name=", "name"),
        ("requeue.signal=KILL", "requeue.signal"),
    ],
)
def test_bad_override_value(example_job, override, key):
    with pytest.raises(ConfigError) as ei:
        load_config(example_job, [override])
    msg = str(ei.value)
    assert "\n" not in msg and f"'{key}" in msg


# How papers and configs write a learning rate: YAML 1.1 (PyYAML) reads 3e-4 and 1E-3 as strings;
# the job's YAML reads every float YAML 1.2 and Python read, in the file, --set and --sweep alike.
FLOATS = [("3e-4", 3e-4), ("1E-3", 1e-3), (".5", 0.5), ("1_000", 1000.0), ("1.0e-3", 1e-3), ("1e3", 1000.0)]


@pytest.mark.parametrize("text, value", FLOATS, ids=[f[0] for f in FLOATS])
def test_floats_as_yaml_12_and_python_write_them(write_job, example_job, text, value):
    from slurm_ddp.sweep import parse_sweep_flag

    path = write_job(text=f"name: x\ntrain: {{task: 'm:T', lr: {text}, clip_grad_norm: {text}}}\n")
    cfg = load_config(path)
    assert (cfg.train.lr, cfg.train.clip_grad_norm) == (value, value)
    assert load_config(example_job, [f"train.lr={text}"]).train.lr == value
    assert parse_sweep_flag(f"train.lr=1e-4,{text}") == ("train.lr", [1e-4, value])


def test_a_number_written_as_a_string_passes_the_number_check(make_config):
    # a mapping from JSON or the Python API: '3e-4' is as good a learning rate as 3e-4
    assert make_config({"train": {"lr": "3e-4"}}).train.lr == 3e-4
    assert make_config({"slurm": {"mem_gb": "1_000"}}).slurm.mem_gb == 1000.0
    for bad in ("3e", "abc", ".nan", "1e3x"):
        with pytest.raises(ConfigError, match="expected a number"):
            make_config({"train": {"lr": bad}})


def test_yaml_12_floats_leave_other_scalars_alone(write_job):
    from slurm_ddp.config import _yaml_load

    texts = ("1", "1_000", "1:30:00", "e3", "3e", "1.5")
    assert [_yaml_load(t) for t in texts] == [1, 1000, "1:30:00", "e3", "3e", 1.5]


def test_override_does_not_hide_a_top_level_that_is_not_a_mapping(write_job):
    path = write_job(text="- name: x\n")
    with pytest.raises(ConfigError) as ei:
        load_config(path, ["name=x"])
    assert "<top level>" in str(ei.value) and "a mapping" in str(ei.value)


# --------------------------------------------------------------------------- time


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 30 * 60),
        (30, 30 * 60),
        ("10:00", 10 * 60),  # MM:SS
        ("1:30:00", 90 * 60),  # HH:MM:SS
        ("00:20:00", 20 * 60),
        ("2-00", 2 * 86400),  # D-HH
        ("2-03:04", 2 * 86400 + 3 * 3600 + 4 * 60),  # D-HH:MM
        ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5),  # D-HH:MM:SS
    ],
)
def test_valid_time_formats(write_job, text, seconds):
    assert parse_time_s(text) == seconds
    # also as written in a YAML file, quoted or not
    quoted = load_config(write_job({"slurm": {"time": text}}))
    assert quoted.slurm.time == str(text) and quoted.slurm.time_s == seconds
    raw = load_config(write_job(text=f"name: t\ntrain: {{task: 'm:C'}}\nslurm:\n  time: {text}\n"))
    assert raw.slurm.time == str(text) and raw.slurm.time_s == seconds


@pytest.mark.parametrize("text", ["1h", "abc", "1:2:3:4", "-5", "0", "", " 30", "30\n", "1-", "0:00", True, 1.5])
def test_invalid_time_formats(text):
    with pytest.raises(ValueError):
        parse_time_s(text)


# --------------------------------------------------------------------------- bad input

# (patch merged into a minimal valid job, key the message must name, fragments it must contain).
# Each message must be one line and name the key; the fragments check what was given and what
# is valid.
BAD = [
    # unknown keys, at the top and in each section: valid keys listed, the closest suggested
    ({"nmae": "x"}, "nmae", ["unknown config key", "valid keys: name, slurm, environment", "did you mean 'name'"]),
    ({"slurn": {}}, "slurn", ["valid keys:", "did you mean 'slurm'"]),
    ({"slurm": {"node": 2}}, "slurm.node", ["valid keys: partition, account", "did you mean 'nodes'"]),
    ({"slurm": {"zzzzzz": 1}}, "slurm.zzzzzz", ["valid keys: partition"]),
    ({"slurm": {"no\nde": 1}}, "slurm.no\\nde", ["unknown config key", "valid keys: partition"]),
    ({"na\tme": "x"}, "na\\tme", ["unknown config key", "valid keys: name"]),
    ({"environment": {"envs": {}}}, "environment.envs", ["valid keys: setup, env, python", "did you mean 'env'"]),
    ({"train": {"max_step": 5}}, "train.max_step", ["valid keys: task,", "did you mean 'max_steps'"]),
    (
        {"checkpoint": {"keep": 3}},
        "checkpoint.keep",
        ["valid keys: every_steps, keep_last", "did you mean 'keep_last'"],
    ),
    ({"requeue": {"signl": "USR2"}}, "requeue.signl", ["valid keys: signal,", "did you mean 'signal'"]),
    # wrong types
    ({"slurm": {"nodes": "2"}}, "slurm.nodes", ["got '2'", "an integer"]),
    ({"slurm": {"nodes": True}}, "slurm.nodes", ["got True", "an integer"]),
    ({"slurm": {"nodes": 1.5}}, "slurm.nodes", ["got 1.5", "an integer"]),
    ({"slurm": {"tasks_per_node": [2]}}, "slurm.tasks_per_node", ["got [2]", "an integer"]),
    ({"slurm": [1, 2]}, "slurm", ["got [1, 2]", "a mapping"]),
    ({"train": "fast"}, "train", ["got 'fast'", "a mapping"]),
    ({"train": {"args": [1, 2]}}, "train.args", ["got [1, 2]", "a mapping"]),
    ({"environment": {"env": ["A=1"]}}, "environment.env", ["got ['A=1']", "a mapping"]),
    ({"slurm": {"extra": "--mail-type=END"}}, "slurm.extra", ["a mapping"]),
    ({"slurm": {"exclusive": 1}}, "slurm.exclusive", ["got 1", "true or false"]),
    ({"slurm": {"exclusive": "yes"}}, "slurm.exclusive", ["got 'yes'", "true or false"]),
    ({"train": {"lr": "fast"}}, "train.lr", ["got 'fast'", "a number"]),
    ({"slurm": {"mem_gb": "lots"}}, "slurm.mem_gb", ["got 'lots'", "a number"]),
    ({"slurm": {"partition": ["gpu"]}}, "slurm.partition", ["got ['gpu']", "a string"]),
    ({"name": ["a", "b"]}, "name", ["got ['a', 'b']", "a string"]),
    ({"requeue": {"max_requeues": False}}, "requeue.max_requeues", ["got False", "an integer"]),
    ({"environment": {"env": {"A": None}}}, "environment.env.A", ["got None", "a string"]),
    ({"environment": {"env": {"A": True}}}, "environment.env.A", ["got True", "a string"]),
    ({"environment": {"env": {"A": [1]}}}, "environment.env.A", ["got [1]", "a string"]),
    # zero / negative counts
    ({"slurm": {"nodes": 0}}, "slurm.nodes", ["got 0", ">= 1"]),
    ({"slurm": {"nodes": -1}}, "slurm.nodes", ["got -1", ">= 1"]),
    ({"slurm": {"tasks_per_node": 0}}, "slurm.tasks_per_node", ["got 0", ">= 1"]),
    ({"slurm": {"cpus_per_task": 0}}, "slurm.cpus_per_task", ["got 0", ">= 1"]),
    ({"slurm": {"gpus_per_node": -1}}, "slurm.gpus_per_node", ["got -1", ">= 0"]),
    ({"slurm": {"mem_gb": 0}}, "slurm.mem_gb", ["got 0", ">= 0.001"]),
    ({"train": {"max_steps": 0}}, "train.max_steps", ["got 0", ">= 1"]),
    ({"train": {"batch_size": -4}}, "train.batch_size", ["got -4", ">= 1"]),
    ({"train": {"lr": -0.1}}, "train.lr", ["got -0.1", ">= 0.0"]),
    ({"train": {"log_every": 0}}, "train.log_every", ["got 0", ">= 1"]),
    ({"checkpoint": {"keep_last": 0}}, "checkpoint.keep_last", ["got 0", ">= 1"]),
    ({"checkpoint": {"every_steps": -1}}, "checkpoint.every_steps", ["got -1", ">= 0"]),
    ({"requeue": {"signal_delay_s": 0}}, "requeue.signal_delay_s", ["got 0", ">= 1"]),
    ({"requeue": {"max_requeues": -1}}, "requeue.max_requeues", ["got -1", ">= 0"]),
    ({"slurm": {"time": "2-00"}, "requeue": {"signal_delay_s": 70000}}, "requeue.signal_delay_s", ["<= 65535"]),
    # bad time formats
    *[
        ({"slurm": {"time": t}}, "slurm.time", [f"got {t!r}", TIME_FORMATS])
        for t in ["1h", "abc", "1:2:3:4", "-5", "0", "", " 30", "30\n", "1.5"]
    ],
    ({"slurm": {"time": 0}}, "slurm.time", ["got '0'", "HH:MM:SS"]),
    # signals
    *[
        ({"requeue": {"signal": s}}, "requeue.signal", [f"got {s!r}", "USR2, USR1, TERM"])
        for s in ["KILL", "SIGSEGV", "USR3", ""]
    ],
    ({"requeue": {"signal": 12}}, "requeue.signal", ["got '12'", "USR2"]),
    # the signal must come before the time limit
    (
        {"slurm": {"time": "00:02:00"}, "requeue": {"signal_delay_s": 120}},
        "requeue.signal_delay_s",
        ["got 120", "fewer seconds than slurm.time (00:02:00 = 120 s)"],
    ),
    ({"slurm": {"time": "1"}}, "requeue.signal_delay_s", ["got 120", "slurm.time (1 = 60 s)"]),
    # one task per GPU
    (
        {"slurm": {"gpus_per_node": 4, "tasks_per_node": 2}},
        "slurm.tasks_per_node",
        ["got 2", "one task per GPU (4, from slurm.gpus_per_node)", "hint:"],
    ),
    ({"slurm": {"gpus_per_node": 2, "tasks_per_node": 1}}, "slurm.tasks_per_node", ["got 1", "one task per GPU (2"]),
    ({"train": {"backend": "nccl"}}, "train.backend", ["got 'nccl'", "gloo or auto", "gpus_per_node"]),
    ({"train": {"backend": "mpi"}}, "train.backend", ["got 'mpi'", "one of auto, gloo, nccl"]),
    # environment.setup entries are strings
    ({"environment": {"setup": ["module load cuda", 3]}}, "environment.setup[1]", ["got 3", "a string"]),
    ({"environment": {"setup": [{"a": "b"}]}}, "environment.setup[0]", ["got {'a': 'b'}", "a string"]),
    ({"environment": {"setup": 5}}, "environment.setup", ["got 5", "a list of strings"]),
    # environment variable names
    ({"environment": {"env": {"1ABC": "x"}}}, "environment.env.1ABC", ["got '1ABC'", "a variable name"]),
    ({"environment": {"env": {"A-B": "x"}}}, "environment.env.A-B", ["got 'A-B'", "a variable name"]),
    ({"environment": {"env": {"A B": "x"}}}, "environment.env.A B", ["got 'A B'", "a variable name"]),
    ({"environment": {"env": {"A\n": "x"}}}, "environment.env.A\\n", ["got 'A\\n'", "a variable name"]),
    ({"environment": {"env": {"A$(touch X)": "x"}}}, "environment.env.A$(touch X)", ["a variable name"]),
    # train.task
    *[
        ({"train": {"task": t}}, "train.task", [f"got {t!r}", "'package.module:Attribute'"])
        for t in ["digits_task.DigitsTask", "digits_task:", ":DigitsTask", "a b:C", "m:C:D", "m:C\n", "1m:C"]
    ],
    # name
    ({"name": "job\ntouch X"}, "name", ["got 'job\\ntouch X'", "without control characters"]),
    ({"name": "tab\there"}, "name", ["without control characters"]),
    ({"name": "   "}, "name", ["a non-empty string"]),
    # values that go into "#SBATCH --flag=value" lines: one token
    ({"slurm": {"partition": "gpu a"}}, "slurm.partition", ["got 'gpu a'", "one token"]),
    ({"slurm": {"partition": "gpu\n"}}, "slurm.partition", ["got 'gpu\\n'", "one token"]),
    ({"slurm": {"account": "it's"}}, "slurm.account", ["one token"]),
    ({"slurm": {"qos": 'a"b'}}, "slurm.qos", ["one token"]),
    ({"slurm": {"constraint": "a`id`"}}, "slurm.constraint", ["one token"]),
    ({"slurm": {"extra": {"--mail-type": "END"}}}, "slurm.extra.--mail-type", ["sbatch long option name"]),
    ({"slurm": {"extra": {"Mail": "END"}}}, "slurm.extra.Mail", ["sbatch long option name"]),
    ({"slurm": {"extra": {"x\n": "$(touch${IFS}X)"}}}, "slurm.extra.x\\n", ["sbatch long option name"]),
    ({"slurm": {"extra": {"mail-type": "END FAIL"}}}, "slurm.extra.mail-type", ["got 'END FAIL'", "one token"]),
    ({"slurm": {"extra": {"mail-type": "END\n"}}}, "slurm.extra.mail-type", ["one token"]),
    ({"slurm": {"extra": {"mail-type": None}}}, "slurm.extra.mail-type", ["got None"]),
    # options slurm_ddp sets itself: the hint names the key that sets them
    ({"slurm": {"extra": {"time": "10"}}}, "slurm.extra.time", ["does not set itself", "slurm.time"]),
    ({"slurm": {"extra": {"ntasks_per_node": 4}}}, "slurm.extra.ntasks_per_node", ["slurm.tasks_per_node"]),
    ({"slurm": {"extra": {"signal": "USR1@60"}}}, "slurm.extra.signal", ["requeue.signal"]),
    ({"slurm": {"extra": {"requeue": False}}}, "slurm.extra.requeue", ["requeue.max_requeues"]),
    ({"slurm": {"extra": {"output": "x.out"}}}, "slurm.extra.output", ["RUN_DIR/logs"]),
]


def _case_id(case) -> str:
    patch, key, _ = case
    flat = repr(patch)
    return f"{key}:{flat}"[:70]


@pytest.mark.parametrize("patch, key, fragments", BAD, ids=[_case_id(c) for c in BAD])
def test_bad_input_gives_one_line_config_error(write_job, patch, key, fragments):
    path = write_job(patch)
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    msg = str(ei.value)
    assert "\n" not in msg and "\r" not in msg, f"message is not one line: {msg!r}"
    assert f"'{key}'" in msg or f"'{key}." in msg or f"'{key}[" in msg, f"{key!r} not named in {msg!r}"
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"
    assert isinstance(ei.value, UserError) and ei.value.exit_code == 2


def test_there_are_plenty_of_bad_input_cases():
    assert len(BAD) >= 40


@pytest.mark.parametrize(
    "data, key",
    [
        ({"train": {"task": "m:C"}}, "name"),
        ({"name": "x"}, "train.task"),
        ({"name": "x", "train": {"max_steps": 3}}, "train.task"),
        ({"name": "x", "train": {"task": ""}}, "train.task"),  # "" is no task (a train.command config)
        (None, "name"),  # an empty file
    ],
)
def test_missing_required_keys(write_job, data, key):
    path = write_job(data, base=None) if data is not None else write_job(text="")
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    msg = str(ei.value)
    assert "\n" not in msg and f"'{key}' is missing" in msg


@pytest.mark.parametrize(
    "text, line, column, problem",
    [
        ("name: x\nslurm:\n  nodes: 1\n   bad: 2\n", 4, 7, "mapping values are not allowed here"),
        ("name: [unclosed\n", 2, 1, "expected ',' or ']'"),
        ("name: x\n\tslurm: 1\n", 2, 1, "found character '\\t' that cannot start any token"),
        ("a: b: c\n", 1, 5, "mapping values are not allowed here"),
    ],
)
def test_yaml_syntax_error_names_line_and_column(write_job, text, line, column, problem):
    path = write_job(text=text)
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(f"YAML syntax error in {str(path)!r} line {line}, column {column}: ")
    assert problem in msg


def test_yaml_that_would_construct_objects_is_rejected(write_job):
    path = write_job(text="name: !!python/object/apply:os.system ['touch X']\n")
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    assert "\n" not in str(ei.value) and "line 1" in str(ei.value)


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    msg = str(ei.value)
    assert "\n" not in msg and repr(str(path)) in msg and "not found" in msg


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError) as ei:
        load_config(tmp_path)
    msg = str(ei.value)
    assert "\n" not in msg and "is a directory" in msg


@pytest.mark.parametrize("text, shown", [("- a\n- b\n", "['a', 'b']"), ("just text\n", "'just text'"), ("42\n", "42")])
def test_top_level_not_a_mapping(write_job, text, shown):
    with pytest.raises(ConfigError) as ei:
        load_config(write_job(text=text))
    msg = str(ei.value)
    assert "\n" not in msg
    assert "'<top level>'" in msg and f"got {shown}" in msg and "a mapping" in msg


def test_long_values_are_shortened_in_messages(make_config):
    with pytest.raises(ConfigError) as ei:
        make_config({"slurm": {"partition": "x " * 100}})
    assert len(str(ei.value)) < 200 and "..." in str(ei.value)


# --------------------------------------------------------------------------- through the CLI

CLI_BAD = {
    "unknown key": ("name: x\ntrain: {task: 'm:C'}\nslurm: {node: 2}\n", [], "did you mean 'nodes'"),
    "bad time": ("name: x\ntrain: {task: 'm:C'}\nslurm: {time: 1h}\n", [], "slurm.time"),
    "yaml syntax": ("name: [x\n", [], "line 2, column 1"),
    "not a mapping": ("- x\n", [], "<top level>"),
    "bad --set": ("name: x\ntrain: {task: 'm:C'}\n", ["--set", "slurm.nodes=0"], "slurm.nodes"),
    "malformed --set": ("name: x\ntrain: {task: 'm:C'}\n", ["--set", "slurm.nodes"], "section.key=value"),
    "newline in name": ('name: "a\\ntouch X"\ntrain: {task: "m:C"}\n', [], "control characters"),
    "missing file": (None, [], "not found"),
}


@pytest.mark.parametrize("case", list(CLI_BAD))
def test_cli_render_of_a_bad_config(tmp_path, monkeypatch, capsys, case):
    text, extra, fragment = CLI_BAD[case]
    monkeypatch.chdir(tmp_path)
    job = tmp_path / "job.yaml"
    if text is not None:
        job.write_text(text)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc = main(["render", str(job), *extra])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("slurm-ddp: error: ") and fragment in lines[0]
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # wrote nothing (no runs/ either)
    assert not (tmp_path / "X").exists()


def test_cli_render_of_a_good_config_prints_the_script(tmp_path, monkeypatch, capsys, example_job):
    monkeypatch.chdir(tmp_path)
    rc = main(["render", str(example_job), "--run-dir", str(tmp_path / "run"), "--set", "slurm.partition=gpu"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    assert out.startswith("#!/bin/bash\n") and "#SBATCH --partition=gpu\n" in out
    assert os.listdir(tmp_path) == []  # render writes nothing


def test_cli_config_keys_lists_every_section(capsys):
    assert main(["config-keys"]) == 0
    out = capsys.readouterr().out
    for section in ("slurm:", "environment:", "train:", "checkpoint:", "requeue:"):
        assert section in out


# --------------------------------------------------------------------------- train.command, slurm.launcher


def test_command_string_is_split_and_paths_resolve_against_the_yaml(write_job, tmp_path):
    path = write_job({"train": {"task": "", "command": "python -u train.py --lr '0.1 0.2'"}})
    cfg = load_config(path)
    assert cfg.train.command == ("python", "-u", str(tmp_path / "train.py"), "--lr", "0.1 0.2")
    assert cfg.train.workdir == str(tmp_path.resolve()) and cfg.train.task == ""
    sub = tmp_path / "w"
    path = write_job({"train": {"task": "", "command": ["train.py"], "workdir": "w"}})
    cfg = load_config(path)
    assert cfg.train.command == (str(tmp_path / "train.py"),) and cfg.train.workdir == str(sub.resolve())
    assert load_config(path).config_hash() == config_from_dict(cfg.to_dict()).config_hash()  # written back as is


@pytest.mark.parametrize(
    "argv, index",
    [
        (["python", "t.py"], 1),
        (["python3", "-u", "-W", "ignore", "t.py", "x.py"], 4),
        (["python", "-m", "pkg.train"], None),
        (["python", "-c", "pass"], None),
        (["python", "-um", "pkg"], None),
        (["t.py", "--a"], 0),
        (["./run.sh"], 0),
        (["torchrun_like_tool", "t.py"], None),
        # shells (bash(1) "Invocation"): the first operand after the options is the script
        (["bash", "run.sh", "--lr", "1"], 1),
        (["sh", "-e", "x.sh"], 2),
        (["bash", "-euo", "pipefail", "run.sh"], 3),
        (["bash", "-O", "extglob", "+o", "posix", "run.sh"], 5),
        (["bash", "--norc", "--rcfile", "rc", "--", "run.sh"], 5),
        (["/bin/zsh", "-x", "x.zsh"], 2),
        (["dash", "-", "x.sh"], 2),
        (["bash", "-c", "echo hi"], None),
        (["sh", "-es"], None),
        (["bash"], None),
        (["bash", "-e"], None),
        # programs given by a path: the project's, unless in a system directory (FHS)
        (["bin/train", "--x"], 0),
        (["/home/me/proj/run.sh"], 0),
        (["/usr/bin/env", "python", "t.py"], None),
        (["/bin/true"], None),
    ],
)
def test_command_script_index(argv, index):
    from slurm_ddp.config import command_script_index

    assert command_script_index(argv) == index


@pytest.mark.parametrize(
    "argv, wrapper",
    [
        (["bash", "run.sh"], True),
        (["sh", "-e", "x.sh"], True),
        (["./x.sh"], True),
        (["bin/train"], True),
        (["bash", "-c", "python t.py"], False),
        (["python", "t.py"], False),
        (["/opt/py/bin/python3.11", "t.py"], False),
        (["./t.py"], False),
        (["python", "-m", "pkg"], False),
        (["/usr/bin/env", "python", "t.py"], False),
    ],
)
def test_command_is_wrapper(argv, wrapper):
    from slurm_ddp.config import command_is_wrapper

    assert command_is_wrapper(argv) is wrapper


@pytest.mark.parametrize(
    "path, python, expected",
    [
        ("/usr/bin:/bin", "/opt/env/bin/python", "/opt/env/bin:/usr/bin:/bin"),
        ("/opt/env/bin:/usr/bin", "/opt/env/bin/python", "/opt/env/bin:/usr/bin"),  # already first: unchanged
        ("/opt/env/bin/:/usr/bin", "/opt/env/bin/python", "/opt/env/bin/:/usr/bin"),
        ("/conda/bin:/opt/env/bin", "/opt/env/bin/python", "/opt/env/bin:/conda/bin:/opt/env/bin"),
        ("", "/opt/env/bin/python", "/opt/env/bin"),
        ("/usr/bin", "", "/usr/bin"),  # sys.executable can be empty
        ("/usr/bin", "/venv/bin/python", "/venv/bin:/usr/bin"),  # the venv's directory, its link not resolved
    ],
)
def test_the_ranks_interpreter_goes_first_on_path(path, python, expected):
    from slurm_ddp.launch import python_first_on_path

    assert python_first_on_path(path, python) == expected


def test_command_argv_uses_the_ranks_interpreter():
    from slurm_ddp.config import command_argv

    assert command_argv(["python", "t.py"], "/py") == ["/py", "t.py"]
    assert command_argv(["python3.11", "t.py"], "/py") == ["/py", "t.py"]
    assert command_argv(["t.py", "-x"], "/py") == ["/py", "t.py", "-x"]
    assert command_argv(["/opt/bin/python", "t.py"], "/py") == ["/opt/bin/python", "t.py"]
    assert command_argv(["bash", "run.sh"], "/py") == ["bash", "run.sh"]


@pytest.mark.parametrize(
    "train, fragments",
    [
        ({"task": "m:C", "command": ["python", "t.py"]}, ["'train.task'", "'train.command'", "both set"]),
        ({"task": "", "command": []}, ["'train.task' is missing", "'train.command'"]),
        ({"task": "", "command": ["python", 3]}, ["train.command[1]", "got 3", "a string"]),
        ({"task": "", "command": {"a": 1}}, ["train.command", "a list of strings"]),
        ({"task": "", "command": "python 'unclosed"}, ["train.command", "No closing quotation"]),
        ({"task": "", "command": [""]}, ["train.command[0]"]),
    ],
)
def test_command_mistakes_are_one_line(write_job, train, fragments):
    with pytest.raises(ConfigError) as ei:
        load_config(write_job({"train": train}))
    msg = str(ei.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, (f, msg)


def test_launcher_choices(make_config):
    assert make_config().slurm.launcher == "srun"
    assert make_config({"slurm": {"launcher": "torchrun"}}).slurm.launcher == "torchrun"
    with pytest.raises(ConfigError, match="slurm.launcher.*one of srun, torchrun"):
        make_config({"slurm": {"launcher": "mpirun"}})
