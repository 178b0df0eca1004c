"""``python -m slurm_ddp.launch --run-dir DIR -- CMD [ARG...]``: bind this task, then exec CMD.

The edge that applies ``slurm_ddp.binding``: it reads ``DIR/config.yaml`` and the SLURM
task variables, plans the rank's binding, sets the planned variables (OMP_*, KMP_*,
LD_PRELOAD), pins the process with ``os.sched_setaffinity`` and replaces itself with CMD
(prefixed by ``numactl --cpunodebind=N --membind=N`` in ``numa`` mode) through
``os.execvpe`` — same pid, so signals sent to the task reach CMD. ``LD_PRELOAD`` only
takes effect in a process started after it is set, which is why this is a wrapper and not
code inside the worker. The srun line of the sbatch script (or, with ``slurm.launcher:
torchrun``, torchrun on each node), the local backend and submitit start every rank through
it. CMD gets the torchrun environment contract (``DistEnv.torch_env``: RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK, MASTER_ADDR, MASTER_PORT), the run
directory as ``SLURM_DDP_RUN_DIR`` and the requeue signal as ``SLURM_DDP_REQUEUE_SIGNAL``. Imports no torch; with ``cpu_bind: none``, ``allocator: system``
and ``openmp: gnu`` it reads no /sys file and runs no subprocess.

``environment.env``'s values that hold a ``$`` are set here, ``$VAR``/``${VAR}`` expanded in the rank's
environment (``config.expand_env``; the batch script exports only the others). Then the ranks' interpreter's
directory goes first on ``PATH`` (:func:`python_first_on_path`): the one owner of the ranks' ``PATH``, for
every backend.

A ``train.command`` rank is different in two ways. Its words have ``$VAR``/``${VAR}`` of the
rank's environment expanded (``$$`` is a literal ``$``; :func:`expand_command`), ``${args.NAME}``
replaced by the run's ``train.args.NAME``, and the other ``train.args`` entries appended as
``--NAME=VALUE`` (``slurm_ddp.config.command``): how a sweep element's values reach the script. A
sweep element's rank runs in the element's own working directory, ``RUN_DIR/work``
(``rundir.ELEMENT_WORKDIR``), made at submit. With ``train.resume`` the words end with the newest complete
checkpoint of the script's own (``--resume_from_checkpoint PATH`` for ``hf``) at every start but the first,
the same on every rank of a start (:func:`resume_command`, ``rundir.script_checkpoints``), and the rank's log
names it and every newer one skipped as incomplete. And the wrapper
does not replace itself: it forks the command (binding, rank log and hang watchdog as above) and
stays as its parent, so that it sees the signals its rank is sent — Slurm signals every process
of a task (``proctrack``), torchrun the worker's pid, the local supervisor the rank's process
group; the wrapper passes nothing on, the command gets them as before. A stop signal (SIGTERM,
SIGINT, SIGHUP, ``requeue.signal``) is recorded in the run directory
(``rundir.record_rank_stop``), where the finished and requeue rules read it: a script that exits
0 after it has stopped, not finished. The wrapper exits with the command's status, or dies of the
signal that killed it.

Under in-job recovery (the batch script sets ``PEER_LOST_VAR`` for each training step) a
``train.command`` rank that ends with a failure — a non-zero status other than the preemption status
75, or death by a signal, and no stop signal recorded before — makes the wrapper leave the step's
peer-lost marker (``rundir.write_peer_lost``, :func:`report_failure`) before it exits: a plain script
whose gloo/NCCL collective fails because a peer's node vanished exits 1 with a traceback, and the
batch script then ends srun at once instead of waiting for the lost node's tasks until Slurm marks the
node DOWN (``SlurmdTimeout``). The wrapper cannot tell a peer's loss from a crash of the script's own;
it reports both, and the probe of the step's nodes that follows decides: a crash on healthy nodes
names no node, and the requeue rule decides as without the marker.

``--dry-run`` prints the plan as JSON and the command instead of running it. A binding
that cannot be applied (numactl or a library missing) prints one line
``slurm_ddp launch: error: …`` naming the package to install, and exits 2.

Why over 600 lines: it is everything a rank does between srun (or torchrun) and its own interpreter, in
one process: the environment it derives, the binding it applies and the exec, each a named step; split, the
steps would pass the half-built environment between modules.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .entrypoint import run_main
from .errors import CommandNotRunnable, UserError
from .rundir import ENV_EXPANDED_VAR, RUN_DIR_VAR, SIGNAL_VAR, TORCHRUN_OMP_VAR  # the run directory's variables

if TYPE_CHECKING:  # imported where used, so that a plain binding imports as little as it can
    from .binding import BindingPlan
    from .config import JobConfig
    from .env import DistEnv

USAGE = "usage: python -m slurm_ddp.launch --run-dir DIR [--dry-run] [--rank-log] [--no-watchdog] -- CMD [ARG...]"


def parse_args(argv: Sequence[str]) -> Tuple[str, bool, List[str]]:
    """``(run_dir, dry_run, command)`` from ``argv``; raises ``UserError`` with the usage line.
    (``--rank-log`` and ``--no-watchdog`` are read by :func:`parse_options`.)"""
    run_dir, dry, _, _, cmd = parse_options(argv)
    return run_dir, dry, cmd


def parse_options(argv: Sequence[str]) -> Tuple[str, bool, bool, bool, List[str]]:
    """``(run_dir, dry_run, rank_log, no_watchdog, command)`` from ``argv``; raises ``UserError`` with
    the usage line.

    ``--rank-log``: send this rank's stdout and stderr to ``RUN_DIR/logs/rank-RANK.log`` (appended),
    as srun's ``--output`` does for the srun launcher; the torchrun launcher starts ranks through it.
    ``--no-watchdog``: CMD is not the rank but starts it through this wrapper again (submitit's Python
    running ``train.command``): the inner start makes the rank's one hang watchdog, expands the
    command's words and ``train.args`` and enters a sweep element's working directory; this one none."""
    argv = list(argv)
    if "--" not in argv:
        raise UserError(f"no command after '--'; {USAGE}")
    cut = argv.index("--")
    opts, cmd = argv[:cut], argv[cut + 1 :]
    run_dir, dry, rank_log, no_watchdog = None, False, False, False
    i = 0
    while i < len(opts):
        if opts[i] == "--run-dir" and i + 1 < len(opts):
            run_dir = opts[i + 1]
            i += 2
        elif opts[i].startswith("--run-dir="):
            run_dir = opts[i].split("=", 1)[1]
            i += 1
        elif opts[i] == "--dry-run":
            dry = True
            i += 1
        elif opts[i] == "--rank-log":
            rank_log = True
            i += 1
        elif opts[i] == "--no-watchdog":
            no_watchdog = True
            i += 1
        else:
            raise UserError(f"unknown option {opts[i]!r}; {USAGE}")
    if not run_dir or not cmd:
        raise UserError(USAGE)
    return run_dir, dry, rank_log, no_watchdog, cmd


def plan_here(cfg: JobConfig, environ: Mapping[str, str]) -> BindingPlan:
    """The binding plan of this process, a SLURM task of ``cfg``: reads the affinity, and
    /sys and ``ldconfig -p`` only when the config needs them."""
    from . import binding

    e = cfg.environment
    allowed = os.sched_getaffinity(0)
    plain = e.cpu_bind == "none" and e.allocator == "system" and e.openmp == "gnu"
    numa = core_ids = gpus = None
    if not plain:
        numa = binding.read_numa_nodes()
        core_ids = binding.read_core_ids(allowed)
        if cfg.slurm.gpu_job:  # each local task's GPU (what Slurm assigned) → its NUMA node
            from .devices import read_devices_constrained, slot_gpus

            by_index = binding.read_gpu_numa_by_index()  # every GPU of the node: {index: NUMA node}
            slots = slot_gpus(
                environ, constrained=read_devices_constrained(environ), node_gpu_count=len(by_index) or None
            )
            gpus = [by_index.get(int(g), -1) if g is not None and g.isdigit() else -1 for g in slots]
    libraries = binding.locate_libraries(binding.needed_libraries(cfg), environ)
    numactl = shutil.which("numactl", path=environ.get("PATH")) if e.cpu_bind == "numa" else None
    return binding.plan_for_task(
        cfg,
        environ,
        allowed=allowed,
        numa=numa,
        core_ids=core_ids,
        gpu_numa_nodes=gpus,
        libraries=libraries,
        numactl=numactl,
    )


def expand_command(
    words: Sequence[str], environ: Mapping[str, str], args: Optional[Mapping[str, Any]] = None
) -> List[str]:
    """``words`` with ``$NAME`` and ``${NAME}`` replaced by ``environ[NAME]`` and ``$$`` by ``$``;
    with ``args`` (``train.args``), ``${args.NAME}`` by ``args[NAME]`` (``config.command_arg_text``) and
    every entry no word places that way appended as ``--NAME=VALUE`` (``config.command_arg_flags``).

    The rule of ``train.command`` at rank start (the rank's own environment: ``SLURM_DDP_RUN_DIR``,
    ``RANK``, ``SLURM_JOB_ID``, ...; the run's ``train.args``, a sweep element's own), by
    ``config.expand_variables``, the rule of ``environment.env``'s values too. Raises ``UserError`` for a
    variable that is not set, an ``${args.NAME}`` that ``train.args`` lacks, and a ``$`` followed by
    anything else.
    """
    from .config import command_arg_flags, expand_variables  # the one rule, environment.env's values too

    given = dict(args or {})
    placed: Set[str] = set()
    out = [expand_variables(w, environ, f"train.command word {w!r}", args=given, placed=placed) for w in words]
    return out + command_arg_flags(given, placed)


def python_first_on_path(path: str, python: str) -> str:
    """``path`` (a ``PATH`` value, ``os.pathsep``-separated) with the directory of ``python`` first: the ranks'
    ``PATH``, so that ``python`` in a wrapper (``bash run.sh`` ending in ``exec python train.py``) and in a
    script's subprocesses is the ranks' interpreter, the one this wrapper runs in (``environment.python``,
    ``environment.container.python`` inside a container, default the one that submitted), without an activated
    virtual environment. Applied at every rank's start after ``environment.setup`` (run by the batch shell
    before srun) and ``environment.env`` (its ``PATH: /opt/x/bin:$PATH`` included), so it comes before what
    they put first; the rest of ``PATH`` stays in its order (``conda activate``'s and ``module load``'s
    directories too). ``python``'s directory is taken as given, not with its symbolic links resolved (a
    virtual environment's ``bin/python`` links to the base interpreter). Unchanged when it is already first
    or ``python`` is empty (``sys.executable`` can be). Pure."""
    d = os.path.dirname(python)
    if not d:
        return path
    parts = path.split(os.pathsep) if path else []
    if parts and os.path.normpath(parts[0] or ".") == os.path.normpath(d):
        return path
    return os.pathsep.join([d, *parts])


def resume_command(
    cfg: JobConfig, denv: DistEnv, env: Mapping[str, str], cmd: List[str], publish: bool = True
) -> Tuple[List[str], List[str]]:
    """``(cmd, log lines)``: the ``train.command`` words ``cmd`` (expanded) with the checkpoint this start
    resumes from (``train.resume``; ``rundir.script_checkpoints.resume_at_start``), and what the rank's log
    says of it. Runs in the ranks' working directory.

    Every rank of a start passes the SAME checkpoint: the first rank of the start to get here decides and
    records its decision in the run directory (``RUN_DIR/resumes/JOB.RESTART[.ATTEMPT].json``, linked into
    place whole: one writer), and every other rank of the start reads that record instead of listing the
    directory itself (a node's NFS cache can show another listing). ``publish=False`` (``--dry-run``): this
    rank's own decision, not recorded. A run directory where the record can be neither written nor read:
    this rank's own decision too, with a note."""
    from .rundir import ScriptResume, resume_at_start, resume_lines

    def start(publish: bool) -> Tuple[List[str], Optional[ScriptResume]]:
        return resume_at_start(
            cfg,
            env[RUN_DIR_VAR],
            cmd,
            os.getcwd(),
            env,
            job_id=str(denv.job_id),
            restart=denv.restart_count,
            rank=denv.rank,
            world_size=denv.world_size,
            publish=publish,
        )

    notes: List[str] = []
    try:
        out, record = start(publish)
    except OSError as err:
        notes.append(f"note: could not record this start's train.resume decision ({err}); this rank decided alone")
        out, record = start(False)
    if record is not None:
        notes += resume_lines(record)
    return out, notes


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry of ``python -m slurm_ddp.launch``: does not return when CMD starts; else the exit status
    (2 a bad run directory or binding, 127 CMD cannot run), after one ``slurm_ddp launch: error:`` line."""
    args = sys.argv[1:] if argv is None else argv
    return run_main("slurm_ddp launch", lambda: _bind_and_exec(args))


def _bind_and_exec(argv: Sequence[str]) -> int:
    """The wrapper's work, step by step: the config, this rank's environment, the binding plan and the
    command's environment, the command (``train.command``: its arguments, working directory and resume),
    then a dry run's report, or the start's record, the CPU pinning, the rank log and the exec (or, for a
    ``train.command``, the supervised run)."""
    from .binding import APPLIED_VAR

    run_dir, dry, rank_log, no_watchdog, cmd = parse_options(argv)
    cfg = _load_run_config(run_dir)
    environ, denv = _rank_environ(cfg, run_dir)
    plan = plan_here(cfg, environ)
    env = plan.environ(environ)
    env[APPLIED_VAR] = plan.summary()
    env.update(_command_environ(cfg, denv, env, run_dir))
    resume_notes: List[str] = []
    # the rank's train.command (not submitit's Python that starts it through this wrapper again: --no-watchdog)
    if cfg.train.command and not no_watchdog:
        cmd, resume_notes = _prepare_command(cfg, denv, env, cmd, publish=not dry)
        run_dir = env[RUN_DIR_VAR]  # absolute: the paths below must not follow the chdir
    full = plan.command(cmd)
    if dry:
        print(json.dumps(_dry_run_report(plan, full, denv), indent=1))
        return 0
    for note in plan.notes:
        print(f"slurm_ddp launch: note: {note}", file=sys.stderr, flush=True)
    _record_start(run_dir, environ, denv)
    _pin(plan.affinity)
    sys.stdout.flush()
    sys.stderr.flush()
    if rank_log:
        _to_rank_log(run_dir, denv.rank)
    for note in resume_notes:  # in the rank's log (srun's --output, or the one opened above)
        print(f"slurm_ddp launch: rank {denv.rank}: {note}", file=sys.stderr, flush=True)
    if cfg.train.command:
        return _supervise(cfg, denv, env, full, watchdog=not no_watchdog)
    return _exec_worker(cfg, denv, env, full, watchdog=not no_watchdog)


def _load_run_config(run_dir: str) -> JobConfig:
    """The run directory's ``config.yaml``. Raises ``UserError`` when ``run_dir`` holds none."""
    from .config import load_config
    from .rundir import CONFIG_NAME

    path = Path(run_dir) / CONFIG_NAME
    if not path.is_file():
        raise UserError(f"{path} does not exist: --run-dir must be a run directory made by `slurm-ddp submit`")
    return load_config(path)


def _rank_environ(cfg: JobConfig, run_dir: str) -> Tuple[Dict[str, str], DistEnv]:
    """This rank's environment before the binding plan, and its place in the job: the rank variables an OCI
    container's task lacks (``env.container_step_env``), torchrun's ``OMP_NUM_THREADS=1`` dropped
    (``TORCHRUN_OMP_VAR``), ``environment.env``'s ``$NAME`` values expanded once per rank start
    (``ENV_EXPANDED_VAR``; before the plan, which reads ``OMP_*``/``KMP_*``), this interpreter first on
    ``PATH``. PID 1 of the local backend's OCI container is tied to its parent first."""
    from .config import expand_env
    from .env import DistEnv, container_step_env

    environ = dict(os.environ)
    if os.getpid() == 1 and environ.get("SLURM_DDP_BACKEND") == "local":
        # PID 1 of the local backend's OCI container (container.local_rank_argv): like every local rank it must
        # not outlive the local supervisor, whose death SIGKILLs `runc run`; runc does not take its container with it
        from .signals import die_with_parent

        die_with_parent()
    # inside Slurm's OCI container support the task's rank variables are missing (env.container_step_env)
    environ.update(container_step_env(environ, socket.gethostname()))
    denv = DistEnv.from_environ(environ)
    if environ.pop(TORCHRUN_OMP_VAR, "") == "1" and denv.launcher == "torchrun":
        environ.pop("OMP_NUM_THREADS", None)  # torchrun's default of 1, not the user's
    this_rank = f"{Path(run_dir).resolve()}:{denv.job_id}:{denv.restart_count}:{denv.rank}"
    if environ.get(ENV_EXPANDED_VAR) != this_rank:  # not again in a start through this wrapper (submitit's command)
        # environment.env's values with $NAME, in the rank's environment (the torchrun variables and the run
        # directory too), as train.command's words
        seen = {**environ, **denv.torch_env(), RUN_DIR_VAR: str(Path(run_dir).resolve())}
        environ.update(expand_env(cfg.environment.env, seen))
        environ[ENV_EXPANDED_VAR] = this_rank
    environ["PATH"] = python_first_on_path(environ.get("PATH", ""), sys.executable)
    return environ, denv


def _command_environ(cfg: JobConfig, denv: DistEnv, env: Mapping[str, str], run_dir: str) -> Dict[str, str]:
    """What the command's environment ``env`` (the binding plan's) gets on top: NCCL's defaults where the user
    set none (GPU jobs, ``devices.NCCL_DEFAULTS``), the torchrun environment contract (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``/``NODE_RANK``, ``MASTER_ADDR``/``PORT``)
    whatever started it (srun, torchrun, the local supervisor, submitit), the run directory and
    ``requeue.signal``, the checkpoint interval rule's figures (``checkpoint.every_s: auto``), the trackers' run ids."""
    out: Dict[str, str] = {}
    if cfg.slurm.gpu_job:  # NCCL's settings where the user set none (slurm_ddp.devices.NCCL_DEFAULTS)
        from .devices import nccl_environment

        out.update(nccl_environment(dict(env))[0])
    out.update(denv.torch_env())
    out[RUN_DIR_VAR] = str(Path(run_dir).resolve())
    out[SIGNAL_VAR] = cfg.requeue.signal_name
    if cfg.checkpoint.auto_interval:  # the interval rule's figures for the script (slurm_ddp.preemption)
        out.update(_interval_environment(cfg, denv, Path(run_dir)))
    if cfg.tracking.mlflow.enabled or cfg.tracking.wandb.enabled:  # MLFLOW_RUN_ID, WANDB_RUN_ID … (slurm_ddp.tracking)
        from .tracking import rank_env

        out.update(rank_env(run_dir))
    return out


def _prepare_command(
    cfg: JobConfig, denv: DistEnv, env: Dict[str, str], cmd: List[str], *, publish: bool
) -> Tuple[List[str], List[str]]:
    """A ``train.command`` rank's command and the notes for its log: the run's (a sweep element's)
    ``train.args`` as ``${args.NAME}`` and ``--NAME=VALUE``, the sweep element's working directory entered,
    ``train.resume``'s checkpoint (``resume_command``). Raises ``UserError`` when the working directory cannot
    be entered."""
    from .rundir import ELEMENT_WORKDIR

    cmd = expand_command(cmd, env, cfg.train.args)
    work = Path(env[RUN_DIR_VAR]) / ELEMENT_WORKDIR
    if work.is_dir():  # a sweep element: its relative outputs are its own (made at submit)
        try:
            os.chdir(work)
        except OSError as err:
            raise UserError(f"cannot enter the sweep element's working directory {work}: {err}") from None
    return resume_command(cfg, denv, env, cmd, publish=publish)


def _dry_run_report(plan: BindingPlan, full: List[str], denv: DistEnv) -> Dict[str, Any]:
    """``--dry-run``'s JSON document: the binding plan, the command and the torchrun environment."""
    from .binding import format_cpulist

    return {
        "cpus": format_cpulist(plan.cpus),
        "affinity": None if plan.affinity is None else format_cpulist(plan.affinity),
        "numa_nodes": list(plan.numa_nodes),
        "threads": plan.threads,
        "env": dict(plan.env),
        "kept": dict(plan.kept),
        "preload": list(plan.preload),
        "source": plan.source,
        "notes": list(plan.notes),
        "command": full,
        "torch_env": denv.torch_env(),
    }


def _record_start(run_dir: str, environ: Mapping[str, str], denv: DistEnv) -> None:
    """Rank 0: this start in ``provenance.json`` (``slurm_ddp.rundir.provenance``), once per start; a failure to
    write it is a note on stderr."""
    if denv.rank != 0:
        return
    from .rundir.provenance import record_start

    try:
        record_start(run_dir, environ, job_id=denv.job_id, restart=denv.restart_count, world_size=denv.world_size)
    except OSError as err:
        print(f"slurm_ddp launch: note: could not record this start's provenance: {err}", file=sys.stderr)


def _pin(affinity: Optional[Sequence[int]]) -> None:
    """Pin this process to the plan's CPUs (``None``: leave it). Raises ``UserError``."""
    if affinity is None:
        return
    from .binding import format_cpulist

    try:
        os.sched_setaffinity(0, affinity)
    except OSError as err:
        raise UserError(f"cannot pin this task to CPUs {format_cpulist(affinity)}: {err}") from None


def _to_rank_log(run_dir: str, rank: int) -> None:
    """``--rank-log``: stdout and stderr appended to ``logs/rank-N.log`` (torchrun's workers have no srun
    ``--output`` of their own). Raises ``UserError``."""
    from .rundir import LOGS_DIR, rank_log_name

    log_path = Path(run_dir) / LOGS_DIR / rank_log_name(rank)
    try:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as err:
        raise UserError(f"cannot open the rank log {log_path}: {err}") from None
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _exec_worker(cfg: JobConfig, denv: DistEnv, env: Dict[str, str], full: List[str], *, watchdog: bool) -> int:
    """The shared worker (or a task's command): its hang watchdog started beside it, then exec'd in place of
    this process. Raises ``CommandNotRunnable``; returns only in a test's patched exec."""
    if cfg.watchdog.enabled and watchdog:  # the rank's hang watchdog, a process beside it (slurm_ddp.watchdog)
        from .watchdog import start_for_rank

        env.update(start_for_rank(cfg, denv, env[RUN_DIR_VAR], sys.executable))
    # The shared worker handles the requeue signal and SIGTERM only once its PreemptionFlag is
    # installed; until then the default action would kill the rank (a preemption notice in the first
    # seconds of a start, one Slurm re-delivers to a requeued job, or the local supervisor's Ctrl-C
    # while the rank starts, end it without a checkpoint). Blocked here, they stay pending across
    # exec and reach the flag when install() unblocks them. The local supervisor starts this wrapper
    # with every signal it passes on blocked (signals.forwarded_signals): the others get their
    # default action back. A train.command script keeps the default actions (torchrun's
    # behaviour; see _supervise, which resets the mask of the command it forks).
    from .signals import forwarded_signals, worker_signals

    flag_signals = set(worker_signals(cfg.requeue.signal_name))
    signal.pthread_sigmask(signal.SIG_BLOCK, flag_signals)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, forwarded_signals(cfg.requeue.signal_name) - flag_signals)
    try:
        os.execvpe(full[0], full, env)
    except OSError as err:
        raise CommandNotRunnable(f"cannot run {full[0]!r}: {err}") from None
    return 0  # not reached


