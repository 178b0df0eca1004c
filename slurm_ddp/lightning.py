"""PyTorch Lightning integration: :class:`SlurmDDPCallback` and :func:`cluster_plugins`.

Side effects: the callback appends to the run directory's metrics file (rank 0), reports progress
to the hang watchdog (``slurm_ddp.progress``), installs the preemption flag's signal handlers for
the training loop (``slurm_ddp.preemption``), and on a stop signal saves a Lightning checkpoint and
ends the process with status 75. Imports Lightning (and so torch); the torch-free core never
imports this module. Without Lightning, importing it raises ``ImportError`` naming the extra.

A Lightning script submitted as ``train.command`` adds two things (``examples/lightning/train.py``)::

    from lightning.pytorch.callbacks import ModelCheckpoint
    from slurm_ddp.lightning import SlurmDDPCallback, cluster_plugins

    trainer = Trainer(
        strategy="ddp",
        callbacks=[ModelCheckpoint(dirpath=run_dir + "/lightning", save_last=True), SlurmDDPCallback()],
        plugins=cluster_plugins(),  # Lightning's own SLURM auto-requeue off
    )
    trainer.fit(model, ckpt_path="last")  # a requeued job resumes from last.ckpt

What the callback does, per rank (only inside a ``slurm-ddp`` run, i.e. with ``$SLURM_DDP_RUN_DIR``
set, except the watchdog reports, which are no-ops elsewhere anyway):

- **Metrics** (rank 0): ``train`` events every ``log_every_n_steps`` optimizer steps (the mean of
  rank 0's training-step losses since the last event, ``steps_per_s``, ``lr``), ``eval`` events at
  each validation end (the logged ``val_*``/``val/*``/``eval_*`` metrics as ``eval_*``, so
  ``val_accuracy`` reads as ``eval_accuracy``), ``resume`` when ``fit`` restored a checkpoint,
  ``checkpoint`` and ``preempted`` at a stop: the worker's events, read by ``slurm-ddp status``,
  ``runs`` and ``plot``.
- **Hang watchdog**: the step after every training batch (phase ``data`` until the next batch
  starts, then ``step``), ``eval`` during validation, ``checkpoint`` while Lightning saves.
- **Preemption**: from ``on_train_start`` the job's requeue signal (``$SLURM_DDP_REQUEUE_SIGNAL``)
  and SIGTERM set the flag of ``slurm_ddp.preemption`` instead of Lightning's SIGTERM handler; after
  each optimizer step the ranks agree on it (``preemption.should_stop``), and when set every rank
  calls ``trainer.save_checkpoint`` to the ``ModelCheckpoint``'s ``last.ckpt`` (so
  ``fit(ckpt_path="last")`` resumes from that step) and exits with status 75
  (``preemption.exit_preempted``). Lightning's own handlers are back after ``fit``.

Lightning's ``SLURMEnvironment`` (chosen by Lightning under srun and on the local backend, which
sets srun's variables) requeues the job itself on SIGUSR1 by default (``auto_requeue=True``,
``lightning.fabric.plugins.environments.slurm``); with ``requeue.signal: USR1`` the job would be
requeued twice. :func:`cluster_plugins` turns it off, and the callback warns once when it is on.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

try:
    import torch
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.utilities import rank_zero_warn
except ImportError as e:  # pragma: no cover - exercised where Lightning is not installed
    raise ImportError(
        f"slurm_ddp.lightning needs PyTorch Lightning ({e}): pip install 'slurm-ddp[lightning]'"
    ) from None

from . import preemption
from . import progress as _progress
from .rundir import METRICS_NAME, append_jsonl, end_partial_line

__all__ = ["SlurmDDPCallback", "cluster_plugins"]

log = logging.getLogger("slurm_ddp.lightning")

#: Prefixes of logged validation metrics that become ``eval_*`` keys of the ``eval`` events.
EVAL_PREFIXES = ("val_", "val/", "validation_", "validation/", "eval_", "eval/")


def cluster_plugins() -> List[Any]:
    """``Trainer(plugins=...)`` for a ``slurm-ddp`` run: ``[SLURMEnvironment(auto_requeue=False)]``
    where Lightning would choose its SLURM environment (srun's variables set, not under torchrun),
    else ``[]`` (under torchrun Lightning chooses ``TorchElasticEnvironment``, which never requeues).

    slurm_ddp requeues the job itself (``requeue.*``); Lightning's auto-requeue (on by default,
    SIGUSR1, ``scontrol requeue`` from inside the job) would requeue it a second time.
    """
    if TorchElasticEnvironment.detect() or not SLURMEnvironment.detect():
        return []
    return [SLURMEnvironment(auto_requeue=False)]


def _loss_of(outputs: Any) -> Optional[torch.Tensor]:
    """The loss tensor of ``training_step``'s output (a tensor or a mapping with ``"loss"``)."""
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
        return outputs.detach()
    return None


