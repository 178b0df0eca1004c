"""Preemption for a training script of one's own (``train.command``): what the worker does, as three calls.

Side effects: installs signal handlers (main thread), collectives, and ``exit_preempted`` ends the
process. Importing this module imports no torch; ``should_stop`` and ``exit_preempted`` import it.

Every rank of a script started by ``slurm-ddp submit`` with ``train.command`` gets the job's requeue
signal (``requeue.signal``, default SIGUSR2) ``requeue.signal_delay_s`` before the time limit, and
SIGTERM when the job is preempted or cancelled. A script that wants to stop cleanly there does::

    from slurm_ddp import preemption

    preemption.install()                      # before training: the handler only sets a flag
    ...                                       # init_process_group, model, resume from the snapshot
    for batch in loader:
        train_step(batch)
        if preemption.should_stop():          # every rank, every step: the flag agreed across ranks
            if rank == 0:
                save_snapshot()               # the script's own snapshot, as at an epoch end
            preemption.exit_preempted(step)   # every rank: waits for all, exits with status 75

``should_stop`` is :class:`slurm_ddp.worker.runtime.StepAgreement` (the shared worker's own): it
all-reduces the flag only every ~``interval_s`` of steps (the interval agreed by the ranks), so it
is cheap enough for every step, and every rank gets the same answer after the same step.
``exit_preempted`` exits with ``PREEMPTED_EXIT_CODE`` (75, EX_TEMPFAIL), which the batch script
reads as "stopped for preemption": it requeues the job (``slurm_ddp.rundir.decide_requeue``, at
most ``requeue.max_requeues`` times; not after SIGTERM), and the requeued job starts the script
again, which resumes from its snapshot. A script that does not use this module still gets a
requeue at the time limit (the rule's ``got_signal``), but dies of the signal wherever it is.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Iterable, NoReturn, Optional

from .constants import PREEMPTED_EXIT_CODE
from .signals import PreemptionFlag, SignalSpec, worker_signals

if TYPE_CHECKING:
    from .worker.runtime import StepAgreement

#: The variable the launch wrapper sets to the job's ``requeue.signal`` (``USR2``).
SIGNAL_VAR = "SLURM_DDP_REQUEUE_SIGNAL"

_flag: Optional[PreemptionFlag] = None
_agreement: Optional[StepAgreement] = None


def install(signals: Optional[Iterable[SignalSpec]] = None) -> PreemptionFlag:
    """Install the flag's handlers (main thread only): the job's requeue signal (``$SLURM_DDP_REQUEUE_SIGNAL``,
    else ``USR2``) and SIGTERM, unless ``signals`` are given. Returns the flag; calling it again reinstalls."""
    global _flag, _agreement
    if _flag is not None:
        _flag.restore()
    chosen = tuple(signals) if signals is not None else worker_signals(os.environ.get(SIGNAL_VAR) or "USR2")
    _flag = PreemptionFlag(chosen).install()
    _agreement = None
    return _flag


def flag() -> PreemptionFlag:
    """The installed flag; raises ``RuntimeError`` when :func:`install` was not called."""
    if _flag is None:
        raise RuntimeError("call slurm_ddp.preemption.install() before training")
    return _flag


def should_stop(interval_s: float = 0.5) -> bool:
    """True on every rank when any rank got a preemption signal; call once per step on every rank.

    A collective on check steps (every step when steps take longer than ``interval_s`` seconds,
    else about every ``interval_s``); without a process group it is the local flag. The flag lives
    on the CPU: with an NCCL default group a gloo group is made for it at the first call (a
    collective too, so every rank must call this from the first step on).
    """
    global _agreement
    f = flag()
    if _agreement is None:
        import torch.distributed as dist

        from .worker.runtime import StepAgreement

        group = None
        if dist.is_available() and dist.is_initialized() and dist.get_backend() != "gloo":
            group = dist.new_group(backend="gloo")
        _agreement = StepAgreement(f, group=group, interval_s=interval_s)
    return _agreement.poll()


def exit_preempted(step: Optional[int] = None) -> NoReturn:
    """Stop this rank for preemption: wait for every rank, record the stop, exit with status 75.

    Call it on every rank after :func:`should_stop` said so and rank 0 saved its snapshot: the
    barrier keeps a rank from exiting while rank 0 still writes (srun's ``--kill-on-bad-exit``
    would kill it). Rank 0 writes the run directory's ``PREEMPTED`` marker (job, restart,
    ``step`` or 0, and the signal the ranks agreed on in :func:`should_stop`: SIGTERM when any rank
    got it, which the requeue rule does not requeue, else the requeue signal) when ``SLURM_DDP_RUN_DIR`` and ``SLURM_JOB_ID`` are set, so the batch
    script knows the stop even if a launcher reports another status. The process group is
    destroyed and the process exits with ``os._exit`` after flushing stdio and logging: no
    interpreter teardown, where a group still held by a DDP model can abort the process.
    """
    received = flag().received
    sig = received.name if received is not None else "SIGUSR2"
    rank = int(os.environ.get("RANK", "0") or 0)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            group = _agreement.group if _agreement is not None else None
            dist.barrier(group=group)
            rank = dist.get_rank()
    except ImportError:
        pass
    run_dir, job_id = os.environ.get("SLURM_DDP_RUN_DIR"), os.environ.get("SLURM_JOB_ID")
    if rank == 0 and run_dir and job_id:
        from .rundir import Preempted, write_preempted

        restart = os.environ.get("SLURM_RESTART_COUNT") or "0"
        write_preempted(
            run_dir,
            Preempted(job_id=job_id, restart=int(restart) if restart.isdigit() else 0, step=step or 0, signal=sig),
        )
    _shutdown_group()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(PREEMPTED_EXIT_CODE)


def _shutdown_group() -> None:
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _reset_for_tests() -> Any:
    """Forget the installed flag (restoring its handlers); for tests."""
    global _flag, _agreement
    if _flag is not None:
        _flag.restore()
    _flag, _agreement = None, None
    return None


def mark_finished(**record: Any) -> bool:
    """State that the run is finished (rank 0, once training has ended): writes the run directory's
    ``FINISHED`` marker (``record`` plus ``command``/``job_id``/``restart``/``time``) when
    ``SLURM_DDP_RUN_DIR`` is set. True when written, False outside slurm_ddp or when it exists.

    Without it, a ``train.command`` run is finished when every rank exits 0 without having been
    told to stop (``slurm_ddp.rundir.mark_command_finished``); with it, a stop signal that reaches
    the ranks after this call (a cancel while they tear down) no longer makes the run unfinished,
    and the job reports success. Raises ``OSError`` when the marker cannot be written.
    """
    run_dir = os.environ.get("SLURM_DDP_RUN_DIR")
    if not run_dir:
        return False
    from .rundir import is_finished, write_finished

    if is_finished(run_dir):
        return False
    import time

    rec = {
        "command": True,
        "job_id": os.environ.get("SLURM_JOB_ID", ""),
        "restart": os.environ.get("SLURM_RESTART_COUNT") or "0",
        "time": time.time(),
    }
    rec.update(record)
    write_finished(run_dir, rec)
    return True
