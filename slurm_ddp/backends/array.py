"""Submitting a sweep (``slurm_ddp.sweep``): one sweep directory, one run directory per element.

``plan_sweep()`` is pure apart from reading an existing sweep directory (what would be
submitted; ``describe()`` is ``submit --dry-run``'s text). ``schedule_sbatch`` writes the
sweep directory and submits **one** ``sbatch --array`` of the elements that have not
finished, or, past the cluster's ``MaxArraySize``, one per array of ``sweep.plan_arrays``
(task t of the array at offset o runs element o + t; with ``slurm.array_parallelism`` each
later array waits for the one before: ``sweep.chained``), all or none
(``submitit_sweep.schedule_submitit``: submitit job arrays the same way); ``schedule_local`` runs those elements one after another on this machine through
the local backend. The plan (``SweepPlan``) and the sweep directory's writing (``prepare_sweep_dir``) are
``sweep_plan``'s; the directory layout's names are ``slurm_ddp.rundir``'s.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional, Sequence, Set, Tuple, cast

from ..errors import ClusterError, SlurmDDPError, UserError
from ..render import ArrayJob, RenderedJob, job_warnings, render
from ..rundir import (
    ARRAY_SCRIPT_NAME,
    CONFIG_NAME,
    array_link_dir,
    array_task_id,
    clear_submit_intent,
    element_dir_name,
    element_width,
    is_finished,
    read_sweep_jobs,
    read_sweep_manifest,
    record_job,
    record_sweep_job,
    was_accepted,
)
from ..secrets import check_pass_env
from ..snapshot import SnapshotPlan, check_resubmit, plan_snapshot, remap_config
from ..submitenv import submit_environ
from ..sweep import ArrayChunk, Sweep, array_spec, plan_arrays
from ..tracking import check_installed
from . import BACKENDS, check_run_dir, default_run_dir, secret_warnings
from .submitit_sweep import SubmititSweepPlan
from .sweep_plan import SweepPlan, prepare_sweep_dir, project_links


def render_sweep(
    sweep: Sweep,
    sweep_dir: str,
    *,
    indices: Optional[Sequence[int]] = None,
    command: Optional[Sequence[str]] = None,
    python: Optional[str] = None,
    snapshot: Optional[SnapshotPlan] = None,
    arrays: Sequence[ArrayChunk] = (),
) -> RenderedJob:
    """The array script of ``sweep`` writing into ``sweep_dir`` (``--array`` of ``indices``, default all;
    with several ``arrays`` (``sweep.plan_arrays``) the first one's, and the header lists them all);
    with ``snapshot``, train.command's script and train.workdir point into it (``remap_config``)."""
    n = len(sweep.elements)
    idx = list(range(n)) if indices is None else list(indices)
    job = ArrayJob(
        spec=arrays[0].spec(sweep.parallelism) if len(arrays) > 1 else array_spec(idx, sweep.parallelism),
        width=element_width(n),
        sweep_hash=sweep.sweep_hash(),
        elements=tuple((e.index, e.label) for e in sweep.elements),
        arrays=tuple((a.offset, a.spec(sweep.parallelism)) for a in arrays) if len(arrays) > 1 else (),
    )
    cfg = remap_config(sweep.base_cfg, snapshot)
    rendered = render(cfg, sweep_dir, command=command, python=python, array=job)
    # an element may sweep train.num_workers or a timeout: each element's warnings, once; under the sweep's
    # name (the job array's --job-name), not the element's generated NAME[label]
    warnings = dict.fromkeys(
        w for e in sweep.elements for w in job_warnings(dataclasses.replace(e.cfg, name=sweep.name))
    )
    return dataclasses.replace(rendered, warnings=tuple(warnings))


def plan_sweep_script(
    sweep: Sweep,
    sweep_dir: str,
    *,
    command: Optional[Sequence[str]] = None,
    python: Optional[str] = None,
    arrays: Sequence[ArrayChunk] = (),
) -> Tuple[Optional[SnapshotPlan], RenderedJob]:
    """The sweep's code snapshot for ``sweep_dir`` and the array script ``submit`` would write, its code
    paths in that snapshot: what ``render --sweep`` prints and ``plan_sweep`` writes. Reads the
    checkout, writes nothing, does not look at ``sweep_dir``. Raises ``UserError`` when the code
    cannot be snapshotted."""
    sweep_dir = os.path.abspath(sweep_dir)
    snap = plan_snapshot(sweep.base_cfg, sweep_dir)
    return snap, render_sweep(sweep, sweep_dir, command=command, python=python, snapshot=snap, arrays=arrays)


def default_sweep_dir(sweep: Sweep) -> str:
    """``./runs/<name>``, like a single run's."""
    return default_run_dir(sweep.base_cfg)


def _check_sweep_dir(sweep: Sweep, sweep_dir: str) -> Tuple[bool, List[int]]:
    """(resuming, indices of unfinished elements). Raises ``UserError`` when ``sweep_dir`` holds
    another sweep or something that is not a sweep directory.

    A sweep directory none of whose jobs was ever accepted (``rundir.was_accepted``: sbatch refused
    it, or the submit was interrupted before it submitted) binds nothing: it is written anew, its
    elements' configs included (``prepare_sweep_dir``). One element that ran binds the sweep, and
    a sweep directory that lost its ``sweep.json`` is checked element by element."""
    p = Path(sweep_dir)
    n = len(sweep.elements)
    if not p.exists():
        return False, list(range(n))
    if not p.is_dir():
        raise UserError(f"--run-dir {sweep_dir!r} exists and is not a directory; choose another path")
    manifest = read_sweep_manifest(p)
    if manifest is None and (p / CONFIG_NAME).exists():
        raise UserError(f"--run-dir {sweep_dir!r} holds a single run, not a sweep; give the sweep another --run-dir")
    dirs = [os.path.join(sweep_dir, element_dir_name(e.index, n)) for e in sweep.elements]
    if not read_sweep_jobs(p) and not any(was_accepted(d) for d in dirs):
        return False, list(range(n))
    old = manifest.get("elements") if manifest is not None else None
    if manifest is not None and (
        not isinstance(old, list) or len(old) != n or manifest.get("sweep_hash") != sweep.sweep_hash()
    ):
        raise UserError(
            f"sweep directory {sweep_dir!r} belongs to a different sweep (other keys, values or config); "
            "use another --run-dir, or restore that sweep's config to resume it"
        )
    todo = []
    for e, d in zip(sweep.elements, dirs):
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
    dependency: str = "",
    max_array_size: Optional[int] = None,
) -> SweepPlan:
    """The dry-run object of a sweep for ``backend`` (``sbatch``, ``submitit`` or ``local``).

    ``max_array_size``: the cluster's ``MaxArraySize`` (``sweep.max_array_size``; None: not known):
    past it the unfinished elements go out as several job arrays (``sweep.plan_arrays``; for
    submitit, ``submitit_sweep.task_arrays``).

    The sweep takes one code snapshot (``slurm_ddp.snapshot``, of the base config's code) stored
    once in the sweep directory; every element's ranks run from it. Raises ``UserError`` for
    an unknown backend, a sweep directory of another sweep, code that cannot be snapshotted, and a
    sweep directory whose snapshot differs from the code now (unless ``accept_new_code``).
    """
    if backend not in BACKENDS:
        raise UserError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    for e in sweep.elements:  # pass_env and env may be swept
        check_pass_env(e.cfg.environment.pass_env, os.environ)
    check_installed(sweep.base_cfg)  # tracking's packages (one tracking section for all elements)
    sweep_dir = os.path.abspath(sweep_dir or default_sweep_dir(sweep))
    resuming, todo = _check_sweep_dir(sweep, sweep_dir)
    arrays = plan_arrays(todo, max_array_size) if backend == "sbatch" else ()
    snap, rendered = plan_sweep_script(sweep, sweep_dir, command=command, python=python, arrays=arrays)
    env = {k: v for e in sweep.elements for k, v in e.cfg.environment.env.items()}
    secret = secret_warnings(env, snap, sweep.base_cfg.environment.run_dir_mode) + (
        snap.notes if snap is not None else ()
    )
    warning = check_resubmit(snap, sweep_dir, accept_new_code) if resuming else None
    spec = array_spec(todo, sweep.parallelism) if todo else ""
    argv: Tuple[str, ...] = (
        "sbatch",
        "--parsable",
        f"--array={arrays[0].spec(sweep.parallelism) if arrays else spec}",
        *((f"--dependency={dependency}",) if dependency else ()),
        *rendered.sbatch_args,
        os.path.join(sweep_dir, ARRAY_SCRIPT_NAME),
    )
    if backend == "local":
        argv = ("slurm-ddp", "local supervisor", f"{len(todo)} elements one after another")
    elif backend == "submitit":  # one submitit job array (backends.submitit_sweep); task k runs todo[k]
        argv = ("submitit.SlurmExecutor.batch", f"{len(todo)} array tasks")
    linked: Tuple[str, ...] = ()
    not_linked: Tuple[str, ...] = ()
    notes: List[str] = []
    if sweep.base_cfg.train.command:  # each element runs in its own RUN_DIR/work (sweep_plan.project_links)
        linked, not_linked = project_links(sweep.base_cfg.train.workdir or os.getcwd(), sweep_dir)
        if not_linked:
            notes.append(
                f"not linked into the sweep elements' working directories (they hold saved checkpoints, which "
                f"every element would resume from and overwrite): {', '.join(not_linked)}; each element "
                "writes its own. A script that reads one should give its absolute path"
            )
    plan_type = SubmititSweepPlan if backend == "submitit" else SweepPlan
    plan = plan_type(
        sweep=sweep,
        backend=backend,
        sweep_dir=sweep_dir,
        rendered=rendered,
        todo=tuple(todo),
        resuming=resuming,
        command=argv,
        snapshot=snap,
        warnings=(*secret, *rendered.warnings, *notes, *((warning,) if warning else ())),
        accept_new_code=accept_new_code,
        submit_argv=tuple(command) if command is not None else tuple(sys.argv),
        linked=linked,
        not_linked=not_linked,
        arrays=arrays,
        dependency=dependency,
        max_array_size=max_array_size,
    )
    if arrays and arrays[0].offset:  # a re-submit whose first unfinished element is past MaxArraySize
        plan = dataclasses.replace(plan, command=plan.offset_argv(0))
    return plan


