"""``environment.container``: how every rank of a job starts inside a container, and what ``submit``
prepares for it.

Three runtimes (``config.CONTAINER_RUNTIMES``), each wrapping the one ``srun`` that starts the ranks
(srun and torchrun launchers, the task worker and ``train.command`` alike), so that inside the
container every rank still starts through ``python -m slurm_ddp.launch`` (binding, OMP, allocator,
rank log, watchdog):

* ``apptainer``: ``srun … apptainer exec [--nv] --bind MOUNTS --pwd WORKDIR [options] IMAGE PYTHON …``
  (Apptainer docs, "Bind Paths and Mounts", "GPU Support": ``--nv`` when the job has GPUs). The
  starter passes the host environment in (SLURM_*, MASTER_*, the torchrun variables) and forwards the
  signals it gets to the container's process; with a proctrack plugin that signals every process
  of the step the rank may get a signal twice, which its handler (a flag) does not mind.
* ``pyxis``: ``srun --container-image=IMAGE --container-mounts=MOUNTS --container-workdir=WORKDIR
  [options] PYTHON …`` (Pyxis README, "Usage"). The ranks are the step's own tasks in the container's
  namespaces: Slurm's signals, variables and GPUs (enroot's hooks) reach them as without a container.
* ``oci``: ``srun --container=RUN_DIR/container/bundle [options] PYTHON …`` (Slurm's containers
  guide, oci.conf(5)). The bundle is made at submit (``prepare``) from the image's: the image's root
  is bound in, one top-level entry at a time, onto a skeleton of it (``oci_bundle_config``), its own
  mounts kept, the mounts below added and ``process.cwd`` set to the working directory. Slurm 22.05 runs the step's command as PID 1 of the container, passes the
  environment but not ``SLURM_PROCID``/``SLURM_LOCALID``/``SLURM_NODEID`` and runs one task per node
  per step; ``slurm_ddp.launch`` fills those in from the host name (``env.container_step_env``).
  A signal to the step reaches PID 1 through ``runc run``, which forwards the signals it gets, when
  ``runc run`` is the step's task: oci.conf's ``RunTimeRun`` must ``exec`` it, as slurmstepd runs
  that line with ``/bin/sh -c`` and signals the shell too (``sandbox.oci.oci_conf_text``).

Mounted at the same paths, without asking: the run directory (the code snapshot, checkpoints and logs
are in it), the ranks' working directory (``train.workdir``), ``train.pythonpath`` (when the code is
not snapshotted) and ``environment.container.mounts``. slurm_ddp itself is made importable inside
the image from the run directory: ``submit`` copies the package that renders the script into
``RUN_DIR/container/python`` (``rundir.CONTAINER_PYTHON_DIR``) and the script puts it first on the
ranks' ``PYTHONPATH``, so the ranks run the same version as the batch script's requeue logic (which
stays on the host); the image needs torch and PyYAML.

The local backend (``submit --backend local``, a rehearsal) runs each rank in the same container:
``apptainer`` with the batch script's words (``ContainerPlan.exec_argv``), ``oci`` as PID 1 of one
``runc run`` per rank (``local_rank_argv``, ``oci_rank_config``); ``check_local`` refuses pyxis and a
runtime that is not on PATH.

``plan`` and ``describe`` are pure; ``check`` (submit, ``--dry-run`` too) may run the runtime
(``apptainer exec``) to check the image; ``prepare`` (submit) writes the run directory's ``container/``.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .config import JobConfig, image_is_path
from .errors import UserError
from .rundir import CONTAINER_BUNDLE_DIR, CONTAINER_PYTHON_DIR, CONTAINER_RANKS_DIR

#: The package directory copied into the run directory (``prepare``).
_PACKAGE_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Mount:
    """A host path mounted into the container: ``source`` on the host at ``target`` inside."""

    source: str
    target: str
    read_only: bool = False

    def spec(self) -> str:
        """``SRC:DST[:ro]``, the form ``apptainer --bind`` and ``--container-mounts`` take."""
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class ContainerPlan:
    """How the ranks of one job start in a container; the words are shell-quoted for the batch script."""

    runtime: str
    image: str
    python: str  #: the interpreter inside the image
    mounts: Tuple[Mount, ...]
    workdir: str
    gpus: bool  #: the job asks for GPUs
    python_dir: str  #: the copy of slurm_ddp, first on the ranks' PYTHONPATH
    srun_flags: Tuple[str, ...]  #: more srun options (pyxis, oci)
    exec_argv: Tuple[str, ...]  #: the runtime's words before the rank's interpreter, unquoted (apptainer exec …)
    #: apptainer with a clean environment (``--cleanenv``, ``--containall``: ``clean_env_option``): the names
    #: (and ``CLEAN_ENV_PREFIX``) passed in as ``APPTAINERENV_<NAME>`` (``passed_environ``); else empty
    passed_names: Tuple[str, ...] = ()

    @property
    def clean_env(self) -> bool:
        """The runtime starts the rank without the host's environment (``passed_names`` reach it)."""
        return bool(self.passed_names)

    @property
    def prefix(self) -> Tuple[str, ...]:
        """``exec_argv`` shell-quoted, for the batch script; with a clean environment after a ``bash -c`` that
        sets ``APPTAINERENV_<NAME>`` in each task's own environment (``passed_environ``'s rule)."""
        words = self.exec_argv
        if self.clean_env:
            names = " ".join(f"${{!{CLEAN_ENV_PREFIX}@}}" if n == CLEAN_ENV_PREFIX else n for n in self.passed_names)
            snippet = f'for n in {names}; do [ -n "${{!n+x}}" ] && export "APPTAINERENV_$n=${{!n}}"; done; exec "$@"'
            words = ("bash", "-c", snippet, "slurm-ddp-passenv", *words)
        return tuple(shlex.quote(w) for w in words)


