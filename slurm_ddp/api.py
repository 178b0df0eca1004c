"""The Python API: submit a job, reattach to a run, wait for it and read its results.

The same functions as the ``slurm-ddp`` verbs (``backends.submit``, ``slurm_ddp.ops``), with errors
raised as the project's exceptions (``slurm_ddp.errors``: ``UserError`` for bad input,
``ClusterError`` when Slurm refuses or cannot be asked, ``WaitTimeout``,
``DependencyNeverSatisfied``) instead of exit codes; nothing here calls ``sys.exit``. Imports no
torch. Reached lazily from the package's top level (``slurm_ddp.submit``, ``slurm_ddp.Run``,
``slurm_ddp.Sweep``)::

    import slurm_ddp

    run = slurm_ddp.submit("examples/digits/job.yaml", overrides=["train.max_steps=100"], backend="local")
    status = run.wait(timeout_s=600)          # RunStatus; .state "COMPLETED"
    print(run.final().metrics["eval_accuracy"], run.final().weights)
    rows = run.metrics()                      # metrics.jsonl, one dict per line

Side effects: those of the verbs: writes run directories, runs ``sbatch``/``scontrol``/``squeue``/
``scancel``, starts a detached submit process that runs a local job in the background (``backend="local"``).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from .errors import DependencyNeverSatisfied, SlurmDDPError, SlurmDDPWarning, UserError, WaitTimeout
from .ops.poll import POLL, PollPolicy, wait_runs, wait_sweep
from .ops.runs import read_run, resolve_run
from .ops.slurm import NEVER_SATISFIED_REASON, REQUEUED_STATES
from .ops.status import LOCAL_WAIT_SOURCE, RunStatus, never_starts_note, run_status
from .ops.sweeps import SweepStatus, best_value, default_metric, read_sweep, sweep_status
from .rundir import (
    CONFIG_NAME,
    FINAL_MODEL_NAME,
    LAUNCHER_OUT_NAME,
    is_sweep_dir,
    read_finished,
    read_jobs,
    read_metrics,
    read_waiting,
)

#: seconds between two questions to Slurm in :meth:`Run.wait` after a change (``ops.poll.POLL``)
DEFAULT_POLL_S = POLL.first_s
#: the longest wait between two questions while nothing changes (``ops.poll.POLL``)
MAX_POLL_S = POLL.max_s

PathLike = Union[str, "os.PathLike[str]"]


def _ended(st: RunStatus) -> bool:
    """True when the run will not go on by itself: its state is final and not a requeue
    (``REQUEUED_STATES``: Slurm starts it again, with the same job id)."""
    return st.final and st.state not in REQUEUED_STATES


def _check_dependency(st: RunStatus) -> None:
    """Raise ``DependencyNeverSatisfied`` when the run's job will never start: pending on a dependency that
    can no longer be met, or cancelled for it (a local run's wait that gave up, Slurm under
    ``kill_invalid_depend``). The note names the dependency: ``scontrol`` is asked for it (once) where the
    batched ``squeue`` answer lacks it."""
    s = st.slurm
    if s is not None and s.never_starts:
        if not s.dependency and s.source == "squeue":
            detail = run_status(read_run(st.run.path))
            s = detail.slurm if detail.slurm is not None and detail.slurm.never_starts else s
        raise DependencyNeverSatisfied(never_starts_note(st.run.path, s))
    if s is not None and s.final and s.reason == NEVER_SATISFIED_REASON:
        raise DependencyNeverSatisfied("; ".join(st.notes) or f"{st.describe_state()}: {s.dependency}")


def _policy(poll_s: float, max_poll_s: float) -> PollPolicy:
    """``ops.poll.POLL`` with the caller's intervals; ``UserError`` for values it cannot take."""
    try:
        return replace(POLL, first_s=float(poll_s), max_s=float(max_poll_s))
    except ValueError as e:
        raise UserError(f"wait: {e}") from None


