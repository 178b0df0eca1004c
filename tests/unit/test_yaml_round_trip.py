"""The run directory's ``config.yaml`` reads back equal to what was submitted (issue 49, item 2).

Property tests (hypothesis) over the values a user writes: ``train.command`` words, ``train.args``
values (strings, numbers, bools, null, lists, mappings), ``environment.env`` values, ``slurm.extra``
and ``name``: config → ``dump_config`` → ``load_config`` gives an equal config, value by value and type
by type (a string stays a string, ``5e-5`` never becomes a float); and a number in the job YAML keeps
the text it was written as, through ``--set``, ``--sweep`` and the round trip, up to the script's
``--NAME=VALUE``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from slurm_ddp.config import (
    ScalarFloat,
    ScalarInt,
    apply_overrides,
    command_arg_flags,
    config_from_dict,
    dump_config,
    load_config,
    read_yaml,
)
from slurm_ddp.config.loading import _yaml_load
from slurm_ddp.sweep import expand, parse_sweep_flag

#: Texts that YAML 1.1, YAML 1.2 or this project's loader read as something other than the string:
#: numbers in every notation, bools, nulls, base-60, dates, YAML's indicators.
TRICKY = [
    "5e-5", "1e3", "1E-3", "010", "0x1f", "0o17", "0b101", "inf", ".inf", "-.inf", ".nan", ".NaN", "nan",
    "yes", "no", "on", "off", "y", "n", "Yes", "TRUE", "False", "~", "null", "Null", "", "'3'", '"3"', "3",
    "-3", "+3", "1:30:00", "10:00", "-.5", ".5", "1.", "1_000", "1_000.5", "0.10", "1e", "e3", "0", "-0",
    "2024-01-01", "2001-12-14t21:59:43.10-05:00", "<<", "=", "#x", "a: b", "- a", "[a]", "{a: 1}", " x",
    "x ", "!tag", "&a", "*a", "%x", "@x", "`x", "|", ">", "?", ",", "x\ny", "\t", "\x85", "\u2028", "\ufeff",
]  # fmt: skip

#: Plain scalars of the job YAML that the loader reads as numbers (their text must reach the script).
NUMBER_TEXTS = ["5e-5", "1e3", "1E-3", "010", "0x1f", "0b101", "-.5", ".5", "1.", "1_000", "1_000.5",
                "0.10", "3", "-3", "+3", "0", "-0", ".inf", "-.inf", ".nan", "1e999", "007", "3.0e+2"]  # fmt: skip

_text = st.one_of(st.sampled_from(TRICKY), st.text(st.characters(exclude_categories=("Cs",)), max_size=12))
_word = _text.filter(lambda w: "$" not in w)  # a '$' is train.command's own syntax (COMMAND_VAR)
_number = st.one_of(
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(NUMBER_TEXTS).map(_yaml_load),  # ScalarInt/ScalarFloat with their text
)
_scalar = st.one_of(_text, _number, st.booleans(), st.none())
_arg_value = st.recursive(
    _scalar,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(_text, inner, max_size=3)),
    max_leaves=6,
)
#: an ``slurm.extra`` value: one sbatch token (no blanks, quotes, backslashes), or a finite number
_sbatch_value = st.one_of(
    st.sampled_from([t for t in TRICKY if re.fullmatch(r"[^\s'\"\\`]+", t)]),
    st.sampled_from(NUMBER_TEXTS).map(_yaml_load).filter(math.isfinite),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
)
_arg_name = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_-]{0,6}\Z")
_env_name = st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,6}\Z")


def same(a: Any, b: Any) -> bool:
    """Equal value by value and type by type: a string is never a number, ``1 != 1.0 != True``, NaN
    equals NaN, a number keeps its text (``str``: a ``ScalarFloat``'s as written, a float's ``repr``),
    and mappings keep their order."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, float) != isinstance(b, float) or str(a) != str(b):  # str: what reaches a script
            return False
        return (math.isnan(a) and math.isnan(b)) if isinstance(a, float) and math.isnan(a) else a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def _round_trip(cfg: Any, tmp_path: Path) -> Any:
    """``cfg`` written as the run directory's ``config.yaml`` (``prepare_run_dir``: ``dump_config``) and
    read back as a rank's rank wrapper reads it (``load_config``)."""
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg), encoding="utf-8")
    return load_config(path)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    words=st.lists(_word, min_size=1, max_size=6),
    args=st.dictionaries(_arg_name, _arg_value, max_size=5),
    env=st.dictionaries(_env_name, _word, max_size=3),
    extra=st.dictionaries(st.sampled_from(["comment", "mail-user", "nice"]), _sbatch_value, max_size=2),
    name=_text.filter(lambda t: t.strip() and t.isprintable()),
)
@example(
    words=[
        "--learning_rate",
        "5e-5",
        "1e3",
        "010",
        "0x1f",
        "inf",
        ".nan",
        "yes",
        "~",
        "'3'",
        "1:30:00",
        "-.5",
        "1_000",
    ],
    args={"lr": "5e-5", "e": _yaml_load("1e3"), "o": _yaml_load("010"), "h": "0x1f", "n": float("nan")},
    env={"LR": "5e-5", "T": "1:30:00", "N": "~", "Y": "yes"},
    extra={"comment": "1e3"},
    name="1e3",
)
def test_config_yaml_reads_back_equal_to_what_was_submitted(
    tmp_path: Path, words: list, args: dict, env: dict, extra: dict, name: str
) -> None:
    data = {
        "name": name,
        "slurm": {"extra": extra},
        "environment": {"env": env},
        "train": {"command": ["python", "x.py", *words], "args": args},
    }
    cfg = config_from_dict(data, base_dir=tmp_path)  # as submit loads it (paths resolved)
    back = _round_trip(cfg, tmp_path)
    assert same(back.to_dict(), cfg.to_dict()), dump_config(cfg)
    assert back.train.command[2:] == tuple(words)
    assert command_arg_flags(back.train.args) == command_arg_flags(cfg.train.args)
    assert back.config_hash() == cfg.config_hash()  # the run directory is this run's (check_run_dir)
    assert back.given_keys == cfg.given_keys  # the written comment's keys: its mapping read back unchanged


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(
    texts=st.lists(st.sampled_from(NUMBER_TEXTS + ["yes", "~", "'3'", "1:30:00", "inf", "x"]), min_size=1, max_size=6)
)
def test_numbers_of_train_args_reach_the_script_as_written_after_the_round_trip(tmp_path: Path, texts: list) -> None:
    lines = "".join(f"    a{i}: {t}\n" for i, t in enumerate(texts))
    job = tmp_path / "job.yaml"
    job.write_text(f"name: n\ntrain:\n  command: python x.py\n  args:\n{lines}", encoding="utf-8")
    cfg = load_config(job)
    back = _round_trip(cfg, tmp_path)
    assert same(back.to_dict(), cfg.to_dict())
    for flags in (command_arg_flags(cfg.train.args), command_arg_flags(back.train.args)):
        for i, (t, flag) in enumerate(zip(texts, flags)):
            want = {"yes": "true", "~": "null", "'3'": "3"}.get(t, t)  # YAML's bool, null and a quoted string
            assert flag == f"--a{i}={want}"


