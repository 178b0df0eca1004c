"""In-job recovery from a lost or hung node (config section ``recovery``): THE rule that decides, after
a training step of a ``--no-kill`` job ended badly, whether the batch script starts the next step inside
the same allocation, on which nodes, or falls back to a requeue (:func:`decide_recovery`, pure); the
evidence it reads (:func:`gather_evidence`: the step's hang reports, the peer-lost marker the worker
writes, a short probe step per node); and the batch shell's entry points (``python -m slurm_ddp.rundir
recovery-start`` / ``recovery-decision``, :func:`main_start` / :func:`main_decision`). Part of
:mod:`slurm_ddp.rundir`.

Why our own evidence: Slurm marks a silent node DOWN only after ``SlurmdTimeout`` (300 s by default),
and a step whose node vanished runs on until then (SLURM-FACTS.md, "A node lost inside a --no-kill
job"). The ranks notice at once (a collective fails when a peer's socket closes, or times out after
``train.pg_timeout_s``), the watchdog names a hung rank's node, and a probe step ``srun -w NODE true``
that fails or does not finish within seconds names a node that cannot run tasks.

Side effects: :func:`gather_evidence` runs ``srun``/``scontrol`` (through an injected runner) and reads
the run directory; :func:`main_decision` appends to ``recoveries.jsonl``, may shrink the job
(``scontrol update JobId= NodeList=``) and, before an in-job restart, sets the step's hang reports aside
(``hangs/JOBID.RESTART.step-K``). Imports no torch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, NoReturn, Optional, Sequence, Tuple

from .files import RECOVERIES_NAME as RECOVERIES_NAME
from .files import PathLike, append_jsonl, is_finished, read_jsonl, read_metrics, read_preempted, read_recoveries
from .hangs import Hang, read_hang_reports, set_aside_hang_reports, summarize_hang

#: The actions of a :class:`RecoveryDecision`.
RESTART, REQUEUE, NONE = "restart", "requeue", "none"
#: The action of a ``recoveries.jsonl`` record that in-process recovery (``slurm_ddp.worker.inprocess``) wrote:
#: the survivors went on in the same step, with a spare or alone.
IN_PROCESS = "in_process"

#: Seconds a probe step (``srun -w NODE true``) may take before its node counts as bad.
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class RecoveryDecision:
    """What the batch script does after a training step ended badly."""

    action: str  #: ``restart``: next step on ``nodes``; ``requeue``: requeue without ``bad``; ``none``: the requeue rule decides
    nodes: Tuple[str, ...]  #: the next step's nodes, batch host first (``restart`` only)
    bad: Tuple[str, ...]  #: the nodes taken for lost or hung
    reason: str  #: one log line saying why

    def line(self) -> str:
        """``ACTION NODES BAD`` for the batch shell: comma lists, ``-`` for none (checked, never eval'ed)."""
        return f"{self.action} {','.join(self.nodes) or '-'} {','.join(self.bad) or '-'}"


@dataclass(frozen=True)
class Evidence:
    """What is known about the nodes after a step ended (:func:`gather_evidence`)."""

    probe_failed: Tuple[str, ...] = ()  #: nodes whose probe step failed or timed out
    hang: Optional[Hang] = None  #: the step's hang, from its watchdogs' reports
    peer_lost: bool = False  #: a rank saw a peer vanish (the worker's peer-lost marker)
    #: the marker's first record (``rank``, ``host``, ``step``: the last completed step, ``time``), when readable
    peer_lost_record: Optional[Dict[str, Any]] = None
    notes: Tuple[str, ...] = field(default=())  #: what was looked at, for the log line

    @property
    def bad(self) -> Tuple[str, ...]:
        """The nodes the evidence points at: failed probes, then a hang's one node."""
        out = list(self.probe_failed)
        if self.hang is not None and self.hang.exclude and self.hang.exclude not in out:
            out.append(self.hang.exclude)
        return tuple(out)


def decide_recovery(
    *,
    exit_code: int,
    finished: bool,
    stopped: bool,
    batch_host: str,
    step_nodes: Sequence[str],
    job_nodes: Sequence[str],
    bad: Sequence[str],
    nodes_wanted: int,
    min_nodes: int,
    restarts_done: int,
    max_restarts: int,
    restart_count: int,
    max_requeues: int,
    can_requeue: bool,
) -> RecoveryDecision:
    """THE in-job recovery rule. Pure.

    ``exit_code``: srun's status for the step that ended; ``finished``: the run wrote ``FINISHED``;
    ``stopped``: the step was told to stop (SIGTERM, the time-limit signal, a preemption marker of this
    job): then the requeue rule (:func:`slurm_ddp.rundir.decide_requeue`) decides, not this one.
    ``step_nodes``: the nodes the step ran on; ``job_nodes``: the nodes the allocation holds now (the
    step's plus idle spares); ``bad``: the nodes the evidence names (:class:`Evidence`);
    ``nodes_wanted``: ``slurm.nodes``; ``min_nodes``: the fewest nodes a step may run on
    (``recovery.min_nodes``); ``restarts_done``/``max_restarts``: in-job restarts so far in this job
    start and ``recovery.max_restarts``; ``restart_count``/``max_requeues``/``can_requeue`` as for the
    requeue rule.

    - a step that ended with status 0, a finished run or a stop → ``none``;
    - no node named bad → ``none``: a crash on healthy nodes, which the requeue rule does not requeue;
    - the batch host is bad (its ranks hung; the shell lives on) → ``requeue`` without it;
    - ``max_restarts`` reached → ``requeue`` without the bad nodes;
    - else the healthy nodes of the step, then spares, up to ``nodes_wanted``: ``restart`` when at least
      ``min_nodes`` are left, else ``requeue``.

    ``requeue`` becomes ``none`` (the job ends with the step's status) when it cannot requeue: no
    ``scontrol`` or ``max_requeues`` reached.
    """
    bad_t = tuple(dict.fromkeys(bad))
    if exit_code == 0 or finished or stopped:
        why = "the run finished" if finished else ("the step was told to stop" if stopped else "status 0")
        return RecoveryDecision(NONE, (), (), f"in-job recovery: nothing to recover ({why})")
    if not bad_t:
        return RecoveryDecision(
            NONE,
            (),
            (),
            f"in-job recovery: the step failed (status {exit_code}) but no node was found lost or hung "
            "(every probe passed, no hang report): a crash, not a node",
        )
    lost = ", ".join(bad_t)

    def requeue(why: str) -> RecoveryDecision:
        if not can_requeue:
            return RecoveryDecision(NONE, (), bad_t, f"in-job recovery: node {lost} bad; {why}; scontrol is missing")
        if restart_count >= max_requeues:
            return RecoveryDecision(
                NONE,
                (),
                bad_t,
                f"in-job recovery: node {lost} bad; {why}; max_requeues={max_requeues} reached: not requeueing",
            )
        return RecoveryDecision(
            REQUEUE,
            (),
            bad_t,
            f"in-job recovery: node {lost} bad; {why}; requeueing without it "
            f"(restart {restart_count + 1} of at most {max_requeues})",
        )

    if batch_host in bad_t:
        return requeue(f"it is the batch host ({batch_host}), where this script and rank 0 run")
    if restarts_done >= max_restarts:
        return requeue(f"recovery.max_restarts={max_restarts} in-job restarts done")
    healthy = [n for n in step_nodes if n not in bad_t]
    spares = [n for n in job_nodes if n not in bad_t and n not in step_nodes]
    if batch_host in healthy:  # rank 0 and MASTER_ADDR stay on the batch host
        healthy.remove(batch_host)
    nodes = [batch_host, *healthy, *spares][:nodes_wanted]
    if len(nodes) < min_nodes:
        return requeue(f"{len(nodes)} healthy node(s) left, fewer than recovery.min_nodes={min_nodes} (no spare left)")
    with_spare = [n for n in nodes if n in spares]
    how = f"with spare {', '.join(with_spare)}" if with_spare else f"on the {len(nodes)} survivor(s)"
    return RecoveryDecision(
        RESTART,
        tuple(nodes),
        bad_t,
        f"in-job recovery: node {lost} lost or hung (step status {exit_code}); restart {restarts_done + 1} of at "
        f"most {max_restarts} in this job, {how}: {','.join(nodes)}",
    )


# --------------------------------------------------------------------------- evidence (edge)
Runner = Callable[..., Any]


def job_nodes(job_id: str, run: Runner = subprocess.run) -> List[str]:
    """The nodes job ``job_id`` holds now (``scontrol show job``'s ``NodeList``, expanded by ``scontrol
    show hostnames``); ``SLURM_JOB_NODELIST`` is stale once a node is lost or given back. Empty when
    ``scontrol`` fails."""
    out = run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30, check=False)
    nodelist = ""
    for word in str(getattr(out, "stdout", "") or "").split():
        if word.startswith("NodeList="):
            nodelist = word.split("=", 1)[1]
    if not nodelist or nodelist == "(null)":
        return []
    names = run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=False)
    return str(getattr(names, "stdout", "") or "").split()