@dataclass(frozen=True)
class Final:
    """What a finished run left: rank 0's final record (``FINISHED``) and the weights."""

    metrics: Dict[str, Any]  #: the finished marker's record: ``step``, ``eval_accuracy``, ``eval_loss``, ...
    weights: Optional[
        Path
    ]  #: ``final_model.pt`` (``model.module.state_dict()`` of rank 0); None for ``train.command`` runs


class Run:
    """One run directory, reattached by path (or by a name under ``./runs``).

    Every method reads the directory (and asks Slurm) anew: a ``Run`` holds no state that can go
    stale, and several may exist for one directory. Raises ``UserError`` when ``run_dir`` is not a
    run directory.
    """

    def __init__(self, run_dir: PathLike, *, _detached: Optional[subprocess.Popen[bytes]] = None) -> None:
        # the detached submit process this process started for a local run (``submit``): it writes the
        # directory itself
        self._detached = _detached
        self.path: Path = Path(run_dir).resolve() if _detached is not None else resolve_run(os.fspath(run_dir))
        self._jobs_before = len(read_jobs(self.path)) if _detached is not None else 0

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r})"

    @property
    def name(self) -> str:
        """The job's ``name`` (from its config)."""
        return read_run(self.path).name

    @property
    def job_ids(self) -> List[str]:
        """Job ids of its submissions, oldest first (a requeue keeps its id; a local run's id is the pid of
        its local supervisor, the process that started and watches its ranks)."""
        return read_run(self.path).job_ids

    def status(self) -> RunStatus:
        """Its state now (``ops.run_status``: Slurm's word joined with the run directory's). A local
        run that waits for its ``after=`` runs is ``PENDING`` with ``.slurm.reason``
        ``Dependency`` and ``.slurm.dependency`` (as a Slurm job); so is a run of a detached submit process
        started by this process that has not started the ranks yet."""
        self._reap()
        run = read_run(self.path)
        st = run_status(run)
        if self._detached is not None and self._detached.poll() is None and not _has_live_job(run):
            if st.state == "PENDING":
                return st  # waiting, and it says for what
            return RunStatus(run, "PENDING", False, LOCAL_WAIT_SOURCE, notes=["waiting for the runs it comes after"])
        return st

    def wait(
        self, timeout_s: Optional[float] = None, poll_s: float = DEFAULT_POLL_S, max_poll_s: float = MAX_POLL_S
    ) -> RunStatus:
        """Block until the run ends (finished, failed, cancelled, stopped for preemption and not
        requeued) and return its last status; a requeue is followed (Slurm keeps the job id). ``timeout_s``:
        seconds to wait at most (None: no limit). Slurm is asked on ``ops.poll``'s schedule: ``poll_s``
        seconds after a change, doubled while nothing changes, up to ``max_poll_s`` (squeue(1)
        "PERFORMANCE"); the run directory is looked at every second in between, and a new job record or
        ``FINISHED`` marker makes the next question due at once. A detached submit process of this
        process is watched every ``poll_s`` (no scheduler).

        Raises ``WaitTimeout`` when the time runs out (the run goes on), ``DependencyNeverSatisfied``
        when its job will never start (Slurm: PENDING with Reason=DependencyNeverSatisfied, e.g.
        ``after=`` a run that failed, with ``afterok``; the local backend: its wait found the same),
        ``SlurmDDPError`` when a detached submit process of this process failed otherwise
        before it started the ranks, and ``UserError`` for ``max_poll_s < poll_s`` or a value <= 0."""
        policy = _policy(poll_s, max_poll_s)
        if self._detached is None:
            (st,), timed_out = wait_runs(
                [self.path], _ended, check=_check_dependency, timeout_s=timeout_s, policy=policy
            )
            if timed_out:
                raise WaitTimeout(f"run {str(self.path)!r} did not end within {timeout_s:g} s (it is {st.state})")
            return st
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self._detached.poll() is not None:
                self._check_detached()
                return run_status(read_run(self.path))
            st = self.status()
            _check_dependency(st)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"run {str(self.path)!r} did not end within {timeout_s:g} s (it is {st.state})")
            try:
                self._detached.wait(timeout=poll_s if deadline is None else min(poll_s, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def metrics(self) -> List[Dict[str, Any]]:
        """The rows of ``metrics.jsonl`` (rank 0's events: ``train``, ``eval``, ``checkpoint``,
        ``preempted``, ``resume``, ``finished``), one dict each, in order."""
        return read_metrics(self.path)

    def final(self) -> Final:
        """The final eval metrics and the weights' path. Raises ``UserError`` when the run has not
        finished (no ``FINISHED`` marker)."""
        rec = read_finished(self.path)
        if rec is None:
            raise UserError(f"run {str(self.path)!r} has not finished (no FINISHED marker); wait() for it first")
        weights = self.path / FINAL_MODEL_NAME
        return Final(metrics=dict(rec), weights=weights if weights.exists() else None)

    def logs(self, rank: Optional[int] = None) -> str:
        """Its logs as text: rank ``rank``'s, or every rank's interleaved with a ``[rank N]`` prefix
        (``slurm-ddp logs``). Raises ``UserError`` for a rank the run does not have."""
        from .ops.targets import show_target_logs

        buf = io.StringIO()
        show_target_logs(str(self.path), rank, buf.write)
        return buf.getvalue()

    def cancel(self) -> str:
        """Stop it: ``scancel`` its Slurm job, or SIGTERM to its local supervisor. Returns what was done, with
        what SIGTERM does to this run's ranks (``rundir.at_stop``: a checkpoint at the step boundary only
        where a handler exists). Raises ``UserError`` when it already ended."""
        from .ops.targets import cancel_target

        self._reap()
        return cancel_target(self.path)

    def requeue(self) -> str:
        """``scontrol requeue`` its Slurm job: Slurm stops it (SIGTERM) and starts it again; the returned
        sentence says what that does to this run and what the next start trains from (``rundir.at_stop``).
        Raises ``UserError`` (local run, pending or finished run) or ``ClusterError``."""
        from .ops.targets import requeue_target

        return requeue_target(self.path)

    def _reap(self) -> None:
        if self._detached is not None:
            self._detached.poll()

    def _check_detached(self) -> None:
        """Raise when the detached submit process ended with an error before it started the ranks (a
        dependency never satisfied, a run directory taken in between); once the ranks ran, the run's
        own status says how they ended."""
        assert self._detached is not None
        rc = self._detached.returncode
        if rc in (0, None) or len(read_jobs(self.path)) > self._jobs_before:
            return
        waited = read_waiting(self.path)
        if waited is not None and waited.cancelled_time:  # cancel() ended its wait: the status says CANCELLED
            return
        tail = _tail(self.path / LAUNCHER_OUT_NAME)
        if rc == DependencyNeverSatisfied.exit_code:
            raise DependencyNeverSatisfied(tail.split(": error: ", 1)[-1])
        raise SlurmDDPError(f"the detached submit process of {str(self.path)!r} exited with status {rc}: {tail}")


def _has_live_job(run: Any) -> bool:
    """A job recorded after the detached submit process of this session started (the last record is local
    and its supervisor is alive)."""
    from .ops.status import local_supervisor_alive

    return bool(run.jobs) and run.is_local and local_supervisor_alive(run.jobs[-1], run.path)


def _tail(path: Path) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    return lines[-1] if lines else "no output"


class Sweep:
    """A sweep directory: its elements as :class:`Run` objects and a table of values → metrics.
    Raises ``UserError`` when ``sweep_dir`` is not a sweep directory."""

    def __init__(self, sweep_dir: PathLike, *, _detached: Optional[subprocess.Popen[bytes]] = None) -> None:
        p = Path(sweep_dir)
        if _detached is None and not is_sweep_dir(p):
            raise UserError(f"{str(p)!r} is not a sweep directory (no sweep.json); give the --run-dir of a sweep")
        self.path: Path = p.resolve()
        self._detached = _detached

    def __repr__(self) -> str:
        return f"Sweep({str(self.path)!r})"

    @property
    def runs(self) -> List[Run]:
        """One :class:`Run` per element, by index (an element not yet written is left out)."""
        return [Run(e.run.path) for e in read_sweep(self.path).elements if (e.run.path / CONFIG_NAME).exists()]

    def element(self, index: int) -> Run:
        """The :class:`Run` of element ``index`` (the ``index`` of :meth:`table`'s rows). Raises
        ``UserError`` for an index the sweep does not have."""
        elements = read_sweep(self.path).elements
        for e in elements:
            if e.index == index:
                return Run(e.run.path)
        raise UserError(f"sweep {str(self.path)!r} has no element {index}; it has 0..{len(elements) - 1}")

    def status(self) -> SweepStatus:
        """Every element's state, from one Slurm question (``ops.sweeps.sweep_status``)."""
        return sweep_status(read_sweep(self.path))

    def wait(
        self, timeout_s: Optional[float] = None, poll_s: float = DEFAULT_POLL_S, max_poll_s: float = MAX_POLL_S
    ) -> SweepStatus:
        """Block until no element is pending or running (``Run.wait``'s rules) and return the sweep's
        last status. Each question is one ``squeue --array`` for all the sweep's array jobs (``sacct``
        only for arrays the controller forgot), however many elements, on ``Run.wait``'s schedule
        (``poll_s`` after a change, doubling up to ``max_poll_s``; ``ops.poll``). Raises ``WaitTimeout``,
        ``DependencyNeverSatisfied`` when an element's job will never start (its ``after=``), ``UserError``
        for intervals ``ops.poll.PollPolicy`` cannot take."""
        policy = _policy(poll_s, max_poll_s)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._detached is not None and self._detached.poll() is None:
            try:  # the detached submit process runs the elements: its end is the sweep's
                self._detached.wait(
                    timeout=poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
                )
            except subprocess.TimeoutExpired:
                pass
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(f"sweep {str(self.path)!r} did not end within {timeout_s:g} s")

        def check(path: Path, s: RunStatus) -> None:
            if s.slurm is not None and s.slurm.never_starts:
                raise DependencyNeverSatisfied(never_starts_note(path, s.slurm))

        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        st, timed_out = wait_sweep(self.path, _ended, check=check, timeout_s=left, policy=policy)
        if timed_out:
            raise WaitTimeout(f"sweep {str(self.path)!r} did not end within {timeout_s:g} s")
        return st

    def table(self, metric: Optional[str] = None) -> List[Dict[str, Any]]:
        """One row per element: ``index``, the swept values (by key), ``state``, and ``metric``'s
        best value (default: ``eval_accuracy`` when reported, else the first eval metric); best first
        is the caller's sort (``lower_is_better`` for losses)."""
        st = self.status()
        m = metric or default_metric(st.sweep)
        rows = []
        for e, s in st.elements:
            row: Dict[str, Any] = {"index": e.index, **e.values, "state": s.state}
            if m:
                row[m] = best_value(e.run, m)
            rows.append(row)
        return rows


def wait_all(
    runs: Sequence[Union[Run, PathLike]],
    timeout_s: Optional[float] = None,
    poll_s: float = DEFAULT_POLL_S,
    max_poll_s: float = MAX_POLL_S,
) -> List[RunStatus]:
    """Block until every run of ``runs`` (``Run`` objects or run directories) ended, as :meth:`Run.wait`
    for each, and return their last statuses in the same order. Slurm is asked ONE question per interval
    for all of them (``squeue --jobs=ID1,ID2,…``, one per cluster; ``sacct`` only for ids that left the
    queue; ``ops.poll.wait_runs``) instead of one per run, on ``Run.wait``'s schedule; a run that ended is
    asked about once more in detail (``scontrol``) and then no more. Runs of a detached submit process
    this process started are waited for first (no scheduler). Raises as :meth:`Run.wait` does
    (``WaitTimeout`` names the runs still going)."""
    policy = _policy(poll_s, max_poll_s)
    objs = [r if isinstance(r, Run) else Run(r) for r in runs]
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    done: Dict[Path, RunStatus] = {}
    for r in objs:
        if r._detached is not None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done[r.path] = r.wait(timeout_s=left, poll_s=poll_s, max_poll_s=max_poll_s)
    rest = [r.path for r in objs if r.path not in done]
    left = None if deadline is None else max(0.0, deadline - time.monotonic())
    statuses, timed_out = wait_runs(rest, _ended, check=_check_dependency, timeout_s=left, policy=policy)
    if timed_out:
        going = [st for st in statuses if not _ended(st)]
        names = ", ".join(f"{str(st.run.path)!r} ({st.state})" for st in going[:8])
        more = f" and {len(going) - 8} more" if len(going) > 8 else ""
        raise WaitTimeout(f"{len(going)} of {len(objs)} runs did not end within {timeout_s:g} s: {names}{more}")
    done.update((Path(st.run.path), st) for st in statuses)
    return [done[r.path] for r in objs]


def submit(
    job: Union[PathLike, Mapping[str, Any]],
    *,
    overrides: Sequence[str] = (),
    run_dir: Optional[PathLike] = None,
    backend: str = "auto",
    sweep: Sequence[str] = (),
    after: Union[str, Run, Sequence[Union[str, Run]]] = (),
    check_task: bool = True,
    accept_new_code: bool = False,
    say: Optional[Callable[[str], None]] = None,
) -> Union[Run, Sweep]:
    """Submit a job, as ``slurm-ddp submit`` does, and return its :class:`Run` (a sweep: its :class:`Sweep`).

    ``job``: a YAML path, or the mapping such a file holds (relative paths from the current
    directory). ``overrides``: ``SECTION.KEY=VALUE`` strings (``--set``); here and in ``sweep`` and
    ``after`` a single string (``after``: or a single ``Run``) is one item, as one flag is, not a list of its
    characters. ``run_dir``: default ``./runs/<name>``. ``backend``: ``auto`` (sbatch when on PATH; else local, unless the job asks for a cluster:
    ``UserError``), ``sbatch``,
    ``submitit`` or ``local`` — a local run starts in the background, in a detached submit process (its
    output in the run directory's ``launcher.out``), and this returns at once. ``sweep``: ``KEY=V1,V2`` strings
    (``--sweep``). ``after``: runs (``Run``, a run directory) or job ids, each optionally
    ``:afterok`` (default), ``:afterany`` or ``:afternotok`` (``--after``, sbatch's ``--dependency``).
    ``check_task``: import ``train.task`` in a child process first. ``say``: where the submit's
    status lines go (default: nowhere). Its warnings (a setting that does nothing, a GPU rank with
    a single CPU, ...) are issued through Python's ``warnings`` as :class:`~slurm_ddp.errors.SlurmDDPWarning`,
    attributed to the line that called ``submit``: shown by default, filtered like any warning.

    Raises ``UserError`` (config, run directory, arguments, dependencies), ``ClusterError``
    (Slurm refused the job); never ``SystemExit``.
    """
    from .backends.submit import Reporter, SubmitRequest
    from .backends.submit import submit as submit_job

    lines: Callable[[str], None] = say or (lambda _line: None)
    caller = sys._getframe(1)  # the user's line: where the warnings point, as warnings.warn(stacklevel=2) would

    def out(text: str) -> None:
        for line in text.splitlines():
            if line.strip():
                lines(line)

    def warn(line: str) -> None:
        g = caller.f_globals
        warnings.warn_explicit(
            line,
            SlurmDDPWarning,
            caller.f_code.co_filename,
            caller.f_lineno,
            module=g.get("__name__", "__main__"),
            registry=g.setdefault("__warningregistry__", {}),
            module_globals=g,
        )

    report = Reporter(out=out, warn=warn, say=lines)
    depends = [after] if isinstance(after, (str, Run)) else after  # one spec or Run, as one --after
    request = SubmitRequest(
        job,
        overrides=overrides,
        sweep=sweep,
        backend=backend,
        run_dir=os.fspath(run_dir) if run_dir is not None else None,
        command=None,
        check_task=check_task,
        accept_new_code=accept_new_code,
        after=[f"{a.path}" if isinstance(a, Run) else str(a) for a in depends],
        detach=True,  # a local run goes on in the background; the returned Run follows it
    )
    done = submit_job(request, report=report)
    if done.sweep:
        return Sweep(done.run_dir, _detached=done.detached)
    return Run(done.run_dir, _detached=done.detached)
