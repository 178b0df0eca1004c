"""The preemption flag: signal handlers that only set a flag; ranks agree at a step boundary.

Side effects: installs signal handlers (main thread only) and restores the originals.
Checkpoint I/O or ``scontrol`` inside a handler can deadlock (it interrupts arbitrary code,
e.g. a collective or a lock held by the allocator; cf. Lightning issue #21406), so the
handler records the signal and returns. The ranks then agree on the flag with an
all-reduce (MAX), so every rank stops after the same step even when only some of them
received the signal, and for the same signal: the reduced value encodes the signal with its weight
(``rundir.stop_precedence``: SIGTERM over the requeue signal), so a SIGTERM to one rank is every
rank's stop for SIGTERM, which rank 0 records in the ``PREEMPTED`` marker. The worker does this with ``slurm_ddp.worker.runtime.StepAgreement``,
which calls that all-reduce only every ~0.5 s of steps (its ``poll()`` is called once per
step on every rank); :meth:`PreemptionFlag.sync` is the same agreement at every step, for a
training script of one's own where a collective per step costs nothing that matters.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, Iterator, Optional, Union

if TYPE_CHECKING:  # torch only inside sync(), so that importing this module imports no torch
    import torch

SignalSpec = Union[str, int, signal.Signals]


def to_signal(spec: SignalSpec) -> signal.Signals:
    """``"USR2"``, ``"SIGUSR2"`` or ``12`` → ``signal.SIGUSR2``. Raises ``ValueError``."""
    if isinstance(spec, signal.Signals):
        return spec
    if isinstance(spec, int):
        return signal.Signals(spec)
    name = spec.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return signal.Signals[name]
    except KeyError:
        raise ValueError(f"unknown signal {spec!r}") from None


class PreemptionFlag:
    """Set by SIGUSR2/SIGTERM (or the signals given); read and agreed on by the training loop.

    Usage::

        flag = PreemptionFlag(["USR2", "TERM"]).install()
        for batch in loader:
            ...
            if flag.sync():          # collective: every rank must call it at the same step
                save_checkpoint(); break
        flag.restore()
    """

    def __init__(self, signals: Iterable[SignalSpec] = ("USR2", "TERM")):
        self.signals = tuple(dict.fromkeys(to_signal(s) for s in signals))
        self._received: Optional[signal.Signals] = None
        self._received_at: Optional[float] = None
        self._originals: Dict[signal.Signals, Union[Callable[[int, Optional[FrameType]], Any], int, None]] = {}

    # -- handler side: only records -----------------------------------------
    def _handler(self, signum: int, frame: Optional[FrameType]) -> None:
        got = signal.Signals(signum)
        if self._received is None or signal_code(got) > signal_code(self._received):
            if self._received is None:
                self._received_at = time.time()
            self._received = got  # a SIGTERM after the requeue signal: the stop is SIGTERM's

    def install(self) -> PreemptionFlag:
        """Install the handlers, remembering the previous ones. Main thread only (Python's rule).

        Installing twice keeps the handlers from before the first call, so ``restore()``
        still puts back the originals, not this flag's own handler.
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionFlag.install() must run in the main thread")
        for sig in self.signals:
            previous = signal.signal(sig, self._handler)
            self._originals.setdefault(sig, previous)
        # slurm_ddp.launch blocks the requeue signal before it execs the worker: one that arrived
        # since is pending and is delivered to this handler now.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(self.signals))
        return self

    def restore(self) -> None:
        """Put back the handlers that were installed before ``install()``."""
        for sig, original in self._originals.items():
            signal.signal(sig, original if original is not None else signal.SIG_DFL)
        self._originals.clear()

    def __enter__(self) -> PreemptionFlag:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.restore()

    # -- loop side ------------------------------------------------------------
    @property
    def received(self) -> Optional[signal.Signals]:
        """The signal this rank stops for, or None: the heaviest one it received (``rundir.stop_precedence``;
        SIGTERM over the requeue signal), or after an agreement (:meth:`sync`, ``StepAgreement``) the one
        the ranks agreed on."""
        return self._received

    @property
    def received_at(self) -> Optional[float]:
        """Wall-clock time (``time.time()``, s) this rank received :attr:`received`; None when it was
        raised by hand or by the other ranks (:meth:`sync`), or not at all."""
        return self._received_at

    def code(self) -> int:
        """This rank's flag as the integer the ranks all-reduce with MAX (0: no signal); see :func:`signal_code`."""
        return signal_code(self._received) if self._received is not None else 0

    def agree(self, code: int) -> bool:
        """Take the all-reduced (MAX) :meth:`code` of every rank; True when any rank got a signal.
        The flag then names the agreed signal (a flag raised without one: its first signal)."""
        if code <= 0:
            return False
        try:
            agreed = signal.Signals(code % _CODE_BASE)
        except ValueError:
            agreed = self.signals[0] if self.signals else signal.SIGUSR2
        if self._received is None or code > self.code():
            self._received = agreed
        return True

    def set(self, sig: SignalSpec = "USR2") -> None:
        """Raise the flag by hand (e.g. a time budget ran out)."""
        self._received = to_signal(sig)

    def sync(self, group: object = None, device: Union[str, torch.device, int, None] = None) -> bool:
        """True on every rank when any rank received a signal. A collective (all-reduce MAX).

        Without an initialized ``torch.distributed`` process group it returns the local flag.
        ``device`` is where the one-element tensor lives (``cuda:LOCAL_RANK`` with NCCL).
        """
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self._received is not None
        t = torch.tensor([self.code()], dtype=torch.int32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return self.agree(int(t.item()))


#: signal numbers are below this (Linux: 1..64); the weight is the code's higher part
_CODE_BASE = 256


def signal_code(sig: SignalSpec) -> int:
    """``sig`` as a positive integer ordered by ``rundir.stop_precedence`` (weight × 256 + signal
    number): the MAX of the ranks' codes is the signal they agree to stop for."""
    from .rundir import stop_precedence

    s = to_signal(sig)
    return stop_precedence(s.name) * _CODE_BASE + int(s)


def worker_signals(requeue_signal: SignalSpec) -> tuple[signal.Signals, ...]:
    """The signals a rank's preemption flag handles: the job's ``requeue.signal`` and SIGTERM (the shared
    worker's flag, and ``slurm_ddp.preemption.install()``'s default). The rank wrapper execs the worker
    with these blocked; ``PreemptionFlag.install`` unblocks them, so one sent earlier is not lost."""
    return tuple(dict.fromkeys((to_signal(requeue_signal), signal.SIGTERM)))


def ignore_in_loader_workers(signals: Iterable[SignalSpec]) -> Callable[[int], None]:
    """A DataLoader ``worker_init_fn`` (called with the worker id) that makes the loader's worker processes
    ignore ``signals`` — the rank's stop signals (:func:`worker_signals`).

    Why: Slurm sends a stop signal to every process of the step (``scancel``, preemption, ``KillWait``;
    scancel(1), slurm.conf(5) ``PreemptMode``), and the local supervisor to each rank's process group, so the
    loader workers get it too. torch's worker handler (``torch.utils.data._utils.signal_handling``) lets a
    SIGTERM that its rank did not send kill the worker, and the rank's next batch then raises "DataLoader
    worker … is killed by signal: Terminated": the rank fails instead of saving at the step boundary.
    Ignoring the signal leaves the stop to the rank, which ends its loader workers as it exits (and they
    end on their own when it is gone: torch's worker loop watches its parent). A picklable callable
    (``functools.partial``), so it also works with the ``spawn`` and ``forkserver`` start methods.

    A worker runs this some milliseconds after it started (more on a loaded machine); a signal in between
    would still kill it. Create the loader's iterator (which starts the workers) inside :func:`blocked`
    with the same signals: the workers then start with them blocked, and this function unblocks them once
    they are ignored, which discards a pending one (signal(7)). How each start method of
    ``multiprocessing`` (Python's docs, "Contexts and start methods") keeps the mask: ``fork`` — the
    child has the forking thread's mask (fork(2)); ``spawn`` — a fork and an exec, both keep it
    (execve(2)); ``forkserver`` (Linux's default since Python 3.14) — the worker is forked by the fork
    server, so it has the *server's* mask, the one of the thread that started the server: the server
    starts at the first worker start of the process, so a rank whose first loader iterator is created
    inside :func:`blocked` (the shared worker's trainer) has a server, and workers, with the signals
    blocked; a server started earlier outside it leaves the window open. The server itself then keeps
    them blocked (pending, harmless) and ends with its last client, as Python's docs say.

    It also ends the worker when the process that started it is gone or has let go of it
    (``multiprocessing.parent_process()``'s sentinel, watched by a daemon thread): torch's own check
    watches the worker's parent process, which under ``forkserver`` is the fork server, not the rank,
    and ``terminate()`` sends the SIGTERM the worker now ignores; without this a worker of a rank that
    died (SIGKILL, OOM) would wait for work forever and keep the fork server alive with it."""
    return functools.partial(_ignore_signals, tuple(int(to_signal(s)) for s in signals))


def _ignore_signals(signums: tuple[int, ...], worker_id: int) -> None:
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signums)
    _end_with_parent_process()


def _end_with_parent_process() -> None:
    """In a ``multiprocessing`` child: a daemon thread that ends this process (``os._exit(0)``) once its
    parent process (the one that started it, whatever the start method) is gone or has closed its end of
    the child's sentinel pipe (it dropped the child's ``Process`` object). A no-op in a main process."""
    import multiprocessing
    import os

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(0)

    threading.Thread(target=watch, name="slurm-ddp-parent-watch", daemon=True).start()


@contextlib.contextmanager
def blocked(signals: Iterable[SignalSpec]) -> Iterator[None]:
    """Block ``signals`` in the calling thread for the ``with`` body, then restore its mask
    (pthread_sigmask(3)). One that arrives meanwhile stays pending and is delivered after (or to another
    thread that does not block it); a process forked meanwhile starts with them blocked. See
    :func:`ignore_in_loader_workers`.

    On Python < 3.13 it first makes sure ``multiprocessing``'s resource tracker runs: starting it (the
    first ``spawn``/``forkserver`` process of a program does) unblocks SIGINT and SIGTERM in the calling
    thread there (``resource_tracker.ensure_running``; 3.13 restores the previous mask instead), which
    inside the ``with`` body would start a fork server or a spawned loader worker with SIGTERM unblocked
    (seen with Python 3.11.2)."""
    if sys.version_info < (3, 13):
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {to_signal(s) for s in signals})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def loader_context(signals: Iterable[SignalSpec], preload: Iterable[str] = ()) -> Any:
    """The ``multiprocessing`` context (``DataLoader(multiprocessing_context=…)``) for loader workers that
    ignore ``signals`` (:func:`ignore_in_loader_workers`): the platform's default start method, and for
    ``forkserver`` (Linux's default since Python 3.14) a fork server started now, inside :func:`blocked`,
    with ``torch`` and the modules ``preload`` names (the dataset's: the task's module) imported in it.

    Why: a fork server without them makes every worker import torch and the task anew, about 2.5 s per
    epoch's new workers on a loaded 2-core machine (Python 3.14, digits example), and a rank that must
    stop waits that long at an epoch boundary — past Slurm's ``KillWait`` when the stop is a preemption
    (the partition-preemption test timed out on Python 3.14 waiting for the checkpoint). Forked from a
    server that has them, a worker starts in milliseconds. Started here, inside :func:`blocked`, the
    server and every worker it forks have ``signals`` blocked until the worker ignores them. A server
    already running (something of the process's own started one) is used as it is: neither its
    modules nor its mask change. ``preload`` is Python's ``set_forkserver_preload``, process-wide;
    a module that fails to import there is skipped (Python's forkserver does so)."""
    import multiprocessing

    ctx = multiprocessing.get_context()
    if ctx.get_start_method() == "forkserver":
        from multiprocessing import forkserver

        ctx.set_forkserver_preload(list(dict.fromkeys(["__main__", "torch", *preload])))
        with blocked(signals):
            forkserver.ensure_running()
    return ctx


def forwarded_signals(requeue_signal: SignalSpec) -> frozenset[signal.Signals]:
    """The signals the local supervisor and a local sweep catch and pass on to their ranks or elements
    (as srun passes them on): SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP and the job's ``requeue.signal``.
    They are blocked from before a rank or element is started until its handlers are in place."""
    sigs = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    return frozenset({*sigs, to_signal(requeue_signal)})


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have Linux send ``sig`` to this process when its parent dies (prctl(2) PR_SET_PDEATHSIG);
    a no-op where prctl is missing. Used by the local supervisor's ranks and sweep elements and by
    the rank wrapper's command child: none may outlive the process that supervises it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