#: Apptainer options that start the rank without the host's environment (apptainer exec: ``-e``/``--cleanenv``;
#: ``-C``/``--containall`` implies it): the rank variables then reach it only as ``APPTAINERENV_<NAME>``.
CLEAN_ENV_OPTIONS = ("-e", "--cleanenv", "-C", "--containall")
#: What a rank needs from the host under a clean environment, besides ``environment.env``/``pass_env``: every
#: ``SLURM_*`` variable (srun's task variables, slurm_ddp's own ``SLURM_DDP_*``), the rendezvous, the copy of
#: slurm_ddp on ``PYTHONPATH``, the GPUs Slurm gave the task, and ``SLURMD_NODENAME`` (no ``SLURM_`` prefix: the
#: node's name, which in-process recovery places each rank by, ``slurm_ddp.worker.inprocess.place_in_step``).
CLEAN_ENV_PREFIX = "SLURM_"
CLEAN_ENV_NAMES = (
    "SLURMD_NODENAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "CUDA_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
)


def clean_env_option(options: Sequence[str]) -> Optional[str]:
    """The first of ``options`` (``environment.container.options``) that makes Apptainer start the rank with a
    clean environment (``CLEAN_ENV_OPTIONS``, also as ``--cleanenv=true``), or None."""
    for o in options:
        name, _, value = o.partition("=")
        if name in CLEAN_ENV_OPTIONS and value.lower() in ("", "true"):
            return o
    return None


def passed_environ(p: ContainerPlan, env: Mapping[str, str]) -> Dict[str, str]:
    """``APPTAINERENV_<NAME>`` for each of ``p.passed_names`` set in ``env`` (the rank's host environment;
    ``CLEAN_ENV_PREFIX``: every name with it): what reaches the rank under ``--cleanenv``
    (Apptainer docs, "Environment and Metadata"). The batch script does the same in bash (``prefix``)."""
    names = [n for n in env if n.startswith(CLEAN_ENV_PREFIX)] if CLEAN_ENV_PREFIX in p.passed_names else []
    names += [n for n in p.passed_names if n != CLEAN_ENV_PREFIX and n in env]
    return {f"APPTAINERENV_{n}": env[n] for n in dict.fromkeys(names)}


