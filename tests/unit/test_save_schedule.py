"""The shared worker's periodic-save decision (slurm_ddp.worker.saves) with a fake clock and a fake broadcast."""

from __future__ import annotations

from typing import Any, Dict, List

from slurm_ddp.config import config_from_dict
from slurm_ddp.worker.saves import BOOTSTRAP_STEPS, SaveSchedule


def schedule(checkpoint: Dict[str, Any], history: List[Dict[str, Any]] = ()) -> tuple:
    cfg = config_from_dict({"name": "x", "train": {"task": "a.b:C"}, "checkpoint": checkpoint})
    clock = [0.0]
    written: List[Dict[str, Any]] = []
    sched = SaveSchedule(
        cfg,
        is_main=True,
        nodes=1,
        history=lambda: list(history),
        broadcast=lambda obj: obj,
        write=lambda **r: written.append(r),
        clock=lambda: clock[0],
        wall=lambda: 20.0,
    )
    return sched, clock, written


def run_steps(
    sched: SaveSchedule, clock: List[float], start: int, stop: int, step_s: float, cost_s: float
) -> List[int]:
    saves = []
    sched.begin(start)
    for step in range(start + 1, stop + 1):
        clock[0] += step_s
        if sched.due(step):
            clock[0] += cost_s
            saves.append(step)
            sched.saved(step, cost_s, None)
        elif sched.agree_due(step):
            sched.agree(step)
    return saves


def test_fixed_every_steps_needs_no_measurement():
    sched, clock, written = schedule({"every_steps": 10})
    assert run_steps(sched, clock, 0, 35, 0.1, 0.01) == [10, 20, 30] and not written


def test_fixed_every_s_turns_seconds_into_agreed_steps():
    sched, clock, _ = schedule({"every_steps": 0, "every_s": 2.0})
    saves = run_steps(sched, clock, 0, 100, 0.1, 0.0)
    # the bootstrap point (no save) measures 0.1 s steps; then a save every 2 s = 20 steps
    assert saves == [BOOTSTRAP_STEPS + 20 * k for k in range(1, 5)]


def test_auto_measures_at_the_bootstrap_save_then_saves_at_the_chosen_interval():
    sched, clock, written = schedule({"every_steps": "auto", "mtbf_s": 50.0, "async_save": False})
    saves = run_steps(sched, clock, 0, 200, 0.1, 0.25)
    assert saves[0] == BOOTSTRAP_STEPS  # no cost known: the first save measures it
    chosen = [w for w in written if w["event"] == "checkpoint_interval"]
    assert chosen and chosen[0]["checkpoint_cost_s"] == 0.25 and chosen[0]["bound"] == "daly"
    for w, nxt in zip(chosen, saves[1:]):
        assert nxt == w["next_step"] == w["step"] + w["every_steps"]


def test_a_resumed_start_takes_the_cost_from_the_runs_records():
    history = [
        {"event": "first_step", "time": 0.0},
        {"event": "checkpoint", "reason": "periodic", "blocked_s": 0.25, "time": 10.0},
        {"event": "first_step", "time": 15.0},  # this start's (the worker writes it before the first choice)
    ]
    sched, clock, written = schedule({"every_steps": "auto", "mtbf_s": 50.0}, history)
    saves = run_steps(sched, clock, 100, 200, 0.1, 0.25)
    assert saves and saves[0] > 100 + BOOTSTRAP_STEPS  # the bootstrap point only measured the step time
    # the run's first start ended without a stop record: one interruption in M, over 10 + 5 s
    assert written[0]["interruptions"] == 1 and written[0]["observed_s"] == 15.0
    assert written[0]["mtbf_s"] == (50.0 + 15.0) / 2
