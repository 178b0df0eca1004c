"""``checkpoint.every_s: auto`` for a script of one's own: the rank wrapper's figures and slurm_ddp.preemption."""

from __future__ import annotations

import pytest

from slurm_ddp import preemption
from slurm_ddp.rundir import interval as iv


def test_script_environment_offers_the_interval_once_a_cost_is_recorded():
    kw = dict(mtbf_default_s=3600.0, max_interval_s=900.0, time_limit_s=7200.0, signal_delay_s=120.0)
    none = iv.script_environment([], **kw)
    assert none == {iv.MTBF_VAR: "3600.000", iv.MAX_INTERVAL_VAR: "900.000"}
    metrics = [{"event": "checkpoint", "reason": "periodic", "blocked_s": 2.0}]
    got = iv.script_environment(metrics, **kw)
    assert float(got[iv.EVERY_S_VAR]) == pytest.approx(iv.daly_interval_s(2.0, 3600.0), abs=1e-3)


def test_preemption_checkpoint_interval_and_should_checkpoint(monkeypatch):
    preemption._reset_for_tests()
    monkeypatch.delenv(iv.EVERY_S_VAR, raising=False)
    monkeypatch.delenv(iv.MTBF_VAR, raising=False)
    assert preemption.checkpoint_interval() is None and preemption.checkpoint_interval(1.0) is None
    assert not preemption.should_checkpoint(now=0.0) and not preemption.should_checkpoint(now=1e9)
    preemption._reset_for_tests()
    monkeypatch.setenv(iv.MTBF_VAR, "5000")
    monkeypatch.setenv(iv.MAX_INTERVAL_VAR, "60")
    assert preemption.checkpoint_interval(0.2) == pytest.approx(iv.daly_interval_s(0.2, 5000.0))
    assert preemption.checkpoint_interval(50.0) == 60.0  # the cap
    monkeypatch.setenv(iv.EVERY_S_VAR, "10")
    assert preemption.checkpoint_interval() == 10.0
    assert not preemption.should_checkpoint(now=100.0)  # the first call starts the clock
    assert not preemption.should_checkpoint(now=109.0)
    assert preemption.should_checkpoint(now=110.0)
    assert not preemption.should_checkpoint(now=115.0)
    preemption._reset_for_tests()
