"""What Slurm says about jobs: ``scontrol show job``, ``squeue`` and ``sacct``, asked in that
order of detail, and what their job states mean (:data:`FINAL_STATES`, :data:`REQUEUED_STATES`).

Side effects: runs the Slurm client commands through an injectable ``run`` (a
:data:`Runner`, default ``subprocess.run``) so tests pass a fake; reads no run directory
(:func:`local_cluster` reads ``slurm.conf`` where it can).
A question that cannot be asked (no client on PATH, a timeout, accounting off) is returned
as a note, never raised: the callers decide what it means. Imports no torch.

Every answer carries what identifies the job (user, name, ``Command``/``StdOut``/``WorkDir``, submit
time), which ``ops.ownjob`` checks against the run's record. Each query takes a ``cluster``: the
``-M/--clusters`` value where the run's job lives on another cluster of a multi-cluster site ("":
the local one). The read-only queries are retried on the controller's transient errors
(:data:`RETRY`, the one retry policy: :func:`call`); ``scancel``/``scontrol requeue`` never are.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
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

#: What the Slurm clients print when the controller (or slurmdbd) did not answer this time: worth asking
#: again after a pause (slurm_strerror(3) texts of SLURM_PROTOCOL_SOCKET_IMPL_TIMEOUT,
#: SLURMCTLD_COMMUNICATIONS_CONNECTION_ERROR, ESLURM_ERROR_ON_DESC_TO_RECORD_COPY..., lower case).
TRANSIENT_ERRORS = (
    "socket timed out",
    "unable to contact slurm controller",
    "slurm temporarily unable",
    "zero bytes were transmitted or received",
    "connection refused",
    "resource temporarily unavailable",
)


@dataclass(frozen=True)
class RetryPolicy:
    """How a read-only Slurm query is asked again after a transient error (:data:`TRANSIENT_ERRORS`) or
    no answer within its timeout: after each delay of ``delays_s`` (seconds), so at most
    ``1 + len(delays_s)`` tries. squeue(1)/sacct(1) ask tools not to hammer the controller: the delays
    grow (1, 2, 4 s)."""

    delays_s: Tuple[float, ...] = (1.0, 2.0, 4.0)
    sleep: Callable[[float], None] = time.sleep


#: The one retry policy of the Slurm queries (tests replace it with one that does not sleep).
RETRY = RetryPolicy()

#: Between fields of the squeue/sacct formats that carry free text (job names, paths may hold ``|``):
#: the ASCII unit separator, which no job name or path a shell makes holds.
FIELD_SEP = "\x1f"


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
    # what identifies the job ("" where the command did not say): ops.ownjob checks them
    user: str = ""  #: the owner's name (scontrol's ``UserId=name(uid)`` without the uid)
    name: str = ""  #: JobName
    command: str = ""  #: the batch script's path (scontrol ``Command``, squeue ``%o``)
    stdout: str = ""  #: scontrol ``StdOut``
    work_dir: str = ""  #: WorkDir (squeue ``%Z``, sacct ``WorkDir``)
    submit_time: str = ""  #: SubmitTime, ``YYYY-MM-DDTHH:MM:SS`` in the controller's local time
    cluster: str = ""  #: the cluster that answered (sacct ``Cluster``, squeue -M's ``CLUSTER:`` line)

    @property
    def paths(self) -> Tuple[str, ...]:
        """The job's paths Slurm reported (``Command``, ``StdOut``, ``WorkDir``), non-empty ones."""
        return tuple(p for p in (self.command, self.stdout, self.work_dir) if p)

    @property
    def final(self) -> bool:
        return is_final(self.state)

    @property
    def never_starts(self) -> bool:
        """Pending on a dependency that can no longer be satisfied (:data:`NEVER_SATISFIED_REASON`)."""
        return self.state == "PENDING" and self.reason == NEVER_SATISFIED_REASON


def transient(proc: subprocess.CompletedProcess[str]) -> bool:
    """True when a failed Slurm command says the controller did not answer this time (:data:`TRANSIENT_ERRORS`)."""
    text = ((proc.stderr or "") + (proc.stdout or "")).lower()
    return proc.returncode != 0 and any(s in text for s in TRANSIENT_ERRORS)


