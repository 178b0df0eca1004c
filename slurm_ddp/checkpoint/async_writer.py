"""Durable, atomic, verifiable checkpoints in one directory. Side effects: files.

A checkpoint is two files: ``step-00000120.pt`` (``torch.save`` of a dict) and
``step-00000120.json``, its manifest (step, world size, config hash, byte size, sha256,
and the data file's name: a step saved again while committed goes to ``step-00000120.1.pt``,
so the committed data is never overwritten in place).
The commit protocol (what makes a crash at any instant leave a valid latest checkpoint):

1. write the data to a temporary name in the same directory, ``fsync`` it, ``rename`` it;
2. write the manifest the same way, last: the manifest is the commit marker;
3. ``fsync`` the directory so both renames survive a power loss (rename(2) is atomic,
   but durable only once the directory entry is flushed; see fsync(2) NOTES).

``latest()`` is the newest checkpoint whose manifest parses and whose data file has the
recorded size and sha256; a truncated or corrupted one is reported and skipped.
``keep_last`` retention never deletes the newest valid checkpoint. Loading uses
``torch.load(weights_only=True)``: a checkpoint file cannot run code.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Union

from .errors import CheckpointError

log = logging.getLogger("slurm_ddp.checkpoint")
_NAME = re.compile(r"^step-(\d{8,})\.json$")
_CHUNK = 1 << 20


def fsync_dir(path: Union[str, os.PathLike]) -> None:
    """fsync a directory so renames inside it are durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _load_sync_file_range() -> Optional[Callable[[int, int, int, int], int]]:
    """libc's ``sync_file_range(2)`` (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_sync_file_range: Any = False  # looked up on first use (False: not yet)
_SYNC_FILE_RANGE_WRITE = 2
_BIG = 1 << 20  # the first write of at least this many bytes starts the helper threads
_PIECE = 4 << 20  # large writes go to the kernel in pieces of this size ...
_HEAD = 8 << 20  # ... and of _BIG bytes in a file's first _HEAD bytes, so the disk starts early


class _HashingWriter:
    """File-like wrapper that hashes and counts what passes through ``write``.

    Small files (a manifest) are hashed inline. From the first large write on, the work is spread
    so that the training thread (sync save) or the writer thread (async) only serializes and copies
    into the page cache, because a checkpoint is on the critical path:

    - the data goes to the kernel in pieces; a *hash* thread reads each piece back from the page
      cache (``pread``, which does not move the file position) and hashes it, in order, while the
      next pieces are written — so the sha256 is of the bytes the kernel holds for the file;
    - a *writeback* thread hands each written piece to the kernel's writeback right away
      (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, Linux), so the disk works while the rest is
      serialized instead of all at the final ``fsync``. That only starts writeback early:
      durability still comes from the ``fsync`` in ``atomic_write``.

    ``finish()`` after the last write (the hash may complete while the caller fsyncs), ``close()``
    before the file is closed: it joins the helpers and raises a read-back error. ``sha256``
    and ``size`` are final after ``close()``.
    """

    def __init__(self, f: Any):
        import threading

        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0  # bytes accepted by write()
        self._cond = threading.Condition()
        self._in_kernel = 0  # bytes flushed to the kernel: what the hash thread may read
        self._done = False
        self._abort = False
        self._hasher: Optional[Any] = None
        self._hash_error: Optional[BaseException] = None
        self._flusher: Optional[Any] = None
        self._handed_to_writeback = 0
        try:
            self._fd: Optional[int] = f.fileno()
        except (AttributeError, OSError, ValueError):
            self._fd = None

    def write(self, data: Any) -> int:
        mv = memoryview(data)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        n = mv.nbytes
        if self._hasher is None and (n < _BIG or not self._start_helpers()):
            self.sha256.update(mv)
            self._f.write(mv)
            self.size += n
            return n
        off = 0
        while off < n:
            piece = mv[off:off + (_PIECE if self.size >= _HEAD else _BIG)]
            self._f.write(piece)
            self.size += piece.nbytes
            off += piece.nbytes
            if piece.nbytes >= _BIG:
                self._publish()
        return n

    def _start_helpers(self) -> bool:
        global _sync_file_range
        if self._fd is None or not hasattr(os, "pread"):
            return False
        try:
            import fcntl

            if fcntl.fcntl(self._fd, fcntl.F_GETFL) & os.O_ACCMODE != os.O_RDWR:
                return False  # cannot read back (atomic_write's mkstemp file can): hash inline
        except (ImportError, OSError, AttributeError):
            return False
        import threading

        self._f.flush()
        self._in_kernel = self.size  # hashed inline so far
        self._hasher = threading.Thread(target=self._hash_loop, args=(self.size,), name="checkpoint-hash",
                                        daemon=True)
        self._hasher.start()
        if _sync_file_range is False:
            _sync_file_range = _load_sync_file_range()
        if _sync_file_range is not None:
            from concurrent.futures import ThreadPoolExecutor

            self._flusher = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writeback")
        return True

    def _publish(self) -> None:
        """Make everything written so far visible to the hash thread and start its writeback."""
        self._f.flush()
        with self._cond:
            self._in_kernel = self.size
            self._cond.notify()
        if self._flusher is not None and self.size - self._handed_to_writeback >= _BIG:
            start, self._handed_to_writeback = self._handed_to_writeback, self.size
            # advisory; it can block while the device queue is full, hence its own thread
            self._flusher.submit(_sync_file_range, self._fd, start, self.size - start, _SYNC_FILE_RANGE_WRITE)

    def _hash_loop(self, pos: int) -> None:
        buf = bytearray(_PIECE)
        view = memoryview(buf)
        try:
            while True:
                with self._cond:
                    while self._in_kernel <= pos and not self._done:
                        self._cond.wait()
                    end = self._in_kernel
                if pos >= end or self._abort:
                    return  # done, and all of it hashed; or the write failed
                while pos < end and not self._abort:
                    want = min(_PIECE, end - pos)
                    if hasattr(os, "preadv"):
                        got = os.preadv(self._fd, [view[:want]], pos)
                        chunk: Any = view[:got]
                    else:
                        chunk = os.pread(self._fd, want, pos)
                        got = len(chunk)
                    if got <= 0:
                        raise OSError(f"short read-back at byte {pos} of {end} while hashing")
                    self.sha256.update(chunk)
                    pos += got
        except BaseException as e:  # raised by close()
            self._hash_error = e

    def flush(self) -> None:
        self._f.flush()

    def finish(self) -> None:
        """No more writes: flush them and let the hash thread complete (without waiting for it)."""
        self._f.flush()
        with self._cond:
            self._in_kernel = self.size
            self._done = True
            self._cond.notify()

    def close(self) -> None:
        """Join the helpers (queued writeback hints are dropped). After ``finish()``, raise the
        hash thread's error; without it (a failed write), stop them quietly."""
        finished = self._done
        with self._cond:
            self._abort = not finished  # a failed write: no use hashing the rest
            self._done = True
            self._cond.notify()
        if self._flusher is not None:
            self._flusher.shutdown(wait=True, cancel_futures=True)  # before the fd can be closed
            self._flusher = None
        if self._hasher is not None:
            self._hasher.join()
            self._hasher = None
        err, self._hash_error = self._hash_error, None
        if err is not None and finished:
            raise OSError(f"could not read back what was written, to hash it: {err}") from err


