"""SLURM variables → the distributed environment of one rank. Pure: takes a ``Mapping``.

``DistEnv.from_slurm(os.environ)`` gives RANK, LOCAL_RANK, WORLD_SIZE, NODE_RANK,
LOCAL_WORLD_SIZE and MASTER_ADDR/PORT from what ``srun`` sets for each task (srun(1),
"OUTPUT ENVIRONMENT VARIABLES"): ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
``SLURM_NTASKS``, ``SLURM_NNODES``, ``SLURM_JOB_NODELIST``, ``SLURM_TASKS_PER_NODE``,
``SLURM_JOB_ID``. Nothing here writes ``os.environ``; ``DistEnv.torch_env()`` returns
the variables PyTorch's ``env://`` rendezvous reads, for the caller to apply.
"""

from __future__ import annotations

import configparser
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

from .errors import EnvironmentMismatch, UserError

if TYPE_CHECKING:
    from .config import JobConfig

#: Range MASTER_PORT falls back to when the batch script did not export one:
#: ``PORT_BASE + job_id % PORT_SPAN`` (the convention Lightning's SLURMEnvironment uses:
#: every rank computes the same port without talking). Below the Linux ephemeral range
#: (32768-60999, /proc/sys/net/ipv4/ip_local_port_range) so it rarely collides with
#: client sockets.
PORT_BASE = 15000
PORT_SPAN = 15000


#: Characters that are set operators or group names in ClusterShell's nodeset syntax
#: (``a!b``, ``a&b``, ``a^b``, ``@group``, ``a*``) but never part of a SLURM hostlist
#: (slurm.conf(5), NodeName): refused, so ``expand_nodelist`` reads exactly SLURM's syntax.
_NOT_SLURM_HOSTLIST = frozenset("!&^@*")


def _nodeset() -> Any:
    """ClusterShell's ``NodeSet`` module (untyped: ``Any``), imported on first use.

    Its import reads ClusterShell's ``defaults.conf`` (``/etc/clustershell``, ``~/.config``,
    ``$CLUSTERSHELL_CFGDIR``) and fails on a malformed one: that is one ``UserError`` line
    here, when a nodelist is read, not an import error of every command.
    """
    try:
        from ClusterShell import NodeSet
    except ImportError as e:
        raise UserError(f"cannot import ClusterShell ({e}): pip install 'ClusterShell>=1.9'") from None
    except (configparser.Error, ValueError) as e:  # a broken defaults.conf, read at import
        text = " ".join(str(e).split())
        raise UserError(
            f"cannot load ClusterShell's nodeset library: {type(e).__name__}: {text} "
            "(a ClusterShell config file, e.g. /etc/clustershell/defaults.conf, is malformed)"
        ) from None
    return NodeSet


def _top_level_elements(nodelist: str) -> List[str]:
    """Split ``"a[1-2],b3"`` at the commas outside brackets: ``["a[1-2]", "b3"]``."""
    elements: List[str] = []
    depth = start = 0
    for i, ch in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            elements.append(nodelist[start:i])
            start = i + 1
    elements.append(nodelist[start:])
    return elements


def expand_nodelist(nodelist: str) -> List[str]:
    """Expand a SLURM hostlist (``"gpu-[001-004]"``, ``"a[1-2],b3"``) into host names, in order.

    The syntax is SLURM's (``scontrol show hostnames``; slurm.conf(5) NodeName): ranges,
    zero padding (``n[08-10]``), several bracket groups (``rack[1-2]-n[1-2]``). Each bracket
    element is expanded by ClusterShell's ``NodeSet`` (LGPL-2.1+, with group resolution off,
    so no groups.conf is read and no group command runs); the comma-separated elements keep
    their order (the first host is rank 0's, ``SLURM_JOB_NODELIST``), a repeated host counts
    once. Raises ``UserError`` naming the list for a malformed or empty one.
    """
    if not nodelist.strip():
        raise UserError(f"empty SLURM nodelist {nodelist!r}")
    bad = sorted(_NOT_SLURM_HOSTLIST.intersection(nodelist))
    if bad:
        raise UserError(f"bad SLURM nodelist {nodelist!r}: {''.join(bad)!r} is not hostlist syntax")
    ns = _nodeset()
    hosts: List[str] = []
    seen = set()
    for element in _top_level_elements(nodelist):
        if not element.strip():
            raise UserError(f"bad SLURM nodelist {nodelist!r}: an empty element between commas")
        try:
            expanded = list(ns.NodeSet(element, resolver=ns.RESOLVER_NOGROUP))
        except ns.NodeSetParseError as e:
            raise UserError(f"bad SLURM nodelist {nodelist!r}: {e}") from None
        hosts += [h for h in expanded if h not in seen]
        seen.update(expanded)
    return hosts


