"""The in-process recovery's membership protocol at 1,024 and 4,096 members: heartbeats, rank 0's monitor,
the coordinator's plan (``slurm_ddp.worker.inprocess``), without a model.

    python benchmarks/bench_membership.py                      # 1,024 and 4,096 members, ~1-2 min
    python benchmarks/bench_membership.py --members 256 1024 --interval-s 0.25 --timeout-s 5

One process. Rank 0 is a real ``Membership`` (it serves the ``TCPStore`` and runs the monitor thread); the
other members are simulated by ``--threads`` threads, each with its own store connection, beating
``--tasks-per-node`` slots per node every ``--interval-s`` (``recovery.heartbeat_interval_s``) as the members'
heartbeat threads do (one ``add`` per beat). Per member count N it measures:

* *store capacity*: ``add`` requests/s the store answers with every thread sending as fast as it can (the
  budget: what one rank 0 can serve on this machine);
* *load*: the heartbeats' requests/s (N / interval demanded; achieved, and how late the slowest beat of a
  pass was) plus the monitor's (one ``multi_get`` of N counters per interval, counted as N), as a share of
  the capacity;
* *detection*: one node's beats stop; seconds until rank 0's monitor raised its alarm (``alarm/g0``), minus
  ``--timeout-s`` (``recovery.heartbeat_timeout_s``) — what the protocol adds to the timeout;
* *plan*: every other member checks in, one spare node is ready; seconds for ``Membership.coordinate`` to
  publish the next plan (it starts from the monitor's view, so the timeout is not waited again), and the
  pure ``next_plan`` alone.

Budgets (stated, checked): load ≤ 50 % of the store's capacity; detection ≤ 2 intervals beyond the
timeout; plan ≤ 1 s. Costs that grow with N: heartbeats N/interval requests/s (one per member per
interval: the dominant one); the monitor one ``multi_get`` of N keys per interval; the coordinator one
``multi_get`` per pass plus a check and a get per member's check-in (N round trips, once).
On this 2-core machine the simulated members share the cores with the store: a real cluster's members each
have their own, so the achieved rates here are a lower bound on the store's.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Dict, List, Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slurm_ddp.worker.inprocess import Membership, first_plan, next_plan, slot_name


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def client(port: int) -> Any:
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))


def capacity(port: int, threads: int, seconds: float) -> float:
    """``add`` requests/s with ``threads`` connections sending back to back."""
    stores = [client(port) for _ in range(threads)]
    counts = [0] * threads
    end = time.monotonic() + seconds

    def run(i: int) -> None:
        s, n = stores[i], 0
        while time.monotonic() < end:
            s.add(f"cap/{i}", 1)
            n += 1
        counts[i] = n

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


class Beaters:
    """``threads`` threads beating ``slots`` every ``interval`` s (one ``add`` each); ``stop_node`` silences a node."""

    def __init__(self, port: int, slots: List[str], threads: int, interval: float):
        self.interval, self.silent, self.done = interval, set(), threading.Event()
        self.sent = 0
        self.late: List[float] = []  # per pass: how far past its interval the pass ended
        self._lock = threading.Lock()
        parts = [slots[i::threads] for i in range(threads)]
        self.threads = [threading.Thread(target=self._run, args=(client(port), p), daemon=True) for p in parts]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def _run(self, store: Any, mine: List[str]) -> None:
        nxt = time.monotonic()
        while not self.done.is_set():
            n = 0
            for s in mine:
                if s.split("/")[0] not in self.silent:
                    store.add(f"hb/{s}", 1)
                    n += 1
            now = time.monotonic()
            with self._lock:
                self.sent += n
                self.late.append(max(0.0, now - (nxt + self.interval)))
            nxt += self.interval
            self.done.wait(max(0.0, nxt - now))


def one(n: int, args: argparse.Namespace) -> Dict[str, float]:
    tpn = args.tasks_per_node
    nodes = [f"n{i}" for i in range(1, n // tpn + 1)]
    plan = first_plan(nodes, tpn)
    spare = f"n{len(nodes) + 1}"
    port = free_port()
    m0 = Membership(
        "127.0.0.1",
        port,
        slot_name(nodes[0], 0),
        serve=True,
        timeout_s=120,
        heartbeat_s=args.interval_s,
        dead_after_s=args.timeout_s,
    )
    out: Dict[str, float] = {"members": n}
    others = [s for s in plan.ranks if s != m0.slot] + [slot_name(spare, lr) for lr in range(tpn)]
    beat = Beaters(port, others, args.threads, args.interval_s)
    try:
        out["capacity"] = capacity(port, args.threads, args.capacity_s)
        beat.start()
        m0.watch(plan)
        time.sleep(args.settle_s)  # the load, measured over a window
        s0, p0, t0 = beat.sent, m0.monitor_passes, time.monotonic()
        time.sleep(args.window_s)
        dt = time.monotonic() - t0
        out["beats_per_s"] = (beat.sent - s0) / dt
        out["monitor_per_s"] = (m0.monitor_passes - p0) * n / dt
        out["late_p99_s"] = statistics.quantiles(beat.late[-2000:], n=100)[98] if len(beat.late) > 100 else 0.0
        victim = nodes[len(nodes) // 2]
        t_stop = time.monotonic()
        beat.silent.add(victim)
        while not m0.store.check(["alarm/g0"]):
            if time.monotonic() - t_stop > args.timeout_s + 60:
                raise SystemExit(f"N={n}: no alarm within {args.timeout_s + 60:.0f} s")
            time.sleep(0.01)
        out["detect_s"] = time.monotonic() - t_stop - args.timeout_s
        m0.watch(None)
        st = client(port)
        for s in plan.ranks:
            if not s.startswith(victim + "/"):
                st.set(f"g1/alive/{s}", "10")
        for lr in range(tpn):
            st.set(f"spare/{slot_name(spare, lr)}", "ready")
        t0 = time.monotonic()
        new = m0.coordinate(
            plan,
            [slot_name(spare, lr) for lr in range(tpn)],
            tasks_per_node=tpn,
            min_nodes=1,
            max_generations=2,
            deadline_s=120,
        )
        out["plan_s"] = time.monotonic() - t0
        assert new.lost == (victim,) and new.spares_used == (spare,), (new.lost, new.spares_used)
        alive = {s: 10 for s in plan.ranks if not s.startswith(victim + "/")}
        t0 = time.perf_counter()
        next_plan(
            plan, alive, [slot_name(spare, lr) for lr in range(tpn)], tasks_per_node=tpn, min_nodes=1, max_generations=2
        )
        out["next_plan_s"] = time.perf_counter() - t0
    finally:
        beat.done.set()
        for t in beat.threads:
            t.join(timeout=30)
        m0.close()
    return out


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--members", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--tasks-per-node", type=int, default=8)
    ap.add_argument("--interval-s", type=float, default=0.25, help="recovery.heartbeat_interval_s")
    ap.add_argument("--timeout-s", type=float, default=5.0, help="recovery.heartbeat_timeout_s")
    ap.add_argument("--threads", type=int, default=8, help="simulated members' connections")
    ap.add_argument("--capacity-s", type=float, default=3.0)
    ap.add_argument("--settle-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=5.0)
    args = ap.parse_args(list(argv) or None)
    print(
        f"{os.cpu_count()} CPUs; {args.tasks_per_node} tasks per node; heartbeat every {args.interval_s:g} s, "
        f"timeout {args.timeout_s:g} s; {args.threads} simulated connections"
    )
    rows = [one(n, args) for n in args.members]
    print(
        "\n| members | store capacity (req/s) | heartbeats (req/s, demanded) | monitor (keys/s) | load ÷ capacity "
        "| beat late p99 (s) | detection − timeout (s) | plan (s) | next_plan (ms) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ok = True
    for r in rows:
        n = int(r["members"])
        load = (r["beats_per_s"] + r["monitor_per_s"]) / r["capacity"]
        print(
            f"| {n:,} | {r['capacity']:,.0f} | {r['beats_per_s']:,.0f} ({n / args.interval_s:,.0f}) | "
            f"{r['monitor_per_s']:,.0f} | {load:.2f} | {r['late_p99_s']:.3f} | {r['detect_s']:.2f} | "
            f"{r['plan_s']:.2f} | {r['next_plan_s'] * 1e3:.2f} |"
        )
        ok &= load <= 0.5 and r["detect_s"] <= 2 * args.interval_s and r["plan_s"] <= 1.0
    print(
        "\nbudgets: load ≤ 0.5 of capacity, detection ≤ 2 intervals past the timeout, plan ≤ 1 s: "
        + ("all met" if ok else "NOT all met")
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
