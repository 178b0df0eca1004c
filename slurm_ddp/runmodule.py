"""``python -m slurm_ddp.runmodule DIR MODULE [ARG...]``: ``python -m MODULE [ARG...]``, with DIR
first on ``sys.path`` instead of the working directory.

A ``train.command`` of the form ``python -m pkg`` runs in the user's working directory
(``train.workdir``), with its code from the code snapshot (``slurm_ddp.snapshot``). ``python -m``
puts the working directory first on ``sys.path`` (python(1), ``-m``; since Python 3.11 ``-P`` /
``PYTHONSAFEPATH`` can turn that off, but not on 3.9/3.10, and the variable would reach the
script's own subprocesses), so the checkout would shadow the snapshot. ``remap_config`` rewrites
the command to ``python -m slurm_ddp.runmodule SNAPSHOT_DIR pkg``, and this module runs ``pkg``
as ``-m`` would (``runpy.run_module(..., run_name="__main__", alter_sys=True)``: ``__main__``,
``sys.argv[0]`` the module's file, a package's ``__main__``), with SNAPSHOT_DIR where the working
directory would have been. Imports nothing of slurm_ddp and no torch; exit status: the module's,
2 for a wrong call.
"""

import os
import runpy
import sys
from typing import List, Optional

USAGE = "usage: python -m slurm_ddp.runmodule DIR MODULE [ARG...]"


def main(argv: Optional[List[str]] = None) -> None:
    """Run MODULE as ``__main__`` with DIR first on ``sys.path``; returns only if MODULE does."""
    args = sys.argv[1:] if argv is None else list(argv)
    if len(args) < 2 or not args[1] or args[1].startswith("-"):
        print(f"slurm_ddp runmodule: error: {USAGE}", file=sys.stderr)
        raise SystemExit(2)
    directory, module, rest = os.path.abspath(args[0]), args[1], args[2:]
    # python -m put the working directory first (its absolute path; '' in older versions), unless -P
    if sys.path and sys.path[0] in ("", os.getcwd()):
        sys.path[0] = directory
    else:
        sys.path.insert(0, directory)
    sys.argv = [module, *rest]  # run_module sets sys.argv[0] to the module's file, as -m does
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
