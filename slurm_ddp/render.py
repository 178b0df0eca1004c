"""Job config → sbatch script text. Pure: no files written, no cluster, no torch.

The script comes from ``job_templates/sbatch.sh.j2`` (shipped in the wheel as the package
``slurm_ddp.job_templates``) through jinja2 with ``StrictUndefined``. Every value from
the config that reaches the shell body goes through the ``q`` filter (``shlex.quote``),
so quotes, ``$(...)``, backticks, ``;`` and newlines stay inert text. ``#SBATCH`` lines
are read by sbatch, not by the shell, so values there are restricted to single tokens
(see ``slurm_ddp.config``); the job name is reduced to a safe token for ``--job-name``.
``environment.setup`` lines are shell code by design and are written as given.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import jinja2

from . import container as _container
from .config import JobConfig, command_argv, env_as_written, unused_settings
from .constants import PREEMPTED_EXIT_CODE, __version__
from .errors import UserError
from .rundir import (
    FINISHED_NAME,
    LOGS_DIR,
    PEER_LOST_VAR,
    RECOVERY_DIR,
    STEP_END_VAR,
    STEP_NODES_VAR,
    SWEEP_NAME,
    TORCHRUN_OMP_VAR,
    batch_log_name,
    launcher_log_name,
    rank_log_name,
)
from .secrets import redact_argv, redact_env, secret_values
from .submitenv import batch_unset
from .supervise import PLAN_DELIMITER, JobPlan, RecoveryPlan

TEMPLATE = "sbatch.sh.j2"
#: In-job recovery: seconds the batch script lets srun end a step after a rank saw a peer vanish, before
#: it ends srun itself (srun waits for the lost node's tasks until Slurm marks the node DOWN,
#: ``SlurmdTimeout``: 300 s by default).
PEER_LOST_GRACE_S = 5
_SAFE_TOKEN = re.compile(r"^[A-Za-z0-9_./+:@%,=-]+\Z")  # \Z: "$" would let a trailing newline through


def _template_dir() -> str:
    # The checkout beside the imported package first: the template must match the code that renders
    # it, also when that code is imported through PYTHONPATH from a checkout other than the installed one.
    source = Path(__file__).resolve().parent.parent / "job_templates"
    if (source / TEMPLATE).is_file():
        return str(source)
    try:  # installed wheel: the package slurm_ddp.job_templates
        from importlib.resources import files

        d = files("slurm_ddp.job_templates")
        if d.joinpath(TEMPLATE).is_file():
            return str(d)
    except (ImportError, ModuleNotFoundError, TypeError):
        pass
    return str(source)


def comment_safe(text: object) -> str:
    """Text that stays on one comment line: control characters become escapes like ``\\n``."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def sbatch_job_name(name: str) -> str:
    """``name`` reduced to characters that are safe in ``#SBATCH --job-name=``; others → ``_``."""
    return re.sub(r"[^A-Za-z0-9_.+-]", "_", name)[:128] or "job"


def job_name_warning(cfg: JobConfig) -> Optional[str]:
    """One line when ``name`` is not what Slurm will show (``sbatch_job_name``: ``bert base`` →
    ``bert_base`` in ``--job-name``, squeue and sacct, and in the default run directory); else None."""
    slurm_name = sbatch_job_name(cfg.name)
    if slurm_name == cfg.name:
        return None
    return (
        f"name {comment_safe(cfg.name)!r} becomes {slurm_name!r} for Slurm (--job-name; squeue, sacct) and the default "
        "run directory: only letters, digits and _.+- are kept (at most 128); name the job so to see the same name"
    )


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_template_dir()),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["q"] = lambda v: shlex.quote(str(v))
    env.filters["comment"] = comment_safe
    return env


