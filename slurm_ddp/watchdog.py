"""The hang watchdog: a small process beside each rank that ends the rank when it stops progressing.

``python -m slurm_ddp.watchdog --pid PID --fd FD --run-dir DIR --rank N ...`` is started by the
rank wrapper (``slurm_ddp.launch``) just before it execs the rank's command, so it works alike
under the local, sbatch (srun or torchrun launcher) and submitit backends. It is a separate process,
not a thread of the rank, because a hung rank may hold the GIL or be stuck in C code. It imports no
torch, reads the rank's progress record (``slurm_ddp.progress``: shared memory, inherited as FD)
every ``watchdog.poll_interval_s`` and dies with the rank (``PR_SET_PDEATHSIG``). It ignores the
signals the job's ranks get (requeue signal, SIGTERM, SIGINT, SIGHUP): it outlives a preemption
stop, and a rank that hangs while saving for preemption is still ended.

Allowance without progress (:func:`allowance_s`): ``watchdog.startup_s`` until the first step is
done (process group, data, model, first step: torch.compile, cuDNN autotuning), ``eval_s`` during
an evaluation, ``checkpoint_s`` during a checkpoint save, and ``max(timeout_floor_s,
step_time_factor × recent step time)`` in training steps and data loading. A watchdog that was itself
stopped (``scontrol suspend`` stops the whole step) restarts the clock; a rank stopped alone (SIGSTOP,
a frozen process: state ``T``) for longer than a training step's allowance while its watchdog runs is
hung (its report says ``stopped``), and when it continues the clock restarts; one stopped by a debugger
(state ``t``) is never judged. A rank that never
reported (a ``train.command`` script that does not call ``slurm_ddp.progress``) is not judged.

Rank 0's watchdog of a ``train.command`` script (``--samples``) also keeps its rank's step samples for
``slurm-ddp report`` (:class:`StepSampler`): from the record it reads anyway, it appends one line
(time, step, phase) to ``rundir.PROGRESS_NAME`` when the step changed and a second has passed since
the last line, at every phase change, at the rank's first step and when the rank exits (its parent-death
signal is then :data:`FINAL_SAMPLE_SIGNAL`, which it catches, not SIGKILL). The rank
itself does nothing more than its progress reports (the first :func:`slurm_ddp.progress.step` also
writes its step and time once).

When the rank exceeds its allowance, or another rank of the job was found hung (a report appeared in
``rundir.hang_dir``), the watchdog: writes its ``HangReport`` (``rundir.write_hang_report``), logs one
line to the rank's log, makes the rank write every thread's stack there (``faulthandler`` on
``progress.DUMP_SIGNAL``, sent only to the process that installed it: the rank, or the Python program
a rank's shell script started; a rank stuck in C dumps too), waits a moment so that its peers notice
and dump theirs, under in-job recovery (``--save-wait-s``) lets a rank that is not stopped commit the
last completed step alone first (the worker's emergency checkpoint; ``rundir.hangs``), and kills the
rank with every process it started (SIGKILL). What started the ranks then ends the job (srun's
``--kill-on-bad-exit``, torchrun, the local supervisor), and the requeue rule reads the reports.
"""

from __future__ import annotations

import argparse
import mmap
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from .constants import EMERGENCY_WAIT_S
from .progress import (
    CHECKPOINT,
    DUMP_PID,
    DUMP_PID_OFFSET,
    EVAL,
    FLAG_DUMPABLE,
    FLAG_REPORTING,
    PHASE_WORDS,
    PHASES,
    SIZE,
    STARTUP,
    STEP,
    read_first_step,
    read_record,
)
from .progress import DUMP_SIGNAL as DUMP_SIGNAL

if TYPE_CHECKING:
    from .config import JobConfig
    from .env import DistEnv