def _mounts(cfg: JobConfig, run_dir: str) -> Tuple[Mount, ...]:
    """The run directory, the working directory, ``train.pythonpath`` outside them, then the user's mounts;
    a path already inside an automatic mount is left out."""
    auto: List[str] = []
    for p in (run_dir, cfg.train.workdir or "", *cfg.train.pythonpath):
        p = os.path.normpath(p) if p else ""
        if p and not any(p == a or p.startswith(a.rstrip("/") + "/") for a in auto):
            auto = [a for a in auto if not a.startswith(p.rstrip("/") + "/")] + [p]
    out = [Mount(p, p) for p in auto]
    for given in cfg.environment.container.mounts:
        parts = given.split(":")
        out.append(Mount(parts[0], parts[1] if len(parts) > 1 else parts[0], len(parts) == 3 and parts[2] == "ro"))
    for m in out:
        if "," in m.spec() or any(not c.isprintable() for c in m.spec()):
            raise UserError(
                f"environment.container: cannot mount {m.source!r}: the runtimes split mount lists on ',' "
                "(choose a run directory and working directory without commas)"
            )
    return tuple(out)


def plan(cfg: JobConfig, run_dir: str) -> Optional[ContainerPlan]:
    """The container of ``cfg``'s ranks, writing into ``run_dir`` (absolute); None without one.

    Raises ``UserError`` when a mounted path holds a comma (the runtimes' mount lists are
    comma-separated)."""
    c = cfg.environment.container
    if c.runtime == "none":
        return None
    mounts = _mounts(cfg, run_dir)
    workdir = cfg.train.workdir or run_dir
    q = shlex.quote
    opts = tuple(q(o) for o in c.options)
    srun: Tuple[str, ...] = ()
    exec_argv: Tuple[str, ...] = ()
    passed: Tuple[str, ...] = ()
    if c.runtime == "apptainer":  # the batch script and the local backend both wrap the rank in these words
        binds = ",".join(m.spec() for m in mounts)
        exec_argv = ("apptainer", "exec", *(("--nv",) if cfg.slurm.gpu_job else ()), "--bind", binds)
        exec_argv += ("--pwd", workdir, *c.options, c.image)
        if clean_env_option(c.options):
            e = cfg.environment
            passed = tuple(dict.fromkeys((CLEAN_ENV_PREFIX, *CLEAN_ENV_NAMES, *sorted(e.env), *e.pass_env)))
    elif c.runtime == "pyxis":
        srun = (
            f"--container-image={q(c.image)}",
            f"--container-mounts={q(','.join(m.spec() for m in mounts))}",
            f"--container-workdir={q(workdir)}",
            *opts,
        )
    else:  # oci: the bundle prepare() writes
        srun = (f"--container={q(os.path.join(run_dir, CONTAINER_BUNDLE_DIR))}", *opts)
    return ContainerPlan(
        runtime=c.runtime,
        image=c.image,
        python=c.python,
        mounts=mounts,
        workdir=workdir,
        gpus=cfg.slurm.gpu_job,
        python_dir=os.path.join(run_dir, CONTAINER_PYTHON_DIR),
        srun_flags=srun,
        exec_argv=exec_argv,
        passed_names=passed,
    )


