"""Where a run's allocation went: its starts, each start's time split into phases, and goodput.

``slurm-ddp report RUN|SWEEP`` (:func:`run_report`, :func:`report`)
and the timeline of ``slurm-ddp plot RUN --timeline`` read this. Side effects: reads the run
directory (never writes); asks nothing of Slurm itself (the caller passes accounting rows,
``slurm_ddp.ops.accounting.history``). Imports no torch. Its text is ``slurm_ddp.ops.view``'s.

Why over 600 lines: one computation, the time split of each start, whose parts (start and end
times, how a start ended, phases, redone steps, losses in words) read the same records and must
agree to the second; the definitions below are the documentation of the ``--json`` fields.

**Starts.** One per start of the ranks, requeues included: the ``starts`` of ``provenance.json``
(rank 0's launch wrapper writes one before it execs the rank, on every backend and mode). A start
runs from its job's start to its end:

- start: accounting's ``Start`` of the job id at that restart when accounting answers; else, for
  the local backend, the local supervisor's record in ``jobs.jsonl``; else the provenance record (rank 0's
  launch wrapper, a moment after the job started);
- an in-job restart (``recovery``) runs several training steps in one job start (the same job id and
  restart count; each step is a start here): a step followed by another of its job start ends where that
  one begins (``end_source`` ``next step``: the allocation was held throughout, the detection, probes and
  launch in between are the ending step's ``other``; ``ended`` ``node_lost``, naming the node), and a later step begins at its own provenance record, not at accounting's ``Start`` of the job;
- end: accounting's ``End``; else the record the job's supervisor (batch host or local) wrote when the
  ranks exited (``rundir.record_end``); else the start's last record (``metrics.jsonl``) — a start
  killed together with its supervisor leaves nothing later. sacct keeps whole seconds (the second the
  job ended): an end record that falls within that second is the same end to the sub-second and is
  taken instead (``end_source`` stays ``sacct``), so a stop shorter than a second is not clipped to 0;
- ``queue_wait_s`` before it: from the submission (``jobs.jsonl``), or for a requeue from the end of
  the job's previous start, to its start.

**Phases** of a start, in seconds (and node-seconds: × its node count). They add up to its wall
time by construction (``other`` is the rest):

- ``startup``: start → this start's first training step done (worker event ``first_step``; for a
  script of one's own, its first ``train`` event with a ``time``, else the first step it reported
  through ``slurm_ddp.progress``, from rank 0's watchdog samples, see below);
- ``train_kept``: training steps whose result survived (the checkpoint the next start resumed from
  is at or after them, or this start finished the run);
- ``train_redone``: steps computed after the last committed checkpoint before a stop that lost
  them: the next start resumed from an earlier step and computed them again (``redone_steps``);
- ``recovery``: in-process recoveries inside the start (``recovery.in_process``: its ``in_process``
  records in ``recoveries.jsonl``): from the last step completed before the loss to the survivors'
  ``resume`` in the new generation (the step in flight, the heartbeat timeout, the new group, the state's
  broadcast); no new start, so no start-up;
- ``eval``: evaluation (``eval`` events' ``duration_s``);
- ``checkpoint``: checkpoint time that blocked training (``checkpoint`` events' ``blocked_s``; the
  save after a stop signal is ``stop``);
- ``stop``: the stop signal's arrival (``preempted`` event's ``signal_time``) → the start's end;
- ``unknown``: a start that recorded no step with a time (a script of one's own that writes no
  metrics and reports no progress): its start → its stop signal (else its end), which may be start-up
  or training; slurm_ddp cannot tell, so it is neither;
- ``other``: the rest (e.g. the final weights' write, the gap between a killed start's last record
  and its end, a failure's tail).

**A script of one's own** (``train.command``) gets step-level figures from whichever it left:
``metrics.jsonl`` ``train`` lines with a ``time``, or, when a start has none, the step samples rank
0's hang watchdog took of its ``slurm_ddp.progress`` reports (``rundir.PROGRESS_NAME``: at most one a
second, each phase change, its first step and its last): steps and their times, ``eval`` and
``checkpoint`` phases (their length to the next sample: up to a second too long). The step a start
resumed from is the step of the checkpoint the start passed it (``train.resume``: its record in
``RUN_DIR/resumes/``, also shown as ``resume``), else its first reported step − 1 (the script's own count),
else 0 when its record says there was nothing to pass, so the redone steps are right when the script numbers its steps across restarts;
a stop's signal time is when its launch wrapper recorded the signal (``rundir.stop_dir``).

**Run totals**: ``allocated_node_s`` (Σ wall × nodes), ``productive_node_s`` (Σ ``train_kept`` ×
nodes), ``goodput`` = productive ÷ allocated, ``redone_steps``, ``restarts`` (starts − 1),
``queue_wait_s`` (Σ, not part of the allocation), and the three largest losses in words. A figure
the records cannot give (a script that logs no steps, events without times) is ``None`` and named in
``unknown``. The JSON field names are listed in :data:`RUN_FIELDS`, :data:`START_FIELDS` and
documented in docs/guides/operating.md ("Where the allocation went").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..rundir import (
    FINISHED_NAME,
    find_hang,
    read_ends,
    read_finished,
    read_jobs,
    read_metrics,
    read_progress_samples,
    read_rank_stops,
    read_recoveries,
    stop_dir,
)
from ..rundir import in_job_restarts as join_in_job_restarts
from ..rundir.interval import last_interval
from ..rundir.local_end import PREEMPTED_STATE
from ..rundir.script_checkpoints import (
    FIRST_START,
    NO_CHECKPOINT,
    NO_COMPLETE,
    read_script_resumes,
    resume_lines,
)
from .accounting import Accounting, AccountingRow, Runner

#: the outcomes of a start's record (``rundir.script_checkpoints``) that leave its script no checkpoint to
#: resume from (``UNSET_WITH_CHECKPOINTS`` is not one: the script may find its checkpoints itself)
FROM_STEP_0 = (FIRST_START, NO_CHECKPOINT, NO_COMPLETE)

#: the phases of a start, in timeline order (the JSON keys of ``phases_s`` / ``phases_node_s``)
PHASES = ("startup", "train_kept", "train_redone", "recovery", "eval", "checkpoint", "stop", "unknown", "other")
#: how a phase reads in a sentence
PHASE_WORDS = {
    "startup": "start-up",
    "train_kept": "training (kept)",
    "train_redone": "training redone",
    "recovery": "in-process recovery",
    "eval": "evaluation",
    "checkpoint": "checkpoint stalls",
    "stop": "stopping",
    "unknown": "unknown",
    "other": "other",
}
#: how a start can end (``ended``)
ENDINGS = ("finished", "preempted", "killed", "timed_out", "failed", "node_lost", "running")
#: the run-level JSON fields of ``report --json`` (stable)
RUN_FIELDS = (
    "run",
    "path",
    "allocated_source",
    "starts",
    "allocated_node_s",
    "productive_node_s",
    "goodput",
    "ettr",
    "scheduling_goodput",
    "runtime_goodput",
    "program_goodput",
    "checkpoint_interval",
    "redone_steps",
    "restarts",
    "in_job_restarts",
    "queue_wait_s",
    "phases_node_s",
    "losses",
    "unknown",
)
#: the per-start JSON fields of ``report --json`` (stable)
START_FIELDS = (
    "index",
    "job_id",
    "restart",
    "nodes",
    "node_count",
    "start",
    "end",
    "start_source",
    "end_source",
    "ended",
    "reason",
    "queue_wait_s",
    "wall_s",
    "phases_s",
    "phases_node_s",
    "resumed_from_step",
    "first_step",
    "last_step",
    "steps_kept",
    "redone_steps",
    "signal_time",
    "in_job_restarts",
    "resume",
    "unknown",
)

_KILLED_STATUS = 128 + 9


@dataclass
class StartReport:
    """One start of a run and where its time went (fields: :data:`START_FIELDS`)."""

    index: int
    job_id: str
    restart: int
    nodes: str  #: hostlist, as the start recorded it
    node_count: int
    start: float  #: epoch seconds
    end: float  #: epoch seconds (now, for a start still running)
    start_source: str  #: ``sacct``, ``launcher`` (the job's record in ``jobs.jsonl``: a word kept for --json readers) or ``provenance``
    end_source: str  #: ``sacct``, ``batch``, ``local``, ``last record``, ``next step`` (an in-job restart) or ``now``
    ended: str  #: one of :data:`ENDINGS`
    reason: str  #: why, in words
    queue_wait_s: Optional[float]
    phases_s: Dict[str, float]
    resumed_from_step: Optional[int] = None
    first_step: Optional[int] = None
    last_step: Optional[int] = None
    steps_kept: Optional[int] = None
    redone_steps: Optional[int] = None
    signal_time: Optional[float] = None
    #: restarts inside this start after a lost node (``rundir.InJobRestart.to_dict``), oldest first
    in_job_restarts: List[Dict[str, Any]] = field(default_factory=list)
    #: a ``train.command`` start: what it passed its script (``rundir.script_checkpoints.resume_lines``),
    #: None where it recorded nothing (the worker; a script without ``train.resume`` and no checkpoint seen)
    resume: Optional[str] = None
    unknown: List[str] = field(default_factory=list)

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    @property
    def phases_node_s(self) -> Dict[str, float]:
        return {k: v * self.node_count for k, v in self.phases_s.items()}

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {}
        for k in START_FIELDS:
            d[k] = getattr(self, k)
        return d


@dataclass
class RunReport:
    """A run's starts and totals (fields: :data:`RUN_FIELDS`)."""

    run: str
    path: Path
    starts: List[StartReport]
    allocated_source: str  #: ``sacct``, ``run directory``, or ``sacct and run directory``
    unknown: List[str] = field(default_factory=list)
    #: the records hold steps with times (the worker's events, or a script's timed metrics.jsonl
    #: lines): without them the productive time, goodput and redone steps are unknown (None)
    step_level: bool = True
    #: the last interval ``checkpoint.every_steps: auto`` chose (its ``checkpoint_interval`` event), or None
    checkpoint_interval: Optional[Dict[str, Any]] = None

    @property
    def allocated_node_s(self) -> float:
        return sum(s.wall_s * s.node_count for s in self.starts)

    @property
    def phases_node_s(self) -> Dict[str, float]:
        return {k: sum(s.phases_node_s[k] for s in self.starts) for k in PHASES}

    @property
    def productive_node_s(self) -> Optional[float]:
        return self.phases_node_s["train_kept"] if self.step_level else None

    @property
    def goodput(self) -> Optional[float]:
        """productive ÷ allocated node-seconds; None before any allocation or without step-level records."""
        alloc, productive = self.allocated_node_s, self.productive_node_s
        return productive / alloc if alloc > 0 and productive is not None else None

    @property
    def ettr(self) -> Optional[float]:
        """Effective training time ratio in Meta's sense (Kokolis et al., "Revisiting Reliability in Large-Scale
        Machine Learning Research Clusters", HPCA 2025: productive training time ÷ the wall time available to the
        job): Σ ``train_kept`` ÷ Σ wall time of the starts, in seconds (not node-seconds; queue waits between
        starts are out, ``scheduling_goodput`` has them). None without step-level records or allocation."""
        wall = sum(s.wall_s for s in self.starts)
        if wall <= 0 or not self.step_level:
            return None
        return sum(s.phases_s["train_kept"] for s in self.starts) / wall

    @property
    def scheduling_goodput(self) -> Optional[float]:
        """Google's scheduling goodput (Google Cloud, "Introducing ML Productivity Goodput", 2024: the fraction of
        time all the resources the job needs are available to it): allocated ÷ (allocated + queue waits) in
        seconds, from the submission on. None without a start or when a queue wait is unknown."""
        wall = sum(s.wall_s for s in self.starts)
        if wall <= 0 or any(s.queue_wait_s is None for s in self.starts):
            return None
        return wall / (wall + self.queue_wait_s)

    @property
    def runtime_goodput(self) -> Optional[float]:
        """Google's runtime goodput (same source: the time spent making forward progress — steps whose result
        was kept — as a fraction of the time the resources were available): ``goodput``, node-weighted."""
        return self.goodput

    @property
    def program_goodput(self) -> Optional[float]:
        """Google's program goodput (same source: the share of the hardware's peak throughput the program
        reaches, model FLOP utilisation): always None here — it needs the model's FLOPs per step and the
        hardware's peak, which the run directory does not hold (the table shows ``?``; not in ``unknown``, which lists
        what a run's records could have given)."""
        return None

    @property
    def redone_steps(self) -> Optional[int]:
        return sum(s.redone_steps or 0 for s in self.starts) if self.step_level else None

    @property
    def restarts(self) -> int:
        return max(len(self.starts) - 1, 0)

    @property
    def in_job_restarts(self) -> int:
        """Restarts inside a job after a lost node (each also a start: part of ``restarts``)."""
        return sum(len(s.in_job_restarts) for s in self.starts)

    @property
    def queue_wait_s(self) -> float:
        return sum(s.queue_wait_s or 0.0 for s in self.starts)

    @property
    def losses(self) -> List[Dict[str, Any]]:
        """The three largest losses (phases other than ``train_kept``), largest first: ``phase``,
        ``node_s``, ``fraction`` (of allocated) and ``words``."""
        return losses(self)

    def to_dict(self) -> Dict[str, Any]:
        d: Dict[str, Any] = {}
        for k in RUN_FIELDS:
            v = getattr(self, k)
            if k == "path":
                v = str(v)
            elif k == "starts":
                v = [s.to_dict() for s in v]
            d[k] = v
        return d