def sbatch_options(cfg: JobConfig, run_dir: Optional[str] = None) -> Dict[str, Optional[str]]:
    """The job's sbatch(1) long options in snake_case (``ntasks_per_node``), value or None for a bare flag.

    The one mapping from config to sbatch options: the ``#SBATCH`` lines (``sbatch_flags``) and
    the submitit backend's parameters are both built from it, so they cannot disagree.
    ``signal`` (``B:SIG@delay``) and ``requeue`` are always present; with in-job recovery (``recovery``)
    ``no_kill`` too, and ``nodes`` counts ``recovery.spare_nodes`` in; ``output`` only when
    ``run_dir`` is a safe single token. ``slurm.extra`` comes last: a key there replaces the
    option (``-`` and ``_`` alike), ``true`` makes it a bare flag and ``false`` removes it.
    """
    s, r = cfg.slurm, cfg.requeue
    # in-job recovery: the spares come with the allocation, and a lost node must not end it (--no-kill)
    spares = cfg.recovery.spare_nodes if cfg.in_job_recovery else 0
    opts: Dict[str, Optional[str]] = {
        "job_name": sbatch_job_name(cfg.name),
        "nodes": str(s.min_nodes + spares) if spares else str(s.nodes),  # spares: one node count (validated)
        "ntasks_per_node": str(s.tasks_per_node),
        "cpus_per_task": str(s.cpus_per_task),
        "time": s.time,
        "signal": f"B:{r.signal_name}@{r.signal_delay_s}",
        "requeue": None,
        "open_mode": "append",
    }
    if cfg.in_job_recovery:
        opts["no_kill"] = None
    opts.update(gpu_options(cfg))
    if s.mem_gb is not None:
        opts["mem"] = f"{int(round(s.mem_gb * 1024))}M"
    for key in ("partition", "account", "qos", "constraint"):
        value = getattr(s, key)
        if value is not None:
            opts[key] = str(value)
    if s.exclusive:
        opts["exclusive"] = None
    if run_dir is not None and _SAFE_TOKEN.match(run_dir):
        opts["output"] = f"{run_dir}/{LOGS_DIR}/{batch_log_name('%j')}"
    for key, value in s.extra.items():
        key = key.replace("-", "_")
        if value is False:
            opts.pop(key, None)
        else:
            opts[key] = None if value is True else str(value)
    return opts


def gpu_options(cfg: JobConfig) -> Dict[str, str]:
    """The GPU part of ``sbatch_options`` (sbatch(1) "--gpus-per-node", "--gpus-per-task",
    "--gpu-bind", "--gres"): a count is prefixed by ``gpu_type`` (``a100:4``); empty for a CPU job."""
    s = cfg.slurm
    typed = (s.gpu_type + ":") if s.gpu_type else ""
    opts: Dict[str, str] = {}
    if s.gpus_per_node:
        opts["gpus_per_node"] = f"{typed}{s.gpus_per_node}"
    if s.gpus_per_task:
        opts["gpus_per_task"] = f"{typed}{s.gpus_per_task}"
    if s.gres:
        opts["gres"] = s.gres
    if s.gpu_bind:
        opts["gpu_bind"] = s.gpu_bind
    return opts


def recovery_warning(cfg: JobConfig) -> Optional[str]:
    """One line when in-job recovery (``recovery``) cannot recover a hung node for the shared worker; else None.

    A peer that hangs silently (a frozen node) is named by the hang watchdog's reports; if the worker's
    collective times out first (``train.pg_timeout_s`` ≤ ``watchdog.timeout_floor_s``), or there is no
    watchdog, the ranks see a lost peer with no node to blame (every probe passes) and the job ends as after
    a crash. ``train.command`` scripts set their own timeout and are not checked. Shown by ``render`` and
    ``submit`` (also ``--dry-run``).
    """
    if not cfg.in_job_recovery or cfg.train.command:
        return None
    w, pg = cfg.watchdog, cfg.train.pg_timeout_s
    if not w.enabled:
        return (
            "recovery: watchdog.enabled is false, so a hung node (a silent peer) is not named and ends the job "
            "as a crash after train.pg_timeout_s; enable the watchdog"
        )
    if w.timeout_floor_s >= pg:
        return (
            f"recovery: watchdog.timeout_floor_s={w.timeout_floor_s:g} is not below train.pg_timeout_s={pg}, so a "
            "hung node makes the collective time out before the watchdog names it, and the job ends as a crash; "
            "lower watchdog.timeout_floor_s or raise train.pg_timeout_s"
        )
    return None