def describe(cfg: JobConfig, run_dir: str) -> List[str]:
    """Lines for ``env --explain``: where each rank runs, what is mounted, how GPUs and signals get in."""
    p = plan(cfg, run_dir)
    if p is None:
        return ["each rank runs on the node itself (no environment.container)"]
    gpus = {
        "apptainer": "GPUs: apptainer exec --nv (the driver libraries and the job's devices are bound in)",
        "pyxis": "GPUs: enroot's hooks expose the step's GPUs (CUDA_VISIBLE_DEVICES as Slurm set it)",
        "oci": "GPUs: only through the runtime's hooks configured in oci.conf (e.g. an NVIDIA runtime hook)",
    }[p.runtime]
    signals = {
        "apptainer": "signals: Slurm's reach apptainer's starter, which forwards them to the rank",
        "pyxis": "signals: the ranks are the step's own tasks; Slurm's signals reach them directly",
        "oci": "signals: Slurm signals 'runc run', which forwards them to the rank (PID 1 of the container); "
        "oci.conf's RunTimeRun must exec runc (a /bin/sh -c in between dies of the requeue signal)",
    }[p.runtime]
    lines = [
        f"each rank runs inside the {p.runtime} container {p.image}, started by slurm_ddp.launch with {p.python}",
        "the batch shell, MASTER_ADDR/PORT and the requeue decision stay on the host",
        "mounted at the same paths: " + ", ".join(m.spec() for m in p.mounts),
        f"working directory: {p.workdir}; slurm_ddp from {p.python_dir} (copied at submit, first on PYTHONPATH)",
    ]
    if p.clean_env:
        lines.append(
            f"{clean_env_option(cfg.environment.container.options)}: the host's environment stays out; the rank gets "
            + ", ".join(f"{n}*" if n == CLEAN_ENV_PREFIX else n for n in p.passed_names)
            + " as APPTAINERENV_<NAME>"
        )
    if p.runtime == "oci":
        lines.append(
            "Slurm's OCI support runs one task per node per step, as PID 1, without SLURM_PROCID/LOCALID: "
            "slurm_ddp.launch takes the rank from the host's place in SLURM_STEP_NODELIST"
        )
    if p.gpus:
        lines.append(gpus)
    lines.append(signals)
    return lines


# --------------------------------------------------------------------------- submit (side effects)


def _copy_package(dest: Path) -> None:
    target = dest / "slurm_ddp"
    tmp = dest / ".slurm_ddp.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(_PACKAGE_DIR, tmp, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def _load_bundle(image: str) -> Tuple[Dict[str, Any], Path]:
    path = Path(image)
    try:
        spec = json.loads((path / "config.json").read_text())
    except FileNotFoundError:
        raise UserError(
            f"environment.container.image {image!r}: no config.json there; give an OCI bundle directory "
            "(config.json + rootfs; `slurm-ddp sandbox oci-bundle DIR` makes one from this machine)"
        ) from None
    except (OSError, ValueError) as e:
        raise UserError(f"environment.container.image {image!r}: cannot read its config.json: {e}") from None
    root = spec.get("root", {}).get("path", "rootfs") if isinstance(spec, dict) else None
    if not isinstance(root, str):
        raise UserError(f"environment.container.image {image!r}: config.json has no root.path")
    rootfs = Path(root) if os.path.isabs(root) else path / root
    if not rootfs.is_dir():
        raise UserError(f"environment.container.image {image!r}: its root {str(rootfs)!r} is not a directory")
    return spec, rootfs.resolve()


def _in_bundle(path: str, rootfs: Path, mounts: Sequence[Dict[str, Any]], made: str = "") -> bool:
    """Whether ``path`` exists inside the bundle: under its longest bind mount (where ``made``, a host
    path submit creates, counts as existing), else in its rootfs."""
    best: Optional[Dict[str, Any]] = None
    for m in mounts:
        dst = str(m.get("destination", "")).rstrip("/") or "/"
        inside = m.get("type") == "bind" and dst != "/" and (path == dst or path.startswith(dst + "/"))
        if inside and (best is None or len(dst) > len(str(best["destination"]).rstrip("/"))):
            best = m
    if best is not None:
        rest = path[len(str(best["destination"]).rstrip("/")) :].lstrip("/")
        host = os.path.join(str(best.get("source", "")), rest)
        return os.path.exists(host) or (bool(made) and os.path.normpath(host) == os.path.normpath(made))
    return os.path.lexists(os.path.join(str(rootfs), path.lstrip("/")))


