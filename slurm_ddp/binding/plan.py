"""The binding plan of one rank (:func:`plan_binding`, :func:`plan_for_task`): its CPU set, NUMA node(s),
OpenMP/KMP variables, libraries to preload and command prefix. Part of :mod:`slurm_ddp.binding` (its
docstring gives the conventions and sources). Pure: the machine's facts come in as arguments.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import (
    TYPE_CHECKING,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from ..errors import BindingError
from .cpulist import _SLURM_BINDING_TYPES, format_cpulist, omp_places, parse_slurm_cpu_bind
from .machine import missing_library_message

if TYPE_CHECKING:
    from ..config import JobConfig


#: Variables that belong to the plan; a value the user already set is kept unless
#: ``environment.override_env`` is true.
PLAN_VARS = ("OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "OMP_SCHEDULE", "KMP_AFFINITY", "KMP_BLOCKTIME")

#: Where the rank wrapper records what it applied (one line, for the logs and ``slurm-ddp env``).
APPLIED_VAR = "SLURM_DDP_BINDING"


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class BindingPlan:
    """What one rank gets. Apply with ``slurm_ddp.launch`` (affinity, environment, exec)."""

    slot: int  #: index of this rank among the tasks sharing the node's CPUs (SLURM_LOCALID)
    slots: int  #: tasks sharing the node's CPUs (local world size; all ranks for the local backend)
    mode: str  #: environment.cpu_bind: none | cores | numa
    cpus: Tuple[int, ...]  #: the rank's CPUs (ids, in placement order); OpenMP threads go here
    affinity: Optional[Tuple[int, ...]]  #: CPUs the process is pinned to; None = left as it is
    numa_nodes: Tuple[int, ...]  #: NUMA node(s) of the rank's CPUs (or of its GPU)
    threads: int  #: planned OMP_NUM_THREADS (the rank's CPUs, not the node's)
    env: Mapping[str, str]  #: variables to set (user-set ones are left out unless override_env)
    kept: Mapping[str, str]  #: user-set variables the plan would have set, kept as the user set them
    preload: Tuple[str, ...]  #: libraries added to LD_PRELOAD (absolute paths)
    prefix: Tuple[str, ...]  #: command prefix, e.g. ("/usr/bin/numactl", "--cpunodebind=0", "--membind=0")
    source: str  #: how the CPU set was chosen, in words
    notes: Tuple[str, ...] = ()  #: warnings (oversubscription, a GPU's NUMA node ignored, …)

    def command(self, argv: Sequence[str]) -> List[str]:
        """``argv`` with the plan's prefix (``numactl …`` in numa mode) in front."""
        return [*self.prefix, *argv]

    def environ(self, base: Mapping[str, str]) -> Dict[str, str]:
        """``base`` with the plan's variables (and ``LD_PRELOAD``) applied."""
        out = dict(base)
        out.update(self.env)
        return out

    @property
    def effective_threads(self) -> str:
        """The rank's OMP_NUM_THREADS as it will be: the plan's, or the user's value it keeps."""
        return self.env.get("OMP_NUM_THREADS") or self.kept.get("OMP_NUM_THREADS") or str(self.threads)

    def summary(self) -> str:
        """One line: ``cpus=0-3 numa=0 threads=4 bind=cores`` (what the wrapper records in APPLIED_VAR)."""
        return (
            f"cpus={format_cpulist(self.cpus)} numa={','.join(map(str, self.numa_nodes)) or '?'} "
            f"threads={self.effective_threads} bind={self.mode}"
        )


def _node_of(numa: Mapping[int, FrozenSet[int]]) -> Dict[int, int]:
    return {c: n for n, cpus in numa.items() for c in cpus}


def _take(pool: Sequence[int], slots: int, slot: int, per_slot: int) -> Tuple[Tuple[int, ...], str]:
    """Rank ``slot``'s block of ``pool`` (already in placement order), and a note when short."""
    m = len(pool)
    if m >= slots * per_slot:
        return tuple(pool[slot * per_slot : (slot + 1) * per_slot]), ""
    if m >= slots:  # fewer CPUs than asked: blocks that differ by at most one CPU
        lo, hi = slot * m // slots, (slot + 1) * m // slots
        return tuple(pool[lo:hi]), (
            f"{m} CPUs for {slots} tasks × {per_slot} CPUs: each task gets "
            f"{m // slots}{'-' + str(-(-m // slots)) if m % slots else ''}"
        )
    return (pool[slot % m],), f"oversubscribed: {slots} tasks share {m} CPUs (one CPU each, reused)"


