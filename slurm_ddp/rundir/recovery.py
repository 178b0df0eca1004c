"""In-job recovery from a lost or hung node (config section ``recovery``): THE rule that decides, after
a training step of a ``--no-kill`` job ended badly, whether the job's supervisor starts the next step inside
the same allocation, on which nodes, or falls back to a requeue (:func:`decide_recovery`, pure); the
evidence it reads (:func:`gather_evidence`: the step's hang reports, the peer-lost marker the worker
writes, a short probe step per node); and the node lists of the steps (:func:`start_nodes`,
:func:`step_with_spares`; an in-process step's lost nodes: ``rundir.inprocess_nodes.still_lost``). The job's
supervisor (:mod:`slurm_ddp.supervise`) asks them after each step. Part of :mod:`slurm_ddp.rundir`.

Why our own evidence: Slurm marks a silent node DOWN only after ``SlurmdTimeout`` (300 s by default),
and a step whose node vanished runs on until then (SLURM-FACTS.md, "A node lost inside a --no-kill
job"). The ranks notice at once (a collective fails when a peer's socket closes, or times out after
``train.pg_timeout_s``), the watchdog names a hung rank's node, and a probe step ``srun -w NODE true``
that fails or does not finish within seconds names a node that cannot run tasks.

Side effects: :func:`gather_evidence` runs ``srun``/``scontrol`` (through an injected runner) and reads
the run directory; the supervisor (:mod:`slurm_ddp.supervise`) appends to ``recoveries.jsonl``, may shrink the job
(``scontrol update JobId= NodeList=``) and, before an in-job restart, sets the step's hang reports aside
(``hangs/JOBID.RESTART.step-K``). Imports no torch.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .files import RECOVERIES_NAME as RECOVERIES_NAME
from .files import PathLike, append_jsonl, read_jsonl, read_metrics, read_recoveries
from .hangs import Hang, read_hang_reports, summarize_hang
from .requeue import NO_RESTART_KEY

#: The actions of a :class:`RecoveryDecision`.
RESTART, REQUEUE, NONE = "restart", "requeue", "none"
#: The action of a ``recoveries.jsonl`` record that in-process recovery (``slurm_ddp.worker.inprocess``) wrote:
#: the survivors went on in the same step, with a spare or alone.
IN_PROCESS = "in_process"

#: Seconds a probe step (``srun -w NODE true``) may take before its node counts as bad.
PROBE_TIMEOUT_S = 10.0

#: The variable in which the job's supervisor tells a training step how many recoveries of this job start's
#: ``recovery.max_restarts`` are left for its in-process recoveries (:func:`recoveries_left`); set for every
#: step of a job with in-job recovery, unset elsewhere.
RECOVERIES_LEFT_VAR = "SLURM_DDP_RECOVERIES_LEFT"


def in_process_recoveries(recoveries: Sequence[Mapping[str, Any]], job_id: str, restart: int) -> int:
    """How many in-process recoveries (``IN_PROCESS`` records) job ``job_id`` made at requeue count
    ``restart`` (one job start), over all its steps. ``recoveries``: ``recoveries.jsonl``'s records. Pure."""
    return sum(
        1
        for r in recoveries
        if r.get("action") == IN_PROCESS and str(r.get("job_id")) == job_id and r.get("restart") == restart
    )


#: The key of a supervisor's ``recoveries.jsonl`` record that holds the run's newest committed checkpoint
#: step when the decision was taken (``null``: none yet): the progress :func:`no_progress_stop` compares.
COMMITTED_STEP_KEY = "committed_step"
#: The key of an end record (``ends.jsonl``) that names a no-progress stop (:func:`no_progress_stop`'s reason).
NO_PROGRESS_KEY = "no_progress"


def no_progress_stop(
    recoveries: Sequence[Mapping[str, Any]], committed_step: Optional[int], max_no_progress: int
) -> Optional[str]:
    """Why the recovery about to be made (an in-job restart, or a requeue for a lost or hung node) must not be,
    or ``None``: the last ``max_no_progress`` recoveries of the run (its ``restart``/``requeue`` records in
    ``recoveries.jsonl`` that carry :data:`COMMITTED_STEP_KEY`, over every job start) each found the run at
    the committed checkpoint step ``committed_step`` (``None``: no checkpoint yet, the same for all), so none of
    them brought progress: a failure that comes back at the same place is the training code's or its data's,
    not a node's, and recovering again would loop. ``max_no_progress`` 0: never. Pure.

    The convention: NVIDIA Resiliency Extension's fault-tolerance launcher stops when no new completed
    checkpoint appears across several failing restart cycles (docs, "Operations and troubleshooting: Cycle
    records and checkpoint progress", ``--ft-checkpoint-iteration-file``), and SkyPilot managed jobs bound
    restarts on user-code errors (``max_restarts_on_errors``) apart from preemption recoveries. Preemption and
    time-limit requeues write no such record (the requeue rule, ``rundir.decide_requeue``, takes them), so they
    never count; a preemption's checkpoint is progress like any other.
    """
    if max_no_progress <= 0:
        return None
    counted = [r for r in recoveries if r.get("action") in (RESTART, REQUEUE) and COMMITTED_STEP_KEY in r]
    last = counted[-max_no_progress:]
    if len(last) < max_no_progress or any(r.get(COMMITTED_STEP_KEY) != committed_step for r in last):
        return None
    where = "no checkpoint committed yet" if committed_step is None else f"still at checkpoint step {committed_step}"
    return (
        f"recovery.max_no_progress={max_no_progress}: the last {max_no_progress} recoveries of this run brought no "
        f"progress ({where}): the failure repeats, a fault of the training code or its data, not of a node; "
        "ending the job instead of recovering again"
    )