def call(
    run: Runner, argv: Sequence[str], timeout: float = 30, retry: Optional[RetryPolicy] = None
) -> Tuple[Optional[subprocess.CompletedProcess[str]], str]:
    """Run a Slurm client command, output captured as text: (result, "") or (None, why it could
    not run: not on PATH, no answer within ``timeout`` seconds, another ``OSError``).

    ``retry`` (read-only queries: :data:`RETRY`): after a transient error (:func:`transient`) or a
    timeout, ask again after each of its delays; the last answer is returned. None: one try (actions)."""
    delays = list(retry.delays_s) if retry is not None else []
    while True:
        try:
            proc = run(list(argv), capture_output=True, text=True, timeout=timeout)
        except FileNotFoundError:
            return None, f"{argv[0]} is not on PATH"
        except subprocess.TimeoutExpired:
            if not delays or retry is None:
                return None, f"{argv[0]} did not answer within {timeout:.0f} s"
        except OSError as e:
            return None, f"{argv[0]}: {e}"
        else:
            if not delays or retry is None or not transient(proc):
                return proc, ""
        retry.sleep(delays.pop(0))


def clusters_args(cluster: str) -> List[str]:
    """``--clusters=NAME`` (squeue(1), scontrol(1), sacct(1), scancel(1) ``-M``) for a job of another
    cluster; nothing for the local one (``""``)."""
    return [f"--clusters={cluster}"] if cluster else []


def _part(parts: Sequence[str], i: int) -> str:
    return _clean(parts[i]) if len(parts) > i else ""


def _split(line: str) -> List[str]:
    """The fields of one squeue/sacct line: :data:`FIELD_SEP`-separated, or ``|`` (older formats)."""
    return line.strip("\n").split(FIELD_SEP) if FIELD_SEP in line else line.strip().split("|")


#: ``scontrol show job -o`` fields, ``Key=value`` separated by spaces; a value may hold spaces (paths):
#: it runs to the next `` Key=``.
_SCONTROL_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:_]*)=")


def parse_scontrol_fields(line: str) -> Dict[str, str]:
    """One ``scontrol show job -o`` line as ``{Key: value}``; a value runs to the next `` Key=``, so
    ``Command=/runs/my run/job.sbatch`` keeps its space."""
    marks = list(_SCONTROL_FIELD.finditer(line))
    out: Dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        out.setdefault(m.group(1), line[m.end() : end].strip())
    return out


def user_name(user_id: str) -> str:
    """``root(0)`` (scontrol's ``UserId``) → ``root``; a bare name stays."""
    return user_id.split("(", 1)[0]


def local_cluster(run: Runner = subprocess.run, environ: Optional[Dict[str, str]] = None) -> str:
    """This machine's cluster: ``SLURM_CLUSTER_NAME`` inside a job, else ``ClusterName`` of the
    slurm.conf(5) the clients read (``SLURM_CONF``, default ``/etc/slurm/slurm.conf``), else of
    ``scontrol show config`` (one query; configless sites); lower case (Slurm lowercases it); ""
    where none says. Cached per ``SLURM_CONF``."""
    env = os.environ if environ is None else environ
    if env.get("SLURM_CLUSTER_NAME"):
        return env["SLURM_CLUSTER_NAME"].lower()
    conf = env.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    if conf in _CLUSTER_CACHE:
        return _CLUSTER_CACHE[conf]
    name = ""
    try:
        with open(conf, encoding="utf-8", errors="replace") as f:
            for line in f:
                m = re.match(r"\s*ClusterName\s*=\s*(\S+)", line, re.I)
                if m:
                    name = m.group(1)
    except OSError:
        pass
    if not name:
        proc, _ = call(run, ["scontrol", "show", "config"], retry=RETRY)
        if proc is not None and proc.returncode == 0:
            m = re.search(r"^ClusterName\s*=\s*(\S+)", proc.stdout or "", re.M)
            name = m.group(1) if m else ""
        if not name:
            return ""  # not cached: ask again next time
    _CLUSTER_CACHE[conf] = name.lower()
    return _CLUSTER_CACHE[conf]


_CLUSTER_CACHE: Dict[str, str] = {}


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