# --------------------------------------------------------------------------- helpers
def _num(v: Any) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> Optional[int]:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def sacct_epoch(text: str) -> Optional[float]:
    """sacct's ``YYYY-MM-DDTHH:MM:SS`` (local time, whole seconds) as epoch seconds; None otherwise."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except (ValueError, OverflowError):
        return None


def node_count(nodes: str) -> Optional[int]:
    """How many hosts a hostlist names (``n[1-3],m1`` → 4); None when it cannot be read."""
    if not nodes:
        return None
    from ..env import expand_nodelist
    from ..errors import SlurmDDPError

    try:
        return len(expand_nodelist(nodes)) or None
    except SlurmDDPError:  # malformed, or ClusterShell missing: the caller falls back
        return None


def _time_of_step(points: Sequence[Tuple[float, int]], step: int) -> Optional[float]:
    """When ``step`` was done, interpolated linearly between the (time, step) records around it;
    None outside them."""
    for (t0, s0), (t1, s1) in zip(points, points[1:]):
        if s0 <= step <= s1:
            return t0 if s1 == s0 else t0 + (t1 - t0) * (step - s0) / (s1 - s0)
    if points and points[0][1] == step:
        return points[0][0]
    return None


def _blocking_within(events: Sequence[Dict[str, Any]], lo: float, hi: float) -> float:
    """Seconds of eval and checkpoint that blocked training and ended within ``(lo, hi]``."""
    total = 0.0
    for m in events:
        t = _num(m.get("time"))
        if t is None or not lo < t <= hi:
            continue
        if m.get("event") == "eval":
            total += _num(m.get("duration_s")) or 0.0
        elif m.get("event") == "checkpoint" and not str(m.get("reason", "")).startswith("preemption"):
            total += _num(m.get("blocked_s")) or 0.0
    return total


# --------------------------------------------------------------------------- one run
def run_report(
    path: Path,
    *,
    name: Optional[str] = None,
    accounting: Optional[Accounting] = None,
    now: Optional[float] = None,
    alive: Optional[bool] = None,
    config_nodes: int = 1,
) -> RunReport:
    """The report of the run directory ``path``.

    ``accounting``: its jobs' rows (``ops.accounting.history``) or None (a local run, or not asked);
    ``now``: epoch seconds, the end of a start still running (default ``time.time()``); ``alive``:
    whether the run's job still runs (False: a last start without an end record ended at its last
    record; None: unknown, it is taken for running unless the run finished); ``config_nodes``:
    ``slurm.nodes``, the node count where no record gives one. Tolerates half-written files.
    """
    from ..rundir.provenance import read as read_provenance

    path = Path(path)
    now = time.time() if now is None else now
    prov = [s for s in read_provenance(str(path)).get("starts", []) if isinstance(s, dict)]
    prov = [s for s in prov if _num(s.get("time")) is not None]
    prov.sort(key=lambda s: float(s["time"]))
    metrics = [m for m in read_metrics(path)]
    timed = [m for m in metrics if _num(m.get("time")) is not None]
    sampled = samples_as_events(read_progress_samples(path))
    jobs = read_jobs(path)
    ends = read_ends(path)
    rows: Dict[Tuple[str, int], AccountingRow] = {}
    if accounting is not None:
        for r in accounting.rows:
            if r.started:
                rows[(r.job_id, r.restart)] = r
    # an array task: accounting names it ARRAYJOBID_TASKID, its ranks' records SLURM_JOB_ID
    by_restart = {r: row for (_, r), row in rows.items()} if len({j for j, _ in rows}) == 1 else {}
    finished = read_finished(path)
    script_resumes = read_script_resumes(path)
    in_job = join_in_job_restarts(read_recoveries(path), metrics)
    unknown: List[str] = []
    if metrics and not timed:
        unknown.append("step-level figures: metrics.jsonl events carry no time")

    starts: List[StartReport] = []
    trained: List[Tuple[List[Tuple[float, int]], float]] = []  # per start: (time, step) records, training's end
    for i, p in enumerate(prov):
        job_id, restart = str(p.get("job_id", "")), _int(p.get("restart")) or 0
        t_prov = float(p["time"])
        t_next = float(prov[i + 1]["time"]) if i + 1 < len(prov) else float("inf")
        # in-job restarts (``recovery``): several training steps, each a start, in one job start (the same job id
        # and restart count), whose accounting row and end record are the job start's, i.e. its last step's
        same_before = i > 0 and _same_job_start(prov[i - 1], job_id, restart)
        same_after = i + 1 < len(prov) and _same_job_start(prov[i + 1], job_id, restart)
        window = [m for m in timed if t_prov <= float(m["time"]) < t_next]
        from_samples = False
        if not any(_is_step(m) for m in window):  # a script of one's own: its progress samples, if any
            mine = [m for m in sampled if t_prov <= float(m["time"]) < t_next]
            if mine:
                window = sorted(window + mine, key=lambda m: float(m["time"]))
                timed += mine
                from_samples = True
        # -- start
        row = rows.get((job_id, restart)) or by_restart.get(restart)
        t0, start_source = t_prov, "provenance"
        if same_before:  # a later step of the job start: it began with its own rank 0 (accounting has the job's)
            pass
        elif row is not None and sacct_epoch(row.start) is not None:
            t0, start_source = min(float(sacct_epoch(row.start) or t_prov), t_prov), "sacct"
        else:
            launched = [
                float(j["time"])
                for j in jobs
                if str(j.get("job_id", "")) == job_id
                and _int(j.get("restart")) in (None, restart)
                and _num(j.get("time")) is not None
                and float(j["time"]) <= t_prov
            ]
            if launched and jobs and str(jobs[-1].get("backend", "")) == "local":
                t0, start_source = max(launched), "launcher"
        # -- end
        last_record = max((float(m["time"]) for m in window), default=t_prov)
        end_rec = next(
            (e for e in ends if str(e.get("job_id", "")) == job_id and _int(e.get("restart")) == restart), None
        )
        end: Optional[float] = None
        end_source = ""
        if same_after:  # the allocation went on into the next step: this start ends where it begins
            end, end_source, end_rec, row = t_next, "next step", None, None
        elif row is not None and sacct_epoch(row.end) is not None:
            end, end_source = sacct_epoch(row.end), "sacct"
            end = _within_second(end, end_rec)
        elif end_rec is not None and _num(end_rec.get("time")) is not None:
            end, end_source = float(end_rec["time"]), str(end_rec.get("by") or "launcher")
        elif i + 1 < len(prov) or alive is False or finished is not None:
            end, end_source = last_record, "last record"
        else:
            end, end_source = now, "now"
        end = max(float(end if end is not None else last_record), last_record)
        # -- how it ended
        ev = {m.get("event") for m in window}
        preempted = next((m for m in window if m.get("event") == "preempted"), None)
        restarted = [
            x.to_dict() for x in in_job if x.job_id == job_id and x.restart == restart and t_prov <= x.lost_at < t_next
        ]
        ended, reason = _ending(path, job_id, restart, window, row, end_rec, preempted, end_source, finished)
        lost_here = [x for x in restarted if not x["in_process"]]
        if same_after and ended not in ("finished", "preempted"):
            ended, reason = (
                "node_lost",
                (
                    f"node {','.join(lost_here[-1]['lost']) or '?'} lost or hung: in-job restart "
                    f"{lost_here[-1]['attempt']} in the same job"
                    if lost_here
                    else "the job's next training step started (an in-job restart; no recovery record found)"
                ),
            )
        # -- steps and phases
        nodes = str(p.get("nodes") or (row.nodes if row is not None else "") or "")
        fs = next((m for m in window if m.get("event") == "first_step"), None)
        count = _int(fs.get("nodes")) if fs is not None else None
        count = count or (row.nnodes if row is not None and row.nnodes else None) or node_count(nodes) or config_nodes
        st = StartReport(
            index=i,
            job_id=job_id,
            restart=restart,
            nodes=nodes,
            node_count=count,
            start=t0,
            end=end,
            start_source=start_source,
            end_source=end_source,
            ended=ended,
            reason=reason,
            queue_wait_s=None,
            phases_s=dict.fromkeys(PHASES, 0.0),
        )
        # the start's own resume (an in-process recovery's, later in the start, resumes the survivors' state)
        resume = next((m for m in window if m.get("event") == "resume" and not m.get("in_process")), None)
        st.resumed_from_step = _int(resume.get("step")) if resume is not None else None
        passed = next((r for r in script_resumes if (r.job_id, r.restart) == (job_id, restart)), None)
        if passed is not None:  # a train.command start: what it passed its script decides where it began
            st.resume = resume_lines(passed)[0]
            if st.resumed_from_step is None and passed.resumed and passed.step is not None:
                st.resumed_from_step = passed.step
        if st.resumed_from_step is None and fs is not None:
            st.resumed_from_step = (_int(fs.get("step")) or 1) - 1
        if st.resumed_from_step is None and passed is not None and passed.outcome in FROM_STEP_0:
            st.resumed_from_step = 0  # nothing to pass it: a checkpoint-less start (its records show no step)
        steps = [
            (float(m["time"]), int(m["step"]))
            for m in window
            if m.get("event") in ("first_step", "train") and _int(m.get("step")) is not None
        ]
        if fs is None and steps:
            st.unknown.append("start-up end: no first_step event (the first logged step is taken)")
        if not steps:
            st.unknown.append("training steps: this start logged no step with a time")
        if "eval" in ev and any(m.get("event") == "eval" and "duration_s" not in m for m in window):
            st.unknown.append("evaluation time: eval events without duration_s")
        if preempted is not None:
            st.signal_time = _num(preempted.get("signal_time")) or _num(preempted.get("time"))
        elif ended == "preempted":  # a script of one's own told to stop: when its launch wrapper recorded it
            st.signal_time = _stop_recorded(path, job_id, restart)
        if from_samples:
            st.unknown.append(
                "steps: from the watchdog's samples of slurm_ddp.progress (at most one a second); the step it "
                "resumed from is its first step − 1 in the script's own count (its checkpoints are its own)"
            )
        st.in_job_restarts = restarted
        trained.append((steps, _split(st, window, steps, preempted)))
        starts.append(st)

    # -- redone steps: what the next start did not resume after
    for k, (st, nxt) in enumerate(zip(starts, starts[1:])):
        window = [m for m in timed if st.start <= float(m["time"]) <= st.end]
        _redo(st, nxt.resumed_from_step, window, *trained[k])
    for st in starts:
        if st.last_step is not None:
            base = st.resumed_from_step or 0
            st.steps_kept = max(st.last_step - base - (st.redone_steps or 0), 0)
        _close(st)
    # -- queue waits
    for i, st in enumerate(starts):
        prev = starts[i - 1] if i else None
        if prev is not None and prev.job_id == st.job_id:
            st.queue_wait_s = max(st.start - prev.end, 0.0)
        else:
            subs = [
                float(j["time"])
                for j in jobs
                if str(j.get("job_id", "")) == st.job_id and _num(j.get("time")) is not None
            ]
            st.queue_wait_s = max(st.start - min(subs), 0.0) if subs else None
            if st.queue_wait_s is None:
                st.unknown.append("queue wait: no submission recorded for this job id")
    sources = {s.start_source == "sacct" and s.end_source == "sacct" for s in starts}
    alloc_src = "sacct" if sources == {True} else "run directory" if sources == {False} else "sacct and run directory"
    if not starts:
        unknown.append("starts: provenance.json records none (the run never started, or predates it)")
    step_level = any(steps for steps, _ in trained)
    if starts and not step_level:
        unknown.append(
            "productive time, goodput and redone steps: no step is recorded with a time (the worker writes them; "
            'a script of its own appends {"event": "train", "step": N, "time": T} lines to metrics.jsonl)'
        )
    return RunReport(
        run=name or path.name,
        path=path,
        starts=starts,
        allocated_source=alloc_src,
        unknown=unknown,
        step_level=step_level,
        checkpoint_interval=last_interval(metrics),
    )


def _within_second(sacct_end: Optional[float], end_rec: Optional[Dict[str, Any]]) -> Optional[float]:
    """sacct's whole-second ``End`` (the second the job ended, truncated), or the run directory's end
    record's time (``rundir.record_end``, sub-second) when that falls within it: the same end, finer."""
    t = _num(end_rec.get("time")) if end_rec is not None else None
    if sacct_end is not None and t is not None and sacct_end <= t < sacct_end + 1.0:
        return t
    return sacct_end


