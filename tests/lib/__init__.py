"""The test suite's shared helpers: one way to wait, one way to skip.

Importable as ``lib`` from every test (``pythonpath = ["tests"]`` in pyproject.toml's pytest
section puts ``tests/`` on ``sys.path``)::

    from lib import require_module, missing_prerequisite, wait_for

- ``wait_for(pred, timeout_s, what, diag=..., interval_s=...)``: poll until ``pred()`` is truthy and
  return its value; at the deadline raise ``AssertionError`` naming ``what`` and ``diag()``. The
  deadline is a safety net against a hang, never an assertion on speed: give it generous room
  (the suite must pass with the CPUs busy). It is :func:`slurm_ddp.testing.wait_for`, the one
  implementation, which users of the pytest plugin share.
- ``missing_prerequisite(reason)``: skip, or fail when ``SLURM_DDP_REQUIRE_SLURM=1`` (CI, where
  ``.ci/run`` installs every prerequisite and no tier may be skipped silently).
- ``require_module(name)``, ``require_executable(*names)``, ``require_library(kind)``: the same rule for an
  importable module (instead of ``pytest.importorskip``), a program on ``PATH`` and a library the binding
  preloads (``jemalloc``, ``tcmalloc``, ``iomp5``; ``HIDE_LIBRARIES_ENV`` plays a machine without it).
- ``wait_process(proc, pred, timeout_s, what)``: ``wait_for`` that fails at once, with the
  process's output, when ``proc`` exits first.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
from types import ModuleType
from typing import Any, Callable, TypeVar, cast

from slurm_ddp.testing import missing_prerequisite, wait_for

__all__ = [
    "HIDE_LIBRARIES_ENV",
    "missing_prerequisite",
    "require_executable",
    "require_library",
    "require_module",
    "wait_for",
    "wait_process",
]

T = TypeVar("T")


def require_module(name: str, why: str = "") -> ModuleType:
    """Import and return module ``name``; if it is not installed, ``missing_prerequisite``.

    ``why``: what needs it, added to the reason. Usable at module level.
    """
    __tracebackhide__ = True
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        missing_prerequisite(f"{name} is not installed ({e})" + (f": {why}" if why else ""))


def require_executable(*names: str, why: str = "") -> str:
    """The path of the first of ``names`` on ``PATH``; if none is, ``missing_prerequisite``."""
    __tracebackhide__ = True
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    missing_prerequisite(f"none of {', '.join(names)} is on PATH" + (f": {why}" if why else ""))


#: Test-only: comma-separated library kinds ``require_library`` treats as missing although installed, so
#: that a machine with them can check the suite passes on one without them (``.ci/run`` does).
HIDE_LIBRARIES_ENV = "SLURM_DDP_TEST_HIDE_LIBRARIES"


def require_library(kind: str, why: str = "") -> str:
    """The path of the library ``kind`` as the binding finds it (``slurm_ddp.binding.locate_libraries``:
    ``ldconfig -p``, then the usual directories); if it is not installed, ``missing_prerequisite`` with
    the binding's own message (it names the package to install)."""
    __tracebackhide__ = True
    from slurm_ddp.binding import locate_libraries, missing_library_message
    from slurm_ddp.errors import BindingError

    hidden = {k.strip() for k in os.environ.get(HIDE_LIBRARIES_ENV, "").split(",")}
    try:
        if kind in hidden:
            raise BindingError(f"{missing_library_message(kind)} [hidden by {HIDE_LIBRARIES_ENV}]")
        return locate_libraries([kind], os.environ)[kind]
    except BindingError as e:
        missing_prerequisite(f"{e}" + (f": {why}" if why else ""))


def wait_process(
    proc: subprocess.Popen[Any],
    pred: Callable[[], T],
    timeout_s: float,
    what: str,
    diag: Callable[[], str] | None = None,
    interval_s: float = 0.05,
) -> T:
    """``wait_for(pred)``, but fail at once if ``proc`` exits before ``pred()`` holds.

    The error names ``what``, the exit status and ``diag()`` (default: nothing more; a caller whose
    process writes to a pipe passes a ``diag`` that reads it once the process is gone).
    """

    def ready() -> T | None:
        value = pred()
        if value:
            return value
        if proc.poll() is not None:
            value = pred()  # it may have written the awaited record just before exiting
            if value:
                return value
            extra = diag() if diag is not None else ""
            raise AssertionError(f"process exited with status {proc.returncode} while waiting for {what}\n{extra}")
        return None

    return cast(T, wait_for(ready, timeout_s, what, diag or (lambda: ""), interval_s=interval_s))