def scontrol_job(job_id: str, run: Runner = subprocess.run, cluster: str = "") -> Tuple[Optional[SlurmJob], str]:
    """``scontrol show job -o JOB``: (job, "") / (None, "") when Slurm does not know it /
    (None, why the question could not be asked). ``cluster``: :func:`clusters_args`."""
    proc, why = call(run, ["scontrol", *clusters_args(cluster), "show", "job", "-o", job_id], retry=RETRY)
    if proc is None:
        return None, why
    if proc.returncode != 0:
        return None, ("" if _unknown_job(proc) else f"scontrol: {last_line(proc)}")
    for line in (proc.stdout or "").splitlines():
        fields = parse_scontrol_fields(line)
        if "JobState" not in fields:
            continue
        restarts = fields.get("Restarts", "")
        return SlurmJob(
            job_id=fields.get("JobId", job_id),
            state=fields["JobState"].split()[0] if fields["JobState"] else "?",
            reason=_clean(fields.get("Reason", "")),
            restarts=int(restarts) if restarts.isdigit() else None,
            exit_code=fields.get("ExitCode", ""),
            nodes=_clean(fields.get("NodeList", "")),
            source="scontrol",
            dependency=_clean(fields.get("Dependency", "")),
            user=user_name(fields.get("UserId", "")),
            name=fields.get("JobName", ""),
            command=_clean(fields.get("Command", "")),
            stdout=_clean(fields.get("StdOut", "")),
            work_dir=_clean(fields.get("WorkDir", "")),
            submit_time=_clean(fields.get("SubmitTime", "")),
            cluster=cluster,
        ), ""
    return None, ""


#: squeue(1) ``--format``: id, state, reason, nodes, user, submit time, then the free-text fields name,
#: work dir, command (:data:`FIELD_SEP` between all of them)
SQUEUE_FORMAT = FIELD_SEP.join(["%i", "%T", "%r", "%N", "%u", "%V", "%j", "%Z", "%o"])


def parse_squeue_line(line: str, cluster: str = "") -> Optional[SlurmJob]:
    """One line of ``squeue --format=SQUEUE_FORMAT`` (or the older ``%i|%T|%r|%N``), None for another line."""
    parts = _split(line)
    if len(parts) < 2 or not parts[0] or parts[0].startswith("CLUSTER:"):
        return None
    return SlurmJob(
        job_id=parts[0].strip(),
        state=parts[1].split()[0] if parts[1].strip() else "?",
        reason=_part(parts, 2),
        nodes=_part(parts, 3),
        source="squeue",
        user=_part(parts, 4),
        submit_time=_part(parts, 5),
        name=_part(parts, 6),
        work_dir=_part(parts, 7),
        command=_part(parts, 8),
        cluster=cluster,
    )


def squeue_jobs(
    job_ids: Sequence[str], run: Runner = subprocess.run, cluster: str = "", array: bool = False
) -> Tuple[Dict[str, SlurmJob], str]:
    """``squeue`` for ``job_ids`` in every state the controller still remembers (``array``: one line
    per task of the arrays ``job_ids`` name, keyed ``ARRAYJOBID_TASKID``). ``cluster``: :func:`clusters_args`."""
    if not job_ids:
        return {}, ""
    argv = ["squeue", *clusters_args(cluster), "--noheader", *(["--array"] if array else []), "--states=all"]
    proc, why = call(run, [*argv, f"--jobs={','.join(job_ids)}", f"--format={SQUEUE_FORMAT}"], retry=RETRY)
    if proc is None:
        return {}, why
    if proc.returncode != 0:
        return {}, ("" if _unknown_job(proc) else f"squeue: {last_line(proc)}")
    out: Dict[str, SlurmJob] = {}
    for line in (proc.stdout or "").splitlines():
        job = parse_squeue_line(line, cluster)
        if job is not None and (job.job_id in job_ids if not array else "_" in job.job_id):
            out[job.job_id] = job
    return out, ""


#: sacct(1) ``--format``: the free-text fields (JobName, WorkDir) last
SACCT_FORMAT = "JobID,State,ExitCode,NodeList,User,Submit,Cluster,JobName,WorkDir"


