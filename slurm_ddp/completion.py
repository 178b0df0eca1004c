"""Shell completion of ``slurm-ddp`` for bash, zsh and fish, through argcomplete (Apache-2.0).

``shell_script(shell)`` is the text ``slurm-ddp completion SHELL`` prints (argcomplete's own shell
code, registered for the ``slurm-ddp`` command). On each TAB the shell runs ``slurm-ddp`` with
``_ARGCOMPLETE`` set; ``autocomplete(parser)`` — called by the CLI before parsing — then answers from
the parser itself: verbs, flags, choices, and, through the completers attached here, config keys after
``--set`` (from the config's field metadata), job YAML files, and run or sweep directories.

Side effects: ``autocomplete`` writes the completions and exits the process when, and only when,
``_ARGCOMPLETE`` is set; otherwise nothing. Imports argcomplete only then, or for ``shell_script``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any, List, get_type_hints

from .errors import UserError

#: shells ``slurm-ddp completion`` writes a script for
SHELLS = ("bash", "zsh", "fish")
#: what the completion is registered for
PROG = "slurm-ddp"


def config_keys() -> List[str]:
    """Every dotted config key (``slurm.nodes``, ``tracking.mlflow.enabled``), in the schema's order."""
    from .config import JobConfig, key_fields

    out: List[str] = []

    def walk(cls: type, prefix: str) -> None:
        hints = get_type_hints(cls)
        for f in key_fields(cls):
            tp = hints[f.name]
            if isinstance(tp, type) and dataclasses.is_dataclass(tp):
                walk(tp, prefix + f.name + ".")
            else:
                out.append(prefix + f.name)

    walk(JobConfig, "")
    return out


def complete_set(prefix: str, **_: Any) -> List[str]:
    """``--set`` values: the config keys starting with ``prefix``, each followed by ``=``."""
    if "=" in prefix:
        return []
    return [k + "=" for k in config_keys() if k.startswith(prefix)]


def _is_run_dir(p: Path) -> bool:
    from .rundir import CONFIG_NAME, SWEEP_NAME

    return (p / CONFIG_NAME).is_file() or (p / SWEEP_NAME).is_file()


def complete_run(prefix: str, **_: Any) -> List[str]:
    """A run argument: directories that start with ``prefix``, and the run names under ``./runs``
    (what ``status NAME`` resolves) — run and sweep directories first."""
    base = Path(prefix).parent if prefix and not prefix.endswith("/") else Path(prefix or ".")
    stem = "" if prefix.endswith("/") else Path(prefix).name
    found: List[str] = []
    try:
        for p in sorted(base.iterdir()):
            if p.is_dir() and p.name.startswith(stem) and not p.name.startswith("."):
                shown = str(p) if prefix else p.name
                found.append(shown if _is_run_dir(p) else shown + "/")
    except OSError:
        pass
    if "/" not in prefix and Path("runs").is_dir():
        found += [p.name for p in sorted(Path("runs").iterdir()) if p.name.startswith(prefix) and _is_run_dir(p)]
    return found


def _attach(parser: argparse.ArgumentParser) -> None:
    """Completers on the parser's actions, by their ``dest`` (the CLI's names: ``overrides``, ``run``, ``job``)."""
    from argcomplete.completers import DirectoriesCompleter, FilesCompleter

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _attach(sub)
        elif action.dest == "overrides":
            action.completer = complete_set  # type: ignore[attr-defined]
        elif action.dest in ("run", "after"):
            action.completer = complete_run  # type: ignore[attr-defined]
        elif action.dest in ("job", "script"):
            action.completer = FilesCompleter(("yaml", "yml") if action.dest == "job" else ("py",))  # type: ignore[attr-defined]
        elif action.dest in ("dir", "root"):
            action.completer = DirectoriesCompleter()  # type: ignore[attr-defined]


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer a completion request of the shell (``_ARGCOMPLETE`` set: prints and exits); else nothing."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    _attach(parser)
    argcomplete.autocomplete(parser, always_complete_options=False)  # flags once "-" is typed


def shell_script(shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh, fish). Raises ``UserError`` for another shell."""
    if shell not in SHELLS:
        raise UserError(f"no completion for shell {shell!r}; choose one of {', '.join(SHELLS)}")
    from argcomplete.shell_integration import shellcode

    text: str = shellcode([PROG], shell=shell)
    return text if text.endswith("\n") else text + "\n"
