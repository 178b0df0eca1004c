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
from typing import List, Optional, Tuple

from ..config import dump_config
from ..errors import UserError
from ..render import RenderedJob
from ..rundir import (
    ARRAY_SCRIPT_NAME,
    CHECKPOINTS_DIR,
    CONFIG_NAME,
    ELEMENT_WORKDIR,
    LOGS_DIR,
    SNAPSHOTS_DIR,
    apply_private_modes,
    array_link_dir,
    batch_log_name,
    element_dir_name,
    element_width,
    is_finished,
    is_job_dir,
    private_dir,
    private_modes,
    was_accepted,
    write_private_text,
    write_sweep_manifest,
)
from ..rundir.provenance import record_submit
from ..secrets import redact_argv
from ..snapshot import CHECKPOINT_DIR, SnapshotPlan, is_checkpoint_file, take, write_record
from ..sweep import ArrayChunk, Sweep, SweepElement, chained
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
    #: a ``train.command`` sweep: the project directory's entries linked into each element's working
    #: directory (``project_links``), and the ones left out because they hold checkpoints
    linked: Tuple[str, ...] = ()
    not_linked: Tuple[str, ...] = ()
    #: the job arrays of an sbatch submit (``sweep.plan_arrays``): one, or several past ``MaxArraySize``
    arrays: Tuple[ArrayChunk, ...] = ()
    dependency: str = ""  #: sbatch's ``--dependency`` of ``--after`` (``backends.after``), every array's
    max_array_size: Optional[int] = None  #: the cluster's ``MaxArraySize``; None: not known
    #: the submit limit line of ``submit --dry-run`` (``sweep.SubmitLimit.describe``); "" when not asked
    limit_line: str = ""
    #: what memory each element will get (``ops.memory.memory_line`` of the base config); set by ``submit``
    memory: str = ""

    def element_dir(self, index: int) -> str:
        return os.path.join(self.sweep_dir, element_dir_name(index, len(self.sweep.elements)))

    def array_argv(self, j: int, previous_job_id: str = "") -> Tuple[str, ...]:
        """The sbatch argv of array ``j`` of ``arrays`` (``command`` for the first): its ``--array``;
        ``--dependency`` = the user's ``--after`` and, when the arrays are chained (``sweep.chained``),
        ``afterany:<previous_job_id>`` (sbatch(1): a ``,`` joins dependencies that must all hold);
        for an array at an offset, ``--output`` through its links (``rundir.ARRAY_LINKS_DIR``) and the
        offset as the script's argument (the batch script adds it to ``SLURM_ARRAY_TASK_ID``)."""
        if not self.arrays or (j == 0 and self.arrays[0].offset == 0):
            return self.command
        return self.offset_argv(j, previous_job_id)

    def offset_argv(self, j: int, previous_job_id: str = "") -> Tuple[str, ...]:
        """:meth:`array_argv` of array ``j`` built whole (``plan_sweep`` makes ``command`` with it when
        the first array of a re-submit starts past element 0)."""
        chunk = self.arrays[j]
        deps = [d for d in (self.dependency,) if d]
        if j > 0 and chained(self.arrays, self.sweep.parallelism):
            deps.append(f"afterany:{previous_job_id or f'JOBID_OF_ARRAY_{j}'}")  # dry run: not known yet
        width = element_width(len(self.sweep.elements))
        output = os.path.join(
            str(array_link_dir(self.sweep_dir, chunk.offset)), f"%{width}a", LOGS_DIR, batch_log_name("%j")
        )
        return (
            "sbatch",
            "--parsable",
            f"--array={chunk.spec(self.sweep.parallelism)}",
            *((f"--dependency={','.join(deps)}",) if deps else ()),
            f"--output={output}",
            *(a for a in self.rendered.sbatch_args if not a.startswith("--output=")),
            self.script_path,
            str(chunk.offset),
        )

    def _arrays_lines(self) -> List[str]:
        """``describe``'s lines on MaxArraySize, the other arrays and the submit limit."""
        lines: List[str] = []
        if self.backend == "sbatch" and self.todo:
            limit = (
                "unknown (scontrol show config did not answer)"
                if self.max_array_size is None
                else str(self.max_array_size)
            )
            lines.append(f"# MaxArraySize: {limit}; job arrays: {len(self.arrays) or 1}")
        if len(self.arrays) > 1:
            p = self.sweep.parallelism
            lines.append(
                "# each later array starts once the one before has ended (--dependency=afterany): "
                f"at most {p} elements run at once across them"
                if chained(self.arrays, p)
                else "# the arrays run side by side (no slurm.array_parallelism)"
                if p is None
                else f"# the arrays run side by side (array_parallelism {p} >= the {len(self.todo)} elements)"
            )
            for j, chunk in enumerate(self.arrays[1:11], start=1):
                lines.append(f"# array {j + 1} (elements {chunk.offset}+TASKID): {shlex.join(self.array_argv(j))}")
            if len(self.arrays) > 11:
                lines.append(f"# ... {len(self.arrays) - 11} more arrays")
        if self.limit_line:
            lines.append(f"# {self.limit_line}")
        return lines

    @property
    def pass_env(self) -> Tuple[str, ...]:
        """The names any element hands on from the submitting shell (``environment.pass_env`` may be
        swept), sorted: what the sweep's one sbatch keeps (``submitenv.submit_environ``)."""
        return tuple(sorted({n for e in self.sweep.elements for n in e.cfg.environment.pass_env}))

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
            *self._arrays_lines(),
            *([f"# {self.memory}"] if self.memory else []),
            *([self.snapshot.describe()] if self.snapshot is not None else ["# code snapshot: off"]),
            *(
                [
                    f"# working directory of each element: its own RUN_DIR/{ELEMENT_WORKDIR}, "
                    f"with {len(self.linked)} entries of {self.sweep.base_cfg.train.workdir} linked in"
                    + (f" (not linked: {', '.join(self.not_linked)})" if self.not_linked else "")
                ]
                if self.sweep.base_cfg.train.command
                else []
            ),
            f"# script ({self.script_path}):",
        ]
        return "\n".join(head) + "\n" + self.rendered.printed


