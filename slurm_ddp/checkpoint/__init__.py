"""Durable, atomic, verifiable checkpoints in one directory. Side effects: files (see each module).

Two modules, one job each, on the durable writes of ``slurm_ddp.durable`` (the bottom floor: atomic and
durable file writes, ``atomic_write``, ``atomic_write_text``, ``fsync_dir``, ``sha256_file``, and the one-writer
claim protocol ``write_once`` of a save after a lost peer; re-exported here for the checkpoint's users; the run
directory's markers and the backends import them from ``slurm_ddp.durable``):

- ``manager``: ``CheckpointManager`` and ``CheckpointInfo``: the commit protocol, the manifest
  (its file-name pattern and fields have no other owner), verification, retention and loading;
- ``async_writer``: ``snapshot_to_cpu`` and ``AsyncCheckpointer``, the background writer thread.

Importing this package imports no torch (torch is imported inside the functions that need it),
so a login node that renders, submits and watches runs can use it.
"""

from ..durable import _HashingWriter as _HashingWriter  # private; tests reach it here
from ..durable import atomic_write, atomic_write_text, fsync_dir, sha256_file, write_once
from .async_writer import COPIERS, AsyncCheckpointer, snapshot_to_cpu
from .manager import CheckpointInfo, CheckpointManager

__all__ = [
    "COPIERS",
    "AsyncCheckpointer",
    "CheckpointInfo",
    "CheckpointManager",
    "atomic_write",
    "atomic_write_text",
    "fsync_dir",
    "sha256_file",
    "snapshot_to_cpu",
    "write_once",
]
