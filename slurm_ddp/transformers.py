"""Hugging Face Transformers integration: :class:`SlurmDDPCallback`, a ``TrainerCallback``.

Side effects: the callback appends to the run directory's metrics file (rank 0), reports progress
to the hang watchdog (``slurm_ddp.progress``), installs the preemption flag's signal handlers for
the training loop (``slurm_ddp.preemption``), and on a stop signal makes the ``Trainer`` save a
checkpoint of the step and ends the process with status 75. Imports Transformers (and so torch); the
torch-free core never imports this module. Without Transformers, importing it raises ``ImportError``
naming the extra.

Without editing the script, the runner adds the callback to every ``Trainer`` it builds
(``slurm_ddp.transformers_run``; the script runs as ``python SCRIPT ARGS`` would, and is snapshotted so)::

    train:
      command: python -m slurm_ddp.transformers run_clm.py --output_dir $SLURM_DDP_RUN_DIR/hf --save_steps 50

Or a ``Trainer`` script submitted as ``train.command`` adds one callback (``examples/transformers/train.py``)::

    from transformers.trainer_utils import get_last_checkpoint
    from slurm_ddp.transformers import SlurmDDPCallback

    trainer = Trainer(model=model, args=args, train_dataset=train, callbacks=[SlurmDDPCallback()])
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)  # a requeued job resumes from the newest checkpoint-N

What the callback does, per rank (only inside a ``slurm-ddp`` run, i.e. with ``$SLURM_DDP_RUN_DIR``
set, except the watchdog reports, which are no-ops elsewhere anyway):

- **Metrics** (rank 0): a ``train`` event at each of the Trainer's own logs (``logging_steps``: its
  loss, the mean over the ranks and the steps since the last log, ``lr``, ``grad_norm``, ``epoch``
  and ``steps_per_s``), an ``eval`` event at each evaluation (the Trainer's ``eval_*`` metrics), a
  ``resume`` event when ``train`` started from a checkpoint, and ``checkpoint`` events after every
  save (``reason`` ``"transformers"``, or ``"preemption"`` and then ``preempted`` at a stop): the
  worker's events, read by ``slurm-ddp status``, ``runs``, ``report`` and ``plot``.
- **Hang watchdog**: every optimizer step (``progress.step``), ``eval`` while the Trainer evaluates,
  ``checkpoint`` while it saves, and ``eval`` (``watchdog.eval_s``) after ``train`` returns, for what the
  script does next (an evaluation, ``save_model``).
- **Preemption**: from ``on_train_begin`` the job's requeue signal (``$SLURM_DDP_REQUEUE_SIGNAL``) and
  SIGTERM set the flag of ``slurm_ddp.preemption``; after each optimizer step the ranks agree on it
  (``preemption.should_stop``), and when set the callback sets ``control.should_save`` and
  ``control.should_training_stop``: the Trainer writes ``checkpoint-<step>`` in ``output_dir`` through
  its own save path (``_save_checkpoint``: model, optimizer, scheduler, scaler, every rank's RNG state
  and ``trainer_state.json``, the step's data position; with ``save_total_limit`` rotation, even with
  ``save_strategy="no"``), and in ``on_save`` every rank exits with status 75
  (``preemption.exit_preempted``) before any evaluation or code after ``train()`` runs. The next start's
  ``train(resume_from_checkpoint=get_last_checkpoint(output_dir))`` resumes at that step: no step is
  redone. The handlers from before are back when training ends.

Nothing the script asked for is turned off: ``report_to`` integrations log as before (under
``tracking.mlflow``/``tracking.wandb`` their plain ``mlflow.start_run()``/``wandb.init()`` join the run
directory's one tracker run, ``slurm_ddp.tracking.rank_env``); at a stop a W&B run is finished with the
status 75 first (its offline data flushed) and MLflow's asynchronous logging is flushed.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as e:  # pragma: no cover - exercised where Transformers is not installed
    raise ImportError(
        f"slurm_ddp.transformers needs Hugging Face Transformers ({e}): pip install 'slurm-ddp[transformers]'"
    ) from None

from . import preemption
from . import progress as _progress
from .constants import PREEMPTED_EXIT_CODE
from .rundir import METRICS_NAME, append_jsonl, end_partial_line

__all__ = ["SlurmDDPCallback"]

log = logging.getLogger("slurm_ddp.transformers")

#: The Trainer's log keys copied into ``train`` events, and the names they get there.
TRAIN_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm", "epoch": "epoch"}


def _number(value: Any) -> Optional[float]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def eval_metrics(metrics: Mapping[str, Any]) -> Dict[str, float]:
    """The Trainer's evaluation metrics that are numbers, as ``eval_*`` keys (``eval_loss`` stays; a
    ``metric_key_prefix`` other than ``eval`` gives ``test_accuracy`` → ``eval_test_accuracy``); its
    timing keys (``*_runtime``, ``*_per_second``) are left out."""
    out: Dict[str, float] = {}
    for key, value in metrics.items():
        number = _number(value)
        if number is None or key.endswith(("_runtime", "_per_second")) or key == "epoch":
            continue
        out[key if key.startswith("eval_") else "eval_" + key] = number
    return out


class SlurmDDPCallback(TrainerCallback):
    """Metrics, hang-watchdog reports and a stop at a step with a checkpoint, for a Transformers
    ``Trainer`` run by ``slurm-ddp`` (see the module docstring).

    ``stop_on_signal``: handle the stop signals (default: inside a ``slurm-ddp`` run, i.e. when
    ``$SLURM_DDP_RUN_DIR`` is set). ``check_interval_s``: about how often (seconds of training) the
    ranks agree on the stop flag (``slurm_ddp.worker.runtime.StepAgreement``).
    """

    def __init__(self, stop_on_signal: Optional[bool] = None, check_interval_s: float = 0.5):
        super().__init__()
        run_dir = os.environ.get("SLURM_DDP_RUN_DIR")
        self.run_dir = Path(run_dir) if run_dir else None
        self.stop_on_signal = self.run_dir is not None if stop_on_signal is None else stop_on_signal
        self.check_interval_s = check_interval_s
        self._metrics_path: Optional[Path] = None
        self._installed = False
        self._stopping: Optional[int] = None  # the step the ranks agreed to stop at
        self._save_started: Optional[float] = None
        self._t_log = time.perf_counter()
        self._step_at_log = 0
        self._progress = _progress.recorder()

    # ------------------------------------------------------------------ helpers
    def write(self, state: TrainerState, **record: Any) -> None:
        """Append one event to the run's metrics file (rank 0, inside a ``slurm-ddp`` run; else nothing)."""
        if self._metrics_path is None or not state.is_world_process_zero:
            return
        record.setdefault("time", time.time())
        append_jsonl(self._metrics_path, record)

    def _uninstall(self) -> None:
        if self._installed:
            preemption.flag().restore()
            self._installed = False

    # ------------------------------------------------------------------ hooks
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        step = state.global_step  # the resumed checkpoint's (its trainer_state.json is loaded before this hook)
        self._progress.mark(step, _progress.STARTUP)
        self._stopping = None
        self._t_log, self._step_at_log = time.perf_counter(), step
        if self.run_dir is not None and state.is_world_process_zero:
            self._metrics_path = self.run_dir / METRICS_NAME
            end_partial_line(self._metrics_path)  # a run killed mid-line left no newline
        if step > 0:
            checkpoint = os.path.join(str(args.output_dir), f"{PREFIX_CHECKPOINT_DIR}-{step}")
            log.info("resumed from %s at step %d", checkpoint, step)
            self.write(
                state,
                event="resume",
                step=step,
                epoch=state.epoch,
                restart=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
                world_size=args.world_size,
                checkpoint=checkpoint,
            )
        if self.stop_on_signal:
            preemption.install()
            self._installed = True

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._progress.steps_reported:  # the first step keeps the start-up phase, as the worker's
            self._progress.mark(state.global_step, _progress.STEP)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        step = state.global_step
        self._progress.mark_step(step)
        # every rank has the same global_step: every rank polls after the same optimizer steps
        if self._installed and self._stopping is None and preemption.should_stop(self.check_interval_s):
            self._stopping = step
            control.should_save = True
            control.should_training_stop = True
            control.should_evaluate = False  # the save first; the evaluation is the next start's
        # the default flow callback (before this one) decided what follows the step
        if control.should_save:
            self._progress.mark(step, _progress.CHECKPOINT)
            self._save_started = time.perf_counter()
        elif control.should_evaluate:
            self._progress.mark(step, _progress.EVAL)
        else:
            self._progress.mark(step, _progress.DATA)

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if control.should_evaluate:
            self._progress.mark(state.global_step, _progress.EVAL)
        elif control.should_save:
            self._progress.mark(state.global_step, _progress.CHECKPOINT)
            self._save_started = time.perf_counter()

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: Optional[Mapping[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        step = state.global_step
        if control.should_save:  # a save follows the evaluation
            self._progress.mark(step, _progress.CHECKPOINT)
            self._save_started = time.perf_counter()
        else:
            self._progress.mark(step, _progress.DATA)
        result = eval_metrics(metrics or {})
        if result:
            self.write(state, event="eval", step=step, epoch=state.epoch, **result)

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: Optional[Mapping[str, Any]] = None,
        **kwargs: Any,
    ) -> None:
        logs = logs or {}
        if "loss" not in logs or self._metrics_path is None:  # evaluation logs are on_evaluate's
            return
        step = state.global_step
        now = time.perf_counter()
        record: Dict[str, Any] = {}
        for key, name in TRAIN_KEYS.items():
            number = _number(logs.get(key))
            if number is not None:
                record[name] = number
        record["steps_per_s"] = (step - self._step_at_log) / max(now - self._t_log, 1e-9)
        self._t_log, self._step_at_log = now, step
        self.write(state, event="train", step=step, **record)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        step = state.global_step
        blocked = time.perf_counter() - self._save_started if self._save_started is not None else None
        self._save_started = None
        path = os.path.join(str(args.output_dir), f"{PREFIX_CHECKPOINT_DIR}-{step}")
        if self._stopping is None:
            self.write(state, event="checkpoint", step=step, reason="transformers", blocked_s=blocked, path=path)
            self._progress.mark(step, _progress.DATA)
            return
        received = preemption.flag().received
        sig = received.name if received is not None else "SIGUSR2"
        if state.is_world_process_zero:
            log.warning("stopping at step %d (%s): saved %s", step, sig, path)
        self.write(state, event="checkpoint", step=step, reason="preemption", blocked_s=blocked, path=path)
        self.write(state, event="preempted", step=step, signal=sig)
        _flush_trackers()
        preemption.exit_preempted(step=step)  # every rank: a barrier (rank 0 may still write), then status 75

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        # what the script does after train() (an evaluation, save_model) gets watchdog.eval_s, not a step's allowance
        self._progress.mark(state.global_step, _progress.EVAL)
        self._uninstall()


def _flush_trackers() -> None:
    """Before the process ends without teardown (``os._exit``): finish a W&B run with status 75 (so that
    its data, offline ones included, are written) and flush MLflow's asynchronous logging. Only trackers
    the script already imported; a failure is logged, never raised (the stop goes on)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        try:
            wandb.finish(exit_code=PREEMPTED_EXIT_CODE)
        except Exception as e:  # the stop must not fail on a tracker
            log.warning("could not finish the W&B run: %s", e)
    mlflow = sys.modules.get("mlflow")
    flush = getattr(mlflow, "flush_async_logging", None) if mlflow is not None else None
    if flush is not None:
        try:
            flush()
        except Exception as e:
            log.warning("could not flush MLflow's logging: %s", e)


if __name__ == "__main__":
    # python -m slurm_ddp.transformers SCRIPT ARGS: run the runner module as __main__ (it imports this module
    # by name, so the callback class is that module's, never this __main__ copy; no import back to it here)
    import runpy

    runpy.run_module("slurm_ddp.transformers_run", run_name="__main__", alter_sys=True)