_SCAN_LIMIT = 2000  #: entries looked at per project entry (a dataset directory is not walked through)


def _holds_checkpoints(path: str) -> bool:
    """True when ``path`` is (or, up to 3 levels down and ``_SCAN_LIMIT`` entries, holds) a saved
    checkpoint: an earlier run's output, which a sweep element must not read or overwrite."""
    if os.path.isfile(path):
        return is_checkpoint_file(path)
    seen = 0
    for dirpath, dirnames, filenames in os.walk(path):
        rel = os.path.relpath(dirpath, path)
        depth = 0 if rel == "." else rel.count(os.sep) + 1
        if any(CHECKPOINT_DIR.match(d) for d in dirnames):
            return True
        for name in filenames:
            seen += 1
            if is_checkpoint_file(os.path.join(dirpath, name)):
                return True
            if seen > _SCAN_LIMIT:
                return False
        if depth >= 3:
            dirnames[:] = []
    return False


def project_links(project: str, sweep_dir: str) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(names linked, names left out) of the entries of ``project`` (``train.workdir``) in a
    ``train.command`` sweep element's working directory (``RUN_DIR/work``).

    Every entry is linked (a symbolic link to it: the script reads ``data/…`` by the same relative
    path) except the one holding ``sweep_dir`` (``runs/``), run and sweep directories, and an entry
    that holds a saved checkpoint (``checkpoint.pt``, ``out/checkpoint-500/``: an earlier run's
    outputs, which every element would resume from and overwrite; left out, it is each element's own,
    new). A relative path the script writes that no link covers lands in the element's own directory.
    """
    linked: List[str] = []
    skipped: List[str] = []
    sweep_dir = os.path.realpath(sweep_dir)
    try:
        names = sorted(os.listdir(project))
    except OSError:
        return (), ()
    for name in names:
        full = os.path.join(project, name)
        real = os.path.realpath(full)
        if sweep_dir == real or sweep_dir.startswith(real.rstrip("/") + "/") or is_job_dir(full):
            continue
        (skipped if _holds_checkpoints(full) else linked).append(name)
    return tuple(linked), tuple(skipped)


def _make_workdir(plan: SweepPlan, rd: Path) -> None:
    """``rd/work`` with the project's entries linked in (``plan.linked``); a name already there (the
    element's own output, an earlier link) is kept."""
    work = rd / ELEMENT_WORKDIR
    work.mkdir(exist_ok=True)
    project = plan.sweep.base_cfg.train.workdir or os.getcwd()
    for name in plan.linked:
        link = work / name
        if not os.path.lexists(link):
            os.symlink(os.path.join(project, name), link)


