"""The checkpoint interval rule (``checkpoint.every_steps: auto`` / ``checkpoint.every_s: auto``):
how often to save, from the measured cost of a save and the expected time between interruptions.

Pure functions of figures and of the run directory's records (:func:`interruption_history` reads
``metrics.jsonl``); imports no torch. The shared worker asks :func:`choose_interval` at each of its
saves and logs the :class:`Interval` it got (``metrics.jsonl`` event ``checkpoint_interval``:
:meth:`Interval.record`); a script of its own gets the same rule through ``slurm_ddp.preemption``
(``checkpoint_interval``, ``should_checkpoint``) and the environment variable
:data:`EVERY_S_VAR`; ``slurm-ddp report`` shows the last one a run chose (:func:`last_interval`).

**The rule.** For a blocking checkpoint cost ``C`` (seconds training waits for one save) and a mean
time between interruptions that lose work ``M`` (seconds), the interval of compute between saves is
Daly's higher-order estimate (J. T. Daly, "A higher order estimate of the optimum checkpoint
interval for restart dumps", Future Generation Computer Systems 22(3), 2006, eq. 37)::

    tau = sqrt(2 C M) * (1 + sqrt(C / (2 M)) / 3 + (C / (2 M)) / 9) - C     for C < 2 M
    tau = M                                                                    otherwise

whose first term is Young's first-order optimum ``sqrt(2 C M)`` (J. W. Young, "A first order
approximation to the optimum checkpoint interval", Communications of the ACM 17(9), 1974). It
minimises the expected loss ``C / tau + (tau / 2 + R) / M`` per unit of time (the restart cost ``R``
does not move the optimum).

**M.** Interruptions that lose the steps since the last save: process deaths, lost or hung nodes,
kills. The planned stop before the time limit (``slurm.time - requeue.signal_delay_s``) and a
preemption by signal save synchronously when they stop, so they lose no steps and do not enter
``M``; the planned stop bounds the interval instead (an interval longer than a start's planned
length is never reached: the stop saves first). ``M`` combines the stated default ``mtbf_s`` and
the run's own history across its starts and in-process recoveries (:class:`History`) as the
posterior mean of a Gamma prior on the interruption rate worth one interruption at the default
(the conjugate prior of a Poisson process): ``M = (mtbf_s + observed_s) / (1 + interruptions)``.
With no history that is the default; each interruption the run sees shortens it.

**Bounds**, in this order: never more often than the background writer can keep up (``tau >=``
the measured time of one asynchronous write: a save sooner would wait for the previous one);
never less often than the stated cap ``max_interval_s``; at least one step.

**Default MTBF.** :data:`NODE_MTBF_S` per node, divided by the node count (independent nodes):
Meta's RSC-1 saw 6.50 failures per 1000 node-days (Kokolis et al., "Revisiting Reliability in
Large-Scale Machine Learning Research Clusters", HPCA 2025), a node MTBF of about 154 days.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterable, List, Mapping, Optional

#: the chosen interval offered to a ``train.command`` script at its start, in seconds (``slurm_ddp.preemption``)
EVERY_S_VAR = "SLURM_DDP_CHECKPOINT_EVERY_S"
#: the expected seconds between interruptions at the start (M), for ``preemption.checkpoint_interval``
MTBF_VAR = "SLURM_DDP_CHECKPOINT_MTBF_S"
#: the cap on the interval, seconds (``checkpoint.max_interval_s``)
MAX_INTERVAL_VAR = "SLURM_DDP_CHECKPOINT_MAX_INTERVAL_S"
#: the value of ``checkpoint.every_steps`` / ``checkpoint.every_s`` that asks this rule
AUTO = "auto"
#: the ``metrics.jsonl`` event of a chosen interval
EVENT = "checkpoint_interval"

#: a node's mean time between failures, seconds: 1000 / 6.50 node-days (Meta RSC-1, HPCA 2025)
NODE_MTBF_S = 1000.0 / 6.50 * 86400.0
#: the cap on the interval when the config states none, seconds
DEFAULT_MAX_INTERVAL_S = 3600.0


def default_mtbf_s(nodes: int) -> float:
    """The stated default mean time between interruptions of a job on ``nodes`` nodes, seconds:
    :data:`NODE_MTBF_S` / nodes. Raises ``ValueError`` for ``nodes < 1``."""
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    return NODE_MTBF_S / nodes


def daly_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum compute time between checkpoints, seconds, for a
    checkpoint cost ``cost_s`` and mean time between interruptions ``mtbf_s`` (both seconds, > 0
    for ``mtbf_s``; ``cost_s`` >= 0). ``cost_s == 0`` gives 0 (save at every chance)."""
    if mtbf_s <= 0:
        raise ValueError(f"mtbf_s must be > 0, got {mtbf_s}")
    if cost_s < 0:
        raise ValueError(f"cost_s must be >= 0, got {cost_s}")
    if cost_s >= 2 * mtbf_s:
        return mtbf_s
    x = cost_s / (2 * mtbf_s)
    return max(0.0, math.sqrt(2 * cost_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - cost_s)


def young_interval_s(cost_s: float, mtbf_s: float) -> float:
    """Young's (1974) first-order optimum ``sqrt(2 C M)``, seconds (shown beside Daly's)."""
    return math.sqrt(2 * max(0.0, cost_s) * mtbf_s)


def expected_efficiency(
    interval_s: float, cost_s: float, restart_s: float, mtbf_s: float, redo_fraction: float = 0.5
) -> float:
    """The first-order share of the allocation that trains, ``1 - C/tau - (tau/2 + R)/M``, for a
    save every ``interval_s`` of compute costing ``cost_s``, a restart costing ``restart_s`` and
    interruptions every ``mtbf_s`` (all seconds). The benchmark's analytic limit; not clipped.

    ``redo_fraction``: the share of an interval an interruption computes again, 1/2 for one at a
    uniformly random moment since the last save (Young 1974); 0 where nothing is rolled back (an
    in-process recovery keeps the survivors' state; an in-job restart resumes from the emergency
    checkpoint of the last step): then ``1 - C/tau - R/M``. Raises ``ValueError`` outside 0..1."""
    if not 0.0 <= redo_fraction <= 1.0:
        raise ValueError(f"redo_fraction must be 0..1, got {redo_fraction}")
    if interval_s <= 0:
        return -math.inf if cost_s > 0 else 1.0 - restart_s / mtbf_s
    return 1.0 - cost_s / interval_s - (redo_fraction * interval_s + restart_s) / mtbf_s


@dataclass(frozen=True)
class History:
    """A run's interruptions that lost work, and the running time over which it saw them."""

    observed_s: float = 0.0  # seconds the run trained (from each start's first step to its last record)
    interruptions: int = (
        0  # starts that ended without a save (not finished, not stopped by signal) + in-process recoveries
    )
    planned_stops: int = 0  # stops by signal that saved (time limit, preemption): not in M


def interruption_history(metrics: Iterable[Mapping[str, Any]], now: Optional[float] = None) -> History:
    """The :class:`History` in a run's ``metrics.jsonl`` records (``rundir.read_metrics``).

    A start begins at its ``first_step`` event; it ended planned when a ``preempted`` or
    ``finished`` event follows it before the next start, else it was interrupted (a death, a lost
    node, a kill: the next start redid steps). An in-process recovery (``resume`` with
    ``in_process``) is an interruption inside a start. ``observed_s``: each start's first step to
    its last record (the running start to ``now``, when given). Records without a ``time`` are skipped.
    The ``first_step`` the survivors write after an in-process recovery (the worker writes one per training
    loop) continues the start: the recovery is counted once, at its ``resume``.
    """
    observed = 0.0
    interruptions = planned = 0
    begin: Optional[float] = None
    last: Optional[float] = None
    ended_planned = False
    in_process = False  # an in-process recovery since the start's first step: the worker's next first_step is its
    for m in metrics:
        t = m.get("time")
        if not isinstance(t, (int, float)):
            continue
        ev = m.get("event")
        if ev == "first_step" and in_process and begin is not None:
            in_process = False  # the survivors' first step after their recovery (counted at its resume): same start
        elif ev == "first_step":
            if begin is not None and last is not None:
                observed += max(0.0, last - begin)
                if not ended_planned:
                    interruptions += 1
            begin, ended_planned = float(t), False
        elif begin is None:
            continue
        if ev in ("preempted", "finished"):
            ended_planned = True
            planned += ev == "preempted"
        elif ev == "resume" and m.get("in_process"):
            interruptions += 1
            in_process = True
        elif ev == "resume":  # a new start's resume from a checkpoint: its first_step begins it
            in_process = False
        last = float(t)
    if begin is not None and last is not None:
        end = max(last, now) if now is not None and not ended_planned else last
        observed += max(0.0, end - begin)
    return History(observed_s=observed, interruptions=interruptions, planned_stops=planned)


def estimate_mtbf_s(default_mtbf: float, history: History) -> float:
    """``(default + observed) / (1 + interruptions)``, seconds: the Gamma–Poisson posterior mean of the
    time between interruptions with a prior worth one interruption at ``default_mtbf``."""
    if default_mtbf <= 0:
        raise ValueError(f"default mtbf must be > 0, got {default_mtbf}")
    return (default_mtbf + max(0.0, history.observed_s)) / (1 + max(0, history.interruptions))


@dataclass(frozen=True)
class Interval:
    """A chosen checkpoint interval and the figures that chose it (seconds unless named)."""

    every_s: float  # compute time between saves
    every_steps: Optional[int]  # the same in steps (None without a measured step time)
    bound: str  # what set it: "daly", "writer" (the async write time), "cap", "planned_stop", "step"
    daly_s: float  # Daly's optimum before the bounds
    young_s: float  # Young's first-order optimum, for comparison
    checkpoint_cost_s: float  # C: training blocked per save
    write_s: Optional[float]  # one background write (None: synchronous saves or not measured)
    step_s: Optional[float]  # one training step
    mtbf_s: float  # M: the expected time between interruptions that lose work
    default_mtbf_s: float  # the stated default in M
    observed_s: float  # the run's history in M
    interruptions: int
    planned_stop_every_s: Optional[float]  # slurm.time - requeue.signal_delay_s
    max_interval_s: float  # the cap

    def record(self) -> Dict[str, Any]:
        """The ``metrics.jsonl`` event (``{"event": "checkpoint_interval", ...}``) of this choice."""
        return {"event": EVENT, **asdict(self)}

    def words(self) -> str:
        """One line for the log: the interval and what chose it."""
        steps = f" = {self.every_steps} steps of {self.step_s:.3f} s" if self.every_steps and self.step_s else ""
        write = f", background write {self.write_s:.3f} s" if self.write_s is not None else ""
        why = {
            "daly": "Daly's optimum",
            "writer": "the background writer's pace (Daly's optimum is shorter)",
            "cap": f"the cap {self.max_interval_s:.0f} s",
            "planned_stop": "a start's planned length (the time-limit stop saves)",
            "step": "one step",
        }[self.bound]
        return (
            f"checkpoint interval {self.every_s:.1f} s{steps}: {why}; checkpoint blocks {self.checkpoint_cost_s:.3f} s"
            f"{write}; MTBF {self.mtbf_s:.0f} s (default {self.default_mtbf_s:.0f} s, "
            f"{self.interruptions} interruptions in {self.observed_s:.0f} s of this run); Daly {self.daly_s:.1f} s"
        )


def choose_interval(
    *,
    checkpoint_cost_s: float,
    mtbf_default_s: float,
    history: History = History(),
    write_s: Optional[float] = None,
    step_s: Optional[float] = None,
    time_limit_s: Optional[float] = None,
    signal_delay_s: Optional[float] = None,
    max_interval_s: float = DEFAULT_MAX_INTERVAL_S,
) -> Interval:
    """The checkpoint interval for the measured figures (module docstring: rule, M, bounds).

    ``checkpoint_cost_s``: training blocked by one save (>= 0); ``write_s``: one background write
    (None when saves are synchronous); ``step_s``: one training step (None: ``every_steps`` None);
    ``time_limit_s``/``signal_delay_s``: ``slurm.time`` and ``requeue.signal_delay_s``;
    ``max_interval_s``: the cap (> 0). All seconds. Raises ``ValueError`` for a negative cost or a
    non-positive MTBF or cap.
    """
    if max_interval_s <= 0:
        raise ValueError(f"max_interval_s must be > 0, got {max_interval_s}")
    mtbf = estimate_mtbf_s(mtbf_default_s, history)
    daly = daly_interval_s(checkpoint_cost_s, mtbf)
    tau, bound = daly, "daly"
    planned = None
    if time_limit_s is not None:
        planned = max(0.0, time_limit_s - (signal_delay_s or 0.0))
        if planned > 0 and tau > planned:
            tau, bound = planned, "planned_stop"
    if tau > max_interval_s:
        tau, bound = max_interval_s, "cap"
    if write_s is not None and tau < write_s:
        tau, bound = write_s, "writer"
    steps: Optional[int] = None
    if step_s is not None and step_s > 0:
        steps = int(round(tau / step_s))
        if write_s is not None:
            steps = max(steps, math.ceil(write_s / step_s))  # never sooner than the writer, after rounding
        if steps < 1:
            steps, bound = 1, "step"
        tau = steps * step_s
    return Interval(
        every_s=tau,
        every_steps=steps,
        bound=bound,
        daly_s=daly,
        young_s=young_interval_s(checkpoint_cost_s, mtbf),
        checkpoint_cost_s=checkpoint_cost_s,
        write_s=write_s,
        step_s=step_s,
        mtbf_s=mtbf,
        default_mtbf_s=mtbf_default_s,
        observed_s=history.observed_s,
        interruptions=history.interruptions,
        planned_stop_every_s=planned,
        max_interval_s=max_interval_s,
    )


def measured_costs(metrics: Iterable[Mapping[str, Any]], last: int = 5) -> Dict[str, Optional[float]]:
    """The run's recorded save costs, from ``metrics.jsonl``: the mean ``blocked_s`` and ``previous_write_s``
    (the background write of the save before) of its last ``last`` periodic ``checkpoint`` events (None where none recorded it); a new start's
    first guess before it measured its own."""
    blocked: List[float] = []
    writes: List[float] = []
    for m in metrics:
        if m.get("event") != "checkpoint" or m.get("reason") != "periodic":
            continue
        if isinstance(m.get("blocked_s"), (int, float)):
            blocked.append(float(m["blocked_s"]))
        if isinstance(m.get("previous_write_s"), (int, float)):
            writes.append(float(m["previous_write_s"]))

    def mean(xs: List[float]) -> Optional[float]:
        return sum(xs[-last:]) / len(xs[-last:]) if xs else None

    return {"blocked_s": mean(blocked), "write_s": mean(writes)}


def last_interval(metrics: Iterable[Mapping[str, Any]]) -> Optional[Dict[str, Any]]:
    """The newest ``checkpoint_interval`` event of a run's ``metrics.jsonl`` records, or None."""
    found: Optional[Dict[str, Any]] = None
    for m in metrics:
        if m.get("event") == EVENT:
            found = dict(m)
    return found


def script_environment(
    metrics: Iterable[Mapping[str, Any]],
    *,
    mtbf_default_s: float,
    max_interval_s: float,
    time_limit_s: Optional[float],
    signal_delay_s: Optional[float],
    now: Optional[float] = None,
) -> Dict[str, str]:
    """What a ``train.command`` rank is offered at its start under ``auto`` (the rank wrapper sets these):
    :data:`MTBF_VAR` (M from the stated default and the run's history), :data:`MAX_INTERVAL_VAR`, and
    :data:`EVERY_S_VAR` — the interval itself, only when the run's records hold a measured save cost
    (``checkpoint`` events in ``metrics.jsonl``); without one the script passes its own to
    ``slurm_ddp.preemption.checkpoint_interval(cost_s=...)``. Values are decimal seconds."""
    records = list(metrics)
    history = interruption_history(records, now=now)
    out = {
        MTBF_VAR: f"{estimate_mtbf_s(mtbf_default_s, history):.3f}",
        MAX_INTERVAL_VAR: f"{max_interval_s:.3f}",
    }
    costs = measured_costs(records)
    if costs["blocked_s"] is not None:
        chosen = choose_interval(
            checkpoint_cost_s=costs["blocked_s"],
            mtbf_default_s=mtbf_default_s,
            history=history,
            write_s=costs["write_s"],
            time_limit_s=time_limit_s,
            signal_delay_s=signal_delay_s,
            max_interval_s=max_interval_s,
        )
        out[EVERY_S_VAR] = f"{chosen.every_s:.3f}"
    return out
