"""Checks at submit time of what would otherwise fail only inside the job.

Side effects: starts one subprocess per check. ``check_task_imports`` imports the job's
``train.task`` the way the worker will (the job's interpreter, ``train.pythonpath`` first
on ``sys.path``, ``environment.env`` set) but in a child process, so that the CLI process
never imports torch or the user's code. A task that does not import is a ``UserError``
that says why, in one line, before anything is written or queued. (``sbatch --test-only``, which asks the
real controller about the rendered script, is the sbatch backend's: ``backends.sbatch.sbatch_test_only``.)

A task that imported is remembered (``ImportCache``, one small JSON file per interpreter, task, search path
and import-relevant environment under ``$XDG_CACHE_HOME/slurm_ddp/preflight``): the next submit of the same
task skips the child (``import torch`` costs seconds on a login node, tens of seconds on a cold parallel file
system) as long as every file the import loaded and every directory on its ``sys.path`` is as it was (same
mtime and size; a new file that could shadow a module changes its directory's mtime). A failed import is
never remembered. ``SLURM_DDP_PREFLIGHT_CACHE=0`` turns the memory off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from .config import JobConfig
from .errors import UserError

Runner = Callable[..., subprocess.CompletedProcess[str]]

#: Seconds the import may take (torch alone takes a few on a cold file system).
TIMEOUT_S = 120.0
_MARK = "SLURM_DDP_PREFLIGHT "

# Runs in the child: argv = [task, keep_cwd, *pythonpath]. Prints one line "MARK {json}" last.
# The worker runs as "python -m slurm_ddp.worker" in the directory it was started from: the
# run directory under sbatch (so the submitting directory is not on its sys.path), the
# submitting directory under the local backend (keep_cwd=1).
# slurm_ddp.task (which imports torch) is only consulted when the user's module imported
# it already: a class that is not a subclass of it cannot be a Task otherwise.
_CHILD = r"""
import gc
gc.disable()  # a short-lived child that imports torch: see slurm_ddp.worker.runtime.end_startup_gc
import importlib, json, os, sys, traceback
MARK = "SLURM_DDP_PREFLIGHT "
task, keep_cwd, paths = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
if not keep_cwd:
    sys.path[:] = [p for p in sys.path if p not in ("", ".", os.getcwd())]
for p in reversed(paths):
    if p not in sys.path:
        sys.path.insert(0, p)
module_name, _, attr = task.partition(":")
def stats():
    files, dirs = {}, {}
    for m in list(sys.modules.values()):
        f = getattr(m, "__file__", None)
        if isinstance(f, str) and f not in files:
            try:
                st = os.stat(f)
            except OSError:
                continue
            files[f] = [st.st_mtime_ns, st.st_size]
    for p in sys.path:
        d = os.path.abspath(p or ".")
        try:
            dirs[d] = os.stat(d).st_mtime_ns
        except OSError:
            dirs[d] = None
    top = sorted(n for n, m in list(sys.modules.items())
                 if "." not in n and (getattr(m, "__file__", None) or getattr(m, "__path__", None)))
    return {"files": files, "dirs": dirs, "cwd": os.getcwd() if keep_cwd else None, "top": top}
def done(error=None, kind="import"):
    sys.stdout.flush()
    answer = {"error": error, "kind": kind}
    if error is None:
        answer["loaded"] = stats()
    print("\n" + MARK + json.dumps(answer), flush=True)
    sys.exit(0)
def why(e):
    text = " ".join(str(e).split())
    if isinstance(e, SyntaxError) and e.filename:
        return f"SyntaxError: {e.msg} ({e.filename}, line {e.lineno})"
    tb = traceback.extract_tb(e.__traceback__)
    where = f" ({tb[-1].filename}, line {tb[-1].lineno})" if tb and type(e) is not ModuleNotFoundError else ""
    return f"{type(e).__name__}: {text}{where}"
try:
    module = importlib.import_module(module_name)
except BaseException as e:
    done(f"cannot import module {module_name!r}: {why(e)}")
