"""Acting on a run's latest Slurm job from the login node: :func:`cancel` (``scancel``) and
:func:`requeue` (``scontrol requeue``).

Side effects: asks Slurm about the job first (:mod:`.slurm`, on the cluster it was submitted to) and
refuses, in one line, a job under the run's id that is not the run's (:mod:`.ownjob`: a second cluster
sharing ``$HOME``, restarted job ids); then runs ``scancel`` or ``scontrol requeue`` through the
injectable ``run_cmd``; returns a sentence saying what was
done and raises a one-line error otherwise (printing is the CLI's). Imports no torch.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import replace
from typing import List, Optional, Tuple

from ..errors import ClusterError, UserError
from ..rundir import CONFIG_NAME, FINISHED_NAME, JOBS_NAME, record_waiting
from .ownjob import identity_of, own_job, query_cluster, refusal
from .runs import Run
from .slurm import REQUEUED_STATES, Runner, SlurmAnswer, SlurmJob, call, clusters_args, last_line, query_jobs
from .status import local_supervisor_alive, waiting_status


def _slurm_job_of(run: Run, verb: str) -> str:
    if not run.jobs or not run.latest_job_id:
        raise UserError(
            f"run {str(run.path)!r} has no job id recorded in {JOBS_NAME}: nothing to {verb} (was it submitted?)"
        )
    if run.is_local:
        raise UserError(
            f"run {str(run.path)!r} ran on the local backend: there is no Slurm job to {verb} "
            f"(its local supervisor is process {run.latest_job_id} on the machine that submitted it)"
        )
    return run.latest_job_id


def _own_job(run: Run, jid: str, run_cmd: Runner, done: str) -> Tuple[Optional[SlurmJob], SlurmAnswer]:
    """Slurm's word on the run's job ``jid`` (asked on the cluster it was submitted to), checked to be the
    run's own (``ops.ownjob``); raises ``UserError`` with the one-line refusal (``done``: ``not cancelled``)
    when the id names another job now."""
    ident = identity_of(run)
    ans = query_jobs([jid], run_cmd, detail=True, cluster=query_cluster(ident))
    job, other, verdict = own_job(ident, ans)
    if other is not None:
        raise UserError(refusal(ident, other, verdict, run.name, ans, done))
    return job, ans


def _act(argv: List[str], run_cmd: Runner) -> None:
    proc, why = call(run_cmd, argv)
    if proc is None:
        raise ClusterError(f"{' '.join(argv)}: {why}; run this on a login node of the cluster")
    if proc.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed (exit {proc.returncode}): {last_line(proc)}")


def cancel(run: Run, run_cmd: Runner = subprocess.run) -> str:
    """``scancel`` the run's latest job; returns what was done. The ranks get SIGTERM and the batch
    script does not requeue; what SIGTERM does to the ranks and what a later start trains from is
    the run's own (``Run.at_stop``: the worker and a script with a slurm_ddp handler checkpoint at the
    next step boundary, a plain script is killed).

    A local run's supervisor (its job id is the local supervisor's pid) gets SIGTERM, which it passes to the
    ranks as srun would; a local supervisor still waiting on ``--after`` (``rundir.WAITING_NAME``) gets
    SIGTERM too and the run is recorded CANCELLED, as ``scancel`` of a pending job is. Raises ``UserError`` (no job id, job or local supervisor already ended) or
    ``ClusterError``.
    """
    waiting = waiting_status(run)
    if waiting is not None and waiting.state == "PENDING":
        return _cancel_waiting(run)
    if run.is_local and run.jobs:
        return _cancel_local(run)
    jid = _slurm_job_of(run, "cancel")
    job, ans = _own_job(run, jid, run_cmd, "not cancelled")
    if job is not None and job.final:
        raise UserError(f"job {jid} of run {run.name!r} already ended ({job.state}); nothing to cancel")
    if job is None and ans.controller_answered:
        raise UserError(f"Slurm no longer knows job {jid} of run {run.name!r}: it ended; nothing to cancel")
    _act(["scancel", *clusters_args(ans.cluster), jid], run_cmd)
    if job is not None and job.state == "PENDING":
        return (
            f"cancelled job {jid} of run {run.name!r} while it was pending: no rank of it started; "
            f"{run.next_start().words}. Continue later with: slurm-ddp requeue {run.path}"
        )
    return (
        f"cancelled job {jid} of run {run.name!r}: {run.at_stop().sentence()}. "
        f"Continue later with: slurm-ddp requeue {run.path}"
    )


def _cancel_waiting(run: Run) -> str:
    w = run.waiting
    assert w is not None
    try:
        os.kill(w.pid, signal.SIGTERM)  # it waits with the default action: it ends there, no rank started
    except ProcessLookupError:
        raise UserError(
            f"the local supervisor of run {run.name!r} (process {w.pid}) already ended; nothing to cancel"
        ) from None
    record_waiting(run.path, replace(w, cancelled_time=time.time()))
    return (
        f"cancelled run {run.name!r} while its local supervisor (process {w.pid}) waited for {w.dependency}; "
        f"it never started. Submit it again to run it"
    )


def _cancel_local(run: Run) -> str:
    pid = run.latest_job_id or ""
    if not pid.isdigit() or not local_supervisor_alive(run.jobs[-1], run.path):
        raise UserError(f"the local supervisor of run {run.name!r} (process {pid}) already ended; nothing to cancel")
    try:
        os.kill(int(pid), signal.SIGTERM)
    except ProcessLookupError:
        raise UserError(
            f"the local supervisor of run {run.name!r} (process {pid}) already ended; nothing to cancel"
        ) from None
    return (
        f"sent SIGTERM to the local supervisor of run {run.name!r} (process {pid}), which passes it to the ranks: "
        f"{run.at_stop().sentence()}. Continue later with: slurm-ddp submit {run.path / CONFIG_NAME} "
        f"--backend local --run-dir {run.path}"
    )


def requeue(run: Run, run_cmd: Runner = subprocess.run) -> str:
    """``scontrol requeue`` the run's latest job: Slurm stops it (SIGTERM) and starts it again; the
    returned sentence says what SIGTERM does to the ranks and what the next start trains from
    (``Run.at_stop``). A job that ended but that the controller still remembers is started again too.

    Raises ``UserError`` (local run, no job id, pending job, finished run, forgotten job) or
    ``ClusterError``.
    """
    jid = _slurm_job_of(run, "requeue")
    if run.finished is not None:
        raise UserError(
            f"run {run.name!r} already finished ({FINISHED_NAME} in {run.path}); a requeued job would exit "
            "at once. Submit with another --run-dir to train again"
        )
    job, ans = _own_job(run, jid, run_cmd, "not requeued")
    if job is not None and (job.state == "PENDING" or job.state in REQUEUED_STATES):
        raise UserError(
            f"job {jid} of run {run.name!r} is {job.state}: it is already waiting to start; nothing to requeue"
        )
    if job is None and ans.controller_answered:
        raise UserError(
            f"Slurm no longer knows job {jid} of run {run.name!r}; to resume it, submit again: "
            f"slurm-ddp submit {run.path / CONFIG_NAME} --run-dir {run.path}"
        )
    _act(["scontrol", *clusters_args(ans.cluster), "requeue", jid], run_cmd)
    if job is not None and job.final:
        return f"requeued job {jid} of run {run.name!r}: it had ended; Slurm starts it again: {run.next_start().words}"
    return (
        f"requeued job {jid} of run {run.name!r}: Slurm stops it with SIGTERM and starts it again: "
        f"{run.at_stop().sentence()}"
    )
