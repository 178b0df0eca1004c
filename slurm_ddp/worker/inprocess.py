"""In-process recovery (``recovery.in_process``): on a lost node the surviving ranks keep their processes, and
a warm spare takes the lost node's ranks.

The batch script starts one ``srun --no-kill`` step on every node of the allocation: the training nodes
(``STEP_NODES_VAR``, batch host first) and the spares. A spare's ranks import torch, build the task (model,
optimizer, datasets) and wait to be called in. Every process of the step talks to one ``TCPStore``, served by
rank 0 (the batch host: the one node whose loss the job does not survive in-process; its loss ends the batch
script too) at ``MASTER_ADDR:MASTER_PORT``. Each training *generation* forms its process group through its
own prefix of that store (``g<N>/pg``), so a new group needs nothing from a lost node.

When a collective fails (a peer's socket closed, or ``train.pg_timeout_s`` passed), each survivor leaves the
broken group and checks in for the next generation with the last step it completed. Rank 0's process, the
coordinator (:meth:`Membership.coordinate`), waits until every member of the generation has checked in or
stopped beating (each process adds to its heartbeat counter every :data:`HEARTBEAT_S`; one that has not
moved for :data:`DEAD_AFTER_S` is lost), then publishes the next :class:`Plan` (:func:`next_plan`, pure):
the lost nodes' ranks go to spares, rank for rank (the world size kept: the run stays bitwise equal to an
uninterrupted one), or, with no spare left, the survivors renumber and continue down to ``min_nodes``
(resumed sample-exactly, ``slurm_ddp.resize``). Rank 0 (the batch host) broadcasts its
training state (model, optimizer, scheduler, data position, log window) over the new group; nothing is read
from disk. A crash (a rank's own exception, :meth:`Membership.report_crash`), a rank lost on a node whose
other ranks live, a lost batch host or ``recovery.max_restarts`` reached (one budget per job start, shared
with the in-job restarts and earlier steps: ``rundir.recovery.recoveries_left``) end the step as before (each rank's
peer-failure path: the emergency checkpoint, the peer-lost marker, the batch script's recovery rule).

Key names in the store (one owner, this module): ``hb/<slot>`` heartbeat counters, ``spare/<slot>`` a
ready spare, ``spare_failed/<slot>`` a spare that failed before it was called in (left out of every plan; a
spare's failure is never a ``crash``), ``g<N>/alive/<slot>`` a survivor's check-in (its completed step),
``g<N>/plan`` the plan (JSON), ``g<N>/joined/<slot>`` a member of plan N about to form its group, ``g<N>/go``
rank 0's answer to those (``go``, or why the generation is planned again: a member that stopped beating
before it joined), ``crash`` a training rank's crash, ``done`` the step ended (spares exit 0). A slot is
``NODE/LOCAL_RANK``.

A member of the old plan that was only slow (silent past ``recovery.heartbeat_timeout_s``, then alive again)
finds itself outside the new plan: it becomes a spare of the step (``spare/<slot>``) and waits to be called
in; it never exits with a failure (the in-process step runs without ``srun --kill-on-bad-exit``, so no single
task's exit ends it either: ``render.srun_flags``).

Sources: ``torch.distributed.TCPStore``/``PrefixStore`` and ``init_process_group(store=...)`` (PyTorch docs,
"Distributed communication package", Initialization); ``srun --no-kill`` keeps a step's tasks on the other
nodes running after one node fails (srun(1) ``-k``; seen with Slurm 22.05, docs/development.md).

Why over 600 lines: it is the whole membership protocol (heartbeats, the coordinator, the plan, the
generation's join) that every rank and spare runs against one store; its parts share the store's key layout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

if TYPE_CHECKING:
    from ..env import DistEnv

log = logging.getLogger("slurm_ddp.worker")

#: Seconds between two heartbeats of a process (one ``TCPStore.add`` on its own connection): the default of
#: ``recovery.heartbeat_interval_s``.
HEARTBEAT_S = 0.25
#: Seconds without a heartbeat after which a process that has not checked in counts as lost: the default of
#: ``recovery.heartbeat_timeout_s``. A process whose node was cut off stops beating at once; a live one beats
#: even while it waits in a collective, but a loaded node (GC, a page-cache flush, a stalled file system, CPU
#: starvation) can pause it for seconds. 5 s rides out the 3 s pause of issue 52's reproduction; a live rank
#: paused for longer is not lost either: it finds itself outside the new plan and waits as a spare
#: (``Membership.wait_for_call``), so a short timeout costs a node swap, never the job. NVIDIA's resiliency
#: extension (``nvidia_resiliency_ext.inprocess``) uses tens of seconds because a timeout there restarts every
#: rank; here it is also the floor of every recovery's time (a killed process is known lost only by its silence).
DEAD_AFTER_S = 5.0
#: Seconds between two looks at the store while waiting (the coordinator, a spare).
POLL_S = 0.05


def slot_name(node: str, local_rank: int) -> str:
    """The slot of a process: ``NODE/LOCAL_RANK``."""
    return f"{node}/{local_rank}"


def slot_node(slot: str) -> str:
    """The node of a slot (:func:`slot_name`)."""
    return slot.rsplit("/", 1)[0]


@dataclass(frozen=True)
class Plan:
    """One training generation: who trains, with which rank, and where the state comes from."""

    generation: int  #: 0 for the step's start, then one more per recovery
    nodes: Tuple[str, ...]  #: the training nodes in node-rank order (the batch host first)
    ranks: Dict[str, int] = field(hash=False)  #: slot → global rank
    source: int = 0  #: the rank (of this plan) whose state every rank loads; 0 at generation 0
    step: int = 0  #: the completed step the generation resumes at (generation 0: from the checkpoint)
    lost: Tuple[str, ...] = ()  #: the nodes lost since the previous generation
    spares_used: Tuple[str, ...] = ()  #: the spare nodes called in for them
    world_before: int = 0  #: the previous generation's world size (0 at generation 0)
    spares_failed: Tuple[str, ...] = ()  #: spare slots that failed before this plan (left out of it)
    replanned: str = ""  #: why the previous generation never trained (a member lost before it joined), or ''

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def to_json(self) -> str:
        return json.dumps(
            {
                "generation": self.generation,
                "nodes": list(self.nodes),
                "ranks": self.ranks,
                "source": self.source,
                "step": self.step,
                "lost": list(self.lost),
                "spares_used": list(self.spares_used),
                "world_before": self.world_before,
                "spares_failed": list(self.spares_failed),
                "replanned": self.replanned,
            }
        )

    @classmethod
    def from_json(cls, text: Union[str, bytes]) -> Plan:
        d = json.loads(text)
        return cls(
            generation=int(d["generation"]),
            nodes=tuple(d["nodes"]),
            ranks={str(k): int(v) for k, v in d["ranks"].items()},
            source=int(d["source"]),
            step=int(d["step"]),
            lost=tuple(d.get("lost") or ()),
            spares_used=tuple(d.get("spares_used") or ()),
            world_before=int(d.get("world_before") or 0),
            spares_failed=tuple(d.get("spares_failed") or ()),
            replanned=str(d.get("replanned") or ""),
        )


def first_plan(step_nodes: Sequence[str], tasks_per_node: int) -> Plan:
    """Generation 0: the training nodes in order, rank = node index × ``tasks_per_node`` + local rank (as
    ``srun`` numbers one step on those nodes). Pure."""
    ranks = {
        slot_name(n, lr): i * tasks_per_node + lr for i, n in enumerate(step_nodes) for lr in range(tasks_per_node)
    }
    return Plan(generation=0, nodes=tuple(step_nodes), ranks=ranks)


def next_plan(
    plan: Plan,
    alive: Mapping[str, int],
    spare_slots: Sequence[str],
    *,
    tasks_per_node: int,
    min_nodes: int,
    max_generations: int,
) -> Union[Plan, str]:
    """The generation after ``plan``, or why there is none (a string). Pure.

    ``alive``: the members of ``plan`` that checked in, slot → last completed step; the others are lost.
    ``spare_slots``: the ready, beating spares' slots, in the order to use them (a spare node counts only
    with all ``tasks_per_node`` slots). Each lost node, in node-rank order, is replaced by the next spare node,
    local rank for local rank with the lost ranks (world size kept); with no spare left the lost node is
    dropped and the survivors are renumbered in their order (node index × ``tasks_per_node`` + local rank).
    The state's source is rank 0 (the batch host, alive in every plan there is), at its completed step: its
    BatchNorm-style buffers are those DDP gave every rank, its log window the logged one. A survivor a step
    ahead of it (a collective that completed on some ranks only) is rolled back to that step (one step redone).

    No plan when: no member was lost (a collective failed with every rank alive: a timeout, not a lost node);
    a lost rank's node still has a live rank (a crash of one process, not a lost node); the batch host
    (``plan.nodes[0]``, rank 0's node) is lost; ``max_generations`` recoveries were done (what
    ``recovery.max_restarts`` left this step: ``rundir.recovery.recoveries_left``); fewer than
    ``min_nodes`` nodes would be left.
    """
    lost_slots = [s for s in plan.ranks if s not in alive]
    if not lost_slots:
        return "no rank was lost (every rank checked in): a failed collective, not a lost node"
    lost_nodes = [n for n in plan.nodes if any(slot_node(s) == n for s in lost_slots)]
    for n in lost_nodes:
        live_here = sorted(s for s in alive if slot_node(s) == n)
        if live_here:
            gone = sorted(s for s in lost_slots if slot_node(s) == n)
            return (
                f"{', '.join(gone)} ended while {', '.join(live_here)} on the same node lives: a crash, not a lost node"
            )
    if plan.nodes and plan.nodes[0] in lost_nodes:
        return f"the batch host {plan.nodes[0]} (rank 0) is lost"
    if plan.generation >= max_generations:
        return (
            f"recovery.max_restarts reached: the {max_generations} recoveries this job start had left for the step "
            "were done"
        )
    by_node: Dict[str, List[str]] = {}
    for s in spare_slots:
        by_node.setdefault(slot_node(s), []).append(s)
    spares = [n for n, slots in by_node.items() if len(set(slots)) == tasks_per_node and n not in plan.nodes]
    nodes: List[Optional[str]] = list(plan.nodes)
    used: List[str] = []
    replaced: Dict[str, str] = {}  # spare node → the lost node whose ranks it takes
    for n in lost_nodes:
        i = nodes.index(n)
        if spares:
            sp = spares.pop(0)
            nodes[i], replaced[sp] = sp, n
            used.append(sp)
        else:
            nodes[i] = None
    kept = [n for n in nodes if n is not None]
    if len(kept) < min_nodes:
        return f"{len(kept)} node(s) would be left, fewer than recovery.min_nodes={min_nodes} (no spare left)"
    shrink = len(kept) < len(plan.nodes)
    ranks: Dict[str, int] = {}
    for i, n in enumerate(kept):
        for lr in range(tasks_per_node):
            if shrink:
                ranks[slot_name(n, lr)] = i * tasks_per_node + lr
            else:  # the spare takes the lost node's ranks: the same data shards and random streams
                ranks[slot_name(n, lr)] = plan.ranks[slot_name(replaced.get(n, n), lr)]
    source_slot = min(alive, key=lambda s: plan.ranks[s])  # rank 0: its node is not lost, so it checked in
    step = alive[source_slot]
    return Plan(
        generation=plan.generation + 1,
        nodes=tuple(kept),
        ranks=ranks,
        source=ranks[source_slot],
        step=step,
        lost=tuple(lost_nodes),
        spares_used=tuple(used),
        world_before=plan.world_size,
    )


@dataclass(frozen=True)
class Place:
    """Where this process sits in an in-process recovery step (:func:`place_in_step`)."""

    node: str  #: this node (``SLURMD_NODENAME``)
    local_rank: int  #: ``SLURM_LOCALID``
    spare: bool  #: a warm spare: its node is not one of the training nodes
    step_nodes: Tuple[str, ...]  #: generation 0's training nodes, batch host first (``STEP_NODES_VAR``)
    spare_nodes: Tuple[str, ...]  #: the step's other nodes (``SLURM_STEP_NODELIST`` minus the training nodes)
    tasks_per_node: int

    @property
    def slot(self) -> str:
        return slot_name(self.node, self.local_rank)

    def spare_slots(self) -> List[str]:
        """Every spare slot of the step, spare node by spare node."""
        return [slot_name(n, lr) for n in self.spare_nodes for lr in range(self.tasks_per_node)]


def place_in_step(denv: DistEnv, environ: Mapping[str, str], tasks_per_node: int) -> Tuple[DistEnv, Place]:
    """This process's :class:`Place` in a step that runs on every node of the allocation, and its
    :class:`~slurm_ddp.env.DistEnv` for generation 0 (:func:`first_plan`: rank, world size, node rank and
    count of the training nodes; a spare gets rank -1 until it is called in). Pure. Raises ``UserError``
    when ``STEP_NODES_VAR`` or ``SLURMD_NODENAME`` is missing (the step was not started by the batch script
    of a ``recovery.in_process`` job)."""
    from dataclasses import replace

    from ..env import expand_nodelist
    from ..errors import UserError
    from ..rundir import STEP_NODES_VAR

    step_nodes = tuple(n for n in environ.get(STEP_NODES_VAR, "").split(",") if n)
    node = environ.get("SLURMD_NODENAME") or denv.hostname
    if not step_nodes:
        raise UserError(
            f"recovery.in_process: {STEP_NODES_VAR} is not set for this rank (the batch script of `slurm-ddp submit` "
            "sets it); submit the job with slurm-ddp submit"
        )
    if not node:
        inside = any(k in environ for k in ("APPTAINER_CONTAINER", "SINGULARITY_CONTAINER"))
        raise UserError(
            "recovery.in_process: SLURMD_NODENAME (set by Slurm for every task) did not reach this rank"
            + (
                " inside its container: a runtime started with a clean environment must pass it in "
                "(slurm-ddp passes it as APPTAINERENV_SLURMD_NODENAME for environment.container options -e/--cleanenv)"
                if inside
                else "; check that nothing between srun and the rank clears the environment (env -i, a wrapper)"
            )
        )
    nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST") or ""
    spare_nodes = tuple(n for n in (expand_nodelist(nodelist) if nodelist else []) if n not in step_nodes)
    place = Place(node, denv.local_rank, node not in step_nodes, step_nodes, spare_nodes, tasks_per_node)
    plan = first_plan(step_nodes, tasks_per_node)
    rank = -1 if place.spare else plan.ranks[place.slot]
    node_rank = -1 if place.spare else step_nodes.index(node)
    return (
        replace(denv, rank=rank, world_size=plan.world_size, node_rank=node_rank, num_nodes=len(step_nodes)),
        place,
    )


class RecoveryAbandoned(Exception):
    """The step cannot go on in-process: the message says why (the peer-failure path takes over)."""


def local_addresses(master_addr: str, master_port: int) -> List[str]:
    """This host's IPv4 addresses as its peers see it: the one its route to ``master_addr`` leaves from (a UDP
    ``connect`` sends nothing), and those its host name resolves to. Loopback addresses are left out."""
    import socket

    out: List[str] = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master_addr, master_port or 9))
            out.append(s.getsockname()[0])
    except OSError:
        pass
    try:
        out += socket.gethostbyname_ex(socket.gethostname())[2]
    except OSError:
        pass
    return [a for a in dict.fromkeys(out) if not a.startswith("127.")]


def cut_connections(peers: Sequence[str], keep_local_port: int = 0, keep_remote_port: int = 0) -> int:
    """Shut down (``shutdown(SHUT_RDWR)``) every TCP socket of this process whose peer address is one of
    ``peers``: a collective blocked on a silent node (no FIN, no RST: a power cut, a switch) then fails at once
    with gloo's "Connection closed", as when the node's processes die. Sockets whose local port is
    ``keep_local_port`` (the step's store, served by this process) are kept: a node that was only slow keeps
    its link to the store and can wait as a spare; so are those to ``keep_remote_port`` (the step's store,
    served by a peer) for a member that cuts its links to the store's host. Returns the sockets shut. Linux (``/proc/self/fd``); never
    raises."""
    import os
    import socket

    want, n = set(peers), 0
    if not want:
        return 0
    try:
        fds = [int(f) for f in os.listdir("/proc/self/fd")]
    except OSError:
        return 0
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            inet = s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6)
            peer = s.getpeername()
            if (
                inet
                and peer[0] in want
                and s.getsockname()[1] != keep_local_port
                and not (keep_remote_port and peer[1] == keep_remote_port)
            ):
                s.shutdown(socket.SHUT_RDWR)
                n += 1
        except OSError:
            pass
        finally:
            s.close()  # the duplicate only
    return n


def heartbeat_counts(store: Any, slots: Sequence[str], made: set, chunk: int = 64) -> Dict[str, int]:
    """The heartbeat counters of ``slots`` in few requests (a pass stays a few round trips at thousands of
    members): per ``chunk`` of slots one ``multi_get``, after a ``check`` when a slot of it is not yet in
    ``made`` (its key may not exist: ``multi_get`` would wait for it), and then ``add(key, 0)`` for each slot of
    a chunk with a missing key (a process that never beat). ``made`` is updated."""
    out: Dict[str, int] = {}
    for i in range(0, len(slots), chunk):
        part = list(slots[i : i + chunk])
        keys = [f"hb/{s}" for s in part]
        if any(s not in made for s in part) and not store.check(keys):
            for k in keys:
                store.add(k, 0)
        made.update(part)
        out.update(zip(part, (int(v) for v in store.multi_get(keys))))
    return out


def present_values(store: Any, keys: Sequence[str], chunk: int = 64) -> Dict[str, bytes]:
    """The values of those of ``keys`` that exist, in few requests: a ``check`` per ``chunk`` of keys and, when
    all of them exist, one ``multi_get``; a chunk with a missing key is looked at key by key."""
    out: Dict[str, bytes] = {}
    for i in range(0, len(keys), chunk):
        part = list(keys[i : i + chunk])
        if store.check(part):
            out.update(zip(part, store.multi_get(part)))
            continue
        for k in part:
            if store.check([k]):
                out[k] = store.get(k)
    return out


class Membership:
    """This process's link to the step's store: heartbeat, check-in, the coordinator's decision, the
    spare's wait. ``torch`` is imported here, not at module import (the plan logic above is pure).

    ``heartbeat_s``: seconds between two beats (``recovery.heartbeat_interval_s``); ``dead_after_s``: seconds
    of silence after which a member counts as lost (``recovery.heartbeat_timeout_s``); ``poll_s``: seconds
    between two looks at the store while waiting. ``timeout_s``: each store request's timeout."""

    def __init__(
        self,
        addr: str,
        port: int,
        slot: str,
        *,
        serve: bool,
        timeout_s: float,
        heartbeat_s: float = HEARTBEAT_S,
        dead_after_s: float = DEAD_AFTER_S,
        poll_s: float = POLL_S,
    ):
        import torch.distributed as dist

        self.slot, self.serve, self.timeout_s = slot, serve, timeout_s
        self.addr, self.port = addr, port
        self.heartbeat_s, self.dead_after_s, self.poll_s = heartbeat_s, dead_after_s, poll_s
        self.beat_errors = 0  #: heartbeats that failed (logged; the thread goes on)
        td = timedelta(seconds=timeout_s)
        # rank 0 serves the store for the life of its process; the others connect (retrying until timeout_s)
        self.store = dist.TCPStore(addr, port, is_master=serve, timeout=td, wait_for_workers=False)
        self._beat_store: Any = dist.TCPStore(addr, port, is_master=False, timeout=td)
        self._stop = threading.Event()
        # silent-node detection while a generation trains (``watch``): rank 0's monitor thread reads every
        # member's heartbeat; the others' heartbeat thread looks for its alarm
        self._lock = threading.Lock()
        self._watched: Optional[Plan] = None
        self._alarmed = -1  # the generation whose alarm this process acted on
        self.seen: Dict[str, Tuple[int, float]] = {}  #: the monitor's view: slot → (count, when it last moved)
        self.monitor_passes = 0  #: rank 0: the monitor's passes (one ``multi_get`` each)
        self._made: set = set()  # heartbeat keys known to exist (the main thread's connection)
        self._seen_generation = -1
        self.own_addresses = local_addresses(addr, port)
        try:
            self.store.set(f"addr/{slot}", ",".join(self.own_addresses))
        except Exception:
            pass
        self._beats = threading.Thread(target=self._beat, name="inprocess-heartbeat", daemon=True)
        self._beats.start()
        if serve:
            self._monitor_thread = threading.Thread(target=self._monitor, name="inprocess-monitor", daemon=True)
            self._monitor_thread.start()

    def _beat(self) -> None:
        """The heartbeat thread: one ``add`` per ``heartbeat_s``. A failed beat is logged (once per outage) and
        the connection made again; the thread ends only with :meth:`close`."""
        import torch.distributed as dist

        key = f"hb/{self.slot}"
        failing_since: Optional[float] = None
        while not self._stop.is_set():
            try:
                if self._beat_store is None:  # after a failure: a fresh connection
                    self._beat_store = dist.TCPStore(
                        self.addr, self.port, is_master=False, timeout=timedelta(seconds=max(self.dead_after_s, 1.0))
                    )
                self._beat_store.add(key, 1)
                watched = self._watched
                if watched is not None and not self.serve and self._alarmed != watched.generation:
                    alarm = f"alarm/g{watched.generation}"
                    if self._beat_store.check([alarm]):
                        self._alarmed = watched.generation
                        nodes = self._beat_store.get(alarm).decode().split(",")
                        self._cut(self._beat_store, watched, nodes)
                if failing_since is not None:
                    log.warning(
                        "heartbeat of %s: the store answers again after %.1f s",
                        self.slot,
                        time.monotonic() - failing_since,
                    )
                    failing_since = None
            except Exception as e:  # the store is slow, restarting or gone (rank 0 ended): beat on
                self.beat_errors += 1
                self._beat_store = None
                if failing_since is None:
                    failing_since = time.monotonic()
                    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
                    log.warning(
                        "heartbeat of %s failed (%s); retrying every %.2f s", self.slot, first, self.heartbeat_s
                    )
            self._stop.wait(self.heartbeat_s)

    def close(self) -> None:
        """Stop the heartbeat (the process is ending)."""
        self._stop.set()

    # ------------------------------------------------------------------ silent nodes while training
    def watch(self, plan: Optional[Plan]) -> None:
        """``plan`` trains now (None: it stopped, a recovery began): rank 0's monitor judges its members'
        heartbeats; a node all of whose ranks are silent for ``dead_after_s`` is cut off (``cut_connections``,
        on every member: rank 0 raises the alarm ``alarm/g<N>``, the others see it at their next beat), so the
        blocked collective fails and the recovery begins, whatever ``train.pg_timeout_s`` is."""
        with self._lock:
            self._watched = plan
            if plan is not None and plan.generation != self._seen_generation:
                self.seen, self._seen_generation = {}, plan.generation

    def _cut(self, store: Any, plan: Plan, nodes: Sequence[str]) -> None:
        """Shut this process's connections to the ranks of ``nodes`` (the alarm's silent ones), so that its
        blocked collective fails. When the alarm names this process's own node (it was only slow, e.g.
        stopped past ``heartbeat_timeout_s``, and the step gave up on it), the connections to every other node
        of ``plan`` instead: nothing else ends its collective before ``train.pg_timeout_s`` (its peers have
        gone on to the next generation), and it must get out to wait as a spare."""
        own, named = slot_node(self.slot), list(nodes)
        if own in nodes:
            nodes = [n for n in dict.fromkeys(slot_node(s) for s in plan.ranks) if n != own]
        peers: List[str] = []
        for n in nodes:
            for s in plan.ranks:
                if slot_node(s) == n:
                    with contextlib.suppress(Exception):
                        peers += [a for a in store.get(f"addr/{s}").decode().split(",") if a]
        keep = set(self.own_addresses)  # never this host; the store's link is kept by its port
        peers = [a for a in dict.fromkeys(peers) if a not in keep]
        shut = cut_connections(
            peers, keep_local_port=self.port if self.serve else 0, keep_remote_port=0 if self.serve else self.port
        )
        log.warning(
            "node(s) %s silent for %.1f s (no heartbeat): %d connection(s) to %s shut, so the step's collective fails",
            ",".join(named),
            self.dead_after_s,
            shut,
            ",".join(peers) or "no known address",
        )

    def _monitor(self) -> None:
        """Rank 0's thread: every ``heartbeat_s``, the watched generation's heartbeats; raises the alarm for
        the nodes all of whose ranks fell silent (``watch``). Its own store connection; errors are logged."""
        import torch.distributed as dist

        store: Any = None
        made: set = set()
        while not self._stop.wait(self.heartbeat_s):
            self.monitor_passes += 1
            plan = self._watched
            if plan is None or self._alarmed == plan.generation:
                continue
            try:
                if store is None:
                    store = dist.TCPStore(
                        self.addr, self.port, is_master=False, timeout=timedelta(seconds=max(self.dead_after_s, 1.0))
                    )
                counts = heartbeat_counts(store, list(plan.ranks), made)
                now = time.monotonic()
            except Exception as e:
                store, made = None, set()
                log.warning("in-process monitor: the store did not answer (%s)", str(e).splitlines()[0][:200])
                continue
            with self._lock:
                if self._watched is not plan:
                    continue
                for s, c in counts.items():
                    if s not in self.seen or self.seen[s][0] != c:
                        self.seen[s] = (c, now)
                silent = {s for s in plan.ranks if now - self.seen[s][1] >= self.dead_after_s}
            lost = [
                n
                for n in plan.nodes[1:]  # never the batch host (this process's node)
                if all(s in silent for s in plan.ranks if slot_node(s) == n)
            ]
            if lost:
                self._alarmed = plan.generation
                with contextlib.suppress(Exception):
                    store.set(f"alarm/g{plan.generation}", ",".join(lost))
                self._cut(store, plan, lost)

    def group_store(self, generation: int) -> Any:
        """The store prefix that generation ``generation``'s process group forms through."""
        import torch.distributed as dist

        return dist.PrefixStore(f"g{generation}/pg", self.store)

    def _has(self, key: str) -> bool:
        return bool(self.store.check([key]))

    def _counter(self, key: str) -> int:
        return int(self.store.add(key, 0))

    # ------------------------------------------------------------------ spares
    def spare_ready(self) -> None:
        """Tell the coordinator this spare has built its task and can be called in."""
        self.store.set(f"spare/{self.slot}", "ready")

    def spare_failed(self, what: str) -> None:
        """This spare failed before it was called in (``what``: the error): no plan calls it in, and it is no
        ``crash`` (the training ranks and later recoveries go on). Never raises."""
        try:
            self.store.set(f"spare_failed/{self.slot}", what[:500])
            self.store.delete_key(f"spare/{self.slot}")
        except Exception:
            pass

    def wait_for_call(self, first_generation: int = 1, tick: Optional[Callable[[], None]] = None) -> Optional[Plan]:
        """Block until a generation from ``first_generation`` on calls this spare in (its :class:`Plan`), or the
        step ends (None: the run finished, was stopped, or rank 0's store is gone). Generations that do not
        call it are skipped. ``tick``: called at each look at the store (a live waiter's progress mark)."""
        g = first_generation
        while True:
            try:
                if self._has(f"g{g}/plan"):
                    text = self.store.get(f"g{g}/plan")
                    g += 1
                    if not text.startswith(b"{"):  # the survivors gave up: the step ends
                        return None
                    plan = Plan.from_json(text)
                    if self.slot in plan.ranks:
                        return plan
                    continue
                if self._has("done"):
                    return None
            except Exception as e:  # rank 0 ended and took the store with it
                log.warning("spare %s: the step's store is gone (%s); ending", self.slot, str(e).splitlines()[0][:200])
                return None
            if tick is not None:
                tick()
            time.sleep(self.poll_s)

    def done(self) -> None:
        """Rank 0: the step ends (spares still waiting exit)."""
        try:
            self.store.set("done", "1")
        except Exception:
            pass

    def report_crash(self, what: str) -> None:
        """A training rank's own error (not a lost peer): the coordinator then gives up instead of replacing it."""
        try:
            self.store.set("crash", f"{self.slot}: {what}"[:500])
        except Exception:
            pass

    # ------------------------------------------------------------------ survivors
    def check_in(self, plan: Plan, step: int) -> None:
        """After the failed collective: this member of ``plan`` is alive with ``step`` completed steps."""
        self.store.set(f"g{plan.generation + 1}/alive/{self.slot}", str(step))

    def wait_plan(self, generation: int, deadline_s: float) -> Plan:
        """The plan of ``generation`` (published by the coordinator); raises :class:`RecoveryAbandoned` when
        it gave up, did not decide within ``deadline_s`` seconds, or its store is gone."""
        text = self._wait_key(f"g{generation}/plan", deadline_s, f"no plan for generation {generation}")
        if not text.startswith(b"{"):
            raise RecoveryAbandoned(text.decode(errors="replace"))
        return Plan.from_json(text)

    def _wait_key(self, key: str, deadline_s: float, what: str) -> bytes:
        end = time.monotonic() + deadline_s
        try:
            while not self._has(key):
                if time.monotonic() > end:
                    raise RecoveryAbandoned(f"{what} within {deadline_s:.0f} s")
                time.sleep(self.poll_s)
            return bytes(self.store.get(key))
        except RecoveryAbandoned:
            raise
        except Exception as e:
            raise RecoveryAbandoned(f"the step's store is gone ({str(e).splitlines()[0][:200]})") from None

    def _watch(self, slots: Sequence[str], last: Dict[str, Tuple[int, float]], now: float) -> None:
        """Update ``last`` (slot → (heartbeat count, when it last moved)) from the store."""
        for s, count in heartbeat_counts(self.store, slots, self._made).items():
            if s not in last or last[s][0] != count:
                last[s] = (count, now)

    def enter(self, plan: Plan, deadline_s: float) -> str:
        """Before forming ``plan``'s process group: '' when every member is there to form it, else why not (the
        generation is planned again: each member checks in for the next one). A member says it joined; rank 0
        of ``plan`` waits until every member did, or one stopped beating for ``dead_after_s`` (a spare that died
        just as it was called in: otherwise the group would wait ``train.pg_timeout_s`` for it), then publishes
        the answer the others wait for. Raises :class:`RecoveryAbandoned` when the store is gone."""
        g = plan.generation
        try:
            self.store.set(f"g{g}/joined/{self.slot}", "1")
        except Exception as e:
            raise RecoveryAbandoned(f"the step's store is gone ({str(e).splitlines()[0][:200]})") from None
        if plan.ranks.get(self.slot) != 0:
            text = self._wait_key(f"g{g}/go", deadline_s, f"no go for generation {g}").decode(errors="replace")
            return "" if text == "go" else text
        last: Dict[str, Tuple[int, float]] = {}
        start = time.monotonic()
        why = ""
        joined: set = set()
        while True:
            now = time.monotonic()
            self._watch(list(plan.ranks), last, now)
            found = present_values(self.store, [f"g{g}/joined/{s}" for s in plan.ranks if s not in joined])
            joined |= {k.rsplit("/joined/", 1)[1] for k in found}
            missing = [s for s in plan.ranks if s not in joined]
            silent = [s for s in missing if now - last[s][1] >= self.dead_after_s]
            if not missing:
                break
            if silent:
                why = f"{', '.join(silent)} stopped beating before generation {g} formed"
                break
            if now - start > deadline_s:
                why = f"{', '.join(missing)} did not join generation {g} within {deadline_s:.0f} s"
                break
            time.sleep(self.poll_s)
        self.store.set(f"g{g}/go", why or "go")
        return why

    def coordinate(
        self,
        plan: Plan,
        spare_candidates: Sequence[str],
        *,
        tasks_per_node: int,
        min_nodes: int,
        max_generations: int,
        deadline_s: float,
        replanned: str = "",
    ) -> Plan:
        """Rank 0, after its own check-in: decide and publish the next generation's plan (:func:`next_plan`).

        Waits until each member of ``plan`` has checked in or has not beaten for ``dead_after_s``, at most
        ``deadline_s`` seconds (then the silent ones count as lost), and, when a member was lost, until enough
        ready spares were seen beating to take its node (or every ready spare was judged). ``spare_candidates``:
        the spare slots of the step (the ready, beating ones that did not fail are used; a failed one is named
        in the plan's ``spares_failed``). ``replanned``: why ``plan`` never trained (kept in the new plan).
        Raises :class:`RecoveryAbandoned` (after publishing the reason, so every waiting rank gives up too)."""
        g = plan.generation + 1
        candidates = [s for s in spare_candidates if s not in plan.ranks]
        watched = list(plan.ranks) + candidates
        last: Dict[str, Tuple[int, float]] = {}
        with self._lock:  # what the monitor saw while the generation trained: a silence already under way counts
            if self._seen_generation == plan.generation:
                last.update({s: v for s, v in self.seen.items() if s in plan.ranks})
        first: Dict[str, int] = {}
        start = time.monotonic()
        alive: Dict[str, int] = {}
        failed: List[str] = []
        usable: List[str] = []
        while True:
            now = time.monotonic()
            self._watch(watched, last, now)
            for s in watched:
                first.setdefault(s, last[s][0])
            found = present_values(self.store, [f"g{g}/alive/{s}" for s in plan.ranks if s not in alive])
            for key, value in found.items():
                alive[key.rsplit("/alive/", 1)[1]] = int(value)
            silent = [s for s in plan.ranks if s not in alive and now - last[s][1] >= self.dead_after_s]
            waiting = [s for s in plan.ranks if s not in alive and s not in silent]
            failed = [s for s in candidates if self._has(f"spare_failed/{s}")]
            ready = [s for s in candidates if s not in failed and self._has(f"spare/{s}")]
            # a ready spare is usable once its heartbeat was seen to move (and has not stopped since)
            usable = [s for s in ready if last[s][0] != first[s] and now - last[s][1] < self.dead_after_s]
            undecided = [s for s in ready if s not in usable and now - last[s][1] < self.dead_after_s]
            lost_nodes = {slot_node(s) for s in silent}
            covered = len({slot_node(s) for s in usable}) >= len(lost_nodes)
            if not waiting and (not undecided or covered):
                break
            if now - start > deadline_s:
                log.warning("in-process recovery: %s did not check in within %.0f s", ", ".join(waiting), deadline_s)
                break
            time.sleep(self.poll_s)
        crash = self.store.get("crash").decode(errors="replace") if self._has("crash") else ""
        if failed:
            log.warning("in-process recovery: spare(s) %s failed and are left out", ", ".join(failed))
        result: Union[Plan, str] = (
            f"a rank crashed ({crash})"
            if crash
            else next_plan(
                plan,
                alive,
                usable,
                tasks_per_node=tasks_per_node,
                min_nodes=min_nodes,
                max_generations=max_generations,
            )
        )
        if isinstance(result, str):
            self.store.set(f"g{g}/plan", result)
            raise RecoveryAbandoned(result)
        from dataclasses import replace

        result = replace(result, spares_failed=tuple(failed), replanned=replanned)
        self.store.set(f"g{g}/plan", result.to_json())
        return result
