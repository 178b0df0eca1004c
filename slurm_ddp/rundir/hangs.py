"""Hang reports of a run directory: ``hangs/JOBID.RESTART/rank-N.json``, written by a rank's hang
watchdog (``slurm_ddp.watchdog``) when it ends the rank, and their summary (:class:`Hang`) that the
requeue rule and the local supervisor read. An in-job restart sets the step's reports aside
(``hangs/JOBID.RESTART.step-K``, :func:`set_aside_hang_reports`). Part of :mod:`slurm_ddp.rundir`.

Side effects: reads and writes files of a run directory; imports no torch.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from .files import HANGS_DIR, PathLike


# --------------------------------------------------------------------------- hangs
@dataclass(frozen=True)
class HangReport:
    """What one rank's watchdog saw when it ended the rank (``hangs/JOBID.RESTART/rank-N.json``)."""

    job_id: str
    restart: int
    rank: int
    world_size: int
    host: str
    #: steps the rank had completed: its last progress report (``slurm_ddp.progress``), read when the
    #: report is written, also from a rank that is stopped
    step: int
    phase: str  #: one of ``slurm_ddp.progress.PHASES``
    idle_s: float  #: seconds since its last progress report
    limit_s: float  #: the allowance it exceeded (for ``cause == "self"``)
    cause: str  #: ``"self"``: it stopped progressing; ``"peer"``: ended because another rank did
    time: float = 0.0  #: wall clock (``time.time()``) of the report
    #: the rank's process was stopped (state ``T``: SIGSTOP, a frozen process) when the report was written:
    #: its own watchdog never fires for it (``scontrol suspend`` stops every rank), but a peer's hang is its doing
    stopped: bool = False


def hang_dir(run_dir: PathLike, job_id: str, restart: int) -> Path:
    """``RUN_DIR/hangs/JOBID.RESTART``: the reports of one job's hang (exists only after one)."""
    return Path(run_dir) / HANGS_DIR / f"{job_id}.{restart}"


def hang_report_path(run_dir: PathLike, job_id: str, restart: int, rank: int) -> Path:
    """``hang_dir(...)/rank-N.json``: the report of ``rank``'s watchdog (exists once it ends the rank)."""
    return hang_dir(run_dir, job_id, restart) / f"rank-{rank}.json"


def write_hang_report(run_dir: PathLike, report: HangReport) -> Path:
    """Write ``report`` as ``hang_dir(...)/rank-N.json`` (atomically); returns its path."""
    from dataclasses import asdict

    from ..durable import atomic_write_text

    path = hang_report_path(run_dir, report.job_id, report.restart, report.rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(asdict(report)) + "\n")
    return path


# ------------------------------------------------------------ the save before a hung job's ranks end
# Under in-job recovery a rank's watchdog, about to end it, gives it time to commit the last completed
# step alone (the worker's emergency checkpoint) first: the rank answers in ``rank-N.save`` beside the
# reports — a first line ``saving`` when it took the request (a thread of the rank, which sees its
# watchdog's report appear), then one line, the outcome. No answer (a rank that holds its GIL in a
# C call, a ``train.command`` script) and the watchdog ends the rank after a few seconds, as before.
HANG_SAVE_ACK = "saving"


def hang_save_path(run_dir: PathLike, job_id: str, restart: int, rank: int) -> Path:
    """``hang_dir(...)/rank-N.save``: ``rank``'s answer to its watchdog's report (see above)."""
    return hang_dir(run_dir, job_id, restart) / f"rank-{rank}.save"


def start_hang_save(run_dir: PathLike, job_id: str, restart: int, rank: int) -> None:
    """The rank took its watchdog's report as a request to save: the first line, written atomically (a
    rank ended while it writes leaves no empty answer, which a reader would take for an acknowledgement
    without an outcome). Raises ``OSError``."""
    from ..durable import atomic_write_text

    atomic_write_text(hang_save_path(run_dir, job_id, restart, rank), HANG_SAVE_ACK + "\n")


def end_hang_save(run_dir: PathLike, job_id: str, restart: int, rank: int, outcome: str) -> None:
    """Append the save's ``outcome`` (one line); best effort."""
    try:
        with open(hang_save_path(run_dir, job_id, restart, rank), "a", encoding="utf-8") as f:
            f.write(outcome.replace("\n", " ") + "\n")
    except OSError:
        pass


def wait_hang_save(
    run_dir: PathLike,
    job_id: str,
    restart: int,
    rank: Optional[int],
    ack_s: float,
    timeout_s: float,
    poll_s: float = 0.1,
) -> Optional[str]:
    """The outcome ``rank`` recorded (``end_hang_save``; ``rank`` None: the first outcome of any rank),
    waited for: up to ``ack_s`` seconds for a first line, then up to ``timeout_s`` seconds in all for the
    outcome. None when no rank took the request; ``"no outcome within N s"`` when one took it but did not
    finish."""
    d = hang_dir(run_dir, job_id, restart)
    paths = [hang_save_path(run_dir, job_id, restart, rank)] if rank is not None else []
    start = time.monotonic()
    while True:
        answers = []
        for path in paths or sorted(d.glob("rank-*.save")):
            try:
                answers.append(path.read_text(encoding="utf-8").splitlines(keepends=True))
            except OSError:
                continue
        for lines in answers:
            if len(lines) >= 2 and lines[1].endswith("\n"):
                return lines[1].strip()
        waited = time.monotonic() - start
        if (not answers and waited >= ack_s) or waited >= timeout_s:
            return None if not answers else f"no outcome within {timeout_s:.0f} s"
        time.sleep(poll_s)


