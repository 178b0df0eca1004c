"""Checkpoints in one directory and their manifests: ``CheckpointManager``, ``CheckpointInfo``.

Side effects: writes, renames and deletes files in the checkpoint directory (``save``, ``prune``);
logs skipped manifests and invalid checkpoints on the ``slurm_ddp.checkpoint`` logger. Imports
torch only inside ``save`` and ``load``: ``committed``/``verify``/``latest`` run on a login node
(``slurm_ddp.rundir`` reads the newest committed step with ``committed(quiet=True)``). This module
alone knows the manifest's file-name pattern and its fields.

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

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..errors import CheckpointError
from .durable import PathArg, atomic_write, atomic_write_text, sha256_file

log = logging.getLogger("slurm_ddp.checkpoint")
#: a manifest's file name: ``step-`` and the step, zero-padded to 8 digits or more
_NAME = re.compile(r"^step-(\d{8,})\.json$")


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

    def __init__(self, directory: PathArg, keep_last: int = 2, config_hash: str = ""):
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.config_hash = config_hash

    def _paths(self, step: int) -> Tuple[Path, Path]:
        stem = f"step-{step:08d}"
        return self.directory / f"{stem}.pt", self.directory / f"{stem}.json"

    def save(self, state: Dict[str, Any], step: int, world_size: int = 1) -> CheckpointInfo:
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
            log.warning(
                "checkpoint of step %d in %s is invalid (%s); falling back to an older one",
                info.step,
                self.directory,
                problem,
            )
        return None

    def load(self, info: Optional[CheckpointInfo] = None, map_location: Any = "cpu") -> Optional[Dict[str, Any]]:
        """Load ``info`` (default: ``latest()``) with ``torch.load(weights_only=True)``; None if none."""
        import torch

        info = info or self.latest()
        if info is None:
            return None
        try:
            state: Dict[str, Any] = torch.load(info.path, map_location=map_location, weights_only=True)
        except Exception as e:  # an unpickling error is data corruption, not a bug here
            raise CheckpointError(f"could not load checkpoint {info.path}: {e}") from e
        return state

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
