"""``submit``: load a job (or a sweep), plan it, check it and start it on the chosen backend.

The one implementation of the ``submit`` verb, for the CLI and the Python API alike. Side effects:
reads the job's YAML, asks Slurm whether a resumed run is busy (``ops.refuse_active_run``),
imports the task in a child process (``preflight``), writes the run or sweep directory and starts
the job (``sbatch``, submitit, or the local ranks, which it waits for). What it has to say goes
through a :class:`Reporter` (the CLI's: stdout and stderr); errors are raised (``UserError``,
``ClusterError``), never turned into exit codes here. Imports no torch.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, Mapping, Optional, Sequence, Union

from ..config import ClusterDefaults, JobConfig
from ..constants import PREEMPTED_EXIT_CODE
from ..errors import UserError

if TYPE_CHECKING:
    from ..sweep import Sweep
    from . import SubmitPlan
    from .after import Dependencies
    from .sweep_plan import SweepPlan

#: A job: the path of its YAML file, or the mapping such a file holds (relative paths then count
#: from the current directory)
Job = Union[str, "os.PathLike[str]", Mapping[str, Any]]


@dataclass(frozen=True)
class Reporter:
    """Where ``submit``'s words go. ``out``: text of the result (the CLI's stdout; each call a whole
    line or block, newline included); ``warn``: a warning (the CLI prints ``slurm-ddp: warning: …``);
    ``say``: a status line of submit or of the local run's supervision (``slurm-ddp: …``); ``echo``:
    rank 0's output of a local run."""

    out: Callable[[str], None]
    warn: Callable[[str], None]
    say: Callable[[str], None]
    echo: Optional[IO[str]] = None


@dataclass(frozen=True)
class Submitted:
    """What :func:`submit` did."""

    run_dir: str  #: the run directory, or a sweep's sweep directory
    backend: str  #: ``sbatch``, ``submitit`` or ``local`` (``auto`` resolved)
    sweep: bool  #: a sweep (``run_dir`` holds one run directory per element)
    job_id: Optional[str] = None  #: the Slurm job id (a sweep: the array job id); None on the local backend
    exit_status: int = 0  #: the local run's (or first failed element's) exit status; 0 for Slurm backends
    started: bool = True  #: False for ``dry_run``, ``test_only`` and a sweep with nothing left to run
    #: the detached submit process that runs a local job (``SubmitRequest.detach``), whose end the caller
    #: may wait for
    detached: Optional[subprocess.Popen[bytes]] = field(default=None, compare=False)


def cluster_request(cfg: JobConfig) -> Optional[str]:
    """What in ``cfg`` asks for a Slurm cluster (``slurm.nodes=2``, ``slurm.partition=gpu``, …), or None
    when it could run as it is on one machine: more than one node, a partition, account, QoS, constraint,
    GPU type, ``exclusive`` or any ``slurm.extra`` option (sbatch's words, which the local backend ignores)."""
    s = cfg.slurm
    asks = [f"slurm.nodes={s.nodes}"] if s.max_nodes > 1 else []
    for key in ("partition", "account", "qos", "constraint", "gpu_type"):
        if getattr(s, key):
            asks.append(f"slurm.{key}={getattr(s, key)}")
    if s.exclusive:
        asks.append("slurm.exclusive=true")
    asks += [f"slurm.extra.{k}" for k in s.extra]
    return ", ".join(asks) or None


def resolve_backend(backend: str, cfg: Optional[JobConfig] = None, warn: Optional[Callable[[str], None]] = None) -> str:
    """``auto`` → ``sbatch`` when it is on PATH; else ``local`` for a job that asks for no cluster
    (:func:`cluster_request`; with a ``warn`` line saying so), and ``UserError`` for one that does: a
    login node before ``module load slurm`` must not train a multi-node or partition job on itself.
    Any other name as given."""
    if backend != "auto":
        return backend
    if shutil.which("sbatch"):
        return "sbatch"
    asks = cluster_request(cfg) if cfg is not None else None
    if asks:
        raise UserError(
            f"Slurm was not found (no sbatch on PATH) and this job asks for a cluster ({asks}); load Slurm "
            "(e.g. module load slurm) to submit it, or pass --backend local to run it on this machine"
        )
    if warn is not None:
        warn("Slurm was not found (no sbatch on PATH): running the job on this machine; pass --backend local to say so")
    return "local"


