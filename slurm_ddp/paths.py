"""Checks that a path slurm_ddp will write to can be written, before anything is written.

Side effects: a probe creates and at once removes one empty temporary directory (or file) in
the directory that will be written; nothing stays behind. Imports no torch.

Permission bits cannot answer this for root (root ignores them, but not a read-only mount, nor
``/proc`` or ``/sys``), so each check really tries. Raises ``UserError`` with one line that names
the option, the path and the reason.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union

from .errors import UserError

_PROBE_PREFIX = ".slurm-ddp-write-probe-"


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def check_dir_writable(path: Union[str, os.PathLike[str]], what: str) -> None:
    """``path`` is a directory this process can write, or one it can create (parents included).

    ``what`` names the option in the message (``"--run-dir"``). Raises ``UserError``.
    """
    p = Path(os.path.abspath(path))
    if p.exists() and not p.is_dir():
        raise UserError(f"{what} {str(p)!r} exists and is not a directory; choose another path")
    base = _nearest_existing(p)
    if not base.is_dir():
        raise UserError(
            f"{what} {str(p)!r} cannot be created: {str(base)!r} is a file, not a directory; choose another path"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=_PROBE_PREFIX, dir=base))
    except OSError as e:
        verb = "is not writable" if base == p else "cannot be created"
        where = "" if base == p else f" (in {str(base)!r})"
        raise UserError(f"{what} {str(p)!r} {verb}{where}: {_reason(e)}; choose another path") from None


def check_file_writable(path: Union[str, os.PathLike[str]], what: str) -> None:
    """``path`` is a file this process can (over)write: its directory is writable and it is not
    a directory. Raises ``UserError``."""
    p = Path(os.path.abspath(path))
    if p.is_dir():
        raise UserError(f"{what} {str(p)!r} is a directory; give a file path")
    if p.exists() and not os.access(p, os.W_OK):
        raise UserError(f"{what} {str(p)!r} is not writable; choose another path")
    check_dir_writable(p.parent, f"the directory of {what}")
