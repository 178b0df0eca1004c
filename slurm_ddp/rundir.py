"""The run directory's one owner: its file names, markers, JSON-lines records and the requeue rule.

Side effects: reads and writes files of a run directory; imports no torch (a login node that
only renders, submits and watches uses it). Every other module, the batch template included,
asks this one for a name or a rule instead of spelling it again.

A run directory holds:

- ``config.yaml``: the validated job config, as submitted (``CONFIG_NAME``);
- ``job.sbatch``: the rendered batch script (``SCRIPT_NAME``);
- ``jobs.jsonl``: one ``{"backend", "job_id", "time", ...}`` per submission (``JOBS_NAME``);
- ``metrics.jsonl``: rank 0's events ``train``/``eval``/``checkpoint``/``preempted``/``resume``/
  ``finished``, one JSON object per line (``METRICS_NAME``);
- ``logs/``: ``rank-N.log`` per rank and ``batch-JOBID.out`` of the batch shell (``LOGS_DIR``);
- ``checkpoints/``: ``step-NNNNNNNN.{pt,json}`` (data and manifest, see ``slurm_ddp.checkpoint``);
- the markers ``FINISHED`` (JSON: step, world size, final eval) and ``PREEMPTED``
  (one line ``"JOB_ID RESTART_COUNT STEP SIGNAL"``: the last stop for preemption);
- ``launcher.lock``: held (``flock``) by a running local launcher, holding its pid.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

PathLike = Union[str, "os.PathLike[str]"]

CONFIG_NAME = "config.yaml"
SCRIPT_NAME = "job.sbatch"
JOBS_NAME = "jobs.jsonl"
METRICS_NAME = "metrics.jsonl"
FINISHED_NAME = "FINISHED"
PREEMPTED_NAME = "PREEMPTED"
FINAL_MODEL_NAME = "final_model.pt"
#: held (flock) by a running ``submit --backend local`` launcher; holds its pid
LAUNCHER_LOCK_NAME = "launcher.lock"
LOGS_DIR = "logs"
CHECKPOINTS_DIR = "checkpoints"
DEFAULT_RUNS_DIR = "runs"


# --------------------------------------------------------------------------- JSON lines
def append_jsonl(path: PathLike, record: Dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path`` (created when missing).

    One ``write`` of a whole line in append mode, so concurrent readers see whole lines or an
    unfinished last line, which :func:`read_jsonl` skips. Raises ``OSError`` when unwritable.
    """
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def end_partial_line(path: PathLike) -> None:
    """Terminate a last line that a killed writer left without its newline (no-op otherwise)."""
    p = Path(path)
    if p.exists() and p.stat().st_size:
        with open(p, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


def read_jsonl(path: PathLike) -> List[Dict[str, Any]]:
    """JSON objects, one per line, in order; a line being written (or damaged) is skipped.

    A missing or unreadable file is an empty list.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


def record_job(run_dir: PathLike, **record: Any) -> None:
    """Append one submission to ``RUN_DIR/jobs.jsonl`` (backend, job id; ``time`` added)."""
    record.setdefault("time", time.time())
    append_jsonl(Path(run_dir) / JOBS_NAME, record)


def read_jobs(run_dir: PathLike) -> List[Dict[str, Any]]:
    """The submissions recorded in ``RUN_DIR/jobs.jsonl``, oldest first."""
    return read_jsonl(Path(run_dir) / JOBS_NAME)


def read_metrics(run_dir: PathLike) -> List[Dict[str, Any]]:
    """``RUN_DIR/metrics.jsonl`` as a list of events (incomplete lines skipped)."""
    return read_jsonl(Path(run_dir) / METRICS_NAME)


# --------------------------------------------------------------------------- markers
@dataclass(frozen=True)
class Preempted:
    """The ``PREEMPTED`` marker: the last stop for preemption of the run."""

    job_id: str
    restart: int  #: SLURM_RESTART_COUNT of the job that stopped
    step: int  #: the step whose checkpoint was committed before stopping
    signal: str  #: e.g. ``SIGUSR2``, ``SIGTERM``

    def line(self) -> str:
        """The marker's one line, ``"JOB_ID RESTART_COUNT STEP SIGNAL\\n"`` (the batch script reads it)."""
        return f"{self.job_id} {self.restart} {self.step} {self.signal}\n"


def read_preempted(run_dir: PathLike) -> Optional[Preempted]:
    """The ``PREEMPTED`` marker of ``run_dir``; None when missing or malformed."""
    try:
        parts = (Path(run_dir) / PREEMPTED_NAME).read_text().split()
        return Preempted(job_id=parts[0], restart=int(parts[1]), step=int(parts[2]), signal=parts[3])
    except (OSError, IndexError, ValueError):
        return None


def write_preempted(run_dir: PathLike, marker: Preempted) -> None:
    """Write the ``PREEMPTED`` marker atomically (rank 0, after the checkpoint is committed)."""
    from .checkpoint import atomic_write_text

    atomic_write_text(Path(run_dir) / PREEMPTED_NAME, marker.line())


def is_finished(run_dir: PathLike) -> bool:
    """True when the run wrote its ``FINISHED`` marker (it never trains again)."""
    return (Path(run_dir) / FINISHED_NAME).exists()


def read_finished(run_dir: PathLike) -> Optional[Dict[str, Any]]:
    """The ``FINISHED`` record; None when the run has not finished, ``{}`` when it is unreadable."""
    p = Path(run_dir) / FINISHED_NAME
    if not p.exists():
        return None
    try:
        rec = json.loads(p.read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def write_finished(run_dir: PathLike, record: Dict[str, Any]) -> None:
    """Write the ``FINISHED`` marker (JSON) atomically; rank 0 only, after the final checkpoint."""
    from .checkpoint import atomic_write_text

    atomic_write_text(Path(run_dir) / FINISHED_NAME, json.dumps(record) + "\n")


# --------------------------------------------------------------------------- checkpoints
def checkpoint_dir(run_dir: PathLike) -> Path:
    """``RUN_DIR/checkpoints``: where the worker's ``CheckpointManager`` keeps its files."""
    return Path(run_dir) / CHECKPOINTS_DIR


def latest_checkpoint_step(run_dir: PathLike) -> Optional[int]:
    """Step of the newest committed checkpoint of the run: its manifest parses and its data
    file has the recorded size (the sha256 is checked by the worker when it loads, not here)."""
    from .checkpoint import CheckpointManager

    for info in reversed(CheckpointManager(checkpoint_dir(run_dir)).committed(quiet=True)):
        try:
            if info.path.stat().st_size == info.size_bytes:
                return info.step
        except OSError:
            continue
    return None