#: Which backend started the job (``local``; ``submitit`` sets it in its batch script's setup lines).
BACKEND_VAR = "SLURM_DDP_BACKEND"
#: What a sampling watchdog (``--samples``) gets when its rank exits (``PR_SET_PDEATHSIG``), instead of
#: SIGKILL: it records the rank's last step (:class:`StepSampler`), then exits. ``DUMP_SIGNAL`` + 1.
FINAL_SAMPLE_SIGNAL = int(signal.SIGRTMIN) + 4
#: How long a watchdog waits for its rank to take the request to save before it ends it (seconds;
#: the rank's thread looks every 0.5 s: ``rundir.hangs``, the save before a hung job's ranks end).
HANG_SAVE_ACK_S = 5.0
#: Signals the ranks of a job get that the watchdog ignores (the requeue signal is added).
IGNORED_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP")


@dataclass(frozen=True)
class Limits:
    """``watchdog.*`` of the config, in seconds (see ``config.WatchdogConfig``)."""

    timeout_floor_s: float = 45.0
    step_time_factor: float = 20.0
    startup_s: float = 600.0
    eval_s: float = 600.0
    checkpoint_s: float = 600.0
    poll_interval_s: float = 1.0


def allowance_s(limits: Limits, phase: int, steps_seen: int, step_time_s: Optional[float]) -> float:
    """Seconds a rank in ``phase`` may go without progress (``startup`` lasts to the end of the rank's
    first step: the worker marks it so). ``steps_seen``: step increases the watchdog has seen (unused);
    ``step_time_s``: the recent step time (None when unknown)."""
    step_limit = max(limits.timeout_floor_s, limits.step_time_factor * (step_time_s or 0.0))
    if phase == EVAL:
        return max(limits.eval_s, step_limit)
    if phase == CHECKPOINT:
        return max(limits.checkpoint_s, step_limit)
    if phase == STARTUP:  # the rank marks its start and its first step so
        return max(limits.startup_s, step_limit)
    return step_limit


def _proc_state(pid: int) -> Optional[str]:
    """The state letter of ``/proc/PID/stat`` (``T`` stopped, ``Z`` zombie), None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
        return text[text.rindex(")") + 2 :].split(" ", 1)[0]
    except (OSError, ValueError):
        return None


class Watch:
    """The watchdog's state for one rank; :meth:`poll` once per interval says whether to fire."""

    def __init__(self, limits: Limits, read: Callable[[], Optional[tuple[int, int, int, float]]]):
        self.limits = limits
        self.read = read
        self.last_step: Optional[int] = None
        self.last_step_t = 0.0
        self.steps_seen = 0
        self.step_time_s: Optional[float] = None
        self.resumed_t = time.monotonic()  # a pause (rank or watchdog stopped) restarts the clock here
        self.stopped_since: Optional[float] = None  # when the rank was first seen stopped (state T), in a row
        self.last_poll = self.resumed_t
        self.record: Optional[tuple[int, int, int, float]] = None
        self.idle_s = 0.0
        self.limit_s = 0.0

    def poll(self, now: float, stopped: bool, traced: bool = False) -> bool:
        """True when the rank has gone without progress for longer than its allowance, or has been
        stopped (``stopped``: state ``T``) for longer than a training step's allowance while this
        watchdog ran: a rank frozen alone (SIGSTOP, a frozen process) leaves its peers waiting in a
        collective. ``scontrol suspend`` stops the watchdog too: its own pause restarts both clocks.
        ``traced``: stopped by a debugger (state ``t``): never a verdict, the clock restarts."""
        if now - self.last_poll > 3 * self.limits.poll_interval_s + 2.0:
            self.resumed_t = now  # the watchdog itself was stopped or starved: no verdict
            self.stopped_since = now if stopped else None
        self.last_poll = now
        if traced:
            self.resumed_t, self.stopped_since = now, None
            return False
        rec = self.read()  # also while the rank is stopped: its last report is the step it got to
        if rec is not None:
            self.record = rec
        if stopped:
            self.resumed_t = now  # the progress clock restarts when the rank continues
            if self.stopped_since is None:
                self.stopped_since = now
            self.idle_s = now - self.stopped_since
            self.limit_s = allowance_s(self.limits, STEP, self.steps_seen, self.step_time_s)
            return self.idle_s > self.limit_s
        self.stopped_since = None
        if rec is None:
            return False
        flags, step, phase, t = rec
        if not flags & FLAG_REPORTING:
            return False
        if self.last_step is None:
            self.last_step, self.last_step_t = step, t
        elif step > self.last_step:
            if phase not in (EVAL, CHECKPOINT):
                per_step = (t - self.last_step_t) / (step - self.last_step)
                if self.steps_seen > 0:  # the first interval includes start-up
                    self.step_time_s = per_step if self.step_time_s is None else 0.8 * self.step_time_s + 0.2 * per_step
                self.steps_seen += 1
            self.last_step, self.last_step_t = step, t
        self.idle_s = now - max(t, self.resumed_t)
        self.limit_s = allowance_s(self.limits, phase, self.steps_seen, self.step_time_s)
        return self.idle_s > self.limit_s


