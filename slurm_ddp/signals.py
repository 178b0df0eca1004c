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
    worker's flag, and ``slurm_ddp.preemption.install()``'s default). The launch wrapper execs the worker
    with these blocked; ``PreemptionFlag.install`` unblocks them, so one sent earlier is not lost."""
    return tuple(dict.fromkeys((to_signal(requeue_signal), signal.SIGTERM)))


def ignore_in_loader_workers(signals: Iterable[SignalSpec]) -> Callable[[int], None]:
    """A DataLoader ``worker_init_fn`` (called with the worker id) that makes the loader's worker processes
    ignore ``signals`` — the rank's stop signals (:func:`worker_signals`).

    Why: Slurm sends a stop signal to every process of the step (``scancel``, preemption, ``KillWait``;
    scancel(1), slurm.conf(5) ``PreemptMode``), and the local launcher to each rank's process group, so the
    loader workers get it too. torch's worker handler (``torch.utils.data._utils.signal_handling``) lets a
    SIGTERM that its rank did not send kill the worker, and the rank's next batch then raises "DataLoader
    worker … is killed by signal: Terminated": the rank fails instead of saving at the step boundary.
    Ignoring the signal leaves the stop to the rank, which ends its loader workers as it exits (and they
    end on their own when it is gone: torch's worker loop watches its parent). A picklable callable
    (``functools.partial``), so it also works with the ``spawn`` and ``forkserver`` start methods.

    A worker runs this some milliseconds after it was forked (more on a loaded machine); a signal in
    between would still kill it. Create the loader's iterator (which forks the workers) inside
    :func:`blocked` with the same signals: the workers start with them blocked (fork(2) and execve(2)
    keep the signal mask: the ``fork`` and ``spawn`` start methods; not ``forkserver``, whose server forks
    them), and this function unblocks them once they are ignored, which discards a pending one (signal(7))."""
    return functools.partial(_ignore_signals, tuple(int(to_signal(s)) for s in signals))


def _ignore_signals(signums: tuple[int, ...], worker_id: int) -> None:
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signums)


@contextlib.contextmanager
def blocked(signals: Iterable[SignalSpec]) -> Iterator[None]:
    """Block ``signals`` in the calling thread for the ``with`` body, then restore its mask
    (pthread_sigmask(3)). One that arrives meanwhile stays pending and is delivered after (or to another
    thread that does not block it); a process forked meanwhile starts with them blocked. See
    :func:`ignore_in_loader_workers`."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {to_signal(s) for s in signals})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def forwarded_signals(requeue_signal: SignalSpec) -> frozenset[signal.Signals]:
    """The signals the local launcher and a local sweep catch and pass on to their ranks or elements
    (as srun passes them on): SIGUSR1, SIGUSR2, SIGTERM, SIGINT, SIGHUP and the job's ``requeue.signal``.
    They are blocked from before a rank or element is started until its handlers are in place."""
    sigs = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    return frozenset({*sigs, to_signal(requeue_signal)})


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have Linux send ``sig`` to this process when its parent dies (prctl(2) PR_SET_PDEATHSIG);
    a no-op where prctl is missing. Used by the local launcher's ranks and sweep elements and by
    the launch wrapper's command child: none may outlive the process that supervises it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
