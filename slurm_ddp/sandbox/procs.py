"""The sandbox's processes: the binaries it runs (``check_prerequisites``), daemons started in a
session of their own and recorded by PID and start time (a reused PID is never taken for a
daemon), waits that fail with the daemon's own log lines, and stopping by PID.

Side effects: starts, signals and reaps processes; writes the state file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from slurm_ddp.errors import SandboxUnavailable

from .cgroups import cgroup_v1_problems
from .layout import SandboxLayout

# Binaries the sandbox runs, and the Debian package that provides each.
_REQUIRED = {
    "slurmctld": "slurmctld",
    "slurmd": "slurmd",
    "sbatch": "slurm-client",
    "srun": "slurm-client",
    "scontrol": "slurm-client",
    "sinfo": "slurm-client",
    "squeue": "slurm-client",
    "scancel": "slurm-client",
    "munged": "munge",
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "mount": "mount",
}
_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/local/bin", "/usr/bin", "/bin")


def _which(name: str) -> Optional[str]:
    path = os.environ.get("PATH", "")
    found = shutil.which(name, path=os.pathsep.join([path, *_SBIN]))
    return found


def _executable(name: str) -> str:
    """Path of a binary the sandbox runs (``check_prerequisites`` looked for it before any start).

    Raises ``SandboxUnavailable`` when it is on neither PATH nor the sbin directories.
    """
    found = _which(name)
    if found is None:
        raise SandboxUnavailable(f"{name} is on neither PATH nor {os.pathsep.join(_SBIN)}; install it")
    return found


def check_prerequisites(oci: bool = False, production: bool = False) -> List[str]:
    """Return human-readable problems that stop a sandbox from starting; empty = OK.

    ``oci``: the sandbox runs containers with Slurm's OCI support, which needs ``runc``. ``production``: the
    production profile, which needs cgroup v1 controllers (``cgroups.cgroup_v1_problems``) and ``taskset``."""
    problems: List[str] = []
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        uid = os.geteuid() if hasattr(os, "geteuid") else "?"
        problems.append(
            f"not running as root (uid {uid}): the Slurm sandbox creates network namespaces "
            "and starts slurmd as root; run it as root (e.g. in a disposable VM or container)"
        )
    missing: Dict[str, List[str]] = {}
    for binary, package in [*_REQUIRED.items(), *([("runc", "runc")] if oci else [])]:
        if _which(binary) is None:
            missing.setdefault(package, []).append(binary)
    for package, binaries in missing.items():
        problems.append(
            f"missing {', '.join(binaries)} (Debian package {package}): "
            f"apt-get install -y --no-install-recommends {package}"
        )
    if production:
        problems += cgroup_v1_problems()
        if _which("taskset") is None:
            problems.append("missing taskset (Debian package util-linux): apt-get install -y util-linux")
    if not os.path.exists("/proc/self/ns/net"):
        problems.append("this kernel has no network namespaces (/proc/self/ns/net is missing)")
    return problems


def _proc_starttime(pid: int) -> Optional[int]:
    """Start time of ``pid`` (clock ticks since boot), None if it does not exist or is a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode(errors="replace")
    except OSError:
        return None
    # comm may contain spaces and parentheses: split after the last ')'
    rest = data[data.rfind(")") + 2 :].split()
    if not rest or rest[0] in ("Z", "X"):
        return None
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def _alive(pid: Optional[int], starttime: Optional[int]) -> bool:
    if not pid:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap if it is our child
    st = _proc_starttime(pid)
    return st is not None and (starttime is None or st == starttime)


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _sh(*args: str, check: bool = True, timeout: float = 20) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, list(args), proc.stdout, proc.stderr)
    return proc


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


class SandboxDaemons(SandboxLayout):
    """Starting, recording, watching and waiting for a sandbox's daemons."""

    def _record_pid(self, key: str, proc: subprocess.Popen) -> None:
        self._procs[key] = proc
        self._state.setdefault("pids", {})[key] = proc.pid
        self._state.setdefault("starttimes", {})[key] = _proc_starttime(proc.pid)
        self._save_state()

    def _live_pids(self) -> Dict[str, int]:
        pids = self._state.get("pids", {})
        starts = self._state.get("starttimes", {})
        return {k: p for k, p in pids.items() if _alive(p, starts.get(k))}

    def _daemon_env(self) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env["SLURM_CONF"] = str(self.slurm_conf)
        env["PATH"] = os.pathsep.join([env.get("PATH", ""), *_SBIN])
        return env

    def _spawn(self, key: str, argv: List[str]) -> subprocess.Popen[bytes]:
        with open(self.log_dir / f"{key}.out", "ab") as out:  # the daemon keeps its own copy of the fd
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self._daemon_env(),
                start_new_session=True,  # = setsid: own session, no controlling terminal
                close_fds=True,
            )
        self._record_pid(key, proc)
        return proc

    def _dead_daemon(self, keys: Optional[List[str]] = None) -> Optional[str]:
        starts = self._state.get("starttimes", {})
        for key, pid in self._state.get("pids", {}).items():
            if keys is not None and key not in keys:
                continue
            if not _alive(pid, starts.get(key)):
                return key
        return None

    def _failure(self, what: str, key: Optional[str]) -> SandboxUnavailable:
        """One line: what went wrong, the last lines of the relevant logs, where the logs are."""
        names = [key] if key else ["munged", "slurmctld", *(f"slurmd-{n}" for n in self.node_names)]
        hints = []
        for k in names:
            log = "munged.log" if k == "munged" else f"{k}.log"
            for p in (self.log_dir / log, self.log_dir / f"{k}.out"):
                last = [ln.strip() for ln in _tail(p, 40).splitlines() if ln.strip()]
                errs = [ln for ln in last if "error" in ln.lower() or "fatal" in ln.lower()] or last
                if errs:
                    hints.append(f"{p.name}: " + " | ".join(errs[-2:]))
        detail = f" ({'; '.join(hints[:4])})" if hints else ""
        return SandboxUnavailable(f"Slurm sandbox in {self.root}: {what}{detail}; see logs in {self.log_dir}")

    def _wait_for(self, cond, deadline: float, what: str, keys: Optional[List[str]] = None) -> None:
        while True:
            if cond():
                return
            dead = self._dead_daemon(keys)
            if dead:
                raise self._failure(f"{dead} exited while waiting for {what}", dead)
            if time.monotonic() > deadline:
                raise self._failure(f"timed out waiting for {what}", None)
            time.sleep(0.05)

    @staticmethod
    def _wait_gone(pids: Dict[str, int], starts: Dict[str, Any], extra: List[int], grace: float) -> None:
        end = time.monotonic() + grace
        while time.monotonic() < end:
            if not any(_alive(p, starts.get(k)) for k, p in pids.items()) and not any(_alive(p, None) for p in extra):
                return
            time.sleep(0.05)
