"""The sandbox's settings, names, addresses, paths and state file (``SandboxLayout``), shared by its parts.

No side effects apart from writing the state file (``sandbox.json``, ``_save_state``) and ``run``
(a Slurm client command against the sandbox). Names and addresses follow the layout in
``slurm_ddp.sandbox``'s docstring: bridge ``sdbID``, namespaces ``sdID-NODE``, subnet
``10.A.B.0/24`` with node ``nI`` at ``.I``, this machine at ``.253`` and the controller at ``.254``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from slurm_ddp.errors import SandboxUnavailable
from slurm_ddp.slurmversion import SlurmVersion, slurm_version

#: Name of the state file inside the sandbox root.
STATE_FILE = "sandbox.json"
#: ``SlurmdTimeout`` must be at least this many times ``MessageTimeout``. slurmctld (``ping_nodes``) pings
#: only the nodes whose last answer is older than ``SlurmdTimeout/3``, starts no new round before the last
#: one ended, and sets DOWN ("not responding") a node whose last answer was older than ``SlurmdTimeout`` when
#: the previous round started. A round that includes a lost node lasts up to ~2 x ``MessageTimeout`` (3-4 s
#: seen at 2 s: the refused connection is retried), so a healthy node skipped in one round and pinged in the
#: next can look silent for ``SlurmdTimeout/3`` + such a round: set DOWN when that round lasts more than
#: 2/3 of ``SlurmdTimeout``. Seen with Slurm 24.11.5 (healthy nodes set DOWN with or right after the lost
#: one, and at once back in service; a job on them NODE_FAILed, a ``--no-kill`` job lost its batch host):
#: at 4 s / 3 s in 1 of 3 idle tries, at 6 s / 2 s in 1 of 10 tries with the CPUs busy; none at 10 s / 2 s
#: (6 busy tries; the lost node DOWN after 8.5-17.6 s).
MIN_SLURMD_PER_MESSAGE_TIMEOUT = 5


def check_timeouts(slurmd_timeout_s: int, message_timeout_s: int, kill_wait_s: int = 0) -> None:
    """Check a sandbox's Slurm timeouts (seconds; slurm.conf(5) ``SlurmdTimeout``, ``MessageTimeout``,
    ``KillWait``). Raises ValueError, one line saying which and how to fix it: out of range (2, 1, 0 ..65533),
    or ``slurmd_timeout_s`` under ``MIN_SLURMD_PER_MESSAGE_TIMEOUT`` x ``message_timeout_s``."""
    for key, value, low in (
        ("slurmd_timeout_s", slurmd_timeout_s, 2),
        ("message_timeout_s", message_timeout_s, 1),
        ("kill_wait_s", kill_wait_s, 0),
    ):
        if not low <= int(value) <= 65533:
            raise ValueError(f"{key} must be {low}..65533 seconds, got {value}")
    if int(slurmd_timeout_s) < MIN_SLURMD_PER_MESSAGE_TIMEOUT * int(message_timeout_s):
        raise ValueError(
            f"slurmd_timeout_s ({slurmd_timeout_s}) must be at least {MIN_SLURMD_PER_MESSAGE_TIMEOUT} x "
            f"message_timeout_s ({message_timeout_s}): with less, Slurm 24.11 sets healthy nodes DOWN while it "
            "still pings a lost one (e.g. slurmd_timeout_s=10, message_timeout_s=2)"
        )


#: The sandbox's configuration profiles (``SlurmSandbox(profile=...)``): ``basic`` (jobs as root,
#: ``proctrack/linuxproc``, ``task/none``, CPUs only) and ``production`` (cgroup plugins with per-node cgroup
#: subtrees, memory as a consumable resource, ``PrologFlags=Contain``, ``job_container/tmpfs``, ``SlurmUser=slurm``:
#: ``conf``).
PROFILES = ("basic", "production")
#: ``DefMemPerCPU`` (MB) of the production profile: the memory a job gets per allocated CPU when it asks for
#: none (``--mem``/``--mem-per-cpu``); each node's ``RealMemory`` is this times its CPUs.
DEF_MEM_PER_CPU_MB = 1000
#: ``SlurmUser`` of the production profile.
SLURM_USER = "slurm"

_CONTROLLER_HOST = "ctl"
_SHORT_BASE = "/tmp"  # sockets: keep paths far below the 108-byte limit
#: The production profile's jobs have a private /tmp (``job_container/tmpfs``): its sockets live here instead.
_SHORT_BASE_PRIVATE_TMP = "/run"
#: What ``job_container/tmpfs`` makes private to each job (Slurm 22.05: always both): a job of the production
#: profile sees nothing of the host's below them.
PRIVATE_DIRS = (Path("/tmp"), Path("/dev/shm"))


class SandboxLayout:
    """A sandbox's settings (``SlurmSandbox``'s arguments, checked) and the names derived from them."""

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
        oci: bool = False,
        slurm_conf_extra: Sequence[str] = (),
        profile: str = "basic",
    ) -> None:
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
        if not 1 <= int(nodes) <= 200:
            raise ValueError(f"nodes must be 1..200, got {nodes}")
        if int(cpus_per_node) < 1:
            raise ValueError(f"cpus_per_node must be >= 1, got {cpus_per_node}")
        if not 0 <= int(gpus_per_node) <= 64:
            raise ValueError(f"gpus_per_node must be 0..64, got {gpus_per_node}")
        check_timeouts(slurmd_timeout_s, message_timeout_s, kill_wait_s)
        self.slurmd_timeout_s = int(slurmd_timeout_s)
        self.message_timeout_s = int(message_timeout_s)
        self.kill_wait_s = int(kill_wait_s)
        self.root = Path(root).absolute()
        if profile == "production" and any(
            self.root.resolve().is_relative_to(d) for d in PRIVATE_DIRS
        ):  # its jobs would not see the sandbox's slurm.conf
            raise ValueError(
                f"the production profile gives every job a private /tmp and /dev/shm (job_container/tmpfs): put the "
                f"sandbox root outside them, not {self.root} (e.g. under /var/tmp)"
            )
        self.num_nodes = int(nodes)
        self.cpus_per_node = int(cpus_per_node)
        self.gpus_per_node = int(gpus_per_node)
        self.accounting = bool(accounting)
        self.oci = bool(oci)
        for line in slurm_conf_extra:
            if "\n" in line or not re.fullmatch(r"[A-Za-z]\w*=\S.*", line):
                raise ValueError(f"slurm_conf_extra: expected slurm.conf lines KEY=VALUE, got {line!r}")
        #: slurm.conf(5) lines written after the sandbox's own, e.g. ``MaxArraySize=4`` (a key it does not set itself)
        self.slurm_conf_extra = tuple(slurm_conf_extra)
        self.profile = profile
        self.id = self._make_id(name)
        self.real_memory_mb = DEF_MEM_PER_CPU_MB * self.cpus_per_node if self.production else 1000
        self._state: Dict[str, Any] = {}
        self._procs: Dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------ naming

    @property
    def slurm_user(self) -> str:
        """slurm.conf's ``SlurmUser``, whom slurmctld (and slurmdbd) run as: ``slurm`` in the production profile
        (Debian's packages make that user), else ``root``."""
        return SLURM_USER if self.production else "root"

    def slurm_user_ids(self) -> Tuple[int, int]:
        """(uid, gid) of :attr:`slurm_user`. Raises ``SandboxUnavailable`` naming the fix when there is no such user."""
        try:
            pw = pwd.getpwnam(self.slurm_user)
        except KeyError:
            raise SandboxUnavailable(
                f"no user {self.slurm_user!r} (SlurmUser of the production profile): install Debian's slurmctld "
                f"package, which makes it, or: useradd --system --no-create-home {self.slurm_user}"
            ) from None
        return pw.pw_uid, pw.pw_gid

    @property
    def production(self) -> bool:
        """Whether this sandbox runs the ``production`` profile (see ``PROFILES``)."""
        return self.profile == "production"

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
        return Path(self._state.get("short_dir") or f"{self._short_base}/sdsb-{self.id}")

    @property
    def _short_base(self) -> str:
        return _SHORT_BASE_PRIVATE_TMP if self.production else _SHORT_BASE

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def job_container_dir(self) -> Path:
        """``job_container/tmpfs``'s ``BasePath`` of each node is ``<this>/<node>`` (production profile)."""
        return self.root / "jc"

    @property
    def gpu_dir(self) -> Path:
        """Where the placeholder GPU devices live (``nvidia0`` …)."""
        return self.root / "dev"

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

    def slurm_version(self) -> SlurmVersion:
        """The version of the Slurm the sandbox runs (``slurm_ddp.slurmversion``, through :meth:`run`)."""
        return slurm_version(run=self.run)

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
            oci=self.oci,
            slurm_conf_extra=list(self.slurm_conf_extra),
            profile=self.profile,
            root=str(self.root),
            slurm_conf=str(self.slurm_conf),
        )
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=2, sort_keys=True))
        os.replace(tmp, self.state_path)
