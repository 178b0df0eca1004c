"""The numbers every part of slurm_ddp agrees on: the package version, the exit status of a
stopped-for-preemption rank and that of a rank that asks not to be restarted. A leaf module (imports nothing), so that any module may use them
without importing the package's top level (which reaches the Python API, ``slurm_ddp.api``).
"""

__version__ = "0.1.0"

#: Exit status of a rank (and of the job step) that stopped because of a preemption
#: signal after its checkpoint was committed. 75 is EX_TEMPFAIL from sysexits.h:
#: "a temporary failure ... the user is invited to retry".
PREEMPTED_EXIT_CODE = 75

#: Exit status of a rank that failed deterministically and asks that the job be neither restarted in the job
#: nor requeued (``errors.NoRestart`` in the shared worker; ``sys.exit(93)`` in a ``train.command`` script):
#: the job ends, the cause named in the batch log, ``ends.jsonl`` (``no_restart``) and ``slurm-ddp status``.
#: 93 is the default of NVIDIA Resiliency Extension's ``--ft-no-restart-exit-code`` (its launchers' "do not
#: requeue" status), chosen there outside the codes that already mean something: 0-2, sysexits.h's 64-78,
#: the shell's 126-165 (128+N: a signal) and 255.
NO_RESTART_EXIT_CODE = 93

#: How long a rank that lost a peer waits for the survivor that claimed the emergency checkpoint of the
#: last completed step to commit it (seconds; a few saves of a large model to a parallel file system),
#: and how long a hang watchdog lets its rank save that checkpoint before it ends the rank.
EMERGENCY_WAIT_S = 60.0

#: ``environment.run_dir_mode``'s choices: who may read the run directory's files that can hold the config's
#: values (``private``: the owner; ``group``: the file's group too). The modes they stand for are
#: ``slurm_ddp.rundir.private_modes``'.
RUN_DIR_MODES = ("private", "group")