def loader_cpu_warning(cfg: JobConfig, cpus_per_task: Optional[int] = None) -> Optional[str]:
    """One line when a rank gets fewer CPUs than its DataLoader workers plus one (the rank's own process), or a
    GPU rank a single CPU, naming ``slurm.cpus_per_task`` and ``train.num_workers``; else None.

    A rank's CPUs are ``cpus_per_task`` (default ``slurm.cpus_per_task``; under torchrun the node task's
    ``tasks_per_node × cpus_per_task`` CPUs are split among its ranks: the same count). Each of the
    ``train.num_workers`` worker processes loads batches on its own CPU while the rank's own process trains
    (PyTorch docs, ``torch.utils.data``, "Multi-process data loading"; the PyTorch performance tuning guide);
    with fewer CPUs they take turns. torch itself warns ("This DataLoader will create N worker processes in
    total. Our suggested max number of worker in current system is M":
    ``torch.utils.data.DataLoader.check_worker_number_rationality``, M the CPUs of the rank's affinity)
    only when the workers outnumber all the rank's CPUs, once the job runs; this check counts the rank's own
    thread too, on CPU and GPU jobs alike, before anything is submitted. A GPU rank's own process also
    drives the GPU (the Python loop, the host side of the batch, the CUDA/NCCL threads): a single CPU is
    warned about even without workers (``slurm.cpus_per_task`` defaults to 1). A ``train.command`` job's loaders are not known here: only a GPU
    rank's single CPU is warned about. A CPU job without workers is not checked (the rank's compute threads
    are the work, planned by ``binding.plan_binding``). Shown by ``render``, ``submit`` (also ``--dry-run``)
    and ``env --explain``.
    """
    cpus = cpus_per_task or cfg.slurm.cpus_per_task
    workers = 0 if cfg.train.command else cfg.train.num_workers
    need = max(2 if cfg.slurm.gpu_job else 1, workers + 1)
    if cpus >= need:
        return None
    if workers:
        fewer = (
            "train.num_workers to 0 (load in the rank's process)"
            if cpus == 1
            else f"train.num_workers to at most {cpus - 1}"
        )
        return (
            f"slurm.cpus_per_task={cpus} gives each {'GPU ' if cfg.slurm.gpu_job else ''}rank {cpus} CPU(s) for its "
            f"{workers} DataLoader workers (train.num_workers) and itself, so they take turns and "
            f"{'the GPUs wait' if cfg.slurm.gpu_job else 'training waits'} for data; set slurm.cpus_per_task to at "
            f"least {need} (train.num_workers + 1), or {fewer}"
        )
    loaders = "DataLoader worker the script starts" if cfg.train.command else "DataLoader worker (train.num_workers)"
    return (
        f"slurm.cpus_per_task={cpus} gives each GPU rank a single CPU for its training loop, data loading and "
        f"CUDA/NCCL threads, so the GPU waits on it; set slurm.cpus_per_task to at least 2 (one more per "
        f"{loaders}; it defaults to 1)"
    )


#: a here-document's start in a setup line (bash(1), "Here Documents") (``cat > f <<EOF``, ``<<-'EOF'``): its word, the line that ends it
_HEREDOC = re.compile(r"(?<!<)<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")  # not a here-string (<<<)


