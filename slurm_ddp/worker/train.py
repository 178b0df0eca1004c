"""The shared DDP worker: one process per SLURM task trains the job's ``Task``.

Built only from public pieces — ``DistEnv`` (env), ``PreemptionFlag`` (signals),
``CheckpointManager`` (checkpoint) and ``worker.runtime`` — that a user's own training
script can use the same way. Side effects: everything a training process does.

Exit statuses: 0 finished (or already finished); ``PREEMPTED_EXIT_CODE`` (75) stopped for
preemption after the checkpoint of the last completed step was committed; 2 bad input.

Why over 600 lines: most of it is one class, :class:`Trainer`, whose methods share the state of
one training process (model, optimizer, sampler, scaler, step, the preemption flag) and run in one
order (build → resume → train loop → stop or finish). What it does when a peer is lost or hangs (the
emergency save, the hang saver, the peer failure, the in-process join) is a helper it owns
(``worker.fault.FaultTolerance``, its ``fault``); its reusable pieces live elsewhere
(``worker.runtime``, ``checkpoint``, ``resize``, ``signals``); splitting the rest across modules would
only scatter that order.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Dict, Generator, List, Optional, Tuple, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from ..checkpoint import AsyncCheckpointer, CheckpointInfo, CheckpointManager, atomic_write
from ..config import JobConfig, load_config
from ..constants import PREEMPTED_EXIT_CODE
from ..env import DistEnv
from ..errors import CheckpointError, NoRestart, TrainingDiverged, UserError
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
    end_partial_line,
    is_finished,
    read_metrics,
    write_finished,
    write_preempted,
)
from ..signals import PreemptionFlag, blocked, ignore_in_loader_workers, loader_context, worker_signals
from ..snapshot import run_pythonpath
from ..task import Task, load_task_class
from .fault import FaultTolerance, StandbyEnded
from .inprocess import Place, RecoveryAbandoned, place_in_step
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
    setup_logging,
    shutdown_distributed,
)
from .saves import SaveSchedule

log = logging.getLogger("slurm_ddp.worker")


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

    device: torch.device  #: this rank's device, from run() on (``init_distributed``, ``rank_device``)

    def __init__(self, cfg: JobConfig, run_dir: Path, denv: DistEnv, place: Optional[Place] = None):
        self.cfg, self.run_dir, self.denv = cfg, run_dir, denv
        # the emergency save, hang saver, peer failure and in-process recovery (slurm_ddp.worker.fault)
        self.fault = FaultTolerance(self, place)
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
        self.progress = DISABLED if self.fault.spare else progress_recorder()

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
        self.fault.track_buffers(model)  # kept at each step's start for an emergency checkpoint
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
        if self.fault.waiting_spare:
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
        if self.fault.waiting_spare:
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
        old_world = self.load_training_state(state)
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
        self.place_in_epoch(state, old_world, exact)
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

    def load_training_state(self, state: Dict[str, Any]) -> int:
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

    def place_in_epoch(self, state: Dict[str, Any], old_world: int, exact: bool) -> None:
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
        fault = self.fault
        fault.nonfinite = nonfinite  # updated in place below
        fault.at_step_boundary = True
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
                fault.in_step, fault.buffers_kept = True, False
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
                fault.in_step = False
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
        fault = self.fault
        ok = False
        self.flag.install()
        fault.start_hang_saver()
        status = 1
        try:
            t0 = time.perf_counter()
            if fault.place is not None:  # in-process recovery: every process of the step joins rank 0's store
                _, self.device = rank_device(denv, self.tc.backend)
                fault.join_step()
            if fault.spare:  # build the task, then wait warm until a lost node's ranks are this node's
                self.build()
                end_startup_gc()
                if not fault.serve_as_spare(t0):
                    ok, status = True, 0
                    return status
            else:
                store = fault.first_store()
                self.device = init_distributed(
                    denv, self.tc.backend, self.tc.pg_timeout_s, store=store, device=getattr(self, "device", None)
                )
                fault.watch_first()  # a node that falls silent while this generation trains
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
            status = fault.train_recovering()
            if status == 0:
                self.finish()
            ok = True
            return status
        except StandbyEnded as e:  # left out of a generation, it waited as a spare until the step ended
            log.warning("%s", e)
            status = 0
            return status
        except RecoveryAbandoned as e:  # a called-in spare's generation never formed and none came after it
            log.error("warm spare %s: in-process recovery given up: %s", fault.slot(), e)
            status = 0  # the training ranks take their peer-failure path; this spare failed nothing
            return status
        except RuntimeError as e:  # DistBackendError included
            if is_peer_failure(e):
                raise fault.peer_failure(e) from e
            fault.report_crash(e)
            raise
        except BaseException as e:
            if isinstance(e, NoRestart) and not fault.waiting_spare:  # the batch side neither restarts nor requeues
                fault.report_no_restart(e)
                status = NoRestart.exit_code  # rank 0's step end says it too (in-process: the step's status)
            fault.report_crash(e)
            if fault.waiting_spare and not isinstance(e, (KeyboardInterrupt, SystemExit)):
                # a warm spare's own failure (its data, its GPU, an import) is the spare's problem: named in
                # the run's records, left out of every plan, and no failed exit (the training ranks go on)
                log.error("warm spare %s failed before it was called in: %s", fault.slot(), e, exc_info=True)
                return 0
            raise
        finally:
            fault.close(
                status if ok or status == NoRestart.exit_code else 1
            )  # the hang saver; the step's store under in-process recovery
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
                self.release_ddp()
                shutdown_distributed()
            elif dist.is_initialized():
                dist.destroy_process_group()

    def release_ddp(self) -> None:
        """Drop the DDP wrapper (compiled or not) and the stop agreement's gloo group: they hold the process
        group (the broken one after a lost peer)."""
        for name in ("forward_model", "ddp"):
            self.__dict__.pop(name, None)
        self.stop.group = None


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
