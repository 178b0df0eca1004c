"""Asynchronous checkpoints on rank 0: ``snapshot_to_cpu`` and ``AsyncCheckpointer``.

The training loop is blocked only while the state is copied into CPU memory (``snapshot_to_cpu``,
into buffers reused from the previous save); a long-lived ``checkpoint-writer`` thread then commits
the copy with ``CheckpointManager.save`` (see ``slurm_ddp.checkpoint.manager``). Side effects:
starts and ends that thread, holds one CPU copy of the state between saves, and through the manager
writes the checkpoint's files. Imports torch only inside functions.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import CheckpointError
from .manager import CheckpointInfo, CheckpointManager


def _plain(t: Any) -> bool:
    """A dense tensor without lazy conjugate/negative bits, of torch's own Tensor type."""
    import torch

    return (
        type(t) is torch.Tensor
        and t.layout == torch.strided
        and not t.is_quantized
        and not t.is_conj()
        and not t.is_neg()
    )


def _reusable(buf: Any, t: Any) -> bool:
    """Whether ``buf`` (a tensor of an earlier snapshot) can receive a copy of ``t`` in place."""
    return (
        _plain(t)
        and _plain(buf)
        and buf.device.type == "cpu"
        and buf.dtype == t.dtype
        and buf.shape == t.shape
        and buf.stride() == t.stride()
        and not buf.requires_grad
    )


COPIERS = ("memmove", "torch")


def _run_copies(copies: List[Tuple[Any, Any]], copier: str = "memmove") -> None:
    """Copy each (dst, src) pair of contiguous CPU tensors of the same size.

    ``"memmove"``: one ``memmove`` per tensor on this thread (it releases the GIL). ``"torch"``:
    ``dst.copy_(src)``, which splits each copy over torch's intra-op threads with a barrier at the
    end — faster on idle cores, much slower on a loaded machine (more runnable threads than cores),
    where a descheduled thread stalls each of those barriers. Measured on 2 cores, 200 MB of model
    + AdamW state into reused buffers: idle, torch 16 ms vs memmove 23 ms; busy, torch 79 ms vs
    memmove 25 ms (medians). ``AsyncCheckpointer`` picks whichever has been faster lately.
    """
    if copier == "torch":
        for d, s in copies:
            d.copy_(s)
        return
    import ctypes

    for d, s in copies:
        ctypes.memmove(d.data_ptr(), s.data_ptr(), s.numel() * s.element_size())


def _snapshot(obj: Any, reuse: Any, copies: List[Tuple[Any, Any]]) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        if t.device.type == "cpu" and _plain(t) and t.is_contiguous():
            dst = reuse if reuse is not None and _reusable(reuse, t) else torch.empty_like(t)
            if t.numel():
                copies.append((dst, t))  # both contiguous, same shape and dtype: the same bytes
            return dst
        if reuse is not None and _reusable(reuse, t):
            return reuse.copy_(t)
        return t.to("cpu", copy=True)
    if isinstance(obj, dict):
        old = reuse if isinstance(reuse, dict) else {}
        items = [(k, _snapshot(v, old.get(k), copies)) for k, v in obj.items()]
        if isinstance(obj, OrderedDict):
            out: Any = OrderedDict(items)
            meta = getattr(obj, "_metadata", None)
            if meta is not None:
                out._metadata = copy.deepcopy(meta)
            return out
        return dict(items)
    if isinstance(obj, (list, tuple)):
        olds = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(obj) else [None] * len(obj)
        elems = [_snapshot(v, r, copies) for v, r in zip(obj, olds)]
        if isinstance(obj, list):
            return elems
        return type(obj)(*elems) if hasattr(obj, "_fields") else tuple(elems)  # a namedtuple stays one
    return obj


def snapshot_to_cpu(obj: Any, reuse: Any = None, copier: str = "memmove") -> Any:
    """A copy of a (nested dict/list/tuple) state whose tensors are fresh CPU copies.

    Training may go on mutating the live tensors while the snapshot is written.
    ``OrderedDict`` stays ``OrderedDict``, with the ``_metadata`` (module versions) that
    ``Module.state_dict()`` attaches and ``load_state_dict`` reads, as in a synchronous save.

    ``reuse``: an earlier snapshot of the same state that nothing reads any more (the previous
    checkpoint's, once written): its tensors receive the new copies wherever shape, dtype and
    strides match. Copying into memory that is already mapped is several times faster than into
    fresh memory, which the kernel must fault in and zero page by page — that copy is all the
    training loop waits for in an asynchronous save.

    ``copier``: how contiguous CPU tensors are copied, ``"memmove"`` or ``"torch"`` (see
    ``_run_copies``); others always go through ``Tensor.copy_``/``Tensor.to``.
    """
    if copier not in COPIERS:
        raise ValueError(f"copier must be one of {COPIERS}, not {copier!r}")
    copies: List[Tuple[Any, Any]] = []
    out = _snapshot(obj, reuse, copies)
    _run_copies(copies, copier)
    return out