def _root_entries(rootfs: Path) -> List[Tuple[str, str]]:
    """``(name, kind)`` of each top-level entry of the image's root ``rootfs``, sorted: ``kind`` is ``dir``,
    ``file`` or ``symlink`` (other kinds, and ``lost+found``, are left out)."""
    out: List[Tuple[str, str]] = []
    for entry in sorted(rootfs.iterdir()):
        if entry.is_symlink():
            out.append((entry.name, "symlink"))
        elif entry.name == "lost+found":
            continue
        elif entry.is_dir():
            out.append((entry.name, "dir"))
        elif entry.is_file():
            out.append((entry.name, "file"))
    return out


def oci_bundle_config(spec: Dict[str, Any], rootfs: Path, p: ContainerPlan) -> Dict[str, Any]:
    """The run's bundle (OCI runtime spec): the image's ``spec`` with its root ``rootfs`` bound in one
    top-level entry at a time onto the run bundle's ``rootfs`` skeleton (:func:`make_root_skeleton`;
    read-only as the image's ``root.readonly`` says; not those the image's own mounts replace), its
    mounts, then ``p``'s, and ``process.cwd`` = the working directory.

    Why entry by entry: Slurm 22.05 takes the root from ``BUNDLE/rootfs`` whatever ``root.path`` says
    (its ``_modify_config``; 24.11 and 26.05 use ``root.path``) and refuses a symlink there, and runc
    since 1.2.8/1.3.3 (the fix of CVE-2025-52881) refuses a mount on "/" ("mountpoint … is on the top of
    rootfs"; runc 1.3.6 in Debian sid), so neither a symlink nor one bind of the whole root works
    everywhere. runc makes these binds before the image's own mounts, so those land inside them."""
    out = copy.deepcopy(spec)
    readonly = bool(spec.get("root", {}).get("readonly", False))
    out["root"] = {"path": "rootfs", "readonly": readonly}
    image_mounts = list(spec.get("mounts", []))
    replaced = {str(m.get("destination", "")).rstrip("/") for m in image_mounts if isinstance(m, dict)}
    root_binds = [
        {
            "destination": f"/{name}",
            "type": "bind",
            "source": str(rootfs / name),
            "options": ["rbind", "ro" if readonly else "rw"],
        }
        for name, kind in _root_entries(rootfs)
        if kind != "symlink" and f"/{name}" not in replaced
    ]
    ours = [
        {
            "destination": m.target,
            "type": "bind",
            "source": m.source,
            "options": ["rbind", "ro" if m.read_only else "rw"],
        }
        for m in p.mounts
    ]
    out["mounts"] = [*root_binds, *image_mounts, *ours]
    process = dict(out.get("process") or {})
    process["cwd"] = p.workdir
    process["terminal"] = False
    out["process"] = process
    return out


def make_root_skeleton(rootfs: Path, skeleton: Path) -> None:
    """Make ``skeleton`` (the run bundle's ``rootfs``) the mount points of :func:`oci_bundle_config`'s
    root binds: an empty directory or file for each top-level directory or file of the image's root
    ``rootfs``, and a copy of each top-level symlink (``bin -> usr/bin``). What exists is kept (a
    resubmit). Raises ``OSError`` when ``skeleton`` cannot be written."""
    skeleton.mkdir(parents=True, exist_ok=True)
    for name, kind in _root_entries(rootfs):
        at = skeleton / name
        if os.path.lexists(at):
            continue
        if kind == "symlink":
            os.symlink(os.readlink(rootfs / name), at)
        elif kind == "dir":
            at.mkdir(mode=0o755)
        else:
            at.touch(mode=0o644)


