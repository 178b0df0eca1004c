"""Slurm's own OCI container support in the sandbox: the ``oci.conf`` lines for ``runc`` and a bundle
whose root is this machine's own file system (``make_host_bundle``), to rehearse
``environment.container.runtime: oci`` (``srun --container=BUNDLE``) with Python and torch inside.

Side effects: ``make_host_bundle`` writes a directory (``config.json`` and an empty ``rootfs``
skeleton); nothing is mounted on the host. What was seen with Slurm 22.05 and runc 1.1 on Debian 12
is in the project's SLURM-FACTS notes: crun 1.8 refuses a cgroup-v1 ("hybrid") machine, runc works;
``root.path: "/"`` fails (pivot_root: busy).

The root here is an empty skeleton (one empty directory per top-level directory of ``/``, the
top-level symlinks such as ``bin -> usr/bin`` copied) with each host directory bind-mounted onto it
read-only by the runtime (``/tmp`` read-write, ``/sys`` read-only, ``/proc``, ``/dev`` and
``/dev/shm`` the runtime's own, ``/run`` an empty tmpfs, where Slurm 24.11 and later mount the step's
spool directory: ``/var/run/slurm``). The binds are made by runc inside the step's own mount namespace,
so the bundle works whatever mount namespace slurmd runs in (the sandbox's nodes each have a private
one, made before the bundle): a host ``mount --bind / rootfs`` would not be seen there.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, List, Union

from slurm_ddp.errors import SandboxUnavailable

#: runc's ``--root`` (its container state) for the sandboxes: one directory per sandbox below it
#: (``runtime_root``), as two sandboxes both number jobs from 1 and name nodes ``n1…``, and a
#: container id (``%n.%u.%j.%s.%t``) must be unique within one ``--root``.
OCI_RUNTIME_ROOT = "/run/slurm-oci"

#: The directories of ``/`` bound read-write (everything else that is bound is read-only).
_WRITABLE = ("tmp",)
#: Not bound from the host: the runtime mounts its own (/proc, /dev), or they hold host state
#: (/run: daemons' sockets and the namespaces; /sys is bound separately, read-only).
_NOT_BOUND = ("proc", "dev", "sys", "run", "lost+found")


def runtime_root(sandbox_id: str) -> Path:
    """runc's ``--root`` for the sandbox ``sandbox_id`` (letters and digits): ``OCI_RUNTIME_ROOT/sandbox_id``.
    Raises ``ValueError`` for another id (the directory is deleted at ``down``)."""
    if not sandbox_id.isalnum():
        raise ValueError(f"a sandbox id is letters and digits, not {sandbox_id!r}")
    return Path(OCI_RUNTIME_ROOT) / sandbox_id


def oci_conf_text(runc: str, root: Union[str, os.PathLike[str]] = OCI_RUNTIME_ROOT) -> str:
    """The sandbox's ``oci.conf`` (read by slurmd at start, beside slurm.conf) for ``runc`` at path
    ``runc`` keeping its state in ``root``. Patterns (oci.conf(5)): ``%b`` bundle, ``%n`` node,
    ``%u`` user, ``%j`` job, ``%s`` step, ``%t`` task.

    ``RunTimeRun`` starts with ``exec``: slurmstepd runs the line as ``/bin/sh -c LINE`` and signals
    every process of the step's tree (proctrack), that shell included. Debian's ``/bin/sh`` (dash)
    does not replace itself with the last command, so without ``exec`` a USR2 to the step kills the
    shell (no handler), the task ends with 140 (128 + SIGUSR2), srun's ``--kill-on-bad-exit`` ends
    the step and slurmstepd's clean-up runs ``RunTimeKill`` (``runc kill -a``: SIGTERM) on the ranks.
    With ``exec`` the task is ``runc run`` itself, which forwards the signal to the container's PID 1.
    ``RunTimeKill`` is only used at that clean-up (after the task ended), never to pass a signal on.
    """
    base = f"{runc} --root={root}"
    return (
        "# Written by slurm_ddp.sandbox: Slurm's OCI support with runc (crun 1.8 refuses cgroup v1 here).\n"
        "# RunTimeRun execs runc: slurmstepd runs it through /bin/sh -c and signals that shell too (see\n"
        "# slurm_ddp/sandbox/oci.py); a shell left in between dies of the requeue signal.\n"
        'RunTimeQuery="' + base + ' state %n.%u.%j.%s.%t"\n'
        'RunTimeKill="' + base + ' kill -a %n.%u.%j.%s.%t"\n'
        'RunTimeDelete="' + base + ' delete --force %n.%u.%j.%s.%t"\n'
        'RunTimeRun="exec ' + base + ' run --bundle %b %n.%u.%j.%s.%t"\n'
    )


def _bind(source: str, writable: bool) -> Dict[str, Any]:
    return {
        "destination": source,
        "type": "bind",
        "source": source,
        "options": ["rbind", "rprivate", "rw" if writable else "ro"],
    }


def host_bundle_config(host_root: Union[str, os.PathLike[str]] = "/") -> Dict[str, Any]:
    """The ``config.json`` (OCI runtime spec 1.0) of a bundle whose root is ``host_root``'s directories
    bound onto the skeleton ``rootfs``: what ``runc spec`` writes, minus the network, UTS and user
    namespaces (the ranks use the node's network and hostname), minus ``hostname`` and the cgroup
    mount, with ``/sys`` a read-only bind, a tmpfs on ``/run`` (writable: Slurm 24.11 and later mount
    the step's spool at ``/var/run/slurm``, oci.conf(5) ``MountSpoolDir``) and ``terminal: false``
    (a batch step has no terminal)."""
    root = Path(host_root)
    mounts: List[Dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755"]},
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        # torch's DataLoader and gloo use shared memory: the host's size, not runc's 64 MiB
        {"destination": "/dev/shm", "type": "bind", "source": "/dev/shm", "options": ["rbind", "rw"]},
        _bind("/sys", writable=False),
        # a writable, empty /run: Slurm 24.11 and later bind the step's spool directory at
        # /var/run/slurm (oci.conf's MountSpoolDir default; /var/run -> /run) in every container, and
        # runc cannot make that mount point in the read-only root
        {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=755"]},
    ]
    for entry in sorted(root.iterdir()):
        if entry.is_symlink() or not entry.is_dir() or entry.name in _NOT_BOUND:
            continue
        mounts.append(_bind(f"/{entry.name}", writable=entry.name in _WRITABLE))
    return {
        "ociVersion": "1.0.2-dev",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": ["sh"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "mount"}],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
            "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"],
        },
    }


def make_host_bundle(bundle: Union[str, os.PathLike[str]], host_root: Union[str, os.PathLike[str]] = "/") -> Path:
    """Write an OCI bundle in ``bundle`` (created; an existing bundle there is replaced) whose root is
    this machine's file system (``host_bundle_config``); return its absolute path.

    ``rootfs`` holds one empty directory per top-level directory of ``host_root`` and a copy of each
    top-level symlink. Raises ``SandboxUnavailable`` when ``bundle`` exists and is not a bundle this
    function made (a directory with other files), so nothing of the user's is deleted.
    """
    out = Path(bundle).absolute()
    if out.exists():
        names = {p.name for p in out.iterdir()}
        if names - {"config.json", "rootfs"}:
            raise SandboxUnavailable(
                f"{out} exists and is not an OCI bundle made by slurm-ddp (it holds {', '.join(sorted(names))}); "
                "give a new or empty directory"
            )
        shutil.rmtree(out / "rootfs", ignore_errors=True)
    rootfs = out / "rootfs"
    rootfs.mkdir(parents=True)
    for entry in sorted(Path(host_root).iterdir()):
        if entry.is_symlink():
            os.symlink(os.readlink(entry), rootfs / entry.name)
        elif entry.is_dir() and entry.name != "lost+found":
            (rootfs / entry.name).mkdir(mode=0o755)
    tmp = out / "config.json.tmp"
    tmp.write_text(json.dumps(host_bundle_config(host_root), indent=1) + "\n")
    os.replace(tmp, out / "config.json")
    return out