def _is_step(m: Dict[str, Any]) -> bool:
    return m.get("event") in ("first_step", "train") and _int(m.get("step")) is not None


def samples_as_events(samples: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Rank 0's watchdog samples (``rundir.read_progress_samples``) as the worker's events: the first
    step → ``first_step``; a sample in a training phase → ``train``; an ``eval`` or ``checkpoint``
    phase → an ``eval`` (``duration_s``) or ``checkpoint`` (``blocked_s``) event at its end, lasting
    to the next sample's time (the rank's next report: the phase's end, or up to a sample later)."""
    rows = [s for s in samples if _num(s.get("time")) is not None and _int(s.get("step")) is not None]
    out: List[Dict[str, Any]] = []
    for k, smp in enumerate(rows):
        t, step, phase = float(smp["time"]), int(smp["step"]), str(smp.get("phase", ""))
        if smp.get("first"):
            out.append({"event": "first_step", "step": step, "time": t, "source": "progress"})
        elif phase in ("step", "data") and step > 0:
            out.append({"event": "train", "step": step, "time": t, "source": "progress"})
        elif phase in ("eval", "checkpoint"):
            later = [float(r["time"]) for r in rows[k + 1 :] if str(r.get("phase", "")) != phase]
            if not later:
                continue  # the rank ended in it: the start's tail (stop or other)
            d = max(later[0] - t, 0.0)
            key = "duration_s" if phase == "eval" else "blocked_s"
            out.append({"event": phase, "step": step, key: d, "time": t + d, "reason": "script", "source": "progress"})
    return out


def _same_job_start(prov: Dict[str, Any], job_id: str, restart: int) -> bool:
    """Whether the provenance start ``prov`` is of job ``job_id`` at ``restart`` (an in-job restart's step)."""
    return str(prov.get("job_id", "")) == job_id and (_int(prov.get("restart")) or 0) == restart


def _stop_recorded(path: Path, job_id: str, restart: int) -> Optional[float]:
    """When the first stop signal of a ``train.command`` start was recorded (its launch wrapper's
    record's modification time, ``rundir.stop_dir``); None without one."""
    try:
        return min((p.stat().st_mtime for p in stop_dir(path, job_id, restart).glob("rank-*")), default=None)
    except OSError:
        return None


def _ending(
    path: Path,
    job_id: str,
    restart: int,
    window: Sequence[Dict[str, Any]],
    row: Optional[AccountingRow],
    end_rec: Optional[Dict[str, Any]],
    preempted: Optional[Dict[str, Any]],
    end_source: str,
    finished: Optional[Dict[str, Any]],
) -> Tuple[str, str]:
    """(one of :data:`ENDINGS`, why in words) for one start."""
    if any(m.get("event") == "finished" for m in window) or (
        finished is not None
        and str(finished.get("job_id", "")) == job_id
        and str(finished.get("restart")) == str(restart)
    ):
        return "finished", f"finished ({FINISHED_NAME} written)"
    if preempted is not None:
        return (
            "preempted",
            f"stopped on {preempted.get('signal', 'a signal')}, checkpoint of step {preempted.get('step')}",
        )
    hang = find_hang(path, job_id, restart)
    if hang is not None:
        return "failed", hang.line()
    stops = read_rank_stops(path, job_id, restart)
    if row is not None:
        state = row.state
        if state == "TIMEOUT":
            return "timed_out", "time limit reached (sacct TIMEOUT)"
        if state == "NODE_FAIL":
            return "node_lost", f"node failure (sacct NODE_FAIL on {row.nodes})"
        if state in (PREEMPTED_STATE, "REQUEUED") and stops.told:
            return "preempted", f"stopped on {', '.join(stops.signals)} (sacct {state}); checkpoint: the script's own"
        if state in (PREEMPTED_STATE, "REQUEUED", "CANCELLED"):
            return "killed", f"sacct {state} without a checkpoint of the worker"
        if state == "RUNNING":
            return "running", "running (sacct)"
        if state == "COMPLETED":
            return "finished", "completed (sacct)"
        return "failed", f"sacct {state}, exit {row.exit_code}"
    if stops.told:
        return "preempted", f"stopped on {', '.join(stops.signals)}; checkpoint: the script's own"
    if end_rec is not None:
        code = _int(end_rec.get("exit_code"))
        if code == _KILLED_STATUS:
            return "killed", "a rank was killed (SIGKILL, status 137)"
        if code == 0:
            return "finished", "exited with status 0"
        return "failed", f"exited with status {code}"
    if end_source == "now":
        return "running", "no end recorded yet: still running"
    return "killed", "no record of its end: killed together with its supervisor, or its node was lost"


def _split(
    st: StartReport,
    window: Sequence[Dict[str, Any]],
    steps: Sequence[Tuple[float, int]],
    preempted: Optional[Dict[str, Any]],
) -> float:
    """Fill ``st.phases_s`` (all but ``train_redone`` and ``other``) from the start's records;
    returns when its training ended (the stop signal, else its last step)."""
    ph = st.phases_s
    stop_at = st.signal_time if st.signal_time is not None else st.end
    stop_at = min(max(stop_at, st.start), st.end)
    if not steps:  # no step recorded: start-up, training and saves cannot be told apart
        ph["unknown"] = stop_at - st.start
        ph["stop"] = st.end - stop_at
        return stop_at
    t_first, first = steps[0]
    t_first = min(max(t_first, st.start), stop_at)
    st.first_step = first
    last = max(s for _, s in steps)
    if preempted is not None and _int(preempted.get("step")) is not None:
        last = max(last, int(preempted["step"]))
    st.last_step = last
    t_train_end = min(max(t for t, _ in steps), stop_at) if st.signal_time is None else stop_at
    ph["startup"] = t_first - st.start
    ph["stop"] = st.end - stop_at
    for m in window:
        t = _num(m.get("time"))
        if t is None or t > stop_at:
            continue
        if m.get("event") == "eval":
            ph["eval"] += _num(m.get("duration_s")) or 0.0
        elif m.get("event") == "checkpoint" and not str(m.get("reason", "")).startswith("preemption"):
            ph["checkpoint"] += _num(m.get("blocked_s")) or 0.0
    blocked = _blocking_within(window, t_first, t_train_end)
    ph["recovery"] = _in_process_recovery_s(st, window, steps, t_first, t_train_end)
    ph["train_kept"] = max(t_train_end - t_first - blocked - ph["recovery"], 0.0)
    return t_train_end


def _in_process_recovery_s(
    st: StartReport, window: Sequence[Dict[str, Any]], steps: Sequence[Tuple[float, int]], lo: float, hi: float
) -> float:
    """Seconds of ``st``'s in-process recoveries within its training (``lo`` → ``hi``): each from its lost step's
    time (``lost_step``, interpolated between the step records; else the loss's time) to its ``resume``, less
    any save or evaluation that blocked within it (counted in their own phases). A recovery not resumed yet
    counts nothing."""
    total = 0.0
    points = sorted(steps, key=lambda pt: pt[0])
    for x in st.in_job_restarts:
        resumed = _num(x.get("resumed_at"))
        if not x.get("in_process") or resumed is None:
            continue
        step = _int(x.get("lost_step"))
        t_lost = _time_of_step(points, step) if step is not None else None
        t_from = max(t_lost if t_lost is not None else _num(x.get("lost_at")) or resumed, lo)
        t_to = min(resumed, hi)
        if t_to > t_from:
            total += t_to - t_from - _blocking_within(window, t_from, t_to)
    return max(total, 0.0)


def _redo(
    st: StartReport,
    resumed_next: Optional[int],
    window: Sequence[Dict[str, Any]],
    steps: Sequence[Tuple[float, int]],
    t_end: float,
) -> None:
    """Move the time of the steps the next start computed again (after ``resumed_next``) from
    ``train_kept`` to ``train_redone``; ``steps``: the start's (time, step) records, ``t_end``:
    when its training ended."""
    if st.last_step is None:
        return
    if resumed_next is None:
        st.unknown.append("redone steps: the next start did not say which step it resumed from")
        return
    base = max(resumed_next, st.resumed_from_step or 0)
    redone = max(st.last_step - base, 0)
    st.redone_steps = redone
    if not redone:
        return
    pts = [(st.start, st.resumed_from_step or 0)] + [pt for pt in steps if pt[1] >= (st.resumed_from_step or 0)]
    t_from = _time_of_step(sorted(pts, key=lambda pt: pt[0]), base)
    if t_from is None:
        t_from = steps[0][0] if steps else st.start
    t_from = max(t_from, steps[0][0] if steps else st.start)
    lost = _blocking_within(window, t_from, t_end) + _in_process_recovery_s(st, window, steps, t_from, t_end)
    moved = max(min(t_end - t_from - lost, st.phases_s["train_kept"]), 0.0)
    st.phases_s["train_kept"] -= moved
    st.phases_s["train_redone"] += moved


def _close(st: StartReport) -> None:
    """``other`` = wall − the rest (≥ 0: when the records overlap, the wall time grows to hold them)."""
    rest = sum(v for k, v in st.phases_s.items() if k != "other")
    st.phases_s["other"] = max(st.wall_s - rest, 0.0)
    if rest > st.wall_s:
        st.end = st.start + rest
        st.unknown.append("end: the records outlast the recorded end; the end was moved to hold them")


# --------------------------------------------------------------------------- words
def losses(rep: RunReport, top: int = 3) -> List[Dict[str, Any]]:
    """The ``top`` largest non-productive phases of ``rep`` in node-seconds, each with a sentence."""
    alloc = rep.allocated_node_s
    if alloc <= 0 or not rep.step_level:
        return []
    totals = rep.phases_node_s
    out: List[Dict[str, Any]] = []
    for k in sorted((k for k in PHASES if k != "train_kept"), key=lambda k: -totals[k]):
        if totals[k] <= 0 or len(out) >= top:
            continue
        frac = totals[k] / alloc
        out.append({"phase": k, "node_s": totals[k], "fraction": frac, "words": _loss_words(rep, k, frac)})
    return out


def _loss_words(rep: RunReport, phase: str, frac: float) -> str:
    n = len(rep.starts)
    per = [s.phases_s[phase] for s in rep.starts]
    head = f"{PHASE_WORDS[phase]} {frac * 100:.0f} %"
    if phase == "startup":
        return (
            f"{head}: {sum(per) / max(n, 1):.1f} s from job start to the first step done, on average over {n} start(s)"
        )
    if phase == "train_redone":
        lost = [s for s in rep.starts if s.redone_steps]
        how = ", ".join(f"{s.redone_steps} after start {s.index} ({s.ended})" for s in lost)
        return f"{head}: {rep.redone_steps} steps computed again ({how}); checkpoint more often to lose fewer"
    if phase == "recovery":
        n = sum(1 for s in rep.starts for x in s.in_job_restarts if x.get("in_process"))
        return (
            f"{head}: {sum(per):.1f} s from a lost node's last step to training again, over {n} in-process recoveries"
        )
    if phase == "eval":
        return f"{head}: {sum(per):.1f} s of evaluation"
    if phase == "checkpoint":
        return f"{head}: {sum(per):.1f} s of training blocked by checkpoint saves"
    if phase == "unknown":
        blind = [s for s in rep.starts if s.phases_s["unknown"] > 0]
        return (
            f"{head}: {sum(per):.1f} s of {len(blind)} start(s) that recorded no step (start-up or training: unknown)"
        )
    if phase == "stop":
        stops = [s for s in rep.starts if s.phases_s["stop"] > 0]
        return f"{head}: {sum(per):.1f} s from stop signal to exit over {len(stops)} stop(s) (includes the final save)"
    return f"{head}: {sum(per):.1f} s not accounted for by a phase (exit, final write, the tail of a failure)"


# --------------------------------------------------------------------------- sweeps
@dataclass
class SweepReport:
    """Every element's :class:`RunReport` of a sweep and their totals."""

    name: str
    path: Path
    elements: List[Tuple[int, str, RunReport]]  #: (index, label, report)

    @property
    def allocated_node_s(self) -> float:
        return sum(r.allocated_node_s for _, _, r in self.elements)

    @property
    def productive_node_s(self) -> Optional[float]:
        """Σ of the elements' productive node-seconds; None when one of them is unknown."""
        parts = [r.productive_node_s for _, _, r in self.elements]
        return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)

    @property
    def goodput(self) -> Optional[float]:
        a, p = self.allocated_node_s, self.productive_node_s
        return p / a if a > 0 and p is not None else None

    def to_dict(self) -> Dict[str, Any]:
        return {
            "sweep": self.name,
            "path": str(self.path),
            "allocated_node_s": self.allocated_node_s,
            "productive_node_s": self.productive_node_s,
            "goodput": self.goodput,
            "redone_steps": sum(r.redone_steps or 0 for _, _, r in self.elements),
            "restarts": sum(r.restarts for _, _, r in self.elements),
            "queue_wait_s": sum(r.queue_wait_s for _, _, r in self.elements),
            "elements": [{"index": i, "label": label, **r.to_dict()} for i, label, r in self.elements],
        }


