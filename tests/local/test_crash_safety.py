"""Crash safety of checkpoint saves: SIGKILL of the writing process at 20+ points spread over a save.

The harness is ``benchmarks/crash_points.py`` (which runs 100+ points): a child process forked from
this one saves a ~24 MB training-like state with ``CheckpointManager`` over a committed checkpoint and
is killed with SIGKILL — a real kill of a real process writing to the real filesystem — either

- right after each ``os.fsync``/``os.replace``/``os.unlink`` of the commit protocol (every window between
  two of its steps, deterministically), or
- after delays spread from 0 to the measured duration of the save (inside torch.save, hashing,
  writing, fsyncs, the renames, the retention that deletes the old checkpoint).

After each kill: ``latest()`` exists, loads with ``weights_only=True``, is the old or the new step and
holds exactly the tensors saved for it; and a resumed run's next save lands in the same directory and
loads back exactly.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import time
from pathlib import Path

import pytest
from lib import require_module

torch = require_module("torch")

pytestmark = [
    pytest.mark.local,
    pytest.mark.skipif(not hasattr(os, "fork"), reason="the kill harness forks the saving process"),
]

REPO = Path(__file__).resolve().parents[2]


def _harness():
    spec = importlib.util.spec_from_file_location("crash_points", REPO / "benchmarks" / "crash_points.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("crash_points", mod)
    spec.loader.exec_module(mod)
    return mod


cp = _harness()
SC = {sc.name: sc for sc in cp.SCENARIOS}


@pytest.fixture
def harness(tmp_path, caplog):
    caplog.set_level(logging.ERROR, logger="slurm_ddp.checkpoint")  # skipped damaged checkpoints: expected
    return cp.Harness(tmp_path, mib=24)


def test_kill_minus_9_at_every_commit_step_and_spread_over_the_save(harness):
    t0 = time.monotonic()
    # every step of the commit protocol for a new step and for a re-save of the committed step
    # (the preemption save right after a periodic one), then 18 kills spread in time over the
    # three kinds of save (next step, same step, AsyncCheckpointer).
    points = cp.plan(harness, n_time=18, event_scenarios=("next-step", "same-step"), reps=1, spread=1.0)
    assert len(points) >= 20
    outcomes = []
    for pt in points:
        o = harness.kill_point(
            pt["sc"],
            kill_after=pt.get("kill_after"),
            kill_at_event=pt.get("kill_at_event"),
            event_names=pt.get("event_names"),
        )
        outcomes.append(o)
    report = "\n".join(
        f"{o.scenario} {o.how}: killed={o.killed} latest={o.found} problem={o.problem}" for o in outcomes
    )
    assert [o for o in outcomes if o.problem] == [], report
    # every kill at a protocol event lands mid-save; of the kills spread in time (over the save's duration as
    # measured before them: on a loaded machine a save can end sooner), at least one per kind of save does
    assert all(o.killed for o in outcomes if o.how.startswith("after")), report
    for name in {o.scenario for o in outcomes if o.how.startswith("t=")}:
        assert any(o.killed for o in outcomes if o.scenario == name and o.how.startswith("t=")), report
    # the event kills land on both sides of the commit (the manifest's rename), deterministically
    for name in ("next-step", "same-step"):
        found = {o.found for o in outcomes if o.scenario == name and o.how.startswith("after")}
        assert found == {"old", "new"}, report
    # the protocol, as the events show it: data fsync + rename, manifest fsync + rename, one directory
    # fsync for both renames, then retention deletes the old checkpoint (manifest first, then data)
    _, events = harness.measure(SC["next-step"], reps=1)
    assert events == ["fsync", "replace", "fsync", "replace", "fsync", "unlink", "unlink"], events
    print(
        f"\n{len(outcomes)} kill points ({sum(o.killed for o in outcomes)} mid-save), 0 invalid latest "
        f"checkpoints, {time.monotonic() - t0:.1f} s"
    )


def test_a_resave_of_the_same_step_never_overwrites_the_committed_data(harness, tmp_path):
    """The committed data file stays untouched until the new manifest is committed."""
    from slurm_ddp.checkpoint import CheckpointManager

    d = tmp_path / "same"
    mgr = CheckpointManager(d, keep_last=1)
    first = mgr.save(harness.state(1, 0), 1)
    second = mgr.save(harness.state(1, 1), 1)
    assert second.path != first.path and not first.path.exists()
    assert mgr.latest().path == second.path
    assert cp.same(mgr.load(), harness.state(1, 1))
    third = mgr.save(harness.state(1, 0), 1)  # and back to the first name
    assert third.path == first.path and not second.path.exists()
    assert cp.same(mgr.load(), harness.state(1, 0))
    assert sorted(p.name for p in d.iterdir()) == ["step-00000001.json", "step-00000001.pt"]