def check_test_only(requested: str, backend: str, dry_run: bool) -> None:
    """Refuse ``--test-only`` where it cannot apply (with ``--dry-run``, another backend, no sbatch here)."""
    if dry_run:
        raise UserError(
            "--dry-run and --test-only: choose one (--dry-run prints the script; --test-only asks the controller)"
        )
    if requested not in ("auto", "sbatch"):
        raise UserError(f"--test-only checks an sbatch submission; it does not apply to --backend {requested}")
    if backend != "sbatch" or not shutil.which("sbatch"):
        raise UserError(
            "--test-only asks the Slurm controller through sbatch, which is not on PATH here; "
            "run it on a login node of the cluster (or use --dry-run)"
        )


def render(
    job: str,
    overrides: Sequence[str] = (),
    sweep: Sequence[str] = (),
    *,
    warn: Callable[[str], None],
    run_dir: Optional[str] = None,
    command: Optional[Sequence[str]] = None,
    cluster: Optional[str] = None,
) -> str:
    """``slurm-ddp render``: the batch script ``submit`` would write for ``job`` (a sweep: its array
    script), with credential-looking values shown as ``***`` (``slurm_ddp.secrets``), followed by what the
    job's supervisor will do, in comment lines (``supervise.JobPlan.explain``). Reads the
    checkout for the code snapshot's paths; writes nothing and does not check ``run_dir`` (it may
    name a cluster path). Warnings (literal credentials, the renderer's) go to ``warn``. ``cluster``: whose
    per-cluster defaults apply (``cluster_defaults``; default this machine's).

    Raises ``UserError`` for a bad config or code that cannot be snapshotted."""
    from ..secrets import literal_warning

    loaded = load_job(job, overrides, sweep, cluster=cluster)
    if not isinstance(loaded, JobConfig):
        from .array import default_sweep_dir, plan_sweep_script

        line = literal_warning({k: v for e in loaded.elements for k, v in e.cfg.environment.env.items()})
        if line:
            warn(line)
        _, rendered = plan_sweep_script(loaded, run_dir or default_sweep_dir(loaded), command=command)
    else:
        from . import default_run_dir, plan_script

        cfg = loaded
        line = literal_warning(cfg.environment.env)
        if line:
            warn(line)
        # the script submit writes (code paths in the snapshot it would take), without the run-dir checks
        _, rendered = plan_script(cfg, run_dir or default_run_dir(cfg), command=command)
    for w in rendered.warnings:
        warn(w)
    return rendered.printed


def memory_note(cfg: JobConfig, run: Optional[Callable[..., subprocess.CompletedProcess[str]]] = None) -> str:
    """The line ``submit`` and ``--dry-run`` print about the job's memory (``ops.memory.memory_line``):
    what it asks for, else the site's default, asked of ``scontrol`` (``run``, default
    ``subprocess.run``) — "unknown" where Slurm cannot be asked."""
    from ..ops.memory import ask_site_memory, memory_line, size_mb
    from ..render import sbatch_options

    opts = sbatch_options(cfg)
    if size_mb(opts.get("mem") or "") or opts.get("mem_per_cpu") or opts.get("mem_per_gpu"):
        return memory_line(cfg, None)  # asked for: nothing to ask Slurm
    return memory_line(cfg, ask_site_memory(cfg.slurm.partition, run or subprocess.run))


def _preflight(cfg: JobConfig, backend: str, warn: Callable[[str], None]) -> None:
    from ..preflight import ImportCache, check_command, check_task_imports

    check_command(cfg, warn=warn)  # train.command's script and program; torchrun's options
    if not cfg.train.command:
        check_task_imports(cfg, cwd_on_path=backend == "local", warn=warn, cache=ImportCache.default())


