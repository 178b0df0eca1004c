"""Chains: ``submit --after RUN_DIR|JOBID[:afterok|afterany|afternotok]`` (the API's ``after=``).

On Slurm a chain is sbatch's ``--dependency`` (sbatch(1): ``afterok:job_id[:jobid...]`` starts once
those jobs ended with exit code 0, ``afternotok`` once they failed, ``afterany`` once they ended):
:func:`resolve_after` turns each target into a job id (a run directory: its latest job, which a
requeue keeps, so the dependency survives requeues) and drops what is already satisfied (a run
that finished, for ``afterok``/``afterany``: the controller may have forgotten its job, and sbatch
refuses a dependency on a job it does not know). The local backend has no scheduler: its local supervisor
waits for the named runs itself (:func:`wait_for_runs`) before it starts the ranks.

A run's recorded id is checked to name the run's own job first (``ops.ownjob``, one query per run
target, one per sweep): an id that names another job now (a second cluster, restarted ids) is refused.

Side effects: reads run directories; asks Slurm about each target run's job (``ops.run_status``,
``ops.sweeps.sweep_status``); :func:`wait_for_runs` asks it until the runs end, and records its wait in the waiting run's directory (``rundir.WAITING_NAME``). Imports no torch.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

from ..errors import DependencyNeverSatisfied, UserError
from ..ops.poll import POLL, wait_runs
from ..ops.runs import Run, read_run, resolve_run
from ..ops.status import RunStatus, run_status
from ..ops.sweeps import read_sweep, sweep_status
from ..rundir import LocalWait, is_sweep_dir, record_waiting

#: sbatch's dependency types that ``--after`` takes (sbatch(1), ``--dependency``); the first is the default
KINDS = ("afterok", "afterany", "afternotok")
_JOB_ID = re.compile(r"^\d+(_\d+)?$")


@dataclass(frozen=True)
class After:
    """One ``--after`` target: a Slurm job id, or a run directory (``path``), and the condition."""

    kind: str  #: ``afterok``, ``afterany`` or ``afternotok``
    job_id: str = ""  #: a job id given as such
    path: Optional[Path] = None  #: a run directory (resolved)

    def describe(self) -> str:
        return f"{self.kind} of {self.path if self.path is not None else 'job ' + self.job_id}"


@dataclass(frozen=True)
class Dependencies:
    """What :func:`resolve_after` made of the ``--after`` targets."""

    slurm: str = ""  #: sbatch's ``--dependency`` value, e.g. ``afterok:12:13,afterany:14``; "" for none
    local: Tuple[After, ...] = ()  #: runs the local supervisor waits for
    notes: Tuple[str, ...] = field(default_factory=tuple)  #: targets dropped as already satisfied


def parse_after(text: str) -> After:
    """``RUN_DIR``, ``JOBID`` (``123`` or an array task ``123_4``), either with ``:afterok`` (the
    default), ``:afterany`` or ``:afternotok``. A bare name is a run under ``./runs``.

    Raises ``UserError`` for an unknown condition or a target that is neither a job id nor a run
    directory."""
    target, kind = text, KINDS[0]
    head, sep, tail = text.rpartition(":")
    if sep and re.fullmatch(r"[A-Za-z]+", tail):
        if tail not in KINDS:
            raise UserError(f"--after {text!r}: unknown condition {tail!r}; expected one of {', '.join(KINDS)}")
        target, kind = head, tail
    if not target:
        raise UserError(f"--after {text!r}: give a run directory or a job id, e.g. --after runs/train:afterok")
    if _JOB_ID.match(target):
        return After(kind=kind, job_id=target)
    p = Path(target)
    if is_sweep_dir(p):
        return After(kind=kind, path=p.resolve())
    try:
        return After(kind=kind, path=resolve_run(target))
    except UserError as e:
        raise UserError(f"--after {text!r}: {e}") from None


def resolve_after(afters: Sequence[str], backend: str) -> Dependencies:
    """The dependencies of ``--after`` specs for ``backend``. Raises ``UserError`` when one cannot
    hold: a job id on the local backend, a local run as a Slurm job's dependency, a run that was never
    submitted, ``afternotok`` of a run that finished (never satisfied), or the submitit backend."""
    if not afters:
        return Dependencies()
    parsed = [parse_after(a) for a in afters]
    if backend == "submitit":
        raise UserError("--after: chains need --backend sbatch (or local); the submitit backend does not take them")
    if backend == "local":
        for a in parsed:
            if a.path is None:
                raise UserError(
                    f"--after {a.job_id}: the local backend waits for run directories, not Slurm job ids; "
                    "name the run directory of that job"
                )
        return Dependencies(local=tuple(parsed))
    groups: dict[str, List[str]] = {}
    notes: List[str] = []
    for a in parsed:
        for jid, finished, where in _job_ids(a):
            if finished:
                if a.kind == "afternotok":
                    raise UserError(f"--after {where}:afternotok: that run finished, so the job would never start")
                notes.append(f"--after {where}: finished already; no dependency needed")
                continue
            groups.setdefault(a.kind, []).append(jid)
    slurm = ",".join(f"{k}:{':'.join(ids)}" for k, ids in groups.items())
    return Dependencies(slurm=slurm, notes=tuple(notes))


def _job_ids(a: After) -> List[Tuple[str, bool, str]]:
    """(job id, the run finished already, how to name it) of one target: a run's latest job; a
    sweep's array jobs (the latest of each element, grouped by array)."""
    if a.path is None:
        return [(a.job_id, False, a.job_id)]
    if is_sweep_dir(a.path):
        out: List[Tuple[str, bool, str]] = []
        # one query for the whole sweep: an element's id that names another job now is no dependency
        for _, st in sweep_status(read_sweep(a.path)).elements:
            r = st.run
            if not r.jobs:
                continue
            out.append(_run_job(r, str(r.path), st))
        if not out:
            raise UserError(f"--after {a.path}: no element of that sweep was submitted")
        return out
    run = read_run(a.path)
    return [_run_job(run, str(a.path), run_status(run) if run.jobs and not run.is_local else None)]


