"""What grows with the rank count: process-group start, the checkpoint collective, the stop agreement.

    python benchmarks/bench_scale.py                  # 2 / 4 / 8 / 16 local gloo ranks, ~2-4 min
    python benchmarks/bench_scale.py --worlds 2 4 --reps 20

For each world size W, W processes on this machine (gloo over TCP on 127.0.0.1, one process
per rank, as srun starts them) measure, with the worker's own functions:

* *group ready*: from the parent's spawn of the ranks to the last rank's ``init_process_group``
  returning (interpreter + ``import torch`` + rendezvous), and the slowest rank's
  ``init_process_group`` call alone (the TCPStore rendezvous);
* *checkpoint collective*, the part of every checkpoint (periodic or preemption) that every rank
  runs, median over ``--reps`` on rank 0 (it finishes last), two designs:
  - *gather* (before): ``gather_to_main(capture_rng(), denv)``, the per-rank RNG gather into rank
    0's state; and the bytes rank 0 receives (``gather_object`` pickles each rank's state and pads
    every message to the largest: W × max);
  - *per-rank file* (now, ``Trainer.save_rank_states``): each rank writes its own RNG state with
    ``CheckpointManager.save_rank_state`` (atomic, fsync'd) beside the checkpoint, then one
    ``all_gather`` of every file's size and sha256 (40 B per rank; ``gather_rank_digests``);
* *resume check* (``Trainer._agreed_checkpoint``): rank 0's ``CheckpointManager.latest()`` (the data
  file and the W rank files checked against the manifest's sizes and sha256) and the broadcast of
  its step to the other ranks, who read nothing (W rank files per start, not W²);
* *stop agreement*: ``StepAgreement.poll()`` of the worker in a loop of ``--step-ms`` steps (a
  sleep: the steps' compute is not what is measured): its time per step on rank 0, the all-reduce
  it runs on check steps (median), and what an all-reduce at every step would cost.

Then a least-squares fit of each cost over W and its value at 1,024 ranks (``--extrapolate``). The
formulas: gather time ``a + b·W`` (rank 0 receives W-1 messages, one after another in gloo) and
bytes ``s·W``; per-rank file + digest all_gather ``a + b·W`` as well (an upper bound: the file is
written in parallel); the resume check ``a + b·W`` (rank 0 hashes W files of ~15 kB); group ready ``a + b·W`` (rank 0's TCPStore serves every rank); the agreement's
all-reduce ``a + b·W`` too (gloo's ring for small tensors: 2(W-1) hops). On this 2-core machine
16 ranks are 8 processes per core, so every fitted slope holds the CPU oversubscription as well:
the extrapolation is an upper bound for ranks that each have their own core, not a prediction for
a real network.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- one rank
def child(args: argparse.Namespace) -> None:
    t_spawn = args.t_spawn
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(REPO))
    from datetime import timedelta

    from slurm_ddp.worker.runtime import StepAgreement, capture_rng, gather_to_main, seed_everything

    rank, world = args.rank, args.world
    t_call = time.time()
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=300),
    )
    t_ready = time.time()
    out: Dict[str, Any] = {"rank": rank, "spawn_to_ready_s": t_ready - t_spawn, "init_call_s": t_ready - t_call}
    denv = SimpleNamespace(world_size=world, rank=rank, is_main=rank == 0)
    seed_everything(1000 + rank)

    # the checkpoint collective: the per-rank RNG gather of Trainer.state_dict
    times: List[float] = []
    rng_sizes: List[int] = []
    for _ in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        rngs = gather_to_main(capture_rng(), denv)  # type: ignore[arg-type]
        times.append(time.perf_counter() - t0)
        if rank == 0:
            assert rngs is not None and len(rngs) == world
            rng_sizes = [len(pickle.dumps(r)) for r in rngs]
    out["gather_s"] = statistics.median(times)

    # the per-rank file design (Trainer.save_rank_states): each rank writes its own state, then one
    # all_gather of every file's (size, sha256) in place of a barrier
    from slurm_ddp.checkpoint import CheckpointManager
    from slurm_ddp.worker.train import gather_rank_digests

    mgr = CheckpointManager(args.dir, keep_last=args.reps + 1)
    times = []
    digests: List[Any] = []
    for i in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        digests = gather_rank_digests(mgr.save_rank_state(capture_rng(), i, rank), torch.device("cpu"))
        times.append(time.perf_counter() - t0)
    out["rank_file_s"] = statistics.median(times)

    # a resume's check (Trainer._agreed_checkpoint): rank 0 verifies the newest checkpoint (its data
    # file and the W rank files against the manifest's sizes and sha256), the others take its step
    if rank == 0:
        mgr.save({"step": args.reps - 1}, args.reps - 1, world_size=world, rank_states=world, rank_digests=digests)
    dist.barrier()
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        info = mgr.latest() if rank == 0 else None
        box = [None if info is None else info.step]
        dist.broadcast_object_list(box, src=0)
        times.append(time.perf_counter() - t0)
        assert box[0] == args.reps - 1, box
    out["resume_check_s"] = statistics.median(times)
    if rank == 0:
        out["gather_bytes"] = world * max(rng_sizes)  # gather_object pads every message to the largest
        out["rng_state_bytes"] = statistics.median(rng_sizes)

    # the stop agreement: poll() at every step of a loop of sleeping steps
    class Flag:
        received = None
        signals = ("USR2",)

    agree = StepAgreement(Flag())
    dist.barrier()
    poll_s = 0.0
    step_s = args.step_ms / 1000
    t_loop = time.perf_counter()
    steps = 0
    while True:  # every rank stops at the same step: the one where poll() agrees
        time.sleep(step_s)
        if time.perf_counter() - t_loop > args.agree_s:
            Flag.received = "stop"  # type: ignore[assignment]
        t0 = time.perf_counter()
        stop = agree.poll()
        poll_s += time.perf_counter() - t0
        steps += 1
        if stop:
            break
    out["poll_per_step_s"] = poll_s / max(steps, 1)
    out["agree_every_steps"] = agree.every
    t = torch.zeros(2, dtype=torch.int64)
    ar: List[float] = []
    for _ in range(args.reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        ar.append(time.perf_counter() - t0)
    out["allreduce_s"] = statistics.median(ar)
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)


# --------------------------------------------------------------------------- the parent
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_world(world: int, args: argparse.Namespace) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=".bench-scale-", dir=args.dir) as d:
        return _run_world(world, args, d)


def _run_world(world: int, args: argparse.Namespace, directory: str) -> Dict[str, Any]:
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    t_spawn = time.time()
    procs = [
        subprocess.Popen(
            [
                sys.executable, __file__, "--child", "--rank", str(r), "--world", str(world), "--port", str(port),
                "--t-spawn", repr(t_spawn), "--reps", str(args.reps), "--step-ms", str(args.step_ms),
                "--agree-s", str(args.agree_s), "--dir", directory,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(world)
    ]  # fmt: skip
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            raise SystemExit(f"a rank of world {world} failed ({p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    r0 = next(r for r in results if r["rank"] == 0)
    return {
        "world": world,
        "ready_s": max(r["spawn_to_ready_s"] for r in results),
        "init_call_s": max(r["init_call_s"] for r in results),
        "gather_s": r0["gather_s"],
        "rank_file_s": r0["rank_file_s"],
        "resume_check_s": r0["resume_check_s"],
        "gather_bytes": r0["gather_bytes"],
        "rng_state_bytes": r0["rng_state_bytes"],
        "poll_per_step_s": r0["poll_per_step_s"],
        "agree_every": r0["agree_every_steps"],
        "allreduce_s": r0["allreduce_s"],
    }


def fit_linear(xs: Sequence[float], ys: Sequence[float]) -> Tuple[float, float]:
    """Least squares ``y = a + b·x``; returns ``(a, b)``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4, 8, 16])
    ap.add_argument("--reps", type=int, default=30, help="repetitions of each collective (medians)")
    ap.add_argument("--step-ms", type=float, default=20.0, help="the simulated step's duration")
    ap.add_argument("--agree-s", type=float, default=5.0, help="seconds of stop-agreement loop per world")
    ap.add_argument("--extrapolate", type=int, default=1024, help="the world size to extrapolate to")
    ap.add_argument("--json", help="also write the rows and fits to this file")
    ap.add_argument("--dir", default=".", help="where the per-rank files are written (a temporary directory in it)")
    # a rank (internal)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--t-spawn", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args(list(argv) or None)
    if args.child:
        child(args)
        return 0

    print(f"{os.cpu_count()} CPUs; gloo on 127.0.0.1; {args.reps} reps; {args.step_ms:g} ms steps")
    rows = []
    for w in args.worlds:
        row = run_world(w, args)
        rows.append(row)
        print(
            f"W={w:3d}: group ready {row['ready_s']:.2f} s (init_process_group {row['init_call_s']:.3f} s) | "
            f"RNG gather {row['gather_s'] * 1e3:.2f} ms, {row['gather_bytes'] / 1e3:.1f} kB to rank 0 | "
            f"per-rank file + digest all_gather {row['rank_file_s'] * 1e3:.2f} ms | "
            f"resume check {row['resume_check_s'] * 1e3:.2f} ms | "
            f"stop agreement {row['poll_per_step_s'] * 1e6:.0f} µs/step (all-reduce {row['allreduce_s'] * 1e3:.2f} ms "
            f"every {row['agree_every']} steps)",
            flush=True,
        )
    ws = [float(r["world"]) for r in rows]
    big = args.extrapolate
    fits = {}
    print("\n| ranks | group ready (s) | init_process_group (s) | RNG gather (ms) | bytes to rank 0 | "
          "per-rank file + digests (ms) | resume check (ms) | agreement µs/step | its all-reduce (ms) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['world']} | {r['ready_s']:.2f} | {r['init_call_s']:.3f} | {r['gather_s'] * 1e3:.2f} | "
            f"{r['gather_bytes'] / 1e3:.1f} kB | {r['rank_file_s'] * 1e3:.2f} | {r['resume_check_s'] * 1e3:.2f} | "
            f"{r['poll_per_step_s'] * 1e6:.0f} | "
            f"{r['allreduce_s'] * 1e3:.2f} |"
        )
    for key in (
        "ready_s",
        "init_call_s",
        "gather_s",
        "rank_file_s",
        "resume_check_s",
        "allreduce_s",
        "poll_per_step_s",
    ):
        a, b = fit_linear(ws, [r[key] for r in rows])
        fits[key] = {"a": a, "b": b, "at": a + b * big}
    s = statistics.median(r["gather_bytes"] / r["world"] for r in rows)
    fits["gather_bytes"] = {"a": 0.0, "b": s, "at": s * big}
    f = fits
    print(
        f"| {big} (fit) | {f['ready_s']['at']:.1f} | {f['init_call_s']['at']:.2f} | {f['gather_s']['at'] * 1e3:.0f} | "
        f"{f['gather_bytes']['at'] / 1e6:.1f} MB | {f['rank_file_s']['at'] * 1e3:.0f} | "
        f"{f['resume_check_s']['at'] * 1e3:.0f} | "
        f"{f['poll_per_step_s']['at'] * 1e6:.0f} | {f['allreduce_s']['at'] * 1e3:.1f} |"
    )
    print("\nFormulas (least squares over the measured W; t in seconds):")
    for key, v in fits.items():
        print(f"  {key} = {v['a']:.4g} + {v['b']:.4g}·W   → W={big}: {v['at']:.4g}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "fits": fits}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