#: What the supervising wrapper of a ``train.command`` rank catches: the stop signals and the
#: user signals (a USR1 meant for the command must not end the wrapper); the rest keep their default.
_CAUGHT = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")


def _interval_environment(cfg: JobConfig, denv: DistEnv, run_dir: Path) -> Dict[str, str]:
    """``checkpoint.every_s: auto`` for a script of one's own: the rule's figures at this start
    (``rundir.interval.script_environment``), from the config and the run's records."""
    from .config import parse_time_s
    from .rundir import interval as rule
    from .rundir import read_metrics

    ck = cfg.checkpoint
    return rule.script_environment(
        read_metrics(run_dir),
        mtbf_default_s=ck.mtbf_s if ck.mtbf_s is not None else rule.default_mtbf_s(max(1, denv.num_nodes)),
        max_interval_s=ck.max_interval_s,
        time_limit_s=float(parse_time_s(cfg.slurm.time)),
        signal_delay_s=float(cfg.requeue.signal_delay_s),
    )


def command_failure(status: int, stopped: bool) -> Optional[str]:
    """Why the ``os.waitpid`` status ``status`` of a ``train.command`` rank is a failure to report through
    the step's peer-lost marker (:func:`report_failure`), e.g. ``"the command exited with status 1"`` or
    ``"the command died of SIGABRT"``; None for status 0, the preemption status 75
    (``constants.PREEMPTED_EXIT_CODE``: ``preemption.exit_preempted``), and any end after a stop signal
    the wrapper recorded (``stopped``; a death by a stop signal is recorded before this is asked). Pure."""
    from .constants import PREEMPTED_EXIT_CODE

    if stopped:
        return None
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        return f"the command died of {name}"
    code = os.waitstatus_to_exitcode(status)
    if code in (0, PREEMPTED_EXIT_CODE):
        return None
    return f"the command exited with status {code}"