def report(path: Path, run_cmd: Optional[Runner] = None) -> Union[RunReport, SweepReport]:
    """The report of a run or sweep directory (``slurm-ddp report``): accounting asked through
    ``run_cmd`` (default ``subprocess.run``) for a run of a Slurm backend; a local run is read from
    its run directory alone (its local supervisor's lock says whether it still runs)."""
    import subprocess

    from ..rundir import is_sweep_dir
    from .accounting import history
    from .ownjob import job_identities
    from .runs import read_run
    from .status import launcher_lock_held

    runner: Runner = subprocess.run if run_cmd is None else run_cmd

    def one(run_path: Path) -> RunReport:
        run = read_run(run_path)
        acc = None if run.is_local else history(run.job_ids, runner, job_identities(run))
        if acc is not None and acc.unavailable:
            acc = None
        alive: Optional[bool] = None
        if run.finished is not None:
            alive = False
        elif run.is_local:
            held = launcher_lock_held(run.path)
            alive = None if held is None else held
        nodes = (run.world_size or 1) // max(_tasks_per_node(run.path), 1)
        rep = run_report(run.path, name=run.name, accounting=acc, alive=alive, config_nodes=max(nodes, 1))
        if acc is None and not run.is_local:
            rep.unknown.append("Slurm accounting (sacct) did not answer: start and end times are the run directory's")
        return rep

    if is_sweep_dir(path):
        from .sweeps import read_sweep

        sw = read_sweep(path)
        return SweepReport(
            name=sw.name, path=sw.path, elements=[(e.index, e.label, one(e.run.path)) for e in sw.elements]
        )
    return one(path)


def _tasks_per_node(path: Path) -> int:
    from ..config import read_yaml
    from ..errors import ConfigError
    from ..rundir import CONFIG_NAME

    try:
        data = read_yaml(path / CONFIG_NAME)
    except ConfigError:
        return 1
    slurm = data.get("slurm") if isinstance(data, dict) else None
    tasks = slurm.get("tasks_per_node") if isinstance(slurm, dict) else None
    return tasks if isinstance(tasks, int) and tasks > 0 else 1


__all__ = [
    "report",
    "ENDINGS",
    "PHASES",
    "PHASE_WORDS",
    "RUN_FIELDS",
    "START_FIELDS",
    "RunReport",
    "StartReport",
    "SweepReport",
    "losses",
    "run_report",
    "sacct_epoch",
]
