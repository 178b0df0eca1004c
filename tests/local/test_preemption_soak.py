"""The preemption soak's CI variant: 5 interruptions (one of each kind; the moments step, checkpoint
write and evaluation each at least once), then the run matches the uninterrupted one bitwise, with no
step missing or repeated in the metrics and no checkpoint left unloadable. ``benchmarks/preemption_soak.py
--n 100`` is the full soak (benchmarks/README.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]


def _soak_module():
    spec = importlib.util.spec_from_file_location("preemption_soak", REPO / "benchmarks" / "preemption_soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_five_random_preemptions_leave_no_trace(tmp_path: Path) -> None:
    soak = _soak_module()
    # max_steps 250: 5 interruptions advance the run ~25 steps each (eval every 50, checkpoints every 10); at
    # most to the next eval (+50) for the <= 2 of 5 at an eval, +25 at a step, +10 at a checkpoint: <= 180
    result = soak.run_soak(5, seed=1, work=tmp_path / "soak", max_steps=250, say=lambda line: None)
    assert {x.kind for x in result.interruptions} == set(soak.KINDS)
    assert {x.moment for x in result.interruptions} == set(soak.MOMENTS)
    assert result.ok, result.summary()
