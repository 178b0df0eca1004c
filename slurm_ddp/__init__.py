"""slurm_ddp: one YAML file → a DistributedDataParallel job on SLURM.

The package is split into a pure core that imports no torch (``config``, ``env``,
``render``, ``binding``) and edges with side effects (``backends``, ``checkpoint``,
``signals``, ``worker``, ``sandbox``). ``render`` and ``submit --dry-run`` work on a
login node where torch is not installed.
"""

__version__ = "0.1.0"

#: Exit status of a rank (and of the job step) that stopped because of a preemption
#: signal after its checkpoint was committed. 75 is EX_TEMPFAIL from sysexits.h:
#: "a temporary failure ... the user is invited to retry".
PREEMPTED_EXIT_CODE = 75