def setup_lines(setup: Sequence[str], say: str) -> List[str]:
    """``environment.setup`` as a batch script runs it: each line as written, then a check that stops the job
    (exit 1, before any rank starts) when the line ended with a non-zero status, saying so with ``say`` (a
    shell command that prints its words: the batch script's ``log``). The batch script runs them without
    ``set -u``; the sbatch template and submitit's script both take their lines from here.

    A command that goes on over more lines is checked once, after its last line: a line ending in ``\\``
    (bash joins the next one to it) and a here-document (``<<EOF`` up to the line ``EOF``) get no check
    inside them, which would change the command or the document's text."""
    out: List[str] = []
    heredoc: Optional[str] = None
    for i, line in enumerate(setup, 1):
        out.append(line)
        if heredoc is not None:
            if line.strip() != heredoc:
                continue
            heredoc = None
        else:
            m = _HEREDOC.search(line)
            if m:
                heredoc = m.group(2)
                continue
        if line.endswith("\\"):
            continue
        out.append(
            f'SETUP_STATUS=$?; [ "$SETUP_STATUS" -eq 0 ] || {{ {say} "ERROR: environment.setup line {i} failed with '
            f'status $SETUP_STATUS; not starting the ranks:" {shlex.quote(line)}; exit 1; }}'
        )
    return out


def job_warnings(cfg: JobConfig) -> Tuple[str, ...]:
    """The lines ``render`` and ``submit`` (``--dry-run`` too, and the Python API) print about ``cfg`` before
    anything runs: settings that do nothing (``config.unused_settings``), a job name Slurm rewrites
    (``job_name_warning``), a rank short of CPUs for its loader workers (``loader_cpu_warning``), in-job
    recovery that cannot name a hung node (``recovery_warning``)."""
    return tuple(
        w for w in (*unused_settings(cfg), job_name_warning(cfg), loader_cpu_warning(cfg), recovery_warning(cfg)) if w
    )


def sbatch_flags(cfg: JobConfig, run_dir: Optional[str] = None) -> List[str]:
    """The ``#SBATCH`` options for ``cfg`` (``sbatch_options`` as ``--kebab-case``), sorted by flag
    name (deterministic, golden-testable)."""
    flags = {k.replace("_", "-"): v for k, v in sbatch_options(cfg, run_dir).items()}
    return [f"--{k}" if v is None else f"--{k}={v}" for k, v in sorted(flags.items())]


def job_nodes(cfg: JobConfig) -> str:
    """The node count of the job's steps: ``slurm.nodes``, or with a range (``2-4``) the count the job
    got, ``"$SLURM_JOB_NUM_NODES"``; with in-job recovery ``"$STEP_NNODES"`` (each step's nodes are chosen by
    ``rundir.recovery``): the supervisor expands both in the planned srun words (``supervise.STEP_VARIABLES``)."""
    s = cfg.slurm
    if cfg.in_job_recovery:
        return '"$STEP_NNODES"'
    return str(s.nodes) if s.min_nodes == s.max_nodes else '"$SLURM_JOB_NUM_NODES"'


def srun_flags(cfg: JobConfig) -> List[str]:
    """Options of the ``srun`` that starts the ranks (srun(1)): one task per rank, or with
    ``slurm.launcher: torchrun`` one task per node holding all of the node's ranks' CPUs."""
    s = cfg.slurm
    torchrun = s.launcher == "torchrun"
    recovery = cfg.in_job_recovery
    # in-process recovery: one step on the training nodes and the warm spares ("$JOB_NODES"), and --no-kill:
    # the step's tasks on the other nodes run on when one node fails (srun(1) -k; docs/development.md)
    in_process = recovery and cfg.recovery.in_process
    nodes = '"$JOB_NNODES"' if in_process else job_nodes(cfg)
    listed = '"$JOB_NODES"' if in_process else '"$STEP_NODES"'
    count = "JOB_NNODES" if in_process else "STEP_NNODES"
    return [
        # srun -K ends the whole step on the first task's non-zero exit, --no-kill or not (Slurm's
        # src/srun/launch.c, _task_finish; seen on 22.05: /work/shared/SLURM-FACTS.md). The in-process step must
        # outlive any one member's exit (a failed warm spare, a rank taken for lost): it runs with -K0, and
        # rank 0's end marker (STEP_END) ends it and gives its status (slurm_ddp.worker.inprocess)
        "--kill-on-bad-exit=0" if in_process else "--kill-on-bad-exit=1",
        *(["--no-kill"] if in_process else []),
        f"--nodes={nodes}",
        # in-job recovery: the step's own nodes (not the spares, not a lost node), and --overlap: a step on
        # a lost node lives on in Slurm until the node is DOWN, holding its CPUs on the survivors too
        *([f"--nodelist={listed}", "--overlap"] if recovery else []),
        # under torchrun also --ntasks: srun would take the allocation's SLURM_NTASKS otherwise (so with
        # recovery, whose allocation holds spares)
        *([f"--ntasks={nodes}"] if torchrun else []),
        *([f'--ntasks="$(({count} * {s.tasks_per_node}))"'] if recovery and not torchrun else []),
        f"--ntasks-per-node={1 if torchrun else s.tasks_per_node}",
        f"--cpus-per-task={s.tasks_per_node * s.cpus_per_task if torchrun else s.cpus_per_task}",
        # also in #SBATCH; here explicit for the step (torchrun's one task per node needs every GPU)
        *([f"--gpu-bind={s.gpu_bind}"] if s.gpu_bind and not torchrun else []),
        "--open-mode=append",
    ]


