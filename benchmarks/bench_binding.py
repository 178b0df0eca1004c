"""Binding benchmark: what ``environment.cpu_bind``/OpenMP threads and ``allocator`` are worth.

    python benchmarks/bench_binding.py          # ~45 s on 2 cores; --window-s to change

Two measurements, each a ratio of two runs of the real worker (2 gloo DDP ranks on this
machine, started as the local backend starts them: srun's task variables from
``slurm_ddp.backends.local.rank_environ``), taken in the same invocation:

1. **binding vs oversubscription** — a compute-bound MLP task (defined below: 512→1024→1024→10,
   per-rank batch 128, synthetic data, no checkpoints, no eval):
   * *bound*: ranks started through ``python -m slurm_ddp.launch`` with ``cpu_bind: cores``
     and ``cpus_per_task`` = this machine's CPUs ÷ 2 → each rank pinned to its own CPUs,
     ``OMP_NUM_THREADS`` = its CPUs, OpenMP threads pinned (``OMP_PROC_BIND=close``, ``OMP_PLACES``);
   * *unbound*: the worker started directly, no OMP_* variables — what a job got before
     slurm_ddp bound it: each rank takes torch's default thread count (the machine's cores),
     so 2 ranks run 2× as many compute threads as there are CPUs.
2. **jemalloc vs the system allocator** — the digits example (``examples/digits/job.yaml``,
   eval and checkpoints off so the window is pure training), both through the wrapper, the
   one difference being ``allocator: jemalloc`` (LD_PRELOAD of libjemalloc).

Aggregate samples/s = (steps between the first and the last ``train`` record of
``metrics.jsonl`` inside the measuring window) ÷ (their time difference) × per-rank batch × 2
ranks; process start, imports and the first ``--warmup-steps`` steps are outside the window.
The ranks are killed when the window (``--window-s``) is full. By default one run per
configuration (bound, unbound, system, jemalloc); ``--rounds N`` repeats each pair N times in
alternating order and reports the median of the per-round ratios. It prints every run and one
``RESULT`` line per ratio. On a shared, loaded machine single runs vary by ±20 % or more.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Dict, List

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
DIGITS = REPO / "examples" / "digits" / "job.yaml"

if __name__ != "__main__":  # imported by the worker as ``train.task: bench_binding:MLPTask``
    import torch
    from torch.utils.data import TensorDataset

    from slurm_ddp.task import Task

    class MLPTask(Task):
        """Compute-bound: a 512→1024→1024→10 MLP on 8192 synthetic samples (``train.args.dim``)."""

        def build_model(self) -> torch.nn.Module:
            d = int(self.args.get("dim", 512))
            return torch.nn.Sequential(
                torch.nn.Linear(d, 1024),
                torch.nn.ReLU(),
                torch.nn.Linear(1024, 1024),
                torch.nn.ReLU(),
                torch.nn.Linear(1024, 10),
            )

        def build_datasets(self):
            g = torch.Generator().manual_seed(0)
            x = torch.randn(8192, int(self.args.get("dim", 512)), generator=g)
            return TensorDataset(x, torch.randint(0, 10, (8192,), generator=g)), None


def clean_environ() -> Dict[str, str]:
    """This environment without SLURM_, MASTER_, OMP_, KMP_ variables and LD_PRELOAD."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "MASTER_", "OMP_", "KMP_", "GOMP_")) and k != "LD_PRELOAD"
    }


