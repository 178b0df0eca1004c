"""The production profile's cgroups: one cgroup v1 subtree per node, its processes killed and the subtree
removed at stop.

Several slurmd on one machine share its cgroup hierarchies, and Slurm's ``cgroup/v1`` plugin names its
directories by node (``slurm_<node>``) but a job's by user and job id only: two nodes of one job would meet in
the same ``uid_0/job_N`` directory. So each node gets a directory of its own in every controller Slurm uses
(``SandboxCgroups._make_cgroups``, under this process's own cgroup, so that the caller's limits still hold), and
its slurmd, in its private mount namespace, sees that directory bind-mounted over ``/sys/fs/cgroup/C``
(``SandboxCgroups._cgroup_binds``, used by ``network._isolated``). A task's ``/proc/self/cgroup`` then shows
the host's full path, which does not resolve under the bind mount.

Side effects: mkdir/rmdir under ``/sys/fs/cgroup``, SIGKILL to the processes left in the subtrees (by PID,
read from ``cgroup.procs``). The directories are recorded in the state file as soon as they exist, so
``down`` removes exactly what was made, also after a partial start. Facts: cgroups(7), cgroup.conf(5),
the kernel's ``Documentation/admin-guide/cgroup-v1/``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Dict, List, Tuple

from slurm_ddp.errors import SandboxUnavailable

from .layout import SandboxLayout

#: The cgroup v1 controllers Slurm's plugins use: freezer (``proctrack/cgroup``), cpuset
#: (``ConstrainCores``), memory (``ConstrainRAMSpace``), devices (``ConstrainDevices``), cpuacct
#: (``jobacct_gather/cgroup``).
CONTROLLERS = ("cpuset", "memory", "devices", "freezer", "cpuacct")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _v1_mounts() -> Dict[str, Tuple[str, bool]]:
    """Controller -> (mount point, writable) of every cgroup v1 hierarchy, from /proc/self/mounts."""
    found: Dict[str, Tuple[str, bool]] = {}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        parts = line.split()
        if len(parts) < 4 or parts[2] != "cgroup":
            continue
        opts = parts[3].split(",")
        for c in CONTROLLERS:
            if c in opts:
                found.setdefault(c, (parts[1], "rw" in opts))
    return found


def cgroup_v1_problems() -> List[str]:
    """Why this machine cannot run the production profile's cgroups; empty = it can.

    Needs every controller of ``CONTROLLERS`` mounted read-write as cgroup v1 at ``/sys/fs/cgroup/C``
    (``CgroupPlugin=cgroup/v1``, ``CgroupMountpoint=/sys/fs/cgroup``: cgroup.conf(5))."""
    mounts = _v1_mounts()
    missing = [c for c in CONTROLLERS if c not in mounts]
    if missing:
        return [
            f"the production profile needs the cgroup v1 controllers {', '.join(missing)} mounted under "
            f"{CGROUP_ROOT} (mount | grep cgroup); this machine has "
            f"{', '.join(sorted(mounts)) or 'none'} (a cgroup v2-only host cannot run it)"
        ]
    problems = []
    for c in CONTROLLERS:
        point, rw = mounts[c]
        if not rw:
            problems.append(f"the cgroup v1 controller {c} is mounted read-only at {point}; the profile needs it rw")
        elif Path(point).resolve() != (CGROUP_ROOT / c).resolve():
            problems.append(f"the cgroup v1 controller {c} is mounted at {point}, not {CGROUP_ROOT / c}")
    return problems


def own_cgroup(controller: str) -> str:
    """This process's cgroup in ``controller``'s v1 hierarchy (``/proc/self/cgroup``), e.g. ``/`` or ``/a/b``."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return path or "/"
    raise SandboxUnavailable(f"this process is in no cgroup v1 {controller} hierarchy (/proc/self/cgroup)")


def _cgroup_tree(top: Path) -> List[Path]:
    """``top`` and every cgroup below it, deepest first (the order rmdir needs)."""
    if not top.is_dir():
        return []
    dirs = [Path(d) for d, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def _procs(cgroup: Path) -> List[int]:
    with contextlib.suppress(OSError):
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    return []


class SandboxCgroups(SandboxLayout):
    """The per-node cgroup subtrees of a production sandbox (``_state["cgroups"]``: controller -> its dir)."""

    def _cgroup_base(self, controller: str) -> Path:
        """The sandbox's directory in ``controller``'s hierarchy: beside this process's own cgroup's children."""
        own = own_cgroup(controller).lstrip("/")
        return (CGROUP_ROOT / controller).resolve() / own / f"slurm-ddp-{self.id}"

    def _make_cgroups(self) -> None:
        """mkdir one directory per node in every controller (cpuset: with its parent's CPUs and memory nodes)."""
        made: Dict[str, str] = self._state.setdefault("cgroups", {})
        for c in CONTROLLERS:
            base = self._cgroup_base(c)
            for d in [base, *(base / n for n in self.node_names)]:
                try:
                    d.mkdir(exist_ok=True)
                    if c == "cpuset":  # a new cpuset has no CPUs: tasks cannot join it until it gets some
                        for key in ("cpuset.cpus", "cpuset.mems"):
                            (d / key).write_text((d.parent / key).read_text())
                except OSError as e:
                    raise SandboxUnavailable(f"cannot make the node cgroup {d}: {e}") from None
                made[c] = str(base)
                self._save_state()

    def _cgroup_binds(self, node: str) -> List[Tuple[str, str]]:
        """(source, target) bind mounts that give ``node``'s slurmd its own subtree as each controller's root."""
        cgroups = self._state.get("cgroups", {})
        return [(f"{cgroups[c]}/{node}", str(CGROUP_ROOT / c)) for c in CONTROLLERS if c in cgroups]

    def cgroup_pids(self) -> List[int]:
        """PIDs of every process in the sandbox's cgroup subtrees (job steps and tasks, after a node's loss too)."""
        pids = set()
        for base in self._state.get("cgroups", {}).values():
            for d in _cgroup_tree(Path(base)):
                pids.update(_procs(d))
        return sorted(pids - {os.getpid()})

    def _remove_cgroups(self, timeout_s: float = 10) -> None:
        """Kill what is left in the subtrees (thawed first: a frozen task does not die), then rmdir them.

        Raises nothing: what could not be removed stays recorded in the state file for the next ``down``."""
        cgroups: Dict[str, str] = self._state.get("cgroups", {})
        if not cgroups:
            return
        freezer = cgroups.get("freezer")
        end = time.monotonic() + timeout_s
        while True:
            if freezer:  # proctrack/cgroup freezes a step to signal it atomically
                for d in _cgroup_tree(Path(freezer)):
                    with contextlib.suppress(OSError):
                        if (d / "freezer.state").read_text().strip() != "THAWED":
                            (d / "freezer.state").write_text("THAWED")
            pids = self.cgroup_pids()
            if not pids or time.monotonic() > end:
                break
            for p in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.05)
        for c, base in list(cgroups.items()):
            left = []
            for d in _cgroup_tree(Path(base)):
                for _ in range(100):  # a killed task leaves its cgroup a moment after it is reaped
                    try:
                        d.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        time.sleep(0.05)
                else:
                    left.append(d)
            if not left:
                cgroups.pop(c)
        if not cgroups:
            self._state.pop("cgroups", None)
