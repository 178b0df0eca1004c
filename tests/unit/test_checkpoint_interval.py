"""The checkpoint interval rule (slurm_ddp.rundir.interval): inputs -> interval, bounds, update after an interruption."""

from __future__ import annotations

import math

import pytest

from slurm_ddp.rundir import interval as iv


def test_daly_is_young_plus_higher_order_terms():
    c, m = 2.0, 3600.0
    young = math.sqrt(2 * c * m)  # 120 s
    x = c / (2 * m)
    assert iv.young_interval_s(c, m) == pytest.approx(120.0)
    assert iv.daly_interval_s(c, m) == pytest.approx(young * (1 + math.sqrt(x) / 3 + x / 9) - c)
    # within a few per cent of Young's when C << M, as Daly's paper says
    assert iv.daly_interval_s(c, m) == pytest.approx(young, rel=0.02)
    # a save costing more than 2 M: Daly's tau = M
    assert iv.daly_interval_s(10.0, 4.0) == 4.0
    with pytest.raises(ValueError):
        iv.daly_interval_s(-1.0, 10.0)


def test_interval_is_the_optimum_of_the_first_order_loss():
    c, r, m = 0.5, 20.0, 1800.0
    tau = iv.choose_interval(checkpoint_cost_s=c, mtbf_default_s=m, max_interval_s=1e9).every_s
    best = iv.expected_efficiency(tau, c, r, m)
    for other in (tau * 0.8, tau * 1.25):
        assert iv.expected_efficiency(other, c, r, m) < best
    # nothing rolled back (in-process recovery, an emergency checkpoint): the tau/2 term goes, R stays
    assert iv.expected_efficiency(tau, c, r, m, redo_fraction=0.0) == pytest.approx(1 - c / tau - r / m)
    assert iv.expected_efficiency(tau, c, r, m, redo_fraction=0.0) - best == pytest.approx(tau / 2 / m)
    with pytest.raises(ValueError):
        iv.expected_efficiency(tau, c, r, m, redo_fraction=1.5)


def test_inputs_to_interval_in_steps_with_figures():
    got = iv.choose_interval(checkpoint_cost_s=0.2, mtbf_default_s=1000.0, step_s=0.5, max_interval_s=1e6)
    assert got.bound == "daly"
    assert got.every_steps == round(iv.daly_interval_s(0.2, 1000.0) / 0.5)
    assert got.every_s == pytest.approx(got.every_steps * 0.5)
    rec = got.record()
    assert rec["event"] == "checkpoint_interval"
    assert rec["checkpoint_cost_s"] == 0.2 and rec["mtbf_s"] == 1000.0 and rec["step_s"] == 0.5
    assert "Daly" in got.words()


def test_bounds_writer_cap_planned_stop_and_one_step():
    # the writer cannot keep up with Daly's optimum: never sooner than one background write
    w = iv.choose_interval(checkpoint_cost_s=0.001, mtbf_default_s=100.0, write_s=30.0, step_s=0.7)
    assert w.bound == "writer" and w.every_steps == math.ceil(30.0 / 0.7)
    assert w.every_s >= 30.0
    # a cheap-looking save on a reliable cluster: never less often than the cap
    c = iv.choose_interval(checkpoint_cost_s=5.0, mtbf_default_s=1e9, max_interval_s=600.0)
    assert c.bound == "cap" and c.every_s == 600.0
    # a start's planned length bounds it (the stop before the time limit saves anyway)
    p = iv.choose_interval(
        checkpoint_cost_s=5.0, mtbf_default_s=1e9, time_limit_s=1800, signal_delay_s=120, max_interval_s=1e6
    )
    assert p.bound == "planned_stop" and p.every_s == 1680.0 and p.planned_stop_every_s == 1680.0
    # a free save: at least one step
    s = iv.choose_interval(checkpoint_cost_s=0.0, mtbf_default_s=100.0, step_s=0.3)
    assert s.every_steps == 1 and s.bound == "step"
    with pytest.raises(ValueError):
        iv.choose_interval(checkpoint_cost_s=1.0, mtbf_default_s=100.0, max_interval_s=0)


