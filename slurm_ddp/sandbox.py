"""A private, real Slurm cluster on one machine: ``SlurmSandbox``.

One private ``munged``, one ``slurmctld`` and N ``slurmd`` "nodes" (``n1`` .. ``nN``),
each node in its own network namespace with its own hostname and its own address on a
private bridge, so that ranks of a job talk over a real (virtual) network. Everything
lives under one directory (``root``): configuration, logs, state, and a state file
(``sandbox.json``) with the PIDs of the daemons, so that another process can re-attach
with :meth:`SlurmSandbox.load` and stop it. Unix sockets (munge, slurmstepd) live in a
short directory under ``/tmp`` because socket paths are limited to 108 bytes.

Needs root and Debian's ``slurmctld``, ``slurmd``, ``slurm-client``, ``munge``,
``iproute2`` and ``util-linux`` packages (see :func:`check_prerequisites`)::

    with SlurmSandbox("/tmp/cluster", nodes=2) as sb:
        out = sb.run(["srun", "-N2", "-n2", "hostname"], capture_output=True, text=True)
        # out.stdout == "n1\\nn2\\n" (in some order)

Network layout of a sandbox with id ``ID`` and subnet ``10.A.B.0/24``:

* a bridge ``sdbID`` in the host namespace with address ``10.A.B.253``: the ``srun`` /
  ``sbatch`` clients of this machine reach the controller and the nodes through it;
* the controller ``ctl`` (slurmctld) lives in namespace ``sdID-ctl`` at ``10.A.B.254``;
* node ``nI`` lives in namespace ``sdID-nI`` (``/run/netns``), interface ``eth0`` with
  address ``10.A.B.I/24``, no default route; its ``/etc/hosts`` (bind-mounted in a
  private mount namespace) maps ``ctl`` and every ``nJ`` to their addresses, so a job
  may use ``MASTER_ADDR=n1``.

No NAT, no default route: traffic stays on the bridge and in the namespaces. Every
daemon is started with its own session and stopped by PID; ``down()`` also stops every
process still left inside the nodes' namespaces (job steps, tasks).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from slurm_ddp.errors import SandboxUnavailable
from slurm_ddp.rendezvous import port_is_free

__all__ = ["SlurmSandbox", "check_prerequisites", "STATE_FILE"]

#: Name of the state file inside the sandbox root.
STATE_FILE = "sandbox.json"

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
_CONTROLLER_HOST = "ctl"
_SHORT_BASE = "/tmp"  # sockets: keep paths far below the 108-byte limit
_LOCK_PATH = "/tmp/slurm-ddp-sandbox.lock"
_PORT_RANGE = (20000, 32000)  # below Linux's default ephemeral range (32768-60999)


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


def check_prerequisites() -> List[str]:
    """Return human-readable problems that stop a sandbox from starting; empty = OK."""
    problems: List[str] = []
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        uid = os.geteuid() if hasattr(os, "geteuid") else "?"
        problems.append(
            f"not running as root (uid {uid}): the Slurm sandbox creates network namespaces "
            "and starts slurmd as root; run it as root (e.g. in a disposable VM or container)"
        )
    missing: Dict[str, List[str]] = {}
    for binary, package in _REQUIRED.items():
        if _which(binary) is None:
            missing.setdefault(package, []).append(binary)
    for package, binaries in missing.items():
        problems.append(
            f"missing {', '.join(binaries)} (Debian package {package}): "
            f"apt-get install -y --no-install-recommends {package}"
        )
    if not os.path.exists("/proc/self/ns/net"):
        problems.append("this kernel has no network namespaces (/proc/self/ns/net is missing)")
    return problems


# --------------------------------------------------------------------------- processes


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


def _free_ports(count: int, taken: set) -> List[int]:
    rng = random.SystemRandom()
    ports: List[int] = []
    for _ in range(2000):
        if len(ports) == count:
            break
        # a consecutive block keeps the config readable; fall back to any free port
        start = rng.randrange(_PORT_RANGE[0], _PORT_RANGE[1] - count)
        block = [start + i for i in range(count - len(ports))]
        for p in block:
            if p not in taken and p not in ports and port_is_free(p):
                ports.append(p)
    if len(ports) < count:
        raise SandboxUnavailable(f"found no {count} free TCP ports in {_PORT_RANGE}")
    return ports


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------- sandbox


class SlurmSandbox:
    """A private Slurm cluster (``munged`` + ``slurmctld`` + N ``slurmd``) on this machine.

    ``root``: directory for everything (created). ``nodes``: number of nodes ``n1..nN``.
    ``cpus_per_node``: CPUs each node advertises (may exceed the real cores).
    ``name``: short id (lowercase letters/digits, ≤ 8) used in interface, namespace and
    cluster names; random when omitted. ``gpus_per_node``: emulated GPUs per node (GRES
    ``gpu``): placeholder character devices ``ROOT/dev/nvidia0..N-1`` (``mknod c 195 K``, as
    slurmd accepts only devices) listed in a ``gres.conf`` with ``AutoDetect=off``. Slurm then
    schedules them and sets ``CUDA_VISIBLE_DEVICES``/``SLURM_STEP_GPUS`` per task exactly as on
    a GPU cluster; CUDA cannot use them, so jobs run on the CPU (gloo). ``accounting``: also a
    private MariaDB (``mariadbd --no-defaults``, datadir ``ROOT/mysql``, on 127.0.0.1) and Debian's
    ``slurmdbd`` in front of it (``AccountingStorageType=accounting_storage/slurmdbd``), started
    before slurmctld and stopped by PID with the rest, so ``sacct`` answers (packages ``slurmdbd``
    and ``mariadb-server``; the database is created at the first ``up``, a few seconds).

    Timeouts (slurm.conf(5)): ``slurmd_timeout_s`` (``SlurmdTimeout``: a node whose slurmd does not
    answer for this long is marked DOWN and its jobs fail with NODE_FAIL, or are requeued),
    ``message_timeout_s`` (``MessageTimeout``, one RPC's round trip) and ``kill_wait_s``
    (``KillWait``, SIGTERM→SIGKILL grace). A node-loss test sets ``slurmd_timeout_s`` to a few
    seconds (slurmctld pings every ``SlurmdTimeout/3``) and loses a node with :meth:`kill_node`.
    """

    def __init__(
        self,
        root: Union[str, os.PathLike[str]],
        nodes: int = 2,
        cpus_per_node: int = 2,
        name: Optional[str] = None,
        gpus_per_node: int = 0,
        slurmd_timeout_s: int = 60,
        message_timeout_s: int = 10,
        kill_wait_s: int = 5,
        accounting: bool = False,
    ) -> None:
        if not 1 <= int(nodes) <= 200:
            raise ValueError(f"nodes must be 1..200, got {nodes}")
        if int(cpus_per_node) < 1:
            raise ValueError(f"cpus_per_node must be >= 1, got {cpus_per_node}")
        if not 0 <= int(gpus_per_node) <= 64:
            raise ValueError(f"gpus_per_node must be 0..64, got {gpus_per_node}")
        for key, value, low in (
            ("slurmd_timeout_s", slurmd_timeout_s, 2),
            ("message_timeout_s", message_timeout_s, 1),
            ("kill_wait_s", kill_wait_s, 0),
        ):
            if not low <= int(value) <= 65533:
                raise ValueError(f"{key} must be {low}..65533 seconds, got {value}")
        self.slurmd_timeout_s = int(slurmd_timeout_s)
        self.message_timeout_s = int(message_timeout_s)
        self.kill_wait_s = int(kill_wait_s)
        self.root = Path(root).absolute()
        self.num_nodes = int(nodes)
        self.cpus_per_node = int(cpus_per_node)
        self.gpus_per_node = int(gpus_per_node)
        self.accounting = bool(accounting)
        self.id = self._make_id(name)
        self.real_memory_mb = 1000
        self._state: Dict[str, Any] = {}
        self._procs: Dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ naming

    @staticmethod
    def _make_id(name: Optional[str]) -> str:
        if name is None:
            return secrets.token_hex(3)
        if re.fullmatch(r"[a-z0-9]{1,8}", name):
            return name
        return hashlib.sha1(name.encode()).hexdigest()[:6]

    @property
    def node_names(self) -> List[str]:
        return [f"n{i}" for i in range(1, self.num_nodes + 1)]

    @property
    def bridge(self) -> str:
        return f"sdb{self.id}"

    def netns(self, node: str) -> str:
        """Name of the network namespace of ``node`` (``n1``.., or ``ctl`` for slurmctld), under /run/netns."""
        return f"sd{self.id}-{node}"

    def _veth(self, node: str) -> str:
        return f"sd{self.id}h{'c' if node == _CONTROLLER_HOST else node[1:]}"

    @property
    def slurm_conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def state_path(self) -> Path:
        return self.root / STATE_FILE

    @property
    def short_dir(self) -> Path:
        return Path(self._state.get("short_dir") or f"{_SHORT_BASE}/sdsb-{self.id}")

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    def node_addr(self, node: str) -> str:
        """IPv4 address of ``node`` (e.g. ``n1``) on the sandbox bridge."""
        return f"{self._state['subnet']}.{int(node[1:])}"

    @property
    def controller_addr(self) -> str:
        """Address of slurmctld (in its own namespace)."""
        return f"{self._state['subnet']}.254"

    @property
    def host_addr(self) -> str:
        """Address of this machine (the host namespace) on the sandbox bridge."""
        return f"{self._state['subnet']}.253"

    # ------------------------------------------------------------------ client side

    @property
    def env(self) -> Dict[str, str]:
        """Variables a Slurm client needs to talk to this sandbox (merge into a copy of os.environ)."""
        return {"SLURM_CONF": str(self.slurm_conf), "SLURM_DDP_SANDBOX": str(self.root)}

    def client_env(self, base: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """``base`` plus :attr:`env`. Without ``base``: os.environ minus its SLURM_* variables (those
        of an enclosing job, e.g. SLURM_JOB_ID, would make srun think it runs inside that job)."""
        if base is None:
            out = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        else:
            out = dict(base)
        out.update(self.env)
        return out

    def run(self, *args: Any, **kw: Any) -> subprocess.CompletedProcess:
        """``subprocess.run`` with :attr:`env` merged into the environment (``env=`` or os.environ)."""
        kw["env"] = self.client_env(kw.get("env"))
        return subprocess.run(*args, **kw)

    # ------------------------------------------------------------------ state file

    def _save_state(self) -> None:
        self._state.update(
            id=self.id,
            nodes=self.num_nodes,
            cpus_per_node=self.cpus_per_node,
            gpus_per_node=self.gpus_per_node,
            slurmd_timeout_s=self.slurmd_timeout_s,
            message_timeout_s=self.message_timeout_s,
            kill_wait_s=self.kill_wait_s,
            accounting=self.accounting,
            root=str(self.root),
            slurm_conf=str(self.slurm_conf),
        )
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=2, sort_keys=True))
        os.replace(tmp, self.state_path)

    @classmethod
    def load(cls, root: Union[str, os.PathLike[str]]) -> SlurmSandbox:
        """Re-attach to a sandbox started earlier (possibly by another process) in ``root``."""
        path = Path(root).absolute() / STATE_FILE
        try:
            state = json.loads(path.read_text())
        except FileNotFoundError:
            raise SandboxUnavailable(f"no sandbox state file {path}: nothing was started in {root}") from None
        sb = cls(
            root,
            nodes=state["nodes"],
            cpus_per_node=state["cpus_per_node"],
            name=state["id"],
            gpus_per_node=state.get("gpus_per_node", 0),
            slurmd_timeout_s=state.get("slurmd_timeout_s", 60),
            message_timeout_s=state.get("message_timeout_s", 10),
            kill_wait_s=state.get("kill_wait_s", 5),
            accounting=state.get("accounting", False),
        )
        sb._state = state
        return sb

    def _record_pid(self, key: str, proc: subprocess.Popen) -> None:
        self._procs[key] = proc
        self._state.setdefault("pids", {})[key] = proc.pid
        self._state.setdefault("starttimes", {})[key] = _proc_starttime(proc.pid)
        self._save_state()

    def _live_pids(self) -> Dict[str, int]:
        pids = self._state.get("pids", {})
        starts = self._state.get("starttimes", {})
        return {k: p for k, p in pids.items() if _alive(p, starts.get(k))}

    # ------------------------------------------------------------------ status

    def status(self) -> Dict[str, Any]:
        """Where the sandbox stands: ``up``, ``nodes`` (name/addr/netns/state), ``pids`` (live ones), paths."""
        live = self._live_pids()
        expected = {"munged", "slurmctld", *(f"slurmd-{n}" for n in self.node_names)}
        up = bool(self._state.get("pids")) and expected <= set(live)
        states: Dict[str, str] = {}
        if up:
            with contextlib.suppress(Exception):
                states = self._node_states(timeout=10)
        nodes = []
        for n in self.node_names:
            nodes.append(
                {
                    "name": n,
                    "addr": self.node_addr(n) if "subnet" in self._state else None,
                    "netns": self.netns(n),
                    "state": states.get(n, "down" if not up else "unknown"),
                    "pid": live.get(f"slurmd-{n}"),
                }
            )
        return {
            "up": up,
            "id": self.id,
            "root": str(self.root),
            "nodes": nodes,
            "pids": live,
            "slurm_conf": str(self.slurm_conf),
            "log_dir": str(self.log_dir),
            "controller": (
                f"{self.controller_addr}:{self._state['ports']['slurmctld']}" if "ports" in self._state else None
            ),
            "subnet": f"{self._state['subnet']}.0/24" if "subnet" in self._state else None,
            "bridge": self.bridge,
            "short_dir": str(self.short_dir),
            "partitions": ["debug", "high"],
        }

    def _node_states(self, timeout: float = 10) -> Dict[str, str]:
        out = self.run(["sinfo", "-h", "-N", "-o", "%N|%T"], capture_output=True, text=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError(out.stderr.strip())
        states: Dict[str, str] = {}
        for line in out.stdout.split():
            node, _, st = line.partition("|")
            states[node] = st  # a node in two partitions is listed twice, same state
        return states

    # ------------------------------------------------------------------ up

    def up(self, timeout_s: float = 60) -> SlurmSandbox:
        """Start the cluster and wait until every node is idle; return self.

        Raises :class:`SandboxUnavailable` if this machine cannot run it (not root,
        packages missing, no network namespaces) or if it did not come up within
        ``timeout_s`` (whatever did start is stopped first).
        """
        problems = check_prerequisites()
        if problems:
            raise SandboxUnavailable("; ".join(problems))
        deadline = time.monotonic() + timeout_s
        if not self._state and self.state_path.exists():
            with contextlib.suppress(Exception):
                state = json.loads(self.state_path.read_text())
                if state.get("pids"):  # started earlier, maybe by another process: attach
                    self._state, self.id = state, state["id"]
        if self._state.get("pids"):
            wanted = (self.num_nodes, self.cpus_per_node, self.gpus_per_node)
            self.num_nodes, self.cpus_per_node = self._state["nodes"], self._state["cpus_per_node"]
            self.gpus_per_node = self._state.get("gpus_per_node", 0)
            if self.status()["up"]:
                if (self.num_nodes, self.cpus_per_node, self.gpus_per_node) != wanted:
                    raise SandboxUnavailable(
                        f"a sandbox with {self.num_nodes} nodes x {self.cpus_per_node} CPUs x {self.gpus_per_node} "
                        f"GPUs already runs in {self.root}; stop it first (slurm-ddp sandbox down) to start one with "
                        f"{wanted[0]} x {wanted[1]} x {wanted[2]}"
                    )
                self._wait_idle(deadline)
                return self
            self.down()  # stale or partial: clear it before starting afresh
            self.num_nodes, self.cpus_per_node, self.gpus_per_node = wanted
        with open(_LOCK_PATH, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # ports, subnet and names are chosen one sandbox at a time
            self._check_id_free()
            try:
                self._prepare_files()
                self._make_network()
                self._start_daemons(deadline)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.down()
                raise
        try:
            self._wait_idle(deadline)
        except BaseException:
            with contextlib.suppress(Exception):
                self.down()
            raise
        self._state["started_at"] = time.time()
        self._save_state()
        return self

    def _check_id_free(self) -> None:
        prefix = f"sd{self.id}-"
        in_use = _sh("ip", "link", "show", self.bridge, check=False).returncode == 0 or any(
            line.split()[0].startswith(prefix) for line in _sh("ip", "netns", "list", check=False).stdout.splitlines()
        )
        if in_use:
            raise SandboxUnavailable(
                f"sandbox id {self.id!r} is in use (bridge {self.bridge} or namespaces {prefix}* exist): "
                "stop that sandbox (slurm-ddp sandbox down) or choose another name"
            )

    def _prepare_files(self) -> None:
        # every start is a fresh cluster: slurmctld refuses state saved under another ClusterName
        shutil.rmtree(self.root / "state", ignore_errors=True)
        for d in ("etc", "log", "state", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        short = Path(f"{_SHORT_BASE}/sdsb-{self.id}")
        if short.exists():  # left by a sandbox with this id that was not stopped (its bridge is gone)
            shutil.rmtree(short)
        short.mkdir(mode=0o755)
        os.chmod(short, 0o755)  # munged wants o+x on the socket's directory
        for n in self.node_names:
            (short / n).mkdir(mode=0o755)
        self._state["short_dir"] = str(short)

        taken: set = set()
        ctl_port, *node_ports = _free_ports(1 + self.num_nodes, taken)
        self._state["ports"] = {"slurmctld": ctl_port, **{n: p for n, p in zip(self.node_names, node_ports)}}
        if self.accounting:
            mysql_port, dbd_port = _free_ports(2, taken)
            self._state["ports"].update(mysql=mysql_port, slurmdbd=dbd_port)
        self._state["subnet"] = self._pick_subnet()
        self._save_state()

        key = self.root / "munge" / "munge.key"
        if key.exists():
            key.chmod(0o600)
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        os.chmod(self.root / "munge", 0o700)

        hosts = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        names = [(self.host_addr, "sandbox-host"), (self.controller_addr, _CONTROLLER_HOST)]
        names += [(self.node_addr(n), n) for n in self.node_names]
        hosts += [f"{a}\t{n}" for a, n in names]
        # reverse lookups of IPv4-mapped peers (dual-stack servers such as torch's TCPStore)
        hosts += [f"::ffff:{a}\t{n}" for a, n in names]
        (self.root / "etc" / "hosts").write_text("\n".join(hosts) + "\n")
        (self.root / "etc" / "cgroup.conf").write_text("CgroupPlugin=autodetect\nIgnoreSystemd=yes\n")
        self._make_gpu_devices()
        self.slurm_conf.write_text(self._render_conf())
        if self.accounting:
            dbd = self.slurm_conf.parent / "slurmdbd.conf"  # slurmdbd reads it beside SLURM_CONF
            dbd.write_text(self._render_dbd_conf())
            dbd.chmod(0o600)  # slurmdbd refuses a readable one

    @property
    def gpu_dir(self) -> Path:
        """Where the placeholder GPU devices live (``nvidia0`` …)."""
        return self.root / "dev"

    def _make_gpu_devices(self) -> None:
        """``gpus_per_node`` placeholder character devices (major 195, NVIDIA's) and ``gres.conf``.

        gres.conf(5): ``AutoDetect=off`` (no NVML here), one ``Name=gpu File=…`` line covering
        ``nvidia[0-N-1]``; every node lists the same files (they are placeholders). slurmd refuses
        regular files ("is not a valid character or block device"), hence ``mknod``.
        """
        gres = self.root / "etc" / "gres.conf"
        shutil.rmtree(self.gpu_dir, ignore_errors=True)
        if not self.gpus_per_node:
            gres.unlink(missing_ok=True)
            return
        self.gpu_dir.mkdir(parents=True)
        for k in range(self.gpus_per_node):
            try:
                os.mknod(self.gpu_dir / f"nvidia{k}", 0o600 | stat.S_IFCHR, os.makedev(195, k))
            except OSError as e:
                raise SandboxUnavailable(f"cannot make the emulated GPU device {self.gpu_dir}/nvidia{k}: {e}") from None
        files = (
            f"{self.gpu_dir}/nvidia[0-{self.gpus_per_node - 1}]"
            if self.gpus_per_node > 1
            else f"{self.gpu_dir}/nvidia0"
        )
        gres.write_text(f"# Written by slurm_ddp.sandbox: emulated GPUs.\nAutoDetect=off\nName=gpu File={files}\n")

    def _pick_subnet(self) -> str:
        text = _sh("ip", "-4", "-o", "addr", "show").stdout + _sh("ip", "-4", "route", "show", "table", "all").stdout
        used = []
        for addr, plen in re.findall(r"\b(\d+\.\d+\.\d+\.\d+)(?:/(\d+))?", text):
            with contextlib.suppress(ValueError):
                used.append(ipaddress.ip_network(f"{addr}/{plen or 32}", strict=False))
        h = int(hashlib.sha1(self.id.encode()).hexdigest(), 16)
        span = 56 * 256  # 10.200.0.0 - 10.255.255.0
        for k in range(span):
            idx = (h + k) % span
            net = ipaddress.ip_network(f"10.{200 + idx // 256}.{idx % 256}.0/24")
            if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
                return str(net.network_address).rsplit(".", 1)[0]
        raise SandboxUnavailable("no free 10.x.y.0/24 subnet found for the sandbox bridge")

    def _render_conf(self) -> str:
        r, s = self.root, self.short_dir
        ports = self._state["ports"]
        node_lines = [
            f"NodeName={n} NodeHostname={n} NodeAddr={self.node_addr(n)} Port={ports[n]} "
            f"CPUs={self.cpus_per_node} RealMemory={self.real_memory_mb} State=UNKNOWN"
            + (f" Gres=gpu:{self.gpus_per_node}" if self.gpus_per_node else "")
            for n in self.node_names
        ]
        all_nodes = f"n[1-{self.num_nodes}]" if self.num_nodes > 1 else "n1"
        lines = [
            "# Written by slurm_ddp.sandbox: a private cluster; do not edit while it runs.",
            f"ClusterName=sdb{self.id}",
            f"SlurmctldHost={_CONTROLLER_HOST}({self.controller_addr})",
            f"SlurmctldPort={ports['slurmctld']}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={s}/munge.sock,cred_expire=5",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={s}/%n",
            f"SlurmctldPidFile={r}/state/slurmctld.pid",
            f"SlurmdPidFile={r}/state/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            *(
                [
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    f"AccountingStorageHost={self.host_addr}",
                    f"AccountingStoragePort={ports['slurmdbd']}",
                    f"AccountingStoragePass={s}/munge.sock",  # traffic to slurmdbd ignores AuthInfo's socket
                    # GPUs are not tracked by default: without this sacct's AllocTRES has no gres/gpu
                    *(["AccountingStorageTRES=gres/gpu"] if self.gpus_per_node else []),
                ]
                if self.accounting
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r}/log/jobcomp.txt",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,sched_interval=2,bf_interval=1",
            "SwitchType=switch/none",
            "MpiDefault=none",
            f"KillWait={self.kill_wait_s}",
            "JobRequeue=1",
            "ReturnToService=2",
            "InactiveLimit=0",
            "MinJobAge=300",
            "SlurmctldTimeout=30",
            f"SlurmdTimeout={self.slurmd_timeout_s}",
            f"MessageTimeout={self.message_timeout_s}",
            "MailProg=/bin/true",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            *(["GresTypes=gpu"] if self.gpus_per_node else []),
            *node_lines,
            f"PartitionName=debug Nodes={all_nodes} Default=YES PriorityTier=1 MaxTime=INFINITE State=UP",
            f"PartitionName=high Nodes={all_nodes} Default=NO PriorityTier=10 MaxTime=INFINITE State=UP",
        ]
        return "\n".join(lines) + "\n"

    def _render_dbd_conf(self) -> str:
        r, s = self.root, self.short_dir
        ports = self._state["ports"]
        return (
            "\n".join(
                [
                    "# Written by slurm_ddp.sandbox: the private accounting daemon.",
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={s}/munge.sock",
                    f"DbdHost={socket.gethostname().split('.')[0]}",
                    f"DbdAddr={self.host_addr}",
                    f"DbdPort={ports['slurmdbd']}",
                    "SlurmUser=root",
                    f"PidFile={r}/state/slurmdbd.pid",
                    f"LogFile={r}/log/slurmdbd.log",
                    "DebugLevel=info",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={ports['mysql']}",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                ]
            )
            + "\n"
        )

    def _start_accounting(self, deadline: float) -> None:
        """MariaDB (its data directory made at the first start) then slurmdbd, both in this namespace."""
        datadir = self.root / "mysql"
        ports = self._state["ports"]
        if not (datadir / "mysql").is_dir():
            shutil.rmtree(datadir, ignore_errors=True)
            res = _sh(
                _executable("mariadb-install-db"), "--no-defaults", f"--datadir={datadir}", "--user=root",
                "--auth-root-authentication-method=normal", "--skip-test-db", check=False, timeout=120,
            )  # fmt: skip
            if res.returncode != 0:
                raise SandboxUnavailable(f"mariadb-install-db failed: {(res.stderr or res.stdout).strip()[-300:]}")
        self._spawn(
            "mariadbd",
            [
                _executable("mariadbd"), "--no-defaults", f"--datadir={datadir}", "--user=root",
                f"--socket={self.short_dir}/mysql.sock", f"--port={ports['mysql']}", "--bind-address=127.0.0.1",
                f"--pid-file={datadir}/mariadbd.pid", f"--log-error={self.log_dir}/mariadbd.err",
                "--skip-grant-tables", "--skip-name-resolve",
            ],
        )  # fmt: skip

        def listening(addr: Any) -> Callable[[], bool]:
            def check() -> bool:
                with socket.socket() as sk:
                    sk.settimeout(0.5)
                    return sk.connect_ex(addr) == 0

            return check

        self._wait_for(listening(("127.0.0.1", ports["mysql"])), deadline, "mariadbd to listen", ["mariadbd"])
        self._spawn("slurmdbd", [_executable("slurmdbd"), "-D"])
        self._wait_for(
            listening((self.host_addr, ports["slurmdbd"])), deadline, "slurmdbd to listen", ["slurmdbd", "mariadbd"]
        )

    # ------------------------------------------------------------------ network

    def _make_network(self) -> None:
        br = self.bridge
        self._state["network"] = {"bridge": br, "netns": []}
        self._save_state()
        res = _sh("ip", "link", "add", br, "type", "bridge", check=False)
        if res.returncode != 0:
            raise SandboxUnavailable(
                f"cannot create bridge {br} ({res.stderr.strip()}): the sandbox needs CAP_NET_ADMIN "
                "and the kernel's bridge support; run as root on a VM or a privileged container"
            )
        self._state["network"]["bridge_created"] = True
        self._save_state()
        _sh("ip", "addr", "add", f"{self.host_addr}/24", "dev", br)
        _sh("ip", "link", "set", br, "up")
        for n in [_CONTROLLER_HOST, *self.node_names]:
            ns, veth = self.netns(n), self._veth(n)
            addr = self.controller_addr if n == _CONTROLLER_HOST else self.node_addr(n)
            res = _sh("ip", "netns", "add", ns, check=False)
            if res.returncode != 0:
                raise SandboxUnavailable(
                    f"cannot create network namespace {ns} ({res.stderr.strip()}): "
                    "the sandbox needs `ip netns` (CAP_SYS_ADMIN); run as root on a VM or a privileged container"
                )
            self._state["network"]["netns"].append(ns)
            self._save_state()
            _sh("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p", "netns", ns)
            _sh("ip", "link", "set", veth, "master", br, "up")
            _sh("ip", "-n", ns, "link", "set", f"{veth}p", "name", "eth0")
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")

    # ------------------------------------------------------------------ daemons

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

    def _isolated(self, hostname: str, argv: List[str]) -> List[str]:
        """argv run with its own hostname and the sandbox's /etc/hosts (private UTS + mount namespaces).

        unshare and sh exec in place, so the PID Popen returns is the daemon's own PID.
        """
        script = 'echo "$1" > /proc/sys/kernel/hostname && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
        return [
            _executable("unshare"), "--uts", "--mount", "--propagation", "private",
            "/bin/sh", "-c", script, "sh", hostname, str(self.root / "etc" / "hosts"), *argv,
        ]  # fmt: skip

    def _start_daemons(self, deadline: float) -> None:
        short = self.short_dir
        sock = short / "munge.sock"
        m = self.root / "munge"
        self._spawn(
            "munged",
            [
                _executable("munged"), "-F", "--force",
                f"--socket={sock}", f"--key-file={m / 'munge.key'}", f"--pid-file={m / 'munged.pid'}",
                f"--log-file={self.log_dir / 'munged.log'}", f"--seed-file={m / 'munged.seed'}",
            ],
        )  # fmt: skip
        self._wait_for(lambda: sock.exists(), deadline, "munged to create its socket", ["munged"])
        if self.accounting:
            self._start_accounting(deadline)

        conf = str(self.slurm_conf)
        argv = [_executable("nsenter"), f"--net=/run/netns/{self.netns(_CONTROLLER_HOST)}", "--"]
        ctld = [_executable("slurmctld"), "-D", "-f", conf]
        self._spawn("slurmctld", argv + self._isolated(_CONTROLLER_HOST, ctld))
        addr = (self.controller_addr, self._state["ports"]["slurmctld"])

        def ctld_listening() -> bool:
            with socket.socket() as s:
                s.settimeout(0.5)
                return s.connect_ex(addr) == 0

        self._wait_for(ctld_listening, deadline, f"slurmctld to listen on {addr[0]}:{addr[1]}", ["slurmctld"])
        for n in self.node_names:
            self._spawn_slurmd(n)

    def _spawn_slurmd(self, node: str) -> None:
        argv = [_executable("nsenter"), f"--net=/run/netns/{self.netns(node)}", "--"]
        argv += self._isolated(node, [_executable("slurmd"), "-D", "-N", node, "-f", str(self.slurm_conf)])
        self._spawn(f"slurmd-{node}", argv)

    # ------------------------------------------------------------------ faults

    def node_pids(self, node: str) -> List[int]:
        """PIDs of every process in ``node``'s network namespace: its slurmd, the slurmstepd of each
        job step and batch script there, and their tasks (a job's batch shell runs on its first node)."""
        if node not in self.node_names:
            raise ValueError(f"no node {node!r} in this sandbox (nodes: {', '.join(self.node_names)})")
        res = _sh("ip", "netns", "pids", self.netns(node), check=False)
        return [int(p) for p in res.stdout.split() if p.isdigit() and int(p) != os.getpid()]

    def kill_node(self, node: str, timeout_s: float = 10) -> List[int]:
        """Lose ``node`` as a power cut would: SIGKILL its slurmd and every process of it (job steps,
        batch shell, tasks) at once, and wait until they are gone. Returns the PIDs killed.

        The namespace and its address stay: slurmctld's pings are refused, and after
        ``slurmd_timeout_s`` it marks the node DOWN (jobs on it: NODE_FAIL, requeued when they
        allow it). :meth:`restart_node` brings it back.
        """
        pids = self.node_pids(node)
        for _ in range(3):  # a process forked while we killed: catch it on the next pass
            for p in pids:
                _kill(p, signal.SIGKILL)
            more = [p for p in self.node_pids(node) if p not in pids]
            if not more:
                break
            pids += more
        self._wait_gone({}, {}, pids, timeout_s)
        self._procs.pop(f"slurmd-{node}", None)
        return pids

    def restart_node(self, node: str, timeout_s: float = 60) -> None:
        """Start ``node``'s slurmd again (after :meth:`kill_node`) and wait until the node is idle
        (``ReturnToService=2``: a DOWN node returns when its slurmd registers)."""
        if node not in self.node_names:
            raise ValueError(f"no node {node!r} in this sandbox (nodes: {', '.join(self.node_names)})")
        if _alive(
            self._state.get("pids", {}).get(f"slurmd-{node}"), self._state.get("starttimes", {}).get(f"slurmd-{node}")
        ):
            raise SandboxUnavailable(f"slurmd of {node} still runs; kill_node({node!r}) first")
        deadline = time.monotonic() + timeout_s
        self._spawn_slurmd(node)
        last: Dict[str, str] = {}

        def idle() -> bool:
            nonlocal last
            with contextlib.suppress(Exception):
                last = self._node_states(timeout=10)
            return last.get(node) == "idle"

        try:
            self._wait_for(idle, deadline, f"{node} to be idle again", [f"slurmd-{node}"])
        except SandboxUnavailable as e:
            raise SandboxUnavailable(f"{e} (node states: {last or 'none'})") from None

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

    def _wait_idle(self, deadline: float) -> None:
        want = set(self.node_names)
        last: Dict[str, str] = {}

        def all_idle() -> bool:
            nonlocal last
            try:
                last = self._node_states(timeout=max(1.0, deadline - time.monotonic()))
            except Exception:
                return False
            return want <= set(last) and all(last[n] == "idle" for n in want)

        try:
            self._wait_for(all_idle, deadline, "all nodes to be idle")
        except SandboxUnavailable as e:
            raise SandboxUnavailable(f"{e} (node states: {last or 'none'})") from None

    # ------------------------------------------------------------------ down

    def down(self, timeout_s: float = 10) -> None:
        """Stop every daemon (SIGTERM in parallel, SIGKILL after ``timeout_s``) and every process
        left in the nodes' namespaces, then delete the namespaces, the bridge and the socket dir.
        Safe to call twice, after a partial start, and from another process (see :meth:`load`)."""
        if not self._state and self.state_path.exists():
            with contextlib.suppress(Exception):
                self._state = json.loads(self.state_path.read_text())
        pids = self._state.get("pids", {})
        starts = self._state.get("starttimes", {})
        netns = list(self._state.get("network", {}).get("netns", []))

        node_netns = [ns for ns in netns if not ns.endswith(f"-{_CONTROLLER_HOST}")]

        def ns_pids(namespaces: List[str]) -> List[int]:
            found: List[int] = []
            for ns in namespaces:
                res = _sh("ip", "netns", "pids", ns, check=False)
                found += [int(p) for p in res.stdout.split() if p.isdigit()]
            return [p for p in found if p != os.getpid()]

        def stop(group: Dict[str, int], extra: List[int], grace: float) -> None:
            targets = {k: p for k, p in group.items() if _alive(p, starts.get(k))}
            for p in targets.values():
                _kill(p, signal.SIGTERM)
            for p in extra:  # job steps and tasks: no grace at teardown (slurmstepd ignores SIGTERM)
                _kill(p, signal.SIGKILL)
            end = time.monotonic() + grace
            while time.monotonic() < end:
                if not any(_alive(p, starts.get(k)) for k, p in targets.items()) and not any(
                    _alive(p, None) for p in extra
                ):
                    break
                time.sleep(0.05)
            for k, p in targets.items():
                if _alive(p, starts.get(k)):
                    _kill(p, signal.SIGKILL)
            for p in extra:
                if _alive(p, None):
                    _kill(p, signal.SIGKILL)

        slurm = {k: p for k, p in pids.items() if k != "munged"}
        daemon_pids = set(pids.values())
        stop(slurm, [p for p in ns_pids(node_netns) if p not in daemon_pids], timeout_s)
        leftovers = ns_pids(netns)  # job steps/tasks that outlived slurmd, slurmctld's helpers
        for p in leftovers:
            _kill(p, signal.SIGKILL)
        stop({k: p for k, p in pids.items() if k == "munged"}, [], min(timeout_s, 5))
        self._wait_gone(pids, starts, leftovers, 5)
        for proc in self._procs.values():
            with contextlib.suppress(Exception):
                proc.wait(timeout=1)
        self._procs.clear()

        for ns in netns:
            _sh("ip", "netns", "del", ns, check=False)
        net = self._state.get("network", {})
        if net.get("bridge_created"):  # only a bridge this sandbox made
            _sh("ip", "link", "del", net.get("bridge", self.bridge), check=False)
        short = self._state.get("short_dir")
        if short and Path(short).name.startswith("sdsb-"):
            shutil.rmtree(short, ignore_errors=True)
        shutil.rmtree(self.gpu_dir, ignore_errors=True)  # the placeholder GPU devices
        if self._state:
            self._state.pop("pids", None)
            self._state.pop("starttimes", None)
            self._state.pop("network", None)
            self._state["stopped_at"] = time.time()
            with contextlib.suppress(OSError):
                self._save_state()

    @staticmethod
    def _wait_gone(pids: Dict[str, int], starts: Dict[str, Any], extra: List[int], grace: float) -> None:
        end = time.monotonic() + grace
        while time.monotonic() < end:
            if not any(_alive(p, starts.get(k)) for k, p in pids.items()) and not any(_alive(p, None) for p in extra):
                return
            time.sleep(0.05)

    # ------------------------------------------------------------------ context manager

    def __enter__(self) -> SlurmSandbox:
        return self.up()

    def __exit__(self, *exc: Any) -> None:
        self.down()

    def __repr__(self) -> str:
        return f"SlurmSandbox(root={str(self.root)!r}, nodes={self.num_nodes}, id={self.id!r})"
