"""The requeue rule (:func:`decide_requeue`), one for the batch script, the submitit backend and
the local supervisor; :func:`requeue_job`, which carries out a decision taken in Python; the finished
rule of ``train.command`` runs (:func:`mark_command_finished`); and the OOM check of a start
(:func:`oom_of_start`). The job's supervisor (:mod:`slurm_ddp.supervise`) applies them. Part of
:mod:`slurm_ddp.rundir`.

Side effects: reads and writes the run directory's markers; :func:`requeue_job` runs ``scontrol``.
Imports no torch.
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence

from ..constants import NO_RESTART_EXIT_CODE, PREEMPTED_EXIT_CODE
from .files import (
    LOGS_DIR,
    PathLike,
    Preempted,
    batch_log_name,
    is_finished,
    read_no_restart,
    read_preempted,
    write_finished,
)
from .hangs import Hang, find_hang
from .oom import OomKill, find_oom, this_start
from .stops import STOP_SIGNALS, RankStops, read_rank_stops, read_rank_stops_here

# --------------------------------------------------------------------------- the requeue decision
#: What follows a SIGTERM to the job's supervisor, which cannot tell its sender: ``scancel`` ends the job;
#: ``scontrol requeue`` and a preemption under ``PreemptMode=REQUEUE`` (scontrol(1) "requeue",
#: slurm.conf(5) PreemptMode) make Slurm itself start the job again, with ``SLURM_RESTART_COUNT`` + 1.
SIGTERM_WORDS = (
    "this job does not requeue itself: after scancel it ends; after scontrol requeue (slurm-ddp requeue) or "
    "a preemption with PreemptMode=REQUEUE, Slurm starts it again itself"
)


#: The key of an end record (``ends.jsonl``) that names a rank's "do not restart" (:func:`no_restart_reason`).
NO_RESTART_KEY = "no_restart"


def no_restart_reason(exit_code: int, record: Optional[Mapping[str, Any]]) -> str:
    """Why this start must be neither restarted nor requeued, in words, or "" when nothing says so: a rank's
    record (``rundir.read_no_restart`` of this start: ``errors.NoRestart`` in the shared worker, a
    ``train.command`` rank that exited with ``constants.NO_RESTART_EXIT_CODE``), else the step's status
    ``exit_code`` being that code (srun reports its tasks' highest status; a rank that could not write the
    record). Pure. The convention is NVIDIA Resiliency Extension's: its launchers exit with
    ``--ft-no-restart-exit-code`` (93) when the job must not be requeued."""
    code = NO_RESTART_EXIT_CODE
    if record is not None:
        why = str(record.get("reason") or "").strip()
        return (
            f"rank {record.get('rank', '?')} on {record.get('host') or '?'} ended with the do-not-restart status {code}"
            + (f" ({why})" if why else "")
        )
    if exit_code == code:
        return f"the step ended with the do-not-restart status {code} (constants.NO_RESTART_EXIT_CODE)"
    return ""


@dataclass(frozen=True)
class RequeueDecision:
    """What a job does after its ranks stopped: requeue itself or not, and its exit status."""

    preempted: bool  #: the ranks stopped for preemption with a committed checkpoint
    requeue: bool  #: run ``scontrol requeue JOB_ID`` now
    reason: str  #: one log line saying why
    exit_code: int  #: the job's exit status: ``PREEMPTED_EXIT_CODE`` when preempted, else srun's
    #: node(s) to leave out of the requeued job: a hang's node, or the nodes in-job recovery found lost (a, b)
    exclude: Optional[str] = None
    #: why the job ends without a restart or requeue: a rank's "do not restart" (:func:`no_restart_reason`); ""
    no_restart: str = ""


def decide_requeue(
    *,
    exit_code: int,
    marker: Optional[Preempted],
    job_id: str,
    restart_count: int,
    max_requeues: int,
    got_term: bool,
    can_requeue: bool,
    finished: bool = False,
    got_signal: bool = False,
    command: bool = False,
    hang: Optional[Hang] = None,
    previous_hang: Optional[Hang] = None,
    stops: Optional[RankStops] = None,
    lost_nodes: Sequence[str] = (),
    no_restart: str = "",
) -> RequeueDecision:
    """THE requeue rule, for the batch script, the submitit backend and the local supervisor alike. Pure.

    ``exit_code`` is srun's status (sbatch backend) or rank 0's (submitit); ``marker`` the run's
    ``PREEMPTED`` marker, if any; ``job_id``/``restart_count`` are this job's ``SLURM_JOB_ID`` and
    ``SLURM_RESTART_COUNT``; ``got_term``: the job's supervisor received SIGTERM; ``can_requeue``:
    ``scontrol`` is on PATH; ``finished``: the run wrote ``FINISHED``; ``got_signal``: the ranks
    were sent the time-limit signal (``requeue.signal``, sbatch ``--signal``) in this job;
    ``command``: the run is a ``train.command`` script (``got_signal`` counts only for those: the
    shared worker states a preemption itself, by its status and marker, on every backend alike).

    Preempted when the status is ``PREEMPTED_EXIT_CODE``, or when the marker belongs to this job
    AND this restart (srun may report a rank killed by ``--kill-on-bad-exit`` after rank 0 had
    committed the checkpoint; a marker of another job or an earlier restart is stale), or when
    the ranks got the time-limit signal and the run did not finish, whatever their status: a
    script of one's own (``train.command``) that ignores the signal dies of it or is killed at
    the limit, and one that resumes from its own snapshot (the PyTorch DDP tutorial's pattern)
    continues after the requeue. A status other than 0/75 *without* that signal is a crash and
    never requeues. A preempted
    job requeues itself unless it was stopped by SIGTERM (Slurm requeues a job it preempts itself
    with ``PreemptMode=REQUEUE``, and ``scancel`` means stop), ``scontrol`` is missing, there is no
    job id, or ``restart_count >= max_requeues`` (the cap counts every restart of the job). A
    finished run is never requeued.

    ``hang``: the hang watchdog ended this job's ranks (``find_hang`` of this job and restart). A
    hang is taken for a node's fault, like a preemption: the job requeues under the same
    conditions, without the culprits' node when the hang points at one (``exclude``), and resumes
    from its last checkpoint. ``previous_hang`` (the job's previous restart) at the same step on
    another node makes it the training code's fault: no requeue.

    ``stops``: the signals the ranks' rank wrappers recorded (:func:`read_rank_stops`, a
    ``train.command`` run): the requeue signal counts as ``got_signal`` and a stop signal as
    ``got_term``, wherever it came from (``scancel --signal=USR2 JOBID`` reaches the ranks only).
    A ``train.command`` run is finished only when its ranks exit 0 *without* having been told to
    stop: status 0 after SIGTERM (a script that saves and exits 0 on it, PyTorch Lightning) is a
    stop like a preemption, exit ``PREEMPTED_EXIT_CODE``, not requeued; the next start decides
    (a script with nothing left to do exits 0 at once, and then the run is finished). A run that
    had written ``FINISHED`` before a stop signal ended its ranks (status 75 or 128+N) reports 0.

    ``lost_nodes``: the nodes in-job recovery found lost or hung and could not replace inside the job
    (:func:`slurm_ddp.rundir.recovery.decide_recovery` answered ``requeue``): a node's fault, so the job
    requeues under the same conditions as for a hang, without them (``exclude``, comma-separated).

    ``no_restart``: a rank asked that the job be neither restarted nor requeued (:func:`no_restart_reason`):
    unless the run finished, no requeue whatever else happened (a preemption, a hang, a lost node), and the
    job's status is ``NO_RESTART_EXIT_CODE`` (the scheduler-facing "do not requeue"); ``no_restart`` names it.
    """
    if no_restart and not finished:
        return RequeueDecision(
            preempted=False,
            requeue=False,
            reason=f"{no_restart}: a deterministic failure, not a node's; not requeueing",
            exit_code=NO_RESTART_EXIT_CODE,
            no_restart=no_restart,
        )
    if lost_nodes and not finished and marker_is_not_this(marker, job_id, restart_count):
        return _decide_lost(
            exit_code=exit_code,
            job_id=job_id,
            restart_count=restart_count,
            max_requeues=max_requeues,
            got_term=got_term,
            can_requeue=can_requeue,
            lost_nodes=lost_nodes,
        )
    if stops is not None:
        got_signal = got_signal or stops.requeue
        got_term = got_term or stops.stop
    if hang is not None and not finished and marker_is_not_this(marker, job_id, restart_count):
        return _decide_hang(
            exit_code=exit_code,
            job_id=job_id,
            restart_count=restart_count,
            max_requeues=max_requeues,
            got_term=got_term,
            can_requeue=can_requeue,
            hang=hang,
            previous_hang=previous_hang,
        )
    notes: List[str] = []
    preempted = exit_code == PREEMPTED_EXIT_CODE
    if marker is not None and marker.job_id == job_id and marker.restart == restart_count:
        preempted = True
        notes.append(f"rank 0 committed the checkpoint of step {marker.step} before stopping ({marker.signal})")
        got_term = got_term or marker.signal in STOP_SIGNALS
    saved = "checkpoint saved" if preempted else "stopped at the time-limit signal"
    if not preempted and got_signal and command and not finished:
        preempted = True
        notes.append(f"the ranks got the time-limit signal and stopped (status {exit_code}) before the run finished")
    if not preempted and got_term and command and not finished and exit_code == 0:
        preempted = True
        notes.append(
            "the ranks were told to stop (SIGTERM) and exited with status 0: stopped, not finished; "
            "the next start decides"
        )
    requeue = False
    if finished:
        preempted = False
        notes.append("the run finished: nothing to requeue")
        if (got_term or got_signal) and (exit_code == PREEMPTED_EXIT_CODE or exit_code > 128):
            notes.append(f"status {exit_code} came from a stop signal that arrived after the run finished: reporting 0")
            exit_code = 0
    elif not preempted and got_term:
        notes.append(f"the ranks ended with status {exit_code} after SIGTERM; {SIGTERM_WORDS}")
    elif not preempted:
        pass
    elif got_term:
        notes.append(f"stopped by SIGTERM; {SIGTERM_WORDS}")
    elif not can_requeue:
        notes.append(f"{saved}, but scontrol is missing: cannot requeue")
    elif not job_id:
        notes.append(f"{saved}, but SLURM_JOB_ID is not set: cannot requeue")
    elif restart_count >= max_requeues:
        notes.append(f"{saved}; max_requeues={max_requeues} reached (restart {restart_count}): not requeueing")
    else:
        requeue = True
        notes.append(f"{saved}; requeueing (restart {restart_count + 1} of at most {max_requeues})")
    if not preempted and not notes:
        notes.append(f"not preempted (status {exit_code}): not requeueing")
    return RequeueDecision(
        preempted=preempted,
        requeue=requeue,
        reason="; ".join(notes),
        exit_code=PREEMPTED_EXIT_CODE if preempted else exit_code,
    )


def marker_is_not_this(marker: Optional[Preempted], job_id: str, restart_count: int) -> bool:
    """True unless ``marker`` states a preemption stop of this job and restart (which wins over a hang)."""
    return marker is None or marker.job_id != job_id or marker.restart != restart_count


def _decide_hang(
    *,
    exit_code: int,
    job_id: str,
    restart_count: int,
    max_requeues: int,
    got_term: bool,
    can_requeue: bool,
    hang: Hang,
    previous_hang: Optional[Hang],
) -> RequeueDecision:
    status = exit_code if exit_code not in (0, PREEMPTED_EXIT_CODE) else 1
    notes = [hang.line()]
    if previous_hang is not None and previous_hang.step == hang.step and set(previous_hang.hosts) != set(hang.hosts):
        notes.append(
            f"the same hang at step {hang.step} as in the previous run (on {', '.join(previous_hang.hosts)}), now on "
            f"{', '.join(hang.hosts)}: a bug in the training code or its data, not a node; not requeueing"
        )
        return RequeueDecision(preempted=False, requeue=False, reason="; ".join(notes), exit_code=status)
    exclude = hang.exclude
    requeue = False
    why_not = _why_not_requeue(
        got_term=got_term,
        can_requeue=can_requeue,
        job_id=job_id,
        restart_count=restart_count,
        max_requeues=max_requeues,
    )
    if why_not:
        notes.append(why_not)
    else:
        requeue = True
        away = f" without node {exclude}" if exclude else ""
        notes.append(
            f"taken for a node problem: requeueing{away} (restart {restart_count + 1} of at most {max_requeues}), "
            "resuming from the last checkpoint"
        )
    return RequeueDecision(
        preempted=False,
        requeue=requeue,
        reason="; ".join(notes),
        exit_code=status,
        exclude=exclude if requeue else None,
    )


def _why_not_requeue(*, got_term: bool, can_requeue: bool, job_id: str, restart_count: int, max_requeues: int) -> str:
    """Why a job that a hang or a lost node ended cannot requeue itself, in words; "" when it can."""
    if got_term:
        return f"stopped by SIGTERM; {SIGTERM_WORDS}"
    if not can_requeue:
        return "scontrol is missing: cannot requeue"
    if not job_id:
        return "SLURM_JOB_ID is not set: cannot requeue"
    if restart_count >= max_requeues:
        return f"max_requeues={max_requeues} reached (restart {restart_count}): not requeueing"
    return ""


def _decide_lost(
    *,
    exit_code: int,
    job_id: str,
    restart_count: int,
    max_requeues: int,
    got_term: bool,
    can_requeue: bool,
    lost_nodes: Sequence[str],
) -> RequeueDecision:
    status = exit_code if exit_code not in (0, PREEMPTED_EXIT_CODE) else 1
    lost = ",".join(dict.fromkeys(lost_nodes))
    notes = [f"node {lost} lost or hung and not replaceable inside the job"]
    requeue = False
    why_not = _why_not_requeue(
        got_term=got_term,
        can_requeue=can_requeue,
        job_id=job_id,
        restart_count=restart_count,
        max_requeues=max_requeues,
    )
    if why_not:
        notes.append(why_not)
    else:
        requeue = True
        notes.append(
            f"requeueing without node {lost} (restart {restart_count + 1} of at most {max_requeues}), resuming "
            "from the last checkpoint"
        )
    return RequeueDecision(
        preempted=False, requeue=requeue, reason="; ".join(notes), exit_code=status, exclude=lost if requeue else None
    )


def decide_requeue_here(
    run_dir: PathLike,
    *,
    exit_code: int,
    max_requeues: int,
    got_term: bool,
    can_requeue: bool,
    environ: Optional[Mapping[str, str]] = None,
    got_signal: bool = False,
    command: bool = False,
    lost_nodes: Sequence[str] = (),
) -> RequeueDecision:
    """:func:`decide_requeue` for the job in ``environ`` (default ``os.environ``) and ``run_dir``'s
    markers (``PREEMPTED``, ``FINISHED``, the hang reports, the ranks' stop records, their "do not restart").

    Raises ``ValueError`` when ``SLURM_RESTART_COUNT`` is not a non-negative integer.
    """
    env = os.environ if environ is None else environ
    restart_text = env.get("SLURM_RESTART_COUNT") or "0"
    if not restart_text.isdigit():
        raise ValueError(f"SLURM_RESTART_COUNT={restart_text!r} is not a non-negative integer")
    job_id, restart = env.get("SLURM_JOB_ID", ""), int(restart_text)
    said = read_no_restart(run_dir, job_id, restart) if job_id else None
    return decide_requeue(
        no_restart=no_restart_reason(exit_code, said),
        hang=find_hang(run_dir, job_id, restart) if job_id else None,
        previous_hang=find_hang(run_dir, job_id, restart - 1) if job_id and restart else None,
        exit_code=exit_code,
        marker=read_preempted(run_dir),
        job_id=env.get("SLURM_JOB_ID", ""),
        restart_count=int(restart_text),
        max_requeues=max_requeues,
        got_term=got_term,
        can_requeue=can_requeue,
        finished=is_finished(run_dir),
        got_signal=got_signal,
        command=command,
        stops=read_rank_stops(run_dir, job_id, restart) if job_id else None,
        lost_nodes=lost_nodes,
    )


#: seconds the batch side waits for the job's steps to end (:func:`wait_for_steps_to_end`) before it requeues
STEPS_END_TIMEOUT_S = 10.0
_STEP_ID = re.compile(r"\bStepId=\S+?\.(\d+)\b")


def wait_for_steps_to_end(
    job_id: str,
    run: Callable[..., Any],
    timeout_s: float = STEPS_END_TIMEOUT_S,
    interval_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Wait until job ``job_id`` has no numbered step left (``scontrol show step JOB_ID``: ``StepId=J.N``;
    its ``batch`` and ``extern`` steps do not count), at most ``timeout_s`` seconds; True when none is left
    or ``scontrol`` cannot say (nothing to wait for), False at the timeout.

    Why: srun exits once its tasks have exited, while slurmstepd may still be cleaning the step up (its
    epilogue, an OCI container's ``RunTimeDelete``: oci.conf(5)); a requeue then ends the job under that
    clean-up, and the next start's step can find it unfinished (seen on Slurm 26.05: ``runc run failed:
    container with given ID already exists``, the container id ``%n.%u.%j.%s.%t`` being the same after a
    requeue). For the batch side only: a caller inside a step (submitit's rank 0) would wait for itself."""
    deadline = clock() + timeout_s
    while True:
        r = run(["scontrol", "show", "step", job_id, "-o"], check=False, capture_output=True, text=True)
        if getattr(r, "returncode", 1) != 0 or not _STEP_ID.search(str(getattr(r, "stdout", "") or "")):
            return True
        if clock() >= deadline:
            return False
        sleep(interval_s)


def requeue_job(
    job_id: str,
    exclude: Optional[str],
    run: Callable[..., Any],
    wlog: logging.Logger,
    wait_steps: Optional[str] = None,
) -> None:
    """``scontrol requeue JOB_ID``, then leave node ``exclude`` (a hang's) out of the requeued job
    (``ExcNodeList``, added to the job's own; Slurm takes it only once the job is pending again).
    ``wait_steps`` (the batch side's supervisor: ``SLURM_JOB_ID``, an array element's own id): first wait
    for that job's steps to end (:func:`wait_for_steps_to_end`). Also used where Python takes the requeue decision inside a step
    (submitit's rank 0, a hung submitit job's watchdog); failures are logged, not raised."""
    if wait_steps and not wait_for_steps_to_end(wait_steps, run):
        wlog.warning(
            "job %s still has a step %.0f s after it ended (scontrol show step); requeueing anyway",
            wait_steps,
            STEPS_END_TIMEOUT_S,
        )
    r = run(["scontrol", "requeue", job_id], check=False)
    if getattr(r, "returncode", 0) != 0:
        wlog.error("scontrol requeue failed (status %s)", r.returncode)
        return
    if not exclude:
        return
    out = run(["scontrol", "show", "job", "-o", job_id], check=False, capture_output=True, text=True)
    current = ""
    for word in str(getattr(out, "stdout", "") or "").split():
        if word.startswith("ExcNodeList="):
            current = word.split("=", 1)[1]
    nodes = exclude if current in ("", "(null)") else f"{current},{exclude}"
    for _ in range(5):
        r = run(["scontrol", "update", f"JobId={job_id}", f"ExcNodeList={nodes}"], check=False)
        if getattr(r, "returncode", 0) == 0:
            wlog.warning("node %s is left out of the requeued job (ExcNodeList=%s)", exclude, nodes)
            return
        time.sleep(1)
    wlog.error("could not leave node %s out of the requeued job", exclude)


def mark_command_finished(
    run_dir: PathLike,
    *,
    exit_code: int,
    environ: Optional[Mapping[str, str]] = None,
    told_to_stop: bool = False,
) -> bool:
    """Write ``FINISHED`` for a ``train.command`` run whose ranks all exited with status 0 without
    having been told to stop; True if written.

    A script of one's own knows nothing of the run directory, so its exit status is its only
    statement: 0 is "done" (the batch script, the local supervisor and submitit's rank 0 call this
    after the ranks exit, before the requeue decision, so a finished run is never requeued and a
    requeued or resubmitted job of it exits at once) — unless the ranks were told to stop: status
    0 after a stop signal is a stop (a script that saves and exits 0 on SIGTERM, PyTorch
    Lightning), and the next start decides. ``told_to_stop``: the caller sent or forwarded a stop
    signal (the supervisor's SIGTERM or ``requeue.signal``); the ranks' own records
    (:func:`read_rank_stops` of the job in ``environ``) count too. Any other status writes nothing.
    """
    if exit_code != 0 or is_finished(run_dir) or told_to_stop:
        return False
    env = os.environ if environ is None else environ
    if read_rank_stops_here(run_dir, env).told:
        return False
    write_finished(
        run_dir,
        {
            "command": True,
            "exit_code": 0,
            "job_id": env.get("SLURM_JOB_ID", ""),
            "restart": env.get("SLURM_RESTART_COUNT") or "0",
            "time": time.time(),
        },
    )
    return True


# --------------------------------------------------------------------------- the OOM check of a start
#: how much of each log the OOM check reads (its end: srun and slurmstepd write their lines as the step ends)
_OOM_TAIL_BYTES = 256 * 1024


def _tail(path: Path, size: int = _OOM_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def oom_of_start(run_dir: PathLike, job_id: str, launcher: str = "srun") -> OomKill:
    """:func:`slurm_ddp.rundir.oom.find_oom` over the end of this start's batch log
    (``logs/batch-JOB.out``, from the start's first line) and of its tasks' logs: ``rank-N.log``
    (``slurm.launcher: srun``: task N is rank N) or ``torchrun-node-N.log`` (torchrun: task N is node N's
    agent). Lines of other jobs' steps are left out."""
    logs = Path(run_dir) / LOGS_DIR
    pattern = re.compile(r"rank-(\d+)\.log$" if launcher == "srun" else r"torchrun-node-(\d+)\.log$")
    tasks = {}
    for p in logs.glob("*.log"):
        m = pattern.match(p.name)
        if m:
            tasks[int(m.group(1))] = _tail(p)
    return find_oom(this_start(_tail(logs / batch_log_name(job_id)), job_id), tasks, job_id=job_id)