def _start(t0, steps=3, job="1", restart=0, end=None):
    ev = [{"event": "first_step", "time": t0, "job_id": job, "restart": restart}]
    ev += [{"event": "train", "time": t0 + 10.0 * (i + 1)} for i in range(steps)]
    if end:
        ev.append({"event": end, "time": t0 + 10.0 * steps + 1})
    return ev


def test_history_counts_only_interruptions_that_lose_work():
    # start 1 killed (no stop record), start 2 stopped by signal (saved), start 3 running
    metrics = _start(0.0) + _start(100.0, restart=1, end="preempted") + _start(200.0, restart=2)
    h = iv.interruption_history(metrics)
    assert h.interruptions == 1 and h.planned_stops == 1
    assert h.observed_s == pytest.approx(30.0 + 31.0 + 30.0)
    assert iv.interruption_history(metrics, now=260.0).observed_s == pytest.approx(30.0 + 31.0 + 60.0)
    # an in-process recovery is an interruption inside a start
    more = metrics + [{"event": "resume", "time": 240.0, "in_process": True}]
    assert iv.interruption_history(more).interruptions == 2
    # ... counted once: the first_step the survivors write after it continues the start (no second interruption)
    after = more + [{"event": "first_step", "time": 241.0}, {"event": "train", "time": 250.0}]
    h = iv.interruption_history(after)
    assert h.interruptions == 2 and h.observed_s == pytest.approx(30.0 + 31.0 + 50.0)
    killed_after = after + _start(300.0, restart=3)  # then that start killed: one more
    assert iv.interruption_history(killed_after).interruptions == 3
    assert iv.interruption_history([]) == iv.History()


def test_update_after_an_interruption_shortens_the_interval():
    before = iv.History(observed_s=3600.0, interruptions=0)
    after = iv.History(observed_s=3600.0, interruptions=1)
    kw = dict(checkpoint_cost_s=1.0, mtbf_default_s=7200.0, max_interval_s=1e6)
    a = iv.choose_interval(history=before, **kw)
    b = iv.choose_interval(history=after, **kw)
    assert a.mtbf_s == pytest.approx(10800.0) and b.mtbf_s == pytest.approx(5400.0)
    assert b.every_s < a.every_s
    assert b.every_s == pytest.approx(iv.daly_interval_s(1.0, 5400.0))
    # many interruptions: M tends to the run's own observed time between them
    many = iv.History(observed_s=1e6, interruptions=1000)
    assert iv.estimate_mtbf_s(7200.0, many) == pytest.approx(1e3, rel=0.01)


def test_default_mtbf_and_measured_costs():
    assert iv.default_mtbf_s(1) == pytest.approx(1000 / 6.5 * 86400)
    assert iv.default_mtbf_s(4) == pytest.approx(iv.default_mtbf_s(1) / 4)
    with pytest.raises(ValueError):
        iv.default_mtbf_s(0)
    metrics = [
        {"event": "checkpoint", "reason": "periodic", "blocked_s": 0.1, "previous_write_s": 1.0},
        {"event": "checkpoint", "reason": "final", "blocked_s": 9.0},
        {"event": "checkpoint", "reason": "periodic", "blocked_s": 0.3, "previous_write_s": 3.0},
        {"event": "checkpoint_interval", "every_s": 12.0},
    ]
    assert iv.measured_costs(metrics) == {"blocked_s": pytest.approx(0.2), "write_s": pytest.approx(2.0)}
    assert iv.measured_costs([]) == {"blocked_s": None, "write_s": None}
    assert iv.last_interval(metrics) == {"event": "checkpoint_interval", "every_s": 12.0}
