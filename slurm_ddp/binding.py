"""CPU, NUMA, OpenMP and allocator binding of one rank: planned purely, applied at the edge.

``plan_binding()`` is pure: from explicit inputs (the config's ``environment`` section, the
rank's slot on its node, ``cpus_per_task``, the CPUs the process may use, the NUMA topology,
the task's environment, the located libraries) it returns a :class:`BindingPlan` — the CPU
set of the rank, its NUMA node(s), the variables to set, the libraries to preload and a
command prefix (``numactl`` in ``numa`` mode). ``plan_for_task()`` takes the slot from the
SLURM task variables. Nothing here changes the process.

The readers (``read_numa_nodes``, ``read_core_ids``, ``read_gpu_numa_nodes``,
``ldconfig_cache``) read ``/sys`` or run ``ldconfig -p`` and are the only functions with
inputs from the machine; the caller passes what they return into the planner.
Applying the plan (``sched_setaffinity``, the environment, ``exec``) is
``slurm_ddp.launch``: ``LD_PRELOAD`` must be in place before the interpreter starts, so it
cannot be set from inside the worker. Imports no torch.

Conventions and sources:

- CPU lists use the Linux "cpulist" format (``0-3,8,10-11``; cpuset(7), "FORMATS").
- ``SLURM_CPU_BIND`` is the task's value of ``srun --cpu-bind`` (srun(1), "--cpu-bind" and
  "OUTPUT ENVIRONMENT VARIABLES"): ``[quiet|verbose,]TYPE[:LIST]``.
- ``OMP_NUM_THREADS``, ``OMP_PROC_BIND``, ``OMP_PLACES``, ``OMP_SCHEDULE``: OpenMP API
  specification 5.2, chapter 21 "Environment Variables" (``{c}:n`` is a place interval:
  ``n`` places of one CPU from CPU ``c``).
- ``KMP_AFFINITY``, ``KMP_BLOCKTIME``: Intel OpenMP runtime ("Thread Affinity Interface",
  "Supported Environment Variables" of the Intel C++ compiler / oneAPI documentation).
  KMP_AFFINITY takes precedence over OMP_PROC_BIND/OMP_PLACES in libiomp5 (and warns when
  both are set), so with ``openmp: intel`` only the KMP_ variables bind threads.
- The values follow PyTorch's CPU performance tuning guide: OMP_NUM_THREADS = the task's
  physical CPUs, ``OMP_SCHEDULE=STATIC``, ``OMP_PROC_BIND=CLOSE``, ``KMP_BLOCKTIME=1``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from .errors import BindingError

if TYPE_CHECKING:
    from .config import JobConfig

#: Variables that belong to the plan; a value the user already set is kept unless
#: ``environment.override_env`` is true.
PLAN_VARS = ("OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "OMP_SCHEDULE", "KMP_AFFINITY", "KMP_BLOCKTIME")

#: Where the launch wrapper records what it applied (one line, for the logs and ``slurm-ddp env``).
APPLIED_VAR = "SLURM_DDP_BINDING"


# --------------------------------------------------------------------------- cpu lists


def parse_cpulist(text: str) -> FrozenSet[int]:
    """``"0-3,8,10-11"`` → ``{0, 1, 2, 3, 8, 10, 11}`` (Linux cpulist format, cpuset(7)).

    Also accepts ``a-b:stride`` ranges. Raises ``ValueError`` for anything else.
    """
    cpus: Set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not m:
            raise ValueError(f"bad CPU list {text!r}: expected e.g. 0-3,8,10-11")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise ValueError(f"bad CPU list {text!r}: range {part!r} is empty")
        cpus.update(range(lo, hi + 1, step))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 8}`` → ``"0-3,8"`` (sorted; Linux cpulist format). Empty → ``""``."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in _runs(sorted(set(cpus))))


def omp_places(cpus: Sequence[int]) -> str:
    """OMP_PLACES with one place per CPU, in the given order, runs written as intervals.

    ``[0, 1, 2, 3, 8]`` → ``"{0}:4,{8}"`` (OpenMP 5.2 §21.1.6: ``{0}:4`` = ``{0},{1},{2},{3}``).
    """
    parts = []
    i = 0
    cpus = list(cpus)
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        n = j - i + 1
        parts.append(f"{{{cpus[i]}}}" + (f":{n}" if n > 1 else ""))
        i = j + 1
    return ",".join(parts)


def _runs(sorted_cpus: List[int]) -> List[Tuple[int, int]]:
    runs: List[Tuple[int, int]] = []
    for c in sorted_cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return runs


# --------------------------------------------------------------------------- SLURM_CPU_BIND


#: srun --cpu-bind types that bind each task to a subset of the node (srun(1)).
_SLURM_BINDING_TYPES = (
    "cores",
    "threads",
    "sockets",
    "ldoms",
    "rank",
    "rank_ldom",
    "boards",
    "map_cpu",
    "mask_cpu",
    "map_ldom",
    "mask_ldom",
)


def parse_slurm_cpu_bind(value: str) -> Tuple[str, Tuple[FrozenSet[int], ...]]:
    """``SLURM_CPU_BIND`` → ``(type, per-task CPU sets)``.

    ``"quiet,mask_cpu:0x3,0xC"`` → ``("mask_cpu", ({0, 1}, {2, 3}))``;
    ``"verbose,map_cpu:0,4"`` → ``("map_cpu", ({0}, {4}))``; ``"quiet,cores"`` → ``("cores", ())``;
    ``""`` or ``"none"`` → ``("none", ())``. Masks are hexadecimal, map entries CPU ids, and
    ``ITEM*N`` repeats an item N times (srun(1), ``--cpu-bind``). Raises ``ValueError`` for
    a list that cannot be read.
    """
    tokens = [t for t in (value or "").split(",") if t]
    kind = "none"
    items: List[str] = []
    seen_type = False
    for tok in tokens:
        if not seen_type:
            head = tok.split(":", 1)
            if head[0] in ("quiet", "verbose"):
                continue
            kind = head[0] or "none"
            seen_type = True
            if len(head) == 2 and head[1]:
                items.append(head[1])
        else:
            items.append(tok)
    if kind not in ("mask_cpu", "map_cpu"):
        return kind, ()
    sets: List[FrozenSet[int]] = []
    for item in items:
        text, _, times = item.partition("*")
        count = int(times) if times else 1
        if kind == "mask_cpu":
            mask = int(text, 16)
            cpus = frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)
        else:
            cpus = frozenset([int(text, 0)])
        sets.extend([cpus] * count)
    return kind, tuple(sets)


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

    def summary(self) -> str:
        """One line: ``cpus=0-3 numa=0 threads=4 bind=cores`` (what the wrapper records in APPLIED_VAR)."""
        threads = self.env.get("OMP_NUM_THREADS") or self.kept.get("OMP_NUM_THREADS") or str(self.threads)
        return (
            f"cpus={format_cpulist(self.cpus)} numa={','.join(map(str, self.numa_nodes)) or '?'} "
            f"threads={threads} bind={self.mode}"
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
    from .env import DistEnv

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


# --------------------------------------------------------------------------- libraries


@dataclass(frozen=True)
class LibrarySpec:
    """A preloadable library: its file names (preferred first) and who ships it."""

    sonames: Tuple[str, ...]
    install: str  #: how to install it, naming the Debian and RPM packages


LIBRARIES: Mapping[str, LibrarySpec] = {
    "jemalloc": LibrarySpec(
        ("libjemalloc.so.2", "libjemalloc.so"),
        "Debian/Ubuntu: apt-get install libjemalloc2; RHEL/Fedora: dnf install jemalloc (EPEL); "
        "conda: conda install jemalloc",
    ),
    "tcmalloc": LibrarySpec(
        ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"),
        "Debian/Ubuntu: apt-get install libtcmalloc-minimal4; RHEL/Fedora: dnf install gperftools-libs; "
        "conda: conda install gperftools",
    ),
    "iomp5": LibrarySpec(
        ("libiomp5.so",),
        "pip install intel-openmp (into the ranks' environment; it lands in <prefix>/lib) or "
        "conda install intel-openmp; Debian/Ubuntu non-free: apt-get install libiomp5",
    ),
}


def missing_library_message(kind: str) -> str:
    """The one-line error for a library that ``locate_library`` could not find."""
    spec = LIBRARIES[kind]
    what = {
        "jemalloc": "environment.allocator=jemalloc",
        "tcmalloc": "environment.allocator=tcmalloc",
        "iomp5": "environment.openmp=intel",
    }[kind]
    return (
        f"{what} needs {spec.sonames[0]}, which is not installed on {os.uname().nodename} "
        f"(looked in `ldconfig -p` and the usual library directories). Install it — {spec.install} — "
        f"or set {what.split('=')[0]} back to {'gnu' if kind == 'iomp5' else 'system'}"
    )


def default_library_dirs(environ: Mapping[str, str], prefix: str = sys.prefix) -> List[str]:
    """Directories searched after ``ldconfig -p``, in order: LD_LIBRARY_PATH, the Python
    prefix's and conda's ``lib`` (pip's intel-openmp installs there), the Debian multiarch
    and RPM ``lib64`` directories, ``/usr/local/lib``, oneAPI's compiler directory."""
    import sysconfig

    arch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [os.path.join(prefix, "lib")]
    if environ.get("CONDA_PREFIX"):
        dirs.append(os.path.join(environ["CONDA_PREFIX"], "lib"))
    dirs += [
        f"/usr/lib/{arch}",
        f"/lib/{arch}",
        "/usr/lib64",
        "/lib64",
        "/usr/local/lib",
        "/usr/lib",
        "/lib",
        "/opt/intel/oneapi/compiler/latest/lib",
    ]
    return list(dict.fromkeys(dirs))


def locate_library(
    kind: str,
    *,
    ldconfig_text: str = "",
    search_dirs: Sequence[str] = (),
    exists: Callable[[str], bool] = os.path.isfile,
) -> str:
    """Absolute path of the ``kind`` library (``jemalloc``, ``tcmalloc`` or ``iomp5``).

    Looks first in ``ldconfig_text`` (the output of ``ldconfig -p``: lines
    ``\\tNAME (FLAGS) => PATH``; on a 64-bit Python, entries whose FLAGS name a 64-bit ABI
    are preferred), then for each file name in ``search_dirs``. Raises ``BindingError``
    naming the Debian and RPM packages when nothing is found.
    """
    spec = LIBRARIES[kind]
    entries: Dict[str, List[Tuple[str, str]]] = {}
    for line in ldconfig_text.splitlines():
        m = re.match(r"\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)", line)
        if m:
            entries.setdefault(m.group(1), []).append((m.group(2), m.group(3)))
    want64 = sys.maxsize > 2**32
    for name in spec.sonames:
        found = entries.get(name, [])
        found = sorted(found, key=lambda e: ("64" in e[0]) != want64)
        for _, path in found:
            if exists(path):
                return path
    for name in spec.sonames:
        for d in search_dirs:
            path = os.path.join(d, name)
            if exists(path):
                return path
    raise BindingError(missing_library_message(kind))


def ldconfig_cache(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> str:
    """Output of ``ldconfig -p`` (the dynamic linker's cache), or "" when ldconfig is missing.

    ldconfig lives in /sbin, which is not on an ordinary user's PATH on Debian.
    """
    import shutil

    exe = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if exe is None:
        return ""
    try:
        return run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout or ""
    except (OSError, subprocess.SubprocessError):
        return ""


def locate_libraries(kinds: Sequence[str], environ: Mapping[str, str]) -> Dict[str, str]:
    """``{kind: path}`` for each kind, with ``ldconfig -p`` run once. Raises ``BindingError``."""
    if not kinds:
        return {}
    text = ldconfig_cache()
    dirs = default_library_dirs(environ)
    return {k: locate_library(k, ldconfig_text=text, search_dirs=dirs) for k in kinds}


# --------------------------------------------------------------------------- readers of /sys


def read_numa_nodes(root: str = "/sys/devices/system/node") -> Dict[int, FrozenSet[int]]:
    """``{node: CPU ids}`` from ``ROOT/nodeN/cpulist``; ``{}`` when the kernel shows no NUMA
    information (then the planner treats the machine as one node). Nodes without CPUs are left out."""
    out: Dict[int, FrozenSet[int]] = {}
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        m = re.fullmatch(r"node(\d+)", name)
        if not m:
            continue
        try:
            cpus = parse_cpulist(Path(root, name, "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:
            out[int(m.group(1))] = cpus
    return out


def read_core_ids(cpus: Iterable[int], root: str = "/sys/devices/system/cpu") -> Dict[int, int]:
    """``{cpu: core}``, the core being the smallest CPU id among the CPU's hyperthread
    siblings (``cpuN/topology/thread_siblings_list``). CPUs without that file are their own core."""
    out: Dict[int, int] = {}
    for c in cpus:
        try:
            out[c] = min(parse_cpulist(Path(root, f"cpu{c}", "topology", "thread_siblings_list").read_text()))
        except (OSError, ValueError):
            out[c] = c
    return out


#: PCI vendor ids of GPUs whose CUDA/ROCm index follows PCI bus order: NVIDIA, AMD.
_GPU_VENDORS = ("0x10de", "0x1002")


def read_gpu_numa_nodes(environ: Mapping[str, str], root: str = "/sys/bus/pci/devices") -> List[int]:
    """NUMA node of each GPU this task sees, in device-index order (-1 = unknown).

    GPUs are the PCI display/3D controllers (class 0x03xxxx) of NVIDIA and AMD in bus order
    (CUDA's order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; the usual one on servers), filtered
    by ``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` when those hold integer indices.
    """
    gpus: List[int] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return gpus
    for name in names:
        d = Path(root, name)
        try:
            if not d.joinpath("class").read_text().strip().startswith("0x03"):
                continue
            if d.joinpath("vendor").read_text().strip() not in _GPU_VENDORS:
                continue
            node = int(d.joinpath("numa_node").read_text().strip())
        except (OSError, ValueError):
            continue
        gpus.append(node)
    visible = environ.get("CUDA_VISIBLE_DEVICES") or environ.get("ROCR_VISIBLE_DEVICES")
    if visible:
        try:
            idx = [int(v) for v in visible.split(",") if v.strip()]
        except ValueError:  # GPU UUIDs: the order cannot be matched to PCI devices here
            return [-1] * len(visible.split(","))
        gpus = [gpus[i] if 0 <= i < len(gpus) else -1 for i in idx]
    return gpus
