"""Progress points of a rank, read by its hang watchdog (``slurm_ddp.watchdog``): the public API.

Side effects: maps a small shared-memory record (a ``memfd`` the rank wrapper made and passed
down as ``$SLURM_DDP_PROGRESS_FD``) and, at the first call, registers ``faulthandler`` for
:data:`DUMP_SIGNAL` (every thread's Python stack to stderr, i.e. the rank log, without needing the
GIL). Imports no torch. Without the variable (a script not started by ``slurm-ddp submit``, or
``watchdog.enabled: false``), or when its descriptor holds no progress record (a grandchild started
with ``close_fds`` inherits the variable, not the descriptor), every call is a no-op.

The shared worker reports its progress itself. A script of one's own (``train.command``) opts in
with one call per step, and wraps long phases::

    from slurm_ddp import progress

    for step, batch in enumerate(loader, start=1):
        train_step(batch)
        progress.step(step)                 # a memory write: no syscall, ~1 µs
        if step % 1000 == 0:
            with progress.phase("eval"):    # allowed watchdog.eval_s instead of the step allowance
                evaluate()
            with progress.phase("checkpoint"):
                save_snapshot()

The watchdog judges a rank only once it reports (its first call to this module): until then a
script that does not use the API is never taken for hung (it still ends when a peer hangs). From
the first call to the first completed step the rank is in ``startup`` (``watchdog.startup_s``).

The record (:data:`RECORD`, little-endian): magic, flags (bit 0: the dump handler is installed;
bit 1: the rank reports progress), then the step (``int64``), the phase (an index into
:data:`PHASES`) and ``time.monotonic()`` of the last report (``float64``, seconds; the clock is
system-wide, so the watchdog process compares it with its own); then (:data:`DUMP_PID`) the pid of
the process that installed the dump handler; then (:data:`FIRST_STEP`, written once, by the first
:func:`step`) the first step reported and its ``time.monotonic()`` (rank 0's watchdog records them
for ``slurm-ddp report``: the end of start-up).
"""

from __future__ import annotations

import contextlib
import faulthandler
import mmap
import os
import signal
import struct
import sys
import time
from typing import Iterator, Optional

#: What a rank is doing; the index is the code in the record. ``data``: waiting for its next
#: batch; ``step``: forward/backward/optimizer (and the collectives in them).
PHASES = ("startup", "data", "step", "eval", "checkpoint")
STARTUP, DATA, STEP, EVAL, CHECKPOINT = range(5)
#: How a phase reads in a summary line.
PHASE_WORDS = {
    "startup": "start-up",
    "data": "data loading",
    "step": "a training step",
    "eval": "evaluation",
    "checkpoint": "a checkpoint write",
}
#: The rank wrapper passes the record's file descriptor to the rank in this variable.
FD_VAR = "SLURM_DDP_PROGRESS_FD"
#: The watchdog sends this signal to make a rank write every thread's stack (faulthandler).
DUMP_SIGNAL = int(signal.SIGRTMIN) + 3
MAGIC = 0x534C4450  # "SLDP"
FLAG_DUMPABLE = 1
FLAG_REPORTING = 2
#: magic, flags, step, phase, monotonic time
RECORD = struct.Struct("<IIqqd")
_HEAD = struct.Struct("<II")
#: After the record: the pid of the process that installed the dump handler (``int32``; 0: none).
DUMP_PID = struct.Struct("<i")
DUMP_PID_OFFSET = RECORD.size
#: After the dump pid, 8-aligned (offset 40): the first step reported through :func:`step` and its
#: monotonic time (``int64``, ``float64``); zeros until then.
FIRST_STEP = struct.Struct("<qd")
FIRST_STEP_OFFSET = DUMP_PID_OFFSET + 8
_BODY = struct.Struct("<qqd")
SIZE = 64


class Progress:
    """A rank's progress record in shared memory (``fd``: the memfd from the rank wrapper)."""

    def __init__(self, fd: int):
        _check_record(fd)
        self._mm = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._flags = _HEAD.unpack_from(self._mm, 0)[1]
        self._step = 0
        self._phase = STARTUP
        self._steps_reported = 0  # calls of step(): before the first one the rank is in start-up
        self._pack = _BODY.pack_into
        self._clock = time.monotonic

    def _set_flags(self, flags: int) -> None:
        self._flags |= flags
        _HEAD.pack_into(self._mm, 0, MAGIC, self._flags)

    def install_dump(self) -> None:
        """Register ``faulthandler`` for :data:`DUMP_SIGNAL` (all threads, to stderr) and say so
        in the record, with this process's pid: the watchdog sends that signal only to the process
        that did this (the rank, or a Python program a shell script of the rank started), never to
        one whose default action for it is to die."""
        faulthandler.register(DUMP_SIGNAL, file=sys.stderr, all_threads=True, chain=False)
        DUMP_PID.pack_into(self._mm, DUMP_PID_OFFSET, os.getpid())
        self._set_flags(FLAG_DUMPABLE | FLAG_REPORTING)

    def mark(self, step: int, phase: int) -> None:
        """Record ``step`` (steps completed) and ``phase`` (an index into :data:`PHASES`), now."""
        self._step, self._phase = step, phase
        self._pack(self._mm, 8, step, phase, self._clock())

    def mark_step(self, step: int) -> None:
        """Record that step ``step`` is done (phase ``step``): the end of start-up."""
        self._steps_reported += 1
        self.mark(step, STEP)
        if self._steps_reported == 1:  # once: the end of start-up, for the report
            FIRST_STEP.pack_into(self._mm, FIRST_STEP_OFFSET, step, self._clock())

    @property
    def steps_reported(self) -> int:
        """How many times :meth:`mark_step` was called (0: still in start-up)."""
        return self._steps_reported

    @property
    def step(self) -> int:
        return self._step

    @property
    def phase(self) -> int:
        return self._phase


