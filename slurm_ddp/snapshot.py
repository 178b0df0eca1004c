"""The code snapshot taken at submit: the ranks run the code that was submitted, on every start.

Side effects: :func:`take` and :func:`write_record` copy files into and write the run directory;
:func:`plan_snapshot` only reads (the checkout, ``git``). Imports no torch.

What is copied (``train.snapshot: true``, the default):

- ``train.task``: every ``train.pythonpath`` directory (default: the YAML's directory). One inside
  a git repository brings the repository's files as git lists them: every tracked file, and the
  untracked ones ``.gitignore`` does not exclude that are code (below), as they are in the working
  tree now; one outside a repository contributes its code in its directory tree (hidden
  directories and ``__pycache__`` left out). Code is ``is_code``: ``CODE_SUFFIXES`` (``*.py``,
  ``*.pyi``, compiled extensions) and ``.pth`` path-configuration files, told from a ``torch.save``
  ``.pth`` by content (``is_path_config``: small UTF-8 text, not a zip or pickle) — data, logs and
  outputs stay out. Weights and training state (``is_state_file``: ``STATE_SUFFIXES`` such as
  ``.pt``, ``.bin``, ``.safetensors``, ``.ckpt``, and a ``.pth`` that is no path-configuration file)
  are never copied, tracked or not. So what a run writes into the project (a checkpoint, HF's
  ``rng_state_0.pth``, a log) never changes the snapshot's digest, and a resubmit resumes. Run and
  sweep directories (``rundir.is_job_dir``: this run's, a sweep's with its ``code/`` copy, any other)
  are never copied, git-listed or not.
- ``train.command``: the same for the directory of the script (``train.py`` in ``python
  train.py``, ``run.sh`` in ``bash run.sh``: ``config.command_script_index``; the script itself is
  copied whatever its name), or of ``train.workdir`` when the command names no script (``python -m
  pkg``). A wrapper (``config.command_is_wrapper``: a shell script, ``bash -e run.sh``, ``sh x.sh``,
  ``zsh x.zsh``, or a program given by a path, ``./x.sh``) brings both its directory and
  ``train.workdir``, and shell scripts (``SHELL_SUFFIXES``) and executable files count as code: what it runs is in the
  digest, so a resubmit after an edit of it needs ``--accept-new-code`` (:func:`check_resubmit`).
  The ranks run the snapshot's copy of the wrapper in ``train.workdir``; what it names through its
  own location (``"$(dirname "$0")/train.py"``) is the snapshot's, what it names by a path from the
  working directory (``exec python train.py``) is the checkout's, live on every start
  (:func:`live_names`; ``submit`` says so in one line, as ``env --explain`` does). A program found on
  PATH (``accelerate launch train.py``) is not remapped: what it names runs from the checkout, and
  ``submit`` says so the same way.

Each such directory is a *root*; the snapshot is ``RUN_DIR/code/<digest>/<i>/...`` with root ``i``'s
files at their paths relative to it. ``<digest>`` is the sha256 of every file's root, path,
executable bit and content, so identical code is stored once (a resubmit of unchanged code reuses
it). ``snapshot.json`` records the digest and the roots' source paths; the ranks' code paths are
remapped through it: ``train.pythonpath`` entries (by the worker, on every start), the script of
``train.command``, and the module of ``python -m MODULE`` (run by ``slurm_ddp.runmodule`` with the
snapshot of ``train.workdir`` first on ``sys.path``), in the rendered batch script, the local
supervisor and the submitit backend. A path outside every root (an installed package, a dataset) is
left as it is. The ranks' working directory is ``train.workdir`` itself, the user's directory, not
its copy: data read and outputs written by relative path are the user's.

Credential files (``slurm_ddp.secrets.CREDENTIAL_FILES``: ``.env``, ``.env.*``, ``*.pem``, ``*.key``,
``id_rsa*``, ``.netrc``, ``.git-credentials``, ``.pypirc``) are never copied, tracked or not
(``SnapshotPlan.skipped``; ``submit`` names them), and ``code/`` is owner-only (``rundir.PRIVATE_DIRS``).

slurm_ddp itself is never copied: it runs from the installed package (the job's supervisor, the
rank wrapper and the worker import it before any snapshot path is on ``sys.path``), so its
source directory is left out even when it lies in the snapshotted repository. Installed packages
are the environment's, recorded by digest in ``provenance.json``, not copied.

Why over 600 lines: what is copied, its digest, the remap of the ranks' code paths and the resubmit check
are one contract between submit and every start of the run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .config import JobConfig, command_is_wrapper, command_module_index, command_script_index
from .errors import UserError
from .rundir import SNAPSHOT_NAME, SNAPSHOTS_DIR, is_job_dir, snapshot_dir_name
from .secrets import is_credential_file

_SKIP_DIRS = ("__pycache__",)
#: the module that runs ``python -m MODULE`` with the snapshot, not the working directory, first on sys.path
RUNMODULE = "slurm_ddp.runmodule"
#: what a directory outside a git repository contributes: Python code (sources, stubs, compiled
#: extensions, path-configuration files: ``is_code``), and train.command's script whatever its name;
#: data, logs and outputs stay out
CODE_SUFFIXES = (".py", ".pyi", ".so", ".pyd", ".pth")
#: shell scripts: code too in the snapshot of a wrapper command (``config.command_is_wrapper``: ``bash run.sh``),
#: whose ``source env.sh`` or ``bash prep.sh`` they are
SHELL_SUFFIXES = (".sh", ".bash", ".zsh", ".ksh")
#: weights and training state (PyTorch's ``torch.save`` files, Hugging Face's ``pytorch_model.bin``,
#: ``model.safetensors``, Lightning's ``.ckpt``, NumPy/HDF5/ONNX/GGUF arrays, pickles): never code,
#: tracked by git or not; a ``.pth`` is one unless it is a path-configuration file (``is_code``)
STATE_SUFFIXES = (
    ".pt",
    ".bin",
    ".safetensors",
    ".ckpt",
    ".npy",
    ".npz",
    ".h5",
    ".hdf5",
    ".onnx",
    ".gguf",
    ".msgpack",
    ".pkl",
    ".pickle",
)
#: of ``STATE_SUFFIXES`` (and a ``.pth`` that is no path-configuration file), those a training run saves its
#: checkpoints as (``torch.save``'s ``.pt``/``.pth``, Lightning's ``.ckpt``, Hugging Face's ``.safetensors``):
#: ``is_checkpoint_file``; data arrays (``.npy``, ``.h5``, ...) are state, not checkpoints
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".safetensors")
#: a Hugging Face ``Trainer`` checkpoint directory (``checkpoint-500``: ``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``)
CHECKPOINT_DIR = re.compile(r"^checkpoint-\d+$")
#: the largest ``.pth`` read as a path-configuration file (``site``: one directory or ``import`` line each)
PTH_MAX_BYTES = 64 * 1024
_MB = 1_000_000


def is_path_config(path: str) -> bool:
    """True when the ``.pth`` file at ``path`` is a Python path-configuration file (``site``: text
    lines, each a directory to add to ``sys.path``, an ``import`` statement, or a ``#`` comment), not
    a ``torch.save`` file that shares the suffix (a zip archive or a pickle: binary).

    Decided by content: at most ``PTH_MAX_BYTES``, no NUL byte, UTF-8 text (``site`` reads it as
    ``utf-8-sig``). An unreadable file is not one (it is left out, as data)."""
    try:
        with open(path, "rb") as f:
            head = f.read(PTH_MAX_BYTES + 1)
    except OSError:
        return False
    if len(head) > PTH_MAX_BYTES or b"\0" in head:
        return False
    try:
        head.decode("utf-8-sig")
    except UnicodeDecodeError:
        return False
    return True


def is_code(path: str, shell: bool = False) -> bool:
    """True when the file at ``path`` counts as code outside git's list (``CODE_SUFFIXES``; a ``.pth``
    only when it is a path-configuration file: :func:`is_path_config`; with ``shell``, the snapshot of
    a wrapper command, ``SHELL_SUFFIXES`` and executable files too: what a wrapper runs through
    ``"$(dirname "$0")/tools/prep"``; weights never, :func:`is_state_file` is asked first)."""
    if path.endswith(".pth"):
        return is_path_config(path)
    if path.endswith(CODE_SUFFIXES):
        return True
    return shell and (path.endswith(SHELL_SUFFIXES) or (os.path.isfile(path) and os.access(path, os.X_OK)))


def is_state_file(path: str) -> bool:
    """True when the file at ``path`` holds weights or training state (``STATE_SUFFIXES``, or a
    ``.pth`` that is not a path-configuration file): never part of a code snapshot."""
    if path.endswith(".pth"):
        return not is_path_config(path)
    return path.endswith(STATE_SUFFIXES)


def is_checkpoint_file(path: str) -> bool:
    """True when the file at ``path`` is a saved checkpoint (``CHECKPOINT_SUFFIXES``, and weights or state by
    :func:`is_state_file`): an earlier run's output, which a sweep element must not resume from or overwrite."""
    return path.endswith(CHECKPOINT_SUFFIXES) and is_state_file(path)