@dataclass(frozen=True)
class CpuChoice:
    """Which CPUs one rank gets on its node, and why (``choose_cpus``)."""

    cpus: Tuple[int, ...]  #: the rank's CPUs (ids, in placement order)
    numa_nodes: Tuple[int, ...]  #: NUMA node(s) of those CPUs (or of the rank's GPU)
    numa_cpus: Tuple[int, ...]  #: the allowed CPUs of those NUMA node(s), sorted (what ``numa`` mode pins to)
    source: str  #: how the CPUs were chosen, in words
    notes: Tuple[str, ...] = ()  #: warnings (oversubscription, a GPU's NUMA node ignored, …)


def _topology(numa: Optional[Mapping[int, Iterable[int]]], allowed: FrozenSet[int]) -> Dict[int, FrozenSet[int]]:
    """``{node: cpus}`` from ``numa``; allowed CPUs it does not list (or all, without it) count as node 0."""
    topo: Dict[int, FrozenSet[int]] = {int(n): frozenset(c) for n, c in (numa or {}).items() if c}
    if not topo or not allowed <= frozenset().union(*topo.values()):
        # No /sys topology, or CPUs it does not list: what is not listed counts as node 0.
        listed = frozenset().union(*topo.values()) if topo else frozenset()
        topo.setdefault(0, frozenset())
        topo[0] = topo[0] | (allowed - listed)
    return topo


