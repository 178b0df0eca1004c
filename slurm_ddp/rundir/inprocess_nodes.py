"""Which nodes an in-process recovery step (``recovery.in_process``) really lost, from its records. Pure.

A node whose ranks were only slow (silent past ``recovery.heartbeat_timeout_s``, then alive again) is recorded
as lost (``bad``) by the recovery that left it out, but its ranks then wait as spares of the step
(``slurm_ddp.worker.inprocess``) and a later recovery of the same step may call them in (its ``spares_used``).
Such a node is not lost: it must be neither given back to the cluster nor kept out of a later step. The job's
supervisor (``slurm_ddp.supervise``) asks :func:`still_lost` after an in-process step; a node a later recovery
used again is also one of that recovery's ``nodes``.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Sequence

from .recovery import IN_PROCESS


def still_lost(recoveries: Sequence[Mapping[str, Any]], job_id: str, restart: int) -> List[str]:
    """The nodes the in-process recoveries of job ``job_id`` at ``restart`` lost and did not take back later
    (as a spare, ``spares_used``, or as a node of a later generation, ``nodes``), in the order they were
    lost. ``recoveries``: the records of ``recoveries.jsonl`` in order (``read_recoveries``). Pure."""
    lost: List[str] = []
    for r in recoveries:
        if r.get("action") != IN_PROCESS or str(r.get("job_id")) != job_id or r.get("restart") != restart:
            continue
        back = {str(n) for n in (r.get("spares_used") or ())} | {str(n) for n in (r.get("nodes") or ())}
        lost = [n for n in lost if n not in back]
        lost += [str(n) for n in r.get("bad") or () if str(n) not in lost and str(n) not in back]
    return lost
