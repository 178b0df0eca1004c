"""When the shared worker saves a periodic checkpoint: ``checkpoint.every_steps`` (fixed steps),
``checkpoint.every_s`` (seconds of training) or ``auto`` (the interval rule, ``slurm_ddp.rundir.interval``).

The Trainer asks :meth:`SaveSchedule.due` after each step and tells it :meth:`SaveSchedule.saved` after each
periodic save. A fixed ``every_steps`` needs nothing else (every rank counts the same steps). A time-based or
``auto`` interval is measured on rank 0 (its step time, the time a save blocked it, its background write) and
turned into a step number that every rank agrees on: rank 0 broadcasts the step of the next save at the start
of each ``train()`` (after a start, and after each in-process recovery, so a joining spare agrees too) and after
each periodic save — one small collective per save, none per step. Before anything is measured, the first
agreement point comes :data:`BOOTSTRAP_STEPS` steps in: under ``auto`` with no save cost recorded by an earlier
start of the run, a save there measures it; otherwise rank 0 only measures the step time there.

Side effects: rank 0 logs each interval it chooses and writes a ``checkpoint_interval`` event to
``metrics.jsonl`` (through the ``write`` callable); reads the run's ``metrics.jsonl`` (its history). No torch.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Dict, List, Optional, Union

from ..config import JobConfig, parse_time_s
from ..rundir import interval as rule

log = logging.getLogger("slurm_ddp.worker")

#: steps into a start (or after an in-process recovery) at which a time-based or auto interval is first set
BOOTSTRAP_STEPS = 20
#: weight of the newest measurement in the running means of the save cost and the step time
EWMA = 0.5


def _ewma(old: Optional[float], new: float) -> float:
    return new if old is None else (1 - EWMA) * old + EWMA * new


class SaveSchedule:
    """The periodic-save decision of one rank (the same answer on every rank at every step).

    ``cfg``: the job config; ``is_main``: rank 0 (the one that measures and decides; a callable: asked each time); ``nodes``: the
    allocation's node count (the default MTBF); ``history``: a callable returning the run's ``metrics.jsonl``
    records (``rundir.read_metrics``); ``broadcast``: a collective that returns rank 0's value on every rank;
    ``write``: writes one ``metrics.jsonl`` record (rank 0); ``clock``: seconds (``time.perf_counter``); ``wall``:
    epoch seconds (``time.time``, the records' clock).
    """

    def __init__(
        self,
        cfg: JobConfig,
        *,
        is_main: Union[bool, Callable[[], bool]],
        nodes: int,
        history: Callable[[], List[Dict[str, Any]]],
        broadcast: Callable[[Any], Any],
        write: Callable[..., None],
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ):
        ck = cfg.checkpoint
        self.auto = ck.auto_interval
        self.fixed_steps = 0 if self.auto else int(ck.every_steps)
        self.fixed_s = 0.0 if self.auto else float(ck.every_s)
        self.timed = self.auto or self.fixed_s > 0
        self._is_main = is_main
        self.history, self.broadcast, self.write = history, broadcast, write
        self.clock, self.wall = clock, wall
        self.async_save = ck.async_save
        self.max_interval_s = ck.max_interval_s
        self.mtbf_default_s = ck.mtbf_s if ck.mtbf_s is not None else rule.default_mtbf_s(max(1, nodes))
        try:
            self.time_limit_s: Optional[float] = float(parse_time_s(cfg.slurm.time))
        except (ValueError, TypeError):
            self.time_limit_s = None
        self.signal_delay_s = float(cfg.requeue.signal_delay_s)
        self.cost_s: Optional[float] = None  # C: running mean of rank 0's blocked time per periodic save
        self.write_s: Optional[float] = None  # running mean of one background write
        self.step_s: Optional[float] = None  # running mean of one step (rank 0)
        self.next_step: Optional[int] = None  # the agreed step of the next time-based save (or agreement point)
        self.saving_at_next = False  # whether next_step saves (False: a bootstrap point that only measures)
        self.interval: Optional[rule.Interval] = None  # the last interval chosen
        self._mark_t = 0.0
        self._mark_step = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 now (a callable ``is_main`` is asked each time: in-process recovery may renumber the ranks)."""
        return self._is_main() if callable(self._is_main) else self._is_main

    # ------------------------------------------------------------------ the Trainer's questions
    def begin(self, step: int) -> None:
        """Collective when timed: at the start of ``train()`` (every rank, the same ``step``)."""
        self._mark(step)
        if not self.timed:
            return
        plan = None
        if self.is_main:
            if self.auto and self.cost_s is None:
                costs = rule.measured_costs(self.history())  # an earlier start's saves: its first guess
                self.cost_s, self.write_s = costs["blocked_s"], costs["write_s"]
            # the first point measures the step time; it saves when auto has no save cost to go on
            plan = (step + BOOTSTRAP_STEPS, self.auto and self.cost_s is None)
        self.next_step, self.saving_at_next = self.broadcast(plan)

    def due(self, step: int) -> bool:
        """Whether this step ends with a periodic save (every rank gets the same answer)."""
        if self.fixed_steps and step % self.fixed_steps == 0:
            return True
        return self.timed and self.next_step is not None and step >= self.next_step and self.saving_at_next

    def agree_due(self, step: int) -> bool:
        """Whether this step is an agreement point without a save (then call :meth:`agree`)."""
        return self.timed and self.next_step is not None and step >= self.next_step and not self.saving_at_next

    def agree(self, step: int) -> None:
        """Collective: rank 0 measured the step time; every rank learns the step of the next save."""
        self._measure_steps(step)
        self._decide(step)

    def saved(self, step: int, blocked_s: Optional[float], write_s: Optional[float]) -> None:
        """After a periodic save at ``step`` (collective when timed): rank 0's ``blocked_s`` (None on other
        ranks) and the last finished background write's seconds (None: none yet, or synchronous saves)."""
        if blocked_s is not None:
            self.cost_s = _ewma(self.cost_s, blocked_s)
        if write_s is not None:
            self.write_s = _ewma(self.write_s, write_s)
        if not self.timed:
            self._mark(step)
            return
        self._measure_steps(step, minus_s=blocked_s or 0.0)
        self._decide(step)

    # ------------------------------------------------------------------ inside
    def _mark(self, step: int) -> None:
        self._mark_t, self._mark_step = self.clock(), step

    def _measure_steps(self, step: int, minus_s: float = 0.0) -> None:
        now = self.clock()
        n = step - self._mark_step
        if n > 0:
            self.step_s = _ewma(self.step_s, max(1e-9, (now - self._mark_t - minus_s) / n))
        self._mark_t, self._mark_step = now, step

    def _decide(self, step: int) -> None:
        plan = None
        if self.is_main:
            if self.auto and self.cost_s is None:  # a rank 0 that never saved (renumbered): the run's records
                self.cost_s = rule.measured_costs(self.history())["blocked_s"]
            if self.auto and self.cost_s is None:  # nothing recorded either: a save that measures it
                plan = (step + BOOTSTRAP_STEPS, True)
            else:
                plan = (step + max(1, self._choose(step)), True)
        self.next_step, self.saving_at_next = self.broadcast(plan)

    def _choose(self, step: int) -> int:
        """Rank 0: the steps to the next save, from the figures so far."""
        step_s = self.step_s or 1.0
        if not self.auto:
            return max(1, int(round(self.fixed_s / step_s)))
        metrics = self.history()
        history = rule.interruption_history(metrics, now=self.wall())
        chosen = rule.choose_interval(
            checkpoint_cost_s=self.cost_s or 0.0,
            mtbf_default_s=self.mtbf_default_s,
            history=history,
            write_s=self.write_s if self.async_save else None,
            step_s=self.step_s,
            time_limit_s=self.time_limit_s,
            signal_delay_s=self.signal_delay_s,
            max_interval_s=self.max_interval_s,
        )
        old, self.interval = self.interval, chosen
        if old is None or abs(math.log((chosen.every_s or 1e-9) / (old.every_s or 1e-9))) > 0.25:  # a new figure
            log.info("%s (at step %d)", chosen.words(), step)
        self.write(**chosen.record(), step=step, next_step=step + (chosen.every_steps or 1))
        return chosen.every_steps or max(1, int(math.ceil(chosen.every_s / step_s)))
