"""What a login-node verb acts on: a run directory, a sweep directory, or one element of a sweep
(``SWEEP/N``), named on the command line (:func:`resolve_target`); and the verbs that act on
either kind (:func:`cancel_target`, :func:`requeue_target`, :func:`show_target_logs`).

Side effects: reads run directories; ``cancel``/``requeue`` run ``scancel``/``scontrol requeue``
(:mod:`.actions`, :mod:`.sweeps`). Returns sentences and raises ``UserError``/``ClusterError``;
printing is the caller's. Imports no torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import UserError
from ..rundir import is_sweep_dir
from .actions import cancel, requeue
from .logs import check_rank, follow_logs, show_logs
from .runs import read_run, resolve_run
from .status import RunStatus
from .sweeps import cancel_sweep, element_path, read_sweep, requeue_sweep


def resolve_target(arg: str) -> Path:
    """A run directory, a sweep directory, or ``SWEEP/N`` (an element by its number); a bare name
    is looked up under ``./runs``. Raises ``UserError`` when ``arg`` names none of them."""
    elem = element_path(arg)
    if elem is not None:
        return elem
    p = Path(arg)
    if not p.exists() and os.sep not in arg and is_sweep_dir(Path("runs") / arg):
        p = Path("runs") / arg
    if is_sweep_dir(p):
        return p.resolve()
    return resolve_run(arg)


def cancel_target(path: Path) -> str:
    """``scancel`` the run's latest job, or a sweep's unfinished elements; returns what was done."""
    if is_sweep_dir(path):
        return cancel_sweep(read_sweep(path))
    return cancel(read_run(path))


def requeue_target(path: Path) -> str:
    """``scontrol requeue`` the run's latest job, or a sweep's stopped and running elements; returns
    what was done."""
    if is_sweep_dir(path):
        return requeue_sweep(read_sweep(path))
    return requeue(read_run(path))


def show_target_logs(
    arg: str, rank: Optional[int], write: Callable[[str], Any], follow: bool = False
) -> Optional[RunStatus]:
    """Write the logs of the run ``arg`` names (one rank, or every rank interleaved) through ``write``;
    with ``follow``, keep writing until the run ends and return its final state (else None).

    Raises ``UserError`` for a sweep (logs show one run) or a rank the run does not have."""
    path = resolve_target(arg)
    if is_sweep_dir(path):
        raise UserError(f"logs shows one run: give one element of the sweep, e.g. slurm-ddp logs {arg}/0")
    run = read_run(path)
    if rank is not None:
        check_rank(run, rank)
    if not follow:
        show_logs(run, rank, write)
        return None
    return follow_logs(run.path, rank, write)