def atomic_write(path: Union[str, os.PathLike], write: Callable[[Any], None], sync_dir: bool = True) -> tuple:
    """Write a file atomically and durably: temp file, ``write(f)``, fsync, rename, fsync dir.

    Returns ``(size_bytes, sha256_hex)`` of what was written. On any error the temporary
    file is removed and the destination is untouched. ``sync_dir=False`` leaves the
    directory's fsync to the caller (one fsync can cover several renames in a directory).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            hw = _HashingWriter(f)
            try:
                write(hw)
                hw.finish()
                os.fsync(f.fileno())  # while the hash thread completes
            finally:
                hw.close()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if sync_dir:
        fsync_dir(path.parent)
    return hw.size, hw.sha256.hexdigest()


def atomic_write_text(path: Union[str, os.PathLike], text: str) -> None:
    """``atomic_write`` for a UTF-8 text file."""
    atomic_write(path, lambda f: f.write(text.encode()))


def sha256_file(path: Union[str, os.PathLike]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class CheckpointInfo:
    """One committed checkpoint, as its manifest describes it."""

    step: int
    path: Path  #: the data file (``step-NNNNNNNN.pt``)
    manifest: Path
    world_size: int
    config_hash: str
    size_bytes: int
    sha256: str
    created: float  #: time.time() when committed


class CheckpointManager:
    """Save, find and load checkpoints in ``directory``; call ``save`` on rank 0 only.

    ``keep_last``: how many committed checkpoints to keep (>= 1). ``config_hash``: recorded
    in each manifest so a resume can tell a checkpoint of another config.
    """

    def __init__(self, directory: Union[str, os.PathLike], keep_last: int = 2, config_hash: str = ""):
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.config_hash = config_hash

    def _paths(self, step: int) -> tuple:
        stem = f"step-{step:08d}"
        return self.directory / f"{stem}.pt", self.directory / f"{stem}.json"

    def save(self, state: dict, step: int, world_size: int = 1) -> CheckpointInfo:
        """Commit ``state`` (a dict of tensors/containers/primitives) as the checkpoint of ``step``.

        Durable and atomic (see the module docstring); prunes to ``keep_last`` afterwards.
        Raises ``CheckpointError`` when the data cannot be written.
        """
        import torch

        data_path, manifest_path = self._paths(step)
        # Saving a step that is already committed (a preemption save right after the periodic save
        # of the same step): never overwrite the data file the committed manifest vouches for, or a
        # crash between the two renames leaves a manifest whose data no longer matches it, and no
        # valid checkpoint at all with keep_last=1. Write the other of two names; the new manifest
        # switches to it atomically, and the superseded file is deleted after the commit.
        superseded = self._committed_data_file(manifest_path)
        if superseded is not None and superseded.name == data_path.name:
            data_path = data_path.with_name(f"{data_path.stem}.1{data_path.suffix}")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # the directory's fsync after the manifest's rename makes both renames durable
            size, digest = atomic_write(data_path, lambda f: torch.save(state, f), sync_dir=False)
            info = CheckpointInfo(
                step=step,
                path=data_path,
                manifest=manifest_path,
                world_size=world_size,
                config_hash=self.config_hash,
                size_bytes=size,
                sha256=digest,
                created=time.time(),
            )
            manifest = {
                "step": step,
                "file": data_path.name,
                "world_size": world_size,
                "config_hash": self.config_hash,
                "size_bytes": size,
                "sha256": digest,
                "created": info.created,
                "torch_version": torch.__version__,
            }
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1) + "\n")
        except OSError as e:
            raise CheckpointError(f"could not write checkpoint of step {step} to {self.directory}: {e}") from e
        if superseded is not None and superseded != data_path:
            superseded.unlink(missing_ok=True)  # no manifest refers to it any more
        self.prune(newest_valid=info)
        return info

    @staticmethod
    def _committed_data_file(manifest: Path) -> Optional[Path]:
        """The data file an existing manifest refers to (None: no manifest, or an unreadable one)."""
        try:
            return manifest.with_name(str(json.loads(manifest.read_text())["file"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _read_manifest(self, manifest: Path, quiet: bool = False) -> Optional[CheckpointInfo]:
        try:
            m = json.loads(manifest.read_text())
            return CheckpointInfo(
                step=int(m["step"]),
                path=manifest.with_name(m["file"]),
                manifest=manifest,
                world_size=int(m["world_size"]),
                config_hash=str(m.get("config_hash", "")),
                size_bytes=int(m["size_bytes"]),
                sha256=str(m["sha256"]),
                created=float(m.get("created", 0.0)),
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            if not quiet:
                log.warning("skipping checkpoint manifest %s: unreadable (%s)", manifest, e)
            return None

    def committed(self, quiet: bool = False) -> List[CheckpointInfo]:
        """Checkpoints whose manifest exists and parses, oldest first (not yet verified).

        ``quiet``: skip unreadable manifests without a warning (a login-node reader).
        """
        try:
            entries = list(self.directory.iterdir())
        except OSError:
            return []
        infos = []
        for p in entries:
            if _NAME.match(p.name):
                info = self._read_manifest(p, quiet)
                if info is not None:
                    infos.append(info)
        return sorted(infos, key=lambda i: i.step)

    def verify(self, info: CheckpointInfo) -> Optional[str]:
        """None when the data file matches its manifest, else what is wrong."""
        try:
            size = info.path.stat().st_size
        except OSError:
            return "data file missing"
        if size != info.size_bytes:
            return f"size {size} B, manifest says {info.size_bytes} B (truncated?)"
        if sha256_file(info.path) != info.sha256:
            return "sha256 does not match the manifest (corrupted)"
        return None

    def latest(self) -> Optional[CheckpointInfo]:
        """The newest checkpoint that verifies; invalid newer ones are logged and skipped."""
        for info in reversed(self.committed()):
            problem = self.verify(info)
            if problem is None:
                return info
            log.warning("checkpoint of step %d in %s is invalid (%s); falling back to an older one",
                        info.step, self.directory, problem)
        return None

    def load(self, info: Optional[CheckpointInfo] = None, map_location: Any = "cpu") -> Optional[dict]:
        """Load ``info`` (default: ``latest()``) with ``torch.load(weights_only=True)``; None if none."""
        import torch

        info = info or self.latest()
        if info is None:
            return None
        try:
            return torch.load(info.path, map_location=map_location, weights_only=True)
        except Exception as e:  # an unpickling error is data corruption, not a bug here
            raise CheckpointError(f"could not load checkpoint {info.path}: {e}") from e

    def prune(self, newest_valid: Optional[CheckpointInfo] = None) -> None:
        """Delete all but the newest ``keep_last`` committed checkpoints; never the newest valid one.

        ``newest_valid``: the checkpoint just committed, when the caller knows it (saves re-hashing).
        """
        infos = self.committed()
        if len(infos) <= self.keep_last:
            return
        newest_valid = newest_valid or self.latest()
        for info in infos[: -self.keep_last]:
            if newest_valid is not None and info.step == newest_valid.step:
                continue
            for p in (info.manifest, info.path):  # manifest first: uncommit, then delete data
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
        for p in self.directory.glob(".step-*.tmp"):  # leftovers of a crash mid-write
            try:
                if time.time() - p.stat().st_mtime > 60:
                    p.unlink()
            except FileNotFoundError:  # renamed or removed meanwhile
                pass


def _plain(t: Any) -> bool:
    """A dense tensor without lazy conjugate/negative bits, of torch's own Tensor type."""
    import torch

    return (type(t) is torch.Tensor and t.layout == torch.strided and not t.is_quantized
            and not t.is_conj() and not t.is_neg())


