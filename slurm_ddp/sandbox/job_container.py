"""The production profile's private ``/tmp``: Slurm's ``job_container/tmpfs`` on several nodes of one machine.

``job_container/tmpfs`` gives every job a mount namespace of its own with a private ``/tmp`` and
``/dev/shm`` (slurm 22.05: both, always; ``job_container.conf``'s ``Dirs`` came with 23.02), and keeps it by
bind-mounting the namespace's file (``/proc/PID/ns/mnt``) under ``BasePath``. The kernel refuses that bind
when the namespace bound is not newer than the binder's (``fs/namespace.c``, ``mnt_ns_loop``: it compares
the namespaces' ids). Since Linux 6.18 mount-namespace ids come in per-CPU batches, so a job's namespace made
on one CPU can have a lower id than its node's (the slurmd's, made earlier on another CPU): about half of the
launches then failed (``_create_ns: ns base mount failed: Invalid argument``, "Could not launch job").
:func:`ns_cpu` finds the CPU whose next id is the lowest; the node's namespaces are made there
(``network._isolated``'s ``cpu``), so every later namespace, on any CPU, is newer. Seen on this project's
machine: 0 failures in 40+ jobs after that.

Side effects: :func:`ns_cpu` starts one short process per CPU in a throw-away mount namespace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional

from .procs import _executable

#: ``ioctl(fd, NS_GET_MNTNS_ID, &u64)`` on ``/proc/self/ns/mnt`` (``include/uapi/linux/nsfs.h``:
#: ``_IOR(0xb7, 0x5, __u64)``; Linux 6.8+).
NS_GET_MNTNS_ID = 0x8008B705

_PROBE = (
    "import fcntl, os, struct\n"
    "fd = os.open('/proc/self/ns/mnt', os.O_RDONLY)\n"
    f"print(struct.unpack('Q', fcntl.ioctl(fd, {NS_GET_MNTNS_ID}, bytes(8)))[0])\n"
)


def mntns_ids() -> Dict[int, int]:
    """CPU -> the id of a mount namespace made just now on that CPU (``taskset -c CPU unshare --mount``).

    Empty when the kernel has no ``NS_GET_MNTNS_ID`` (before 6.8: ids were one global sequence there)."""
    ids: Dict[int, int] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        argv = [_executable("taskset"), "-c", str(cpu), _executable("unshare"), "--mount", sys.executable, "-c", _PROBE]
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired):
            return {}
        if out.returncode != 0 or not out.stdout.strip().isdigit():
            return {}
        ids[cpu] = int(out.stdout)
    return ids


def ns_cpu() -> Optional[int]:
    """The CPU on which a mount namespace made now gets the lowest id; None when ids are not per-CPU
    (or cannot be read): then any CPU will do."""
    ids = mntns_ids()
    if len(set(ids.values())) < 2:
        return None
    return min(ids, key=lambda c: ids[c])


def job_container_conf_text(base: Path, nodes: List[str]) -> str:
    """``job_container.conf`` (beside slurm.conf, read at slurmd's start): one ``BasePath`` per node, as the
    nodes share this machine's filesystem. ``AutoBasePath=true``: slurmd creates it."""
    lines = ["# Written by slurm_ddp.sandbox: the production profile's private /tmp and /dev/shm per job."]
    lines += [f"NodeName={n} AutoBasePath=true BasePath={base / n}" for n in nodes]
    return "\n".join(lines) + "\n"
