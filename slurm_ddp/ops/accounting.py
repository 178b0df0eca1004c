"""A run's Slurm history from accounting (``sacct``): one row per start, and what it cost.

Side effects: runs ``sacct`` (injectable). Imports no torch.

``sacct -X -D -P -n --format=...`` (sacct(1): ``-X`` allocations only, ``-D``/``--duplicates`` every
run of a requeued job, not only the last; ``-P`` ``|``-separated) gives one row per start of each
job id: a job requeued twice has three rows, the earlier ones in state ``REQUEUED`` (requeued by
``scontrol requeue``, which the batch script runs after the time-limit signal), ``PREEMPTED``
(Slurm's preemption requeued it) or ``NODE_FAIL`` (Slurm requeued it after a node loss), the last one ``COMPLETED`` / ``TIMEOUT`` / ``FAILED`` /
``NODE_FAIL`` / ``CANCELLED`` / ``RUNNING``. Rows of different job ids interleave (sacct lists
them as accounting recorded them: a requeued job's second start comes after a later job's first);
a job cancelled before it ever started has one row with ``NodeList`` ``None assigned`` and ``Start``
``None`` or the cancel time (real Slurm 22.05 output: tests/unit/data/sacct_22.05*.txt). Without accounting
(``AccountingStorageType`` unset) ``sacct`` fails ("accounting storage is disabled"): :func:`history`
then says so in one sentence.

A job id alone does not name a job (a second cluster sharing ``$HOME``, the controller's ids restarted):
:func:`history` asks on each job's recorded cluster (``ops.ownjob.query_cluster``: ``--clusters`` where
it is not this machine's), through the read-only queries' retry policy (``ops.slurm.RETRY``), and drops
the rows whose ``User``/``JobName``/``WorkDir``/``Cluster`` show another job than the run's
(``ops.ownjob.check``): a reused id's rows of another job are not the run's starts nor its cost.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..rundir import JobIdentity
from ..rundir.local_end import PREEMPTED_STATE
from . import slurm as ops_slurm

Runner = Callable[..., "subprocess.CompletedProcess[str]"]

#: ``Start`` of a row whose job never ran (22.05 writes ``None``, or the cancel time; ``Unknown`` is a pending job's)
NOT_STARTED = ("None", "Unknown", "")
#: ``NodeList`` of a row whose job never ran
NO_NODES = "None assigned"

#: the ``--format`` fields of the cost and the end state, in this order (the real captures,
#: tests/unit/data/sacct_22.05*.txt, hold these alone, ``|``-separated)
SACCT_FIELDS = (
    "JobID",  # not JobIDRaw: an array task is "123_4" (the id its run recorded), its raw id another number
    "State",
    "Start",
    "End",
    "ElapsedRaw",
    "ExitCode",
    "NodeList",
    "NNodes",
    "AllocCPUS",
    "AllocTRES",
)
#: then what identifies the job (``ops.ownjob.check``); the free-text fields last, and the fields
#: separated by ``ops.slurm.FIELD_SEP`` (a job name or path may hold ``|``)
IDENTITY_FIELDS = ("User", "Cluster", "JobName", "WorkDir")

#: why a start ended, by sacct state (the first word: ``CANCELLED by 0`` is ``CANCELLED``)
STATE_REASONS = {
    "COMPLETED": "completed",
    PREEMPTED_STATE: "preempted",
    "REQUEUED": "requeued",
    "TIMEOUT": "time limit",
    "NODE_FAIL": "node failure",
    "FAILED": "failed",
    "OUT_OF_MEMORY": "failed (out of memory)",
    "CANCELLED": "cancelled",
    "BOOT_FAIL": "failed (boot)",
    "DEADLINE": "deadline",
    "RUNNING": "running",
    "PENDING": "pending",
    "REQUEUE_HOLD": "requeued, held",
}


@dataclass(frozen=True)
class AccountingRow:
    """One start of a job, as accounting recorded it."""

    job_id: str  #: sacct's ``JobID``: ``123``, or ``123_4`` for an array task (as the run recorded it)
    restart: int  #: 0 for the first start of the job id, then 1, 2, ... (sacct's order)
    state: str  #: sacct's state, first word (``COMPLETED``, ``PREEMPTED``, ``REQUEUED``, ``TIMEOUT``, ...)
    start: str  #: ISO time (local), ``None`` when it never started (sacct 22.05), ``Unknown`` while pending
    end: str
    elapsed_s: int
    exit_code: str  #: ``status:signal``
    nodes: str  #: hostlist
    nnodes: int
    cpus: int
    gpus: int  #: ``gres/gpu=N`` of AllocTRES (0 when none)
    user: str = ""  #: sacct's ``User``, ``JobName``, ``WorkDir``, ``Cluster`` ("" in the old format)
    job_name: str = ""
    work_dir: str = ""
    cluster: str = ""

    @property
    def started(self) -> bool:
        """False for a row of a job that never ran (cancelled while pending, or pending): not a start.
        Its ``NodeList`` says so; its ``Start`` is ``None`` or, as often, the time it was cancelled."""
        return self.start not in NOT_STARTED and self.nodes != NO_NODES

    @property
    def node_hours(self) -> float:
        return self.nnodes * self.elapsed_s / 3600.0

    @property
    def cpu_hours(self) -> float:
        return self.cpus * self.elapsed_s / 3600.0

    @property
    def gpu_hours(self) -> float:
        return self.gpus * self.elapsed_s / 3600.0

    def to_dict(self) -> Dict[str, Any]:
        return {
            "job_id": self.job_id,
            "restart": self.restart,
            "state": self.state,
            "started": self.started,
            "start": self.start,
            "end": self.end,
            "elapsed_s": self.elapsed_s,
            "exit_code": self.exit_code,
            "nodes": self.nodes,
            "node_hours": self.node_hours,
            "cpu_hours": self.cpu_hours,
            "gpu_hours": self.gpu_hours,
        }


@dataclass(frozen=True)
class Accounting:
    """A run's history: ``rows`` (oldest first) when accounting answered, else ``unavailable`` (why)."""

    rows: List[AccountingRow]
    unavailable: Optional[str] = None
    #: one sentence per job id whose rows of another job were left out (``job 59 on cluster 'a' ...``)
    excluded: List[str] = field(default_factory=list)

    @property
    def starts(self) -> int:
        """How many times the jobs started (rows of jobs cancelled before they ran do not count)."""
        return sum(1 for r in self.rows if r.started)

    @property
    def node_hours(self) -> float:
        return sum(r.node_hours for r in self.rows)

    @property
    def cpu_hours(self) -> float:
        return sum(r.cpu_hours for r in self.rows)

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours for r in self.rows)

    def to_dict(self) -> Dict[str, Any]:
        return {
            "rows": [r.to_dict() for r in self.rows],
            "unavailable": self.unavailable,
            "excluded": self.excluded,
            "starts": self.starts,
            "node_hours": self.node_hours,
            "cpu_hours": self.cpu_hours,
            "gpu_hours": self.gpu_hours,
        }