def report_failure(env: Mapping[str, str], denv: DistEnv, failure: str) -> bool:
    """Leave the step's peer-lost marker for this rank's failed ``train.command`` (``failure``, from
    :func:`command_failure`), through its one owner ``rundir.write_peer_lost`` (the file named by
    ``PEER_LOST_VAR`` in ``env``; set by the batch script under in-job recovery only), and say so in one
    line on stderr (the rank's log). True when written.

    The record has the fields the recovery rule reads (``rundir.recovery.gather_evidence``: its first
    record's ``time``, ``step``), as the shared worker and ``preemption.exit_if_peer_lost`` write them:
    ``rank``, ``host`` (``SLURMD_NODENAME``, else this host's name), ``step`` None (a plain script's step
    is unknown), ``time`` (``time.time()``, seconds), ``error`` (``failure``), plus ``by: "launch"``.
    A rank that left its own record first (the API) keeps it: the file is JSON lines, this one is
    appended, and the readers take the first. Any failure counts, a peer's loss or the script's own crash
    (the wrapper cannot tell them apart): the probe step after srun decides (``rundir.recovery``)."""
    from .rundir import PEER_LOST_VAR, peer_lost_record, write_peer_lost

    record = peer_lost_record(denv.rank, denv.hostname or socket.gethostname(), None, failure, by="launch")
    if not write_peer_lost(env, record):
        return False
    print(
        f"slurm_ddp launch: rank {denv.rank}: {failure}; left the peer-lost marker {env[PEER_LOST_VAR]}: "
        "the batch script ends this step now and probes its nodes (a lost peer, or a crash of its own)",
        file=sys.stderr,
        flush=True,
    )
    return True