#: Signals torchrun forwards to its workers by default (``--signals-to-handle``'s default in
#: torch/distributed/run.py); the job's ``requeue.signal`` is added to them.
TORCHRUN_DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


def torchrun_flags(cfg: JobConfig) -> List[str]:
    """Options of ``python -m torch.distributed.run`` (torchrun) under ``slurm.launcher: torchrun``,
    except the rendezvous endpoint and id, which the batch script fills in at run time.

    PyTorch docs "torchrun (Elastic Launch)": ``--nnodes``/``--nproc-per-node``, the ``c10d``
    rendezvous, ``--max-restarts=0`` (a failed rank fails the job; requeue is the batch script's),
    ``--signals-to-handle`` (torchrun forwards only SIGTERM/SIGINT/SIGHUP/SIGQUIT to its workers
    unless told; the requeue signal is added) and ``--shutdown-timeout`` = ``requeue.signal_delay_s``
    (how long workers may take to save after a signal before torchrun kills them). Both options need
    a torch whose torchrun has them; ``submit`` checks that. ``--rdzv-conf=join_timeout`` is the hang
    watchdog's ``watchdog.startup_s`` (torchrun's own default, 600 s, is that default too): the
    rendezvous waits for a late node as long as a rank may take to start. Hangs after start-up are
    the watchdog's (``slurm_ddp.watchdog``, one per rank, started by the rank wrapper under
    torchrun too); with ``--max-restarts=0`` torchrun ends the node's other ranks when it ends one.
    """
    s, r = cfg.slurm, cfg.requeue
    handled = ",".join(dict.fromkeys(("SIG" + r.signal_name, *TORCHRUN_DEFAULT_SIGNALS)))
    return [
        f"--nnodes={job_nodes(cfg)}",
        f"--nproc-per-node={s.tasks_per_node}",
        "--rdzv-backend=c10d",
        "--max-restarts=0",
        f"--signals-to-handle={handled}",
        f"--shutdown-timeout={r.signal_delay_s}",
        # every node's agent must join within the hang watchdog's start-up allowance (torchrun: 600 s)
        f"--rdzv-conf=join_timeout={int(cfg.watchdog.startup_s)}",
    ]


def rank_command(cfg: JobConfig, python: str, python_var: str = '"$PYTHON"') -> List[str]:
    """What every rank runs after the rank wrapper, as shell words (``"$PYTHON"`` and
    ``"$RUN_DIR"`` are the batch script's variables; everything else is quoted): the shared worker,
    or ``train.command`` (``config.command_argv``: ``python``/``*.py`` run by the ranks' interpreter).
    ``python_var``: the word for the ranks' interpreter (``"$CONTAINER_PYTHON"`` in a container)."""
    if not cfg.train.command:
        return [python_var, "-u", "-m", "slurm_ddp.worker", "--run-dir", '"$RUN_DIR"']
    argv = command_argv(cfg.train.command, python)
    return [python_var if i == 0 and a == python else shlex.quote(a) for i, a in enumerate(argv)]


