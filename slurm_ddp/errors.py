"""Errors of slurm_ddp. Nearly a leaf module: imports only ``slurm_ddp.constants`` (a leaf).

Each class carries the process exit code the CLI uses for it; only ``slurm_ddp.cli`` and,
for the processes of a job (launch, worker, rendezvous), ``slurm_ddp.entrypoint.run_main``
turn an error into an exit code and a one-line message. A user's mistake is a
``UserError`` (exit 2, no traceback); anything else that escapes is a bug.
"""

from .constants import NO_RESTART_EXIT_CODE


class SlurmDDPWarning(UserWarning):
    """What slurm_ddp warns about without stopping (a setting that does nothing, a rank with a single
    CPU): the Python API issues ``submit``'s warnings in this category through Python's ``warnings``,
    so that they show by default (once per message and place, as ``UserWarning``);
    ``warnings.simplefilter("error", SlurmDDPWarning)`` turns them into errors. The CLI prints them
    as ``slurm-ddp: warning: …`` lines on stderr."""


class SlurmDDPError(Exception):
    """Base class of every error slurm_ddp raises on purpose."""

    exit_code = 1


class UserError(SlurmDDPError):
    """Bad input from the user (config, arguments, files): exit 2, one line."""

    exit_code = 2


class ConfigError(UserError):
    """The job config is invalid: names the key, what was given and what is valid."""


class EnvironmentMismatch(UserError):
    """SLURM's variables disagree with the job config (nodes, tasks per node)."""


class BindingError(UserError):
    """The binding the config asks for cannot be applied here (a missing library or tool)."""


class ClusterError(SlurmDDPError):
    """A cluster command (sbatch, scontrol, squeue) failed or is missing."""

    exit_code = 3


class SandboxUnavailable(SlurmDDPError):
    """The private Slurm sandbox cannot start here; the message says why and what to install."""

    exit_code = 4


class CommandNotRunnable(SlurmDDPError):
    """A wrapper could not exec the command it was given (exit 127, the shell's "cannot run")."""

    exit_code = 127


class CheckpointError(SlurmDDPError):
    """A checkpoint could not be written or no valid checkpoint could be read."""

    exit_code = 5


class PeerFailure(SlurmDDPError):
    """Another rank died or stopped responding during a collective (the worker's exit 1)."""

    exit_code = 1


class TrainingDiverged(SlurmDDPError):
    """The loss became NaN/inf (``train.nan_check``; the worker's exit 1)."""

    exit_code = 1


class NoRestart(SlurmDDPError):
    """A deterministic failure that no restart can mend (a missing data shard, a config the task refuses):
    raised by the task on any rank, it ends the rank with ``constants.NO_RESTART_EXIT_CODE`` (93, NVIDIA
    Resiliency Extension's do-not-restart status) and the job with it: no in-job restart, no in-process
    recovery, no requeue, the message named in the batch log, ``ends.jsonl`` and ``slurm-ddp status``."""

    exit_code = NO_RESTART_EXIT_CODE


class WaitTimeout(SlurmDDPError):
    """A run did not end within the time ``Run.wait(timeout_s=...)`` was given (it goes on running)."""

    exit_code = 124  # timeout(1)'s status


class DependencyNeverSatisfied(SlurmDDPError):
    """A run that ``--after`` / ``after=`` names ended in a way its condition excludes (``afterok`` of a
    failed run, ``afternotok`` of a finished one): the dependent job never starts. Slurm's word for it
    (a pending job's Reason). Its own exit code, so that the Python API tells it apart in the status
    of the detached submit process it started."""

    exit_code = 6
