"""Operating runs from the login node: the verbs ``runs``, ``status``, ``logs``, ``cancel`` and
``requeue`` as records and sentences; their text is :mod:`.view`'s, the exit codes ``slurm_ddp.cli``'s.

One module per job:

- :mod:`.runs`: what a run directory records (:class:`Run`, :func:`read_run`, :func:`find_runs`,
  :func:`resolve_run`); reads files;
- :mod:`.slurm`: what Slurm says about jobs (``scontrol``/``squeue``/``sacct``, job states);
  runs commands through an injectable ``Runner``;
- :mod:`.ownjob`: whether the job Slurm has under a run's recorded id is the run's own (user, job
  name, directory, cluster), the one check every verb below asks before it acts on or reports a job;
- :mod:`.status`: the two joined into a run's state (:class:`RunStatus`), the local supervisor's
  liveness, and the refusal of a second job in a busy run directory;
- :mod:`.actions`: :func:`cancel` and :func:`requeue` (``scancel`` / ``scontrol requeue``);
- :mod:`.logs`: a run's log files, shown once or followed, written through an injected ``write``;
- :mod:`.poll`: how often the verbs that wait ask Slurm (one batched question per interval for every
  watched run, backing off while nothing changes): the one polling policy, ``POLL``;
- :mod:`.targets`: what a verb's argument names (run, sweep, ``SWEEP/N``) and the verbs that take either;
- :mod:`.report`: what ``runs`` and ``status`` report (states joined with accounting and provenance);
- :mod:`.memory`: the memory a job will get (what it asks for, else the site's default from ``scontrol``),
  the line ``submit`` and its dry run print;
- :mod:`.view`: the text of all of it, shared by the CLI and the Python API.

The run directory's file names and readers belong to :mod:`slurm_ddp.rundir`. Nothing here
imports torch: all of it works on a login node where only the CLI is installed. The names
below are re-exported so that ``from slurm_ddp import ops; ops.read_run(...)`` reads as before.
"""

from __future__ import annotations

from .actions import cancel, requeue
from .logs import LogSource, check_rank, follow_logs, log_sources, show_logs
from .runs import Run, find_runs, is_run_dir, read_config_facts, read_run, resolve_run
from .slurm import (
    FINAL_STATES,
    REQUEUED_STATES,
    Runner,
    SlurmAnswer,
    SlurmJob,
    is_final,
    query_jobs,
    sacct_jobs,
    scontrol_job,
    squeue_jobs,
)
from .status import (
    RunStatus,
    launcher_lock_held,
    local_supervisor_alive,
    refuse_active_run,
    run_status,
    runs_status,
)

__all__ = [
    "FINAL_STATES",
    "REQUEUED_STATES",
    "LogSource",
    "Run",
    "RunStatus",
    "Runner",
    "SlurmAnswer",
    "SlurmJob",
    "cancel",
    "check_rank",
    "find_runs",
    "follow_logs",
    "is_final",
    "is_run_dir",
    "launcher_lock_held",
    "local_supervisor_alive",
    "log_sources",
    "query_jobs",
    "read_config_facts",
    "read_run",
    "refuse_active_run",
    "requeue",
    "resolve_run",
    "run_status",
    "runs_status",
    "sacct_jobs",
    "scontrol_job",
    "show_logs",
    "squeue_jobs",
]