def _container_env(box: Optional[_container.ContainerPlan]) -> str:
    """Assignments before the ranks' ``srun`` in a container: the copy of slurm_ddp first on PYTHONPATH;
    for ``oci`` also the batch step's own task variables emptied, since Slurm's OCI support passes the
    environment into the container without setting the step's (``env.container_step_env`` fills them)."""
    if box is None:
        return ""
    clear = "SLURM_PROCID= SLURM_LOCALID= SLURM_NODEID= SLURMD_NODENAME= " if box.runtime == "oci" else ""
    if box.clean_env:  # apptainer --cleanenv: the copy alone, none of the host's PYTHONPATH
        return f"PYTHONPATH={shlex.quote(box.python_dir)} "
    return f'{clear}PYTHONPATH={shlex.quote(box.python_dir)}"${{PYTHONPATH:+:$PYTHONPATH}}" '


def step_words(cfg: JobConfig, box: Optional[_container.ContainerPlan], python: str) -> List[str]:
    """The training step's ``srun`` command as shell words (``srun_flags``, the rank log, the container's
    options, the rank wrapper, ``rank_command``), naming only ``supervise.STEP_VARIABLES``: the job's
    supervisor expands them for each step (``supervise.expand_word``)."""
    q = shlex.quote
    python_word = '"$CONTAINER_PYTHON"' if box is not None else '"$PYTHON"'
    torchrun = cfg.slurm.launcher == "torchrun"
    log = launcher_log_name("%n") if torchrun else rank_log_name("%t")
    words = ["srun", *srun_flags(cfg), f'--output="$RUN_DIR"/{q(LOGS_DIR)}/{q(log)}']
    if cfg.train.workdir:
        words.append(f"--chdir={q(cfg.train.workdir)}")
    if box is not None:
        words += [*box.srun_flags, *box.prefix]
    launch = [python_word, "-m", "slurm_ddp.launch", "--run-dir", '"$RUN_DIR"']
    if torchrun:
        words += [python_word, "-m", "torch.distributed.run", *torchrun_flags(cfg)]
        words += ['--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"', '--rdzv-id="$SLURM_JOB_ID"', "--no-python"]
        launch.append("--rank-log")
    return [*words, *launch, "--", *rank_command(cfg, python, python_word)]


def job_plan(cfg: JobConfig, run_dir: str, python: str) -> JobPlan:
    """What the job's supervisor (``slurm_ddp.supervise``) does for ``cfg`` submitted in ``run_dir`` (a sweep's:
    the sweep directory): its :class:`JobPlan`."""
    box = _container.plan(cfg, run_dir)
    s = cfg.slurm
    recovery = None
    if cfg.in_job_recovery:
        recovery = RecoveryPlan(
            nodes=s.min_nodes if s.min_nodes == s.max_nodes else 0,
            min_nodes=cfg.recovery_min_nodes,
            max_restarts=cfg.recovery.max_restarts,
            in_process=cfg.recovery.in_process,
            max_no_progress=cfg.recovery.max_no_progress,
            max_node_losses=cfg.recovery.max_node_losses,
            max_hangs=cfg.recovery.max_hangs,
            grace_s=PEER_LOST_GRACE_S,
        )
    clear = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURMD_NODENAME")
    return JobPlan(
        signal=cfg.requeue.signal_name,
        max_requeues=cfg.requeue.max_requeues,
        command_mode=bool(cfg.train.command),
        launcher=s.launcher,
        srun_words=tuple(step_words(cfg, box, python)),
        python=python,
        container_python=box.python if box is not None else "",
        step_env=tuple((n, "") for n in clear) if box is not None and box.runtime == "oci" else (),
        pythonpath_first=box.python_dir if box is not None else "",
        pythonpath_alone=bool(box is not None and box.clean_env),
        pass_env=tuple(cfg.environment.pass_env),
        recovery=recovery,
        torchrun_omp_var=TORCHRUN_OMP_VAR if s.launcher == "torchrun" else "",
        submit_dir=run_dir,
        inherited_unset=tuple(batch_unset(sbatch_options(cfg), keep=[*cfg.environment.pass_env, *cfg.environment.env])),
    )


