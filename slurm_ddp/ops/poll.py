"""How often the login-node verbs ask Slurm while they watch runs: the one polling policy
(:data:`POLL`, :class:`Poller`) that ``Run.wait``, ``Sweep.wait``, :func:`slurm_ddp.api.wait_all`,
``submit --wait`` and ``logs -f`` use.

squeue(1) and sacct(1), section "PERFORMANCE": every call is a remote procedure call to ``slurmctld``
(``slurmdbd`` for sacct); enough of them at once degrade the daemon, "possibly resulting in a denial of
service"; "Do not run squeue or other Slurm client commands that send remote procedure calls to
slurmctld from loops in shell scripts or other programs. Ensure that programs limit calls to squeue to
the minimum necessary for the information you are trying to gather." A wait is such a loop, so it is
made as small as it can be:

- **one question per tick for every run being watched** (:func:`ask_runs`): ``squeue --jobs=ID1,ID2,…``
  (one per cluster the jobs were submitted to; ``ops.status.runs_status``; a sweep: one ``squeue --array``
  for its array jobs, ``ops.sweeps.sweep_status``), then ``sacct`` only for the ids that left the
  controller's queue; one run alone: one ``scontrol show job`` (the same one query, with the detail);
  the exit codes of the runs that ended in a tick: one ``sacct`` for all of them; a run that ended is
  asked about no more;
- **an interval that backs off while nothing changes**: :attr:`PollPolicy.first_s` (5 s) after an
  answer that differs from the one before, doubled after each answer that does not, up to
  :attr:`PollPolicy.max_s` (60 s): a job that runs for hours costs about one question a minute;
- **file-side events cost no question**: between two questions the run directories are looked at
  (``os.stat`` of a few files, every :attr:`PollPolicy.file_check_s`): a new job record, the
  ``FINISHED`` or ``PREEMPTED`` marker, a local supervisor's end record make the next question due at once
  (but never sooner than ``first_s`` after the one before) and reset the interval (the scheduler's state
  is about to change); a rank log growing does not. So a watch never asks more than once per ``first_s``;
- a question that fails on the controller's transient errors is asked again by ``ops.slurm.call``'s
  one retry policy (``ops.slurm.RETRY``: after 1, 2, 4 s); a tick whose question could not be answered
  at all counts as no change (the interval keeps growing).

The rates this gives are stated in docs/guides/operating.md ("Scheduler load") and counted by
benchmarks/bench_scheduler_load.py.

Side effects: reads run directories, asks Slurm through the injectable ``run_cmd`` (``ops.slurm``),
sleeps through an injectable ``sleep`` on an injectable ``clock`` (tests and the benchmark pass fakes).
Never prints. Imports no torch.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Hashable, List, Optional, Sequence, Tuple, TypeVar

from ..rundir import ENDS_NAME, FINISHED_NAME, JOBS_NAME, PREEMPTED_NAME, SWEEP_JOBS_NAME
from .ownjob import identity_of, query_cluster
from .runs import Run, read_run
from .slurm import Runner, sacct_jobs
from .status import RunStatus, run_status, runs_status
from .sweeps import SweepStatus, read_sweep, sweep_status

T = TypeVar("T")


@dataclass(frozen=True)
class PollPolicy:
    """How often a watch asks the scheduler (seconds): ``first_s`` after an answer that changed (and after
    the first), times ``factor`` after each unchanged one, at most ``max_s``; the run directories are looked
    at every ``file_check_s`` in between (no scheduler question)."""

    first_s: float = 5.0
    max_s: float = 60.0
    factor: float = 2.0
    file_check_s: float = 1.0

    def __post_init__(self) -> None:
        if not (self.first_s > 0 and self.max_s >= self.first_s and self.factor >= 1 and self.file_check_s > 0):
            raise ValueError(
                f"poll interval: need 0 < first_s <= max_s and factor >= 1 and file_check_s > 0 "
                f"(got first_s={self.first_s:g}, max_s={self.max_s:g}, factor={self.factor:g}, "
                f"file_check_s={self.file_check_s:g})"
            )


#: The one polling policy of the verbs that wait (5 s, doubling while nothing changes, up to 60 s).
POLL = PollPolicy()

_UNSET: object = object()


class Poller:
    """When the next scheduler question of a watch is due: :meth:`answered` after each question (with a key
    of the answer; ``None``: no answer), :meth:`poke` on a file-side event, :meth:`due` / :meth:`wait_s`
    to know when to ask. Due at once when made. ``clock``: seconds, monotonic."""

    def __init__(self, policy: PollPolicy = POLL, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy, self.clock = policy, clock
        self.interval_s = policy.first_s  #: the wait before the next question, seconds
        self.next_s = clock()  #: when the next question is due (``clock`` seconds)
        self.questions = 0  #: how many answers were recorded
        self._key: object = _UNSET
        self._last_s: Optional[float] = None  # when the last answer came

    def answered(self, key: Optional[Hashable]) -> bool:
        """Record a question's answer (``key``: what of it counts as a change; ``None``: it could not be
        answered, which is no change) and schedule the next. Returns whether it changed."""
        changed = key is not None and self._key is not _UNSET and key != self._key
        if key is not None:
            first = self._key is _UNSET
            self._key = key
        else:
            first = False
        if changed or first:
            self.interval_s = self.policy.first_s
        elif self.questions:
            self.interval_s = min(self.policy.max_s, self.interval_s * self.policy.factor)
        self.questions += 1
        self._last_s = self.clock()
        self.next_s = self._last_s + self.interval_s
        return changed

    def poke(self) -> None:
        """A file-side event (a new job record, a ``FINISHED`` marker): the next question is due now, or
        ``first_s`` after the one before where that is later (events never make the questions more frequent
        than one per ``first_s``), and the interval starts again from ``first_s``."""
        self.interval_s = self.policy.first_s
        self.next_s = min(self.next_s, self.clock() if self._last_s is None else self._last_s + self.policy.first_s)

    def wait_s(self) -> float:
        """Seconds until the next question is due (0: now)."""
        return max(0.0, self.next_s - self.clock())

    def due(self) -> bool:
        return self.wait_s() <= 0


#: The run directory's files whose change means the scheduler's state of its job is about to change (or
#: did): a new job record, the finished / preempted markers, a local supervisor's end record; a sweep
#: directory's array records.
EVENT_FILES = (JOBS_NAME, FINISHED_NAME, PREEMPTED_NAME, ENDS_NAME, SWEEP_JOBS_NAME)


def run_events(run_dirs: Sequence[Path]) -> Tuple[Tuple[int, int], ...]:
    """What the event files (:data:`EVENT_FILES`) of ``run_dirs`` look like now: (size, mtime ns) of each,
    (-1, -1) where absent. Costs ``os.stat`` calls, no scheduler question."""
    out = []
    for d in run_dirs:
        for name in EVENT_FILES:
            try:
                s = os.stat(Path(d) / name)
                out.append((s.st_size, s.st_mtime_ns))
            except OSError:
                out.append((-1, -1))
    return tuple(out)


def status_key(st: RunStatus) -> Optional[Hashable]:
    """What of a run's status counts as a change for the backoff: its state, the job Slurm answered for
    (id, reason, nodes, restarts) and whether it finished; ``None`` when Slurm could not be asked
    (``UNKNOWN``)."""
    if st.state == "UNKNOWN":
        return None
    s = st.slurm
    job = (s.job_id, s.reason, s.nodes, s.restarts) if s is not None else None
    return (str(st.run.path), st.state, job, st.run.finished is not None, len(st.run.jobs))


def statuses_key(statuses: Sequence[RunStatus]) -> Optional[Hashable]:
    """:func:`status_key` of every status; ``None`` when none could be asked about."""
    keys = [status_key(st) for st in statuses]
    if statuses and all(k is None for k in keys):
        return None
    return tuple(keys)


def ask_runs(
    runs: Sequence[Run], run_cmd: Runner = subprocess.run, ended: Callable[[RunStatus], bool] = lambda st: st.final
) -> List[RunStatus]:
    """One tick's question about ``runs``: for one run ``ops.status.run_status`` (``scontrol show job``:
    one query, with the restart count, exit code and dependency); for several ``ops.status.runs_status``
    (one ``squeue --jobs=ID1,ID2,…`` per cluster, ``sacct`` only for ids that left the queue), and for
    the runs whose ``squeue`` answer says they ``ended`` this tick, one ``sacct`` (per cluster) for the
    exit codes ``squeue`` does not give; where accounting does not answer, their status has none.
    Statuses in the order of ``runs``."""
    if len(runs) == 1:
        return [run_status(runs[0], run_cmd)]
    out = runs_status(runs, run_cmd)
    need = [i for i, st in enumerate(out) if ended(st) and st.slurm is not None and st.slurm.source == "squeue"]
    by_cluster: Dict[str, List[int]] = {}
    for i in need:
        by_cluster.setdefault(query_cluster(identity_of(out[i].run)), []).append(i)
    for cluster, idx in by_cluster.items():
        rows, _why = sacct_jobs([out[i].run.latest_job_id or "" for i in idx], run_cmd, cluster)
        for i in idx:
            s, row = out[i].slurm, rows.get(out[i].run.latest_job_id or "")
            if s is not None and row is not None and row.exit_code:
                out[i].slurm = replace(s, exit_code=row.exit_code)
    return out


def watch(
    ask: Callable[[], T],
    key: Callable[[T], Optional[Hashable]],
    done: Callable[[T], bool],
    *,
    events: Optional[Callable[[], bool]] = None,
    timeout_s: Optional[float] = None,
    policy: PollPolicy = POLL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Tuple[T, bool]:
    """Ask (``ask()``: one batched scheduler question) on :class:`Poller`'s schedule until ``done(answer)``
    or ``timeout_s`` seconds passed; between questions ask ``events()`` (file side, every
    ``policy.file_check_s``: True when the directories show an event since the last question) and ask
    Slurm at once when it says so. Returns (the last answer, timed out); at the
    deadline it asks once more first. What ``ask``/``done`` raise propagates."""
    poller = Poller(policy, clock)
    deadline = None if timeout_s is None else clock() + timeout_s
    while True:
        answer = ask()
        poller.answered(key(answer))
        if done(answer):
            return answer, False
        if deadline is not None and clock() >= deadline:
            return answer, True
        while not poller.due():
            step = poller.wait_s()
            if events is not None:
                step = min(step, policy.file_check_s)
            if deadline is not None:
                step = min(step, max(0.0, deadline - clock()))
            sleep(step)
            if deadline is not None and clock() >= deadline:
                break
            if events is not None and events():
                poller.poke()


def wait_runs(
    run_dirs: Sequence[Path],
    ended: Callable[[RunStatus], bool],
    *,
    check: Callable[[RunStatus], None] = lambda st: None,
    timeout_s: Optional[float] = None,
    run_cmd: Runner = subprocess.run,
    policy: PollPolicy = POLL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Tuple[List[RunStatus], bool]:
    """Watch the runs ``run_dirs`` until each has ``ended`` (or ``timeout_s`` seconds passed): one
    :func:`ask_runs` question per tick for the runs not yet ended (several runs: one ``squeue --jobs=…``
    per cluster), on :data:`POLL`'s schedule (``policy``), the run directories' event files looked at in
    between (:func:`run_events`). ``check(status)`` sees every status (it may raise, e.g. for a dependency
    that can never be met). Returns (the statuses in the order of ``run_dirs``, timed out)."""
    dirs = [Path(d) for d in run_dirs]
    last: Dict[Path, RunStatus] = {}
    final: Dict[Path, RunStatus] = {}

    seen: List[Tuple[Tuple[int, int], ...]] = [()]

    def ask() -> List[RunStatus]:
        seen[0] = run_events(dirs)  # before the question: an event written during it is seen next time
        for st in ask_runs([read_run(d) for d in dirs if d not in final], run_cmd, ended):
            d = Path(st.run.path)
            check(st)
            last[d] = st
            if ended(st):
                final[d] = st
        return [last[d] for d in dirs if d in last]

    statuses, timed_out = watch(
        ask,
        statuses_key,
        lambda _sts: len(final) == len(set(dirs)),
        events=lambda: run_events(dirs) != seen[0],
        timeout_s=timeout_s,
        policy=policy,
        clock=clock,
        sleep=sleep,
    )
    return statuses, timed_out


def wait_sweep(
    sweep_dir: Path,
    ended: Callable[[RunStatus], bool],
    *,
    check: Callable[[Path, RunStatus], None] = lambda path, st: None,
    timeout_s: Optional[float] = None,
    run_cmd: Runner = subprocess.run,
    policy: PollPolicy = POLL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Tuple[SweepStatus, bool]:
    """Watch the sweep ``sweep_dir`` until every element has ``ended``: each tick is one
    ``ops.sweeps.sweep_status`` (one ``squeue --array`` for all its array jobs, ``sacct`` only for arrays
    the controller forgot), however many elements, on :data:`POLL`'s schedule (``policy``); in between,
    the sweep directory's array records and the ``FINISHED`` marker of each element still going are
    looked at (one ``stat`` each). ``check(element dir,
    status)`` sees every element's status (it may raise). Returns (the last status, timed out)."""

    seen: List[Tuple[Tuple[int, int], ...]] = [()]
    going: List[Path] = []  # the elements not ended, without a FINISHED marker, at the last question

    def ask() -> SweepStatus:
        seen[0] = run_events([sweep_dir])
        st = sweep_status(read_sweep(sweep_dir), run_cmd)
        going[:] = [e.run.path for e, s in st.elements if not ended(s) and e.run.finished is None]
        for e, s in st.elements:
            check(e.run.path, s)
        return st

    def events() -> bool:
        return run_events([sweep_dir]) != seen[0] or any((p / FINISHED_NAME).exists() for p in going)

    return watch(
        ask,
        lambda st: statuses_key([s for _, s in st.elements]),
        lambda st: all(ended(s) for _, s in st.elements),
        events=events,
        timeout_s=timeout_s,
        policy=policy,
        clock=clock,
        sleep=sleep,
    )