def _make_array_links(plan: SweepPlan, chunk: ArrayChunk) -> None:
    """``SWEEP_DIR/.arrays/OFFSET/TASKID`` → ``../../ELEMENT`` for each task of an array at an offset
    (``rundir.ARRAY_LINKS_DIR``): its ``--output`` goes through them into each element's ``logs/``."""
    d = array_link_dir(plan.sweep_dir, chunk.offset)
    d.mkdir(parents=True, exist_ok=True)
    n = len(plan.sweep.elements)
    width = element_width(n)
    for task, element in zip(chunk.task_ids, chunk.elements):
        link = d / f"{task:0{width}d}"
        target = os.path.join("..", "..", element_dir_name(element, n))
        if os.path.lexists(link) and os.readlink(link) != target:
            link.unlink()
        if not os.path.lexists(link):
            os.symlink(target, link)


def schedule_sbatch(plan: SweepPlan, run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> str:
    """Write the sweep directory and submit the unfinished elements: one ``sbatch --array`` per array
    of ``plan.arrays`` (one unless the sweep is past ``MaxArraySize``), in order, each later one with
    ``--dependency=afterany:<the one before>`` when the arrays are chained (``sweep.chained``: one
    ``array_parallelism`` across them). Returns the first array's job id. Each element's ``jobs.jsonl``
    records ``ARRAYJOBID_TASKID`` and ``sweep-jobs.jsonl`` one line per array (its job id, ``--array``
    value and ``offset``: task t of it is element ``offset + t``).

    All or none: when sbatch refuses an array, the arrays of this submit it had accepted are cancelled
    (``scancel``, later ones first) before this raises (their records stay: they name cancelled jobs).
    Raises ``ClusterError`` when sbatch is
    missing or refuses a job array.
    """
    if run is subprocess.run and shutil.which(plan.command[0]) is None:
        raise ClusterError("sbatch is not on PATH: submit from a login node of the cluster, or use --backend local")
    from .sbatch import identity_for, refuse_beside_lost_array, script_job_name, submit_once

    known = [str(j.get("job_id", "")) for j in read_sweep_jobs(plan.sweep_dir)]
    refuse_beside_lost_array(plan.sweep_dir, known, run)
    prepare_sweep_dir(plan)
    # the intent first, and a lost answer's job looked for, never submitted twice (backends.sbatch)
    ident = identity_for(plan.sweep_dir, script_job_name(plan.rendered.script))
    # without the variables of a job this shell runs inside (submitenv), as the single-run backend
    env = submit_environ(os.environ, keep=plan.pass_env, submit_dir=plan.sweep_dir)
    arrays = plan.arrays or (ArrayChunk(offset=0, elements=plan.todo),)
    submitted: List[str] = []
    for j, chunk in enumerate(arrays):
        if chunk.offset:
            _make_array_links(plan, chunk)
        argv = plan.array_argv(j, submitted[-1] if submitted else "")
        try:
            job_id, array_ident, note = submit_once(argv, ident, [*known, *submitted], run, "the job array", env=env)
        except ClusterError as e:
            if not submitted:
                raise
            # later arrays first: an earlier one's end would release a later one's dependency
            undo = run(["scancel", *reversed(submitted)], capture_output=True, text=True)
            gone = "cancelled" if undo.returncode == 0 else f"NOT cancelled (scancel exit {undo.returncode})"
            raise ClusterError(
                f"{e} (array {j + 1} of {len(arrays)}, elements {chunk.elements[0]}..{chunk.elements[-1]}); "
                f"the {len(submitted)} array(s) of this submit it had accepted ({', '.join(submitted)}) were {gone}"
            ) from None
        submitted.append(job_id)
        extra = {"found_after_lost_answer": True} if note else {}
        # recorded at once: an interrupted submit leaves the arrays it made visible to status and cancel
        spec = next(a for a in argv if a.startswith("--array=")).split("=", 1)[1]
        record_sweep_job(
            plan.sweep_dir, backend="sbatch", identity=array_ident, array=spec, offset=chunk.offset, **extra
        )
        for task, i in zip(chunk.task_ids, chunk.elements):
            task_ident = dataclasses.replace(array_ident, job_id=array_task_id(job_id, task))  # paths in the sweep dir
            record_job(plan.element_dir(i), backend="sbatch", identity=task_ident, array_job_id=job_id, **extra)
        clear_submit_intent(plan.sweep_dir)
    return submitted[0]


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
    session, with its own local supervisor (``backends.local``: its own ``MASTER_PORT``, reserved while its
    ranks run: ``rendezvous.reserve_port``, so no two elements share one) and its lines prefixed ``[NNN]``; a signal to this process (Ctrl-C, SIGTERM, the requeue
    signal) is passed to every running element, whose ranks stop as ``rundir.at_stop`` says (the worker's
    checkpoint at the step boundary; a ``train.command`` script's only with a slurm_ddp handler), and an element
    whose parent dies gets SIGTERM (prctl PR_SET_PDEATHSIG). After an element stopped for
    preemption no further element starts: submitting the sweep again resumes the unfinished ones.
    """
    prepare_sweep_dir(plan)
    k = max(1, plan.sweep.parallelism or 1)
    if k == 1:
        return _run_local_in_turn(plan, echo=echo, say=say, command=command)
    return _run_local_concurrently(plan, k, echo=echo, say=say, command=command)


def _run_local_element(
    plan: SweepPlan,
    index: int,
    echo: IO[str],
    say: Callable[[str], None],
    command: Optional[Sequence[str]],
    told: Optional[Set[int]] = None,
) -> int:
    from . import plan_submit
    from .local import schedule as local_schedule

    e = plan.sweep.elements[index]
    sub = plan_submit(
        e.cfg,
        "local",
        plan.element_dir(index),
        command=command,
        accept_new_code=plan.accept_new_code,
        sweep_snapshot=plan.snapshot,  # the sweep's one snapshot, never one per element
        in_sweep=True,
    )
    return local_schedule(sub, echo=echo, say=say, told=told)


def _run_local_in_turn(
    plan: SweepPlan, *, echo: IO[str], say: Callable[[str], None], command: Optional[Sequence[str]]
) -> List[Tuple[int, int]]:
    from ..constants import PREEMPTED_EXIT_CODE

    results: List[Tuple[int, int]] = []
    n = len(plan.sweep.elements)
    for i in plan.todo:
        say(f"sweep element {i + 1}/{n} ({plan.sweep.elements[i].label}): run directory {plan.element_dir(i)}")
        told: Set[int] = set()  # the stop signals (Ctrl-C, SIGTERM, the requeue signal) passed to its ranks
        status = _run_local_element(plan, i, echo, say, command, told)
        results.append((i, status))
        if status == PREEMPTED_EXIT_CODE or told:
            break  # a script killed by the stop signal exits 143, not 75: stopped all the same
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

    from ..constants import PREEMPTED_EXIT_CODE
    from ..signals import die_with_parent, forwarded_signals

    n = len(plan.sweep.elements)
    width = len(element_dir_name(n - 1, n))
    queue = list(plan.todo)
    running: Dict[int, int] = {}  # pid -> element index
    results: List[Tuple[int, int]] = []
    parent = os.getpid()
    stopping: List[int] = []  # the signals received (no new element starts once one came)
    sigs = set(forwarded_signals(plan.sweep.base_cfg.requeue.signal_name))

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
                        # still blocked: one passed on before the element's local supervisor catches them
                        # (backends.local.LocalRanksStarter.install, which unblocks them) waits for it, pending,
                        # and is not taken by the default action
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