#: The key of a recovery record (``recoveries.jsonl``) that names what it recovered from: :data:`NODE_LOST` (a probe
#: failed: the node cannot run tasks; in-process: all its ranks fell silent) or :data:`HANG` (the watchdog's hang
#: reports name the node). A record without it: an ``in_process`` one counts as a node lost, others as neither.
CAUSE_KEY = "cause"
NODE_LOST, HANG = "node_lost", "hang"
#: The key of an end record (``ends.jsonl``) that names a per-cause cap's stop (:func:`cause_cap_stop`'s reason).
CAUSE_CAP_KEY = "cause_cap"
#: The config key of each cause's cap (``recovery.max_node_losses``, ``recovery.max_hangs``), for the words.
CAP_KEYS = {NODE_LOST: "recovery.max_node_losses", HANG: "recovery.max_hangs"}


def record_cause(record: Mapping[str, Any]) -> str:
    """The cause of a ``recoveries.jsonl`` record (:data:`CAUSE_KEY`; an ``in_process`` one without it: a node
    lost); "" when it names none. Pure."""
    cause = record.get(CAUSE_KEY)
    if isinstance(cause, str) and cause:
        return cause
    return NODE_LOST if record.get("action") == IN_PROCESS else ""


def cause_recoveries(recoveries: Sequence[Mapping[str, Any]], job_id: str, cause: str) -> int:
    """How many recoveries of job ``job_id``, over all its starts (requeues), were made from ``cause``: its
    in-job restarts, requeues for a bad node and in-process recoveries (``restart``, ``requeue``, ``in_process``
    records of ``recoveries.jsonl``) whose :func:`record_cause` is ``cause``. Pure."""
    return sum(
        1
        for r in recoveries
        if r.get("action") in (RESTART, REQUEUE, IN_PROCESS)
        and str(r.get("job_id")) == job_id
        and record_cause(r) == cause
    )


def cause_cap_stop(
    recoveries: Sequence[Mapping[str, Any]], job_id: str, cause: str, caps: Mapping[str, int]
) -> Optional[str]:
    """Why the recovery about to be made from ``cause`` (an in-job restart, or a requeue without the bad node)
    must not be, or ``None``: job ``job_id`` already recovered ``caps[cause]`` times from that cause over its
    starts (:func:`cause_recoveries`). ``caps``: cause → cap (``recovery.max_node_losses``,
    ``recovery.max_hangs``); 0 or absent: no cap. Pure.

    One budget per cause, apart from the others and from preemptions (which write no recovery record), as
    SkyPilot managed jobs keep ``max_restarts_on_errors`` apart from their preemption recoveries: a node that
    keeps being lost (a flaky rack, a failing switch) or a hang that keeps coming back ends the job, naming
    the cause, instead of spending the allocation and the requeue cap (``requeue.max_requeues``) on it."""
    cap = int(caps.get(cause) or 0)
    if cap <= 0:
        return None
    done = cause_recoveries(recoveries, job_id, cause)
    if done < cap:
        return None
    what = {NODE_LOST: "lost node", HANG: "hang"}.get(cause, cause) + ("s" if done != 1 else "")
    return (
        f"{CAP_KEYS.get(cause, cause)}={cap}: this job already recovered from {done} {what} (over its starts); "
        "ending the job instead of recovering again"
    )


def stop_note(ends: Sequence[Mapping[str, Any]], job_id: str) -> Optional[str]:
    """``slurm-ddp status``'s line for job ``job_id`` when its latest end record (``ends.jsonl``) states why it
    ended without a restart or requeue: a rank's "do not restart" (``NO_RESTART_KEY``), a no-progress stop
    (:data:`NO_PROGRESS_KEY`) or a per-cause cap (:data:`CAUSE_CAP_KEY`); else None."""
    mine = [e for e in ends if str(e.get("job_id")) == str(job_id)]
    last = mine[-1] if mine else {}
    why = last.get(NO_RESTART_KEY)
    if isinstance(why, str) and why:
        return f"ended without a restart or requeue: {why}"
    for key in (NO_PROGRESS_KEY, CAUSE_CAP_KEY):
        why = last.get(key)
        if isinstance(why, str) and why:
            return f"ended without recovering again: {why}"
    return None