def probe_nodes(
    nodes: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S, popen: Callable[..., Any] = subprocess.Popen
) -> List[str]:
    """The nodes of ``nodes`` that cannot run a task now: a one-task step ``srun -w NODE true`` (inside
    this job; ``--overlap``: a step that still holds the node's CPUs does not delay it) that fails or
    does not finish within ``timeout_s`` seconds. All probes run at once."""
    procs = {}
    for n in nodes:
        procs[n] = popen(
            [
                "srun",
                "--overlap",
                "--quiet",
                "-N1",
                "-n1",
                "--cpus-per-task=1",
                f"--nodelist={n}",
                "--time=1",
                "--kill-on-bad-exit=1",
                "true",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    deadline = time.monotonic() + timeout_s
    bad = []
    for n, p in procs.items():
        try:
            rc = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            rc = None
        if rc != 0:
            bad.append(n)
    return bad


def find_step_hang(run_dir: PathLike, job_id: str, restart: int, since: float) -> Optional[Hang]:
    """The hang of the step that started at ``since`` (``time.time()``), from the hang reports of job
    ``job_id`` at ``restart`` written since then (an earlier step of the same job start wrote its own)."""
    return summarize_hang([r for r in read_hang_reports(run_dir, job_id, restart) if r.time >= since])


def gather_evidence(
    run_dir: PathLike,
    *,
    job_id: str,
    restart: int,
    since: float,
    probe: Sequence[str],
    peer_lost_marker: str = "",
    prober: Callable[[Sequence[str]], List[str]] = probe_nodes,
) -> Evidence:
    """The evidence after a step: the hang reports since ``since``, the worker's peer-lost marker
    (``peer_lost_marker``, a path; the rank writes it when a peer vanished) and a probe of each node of
    ``probe``."""
    hang = find_step_hang(run_dir, job_id, restart, since)
    peer_lost = bool(peer_lost_marker) and os.path.exists(peer_lost_marker)
    first = next(iter(read_jsonl(peer_lost_marker)), None) if peer_lost else None
    failed = tuple(prober(probe)) if probe else ()
    notes = [f"probed {','.join(probe) or 'no node'}: " + (f"{','.join(failed)} failed" if failed else "all ran")]
    if hang is not None:
        notes.append(hang.line())
    if peer_lost and (first or {}).get("by") == "launch":  # the wrapper of a train.command rank that failed
        error = str((first or {}).get("error") or "failed")
        notes.append(f"rank {(first or {}).get('rank', '?')}: {error} (a lost peer or a crash: the probes tell)")
    elif peer_lost:
        notes.append("a rank saw a peer vanish")
    return Evidence(probe_failed=failed, hang=hang, peer_lost=peer_lost, peer_lost_record=first, notes=tuple(notes))


def record_recovery(run_dir: PathLike, **record: Any) -> None:
    """Append one in-job recovery (a :class:`RecoveryDecision` with its context) to ``recoveries.jsonl``."""
    append_jsonl(os.path.join(os.fspath(run_dir), RECOVERIES_NAME), record)


def give_back(job_id: str, keep: Sequence[str], run: Runner = subprocess.run) -> Tuple[bool, str]:
    """Shrink job ``job_id`` to the nodes ``keep`` (``scontrol update JobId= NodeList=``), giving the others
    back to the cluster: (True, "") when Slurm took it, else (False, scontrol's last error line).
    ``SLURM_JOB_NODELIST`` is stale afterwards. Slurm before 24.11 (22.05 seen) refuses a second shrink of a
    job until the accounting database has indexed the first ("the DB index is being set"): without slurmdbd,
    never; 24.11 and later take it (``slurm_ddp.slurmversion.REPEATED_SHRINK``). Either way the caller goes on:
    a node not given back stays excluded from the job's next steps."""
    r = run(
        ["scontrol", "update", f"JobId={job_id}", f"NodeList={','.join(keep)}"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if getattr(r, "returncode", 1) == 0:
        return True, ""
    lines = str(getattr(r, "stderr", "") or "").strip().splitlines()
    return False, lines[-1] if lines else f"status {getattr(r, 'returncode', '?')}"


# --------------------------------------------------------------------------- what the login node shows
@dataclass(frozen=True)
class InJobRestart:
    """One in-job restart as ``status``, ``runs`` and ``report`` show it (:func:`in_job_restarts`).

    Times are ``time.time()`` seconds; a field the records do not give is None."""

    job_id: str
    restart: int  #: the job's Slurm restart count (requeues) when it happened
    attempt: int  #: the in-job restart's number within that start (1, 2, …)
    lost: Tuple[str, ...]  #: the nodes taken for lost or hung
    nodes: Tuple[str, ...]  #: the next step's nodes, batch host first
    lost_at: float  #: when a rank saw the peer vanish (the peer-lost marker), else when the decision was made
    lost_step: Optional[int]  #: the last step completed before the loss
    resumed_at: Optional[float] = None  #: the next step's ``resume`` event (None: not resumed yet)
    resumed_step: Optional[int] = None
    emergency: bool = False  #: resumed from the survivors' emergency checkpoint
    reason: str = ""
    in_process: bool = False  #: the survivors kept their processes (``recovery.in_process``): no new step

    @property
    def time_to_resume_s(self) -> Optional[float]:
        """Seconds from the loss to the resumed step (None: not resumed yet)."""
        return None if self.resumed_at is None else max(self.resumed_at - self.lost_at, 0.0)

    @property
    def redone_steps(self) -> Optional[int]:
        """Completed steps the next step computes again (``lost_step − resumed_step``, at least 0)."""
        if self.lost_step is None or self.resumed_step is None:
            return None
        return max(self.lost_step - self.resumed_step, 0)

    def line(self) -> str:
        """E.g. ``lost node n2 at step 17, back at step 17 on n1,n3 after 27 s (emergency checkpoint)``."""
        what = f"lost node{'s' if len(self.lost) > 1 else ''} {','.join(self.lost) or '?'}"
        if self.lost_step is not None:
            what += f" at step {self.lost_step}"
        if self.resumed_at is None:
            return f"{what}, restarting on {','.join(self.nodes)}"
        took = self.time_to_resume_s or 0.0
        back = f"back at step {self.resumed_step} on {','.join(self.nodes)} after {took:.0f} s"
        how = " (in-process)" if self.in_process else (" (emergency checkpoint)" if self.emergency else "")
        return f"{what}, {back}{how}"

    def to_dict(self) -> Dict[str, Any]:
        """JSON-able, with ``time_to_resume_s``, ``redone_steps`` and ``line`` (:meth:`line`)."""
        return {
            "job_id": self.job_id,
            "restart": self.restart,
            "attempt": self.attempt,
            "lost": list(self.lost),
            "nodes": list(self.nodes),
            "lost_at": self.lost_at,
            "lost_step": self.lost_step,
            "resumed_at": self.resumed_at,
            "resumed_step": self.resumed_step,
            "emergency": self.emergency,
            "time_to_resume_s": self.time_to_resume_s,
            "redone_steps": self.redone_steps,
            "reason": self.reason,
            "in_process": self.in_process,
            "line": self.line(),
        }


def in_job_restarts(
    recoveries: Sequence[Mapping[str, Any]], metrics: Sequence[Mapping[str, Any]]
) -> List[InJobRestart]:
    """The in-job restarts of a run, oldest first, from its ``recoveries.jsonl`` (the ``restart``
    decisions and the in-process recoveries) and rank 0's ``metrics.jsonl`` (the ``resume`` that followed each; the last ``train``
    step before it when the peer-lost marker gave no step). Pure; malformed records are skipped."""
    decisions = [
        r for r in recoveries if r.get("action") in (RESTART, IN_PROCESS) and isinstance(r.get("time"), (int, float))
    ]
    timed = [m for m in metrics if isinstance(m.get("time"), (int, float))]
    out: List[InJobRestart] = []
    for i, r in enumerate(decisions):
        decided = float(r["time"])
        until = float(decisions[i + 1]["time"]) if i + 1 < len(decisions) else float("inf")
        resume = next((m for m in timed if m.get("event") == "resume" and decided < m["time"] < until), None)
        marked = r.get("lost_at")
        lost_at = float(marked) if isinstance(marked, (int, float)) else decided
        lost_step = r.get("lost_step") if isinstance(r.get("lost_step"), int) else None
        if lost_step is None:
            steps = [m.get("step") for m in timed if m.get("event") == "train" and m["time"] <= decided]
            lost_step = next((s for s in reversed(steps) if isinstance(s, int)), None)
        out.append(
            InJobRestart(
                job_id=str(r.get("job_id", "")),
                restart=int(r.get("restart") or 0),
                attempt=int(r.get("attempt") or 0) + 1,
                lost=tuple(str(n) for n in r.get("bad") or ()),
                nodes=tuple(str(n) for n in r.get("nodes") or ()),
                lost_at=lost_at,
                lost_step=lost_step,
                resumed_at=None if resume is None else float(resume["time"]),
                resumed_step=None if resume is None else resume.get("step"),
                emergency=bool(resume is not None and resume.get("emergency")),
                reason=str(r.get("reason", "")),
                in_process=r.get("action") == IN_PROCESS,
            )
        )
    return out


def read_in_job_restarts(run_dir: PathLike) -> List[InJobRestart]:
    """:func:`in_job_restarts` of the run directory ``run_dir`` (none when it recorded none)."""
    recoveries = read_recoveries(run_dir)
    return in_job_restarts(recoveries, read_metrics(run_dir)) if recoveries else []


# --------------------------------------------------------------------------- batch-shell entry points
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        from ..errors import UserError

        raise UserError(message)


def _nodes_arg(text: str) -> List[str]:
    names = [n for n in text.split(",") if n and n != "-"]
    for n in names:
        if not all(c.isalnum() or c in "._-" for c in n):
            raise argparse.ArgumentTypeError(f"{n!r} is not a node name")
    return names


def start_nodes(job_nodes_now: Sequence[str], batch_host: str, nodes_wanted: int) -> List[str]:
    """The first step's nodes: the batch host (rank 0, MASTER_ADDR), then the allocation's other nodes in
    order, ``nodes_wanted`` in all; the rest are the spares. Pure."""
    rest = [n for n in job_nodes_now if n != batch_host]
    return [batch_host, *rest][:nodes_wanted]


def main_start(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    """``recovery-start --nodes N``: print ``NODES COUNT``, the first step's nodes (comma list, batch host
    first) and their count, from ``SLURM_JOB_NODELIST`` and ``SLURMD_NODENAME`` (or the host name)."""
    import socket

    from ..env import expand_nodelist

    p = _Parser(prog="python -m slurm_ddp.rundir recovery-start", add_help=False)
    p.add_argument("--nodes", required=True, type=int)
    args = p.parse_args(argv)
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    host = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    nodes = start_nodes(expand_nodelist(nodelist) if nodelist else [host], host, args.nodes)
    print(f"{','.join(nodes)} {len(nodes)}", flush=True)
    return 0


def step_with_spares(step_nodes: Sequence[str], nodes_now: Sequence[str], exclude: Sequence[str]) -> List[str]:
    """The nodes of an in-process recovery step (``recovery.in_process``): the training nodes, then the job's
    other nodes now, less ``exclude`` (nodes found lost or hung, possibly not given back), as the warm
    spares. Pure."""
    return [*step_nodes, *(n for n in nodes_now if n not in step_nodes and n not in exclude)]


def main_nodes(argv: Sequence[str], environ: Mapping[str, str], run: Runner = subprocess.run) -> int:
    """``recovery-nodes --step-nodes A,B [--exclude C,D]``: print ``NODES COUNT``, the nodes of an in-process
    recovery step (:func:`step_with_spares`; the job's nodes from ``scontrol``, else ``SLURM_JOB_NODELIST``)."""
    from ..env import expand_nodelist

    p = _Parser(prog="python -m slurm_ddp.rundir recovery-nodes", add_help=False)
    p.add_argument("--step-nodes", required=True, type=_nodes_arg)
    p.add_argument("--exclude", default="-", type=_nodes_arg)
    args = p.parse_args(argv)
    job_id = environ.get("SLURM_JOB_ID", "")
    nodes_now = job_nodes(job_id, run) if job_id else []
    if not nodes_now:
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
        nodes_now = expand_nodelist(nodelist) if nodelist else []
    nodes = step_with_spares(args.step_nodes, nodes_now, args.exclude)
    print(f"{','.join(nodes)} {len(nodes)}", flush=True)
    return 0


def in_process_lost(recoveries: Sequence[Mapping[str, Any]], job_id: str, restart: int) -> List[str]:
    """The nodes in-process recovery (``recovery.in_process``) found lost in job ``job_id`` at ``restart``,
    from its ``in_process`` records in ``recoveries.jsonl``, in order. Pure."""
    lost: List[str] = []
    for r in recoveries:
        if r.get("action") == IN_PROCESS and str(r.get("job_id")) == job_id and r.get("restart") == restart:
            lost += [str(n) for n in r.get("bad") or () if str(n) not in lost]
    return lost


def main_release(
    argv: Sequence[str], environ: Mapping[str, str], log: Callable[[str], None], run: Runner = subprocess.run
) -> int:
    """``recovery-release --run-dir D``: after an in-process recovery step ended, give the nodes it lost back to
    the cluster (:func:`give_back`): a job still holding a node Slurm has not marked DOWN stays COMPLETING until
    it is. Prints the lost nodes (a comma list, ``-`` for none) for the batch script to keep out of a later
    step."""
    p = _Parser(prog="python -m slurm_ddp.rundir recovery-release", add_help=False)
    p.add_argument("--run-dir", required=True)
    args = p.parse_args(argv)
    job_id = environ.get("SLURM_JOB_ID", "")
    restart_text = environ.get("SLURM_RESTART_COUNT") or "0"
    lost = in_process_lost(read_recoveries(args.run_dir), job_id, int(restart_text) if restart_text.isdigit() else 0)
    if lost and job_id:
        nodes_now = job_nodes(job_id, run)
        keep = [n for n in nodes_now if n not in lost]
        if nodes_now and keep != nodes_now:
            gave, why = give_back(job_id, keep, run)
            log(
                f"gave node {','.join(lost)}, lost in-process, back to the cluster (job NodeList={','.join(keep)})"
                if gave
                else f"could not give node {','.join(lost)} back (scontrol update NodeList: {why})"
            )
    print(",".join(lost) or "-", flush=True)
    return 0


def main_decision(argv: Sequence[str], environ: Mapping[str, str], log: Callable[[str], None]) -> int:
    """``recovery-decision --run-dir D --exit-code N --step-nodes A,B --since T --restarts-done K --nodes W
    --min-nodes M --max-restarts R --max-requeues Q --can-requeue 0|1 --stopped 0|1 [--peer-lost PATH]
    [--give-back 0|1]``: gather the evidence, decide (:func:`decide_recovery`), record it in
    ``recoveries.jsonl``, give lost nodes back when restarting (``--give-back 1``), log the reason and print
    :meth:`RecoveryDecision.line`."""
    p = _Parser(prog="python -m slurm_ddp.rundir recovery-decision", add_help=False)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--exit-code", required=True, type=int)
    p.add_argument("--step-nodes", required=True, type=_nodes_arg)
    p.add_argument("--since", required=True, type=float)
    p.add_argument("--restarts-done", required=True, type=int)
    p.add_argument("--nodes", required=True, type=int)
    p.add_argument("--min-nodes", required=True, type=int)
    p.add_argument("--max-restarts", required=True, type=int)
    p.add_argument("--max-requeues", required=True, type=int)
    p.add_argument("--can-requeue", required=True, type=int, choices=(0, 1))
    p.add_argument("--stopped", required=True, type=int, choices=(0, 1))
    p.add_argument("--peer-lost", default="")
    p.add_argument("--give-back", default=0, type=int, choices=(0, 1))
    args = p.parse_args(argv)
    import socket

    job_id = environ.get("SLURM_JOB_ID", "")
    restart_text = environ.get("SLURM_RESTART_COUNT") or "0"
    restart = int(restart_text) if restart_text.isdigit() else 0
    host = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    marker = read_preempted(args.run_dir)
    stopped = bool(args.stopped) or (marker is not None and marker.job_id == job_id and marker.restart == restart)
    finished = is_finished(args.run_dir)
    t0 = time.time()
    if args.exit_code == 0 or finished or stopped or not job_id:
        evidence = Evidence()
        nodes_now = list(args.step_nodes)
    else:
        nodes_now = job_nodes(job_id) or list(args.step_nodes)
        probe = [n for n in dict.fromkeys([*args.step_nodes, *nodes_now]) if n != host]
        evidence = gather_evidence(
            args.run_dir, job_id=job_id, restart=restart, since=args.since, probe=probe, peer_lost_marker=args.peer_lost
        )
    decision = decide_recovery(
        exit_code=args.exit_code,
        finished=finished,
        stopped=stopped,
        batch_host=host,
        step_nodes=args.step_nodes,
        job_nodes=nodes_now,
        bad=evidence.bad,
        nodes_wanted=args.nodes,
        min_nodes=args.min_nodes,
        restarts_done=args.restarts_done,
        max_restarts=args.max_restarts,
        restart_count=restart,
        max_requeues=args.max_requeues,
        can_requeue=bool(args.can_requeue),
    )
    if evidence.notes:
        log(f"in-job recovery evidence ({time.time() - t0:.1f} s): {'; '.join(evidence.notes)}")
    log(decision.reason)
    gave_back = False
    if decision.action == RESTART and args.give_back and job_id:
        keep = [n for n in nodes_now if n not in decision.bad]
        gave_back, why = give_back(job_id, keep)
        log(
            f"gave node {','.join(decision.bad)} back to the cluster (job NodeList={','.join(keep)})"
            if gave_back
            else f"could not give node {','.join(decision.bad)} back (scontrol update NodeList: {why}); "
            "keeping it excluded"
        )
    if decision.action == RESTART and job_id:
        try:  # the next step's watchdogs must not take this step's reports for a peer's hang
            set_aside_hang_reports(args.run_dir, job_id, restart, args.restarts_done)
        except OSError as e:
            log(f"could not set this step's hang reports aside: {e}")
    if decision.action != NONE or decision.bad:
        record: Dict[str, Any] = {
            "job_id": job_id,
            "restart": restart,
            "attempt": args.restarts_done,
            "time": time.time(),
            "step_started": args.since,
            "action": decision.action,
            "exit_code": args.exit_code,
            "step_nodes": list(args.step_nodes),
            "nodes": list(decision.nodes),
            "bad": list(decision.bad),
            "peer_lost": evidence.peer_lost,
            # the first rank that saw it: when, and after which completed step
            "lost_at": (evidence.peer_lost_record or {}).get("time"),
            "lost_step": (evidence.peer_lost_record or {}).get("step"),
            "hang": evidence.hang.line() if evidence.hang is not None else None,
            "gave_back": gave_back,
            "reason": decision.reason,
        }
        try:
            record_recovery(args.run_dir, **record)
        except OSError as e:
            log(f"could not record the recovery in {RECOVERIES_NAME}: {e}")
    print(decision.line(), flush=True)
    return 0


def main(argv: Optional[Sequence[str]] = None, environ: Optional[Mapping[str, str]] = None) -> int:
    """Entry of ``python -m slurm_ddp.rundir recovery-start|recovery-nodes|recovery-release|recovery-decision
    ...`` (see :func:`main_start`, :func:`main_nodes`, :func:`main_release`, :func:`main_decision`). A malformed argument is one stderr line and exit status 2; the batch script
    then ends the loop and lets the requeue rule decide."""
    from ..entrypoint import run_main

    env = os.environ if environ is None else environ
    args = list(sys.argv[1:] if argv is None else argv)

    def log(text: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        print(f"{stamp} slurm_ddp[batch {env.get('SLURM_JOB_ID') or '?'}]: {text}", file=sys.stderr, flush=True)

    def run() -> int:
        if args[:1] == ["recovery-start"]:
            return main_start(args[1:], env)
        if args[:1] == ["recovery-nodes"]:
            return main_nodes(args[1:], env)
        if args[:1] == ["recovery-release"]:
            return main_release(args[1:], env, log)
        return main_decision(args[1:], env, log)

    return run_main("slurm_ddp rundir", run)
