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