def report_no_restart(run_dir: str, denv: DistEnv, status: int) -> bool:
    """When the ``os.waitpid`` status ``status`` of this rank's ``train.command`` is the do-not-restart status
    (``constants.NO_RESTART_EXIT_CODE``), record it for the batch side's rules (``rundir.record_no_restart``,
    ``by: "launch"``): srun's status is its tasks' highest, so the rank's own may not reach them. True when
    written."""
    from .constants import NO_RESTART_EXIT_CODE
    from .rundir import record_no_restart

    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != NO_RESTART_EXIT_CODE:
        return False
    try:
        record_no_restart(
            run_dir,
            job_id=str(denv.job_id),
            restart=denv.restart_count,
            rank=denv.rank,
            host=denv.hostname or socket.gethostname(),
            reason=f"the command exited with status {NO_RESTART_EXIT_CODE}",
            by="launch",
        )
    except OSError as err:
        print(
            f"slurm_ddp launch: note: could not record the do-not-restart of rank {denv.rank}: {err}", file=sys.stderr
        )
        return False
    return True


def _supervise(cfg: JobConfig, denv: DistEnv, env: Dict[str, str], full: List[str], watchdog: bool = True) -> int:
    """Fork ``full`` (a ``train.command`` rank) and stay its parent: record the stop signals this
    rank is sent (``rundir.record_rank_stop``), pass nothing on, leave the step's peer-lost marker
    when the command fails (:func:`command_failure`, :func:`report_failure`; under in-job recovery
    only), and end as the command did."""
    from .rundir import STOP_SIGNALS, record_rank_stop

    requeue_name = "SIG" + cfg.requeue.signal_name
    caught = {signal.Signals[n] for n in (*_CAUGHT, requeue_name)}
    stop_names = {*STOP_SIGNALS, requeue_name}
    run_dir = env[RUN_DIR_VAR]
    recorded: Set[str] = set()

    def record(name: str) -> None:
        if name not in stop_names or name in recorded:
            return
        recorded.add(name)
        try:
            record_rank_stop(
                run_dir,
                job_id=str(denv.job_id),
                restart=denv.restart_count,
                rank=denv.rank,
                signal=name,
                requeue=name == requeue_name,
            )
        except OSError as err:
            print(f"slurm_ddp launch: note: could not record {name} for rank {denv.rank}: {err}", file=sys.stderr)

    signal.pthread_sigmask(signal.SIG_BLOCK, caught)  # until the handlers are in place (parent) / reset (child)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the rank: default dispositions, dies with the wrapper, then as the exec path does
        try:
            from .signals import die_with_parent

            die_with_parent(signal.SIGKILL)
            for sig in caught:  # Python's own SIGINT handler too: the command starts with the defaults
                signal.signal(sig, signal.SIG_DFL)
            if cfg.watchdog.enabled and watchdog:
                from .watchdog import start_for_rank

                env.update(start_for_rank(cfg, denv, run_dir, sys.executable))
            sys.stdout.flush()
            sys.stderr.flush()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)
            os.execvpe(full[0], full, env)
        except OSError as err:
            print(f"slurm_ddp launch: error: cannot run {full[0]!r}: {err}", file=sys.stderr, flush=True)
            os._exit(CommandNotRunnable.exit_code)
        except BaseException as err:  # never return into the wrapper's code in the child
            print(f"slurm_ddp launch: error: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            os._exit(2)
    for sig in caught:
        signal.signal(sig, lambda signum, frame: record(signal.Signals(signum).name))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)
    try:
        _, status = os.waitpid(pid, 0)  # resumed after a handler ran (PEP 475)
    except ChildProcessError:
        status = 0
    died = os.WTERMSIG(status) if os.WIFSIGNALED(status) else 0
    if died:  # a death by a stop signal is a stop: recorded before the failure is asked
        record(signal.Signals(died).name if died in signal.valid_signals() else "")
    failure = command_failure(status, stopped=bool(recorded))
    if failure is not None:
        report_no_restart(run_dir, denv, status)
        report_failure(env, denv, failure)
    if died:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            signal.signal(died, signal.SIG_DFL)  # SIGKILL (the hang watchdog's) has no handler to reset
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {died})
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), died)  # end as the rank did, so srun/torchrun/the local supervisor see the same
        return 128 + died
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
