"""Goodput computed by hand from a run directory's raw records, for the report's tests on both tiers
(tests/local/test_stop_kill_finish_local.py, tests/slurm/test_tracking_slurm.py): what
``slurm-ddp report`` must agree with, written independently of ``slurm_ddp.ops.report``."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from slurm_ddp.rundir import read_ends, read_jobs, read_metrics


def by_hand(run_dir: Path, resumed: List[int], launches: Optional[List[float]] = None) -> float:
    """Goodput from the raw records: Σ training time whose steps survived ÷ Σ (launch → end).

    ``launches``: when each start began (epoch s); default: the submissions in ``jobs.jsonl`` (the local
    backend starts a launch per submit). Under Slurm a requeued start has no submission: pass the
    batch script's starts from ``provenance.json``."""
    if launches is None:
        launches = [j["time"] for j in read_jobs(run_dir)]
    ends = [e["time"] for e in read_ends(run_dir)]
    metrics = read_metrics(run_dir)
    allocated = sum(e - s for s, e in zip(launches, ends))
    kept = 0.0
    for i, (s, e) in enumerate(zip(launches, ends)):
        mine = [m for m in metrics if s <= m["time"] <= e]
        first = next(m["time"] for m in mine if m["event"] == "first_step")
        stop = next((m for m in mine if m["event"] == "preempted"), None)
        train = {m["step"]: m["time"] for m in mine if m["event"] == "train"}
        end = stop["signal_time"] if stop else max(train.values())
        if i + 1 < len(resumed) and resumed[i + 1] < max(train):  # steps after the next start's checkpoint: lost
            end = train[resumed[i + 1]]
        blocked = sum(m.get("duration_s", 0) for m in mine if m["event"] == "eval" and first < m["time"] <= end)
        blocked += sum(
            m["blocked_s"]
            for m in mine
            if m["event"] == "checkpoint" and not m["reason"].startswith("preemption") and first < m["time"] <= end
        )
        kept += end - first - blocked
    return kept / allocated