def _number(value: Any) -> Optional[float]:
    if isinstance(value, torch.Tensor):
        return float(value.item()) if value.numel() == 1 else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def eval_metrics(metrics: Mapping[str, Any]) -> Dict[str, float]:
    """The validation metrics of ``trainer.callback_metrics`` as ``eval_*`` keys (``val_accuracy`` →
    ``eval_accuracy``, ``val/loss`` → ``eval_loss``); other metrics and non-scalars are left out."""
    out: Dict[str, float] = {}
    for key, value in metrics.items():
        prefix = next((p for p in EVAL_PREFIXES if key.startswith(p)), None)
        number = _number(value)
        if prefix is None or number is None or len(key) == len(prefix):
            continue
        out["eval_" + key[len(prefix) :].replace("/", "_")] = number
    return out


class SlurmDDPCallback(Callback):
    """Metrics, hang-watchdog reports and a stop at a step with a checkpoint, for a Lightning ``fit``
    run by ``slurm-ddp`` (see the module docstring).

    ``log_every_n_steps``: optimizer steps between ``train`` events (default: the trainer's
    ``log_every_n_steps``). ``stop_on_signal``: handle the stop signals (default: inside a
    ``slurm-ddp`` run, i.e. when ``$SLURM_DDP_RUN_DIR`` is set). ``check_interval_s``: about how
    often (seconds of training) the ranks agree on the stop flag (``StepAgreement``).

    Needs a ``ModelCheckpoint`` among the trainer's callbacks when it handles signals (the stop
    checkpoint is written to its ``last`` file; one with ``save_last`` is preferred); ``setup``
    raises ``ValueError`` without one.
    """

    _warned_auto_requeue = False

    def __init__(
        self,
        log_every_n_steps: Optional[int] = None,
        stop_on_signal: Optional[bool] = None,
        check_interval_s: float = 0.5,
    ):
        super().__init__()
        run_dir = os.environ.get("SLURM_DDP_RUN_DIR")
        self.run_dir = Path(run_dir) if run_dir else None
        self.log_every_n_steps = log_every_n_steps
        self.stop_on_signal = self.run_dir is not None if stop_on_signal is None else stop_on_signal
        self.check_interval_s = check_interval_s
        self._metrics_path: Optional[Path] = None
        self._loss_sum: Optional[torch.Tensor] = None
        self._loss_count = 0
        self._last_loss: Optional[float] = None
        self._logged_step = -1
        self._polled_step = -1
        self._t_log = time.perf_counter()
        self._step_at_log = 0
        self._installed = False
        self._started = False  # a training batch started since on_train_start
        self._saving: Optional[int] = None  # the step of a checkpoint Lightning is writing (event after it)
        self._progress = _progress.recorder()

    # ------------------------------------------------------------------ helpers
    def write(self, trainer: Trainer, **record: Any) -> None:
        """Append one event to the run's metrics file (rank 0, inside a ``slurm-ddp`` run; else nothing)."""
        if self._metrics_path is None or not trainer.is_global_zero:
            return
        record.setdefault("time", time.time())
        append_jsonl(self._metrics_path, record)

    @staticmethod
    def checkpoint_callback(trainer: Trainer) -> Optional[ModelCheckpoint]:
        """The ``ModelCheckpoint`` whose ``last`` file the stop writes: the first with ``save_last``, else the first."""
        found = [c for c in trainer.checkpoint_callbacks if isinstance(c, ModelCheckpoint)]
        return next((c for c in found if c.save_last), found[0] if found else None)

    def last_path(self, trainer: Trainer) -> str:
        """The path of the stop checkpoint: the ``ModelCheckpoint``'s ``last`` file (what ``ckpt_path="last"`` finds)."""
        cb = self.checkpoint_callback(trainer)
        if cb is None:
            raise ValueError(
                "SlurmDDPCallback needs a ModelCheckpoint callback (save_last=True) to stop with a checkpoint"
            )
        names = {"epoch": torch.tensor(trainer.current_epoch), "step": torch.tensor(trainer.global_step)}
        return cb.format_checkpoint_name(names, cb.CHECKPOINT_NAME_LAST)

    def _mark(self, step: int, phase: int) -> None:
        self._progress.mark(step, phase)

    # ------------------------------------------------------------------ hooks
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._mark(trainer.global_step, _progress.STARTUP)
        if self.run_dir is not None and trainer.is_global_zero:
            self._metrics_path = self.run_dir / METRICS_NAME
            end_partial_line(self._metrics_path)  # a run killed mid-line left no newline
        if self.stop_on_signal and self.checkpoint_callback(trainer) is None:
            raise ValueError(
                "SlurmDDPCallback needs a ModelCheckpoint callback (e.g. ModelCheckpoint(dirpath=..., save_last=True)) "
                "to stop with a checkpoint; or pass stop_on_signal=False"
            )
        env = getattr(trainer.strategy, "cluster_environment", None)
        if isinstance(env, SLURMEnvironment) and env.auto_requeue and not SlurmDDPCallback._warned_auto_requeue:
            SlurmDDPCallback._warned_auto_requeue = True
            rank_zero_warn(
                "Lightning's SLURM auto-requeue is on: it requeues the job itself on "
                f"{getattr(env.requeue_signal, 'name', env.requeue_signal)}, and slurm_ddp requeues it too; "
                "pass Trainer(plugins=slurm_ddp.lightning.cluster_plugins()) (SLURMEnvironment(auto_requeue=False))"
            )

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        step = trainer.global_step
        self._started = False
        self._t_log, self._step_at_log, self._logged_step, self._polled_step = time.perf_counter(), step, step, step
        if trainer.ckpt_path:
            log.info("resumed from %s at step %d", trainer.ckpt_path, step)
            self.write(
                trainer,
                event="resume",
                step=step,
                epoch=trainer.current_epoch,
                restart=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
                world_size=trainer.world_size,
                checkpoint=str(trainer.ckpt_path),
            )
        if self.stop_on_signal:
            # after Lightning's signal connector (registered before this hook): ours replace its SIGTERM handler
            preemption.install()
            self._installed = True

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        self._mark(step, _progress.DATA)  # until the next batch starts: Lightning fetches it (and the one after)
        if self._metrics_path is not None:
            loss = _loss_of(outputs)
            if loss is not None:  # summed on the device: read only at log steps
                self._loss_sum = loss.clone() if self._loss_sum is None else self._loss_sum + loss
                self._loss_count += 1
            every = self.log_every_n_steps or int(getattr(trainer, "log_every_n_steps", 50) or 1)
            if step != self._logged_step and step % every == 0 and self._loss_sum is not None:
                now = time.perf_counter()
                self._last_loss = float(self._loss_sum.item()) / max(self._loss_count, 1)
                sps = (step - self._step_at_log) / max(now - self._t_log, 1e-9)
                record: Dict[str, Any] = {"epoch": trainer.current_epoch, "loss": self._last_loss, "steps_per_s": sps}
                if trainer.optimizers:
                    record["lr"] = trainer.optimizers[0].param_groups[0]["lr"]
                self.write(trainer, event="train", step=step, **record)
                self._loss_sum, self._loss_count = None, 0
                self._t_log, self._step_at_log, self._logged_step = now, step, step
        # agree on the stop flag after optimizer steps only (not between accumulated micro-batches);
        # every rank has the same global_step, so every rank polls at the same batches
        if self._installed and step != self._polled_step:
            self._polled_step = step
            if preemption.should_stop(self.check_interval_s):
                self._stop(trainer, step)

    def _stop(self, trainer: Trainer, step: int) -> None:
        received = preemption.flag().received
        sig = received.name if received is not None else "SIGUSR2"
        path = self.last_path(trainer)
        t0 = time.perf_counter()
        self._mark(step, _progress.CHECKPOINT)
        cb = self.checkpoint_callback(trainer)
        if cb is not None and cb.save_last:
            cb.last_model_path = path  # part of the saved callback state, as ModelCheckpoint does
        trainer.save_checkpoint(path)  # every rank: rank 0 writes, then a barrier
        self._saving = None
        blocked = time.perf_counter() - t0
        if trainer.is_global_zero:
            log.warning("stopping at step %d (%s): saved %s", step, sig, path)
        self.write(trainer, event="checkpoint", step=step, reason="preemption", blocked_s=blocked, path=path)
        self.write(trainer, event="preempted", step=step, signal=sig)
        for logger in trainer.loggers:
            logger.finalize("preempted")
        preemption.exit_preempted(step=step)

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            self._mark(trainer.global_step, _progress.EVAL)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self._mark(trainer.global_step, _progress.DATA)
        result = eval_metrics(trainer.callback_metrics)
        if result:
            self.write(
                trainer,
                event="eval",
                step=trainer.global_step,
                epoch=trainer.current_epoch,
                loss=self._last_loss,
                **result,
            )

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: Dict[str, Any]) -> None:
        # called before Lightning writes the file: the event follows at the next hook, once it is written
        self._saving = trainer.global_step
        self._mark(trainer.global_step, _progress.CHECKPOINT)  # until the next training batch starts

    def _saved(self, trainer: Trainer) -> None:
        if self._saving is not None:
            self.write(trainer, event="checkpoint", step=self._saving, reason="lightning")
            self._saving = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if self._started:  # the batch is here: forward/backward/optimizer
            self._mark(trainer.global_step, _progress.STEP)
        else:  # the first step (DDP's buckets, first batches) keeps the start-up phase, as the worker's
            self._started = True
        self._saved(trainer)

    def _uninstall(self) -> None:
        if self._installed:
            preemption.flag().restore()  # Lightning's connector then restores the handlers from before fit
            self._installed = False

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._saved(trainer)
        self._uninstall()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._uninstall()
