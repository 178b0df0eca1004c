"""``train.command``: where its script is (``command_script_index``) and the argv a rank runs
(``command_argv``). Pure; imports no torch. Part of ``slurm_ddp.config`` (import names from there).
"""

from __future__ import annotations

import os
import re
from typing import List, Optional, Sequence

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?\Z")


def command_script_index(argv: Sequence[str]) -> Optional[int]:
    """Index of the script file in a ``train.command`` argv, or None when it names none.

    ``train.py …`` → 0; ``python [options] train.py …`` → the first argument that is not an
    option (python(1): ``-W``/``-X`` take a value; ``-m``/``-c`` mean there is no script file);
    a program given by a path (``./run.sh``, ``bin/train``) → 0; a program found on PATH → None.
    """
    if not argv:
        return None
    prog = argv[0]
    if prog.endswith(".py"):
        return 0
    if _PYTHON_NAME.match(os.path.basename(prog)):
        i = 1
        while i < len(argv):
            a = argv[i]
            if a == "-" or (a.startswith("-") and not a.startswith("--") and any(c in a[1:] for c in "mc")):
                return None
            if a in ("-W", "-X", "--check-hash-based-pycs"):
                i += 2
                continue
            if a.startswith("-"):
                i += 1
                continue
            return i
        return None
    return 0 if "/" in prog else None


def command_module_index(argv: Sequence[str]) -> Optional[int]:
    """Index of the module name in a ``python [options] -m MODULE …`` argv, or None.

    ``python -u -m pkg.train --lr 1`` → 3. Only a separate ``-m`` word counts (python(1)); a
    program that is not a Python interpreter, a script, or ``-c`` → None.
    """
    if not argv or not _PYTHON_NAME.match(os.path.basename(argv[0])):
        return None
    i = 1
    while i < len(argv):
        a = argv[i]
        if a == "-m" or (a.startswith("-") and not a.startswith("--") and a.endswith("m") and "c" not in a):
            return i + 1 if i + 1 < len(argv) else None  # -m, or a group ending in it (-um)
        if a in ("-W", "-X", "--check-hash-based-pycs"):
            i += 2
            continue
        if not a.startswith("-") or a == "-" or "c" in a[1:] and not a.startswith("--"):
            return None
        i += 1
    return None


def command_argv(command: Sequence[str], python: str) -> List[str]:
    """The argv a rank runs for ``train.command``, with ``python`` the ranks' interpreter.

    A bare ``python``/``python3``/``python3.X`` as the program becomes ``python`` (the
    interpreter ``submit`` checked, ``environment.python`` or the submitting one); a first
    argument ending in ``.py`` is run by it (``train.py --lr 1`` → ``python train.py --lr 1``).
    """
    argv = list(command)
    if not argv:
        return argv
    if argv[0].endswith(".py"):
        return [python, *argv]
    if "/" not in argv[0] and _PYTHON_NAME.match(argv[0]):
        return [python, *argv[1:]]
    return argv
