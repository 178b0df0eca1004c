"""Submitting a sweep (``slurm_ddp.sweep``): one sweep directory, one run directory per element.

``plan_sweep()`` is pure apart from reading an existing sweep directory (what would be
submitted; ``describe()`` is ``submit --dry-run``'s text). ``schedule_sbatch`` writes the
sweep directory and submits **one** ``sbatch --array`` of the elements that have not
finished (``submitit_sweep.schedule_submitit``: one submitit job array); ``schedule_local`` runs those elements one after another on this machine through
the local backend. The directory layout's names are ``slurm_ddp.rundir``'s.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, List, Optional, Sequence, Tuple

from ..checkpoint import atomic_write_text
from ..config import dump_config
from ..errors import ClusterError, UserError
from ..provenance import record_submit
from ..render import ArrayJob, RenderedJob, render
from ..rundir import (
    ARRAY_SCRIPT_NAME,
    CHECKPOINTS_DIR,
    CONFIG_NAME,
    LOGS_DIR,
    array_task_id,
    element_dir_name,
    element_width,
    is_finished,
    read_sweep_manifest,
    record_job,
    record_sweep_job,
    write_sweep_manifest,
)
from ..snapshot import SnapshotPlan, check_resubmit, plan_snapshot, remap_config, take, write_record
from ..sweep import Sweep, SweepElement, array_spec
from . import BACKENDS, check_run_dir, default_run_dir


@dataclass(frozen=True)
class SweepPlan:
    """What ``submit`` does with a sweep; ``describe()`` is what ``submit --dry-run`` prints."""

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

    @property
    def script_path(self) -> str:
        return os.path.join(self.sweep_dir, ARRAY_SCRIPT_NAME)

    def describe(self) -> str:
        if self.backend == "submitit":
            from .submitit_sweep import describe

            return describe(self)
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
        return "\n".join(head) + "\n" + self.rendered.script


def render_sweep(
    sweep: Sweep,
    sweep_dir: str,
    *,
    indices: Optional[Sequence[int]] = None,
    command: Optional[Sequence[str]] = None,
    python: Optional[str] = None,
    snapshot: Optional[SnapshotPlan] = None,
) -> RenderedJob:
    """The array script of ``sweep`` writing into ``sweep_dir`` (``--array`` of ``indices``, default all);
    with ``snapshot``, train.command's script and train.workdir point into it (``remap_config``)."""
    n = len(sweep.elements)
    idx = list(range(n)) if indices is None else list(indices)
    job = ArrayJob(
        spec=array_spec(idx, sweep.parallelism),
        width=element_width(n),
        sweep_hash=sweep.sweep_hash(),
        elements=tuple((e.index, e.label) for e in sweep.elements),
    )
    cfg = remap_config(sweep.base_cfg, snapshot)
    return render(cfg, sweep_dir, command=command, python=python, array=job)


def default_sweep_dir(sweep: Sweep) -> str:
    """``./runs/<name>``, like a single run's."""
    return default_run_dir(sweep.base_cfg)


def _check_sweep_dir(sweep: Sweep, sweep_dir: str) -> Tuple[bool, List[int]]:
    """(resuming, indices of unfinished elements). Raises ``UserError`` when ``sweep_dir`` holds
    another sweep or something that is not a sweep directory."""
    p = Path(sweep_dir)
    n = len(sweep.elements)
    if not p.exists():
        return False, list(range(n))
    if not p.is_dir():
        raise UserError(f"--run-dir {sweep_dir!r} exists and is not a directory; choose another path")
    manifest = read_sweep_manifest(p)
    if manifest is None:
        if (p / CONFIG_NAME).exists():
            raise UserError(
                f"--run-dir {sweep_dir!r} holds a single run, not a sweep; give the sweep another --run-dir"
            )
        return False, list(range(n))
    old = manifest.get("elements")
    if not isinstance(old, list) or len(old) != n or manifest.get("sweep_hash") != sweep.sweep_hash():
        raise UserError(
            f"sweep directory {sweep_dir!r} belongs to a different sweep (other keys, values or config); "
            "use another --run-dir, or restore that sweep's config to resume it"
        )
    todo = []
    for e in sweep.elements:
        d = os.path.join(sweep_dir, element_dir_name(e.index, n))
        check_run_dir(e.cfg, d)
        if not is_finished(d):
            todo.append(e.index)
    return True, todo


def plan_sweep(
    sweep: Sweep,
    backend: str,
    sweep_dir: Optional[str] = None,
    *,
    command: Optional[Sequence[str]] = None,
    python: Optional[str] = None,
    accept_new_code: bool = False,
) -> SweepPlan:
    """The dry-run object of a sweep for ``backend`` (``sbatch``, ``submitit`` or ``local``).

    The sweep takes one code snapshot (``slurm_ddp.snapshot``, of the base config's code) stored
    once in the sweep directory; every element's ranks run from it. Raises ``UserError`` for
    an unknown backend, a sweep directory of another sweep, code that cannot be snapshotted, and a
    sweep directory whose snapshot differs from the code now (unless ``accept_new_code``).
    """
    if backend not in BACKENDS:
        raise UserError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    sweep_dir = os.path.abspath(sweep_dir or default_sweep_dir(sweep))
    resuming, todo = _check_sweep_dir(sweep, sweep_dir)
    snap = plan_snapshot(sweep.base_cfg, sweep_dir)
    warning = check_resubmit(snap, sweep_dir, accept_new_code) if resuming else None
    rendered = render_sweep(sweep, sweep_dir, command=command, python=python, snapshot=snap)
    spec = array_spec(todo, sweep.parallelism) if todo else ""
    argv: Tuple[str, ...] = (
        "sbatch",
        "--parsable",
        f"--array={spec}",
        *rendered.sbatch_args,
        os.path.join(sweep_dir, ARRAY_SCRIPT_NAME),
    )
    if backend == "local":
        argv = ("slurm-ddp", "local launcher", f"{len(todo)} elements one after another")
    elif backend == "submitit":  # one submitit job array (backends.submitit_sweep); task k runs todo[k]
        argv = ("submitit.SlurmExecutor.batch", f"{len(todo)} array tasks")
    return SweepPlan(
        sweep=sweep,
        backend=backend,
        sweep_dir=sweep_dir,
        rendered=rendered,
        todo=tuple(todo),
        resuming=resuming,
        command=argv,
        snapshot=snap,
        warnings=(warning,) if warning else (),
        accept_new_code=accept_new_code,
        submit_argv=tuple(command) if command is not None else tuple(sys.argv),
    )


