"""Submission backends: ``sbatch``, ``submitit`` and ``local``. Side effects: files, processes.

Every submission is ``plan_submit()`` (pure apart from reading an existing run directory's
config: what would be submitted, printable with ``--dry-run``) then the backend's
``schedule(plan)``, which writes the run directory and starts the job.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Tuple

from .. import container
from ..config import JobConfig, command_argv, config_from_dict, dump_config, read_yaml
from ..durable import current_umask
from ..errors import ConfigError, UserError
from ..paths import check_dir_writable
from ..render import RenderedJob, render
from ..rundir import (
    CHECKPOINTS_DIR,
    CONFIG_NAME,
    DEFAULT_RUNS_DIR,
    LOGS_DIR,
    SCRIPT_NAME,
    SNAPSHOTS_DIR,
    apply_private_modes,
    private_dir,
    run_dir_mode_warning,
    was_accepted,
    write_private_text,
)
from ..rundir.provenance import record_submit
from ..secrets import check_pass_env, literal_warning, redact_argv
from ..snapshot import SnapshotPlan, check_resubmit, plan_snapshot, remap_config, take, write_record
from ..tracking import check_installed, prepare_run

BACKENDS = ("sbatch", "submitit", "local")


def default_run_dir(cfg: JobConfig, base: str = DEFAULT_RUNS_DIR) -> str:
    """``./runs/<name>`` with the name reduced to safe path characters."""
    return os.path.abspath(os.path.join(base, re.sub(r"[^A-Za-z0-9_.+-]", "_", cfg.name)))


@dataclass(frozen=True)
class SubmitPlan:
    """Everything a backend needs; ``describe()`` is what ``submit --dry-run`` prints."""

    cfg: JobConfig
    backend: str
    run_dir: str
    rendered: RenderedJob
    command: Tuple[str, ...]  #: what schedule() runs (sbatch argv; informative for local/submitit)
    resuming: bool = False  #: the run directory already holds this config's run
    snapshot: Optional[SnapshotPlan] = None  #: the code snapshot (None: train.snapshot is off)
    warnings: Tuple[str, ...] = ()  #: lines ``submit`` prints before it schedules (e.g. new code accepted)
    submit_argv: Tuple[str, ...] = ()  #: the submit command, for ``provenance.json``
    #: what memory the job will get (``ops.memory.memory_line``); set by ``submit`` for a Slurm backend
    memory: str = ""

    @property
    def ranks_cfg(self) -> JobConfig:
        """``cfg`` with the ranks' paths in the code snapshot (what the backends start); ``cfg`` itself
        is what ``config.yaml`` keeps (and what a resubmit is compared with)."""
        return remap_config(self.cfg, self.snapshot)

    @property
    def script_path(self) -> str:
        return os.path.join(self.run_dir, SCRIPT_NAME)

    def existing_words(self) -> str:
        """`` (exists: the next start resumes from …)`` for a run directory that already holds this run: what
        its next start trains from (``ops.runs.Run.next_start``, the rule of ``rundir.next_start``), so that
        "resumes" is said only where a checkpoint will be used; "" for a new run directory."""
        if not self.resuming:
            return ""
        from ..ops.runs import read_run

        return f" (exists: {read_run(Path(self.run_dir)).next_start().words})"

    def describe(self) -> str:
        head = [
            f"# backend: {self.backend}",
            f"# run directory: {self.run_dir}" + self.existing_words(),
            f"# command: {shlex.join(self.command)}",
            *([f"# {self.memory}"] if self.memory else []),
            *([self.snapshot.describe()] if self.snapshot is not None else ["# code snapshot: off"]),
            f"# script ({self.script_path}):",
        ]
        return "\n".join(head) + "\n" + self.rendered.printed


def check_run_dir(cfg: JobConfig, run_dir: str) -> bool:
    """True when ``run_dir`` holds a run of this same config (a resume), False when new: also when
    no job of it was ever accepted (``rundir.was_accepted``: a submit sbatch refused binds nothing).

    Raises ``UserError`` when it belongs to a different config.
    """
    existing = Path(run_dir) / CONFIG_NAME
    check_dir_writable(run_dir, "--run-dir")  # /proc/x, a read-only mount, a file in the way
    for sub in (LOGS_DIR, CHECKPOINTS_DIR):
        if (Path(run_dir) / sub).exists() and not (Path(run_dir) / sub).is_dir():
            raise UserError(f"--run-dir {run_dir!r}: {sub!r} in it is not a directory; move it away or use another")
    if not existing.exists() or not was_accepted(run_dir):
        return False
    try:
        old = config_from_dict(read_yaml(existing))
    except ConfigError as e:
        raise UserError(
            f"run directory {run_dir!r} holds an unreadable {CONFIG_NAME} ({e}); choose another --run-dir"
        ) from None
    if old.training_hash() == cfg.training_hash():
        return True  # the same run, maybe on another world size (config.RESIZABLE_KEYS): resumed exactly
    if old.config_hash() != cfg.config_hash():
        changed = _changed_keys(old.to_dict(), cfg.to_dict())
        raise UserError(
            f"run directory {run_dir!r} belongs to a different config (changed: {', '.join(changed) or '?'}); "
            "resuming it would mix two runs. Use another --run-dir, or restore those values to resume"
        )
    return True


def _changed_keys(a: Any, b: Any, prefix: str = "") -> List[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: List[str] = []
        for k in sorted(set(a) | set(b)):
            out += _changed_keys(a.get(k), b.get(k), f"{prefix}.{k}" if prefix else k)
        return out
    return [] if a == b else [prefix]


def plan_script(
    cfg: JobConfig,
    run_dir: str,
    *,
    command: Optional[Sequence[str]] = None,
    python: Optional[str] = None,
    in_sweep: bool = False,
    sweep_snapshot: Optional[SnapshotPlan] = None,
) -> Tuple[Optional[SnapshotPlan], RenderedJob]:
    """The code snapshot of ``cfg`` for ``run_dir`` and the batch script whose ranks run from it:
    what ``render`` prints and what ``submit`` (``plan_submit``) writes, so the two cannot differ.

    Reads the checkout (``snapshot.plan_snapshot``: ``git``, file contents for the digest); writes
    nothing and does not look at ``run_dir`` (``render --run-dir`` may name a cluster path). The
    ranks' code paths point into the snapshot (``snapshot.remap_config``); the header's config hash
    is ``cfg``'s. ``in_sweep``: an element of a sweep, whose code is the sweep's one snapshot
    (``sweep_snapshot``, None when it is off), not a snapshot of its own. Raises ``UserError`` when
    the code cannot be snapshotted.
    """
    run_dir = os.path.abspath(run_dir)
    snap = sweep_snapshot if in_sweep else plan_snapshot(cfg, run_dir)
    rendered = render(remap_config(cfg, snap), run_dir, command=command, python=python, config_hash=cfg.config_hash())
    return snap, rendered


def plan_submit(
    cfg: JobConfig,
    backend: str,
    run_dir: Optional[str] = None,
    *,
    command: Optional[Sequence[str]] = None,
    python: Optional[str] = None,
    accept_new_code: bool = False,
    sweep_snapshot: Optional[SnapshotPlan] = None,
    in_sweep: bool = False,
    dependency: str = "",
) -> SubmitPlan:
    """Build the dry-run object for ``backend``. Raises ``UserError`` for a bad backend or run dir,
    for code that cannot be snapshotted, and for a run directory whose code snapshot differs from
    the code now (unless ``accept_new_code``; see ``slurm_ddp.snapshot``).

    ``in_sweep``: ``run_dir`` is an element of a sweep whose one snapshot is ``sweep_snapshot``
    (None: off), taken and checked by the sweep (``backends.array``); none of its own is planned.
    ``dependency``: sbatch's ``--dependency`` value (``backends.after``), on the command line, not in
    the script (a requeue of the job keeps it; a resubmit states its own)."""
    if backend not in BACKENDS:
        raise UserError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "submitit" and cfg.slurm.min_nodes != cfg.slurm.max_nodes:
        raise UserError(
            f"slurm.nodes={cfg.slurm.nodes}: a node range needs --backend sbatch (submitit counts its tasks "
            "from one node count); give one count for submitit"
        )
    if backend == "submitit" and cfg.in_job_recovery:
        raise UserError(
            "recovery (spare_nodes/min_nodes): in-job recovery needs --backend sbatch (its batch script starts "
            "the next training step); leave recovery.spare_nodes at 0 and recovery.min_nodes unset for submitit"
        )
    check_pass_env(cfg.environment.pass_env, os.environ)
    check_installed(cfg)  # tracking's packages, at submit rather than on the nodes
    run_dir = os.path.abspath(run_dir or default_run_dir(cfg))
    resuming = check_run_dir(cfg, run_dir)
    snap, rendered = plan_script(
        cfg, run_dir, command=command, python=python, in_sweep=in_sweep, sweep_snapshot=sweep_snapshot
    )
    warnings = secret_warnings(cfg.environment.env, snap, cfg.environment.run_dir_mode) + (
        snap.notes if snap is not None else ()
    )
    if cfg.environment.container.runtime != "none":
        if backend == "submitit":
            raise UserError(
                "environment.container runs the ranks in a container with --backend sbatch or local only (submitit "
                "does not wrap them yet); use --backend sbatch, or leave environment.container out"
            )
        box = container.plan(remap_config(cfg, snap), run_dir)
        if backend == "local" and box is not None:
            container.check_local(box)  # the runtime on PATH here (apptainer, runc); never pyxis
        warnings += tuple(container.check(remap_config(cfg, snap), run_dir))
    warning = check_resubmit(snap, run_dir, accept_new_code) if resuming and not in_sweep else None
    ranks_cfg = remap_config(cfg, snap)
    py = python or cfg.environment.python or sys.executable
    rank: Tuple[str, ...] = (
        tuple(command_argv(ranks_cfg.train.command, py)) if cfg.train.command else ("python", "-m", "slurm_ddp.worker")
    )
    ranks_run = (*rank, "--run-dir", run_dir) if not cfg.train.command else rank
    if backend == "sbatch":
        dep = (f"--dependency={dependency}",) if dependency else ()
        argv: Tuple[str, ...] = (
            "sbatch",
            "--parsable",
            *dep,
            *rendered.sbatch_args,
            os.path.join(run_dir, SCRIPT_NAME),
        )
    elif backend == "local":
        argv = (
            "slurm-ddp",
            "local supervisor",
            f"{cfg.slurm.world_size} ranks",
            *ranks_run,
        )
    else:
        argv = ("submitit.SlurmExecutor", *ranks_run)
    return SubmitPlan(
        cfg=cfg,
        backend=backend,
        run_dir=run_dir,
        rendered=rendered,
        command=argv,
        resuming=resuming,
        snapshot=snap,
        warnings=(*warnings, *rendered.warnings, *((warning,) if warning else ())),
        submit_argv=tuple(command) if command is not None else tuple(sys.argv),
    )


def secret_warnings(
    env: Mapping[str, str], snap: Optional[SnapshotPlan], run_dir_mode: str = "private"
) -> Tuple[str, ...]:
    """``submit``'s lines about credentials (``slurm_ddp.secrets``) and who may read the run directory: a
    credential-looking name set literally in ``env`` (``environment.env``), the credential files the code
    snapshot left out, and ``environment.run_dir_mode: group`` under a umask that keeps the group out of
    the rest of the run directory (``rundir.run_dir_mode_warning``)."""
    out = [literal_warning(env), run_dir_mode_warning(run_dir_mode, current_umask())]
    if snap is not None and snap.skipped:
        out.append(
            f"the code snapshot left out {len(snap.skipped)} credential file(s), never copied: "
            + ", ".join(snap.skipped[:10])
            + (", ..." if len(snap.skipped) > 10 else "")
        )
    return tuple(w for w in out if w)


def prepare_run_dir(plan: SubmitPlan) -> Path:
    """Create the run directory: ``config.yaml`` (as loaded), ``job.sbatch``, ``logs/``, ``checkpoints/``,
    the code snapshot (``code/<digest>``, ``snapshot.json``) and the submit's provenance record."""
    rd = Path(plan.run_dir)
    mode = plan.cfg.environment.run_dir_mode  # who may read what holds the config (rundir.private_modes)
    try:
        (rd / LOGS_DIR).mkdir(parents=True, exist_ok=True)
        (rd / CHECKPOINTS_DIR).mkdir(exist_ok=True)
        if plan.snapshot is not None and os.path.abspath(plan.snapshot.run_dir) != os.path.abspath(rd):
            write_record(plan.snapshot, str(rd))  # a sweep's element: it runs the sweep's one snapshot
        elif plan.snapshot is not None:
            private_dir(rd / SNAPSHOTS_DIR, mode)  # the snapshot holds the job's YAML (rundir.PRIVATE_DIRS)
            take(plan.snapshot)
        text = dump_config(plan.cfg)
        existing = rd / CONFIG_NAME
        # new, or a resume on another world size (check_run_dir allowed only RESIZABLE_KEYS to differ)
        if not existing.exists() or existing.read_text(encoding="utf-8", errors="replace") != text:
            write_private_text(existing, text, mode)
        write_private_text(rd / SCRIPT_NAME, plan.rendered.script, mode, script=True)  # it may export env values
        apply_private_modes(rd, mode)  # also what this submit leaves as it was: an older config.yaml, diffs/
        container.prepare(plan.ranks_cfg, plan.run_dir)  # environment.container: slurm_ddp's copy, the OCI bundle
    except OSError as e:  # checked in plan_submit; the disk can still fill up or change in between
        raise UserError(f"cannot write the run directory {str(rd)!r}: {e}; choose another --run-dir") from None
    record_submit(
        plan.run_dir,
        argv=redact_argv(plan.submit_argv, plan.cfg.environment.env),
        backend=plan.backend,
        script=plan.rendered.script,
        snapshot_digest=plan.snapshot.digest if plan.snapshot is not None else None,
        git_roots=plan.snapshot.git_roots if plan.snapshot is not None else (),
        run_dir_mode=mode,
    )
    prepare_run(plan.cfg, rd)  # the tracker runs (tracking: on), once; a sweep's element has them already
    return rd
