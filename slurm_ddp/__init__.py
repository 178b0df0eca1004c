"""slurm_ddp: one YAML file → a DistributedDataParallel job on SLURM.

The package is split into a pure core that imports no torch (``config``, ``env``,
``render``, ``binding``) and edges with side effects (``backends``, ``checkpoint``,
``signals``, ``worker``, ``sandbox``). ``render`` and ``submit --dry-run`` work on a
login node where torch is not installed.

The Python API (``slurm_ddp.api``) is reached from here lazily: ``import slurm_ddp`` stays
torch-free and imports nothing else; ``slurm_ddp.submit``, ``slurm_ddp.Run``, ``slurm_ddp.Sweep`` and
``slurm_ddp.wait_all`` load it on first use.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import Final, Run, Sweep, submit, wait_all
    from .errors import NoRestart, SlurmDDPWarning

from .constants import NO_RESTART_EXIT_CODE, PREEMPTED_EXIT_CODE, __version__

__all__ = [
    "NO_RESTART_EXIT_CODE",
    "PREEMPTED_EXIT_CODE",
    "Final",
    "NoRestart",
    "Run",
    "SlurmDDPWarning",
    "Sweep",
    "__version__",
    "submit",
    "wait_all",
]

_API = ("submit", "Run", "Sweep", "Final", "wait_all")


def __getattr__(name: str) -> Any:  # PEP 562: the API on first use
    if name in _API:
        from . import api

        return getattr(api, name)
    if name in ("SlurmDDPWarning", "NoRestart"):  # the API's warnings; a task's "do not restart" (slurm_ddp.errors)
        from . import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'slurm_ddp' has no attribute {name!r}")
