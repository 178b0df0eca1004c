"""The sandbox's Slurm timeouts are checked before anything starts (``slurm_ddp.sandbox.layout.check_timeouts``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_ddp.sandbox import SlurmSandbox
from slurm_ddp.sandbox.layout import MIN_SLURMD_PER_MESSAGE_TIMEOUT, check_timeouts


@pytest.mark.parametrize("slurmd, message", [(4, 3), (6, 2), (49, 10)])
def test_a_slurmd_timeout_under_five_message_timeouts_is_refused_in_one_line(
    tmp_path: Path, slurmd: int, message: int
) -> None:
    with pytest.raises(ValueError) as e:
        SlurmSandbox(tmp_path / "sb", nodes=3, slurmd_timeout_s=slurmd, message_timeout_s=message)
    text = str(e.value)
    assert "\n" not in text and f"slurmd_timeout_s ({slurmd})" in text and "slurmd_timeout_s=10" in text
    assert not (tmp_path / "sb").exists()  # nothing written


@pytest.mark.parametrize("slurmd, message", [(10, 2), (60, 10), (5, 1)])
def test_timeouts_at_least_five_to_one_are_taken(tmp_path: Path, slurmd: int, message: int) -> None:
    assert slurmd >= MIN_SLURMD_PER_MESSAGE_TIMEOUT * message
    sb = SlurmSandbox(tmp_path / "sb", nodes=3, slurmd_timeout_s=slurmd, message_timeout_s=message)
    assert (sb.slurmd_timeout_s, sb.message_timeout_s) == (slurmd, message)


@pytest.mark.parametrize(
    "args, name", [((1, 1, 0), "slurmd_timeout_s"), ((6, 0, 0), "message_timeout_s"), ((6, 2, -1), "kill_wait_s")]
)
def test_out_of_range_values_name_the_setting(args: tuple, name: str) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        check_timeouts(*args)
