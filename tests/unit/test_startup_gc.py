"""The worker's start-up runs with the cyclic garbage collector paused (``python -m slurm_ddp.worker``),
and ``slurm_ddp.worker.runtime.end_startup_gc`` ends the pause: one collection, the survivors frozen,
collection on again. Each check runs in a child process: freezing pytest's own objects is not the test's
business. The CPU it saves is measured by ``benchmarks/bench_rank_startup.py``, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _child(code: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_end_startup_gc_collects_freezes_and_enables_only_after_a_pause():
    got = _child(
        """
import gc, json, weakref
from slurm_ddp.worker.runtime import end_startup_gc
untouched = end_startup_gc()  # the collector is on: nothing changes
frozen_before = gc.get_freeze_count()
gc.disable()
class Cycle:
    pass
a, b = Cycle(), Cycle()
a.other, b.other = b, a
gone = weakref.ref(a)
del a, b  # start-up garbage: a reference cycle only the collector frees
ended = end_startup_gc()
print(json.dumps({"untouched": untouched, "frozen_before": frozen_before, "ended": ended,
                  "enabled": gc.isenabled(), "frozen": gc.get_freeze_count(), "cycle_freed": gone() is None}))
"""
    )
    assert got["untouched"] is False and got["frozen_before"] == 0, got
    assert got["ended"] is True and got["enabled"] is True and got["frozen"] > 0, got
    # the start-up's garbage was collected before the freeze, not frozen for good
    assert got["cycle_freed"] is True, got


def test_the_worker_entry_pauses_the_collector_before_it_imports_the_trainer(tmp_path):
    # a stand-in slurm_ddp.worker.train records what the real one would see when imported and run
    got = _child(
        f"""
import gc, json, sys, types
seen = {{}}
fake = types.ModuleType("slurm_ddp.worker.train")
def main(run_dir):
    seen["enabled_in_main"] = gc.isenabled()
    seen["run_dir"] = run_dir
    return 0
fake.main = main
seen["enabled_at_start"] = gc.isenabled()
sys.modules["slurm_ddp.worker.train"] = fake
from slurm_ddp.worker.__main__ import main as worker_main
seen["status"] = worker_main(["--run-dir", {str(tmp_path)!r}])
print(json.dumps(seen))
"""
    )
    assert got == {"enabled_at_start": True, "enabled_in_main": False, "run_dir": str(tmp_path), "status": 0}, got