class _Off:
    """No watchdog: every report is dropped."""

    step = 0
    phase = STARTUP

    def install_dump(self) -> None:
        return None

    def mark(self, step: int, phase: int) -> None:
        return None

    def mark_step(self, step: int) -> None:
        return None

    steps_reported = 0


#: A recorder that drops every report: a process the watchdog must not judge yet (a warm spare waiting to be
#: called in, ``slurm_ddp.worker.inprocess``, takes :func:`recorder` only once it trains).
DISABLED = _Off()

_recorder: Optional[Progress | _Off] = None


def recorder() -> Progress | _Off:
    """This process's record (made at the first call: maps ``$SLURM_DDP_PROGRESS_FD`` and installs
    the stack-dump handler); a no-op recorder when the variable is unset or unusable."""
    global _recorder
    if _recorder is None:
        text = os.environ.get(FD_VAR, "")
        rec: Progress | _Off = _Off()
        if text.isdigit():
            try:
                rec = Progress(int(text))
                rec.install_dump()
            except (OSError, ValueError):
                rec = _Off()
        _recorder = rec
    return _recorder


def step(n: int) -> None:
    """Report that step ``n`` (steps completed, any increasing count) is done; call once per step on
    every rank. The watchdog allows ``max(watchdog.timeout_floor_s, step_time_factor × recent
    step time)`` until the next call."""
    rec = _recorder if _recorder is not None else recorder()
    rec.mark_step(n)


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Within the block the rank is in phase ``name`` (``"eval"`` or ``"checkpoint"``, allowed
    ``watchdog.eval_s`` / ``watchdog.checkpoint_s``; ``"data"``, ``"step"``); after it, back to
    a training step, or to start-up when no :func:`step` was reported yet (an evaluation before
    training leaves the first step its ``watchdog.startup_s``). Raises ``ValueError`` for another name."""
    if name not in PHASES:
        raise ValueError(f"unknown progress phase {name!r}; one of {', '.join(PHASES)}")
    rec = recorder()
    rec.mark(rec.step, PHASES.index(name))
    try:
        yield
    finally:
        rec.mark(rec.step, STEP if rec.steps_reported else STARTUP)


def _check_record(fd: int) -> None:
    """Raise ``ValueError`` unless ``fd`` holds a progress record (:data:`SIZE` bytes, :data:`MAGIC`
    first): a process that inherited ``$SLURM_DDP_PROGRESS_FD`` but not the descriptor (``close_fds``)
    may have that number open on a file of its own, which must not be written. ``OSError`` when
    ``fd`` is not open."""
    if os.fstat(fd).st_size != SIZE:
        raise ValueError(f"file descriptor {fd} is not a progress record (size)")
    head = os.pread(fd, _HEAD.size, 0)
    if len(head) != _HEAD.size or _HEAD.unpack(head)[0] != MAGIC:
        raise ValueError(f"file descriptor {fd} is not a progress record (magic)")


def read_record(buf: bytes) -> Optional[tuple[int, int, int, float]]:
    """``(flags, step, phase, monotonic_time)`` of a record's bytes; None before it is initialised."""
    magic, flags, step_, phase_, t = RECORD.unpack_from(buf, 0)
    if magic != MAGIC:
        return None
    return flags, step_, phase_, t


def read_first_step(buf: bytes) -> Optional[tuple[int, float]]:
    """``(step, monotonic_time)`` of the first step a record's rank reported through :func:`step`;
    None before it."""
    step_, t = FIRST_STEP.unpack_from(buf, FIRST_STEP_OFFSET)
    return (step_, t) if t > 0 else None


def create_record() -> int:
    """A new record (memfd, inheritable) in phase ``startup`` at step 0, now; returns its fd."""
    fd = os.memfd_create("slurm_ddp-progress", 0)
    os.ftruncate(fd, SIZE)
    os.pwrite(fd, RECORD.pack(MAGIC, 0, 0, STARTUP, time.monotonic()), 0)
    os.set_inheritable(fd, True)
    return fd


def _reset_for_tests() -> None:
    global _recorder
    _recorder = None
