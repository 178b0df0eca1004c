"""The fault-tolerant part of one rank's training run: what it does when a peer is lost or hangs.

:class:`FaultTolerance` is owned by ``worker.train.Trainer`` (its ``fault`` attribute) and holds
everything of the run that only matters after a failure:

- the **emergency save**: the state of the last completed step, committed by a surviving rank alone
  after a lost or hung peer (in-job recovery, ``JobConfig.in_job_recovery``), with the model's
  persistent buffers as the failed step began (a forward pre-hook keeps them);
- the **hang saver**: a daemon thread that makes that save when this rank's hang watchdog reports a
  hang (``rundir.hangs``), before the watchdog ends the rank;
- the **peer failure**: the ``PeerFailure`` a failed collective becomes, after the emergency save and
  the step's peer-lost marker (``rundir.write_peer_lost``), and a crash of this rank told to the step's
  store;
- the **in-process join** (``recovery.in_process``, ``worker.inprocess``): this process's place in the
  step, its membership of the step's store, the current generation's plan, and the loop that leaves a
  broken process group, gets the next generation's plan and joins it with the training state a
  survivor broadcasts; a warm spare's wait until it is called in.

It reads and changes its owner's training state through :class:`Owner` (step, model, rank and world
size, the loader and DDP it rebuilds). Side effects: checkpoint files, ``metrics.jsonl`` lines, the
run directory's markers, the process group. Imports torch.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Protocol

import torch
import torch.distributed as dist

from ..checkpoint import AsyncCheckpointer, CheckpointInfo, CheckpointManager
from ..config import JobConfig, TrainConfig
from ..constants import EMERGENCY_WAIT_S
from ..env import DistEnv
from ..errors import CheckpointError, PeerFailure
from ..progress import STARTUP
from ..progress import recorder as progress_recorder
from ..resize import samples_in_epoch
from ..rundir import (
    METRICS_NAME,
    append_jsonl,
    end_hang_save,
    hang_report_path,
    peer_lost_record,
    record_no_restart,
    start_hang_save,
    write_peer_lost,
    write_step_end,
)
from ..rundir.recovery import CAUSE_KEY, IN_PROCESS, NODE_LOST, record_recovery, recoveries_left
from ..signals import PreemptionFlag
from .inprocess import Membership, Place, Plan, RecoveryAbandoned, first_plan
from .runtime import StepAgreement, init_distributed, is_peer_failure, setup_logging

log = logging.getLogger("slurm_ddp.worker")


class _Writes(Protocol):
    def write(self, **record: Any) -> None: ...


class Owner(Protocol):
    """What :class:`FaultTolerance` reads and changes of the training run that owns it (``Trainer``)."""

    cfg: JobConfig
    tc: TrainConfig
    run_dir: Path
    denv: DistEnv  #: replaced when an in-process recovery renumbers the ranks
    device: torch.device
    step: int  #: optimizer steps completed
    epoch_base: int
    batch_in_epoch: int
    accum: int
    model: torch.nn.Module
    ckpt: CheckpointManager
    writer: Optional[AsyncCheckpointer]
    metrics: _Writes
    progress: Any  #: what the hang watchdog reads (``progress.recorder()``, or ``DISABLED``)
    flag: PreemptionFlag
    stop: StepAgreement

    def train(self) -> int: ...
    def training_state(self) -> Dict[str, Any]: ...
    def load_training_state(self, state: Dict[str, Any]) -> int: ...
    def place_in_epoch(self, state: Dict[str, Any], old_world: int, exact: bool) -> None: ...
    def build_ddp(self) -> None: ...
    def build_loader(self) -> None: ...
    def release_ddp(self) -> None: ...


class StandbyEnded(Exception):
    """A rank taken for lost that waited as a spare until the step ended (exit 0: it failed nothing)."""


class FaultTolerance:
    """The emergency save, hang saver, peer-failure handling and in-process join of one rank's run
    (module docstring), for its ``owner``. ``place``: this process's place in the step under in-process
    recovery (``inprocess.place_in_step``), else None."""

    def __init__(self, owner: Owner, place: Optional[Place]) -> None:
        self.owner = owner
        # in-process recovery (recovery.in_process, slurm_ddp.worker.inprocess): this process's place in the
        # step, its link to the step's store and the current generation's plan (a spare: None until called in)
        self.place = place
        self.spare = place is not None and place.spare
        self.membership: Optional[Membership] = None
        self.plan: Optional[Plan] = None
        # True from the start of the train loop on: every collective that can fail from then on (the
        # DDP backward's all-reduce, the stop check, eval, a checkpoint's gather) leaves the model,
        # optimizer, scheduler and data position at the last completed step, so a rank that loses a
        # peer may commit them alone (``emergency_save``). Before it (resume), they are not yet loaded.
        self.at_step_boundary = False
        # Inside a training step (from its start to ``step += 1``), and the model's persistent
        # buffers (BatchNorm running statistics …) as the step's first forward began, after DDP broadcast
        # rank 0's: what an emergency save of the step before must hold, as the forward updates them
        # (``keep_buffers``); ``buffers_kept``: kept in this step.
        self.in_step = False
        self.buffers_kept = False
        self.kept_buffers: Dict[str, torch.Tensor] = {}
        self.buffer_names: List[str] = []  # the model's persistent buffers (track_buffers)
        self.nonfinite: Optional[torch.Tensor] = None  # the NaN/inf flag of the log window (nan_check)
        self._saver_done = threading.Event()  # ends the hang saver's thread

    @property
    def waiting_spare(self) -> bool:
        """A warm spare not (yet) called into a generation: it builds the task, and no DDP or loader."""
        return self.spare and self.plan is None

    # ------------------------------------------------------------------ start and end
    def start_hang_saver(self) -> None:
        """Under in-job recovery with the watchdog on, start the hang saver's daemon thread (``_hang_saver``)."""
        if self.owner.cfg.in_job_recovery and self.owner.cfg.watchdog.enabled:
            threading.Thread(target=self._hang_saver, args=(self._saver_done,), name="hang-saver", daemon=True).start()

    def join_step(self) -> None:
        """In-process recovery: join rank 0's store of the step, as every process of the step does."""
        o = self.owner
        assert self.place is not None
        self.membership = Membership(
            o.denv.master_addr,
            o.denv.master_port,
            self.place.slot,
            serve=o.denv.is_main,
            timeout_s=max(o.cfg.watchdog.startup_s, o.tc.pg_timeout_s),
            heartbeat_s=o.cfg.recovery.heartbeat_interval_s,
            dead_after_s=o.cfg.recovery.heartbeat_timeout_s,
        )

    def first_store(self) -> Optional[Any]:
        """In-process recovery: generation 0's plan (the training nodes of the step), and the store its
        process group forms on; None otherwise (the group forms on ``MASTER_ADDR:MASTER_PORT``)."""
        if self.membership is None or self.place is None:
            return None
        self.plan = first_plan(self.place.step_nodes, self.place.tasks_per_node)
        return self.membership.group_store(self.plan.generation)

    def watch_first(self) -> None:
        """In-process recovery: watch for a node that falls silent while generation 0 trains."""
        if self.membership is not None:
            self.membership.watch(self.plan)

    def serve_as_spare(self, t0: float) -> bool:
        """A warm spare, its task built: say it is ready and wait to be called in; True once it trains in a
        generation, False when the step ended without calling it in. ``t0``: ``time.perf_counter()`` at start."""
        assert self.membership is not None
        denv = self.owner.denv
        self.membership.spare_ready()
        log.warning(
            "warm spare on %s: task built in %.1f s; waiting to be called in",
            denv.hostname,
            time.perf_counter() - t0,
        )
        plan = self.membership.wait_for_call()
        if plan is None or not self._follow(plan, time.time(), "called in"):
            log.warning("warm spare on %s: the step ended without calling it in", denv.hostname)
            return False
        return True

    def close(self, status: int) -> None:
        """At the run's end, whatever it was: stop the hang saver; under in-process recovery rank 0 leaves the
        step's end (``status``: this rank's exit status) for the batch script and ends the waiting spares,
        and every process leaves the step's store."""
        self._saver_done.set()
        if self.membership is not None:
            if self.owner.denv.is_main:  # srun may wait for a lost node's tasks: the batch script ends it
                write_step_end(os.environ, status)
                self.membership.done()  # the waiting spares end
            self.membership.close()

    def track_buffers(self, model: torch.nn.Module) -> None:
        """Note ``model``'s persistent buffers and, under in-job recovery, keep them at each training step's first
        forward (``keep_buffers``): only an emergency checkpoint needs them; compiled, a Python hook would
        break the graph (``train.compile``: not kept)."""
        persistent = set(model.state_dict())
        self.buffer_names = [n for n, _ in model.named_buffers() if n in persistent]
        if self.owner.cfg.in_job_recovery and self.buffer_names and not self.owner.tc.compile:
            model.register_forward_pre_hook(self.keep_buffers)

    def keep_buffers(self, module: torch.nn.Module, args: Any) -> None:
        """Forward pre-hook of the model (inside DDP: after its buffer broadcast): copy the persistent
        buffers at the first forward of a training step into ``kept_buffers`` (allocated once; one
        ``_foreach_copy_`` where torch has it: a few kernels, not one per buffer)."""
        if not self.in_step or self.buffers_kept or not module.training:
            return
        live = dict(module.named_buffers())
        src = [live[n] for n in self.buffer_names]
        with torch.no_grad():
            kept = list(self.kept_buffers.values())
            if len(kept) == len(src) and all(k.shape == b.shape and k.dtype == b.dtype for k, b in zip(kept, src)):
                foreach_copy = getattr(torch, "_foreach_copy_", None)  # torch >= 2.2
                if foreach_copy is not None:
                    foreach_copy(kept, src)
                else:
                    for k, b in zip(kept, src):
                        k.copy_(b)
            else:  # the first step, or buffers that changed shape
                self.kept_buffers = {n: b.detach().clone() for n, b in zip(self.buffer_names, src)}
        self.buffers_kept = True

    def train_recovering(self) -> int:
        """``train()``, and under in-process recovery (``recovery.in_process``) again after each lost node the
        survivors recovered from without leaving this process (:meth:`recover_in_process`). A failure it
        cannot recover from is raised as it came (the peer-failure path of ``Trainer.run``)."""
        while True:
            try:
                return self.owner.train()
            except RuntimeError as e:
                if self.membership is None or not is_peer_failure(e):
                    raise
                if not self.recover_in_process(e):
                    raise

    def recover_in_process(self, e: BaseException) -> bool:
        """After a failed collective: leave the broken group with the model, optimizer and data position of the
        last completed step kept in memory, check in for the next generation and join it
        (:class:`~slurm_ddp.worker.inprocess.Membership`; rank 0 decides). False when the step cannot go on
        in-process (the reason is logged): the caller's peer-failure path follows."""
        o = self.owner
        assert self.membership is not None and self.plan is not None and self.place is not None
        t_fail = time.time()
        self.membership.watch(None)  # the coordinator judges the members from here on
        log.warning(
            "a peer was lost after step %d (%s); recovering in-process (generation %d)",
            o.step,
            self.peer_message(e)[-200:],
            self.plan.generation + 1,
        )
        o.progress.mark(o.step, STARTUP)
        if self.in_step and self.buffers_kept:  # the failed step's forward updated them: back to its start
            live = dict(o.model.named_buffers())
            with torch.no_grad():
                for name, kept in self.kept_buffers.items():
                    live[name].copy_(kept)
        # in_step stays as it is until this rank is in the next generation: when recovery is given up (the
        # batch host lost …), the emergency save of the peer-failure path needs to know the buffers it holds
        # are the failed step's start (rank 0's, broadcast by DDP), not this rank's own
        o.release_ddp()  # DDP and the stop agreement's group hold the broken group
        try:
            dist.destroy_process_group()
        except Exception as err:
            log.warning("leaving the broken process group: %s", err)
        try:
            plan = self._next_generation(self.plan)
            joined = self._follow(plan, t_fail, f"lost {','.join(plan.lost)}")
        except RecoveryAbandoned as why:
            log.error("in-process recovery given up: %s", why)
            return False
        if not joined:
            raise StandbyEnded(
                f"{self.place.slot} was taken for lost (silent past recovery.heartbeat_timeout_s="
                f"{o.cfg.recovery.heartbeat_timeout_s} s) and waited as a spare; the step ended without calling it in"
            )
        return True

    def _recovery_deadline_s(self) -> float:
        return self.owner.tc.pg_timeout_s + 30.0

    def _next_generation(self, plan: Plan, replanned: str = "") -> Plan:
        """Check in for the generation after ``plan`` and get its plan (rank 0 of ``plan`` decides it,
        ``Membership.coordinate``). Raises :class:`RecoveryAbandoned` when there is none."""
        assert self.membership is not None and self.place is not None
        # a spare called into a generation that never formed holds no state: it must not be the source
        self.membership.check_in(plan, self.owner.step if self.plan is not None else -1)
        deadline = self._recovery_deadline_s()
        if plan.ranks.get(self.place.slot) == 0:
            return self.membership.coordinate(
                plan,
                self.place.spare_slots(),
                tasks_per_node=self.place.tasks_per_node,
                min_nodes=self.owner.cfg.recovery_min_nodes,
                # one budget per job start: what the supervisor left this step (earlier steps' recoveries count)
                max_generations=recoveries_left(os.environ, self.owner.cfg.recovery.max_restarts),
                deadline_s=deadline,
                replanned=replanned,
            )
        return self.membership.wait_plan(plan.generation + 1, deadline + 10.0)

    def _mark_waiting(self) -> None:
        """A rank waiting as a spare is alive: its progress record says so (start-up phase, its last step)."""
        self.owner.progress.mark(self.owner.step, STARTUP)

    def _follow(self, plan: Plan, t_fail: float, why: str) -> bool:
        """From a published ``plan`` on: join it (``_join``) once every member is there
        (``Membership.enter``), planning the next generation again while a member is lost before it formed
        (a second failure during the recovery). Outside a plan (this process was taken for lost: it was only
        slow), wait as a spare of the step to be called in. True once this process trains in a generation;
        False when the step ended while it waited. Raises :class:`RecoveryAbandoned` (no next plan)."""
        assert self.membership is not None and self.place is not None
        while True:
            if self.place.slot not in plan.ranks:
                log.warning(
                    "%s is not in generation %d (taken for lost: silent past recovery.heartbeat_timeout_s=%s s); "
                    "waiting as a spare of the step",
                    self.place.slot,
                    plan.generation,
                    self.owner.cfg.recovery.heartbeat_timeout_s,
                )
                self.membership.spare_ready()
                called = self.membership.wait_for_call(plan.generation + 1, tick=self._mark_waiting)
                if called is None:
                    return False
                plan, why = called, "called in"
                continue
            again = self.membership.enter(plan, self._recovery_deadline_s())
            if not again:
                self.in_step = False
                self._join(plan, t_fail, why)
                return True
            log.warning("generation %d did not form (%s); planning again", plan.generation, again)
            plan = self._next_generation(plan, replanned=again)
            why = f"{why}; then {again}"

    def _join(self, plan: Plan, t_fail: float, why: str) -> None:
        """Form generation ``plan``'s process group, load the state its source rank broadcasts (the same world
        size: exact; a smaller one: sample-exact, ``Trainer.place_in_epoch``), and rebuild DDP, the data loader and
        the stop agreement for the new rank and world size."""
        o = self.owner
        assert self.membership is not None and self.place is not None
        rank = plan.ranks[self.place.slot]
        # the source's state, made before this rank's place changes (its world size is the old one)
        state = o.training_state() if rank == plan.source and self.plan is not None else None
        was_spare = self.plan is None
        o.denv = replace(
            o.denv,
            rank=rank,
            world_size=plan.world_size,
            node_rank=plan.nodes.index(self.place.node),
            num_nodes=len(plan.nodes),
        )
        os.environ.update(o.denv.torch_env())
        if was_spare:
            setup_logging(rank)
            o.progress = progress_recorder()  # judged by the hang watchdog from now on
            o.progress.mark(0, STARTUP)
        self.plan = plan
        init_distributed(
            o.denv,
            o.tc.backend,
            o.tc.pg_timeout_s,
            store=self.membership.group_store(plan.generation),
            device=o.device,
        )
        box = [state]
        dist.broadcast_object_list(box, src=plan.source)
        state = box[0]
        assert state is not None
        old_world = o.load_training_state(state)
        o.place_in_epoch(state, old_world, exact=old_world == o.denv.world_size)
        o.build_ddp()
        o.build_loader()
        o.stop = StepAgreement(o.flag)
        if dist.get_backend() != "gloo":
            o.stop.group = dist.new_group(backend="gloo")
        self.membership.watch(plan)
        took = time.time() - t_fail
        log.warning(
            "in-process recovery, generation %d (%s): rank %d of %d on %s, resuming after step %d from rank %d's "
            "memory in %.2f s",
            plan.generation,
            why,
            rank,
            plan.world_size,
            ",".join(plan.nodes),
            o.step,
            plan.source,
            took,
        )
        if o.denv.is_main:
            b = o.tc.batch_size
            o.metrics.write(
                event="resume",
                step=o.step,
                restart=o.denv.restart_count,
                world_size=o.denv.world_size,
                emergency=False,
                in_process=True,
                generation=plan.generation,
                grad_accum_steps=o.accum,
                samples_in_epoch=samples_in_epoch(o.epoch_base, o.batch_in_epoch, o.denv.world_size, b),
            )
            try:
                record_recovery(
                    o.run_dir,
                    job_id=str(o.denv.job_id),
                    restart=o.denv.restart_count,
                    attempt=plan.generation - 1,
                    time=t_fail,
                    action=IN_PROCESS,
                    **{CAUSE_KEY: NODE_LOST},
                    nodes=list(plan.nodes),
                    bad=list(plan.lost),
                    spares_used=list(plan.spares_used),
                    spares_failed=list(plan.spares_failed),
                    replanned=plan.replanned,
                    lost_at=t_fail,
                    lost_step=plan.step,
                    world_size=plan.world_size,
                    recovery_s=took,
                    reason=f"in-process recovery: node {','.join(plan.lost)} lost after step {plan.step}; "
                    + (
                        f"spare {','.join(plan.spares_used)} took its ranks"
                        if plan.spares_used
                        else f"the {len(plan.nodes)} surviving node(s) go on"
                    )
                    + (f"; failed spare(s) left out: {','.join(plan.spares_failed)}" if plan.spares_failed else "")
                    + (f"; planned again: {plan.replanned}" if plan.replanned else ""),
                )
            except OSError as err:
                log.error("could not record the in-process recovery: %s", err)

    def slot(self) -> str:
        """This process's slot in the step (``NODE/LOCAL``: ``inprocess.Place.slot``), else its rank."""
        return self.place.slot if self.place is not None else str(self.owner.denv.rank)

    def report_no_restart(self, e: BaseException) -> None:
        """Record this rank's "do not restart" (``errors.NoRestart``) for the batch side's rules
        (``rundir.record_no_restart``; logged when it cannot be written: the status still says it)."""
        o = self.owner
        try:
            record_no_restart(
                o.run_dir,
                job_id=str(o.denv.job_id),
                restart=o.denv.restart_count,
                rank=o.denv.rank,
                host=o.denv.hostname or socket.gethostname(),
                reason=str(e),
                by="worker",
            )
        except OSError as err:
            log.error("could not record the do-not-restart of this rank: %s", err)

    def report_crash(self, e: BaseException) -> None:
        """In-process recovery: tell the step's store this rank failed of its own (not a lost peer), so the
        survivors give up instead of calling a spare in for it. A warm spare not yet called in reports a
        spare failure instead (``Membership.spare_failed``: left out of every plan, no ``crash``), and names
        itself in the run's metrics (``spare_failed`` event)."""
        if self.membership is None:
            return
        what = f"{type(e).__name__}: {str(e)[:300]}"
        if self.waiting_spare:
            self.membership.spare_failed(what)
            host = self.owner.denv.hostname or socket.gethostname()
            try:
                append_jsonl(
                    self.owner.run_dir / METRICS_NAME,
                    {"event": "spare_failed", "slot": self.slot(), "host": host, "error": what, "time": time.time()},
                )
            except OSError as err:
                log.error("could not record the spare's failure: %s", err)
            return
        self.membership.report_crash(what)

    def peer_failure(self, e: BaseException) -> PeerFailure:
        """The ``PeerFailure`` for ``e``, after committing the last completed step alone
        (:meth:`emergency_save`) and then leaving the step's peer-lost marker (in-job recovery: the batch
        script stops waiting for a step whose lost node Slurm has not yet marked DOWN)."""
        message = self.peer_message(e)
        self.emergency_save(message)
        host = self.owner.denv.hostname or socket.gethostname()
        write_peer_lost(os.environ, peer_lost_record(self.owner.denv.rank, host, self.owner.step, message))
        return PeerFailure(message)

    def emergency_save(self, why: str) -> str:
        """After a lost or hung peer, commit the state of the last completed step from this rank alone,
        so that the next start redoes at most the step that failed (not everything since the last
        periodic checkpoint). No collective. The first survivor to claim the step writes it
        (``CheckpointManager.write_once``); the others wait up to ``EMERGENCY_WAIT_S`` for it before they
        exit (an early non-zero exit makes srun end the step, the writer with it). Skipped without in-job
        recovery (``JobConfig.in_job_recovery``), before the train loop (nothing loaded yet), when the
        step is already committed, when this rank saw a NaN/inf loss in the window (``train.nan_check``),
        and on a rank other than 0 whose buffers are its own (between two steps: DDP's are rank 0's).
        Called from the main thread after a failed collective, or from the hang saver's thread
        (``_hang_saver``) while the main thread waits in one.
        Never raises: a failed save leaves the resume to the newest committed checkpoint, as before.
        Returns the outcome in a few words (``committed``, why not).
        """
        o = self.owner
        if not o.cfg.in_job_recovery:
            # A requeued job resumes from its newest periodic checkpoint. Saving here too was tried: a hang
            # that repeats at the same step then recurs in the resumed job's first step, under the
            # watchdog's start-up allowance (watchdog.startup_s) instead of a step's, and is found late.
            return "skipped: no in-job recovery"
        if not self.at_step_boundary:
            return "skipped: training had not begun"
        step = o.step
        try:
            if o.tc.nan_check and self.nonfinite is not None and bool(self.nonfinite):
                log.error("no emergency checkpoint of step %d: the loss was NaN or infinite on this rank", step)
                return "skipped: NaN/inf loss on this rank"
            if o.writer is not None:  # a background write (rank 0's) first: two writers never overlap
                try:
                    o.writer.wait()
                except CheckpointError as e:
                    log.error("%s", e)
            if any(i.step == step for i in o.ckpt.committed(quiet=True)):
                log.warning("a peer was lost after step %d, whose checkpoint is committed", step)
                return f"step {step} already committed"
            if o.denv.rank != 0 and self.buffer_names and not (self.in_step and self.buffers_kept):
                # DDP's buffers are rank 0's (broadcast at each forward); between steps this rank holds
                # its own, updated by its last forward: rank 0, or the newest periodic checkpoint, saves
                log.warning(
                    "no emergency checkpoint of step %d from rank %d: its buffers (BatchNorm statistics …) are "
                    "its own, not rank 0's, between two steps",
                    step,
                    o.denv.rank,
                )
                return "skipped: this rank's buffers are not rank 0's between two steps"
            t0 = time.perf_counter()
            host = o.denv.hostname or socket.gethostname()
            record = {
                "rank": o.denv.rank,
                "host": host,
                "job_id": str(o.denv.job_id),
                "why": why[-300:],
            }
            saved: List[CheckpointInfo] = []

            def write() -> None:
                state = o.training_state()
                if self.in_step and self.buffers_kept:  # the failed step's forward ran
                    state["model"].update(self.kept_buffers)  # its buffers as the step began
                saved.append(o.ckpt.save(state, step, world_size=o.denv.world_size, emergency=record))

            wrote, outcome = o.ckpt.write_once(step, write, EMERGENCY_WAIT_S)
            if not wrote:
                log.warning("emergency checkpoint of step %d by another survivor: %s", step, outcome or "no answer")
                return f"by another survivor: {outcome or 'no answer'}"
            info = saved[0]
            took = time.perf_counter() - t0
            log.warning(
                "emergency checkpoint of step %d committed by rank %d alone after a lost or hung peer (%.1f MB, %.3f s)",
                step,
                o.denv.rank,
                info.size_bytes / 1e6,
                took,
            )
            # this rank may not be rank 0 (whose MetricsWriter alone writes): one line, appended directly
            append_jsonl(
                o.run_dir / METRICS_NAME,
                {
                    "event": "emergency_checkpoint",
                    "step": step,
                    "rank": o.denv.rank,
                    "host": host,
                    "duration_s": took,
                    "time": time.time(),
                },
            )
            return f"committed step {step}"
        except Exception as e:  # the resume falls back to the newest committed checkpoint
            log.error("no emergency checkpoint of step %d: %s", step, e)
            return f"failed: {e}"

    def watchdog_rank(self) -> int:
        """The rank this process's hang watchdog names in its report: the rank wrapper's (``slurm_ddp.launch``),
        i.e. Slurm's task number (``SLURM_PROCID``). Under in-process recovery it differs from the training rank (a warm spare's
        is -1, a renumbered survivor's changes); otherwise they are the same."""
        procid = os.environ.get("SLURM_PROCID", "")
        return int(procid) if self.place is not None and procid.isdigit() else self.owner.denv.rank

    def _hang_saver(self, done: threading.Event) -> None:
        """A daemon thread under in-job recovery with the watchdog on: when this rank's watchdog reports a
        hang (its report appears: ``rundir.hang_report_path``) it is about to end the rank, most likely
        while the main thread waits in a collective for a hung or stopped peer; the thread commits the
        last completed step alone (:meth:`emergency_save`) and answers the watchdog (``rundir.hangs``: the
        save before a hung job's ranks end), which waits for that before it kills the rank. Looks every
        0.5 s (a ``stat``) until ``done``."""
        o = self.owner
        job_id, restart, rank = str(o.denv.job_id), o.denv.restart_count, self.watchdog_rank()
        report = hang_report_path(o.run_dir, job_id, restart, rank)
        while not done.wait(0.5):
            if report.exists():
                break
        else:
            return
        try:
            start_hang_save(o.run_dir, job_id, restart, rank)
        except OSError as e:
            log.error("cannot answer the hang watchdog in %s: %s", report.parent, e)
            return
        host = o.denv.hostname or socket.gethostname()
        outcome = self.emergency_save(f"rank {rank} on {host}: its hang watchdog ends it after step {o.step}")
        end_hang_save(o.run_dir, job_id, restart, rank, outcome)

    def peer_message(self, e: BaseException) -> str:
        """The one-line account of a failed collective ``e`` on this rank (``PeerFailure``'s message)."""
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (
            f"rank {self.owner.denv.rank} on {self.owner.denv.hostname or socket.gethostname()}: a peer rank stopped "
            f"responding or died (no answer within train.pg_timeout_s={self.owner.tc.pg_timeout_s} s, or its "
            f"connection closed) at step {self.owner.step}; see the other ranks' logs for the cause. ({first[:300]})"
        )
