"""``slurm_ddp.slurmversion``: the version in ``scontrol --version``'s output, and its failures."""

from __future__ import annotations

import subprocess

import pytest

from slurm_ddp.slurmversion import REPEATED_SHRINK, SlurmVersion, parse_slurm_version, slurm_version


@pytest.mark.parametrize(
    "text, version",
    [
        ("slurm-wlm 22.05.8\n", (22, 5, 8)),  # Debian 12
        ("slurm-wlm 24.11.5\n", (24, 11, 5)),  # Debian 13
        ("slurm 26.05.5\n", (26, 5, 5)),
    ],
)
def test_parse_reads_the_three_numbers(text: str, version: tuple) -> None:
    v = parse_slurm_version(text)
    assert v == version and str(v) == text.split()[1]


def test_versions_compare_with_tuples_and_the_shrink_threshold() -> None:
    assert SlurmVersion(22, 5, 8) < REPEATED_SHRINK <= SlurmVersion(24, 11, 5) < SlurmVersion(26, 5, 5)
    assert SlurmVersion(24, 11, 5) >= (24, 11)


def test_no_version_is_a_value_error_that_quotes_the_text() -> None:
    with pytest.raises(ValueError, match="no Slurm version.*'slurm'"):
        parse_slurm_version("slurm\n")


def test_a_failing_scontrol_is_a_runtime_error_with_its_last_line() -> None:
    def run(argv, **kw):
        assert argv == ["scontrol", "--version"]
        return subprocess.CompletedProcess(
            argv, 1, "", "scontrol: error: x\nscontrol: fatal: Could not establish a configuration source\n"
        )

    with pytest.raises(RuntimeError, match=r"status 1\): scontrol: fatal: Could not establish"):
        slurm_version(run=run)
    ok = lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "slurm-wlm 24.11.5\n", "")  # noqa: E731
    assert slurm_version(run=ok) == (24, 11, 5)
