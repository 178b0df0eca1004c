"""Preemption for a training script of one's own (``train.command``): what the worker does, as three calls,
and a fourth for a lost peer.

Side effects: installs signal handlers (main thread), collectives, and ``exit_preempted`` and
``exit_if_peer_lost`` end the process. Importing this module imports no torch; ``should_stop``,
``exit_preempted`` and ``exit_if_peer_lost`` import it.

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

When a node is lost, a collective on the surviving ranks fails (the peer's connection closed, or
no answer within the process group's timeout). A script that catches that around its training
loop hands it to :func:`exit_if_peer_lost` with the last completed step and its own save::

    try:
        for batch in loader:
            train_step(batch)
            done += 1                          # the last completed step: its state is in memory
            ...
    except Exception as e:                     # a collective raised
        preemption.exit_if_peer_lost(e, step=done, save=lambda: save_snapshot(done))
        raise                                  # not a lost peer: the script's own error

For a lost peer it does not return: the first surviving rank to claim the save (any rank: every
DDP rank holds the whole model and optimizer state) calls ``save()``, the others wait for it, and
every survivor leaves the step's peer-lost marker and exits with status 1. Under in-job recovery
(config ``recovery``) the batch script sees the marker and ends the step at once, without waiting
for Slurm to mark the lost node DOWN (``SlurmdTimeout``), and the next step, on the healthy nodes
and a spare, resumes from that snapshot: at most the failed step is redone.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, NoReturn, Optional

from .constants import EMERGENCY_WAIT_S, PREEMPTED_EXIT_CODE
from .errors import PeerFailure
from .rundir import SIGNAL_VAR  # the variable the rank wrapper sets to the job's requeue.signal (USR2)
from .signals import PreemptionFlag, SignalSpec, ignore_in_loader_workers, worker_signals

if TYPE_CHECKING:
    from .worker.runtime import StepAgreement


_flag: Optional[PreemptionFlag] = None
_agreement: Optional[StepAgreement] = None


def install(signals: Optional[Iterable[SignalSpec]] = None) -> PreemptionFlag:
    """Install the flag's handlers (main thread only): the job's requeue signal (``$SLURM_DDP_REQUEUE_SIGNAL``,
    else ``USR2``) and SIGTERM, unless ``signals`` are given. Returns the flag; calling it again reinstalls.

    Inside a slurm-ddp run it records the install in the run directory (``rundir.record_handler``:
    which signals, and the caller: ``slurm_ddp.preemption``, or the callback of
    ``slurm_ddp.transformers``/``slurm_ddp.lightning`` that called it), the evidence from which
    ``cancel``, ``requeue`` and ``status`` say the ranks checkpoint at a stop (``rundir.at_stop``)."""
    global _flag, _agreement
    if _flag is not None:
        _flag.restore()
    chosen = tuple(signals) if signals is not None else worker_signals(os.environ.get(SIGNAL_VAR) or "USR2")
    _flag = PreemptionFlag(chosen).install()
    _agreement = None
    caller = str(sys._getframe(1).f_globals.get("__name__", ""))
    _record_install(_flag, caller if caller.startswith("slurm_ddp.") else "slurm_ddp.preemption")
    return _flag


def _record_install(f: PreemptionFlag, via: str) -> None:
    """Leave the evidence that this rank has a stop handler (``rundir.record_handler``; inside a
    slurm-ddp run only): ``cancel``, ``requeue`` and ``status`` say "checkpoint at the next step
    boundary" for a ``train.command`` run only where it exists. A failure to write it is one stderr
    line: the handler works without it."""
    from .rundir import record_handler

    try:
        record_handler(via, [s.name for s in f.signals])
    except OSError as e:
        print(
            f"slurm_ddp.preemption: note: could not record the stop handler in the run directory: {e}", file=sys.stderr
        )


def loader_worker_init(worker_id: int) -> None:
    """A DataLoader ``worker_init_fn``: the loader's worker processes ignore the stop signals :func:`install`
    handles by default (``$SLURM_DDP_REQUEUE_SIGNAL``, else ``USR2``, and SIGTERM). Slurm sends them to every
    process of the step; a loader worker killed by one makes the rank's next batch raise ("DataLoader worker
    … is killed by signal: Terminated") before ``should_stop`` can see the flag. Use it as
    ``DataLoader(..., num_workers=N, worker_init_fn=preemption.loader_worker_init)``; a script with its own
    ``worker_init_fn`` calls this first in it. See :func:`slurm_ddp.signals.ignore_in_loader_workers`."""
    ignore_in_loader_workers(worker_signals(os.environ.get(SIGNAL_VAR) or "USR2"))(worker_id)


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


_last_checkpoint: Optional[float] = None  # time.monotonic() of should_checkpoint's last True (or first call)


def checkpoint_interval(
    cost_s: Optional[float] = None, write_s: Optional[float] = None, step_s: Optional[float] = None
) -> Optional[float]:
    """Seconds of training between checkpoints under ``checkpoint.every_s: auto`` (or ``every_steps: auto``).

    With ``cost_s`` (the seconds one of the script's saves blocks training; ``write_s``: one background write,
    ``step_s``: one step) the interval rule (``slurm_ddp.rundir.interval``: Daly's optimum, bounded) computes it
    from the expected time between interruptions the rank wrapper measured at this start
    (``$SLURM_DDP_CHECKPOINT_MTBF_S``, the run's history and ``checkpoint.mtbf_s``). Without ``cost_s``: the
    interval offered at the start (``$SLURM_DDP_CHECKPOINT_EVERY_S``, set when the run's records hold a
    measured save cost). None when neither is known (the config does not ask for ``auto``, or no cost yet).
    """
    from .rundir import interval as rule

    if cost_s is None:
        offered = os.environ.get(rule.EVERY_S_VAR)
        return float(offered) if offered else None
    mtbf = os.environ.get(rule.MTBF_VAR)
    if not mtbf:
        return None
    cap = float(os.environ.get(rule.MAX_INTERVAL_VAR) or rule.DEFAULT_MAX_INTERVAL_S)
    chosen = rule.choose_interval(
        checkpoint_cost_s=cost_s, mtbf_default_s=float(mtbf), write_s=write_s, step_s=step_s, max_interval_s=cap
    )
    return chosen.every_s


def should_checkpoint(cost_s: Optional[float] = None, now: Optional[float] = None) -> bool:
    """True when :func:`checkpoint_interval` seconds passed since the last True (or since the first call);
    False when no interval is known. This rank's clock (``time.monotonic`` unless ``now``): ask it on the
    rank that saves (rank 0), or agree across ranks before a collective save."""
    global _last_checkpoint
    every = checkpoint_interval(cost_s)
    t = time.monotonic() if now is None else now
    if _last_checkpoint is None:
        _last_checkpoint = t
    if every is None or t - _last_checkpoint < every:
        return False
    _last_checkpoint = t
    return True


def exit_preempted(step: Optional[int] = None) -> NoReturn:
    """Stop this rank for preemption: wait for every rank, record the stop, exit with status 75.

    Call it on every rank after :func:`should_stop` said so and rank 0 saved its snapshot: its
    all-reduce (a barrier) keeps a rank from exiting while rank 0 still writes (srun's ``--kill-on-bad-exit``
    would kill it). Rank 0 writes the run directory's ``PREEMPTED`` marker (job, restart,
    ``step`` or 0, and the signal the ranks agree on here, once more: SIGTERM when any rank
    got it by now, which the requeue rule does not requeue, else the requeue signal) when ``SLURM_DDP_RUN_DIR`` and ``SLURM_JOB_ID`` are set, so the batch
    script knows the stop even if srun or torchrun reports another status. The process group is
    destroyed and the process exits with ``os._exit`` after flushing stdio and logging: no
    interpreter teardown, where a group still held by a DDP model can abort the process.
    """
    f = flag()
    rank = int(os.environ.get("RANK", "0") or 0)
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            from .worker.runtime import StepAgreement

            # the barrier is a last agreement on the signal (StepAgreement.settle: SIGTERM over the requeue
            # signal): a signal whose handler ran only after should_stop's all-reduce still counts
            (_agreement if _agreement is not None else StepAgreement(f)).settle()
            rank = dist.get_rank()
    except ImportError:
        pass
    received = f.received
    sig = received.name if received is not None else "SIGUSR2"
    run_dir, job_id = os.environ.get("SLURM_DDP_RUN_DIR"), os.environ.get("SLURM_JOB_ID")
    if rank == 0 and run_dir and job_id:
        from .rundir import Preempted, write_preempted

        restart = os.environ.get("SLURM_RESTART_COUNT") or "0"
        write_preempted(
            run_dir,
            Preempted(job_id=job_id, restart=int(restart) if restart.isdigit() else 0, step=step or 0, signal=sig),
        )
    _shutdown_group()
    _exit_now(PREEMPTED_EXIT_CODE)


def exit_if_peer_lost(
    error: BaseException, step: int, save: Optional[Callable[[], object]] = None, wait_s: Optional[float] = None
) -> None:
    """Leave a step whose collective failed because a peer rank was lost; return when ``error`` is not that.

    Call it on every rank in an ``except`` around the training loop, then re-raise (see the module
    docstring). ``error``: what the collective (or DDP's backward) raised; it is a lost peer when the
    shared worker's classification says so (``slurm_ddp.worker.runtime.is_peer_failure``: a
    ``DistBackendError``, or a ``RuntimeError`` naming a closed connection or a timeout); anything
    else returns at once, doing nothing. ``step``: the last step this rank completed (its state is
    what ``save`` writes), an integer the script counts in its own units.

    For a lost peer, and never returning:

    1. ``save`` (optional; the script's own snapshot of the last completed step, e.g. rank 0's
       epoch-end save) runs on exactly one survivor: the first to claim this job step's save
       (``slurm_ddp.durable.write_once`` on ``slurm_ddp.rundir.survivor_claim_path``: an exclusive
       file create in the run directory, atomic on shared file systems; one claim per job step, not per
       ``step`` value, so two survivors one training step apart never write the snapshot at once). The
       other survivors wait up to ``wait_s`` seconds (default ``slurm_ddp.constants.EMERGENCY_WAIT_S``,
       60) for its outcome, so that none exits while it writes (srun's ``--kill-on-bad-exit`` would kill
       it). A ``save`` that raises is reported and skipped (the next start resumes from the script's
       previous snapshot). It runs with or without in-job recovery: the snapshot is the script's own,
       as exact as its other snapshots, and a requeued or resubmitted run resumes from it too. Skipped
       when ``SLURM_DDP_RUN_DIR`` is unset (not started by slurm_ddp: no shared place for the claim).
    2. The step's peer-lost marker (``slurm_ddp.rundir.write_peer_lost``; only under in-job recovery,
       where the batch script sets ``SLURM_DDP_PEER_LOST``): the batch script ends the step a few
       seconds later instead of waiting for Slurm to mark the lost node DOWN, and the recovery rule
       starts the next step on the healthy nodes and a spare.
    3. Exit with status 1 (``PeerFailure.exit_code``, the worker's status for a lost peer), after
       flushing stdio and logging, without interpreter teardown and without destroying the process
       group (its threads may wait on the dead peer). A non-zero status is what makes the batch script
       consult the recovery rule; 0 would mark the run finished.

    Messages go to stderr (the rank's log), one line each, prefixed ``slurm_ddp[rank N]:``.
    """
    from .worker.runtime import is_peer_failure

    if not is_peer_failure(error):
        return
    rank = _rank()
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    text = str(error).strip()
    first = (text.splitlines()[0] if text else type(error).__name__)[:300]

    def say(line: str) -> None:
        print(f"slurm_ddp[rank {rank}]: {line}", file=sys.stderr, flush=True)

    say(f"a peer rank died or stopped responding after step {step} ({first})")
    run_dir = os.environ.get("SLURM_DDP_RUN_DIR")
    if save is not None and not run_dir:
        say(
            "no survivor save: SLURM_DDP_RUN_DIR is unset, so the survivors have no shared place to agree on one writer"
        )
    elif save is not None and run_dir:
        from .durable import write_once
        from .rundir import survivor_claim_path

        t0 = time.perf_counter()
        try:
            claim = survivor_claim_path(run_dir, os.environ)
            wrote, outcome = write_once(claim, save, EMERGENCY_WAIT_S if wait_s is None else wait_s)
        except Exception as e:  # the script's save failed: its previous snapshot stays the newest
            say(f"survivor save of step {step} failed: {e}")
        else:
            if wrote:
                say(f"survivor save of step {step} done by this rank in {time.perf_counter() - t0:.3f} s")
            else:
                say(f"survivor save of step {step} by another rank: {outcome or 'no answer'}")
    from .rundir import peer_lost_record, write_peer_lost

    if write_peer_lost(os.environ, peer_lost_record(rank, host, step, first)):
        say("left the peer-lost marker: the batch script ends this step and recovers in the job")
    _exit_now(PeerFailure.exit_code)


def _rank() -> int:
    """This rank: the process group's when one exists (local, no collective), else ``$RANK`` or 0."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except ImportError:
        pass
    text = os.environ.get("RANK", "0") or "0"
    return int(text) if text.isdigit() else 0


def _exit_now(status: int) -> NoReturn:
    """Flush logging and stdio, then ``os._exit(status)``: no interpreter teardown."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status)


def _shutdown_group() -> None:
    try:
        import torch.distributed as dist
    except ImportError:
        return
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _reset_for_tests() -> Any:
    """Forget the installed flag (restoring its handlers); for tests."""
    global _flag, _agreement, _last_checkpoint
    if _flag is not None:
        _flag.restore()
    _flag, _agreement, _last_checkpoint = None, None, None
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
