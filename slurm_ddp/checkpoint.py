"""Durable, atomic, verifiable checkpoints in one directory. Side effects: files.

A checkpoint is two files: ``step-00000120.pt`` (``torch.save`` of a dict) and
``step-00000120.json``, its manifest (step, world size, config hash, byte size, sha256).
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

import hashlib
import json
import logging
import os
import re
import tempfile
import time
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


class _HashingWriter:
    """File-like wrapper that hashes and counts what passes through ``write``."""

    def __init__(self, f: Any):
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        mv = memoryview(data)
        self.sha256.update(mv)
        self.size += mv.nbytes
        return self._f.write(mv)

    def flush(self) -> None:
        self._f.flush()


def atomic_write(path: Union[str, os.PathLike], write: Callable[[Any], None]) -> tuple:
    """Write a file atomically and durably: temp file, ``write(f)``, fsync, rename, fsync dir.

    Returns ``(size_bytes, sha256_hex)`` of what was written. On any error the temporary
    file is removed and the destination is untouched.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            hw = _HashingWriter(f)
            write(hw)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
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
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            size, digest = atomic_write(data_path, lambda f: torch.save(state, f))
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
        self.prune(newest_valid=info)
        return info

    def _read_manifest(self, manifest: Path) -> Optional[CheckpointInfo]:
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
            log.warning("skipping checkpoint manifest %s: unreadable (%s)", manifest, e)
            return None

    def committed(self) -> List[CheckpointInfo]:
        """Checkpoints whose manifest exists and parses, oldest first (not yet verified)."""
        if not self.directory.is_dir():
            return []
        infos = []
        for p in self.directory.iterdir():
            if _NAME.match(p.name):
                info = self._read_manifest(p)
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
            if time.time() - p.stat().st_mtime > 60:
                p.unlink(missing_ok=True)


def snapshot_to_cpu(obj: Any) -> Any:
    """A copy of a (nested dict/list/tuple) state whose tensors are fresh CPU copies.

    Training may go on mutating the live tensors while the snapshot is written.
    """
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: snapshot_to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot_to_cpu(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot_to_cpu(v) for v in obj)
    return obj


class AsyncCheckpointer:
    """Background checkpoint writes on rank 0: snapshot to CPU memory, write in a thread.

    At most one write is in flight: ``save`` first waits for the previous one. An error
    in the writer is raised (as ``CheckpointError``) by the next ``save``, ``check`` or
    ``wait`` in the training loop, never lost. ``wait()`` flushes the pending write — call
    it before a preemption save and before exiting.
    """

    def __init__(self, manager: CheckpointManager):
        import threading

        self.manager = manager
        self._threading = threading
        self._thread: Optional[Any] = None
        self._error: Optional[BaseException] = None
        self.last: Optional[CheckpointInfo] = None

    def _write(self, state: dict, step: int, world_size: int) -> None:
        try:
            self.last = self.manager.save(state, step, world_size=world_size)
        except BaseException as e:  # surfaced in the main loop by check()/wait()
            self._error = e

    def save(self, state: dict, step: int, world_size: int = 1) -> float:
        """Snapshot ``state`` and start writing it; returns the seconds the caller was blocked."""
        t0 = time.perf_counter()
        self.wait()
        snapshot = snapshot_to_cpu(state)
        self._thread = self._threading.Thread(
            target=self._write, args=(snapshot, step, world_size), name=f"checkpoint-{step}", daemon=True
        )
        self._thread.start()
        return time.perf_counter() - t0

    @property
    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def check(self) -> None:
        """Raise the writer's error, if it failed, without waiting."""
        if self._error is not None:
            err, self._error = self._error, None
            if isinstance(err, CheckpointError):
                raise err
            raise CheckpointError(f"background checkpoint write failed: {err}") from err

    def wait(self) -> Optional[CheckpointInfo]:
        """Block until the pending write is committed; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.check()
        return self.last
