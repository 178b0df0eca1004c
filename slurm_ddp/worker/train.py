"""The shared DDP worker: one process per SLURM task trains the job's ``Task``.

Built only from public pieces — ``DistEnv`` (env), ``PreemptionFlag`` (signals),
``CheckpointManager`` (checkpoint) and ``worker.runtime`` — that a user's own training
script can use the same way. Side effects: everything a training process does.

Exit statuses: 0 finished (or already finished); ``PREEMPTED_EXIT_CODE`` (75) stopped for
preemption after the checkpoint of the last completed step was committed; 2 bad input.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from .. import PREEMPTED_EXIT_CODE
from ..checkpoint import CheckpointManager, atomic_write, atomic_write_text
from ..config import JobConfig, load_config
from ..env import DistEnv
from ..errors import UserError
from ..signals import PreemptionFlag
from ..task import Task, load_task_class
from .runtime import (
    ResumableDistributedSampler,
    capture_rng,
    evaluate,
    gather_to_main,
    init_distributed,
    restore_rng,
    seed_everything,
)

log = logging.getLogger("slurm_ddp.worker")
FINISHED = "FINISHED"
#: "JOB_ID RESTART_COUNT STEP SIGNAL" of the last stop for preemption (the batch script reads it)
PREEMPTED = "PREEMPTED"
FINAL_MODEL = "final_model.pt"


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

    def write(self, **record: Any) -> None:
        if not self.enabled:
            return
        record.setdefault("time", time.time())
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


class Trainer:
    """State and steps of one rank's training run; ``run()`` returns the exit status."""

    def __init__(self, cfg: JobConfig, run_dir: Path, denv: DistEnv):
        self.cfg, self.run_dir, self.denv = cfg, run_dir, denv
        self.tc = cfg.train
        self.flag = PreemptionFlag([cfg.requeue.signal_name, "TERM"])
        self.ckpt = CheckpointManager(run_dir / "checkpoints", cfg.checkpoint.keep_last, cfg.config_hash())
        self.metrics = MetricsWriter(run_dir / "metrics.jsonl", denv.is_main)
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.last_loss: Optional[float] = None

    # ------------------------------------------------------------------ setup
    def build(self) -> None:
        tc, denv = self.tc, self.denv
        task_cls = load_task_class(tc.task, tc.pythonpath)
        self.task: Task = task_cls(tc)
        seed_everything(tc.seed)  # same initial weights on every rank
        model = self.task.build_model().to(self.device)
        self.model = model
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        self.ddp = DDP(model, device_ids=device_ids)  # also broadcasts rank 0's weights
        self.optimizer = self.task.build_optimizer(model)
        self.scheduler = self.task.build_scheduler(self.optimizer)
        self.train_ds, self.eval_ds = self.task.build_datasets()
        self.sampler = ResumableDistributedSampler(self.train_ds, denv.world_size, denv.rank, seed=tc.seed)
        if len(self.sampler) // tc.batch_size == 0:
            raise UserError(
                f"train.batch_size={tc.batch_size} is larger than a rank's share of the training set "
                f"({len(self.sampler)} samples); lower it"
            )
        # Different data-order-independent randomness (augmentation, dropout) per rank.
        seed_everything(tc.seed + 1000003 * (denv.rank + 1))

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """The full training state on rank 0 (None elsewhere). A collective (gathers RNG)."""
        rngs = gather_to_main(capture_rng(), self.denv)
        if not self.denv.is_main:
            return None
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "task": self.task.state_dict(),
            "step": self.step,
            "epoch": self.epoch,
            "batch_in_epoch": self.batch_in_epoch,
            "rng": rngs,
            "world_size": self.denv.world_size,
            "config_hash": self.cfg.config_hash(),
        }

    def save_checkpoint(self, reason: str) -> None:
        """Collective: gather state, rank 0 commits it, barrier."""
        t0 = time.perf_counter()
        state = self.state_dict()
        if state is not None:
            info = self.ckpt.save(state, self.step, world_size=self.denv.world_size)
            log.info("checkpoint of step %d committed (%s, %.1f MB, %.3f s)", self.step, reason,
                     info.size_bytes / 1e6, time.perf_counter() - t0)
            self.metrics.write(event="checkpoint", step=self.step, reason=reason, seconds=time.perf_counter() - t0)
        dist.barrier()

    def resume(self) -> None:
        """Load the newest valid checkpoint (every rank reads it) and continue from its step."""
        info = self.ckpt.latest()
        if info is None:
            log.info("no checkpoint in %s: starting at step 0", self.ckpt.directory)
            return
        state = self.ckpt.load(info)
        assert state is not None
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.task.load_state_dict(state.get("task") or {})
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        if state.get("config_hash") != self.cfg.config_hash():
            log.warning("checkpoint of step %d was written under a different config; resuming anyway", self.step)
        rngs = state.get("rng") or []
        if state.get("world_size") == self.denv.world_size and len(rngs) == self.denv.world_size:
            restore_rng(rngs[self.denv.rank])
        else:
            log.warning(
                "checkpoint world size %s != current %d: data order and RNG streams cannot continue exactly; "
                "resuming with fresh per-rank seeds", state.get("world_size"), self.denv.world_size)
            seed_everything(self.tc.seed + 7919 * (self.step + 1) + self.denv.rank)
        log.info("resumed from checkpoint of step %d (epoch %d, batch %d of the epoch) in %s",
                 self.step, self.epoch, self.batch_in_epoch, info.path)
        self.metrics.write(event="resume", step=self.step, restart=self.denv.restart_count)

    # ------------------------------------------------------------------ loop
    def loader(self) -> DataLoader:
        tc = self.tc
        self.sampler.set_epoch(self.epoch)
        self.sampler.set_start(self.batch_in_epoch * tc.batch_size)
        # A dedicated generator: creating the iterator then draws no number from the
        # global torch RNG, whose state is part of the checkpoint.
        gen = torch.Generator().manual_seed(tc.seed * 100003 + self.epoch * 101 + self.denv.rank)
        return DataLoader(
            self.train_ds,
            batch_size=tc.batch_size,
            sampler=self.sampler,
            num_workers=tc.num_workers,
            drop_last=True,
            pin_memory=self.device.type == "cuda",
            generator=gen,
        )

    def run_eval(self) -> Dict[str, float]:
        if self.eval_ds is None:
            return {}
        result = evaluate(self.model, self.eval_ds, self.task.eval_sums, self.denv, self.tc.batch_size, self.device)
        if self.denv.is_main:
            shown = " ".join(f"{k}={v:.4f}" for k, v in result.items() if k != "eval_samples")
            log.info("eval at step %d: %s (%d samples)", self.step, shown, result["eval_samples"])
            self.metrics.write(event="eval", step=self.step, loss=self.last_loss, **result)
        return result

    def train(self) -> int:
        tc, ck = self.tc, self.cfg.checkpoint
        non_blocking = self.device.type == "cuda"
        loss_sum = torch.zeros((), device=self.device)  # read only every log_every steps: no per-step sync
        loss_count = 0
        t_log = time.perf_counter()
        step_at_log = self.step
        log.info("training steps %d..%d, %d ranks × batch %d", self.step + 1, tc.max_steps,
                 self.denv.world_size, tc.batch_size)
        while self.step < tc.max_steps:
            for inputs, targets in self.loader():
                inputs = inputs.to(self.device, non_blocking=non_blocking)
                targets = targets.to(self.device, non_blocking=non_blocking)
                self.optimizer.zero_grad(set_to_none=True)
                loss = self.task.loss(self.ddp(inputs), targets)
                loss.backward()
                self.optimizer.step()
                if self.scheduler is not None:
                    self.scheduler.step()
                self.step += 1
                self.batch_in_epoch += 1
                loss_sum += loss.detach()
                loss_count += 1

                if self.step % tc.log_every == 0 or self.step == tc.max_steps:
                    self.last_loss = float(loss_sum) / loss_count
                    dt = time.perf_counter() - t_log
                    sps = (self.step - step_at_log) / dt if dt > 0 else 0.0
                    eta = (tc.max_steps - self.step) / sps if sps > 0 else float("nan")
                    log.info("step %d/%d loss %.4f %.1f steps/s eta %.0f s", self.step, tc.max_steps,
                             self.last_loss, sps, eta)
                    self.metrics.write(event="train", step=self.step, epoch=self.epoch, loss=self.last_loss,
                                       steps_per_s=sps, lr=self.optimizer.param_groups[0]["lr"])
                    loss_sum.zero_()
                    loss_count = 0
                    t_log, step_at_log = time.perf_counter(), self.step
                if tc.eval_every and self.step % tc.eval_every == 0 and self.step < tc.max_steps:
                    self.run_eval()
                if ck.every_steps and self.step % ck.every_steps == 0 and self.step < tc.max_steps:
                    self.save_checkpoint("periodic")
                if self.flag.sync(device=self.device):
                    sig = self.flag.received.name if self.flag.received else "signal"
                    log.warning("stopping for preemption (%s) after step %d", sig, self.step)
                    self.save_checkpoint(f"preemption ({sig})")
                    self.metrics.write(event="preempted", step=self.step, signal=sig)
                    if self.denv.is_main:  # read by the batch script, even if srun's status is lost
                        atomic_write_text(self.run_dir / PREEMPTED,
                                          f"{self.denv.job_id} {self.denv.restart_count} {self.step} {sig}\n")
                    return PREEMPTED_EXIT_CODE
                if self.step >= tc.max_steps:
                    break
            else:
                self.epoch += 1
                self.batch_in_epoch = 0
        return 0

    def finish(self) -> Dict[str, float]:
        result = self.run_eval()
        self.save_checkpoint("final")
        if self.denv.is_main:
            atomic_write(self.run_dir / FINAL_MODEL, lambda f: torch.save(self.model.state_dict(), f))
            record = {"step": self.step, "world_size": self.denv.world_size, "time": time.time(), **result}
            atomic_write_text(self.run_dir / FINISHED, json.dumps(record) + "\n")
            log.info("finished at step %d; weights in %s", self.step, self.run_dir / FINAL_MODEL)
            self.metrics.write(event="finished", step=self.step, **result)
        dist.barrier()
        return result

    def run(self) -> int:
        denv = self.denv
        self.flag.install()
        try:
            t0 = time.perf_counter()
            self.device = init_distributed(denv, self.tc.backend, self.tc.pg_timeout_s)
            if denv.is_main:
                log.info("process group formed in %.3f s (backend %s, world size %d)",
                         time.perf_counter() - t0, dist.get_backend(), denv.world_size)
            self.build()
            self.resume()
            status = self.train()
            if status == 0:
                self.finish()
            return status
        finally:
            self.flag.restore()
            if dist.is_initialized():
                dist.destroy_process_group()


def main(run_dir: str, environ: Optional[Dict[str, str]] = None) -> int:
    """Entry of ``python -m slurm_ddp.worker --run-dir DIR``: returns the exit status."""
    environ = dict(os.environ if environ is None else environ)
    rd = Path(run_dir).resolve()
    denv = DistEnv.from_slurm(environ)
    setup_logging(denv.rank)
    logging.getLogger("slurm_ddp.rank").info(
        "host %s (%s) rank %d/%d local_rank %d/%d node_rank %d master %s:%d job %s restart %d pid %d",
        denv.hostname or socket.gethostname(), socket.gethostname(), denv.rank, denv.world_size,
        denv.local_rank, denv.local_world_size, denv.node_rank, denv.master_addr, denv.master_port,
        denv.job_id, denv.restart_count, os.getpid())
    if (rd / FINISHED).exists():
        log.info("run %s already finished (%s exists): nothing to do", rd, FINISHED)
        return 0
    cfg = load_config(rd / "config.yaml")
    denv.validate_against(cfg)
    os.environ.update(denv.torch_env())  # for user code that reads RANK/LOCAL_RANK/…
    return Trainer(cfg, rd, denv).run()
