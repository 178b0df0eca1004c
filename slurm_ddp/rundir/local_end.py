"""How a local start ended (:class:`LocalEnd`), in Slurm's state names, and the pure rule that names
it (:func:`local_end`). Part of :mod:`slurm_ddp.rundir`.

The record is the local supervisor's entry of the run directory's one log of start ends
(``ENDS_NAME``, :func:`~slurm_ddp.rundir.record_end`, ``by: "local"``), the ``LocalEnd`` under its
``local`` key: the report and ``status`` read the same line. Side effects: :func:`write_local_end`/
:func:`read_local_end` append and read it. Imports no torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

from ..constants import PREEMPTED_EXIT_CODE
from .files import PathLike, Preempted, read_ends, record_end
from .hangs import Hang
from .requeue import RequeueDecision

# --------------------------------------------------------------------------- how a local start ended
#: The Slurm job state of a preempted job (squeue(1) "JOB STATE CODES"; not the run directory's marker file):
#: the one spelling, which ``ops`` (squeue/sacct answers) uses too.
PREEMPTED_STATE = "PREEMPTED"
#: The states of a local start's end, Slurm's own names for the same endings (squeue(1) JOB STATE CODES).
LOCAL_END_STATES = ("COMPLETED", PREEMPTED_STATE, "CANCELLED", "FAILED")


@dataclass(frozen=True)
class LocalEnd:
    """How one start of the local supervisor ended (its ``ENDS_NAME`` record), in Slurm's state names.

    ``COMPLETED``: the run finished. ``PREEMPTED``: the ranks stopped at the requeue signal (status 75
    with a checkpoint, or a script of one's own that the signal stopped); a new submit resumes.
    ``CANCELLED``: the local supervisor was told to stop (Ctrl-C = SIGINT, or SIGTERM when it is not the
    requeue signal) before any rank failed. ``FAILED``: a rank exited with another status first
    (``rank``, ``rank_status``, ``log``), or the hang watchdog ended the ranks.
    """

    job_id: str  #: the local supervisor's job id (its pid), as in ``JOBS_NAME``
    restart: int  #: the start's ``SLURM_RESTART_COUNT`` (local starts of the run directory before it)
    state: str  #: one of ``LOCAL_END_STATES``
    exit_code: int  #: the local supervisor's exit status
    reason: str  #: one line saying what happened and what to do next
    rank: Optional[int] = None  #: FAILED: the first rank that failed
    rank_status: Optional[int] = None  #: its status (``-N``: killed by signal N, as ``Popen.returncode``)
    log: Optional[str] = None  #: its log file
    signal: Optional[str] = None  #: the signal that stopped the start (``SIGUSR2``, ``SIGINT``, ...)
    time: float = 0.0  #: wall clock (``time.time()``) of the end

    def describes(self, job: Mapping[str, Any]) -> bool:
        """True when this record is the end of the submission ``job`` (a ``JOBS_NAME`` record)."""
        restart = job.get("restart", 0)
        return str(job.get("job_id", "")) == self.job_id and isinstance(restart, int) and restart == self.restart


def write_local_end(run_dir: PathLike, end: LocalEnd, status: Optional[int] = None) -> None:
    """Append ``end`` to the run's start ends (``ENDS_NAME``, ``by: "local"``): ``exit_code`` is the
    ranks' status before the requeue rule (``status``, default ``end.exit_code``), as the batch
    shell's record has srun's; the ``LocalEnd`` under ``local``. Raises ``OSError``."""
    from dataclasses import asdict

    code = end.exit_code if status is None else status
    record_end(
        run_dir, job_id=end.job_id, restart=end.restart, exit_code=code, by="local", local=asdict(end), time=end.time
    )


def read_local_end(run_dir: PathLike) -> Optional[LocalEnd]:
    """The latest local start's end (the last ``by: "local"`` record of ``ENDS_NAME``); None when
    there is none or it is malformed."""
    recs = [r for r in read_ends(run_dir) if r.get("by") == "local"]
    if not recs or not isinstance(recs[-1].get("local"), dict):
        return None
    try:
        end = LocalEnd(**recs[-1]["local"])
    except (ValueError, TypeError):
        return None
    if end.state not in LOCAL_END_STATES or not isinstance(end.restart, int):
        return None
    return end


def status_words(status: int) -> str:
    """``status 3``, or ``killed by SIGKILL`` for a ``Popen.returncode`` of ``-9``."""
    if status >= 0:
        return f"status {status}"
    import signal as _signal

    try:
        return f"killed by {_signal.Signals(-status).name}"
    except ValueError:
        return f"killed by signal {-status}"


def local_end(
    *,
    job_id: str,
    restart: int,
    status: int,
    decision: Optional[RequeueDecision],
    requeue_signal: str,
    command: bool,
    finished: bool,
    marker: Optional[Preempted] = None,
    failed: Optional[Tuple[int, int]] = None,
    failed_log: Optional[str] = None,
    hang: Optional[Hang] = None,
    cancelled: Optional[str] = None,
    stopped_by: Optional[str] = None,
    next_start: Optional[str] = None,
) -> LocalEnd:
    """How a local start ended, in Slurm's state names, with its one-line reason. Pure.

    ``status``: the ranks' status before the requeue rule; ``decision``: the rule's
    (:func:`decide_requeue`, as the batch script applies it; None after a failure or hang);
    ``requeue_signal``: e.g. ``SIGUSR2``; ``command``: a ``train.command`` run; ``finished``: the run
    wrote ``FINISHED``; ``marker``: the ``PREEMPTED`` marker when it belongs to this start;
    ``failed``: ``(rank, Popen.returncode)`` of the first rank that failed (not of a stop signal the
    local supervisor passed on) and ``failed_log`` its log; ``hang``: the watchdogs' report of this start;
    ``cancelled``: the signal that told the local supervisor to stop (SIGINT, or SIGTERM that is not the
    requeue signal) when it came before any rank failed; ``stopped_by``: the requeue signal or
    SIGTERM the local supervisor passed on to the ranks, if any; ``next_start``: for a ``train.command`` run,
    what its next start trains from (``rundir.next_start``'s words), said after "submit again".
    """
    exit_code = decision.exit_code if decision is not None else status

    def end(state: str, reason: str, **kw: Any) -> LocalEnd:
        return LocalEnd(
            job_id=job_id, restart=restart, state=state, exit_code=exit_code, reason=reason, time=time.time(), **kw
        )

    resume = "submit again with the same --run-dir to resume"
    # train.command: what the next start trains from is the run's own (rundir.next_start), not a given
    again = f"submit again with the same --run-dir: {next_start or 'what the next start trains from is unknown'}"
    if finished and failed is None and hang is None:
        late = f"; {status_words(status)} came from a stop signal that arrived after the run finished" if status else ""
        return end("COMPLETED", "the run finished" + late)
    if hang is not None:
        return end("FAILED", hang.line(), signal=None)
    if failed is not None and cancelled is None:
        rank, rank_status = failed
        where = f"; its log: {failed_log}" if failed_log else ""
        return end(
            "FAILED",
            f"rank {rank} failed first ({status_words(rank_status)}); the other ranks were stopped{where}",
            rank=rank,
            rank_status=rank_status,
            log=failed_log,
        )
    if marker is not None and not command:
        saved = f"rank 0 committed the checkpoint of step {marker.step}; {resume} from it"
    elif marker is not None:
        saved = f"the script stopped at its step {marker.step} (slurm_ddp.preemption); {again}"
    elif command and exit_code == PREEMPTED_EXIT_CODE and status == 0:
        saved = f"the ranks exited with status 0: stopped, not finished; {again}"
    elif command:
        saved = f"the ranks stopped ({status_words(status)}); {again}"
    else:
        saved = f"the ranks stopped ({status_words(status)}); {resume} from the last committed checkpoint, if any"
    if cancelled is not None:
        how = "SIGINT (Ctrl-C)" if cancelled == "SIGINT" else cancelled
        reason = f"cancelled by {how} to the local supervisor: the ranks were told to stop (SIGTERM)"
        if command and status == 0 and marker is None:
            reason += f" and exited with status 0: stopped, not finished; {again}"
        else:
            reason += f"; {saved}"
        return end("CANCELLED", reason, signal=cancelled)
    if decision is not None and decision.preempted:
        sig = marker.signal if marker is not None else stopped_by or requeue_signal
        what = f"{sig} (the requeue signal)" if sig == requeue_signal else sig
        return end(PREEMPTED_STATE, f"stopped by {what}; {saved}", signal=sig)
    why = f"the ranks ended with {status_words(status)}" + (f" after {stopped_by}" if stopped_by else "")
    return end("FAILED", f"{why} and the run did not finish", signal=stopped_by)
