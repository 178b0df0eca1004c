"""Which of the submitting shell's variables belong to a Slurm job or step, and are kept out of a new job.

Pure and torch-free: a ``Mapping`` of the caller's environment in, names out. The one owner of the
rule; the backends (``sbatch``, ``submitit``, ``local``) and the batch script's renderer ask it.

Why. ``sbatch`` hands the submitting environment to the job (``--export=ALL``, its default; sbatch(1)
"--export"), and the new job's ``srun`` reads many ``SLURM_*`` variables as options (srun(1), "INPUT
ENVIRONMENT VARIABLES": ``SLURM_CPU_BIND``, ``SLURM_DISTRIBUTION``, ``SLURM_MEM_PER_NODE``,
``SLURM_NTASKS``, ``SLURM_GPUS_PER_TASK``, …). Submitted from inside a job (an ``salloc`` shell, an
interactive ``srun --pty``, a step of a chain), the new job would run its ranks with the *caller's*
step options wherever its own request does not set that variable again. Seen on the sandbox (Slurm
22.05): from inside ``srun -c1 --mem=500M``, a 2-node × 2-task job got ``SLURM_DISTRIBUTION=cyclic``
(ranks 0 and 1 on different nodes) and, on the production profile (``task/affinity``), the step's
``SLURM_CPU_BIND=quiet,mask_cpu:1`` for every rank: all four ranks on CPU 0. sbatch itself reads
``SBATCH_*`` variables, and Slurm sets a few of those in a job too (sbatch(1), "OUTPUT ENVIRONMENT
VARIABLES": ``SBATCH_MEM_BIND*``, ``SBATCH_THREADS_PER_CORE``).

The choice: ``submit`` gives the ``sbatch`` it runs (and submitit's) an environment without the
caller's job and step variables (:func:`submit_environ`), rather than ``sbatch --export=…``:
``--export`` can only name what to pass, not what to leave out, and naming a list would drop what a
login shell hands on (``PATH``, modules, conda, ``environment.pass_env``). A requeue keeps the
environment of the submit, so it stays clean. That environment also names the directory submitted
(:data:`SUBMIT_DIR_VAR`); a batch script that does not find its own there was started by hand
(``sbatch job.sbatch``, maybe inside an allocation): its supervisor (``supervise.drop_inherited``) unsets,
before any ``srun``, the srun input variables its own request does not set (:func:`batch_unset`): by
then it cannot tell a caller's job from the user's own settings.

The rule (:func:`caller_job_variables`), inside a job only (``SLURM_JOB_ID`` or ``SLURM_JOBID`` set:
an ``salloc`` shell, a step, a rank); from a login shell nothing is left out, so a submit from there
works as it always did (a site's ``SLURM_MPI_TYPE``, your ``SBATCH_*`` defaults):

- every ``SLURM_*``, ``SLURMD_*`` and ``SRUN_*`` variable is the job's or step's (Slurm sets them in
  a job; slurm_ddp's own ``SLURM_DDP_*`` job markers too), except the client settings in
  :data:`CLIENT_SETTINGS` (``SLURM_CONF``, which names the cluster, ``SLURM_CLUSTERS``, ...);
- so are the ``SBATCH_*``/``SALLOC_*`` variables Slurm sets in a job (:data:`SLURM_SET_SUBMIT_OPTIONS`;
  your own ``SBATCH_*`` defaults stay) and a rank's torch.distributed variables
  (:data:`RANK_VARIABLES`: ``MASTER_ADDR`` of the caller's job would be the new job's rendezvous);
- a name in ``environment.pass_env`` is always kept: that is how a user hands one on on purpose.

The local backend's ranks get a synthetic job of their own: for them every such variable of the
caller counts, inside a job or not (``inside=True``).

``submitit.helpers.clean_env`` does a similar job for submitit users, but drops ``SLURM_CONF`` (the
sandbox's and some sites' way to name the cluster) and the user's own ``SBATCH_*`` defaults.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence

#: Prefixes of the variables Slurm sets in a job or a step (sbatch(1), salloc(1), srun(1) "OUTPUT
#: ENVIRONMENT VARIABLES"), and of slurm_ddp's own markers in a job's ranks (``SLURM_DDP_*``).
JOB_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_")

#: ``SLURM_*`` names that configure the client, not a job: kept. ``SLURM_CONF`` names the cluster's
#: slurm.conf (slurm.conf(5)); ``SLURM_CLUSTERS`` the cluster(s) of ``-M`` (sbatch(1), srun(1));
#: ``SLURM_TIME_FORMAT`` and ``SLURM_BITSTR_LEN`` format the clients' output (squeue(1));
#: ``SLURM_DDP_PREFLIGHT_CACHE``, ``SLURM_DDP_SANDBOX``, ``SLURM_DDP_REQUIRE_SLURM`` are slurm_ddp's
#: settings of the submitting shell (``preflight``, the test sandbox).
CLIENT_SETTINGS: FrozenSet[str] = frozenset(
    {
        "SLURM_CONF",
        "SLURM_CLUSTERS",
        "SLURM_TIME_FORMAT",
        "SLURM_BITSTR_LEN",
        "SLURM_DDP_PREFLIGHT_CACHE",
        "SLURM_DDP_SANDBOX",
        "SLURM_DDP_REQUIRE_SLURM",
    }
)

#: what ``submit`` puts in the environment it gives sbatch: the directory submitted (a run's, a sweep's),
#: which the batch script compares with its own to know it was not started by hand
SUBMIT_DIR_VAR = "SLURM_DDP_SUBMIT_DIR"

#: ``SBATCH_*``/``SALLOC_*`` variables that Slurm itself sets in a job (sbatch(1) and salloc(1),
#: "OUTPUT ENVIRONMENT VARIABLES", Slurm 22.05); sbatch reads the ``SBATCH_`` ones as options.
SLURM_SET_SUBMIT_OPTIONS: FrozenSet[str] = frozenset(
    {
        "SBATCH_MEM_BIND",
        "SBATCH_MEM_BIND_LIST",
        "SBATCH_MEM_BIND_PREFER",
        "SBATCH_MEM_BIND_TYPE",
        "SBATCH_MEM_BIND_VERBOSE",
        "SBATCH_THREADS_PER_CORE",
        "SALLOC_THREADS_PER_CORE",
    }
)

#: torch.distributed's variables of a rank (the torchrun environment contract, torch.distributed.run
#: "Environment Variables"), set in the caller when it is itself a rank of a job.
RANK_VARIABLES: FrozenSet[str] = frozenset(
    {
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "ROLE_RANK",
        "NODE_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "ROLE_WORLD_SIZE",
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "TORCHELASTIC_ERROR_FILE",
        "TORCHELASTIC_USE_AGENT_STORE",
    }
)

#: srun(1) "INPUT ENVIRONMENT VARIABLES" (Slurm 22.05.8's man page), and ``SLURM_CPUS_PER_TASK`` and
#: ``SLURM_TRES_PER_TASK``, which srun reads in releases after 22.05 (22.05 read ``SRUN_CPUS_PER_TASK``
#: instead; its release notes): what an ``srun`` in the batch script reads as its options. A later
#: release's other additions are cleared at submit all the same (by prefix).
SRUN_INPUT: FrozenSet[str] = frozenset(
    [
        "SLURM_ACCOUNT",
        "SLURM_ACCTG_FREQ",
        "SLURM_BCAST",
        "SLURM_BCAST_EXCLUDE",
        "SLURM_BURST_BUFFER",
        "SLURM_CLUSTERS",
        "SLURM_COMPRESS",
        "SLURM_CONF",
        "SLURM_CONSTRAINT",
        "SLURM_CORE_SPEC",
        "SLURM_CPUS_PER_GPU",
        "SLURM_CPUS_PER_TASK",
        "SLURM_CPU_BIND",
        "SLURM_CPU_FREQ_REQ",
        "SLURM_DEBUG",
        "SLURM_DEBUG_FLAGS",
        "SLURM_DELAY_BOOT",
        "SLURM_DEPENDENCY",
        "SLURM_DISABLE_STATUS",
        "SLURM_DISTRIBUTION",
        "SLURM_DIST_PLANESIZE",
        "SLURM_EPILOG",
        "SLURM_EXACT",
        "SLURM_EXCLUSIVE",
        "SLURM_EXIT_ERROR",
        "SLURM_EXIT_IMMEDIATE",
        "SLURM_EXPORT_ENV",
        "SLURM_GPUS",
        "SLURM_GPUS_PER_NODE",
        "SLURM_GPUS_PER_TASK",
        "SLURM_GPU_BIND",
        "SLURM_GPU_FREQ",
        "SLURM_GRES",
        "SLURM_GRES_FLAGS",
        "SLURM_HINT",
        "SLURM_IMMEDIATE",
        "SLURM_JOB_ID",
        "SLURM_JOB_NAME",
        "SLURM_JOB_NUM_NODES",
        "SLURM_KILL_BAD_EXIT",
        "SLURM_LABELIO",
        "SLURM_MEM_BIND",
        "SLURM_MEM_PER_CPU",
        "SLURM_MEM_PER_GPU",
        "SLURM_MEM_PER_NODE",
        "SLURM_MPI_TYPE",
        "SLURM_NETWORK",
        "SLURM_NNODES",
        "SLURM_NO_KILL",
        "SLURM_NPROCS",
        "SLURM_NTASKS",
        "SLURM_NTASKS_PER_CORE",
        "SLURM_NTASKS_PER_GPU",
        "SLURM_NTASKS_PER_NODE",
        "SLURM_NTASKS_PER_SOCKET",
        "SLURM_OPEN_MODE",
        "SLURM_OVERCOMMIT",
        "SLURM_OVERLAP",
        "SLURM_PARTITION",
        "SLURM_PMI_KVS_NO_DUP_KEYS",
        "SLURM_POWER",
        "SLURM_PROFILE",
        "SLURM_PROLOG",
        "SLURM_QOS",
        "SLURM_REMOTE_CWD",
        "SLURM_REQ_SWITCH",
        "SLURM_RESERVATION",
        "SLURM_RESV_PORTS",
        "SLURM_SEND_LIBS",
        "SLURM_SIGNAL",
        "SLURM_SPREAD_JOB",
        "SLURM_SRUN_REDUCE_TASK_EXIT_MSG",
        "SLURM_STDERRMODE",
        "SLURM_STDINMODE",
        "SLURM_STDOUTMODE",
        "SLURM_STEP_GRES",
        "SLURM_STEP_KILLED_MSG_NODE_ID",
        "SLURM_TASK_EPILOG",
        "SLURM_TASK_PROLOG",
        "SLURM_TEST_EXEC",
        "SLURM_THREADS",
        "SLURM_THREADS_PER_CORE",
        "SLURM_THREAD_SPEC",
        "SLURM_TIMELIMIT",
        "SLURM_TRES_PER_TASK",
        "SLURM_UMASK",
        "SLURM_UNBUFFEREDIO",
        "SLURM_USE_MIN_NODES",
        "SLURM_WAIT",
        "SLURM_WAIT4SWITCH",
        "SLURM_WCKEY",
        "SLURM_WORKING_DIR",
        "SRUN_CONTAINER",
        "SRUN_CPUS_PER_TASK",
        "SRUN_EXPORT_ENV",
    ]
)

#: srun input variables that Slurm sets afresh in every batch job, whatever it asked for: the job's
#: identity and size (seen in the sandbox's batch environment, Slurm 22.05), and the cluster.
BATCH_JOB_SETS: FrozenSet[str] = frozenset(
    {"SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NPROCS"}
)

#: sbatch option (``render.sbatch_options``' snake_case keys) → the srun input variables Slurm sets
#: from it in the batch job (sbatch(1), "OUTPUT ENVIRONMENT VARIABLES") under another name than
#: ``SLURM_<OPTION>``; an option's own ``SLURM_<OPTION>`` (``SLURM_CPUS_PER_TASK``,
#: ``SLURM_GPUS_PER_TASK``, ``SLURM_NO_KILL``, …) counts as set by it too.
OPTION_SETS: Mapping[str, Sequence[str]] = {
    "cpus_per_task": ("SLURM_TRES_PER_TASK",),
    "gpus_per_task": ("SLURM_TRES_PER_TASK",),
    "mem": ("SLURM_MEM_PER_NODE",),
    "distribution": ("SLURM_DIST_PLANESIZE",),
}


def in_job(environ: Mapping[str, str]) -> bool:
    """True when ``environ`` is that of a process inside a Slurm job (``SLURM_JOB_ID`` or its older
    spelling ``SLURM_JOBID`` set: sbatch(1), salloc(1), srun(1) "OUTPUT ENVIRONMENT VARIABLES")."""
    return bool(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))


def caller_job_variables(
    environ: Mapping[str, str], keep: Sequence[str] = (), *, inside: Optional[bool] = None
) -> List[str]:
    """The names in ``environ`` that belong to the caller's Slurm job or step (the rule in the module
    docstring), sorted; none outside a job. ``keep`` (``environment.pass_env``) are never listed;
    ``inside``: whether the caller counts as inside a job (default :func:`in_job`)."""
    if not (in_job(environ) if inside is None else inside):
        return []
    kept = set(keep) | CLIENT_SETTINGS
    return sorted(
        name
        for name in environ
        if name not in kept
        and (name.startswith(JOB_PREFIXES) or name in SLURM_SET_SUBMIT_OPTIONS or name in RANK_VARIABLES)
    )


def submit_environ(
    environ: Mapping[str, str],
    keep: Sequence[str] = (),
    *,
    submit_dir: Optional[str] = None,
    inside: Optional[bool] = None,
) -> Dict[str, str]:
    """``environ`` without :func:`caller_job_variables` (``keep``, ``inside`` as there): the environment
    for the ``sbatch`` a submit runs (what the job then gets, ``--export=ALL``), with ``submit_dir``
    (the run or sweep directory submitted) as :data:`SUBMIT_DIR_VAR`; and the base of a local rank's."""
    drop = set(caller_job_variables(environ, keep, inside=inside))
    out = {k: v for k, v in environ.items() if k not in drop}
    if submit_dir is not None:
        out[SUBMIT_DIR_VAR] = submit_dir
    return out