def cluster_defaults(cluster: Optional[str] = None) -> Optional[ClusterDefaults]:
    """The per-cluster defaults file's entries (``config.cluster_defaults``) for ``cluster`` (``--cluster``),
    default this machine's cluster (``ops.slurm.local_cluster``, asked only when the file exists); None
    without a file. Raises ``ConfigError`` for a bad file."""
    from ..config import read_cluster_defaults

    if cluster is not None:
        return read_cluster_defaults(cluster, how="--cluster")
    from ..ops.slurm import local_cluster

    return read_cluster_defaults(lambda: local_cluster(), how="this machine's")


def load_job(
    job: Job, overrides: Sequence[str] = (), sweep: Sequence[str] = (), cluster: Optional[str] = None
) -> Union[JobConfig, Sweep]:
    """The job's validated config, or its sweep (``sweep`` specs or a ``sweep:`` section), over the
    per-cluster defaults of ``cluster`` (:func:`cluster_defaults`). ``job``: a YAML path, or a mapping
    (relative paths from the current directory). Raises ``ConfigError``."""
    from ..config import apply_overrides, config_from_dict, config_with_defaults, load_config_with_defaults
    from ..sweep import load_sweep, sweep_from_data

    defaults = cluster_defaults(cluster)
    if isinstance(job, Mapping):
        loaded = sweep_from_data(dict(job), overrides, sweep, base_dir=Path.cwd(), defaults=defaults)
        if loaded is not None:
            return loaded
        if defaults is not None:
            return config_with_defaults(dict(job), defaults, overrides, base_dir=Path.cwd(), job_label="job mapping")
        data: Any = apply_overrides(dict(job), overrides) if overrides else dict(job)
        return config_from_dict(data, base_dir=Path.cwd())
    loaded = load_sweep(os.fspath(job), overrides, sweep, defaults=defaults)
    return loaded if loaded is not None else load_config_with_defaults(job, overrides, defaults)


@dataclass(frozen=True)
class SubmitRequest:
    """What one ``submit`` is asked to do: the flags of ``slurm-ddp submit`` (built once by the CLI) or the
    keyword arguments of ``slurm_ddp.api.submit`` (built there), passed down unchanged to
    :func:`submit_run` and :func:`submit_sweep`. The sequences given are stored as tuples (a single string
    as a tuple of one: one ``--set``, ``--sweep`` or ``--after``) and a path-like ``job`` as a string, so a
    request holds no caller's list and compares and prints by value.

    Raises ``UserError`` for ``cluster`` without ``dry_run`` (a submit goes to this machine's cluster).
    """

    #: the job: a YAML path, or the mapping such a file holds (relative paths from the current directory)
    job: Job
    #: ``SECTION.KEY=VALUE`` strings, applied in order over the file (``--set``; ``config.apply_overrides``)
    overrides: Sequence[str] = ()
    #: ``KEY=V1,V2`` strings (``--sweep``; ``slurm_ddp.sweep``); a sweep also when the file has ``sweep:``
    sweep: Sequence[str] = ()
    #: ``auto``, ``sbatch``, ``submitit`` or ``local`` (``--backend``; ``auto``: :func:`resolve_backend`)
    backend: str = "auto"
    #: the run directory (a sweep: its sweep directory); None: ``./runs/<name>`` (``--run-dir``)
    run_dir: Optional[str] = None
    #: the command line recorded in the script header and ``provenance.json``; None: not known (the API)
    command: Optional[Sequence[str]] = None
    #: print what would be submitted after submit's checks, and write and queue nothing (``--dry-run``)
    dry_run: bool = False
    #: ask the controller with ``sbatch --test-only`` instead of submitting (``--test-only``)
    test_only: bool = False
    #: import ``train.task`` in a child process first (``--no-check-task`` turns it off)
    check_task: bool = True
    #: resume a run whose code snapshot differs from the checkout's (``--accept-new-code``)
    accept_new_code: bool = False
    #: dependency specs ``RUN_DIR|JOBID[:afterok|:afterany|:afternotok]`` (``--after``; ``after.parse_after``)
    after: Sequence[str] = ()
    #: a local run starts in a detached submit process of its own session (``backends.detached``), and
    #: ``submit`` returns at once; False: it is waited for (the Python API detaches, the CLI waits)
    detach: bool = False
    #: whose per-cluster defaults apply (``--cluster``; :func:`cluster_defaults`), for a dry run only;
    #: None: this machine's cluster
    cluster: Optional[str] = None

    def __post_init__(self) -> None:
        if not isinstance(self.job, Mapping):
            object.__setattr__(self, "job", os.fspath(self.job))
        for name in ("overrides", "sweep", "after"):
            given = getattr(self, name)  # a single string is one item (one --set), not its characters
            object.__setattr__(self, name, (given,) if isinstance(given, str) else tuple(given))
        if self.command is not None:
            object.__setattr__(self, "command", tuple(self.command))
        if self.cluster is not None and not self.dry_run:
            raise UserError(
                f"--cluster {self.cluster} picks the per-cluster defaults for render, env and submit --dry-run; a "
                "submit goes to this machine's cluster with its defaults: run it on a login node of that cluster"
            )

    @property
    def job_shown(self) -> str:
        """The job as a resume hint names it (``slurm-ddp submit JOB ...``): its path, or ``JOB.yaml`` for a
        mapping (which has no file)."""
        return "JOB.yaml" if isinstance(self.job, Mapping) else str(self.job)