obj = module
for part in attr.split("."):
    try:
        obj = getattr(obj, part)
    except AttributeError:
        done(f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no attribute {attr!r}", "attr")
    except BaseException as e:
        done(f"reading {attr!r} of module {module_name!r} failed: {why(e)}", "attr")
base = getattr(sys.modules.get("slurm_ddp.task"), "Task", None)
if not isinstance(obj, type):
    done(f"{attr} is a {type(obj).__name__}, not a class derived from slurm_ddp.task.Task", "type")
if base is None or not issubclass(obj, base):
    done(f"class {attr} does not derive from slurm_ddp.task.Task (define it as: class {attr.split('.')[-1]}(Task))",
         "type")
done()
"""


def _python(cfg: JobConfig) -> str:
    return cfg.environment.python or sys.executable


#: Environment variables that change what an import finds (besides ``environment.env``, which is the job's):
#: the interpreter's (``PYTHON*``, python(1) ENVIRONMENT), the dynamic loader's (``LD_*``, ld.so(8)) and the
#: environment managers'. Part of an ``ImportCache`` key.
_IMPORT_ENV_PREFIXES = ("PYTHON", "LD_")
_IMPORT_ENV_NAMES = ("PATH", "HOME", "VIRTUAL_ENV", "CONDA_PREFIX")
#: ``SLURM_DDP_PREFLIGHT_CACHE=0``: every submit imports the task again.
CACHE_ENV = "SLURM_DDP_PREFLIGHT_CACHE"
#: Cache files kept (the oldest go first): one per task, interpreter and search path a user submits.
CACHE_KEEP = 64


class ImportCache:
    """What task imports succeeded, and what they loaded: ``DIR/KEY.json``, ``KEY`` a SHA-256 of what
    decides the import (interpreter, ``train.task``, ``train.pythonpath``, whether the current directory
    is on the path, ``environment.env`` and the import-relevant variables of this environment).

    ``hit`` is true while every file the remembered import loaded has its recorded ``st_mtime_ns`` and
    ``st_size`` and every directory of its ``sys.path`` its recorded ``st_mtime_ns`` (stat(2); about a
    millisecond per hundred files). With the current directory on the path (the local backend), a submit
    from another directory hits too when the import loaded nothing from the directory it ran in and this
    one provides none of the top-level modules it loaded (``importlib.machinery.PathFinder.find_spec``
    on this directory alone: what would shadow them, as the import system would find it). Best effort:
    an unreadable or unwritable cache is a miss, never an error.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)

    @classmethod
    def default(cls) -> Optional[ImportCache]:
        """``$XDG_CACHE_HOME/slurm_ddp/preflight`` (``~/.cache`` when unset: XDG Base Directory
        Specification); None under ``SLURM_DDP_PREFLIGHT_CACHE=0``."""
        if os.environ.get(CACHE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
            return None
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return cls(Path(base) / "slurm_ddp" / "preflight")

    @staticmethod
    def key(argv: List[str], env: Dict[str, str], cwd_on_path: bool) -> str:
        decides = {k: v for k, v in env.items() if k.startswith(_IMPORT_ENV_PREFIXES) or k in _IMPORT_ENV_NAMES}
        # the interpreter as named, not resolved: a virtual environment's python is a symlink to the base
        # interpreter, and the environment (its site-packages) is what the link's own path selects (venv(7))
        python = argv[0]
        python = os.path.abspath(python if os.sep in python else (shutil.which(python) or python))
        # which current directory is not part of the key: ``hit`` checks what another one would shadow
        record = [python, argv[1:], "cwd" if cwd_on_path else "", sorted(decides.items())]
        return hashlib.sha256(json.dumps(record).encode()).hexdigest()[:32]

    def hit(self, key: str) -> bool:
        try:
            loaded = json.loads((self.directory / f"{key}.json").read_text(encoding="utf-8"))
            was, here = loaded.get("cwd"), os.getcwd()
            moved = isinstance(was, str) and was != here
            if moved and not self._same_from(was, here, loaded["files"], loaded["top"]):
                return False
            for f, (mtime_ns, size) in loaded["files"].items():
                st = os.stat(f)
                if st.st_mtime_ns != mtime_ns or st.st_size != size:
                    return False
            for d, mtime_ns in loaded["dirs"].items():
                if moved and d == was:  # the directory the check ran in: not on this submit's path
                    continue
                try:
                    now: Optional[int] = os.stat(d).st_mtime_ns
                except FileNotFoundError:
                    now = None
                if now != mtime_ns:
                    return False
            os.utime(self.directory / f"{key}.json")  # kept by use, not by age (``remember`` prunes the oldest)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return True

    @staticmethod
    def _same_from(was: str, here: str, files: Dict[str, Any], top: List[str]) -> bool:
        """Whether an import that ran in directory ``was`` (on its ``sys.path``) finds the same modules
        run in ``here``: it loaded no file from ``was``, and ``here`` provides none of its top-level
        modules ``top`` (a ``name.py``, a package or an extension module there would come first)."""
        from importlib.machinery import PathFinder

        inside = os.path.join(was, "")
        if any(f.startswith(inside) for f in files):
            return False
        return all(PathFinder.find_spec(name, [here]) is None for name in top)

    def remember(self, key: str, loaded: Any) -> None:
        from .durable import atomic_write_text

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write_text(self.directory / f"{key}.json", json.dumps(loaded) + "\n")
            kept = sorted(self.directory.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
            for old in kept[CACHE_KEEP:]:
                old.unlink()
        except (OSError, ValueError):
            pass


def _child_answer(proc: subprocess.CompletedProcess[str]) -> Optional[Dict[str, Any]]:
    """The JSON answer a check child printed after ``_MARK`` (its last such line); None when it
    died before answering or the line does not parse."""
    for line in reversed((proc.stdout or "").splitlines()):
        if line.startswith(_MARK):
            try:
                answer = json.loads(line[len(_MARK) :])
            except ValueError:
                return None
            return answer if isinstance(answer, dict) else None
    return None


def check_task_imports(
    cfg: JobConfig,
    run: Runner = subprocess.run,
    *,
    cwd_on_path: bool = False,
    timeout_s: float = TIMEOUT_S,
    warn: Optional[Callable[[str], None]] = None,
    cache: Optional[ImportCache] = None,
) -> None:
    """Import ``cfg.train.task`` in a child process of the job's interpreter.

    ``cwd_on_path``: the current directory is on the worker's ``sys.path`` (local backend: the
    ranks start here); under sbatch/submitit they start in the run directory, so it is not.
    ``cache``: skip the child when the same import succeeded before and nothing it loaded changed
    (``ImportCache``); remember a success.

    Raises ``UserError`` (``train.task '…': cannot import module 'm': ModuleNotFoundError: …``)
    when the import fails, the attribute is missing or it is not a ``Task`` subclass. When the
    check cannot run here (the job's interpreter is not on this machine, or the import takes
    longer than ``timeout_s``) it calls ``warn`` with why and returns: the job may still work
    on the nodes.
    """
    warn = warn or logging.getLogger("slurm_ddp.preflight").warning
    tc = cfg.train
    python = _python(cfg)
    skip = " (skip this check with --no-check-task)"
    env = dict(os.environ)
    env.update(cfg.environment.env)
    argv = [python, "-c", _CHILD, tc.task, "1" if cwd_on_path else "0", *tc.pythonpath]
    key = cache.key(argv, env, cwd_on_path) if cache is not None else ""
    if cache is not None and cache.hit(key):
        logging.getLogger("slurm_ddp.preflight").debug(
            "train.task %r imported before and nothing it loaded changed (%s)", tc.task, cache.directory
        )
        return
    try:
        proc = run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        warn(
            f"not checking that train.task {tc.task!r} imports: the job's interpreter {python!r} is not on this machine"
        )
        return
    except subprocess.TimeoutExpired:
        warn(f"not checking that train.task {tc.task!r} imports: importing it took longer than {timeout_s:.0f} s")
        return
    except OSError as e:
        warn(f"not checking that train.task {tc.task!r} imports: cannot run {python!r}: {e}")
        return
    result = _child_answer(proc)
    if result is None:  # the child died before it could answer (a crash at import, os._exit, …)
        tail = ((proc.stderr or "").strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise UserError(f"train.task {tc.task!r}: importing it with {python} failed: {' '.join(tail.split())}{skip}")
    if result.get("error"):
        where = ""
        if result.get("kind") == "import":
            where = (
                f" (searched train.pythonpath={list(tc.pythonpath)}; checked with {python}"
                f"{'' if python == sys.executable else ' on this machine'})"
            )
        raise UserError(f"train.task {tc.task!r}: {result['error']}{where}{skip}")
    if cache is not None and isinstance(result.get("loaded"), dict):
        cache.remember(key, result["loaded"])


# Runs in the child: argv = [check_torchrun]. Prints one line "MARK {json}" last. It imports no
# torch: torchrun's options are read from the text of torch/distributed/run.py.
_COMMAND_CHILD = r"""
import importlib.util, json, os, sys
MARK = "SLURM_DDP_PREFLIGHT "
error = None
if sys.argv[1] == "1":
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        error = "torch is not installed"
    else:
        run_py = os.path.join(os.path.dirname(spec.origin), "distributed", "run.py")
        try:
            text = open(run_py, encoding="utf-8").read()
        except OSError:
            error = "its torch has no torchrun (torch/distributed/run.py)"
        else:
            missing = [o for o in TORCHRUN_OPTIONS if '"' + o + '"' not in text]
            if missing:
                try:
                    from importlib.metadata import version
                    v = version("torch")
                except Exception:
                    v = "?"
                error = f"its torch {v} has a torchrun without {', '.join(missing)}"
print("\n" + MARK + json.dumps({"error": error}), flush=True)
"""

#: torchrun options the torchrun launcher needs (``render.torchrun_flags``): without
#: ``--signals-to-handle`` torchrun does not forward the requeue signal to its workers.
TORCHRUN_OPTIONS = ("--signals-to-handle", "--shutdown-timeout")


def check_command(
    cfg: JobConfig,
    run: Runner = subprocess.run,
    *,
    timeout_s: float = TIMEOUT_S,
    warn: Optional[Callable[[str], None]] = None,
) -> None:
    """Check what the ranks will start, before anything is written or submitted.

    For ``train.command``: the script file it names exists (``config.command_script_index``) and
    its program is found (the ranks' interpreter for ``python``/``*.py``, else on PATH or in
    ``train.workdir``). Under ``slurm.launcher: torchrun`` (worker or command): the ranks'
    interpreter has a torch whose torchrun has ``--signals-to-handle`` and ``--shutdown-timeout``
    (torch 2.13 has both; an older torchrun would die of the requeue signal without passing it on,
    and its ranks would be killed without a snapshot). The interpreter runs once, in a child,
    importing nothing heavy. Raises ``UserError`` naming the key; when the interpreter is not on
    this machine or does not answer within ``timeout_s`` it calls ``warn`` and returns.
    """
    from .config import command_argv, command_script_index

    warn = warn or logging.getLogger("slurm_ddp.preflight").warning
    tc, python = cfg.train, _python(cfg)
    skip = " (skip this check with --no-check-task)"
    needs_python = cfg.slurm.launcher == "torchrun"
    if tc.command:
        i = command_script_index(tc.command)
        if i is not None and not os.path.isfile(tc.command[i]):
            raise UserError(
                f"train.command: script {tc.command[i]!r} does not exist (a relative path is relative to the "
                f"job file's directory){skip}"
            )
        argv = command_argv(tc.command, python)
        if argv[0] == python:
            needs_python = True
        elif shutil.which(argv[0], path=tc.workdir if "/" in argv[0] else None) is None and not (
            "/" in argv[0] and os.access(argv[0], os.X_OK)
        ):
            raise UserError(f"train.command: program {argv[0]!r} is not found or not executable here{skip}")
    if not needs_python:
        return
    torchrun = "1" if cfg.slurm.launcher == "torchrun" else "0"
    child = _COMMAND_CHILD.replace("TORCHRUN_OPTIONS", repr(TORCHRUN_OPTIONS))
    try:
        proc = run(
            [python, "-c", child, torchrun], capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise UserError(
            f"the ranks' interpreter {python!r} (environment.python) cannot start: not found{skip}"
        ) from None
    except subprocess.TimeoutExpired:
        warn(f"not checking the ranks' interpreter {python!r}: it did not answer within {timeout_s:.0f} s")
        return
    except OSError as e:
        raise UserError(f"the ranks' interpreter {python!r} (environment.python) cannot start: {e}{skip}") from None
    result = _child_answer(proc)
    if result is None:
        tail = ((proc.stderr or "").strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise UserError(f"the ranks' interpreter {python!r} cannot start: {' '.join(tail.split())}{skip}")
    if result.get("error"):
        raise UserError(
            f"slurm.launcher=torchrun: {result['error']} ({python}); torchrun would not pass the requeue signal "
            f"to the ranks. Use a newer torch or slurm.launcher: srun{skip}"
        )