def prepare_sweep_dir(plan: SweepPlan) -> Path:
    """Write the sweep directory: ``sweep.json``, the array script, the code snapshot (once:
    ``code/<digest>``, ``snapshot.json``), and per element a run directory with its
    ``config.yaml``, ``logs/``, ``checkpoints/`` and a ``snapshot.json`` naming the sweep's snapshot
    (read by the ranks on every start, requeues included); then the submit's provenance record in the
    sweep directory (``provenance.record_submit``: command, versions, git state, snapshot digest)."""
    sd = Path(plan.sweep_dir)
    sd.mkdir(parents=True, exist_ok=True)
    if plan.snapshot is not None:
        take(plan.snapshot)
    for e in plan.sweep.elements:
        _prepare_element(plan, e)
    manifest = plan.sweep.manifest()
    manifest["sweep_hash"] = plan.sweep.sweep_hash()
    manifest["dirs"] = [element_dir_name(e.index, len(plan.sweep.elements)) for e in plan.sweep.elements]
    write_sweep_manifest(sd, manifest)
    atomic_write_text(sd / ARRAY_SCRIPT_NAME, plan.rendered.script)
    os.chmod(sd / ARRAY_SCRIPT_NAME, 0o755)
    record_submit(
        plan.sweep_dir,
        argv=plan.submit_argv,
        backend=plan.backend,
        script=plan.rendered.script,
        snapshot_digest=plan.snapshot.digest if plan.snapshot is not None else None,
        git_roots=plan.snapshot.git_roots if plan.snapshot is not None else (),
    )
    return sd


def _prepare_element(plan: SweepPlan, e: SweepElement) -> None:
    rd = Path(plan.element_dir(e.index))
    (rd / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    (rd / CHECKPOINTS_DIR).mkdir(exist_ok=True)
    target = rd / CONFIG_NAME
    if not target.exists():
        # atomic (rename) but not fsynced: a thousand fsyncs would make submit take tens of seconds;
        # a config lost to a power cut is rewritten by submitting the sweep again
        tmp = rd / f".{CONFIG_NAME}.tmp"
        tmp.write_text(dump_config(e.cfg), encoding="utf-8")
        os.replace(tmp, target)
    if plan.snapshot is not None:
        write_record(plan.snapshot, str(rd), fsync=False)


def schedule_sbatch(plan: SweepPlan, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> str:
    """Write the sweep directory and submit one ``sbatch --array`` of the unfinished elements;
    returns the array job id. Each element's ``jobs.jsonl`` records ``ARRAYJOBID_TASKID``.

    Raises ``ClusterError`` when sbatch is missing or refuses the job.
    """
    if run is subprocess.run and shutil.which(plan.command[0]) is None:
        raise ClusterError("sbatch is not on PATH: submit from a login node of the cluster, or use --backend local")
    prepare_sweep_dir(plan)
    proc = run(list(plan.command), capture_output=True, text=True, cwd=plan.sweep_dir)
    if proc.returncode != 0:
        msg = (proc.stderr or proc.stdout or "").strip().splitlines()
        raise ClusterError(f"sbatch refused the job array (exit {proc.returncode}): {msg[-1] if msg else 'no message'}")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id:
        raise ClusterError(f"sbatch printed no job id: {proc.stdout!r}")
    record_sweep_job(plan.sweep_dir, backend="sbatch", job_id=job_id, array=plan.command[2].split("=", 1)[1])
    for i in plan.todo:
        record_job(plan.element_dir(i), backend="sbatch", job_id=array_task_id(job_id, i), array_job_id=job_id)
    return job_id


def schedule_local(
    plan: SweepPlan,
    *,
    echo: IO[str],
    say: Callable[[str], None],
    command: Optional[Sequence[str]] = None,
) -> List[Tuple[int, int]]:
    """Run the unfinished elements one after another with the local backend; returns
    ``(index, exit status)`` per element run. Stops at the first element stopped for preemption
    (Ctrl-C, a signal): submitting the sweep again resumes it and the rest."""
    from .. import PREEMPTED_EXIT_CODE
    from . import plan_submit
    from .local import schedule as local_schedule

    prepare_sweep_dir(plan)
    results: List[Tuple[int, int]] = []
    n = len(plan.sweep.elements)
    for i in plan.todo:
        e = plan.sweep.elements[i]
        say(f"sweep element {i + 1}/{n} ({e.label}): run directory {plan.element_dir(i)}")
        sub = plan_submit(e.cfg, "local", plan.element_dir(i), command=command, accept_new_code=plan.accept_new_code)
        status = local_schedule(sub, echo=echo, say=say)
        results.append((i, status))
        if status == PREEMPTED_EXIT_CODE:
            break
    return results
