"""Whether the job Slurm now has under a run's recorded job id is the run's own job: the one owner of
that question (:func:`check`, :func:`own_job`), asked by every verb that acts on or reports a job
(``cancel``, ``requeue``, ``status``, ``runs``, ``logs -f``, the Python API, the sweep verbs).

A job id alone does not name a job: on a second cluster that shares ``$HOME``, or after the
controller's job ids restarted (a new ``StateSaveLocation``, ``FirstJobId``), the id the run recorded
names another job, often of the same user. ``submit`` records what identifies the job
(``rundir.JobIdentity``: cluster, user, job name, the directory of its batch script / output /
working directory) and this module compares it with Slurm's answer (``ops.slurm.SlurmJob``), field by
field where both sides know it:

- the cluster: the job of a run submitted to cluster A is asked about on A (``--clusters=A``,
  :func:`query_cluster`) where this machine's cluster (``ops.slurm.local_cluster``) is another;
- the user (``UserId``; a bare uid, where the controller cannot name it, is not compared), the job
  name (``JobName``);
- the directory: Slurm's ``Command`` (the batch script), ``StdOut`` or ``WorkDir`` lies in the run's
  directory (the sweep directory for an array element), compared as written and with symlinks resolved.

A record written before these fields existed holds the id alone: then only the directory is checked,
against the run directory itself (its sweep directory for an element) — a job Slurm reports with no
path at all stays ``unchecked`` (:attr:`Verdict.ours` None) and is treated as the run's, as before.

Side effects: none but ``os.path.realpath`` (reads symlinks). Imports no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Dict, Iterable, List, Optional, Tuple

from ..rundir import JobIdentity, job_identity
from .runs import Run
from .slurm import SlurmAnswer, SlurmJob, local_cluster


@dataclass(frozen=True)
class Verdict:
    """:func:`check`'s answer. ``ours``: True (every field Slurm reported matches), False (one does not:
    ``why`` says which, in words), None (nothing to compare: Slurm reported no identifying field)."""

    ours: Optional[bool]
    why: str = ""


def identity_of(run: Run) -> JobIdentity:
    """The identity of the run's latest job: its record's fields (``rundir.job_identity``), and for a
    record that predates them the directory Slurm's paths must lie in: the run directory, or the sweep
    directory for an array element (``ARRAYJOBID_TASKID``)."""
    ident = job_identity(run.jobs[-1]) if run.jobs else JobIdentity(job_id="")
    if ident.job_dir:
        return ident
    element = "_" in ident.job_id or "array_job_id" in (run.jobs[-1] if run.jobs else {})
    return JobIdentity(
        job_id=ident.job_id,
        cluster=ident.cluster,
        user=ident.user,
        job_name=ident.job_name,
        job_dir=str(run.path.parent if element else run.path),
        time=ident.time,
    )


def job_identities(run: Run) -> Dict[str, JobIdentity]:
    """Job id -> the identity of every Slurm job of the run (its newest record of that id), a record that
    predates the fields completed as :func:`identity_of` does (the run or sweep directory)."""
    out: Dict[str, JobIdentity] = {}
    for record in run.jobs:
        ident = job_identity(record)
        if not ident.job_id:
            continue
        if not ident.job_dir:
            element = "_" in ident.job_id or "array_job_id" in record
            ident = replace(ident, job_dir=str(run.path.parent if element else run.path))
        out[ident.job_id] = ident
    return out


def _forms(path: str) -> List[str]:
    out = [os.path.normpath(path)]
    try:
        real = os.path.realpath(path)
    except OSError:
        real = out[0]
    if real not in out:
        out.append(real)
    return out


def _inside(path: str, directory: str) -> bool:
    """True when ``path`` is ``directory`` or lies under it (either written as is or with symlinks resolved)."""
    for p in _forms(path):
        for d in _forms(directory):
            if p == d or p.startswith(d.rstrip("/") + "/"):
                return True
    return False


def check(ident: JobIdentity, job: SlurmJob) -> Verdict:
    """Is ``job`` (Slurm's answer under ``ident.job_id``) the job ``ident`` describes? See the module
    docstring for the fields compared; a field is compared only where both sides know it."""
    compared = False
    if ident.cluster and job.cluster:
        compared = True
        if ident.cluster.lower() != job.cluster.lower():
            return Verdict(False, f"it is a job of cluster {job.cluster!r}")
    if ident.user and job.user and not job.user.isdigit():  # a bare uid: the controller has no name for it
        compared = True
        if ident.user != job.user:
            return Verdict(False, f"it is {job.name or 'a job'!r} of user {job.user!r}" + _where(job))
    if ident.job_name and job.name:
        compared = True
        if ident.job_name != job.name:
            return Verdict(False, f"it is {job.name!r}" + _where(job))
    if ident.job_dir and job.paths:
        compared = True
        if not any(_inside(p, ident.job_dir) for p in job.paths):
            return Verdict(False, f"it is {job.name or 'a job'!r}" + _where(job))
    return Verdict(True if compared else None)


def _where(job: SlurmJob) -> str:
    d = job.work_dir or (os.path.dirname(job.command) if job.command else "") or job.stdout
    return f", run dir {d}" if d else ""


def own_job(ident: JobIdentity, ans: SlurmAnswer) -> Tuple[Optional[SlurmJob], Optional[SlurmJob], Verdict]:
    """(the run's job, another job holding its id, the verdict) from ``ans``: where accounting holds
    several rows of the id (``SlurmAnswer.history``) the newest that matches is the run's; a job that
    does not match is returned second, never first."""
    job = ans.jobs.get(ident.job_id)
    if job is None:
        return None, None, Verdict(None)
    verdict = check(ident, job)
    if verdict.ours is not False:
        return job, None, verdict
    for row in reversed(ans.history.get(ident.job_id, [])):
        v = check(ident, row)
        if v.ours is not False:
            return row, None, v
    return None, job, verdict


def query_cluster(ident: JobIdentity, here: Optional[str] = None) -> str:
    """The ``--clusters`` value to ask about the job ``ident`` with: its recorded cluster where that is
    not this machine's (``here``, default ``ops.slurm.local_cluster()``); "" (the local cluster) otherwise
    or where either is unknown."""
    if not ident.cluster:
        return ""
    here = local_cluster() if here is None else here
    return ident.cluster if here and ident.cluster.lower() != here.lower() else ""


def cluster_words(ident: JobIdentity, ans: SlurmAnswer) -> str:
    """``on cluster 'alpha'`` for the refusal lines: the cluster asked, else the recorded one, else none."""
    c = ans.cluster or ident.cluster
    return f" on cluster {c!r}" if c else ""


def not_the_run(ident: JobIdentity, other: SlurmJob, verdict: Verdict, run_name: str, ans: SlurmAnswer) -> str:
    """The one line that says the job under the run's id is another: ``job 59 on cluster 'alpha' is not
    run 'digits' (it is 'other-job', run dir /x)``."""
    return f"job {other.job_id}{cluster_words(ident, ans)} is not run {run_name!r} ({verdict.why})"


def gone_words(other: SlurmJob) -> str:
    """Where the run's own job is, given that ``other`` holds its id: gone from the queue (the controller
    has one job per id) or, where accounting answered, not in the cluster's accounting under that id."""
    if other.source == "sacct":
        return "the run's job is not in this cluster's accounting under that id"
    return "the run's job is gone from this cluster's queue"


def refusal(ident: JobIdentity, other: SlurmJob, verdict: Verdict, run_name: str, ans: SlurmAnswer, done: str) -> str:
    """The one line a verb refuses with: ``job 59 on cluster 'alpha' is not run 'digits' (it is 'x', run dir
    /y): not cancelled; the run's job is gone from this cluster's queue`` (``done``: ``not cancelled``)."""
    return f"{not_the_run(ident, other, verdict, run_name, ans)}: {done}; {gone_words(other)}"


def group_by_cluster(idents: Iterable[JobIdentity], here: Optional[str] = None) -> Dict[str, List[str]]:
    """The job ids of ``idents`` by the ``--clusters`` value to ask with (:func:`query_cluster`): one
    query per cluster, however many runs."""
    out: Dict[str, List[str]] = {}
    for i in idents:
        if i.job_id:
            ids = out.setdefault(query_cluster(i, here), [])
            if i.job_id not in ids:
                ids.append(i.job_id)
    return out


__all__ = [
    "Verdict",
    "check",
    "cluster_words",
    "gone_words",
    "group_by_cluster",
    "identity_of",
    "job_identities",
    "not_the_run",
    "own_job",
    "query_cluster",
    "refusal",
]