def check(cfg: JobConfig, run_dir: str, run: Callable[..., Any] = subprocess.run) -> List[str]:
    """Check ``cfg``'s image where this machine can (``submit``, ``--dry-run`` too; writes nothing in the run
    directory); return lines for the user about what could not be checked here. Empty without a container.

    An image that is a path must exist; an OCI bundle must have config.json and a root in which every
    mount's target exists (runc cannot make a mount point in a read-only root); with ``apptainer`` on
    PATH, the image's ``python`` must import torch, yaml and slurm_ddp (this package, copied to a
    temporary directory and bound in as the ranks get it; ``run`` injectable). Raises ``UserError``
    naming what failed."""
    p = plan(cfg, run_dir)
    if p is None:
        return []
    if image_is_path(p.runtime, p.image) and not os.path.exists(p.image):
        raise UserError(f"environment.container.image {p.image!r} does not exist on this machine; give its path")
    if p.runtime == "oci":
        spec, rootfs = _load_bundle(p.image)
        mounts = spec.get("mounts", [])
        missing = [m.target for m in p.mounts if not _in_bundle(m.target, rootfs, mounts, made=run_dir)]
        if missing:
            raise UserError(
                f"environment.container: {missing[0]} does not exist in the OCI bundle {p.image} (runc cannot make "
                "a mount point in its read-only root); create it in the bundle's rootfs or bind a parent directory "
                "in its config.json"
            )
        return [f"the ranks run in the OCI bundle {run_dir}/{CONTAINER_BUNDLE_DIR}, made at submit from {p.image}"]
    if p.runtime == "apptainer" and shutil.which("apptainer"):
        import tempfile

        with tempfile.TemporaryDirectory(prefix="slurm-ddp-container-") as tmp:
            _copy_package(Path(tmp))
            probe = "import torch, yaml, slurm_ddp.launch"
            argv = ["apptainer", "exec", "--bind", tmp, p.image, p.python, "-c", probe]
            res = run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tmp}, timeout=300)
        if res.returncode != 0:
            last = ((res.stderr or "") + (res.stdout or "")).strip().splitlines()[-1:] or ["no output"]
            raise UserError(
                f"environment.container: {p.python} in {p.image} cannot run the ranks ({probe!r} failed: {last[0]}); "
                "install torch and PyYAML in the image or set environment.container.python"
            )
        return []
    tool = "apptainer" if p.runtime == "apptainer" else "pyxis (enroot)"
    return [
        f"the image {p.image} was not checked here ({tool} is not on this machine): its {p.python} needs torch "
        f"and PyYAML; slurm_ddp comes from {p.python_dir}, copied at submit"
    ]


def prepare(cfg: JobConfig, run_dir: str) -> None:
    """Write ``RUN_DIR/container/`` for ``cfg``'s container (nothing without one): the copy of slurm_ddp
    (``CONTAINER_PYTHON_DIR``) and, for ``oci``, the run's bundle (``CONTAINER_BUNDLE_DIR``,
    ``oci_bundle_config``). Run after ``check``. Raises ``OSError`` when the run directory cannot be written."""
    p = plan(cfg, run_dir)
    if p is None:
        return
    _copy_package(Path(p.python_dir))
    if p.runtime == "oci":
        spec, rootfs = _load_bundle(p.image)
        bundle = Path(run_dir) / CONTAINER_BUNDLE_DIR
        make_root_skeleton(rootfs, bundle / "rootfs")
        tmp = bundle / "config.json.tmp"
        tmp.write_text(json.dumps(oci_bundle_config(spec, rootfs, p), indent=1) + "\n")
        os.replace(tmp, bundle / "config.json")


# --------------------------------------------------------------------------- the local backend (a rehearsal)

#: The program that runs each runtime's containers on this machine (``submit --backend local``).
LOCAL_TOOLS = {"apptainer": "apptainer", "oci": "runc"}