def submit(request: SubmitRequest, *, report: Reporter) -> Submitted:
    """Submit ``request.job`` (with its ``--set`` overrides; a sweep when ``request.sweep`` specs or the
    file's ``sweep:`` section say so) on ``request.backend``. A local run is waited for, unless
    ``request.detach``: then a detached submit process of its own session runs it (output in the run
    directory's ``LAUNCHER_OUT_NAME``) and ``Submitted.detached`` is that process. Slurm backends return
    once the job is accepted. The job file is merged over the per-cluster defaults of this machine's
    cluster (:func:`cluster_defaults`); ``request.cluster`` names another one, for a dry run only.

    Raises ``UserError`` (bad config, run directory, backend, flags, dependency) or ``ClusterError``
    (sbatch or submitit refused the job); nothing is submitted then.
    """
    loaded = load_job(request.job, request.overrides, request.sweep, cluster=request.cluster)
    if request.test_only and request.backend == "auto":
        chosen = "sbatch"  # check_test_only says when it is not here
    else:
        chosen = resolve_backend(
            request.backend, loaded if isinstance(loaded, JobConfig) else loaded.elements[0].cfg, report.warn
        )
    if not isinstance(loaded, JobConfig):
        return submit_sweep(loaded, request, report=report, backend=chosen)
    if request.test_only:
        check_test_only(request.backend, chosen, request.dry_run)
    return submit_run(loaded, request, report=report, backend=chosen)


def _detach_spec(request: SubmitRequest) -> Dict[str, Any]:
    """What the detached submit process (``backends.detached``) needs to load and run the job again."""
    job = request.job
    return {
        "job": None if isinstance(job, Mapping) else os.path.abspath(job),
        "data": dict(job) if isinstance(job, Mapping) else None,
        "cwd": os.getcwd(),
        "overrides": list(request.overrides),
        "sweep": list(request.sweep),
        "command": list(request.command) if request.command is not None else None,
        "after": list(request.after),
        "accept_new_code": request.accept_new_code,
    }


