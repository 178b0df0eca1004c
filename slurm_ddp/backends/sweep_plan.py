"""A planned sweep (``SweepPlan``) and the sweep directory every backend writes (``prepare_sweep_dir``).

Shared by the sweep backends: ``array`` (``plan_sweep``; ``sbatch --array`` and the local backend)
and ``submitit_sweep`` (one submitit job array). The directory layout's names are
``slurm_ddp.rundir``'s.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

from ..checkpoint import atomic_write_text
from ..config import dump_config
from ..errors import UserError
from ..provenance import record_submit
from ..render import RenderedJob
from ..rundir import (
    ARRAY_SCRIPT_NAME,
    CHECKPOINTS_DIR,
    CONFIG_NAME,
    LOGS_DIR,
    SNAPSHOTS_DIR,
    element_dir_name,
    is_finished,
    private_dir,
    write_sweep_manifest,
)
from ..secrets import redact_argv
from ..snapshot import SnapshotPlan, take, write_record
from ..sweep import Sweep, SweepElement
from ..tracking import prepare_sweep


@dataclass(frozen=True)
class SweepPlan:
    """What ``submit`` does with a sweep; ``describe()`` is what ``submit --dry-run`` prints (a submitit
    sweep's plan is ``submitit_sweep.SubmititSweepPlan``, which describes its job array)."""

    sweep: Sweep
    backend: str
    sweep_dir: str
    rendered: RenderedJob  #: the array script (all elements)
    todo: Tuple[int, ...]  #: indices of the elements to run (not finished)
    resuming: bool  #: the sweep directory already holds this sweep
    command: Tuple[str, ...]  #: the sbatch argv (informative for local)
    #: the sweep's one code snapshot (``SWEEP_DIR/code/<digest>``; None: train.snapshot is off)
    snapshot: Optional[SnapshotPlan] = None
    warnings: Tuple[str, ...] = ()  #: lines ``submit`` prints before it schedules (e.g. new code accepted)
    accept_new_code: bool = False  #: ``--accept-new-code`` (the local backend checks each element again)
    submit_argv: Tuple[str, ...] = ()  #: the submit command, for the sweep's ``provenance.json``

    def element_dir(self, index: int) -> str:
        return os.path.join(self.sweep_dir, element_dir_name(index, len(self.sweep.elements)))

    def array_task_ids(self) -> Tuple[int, ...]:
        """The ``SLURM_ARRAY_TASK_ID`` values this submit's job array has: ``sbatch --array`` numbers
        the tasks by element (task id = element index, of the unfinished elements ``todo``); a
        submitit sweep's plan numbers them 0..K-1. What ``sweep.check_array_size`` checks."""
        return self.todo

    @property
    def script_path(self) -> str:
        return os.path.join(self.sweep_dir, ARRAY_SCRIPT_NAME)

    def describe(self) -> str:
        n = len(self.sweep.elements)
        head = [
            f"# backend: {self.backend}",
            f"# sweep directory: {self.sweep_dir}"
            + (" (exists: resumes its unfinished elements)" if self.resuming else ""),
            f"# elements: {n}, to run: {len(self.todo)}"
            + (f", at most {self.sweep.parallelism} at once" if self.sweep.parallelism else ""),
            f"# command: {shlex.join(self.command)}",
            *([self.snapshot.describe()] if self.snapshot is not None else ["# code snapshot: off"]),
            f"# script ({self.script_path}):",
        ]
        return "\n".join(head) + "\n" + self.rendered.shown


def prepare_sweep_dir(plan: SweepPlan) -> Path:
    """Write the sweep directory: ``sweep.json``, the array script, the code snapshot (once:
    ``code/<digest>``, ``snapshot.json``), and per element a run directory with its
    ``config.yaml``, ``logs/``, ``checkpoints/`` and a ``snapshot.json`` naming the sweep's snapshot
    (read by the ranks on every start, requeues included); then the submit's provenance record in the
    sweep directory (``provenance.record_submit``: command, versions, git state, snapshot digest).
    Raises ``UserError`` (one line) when the directory cannot be written (disk full, permissions)."""
    sd = Path(plan.sweep_dir)
    try:
        sd.mkdir(parents=True, exist_ok=True)
        if plan.snapshot is not None:
            private_dir(sd / SNAPSHOTS_DIR)  # the snapshot holds the job's YAML (rundir.PRIVATE_DIRS)
            take(plan.snapshot)
        for e in plan.sweep.elements:
            _prepare_element(plan, e)
        manifest = plan.sweep.manifest()
        manifest["sweep_hash"] = plan.sweep.sweep_hash()
        manifest["dirs"] = [element_dir_name(e.index, len(plan.sweep.elements)) for e in plan.sweep.elements]
        write_sweep_manifest(sd, manifest)
        atomic_write_text(sd / ARRAY_SCRIPT_NAME, plan.rendered.script, private=True)
        os.chmod(sd / ARRAY_SCRIPT_NAME, 0o700)  # owner-only: it may export an environment.env value
    except OSError as e:  # checked in plan_sweep; the disk can still fill up or change in between
        raise UserError(f"cannot write the sweep directory {str(sd)!r}: {e}; choose another --run-dir") from None
    env = {k: v for e in plan.sweep.elements for k, v in e.cfg.environment.env.items()}
    record_submit(
        plan.sweep_dir,
        argv=redact_argv(plan.submit_argv, env),
        backend=plan.backend,
        script=plan.rendered.script,
        snapshot_digest=plan.snapshot.digest if plan.snapshot is not None else None,
        git_roots=plan.snapshot.git_roots if plan.snapshot is not None else (),
    )
    # one tracker run per element, grouped by the sweep (tracking: on)
    prepare_sweep(sd, plan.sweep.name, [(e.cfg, plan.element_dir(e.index)) for e in plan.sweep.elements])
    return sd


def _prepare_element(plan: SweepPlan, e: SweepElement) -> None:
    rd = Path(plan.element_dir(e.index))
    (rd / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    (rd / CHECKPOINTS_DIR).mkdir(exist_ok=True)
    target = rd / CONFIG_NAME
    text = dump_config(e.cfg)
    # new, left by a submit that never submitted (a stale config binds nothing: _check_sweep_dir),
    # or a resume on another world size (check_run_dir allowed only config.RESIZABLE_KEYS to differ)
    if not target.exists() or target.read_text(encoding="utf-8", errors="replace") != text:
        # atomic (rename) but not fsynced: a thousand fsyncs would make submit take tens of seconds;
        # a config lost to a power cut is rewritten by submitting the sweep again
        tmp = rd / f".{CONFIG_NAME}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # owner-only whatever the umask (rundir.PRIVATE_FILES)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    if plan.snapshot is not None and not is_finished(rd):  # a finished element keeps the code it ran
        write_record(plan.snapshot, str(rd), fsync=False)