def set_aside_hang_reports(run_dir: PathLike, job_id: str, restart: int, attempt: int) -> Optional[Path]:
    """Move the hang reports of job ``job_id`` at ``restart`` to ``hangs/JOBID.RESTART.step-K`` (``K``:
    ``attempt``, the in-job restarts before the step that wrote them) when an in-job restart follows:
    the next step's watchdogs would take the old reports for a peer's hang and end their ranks at once,
    and the requeue rule must judge only the last step. Returns the new path; None when there were no
    reports. Raises ``OSError`` when the move fails."""
    d = hang_dir(run_dir, job_id, restart)
    if not d.is_dir():
        return None
    dest = d.with_name(f"{d.name}.step-{attempt}")
    n = 1
    while dest.exists():  # a second job start with the same restart count (a manual requeue): keep both
        dest = d.with_name(f"{d.name}.step-{attempt}.{n}")
        n += 1
    d.rename(dest)
    return dest


def read_hang_reports(run_dir: PathLike, job_id: str, restart: int) -> List[HangReport]:
    """The hang reports of job ``job_id`` at ``restart``, by rank (unreadable ones skipped)."""
    d = hang_dir(run_dir, job_id, restart)
    out: List[HangReport] = []
    try:
        paths = sorted(d.glob("rank-*.json"))
    except OSError:
        return out
    for p in paths:
        try:
            out.append(HangReport(**json.loads(p.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return sorted(out, key=lambda r: r.rank)


@dataclass(frozen=True)
class Hang:
    """A job's hang, from its ranks' reports (:func:`summarize_hang`)."""

    job_id: str
    restart: int
    step: int  #: the culprits' last step
    phase: str  #: what the culprits were doing
    ranks: Tuple[int, ...]  #: the rank(s) that stopped progressing (all reporting ranks when unknown)
    hosts: Tuple[str, ...]  #: their hosts
    all_hosts: Tuple[str, ...]  #: the hosts of every reporting rank
    idle_s: float  #: the longest time without progress among the culprits
    known: bool  #: False when every rank stopped at the same point (no rank to blame)
    stopped: bool = False  #: the culprits' processes were stopped (SIGSTOP), not stuck

    @property
    def exclude(self) -> Optional[str]:
        """The one node to leave out of a requeued job: the culprits' only host, when other hosts
        took part; None otherwise."""
        if self.known and len(self.hosts) == 1 and len(self.all_hosts) > 1:
            return self.hosts[0]
        return None

    def line(self) -> str:
        """One line: which rank(s), on which host(s), stopped where."""
        from ..progress import PHASE_WORDS

        what = PHASE_WORDS.get(self.phase, self.phase)
        ranks = ", ".join(str(r) for r in self.ranks)
        who = f"rank {ranks}" if len(self.ranks) == 1 else f"ranks {ranks}"
        where = ", ".join(self.hosts)
        head = f"{who} on {where}" if self.known else f"every rank ({who} on {where})"
        how = "was stopped (SIGSTOP or a frozen process)" if self.stopped else "stopped progressing"
        return (
            f"hang: {head} {how} at step {self.step} in {what} "
            f"(no progress for {self.idle_s:.0f} s); their stacks are in their rank logs"
        )


def _position(r: HangReport) -> Tuple[int, int]:
    """How far a rank got: its step, then the phase's place in a step (eval and checkpoint of step N
    come after its training step, before step N+1's data)."""
    order = {"startup": 0, "eval": 1, "checkpoint": 2, "data": 3, "step": 4}
    return (r.step, order.get(r.phase, 4))


def summarize_hang(reports: Sequence[HangReport]) -> Optional[Hang]:
    """Name the culprits of a hang from its reports; None without reports.

    A rank that hangs on its own (data loading, its own work) stops short of its peers, which then
    wait in the next collective: the culprits are the ranks that got least far (step, then the
    phase's place in a step). A rank whose process was stopped (``HangReport.stopped``: SIGSTOP, a
    frozen process; its peers wait for it wherever it stopped) is the culprit whatever its position,
    when some reporting rank was not stopped. When every rank stopped at the same point, no rank is
    blamed (``known`` False): the ranks that noticed the hang themselves are named.
    """
    if not reports:
        return None
    frozen = [r for r in reports if r.stopped]
    if frozen and len(frozen) < len(reports):
        behind, known = frozen, True
    else:
        low = min(_position(r) for r in reports)
        behind = [r for r in reports if _position(r) == low]
        known = len(behind) < len(reports) or (
            len(reports) < reports[0].world_size and all(r.cause == "self" for r in behind)
        )
        if not known:
            behind = [r for r in reports if r.cause == "self"] or list(reports)
    return Hang(
        job_id=reports[0].job_id,
        restart=reports[0].restart,
        step=behind[0].step,
        phase=behind[0].phase,
        ranks=tuple(r.rank for r in behind),
        hosts=tuple(dict.fromkeys(r.host for r in behind)),
        all_hosts=tuple(dict.fromkeys(r.host for r in reports)),
        idle_s=max(r.idle_s for r in behind),
        known=known,
        stopped=bool(frozen) and behind == frozen,
    )


def find_hang(run_dir: PathLike, job_id: str, restart: int) -> Optional[Hang]:
    """The hang of job ``job_id`` at ``restart``, if its watchdogs reported one."""
    return summarize_hang(read_hang_reports(run_dir, job_id, restart))