def _reusable(buf: Any, t: Any) -> bool:
    """Whether ``buf`` (a tensor of an earlier snapshot) can receive a copy of ``t`` in place."""
    return (_plain(t) and _plain(buf) and buf.device.type == "cpu" and buf.dtype == t.dtype
            and buf.shape == t.shape and buf.stride() == t.stride() and not buf.requires_grad)


COPIERS = ("memmove", "torch")


def _run_copies(copies: List[tuple], copier: str = "memmove") -> None:
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


def _snapshot(obj: Any, reuse: Any, copies: List[tuple]) -> Any:
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
        old = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(obj) else [None] * len(obj)
        items = [_snapshot(v, r, copies) for v, r in zip(obj, old)]
        if isinstance(obj, list):
            return items
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)  # a namedtuple stays one
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
    copies: List[tuple] = []
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

    __slots__ = ("manager", "state", "step", "world_size", "done", "info", "error", "like", "buffers")

    def __init__(self, manager: Optional[CheckpointManager], state: Any, step: int, world_size: int, done: Any,
                 like: Any = None):
        self.manager, self.state, self.step, self.world_size, self.done = manager, state, step, world_size, done
        self.like = like
        self.buffers: Any = None
        self.info: Optional[CheckpointInfo] = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        if self.manager is None:
            self.buffers = _allocate_like(self.like)
        else:
            self.info = self.manager.save(self.state, self.step, world_size=self.world_size)


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
        self._copy_cost: dict = {}  # copier -> recent seconds per byte of a snapshot into reused buffers
        self._snapshots = 0
        self.last: Optional[CheckpointInfo] = None
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
            self._worker = self._threading.Thread(target=_writer_loop, args=(self._jobs,),
                                                  name="checkpoint-writer", daemon=True)
            self._worker.start()

    def prepare(self, state: dict) -> None:
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

    def save(self, state: dict, step: int, world_size: int = 1) -> float:
        """Snapshot ``state`` and start writing it; returns the seconds the caller was blocked."""
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
