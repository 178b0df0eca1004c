"""What Slurm says about jobs: ``scontrol show job``, ``squeue`` and ``sacct``, asked in that
order of detail, and what their job states mean (:data:`FINAL_STATES`, :data:`REQUEUED_STATES`).

Side effects: runs the Slurm client commands through an injectable ``run`` (a
:data:`Runner`, default ``subprocess.run``) so tests pass a fake; reads no run directory.
A question that cannot be asked (no client on PATH, a timeout, accounting off) is returned
as a note, never raised: the callers decide what it means. Imports no torch.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..rundir.local_end import PREEMPTED_STATE

#: ``subprocess.run``'s signature: ``run(argv, capture_output=True, text=True, timeout=S)``.
Runner = Callable[..., subprocess.CompletedProcess[str]]

#: Slurm job states after which nothing more happens to the job (squeue(1) "JOB STATE CODES").
#: PREEMPTED is missing on purpose: with PreemptMode=REQUEUE the job starts again.
FINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)
#: States of a job that is waiting to run again.
REQUEUED_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", PREEMPTED_STATE, "SPECIAL_EXIT"})
#: The Reason of a pending job whose dependency can no longer be met (a job it is ``afterok`` of
#: failed, ...): Slurm keeps it PENDING forever unless ``SchedulerParameters=kill_invalid_depend``
#: (squeue(1) "JOB REASON CODES"; sbatch(1) ``--dependency``).
NEVER_SATISFIED_REASON = "DependencyNeverSatisfied"

_NOT_KNOWN = ("invalid job id",)  # what scontrol/squeue/scancel say of a job the controller forgot


def is_final(state: str) -> bool:
    """True when a Slurm job in ``state`` will not run again by itself."""
    return state.upper().split()[0].rstrip("+") in FINAL_STATES if state else False


@dataclass(frozen=True)
class SlurmJob:
    """What Slurm says about one job."""

    job_id: str
    state: str  #: JobState, e.g. RUNNING, PENDING, COMPLETED (first word only)
    reason: str = ""  #: why it is pending or how it ended ("None" dropped)
    restarts: Optional[int] = None  #: Slurm's restart count (scontrol only)
    exit_code: str = ""  #: "STATUS:SIGNAL"
    nodes: str = ""
    source: str = ""  #: the command that answered
    dependency: str = ""  #: what it waits for, e.g. ``afterok:12(unfulfilled)`` (scontrol only; sbatch(1) --dependency)

    @property
    def final(self) -> bool:
        return is_final(self.state)

    @property
    def never_starts(self) -> bool:
        """Pending on a dependency that can no longer be satisfied (:data:`NEVER_SATISFIED_REASON`)."""
        return self.state == "PENDING" and self.reason == NEVER_SATISFIED_REASON


def call(
    run: Runner, argv: Sequence[str], timeout: float = 30
) -> Tuple[Optional[subprocess.CompletedProcess[str]], str]:
    """Run a Slurm client command, output captured as text: (result, "") or (None, why it could
    not run: not on PATH, no answer within ``timeout`` seconds, another ``OSError``)."""
    try:
        return run(list(argv), capture_output=True, text=True, timeout=timeout), ""
    except FileNotFoundError:
        return None, f"{argv[0]} is not on PATH"
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout:.0f} s"
    except OSError as e:
        return None, f"{argv[0]}: {e}"


def last_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The last line a command wrote (stdout after stderr), else its exit status: the one line
    that says why it failed."""
    lines = ((proc.stderr or "") + "\n" + (proc.stdout or "")).strip().splitlines()
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


def _unknown_job(proc: subprocess.CompletedProcess[str]) -> bool:
    text = ((proc.stderr or "") + (proc.stdout or "")).lower()
    return proc.returncode != 0 and any(s in text for s in _NOT_KNOWN)


def _clean(value: str) -> str:
    return "" if value in ("None", "(null)", "N/A") else value


