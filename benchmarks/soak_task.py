"""The digits task with handshake hooks for ``preemption_soak.py`` (inert unless armed).

When the environment has ``SOAK_HOOK_DIR`` (the soak harness sets it for the submits of the run it
interrupts, not in the config, so the interrupted and the reference run share one config), this
module, imported by the worker, installs two pause points that the harness arms by writing the file
``SOAK_HOOK_DIR/arm``:

- ``ckpt K``: the next ``CheckpointManager.save`` (rank 0; a periodic save runs on the async writer's
  thread) pauses right after its K-th ``os.fsync``/``os.replace``/``os.unlink`` (K = 0: on entry), so an
  interruption lands at a chosen point of the commit protocol (data file, manifest, pruning);
- ``eval``: the first ``eval_sums`` call of the next evaluation (any rank) pauses.

A pause writes ``SOAK_HOOK_DIR/ready`` and waits until the harness writes ``SOAK_HOOK_DIR/go`` (after it
sent its signal or kill), at most ``PAUSE_LIMIT_S``. Whoever pauses first consumes the arm file
(an atomic rename), so one arming pauses one process once.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from digits_task import DigitsTask  # examples/digits, on train.pythonpath

PAUSE_LIMIT_S = 120.0
HOOK_DIR: Optional[Path] = Path(os.environ["SOAK_HOOK_DIR"]) if os.environ.get("SOAK_HOOK_DIR") else None
_tls = threading.local()


def _take_arm(kind: str) -> Optional[str]:
    """The arm file's text if it asks for ``kind``, consuming it; else None (cheap: one stat)."""
    assert HOOK_DIR is not None
    arm = HOOK_DIR / "arm"
    try:
        text = arm.read_text().strip()
    except OSError:
        return None
    if not text.startswith(kind):
        return None
    try:
        os.rename(arm, HOOK_DIR / f"taken-{os.getpid()}")
    except OSError:
        return None  # another process or thread took it
    return text


def _pause(what: str) -> None:
    assert HOOK_DIR is not None
    (HOOK_DIR / "ready.tmp").write_text(f"{what} pid {os.getpid()}\n")
    os.rename(HOOK_DIR / "ready.tmp", HOOK_DIR / "ready")
    deadline = time.monotonic() + PAUSE_LIMIT_S
    while not (HOOK_DIR / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.005)


def _install() -> None:
    from slurm_ddp.checkpoint import manager

    original_save = manager.CheckpointManager.save

    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        armed = _take_arm("ckpt")
        _tls.pause_at = int(armed.split()[1]) if armed else None
        _tls.calls = 0
        if _tls.pause_at == 0:
            _pause("checkpoint save, on entry")
        try:
            return original_save(self, *args, **kwargs)
        finally:
            _tls.pause_at = None

    manager.CheckpointManager.save = save  # type: ignore[method-assign]

    def counted(name: str) -> None:
        original = getattr(os, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if getattr(_tls, "pause_at", None):
                _tls.calls += 1
                if _tls.calls == _tls.pause_at:
                    _pause(f"checkpoint save, after call {_tls.calls} ({name})")
            return result

        setattr(os, name, wrapper)

    for name in ("fsync", "replace", "unlink"):
        counted(name)


if HOOK_DIR is not None:
    _install()


class SoakTask(DigitsTask):
    """``DigitsTask`` whose evaluation can be paused (see the module docstring).

    ``train.args.step_sleep_s`` (seconds, default 0): each training step (its loss, once per
    micro-batch) also sleeps that long, so a benchmark (``goodput.py``) can give the tiny digits step a
    realistic length without using CPU (a sleep, not work: steps keep their length on a busy machine).
    """

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pause = float(self.args.get("step_sleep_s", 0) or 0)
        if pause > 0:
            time.sleep(pause)
        return super().loss(outputs, targets)

    def eval_sums(self, outputs: torch.Tensor, targets: torch.Tensor) -> Dict[str, torch.Tensor]:
        if HOOK_DIR is not None and _take_arm("eval"):
            _pause("evaluation")
        return super().eval_sums(outputs, targets)