def fold_nodelist(hosts: List[str]) -> str:
    """The SLURM hostlist of ``hosts`` (``["n1", "n2", "n3"]`` → ``"n[1-3]"``), in their order.

    Folded by ClusterShell's ``NodeSet`` when that keeps the order (it sorts); otherwise the
    names joined by commas, so ``expand_nodelist(fold_nodelist(h)) == h`` for distinct names.
    """
    ns = _nodeset()
    try:
        folded = str(ns.NodeSet.fromlist(hosts, resolver=ns.RESOLVER_NOGROUP))
        if expand_nodelist(folded) == list(hosts):
            return folded
    except (ns.NodeSetParseError, UserError):
        pass
    return ",".join(hosts)


def expand_tasks_per_node(spec: str) -> List[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"`` → ``[2, 2, 2, 1]``), one count per node.

    The format is srun(1)'s (OUTPUT ENVIRONMENT VARIABLES, ``SLURM_TASKS_PER_NODE``): comma-
    separated counts, ``N(xK)`` for K nodes of N tasks. Raises ``UserError`` for another text.
    """
    counts: List[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise UserError(f"bad SLURM_TASKS_PER_NODE {spec!r}: expected e.g. '2(x3),1'")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def container_step_env(environ: Mapping[str, str], hostname: str) -> Dict[str, str]:
    """The task variables Slurm's OCI support leaves out, for a task inside an ``srun --container`` step.

    Slurm 22.05 runs such a step's command as PID 1 of the container with the job's environment and
    ``SLURM_CONTAINER`` but without ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NODEID`` and
    ``SLURMD_NODENAME``, and only one task per node (seen with runc; the project's SLURM-FACTS notes).
    With one task per node the task's rank is its node's place in ``SLURM_STEP_NODELIST`` (srun(1):
    nodes are numbered in the list's order), found by ``hostname`` (the container shares the node's
    UTS namespace). Returns the missing variables (empty outside such a step, or when Slurm set
    them). Raises ``UserError`` when the step has more than one task on a node or ``hostname`` is
    not in its node list (the bundle has a UTS namespace of its own).
    """
    if not environ.get("SLURM_CONTAINER") or environ.get("SLURM_PROCID") not in (None, ""):
        return {}
    per_node = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE") or "1"
    if any(n != 1 for n in expand_tasks_per_node(per_node)):
        raise UserError(
            f"this srun --container step runs {per_node} tasks per node (SLURM_STEP_TASKS_PER_NODE), but inside "
            "Slurm's OCI containers a task cannot tell its rank (no SLURM_PROCID); run one task per node "
            "(slurm.launcher: torchrun)"
        )
    nodes = expand_nodelist(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or "")
    short = hostname.split(".")[0]
    if short not in nodes:
        raise UserError(
            f"inside the srun --container step the host name is {hostname!r}, which is not one of the step's nodes "
            f"({','.join(nodes) or 'none'}): the task cannot tell its rank; remove the uts namespace (and "
            "'hostname') from the OCI bundle's config.json"
        )
    i = str(nodes.index(short))
    return {"SLURM_PROCID": i, "SLURM_LOCALID": "0", "SLURM_NODEID": i, "SLURMD_NODENAME": short}


def fallback_port(job_id: str) -> int:
    """Deterministic port from the job id: ``PORT_BASE + int(job_id) % PORT_SPAN``.

    Only used when the batch script exported no MASTER_PORT (e.g. a bare ``srun``).
    A non-numeric id hashes its digits to 0.
    """
    digits = re.sub(r"\D", "", job_id or "") or "0"
    return PORT_BASE + int(digits[-9:]) % PORT_SPAN


@dataclass(frozen=True)
class DistEnv:
    """Where one rank sits in the job. Every rank computes the same values for shared fields."""

    rank: int  #: global rank, 0 … world_size-1 (SLURM_PROCID)
    local_rank: int  #: rank on this node, 0 … local_world_size-1 (SLURM_LOCALID)
    world_size: int  #: number of ranks in the job (SLURM_NTASKS)
    node_rank: int  #: index of this node in the allocation (SLURM_NODEID)
    num_nodes: int  #: nodes in the allocation (SLURM_NNODES)
    local_world_size: int  #: ranks on this node (from SLURM_TASKS_PER_NODE)
    master_addr: str  #: host of rank 0: the first host of SLURM_JOB_NODELIST, unless MASTER_ADDR is set
    master_port: int  #: rendezvous port: MASTER_PORT if set, else fallback_port(job id)
    job_id: str  #: SLURM_JOB_ID (with SLURM_ARRAY_JOB_ID_TASK when an array task)
    hostname: str  #: this node's name (SLURMD_NODENAME), "" when unknown
    restart_count: int  #: SLURM_RESTART_COUNT: how often the job was requeued
    #: what started this process: ``srun`` (one Slurm task per rank) or ``torchrun`` (one torchrun
    #: agent per node, see ``from_environ``)
    launcher: str = "srun"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> DistEnv:
        """This rank's environment under either launcher (``slurm.launcher``).

        Under torchrun (``TORCHELASTIC_RUN_ID`` is set) the rank comes from the variables torchrun
        gives each worker (PyTorch docs, "torchrun (Elastic Launch)", Environment Variables):
        ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node),
        ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``; the job id, host name and restart count
        still come from SLURM's variables of the node's task. Otherwise :meth:`from_slurm`.
        Raises ``UserError`` naming a missing or malformed variable.
        """
        if not environ.get("TORCHELASTIC_RUN_ID"):
            return cls.from_slurm(environ)

        def need_int(name: str) -> int:
            value = environ.get(name, "")
            try:
                return int(value)
            except ValueError:
                raise UserError(
                    f"{name}={value!r} is not an integer: torchrun sets it for every worker "
                    "(TORCHELASTIC_RUN_ID is set, so this process claims to be one)"
                ) from None

        world_size, local_world_size = need_int("WORLD_SIZE"), need_int("LOCAL_WORLD_SIZE")
        groups = environ.get("GROUP_WORLD_SIZE")
        job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or environ["TORCHELASTIC_RUN_ID"]
        port_text = environ.get("MASTER_PORT")
        env = cls(
            rank=need_int("RANK"),
            local_rank=need_int("LOCAL_RANK"),
            world_size=world_size,
            node_rank=need_int("GROUP_RANK"),
            num_nodes=need_int("GROUP_WORLD_SIZE") if groups else max(1, world_size // max(local_world_size, 1)),
            local_world_size=local_world_size,
            master_addr=environ.get("MASTER_ADDR") or "127.0.0.1",
            master_port=need_int("MASTER_PORT") if port_text else fallback_port(job_id),
            job_id=job_id,
            hostname=environ.get("SLURMD_NODENAME", ""),
            restart_count=int(environ.get("SLURM_RESTART_COUNT") or "0")
            if (environ.get("SLURM_RESTART_COUNT") or "0").isdigit()
            else 0,
            launcher="torchrun",
        )
        env._check_ranges()
        return env

    @classmethod
    def from_slurm(cls, environ: Mapping[str, str]) -> DistEnv:
        """Derive the rank's environment from SLURM's task variables.

        Raises ``UserError`` naming the missing variable when this is not a SLURM task
        (run under ``srun`` or the local backend).
        """

        def need(name: str) -> str:
            if name not in environ or environ[name] == "":
                raise UserError(
                    f"{name} is not set: this process is not a SLURM task; start it with srun "
                    "(the rendered sbatch script does) or `slurm-ddp submit --backend local`"
                )
            return environ[name]

        def as_int(name: str, value: str) -> int:
            try:
                return int(value)
            except ValueError:
                raise UserError(f"{name}={value!r} is not an integer") from None

        rank = as_int("SLURM_PROCID", need("SLURM_PROCID"))
        local_rank = as_int("SLURM_LOCALID", need("SLURM_LOCALID"))
        world_size = as_int("SLURM_NTASKS", need("SLURM_NTASKS"))
        node_rank = as_int("SLURM_NODEID", environ.get("SLURM_NODEID", "0"))
        nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
        hosts = expand_nodelist(nodelist) if nodelist else []
        num_nodes = as_int(
            "SLURM_NNODES", environ.get("SLURM_NNODES") or environ.get("SLURM_JOB_NUM_NODES") or str(len(hosts) or 1)
        )
        # Inside a step, the step's layout wins over the allocation's (srun(1) sets both).
        tpn = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
        if tpn:
            per_node = expand_tasks_per_node(tpn)
            local_world_size = per_node[node_rank] if node_rank < len(per_node) else per_node[-1]
        else:
            local_world_size = world_size // max(num_nodes, 1)
        job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or "0"
        master_addr = environ.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1")
        port_text = environ.get("MASTER_PORT")
        master_port = as_int("MASTER_PORT", port_text) if port_text else fallback_port(job_id)
        env = cls(
            rank=rank,
            local_rank=local_rank,
            world_size=world_size,
            node_rank=node_rank,
            num_nodes=num_nodes,
            local_world_size=local_world_size,
            master_addr=master_addr,
            master_port=master_port,
            job_id=job_id,
            hostname=environ.get("SLURMD_NODENAME", ""),
            restart_count=as_int("SLURM_RESTART_COUNT", environ.get("SLURM_RESTART_COUNT") or "0"),
        )
        env._check_ranges()
        return env

    def _check_ranges(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise UserError(f"SLURM_PROCID={self.rank} is outside 0..SLURM_NTASKS-1={self.world_size - 1}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise UserError(
                f"SLURM_LOCALID={self.local_rank} is outside 0..{self.local_world_size - 1} (tasks on this node)"
            )
        if not 1 <= self.master_port <= 65535:
            raise UserError(f"MASTER_PORT={self.master_port} is not a TCP port (1..65535)")

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that logs, saves and requeues."""
        return self.rank == 0

    def torch_env(self) -> Dict[str, str]:
        """The variables ``torch.distributed``'s ``env://`` init and torchrun-style code read."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def validate_against(self, cfg: JobConfig) -> None:
        """Check the allocation against the config's ``slurm.nodes`` (down to ``recovery.min_nodes`` when
        in-job recovery is on) and ``slurm.tasks_per_node``.

        Raises ``EnvironmentMismatch`` that gives both values and a hint.
        """
        s = cfg.slurm
        # in-job recovery (recovery.min_nodes) may continue a run on fewer nodes than slurm.nodes
        if not cfg.recovery_min_nodes <= self.num_nodes <= s.max_nodes:
            raise EnvironmentMismatch(
                f"SLURM_NNODES={self.num_nodes} does not match slurm.nodes={s.nodes}. HINT: the job was "
                "started with a different --nodes than the config; submit with `slurm-ddp submit` or "
                f"run srun with --nodes={s.nodes}"
            )
        expected = self.num_nodes * s.tasks_per_node  # a node range: the count this job got
        if self.local_world_size != s.tasks_per_node or self.world_size != expected:
            raise EnvironmentMismatch(
                f"SLURM gave {self.local_world_size} tasks on this node and {self.world_size} in all, but the "
                f"config asks slurm.tasks_per_node={s.tasks_per_node} × {self.num_nodes} node(s) = {expected}. "
                f"HINT: launch with srun --ntasks-per-node={s.tasks_per_node}, or change slurm.tasks_per_node"
            )


def synthetic_slurm_env(
    *,
    rank: int,
    nodes: int,
    tasks_per_node: int,
    job_id: str = "1",
    nodelist: Optional[str] = None,
    cpus_per_task: int = 1,
    restart_count: int = 0,
    node_names: Optional[List[str]] = None,
) -> Dict[str, str]:
    """The task variables srun would give global ``rank`` under block distribution.

    Used by the local backend and ``env --explain``; srun(1) "OUTPUT ENVIRONMENT VARIABLES".
    Raises ``ValueError`` when ``rank`` is outside the job or the node names are fewer than ``nodes``.
    """
    world = nodes * tasks_per_node
    names = node_names or (expand_nodelist(nodelist) if nodelist else [f"node{i}" for i in range(nodes)])
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a job of {nodes} node(s) x {tasks_per_node} task(s)")
    if len(names) < nodes:
        raise ValueError(f"{len(names)} node name(s) for {nodes} node(s): {', '.join(names) or '(none)'}")
    node_rank = rank // tasks_per_node
    return {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % tasks_per_node),
        "SLURM_NODEID": str(node_rank),
        "SLURM_NTASKS": str(world),
        "SLURM_NPROCS": str(world),
        "SLURM_NNODES": str(nodes),
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_TASKS_PER_NODE": f"{tasks_per_node}(x{nodes})" if nodes > 1 else str(tasks_per_node),
        "SLURM_NTASKS_PER_NODE": str(tasks_per_node),
        "SLURM_JOB_NODELIST": nodelist or fold_nodelist(names),
        "SLURM_NODELIST": nodelist or fold_nodelist(names),
        "SLURMD_NODENAME": names[node_rank],
        "SLURM_CPUS_PER_TASK": str(cpus_per_task),
        "SLURM_RESTART_COUNT": str(restart_count),
    }
