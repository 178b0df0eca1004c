"""``train.command`` words at rank start: ``$VAR``/``${VAR}`` of the rank's environment, ``$$`` a literal ``$``."""

from __future__ import annotations

import pytest

from slurm_ddp.errors import UserError
from slurm_ddp.launch import expand_command

ENV = {"SLURM_DDP_RUN_DIR": "/runs/a", "RANK": "3", "EMPTY": ""}


def test_variables_of_the_rank_are_expanded_and_double_dollar_is_literal() -> None:
    words = ["--ckpt-dir", "$SLURM_DDP_RUN_DIR/ckpts", "--tag=r${RANK}x", "cost$$5", "$EMPTY", "plain"]
    assert expand_command(words, ENV) == ["--ckpt-dir", "/runs/a/ckpts", "--tag=r3x", "cost$5", "", "plain"]


@pytest.mark.parametrize(
    "word, message",
    [
        ("$NOPE/x", "names $NOPE, which is not set in the rank's environment"),
        ("${NOPE}", "names $NOPE, which is not set"),
        ("a$", "a '$' must start $NAME or ${NAME}; write $$ for a literal $"),
        ("${RANK", "a '$' must start $NAME or ${NAME}"),
        ("$(date)", "a '$' must start $NAME or ${NAME}"),
    ],
)
def test_an_undefined_variable_or_a_lone_dollar_is_a_one_line_error(word: str, message: str) -> None:
    with pytest.raises(UserError) as e:
        expand_command(["python", word], ENV)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_train_args_are_appended_as_flags_unless_a_word_places_them() -> None:
    """train.args of a command job (a sweep element's own values): --NAME=VALUE after the words, in
    the mapping's order, or the value where a word says ${args.NAME} (slurm_ddp.config.command)."""
    args = {"lr": 0.001, "fp16": True, "layers": [1, 2], "name": "a b", "seed": 3}
    words = ["python", "train.py", "seed=${args.seed}", "--out", "$SLURM_DDP_RUN_DIR/o"]
    assert expand_command(words, ENV, args) == [
        "python",
        "train.py",
        "seed=3",
        "--out",
        "/runs/a/o",
        "--lr=0.001",
        "--fp16=true",
        "--layers=[1,2]",
        "--name=a b",
    ]
    assert expand_command(["python", "train.py"], ENV, {}) == ["python", "train.py"]


def test_a_placeholder_train_args_lacks_is_a_one_line_error() -> None:
    with pytest.raises(UserError) as e:
        expand_command(["python", "t.py", "--lr", "${args.lr}"], ENV, {"seed": 1})
    assert "names ${args.lr}, which train.args does not set (train.args has: seed)" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_placeholder_without_its_train_args_entry_is_refused_at_submit() -> None:
    from slurm_ddp.config import command_placeholders, config_from_dict
    from slurm_ddp.errors import ConfigError

    assert command_placeholders(["lr=${args.lr}", "$${args.x}", "${args.b-s}${HOME}"]) == ["lr", "b-s"]
    job = {"name": "p", "slurm": {"time": "00:10:00"}, "train": {"command": "python t.py --lr ${args.lr}"}}
    with pytest.raises(ConfigError, match=r"train.args has no 'lr'.*set train.args.lr"):
        config_from_dict(job)
    config_from_dict({**job, "train": {**job["train"], "args": {"lr": 0.1}}})
    with pytest.raises(ConfigError, match=r"config key 'train.args.--lr'"):
        config_from_dict({**job, "train": {"command": "python t.py", "args": {"--lr": 0.1}}})