class StepSampler:
    """Rank 0's step samples for the report (``rundir.record_progress_sample``), taken from the
    progress records the watchdog reads: a line when the step changed and ``min_interval_s`` passed
    since the last line, at every phase change, once for the rank's first step (``first``), and at
    the end (:meth:`sample` with ``final``). ``write`` gets each record (``time``: epoch seconds of
    the rank's report, from its monotonic time); its ``OSError`` is swallowed (a full disk must not
    end the rank)."""

    def __init__(self, write: Callable[..., None], min_interval_s: float = 1.0, **extra: Any):
        self.write = write
        self.min_interval_s = min_interval_s
        self.extra = extra
        self.last: Optional[tuple[int, int]] = None  # (step, phase) of the last line
        self.last_write = float("-inf")
        self.first_done = False
        self.lines = 0

    def sample(
        self,
        rec: Optional[tuple[int, int, int, float]],
        first: Optional[tuple[int, float]],
        now: float,
        final: bool = False,
    ) -> None:
        """Consider the record ``rec`` (``progress.read_record``) and first step ``first``
        (``progress.read_first_step``) read at monotonic time ``now``."""
        if rec is None or not rec[0] & FLAG_REPORTING:
            return
        _, step, phase, t = rec
        offset = time.time() - time.monotonic()
        if first is not None and not self.first_done:
            self.first_done = True
            self._put(first[1] + offset, first[0], PHASES.index("step"), None, first=True)
        if (step, phase) == self.last:
            return
        if self.last is None or phase != self.last[1] or final or now - self.last_write >= self.min_interval_s:
            self._put(t + offset, step, phase, now)

    def _put(self, t: float, step: int, phase: int, now: Optional[float], **more: Any) -> None:
        """Write one line; ``now`` None: it does not count for the rate (the first step's line)."""
        name = PHASES[phase] if 0 <= phase < len(PHASES) else "step"
        try:
            self.write(time=round(t, 3), step=step, phase=name, **self.extra, **more)
        except OSError:
            return
        if now is not None:
            self.last, self.last_write = (step, phase), now
        self.lines += 1


def _read_stable(mm: mmap.mmap) -> Optional[tuple[int, int, int, float]]:
    """The record, read until two reads agree (the rank may be writing it)."""
    prev = read_record(mm[:SIZE])
    for _ in range(5):
        cur = read_record(mm[:SIZE])
        if cur == prev:
            return cur
        prev = cur
    return prev


def _say(text: str) -> None:
    try:
        os.write(2, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} slurm_ddp watchdog: {text}\n".encode())
    except OSError:
        pass


