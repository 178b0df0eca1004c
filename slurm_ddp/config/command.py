"""``train.command``: where its script is (``command_script_index``) and the argv a rank runs
(``command_argv``); and the one rule of ``$NAME`` in ``train.command``'s words and ``environment.env``'s
values at rank start (``expand_variables``). Pure; imports no torch. Part of ``slurm_ddp.config``
(import names from there).
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Optional, Sequence

from ..errors import UserError

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


#: ``$$``, ``${NAME}``, ``$NAME``, or a ``$`` followed by anything else (the error).
_VARIABLE = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*)|(.?))", re.S)
_LONE_DOLLAR = "a '$' must start $NAME or ${NAME}; write $$ for a literal $"


def expand_variables(text: str, environ: Mapping[str, str], what: str, hint: str = "set it in environment.env") -> str:
    """``text`` with ``$NAME`` and ``${NAME}`` replaced by ``environ[NAME]`` and ``$$`` by ``$``.

    The one rule of ``train.command``'s words and ``environment.env``'s values, applied at rank start in
    the rank's environment (``slurm_ddp.launch``). No other shell syntax: no ``~``, ``$(...)``,
    ``${NAME:-x}``. ``what`` names the text in errors (``train.command word '…'``). Raises ``UserError``
    (one line) for a variable that is not set (an empty value would silently become a wrong path; ``hint``
    says where to set it) and for a ``$`` followed by anything else.
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(3)
        if name is None:
            raise UserError(f"{what}: {_LONE_DOLLAR}")
        if name not in environ:
            raise UserError(
                f"{what} names ${name}, which is not set in the rank's environment ({hint}, or write $$ for a literal $)"
            )
        return environ[name]

    return _VARIABLE.sub(sub, text)


def variables_problem(text: str) -> Optional[str]:
    """What ``expand_variables`` would refuse in ``text`` whatever the environment (a ``$`` that starts
    no name), or None: for checking a config before any rank starts."""
    for m in _VARIABLE.finditer(text):
        if not m.group(1) and not (m.group(2) or m.group(3)):
            return _LONE_DOLLAR
    return None


def env_as_written(env: Mapping[str, str]) -> Dict[str, str]:
    """``environment.env``'s values without a ``$``: what the batch script (the local launcher, submitit's
    script) exports as written before the ranks start, ``environment.setup`` included. A value with a ``$``
    is set by the launch wrapper at rank start only, expanded (``expand_env``)."""
    return {k: v for k, v in env.items() if "$" not in v}


def expand_env(env: Mapping[str, str], environ: Mapping[str, str]) -> Dict[str, str]:
    """``environment.env``'s values with a ``$``, expanded in ``environ`` (the rank's environment) by
    ``expand_variables``; raises ``UserError`` naming the key for an unset name."""
    return {
        k: expand_variables(
            v,
            environ,
            f"environment.env.{k}",
            "set it in the node's environment: environment.setup, environment.pass_env or the submitting shell",
        )
        for k, v in env.items()
        if "$" in v
    }