@dataclass(frozen=True)
class SnapshotFile:
    """One file of a snapshot: root index, path relative to the root, size in bytes, executable bit."""

    root: int
    rel: str
    size: int
    executable: bool


@dataclass(frozen=True)
class SnapshotPlan:
    """What :func:`take` copies and where the ranks' paths go.

    ``roots``: absolute source directories (root ``i`` is ``RUN_DIR/code/<digest>/i``);
    ``git_roots``: the subset that are git repositories (their file list came from git).
    """

    run_dir: str
    roots: Tuple[str, ...]
    git_roots: Tuple[str, ...]
    files: Tuple[SnapshotFile, ...]
    digest: str  #: sha256 hex of roots, paths, modes and contents
    total_bytes: int
    #: credential files left out (``slurm_ddp.secrets.is_credential_file``), paths relative to their root
    skipped: Tuple[str, ...] = ()
    #: the lines ``submit`` prints about this snapshot: what ``train.command`` runs live, from the checkout
    #: (:func:`live_names`, :func:`live_warning`: a wrapper's ``exec python train.py``)
    notes: Tuple[str, ...] = ()

    @property
    def directory(self) -> str:
        """The snapshot directory (absolute): ``RUN_DIR/code/<digest[:16]>``."""
        return os.path.join(self.run_dir, snapshot_dir_name(self.digest))

    def remap(self, path: str) -> str:
        """``path`` inside the snapshot when it lies under a root; else unchanged."""
        return remap_path(path, self.roots, self.directory)

    def describe(self) -> str:
        """One line for ``submit --dry-run``."""
        return (
            f"# code snapshot: {len(self.files)} files, {self.total_bytes / _MB:.2f} MB from "
            f"{', '.join(self.roots) or '-'} -> {self.directory}"
        )

    def record(self, run_dir: Optional[str] = None) -> Dict[str, Any]:
        """The ``snapshot.json`` record (relative directory, so a moved run directory still works).

        ``run_dir``: write it for another run directory that runs this snapshot (a sweep's element:
        ``dir`` is then relative to it, e.g. ``../code/<digest>``)."""
        rel = os.path.relpath(self.directory, os.path.abspath(run_dir)) if run_dir else snapshot_dir_name(self.digest)
        return {
            "digest": self.digest,
            "dir": rel,
            "roots": list(self.roots),
            "git_roots": list(self.git_roots),
            "files": len(self.files),
            "bytes": self.total_bytes,
            "time": time.time(),
        }