def run(args: argparse.Namespace) -> int:
    from .rundir import HangReport, hang_dir, record_progress_sample, wait_hang_save, write_hang_report

    limits = Limits(
        timeout_floor_s=args.timeout_floor_s,
        step_time_factor=args.step_time_factor,
        startup_s=args.startup_s,
        eval_s=args.eval_s,
        checkpoint_s=args.checkpoint_s,
        poll_interval_s=args.poll_interval_s,
    )
    mm = mmap.mmap(args.fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
    watch = Watch(limits, lambda: _read_stable(mm))
    peers_hung = hang_dir(args.run_dir, args.job_id, args.restart)
    sampler = None
    if args.samples:
        run_dir = args.run_dir
        sampler = StepSampler(
            lambda **rec: record_progress_sample(run_dir, **rec), job_id=args.job_id, restart=args.restart
        )
        final_sampler = sampler

        def last_sample(signum: int, frame: object) -> None:  # the rank exited (parent-death signal)
            final_sampler.sample(_read_stable(mm), read_first_step(mm[:SIZE]), time.monotonic(), final=True)
            os._exit(0)

        signal.signal(FINAL_SAMPLE_SIGNAL, last_sample)
    pid = args.pid
    while True:
        time.sleep(limits.poll_interval_s)
        state = _proc_state(pid)
        if state is None or state in ("Z", "X") or os.getppid() != pid:
            if sampler is not None:  # the rank's last step, read from the record it left behind
                sampler.sample(_read_stable(mm), read_first_step(mm[:SIZE]), time.monotonic(), final=True)
            return 0
        now = time.monotonic()
        fired = watch.poll(now, stopped=state == "T", traced=state == "t")
        if sampler is not None:
            sampler.sample(watch.record, read_first_step(mm[:SIZE]), now)
        cause = "self" if fired else ("peer" if peers_hung.is_dir() else "")
        if cause:
            break
    stopped = state == "T"  # the culprit of its peers' hang (rundir.summarize_hang)
    # the record now, not the last poll's: the rank's last report (it may have gone on since that poll)
    rec = _read_stable(mm) or watch.record or (0, 0, STARTUP, now)
    flags, step, phase_code, _ = rec
    phase = PHASES[phase_code] if 0 <= phase_code < len(PHASES) else "step"
    report = HangReport(
        job_id=args.job_id,
        restart=args.restart,
        rank=args.rank,
        world_size=args.world_size,
        host=args.host,
        step=step,
        phase=phase,
        idle_s=round(watch.idle_s, 1),
        limit_s=round(watch.limit_s, 1),
        cause=cause,
        time=time.time(),
        stopped=stopped,
    )
    try:
        write_hang_report(args.run_dir, report)
    except OSError as e:
        _say(f"cannot write the hang report in {args.run_dir}: {e}")
    words = PHASE_WORDS.get(phase, phase)
    if cause == "self":
        if stopped:
            _say(
                f"rank {args.rank} on {args.host}: stopped (SIGSTOP or a frozen process) for {watch.idle_s:.0f} s "
                f"at step {step} in {words} (allowance {watch.limit_s:.0f} s, watchdog.*); the rank is ended"
            )
        else:
            _say(
                f"rank {args.rank} on {args.host}: no progress for {watch.idle_s:.0f} s at step {step} in {words} "
                f"(allowance {watch.limit_s:.0f} s, watchdog.*); its stacks follow, then the rank is ended"
            )
    else:
        _say(
            f"rank {args.rank} on {args.host} (step {step}, {words}): another rank of the job stopped progressing; "
            + (
                "this rank is stopped (SIGSTOP or a frozen process): it is ended"
                if stopped
                else "its stacks follow, then the rank is ended"
            )
        )
    target = _dump_target(mm, pid) if flags & FLAG_DUMPABLE else None
    if target is not None:
        try:
            os.kill(target, DUMP_SIGNAL)
        except ProcessLookupError:
            pass
    # Let the peers' watchdogs see the report and dump their ranks before this rank's end takes the job down.
    time.sleep(max(1.0, 2 * limits.poll_interval_s) + 0.5)
    if args.save_wait_s > 0:  # in-job recovery: the last completed step is committed first
        # a rank that runs saves it alone; a stopped one (the culprit) is ended only once a peer has,
        # or has not taken the request: its end would fail the peers' collectives mid-save
        outcome = wait_hang_save(
            args.run_dir,
            args.job_id,
            args.restart,
            None if stopped else args.rank,
            ack_s=HANG_SAVE_ACK_S,
            timeout_s=args.save_wait_s,
        )
        if outcome is not None and not stopped:
            _say(f"rank {args.rank} on {args.host}: emergency checkpoint before the end: {outcome}")
    # submitit: no job supervisor decides after the ranks (submitit owns the batch script); rank 0's watchdog does
    if args.decide_requeue >= 0:
        _decide_requeue(args.run_dir, args.job_id, args.restart, args.decide_requeue)
    _end_rank(pid)
    return 0


def _children() -> Dict[int, List[int]]:
    """Every process's children, from ``/proc/PID/stat`` (its parent pid)."""
    out: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                text = f.read().decode(errors="replace")
            ppid = int(text[text.rindex(")") + 2 :].split(" ", 2)[1])
        except (OSError, ValueError, IndexError):
            continue
        out.setdefault(ppid, []).append(int(name))
    return out


def rank_tree(pid: int) -> List[int]:
    """``pid`` and every process it started, children before grandchildren (this watchdog excluded)."""
    children, tree, i = _children(), [pid], 0
    while i < len(tree):
        tree += [c for c in children.get(tree[i], []) if c != os.getpid() and c not in tree]
        i += 1
    return tree


def _dump_target(mm: mmap.mmap, pid: int) -> Optional[int]:
    """The process that installed the stack-dump handler (``progress.DUMP_PID``): the rank, or a
    Python program that a rank's shell script started; None when it is neither (gone, or a pid
    reused by another process), so that no process dies of the dump signal's default action."""
    (target,) = DUMP_PID.unpack_from(mm, DUMP_PID_OFFSET)
    return target if target > 0 and target in rank_tree(pid) else None


def _end_rank(pid: int) -> None:
    """SIGKILL the rank and every process it started. A ``train.command`` such as ``bash run.sh``
    runs its Python program as a child of the rank's process: killing only the shell would leave it
    running, hung. Each is stopped first, so that none starts another or loses its parent unseen."""
    seen: List[int] = []
    for _ in range(3):
        tree = [p for p in rank_tree(pid) if p not in seen]
        if not tree:
            break
        for p in tree:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        seen += tree
    for p in reversed(seen):  # the rank last: its end ends this watchdog too (PR_SET_PDEATHSIG)
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _decide_requeue(run_dir: str, job_id: str, restart: int, max_requeues: int) -> None:
    """The requeue rule (``rundir.decide_requeue``) for a hung submitit job, in rank 0's watchdog
    before it ends the rank (the rank's own ``SubmititWorker.after_worker`` never runs then); the job
    requeued is ``rundir.requeue_target`` of this process's environment (``ARRAYJOBID_TASKID`` for an
    array task)."""
    import logging
    import shutil
    import subprocess

    from .rundir import decide_requeue_here, requeue_job, requeue_target

    env = {**os.environ, "SLURM_JOB_ID": job_id, "SLURM_RESTART_COUNT": str(restart)}
    decision = decide_requeue_here(
        run_dir,
        exit_code=137,
        max_requeues=max_requeues,
        got_term=False,
        can_requeue=shutil.which("scontrol") is not None,
        environ=env,
    )
    _say(decision.reason)
    if decision.requeue:
        wlog = logging.getLogger("slurm_ddp.watchdog")
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s slurm_ddp watchdog: %(message)s", "%Y-%m-%dT%H:%M:%S"))
        wlog.handlers[:] = [handler]
        wlog.setLevel(logging.INFO)
        # an array task (a submitit sweep element) requeues itself alone: ARRAYJOBID_TASKID, not the
        # bare job id, which may be the array's own and requeue every task of it
        requeue_job(requeue_target(env), decision.exclude, subprocess.run, wlog)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m slurm_ddp.watchdog")
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--fd", type=int, required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--host", required=True)
    p.add_argument("--job-id", required=True)
    p.add_argument("--restart", type=int, required=True)
    p.add_argument("--decide-requeue", type=int, default=-1, metavar="MAX_REQUEUES")
    p.add_argument("--samples", type=int, default=0, help="1: append the rank's step samples (rundir.PROGRESS_NAME)")
    p.add_argument(
        "--save-wait-s",
        type=float,
        default=0.0,
        help="> 0: let the rank save alone first, up to this long (rundir.hangs)",
    )
    for name, default in Limits().__dict__.items():
        p.add_argument("--" + name.replace("_", "-"), type=float, default=default)
    return p


