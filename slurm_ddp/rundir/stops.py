"""The stop signals the ranks of a ``train.command`` run were sent: ``stops/JOBID.RESTART/rank-N``,
written by the rank wrapper (``slurm_ddp.launch``) and read by the finished and requeue rules.
Part of :mod:`slurm_ddp.rundir`.

Side effects: reads and writes files of a run directory; imports no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Tuple

from .files import STOPS_DIR, PathLike

# --------------------------------------------------------------------------- stop signals of train.command ranks
#: Signals that tell a rank to stop, besides the job's ``requeue.signal``: SIGTERM (``scancel``,
#: ``scontrol requeue``, a preemption, the local supervisor's Ctrl-C), SIGINT and SIGHUP.
STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


def stop_precedence(signal_name: str) -> int:
    """How much a rank's stop signal weighs when the ranks agree on one (``signals.PreemptionFlag``):
    2 for ``STOP_SIGNALS`` (stop: :func:`decide_requeue` does not requeue after them, and a SIGTERM to
    one rank, ``scancel`` of a node, is a stop of the whole job), 1 for any other signal (the
    job's ``requeue.signal``: stop, then requeue). The signal the ranks agree on, which rank 0
    writes into the ``PREEMPTED`` marker, is one of the highest weight any rank received."""
    return 2 if signal_name in STOP_SIGNALS else 1


@dataclass(frozen=True)
class RankStops:
    """What the ranks of one job and restart were told (:func:`read_rank_stops`); empty when nothing."""

    signals: Tuple[str, ...] = ()  #: the signal names, e.g. ``("SIGTERM",)``, sorted
    requeue: bool = False  #: some rank got the job's ``requeue.signal``
    ranks: Tuple[int, ...] = ()  #: the ranks that recorded a signal

    @property
    def told(self) -> bool:
        """Some rank was told to stop (either kind)."""
        return bool(self.signals)

    @property
    def stop(self) -> bool:
        """Some rank got one of ``STOP_SIGNALS`` (not the requeue signal): stop, do not requeue."""
        return any(s in STOP_SIGNALS for s in self.signals)


def stop_dir(run_dir: PathLike, job_id: str, restart: int) -> Path:
    """``RUN_DIR/stops/JOBID.RESTART``: the stop records of one job's ranks (exists only after one)."""
    return Path(run_dir) / STOPS_DIR / f"{job_id}.{restart}"


def record_rank_stop(run_dir: PathLike, *, job_id: str, restart: int, rank: int, signal: str, requeue: bool) -> None:
    """Append ``"SIGNAL requeue|stop"`` to rank ``rank``'s record of job ``job_id`` at ``restart``
    (the rank wrapper of a ``train.command`` rank, when the rank is sent ``signal``, e.g.
    ``SIGTERM``; ``requeue``: it is the job's ``requeue.signal``). Raises ``OSError`` when unwritable."""
    d = stop_dir(run_dir, job_id, restart)
    d.mkdir(parents=True, exist_ok=True)
    append_line = f"{signal} {'requeue' if requeue else 'stop'}\n"
    with open(d / f"rank-{rank}", "a", encoding="utf-8") as f:
        f.write(append_line)


def read_rank_stops(run_dir: PathLike, job_id: str, restart: int) -> RankStops:
    """The stop signals the ranks of job ``job_id`` at ``restart`` recorded (malformed lines skipped).
    A rank's stop signal recorded after its requeue signal does not count: once the ranks stop at the
    requeue signal, srun ends the step's remaining tasks with SIGTERM (``--kill-on-bad-exit``, srun(1))."""
    signals, ranks, requeue = set(), set(), False
    try:
        paths = sorted(stop_dir(run_dir, job_id, restart).glob("rank-*"))
    except OSError:
        paths = []
    for p in paths:
        try:
            rank = int(p.name[len("rank-") :])
            lines = p.read_text(encoding="utf-8", errors="replace").splitlines()
        except (OSError, ValueError):
            continue
        told_requeue = False
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[0].startswith("SIG") and parts[1] in ("requeue", "stop"):
                if told_requeue and parts[1] == "stop":
                    # a stop signal after this rank's requeue signal is the step's teardown (srun's
                    # --kill-on-bad-exit once a peer exited at the requeue signal, or KillWait), not a
                    # stop of its own: a scancel or preemption reaches the supervisor too (got_term)
                    continue
                signals.add(parts[0])
                ranks.add(rank)
                told_requeue = told_requeue or parts[1] == "requeue"
                requeue = requeue or parts[1] == "requeue"
    return RankStops(signals=tuple(sorted(signals)), requeue=requeue, ranks=tuple(sorted(ranks)))


def read_rank_stops_here(run_dir: PathLike, environ: Optional[Mapping[str, str]] = None) -> RankStops:
    """:func:`read_rank_stops` for the job in ``environ`` (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``);
    empty without a job id or with a malformed restart count."""
    env = os.environ if environ is None else environ
    restart = env.get("SLURM_RESTART_COUNT") or "0"
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id or not restart.isdigit():
        return RankStops()
    return read_rank_stops(run_dir, job_id, int(restart))