def _run_job(run: Run, where: str, st: Optional[RunStatus] = None) -> Tuple[str, bool, str]:
    """``st``: the run's state, whose ``other_job`` says that its recorded id names another job now
    (``ops.ownjob``): a dependency on that id would wait for the other job, so it is refused."""
    if not run.jobs or not run.latest_job_id:
        raise UserError(f"--after {where}: that run was never submitted (no job in its jobs.jsonl)")
    if run.is_local:
        raise UserError(
            f"--after {where}: that run ran on the local backend; a Slurm job cannot wait for it "
            "(submit this one with --backend local, or run that one under Slurm)"
        )
    if st is not None and st.other_job is not None and run.finished is None:
        raise UserError(
            f"--after {where}: {st.notes[0]}; a dependency on that id would wait for the other job. "
            f"Submit that run again first, or give a job id"
        )
    return run.latest_job_id, run.finished is not None, where


def wait_for_runs(
    afters: Sequence[After],
    say: Callable[[str], None],
    poll_s: float = 2.0,
    run_cmd: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
    run_dir: Optional[str] = None,
) -> None:
    """The local supervisor's dependency: wait until every run in ``afters`` has ended (its state is
    final; watched on ``ops.poll``'s schedule, ``poll_s`` after a change), then check its condition. ``run_dir``: the waiting run's directory, where the wait is
    recorded (``rundir.WAITING_NAME``: ``status`` shows PENDING, Reason=Dependency) and, if it
    fails, why. Raises ``DependencyNeverSatisfied`` when a condition is not met."""
    wait = LocalWait(pid=os.getpid(), time=time.time(), dependency=",".join(f"{a.kind}:{a.path}" for a in afters))
    if run_dir is not None:
        record_waiting(run_dir, wait)
    policy = replace(POLL, first_s=min(poll_s, POLL.max_s))  # the one polling policy, from poll_s
    for a in afters:
        assert a.path is not None
        st = run_status(read_run(a.path), run_cmd)
        if not st.final:
            say(f"waiting for {a.path} to end ({a.kind}; it is {st.state})")
            (st,), _ = wait_runs([Path(a.path)], lambda s: s.final, run_cmd=run_cmd, policy=policy)
        ok = st.run.finished is not None
        if (a.kind == "afterok" and not ok) or (a.kind == "afternotok" and ok):
            why = (
                f"--after {a.describe()}: that run ended {st.state}"
                + (" and finished" if ok else " without finishing")
                + "; this job does not start (DependencyNeverSatisfied)"
            )
            if run_dir is not None:
                record_waiting(run_dir, replace(wait, never_satisfied=why))
            raise DependencyNeverSatisfied(why)
