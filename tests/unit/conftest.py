"""Shared fixtures of the pure-core unit tests (config, env, render, checkpoint).

Fixtures only (no helpers imported by name: ``tests/conftest.py`` shares the module name).
Everything here is fast and imports no torch; the tests that need torch import it themselves.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "job.yaml"

#: The smallest valid job: every other key has a default.
MINIMAL = {"name": "unit", "train": {"task": "mypkg.tasks:Task"}}


def deep_merge(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict:
    """``base`` with ``patch`` merged in, mapping by mapping (lists and scalars replace)."""
    out = copy.deepcopy(dict(base))
    for key, value in patch.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@pytest.fixture
def write_job(tmp_path: Path) -> Callable[..., Path]:
    """Write a job YAML under ``tmp_path`` and return its path.

    ``write_job({"slurm": {"nodes": 2}})`` merges the patch into ``MINIMAL``;
    ``write_job(text="...")`` writes the text as given; ``base=None`` starts from nothing.
    """

    def write(patch: Any = None, *, text: str = None, base: Any = MINIMAL, name: str = "job.yaml") -> Path:
        path = tmp_path / name
        if text is None:
            data = patch if base is None else deep_merge(base, patch or {})
            text = yaml.safe_dump(data, sort_keys=False)
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def example_job() -> Path:
    """The digits example's job file."""
    return EXAMPLE


@pytest.fixture
def make_config() -> Callable[..., Any]:
    """``make_config({"slurm": {"nodes": 2}})``: ``MINIMAL`` with the patch, validated (no file)."""
    from slurm_ddp.config import config_from_dict

    def make(patch: Any = None, base: Any = MINIMAL) -> Any:
        return config_from_dict(deep_merge(base, patch or {}))

    return make