@dataclass(frozen=True)
class ArrayJob:
    """A sweep's job array (``slurm_ddp.sweep``): ``render`` then writes one script for all elements.

    ``run_dir`` is the sweep directory; element ``i`` runs in ``run_dir/<i zero-padded to width>``
    (``rundir.element_dir_name``), found by ``SLURM_ARRAY_TASK_ID`` plus the array's offset (the script's
    first argument, default 0), and requeues itself alone
    (``scontrol requeue ARRAYJOBID_TASKID``, ``rundir.requeue_target``).
    """

    spec: str  #: sbatch ``--array`` value, e.g. ``0-3%2``
    width: int  #: digits of an element directory's name
    sweep_hash: str  #: shown in the header instead of one config's hash
    elements: Tuple[Tuple[int, str], ...] = ()  #: (index, label), listed in the header
    #: (offset, ``--array`` value) of each array of a sweep past ``MaxArraySize`` (``sweep.plan_arrays``),
    #: listed in the header; task t of the array at offset o runs element o + t (the script's argument: o)
    arrays: Tuple[Tuple[int, str], ...] = ()


@dataclass(frozen=True)
class RenderedJob:
    """What ``submit`` would hand to sbatch: the script text and where it goes."""

    script: str
    run_dir: str
    sbatch_args: Tuple[str, ...]  #: extra sbatch argv (``--output`` when it could not go in the script)
    #: ``script`` as printed (``render``, ``submit --dry-run``): credential-looking values of
    #: ``environment.env`` shown as ``***`` (``slurm_ddp.secrets``); equal to ``script`` when there are none
    shown: str = ""
    #: lines ``render`` and ``submit`` print to stderr (``job_warnings``); not in the script
    warnings: Tuple[str, ...] = ()

    @property
    def printed(self) -> str:
        """What ``render`` and ``submit --dry-run`` print: ``shown``, then what the job's supervisor will do
        (``supervise.JobPlan.explain`` of the script's plan) in comment lines after it, where nothing runs."""
        from .supervise import plan_of_script

        said = "".join(f"#   {line}\n" for line in plan_of_script(self.shown).explain())
        return f"{self.shown}# ---- what python -m slurm_ddp.supervise does for this job (its plan) ----\n{said}"