def check_local(p: ContainerPlan, which: Callable[[str], Optional[str]] = shutil.which) -> str:
    """The path of the program that runs ``p``'s containers here for ``submit --backend local``
    (``LOCAL_TOOLS``). Raises ``UserError`` for ``pyxis`` (its containers are srun's), when that
    program is not on PATH, and for ``oci`` when not root with a bundle that has no user namespace
    (runc cannot run it rootless)."""
    if p.runtime not in LOCAL_TOOLS:
        raise UserError(
            f"environment.container.runtime={p.runtime}: its containers are started by srun (Pyxis), which the local "
            "backend does not use; submit with --backend sbatch, or rehearse with runtime apptainer or oci"
        )
    tool = LOCAL_TOOLS[p.runtime]
    path = which(tool)
    if path is None:
        raise UserError(
            f"environment.container.runtime={p.runtime}: the local backend runs each rank with {tool}, which is not "
            f"on PATH here; install {tool}, or submit with --backend sbatch"
        )
    if p.runtime == "oci" and os.geteuid() != 0:
        spec, _ = _load_bundle(p.image)
        if not any(n.get("type") == "user" for n in spec.get("linux", {}).get("namespaces", [])):
            raise UserError(
                f"environment.container: runc runs the bundle {p.image} only as root (its config.json has no user "
                "namespace); run the local backend as root, or give a rootless bundle (`runc spec --rootless`)"
            )
    return path


def rank_environ(p: ContainerPlan, env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` with the run directory's copy of slurm_ddp first on ``PYTHONPATH`` (under a clean environment
    alone), as the batch script gives the ranks (``render._container_env``), and under a clean environment
    the names that reach the rank as ``APPTAINERENV_<NAME>`` (``passed_environ``)."""
    old = "" if p.clean_env else env.get("PYTHONPATH", "")
    out = {**env, "PYTHONPATH": p.python_dir + (":" + old if old else "")}
    return {**out, **passed_environ(p, out)} if p.clean_env else out


def oci_rank_config(
    run_spec: Mapping[str, Any], rootfs: str, argv: Sequence[str], env: Mapping[str, str]
) -> Dict[str, Any]:
    """The ``config.json`` of one local rank's OCI bundle: the run's (``oci_bundle_config``, read from
    ``RUN_DIR/container/bundle``) with its root ``rootfs`` (that bundle's, absolute), ``argv`` and
    ``env`` as the container's process (PID 1), and no network namespace: the ranks meet at
    MASTER_ADDR=127.0.0.1 on this machine's network, as a node's ranks do on the node's."""
    out = copy.deepcopy(dict(run_spec))
    out["root"] = {**out.get("root", {}), "path": rootfs}
    process = dict(out.get("process") or {})
    process["args"] = list(argv)
    process["env"] = [f"{k}={v}" for k, v in env.items()]
    process["terminal"] = False
    out["process"] = process
    linux = dict(out.get("linux") or {})
    linux["namespaces"] = [n for n in linux.get("namespaces", []) if n.get("type") != "network"]
    out["linux"] = linux
    return out


def local_rank_argv(
    p: ContainerPlan, run_dir: str, rank: int, argv: Sequence[str], env: Mapping[str, str], runtime: str, name: str
) -> List[str]:
    """What the local supervisor runs to start ``argv`` (a rank's, its interpreter ``p.python``) inside
    ``p``'s container, ``runtime`` being ``check_local``'s program: for ``apptainer`` the batch
    script's words (``exec_argv``) then ``argv``; for ``oci`` ``runtime run --bundle DIR name``
    after writing DIR = ``RUN_DIR/container/ranks/<rank>`` (``oci_rank_config``; owner-only, since
    ``env`` may hold ``environment.env``'s values). ``runc run`` forwards the signals it gets to
    the container's PID 1 (the rank). Raises ``OSError`` when the run directory cannot be written."""
    if p.runtime == "apptainer":
        return [runtime, *p.exec_argv[1:], *argv]
    run_bundle = Path(run_dir) / CONTAINER_BUNDLE_DIR
    spec = json.loads((run_bundle / "config.json").read_text())
    ranks = Path(run_dir) / CONTAINER_RANKS_DIR
    ranks.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(ranks, 0o700)
    bundle = ranks / str(rank)
    bundle.mkdir(mode=0o700, exist_ok=True)
    text = json.dumps(oci_rank_config(spec, str(run_bundle / "rootfs"), argv, env), indent=1) + "\n"
    tmp = bundle / "config.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, bundle / "config.json")
    return [runtime, "run", "--bundle", str(bundle), name]
