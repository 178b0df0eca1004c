"""The state of a run: Slurm's word on its latest job joined with the run directory's record
(:class:`RunStatus`, :func:`run_status`, :func:`runs_status`), and the check that refuses a
second job in a run directory whose job still runs (:func:`refuse_active_run`).

Side effects: reads run directories (:mod:`.runs`); asks Slurm through the injectable
``run_cmd`` (:mod:`.slurm`); for a run of the ``local`` backend, probes the local supervisor's
``flock`` on its lock file (``rundir.LAUNCHER_LOCK_NAME``) and its pid in ``/proc`` on this
machine. Never prints. Imports no torch.

Slurm says what the run's latest job is doing: ``scontrol show job`` first (it also knows
the restart count), then ``squeue``, then ``sacct`` (which fails on clusters without
accounting, like the sandbox); a job that none of them knows any more has ended. The run
directory says how far training got (last step, last committed checkpoint, the finished
marker, the ``resume`` events = restarts). A run of the ``local`` backend is read from its
run directory alone: its local supervisor's lock, then how its latest start ended, in Slurm's state names
(``rundir.ENDS_NAME``, ``by: local``; ``STOPPED`` when the local supervisor left no record, e.g. after ``kill -9``). The Slurm states ``PREEMPTED`` and ``REQUEUED`` are not final: Slurm
starts such a job again. A local supervisor that waits for the runs it comes after (``--after``;
``rundir.WAITING_NAME``) has no scheduler to ask: its wait is shown in Slurm's words, ``PENDING`` with
``Reason=Dependency`` and the dependency, and, once a run it waits for ended the wrong way, ``CANCELLED``
with ``Reason=DependencyNeverSatisfied`` (what Slurm does under ``SchedulerParameters=kill_invalid_depend``).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from ..constants import PREEMPTED_EXIT_CODE
from ..errors import UserError
from ..rundir import JOBS_NAME, LAUNCHER_LOCK_NAME, SUBMITTING_NAME, LocalEnd, oom_note, read_ends, status_words
from ..rundir.local_end import PREEMPTED_STATE
from ..rundir.recovery import stop_note
from .ownjob import gone_words, group_by_cluster, identity_of, not_the_run, own_job, query_cluster
from .runs import Run, is_run_dir, read_run
from .slurm import NEVER_SATISFIED_REASON, Runner, SlurmAnswer, SlurmJob, query_jobs

#: ``SlurmJob.source`` of a local run's wait for its ``--after`` runs (``status --json``: ``slurm.source``).
#: The word predates the term "local supervisor" and stays for the readers of ``status --json``.
LOCAL_WAIT_SOURCE = "local launcher"


def _proc_start_time(pid: int) -> Optional[float]:
    """Start time (epoch seconds) of process ``pid`` from /proc, None where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        btime = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def launcher_lock_held(run_dir: Path) -> Optional[bool]:
    """Whether a local supervisor holds the run directory's ``LAUNCHER_LOCK_NAME`` (flock(2)); None
    without the file or where the filesystem has no flock. (Named after the file, ``launcher.lock``.)"""
    import fcntl

    try:
        fd = os.open(run_dir / LAUNCHER_LOCK_NAME, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return None  # a filesystem without flock: fall back to the pid
    finally:
        os.close(fd)
    return False


def local_supervisor_alive(job: Dict[str, Any], run_dir: Optional[Path] = None) -> bool:
    """True when the ``slurm-ddp submit --backend local`` process of ``job`` still runs on this
    machine: it holds ``run_dir``'s ``launcher.lock``, or (runs without a lock file) the pid that is
    its job id runs and did not start after the submission (else it is a reused pid): its local supervisor."""
    if run_dir is not None:
        held = launcher_lock_held(run_dir)
        if held is not None:
            return held
    try:
        pid = int(str(job.get("job_id")))
    except ValueError:
        return False
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    except OSError:
        return False
    started, submitted = _proc_start_time(pid), job.get("time")
    # a process that started well after the submission is another one that reused the pid
    return not (started is not None and isinstance(submitted, (int, float)) and started > submitted + 5)


@dataclass
class RunStatus:
    """A run's state: Slurm's word on its latest job joined with the run directory's record."""

    run: Run
    state: str  #: Slurm's JobState, or for local runs / forgotten jobs the run directory's word
    final: bool  #: nothing more happens without a new submit or requeue
    source: str  #: where ``state`` comes from
    #: Slurm's word on the latest job; for a local supervisor that waits for its ``--after`` runs, its wait in
    #: the same shape (``source`` ``LOCAL_WAIT_SOURCE``, ``job_id`` its pid, ``reason``, ``dependency``)
    slurm: Optional[SlurmJob] = None
    notes: List[str] = field(default_factory=list)
    #: a local run: how its latest start ended (``rundir.LocalEnd``), when the local supervisor recorded it
    local_end: Optional[LocalEnd] = None
    #: another job that Slurm has under the run's recorded id (``ops.ownjob``): never reported as the run's
    other_job: Optional[SlurmJob] = None

    def describe_state(self) -> str:
        """``state`` with the detail that explains it, on one line."""
        parts = []
        s = self.slurm
        if s is not None:
            if s.nodes and s.state in ("RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT"):
                parts.append(f"on {s.nodes}")
            if s.state == "PENDING" and s.restarts:
                parts.append("requeued")
            if s.reason and not (s.reason == "NonZeroExitCode" and s.exit_code):
                parts.append(f"reason {s.reason}")
            if s.exit_code and s.final:
                parts.append(f"exit {s.exit_code}")
        e = self.local_end
        if e is not None:
            if e.rank is not None and e.rank_status is not None:
                parts.append(f"rank {e.rank} {status_words(e.rank_status)}")
            if e.exit_code:
                parts.append(f"exit {e.exit_code}")
        return self.state + (f" ({', '.join(parts)})" if parts else "")

    def to_dict(self) -> Dict[str, Any]:
        r = self.run
        return {
            "run_dir": str(r.path),
            "name": r.name,
            "backend": r.backend,
            "job_ids": r.job_ids,
            "job_id": r.latest_job_id,
            "state": self.state,
            "final": self.final,
            "source": self.source,
            "slurm": None if self.slurm is None else self.slurm.__dict__,
            "step": r.step,
            "max_steps": r.max_steps,
            "last_checkpoint_step": r.last_checkpoint,
            "script_checkpoint": None if r.script_checkpoint is None else r.script_checkpoint.to_dict(),
            "next_start": r.next_start().words,
            "trained_from_step_0": r.trained_from_zero(),
            "finished": r.finished is not None,
            "restarts": r.restarts,
            "in_job_restarts": [x.to_dict() for x in r.in_job_restarts],
            "slurm_restarts": None if self.slurm is None else self.slurm.restarts,
            "last_eval": r.last_eval,
            "notes": self.notes,
            "local_end": None if self.local_end is None else asdict(self.local_end),
            "other_job": None if self.other_job is None else self.other_job.__dict__,
        }


def _local_status(run: Run) -> RunStatus:
    """A local run's state from its run directory: the finished marker, the local supervisor's lock, then how
    the latest start ended (``rundir.ENDS_NAME``, ``by: local``: ``PREEMPTED``, ``CANCELLED``, ``FAILED``, in
    Slurm's names); ``STOPPED`` when the local supervisor is gone without a record (``kill -9``)."""
    src = "run directory (local backend)"
    end = run.local_end if run.local_end is not None and run.local_end.describes(run.jobs[-1]) else None
    if run.finished is not None:
        return RunStatus(run, "COMPLETED", True, src, local_end=end)
    if local_supervisor_alive(run.jobs[-1], run.path):
        return RunStatus(
            run, "RUNNING", False, src, notes=[f"local supervisor pid {run.latest_job_id} runs on this machine"]
        )
    if end is not None:
        notes = [end.reason]
        if end.state == "COMPLETED":  # a finished run whose marker is gone: say so
            notes.append("but the run directory holds no FINISHED marker")
        return RunStatus(run, end.state, True, src, notes=notes, local_end=end)
    if run.preempted is not None and run.preempted.job_id == run.latest_job_id:
        return RunStatus(
            run,
            PREEMPTED_STATE,
            True,
            src,
            notes=[
                f"stopped for preemption ({run.preempted.signal}) at step {run.preempted.step}; submit it again "
                f"with the same --run-dir: {run.next_start().words}"
            ],
        )
    return RunStatus(
        run,
        "STOPPED",
        True,
        src,
        notes=["the local supervisor is gone without recording how the job ended (killed?); see its logs"],
    )


def waiting_status(run: Run) -> Optional[RunStatus]:
    """The state of a local supervisor's wait for the runs it comes after (``Run.waiting``) when no job
    was recorded since it began: ``PENDING`` (Reason=Dependency) while the supervisor lives, ``CANCELLED``
    (Reason=DependencyNeverSatisfied) once it gave up; None otherwise (no wait, a wait that is over, or
    a supervisor gone without a word: killed while it waited)."""
    w = run.waiting
    if w is None or any(float(j.get("time") or 0) >= w.time for j in run.jobs[-1:]):
        return None
    src = "run directory (local backend)"
    if w.cancelled_time:
        job = SlurmJob(str(w.pid), "CANCELLED", "None", dependency=w.dependency, source=LOCAL_WAIT_SOURCE)
        note = "cancelled while it waited for the runs it comes after (slurm-ddp cancel); it never started"
        return RunStatus(run, "CANCELLED", True, src, slurm=job, notes=[note])
    if w.never_satisfied:
        job = SlurmJob(
            str(w.pid), "CANCELLED", NEVER_SATISFIED_REASON, dependency=w.dependency, source=LOCAL_WAIT_SOURCE
        )
        return RunStatus(run, "CANCELLED", True, src, slurm=job, notes=[w.never_satisfied])
    if not local_supervisor_alive({"job_id": w.pid, "time": w.time}):
        return None
    job = SlurmJob(str(w.pid), "PENDING", "Dependency", dependency=w.dependency, source=LOCAL_WAIT_SOURCE)
    note = f"the local supervisor (pid {w.pid}) waits for those runs to end before it starts the ranks"
    return RunStatus(run, "PENDING", False, src, slurm=job, notes=[note])


def _not_submitted(run: Run) -> RunStatus:
    notes = [f"no job recorded in {JOBS_NAME}"]
    if run.waiting is not None:
        notes.append(f"its local supervisor (pid {run.waiting.pid}) stopped while it waited ({run.waiting.dependency})")
    return RunStatus(run, "NOT SUBMITTED", True, "run directory", notes=notes)


def never_starts_note(run_dir: Path, job: SlurmJob) -> str:
    """Why a job pending with Reason=DependencyNeverSatisfied never starts, and what to do."""
    dep = f" ({job.dependency})" if job.dependency else ""
    return (
        f"job {job.job_id} waits on a dependency that can never be satisfied{dep}: a job it comes after "
        f"ended in a way its condition excludes, so Slurm never starts it; cancel it: slurm-ddp cancel {run_dir}"
    )


def stopped_words(run: Run) -> str:
    """How the run's last stop for preemption left it, from its evidence: rank 0's ``PREEMPTED`` marker
    (its step: the worker's committed checkpoint, or a script's ``slurm_ddp.preemption`` stop), else the
    worker's newest checkpoint, else, for a script of one's own, that slurm_ddp saw no checkpoint."""
    if run.preempted is not None:
        what = "checkpoint of step" if not run.command else "the script stopped through slurm_ddp.preemption at step"
        return f"{what} {run.preempted.step}"
    if not run.command:
        return f"checkpoint of step {run.last_checkpoint}" if run.last_checkpoint is not None else "no checkpoint"
    return "its ranks were stopped by the signal; no slurm_ddp stop recorded, so no checkpoint at the stop"


def _status_from(run: Run, ans: SlurmAnswer) -> RunStatus:
    """The run's state from Slurm's answer ``ans``, once the job under its id is checked to be the
    run's (``ops.ownjob``): another job holding the id is never reported as the run's."""
    jid = run.latest_job_id
    ident = identity_of(run)
    job, other, verdict = own_job(ident, ans)
    notes = list(ans.notes)
    if other is not None:  # the id names another job now: the run's job is not there any more
        notes = [f"{not_the_run(ident, other, verdict, run.name, ans)}; {gone_words(other)}", *notes]
        if run.finished is not None:
            return RunStatus(run, "COMPLETED", True, "run directory", notes=notes, other_job=other)
        notes.append(f"the run did not finish (last step {run.step})")
        return RunStatus(run, "ENDED", True, "run directory", notes=notes, other_job=other)
    if job is not None:
        notes = [] if job.source != "sacct" else notes
        st = RunStatus(run, job.state, job.final, f"slurm ({job.source})", slurm=job, notes=notes)
        if job.never_starts:
            st.notes.append(never_starts_note(run.path, job))
        if job.final:  # an OOM kill named: rank, node, memory per node, slurm.mem_gb (rundir.oom)
            ends = read_ends(run.path)
            st.notes += [n for n in [oom_note(ends, job.job_id, job.state), stop_note(ends, job.job_id)] if n]
        if job.final and job.exit_code.split(":")[0] == str(PREEMPTED_EXIT_CODE) and run.finished is None:
            st.notes.append(
                f"exit {PREEMPTED_EXIT_CODE}: stopped for preemption ({stopped_words(run)}) and not requeued; "
                f"continue with: slurm-ddp requeue {run.path}; {run.next_start().words}"
            )
        return st
    if ans.controller_answered:  # asked and answered: the controller forgot the job, so it ended long ago
        notes = [f"Slurm no longer knows job {jid}"] + notes
        ends = read_ends(run.path)  # rundir.oom and rundir.recovery, from the end record
        notes += [n for n in [oom_note(ends, jid or ""), stop_note(ends, jid or "")] if n]
        if run.finished is not None:
            return RunStatus(run, "COMPLETED", True, "run directory", notes=notes)
        return RunStatus(
            run,
            "ENDED",
            True,
            "run directory",
            notes=notes + [f"the run did not finish (last step {'unknown' if run.step is None else run.step})"],
        )
    state = "COMPLETED" if run.finished is not None else "UNKNOWN"
    where = f" on cluster {ans.cluster!r}" if ans.cluster else ""
    return RunStatus(
        run,
        state,
        run.finished is not None,
        "run directory",
        notes=[f"cannot ask Slurm about job {jid}{where}"] + notes,
    )


def run_status(run: Run, run_cmd: Runner = subprocess.run) -> RunStatus:
    """The state of ``run`` (see the module docstring). Never raises for Slurm failures:
    what could not be asked is in ``notes``."""
    waiting = waiting_status(run)
    if waiting is not None:
        return waiting
    if not run.jobs:
        return _with_intent(_not_submitted(run))
    if run.is_local:
        return _local_status(run)
    ident = identity_of(run)
    ans = query_jobs([run.latest_job_id or ""], run_cmd, detail=True, cluster=query_cluster(ident))
    return _with_intent(_status_from(run, ans))


def _with_intent(st: RunStatus) -> RunStatus:
    """``st`` with a note when a submit's intent is in the run directory (``rundir.SUBMITTING_NAME``)."""
    w = st.run.submitting
    if w is not None:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(w.time)) if w.time else "an unknown time"
        st.notes.append(
            f"a submit into this run directory (at {when}) is under way or lost sbatch's answer ({SUBMITTING_NAME}): "
            "the next submit looks for the job it may have made and does not make a second one"
        )
    return st