def _start_detached(spec: Dict[str, Any], run_dir: str, out_dir: str) -> subprocess.Popen[bytes]:
    """Start ``python -m slurm_ddp.backends.detached SPEC`` in a session of its own, output to
    ``out_dir/LAUNCHER_OUT_NAME``: the detached submit process. The spec file is owner-only (it may hold
    ``environment.env`` values) and that process removes it once read."""
    import tempfile

    import yaml

    from ..rundir import LAUNCHER_OUT_NAME

    spec = {**spec, "run_dir": run_dir}
    fd, path = tempfile.mkstemp(prefix="slurm-ddp-detached-", suffix=".yaml")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        yaml.safe_dump(spec, f)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, LAUNCHER_OUT_NAME), "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "slurm_ddp.backends.detached", path],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=spec["cwd"],
        )


def _dependencies(after: Sequence[str], backend: str, report: Reporter) -> Dependencies:
    from .after import resolve_after

    deps = resolve_after(after, backend)
    for n in deps.notes:
        report.warn(n)
    return deps


def submit_run(cfg: JobConfig, request: SubmitRequest, *, report: Reporter, backend: str) -> Submitted:
    """:func:`submit` of ``request``'s job, loaded as ``cfg``, on ``backend`` (resolved: not ``auto``);
    ``request.detach`` runs a local job in a detached submit process of its own."""
    from . import plan_submit

    test_only, command = request.test_only, request.command
    deps = _dependencies(request.after, backend, report)
    plan = plan_submit(
        cfg,
        backend,
        request.run_dir,
        command=command,
        accept_new_code=request.accept_new_code,
        dependency=deps.slurm,
    )
    if backend in ("sbatch", "submitit") and not test_only:
        plan = dataclasses.replace(plan, memory=memory_note(cfg))
    for w in plan.warnings:
        report.warn(w)
    # a dry run checks what submit checks: a resumed run that is still active, the task or command
    if plan.resuming and not test_only:
        from ..ops import refuse_active_run

        note = refuse_active_run(Path(plan.run_dir))
        if note:
            report.warn(note)
    if request.check_task:
        _preflight(cfg, backend, report.warn)
    if request.dry_run:
        if backend == "submitit":  # submitit's own batch script, not the sbatch backend's
            from .submitit_backend import describe

            report.out(describe(plan))
        else:
            report.out(plan.describe())
        return Submitted(plan.run_dir, backend, sweep=False, started=False)
    if test_only:
        from .sbatch import sbatch_test_only

        answer = sbatch_test_only(plan)
        report.out(
            f"slurm-ddp: sbatch --test-only accepted the job (nothing submitted, no run directory written): {answer}\n"
        )
        return Submitted(plan.run_dir, backend, sweep=False, started=False)
    if backend == "sbatch":
        from .sbatch import schedule

        job_id = schedule(plan, warn=report.warn)
        report.out(f"slurm-ddp: {plan.memory}\n")
        report.out(f"submitted job {job_id}; run directory {plan.run_dir}\n")
        return Submitted(plan.run_dir, backend, sweep=False, job_id=job_id)
    if backend == "submitit":
        from .submitit_backend import schedule as submitit_schedule

        job_id = submitit_schedule(plan, warn=report.warn)
        report.out(f"slurm-ddp: {plan.memory}\n")
        report.out(f"submitted job {job_id} through submitit; run directory {plan.run_dir}\n")
        return Submitted(plan.run_dir, backend, sweep=False, job_id=job_id)
    if request.detach:
        detached = _start_detached(_detach_spec(request), plan.run_dir, plan.run_dir)
        report.out(
            f"slurm-ddp: started a detached submit process (process {detached.pid}); run directory {plan.run_dir}\n"
        )
        return Submitted(plan.run_dir, backend, sweep=False, detached=detached)
    if deps.local:
        from .after import wait_for_runs

        wait_for_runs(deps.local, report.say, run_dir=plan.run_dir)
    return run_local(plan, job=request.job_shown, report=report)


