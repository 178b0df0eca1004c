"""The numbers every part of slurm_ddp agrees on: the package version and the exit status of a
stopped-for-preemption rank. A leaf module (imports nothing), so that any module may use them
without importing the package's top level (which reaches the Python API, ``slurm_ddp.api``).
"""

__version__ = "0.1.0"

#: Exit status of a rank (and of the job step) that stopped because of a preemption
#: signal after its checkpoint was committed. 75 is EX_TEMPFAIL from sysexits.h:
#: "a temporary failure ... the user is invited to retry".
PREEMPTED_EXIT_CODE = 75

#: How long a rank that lost a peer waits for the survivor that claimed the emergency checkpoint of the
#: last completed step to commit it (seconds; a few saves of a large model to a parallel file system),
#: and how long a hang watchdog lets its rank save that checkpoint before it ends the rank.
EMERGENCY_WAIT_S = 60.0

#: ``environment.run_dir_mode``'s choices: who may read the run directory's files that can hold the config's
#: values (``private``: the owner; ``group``: the file's group too). The modes they stand for are
#: ``slurm_ddp.rundir.private_modes``'.
RUN_DIR_MODES = ("private", "group")