def _tensor_bytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _allocate_like(obj: Any) -> Any:
    """Empty CPU buffers shaped like ``obj``'s plain tensors (None elsewhere), pages touched.

    Reads only tensor metadata (shape, strides, dtype), never data, so it may run while
    training mutates the tensors. The result is a ``reuse`` argument for ``snapshot_to_cpu``.
    """
    import ctypes

    import torch

    if isinstance(obj, torch.Tensor):
        if not (_plain(obj) and obj.is_contiguous()):
            return None
        buf = torch.empty_strided(obj.size(), obj.stride(), dtype=obj.dtype, device="cpu")
        if buf.numel():
            # fault the pages in now (the kernel zeroes each on first touch); memset releases the GIL
            ctypes.memset(buf.data_ptr(), 0, buf.numel() * buf.element_size())
        return buf
    if isinstance(obj, dict):
        return {k: _allocate_like(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_allocate_like(v) for v in obj]
    return None


class _Job:
    """One background task: a write (what to save, and what came of it) or, with ``state=None``
    and ``like`` set, an allocation of snapshot buffers (``AsyncCheckpointer.prepare``)."""

    __slots__ = (
        "manager",
        "state",
        "step",
        "world_size",
        "done",
        "info",
        "error",
        "like",
        "buffers",
        "rank_states",
        "rank_digests",
        "write_s",
    )

    def __init__(
        self, manager: Optional[CheckpointManager], state: Any, step: int, world_size: int, done: Any, like: Any = None
    ):
        self.manager, self.state, self.step, self.world_size, self.done = manager, state, step, world_size, done
        self.rank_states = 0
        self.rank_digests: Any = None
        self.like = like
        self.buffers: Any = None
        self.info: Optional[CheckpointInfo] = None
        self.error: Optional[BaseException] = None
        self.write_s: Optional[float] = None  # seconds the commit took on the writer thread

    def run(self) -> None:
        t0 = time.perf_counter()
        try:
            self._run()
        finally:
            self.write_s = time.perf_counter() - t0

    def _run(self) -> None:
        if self.manager is None:
            self.buffers = _allocate_like(self.like)
        else:
            extra: Dict[str, Any] = (
                {"rank_states": self.rank_states} if self.rank_states else {}
            )  # a save() of before stays callable
            if self.rank_digests:
                extra["rank_digests"] = self.rank_digests
            self.info = self.manager.save(self.state, self.step, world_size=self.world_size, **extra)


def _writer_loop(jobs: Any) -> None:
    """The writer thread: run each job (commit its snapshot); ``None`` ends it. Holds no reference
    to the ``AsyncCheckpointer``, which stops it when it is closed or garbage-collected."""
    while True:
        job = jobs.get()
        if job is None:
            return
        try:
            job.run()
        except BaseException as e:  # surfaced in the main loop by check()/wait()/save()
            job.error = e
        finally:
            job.state = job.like = None
            job.done.set()
        job = None  # an idle writer holds nothing (it may still be alive at interpreter teardown)


class AsyncCheckpointer:
    """Background checkpoint writes on rank 0: snapshot to CPU memory, write in a thread.

    At most one write is in flight: ``save`` first waits for the previous one. An error
    in the writer is raised (as ``CheckpointError``) by the next ``save``, ``check`` or
    ``wait`` in the training loop, never lost. ``wait()`` flushes the pending write — call
    it before a preemption save and before exiting.

    The writes run on one long-lived thread (started by the first ``save``, ended by ``close()``
    or when the checkpointer is garbage-collected): ``save`` hands it the snapshot without waiting
    for a new thread to be scheduled.

    ``reuse_buffers`` (default): keep the CPU snapshot between saves and copy the next state
    into it (see ``snapshot_to_cpu``), which makes the copy — the time the training loop is
    blocked — several times shorter, at the price of holding one copy of the state in host
    memory for the life of the checkpointer. ``False``: a fresh snapshot each time, freed
    once written. Into reused buffers, CPU tensors are copied by whichever of ``memmove`` and
    torch's threaded copy has been faster lately (see ``_run_copies``: it depends on how busy
    the cores are).
    """

    def __init__(self, manager: CheckpointManager, reuse_buffers: bool = True):
        import queue
        import threading
        import weakref

        self.manager = manager
        self.reuse_buffers = reuse_buffers
        self._threading = threading
        self._jobs: Any = queue.SimpleQueue()
        self._worker: Optional[Any] = None
        self._job: Optional[_Job] = None
        self._error: Optional[BaseException] = None
        self._staging: Any = None
        self._copy_cost: Dict[str, float] = {}  # copier -> recent seconds per byte of a snapshot into reused buffers
        self._snapshots = 0
        self.last: Optional[CheckpointInfo] = None
        #: seconds the last committed background write took (None before one finished): the pace the
        #: writer keeps up with (``slurm_ddp.rundir.interval``: no interval shorter than this)
        self.last_write_s: Optional[float] = None
        weakref.finalize(self, self._jobs.put, None)  # garbage-collected: the writer thread ends

    def _pick_copier(self) -> str:
        """The copier that was faster lately; each is tried first, and the other again every 8th
        snapshot, so a change of machine load is noticed."""
        untried = [c for c in COPIERS if c not in self._copy_cost]
        if untried:
            return untried[0]
        best = min(COPIERS, key=lambda c: self._copy_cost[c])
        if self._snapshots % 8 == 0:
            return next(c for c in COPIERS if c != best)
        return best

    def _start_worker(self) -> None:
        if self._worker is None or not self._worker.is_alive():
            self._worker = self._threading.Thread(
                target=_writer_loop, args=(self._jobs,), name="checkpoint-writer", daemon=True
            )
            self._worker.start()

    def prepare(self, state: Dict[str, Any]) -> None:
        """Allocate the snapshot buffers for states shaped like ``state`` on the writer thread,
        while training goes on, so that not even the first ``save`` waits for fresh memory.

        Optional (the first ``save`` allocates otherwise); call it once the state has its final
        shapes — after the first optimizer step, when optimizers such as Adam have made their
        moment buffers. Only the metadata of ``state``'s tensors is read. A ``save`` before the
        allocation finished waits for it. No-op with ``reuse_buffers=False`` or when buffers exist.
        """
        if not self.reuse_buffers or self._staging is not None or self._job is not None:
            return
        self._start_worker()
        self._job = _Job(None, None, 0, 0, self._threading.Event(), like=state)
        self._jobs.put(self._job)

    def save(
        self,
        state: Dict[str, Any],
        step: int,
        world_size: int = 1,
        rank_states: int = 0,
        rank_digests: Optional[Sequence[Tuple[int, str]]] = None,
    ) -> float:
        """Snapshot ``state`` and start writing it (``rank_states``, ``rank_digests``: as ``CheckpointManager.save``);
        returns the seconds the caller was blocked."""
        t0 = time.perf_counter()
        self.wait()  # at most one write in flight; after it, the previous snapshot is free
        reusing = self._staging is not None
        # a first snapshot is mostly the kernel faulting in fresh memory: torch's threads share that
        copier = self._pick_copier() if reusing else "torch"
        t1 = time.perf_counter()
        snapshot = snapshot_to_cpu(state, self._staging, copier)
        if reusing:
            nbytes = max(1, _tensor_bytes(snapshot))
            cost = (time.perf_counter() - t1) / nbytes
            old = self._copy_cost.get(copier)
            self._copy_cost[copier] = cost if old is None else 0.5 * old + 0.5 * cost
            self._snapshots += 1
        self._staging = snapshot if self.reuse_buffers else None
        self._start_worker()
        self._job = _Job(self.manager, snapshot, step, world_size, self._threading.Event())
        self._job.rank_states = rank_states
        self._job.rank_digests = rank_digests
        self._jobs.put(self._job)
        return time.perf_counter() - t0

    @property
    def in_flight(self) -> bool:
        return self._job is not None and not self._job.done.is_set()

    def _collect(self) -> None:
        """Take in the result of a finished write."""
        job = self._job
        if job is not None and job.done.is_set():
            self._job = None
            if job.error is not None:
                self._error = job.error
            elif job.manager is None:  # a prepare(): its buffers receive the next snapshot
                self._staging = job.buffers
            else:
                self.last = job.info
                self.last_write_s = job.write_s

    def check(self) -> None:
        """Raise the writer's error, if it failed, without waiting."""
        self._collect()
        if self._error is not None:
            err, self._error = self._error, None
            if isinstance(err, CheckpointError):
                raise err
            raise CheckpointError(f"background checkpoint write failed: {err}") from err

    def wait(self) -> Optional[CheckpointInfo]:
        """Block until the pending write is committed; raise its error if it failed."""
        job = self._job
        if job is not None:
            job.done.wait()
        self.check()
        return self.last

    def close(self) -> Optional[CheckpointInfo]:
        """``wait()``, then end the writer thread (a later ``save`` starts a new one)."""
        try:
            return self.wait()
        finally:
            worker, self._worker = self._worker, None
            if worker is not None:
                self._jobs.put(None)
                worker.join()