def choose_cpus(
    *,
    slot: int,
    slots: int,
    cpus_per_task: int,
    allowed: Iterable[int],
    numa: Optional[Mapping[int, Iterable[int]]] = None,
    core_ids: Optional[Mapping[int, int]] = None,
    slurm_cpu_bind: str = "",
    gpu_numa_nodes: Optional[Sequence[int]] = None,
    shared_pool: bool = False,
) -> CpuChoice:
    """The CPUs of the rank in ``slot`` (0 … ``slots``-1) on its node, and why. Pure.

    The inputs are ``plan_binding``'s of the same names. The rank's CPUs, in this order of
    precedence:
      1. ``srun --cpu-bind=mask_cpu:…|map_cpu:…``: the task's entry of the list (srun reuses
         the list cyclically), within ``allowed``.
      2. Slurm already bound the task (``SLURM_CPU_BIND`` names a binding type, or the
         affinity holds no more than ``cpus_per_task`` CPUs while several tasks share the
         node): ``allowed`` is its share; it is kept.
      3. With a GPU per slot and its NUMA node known: the CPUs of that node, divided among
         the slots whose GPU sits on the same node.
      4. Otherwise ``allowed`` is the node's pool, ordered by (NUMA node, core, CPU id) so a
         block keeps hyperthread siblings together and stays in one NUMA node where it can.
         With more CPUs than ``slots × cpus_per_task`` the slots are spread over the NUMA
         nodes (when each node keeps ``cpus_per_task`` CPUs for each of its slots), then
         packed; with exactly enough, slot k gets CPUs [k·c, (k+1)·c) of the pool (srun's
         block distribution); with fewer, blocks that differ by at most one CPU; with fewer
         CPUs than slots, one CPU each, reused (a note says so).

    Raises ``ValueError`` for an impossible slot, ``BindingError`` when no CPU is allowed.
    """
    if not 0 <= slot < slots:
        raise ValueError(f"slot {slot} is outside 0..{slots - 1}")
    cpus_per_task = max(1, int(cpus_per_task))
    allowed_set = frozenset(allowed)
    if not allowed_set:
        raise BindingError("this process may run on no CPU (empty affinity); check the job's cpuset")
    topo = _topology(numa, allowed_set)
    node_of = _node_of(topo)
    cores = core_ids or {}

    def order(cpus: Iterable[int]) -> List[int]:
        return sorted(cpus, key=lambda c: (node_of.get(c, 0), cores.get(c, c), c))

    notes: List[str] = []
    pool = order(allowed_set)
    kind: str = "none"
    masks: Tuple[FrozenSet[int], ...] = ()
    try:
        kind, masks = parse_slurm_cpu_bind(slurm_cpu_bind)
    except ValueError:
        notes.append(f"SLURM_CPU_BIND={slurm_cpu_bind!r} could not be read; ignored")
    gpu_node: Optional[int] = None
    if masks and masks[slot % len(masks)] & allowed_set:
        share = tuple(order(masks[slot % len(masks)] & allowed_set))
        source = f"srun --cpu-bind={kind}: entry {slot % len(masks)} of the task list"
    elif not shared_pool and (
        (kind in _SLURM_BINDING_TYPES and not masks) or (slots > 1 and len(pool) <= cpus_per_task)
    ):
        share = tuple(pool)
        source = "kept: Slurm already bound this task to its CPUs" + (f" (--cpu-bind={kind})" if kind != "none" else "")
    else:
        share, source = (), ""
        if gpu_numa_nodes is not None:
            known = len(gpu_numa_nodes) >= slots and all(
                n in topo and topo[n] & allowed_set for n in gpu_numa_nodes[:slots]
            )
            if known:
                gpu_node = int(gpu_numa_nodes[slot])
                peers = [s for s in range(slots) if gpu_numa_nodes[s] == gpu_node]
                sub = order(topo[gpu_node] & allowed_set)
                share, note = _take(sub, len(peers), peers.index(slot), cpus_per_task)
                source = f"NUMA node {gpu_node} of this task's GPU: {len(sub)} CPUs divided among {len(peers)} task(s)"
                if note:
                    notes.append(note)
            else:
                notes.append(
                    "GPU NUMA nodes unknown (no /sys information for every task's GPU); CPUs divided without them"
                )
        if not share:
            nodes_in_pool = sorted({node_of.get(c, 0) for c in pool})
            m = len(pool)
            # Spread: slot k goes to the NUMA node under the middle of its even block of the
            # pool — when every node then still has cpus_per_task CPUs for each of its slots.
            mid = [node_of.get(pool[((2 * s + 1) * m) // (2 * slots)], 0) for s in range(slots)]
            fits = all(mid.count(n) * cpus_per_task <= sum(1 for c in pool if node_of.get(c, 0) == n) for n in set(mid))
            if m > slots * cpus_per_task and len(nodes_in_pool) > 1 and fits:
                node = mid[slot]
                peers = [s for s in range(slots) if mid[s] == node]
                sub = [c for c in pool if node_of.get(c, 0) == node]
                share, note = _take(sub, len(peers), peers.index(slot), cpus_per_task)
                source = (
                    f"{m} allowed CPUs in NUMA nodes {','.join(map(str, nodes_in_pool))} for {slots} "
                    f"task(s) × {cpus_per_task}: spread over the nodes, this task in node {node}"
                )
            else:
                share, note = _take(pool, slots, slot, cpus_per_task)
                source = f"{m} allowed CPUs divided among {slots} task(s) × {cpus_per_task} CPUs (block)"
            if note:
                notes.append(note)

    numa_nodes = (gpu_node,) if gpu_node is not None else tuple(sorted({node_of.get(c, 0) for c in share}))
    numa_cpus = tuple(sorted(frozenset().union(*(topo[n] for n in numa_nodes)) & allowed_set))
    return CpuChoice(cpus=share, numa_nodes=numa_nodes, numa_cpus=numa_cpus, source=source, notes=tuple(notes))


@dataclass(frozen=True)
class EnvironmentPlan:
    """What one rank's process gets besides its CPUs (``plan_environment``)."""

    env: Mapping[str, str]  #: variables to set (user-set ones are left out unless override_env)
    kept: Mapping[str, str]  #: user-set variables the plan would have set, kept as the user set them
    preload: Tuple[str, ...]  #: libraries added to LD_PRELOAD (absolute paths)
    prefix: Tuple[str, ...]  #: command prefix, e.g. ("/usr/bin/numactl", "--cpunodebind=0", "--membind=0")
    notes: Tuple[str, ...] = ()  #: warnings (OpenMP threads left unpinned)


def plan_environment(
    *,
    cpus: Sequence[int],
    numa_nodes: Sequence[int],
    cpu_bind: str = "none",
    openmp: str = "gnu",
    allocator: str = "system",
    override_env: bool = False,
    environ: Optional[Mapping[str, str]] = None,
    libraries: Optional[Mapping[str, str]] = None,
    numactl: Optional[str] = None,
    pin_threads: bool = True,
) -> EnvironmentPlan:
    """The OMP_*/KMP_* variables, LD_PRELOAD and ``numactl`` prefix of a rank on ``cpus``. Pure.

    ``numa_nodes``: the NUMA node(s) of ``cpus`` (``numactl --cpunodebind/--membind`` in
    ``numa`` mode); the other inputs are ``plan_binding``'s of the same names.
    OMP_NUM_THREADS is ``len(cpus)``. ``cores`` and ``numa`` also pin the OpenMP threads one
    per CPU (``OMP_PROC_BIND=close`` + ``OMP_PLACES``, or ``KMP_AFFINITY=…explicit,
    proclist=[…]``; ``OMP_PROC_BIND=false`` / ``KMP_AFFINITY=disabled`` without
    ``pin_threads``) and set ``OMP_SCHEDULE=STATIC``; ``openmp: intel`` sets
    ``KMP_BLOCKTIME=1`` and preloads libiomp5, ``allocator`` preloads jemalloc or tcmalloc.
    A variable the user set is kept (and listed in ``kept``) unless ``override_env``;
    LD_PRELOAD is merged, never replaced: the user's entries stay first (first wins symbol
    lookup), or last with ``override_env``.

    Raises ``BindingError`` when a library is missing from ``libraries`` (naming the
    package that provides it) or ``numa`` mode has no ``numactl``.
    """
    environ = environ or {}
    libraries = libraries or {}
    notes: List[str] = []
    want: Dict[str, str] = {"OMP_NUM_THREADS": str(len(cpus))}
    if cpu_bind != "none":
        want["OMP_SCHEDULE"] = "STATIC"
        if not pin_threads:
            want["KMP_AFFINITY" if openmp == "intel" else "OMP_PROC_BIND"] = (
                "disabled" if openmp == "intel" else "false"
            )
            notes.append(
                "OpenMP threads not pinned (DataLoader workers in use: a worker would inherit the "
                "main thread's single pinned CPU); they float within the task's CPUs"
            )
        elif openmp == "gnu":
            want["OMP_PROC_BIND"] = "close"
            want["OMP_PLACES"] = omp_places(cpus)
        else:
            want["KMP_AFFINITY"] = f"granularity=fine,explicit,proclist=[{','.join(map(str, cpus))}]"
    if openmp == "intel":
        want["KMP_BLOCKTIME"] = "1"
    env: Dict[str, str] = {}
    kept: Dict[str, str] = {}
    for key, value in want.items():
        if key in environ and not override_env:
            kept[key] = environ[key]
        else:
            env[key] = value

    needed = (["iomp5"] if openmp == "intel" else []) + ([allocator] if allocator != "system" else [])
    preload: List[str] = []
    for lib in needed:
        path = libraries.get(lib)
        if not path:
            raise BindingError(missing_library_message(lib))
        preload.append(path)
    if preload:
        user = [p for p in re.split(r"[:\s]+", environ.get("LD_PRELOAD", "")) if p]
        ours = [p for p in preload if p not in user]
        merged = (ours + [p for p in user if p not in preload]) if override_env else (user + ours)
        env["LD_PRELOAD"] = ":".join(merged)

    prefix: Tuple[str, ...] = ()
    if cpu_bind == "numa":
        if not numactl:
            raise BindingError(
                "environment.cpu_bind=numa needs numactl, which is not on PATH here: install it "
                "(Debian/Ubuntu: apt-get install numactl; RHEL/Fedora/SUSE: the 'numactl' RPM) or use cpu_bind: cores"
            )
        nodes = ",".join(map(str, numa_nodes))
        prefix = (numactl, f"--cpunodebind={nodes}", f"--membind={nodes}")
    return EnvironmentPlan(env=env, kept=kept, preload=tuple(preload), prefix=prefix, notes=tuple(notes))


def plan_binding(
    *,
    cpu_bind: str = "none",
    openmp: str = "gnu",
    allocator: str = "system",
    override_env: bool = False,
    slot: int,
    slots: int,
    cpus_per_task: int,
    allowed: Iterable[int],
    numa: Optional[Mapping[int, Iterable[int]]] = None,
    core_ids: Optional[Mapping[int, int]] = None,
    slurm_cpu_bind: str = "",
    gpu_numa_nodes: Optional[Sequence[int]] = None,
    environ: Optional[Mapping[str, str]] = None,
    libraries: Optional[Mapping[str, str]] = None,
    numactl: Optional[str] = None,
    shared_pool: bool = False,
    pin_threads: bool = True,
) -> BindingPlan:
    """Plan the binding of the rank in ``slot`` (0 … ``slots``-1) on its node. Pure.

    Inputs:
      ``cpu_bind``/``openmp``/``allocator``/``override_env``: the config's ``environment`` keys.
      ``slots``: tasks sharing this node's CPUs; ``cpus_per_task``: CPUs each asked for
      (SLURM_CPUS_PER_TASK). ``allowed``: CPU ids this process may use
      (``os.sched_getaffinity(0)``, which the task's cgroup cpuset bounds). ``numa``:
      ``{node: cpu ids}`` (``read_numa_nodes()``; None or empty = one node). ``core_ids``:
      ``{cpu: core}`` (``read_core_ids()``; hyperthread siblings share a core).
      ``slurm_cpu_bind``: the task's SLURM_CPU_BIND. ``gpu_numa_nodes``: NUMA node of the
      GPU of each slot (index = slot; -1 = unknown), or None for a CPU job.
      ``environ``: the task's environment (user-set variables). ``libraries``:
      ``{"jemalloc"|"tcmalloc"|"iomp5": path}`` as ``locate_library`` found them.
      ``numactl``: path of numactl, or None when it is not installed. ``shared_pool``:
      ``allowed`` is known to be the pool of all slots (the local backend), never a share
      Slurm already bound. ``pin_threads``: pin each OpenMP thread to one of the rank's
      CPUs (see below); ``plan_for_task`` turns it off when DataLoader workers are used.

    The rank's CPUs are ``choose_cpus``'s (which says in what order of precedence).
    OMP_NUM_THREADS is the number of the rank's CPUs (the task's, not the node's).
    ``cores`` pins the process to those CPUs; ``numa`` pins it to its NUMA node(s) and binds
    memory there with ``numactl --cpunodebind=N --membind=N``; both also pin the OpenMP
    threads one per CPU of the rank (``OMP_PROC_BIND=close`` + ``OMP_PLACES``, or
    ``KMP_AFFINITY=…explicit,proclist=[…]``) and set ``OMP_SCHEDULE=STATIC``. Thread pinning
    binds the *initial* thread too (libgomp and libiomp5 do so when the runtime loads), and
    every thread or process it starts later inherits that one CPU — DataLoader workers
    included; so with ``pin_threads=False`` the threads float within the process's CPUs
    instead (``OMP_PROC_BIND=false`` / ``KMP_AFFINITY=disabled``). ``none`` pins nothing and
    sets only OMP_NUM_THREADS (plus KMP_BLOCKTIME with ``openmp: intel``). The variables,
    LD_PRELOAD and the numactl prefix are ``plan_environment``'s.

    A variable the user set is kept (and listed in ``kept``) unless ``override_env``;
    LD_PRELOAD is merged, never replaced: the user's entries stay first (first wins symbol
    lookup), or last with ``override_env``.

    Raises ``BindingError`` when ``numa`` mode finds no numactl, a library the config asks
    for is missing from ``libraries`` (naming the package that provides it), or no CPU is
    allowed. Raises ``ValueError`` for an impossible slot or a bad mode.
    """
    if (
        cpu_bind not in ("none", "cores", "numa")
        or openmp not in ("gnu", "intel")
        or allocator not in ("system", "jemalloc", "tcmalloc")
    ):
        raise ValueError(f"bad binding mode cpu_bind={cpu_bind!r} openmp={openmp!r} allocator={allocator!r}")
    choice = choose_cpus(
        slot=slot,
        slots=slots,
        cpus_per_task=cpus_per_task,
        allowed=allowed,
        numa=numa,
        core_ids=core_ids,
        slurm_cpu_bind=slurm_cpu_bind,
        gpu_numa_nodes=gpu_numa_nodes,
        shared_pool=shared_pool,
    )
    if cpu_bind == "cores":
        affinity: Optional[Tuple[int, ...]] = tuple(sorted(choice.cpus))
    elif cpu_bind == "numa":
        affinity = choice.numa_cpus
    else:
        affinity = None
    envplan = plan_environment(
        cpus=choice.cpus,
        numa_nodes=choice.numa_nodes,
        cpu_bind=cpu_bind,
        openmp=openmp,
        allocator=allocator,
        override_env=override_env,
        environ=environ,
        libraries=libraries,
        numactl=numactl,
        pin_threads=pin_threads,
    )
    return BindingPlan(
        slot=slot,
        slots=slots,
        mode=cpu_bind,
        cpus=choice.cpus,
        affinity=affinity,
        numa_nodes=choice.numa_nodes,
        threads=len(choice.cpus),
        env=envplan.env,
        kept=envplan.kept,
        preload=envplan.preload,
        prefix=envplan.prefix,
        source=choice.source,
        notes=choice.notes + envplan.notes,
    )


def plan_for_task(
    cfg: JobConfig,
    environ: Mapping[str, str],
    *,
    allowed: Iterable[int],
    numa: Optional[Mapping[int, Iterable[int]]] = None,
    core_ids: Optional[Mapping[int, int]] = None,
    gpu_numa_nodes: Optional[Sequence[int]] = None,
    libraries: Optional[Mapping[str, str]] = None,
    numactl: Optional[str] = None,
) -> BindingPlan:
    """``plan_binding`` for the SLURM task described by ``environ`` under the job config ``cfg``.

    The slot is SLURM_LOCALID among the node's tasks (``DistEnv.from_environ``); under the
    local backend (``SLURM_DDP_BACKEND=local``) the "nodes" share this machine, so the slot
    is the global rank among all ranks and GPUs are not used for placement. Under torchrun
    (``slurm.launcher: torchrun``) the Slurm task is the node's torchrun agent: the slot is
    torchrun's LOCAL_RANK among LOCAL_WORLD_SIZE workers sharing the agent's CPUs (its affinity
    and SLURM_CPU_BIND describe the whole node task, so Slurm's binding is not the rank's), and
    ``cpus_per_task`` is ``slurm.cpus_per_task``. Otherwise
    ``cpus_per_task`` is SLURM_CPUS_PER_TASK, else ``slurm.cpus_per_task``. OpenMP threads
    are pinned only when ``train.num_workers`` is 0 (see ``plan_binding``). Raises
    ``UserError`` when ``environ`` is not a SLURM task, ``BindingError`` as ``plan_binding``.
    """
    from ..env import DistEnv

    denv = DistEnv.from_environ(environ)
    local = environ.get("SLURM_DDP_BACKEND") == "local"
    torchrun = denv.launcher == "torchrun"
    slot, slots = (denv.rank, denv.world_size) if local else (denv.local_rank, denv.local_world_size)
    text = environ.get("SLURM_CPUS_PER_TASK", "")
    cpt = int(text) if text.isdigit() and int(text) > 0 and not torchrun else cfg.slurm.cpus_per_task
    e = cfg.environment
    return plan_binding(
        cpu_bind=e.cpu_bind,
        openmp=e.openmp,
        allocator=e.allocator,
        override_env=e.override_env,
        slot=slot,
        slots=slots,
        cpus_per_task=cpt,
        allowed=allowed,
        numa=numa,
        core_ids=core_ids,
        slurm_cpu_bind="" if local or torchrun else environ.get("SLURM_CPU_BIND", ""),
        gpu_numa_nodes=None if local or not cfg.slurm.gpu_job else gpu_numa_nodes,
        environ=environ,
        libraries=libraries,
        numactl=numactl,
        shared_pool=local or torchrun,
        pin_threads=cfg.train.num_workers == 0,
    )


def needed_libraries(cfg: JobConfig) -> List[str]:
    """Library kinds the config's ``environment`` asks to preload: ``iomp5``, ``jemalloc``, ``tcmalloc``."""
    e = cfg.environment
    return (["iomp5"] if e.openmp == "intel" else []) + ([e.allocator] if e.allocator != "system" else [])
