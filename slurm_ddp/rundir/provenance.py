"""Provenance: what ran, where — ``RUN_DIR/provenance.json``, written at submit, extended at every start. Part of
:mod:`slurm_ddp.rundir` (the run directory's files have one owner).

Side effects: reads the environment (installed packages' metadata, ``git``), writes the run
directory. Imports no torch: versions come from package metadata and ``torch/version.py``'s text,
so ``submit`` stays fast on a login node.

The record is one JSON object ``{"submits": [...], "starts": [...]}``, rewritten atomically
(write to a temporary file, rename):

- a submit (``slurm-ddp submit``, before the job is handed over): ``time``, ``argv`` (the submit
  command, credential-looking values as ``***``: ``slurm_ddp.secrets``), ``cwd``, ``backend``,
  ``versions`` (slurm_ddp, Python, torch as ``torch.__version__`` has it, CUDA, NCCL),
  ``packages_sha256`` (of every installed distribution's ``name-version``, sorted) and
  ``packages`` (their count), ``script_sha256`` (the rendered batch script), ``snapshot`` (the code
  snapshot's digest or None) and ``git``: per repository of the snapshot, ``commit``, ``dirty`` and,
  when dirty, ``diff`` (``diffs/<sha>.patch``: ``git diff HEAD``, saved in the run directory);
- a start (rank 0's rank wrapper, before it execs the rank, on every start of every backend):
  ``time``, ``job_id``, ``restart``, ``nodes`` (``SLURM_JOB_NODELIST``), ``host``, ``world_size``,
  ``gpus`` (``CUDA_VISIBLE_DEVICES``, else ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``; None when
  none), ``versions``, ``snapshot`` (the digest in ``snapshot.json``).

Only one process writes starts (rank 0), and a submit happens while no job of the run is active.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import socket
import subprocess
import time
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Union

from ..constants import __version__
from ..secrets import CREDENTIAL_FILES
from .files import PROVENANCE_NAME, SNAPSHOT_NAME, diff_name, private_dir, run_dir_mode_of, write_private_text

#: the fields of a start compared between consecutive starts by :func:`changes`
COMPARED = ("nodes", "gpus", "world_size", "snapshot", "versions")


def _dist_version(name: str) -> Optional[str]:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _torch_version_py() -> Dict[str, Optional[str]]:
    """``torch.__version__`` and ``torch.version.cuda`` read from ``torch/version.py``'s text (no torch
    import): ``{"torch": ..., "cuda": ...}``, a value None where it is missing (``cuda``: a CPU build);
    ``{}`` when torch is not found."""
    try:
        spec = find_spec("torch")
    except (ImportError, ValueError):
        return {}
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        try:
            text = (Path(loc) / "version.py").read_text()
        except OSError:
            continue
        found: Dict[str, Optional[str]] = {}
        for key, name in (("torch", "__version__"), ("cuda", "cuda")):
            m = re.search(rf"^{name}\b[^=]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
            found[key] = m.group(1) if m else None
        return found
    return {}


def versions() -> Dict[str, Optional[str]]:
    """slurm_ddp, Python, torch, CUDA (torch's build) and NCCL (the ``nvidia-nccl-cu*`` wheel) versions;
    None for what is not installed.

    torch's is ``torch.__version__`` (with its local part: ``2.13.0+cu130``, ``2.13.0+cpu``), the version
    the checkpoint manifest records (``torch_version``) and :func:`torch_mismatch` compares, not the
    distribution's metadata version: PyPI's CUDA wheel of torch 2.13.0 declares ``2.13.0`` there while
    its ``torch.__version__`` is ``2.13.0+cu130``. The metadata version only where ``torch/version.py``
    has none."""
    torch_py = _torch_version_py()
    nccl = None
    for name in ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"):
        nccl = _dist_version(name)
        if nccl:
            break
    return {
        "slurm_ddp": __version__,
        "python": platform.python_version(),
        "torch": torch_py.get("torch") or _dist_version("torch"),
        "cuda": torch_py.get("cuda"),
        "nccl": nccl,
    }


def packages_digest() -> Dict[str, Any]:
    """``{"packages_sha256", "packages"}``: sha256 of the sorted ``*.dist-info``/``*.egg-info`` names
    (``name-version``) in the ``sys.path`` directories — every installed distribution and its
    version — and how many there are. Lists directories only (no metadata file is read: fast)."""
    import sys

    names: Set[str] = set()
    for entry in sys.path:
        try:
            with os.scandir(entry or ".") as it:
                names.update(e.name for e in it if e.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
    lines = sorted(names)
    return {"packages_sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest(), "packages": len(lines)}


def _git(root: str, *args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.decode(errors="replace") if out.returncode == 0 else None


def git_state(run_dir: str, roots: Sequence[str], run_dir_mode: str = "private") -> List[Dict[str, Any]]:
    """Per git repository in ``roots``: ``root``, ``commit``, ``dirty`` and, when dirty, ``diff``:
    the run-directory path of the saved ``git diff HEAD`` (untracked files are in the snapshot,
    not in the diff), written with ``rundir.private_modes(run_dir_mode)``."""
    out: List[Dict[str, Any]] = []
    for root in roots:
        commit = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--untracked-files=normal")
        entry: Dict[str, Any] = {
            "root": root,
            "commit": commit.strip() if commit else None,
            "dirty": bool(status and status.strip()),
        }
        if entry["dirty"]:
            # credential files stay out of the diff as out of the snapshot (slurm_ddp.secrets)
            never = [f":(exclude,glob)**/{p}" for p in CREDENTIAL_FILES]
            diff = _git(root, "diff", "HEAD", "--binary", "--", ".", *never) or ""
            name = diff_name(hashlib.sha256(diff.encode()).hexdigest())
            path = Path(run_dir) / name
            # a diff of the job's YAML can hold an environment value (rundir.PRIVATE_DIRS)
            private_dir(path.parent, run_dir_mode)
            if not path.exists():
                write_private_text(path, diff, run_dir_mode)
            entry["diff"] = name
            entry["untracked"] = [ln[3:] for ln in (status or "").splitlines() if ln.startswith("??")][:100]
        out.append(entry)
    return out


def read(run_dir: str) -> Dict[str, Any]:
    """``RUN_DIR/provenance.json`` as ``{"submits": [...], "starts": [...]}`` (empty lists when missing)."""
    try:
        rec = json.loads((Path(run_dir) / PROVENANCE_NAME).read_text())
    except (OSError, ValueError):
        rec = {}
    if not isinstance(rec, dict):
        rec = {}
    for key in ("submits", "starts"):
        if not isinstance(rec.get(key), list):
            rec[key] = []
    return rec


def _append(run_dir: str, key: str, entry: Dict[str, Any], run_dir_mode: Optional[str] = None) -> None:
    """Add ``entry`` to ``provenance.json``'s list ``key``; the file's mode: ``rundir.private_modes(run_dir_mode)``,
    or (None) the mode it has (``rundir.run_dir_mode_of``: what submit chose)."""
    rec = read(run_dir)
    rec[key].append(entry)
    path = Path(run_dir) / PROVENANCE_NAME
    # rundir.PRIVATE_FILES: the submit command line is recorded (its credential values as ***)
    write_private_text(path, json.dumps(rec, indent=1, default=str) + "\n", run_dir_mode or run_dir_mode_of(path))


def record_submit(
    run_dir: str,
    *,
    argv: Sequence[str],
    backend: str,
    script: str,
    snapshot_digest: Optional[str],
    git_roots: Sequence[str],
    run_dir_mode: str = "private",
) -> Dict[str, Any]:
    """Append a submit to ``provenance.json`` (and save a dirty checkout's diff), both with
    ``rundir.private_modes(run_dir_mode)`` (``environment.run_dir_mode``); returns the entry."""
    entry: Dict[str, Any] = {
        "time": time.time(),
        "argv": list(argv),
        "cwd": os.getcwd(),
        "backend": backend,
        "versions": versions(),
        **packages_digest(),
        "script_sha256": hashlib.sha256(script.encode()).hexdigest(),
        "snapshot": snapshot_digest,
        "git": git_state(run_dir, git_roots, run_dir_mode),
    }
    _append(run_dir, "submits", entry, run_dir_mode)
    return entry


def gpus_seen(environ: Mapping[str, str]) -> Optional[str]:
    """The GPUs a task sees: ``CUDA_VISIBLE_DEVICES``, else Slurm's ``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``."""
    for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        if environ.get(name):
            return environ[name]
    return None


def record_start(run_dir: str, environ: Mapping[str, str], *, job_id: str, restart: int, world_size: int) -> None:
    """Append this start to ``provenance.json`` (rank 0 only, once per start)."""
    snap: Optional[str] = None
    try:
        snap = json.loads((Path(run_dir) / SNAPSHOT_NAME).read_text()).get("digest")
    except (OSError, ValueError, AttributeError):
        pass
    _append(
        run_dir,
        "starts",
        {
            "time": time.time(),
            "job_id": job_id,
            "restart": restart,
            "nodes": environ.get("SLURM_JOB_NODELIST") or environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "host": socket.gethostname(),
            "world_size": world_size,
            "gpus": gpus_seen(environ),
            "versions": versions(),
            "snapshot": snap,
        },
    )


def changes(rec: Mapping[str, Any]) -> List[str]:
    """What changed between consecutive starts, one sentence each (``[]`` when nothing did)."""
    out: List[str] = []
    starts = [s for s in rec.get("starts", []) if isinstance(s, dict)]
    for prev, cur in zip(starts, starts[1:]):
        diffs: List[str] = []
        for key in COMPARED:
            a, b = prev.get(key), cur.get(key)
            if key == "versions" and isinstance(a, dict) and isinstance(b, dict):
                diffs += [f"{k} {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
            elif a != b:
                diffs.append(f"{key} {a} -> {b}")
        if diffs:
            out.append(
                f"job {prev.get('job_id')} restart {prev.get('restart')} -> job {cur.get('job_id')} "
                f"restart {cur.get('restart')}: " + "; ".join(diffs)
            )
    return out


def torch_mismatch(manifest: Union[str, os.PathLike[str]], torch_version: str) -> Optional[str]:
    """A warning when the checkpoint manifest's ``torch_version`` differs from ``torch_version``; else None."""
    try:
        saved = json.loads(Path(manifest).read_text()).get("torch_version")
    except (OSError, ValueError, AttributeError):
        return None
    if not saved or saved == torch_version:
        return None
    return (
        f"the checkpoint was written by torch {saved} and this job runs torch {torch_version}: "
        "resuming is not guaranteed to be bitwise exact"
    )