def prepare_sweep_dir(plan: SweepPlan) -> Path:
    """Write the sweep directory: ``sweep.json``, the array script, the code snapshot (once:
    ``code/<digest>``, ``snapshot.json``), and per element a run directory with its
    ``config.yaml``, ``logs/``, ``checkpoints/`` and a ``snapshot.json`` naming the sweep's snapshot
    (read by the ranks on every start, requeues included); then the submit's provenance record in the
    sweep directory (``provenance.record_submit``: command, versions, git state, snapshot digest).
    Raises ``UserError`` (one line) when the directory cannot be written (disk full, permissions)."""
    sd = Path(plan.sweep_dir)
    mode = plan.sweep.base_cfg.environment.run_dir_mode  # who may read what holds the config (rundir.private_modes)
    try:
        sd.mkdir(parents=True, exist_ok=True)
        if plan.snapshot is not None:
            private_dir(sd / SNAPSHOTS_DIR, mode)  # the snapshot holds the job's YAML (rundir.PRIVATE_DIRS)
            take(plan.snapshot)
        for e in plan.sweep.elements:
            _prepare_element(plan, e)
        manifest = plan.sweep.manifest()
        manifest["sweep_hash"] = plan.sweep.sweep_hash()
        manifest["dirs"] = [element_dir_name(e.index, len(plan.sweep.elements)) for e in plan.sweep.elements]
        write_sweep_manifest(sd, manifest)
        write_private_text(sd / ARRAY_SCRIPT_NAME, plan.rendered.script, mode, script=True)  # it may export env values
        apply_private_modes(sd, mode)  # also what this submit leaves as it was (diffs/ of a clean checkout)
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
        run_dir_mode=mode,
    )
    # one tracker run per element, grouped by the sweep (tracking: on)
    prepare_sweep(sd, plan.sweep.name, [(e.cfg, plan.element_dir(e.index)) for e in plan.sweep.elements])
    return sd


def _prepare_element(plan: SweepPlan, e: SweepElement) -> None:
    rd = Path(plan.element_dir(e.index))
    (rd / LOGS_DIR).mkdir(parents=True, exist_ok=True)
    (rd / CHECKPOINTS_DIR).mkdir(exist_ok=True)
    # the element's own working directory (rundir.ELEMENT_WORKDIR); an element that already ran without one
    # (submitted by an older slurm_ddp) keeps running where its outputs are
    if e.cfg.train.command and ((rd / ELEMENT_WORKDIR).is_dir() or not was_accepted(rd)):
        _make_workdir(plan, rd)
    target = rd / CONFIG_NAME
    text = dump_config(e.cfg)
    # new, left by a submit that never submitted (a stale config binds nothing: _check_sweep_dir),
    # or a resume on another world size (check_run_dir allowed only config.RESIZABLE_KEYS to differ)
    if not target.exists() or target.read_text(encoding="utf-8", errors="replace") != text:
        # atomic (rename) but not fsynced: a thousand fsyncs would make submit take tens of seconds;
        # a config lost to a power cut is rewritten by submitting the sweep again
        tmp = rd / f".{CONFIG_NAME}.tmp"
        file_mode = private_modes(e.cfg.environment.run_dir_mode).file  # whatever the umask (rundir.PRIVATE_FILES)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, file_mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    apply_private_modes(rd, e.cfg.environment.run_dir_mode)  # its config.yaml, also one left as it was
    if plan.snapshot is not None and not is_finished(rd):  # a finished element keeps the code it ran
        write_record(plan.snapshot, str(rd), fsync=False)