def scontrol_job(job_id: str, run: Runner = subprocess.run) -> Tuple[Optional[SlurmJob], str]:
    """``scontrol show job -o JOB``: (job, "") / (None, "") when Slurm does not know it /
    (None, why the question could not be asked)."""
    proc, why = call(run, ["scontrol", "show", "job", "-o", job_id])
    if proc is None:
        return None, why
    if proc.returncode != 0:
        return None, ("" if _unknown_job(proc) else f"scontrol: {last_line(proc)}")
    for line in (proc.stdout or "").splitlines():
        fields = dict(re.findall(r"(?:^|\s)([A-Za-z/:_]+)=(\S*)", line))
        if "JobState" not in fields:
            continue
        restarts = fields.get("Restarts", "")
        return SlurmJob(
            job_id=fields.get("JobId", job_id),
            state=fields["JobState"],
            reason=_clean(fields.get("Reason", "")),
            restarts=int(restarts) if restarts.isdigit() else None,
            exit_code=fields.get("ExitCode", ""),
            nodes=_clean(fields.get("NodeList", "")),
            source="scontrol",
            dependency=_clean(fields.get("Dependency", "")),
        ), ""
    return None, ""


def squeue_jobs(job_ids: Sequence[str], run: Runner = subprocess.run) -> Tuple[Dict[str, SlurmJob], str]:
    """``squeue`` for ``job_ids`` in every state the controller still remembers."""
    if not job_ids:
        return {}, ""
    proc, why = call(
        run, ["squeue", "--noheader", "--states=all", f"--jobs={','.join(job_ids)}", "--format=%i|%T|%r|%N"]
    )
    if proc is None:
        return {}, why
    if proc.returncode != 0:
        return {}, ("" if _unknown_job(proc) else f"squeue: {last_line(proc)}")
    out: Dict[str, SlurmJob] = {}
    for line in (proc.stdout or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0] in job_ids:
            out[parts[0]] = SlurmJob(
                job_id=parts[0],
                state=parts[1].split()[0] if parts[1] else "?",
                reason=_clean(parts[2]) if len(parts) > 2 else "",
                nodes=_clean(parts[3]) if len(parts) > 3 else "",
                source="squeue",
            )
    return out, ""


def sacct_jobs(job_ids: Sequence[str], run: Runner = subprocess.run) -> Tuple[Dict[str, SlurmJob], str]:
    """``sacct`` for jobs the controller forgot. Fails where accounting is off (the sandbox)."""
    if not job_ids:
        return {}, ""
    proc, why = call(
        run,
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            f"--jobs={','.join(job_ids)}",
            "--format=JobID,State,ExitCode,NodeList",
        ],
    )
    if proc is None:
        return {}, why
    if proc.returncode != 0:
        return {}, f"sacct: {last_line(proc)}"
    out: Dict[str, SlurmJob] = {}
    for line in (proc.stdout or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0] in job_ids and parts[1]:
            out[parts[0]] = SlurmJob(
                job_id=parts[0],
                state=parts[1].split()[0].rstrip("+"),
                exit_code=parts[2] if len(parts) > 2 else "",
                nodes=_clean(parts[3]) if len(parts) > 3 else "",
                source="sacct",
            )
    return out, ""


@dataclass
class SlurmAnswer:
    """What Slurm said about some job ids."""

    jobs: Dict[str, SlurmJob] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  #: questions that could not be answered, and why
    controller_answered: bool = False  #: scontrol or squeue answered (a job they lack has ended)


def query_jobs(job_ids: Sequence[str], run: Runner = subprocess.run, detail: bool = False) -> SlurmAnswer:
    """What Slurm knows about ``job_ids``. ``detail``: ask ``scontrol`` per job first (restart
    count, exit code); then ``squeue`` for the rest, then ``sacct`` for jobs the controller forgot."""
    ans = SlurmAnswer()
    if detail:
        for jid in job_ids:
            job, why = scontrol_job(jid, run)
            if job is not None:
                ans.jobs[jid] = job
            if why:
                ans.notes.append(why)
            else:
                ans.controller_answered = True
    missing = [j for j in job_ids if j not in ans.jobs]
    if missing:
        jobs, why = squeue_jobs(missing, run)
        ans.jobs.update(jobs)
        if why:
            ans.notes.append(why)
        else:
            ans.controller_answered = True
    missing = [j for j in job_ids if j not in ans.jobs]
    if missing:
        jobs, why = sacct_jobs(missing, run)
        ans.jobs.update(jobs)
        if why:
            ans.notes.append(why)
    return ans