def run(name: str, cfg, root: Path, *, wrapper: bool, window_s: float, warmup_steps: int) -> dict:
    """Start the 2 ranks of ``cfg``, measure the steady rate over ``window_s``, kill them."""
    from slurm_ddp.backends.local import rank_environ
    from slurm_ddp.config import dump_config
    from slurm_ddp.rendezvous import choose_port

    rd = root / name
    (rd / "logs").mkdir(parents=True)
    (rd / "config.yaml").write_text(dump_config(cfg))
    job_id = str(os.getpid())
    port = choose_port(str(int(time.time() * 1000) % 100000))
    plan = SimpleNamespace(cfg=cfg, run_dir=str(rd))
    worker = [sys.executable, "-u", "-m", "slurm_ddp.worker", "--run-dir", str(rd)]
    cmd = ([sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(rd), "--"] if wrapper else []) + worker
    procs: List[subprocess.Popen] = []
    t_start = time.monotonic()
    for rank in range(cfg.slurm.world_size):
        env = rank_environ(plan, rank, job_id, port, 0, base=clean_environ())
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE)])
        with open(rd / "logs" / f"rank-{rank}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
                )
            )
    metrics = rd / "metrics.jsonl"
    recs: List[dict] = []
    try:
        while True:
            if any(p.poll() is not None for p in procs):
                logs = "\n".join((rd / "logs" / f"rank-{r}.log").read_text()[-2000:] for r in range(len(procs)))
                raise RuntimeError(f"{name}: a rank exited early\n{logs}")
            if time.monotonic() - t_start > 120:
                raise RuntimeError(f"{name}: no steady window within 120 s")
            if metrics.exists():
                recs = [json.loads(line) for line in metrics.read_text().splitlines() if line.endswith("}")]
                recs = [r for r in recs if r.get("event") == "train" and r["step"] >= warmup_steps]
                if len(recs) >= 3 and recs[-1]["time"] - recs[0]["time"] >= window_s:
                    break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    first, last = recs[0], recs[-1]
    steps_per_s = (last["step"] - first["step"]) / (last["time"] - first["time"])
    samples_per_s = steps_per_s * cfg.train.batch_size * cfg.slurm.world_size
    out = {
        "name": name,
        "steps_per_s": steps_per_s,
        "samples_per_s": samples_per_s,
        "window_steps": last["step"] - first["step"],
        "window_s": last["time"] - first["time"],
    }
    print(
        f"{name:>9}: {samples_per_s:8.1f} samples/s aggregate ({steps_per_s:.2f} steps/s, "
        f"steps {first['step']}..{last['step']} in {out['window_s']:.1f} s; run {time.monotonic() - t_start:.0f} s)",
        flush=True,
    )
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-s", type=float, default=5.0, help="seconds of steady training per run")
    parser.add_argument("--warmup-steps", type=int, default=10, help="steps before the window starts")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat each pair, order alternating; the ratio is the median of per-round ratios",
    )
    parser.add_argument(
        "--threads-only",
        action="store_true",
        help="also run cpu_bind none through the wrapper (planned thread count, no pinning)",
    )
    parser.add_argument("--only", choices=["binding", "allocator"], help="run one of the two measurements")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from slurm_ddp.binding import BindingError, locate_libraries
    from slurm_ddp.config import config_from_dict, load_config

    ncpu = len(os.sched_getaffinity(0))
    cpt = max(1, ncpu // 2)
    t0 = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-binding-") as tmp:
        root = Path(tmp)
        if args.only in (None, "binding"):
            mlp = {
                "name": "bench-mlp",
                "slurm": {"nodes": 1, "tasks_per_node": 2, "cpus_per_task": cpt},
                "environment": {"cpu_bind": "cores"},
                "train": {
                    "task": "bench_binding:MLPTask",
                    "pythonpath": [str(HERE)],
                    "max_steps": 1000000,
                    "batch_size": 128,
                    "log_every": 5,
                    "eval_every": 0,
                    "num_workers": 0,
                    "lr": 0.001,
                },
                "checkpoint": {"every_steps": 0},
            }
            cfg = config_from_dict(mlp)
            print(
                f"binding: MLP, 2 ranks, {ncpu} CPUs; bound = cpu_bind cores + {cpt} OMP thread(s) per rank; "
                "unbound = no wrapper, torch's default threads",
                flush=True,
            )
            for i in range(args.rounds):
                for name in ("bound", "unbound") if i % 2 == 0 else ("unbound", "bound"):
                    results.setdefault(name, []).append(
                        run(
                            f"{name}-{i}",
                            cfg,
                            root,
                            wrapper=name == "bound",
                            window_s=args.window_s,
                            warmup_steps=args.warmup_steps,
                        )
                    )
                if args.threads_only:  # OMP_NUM_THREADS from the plan, nothing pinned
                    data = cfg.to_dict()
                    data["environment"]["cpu_bind"] = "none"
                    results.setdefault("threads", []).append(
                        run(
                            f"threads-{i}",
                            config_from_dict(data),
                            root,
                            wrapper=True,
                            window_s=args.window_s,
                            warmup_steps=args.warmup_steps,
                        )
                    )
        if args.only in (None, "allocator"):
            try:
                locate_libraries(["jemalloc"], os.environ)
            except BindingError as e:
                print(f"allocator: skipped: {e}")
            else:
                sets = [
                    "train.max_steps=1000000",
                    "train.eval_every=0",
                    "train.log_every=10",
                    "checkpoint.every_steps=0",
                    "train.num_workers=0",
                ]
                base = load_config(DIGITS, sets)
                data = base.to_dict()
                data["train"]["pythonpath"] = [str(DIGITS.parent)]
                print(
                    f"allocator: digits example, 2 ranks, through the wrapper (cpu_bind {base.environment.cpu_bind})",
                    flush=True,
                )
                for i in range(args.rounds):
                    for alloc in ("system", "jemalloc") if i % 2 == 0 else ("jemalloc", "system"):
                        data["environment"]["allocator"] = alloc
                        results.setdefault(alloc, []).append(
                            run(
                                f"{alloc}-{i}",
                                config_from_dict(data),
                                root,
                                wrapper=True,
                                window_s=args.window_s,
                                warmup_steps=args.warmup_steps,
                            )
                        )
    for label, a, b, what in (
        ("binding", "bound", "unbound", "bound/unbound aggregate samples/s"),
        ("threads", "threads", "unbound", "threads-only/unbound aggregate samples/s"),
        ("pinning", "bound", "threads", "bound/threads-only aggregate samples/s"),
        ("allocator", "jemalloc", "system", "jemalloc/system aggregate samples/s on digits"),
    ):
        if a in results and b in results:
            ratios = [x["samples_per_s"] / y["samples_per_s"] for x, y in zip(results[a], results[b])]
            med = statistics.median(ratios)
            print(
                f"RESULT {label}: {what} = {med:.2f}x"
                + (
                    f" (median of {len(ratios)} rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
                    if len(ratios) > 1
                    else f" ({results[a][0]['samples_per_s']:.0f} vs {results[b][0]['samples_per_s']:.0f})"
                )
            )
    print(f"total {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
