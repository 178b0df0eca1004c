"""The one way a process entry point turns a ``SlurmDDPError`` into a message and an exit code.

``python -m slurm_ddp.launch``, ``python -m slurm_ddp.worker`` and ``python -m
slurm_ddp.rendezvous`` run under srun or the batch shell, where stderr is the batch log:
an error the user can act on must be one line there, ``PROG: error: MESSAGE``, and the
process's exit status the error's ``exit_code`` (slurm_ddp.errors). ``slurm_ddp.cli`` does
the same for the ``slurm-ddp`` command. Imports no torch.
"""

from __future__ import annotations

import sys
import traceback
from typing import Callable, Optional, TextIO

from .errors import SlurmDDPError


def one_line(text: str) -> str:
    """``text`` with its lines joined by single spaces (an error message for one log line)."""
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def run_main(
    prog: str,
    fn: Callable[[], int],
    *,
    where: Optional[Callable[[], str]] = None,
    report_crash: bool = False,
    stderr: Optional[TextIO] = None,
) -> int:
    """Run ``fn`` and return its exit status; a ``SlurmDDPError`` becomes one stderr line.

    The line is ``PROG: error: [WHERE: ]MESSAGE`` (``where()``, e.g. ``rank 3 on gpu-002``, is
    called only then) and the status the error's ``exit_code``. Any other exception is a bug
    and propagates with its traceback, unless ``report_crash``: then (the worker, where the
    user's task code runs) the traceback is printed, followed by the one line
    ``PROG: error: [WHERE ]failed: TYPE: MESSAGE``, and the status is 1.
    """
    err = sys.stderr if stderr is None else stderr
    try:
        return fn()
    except SlurmDDPError as e:
        prefix = f"{where()}: " if where else ""
        print(f"{prog}: error: {prefix}{one_line(str(e))}", file=err, flush=True)
        return e.exit_code
    except Exception as e:
        if not report_crash:
            raise
        traceback.print_exc(file=err)
        prefix = f"{where()} " if where else ""
        print(f"{prog}: error: {prefix}failed: {type(e).__name__}: {one_line(str(e))}", file=err, flush=True)
        return 1