def _int(text: str) -> int:
    m = re.match(r"\s*(\d+)", text or "")
    return int(m.group(1)) if m else 0


def _tres_gpus(tres: str) -> int:
    m = re.search(r"(?:^|,)gres/gpu=(\d+)", tres or "")
    return int(m.group(1)) if m else 0


def parse_sacct(text: str) -> List[AccountingRow]:
    """Rows of :func:`sacct_command`'s output (``SACCT_FIELDS`` then ``IDENTITY_FIELDS``, separated by
    ``ops.slurm.FIELD_SEP``) or of the older ``sacct -X -D -P -n --format=<SACCT_FIELDS>`` (``|``, no
    identity: its fields ``""``), in its order (the order accounting recorded them: job ids interleave);
    each job id's rows are numbered 0, 1, ... (its restarts). Lines with another field count are skipped."""
    rows: List[AccountingRow] = []
    seen: Dict[str, int] = {}
    every = SACCT_FIELDS + IDENTITY_FIELDS
    for line in text.splitlines():
        parts = line.split(ops_slurm.FIELD_SEP) if ops_slurm.FIELD_SEP in line else line.split("|")
        if len(parts) not in (len(SACCT_FIELDS), len(every)):
            continue
        f = dict(zip(every, parts))
        job = f["JobID"].strip()
        if not job or "." in job:
            continue  # a step (not with -X, but be safe)
        restart = seen.get(job, 0)
        seen[job] = restart + 1
        rows.append(
            AccountingRow(
                job_id=job,
                restart=restart,
                state=(f["State"].split() or ["?"])[0],
                start=f["Start"],
                end=f["End"],
                elapsed_s=_int(f["ElapsedRaw"]),
                exit_code=f["ExitCode"],
                nodes=f["NodeList"],
                nnodes=_int(f["NNodes"]),
                cpus=_int(f["AllocCPUS"]),
                gpus=_tres_gpus(f["AllocTRES"]),
                user=f.get("User", "").strip(),
                job_name=f.get("JobName", ""),
                work_dir=f.get("WorkDir", ""),
                cluster=f.get("Cluster", "").strip().lower(),
            )
        )
    return rows


