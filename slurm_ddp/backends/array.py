"""Submitting a sweep (``slurm_ddp.sweep``): one sweep directory, one run directory per element.

``plan_sweep()`` is pure apart from reading an existing sweep directory (what would be
submitted; ``describe()`` is ``submit --dry-run``'s text). ``schedule_sbatch`` writes the
sweep directory and submits **one** ``sbatch --array`` of the elements that have not
finished (``submitit_sweep.schedule_submitit``: one submitit job array); ``schedule_local`` runs those elements one after another on this machine through
the local backend. The directory layout's names are ``slurm_ddp.rundir``'s.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Sequence, Tuple, cast

from ..checkpoint import atomic_write_text
from ..config import dump_config
from ..errors import ClusterError, SlurmDDPError, UserError
from ..provenance import record_submit
from ..render import ArrayJob, RenderedJob, loader_cpu_warning, render
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
    rendered = render(cfg, sweep_dir, command=command, python=python, array=job)
    # an element may sweep train.num_workers: each element's warning, once
    warnings = dict.fromkeys(w for e in sweep.elements for w in [loader_cpu_warning(e.cfg)] if w)
    return dataclasses.replace(rendered, warnings=tuple(warnings))


def plan_sweep_script(
    sweep: Sweep, sweep_dir: str, *, command: Optional[Sequence[str]] = None, python: Optional[str] = None
) -> Tuple[Optional[SnapshotPlan], RenderedJob]:
    """The sweep's code snapshot for ``sweep_dir`` and the array script ``submit`` would write, its code
    paths in that snapshot: what ``render --sweep`` prints and ``plan_sweep`` writes. Reads the
    checkout, writes nothing, does not look at ``sweep_dir``. Raises ``UserError`` when the code
    cannot be snapshotted."""
    sweep_dir = os.path.abspath(sweep_dir)
    snap = plan_snapshot(sweep.base_cfg, sweep_dir)
    return snap, render_sweep(sweep, sweep_dir, command=command, python=python, snapshot=snap)


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
    snap, rendered = plan_sweep_script(sweep, sweep_dir, command=command, python=python)
    warning = check_resubmit(snap, sweep_dir, accept_new_code) if resuming else None
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
        warnings=(*rendered.warnings, *((warning,) if warning else ())),
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
    """Run the unfinished elements with the local backend, ``slurm.array_parallelism`` of them at
    once (the ``%P`` of the array; unset: one after another); returns ``(index, exit status)`` per
    element run, in the order they ended.

    One element at a time runs in this process. Several run each in a forked process of its own
    session, with its own launcher (``backends.local``: its own ``MASTER_PORT``, chosen from its
    pid) and its lines prefixed ``[NNN]``; a signal to this process (Ctrl-C, SIGTERM, the requeue
    signal) is passed to every running element, whose ranks checkpoint and stop, and an element
    whose parent dies gets SIGTERM (prctl PR_SET_PDEATHSIG). After an element stopped for
    preemption no further element starts: submitting the sweep again resumes the unfinished ones.
    """
    prepare_sweep_dir(plan)
    k = max(1, plan.sweep.parallelism or 1)
    if k == 1:
        return _run_local_in_turn(plan, echo=echo, say=say, command=command)
    return _run_local_concurrently(plan, k, echo=echo, say=say, command=command)


def _run_local_element(
    plan: SweepPlan, index: int, echo: IO[str], say: Callable[[str], None], command: Optional[Sequence[str]]
) -> int:
    from . import plan_submit
    from .local import schedule as local_schedule

    e = plan.sweep.elements[index]
    sub = plan_submit(e.cfg, "local", plan.element_dir(index), command=command, accept_new_code=plan.accept_new_code)
    return local_schedule(sub, echo=echo, say=say)


def _run_local_in_turn(
    plan: SweepPlan, *, echo: IO[str], say: Callable[[str], None], command: Optional[Sequence[str]]
) -> List[Tuple[int, int]]:
    from .. import PREEMPTED_EXIT_CODE

    results: List[Tuple[int, int]] = []
    n = len(plan.sweep.elements)
    for i in plan.todo:
        say(f"sweep element {i + 1}/{n} ({plan.sweep.elements[i].label}): run directory {plan.element_dir(i)}")
        status = _run_local_element(plan, i, echo, say, command)
        results.append((i, status))
        if status == PREEMPTED_EXIT_CODE:
            break
    return results


class _Prefixed:
    """A text stream that writes every line to ``out`` after ``prefix`` (not a terminal: no
    progress bar, whose redraws from several elements would garble each other)."""

    def __init__(self, out: IO[str], prefix: str):
        self.out, self.prefix, self._at_start = out, prefix, True

    def write(self, text: str) -> int:
        for part in text.splitlines(keepends=True):
            self.out.write((self.prefix if self._at_start else "") + part)
            self._at_start = part.endswith("\n")
        return len(text)

    def flush(self) -> None:
        self.out.flush()

    def isatty(self) -> bool:
        return False


def _run_local_concurrently(
    plan: SweepPlan, k: int, *, echo: IO[str], say: Callable[[str], None], command: Optional[Sequence[str]]
) -> List[Tuple[int, int]]:
    import signal

    from .. import PREEMPTED_EXIT_CODE
    from .local import die_with_parent

    n = len(plan.sweep.elements)
    width = len(element_dir_name(n - 1, n))
    queue = list(plan.todo)
    running: Dict[int, int] = {}  # pid -> element index
    results: List[Tuple[int, int]] = []
    parent = os.getpid()
    stopping: List[int] = []  # the signals received (no new element starts once one came)
    sigs = {signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    sigs.add(signal.Signals["SIG" + plan.sweep.base_cfg.requeue.signal_name])

    def on_signal(signum: int, frame: object) -> None:
        """Pass the signal on to every running element, here: the loop may be blocked in waitpid,
        which Python resumes after a handler (PEP 475)."""
        if os.getpid() != parent:  # a child before it restored its own handlers
            return
        stopping.append(signum)
        for pid in list(running):
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass

    originals = {sig: signal.signal(sig, on_signal) for sig in sigs}
    say(f"running {len(queue)} sweep element(s), {k} at a time")
    try:
        while queue or running:
            while queue and not stopping and len(running) < k:
                i = queue.pop(0)
                say(f"sweep element {i + 1}/{n} ({plan.sweep.elements[i].label}): run directory {plan.element_dir(i)}")
                sys.stdout.flush()
                sys.stderr.flush()
                # signals wait while the element forks: delivered once it is in `running`, so passed on to it too
                signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
                pid = os.fork()
                if pid == 0:  # the element: its own session (a terminal's Ctrl-C reaches only the parent)
                    status = 1
                    try:
                        for sig, handler in originals.items():
                            signal.signal(sig, handler)
                        signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
                        os.setsid()
                        die_with_parent(signal.SIGTERM)
                        tag = f"[{i:0{width}d}] "

                        def say_tagged(message: str, tag: str = tag) -> None:
                            say(tag + message)

                        out = cast(IO[str], _Prefixed(echo, tag))
                        status = _run_local_element(plan, i, out, say_tagged, command)
                    except BaseException as e:  # the child must end here, never return into the loop
                        say(f"[{i:0{width}d}] {e}" if isinstance(e, SlurmDDPError) else f"[{i:0{width}d}] {e!r}")
                        status = int(getattr(e, "exit_code", 1))
                    finally:
                        sys.stdout.flush()
                        sys.stderr.flush()
                        os._exit(status)
                running[pid] = i
                signal.pthread_sigmask(signal.SIG_UNBLOCK, sigs)
            if not running:
                break
            pid, wstatus = os.waitpid(-1, 0)
            if pid not in running:
                continue
            i = running.pop(pid)
            status = os.waitstatus_to_exitcode(wstatus)
            status = status if status >= 0 else 128 - status
            results.append((i, status))
            say(f"sweep element {i + 1}/{n} ({plan.sweep.elements[i].label}) ended with status {status}")
            if status == PREEMPTED_EXIT_CODE:
                stopping.append(0)
    finally:
        for sig, handler in originals.items():
            signal.signal(sig, handler)
    return results