def sacct_rows(job_ids: Sequence[str], run: Runner = subprocess.run, cluster: str = "") -> Tuple[List[SlurmJob], str]:
    """``sacct`` rows (allocations) of ``job_ids``, oldest first: accounting keeps every job that had an
    id, so after the controller's ids restarted one id can have several rows. Fails where accounting
    is off (the sandbox)."""
    if not job_ids:
        return [], ""
    proc, why = call(
        run,
        [
            "sacct",
            *clusters_args(cluster),
            "--noheader",
            "--parsable2",
            f"--delimiter={FIELD_SEP}",
            "--allocations",
            f"--jobs={','.join(job_ids)}",
            f"--format={SACCT_FORMAT}",
        ],
        retry=RETRY,
    )
    if proc is None:
        return [], why
    if proc.returncode != 0:
        return [], f"sacct: {last_line(proc)}"
    out: List[SlurmJob] = []
    for line in (proc.stdout or "").splitlines():
        parts = _split(line)
        if len(parts) >= 2 and parts[1]:
            out.append(
                SlurmJob(
                    job_id=parts[0],
                    state=parts[1].split()[0].rstrip("+"),
                    exit_code=parts[2] if len(parts) > 2 else "",
                    nodes=_part(parts, 3),
                    source="sacct",
                    user=_part(parts, 4),
                    submit_time=_part(parts, 5),
                    cluster=_part(parts, 6).lower(),
                    name=_part(parts, 7),
                    work_dir=_part(parts, 8),
                )
            )
    return out, ""


def sacct_jobs(
    job_ids: Sequence[str], run: Runner = subprocess.run, cluster: str = ""
) -> Tuple[Dict[str, SlurmJob], str]:
    """``sacct`` for jobs the controller forgot: the newest row of each id (:func:`sacct_rows`)."""
    rows, why = sacct_rows(job_ids, run, cluster)
    return {r.job_id: r for r in rows if r.job_id in job_ids}, why


@dataclass
class SlurmAnswer:
    """What Slurm said about some job ids."""

    jobs: Dict[str, SlurmJob] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  #: questions that could not be answered, and why
    controller_answered: bool = False  #: scontrol or squeue answered (a job they lack has ended)
    #: every sacct row of an id that accounting holds several of (ids restarted); ``jobs`` has the newest
    history: Dict[str, List[SlurmJob]] = field(default_factory=dict)
    cluster: str = ""  #: the ``--clusters`` value it was asked with ("": the local cluster)


def query_jobs(
    job_ids: Sequence[str], run: Runner = subprocess.run, detail: bool = False, cluster: str = ""
) -> SlurmAnswer:
    """What Slurm knows about ``job_ids``. ``detail``: ask ``scontrol`` per job first (restart
    count, exit code); then ``squeue`` for the rest, then ``sacct`` for jobs the controller forgot.
    ``cluster``: the ``--clusters`` value for jobs of another cluster (:func:`clusters_args`)."""
    ans = SlurmAnswer(cluster=cluster)
    if detail:
        for jid in job_ids:
            job, why = scontrol_job(jid, run, cluster)
            if job is not None:
                ans.jobs[jid] = job
            if why:
                ans.notes.append(why)
            else:
                ans.controller_answered = True
    missing = [j for j in job_ids if j not in ans.jobs]
    if missing:
        jobs, why = squeue_jobs(missing, run, cluster)
        ans.jobs.update(jobs)
        if why:
            ans.notes.append(why)
        else:
            ans.controller_answered = True
    missing = [j for j in job_ids if j not in ans.jobs]
    if missing:
        rows, why = sacct_rows(missing, run, cluster)
        for r in rows:
            if r.job_id in missing:
                ans.jobs[r.job_id] = r
                ans.history.setdefault(r.job_id, []).append(r)
        if why:
            ans.notes.append(why)
    return ans


def find_jobs(
    user: str, job_name: str, run: Runner = subprocess.run, cluster: str = ""
) -> Tuple[Optional[List[SlurmJob]], str]:
    """The jobs of ``user`` named ``job_name`` that the controller holds (``squeue --user --name``, every
    state): where ``submit`` looks for the job an sbatch whose answer was lost may have made. (None,
    why) when the controller could not be asked."""
    argv = ["squeue", *clusters_args(cluster), "--noheader", "--states=all", f"--user={user}", f"--name={job_name}"]
    proc, why = call(run, [*argv, f"--format={SQUEUE_FORMAT}"], retry=RETRY)
    if proc is None:
        return None, why
    if proc.returncode != 0:
        return None, f"squeue: {last_line(proc)}"
    jobs = [j for j in (parse_squeue_line(ln, cluster) for ln in (proc.stdout or "").splitlines()) if j is not None]
    return jobs, ""