def command(
    python: str, *, pid: int, fd: int, run_dir: str, rank: int, world_size: int, host: str, job_id: str,
    restart: int, limits: Limits, decide_requeue: int = -1, samples: bool = False, save_wait_s: float = 0.0,
) -> List[str]:  # fmt: skip
    """The watchdog's argv for rank ``rank`` (process ``pid``, progress record ``fd``); ``samples``:
    keep its step samples for the report (:class:`StepSampler`); ``save_wait_s`` > 0: before it ends
    the rank, let it commit the last completed step alone, up to that many seconds (``rundir.hangs``)."""
    argv = [python, "-m", "slurm_ddp.watchdog", "--pid", str(pid), "--fd", str(fd), "--run-dir", run_dir]
    argv += ["--rank", str(rank), "--world-size", str(world_size), "--host", host, "--job-id", job_id]
    argv += ["--restart", str(restart), "--decide-requeue", str(decide_requeue), "--samples", str(int(samples))]
    if save_wait_s > 0:
        argv += ["--save-wait-s", repr(float(save_wait_s))]
    for name, value in limits.__dict__.items():
        argv += ["--" + name.replace("_", "-"), repr(float(value))]
    return argv


def spawn(argv: Sequence[str], extra_ignored: Sequence[str] = (), death_signal: int = signal.SIGKILL) -> int:
    """Fork the watchdog of this process (which is about to exec the rank): the child gets
    ``death_signal`` when it ends (``PR_SET_PDEATHSIG``; SIGKILL: it dies with it), ignores the job's
    signals, and execs ``argv``. Returns the child's pid."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing here may raise into the parent's code
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(death_signal))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:
            os._exit(0)
        for name in (*IGNORED_SIGNALS, *extra_ignored):
            sig = getattr(signal, name, None)
            if sig is not None:
                signal.signal(sig, signal.SIG_IGN)
        os.execv(argv[0], list(argv))
    except BaseException:
        pass
    os._exit(127)


def start_for_rank(cfg: JobConfig, denv: DistEnv, run_dir: str, python: str) -> Dict[str, str]:
    """In the rank wrapper, just before it execs the rank: make the rank's progress record and
    start its watchdog. Returns the variables to add to the rank's environment (none when
    ``watchdog.enabled`` is false)."""
    w = cfg.watchdog
    if not w.enabled:
        return {}
    from .progress import FD_VAR, create_record

    try:
        fd = create_record()
    except (AttributeError, OSError) as err:  # no memfd_create (not Linux): run without a watchdog
        print(f"slurm_ddp launch: note: no hang watchdog for this rank: {err}", file=sys.stderr, flush=True)
        return {}
    limits = Limits(
        timeout_floor_s=w.timeout_floor_s,
        step_time_factor=w.step_time_factor,
        startup_s=w.startup_s,
        eval_s=w.eval_s,
        checkpoint_s=w.checkpoint_s,
        poll_interval_s=w.poll_interval_s,
    )
    samples = denv.rank == 0 and bool(cfg.train.command)
    argv = command(
        python,
        pid=os.getpid(),
        fd=fd,
        run_dir=str(run_dir),
        rank=denv.rank,
        world_size=denv.world_size,
        host=denv.hostname or socket.gethostname(),
        job_id=str(denv.job_id),
        restart=denv.restart_count,
        limits=limits,
        # submitit runs no batch script after the ranks: rank 0's watchdog takes the requeue decision,
        # unless the rank is train.command's, whose SubmititCommand outlives it and decides then
        decide_requeue=cfg.requeue.max_requeues
        if denv.rank == 0 and os.environ.get(BACKEND_VAR) == "submitit" and not cfg.train.command
        else -1,
        # a script of one's own: its steps reach the report only through these samples (the worker
        # writes its own step records to metrics.jsonl)
        samples=samples,
        # in-job recovery of the shared worker: the rank commits the last completed step before its end
        save_wait_s=EMERGENCY_WAIT_S if cfg.in_job_recovery and not cfg.train.command else 0.0,
    )
    death = FINAL_SAMPLE_SIGNAL if samples else signal.SIGKILL
    spawn(argv, extra_ignored=("SIG" + cfg.requeue.signal_name,), death_signal=death)
    return {FD_VAR: str(fd)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