def batch_unset(options: Mapping[str, Optional[str]], keep: Sequence[str] = ()) -> List[str]:
    """The srun input variables (:data:`SRUN_INPUT`) a job started by hand unsets before its ``srun``
    (``supervise.drop_inherited``, from the job's plan),
    sorted: those Slurm does not set in the batch job itself, neither always (:data:`BATCH_JOB_SETS`,
    ``SLURM_CONF`` and the other :data:`CLIENT_SETTINGS`) nor from one of the job's sbatch
    ``options`` (``render.sbatch_options``: ``SLURM_<OPTION>`` and :data:`OPTION_SETS`). Present in a batch job, such a
    variable came from the shell that ran sbatch (a job submitted by hand from inside another).
    ``keep`` (``environment.pass_env``) are never listed."""
    own = set(BATCH_JOB_SETS) | CLIENT_SETTINGS | set(keep)  # SUBMIT_DIR_VAR is no srun input
    for option in options:
        option = option.replace("-", "_")
        own.update(("SLURM_" + option.upper(), *OPTION_SETS.get(option, ())))
    return sorted(SRUN_INPUT - own)


__all__ = [
    "BATCH_JOB_SETS",
    "CLIENT_SETTINGS",
    "JOB_PREFIXES",
    "OPTION_SETS",
    "RANK_VARIABLES",
    "SLURM_SET_SUBMIT_OPTIONS",
    "SRUN_INPUT",
    "SUBMIT_DIR_VAR",
    "batch_unset",
    "caller_job_variables",
    "in_job",
    "submit_environ",
]