def run_local(plan: SubmitPlan, *, job: Union[Job, str], report: Reporter) -> Submitted:
    """Run ``plan`` (a local backend's) here, wait, and say how it ended."""
    from ..rundir import FINAL_MODEL_NAME, LOGS_DIR, read_finished, read_local_end
    from .local import schedule as local_schedule

    cfg = plan.cfg
    backend = plan.backend
    report.out(
        f"slurm-ddp: running {cfg.slurm.world_size} ranks locally; run directory {plan.run_dir}"
        + plan.existing_words()
        + "\n"
    )
    status = local_schedule(plan, echo=report.echo, say=report.say)
    rec = read_finished(plan.run_dir)
    if status == 0 and rec is not None and rec.get("command"):
        report.out(
            f"slurm-ddp: finished: every rank of train.command exited with status 0; run directory {plan.run_dir}\n"
        )
    elif status == 0 and rec is not None:
        acc = rec.get("eval_accuracy")
        report.out(
            f"slurm-ddp: finished at step {rec.get('step', '?')}"
            + (f", eval accuracy {acc:.4f}" if acc is not None else "")
            + f"; weights in {Path(plan.run_dir) / FINAL_MODEL_NAME}\n"
        )
    elif status == PREEMPTED_EXIT_CODE or getattr(read_local_end(plan.run_dir), "state", "") == "CANCELLED":
        # what happened: the local supervisor's PREEMPTED/CANCELLED line (rundir.local_end)
        # "resume" only where the next start has a checkpoint to use (ops.runs.Run.next_start)
        from ..ops.runs import read_run

        verb = "resume" if read_run(Path(plan.run_dir)).next_start().resumes else "submit again"
        report.say(f"{verb} with: slurm-ddp submit {job} --backend local --run-dir {plan.run_dir}")
    else:
        report.say(f"job failed with status {status}; logs in {Path(plan.run_dir) / LOGS_DIR}")
    return Submitted(plan.run_dir, backend, sweep=False, exit_status=status)


