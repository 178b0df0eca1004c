"""The shared DDP worker: one process per SLURM task trains the job's ``Task``.

Built only from public pieces — ``DistEnv`` (env), ``PreemptionFlag`` (signals),
``CheckpointManager`` (checkpoint) and ``worker.runtime`` — that a user's own training
script can use the same way. Side effects: everything a training process does.

Exit statuses: 0 finished (or already finished); ``PREEMPTED_EXIT_CODE`` (75) stopped for
preemption after the checkpoint of the last completed step was committed; 2 bad input.

Why over 600 lines: most of it is one class, :class:`Trainer`, whose methods share the state of
one training process (model, optimizer, sampler, scaler, step, the preemption flag) and run in one
order (build → resume → train loop → stop or finish). Its reusable pieces already live elsewhere
(``worker.runtime``, ``checkpoint``, ``resize``, ``signals``); splitting the class across modules
would only scatter that order.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Generator, List, Optional, Tuple, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from ..checkpoint import AsyncCheckpointer, CheckpointInfo, CheckpointManager, atomic_write
from ..config import JobConfig, load_config
from ..constants import EMERGENCY_WAIT_S, PREEMPTED_EXIT_CODE
from ..env import DistEnv
from ..errors import CheckpointError, PeerFailure, TrainingDiverged, UserError
from ..progress import CHECKPOINT, DATA, DISABLED, EVAL, STARTUP, STEP
from ..progress import recorder as progress_recorder
from ..resize import accumulation_for, samples_in_epoch
from ..rundir import (
    CONFIG_NAME,
    FINAL_MODEL_NAME,
    FINISHED_NAME,
    METRICS_NAME,
    STEP_NODES_VAR,
    Preempted,
    append_jsonl,
    checkpoint_dir,
    end_hang_save,
    end_partial_line,
    hang_report_path,
    is_finished,
    peer_lost_record,
    read_metrics,
    start_hang_save,
    write_finished,
    write_peer_lost,
    write_preempted,
    write_step_end,
)
from ..rundir.recovery import IN_PROCESS, record_recovery, recoveries_left
from ..signals import PreemptionFlag, blocked, ignore_in_loader_workers, loader_context, worker_signals
from ..snapshot import run_pythonpath
from ..task import Task, load_task_class
from .inprocess import Membership, Place, Plan, RecoveryAbandoned, first_plan, place_in_step
from .runtime import (
    ResumableDistributedSampler,
    SeededBatchSampler,
    SeededDataset,
    StepAgreement,
    broadcast_from_main,
    capture_rng,
    end_startup_gc,
    evaluate,
    init_distributed,
    is_peer_failure,
    optimizer_step,
    rank_device,
    restore_rng,
    seed_everything,
    seed_step,
    shutdown_distributed,
)
from .saves import SaveSchedule

log = logging.getLogger("slurm_ddp.worker")


def setup_logging(rank: int) -> None:
    """Rank 0 logs INFO; the other ranks WARNING and above (the per-rank logging recipe).

    The ``slurm_ddp.rank`` logger logs INFO on every rank (host/rank facts at start).
    """
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    root = logging.getLogger("slurm_ddp")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logging.getLogger("slurm_ddp.rank").setLevel(logging.INFO)


class MetricsWriter:
    """Appends one JSON object per event to ``RUN_DIR/metrics.jsonl`` (rank 0 only)."""

    def __init__(self, path: Path, enabled: bool):
        self.path = path
        self.enabled = enabled
        self.tracker: Optional[Any] = None  # slurm_ddp.tracking.Tracker: each row also goes to MLflow/W&B
        if enabled:  # a run killed mid-line left no newline: end that line
            end_partial_line(path)

    def write(self, **record: Any) -> None:
        if not self.enabled:
            return
        record.setdefault("time", time.time())
        append_jsonl(self.path, record)
        if self.tracker is not None:
            self.tracker.log(record)


class Trainer:
    """State and steps of one rank's training run; ``run()`` returns the exit status."""

    def __init__(self, cfg: JobConfig, run_dir: Path, denv: DistEnv, place: Optional[Place] = None):
        self.cfg, self.run_dir, self.denv = cfg, run_dir, denv
        # in-process recovery (recovery.in_process, slurm_ddp.worker.inprocess): this process's place in the
        # step, its link to the step's store and the current generation's plan (a spare: None until called in)
        self.place = place
        self.spare = place is not None and place.spare
        self.membership: Optional[Membership] = None
        self.plan: Optional[Plan] = None
        self._groups: Optional[Generator[list, None, None]] = None  # train()'s micro-batch groups (close_loader)
        self.tc = cfg.train
        self.flag = PreemptionFlag(worker_signals(cfg.requeue.signal_name))
        self.stop = StepAgreement(self.flag)  # all-reduces the flag every ~0.5 s, not every step
        self.ckpt = CheckpointManager(checkpoint_dir(run_dir), cfg.checkpoint.keep_last, cfg.config_hash())
        self.writer = AsyncCheckpointer(self.ckpt) if denv.is_main and cfg.checkpoint.async_save else None
        self.metrics = MetricsWriter(run_dir / METRICS_NAME, denv.is_main)
        # when to save periodically (checkpoint.every_steps / every_s / auto: slurm_ddp.worker.saves)
        self.saves = SaveSchedule(
            cfg,
            is_main=lambda: self.denv.is_main,  # asked each time: in-process recovery may renumber the ranks
            nodes=denv.num_nodes,
            history=lambda: read_metrics(run_dir),
            broadcast=lambda obj: broadcast_from_main(obj, self.denv),
            write=self.metrics.write,
        )
        self.last_blocked_s: Optional[float] = None  # rank 0: the last save's blocked time
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0  # micro-batches of the current epoch already trained (since epoch_base)
        # Samples of the current epoch consumed (over all ranks) before this world size took it over:
        # 0 unless the run was resumed on another world size mid-epoch (slurm_ddp.resize).
        self.epoch_base = 0
        self.accum = cfg.train.grad_accum_steps  # micro-steps per optimizer step on this world size
        self.global_batch = denv.world_size * cfg.train.batch_size * self.accum  # the run's target
        self.last_loss: Optional[float] = None  # the loss of the last train event (eval events repeat it)
        # The log window: the losses of the steps since the last train event, summed on the device
        # (read only at log steps: no host sync per step). In every checkpoint (rank 0's, the logged
        # one), so a run resumed between two log steps logs the same averages as an uninterrupted one.
        self.loss_sum: Optional[torch.Tensor] = None  # None: a fresh window, made on the device by train()
        self.loss_count = 0  # steps in the window
        self.blocked_s = 0.0  # training time blocked by checkpoint saves (rank 0)
        self.scaler: Optional[Any] = None
        self.tb: Optional[Any] = None
        # what the hang watchdog reads (slurm_ddp.progress); a waiting spare is not judged until called in
        self.progress = DISABLED if self.spare else progress_recorder()
        # True from the start of the train loop on: every collective that can fail from then on (the
        # DDP backward's all-reduce, the stop check, eval, a checkpoint's gather) leaves the model,
        # optimizer, scheduler and data position at the last completed step, so a rank that loses a
        # peer may commit them alone (``_emergency_save``). Before it (resume), they are not yet loaded.
        self.at_step_boundary = False
        # Inside a training step (from its start to ``self.step += 1``), and the model's persistent
        # buffers (BatchNorm running statistics …) as the step's first forward began, after DDP broadcast
        # rank 0's: what an emergency save of the step before must hold, as the forward updates them
        # (``_keep_buffers``); ``buffers_kept``: kept in this step.
        self.in_step = False
        self.buffers_kept = False
        self.kept_buffers: Dict[str, torch.Tensor] = {}
        self.buffer_names: List[str] = []  # the model's persistent buffers (build)
        self.nonfinite: Optional[torch.Tensor] = None  # the NaN/inf flag of the log window (nan_check)

    # ------------------------------------------------------------------ setup
    def build(self) -> None:
        tc, denv = self.tc, self.denv
        # train.pythonpath remapped into the code snapshot taken at submit (slurm_ddp.snapshot)
        task_cls = load_task_class(tc.task, run_pythonpath(str(self.run_dir), tc.pythonpath))
        if denv.is_main:
            import inspect

            log.info("task %s from %s", tc.task, inspect.getsourcefile(task_cls) or "?")
        self.task: Task = task_cls(tc)
        if tc.deterministic:
            if self.device.type == "cuda":  # cuBLAS is deterministic only with a fixed workspace
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True)
        if self.device.type == "cuda":
            torch.backends.cudnn.benchmark = not tc.deterministic
        seed_everything(tc.seed)  # same initial weights on every rank
        model = self.task.build_model()
        if tc.sync_batchnorm:
            if self.device.type == "cuda":
                model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
            else:
                log.warning("train.sync_batchnorm ignored: SyncBatchNorm needs CUDA devices")
        model = model.to(self.device)
        if tc.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        persistent = set(model.state_dict())
        self.buffer_names = [n for n, _ in model.named_buffers() if n in persistent]
        # only an emergency checkpoint (in-job recovery) needs them; compiled, a Python hook would break the graph
        if self.cfg.in_job_recovery and self.buffer_names and not tc.compile:
            model.register_forward_pre_hook(self._keep_buffers)
        self.build_ddp()
        self.optimizer = self.task.build_optimizer(model)
        self.scheduler = self.task.build_scheduler(self.optimizer)
        self.autocast_dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[tc.amp]
        if tc.amp == "fp16":
            self.scaler = torch.amp.GradScaler(self.device.type)
        self.train_ds, self.eval_ds = self.task.build_datasets()
        self.build_loader()
        if denv.is_main:
            self.open_tensorboard()

    def build_ddp(self) -> None:
        """Wrap the model in DDP over the current default group (its constructor broadcasts rank 0's weights and
        buffers), and compile that when ``train.compile``. Skipped by a warm spare until it is called in."""
        if self.spare and self.plan is None:
            return
        tc = self.tc
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DDP(
            self.model,
            device_ids=device_ids,
            find_unused_parameters=tc.find_unused_parameters,
            static_graph=tc.static_graph,
            gradient_as_bucket_view=tc.gradient_as_bucket_view,
        )
        # torch.compile of a Module returns an OptimizedModule (a Module); its annotation says Callable
        self.forward_model: torch.nn.Module = cast(torch.nn.Module, torch.compile(self.ddp)) if tc.compile else self.ddp

    def build_loader(self) -> None:
        """This rank's share of the training set for the current world size and rank (sampler, batches,
        loader), and its per-rank random streams. Skipped by a warm spare until it is called in."""
        if self.spare and self.plan is None:
            return
        tc, denv = self.tc, self.denv
        sampler = ResumableDistributedSampler(self.train_ds, denv.world_size, denv.rank, seed=tc.seed)
        self.batches = SeededBatchSampler(sampler, tc.batch_size, tc.seed, denv.rank)
        if self.batches.batches_per_epoch() < self.accum:
            raise UserError(
                f"train.batch_size={tc.batch_size} × train.grad_accum_steps={tc.grad_accum_steps} is more than a "
                f"rank's share of the training set ({sampler.num_samples} samples); lower them"
            )
        self.loader = DataLoader(
            SeededDataset(self.train_ds),
            batch_sampler=self.batches,
            num_workers=tc.num_workers,
            pin_memory=tc.pin_memory and self.device.type == "cuda",
            persistent_workers=tc.persistent_workers and tc.num_workers > 0,
            # the stop signal that reaches every process of the step is the rank's to act on
            worker_init_fn=ignore_in_loader_workers(self.flag.signals) if tc.num_workers > 0 else None,
            # forkserver (Python >= 3.14): a server with torch and the task imported, the signals blocked
            multiprocessing_context=(
                loader_context(self.flag.signals, preload=[type(self.task).__module__, SeededDataset.__module__])
                if tc.num_workers > 0
                else None
            ),
            # A dedicated generator: creating an iterator then draws nothing from the global
            # torch RNG, whose state is part of the checkpoint.
            generator=torch.Generator().manual_seed(tc.seed),
        )
        # Per-rank randomness of the training step itself (dropout …), restored on resume.
        seed_everything(tc.seed + 1000003 * (denv.rank + 1))

    def open_tensorboard(self) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        except ImportError:  # tensorboard is optional
            self.tb = None

    def _keep_buffers(self, module: torch.nn.Module, args: Any) -> None:
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

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """The training state rank 0 saves (None elsewhere). Not a collective: each rank's RNG state
        goes to its own file (``save_rank_states``), not through rank 0."""
        if not self.denv.is_main:
            return None
        return self.training_state()

    def training_state(self) -> Dict[str, Any]:
        """The checkpoint's data, from this rank (any rank: DDP keeps model, optimizer, scheduler and
        data position identical on all; the log window is this rank's). No collective."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "task": self.task.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            # the position in the epoch on any world size (slurm_ddp.resize): samples consumed over all
            # ranks of the epoch's permutation, whose seed is DistributedSampler's seed + epoch
            "samples_in_epoch": samples_in_epoch(
                self.epoch_base, self.batch_in_epoch, self.denv.world_size, self.tc.batch_size
            ),
            "epoch_base": self.epoch_base,
            "epoch_seed": self.tc.seed + self.epoch,
            "global_batch": self.global_batch,
            "grad_accum_steps": self.accum,
            "last_loss": self.last_loss,
            "log_window": {"loss_sum": self.loss_sum, "steps": self.loss_count},
            "world_size": self.denv.world_size,
            "config_hash": self.cfg.config_hash(),
            "training_hash": self.cfg.training_hash(),
        }

    def _big_state(self) -> Dict[str, Any]:
        """The tensor-holding part of ``state_dict()``, shaped alike, without its collective: what
        ``AsyncCheckpointer.prepare`` allocates snapshot buffers for (rank 0)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def save_rank_states(self) -> List[Tuple[int, str]]:
        """Collective: every rank writes its own RNG state beside the checkpoint of this step, then one
        all_gather of each file's ``(size_bytes, sha256)`` (40 B per rank, hashed while writing) in place
        of a barrier, so that rank 0 commits the checkpoint, with the digests, only once all of them are
        durable. Returns the digests by rank. Constant file work per rank whatever the world size (a
        gather of the states would bring world × ~15 kB to rank 0)."""
        mine = self.ckpt.save_rank_state(capture_rng(), self.step, self.denv.rank)
        if dist.is_initialized() and self.denv.world_size > 1:
            return gather_rank_digests(mine, self.device)
        return [mine]

    def save_checkpoint(self, reason: str, sync: bool = True) -> None:
        """Collective: per-rank states, then rank 0 commits the checkpoint (in the background unless ``sync``); barrier."""
        t0 = time.perf_counter()
        self.progress.mark(self.step, CHECKPOINT)
        digests = self.save_rank_states()
        state = self.state_dict()
        ranks = self.denv.world_size
        if state is not None:
            if self.writer is not None and not sync:
                self.writer.save(state, self.step, world_size=ranks, rank_states=ranks, rank_digests=digests)
                how = "writing in the background"
            else:
                if self.writer is not None:
                    self.writer.wait()  # flush a pending background write first
                info = self.ckpt.save(state, self.step, world_size=ranks, rank_states=ranks, rank_digests=digests)
                how = f"committed, {info.size_bytes / 1e6:.1f} MB"
            blocked = time.perf_counter() - t0
            self.blocked_s += blocked
            self.last_blocked_s = blocked
            log.info("checkpoint of step %d %s (%s; training blocked %.3f s)", self.step, how, reason, blocked)
            self.metrics.write(
                event="checkpoint",
                step=self.step,
                reason=reason,
                blocked_s=blocked,
                background=not sync and self.writer is not None,
                # the background write of the save before (the pace the writer keeps: rundir.interval)
                previous_write_s=self.writer.last_write_s if self.writer is not None else None,
            )
        if sync:
            dist.barrier()

    def _agreed_checkpoint(self) -> Optional[CheckpointInfo]:
        """The checkpoint every rank resumes from: rank 0 verifies the newest ones (data file and
        every rank's state file against the manifest's sizes and sha256, ``CheckpointManager.latest``)
        and broadcasts its step; the other ranks take that step without reading the files again.
        One verification per start instead of one per rank: W rank files read, not W².

        Raises ``CheckpointError`` when a rank cannot see the checkpoint rank 0 chose (the run
        directory is not on a file system every node shares).
        """
        info = self.ckpt.latest() if self.denv.is_main else None
        step = broadcast_from_main(None if info is None else info.step, self.denv)
        if self.denv.is_main or step is None:
            return info
        for candidate in self.ckpt.committed(quiet=True):
            if candidate.step == step:
                return candidate
        raise CheckpointError(
            f"rank {self.denv.rank} on {socket.gethostname()} does not see the checkpoint of step {step} "
            f"that rank 0 resumes from in {self.ckpt.directory}: put the run directory on a file system "
            "every node shares"
        )

    def resume(self) -> None:
        """Load the newest valid checkpoint (every rank reads it) and continue from its step."""
        info = self._agreed_checkpoint()
        if info is None:
            log.info("no checkpoint in %s: starting at step 0", self.ckpt.directory)
            return
        state = self.ckpt.load(info)
        assert state is not None
        old_world = self._load_training_state(state)
        if self.denv.is_main:  # once per job, in rank 0's log
            from ..rundir.provenance import torch_mismatch

            mismatch = torch_mismatch(info.manifest, torch.__version__)
            if mismatch:
                log.warning("%s", mismatch)
        # each rank's own file (rank_states), or the list gathered into rank 0's data (older checkpoints)
        rngs = state.get("rng") or []
        b = self.tc.batch_size
        same_world = old_world == self.denv.world_size
        if info.emergency is not None:
            log.warning(
                "resuming from the emergency checkpoint of step %d that rank %s on %s wrote alone after a lost or hung peer%s",
                self.step,
                info.emergency.get("rank", "?"),
                info.emergency.get("host", "?"),
                # no per-rank RNG states: none needed, each step's streams derive from (seed, rank, step)
                " (exact: the same world size)" if same_world else "",
            )
        has_rank_states = info.rank_states == self.denv.world_size or len(rngs) == self.denv.world_size
        exact = same_world and (has_rank_states or info.emergency is not None)
        if exact:
            # the same world size: bitwise exact. The per-rank RNG states matter only to code that draws
            # before the first step (each step reseeds, seed_step); restored where saved, as before.
            if info.rank_states == self.denv.world_size:
                restore_rng(self.ckpt.load_rank_state(info, self.denv.rank))
            elif len(rngs) == self.denv.world_size:
                restore_rng(rngs[self.denv.rank])
        self._place_in_epoch(state, old_world, exact)
        log.info(
            "resumed from checkpoint of step %d (epoch %d, batch %d of the epoch) in %s",
            self.step,
            self.epoch,
            self.batch_in_epoch,
            info.path,
        )
        self.metrics.write(
            event="resume",
            step=self.step,
            restart=self.denv.restart_count,
            world_size=self.denv.world_size,
            emergency=info.emergency is not None,
            grad_accum_steps=self.accum,
            samples_in_epoch=samples_in_epoch(self.epoch_base, self.batch_in_epoch, self.denv.world_size, b),
        )

    def _load_training_state(self, state: Dict[str, Any]) -> int:
        """Load a training state (``training_state()``'s shape: a checkpoint's, or a survivor's broadcast under
        in-process recovery) into the model, optimizer, scheduler, scaler, task, step counters, log window and
        global batch; returns the world size it was made on."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.task.load_state_dict(state.get("task") or {})
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        # rank 0's log window (a checkpoint written before windows were saved has none: a fresh one)
        self.last_loss = state.get("last_loss")
        window = state.get("log_window") or {}
        if window.get("loss_sum") is not None:
            self.loss_sum, self.loss_count = window["loss_sum"].to(self.device), int(window["steps"])
        same_config = state.get("config_hash") == self.cfg.config_hash()
        if not same_config and state.get("training_hash") != self.cfg.training_hash():  # world size aside
            log.warning("checkpoint of step %d was written under a different config; resuming anyway", self.step)
        old_world = int(state.get("world_size") or self.denv.world_size)
        b = self.tc.batch_size
        self.global_batch = int(state.get("global_batch") or old_world * b * self.tc.grad_accum_steps)
        return old_world

    def _place_in_epoch(self, state: Dict[str, Any], old_world: int, exact: bool) -> None:
        """The position in the epoch after loading ``state``: as saved when ``exact`` (the same world size, every
        rank's stream known), else sample-exactly on this world size (``_resume_resized``)."""
        if exact:
            self.epoch_base = int(state.get("epoch_base", 0))
            self.accum = int(state.get("grad_accum_steps", self.tc.grad_accum_steps))
        else:
            self._resume_resized(state, old_world)

    def _resume_resized(self, state: Dict[str, Any], old_world: int) -> None:
        """Resume a checkpoint of ``old_world`` ranks on this world size, sample-exactly: the epoch goes
        on after the samples it consumed (over all ranks), with the global batch kept where possible."""
        w, b = self.denv.world_size, self.tc.batch_size
        consumed = state.get("samples_in_epoch")
        if consumed is None:  # a checkpoint from before samples were counted: the same count
            consumed = samples_in_epoch(int(state.get("epoch_base", 0)), self.batch_in_epoch, old_world, b)
        self.epoch_base, self.batch_in_epoch = int(consumed), 0
        if state.get("epoch_seed", self.tc.seed + self.epoch) != self.tc.seed + self.epoch:
            log.warning("checkpoint's epoch seed %s != train.seed + epoch: the data order changed", state["epoch_seed"])
        plan = accumulation_for(self.global_batch, w, b)
        self.accum = plan.grad_accum_steps
        # the per-rank random streams (dropout …) follow (seed, rank, step) on this world size (seed_step)
        log.warning(
            "resuming a training state of %d ranks on %d: epoch %d goes on after its first %d samples (each remaining "
            "sample trained once); grad_accum_steps %d keeps %d samples per step; each rank's random streams "
            "follow (train.seed, rank, step) (not bitwise equal to a run on one world size)",
            old_world,
            w,
            self.epoch,
            self.epoch_base,
            self.accum,
            plan.global_batch,
        )
        if plan.why_not_kept:
            log.warning("%s", plan.why_not_kept)

    def close_loader(self) -> None:
        """End the training loader's worker processes now (``train.num_workers > 0``), whatever the exit.

        Its workers ignore the stop signals (:func:`~slurm_ddp.signals.ignore_in_loader_workers`), so the
        SIGTERM that ``multiprocessing``'s exit hook sends its daemonic children before joining them
        (``multiprocessing.util._exit_function``) does not end them; a persistent workers' iterator
        (``persistent_workers=True``: the ``DataLoader`` keeps it) still alive at exit made that join wait
        forever after a finished run. The iterator's own shutdown (a ``None`` on each index queue, then a
        join; what ``DataLoader``'s iterator does when it is freed, and what Lightning calls for its
        loaders) ends them cleanly."""
        if self._groups is not None:
            self._groups.close()  # the epoch's iterator, non-persistent workers included, is dropped with it
            self._groups = None
        loader = getattr(self, "loader", None)
        iterator = getattr(loader, "_iterator", None)
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        if loader is not None:
            loader._iterator = None

    # ------------------------------------------------------------------ loop
    def micro_batch_groups(self) -> Generator[list, None, None]:
        """Groups of ``self.accum`` micro-batches, epoch after epoch, from the saved position."""
        while True:
            self.batches.set_position(self.epoch, self.batch_in_epoch, self.epoch_base)
            group: list = []
            # the loader's workers are forked here: with the stop signals blocked until they ignore them
            with blocked(self.flag.signals) if self.tc.num_workers > 0 else contextlib.nullcontext():
                epoch_batches = iter(self.loader)
            for batch in epoch_batches:
                group.append(batch)
                if len(group) == self.accum:
                    yield group
                    group = []
            # a partial group at the end of an epoch is dropped (like drop_last)
            self.epoch += 1
            self.batch_in_epoch = 0
            self.epoch_base = 0

    def run_eval(self) -> Dict[str, float]:
        if self.eval_ds is None:
            return {}
        self.progress.mark(self.step, EVAL)
        t0 = time.perf_counter()
        result = evaluate(self.model, self.eval_ds, self.task.eval_sums, self.denv, self.tc.batch_size, self.device)
        if self.denv.is_main:
            shown = " ".join(f"{k}={v:.4f}" for k, v in result.items() if k != "eval_samples")
            log.info("eval at step %d: %s (%d samples)", self.step, shown, result["eval_samples"])
            took = time.perf_counter() - t0
            self.metrics.write(event="eval", step=self.step, loss=self.last_loss, duration_s=took, **result)
            if self.tb is not None:
                for k, v in result.items():
                    self.tb.add_scalar(k, v, self.step)
        return result

    def _profiler(self) -> Any:
        tc = self.tc
        if not tc.profile_first_step or tc.profile_last_step < tc.profile_first_step:
            return None
        from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
        wait = max(tc.profile_first_step - self.step - 1, 0)
        active = tc.profile_last_step - max(tc.profile_first_step, self.step + 1) + 1
        if active <= 0:
            return None
        return profile(
            activities=acts,
            schedule=schedule(wait=wait, warmup=0, active=active, repeat=1),
            on_trace_ready=tensorboard_trace_handler(
                str(self.run_dir / "profile"), worker_name=f"rank{self.denv.rank}"
            ),
        )

    def train(self) -> int:
        tc = self.tc
        if self.loss_sum is None:
            self.loss_sum = torch.zeros((), device=self.device)
        loss_sum = self.loss_sum  # updated in place; read only every log_every steps: no per-step sync
        # every checkpoint is of a window without NaN/inf (checked before each save), so this starts clear
        nonfinite = torch.zeros((), dtype=torch.bool, device=self.device)
        self.nonfinite = nonfinite  # updated in place below
        self.at_step_boundary = True
        t_log = time.perf_counter()
        step_at_log = self.step
        log.info(
            "training steps %d..%d: %d ranks × batch %d × %d micro-steps",
            self.step + 1,
            tc.max_steps,
            self.denv.world_size,
            tc.batch_size,
            self.accum,
        )
        prof = self._profiler()
        if prof is not None:
            prof.start()
        groups = self._groups = self.micro_batch_groups()
        prepared = False
        mark = self.progress.mark
        # After a background checkpoint the other ranks wait in the next step for rank 0, which may
        # still be saving (or waiting for the previous write): that step keeps the checkpoint phase.
        # The first step (compilation, autotuning, the first batches) keeps the start-up phase.
        mark(self.step, STARTUP)
        after_save = True
        first_step = True  # this start's first step: its time ends start-up (slurm-ddp report)
        saves = self.saves
        saves.begin(self.step)  # a collective under every_s / auto (every rank enters train() together)
        try:
            while self.step < tc.max_steps:
                if after_save:
                    after_save = False
                    micro = next(groups)
                else:
                    mark(self.step, DATA)
                    micro = next(groups)
                    mark(self.step, STEP)
                # this step's random streams from (train.seed, rank, step): known at every step
                # boundary, so any checkpoint of this step resumes exactly (step_seed)
                seed_step(tc.seed, self.denv.rank, self.step + 1, self.device)
                self.in_step, self.buffers_kept = True, False
                loss = optimizer_step(
                    self.forward_model,
                    micro,
                    self.task.loss,
                    self.optimizer,
                    device=self.device,
                    scaler=self.scaler,
                    autocast_dtype=self.autocast_dtype,
                    clip_grad_norm=tc.clip_grad_norm,
                    channels_last=tc.channels_last,
                )
                if self.scheduler is not None:
                    self.scheduler.step()
                self.step += 1
                self.batch_in_epoch += len(micro)
                self.in_step = False
                # the step is done: a hang report from here on names it (its phase stays as it was)
                mark(self.step, self.progress.phase)
                if first_step:  # one record per start, rank 0 only, no collective
                    first_step = False
                    self.metrics.write(
                        event="first_step",
                        step=self.step,
                        job_id=str(self.denv.job_id),
                        restart=self.denv.restart_count,
                        nodes=self.denv.num_nodes,
                    )
                loss_sum += loss
                self.loss_count += 1
                if tc.nan_check:
                    nonfinite |= ~torch.isfinite(loss)
                if prof is not None:
                    prof.step()
                    if self.step >= tc.profile_last_step:
                        prof.stop()
                        prof = None

                if self.step % tc.log_every == 0 or self.step == tc.max_steps:
                    self._check_finite(nonfinite)
                    self.last_loss = float(loss_sum) / self.loss_count
                    dt = time.perf_counter() - t_log
                    sps = (self.step - step_at_log) / dt if dt > 0 else 0.0
                    eta = (tc.max_steps - self.step) / sps if sps > 0 else float("nan")
                    log.info(
                        "step %d/%d loss %.4f %.1f steps/s eta %.0f s",
                        self.step,
                        tc.max_steps,
                        self.last_loss,
                        sps,
                        eta,
                    )
                    self.metrics.write(
                        event="train",
                        step=self.step,
                        epoch=self.epoch,
                        loss=self.last_loss,
                        steps_per_s=sps,
                        lr=self.optimizer.param_groups[0]["lr"],
                    )
                    if self.tb is not None:
                        self.tb.add_scalar("loss", self.last_loss, self.step)
                        self.tb.add_scalar("steps_per_s", sps, self.step)
                    loss_sum.zero_()
                    self.loss_count = 0
                    t_log, step_at_log = time.perf_counter(), self.step
                if self.writer is not None:
                    if not prepared:  # after the first step the optimizer state has its shapes
                        self.writer.prepare(self._big_state())
                        prepared = True
                    self.writer.check()  # a failed background write surfaces here
                if tc.eval_every and self.step % tc.eval_every == 0 and self.step < tc.max_steps:
                    self.run_eval()
                if saves.due(self.step) and self.step < tc.max_steps:
                    self._check_finite(nonfinite)  # never checkpoint a diverged model
                    self.last_blocked_s = None
                    self.save_checkpoint("periodic", sync=False)
                    write_s = self.writer.last_write_s if self.writer is not None else None
                    saves.saved(self.step, self.last_blocked_s, write_s)
                    after_save = True
                elif saves.agree_due(self.step) and self.step < tc.max_steps:
                    saves.agree(self.step)
                if self.stop.poll():
                    sig = self.flag.received.name if self.flag.received else "signal"
                    agreed_at = time.time()
                    log.warning("stopping for preemption (%s) after step %d", sig, self.step)
                    self._check_finite(nonfinite)  # never checkpoint a diverged model
                    self.save_checkpoint(f"preemption ({sig})")
                    self.stop.settle()  # a SIGTERM that came during the check or the save still counts
                    sig = self.flag.received.name if self.flag.received else sig
                    self.metrics.write(
                        event="preempted",
                        step=self.step,
                        signal=sig,
                        # when this rank got it (or, signalled elsewhere, when the ranks agreed to stop)
                        signal_time=self.flag.received_at or agreed_at,
                    )
                    if self.denv.is_main:  # read by the batch script, even if srun's status is lost
                        write_preempted(
                            self.run_dir,
                            Preempted(
                                job_id=str(self.denv.job_id),
                                restart=self.denv.restart_count,
                                step=self.step,
                                signal=sig,
                            ),
                        )
                    return PREEMPTED_EXIT_CODE
        finally:
            if prof is not None:
                prof.stop()
        self._check_finite(nonfinite)
        return 0

    def _check_finite(self, nonfinite: torch.Tensor) -> None:
        """Raise ``TrainingDiverged`` on every rank when the loss was NaN/inf on any rank (a collective)."""
        if not self.tc.nan_check:
            return
        bad = nonfinite.to(torch.int32).reshape(1)
        if dist.is_initialized() and self.denv.world_size > 1:
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bool(bad[0]):
            raise TrainingDiverged(
                f"the loss became NaN or infinite before step {self.step} (train.nan_check); the last good "
                f"checkpoint is kept in {self.ckpt.directory}. Lower train.lr or enable train.clip_grad_norm"
            )

    def finish(self) -> Dict[str, float]:
        result = self.run_eval()
        self.save_checkpoint("final")
        if self.denv.is_main:
            atomic_write(self.run_dir / FINAL_MODEL_NAME, lambda f: torch.save(self.model.state_dict(), f))
            record = {
                "step": self.step,
                "world_size": self.denv.world_size,
                "time": time.time(),
                "checkpoint_blocked_s": self.blocked_s,
                **result,
            }
            write_finished(self.run_dir, record)
            log.info("finished at step %d; weights in %s", self.step, self.run_dir / FINAL_MODEL_NAME)
            self.metrics.write(event="finished", step=self.step, **result)
        dist.barrier()
        return result

    def run(self) -> int:
        denv = self.denv
        ok = False
        self.flag.install()
        saver_done = threading.Event()
        if self.cfg.in_job_recovery and self.cfg.watchdog.enabled:
            threading.Thread(target=self._hang_saver, args=(saver_done,), name="hang-saver", daemon=True).start()
        status = 1
        try:
            t0 = time.perf_counter()
            store = None
            if self.place is not None:  # in-process recovery: every process of the step joins rank 0's store
                _, self.device = rank_device(denv, self.tc.backend)
                self.membership = Membership(
                    denv.master_addr,
                    denv.master_port,
                    self.place.slot,
                    serve=denv.is_main,
                    timeout_s=max(self.cfg.watchdog.startup_s, self.tc.pg_timeout_s),
                    heartbeat_s=self.cfg.recovery.heartbeat_interval_s,
                    dead_after_s=self.cfg.recovery.heartbeat_timeout_s,
                )
            if self.spare:  # build the task, then wait warm until a lost node's ranks are this node's
                assert self.membership is not None
                self.build()
                end_startup_gc()
                self.membership.spare_ready()
                log.warning(
                    "warm spare on %s: task built in %.1f s; waiting to be called in",
                    denv.hostname,
                    time.perf_counter() - t0,
                )
                plan = self.membership.wait_for_call()
                if plan is None or not self._follow(plan, time.time(), "called in"):
                    log.warning("warm spare on %s: the step ended without calling it in", denv.hostname)
                    ok, status = True, 0
                    return status
            else:
                if self.membership is not None and self.place is not None:
                    self.plan = first_plan(self.place.step_nodes, self.place.tasks_per_node)
                    store = self.membership.group_store(self.plan.generation)
                self.device = init_distributed(
                    denv, self.tc.backend, self.tc.pg_timeout_s, store=store, device=getattr(self, "device", None)
                )
                if self.membership is not None:
                    self.membership.watch(self.plan)  # a node that falls silent while this generation trains
                if dist.get_backend() != "gloo":  # the preemption flag lives on the CPU: a gloo group for it
                    self.stop.group = dist.new_group(backend="gloo")
                if denv.is_main:
                    log.info(
                        "process group formed in %.3f s (backend %s, world size %d)",
                        time.perf_counter() - t0,
                        dist.get_backend(),
                        denv.world_size,
                    )
                if denv.is_main and (self.cfg.tracking.mlflow.enabled or self.cfg.tracking.wandb.enabled):
                    from ..tracking import Tracker

                    host = denv.hostname or socket.gethostname()
                    self.metrics.tracker = Tracker.open(
                        self.run_dir, self.cfg, job_id=str(denv.job_id), restart=denv.restart_count, host=host
                    )
                self.build()
                end_startup_gc()  # python -m slurm_ddp.worker paused it for the start-up
                self.resume()
            status = self.train_recovering()
            if status == 0:
                self.finish()
            ok = True
            return status
        except _StandbyEnded as e:  # left out of a generation, it waited as a spare until the step ended
            log.warning("%s", e)
            status = 0
            return status
        except RecoveryAbandoned as e:  # a called-in spare's generation never formed and none came after it
            log.error("warm spare %s: in-process recovery given up: %s", self._slot(), e)
            status = 0  # the training ranks take their peer-failure path; this spare failed nothing
            return status
        except RuntimeError as e:  # DistBackendError included
            if is_peer_failure(e):
                raise self._peer_failure(e) from e
            self._report_crash(e)
            raise
        except BaseException as e:
            self._report_crash(e)
            if self.spare and self.plan is None and not isinstance(e, (KeyboardInterrupt, SystemExit)):
                # a warm spare's own failure (its data, its GPU, an import) is the spare's problem: named in
                # the run's records, left out of every plan, and no failed exit (the training ranks go on)
                log.error("warm spare %s failed before it was called in: %s", self._slot(), e, exc_info=True)
                return 0
            raise
        finally:
            saver_done.set()
            if self.membership is not None:
                if self.denv.is_main:  # srun may wait for a lost node's tasks: the batch script ends it
                    write_step_end(os.environ, status if ok else 1)
                    self.membership.done()  # the waiting spares end
                self.membership.close()
            self.flag.restore()
            # close(), not just wait(): the writer thread must end here. Left idle, it still holds its
            # last job (the snapshot buffers); weakref.finalize's atexit hook wakes it at exit, and a
            # thread that frees tensors there (THPVariable_clear drops the GIL) and retakes the GIL
            # after finalization began is pthread_exit'ed inside noexcept C++: std::terminate, the
            # SIGABRT "terminate called without an active exception" of a finished rank 0.
            if self.writer is not None:
                try:
                    self.writer.close()
                except CheckpointError as e:
                    log.error("%s", e)
            self.close_loader()
            if self.tb is not None:
                self.tb.close()
            if self.metrics.tracker is not None:  # flushes MLflow's queue; FINISHED after a finished event
                self.metrics.tracker.close()
            # The DDP wrapper holds the process group (and its backend threads): release both now,
            # while the interpreter is fully alive, rather than at interpreter teardown, where a gloo
            # thread that still drops a finished collective aborts the process ("terminate called
            # without an active exception"). Normal exits only: after a peer failure the threads may
            # still wait on the dead peer, and joining them would hang.
            if ok:
                for name in ("forward_model", "ddp"):
                    self.__dict__.pop(name, None)
                self.stop.group = None
                shutdown_distributed()
            elif dist.is_initialized():
                dist.destroy_process_group()

    # ------------------------------------------------------------------ in-process recovery
    def train_recovering(self) -> int:
        """``train()``, and under in-process recovery (``recovery.in_process``) again after each lost node the
        survivors recovered from without leaving this process (:meth:`_recover_in_process`). A failure it
        cannot recover from is raised as it came (the peer-failure path of :meth:`run`)."""
        while True:
            try:
                return self.train()
            except RuntimeError as e:
                if self.membership is None or not is_peer_failure(e):
                    raise
                if not self._recover_in_process(e):
                    raise

    def _recover_in_process(self, e: BaseException) -> bool:
        """After a failed collective: leave the broken group with the model, optimizer and data position of the
        last completed step kept in memory, check in for the next generation and join it
        (:class:`~slurm_ddp.worker.inprocess.Membership`; rank 0 decides). False when the step cannot go on
        in-process (the reason is logged): the caller's peer-failure path follows."""
        assert self.membership is not None and self.plan is not None and self.place is not None
        t_fail = time.time()
        self.membership.watch(None)  # the coordinator judges the members from here on
        log.warning(
            "a peer was lost after step %d (%s); recovering in-process (generation %d)",
            self.step,
            self._peer_message(e)[-200:],
            self.plan.generation + 1,
        )
        self.progress.mark(self.step, STARTUP)
        if self.in_step and self.buffers_kept:  # the failed step's forward updated them: back to its start
            live = dict(self.model.named_buffers())
            with torch.no_grad():
                for name, kept in self.kept_buffers.items():
                    live[name].copy_(kept)
        # in_step stays as it is until this rank is in the next generation: when recovery is given up (the
        # batch host lost …), the emergency save of the peer-failure path needs to know the buffers it holds
        # are the failed step's start (rank 0's, broadcast by DDP), not this rank's own
        for name in ("forward_model", "ddp"):  # they hold the broken group
            self.__dict__.pop(name, None)
        self.stop.group = None
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
            raise _StandbyEnded(
                f"{self.place.slot} was taken for lost (silent past recovery.heartbeat_timeout_s="
                f"{self.cfg.recovery.heartbeat_timeout_s} s) and waited as a spare; the step ended without calling it in"
            )
        return True

    def _recovery_deadline_s(self) -> float:
        return self.tc.pg_timeout_s + 30.0

    def _next_generation(self, plan: Plan, replanned: str = "") -> Plan:
        """Check in for the generation after ``plan`` and get its plan (rank 0 of ``plan`` decides it,
        ``Membership.coordinate``). Raises :class:`RecoveryAbandoned` when there is none."""
        assert self.membership is not None and self.place is not None
        # a spare called into a generation that never formed holds no state: it must not be the source
        self.membership.check_in(plan, self.step if self.plan is not None else -1)
        deadline = self._recovery_deadline_s()
        if plan.ranks.get(self.place.slot) == 0:
            return self.membership.coordinate(
                plan,
                self.place.spare_slots(),
                tasks_per_node=self.place.tasks_per_node,
                min_nodes=self.cfg.recovery_min_nodes,
                # one budget per job start: what the supervisor left this step (earlier steps' recoveries count)
                max_generations=recoveries_left(os.environ, self.cfg.recovery.max_restarts),
                deadline_s=deadline,
                replanned=replanned,
            )
        return self.membership.wait_plan(plan.generation + 1, deadline + 10.0)

    def _mark_waiting(self) -> None:
        """A rank waiting as a spare is alive: its progress record says so (start-up phase, its last step)."""
        self.progress.mark(self.step, STARTUP)

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
                    self.cfg.recovery.heartbeat_timeout_s,
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
        size: exact; a smaller one: sample-exact, ``_resume_resized``), and rebuild DDP, the data loader and
        the stop agreement for the new rank and world size."""
        from dataclasses import replace

        assert self.membership is not None and self.place is not None
        rank = plan.ranks[self.place.slot]
        # the source's state, made before this rank's place changes (its world size is the old one)
        state = self.training_state() if rank == plan.source and self.plan is not None else None
        was_spare = self.plan is None
        self.denv = replace(
            self.denv,
            rank=rank,
            world_size=plan.world_size,
            node_rank=plan.nodes.index(self.place.node),
            num_nodes=len(plan.nodes),
        )
        os.environ.update(self.denv.torch_env())
        if was_spare:
            setup_logging(rank)
            self.progress = progress_recorder()  # judged by the hang watchdog from now on
            self.progress.mark(0, STARTUP)
        self.plan = plan
        init_distributed(
            self.denv,
            self.tc.backend,
            self.tc.pg_timeout_s,
            store=self.membership.group_store(plan.generation),
            device=self.device,
        )
        box = [state]
        dist.broadcast_object_list(box, src=plan.source)
        state = box[0]
        assert state is not None
        old_world = self._load_training_state(state)
        self._place_in_epoch(state, old_world, exact=old_world == self.denv.world_size)
        self.build_ddp()
        self.build_loader()
        self.stop = StepAgreement(self.flag)
        if dist.get_backend() != "gloo":
            self.stop.group = dist.new_group(backend="gloo")
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
            self.step,
            plan.source,
            took,
        )
        if self.denv.is_main:
            b = self.tc.batch_size
            self.metrics.write(
                event="resume",
                step=self.step,
                restart=self.denv.restart_count,
                world_size=self.denv.world_size,
                emergency=False,
                in_process=True,
                generation=plan.generation,
                grad_accum_steps=self.accum,
                samples_in_epoch=samples_in_epoch(self.epoch_base, self.batch_in_epoch, self.denv.world_size, b),
            )
            try:
                record_recovery(
                    self.run_dir,
                    job_id=str(self.denv.job_id),
                    restart=self.denv.restart_count,
                    attempt=plan.generation - 1,
                    time=t_fail,
                    action=IN_PROCESS,
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

    def _slot(self) -> str:
        return self.place.slot if self.place is not None else str(self.denv.rank)

    def _report_crash(self, e: BaseException) -> None:
        """In-process recovery: tell the step's store this rank failed of its own (not a lost peer), so the
        survivors give up instead of calling a spare in for it. A warm spare not yet called in reports a
        spare failure instead (``Membership.spare_failed``: left out of every plan, no ``crash``), and names
        itself in the run's metrics (``spare_failed`` event)."""
        if self.membership is None:
            return
        what = f"{type(e).__name__}: {str(e)[:300]}"
        if self.spare and self.plan is None:
            self.membership.spare_failed(what)
            host = self.denv.hostname or socket.gethostname()
            try:
                append_jsonl(
                    self.run_dir / METRICS_NAME,
                    {"event": "spare_failed", "slot": self._slot(), "host": host, "error": what, "time": time.time()},
                )
            except OSError as err:
                log.error("could not record the spare's failure: %s", err)
            return
        self.membership.report_crash(what)

    def _peer_failure(self, e: BaseException) -> PeerFailure:
        """The ``PeerFailure`` for ``e``, after committing the last completed step alone
        (``_emergency_save``) and then leaving the step's peer-lost marker (in-job recovery: the batch
        script stops waiting for a step whose lost node Slurm has not yet marked DOWN)."""
        message = self._peer_message(e)
        self._emergency_save(message)
        host = self.denv.hostname or socket.gethostname()
        write_peer_lost(os.environ, peer_lost_record(self.denv.rank, host, self.step, message))
        return PeerFailure(message)

    def _emergency_save(self, why: str) -> str:
        """After a lost or hung peer, commit the state of the last completed step from this rank alone,
        so that the next start redoes at most the step that failed (not everything since the last
        periodic checkpoint). No collective. The first survivor to claim the step writes it
        (``CheckpointManager.write_once``); the others wait up to ``EMERGENCY_WAIT_S`` for it before they
        exit (an early non-zero exit makes srun end the step, the writer with it). Skipped without in-job
        recovery (``JobConfig.in_job_recovery``), before the train loop (nothing loaded yet), when the
        step is already committed, when this rank saw a NaN/inf loss in the window (``train.nan_check``),
        and on a rank other than 0 whose buffers are its own (between two steps: DDP's are rank 0's). Called from the main thread after a failed
        collective, or from the hang saver's thread (``_hang_saver``) while the main thread waits in one.
        Never raises: a failed save leaves the resume to the newest committed checkpoint, as before.
        Returns the outcome in a few words (``committed``, why not).
        """
        if not self.cfg.in_job_recovery:
            # A requeued job resumes from its newest periodic checkpoint. Saving here too was tried: a hang
            # that repeats at the same step then recurs in the resumed job's first step, under the
            # watchdog's start-up allowance (watchdog.startup_s) instead of a step's, and is found late.
            return "skipped: no in-job recovery"
        if not self.at_step_boundary:
            return "skipped: training had not begun"
        step = self.step
        try:
            if self.tc.nan_check and self.nonfinite is not None and bool(self.nonfinite):
                log.error("no emergency checkpoint of step %d: the loss was NaN or infinite on this rank", step)
                return "skipped: NaN/inf loss on this rank"
            if self.writer is not None:  # a background write (rank 0's) first: two writers never overlap
                try:
                    self.writer.wait()
                except CheckpointError as e:
                    log.error("%s", e)
            if any(i.step == step for i in self.ckpt.committed(quiet=True)):
                log.warning("a peer was lost after step %d, whose checkpoint is committed", step)
                return f"step {step} already committed"
            if self.denv.rank != 0 and self.buffer_names and not (self.in_step and self.buffers_kept):
                # DDP's buffers are rank 0's (broadcast at each forward); between steps this rank holds
                # its own, updated by its last forward: rank 0, or the newest periodic checkpoint, saves
                log.warning(
                    "no emergency checkpoint of step %d from rank %d: its buffers (BatchNorm statistics …) are "
                    "its own, not rank 0's, between two steps",
                    step,
                    self.denv.rank,
                )
                return "skipped: this rank's buffers are not rank 0's between two steps"
            t0 = time.perf_counter()
            host = self.denv.hostname or socket.gethostname()
            record = {"rank": self.denv.rank, "host": host, "job_id": str(self.denv.job_id), "why": why[-300:]}
            saved: List[CheckpointInfo] = []

            def write() -> None:
                state = self.training_state()
                if self.in_step and self.buffers_kept:  # the failed step's forward ran
                    state["model"].update(self.kept_buffers)  # its buffers as the step began
                saved.append(self.ckpt.save(state, step, world_size=self.denv.world_size, emergency=record))

            wrote, outcome = self.ckpt.write_once(step, write, EMERGENCY_WAIT_S)
            if not wrote:
                log.warning("emergency checkpoint of step %d by another survivor: %s", step, outcome or "no answer")
                return f"by another survivor: {outcome or 'no answer'}"
            info = saved[0]
            took = time.perf_counter() - t0
            log.warning(
                "emergency checkpoint of step %d committed by rank %d alone after a lost or hung peer (%.1f MB, %.3f s)",
                step,
                self.denv.rank,
                info.size_bytes / 1e6,
                took,
            )
            # this rank may not be rank 0 (whose MetricsWriter alone writes): one line, appended directly
            append_jsonl(
                self.run_dir / METRICS_NAME,
                {
                    "event": "emergency_checkpoint",
                    "step": step,
                    "rank": self.denv.rank,
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
        """The rank this process's hang watchdog names in its report: the launch wrapper's, i.e. Slurm's task
        number (``SLURM_PROCID``). Under in-process recovery it differs from the training rank (a warm spare's
        is -1, a renumbered survivor's changes); otherwise they are the same."""
        procid = os.environ.get("SLURM_PROCID", "")
        return int(procid) if self.place is not None and procid.isdigit() else self.denv.rank

    def _hang_saver(self, done: threading.Event) -> None:
        """A daemon thread under in-job recovery with the watchdog on: when this rank's watchdog reports a
        hang (its report appears: ``rundir.hang_report_path``) it is about to end the rank, most likely
        while the main thread waits in a collective for a hung or stopped peer; the thread commits the
        last completed step alone (``_emergency_save``) and answers the watchdog (``rundir.hangs``: the
        save before a hung job's ranks end), which waits for that before it kills the rank. Looks every
        0.5 s (a ``stat``) until ``done``."""
        job_id, restart, rank = str(self.denv.job_id), self.denv.restart_count, self.watchdog_rank()
        report = hang_report_path(self.run_dir, job_id, restart, rank)
        while not done.wait(0.5):
            if report.exists():
                break
        else:
            return
        try:
            start_hang_save(self.run_dir, job_id, restart, rank)
        except OSError as e:
            log.error("cannot answer the hang watchdog in %s: %s", report.parent, e)
            return
        host = self.denv.hostname or socket.gethostname()
        outcome = self._emergency_save(f"rank {rank} on {host}: its hang watchdog ends it after step {self.step}")
        end_hang_save(self.run_dir, job_id, restart, rank, outcome)

    def _peer_message(self, e: BaseException) -> str:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (
            f"rank {self.denv.rank} on {self.denv.hostname or socket.gethostname()}: a peer rank stopped "
            f"responding or died (no answer within train.pg_timeout_s={self.tc.pg_timeout_s} s, or its "
            f"connection closed) at step {self.step}; see the other ranks' logs for the cause. ({first[:300]})"
        )


class _StandbyEnded(Exception):
    """A rank taken for lost that waited as a spare until the step ended (exit 0: it failed nothing)."""


def gather_rank_digests(mine: Tuple[int, str], device: torch.device) -> List[Tuple[int, str]]:
    """Collective (one all_gather): every rank's ``(size_bytes, sha256_hex)`` of its rank state file, by
    rank. Packed as 40 uint8 per rank (8 B little-endian size, 32 B digest), on ``device`` under NCCL."""
    size, digest = mine
    packed = size.to_bytes(8, "little") + bytes.fromhex(digest)
    if dist.get_backend() != "nccl":
        device = torch.device("cpu")
    t = torch.tensor(list(packed), dtype=torch.uint8, device=device)
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    digests = []
    for o in out:
        b = bytes(o.cpu().tolist())
        digests.append((int.from_bytes(b[:8], "little"), b[8:].hex()))
    return digests


def main(run_dir: str, environ: Optional[Dict[str, str]] = None) -> int:
    """Entry of ``python -m slurm_ddp.worker --run-dir DIR``: returns the exit status."""
    environ = dict(os.environ if environ is None else environ)
    rd = Path(run_dir).resolve()
    denv = DistEnv.from_environ(environ)  # srun's task variables, or torchrun's under slurm.launcher=torchrun
    cfg = load_config(rd / CONFIG_NAME) if (rd / CONFIG_NAME).exists() else None
    place: Optional[Place] = None
    if cfg is not None and cfg.recovery.in_process and environ.get(STEP_NODES_VAR):
        # in-process recovery: one step on every node; the ranks are those of the training nodes, the rest spares
        denv, place = place_in_step(denv, environ, cfg.slurm.tasks_per_node)
    setup_logging(denv.rank)
    logging.getLogger("slurm_ddp.rank").info(
        "host %s (%s) rank %d/%d local_rank %d/%d node_rank %d master %s:%d job %s restart %d pid %d",
        denv.hostname or socket.gethostname(),
        socket.gethostname(),
        denv.rank,
        denv.world_size,
        denv.local_rank,
        denv.local_world_size,
        denv.node_rank,
        denv.master_addr,
        denv.master_port,
        denv.job_id,
        denv.restart_count,
        os.getpid(),
    )
    if is_finished(rd):
        log.info("run %s already finished (%s exists): nothing to do", rd, FINISHED_NAME)
        return 0
    cfg = cfg or load_config(rd / CONFIG_NAME)
    if place is None or not place.spare:
        denv.validate_against(cfg)
    os.environ.update(denv.torch_env())  # for user code that reads RANK/LOCAL_RANK/…
    if cfg.train.workdir:  # the user's directory (the task's relative paths), on every backend; code: the snapshot
        try:
            os.chdir(cfg.train.workdir)
        except OSError as e:
            raise UserError(
                f"train.workdir {cfg.train.workdir!r}: cannot enter it on {socket.gethostname()} ({e.strerror}); "
                "the ranks run there: put it on a file system every node mounts"
            ) from None
    return Trainer(cfg, rd, denv, place).run()