@pytest.mark.parametrize(
    "text,flag",
    [("1e3", "--lr=1e3"), ("0.10", "--lr=0.10"), ("5e-5", "--lr=5e-5"), ("010", "--lr=010"), ("1_000", "--lr=1_000")],
)
def test_a_number_keeps_its_text_through_set_and_sweep(text: str, flag: str, tmp_path: Path) -> None:
    base = {"name": "n", "train": {"command": "python x.py"}}
    cfg = config_from_dict(apply_overrides(base, [f"train.args.lr={text}"]))
    assert command_arg_flags(cfg.train.args) == [flag]
    assert command_arg_flags(_round_trip(cfg, tmp_path).train.args) == [flag]

    key, values = parse_sweep_flag(f"train.args.lr={text},3e-4")
    sweep = expand(base, [f"{key}={text},3e-4"])
    assert sweep is not None and [str(v) for v in values] == [text, "3e-4"]
    assert [command_arg_flags(e.cfg.train.args) for e in sweep.elements] == [[flag], ["--lr=3e-4"]]
    assert [e.label for e in sweep.elements] == [f"lr={text}", "lr=3e-4"]
    # an environment.env value written as a number is the variable's text as written
    env = config_from_dict(apply_overrides(base, [f"environment.env.LR={text}"]))
    assert env.environment.env["LR"] == text and _round_trip(env, tmp_path).environment.env["LR"] == text
    # a sweep: section in the file, and train.args the base config gives, keep their text too
    job = tmp_path / "job.yaml"
    job.write_text(
        f"name: n\ntrain:\n  command: python x.py\n  args: {{wd: 1e-2}}\nsweep:\n  grid: {{train.args.lr: [{text}]}}\n"
    )
    sweep = expand(read_yaml(job))
    assert sweep is not None
    assert command_arg_flags(_round_trip(sweep.elements[0].cfg, tmp_path).train.args) == ["--wd=1e-2", flag]


def test_a_typed_key_holds_a_plain_number_not_its_text() -> None:
    cfg = config_from_dict(
        _yaml_load("name: n\nslurm: {nodes: 010, tasks_per_node: 0x2}\ntrain: {task: m:T, lr: 1e-3}")
    )
    assert type(cfg.slurm.nodes) is int and str(cfg.slurm.nodes) == "8" and str(cfg.slurm.tasks_per_node) == "2"
    assert type(cfg.train.lr) is float and str(cfg.train.lr) == "0.001"


def test_a_date_stays_the_text_it_is_written_as() -> None:
    data = _yaml_load("name: 2024-01-01\ntrain: {command: python x.py, args: {day: 2024-01-01}}")
    cfg = config_from_dict(data)
    assert cfg.name == "2024-01-01" and command_arg_flags(cfg.train.args) == ["--day=2024-01-01"]


def test_the_dumper_quotes_what_a_yaml_reader_would_read_as_another_type() -> None:
    text = dump_config(config_from_dict({"name": "n", "train": {"command": ["python", "x.py", "5e-5", "1.5", "abc"]}}))
    assert "- '5e-5'\n" in text and "- '1.5'\n" in text and "- abc\n" in text
    # a date is text to the loader, and still quoted for a YAML 1.1 reader (yaml.safe_load) of the file
    dated = dump_config(config_from_dict({"name": "2024-01-01", "train": {"command": "python x.py"}}))
    assert "name: '2024-01-01'\n" in dated and yaml.safe_load(dated)["name"] == "2024-01-01"
    # a number written with a tag where its text alone reads as another type
    assert yaml.safe_load("x: !!float 3") == {"x": 3.0}
    cfg = config_from_dict(_yaml_load("name: n\ntrain: {command: python x.py, args: {x: !!float 3}}"))
    assert "x: !!float 3\n" in dump_config(cfg)
    assert isinstance(cfg.train.args["x"], ScalarFloat) and not isinstance(cfg.train.args["x"], ScalarInt)