def submit_sweep(sweep: Sweep, request: SubmitRequest, *, report: Reporter, backend: str) -> Submitted:
    """:func:`submit` of a sweep: one sweep directory, one ``sbatch --array`` (several past the
    cluster's ``MaxArraySize``; or the local backend, element by element) of the elements that have
    not finished. Refused (``UserError``) when they exceed the user's submit limit by themselves
    (``sweep.submit_limit``)."""
    import dataclasses

    from ..sweep import check_submit_limit, max_array_size, submit_limit
    from .array import plan_sweep, schedule_sbatch

    if request.test_only:
        raise UserError("--test-only checks a single job; for a sweep use --dry-run")
    dry_run, command = request.dry_run, request.command
    deps = _dependencies(request.after, backend, report)
    on_slurm = backend in ("sbatch", "submitit")
    plan = plan_sweep(
        sweep,
        backend,
        request.run_dir,
        command=command,
        accept_new_code=request.accept_new_code,
        dependency=deps.slurm,
        max_array_size=max_array_size() if on_slurm else None,
    )
    if on_slurm:
        plan = dataclasses.replace(plan, memory=memory_note(sweep.base_cfg))
    if on_slurm and plan.todo:
        s = sweep.base_cfg.slurm
        limit = submit_limit(account=s.account or "", qos=s.qos or "", partition=s.partition or "")
        note = check_submit_limit(limit, len(plan.todo), len(sweep.elements))
        plan = dataclasses.replace(plan, limit_line=limit.describe(len(plan.todo)))
        if note:
            report.warn(note)
    # a dry run checks what submit checks. A resumed sweep with elements still pending or running is refused
    # on every backend: a sweep run locally into the directories of a running array, too
    if plan.resuming and plan.todo:
        from ..ops.sweeps import progress_kind, read_sweep, sweep_status

        active = [
            e.index
            for e, st in sweep_status(read_sweep(Path(plan.sweep_dir))).elements
            if progress_kind(st) in ("running",) or (st.slurm is not None and not st.final)
        ]
        if active:
            raise UserError(
                f"sweep {plan.sweep_dir!r} still has {len(active)} element(s) pending or running "
                f"(e.g. element {active[0]}); wait for them, or cancel first: slurm-ddp cancel {plan.sweep_dir}"
            )
    if request.check_task and (plan.todo or dry_run):
        _preflight(sweep.elements[0].cfg, backend, report.warn)
    if dry_run:
        for w in plan.warnings:
            report.warn(w)
        report.out(plan.describe())
        return Submitted(plan.sweep_dir, backend, sweep=True, started=False)
    if not plan.todo:
        report.out(f"every element of sweep {sweep.name!r} has finished; nothing to submit ({plan.sweep_dir})\n")
        return Submitted(plan.sweep_dir, backend, sweep=True, started=False)
    for w in plan.warnings:
        report.warn(w)
    n = len(sweep.elements)
    if backend == "sbatch":
        from ..sweep import array_spec, chained

        job_id = schedule_sbatch(plan)
        report.out(f"slurm-ddp: {plan.memory}\n")
        if len(plan.arrays) > 1:
            from ..rundir import read_sweep_jobs

            ids = [str(j.get("job_id")) for j in read_sweep_jobs(plan.sweep_dir)[-len(plan.arrays) :]]
            shown = ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")
            report.out(
                f"submitted {len(ids)} job arrays {shown} (MaxArraySize {plan.max_array_size}; "
                + ("one after another, " if chained(plan.arrays, sweep.parallelism) else "")
                + f"--array={plan.arrays[0].spec(sweep.parallelism)} first): {len(plan.todo)} of {n} elements; "
                f"sweep directory {plan.sweep_dir}\n"
            )
        else:
            report.out(
                f"submitted job array {job_id} (--array={array_spec(plan.todo, sweep.parallelism)}): "
                f"{len(plan.todo)} of {n} elements; sweep directory {plan.sweep_dir}\n"
            )
        return Submitted(plan.sweep_dir, backend, sweep=True, job_id=job_id)
    if backend == "submitit":
        from .submitit_sweep import array_flag, schedule_submitit, task_arrays

        job_id = schedule_submitit(plan, warn=report.warn)
        arrays = len(task_arrays(plan))
        report.out(f"slurm-ddp: {plan.memory}\n")
        report.out(
            (f"submitted {arrays} job arrays, the first {job_id}," if arrays > 1 else f"submitted job array {job_id}")
            + f" through submitit ({array_flag(plan)}{' first' if arrays > 1 else ''}): "
            f"{len(plan.todo)} of {n} elements; sweep directory {plan.sweep_dir}\n"
        )
        return Submitted(plan.sweep_dir, backend, sweep=True, job_id=job_id)
    if request.detach:
        detached = _start_detached(_detach_spec(request), plan.sweep_dir, plan.sweep_dir)
        report.out(
            f"slurm-ddp: started a detached submit process (process {detached.pid}); sweep directory {plan.sweep_dir}\n"
        )
        return Submitted(plan.sweep_dir, backend, sweep=True, detached=detached)
    if deps.local:
        from .after import wait_for_runs

        wait_for_runs(deps.local, report.say)
    return run_local_sweep(plan, report=report, command=command)


def run_local_sweep(plan: SweepPlan, *, report: Reporter, command: Optional[Sequence[str]] = None) -> Submitted:
    """Run the unfinished elements of ``plan`` (a local backend's) here, wait, and say how they ended."""
    from .array import schedule_local

    sweep, backend = plan.sweep, plan.backend
    results = schedule_local(plan, echo=report.echo or sys.stdout, say=report.say, command=command)
    failed = [(i, rc) for i, rc in results if rc != 0]
    done = len(results) - len(failed)
    report.out(
        f"slurm-ddp: sweep {sweep.name!r}: {done} of {len(results)} element(s) run finished; "
        f"sweep directory {plan.sweep_dir}\n"
    )
    if failed:
        i, rc = failed[0]
        report.say(
            f"element {i} ({sweep.elements[i].label}) ended with status {rc}; "
            f"submit the sweep again with --run-dir {plan.sweep_dir} to resume the unfinished elements"
        )
        return Submitted(plan.sweep_dir, backend, sweep=True, exit_status=rc)
    return Submitted(plan.sweep_dir, backend, sweep=True)
