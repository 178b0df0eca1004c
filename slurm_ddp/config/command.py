"""``train.command``: where its script is (``command_script_index``; ``command_is_wrapper``), the argv a rank runs
(``command_argv``), the one rule of ``$NAME`` in ``train.command``'s words and ``environment.env``'s values
at rank start (``COMMAND_VAR``, ``expand_variables``, ``command_word_problem``), the shell syntax the rank wrapper
does not run (``command_shell_syntax``) and how ``train.args`` reach the script (``command_arg_flags``).
Pure; imports no torch. Part of ``slurm_ddp.config`` (import names from there).

``train.args`` of a ``train.command`` job are the script's parameters, one run's (a sweep element's)
own: at rank start (``slurm_ddp.launch``, from the run's ``config.yaml``) a word ``${args.NAME}`` of
the command becomes ``train.args.NAME``'s value, and every entry the command does not place that way
is appended as ``--NAME=VALUE`` (in the mapping's order; the spelling argparse, click and
``HfArgumentParser`` read, and W&B sweeps' ``${args}``). So ``--sweep train.args.lr=0.001,0.01`` over
``python train.py`` runs ``python train.py --lr=0.001`` in element 0 and ``--lr=0.01`` in element 1.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set

from ..errors import UserError

_PYTHON_NAME = re.compile(r"^python(\d+(\.\d+)?)?\Z")

#: A ``$`` in a ``train.command`` word: ``$$`` (group 1, a literal ``$``), ``${args.NAME}`` (2: ``train.args``'
#: entry), ``${NAME}`` (3), ``$NAME`` (4), or anything else (5: an error). The rank wrapper expands the first four at
#: rank start (``launch.expand_command``); nothing else of the shell's syntax.
COMMAND_VAR = re.compile(
    r"\$(?:(\$)|\{args\.([A-Za-z_][A-Za-z0-9_-]*)\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*)|(.?))", re.S
)

_LONE_DOLLAR = "a '$' must start $NAME or ${NAME}; write $$ for a literal $"

#: What to do instead of shell syntax in ``train.command``.
WRAPPER_HINT = (
    "the rank wrapper starts the program itself, without a shell; put the line in a wrapper script that ends in "
    'exec (run.sh: exec python "$(dirname "$0")/train.py" ... > log.txt 2>&1, which runs the snapshot\'s '
    "train.py) and set train.command: bash run.sh"
)


def command_word_problem(word: str) -> Optional[str]:
    """What ``expand_variables`` would refuse in one ``train.command`` word or ``environment.env`` value
    whatever the environment, or None: a ``$(…)`` (command substitution) or a ``$`` not followed by a name,
    ``{NAME}`` or ``$``. For checking a config before any rank starts."""
    for m in COMMAND_VAR.finditer(word):
        if m.group(5) is not None:
            if m.group(5) == "(":
                return f"{_LONE_DOLLAR} (no $(...): command substitution is shell syntax)"
            return _LONE_DOLLAR
    return None


_OPERATOR_CHARS = "|&;<>()"


def command_shell_syntax(line: str) -> Optional[str]:
    """The first piece of shell syntax outside quotes in ``train.command`` given as one string, or None:
    a redirection (``>``, ``2>&1``, ``<``), a pipe, ``&&``/``||``/``;``/``&``, a subshell's ``(``, a
    backquote or ``$(`` (also inside double quotes, where the shell would still run them). Quoting as
    POSIX sh reads it (``shlex``): ``'>'`` or ``"a|b"`` are arguments, not operators."""
    quote = ""
    i = 0
    while i < len(line):
        c = line[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            i += 2
            continue
        elif c == "`":
            return "` (command substitution)"
        elif c == "$" and line.startswith("$(", i):
            return "$( (command substitution)"
        elif quote == '"':
            quote = "" if c == '"' else quote
        elif c in "'\"":
            quote = c
        elif c in _OPERATOR_CHARS:
            j = i
            while j < len(line) and line[j] in _OPERATOR_CHARS:
                j += 1
            if "&" in line[i:j] or ">" in line[i:j]:
                while j < len(line) and (line[j].isdigit() or line[j] == "-"):  # >&2, 2>&1, <&-
                    j += 1
            start = i
            while start > 0 and line[start - 1].isdigit():  # 2>: the descriptor is part of it
                start -= 1
            if start > 0 and not line[start - 1].isspace():
                start = i
            op = line[start:j]
            kinds = {"|": "a pipe", "||": "a command list", "&&": "a command list", ";": "a command list"}
            kinds.update({"&": "a background job", "(": "a subshell", ")": "a subshell"})
            return f"{op} ({kinds.get(op, 'a redirection' if any(ch in op for ch in '<>') else 'shell syntax')})"
        i += 1
    return None


#: a POSIX-family shell run by name (``sh``, ``bash``, ``dash``, ``zsh``, ``ksh``, ``mksh``, ``ash``, ``yash``):
#: ``bash [options] run.sh …`` runs the script ``run.sh`` (bash(1), dash(1) "Invocation")
_SHELL_NAME = re.compile(r"^(ba|da|z|k|mk|a|ya)?sh\Z")
#: a shell option that takes the next word as its value: ``-o NAME``/``+o NAME`` (set's options),
#: bash's ``-O``/``+O`` (shopt), ``--rcfile``/``--init-file`` FILE
_SHELL_VALUE_OPTIONS = ("--rcfile", "--init-file")
#: the FHS's system program directories: a program given by a path there (``/usr/bin/env``,
#: ``/bin/bash``) is the system's, not a script of the project, and is not snapshotted
SYSTEM_DIRS = ("/usr/", "/bin/", "/sbin/", "/lib/", "/lib64/", "/etc/")


def _shell_script_index(argv: Sequence[str]) -> Optional[int]:
    """Index of the script file in a shell's argv (``argv[0]`` a shell), or None when it runs none:
    ``-c`` (a command string), ``-s`` or no operand (stdin). ``--`` or ``-`` end the options
    (bash(1): "A - signals the end of options"); ``-o``/``-O`` (also inside a group, ``-euo pipefail``)
    and ``--rcfile``/``--init-file`` take a value."""
    i = 1
    while i < len(argv):
        a = argv[i]
        if a in ("--", "-"):
            return i + 1 if i + 1 < len(argv) else None
        if a in _SHELL_VALUE_OPTIONS:
            i += 2
            continue
        if a.startswith("--"):
            i += 1
            continue
        if a[:1] in ("-", "+") and len(a) > 1:
            letters = a[1:]
            if a[0] == "-" and any(c in letters for c in "cs"):
                return None
            i += 1 + sum(1 for c in letters if c in "oO")
            continue
        return i
    return None


#: slurm_ddp's modules that run a script file as ``python SCRIPT ARGS`` would, adding something around it:
#: ``python -m slurm_ddp.transformers SCRIPT ARGS`` (every ``transformers.Trainer`` the script builds gets
#: ``SlurmDDPCallback``). For ``command_script_index`` SCRIPT is the command's script (resolved against the
#: job file's directory, checked, snapshotted), and the module is not the user's code.
SCRIPT_RUNNERS = ("slurm_ddp.transformers",)


def _module_word(argv: Sequence[str]) -> Optional[int]:
    """Index of the word after ``-m`` (or a group ending in it, ``-um``) in a python argv, None when the
    options end first, or name ``-c`` or ``-`` (stdin): python(1)'s option rules."""
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


def command_script_index(argv: Sequence[str]) -> Optional[int]:
    """Index of the script file in a ``train.command`` argv, or None when it names none.

    ``train.py …`` → 0; ``python [options] train.py …`` → the first argument that is not an
    option (python(1): ``-W``/``-X`` take a value; ``-m``/``-c`` mean there is no script file);
    ``python -m slurm_ddp.transformers train.py …`` → 3 (a ``SCRIPT_RUNNERS`` module: its first
    argument, unless that is an option such as ``-m``);
    a shell (``sh``/``bash``/``zsh``/…, by name or path) → its script (``bash -e run.sh`` → 2;
    ``bash -c …`` → None: :func:`_shell_script_index`); another program given by a path
    (``./run.sh``, ``bin/train``) → 0, unless it lies in a system directory (``SYSTEM_DIRS``:
    ``/usr/bin/env``); a program found on PATH → None.
    """
    if not argv:
        return None
    prog = argv[0]
    if prog.endswith(".py"):
        return 0
    if _PYTHON_NAME.match(os.path.basename(prog)):
        m = _module_word(argv)
        if m is not None and argv[m] in SCRIPT_RUNNERS:
            return m + 1 if m + 1 < len(argv) and not argv[m + 1].startswith("-") else None
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
    if _SHELL_NAME.match(os.path.basename(prog)):
        return _shell_script_index(argv)
    if "/" not in prog or (os.path.isabs(prog) and os.path.normpath(prog).startswith(SYSTEM_DIRS)):
        return None
    return 0


def command_is_wrapper(argv: Sequence[str]) -> bool:
    """True when ``train.command`` runs a script of its own that Python does not run: a shell script
    (``bash run.sh``, ``sh -e x.sh``) or a program given by a path (``./run.sh``, ``bin/train``).

    Such a wrapper names what it runs by paths it resolves itself (``exec python train.py``: from the
    working directory), so its snapshot holds ``train.workdir``'s code too, and shell scripts
    (``slurm_ddp.snapshot.SHELL_SUFFIXES``) count as code (``slurm_ddp.snapshot``)."""
    i = command_script_index(argv)
    return i is not None and not argv[0].endswith(".py") and not _PYTHON_NAME.match(os.path.basename(argv[0]))


def command_module_index(argv: Sequence[str]) -> Optional[int]:
    """Index of the module name in a ``python [options] -m MODULE …`` argv, or None.

    ``python -u -m pkg.train --lr 1`` → 3. Only a separate ``-m`` word counts (python(1)); a
    program that is not a Python interpreter, a script, or ``-c`` → None; a ``SCRIPT_RUNNERS`` module
    running a script file → None (the script is the user's code: ``command_script_index``).
    """
    if not argv or not _PYTHON_NAME.match(os.path.basename(argv[0])):
        return None
    m = _module_word(argv)
    if m is not None and argv[m] in SCRIPT_RUNNERS and command_script_index(argv) is not None:
        return None
    return m


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


#: a ``train.args`` name a script parameter can have: ``lr``, ``learning_rate``, ``batch-size``
ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")


def command_placeholders(words: Sequence[str]) -> List[str]:
    """The ``train.args`` names the words of ``train.command`` place with ``${args.NAME}`` (``$$`` is a
    literal ``$``, so ``$${args.x}`` places nothing), in order of appearance."""
    return [m.group(2) for w in words for m in COMMAND_VAR.finditer(w) if m.group(2)]


def command_arg_text(value: Any) -> str:
    """A ``train.args`` value as a command-line word: a string as it is, ``true``/``false``, a number as
    the job YAML writes it (``1e3``, ``0.10``, ``010``: ``config.ScalarFloat``/``ScalarInt`` keep the text;
    a number from the Python API as Python writes it, ``0.001``, ``1e-05``), ``null``, a list or mapping
    as compact JSON (its numbers as JSON writes them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), default=str)


def command_arg_flags(args: Mapping[str, Any], placed: Iterable[str] = ()) -> List[str]:
    """``--NAME=VALUE`` for each ``train.args`` entry not in ``placed`` (the names the command's
    words place themselves with ``${args.NAME}``), in the mapping's order."""
    skip = set(placed)
    return [f"--{k}={command_arg_text(v)}" for k, v in args.items() if k not in skip]


def expand_variables(
    text: str,
    environ: Mapping[str, str],
    what: str,
    hint: str = "set it in environment.env",
    args: Optional[Mapping[str, Any]] = None,
    placed: Optional[Set[str]] = None,
) -> str:
    """``text`` with ``$NAME`` and ``${NAME}`` replaced by ``environ[NAME]`` and ``$$`` by ``$``; with
    ``args`` (``train.args``, for ``train.command``'s words), ``${args.NAME}`` by ``args[NAME]``
    (``command_arg_text``), each name so placed added to ``placed``.

    The one rule (``COMMAND_VAR``) of ``train.command``'s words and ``environment.env``'s values, applied at
    rank start in the rank's environment (``slurm_ddp.launch``). No other shell syntax: no ``~``, ``$(...)``,
    ``${NAME:-x}``. ``what`` names the text in errors (``train.command word '…'``). Raises ``UserError``
    (one line) for a variable that is not set (an empty value would silently become a wrong path; ``hint``
    says where to set it), an ``${args.NAME}`` that ``args`` lacks (or outside ``train.command``), and a
    ``$`` followed by anything else.
    """

    def sub(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        arg = m.group(2)
        if arg is not None:
            if args is None:
                raise UserError(f"{what}: ${{args.{arg}}} is for train.command's words only")
            if arg not in args:
                have = ", ".join(sorted(args)) or "none"
                raise UserError(
                    f"{what} names ${{args.{arg}}}, which train.args does not set "
                    f"(train.args has: {have}); set train.args.{arg} or sweep it"
                )
            if placed is not None:
                placed.add(arg)
            return command_arg_text(args[arg])
        name = m.group(3) or m.group(4)
        if name is None:
            raise UserError(f"{what}: {_LONE_DOLLAR}")
        if name not in environ:
            raise UserError(
                f"{what} names ${name}, which is not set in the rank's environment ({hint}, or write $$ for a literal $)"
            )
        return environ[name]

    return COMMAND_VAR.sub(sub, text)


def env_as_written(env: Mapping[str, str]) -> Dict[str, str]:
    """``environment.env``'s values without a ``$``: what the batch script (the local supervisor, submitit's
    script) exports as written before the ranks start, ``environment.setup`` included. A value with a ``$``
    is set by the rank wrapper at rank start only, expanded (``expand_env``)."""
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