def remap_path(path: str, roots: Sequence[str], directory: str) -> str:
    """``path`` under root ``i`` of ``roots`` → the same relative path under ``directory/i``
    (symbolic links in ``path`` resolved first, as the roots' are)."""
    path = os.path.realpath(path)
    for i, root in enumerate(roots):
        if path == root:
            return os.path.join(directory, str(i))
        if path.startswith(root.rstrip("/") + "/"):
            return os.path.join(directory, str(i), os.path.relpath(path, root))
    return path


def _package_dir() -> str:
    return str(Path(__file__).resolve().parent)


def _git_toplevel(d: str) -> Optional[str]:
    try:
        out = subprocess.run(
            ["git", "-C", d, "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    top = out.stdout.strip()
    return str(Path(top).resolve()) if out.returncode == 0 and top else None


def _git_list(top: str, *which: str) -> List[str]:
    out = subprocess.run(["git", "-C", top, "ls-files", "-z", *which], capture_output=True, timeout=60)
    if out.returncode != 0:
        msg = out.stderr.decode(errors="replace").strip().splitlines()
        raise UserError(
            f"git ls-files failed in {top} ({msg[-1] if msg else out.returncode}); set train.snapshot: false"
        )
    return [p for p in out.stdout.decode(errors="surrogateescape").split("\0") if p]


def _git_files(top: str, keep_files: Sequence[str] = (), shell: bool = False) -> List[str]:
    """The files of the git repository ``top`` in the snapshot: the tracked ones, and the untracked ones
    ``.gitignore`` does not exclude that are code (:func:`is_code`, ``shell`` passed on, or ``keep_files``):
    a run's own outputs in the working tree (checkpoints, logs, ``trainer_state.json``) never change the digest."""
    tracked = set(_git_list(top, "--cached"))
    others = [  # credential files too: plan_snapshot leaves them out by name (SnapshotPlan.skipped, which submit names)
        p
        for p in _git_list(top, "--others", "--exclude-standard")
        if os.path.join(top, p) in keep_files or is_code(os.path.join(top, p), shell) or is_credential_file(p)
    ]
    return sorted(tracked.union(others))


def _in_job_dir(root: str, rel: str, cache: Dict[str, bool]) -> bool:
    """True when ``root/rel`` lies in a run or sweep directory (``rundir.is_job_dir``) below ``root``
    (each directory asked once, through ``cache``)."""
    parts = rel.split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        d = os.path.join(root, *parts[:depth])
        if d not in cache:
            cache[d] = is_job_dir(d)
        if cache[d]:
            return True
    return False


def _walk_files(root: str, skip: Sequence[str], keep_files: Sequence[str] = (), shell: bool = False) -> List[str]:
    out: List[str] = []
    for dirpath, dirnames, filenames in os.walk(root, onerror=_raise_unreadable):
        keep = []
        for name in sorted(dirnames):
            full = os.path.join(dirpath, name)
            if name.startswith(".") or name in _SKIP_DIRS or full in skip or is_job_dir(full):
                continue
            if os.path.islink(full):
                continue
            keep.append(name)
        dirnames[:] = keep
        for name in filenames:
            full = os.path.join(dirpath, name)
            if full in keep_files or is_code(full, shell):
                out.append(os.path.relpath(full, root))
    return sorted(out)


def _raise_unreadable(err: OSError) -> None:
    raise UserError(
        f"cannot read {err.filename} for the code snapshot ({err.strerror}); make it readable, "
        "or set train.snapshot: false"
    )


def source_dirs(cfg: JobConfig) -> List[str]:
    """The directories the ranks import from, absolute: ``train.pythonpath`` (task), or the
    directory of ``train.command``'s script, else ``train.workdir`` (command); for a wrapper
    (``config.command_is_wrapper``: ``bash run.sh``) both: the files it runs by a path relative to the
    working directory (``exec python train.py``) are then in the digest, so an edit of them after submit
    needs ``--accept-new-code`` on a resubmit.

    ``train.pythonpath`` entries that do not exist are left out (Python skips them too). Raises
    ``UserError`` (one line) when one is not a readable directory.
    """
    tc = cfg.train
    dirs: List[Tuple[str, str]] = []  # (directory, what it is, for the error)
    if tc.command:
        i = command_script_index(tc.command)
        if i is not None:
            dirs.append((os.path.dirname(os.path.abspath(tc.command[i])), "the directory of train.command's script"))
        if i is None or command_is_wrapper(tc.command):
            dirs.append((os.path.abspath(tc.workdir or "."), "train.workdir"))
    else:
        dirs = [(os.path.abspath(p), "train.pythonpath entry") for p in (tc.pythonpath or (".",))]
        dirs = [
            (d, what) for d, what in dirs if os.path.exists(d)
        ]  # holds nothing to import (submit's check names the task)
    for d, what in dirs:
        if not os.path.isdir(d) or not os.access(d, os.R_OK | os.X_OK):
            raise UserError(
                f"{what} {d!r} is not a readable directory, so the code the ranks import cannot be "
                "snapshotted; fix the path (or set train.snapshot: false)"
            )
    return [d for d, _ in dirs]


def _script(cfg: JobConfig) -> List[str]:
    i = command_script_index(cfg.train.command) if cfg.train.command else None
    return [str(Path(cfg.train.command[i]).resolve())] if i is not None else []


def snapshot_roots(cfg: JobConfig) -> Tuple[List[str], List[str]]:
    """``(roots, git_roots)``: the snapshot's root directories (each of :func:`source_dirs`, or its git
    repository's top level; one inside another counted once), absolute and resolved, and those that are
    git repositories. Reads the checkout (``git rev-parse``)."""
    roots: List[str] = []
    git_roots: List[str] = []
    for d in source_dirs(cfg):
        d = str(Path(d).resolve())
        top = _git_toplevel(d)
        root = top or d
        if any(root == r or root.startswith(r.rstrip("/") + "/") for r in roots):
            continue  # already inside a root
        roots = [r for r in roots if not r.startswith(root.rstrip("/") + "/")]  # a new root holds an old one
        git_roots = [r for r in git_roots if r in roots]
        roots.append(root)
        if top:
            git_roots.append(root)
    return roots, git_roots


#: the largest wrapper script :func:`live_names` reads
WRAPPER_MAX_BYTES = 1_000_000
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def live_names(cfg: JobConfig, roots: Optional[Sequence[str]] = None) -> List[str]:
    """The words of ``train.command`` that name a file of the project the ranks run from the checkout,
    live, not from the snapshot: an edit of it after submit runs on the next start.

    - A wrapper (``config.command_is_wrapper``: ``bash run.sh``): the words of its script that name a
      project file by a path relative to the working directory (``exec python train.py``, ``source
      env.sh``) or an absolute one. The ranks run the snapshot's copy of the wrapper in ``train.workdir``
      (the user's directory), so such a path reaches the checkout's file; one through the wrapper's own
      location (``"$(dirname "$0")/train.py"``) reaches the snapshot's copy.
    - A program found on PATH (``accelerate launch train.py``, ``bash -c "python train.py"``): its own
      words (a word with blanks, the string of ``-c``, split as a line of its own). Nothing of it is
      remapped, so every project file it names runs live. One not on PATH here names nothing.
    - Otherwise (``python train.py``, ``python -m pkg``: remapped, :func:`remap_config`): [].

    A heuristic over shell words (``shlex``, comments left out; a line it cannot split is skipped; words
    with a ``$``, options and ``NAME=value`` assignments are not paths): a word counts when it names an
    existing file under one of ``roots`` (default :func:`snapshot_roots`) that is code (:func:`is_code`
    with ``shell``: shell scripts and executables too). Scanning stops at the first ``cd``/``pushd`` (from
    there the working directory is the script's to say). Reads the wrapper (at most ``WRAPPER_MAX_BYTES``;
    one it cannot read names nothing)."""
    tc = cfg.train
    if not tc.command:
        return []
    i = command_script_index(tc.command)
    if command_is_wrapper(tc.command):
        try:
            with open(tc.command[i or 0], "rb") as f:
                lines = f.read(WRAPPER_MAX_BYTES).decode("utf-8", errors="replace").splitlines()
        except OSError:
            return []
    elif i is None and command_module_index(tc.command) is None:
        if shutil.which(tc.command[0]) is None:
            return []  # a typo: submit's check of the command says so in one line, alone
        rest = tc.command[1:]
        lines = [shlex.join(rest), *(w for w in rest if any(c.isspace() for c in w))]
    else:
        return []
    if roots is None:
        roots = snapshot_roots(cfg)[0]
    workdir = os.path.abspath(tc.workdir or ".")
    found: List[str] = []
    for line in lines:
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            words = list(lexer)
        except ValueError:
            continue
        if any(w in ("cd", "pushd") for w in words):
            break
        for w in words:
            if not w or "$" in w or w.startswith(("-", "+")) or _ASSIGNMENT.match(w) or w in found:
                continue
            full = os.path.realpath(os.path.join(workdir, w))  # an absolute w stays itself
            if not os.path.isfile(full) or not any(full.startswith(r.rstrip("/") + "/") for r in roots):
                continue
            if is_code(full, shell=True):
                found.append(w)
    return found


def live_warning(command: Sequence[str], names: Sequence[str]) -> str:
    """The one line ``submit`` and ``env --explain`` give for :func:`live_names`' ``names`` of
    ``train.command`` ``command``; "" when there are none."""
    if not names:
        return ""
    first = names[0] if not os.path.isabs(names[0]) else os.path.basename(names[0])
    said = (
        "by a path from the working directory (or an absolute one), so the ranks run the checkout's file, not the "
        "snapshot's: an edit after submit runs on the next start, a requeue included"
    )
    if command_is_wrapper(command):
        script = os.path.basename(command[command_script_index(command) or 0])
        return (
            f"train.command's wrapper {script} names {', '.join(names)} {said}; write "
            f'"$(dirname "$0")/{first}" in the wrapper to run the submitted copy'
        )
    prog = os.path.basename(command[0])
    return (
        f"train.command's program {prog} names {', '.join(names)} {said}; to run the submitted copy, start it "
        f'from a wrapper that names "$(dirname "$0")/{first}" (run.sh: exec {prog} ... "$(dirname "$0")/{first}" '
        "...) and set train.command: bash run.sh"
    )


def plan_snapshot(cfg: JobConfig, run_dir: str) -> Optional[SnapshotPlan]:
    """The snapshot of ``cfg``'s code for ``run_dir`` (absolute), or None with ``train.snapshot: false``.

    Reads the checkout (``git``, file contents for the digest); writes nothing. Raises
    ``UserError`` (one line) for an unreadable source directory or file, and for a snapshot over
    ``train.snapshot_max_mb``, naming the largest files.
    """
    if not cfg.train.snapshot:
        return None
    run_dir = os.path.abspath(run_dir)
    roots, git_roots = snapshot_roots(cfg)
    skip = [run_dir, _package_dir()]
    shell = bool(cfg.train.command) and command_is_wrapper(cfg.train.command)
    files: List[SnapshotFile] = []
    skipped: List[str] = []
    job_dirs: Dict[str, bool] = {}
    script = _script(cfg)
    for i, root in enumerate(roots):
        rels = _git_files(root, script, shell) if root in git_roots else _walk_files(root, skip, script, shell)
        for rel in rels:
            if is_credential_file(rel):  # .env, *.pem, ...: never copied, tracked or not
                skipped.append(rel)
                continue
            full = os.path.join(root, rel)
            if full not in script and is_state_file(full):
                continue  # weights and training state (model.pth, rng_state_0.pth, *.safetensors): never code
            if any(full == s or full.startswith(s + "/") for s in skip) or _in_job_dir(root, rel, job_dirs):
                continue  # this run's directory, slurm_ddp itself, another run or sweep directory
            try:
                st = os.stat(full)
            except FileNotFoundError:
                continue  # tracked but deleted in the working tree
            except OSError as e:
                _raise_unreadable(e)
            if not os.path.isfile(full):
                continue
            files.append(SnapshotFile(i, rel, st.st_size, bool(st.st_mode & 0o111)))
    live = live_names(cfg, roots)
    total = sum(f.size for f in files)
    cap = cfg.train.snapshot_max_mb
    if total > cap * _MB:
        largest = sorted(files, key=lambda f: -f.size)[:3]
        names = ", ".join(f"{os.path.join(roots[f.root], f.rel)} ({f.size / _MB:.1f} MB)" for f in largest)
        raise UserError(
            f"the code snapshot would be {total / _MB:.1f} MB, over train.snapshot_max_mb={cap:g} (largest: {names}); "
            "ignore big files in .gitignore, narrow train.pythonpath, raise train.snapshot_max_mb, "
            "or set train.snapshot: false"
        )
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.root}\0{f.rel}\0{int(f.executable)}\0".encode(errors="surrogateescape"))
        h.update(_file_sha(os.path.join(roots[f.root], f.rel)).encode())
        h.update(b"\n")
    return SnapshotPlan(
        run_dir=run_dir,
        roots=tuple(roots),
        git_roots=tuple(git_roots),
        files=tuple(files),
        digest=h.hexdigest(),
        total_bytes=total,
        skipped=tuple(skipped),
        notes=(live_warning(cfg.train.command, live),) if live else (),
    )


def _file_sha(path: str) -> str:
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as e:
        _raise_unreadable(e)
    return h.hexdigest()


def take(plan: SnapshotPlan) -> Path:
    """Copy the snapshot into ``RUN_DIR/code/<digest>`` (nothing when it is already there) and write
    ``snapshot.json``. The copy lands under a temporary name and is renamed, so a directory of that
    name is always complete. Returns the snapshot directory. Raises ``OSError`` when unwritable."""
    dest = Path(plan.directory)
    if not dest.is_dir():
        tmp = dest.parent / f".tmp-{dest.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)  # also with no root at all (no train.pythonpath entry exists here)
        for f in plan.files:
            target = tmp / str(f.root) / f.rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.join(plan.roots[f.root], f.rel), target)
        for i in range(len(plan.roots)):
            (tmp / str(i)).mkdir(parents=True, exist_ok=True)
        try:
            os.rename(tmp, dest)
        except OSError:
            if not dest.is_dir():
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another submit made it first
    write_record(plan)
    return dest