def render(
    cfg: JobConfig,
    run_dir: str,
    *,
    command: Optional[Sequence[str]] = None,
    python: Optional[str] = None,
    version: str = __version__,
    config_hash: Optional[str] = None,
    array: Optional[ArrayJob] = None,
) -> RenderedJob:
    """Render the sbatch script for ``cfg`` writing into ``run_dir`` (an absolute path).

    ``command`` is recorded in the header (default ``sys.argv``); ``python`` is the
    interpreter of the ranks (default ``environment.python``, else ``sys.executable``);
    ``config_hash`` is the header's (default ``cfg``'s; ``submit`` passes the submitted config's
    when ``cfg``'s paths point into the code snapshot).
    ``array``: render a sweep's job array instead (``run_dir`` is then the sweep directory).
    """
    run_dir = os.path.abspath(run_dir)
    # an array task's batch log goes to its own element's logs: sbatch's %Na is the zero-padded task id
    log_dir = f"{run_dir}/%{array.width}a" if array is not None else run_dir
    flags = sbatch_flags(cfg, log_dir)
    if array is not None:
        flags = sorted([*flags, f"--array={array.spec}"], key=lambda f: f.split("=", 1)[0])
    output_in_script = any(f.startswith("--output=") for f in flags)
    env = env_as_written(cfg.environment.env)  # values with $NAME: set by the rank wrapper at rank start
    py = python or cfg.environment.python or sys.executable
    # the header's command line never holds a credential value (--set environment.env.X=...): it is a comment
    made_by = redact_argv(command if command is not None else ["slurm-ddp", *sys.argv[1:]], env)
    template = _env().get_template(TEMPLATE)
    if array is not None and cfg.environment.container.runtime != "none":
        raise UserError(
            "environment.container is not supported for a sweep (job array) yet; submit each element with its own "
            "--run-dir, or leave environment.container out"
        )
    box = _container.plan(cfg, run_dir)
    plan = job_plan(cfg, run_dir, py)

    def text(values: Mapping[str, str]) -> str:
        out: str = template.render(
            name=cfg.name,
            version=version,
            command=shlex.join(made_by),
            config_hash=(config_hash or cfg.config_hash()) if array is None else f"{array.sweep_hash} (sweep)",
            # where the keys a per-cluster defaults file gave got their values (config.cluster_defaults)
            cluster_defaults=cfg.cluster_defaults,
            array=array,
            # the job that requeues itself (rundir.requeue_target): an array task names itself ARRAY_TASK
            requeue_id='"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' if array is not None else '"$SLURM_JOB_ID"',
            sbatch_flags=flags,
            output_in_script=output_in_script,
            signal=cfg.requeue.signal_name,
            signal_delay_s=cfg.requeue.signal_delay_s,
            max_requeues=cfg.requeue.max_requeues,
            preempted_exit_code=PREEMPTED_EXIT_CODE,
            run_dir=run_dir,
            python=py,
            env=sorted(values.items()),
            env_at_rank_start=sorted(set(cfg.environment.env) - set(env)),
            pass_env=list(cfg.environment.pass_env),
            # a caller's srun options this job's request does not set again (a submit by hand from inside a job)
            setup=setup_lines(cfg.environment.setup, "log"),
            srun_flags=srun_flags(cfg),
            launcher=cfg.slurm.launcher,
            torchrun_flags=torchrun_flags(cfg),
            torchrun_omp_var=TORCHRUN_OMP_VAR,
            rank_command=rank_command(cfg, py, '"$CONTAINER_PYTHON"' if box is not None else '"$PYTHON"'),
            container=box,
            # the ranks import the copy of slurm_ddp submit put in the run directory (slurm_ddp.container)
            container_env=_container_env(box),
            rank_python='"$CONTAINER_PYTHON"' if box is not None else '"$PYTHON"',
            command_mode=bool(cfg.train.command),
            workdir=cfg.train.workdir,  # the ranks' working directory, worker and command alike
            node_log=launcher_log_name("%n"),
            logs_dir=LOGS_DIR,
            rank_log=rank_log_name("%t"),
            finished_name=FINISHED_NAME,
            recovery=cfg.in_job_recovery,
            # the nodes a step wants: slurm.nodes (spares aside), or with a range the count the job got
            recovery_nodes=str(cfg.slurm.nodes)
            if cfg.slurm.min_nodes == cfg.slurm.max_nodes
            else '"$SLURM_JOB_NUM_NODES"',
            recovery_min_nodes=cfg.recovery_min_nodes,
            recovery_max_restarts=cfg.recovery.max_restarts,
            recovery_dir=RECOVERY_DIR,
            peer_lost_var=PEER_LOST_VAR,
            peer_lost_grace_s=PEER_LOST_GRACE_S,
            in_process=cfg.in_job_recovery and cfg.recovery.in_process,
            step_nodes_var=STEP_NODES_VAR,
            step_end_var=STEP_END_VAR,
            plan_json=plan.to_json(),
            plan_delimiter=PLAN_DELIMITER,
            sweep_name=SWEEP_NAME,
        )
        return out

    script = text(env)
    shown = text(redact_env(env)) if secret_values(env) else script
    extra = () if output_in_script else (f"--output={log_dir}/{LOGS_DIR}/{batch_log_name('%j')}",)
    return RenderedJob(script=script, run_dir=run_dir, sbatch_args=extra, shown=shown, warnings=job_warnings(cfg))