def sacct_command(job_ids: Sequence[str], cluster: str = "", identity: bool = True) -> List[str]:
    """The ``sacct`` argv for ``job_ids`` (every run of each, allocations only, parsable): on ``cluster``
    (``--clusters``; "" this machine's); ``identity``: with ``IDENTITY_FIELDS``, ``FIELD_SEP``-separated
    (False: the older command of the real captures)."""
    fields = SACCT_FIELDS + (IDENTITY_FIELDS if identity else ())
    sep = [f"--delimiter={ops_slurm.FIELD_SEP}"] if identity else []
    return [
        "sacct",
        *ops_slurm.clusters_args(cluster),
        "-X",
        "-D",
        "-P",
        *sep,
        "-n",
        "--format=" + ",".join(fields),
        "-j",
        ",".join(job_ids),
    ]


def _as_job(row: AccountingRow) -> ops_slurm.SlurmJob:
    return ops_slurm.SlurmJob(
        job_id=row.job_id,
        state=row.state,
        source="sacct",
        user=row.user,
        name=row.job_name,
        work_dir=row.work_dir,
        cluster=row.cluster,
    )


def history(
    job_ids: Sequence[str],
    run_cmd: Runner = subprocess.run,
    identities: Optional[Mapping[str, JobIdentity]] = None,
    here: Optional[str] = None,
) -> Accounting:
    """The accounting rows of ``job_ids`` (a run's Slurm jobs), or why there are none.

    ``identities``: job id -> what the run recorded of that job (``ops.ownjob.job_identities``): each id
    is asked on its cluster (``ops.ownjob.query_cluster``, ``here`` this machine's cluster, default
    ``ops.slurm.local_cluster()``), one ``sacct`` per cluster through ``ops.slurm.RETRY``, and a row
    that ``ops.ownjob.check`` finds to be another job's is left out (``Accounting.excluded`` says so);
    an id without one is asked on this machine's cluster and kept as it is."""
    from .ownjob import check, query_cluster

    if not job_ids:
        return Accounting([], "no Slurm job recorded for this run")
    idents = dict(identities or {})
    groups: Dict[str, List[str]] = {}
    for jid in job_ids:
        ident = idents.get(jid)
        ids = groups.setdefault(query_cluster(ident, here) if ident is not None else "", [])
        if jid not in ids:
            ids.append(jid)
    rows: List[AccountingRow] = []
    excluded: List[str] = []
    for cluster, ids in groups.items():
        proc, why = ops_slurm.call(run_cmd, sacct_command(ids, cluster), retry=ops_slurm.RETRY)
        if proc is None:
            return Accounting([], why)  # not on PATH, no answer within the timeout
        if proc.returncode != 0:
            return Accounting([], f"sacct failed: {ops_slurm.last_line(proc) or f'exit {proc.returncode}'}")
        for row in parse_sacct(proc.stdout or ""):
            ident = idents.get(row.job_id)
            verdict = check(ident, _as_job(row)) if ident is not None else None
            if verdict is not None and verdict.ours is False:
                where = f" on cluster {row.cluster or cluster!r}" if (row.cluster or cluster) else ""
                line = f"job {row.job_id}{where}: rows of another job left out ({verdict.why})"
                if line not in excluded:
                    excluded.append(line)
                continue
            rows.append(row)
    return Accounting(_renumbered(rows) if excluded else rows, excluded=excluded)


def _renumbered(rows: List[AccountingRow]) -> List[AccountingRow]:
    """``rows`` with each id's restarts numbered 0, 1, ... again (after another job's rows were left out)."""
    seen: Dict[str, int] = {}
    out = []
    for r in rows:
        out.append(replace(r, restart=seen.get(r.job_id, 0)))
        seen[r.job_id] = seen.get(r.job_id, 0) + 1
    return out


def reason(row: AccountingRow, stop_signal: Optional[str], requeue_signal: str) -> str:
    """Why a start ended, telling a time-limit stop from a preemption from a failure.

    ``stop_signal``: the signal the ranks stopped on in that start (the run's ``preempted``
    metrics event), if they did; ``requeue_signal``: the job's time-limit signal (``USR2``). A
    ``REQUEUED`` start that stopped on the time-limit signal is a time-limit stop (the batch script
    requeued it); on SIGTERM, or with no signal, a requeue from outside (``scontrol requeue``,
    preemption)."""
    base = STATE_REASONS.get(row.state, row.state.lower())
    if not row.started and row.state not in ("PENDING", "REQUEUE_HOLD"):
        return f"{base} before it started"  # e.g. cancelled while pending
    if row.state == "REQUEUED":
        if stop_signal and stop_signal.upper().removeprefix("SIG") == requeue_signal.upper().removeprefix("SIG"):
            return "time limit (checkpointed, requeued itself)"
        return "requeued (preemption or scontrol requeue)"
    if row.state == PREEMPTED_STATE:
        return "preempted (requeued by Slurm)"
    return base


__all__ = [
    "SACCT_FIELDS",
    "STATE_REASONS",
    "Accounting",
    "AccountingRow",
    "IDENTITY_FIELDS",
    "history",
    "parse_sacct",
    "reason",
    "sacct_command",
]
