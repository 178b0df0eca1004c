"""Durable, atomic file writes, torch-free, on the bottom floor (it imports nothing of slurm_ddp): the commit
primitives of a checkpoint (``slurm_ddp.checkpoint``), and of the run directory's files and markers.

Owns ``fsync_dir``, ``atomic_write`` (temporary file in the same directory, ``fsync``, ``rename``,
directory ``fsync``), ``atomic_write_text`` and ``sha256_file``, the ``_HashingWriter`` that
hashes and counts the bytes as they are written, and the one-writer claim protocol (``claim_file``,
``end_claim_file``, ``wait_claim_file``, ``write_once``) of a save that ranks which cannot agree
through a collective (a lost peer) must make once. Side effects: creates, renames, fsyncs and
deletes files; a large write starts two short-lived helper threads (``checkpoint-hash``,
``checkpoint-writeback``), joined before ``atomic_write`` returns. Imports no torch: the run
directory's markers (``slurm_ddp.rundir``), the code snapshot and the backends write with it on a login node.

Why each step (rename(2) is atomic; it is durable only once the directory entry is flushed; see
fsync(2) NOTES) is described in ``slurm_ddp.checkpoint.manager``, which builds the commit
protocol of a checkpoint on these functions.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional, Tuple, Union

#: a file or directory name: ``str`` or any ``os.PathLike``
PathArg = Union[str, "os.PathLike[str]"]
_CHUNK = 1 << 20


def fsync_dir(path: PathArg) -> None:
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
            piece = mv[off : off + (_PIECE if self.size >= _HEAD else _BIG)]
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
        self._hasher = threading.Thread(
            target=self._hash_loop, args=(self._fd, self.size), name="checkpoint-hash", daemon=True
        )
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

    def _hash_loop(self, fd: int, pos: int) -> None:
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
                        got = os.preadv(fd, [view[:want]], pos)
                        chunk: Any = view[:got]
                    else:
                        chunk = os.pread(fd, want, pos)
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


def current_umask() -> int:
    """This process's umask (``Umask:`` of /proc/self/status, Linux >= 4.7; else set and restored)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(
    path: PathArg,
    write: Callable[[Any], None],
    sync_dir: bool = True,
    *,
    private: bool = False,
    mode: Optional[int] = None,
) -> Tuple[int, str]:
    """Write a file atomically and durably: temp file, ``write(f)``, fsync, rename, fsync dir.

    Returns ``(size_bytes, sha256_hex)`` of what was written. On any error the temporary
    file is removed and the destination is untouched. ``sync_dir=False`` leaves the
    directory's fsync to the caller (one fsync can cover several renames in a directory).
    The file's mode is ``0o666`` less the umask, as ``open`` would give it; ``private=True``:
    ``0o600`` whatever the umask (a file that may hold a credential, ``slurm_ddp.secrets``); ``mode``: that
    mode whatever the umask (``slurm_ddp.rundir.private_modes``); either is set before anything is written.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # mode 0600
    try:
        os.fchmod(fd, mode if mode is not None else 0o600 if private else 0o666 & ~current_umask())
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


def atomic_write_text(path: PathArg, text: str, *, private: bool = False, mode: Optional[int] = None) -> None:
    """``atomic_write`` for a UTF-8 text file (``private``: mode ``0o600``; ``mode``: that mode)."""
    atomic_write(path, lambda f: f.write(text.encode()), private=private, mode=mode)


def sha256_file(path: PathArg) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


# --------------------------------------------------------------------------- one writer (a claim file)
def claim_file(path: PathArg) -> bool:
    """Claim the right to write alone: True for the first process (of every node sharing the directory)
    that creates ``path``, False for every later one or when it cannot be created. ``O_CREAT|O_EXCL``,
    which NFS v3+ and POSIX file systems keep atomic; missing parent directories are created. The
    claimant ends its claim with :func:`end_claim_file`; :func:`wait_claim_file` waits for that."""
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError:
        return False
    os.close(fd)
    return True


def end_claim_file(path: PathArg, outcome: str) -> None:
    """Record ``outcome`` (one line: ``committed`` or what failed) in the claim ``path``; best effort."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(outcome.replace("\n", " ") + "\n")
    except OSError:
        pass


def wait_claim_file(path: PathArg, timeout_s: float, poll_s: float = 0.1) -> Optional[str]:
    """The outcome the claimant of ``path`` recorded (:func:`end_claim_file`), waiting up to ``timeout_s``
    seconds (polling every ``poll_s``) for it; None when it recorded none by then (or there is no claim)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError:
            return None
        if text.endswith("\n"):
            return text.strip()
        if time.monotonic() >= deadline:
            return None
        time.sleep(poll_s)


def write_once(path: PathArg, write: Callable[[], object], timeout_s: float) -> Tuple[bool, Optional[str]]:
    """THE one-writer protocol: the first caller to claim ``path`` (:func:`claim_file`) runs ``write()`` and
    records its outcome (``committed``, or ``failed: ERROR`` and then re-raises what ``write`` raised);
    every later caller waits up to ``timeout_s`` seconds for that outcome. Returns ``(True, "committed")``
    for the writer, ``(False, outcome)`` for the others (outcome None: no answer in time, or no claim
    could be made). The shared worker's emergency checkpoint (``CheckpointManager.write_once``, a claim per
    step) and a script's survivor save (``slurm_ddp.preemption.exit_if_peer_lost``) both use it."""
    if not claim_file(path):
        return False, wait_claim_file(path, timeout_s)
    try:
        write()
    except BaseException as e:
        end_claim_file(path, f"failed: {e}")
        raise
    end_claim_file(path, "committed")
    return True, "committed"