def write_record(plan: SnapshotPlan, run_dir: Optional[str] = None, *, fsync: bool = True) -> None:
    """Write ``RUN_DIR/snapshot.json`` atomically (the snapshot the ranks run from from now on).

    ``run_dir``: another run directory that runs ``plan``'s snapshot (a sweep element runs the
    sweep's one snapshot); default ``plan.run_dir``. ``fsync=False``: renamed into place but not
    fsynced (a thousand sweep elements; a record lost to a power cut is rewritten by resubmitting)."""
    from .durable import atomic_write_text

    target = Path(run_dir or plan.run_dir) / SNAPSHOT_NAME
    text = json.dumps(plan.record(run_dir), indent=1) + "\n"
    if fsync:
        atomic_write_text(target, text)
        return
    tmp = target.with_name(f".{SNAPSHOT_NAME}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)


def read_record(run_dir: str) -> Optional[Dict[str, Any]]:
    """``RUN_DIR/snapshot.json``; None when missing or unreadable."""
    try:
        rec = json.loads((Path(run_dir) / SNAPSHOT_NAME).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def check_resubmit(plan: Optional[SnapshotPlan], run_dir: str, accept_new_code: bool) -> Optional[str]:
    """Refuse (``UserError``) resubmitting ``run_dir`` with code other than its snapshot's.

    Returns a warning line when the new code is accepted (``accept_new_code``), else None.
    """
    old = read_record(run_dir)
    if plan is None or old is None or old.get("digest") == plan.digest:
        return None
    if not accept_new_code:
        raise UserError(
            f"run directory {run_dir!r} ran code snapshot {str(old.get('digest'))[:16]} and the code now differs "
            f"({plan.digest[:16]}); resuming would mix two programs. Use another --run-dir, restore the code, "
            "or pass --accept-new-code"
        )
    return (
        f"resuming {run_dir} with new code (snapshot {plan.digest[:16]}, was {str(old.get('digest'))[:16]}): "
        "the run is no longer exactly reproducible"
    )


def remap_config(cfg: JobConfig, plan: Optional[SnapshotPlan]) -> JobConfig:
    """``cfg`` with the ranks' code in the snapshot: ``train.pythonpath`` and ``train.command``'s
    script; ``python -m MODULE`` becomes ``python -m slurm_ddp.runmodule SNAPSHOT_OF_WORKDIR MODULE``
    (``python -m`` would put the working directory, the checkout, first on ``sys.path``).
    ``train.workdir`` stays the user's directory: relative data paths read the user's data and
    relative outputs land where the user looks. Unchanged when ``plan`` is None."""
    if plan is None:
        return cfg
    tc = cfg.train
    argv = list(tc.command)
    i = command_script_index(argv)
    if i is not None:
        argv[i] = plan.remap(os.path.abspath(argv[i]))
    m = command_module_index(argv)
    if m is not None and tc.workdir and plan.remap(tc.workdir) != tc.workdir:
        argv[m:m] = [RUNMODULE, plan.remap(tc.workdir)]
    train = dataclasses.replace(tc, pythonpath=tuple(plan.remap(p) for p in tc.pythonpath), command=tuple(argv))
    return dataclasses.replace(cfg, train=train)


def run_pythonpath(run_dir: str, pythonpath: Iterable[str]) -> List[str]:
    """``train.pythonpath`` as the ranks use it: remapped into the run's snapshot (``snapshot.json``)
    when there is one, else as given. Read on every start, so a requeued job imports the snapshot."""
    paths = list(pythonpath)
    rec = read_record(run_dir)
    if rec is None or not isinstance(rec.get("roots"), list) or not isinstance(rec.get("dir"), str):
        return paths
    directory = os.path.normpath(os.path.join(os.path.abspath(run_dir), rec["dir"]))  # a sweep element: ../code/..
    return [remap_path(p, [str(r) for r in rec["roots"]], directory) for p in paths]


__all__ = [
    "CODE_SUFFIXES",
    "SHELL_SUFFIXES",
    "SNAPSHOTS_DIR",
    "STATE_SUFFIXES",
    "SnapshotFile",
    "SnapshotPlan",
    "check_resubmit",
    "CHECKPOINT_DIR",
    "CHECKPOINT_SUFFIXES",
    "is_checkpoint_file",
    "is_code",
    "is_path_config",
    "is_state_file",
    "live_warning",
    "plan_snapshot",
    "read_record",
    "remap_config",
    "remap_path",
    "run_pythonpath",
    "snapshot_roots",
    "source_dirs",
    "take",
    "live_names",
    "write_record",
]