def step_recoveries_left(
    budget_left: int, recoveries: Sequence[Mapping[str, Any]], job_id: str, caps: Mapping[str, int]
) -> int:
    """What the supervisor passes a step in :data:`RECOVERIES_LEFT_VAR`: ``budget_left`` (what the in-job
    restarts and the earlier steps' in-process recoveries left of ``recovery.max_restarts`` in this job start),
    no more than the lost-node cap leaves (``caps[NODE_LOST]``, over the job's starts: every in-process
    recovery is one from a lost node), never below 0. Pure."""
    left = max(0, budget_left)
    cap = int(caps.get(NODE_LOST) or 0)
    if cap > 0:
        left = min(left, max(0, cap - cause_recoveries(recoveries, job_id, NODE_LOST)))
    return left


def recoveries_left(environ: Mapping[str, str], max_restarts: int) -> int:
    """The recoveries a training step may still do (in-process recovery's generations): ``recovery.max_restarts``
    is one budget per job start, shared by the in-job restarts and the in-process recoveries of all its steps,
    so the supervisor passes what is left in :data:`RECOVERIES_LEFT_VAR`. Without it (a step started outside
    the supervisor: the local backend, a hand-run ``srun``) or unreadable, ``max_restarts``; never above it,
    never below 0."""
    text = str(environ.get(RECOVERIES_LEFT_VAR, "")).strip()
    if not text.isdigit():
        return max(0, max_restarts)
    return max(0, min(int(text), max_restarts))


@dataclass(frozen=True)
class RecoveryDecision:
    """What the batch script does after a training step ended badly."""

    action: str  #: ``restart``: next step on ``nodes``; ``requeue``: requeue without ``bad``; ``none``: the requeue rule decides
    nodes: Tuple[str, ...]  #: the next step's nodes, batch host first (``restart`` only)
    bad: Tuple[str, ...]  #: the nodes taken for lost or hung
    reason: str  #: one log line saying why

    def line(self) -> str:
        """``ACTION NODES BAD`` for the supervisor's log: comma lists, ``-`` for none."""
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
    def cause(self) -> str:
        """What the bad nodes are bad of (:data:`CAUSE_KEY`): :data:`NODE_LOST` when a probe failed, else
        :data:`HANG` when a hang names its node; "" when no node is bad."""
        if self.probe_failed:
            return NODE_LOST
        return HANG if self.hang is not None and self.hang.exclude else ""

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
    no_restart: str = "",
) -> RecoveryDecision:
    """THE in-job recovery rule. Pure.

    ``exit_code``: srun's status for the step that ended; ``finished``: the run wrote ``FINISHED``;
    ``stopped``: the step was told to stop (SIGTERM, the time-limit signal, a preemption marker of this
    job): then the requeue rule (:func:`slurm_ddp.rundir.decide_requeue`) decides, not this one.
    ``step_nodes``: the nodes the step ran on; ``job_nodes``: the nodes the allocation holds now (the
    step's plus idle spares); ``bad``: the nodes the evidence names (:class:`Evidence`);
    ``nodes_wanted``: ``slurm.nodes``; ``min_nodes``: the fewest nodes a step may run on
    (``recovery.min_nodes``); ``restarts_done``/``max_restarts``: the recoveries so far in this job
    start (its in-job restarts and its steps' in-process recoveries: one budget per job start) and
    ``recovery.max_restarts``; ``restart_count``/``max_requeues``/``can_requeue`` as for the
    requeue rule; ``no_restart``: a rank asked that the job be neither restarted nor requeued
    (``rundir.requeue.no_restart_reason``; "": none did).

    - a step that ended with status 0, a finished run or a stop → ``none``;
    - a rank's "do not restart" → ``none`` (the requeue rule ends the job with it);
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
    if no_restart:
        return RecoveryDecision(NONE, (), (), f"in-job recovery: not restarting: {no_restart}")
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
        return requeue(
            f"recovery.max_restarts={max_restarts} recoveries (in-job restarts and in-process) done in this job start"
        )
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
        f"in-job recovery: node {lost} lost or hung (step status {exit_code}); recovery {restarts_done + 1} of at "
        f"most {max_restarts} in this job start, {how}: {','.join(nodes)}",
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


# --------------------------------------------------------------------------- the supervisor's node lists (pure)
def start_nodes(job_nodes_now: Sequence[str], batch_host: str, nodes_wanted: int) -> List[str]:
    """The first step's nodes: the batch host (rank 0, MASTER_ADDR), then the allocation's other nodes in
    order, ``nodes_wanted`` in all; the rest are the spares. Pure."""
    rest = [n for n in job_nodes_now if n != batch_host]
    return [batch_host, *rest][:nodes_wanted]


def step_with_spares(step_nodes: Sequence[str], nodes_now: Sequence[str], exclude: Sequence[str]) -> List[str]:
    """The nodes of an in-process recovery step (``recovery.in_process``): the training nodes, then the job's
    other nodes now, less ``exclude`` (nodes found lost or hung, possibly not given back), as the warm
    spares. Pure."""
    return [*step_nodes, *(n for n in nodes_now if n not in step_nodes and n not in exclude)]
