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
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..rundir.local_end import PREEMPTED_STATE

Runner = Callable[..., "subprocess.CompletedProcess[str]"]

#: ``Start`` of a row whose job never ran (22.05 writes ``None``, or the cancel time; ``Unknown`` is a pending job's)
NOT_STARTED = ("None", "Unknown", "")
#: ``NodeList`` of a row whose job never ran
NO_NODES = "None assigned"

#: the ``--format`` fields, in this order
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
    """Rows of ``sacct -X -D -P -n --format=<SACCT_FIELDS>`` output, in its order (the order
    accounting recorded them: job ids interleave); each job id's rows are numbered 0, 1, ... (its
    restarts). Lines with the wrong field count are skipped."""
    rows: List[AccountingRow] = []
    seen: Dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            continue
        f = dict(zip(SACCT_FIELDS, parts))
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
            )
        )
    return rows


def sacct_command(job_ids: Sequence[str]) -> List[str]:
    """The ``sacct`` argv for ``job_ids`` (every run of each, allocations only, parsable)."""
    return [
        "sacct",
        "-X",
        "-D",
        "-P",
        "-n",
        "--format=" + ",".join(SACCT_FIELDS),
        "-j",
        ",".join(job_ids),
    ]


def history(job_ids: Sequence[str], run_cmd: Runner = subprocess.run) -> Accounting:
    """The accounting rows of ``job_ids`` (a run's Slurm jobs), or why there are none."""
    if not job_ids:
        return Accounting([], "no Slurm job recorded for this run")
    if run_cmd is subprocess.run and shutil.which("sacct") is None:
        return Accounting([], "sacct is not on PATH")
    try:
        proc = run_cmd(sacct_command(job_ids), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Accounting([], f"sacct did not answer ({e})")
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout or "").strip().splitlines()
        return Accounting([], f"sacct failed: {msg[-1] if msg else f'exit {proc.returncode}'}")
    return Accounting(parse_sacct(proc.stdout))


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
    "history",
    "parse_sacct",
    "reason",
    "sacct_command",
]