def refuse_active_run(run_dir: Path, run_cmd: Runner = subprocess.run) -> Optional[str]:
    """Raise ``UserError`` when a job of ``run_dir`` is still pending, running or requeued.

    Two jobs in one run directory would write the same checkpoints and logs and resume
    from each other's steps. A job Slurm cannot be asked about (no ``squeue`` here) does not
    block; the returned note says so (None when nothing needs saying).
    """
    if not is_run_dir(run_dir):
        return None
    run = read_run(run_dir)
    if not run.jobs:
        return None
    st = run_status(run, run_cmd)
    if st.state == "UNKNOWN":
        return (
            f"could not ask Slurm whether job {run.latest_job_id} of {run_dir} still runs "
            f"({'; '.join(st.notes)}); submitting anyway"
        )
    if st.final:
        return None
    how = (
        "wait for it to stop, or stop it with Ctrl-C / kill -USR2 " + str(run.latest_job_id)
        if run.is_local
        else f"wait for it, or cancel it first: slurm-ddp cancel {run_dir}"
    )
    raise UserError(
        f"run directory {str(run_dir)!r} already has job {run.latest_job_id} in state "
        f"{st.state}; a second job would write the same checkpoints. HINT: {how}, "
        "or submit with another --run-dir"
    )


def runs_status(runs: Sequence[Run], run_cmd: Runner = subprocess.run) -> List[RunStatus]:
    """``run_status`` for many runs with one ``squeue`` (and at most one ``sacct``) call per cluster their
    jobs were submitted to (one, but on a multi-cluster site)."""
    slurm_runs = [r for r in runs if r.jobs and not r.is_local and r.latest_job_id]
    groups = group_by_cluster(identity_of(r) for r in slurm_runs)
    answers = {c: query_jobs(sorted(ids), run_cmd, cluster=c) for c, ids in groups.items()}
    out = []
    for r in runs:
        waiting = waiting_status(r)
        if waiting is not None:
            out.append(waiting)
        elif not r.jobs:
            out.append(RunStatus(r, "NOT SUBMITTED", True, "run directory"))
        elif r.is_local:
            out.append(_local_status(r))
        else:
            out.append(_status_from(r, answers.get(query_cluster(identity_of(r)), SlurmAnswer())))
    return out
