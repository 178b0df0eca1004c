"""An out-of-memory kill, recognised in what Slurm wrote and said: which rank and node, the memory
the job had per node, and the key to raise.

Pure parsing of text and records (the job supervisor's requeue decision reads the logs and calls these;
``slurm-ddp status`` reads the end record). Imports no torch. The evidence, in Slurm's own words
(Slurm 22.05's source; seen on the sandbox's production profile, shared/SLURM-FACTS.md):

- srun, in the batch log, once per step: ``srun: error: n2: task 1: Out Of Memory`` (src/srun's
  ``_task_finish``: ``"%s: %s %s: Out Of Memory"``, hosts, ``task``/``tasks``, the task list);
- slurmstepd, in the killed task's stderr (its rank log) or the batch log for the batch step:
  ``slurmstepd-n2: error: Detected 1 oom-kill event(s) in StepId=59.0. Some of your processes may
  have been killed by the cgroup out-of-memory handler.`` (task/cgroup's memory plugin; older
  releases: ``in step 59.0 cgroup``; Slurm 24.11 and 26.05, seen in .ci/other-debian's chroots:
  ``Detected 1 oom_kill event in StepId=2.0. Some of the step tasks have been OOM Killed.``, which 26.05
  prefixes with a timestamp, ``[2026-12-02T02:16:24.051] error: …``, instead of ``slurmstepd-NODE:``);
- the job's or step's state ``OUT_OF_MEMORY`` (scontrol, sacct; squeue(1) "JOB STATE CODES").

Under ``slurm.launcher: srun`` a task is a rank (``SLURM_PROCID``); under ``torchrun`` a task is one
node's torchrun, holding that node's ranks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..env import expand_nodelist
from ..errors import UserError

#: the key that sets the job's memory (GB per node)
MEM_KEY = "slurm.mem_gb"
#: Slurm's state of a job or step ended by an OOM kill
OOM_STATE = "OUT_OF_MEMORY"

_SRUN_OOM = re.compile(r"srun: error: (?P<hosts>\S+): tasks? (?P<tasks>[\d\[\],-]+): Out Of Memory")
_STEPD_OOM = re.compile(
    r"(?:slurmstepd(?:-(?P<node>[\w.-]+))?:|\[[\d:.T-]+\]) error: Detected (?P<count>\d+) oom[-_]kill events?(?:\(s\))? in "
    r"(?:StepId=|step )(?P<step>\d+(?:_\d+)?\.\w+)"
)


@dataclass(frozen=True)
class OomKill:
    """What the logs say of one start's OOM kills. ``tasks``/``hosts``: srun's (task ids, the nodes
    they ran on, in srun's order); ``events``: slurmstepd's oom-kill events counted, ``steps`` the
    steps they were in (``59.0``, ``59.batch``), ``event_nodes`` the nodes its lines name; ``ranks``:
    the ranks whose own log holds an event line."""

    tasks: Tuple[int, ...] = ()
    hosts: Tuple[str, ...] = ()
    events: int = 0
    steps: Tuple[str, ...] = ()
    event_nodes: Tuple[str, ...] = ()
    ranks: Tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.tasks or self.events)

    def to_record(self, mem_per_node_mb: Optional[float], launcher: str = "srun") -> Dict[str, Any]:
        """The ``oom`` field of an end record (``rundir.record_end``): this, the job's memory per node
        (MB, None when unknown) and ``slurm.launcher`` (what a task is)."""
        return {
            "tasks": list(self.tasks),
            "hosts": list(self.hosts),
            "events": self.events,
            "steps": list(self.steps),
            "event_nodes": list(self.event_nodes),
            "ranks": list(self.ranks),
            "mem_per_node_mb": mem_per_node_mb,
            "launcher": launcher,
        }

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> OomKill:
        return cls(
            tasks=tuple(int(t) for t in rec.get("tasks") or ()),
            hosts=tuple(str(h) for h in rec.get("hosts") or ()),
            events=int(rec.get("events") or 0),
            steps=tuple(str(s) for s in rec.get("steps") or ()),
            event_nodes=tuple(str(n) for n in rec.get("event_nodes") or ()),
            ranks=tuple(int(r) for r in rec.get("ranks") or ()),
        )


def task_ids(text: str) -> List[int]:
    """srun's task list (``1``, ``0-3``, ``0,2-3``, ``[0-1]``) as ids, in order."""
    out: List[int] = []
    for part in text.strip("[]").split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def find_oom(batch_log: str, rank_logs: Optional[Mapping[int, str]] = None, job_id: str = "") -> OomKill:
    """The OOM evidence in ``batch_log`` (srun's and the batch step's slurmstepd lines) and in
    ``rank_logs`` (rank → its log text: slurmstepd's lines in the killed task's stderr). With
    ``job_id``, slurmstepd's lines of other jobs' steps (an appended log's earlier jobs) are left out.
    An empty :class:`OomKill` (false) when there is none."""
    tasks: List[int] = []
    hosts: List[str] = []
    for m in _SRUN_OOM.finditer(batch_log):
        ids = task_ids(m.group("tasks"))
        try:
            names = expand_nodelist(m.group("hosts"))
        except (UserError, ValueError):  # srun's own text; a name it cannot expand is kept as it is
            names = [m.group("hosts")]
        tasks += [t for t in ids if t not in tasks]
        hosts += [h for h in names if h not in hosts]
    events, steps, nodes, ranks = 0, [], [], []
    for rank, text in [(None, batch_log), *sorted((rank_logs or {}).items())]:
        for m in _STEPD_OOM.finditer(text):
            if job_id and m.group("step").split(".")[0] != job_id:
                continue
            events += int(m.group("count"))
            steps += [m.group("step")] if m.group("step") not in steps else []
            node = m.group("node")
            nodes += [node] if node and node not in nodes else []
            ranks += [rank] if rank is not None and rank not in ranks else []
    return OomKill(tuple(tasks), tuple(hosts), events, tuple(steps), tuple(nodes), tuple(ranks))


def this_start(batch_log: str, job_id: str) -> str:
    """The part of an appended batch log (``--open-mode=append``: every start of the job writes to
    it) that the latest start of ``job_id`` wrote: from the last line the batch script logs at its
    start (``slurm_ddp[batch JOB]: host ...``)."""
    mark = f"slurm_ddp[batch {job_id}]: host "
    at = batch_log.rfind(mark)
    return batch_log if at < 0 else batch_log[batch_log.rfind("\n", 0, at) + 1 :]


def mem_per_node_mb(environ: Mapping[str, str]) -> Optional[float]:
    """The memory the job has on this node, in MB, from its batch environment (sbatch(1) "OUTPUT
    ENVIRONMENT VARIABLES": ``SLURM_MEM_PER_NODE``, else ``SLURM_MEM_PER_CPU`` × ``SLURM_CPUS_ON_NODE``;
    Slurm sets ``SLURM_MEM_PER_CPU`` for a site's ``DefMemPerCPU`` too); None when neither says."""
    node = environ.get("SLURM_MEM_PER_NODE", "")
    if node.isdigit() and int(node) > 0:
        return float(node)
    cpu, cpus = environ.get("SLURM_MEM_PER_CPU", ""), environ.get("SLURM_CPUS_ON_NODE", "")
    if cpu.isdigit() and cpus.isdigit() and int(cpu) > 0:
        return float(int(cpu) * int(cpus))
    return None


def describe_oom(
    oom: OomKill,
    *,
    mem_per_node_mb: Optional[float],
    launcher: str = "srun",
    slurm_state: str = "",
) -> str:
    """One line: who was killed for memory, where, what the job had per node, and the key to raise.
    ``launcher``: ``slurm.launcher`` (under torchrun a task is a node's torchrun); ``slurm_state``:
    Slurm's word when it said ``OUT_OF_MEMORY`` (evidence with or without the log lines)."""
    who: List[str] = []
    unit = "rank" if launcher == "srun" else "torchrun task (a node's ranks)"
    if oom.tasks:
        ids = ", ".join(str(t) for t in oom.tasks)
        on = f" on {', '.join(oom.hosts)}" if oom.hosts else ""
        who.append(f"{unit}{'s' if len(oom.tasks) > 1 and launcher == 'srun' else ''} {ids}{on}")
    elif oom.ranks:
        on = f" on {', '.join(oom.event_nodes)}" if oom.event_nodes else ""
        who.append(f"rank{'s' if len(oom.ranks) > 1 else ''} {', '.join(str(r) for r in oom.ranks)}{on}")
    elif oom.event_nodes:
        who.append(f"a process on {', '.join(oom.event_nodes)}")
    evidence = []
    if oom.tasks:
        evidence.append("srun: Out Of Memory")
    if oom.events:
        evidence.append(f"{oom.events} oom-kill event(s) in step {', '.join(oom.steps) or '?'}")
    if slurm_state == OOM_STATE:
        evidence.append(f"Slurm's state {OOM_STATE}")
    mem = f"{mem_per_node_mb:.0f} MB per node" if mem_per_node_mb else "unknown memory per node"
    killed = f"the memory cgroup killed {who[0]}" if who else "a process was killed for memory"
    return f"out of memory: {killed} ({'; '.join(evidence) or 'no detail'}); the job had {mem}; raise {MEM_KEY}"


def oom_of_ends(ends: Sequence[Mapping[str, Any]], job_id: str) -> Optional[Mapping[str, Any]]:
    """The ``oom`` field of the latest end record of ``job_id`` (``rundir.read_ends``), when that start
    ended by an OOM kill; else None."""
    for rec in reversed(ends):
        if str(rec.get("job_id")) == str(job_id):
            oom = rec.get("oom")
            return oom if isinstance(oom, Mapping) else None
    return None


def oom_note(ends: Sequence[Mapping[str, Any]], job_id: str, slurm_state: str = "") -> Optional[str]:
    """``status``'s line for job ``job_id``: :func:`describe_oom` of its latest end record's ``oom``
    (the supervisor's evidence) and of Slurm's state (``OUT_OF_MEMORY`` alone is evidence too); None
    when neither says the job ran out of memory."""
    rec = oom_of_ends(ends, job_id)
    if rec is None and slurm_state != OOM_STATE:
        return None
    oom = OomKill.from_record(rec) if rec is not None else OomKill()
    mem = rec.get("mem_per_node_mb") if rec is not None else None
    launcher = str(rec.get("launcher") or "srun") if rec is not None else "srun"
    return describe_oom(
        oom, mem_per_node_mb=mem if isinstance(mem, (int, float)) else None, launcher=launcher, slurm_state=slurm_state
    )


__all__ = [
    "MEM_KEY",
    "OOM_STATE",
    "OomKill",
    "describe_oom",
    "find_oom",
    "mem_per_node_mb",
    "oom_of_ends",
    "oom_note",
    "task_ids",
    "this_start",
]
