"""The sandbox's network: a bridge, one network namespace per node and one for the controller, a
free ``10.A.B.0/24`` subnet and free TCP ports, and the private UTS and mount namespaces that give
each daemon its hostname and the sandbox's ``/etc/hosts``.

Side effects: ``ip link`` / ``ip netns`` (root: CAP_NET_ADMIN, CAP_SYS_ADMIN). Every bridge and
namespace is recorded in the state file as soon as it exists, so ``down`` removes exactly what was
made, also after a partial start. No NAT, no default route: traffic stays on the bridge and in the
namespaces.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import os
import random
import re
import shlex
from typing import List, Optional, Sequence, Tuple

from slurm_ddp.errors import SandboxUnavailable
from slurm_ddp.rendezvous import port_is_free

from .layout import _CONTROLLER_HOST, SandboxLayout
from .procs import _executable, _sh

_PORT_RANGE = (20000, 32000)  # below Linux's default ephemeral range (32768-60999)


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


class SandboxNetwork(SandboxLayout):
    """The bridge, the namespaces, the subnet and the ports of a sandbox."""

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

    def _allocate_addresses(self) -> None:
        """Free TCP ports for slurmctld and every slurmd (and the accounting daemons), and a free subnet."""
        taken: set = set()
        ctl_port, *node_ports = _free_ports(1 + self.num_nodes, taken)
        self._state["ports"] = {"slurmctld": ctl_port, **{n: p for n, p in zip(self.node_names, node_ports)}}
        if self.accounting:
            mysql_port, dbd_port = _free_ports(2, taken)
            self._state["ports"].update(mysql=mysql_port, slurmdbd=dbd_port)
        self._state["subnet"] = self._pick_subnet()
        self._save_state()

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

    def _remove_network(self, netns: List[str]) -> None:
        """Delete the namespaces ``netns`` and the bridge, if this sandbox made it."""
        for ns in netns:
            _sh("ip", "netns", "del", ns, check=False)
        net = self._state.get("network", {})
        if net.get("bridge_created"):  # only a bridge this sandbox made
            _sh("ip", "link", "del", net.get("bridge", self.bridge), check=False)

    def _netns_pids(self, namespaces: List[str]) -> List[int]:
        """PIDs of every process in the network namespaces ``namespaces`` (this process left out)."""
        found: List[int] = []
        for ns in namespaces:
            res = _sh("ip", "netns", "pids", ns, check=False)
            found += [int(p) for p in res.stdout.split() if p.isdigit()]
        return [p for p in found if p != os.getpid()]

    def _isolated(
        self, hostname: str, argv: List[str], binds: Sequence[Tuple[str, str]] = (), cpu: Optional[int] = None
    ) -> List[str]:
        """argv run with its own hostname and the sandbox's /etc/hosts (private UTS + mount namespaces).

        ``binds``: more (source, target) bind mounts made in that mount namespace before argv starts (a
        production node's cgroup subtrees). ``cpu``: make the namespaces on this CPU (``taskset``), then give
        argv every CPU this process may use again (``job_container.ns_cpu`` says why).
        unshare, taskset and sh exec in place, so the PID Popen returns is the daemon's own PID.
        """
        script = 'echo "$1" > /proc/sys/kernel/hostname && mount --bind "$2" /etc/hosts && '
        script += "".join(f"mount --bind {shlex.quote(src)} {shlex.quote(dst)} && " for src, dst in binds)
        prefix: List[str] = []
        if cpu is not None:
            cpus = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
            prefix = [_executable("taskset"), "-c", str(cpu)]
            script += f"taskset -pc {cpus} $$ >/dev/null && "
        script += 'shift 2 && exec "$@"'
        return [
            *prefix, _executable("unshare"), "--uts", "--mount", "--propagation", "private",
            "/bin/sh", "-c", script, "sh", hostname, str(self.root / "etc" / "hosts"), *argv,
        ]  # fmt: skip
