"""P1 worker overhead: the shared worker's steps/s ÷ a hand-written minimal DDP loop's.

    python benchmarks/bench_worker.py                      # alternating (default), ~4 min on 2 cores
    python benchmarks/bench_worker.py --mode sequential    # one job at a time, interleaved runs

Measured on the shared 2-core test VM (AMD EPYC, torch 2.13 CPU), ``--rounds 12 --slot 3``, median
of per-round ratios (steps per CPU-second ratio in brackets):

    checkpointing off in both                 0.987  (0.983)   goal >= 0.98
    checkpointing on in both (every 50 steps) 0.978  (0.928)   goal >= 0.95
    worker checkpointing on vs minimal off    1.021  (1.001)   goal >= 0.95

Per-round ratios scatter from ~0.6 to ~1.6 with the machine's other load; three runs of the
checkpointing-off ratio gave 0.975, 0.987 and 0.972. Rerun 2026-11-22 (same machine kind): 0.965
(checkpointing on in both 0.958), then 0.952 with the previous commit's worker at 0.964 in the same
run — the goal of 0.98 is not met reliably. A py-spy profile of rank 0 shows no single cost of the
worker's own: forward/backward/optimizer ~90 %, data loading ~8 % (of which the per-batch RNG
save/restore of the seeded batches ~0.1 ms of a ~15 ms step). Before/after the worker fixes, in one run
(``--only off --rounds 12 --slot 3 --baseline-repo DIR`` with DIR = ``git archive`` of the worker
before them): 0.934 before, 0.972 after.

Both train the digits example (``DigitsNet`` width 32, the shifted training images, AdamW,
cosine LR) with 2 gloo ranks on this machine, per-rank batch 32, ``num_workers=0``,
``OMP_NUM_THREADS=1`` per rank (``--threads``), and log every 10 steps:

* **worker**: ``slurm-ddp submit examples/digits/job.yaml --backend local`` — the real launcher
  and worker (preemption-flag agreement, seeded resumable batches, metrics, rank-0 async
  checkpoints of the full state including every rank's RNG);
* **minimal**: ``benchmarks/minimal_ddp.py`` — the classic setup/DistributedSampler/DDP/
  rank-0-``torch.save`` script, started as 2 processes with ``RANK``/``WORLD_SIZE``/``MASTER_*``,
  each in its own session like the local launcher's ranks (with the kernel's sched_autogroup a
  session is scheduled as one group against other load: two ranks sharing one session got ~15 %
  less CPU than the worker's under load, which flattered the worker).

Steady state only: rates come from the ``metrics.jsonl`` records (step, time) after step
``--warmup``; process start, data loading, the first steps, the final eval and the final save are
outside every window. Ratios: checkpointing off in both (goal ≥ 0.98); on every ``--ckpt-every``
steps in both (worker async, minimal a synchronous ``torch.save`` on rank 0; goal ≥ 0.95); worker
on vs minimal off.

This machine is shared and has 2 cores: one job's speed swings by ±30 % from minute to minute
with other load — far more than the effect measured — so runs one after the other (``--mode
sequential``: the plain definition, median of per-round ratios) scatter widely. The default
``alternating`` mode starts the four jobs (worker/minimal × checkpointing off/on, each with a
huge ``max_steps``) one after the other, takes each past its warm-up, and pauses it (SIGSTOP of its
rank processes). Then, ``--rounds`` times, every job in turn (rotating order) is resumed
(SIGCONT), runs ``--settle`` s, is measured for ``--slot`` s — steps/s between its records, CPU
seconds per step of its two rank processes from /proc — and paused again. So the jobs never compete
with each other, each is measured in steady state, and the external load is sampled alike for all
of them, seconds apart. The ratio reported is the median over rounds of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "digits" / "job.yaml"
MINIMAL = REPO / "benchmarks" / "minimal_ddp.py"
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids: List[int]) -> float:
    """utime + stime of ``pids`` (all their threads), from /proc/PID/stat."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return total * TICK_S


def children(ppid: int, marker: str) -> List[int]:
    """Processes whose parent is ``ppid`` and whose command line contains ``marker``."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == ppid and marker in (d / "cmdline").read_text():
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def base_env(threads: int, repo: Path = REPO) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE"))}
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONPATH"] = str(repo) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


class Job:
    """One 2-rank training job (worker or minimal) and the train records it has written so far."""

    def __init__(self, kind: str, out: Path, steps: int, ckpt_every: int, args: argparse.Namespace):
        self.kind, self.out, self.metrics = kind, out, out / "metrics.jsonl"
        self.records: List[Tuple[int, float]] = []  # (step, time) of each train record
        self._offset, self._buf = 0, ""
        self._pids: List[int] = []
        self.log: List[str] = []
        shutil.rmtree(out, ignore_errors=True)
        if kind in ("worker", "baseline"):  # baseline: the worker of another checkout (--baseline-repo)
            repo = Path(args.baseline_repo) if kind == "baseline" else REPO
            cmd = [
                sys.executable,
                "-m",
                "slurm_ddp",
                "submit",
                str(repo / "examples" / "digits" / "job.yaml"),
                "--backend",
                "local",
                "--run-dir",
                str(out),
                "--no-check-task",
            ]
            for s in [
                f"train.max_steps={steps}",
                "train.eval_every=0",
                f"train.log_every={args.log_every}",
                "train.num_workers=0",
                "train.batch_size=32",
                "train.args.width=32",
                f"checkpoint.every_steps={ckpt_every}",
                "checkpoint.async_save=true",
                *args.worker_set,
            ]:
                cmd += ["--set", s]
            p = subprocess.Popen(
                cmd, env=base_env(args.threads, repo), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            threading.Thread(target=lambda: self.log.extend(p.stdout), daemon=True).start()
            self.procs = [p]
        else:
            out.mkdir(parents=True)
            port = free_port()
            self.procs = []
            for rank in range(2):
                env = base_env(args.threads)
                env.update(
                    RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
                )
                cmd = [
                    sys.executable,
                    str(MINIMAL),
                    "--out",
                    str(out),
                    "--steps",
                    str(steps),
                    "--log-every",
                    str(args.log_every),
                    "--ckpt-every",
                    str(ckpt_every),
                ]
                with open(out / f"rank-{rank}.log", "w") as log:
                    # a session per rank, as the local launcher starts the worker's ranks: with the kernel's
                    # sched_autogroup each session is scheduled as one group against the machine's other load
                    self.procs.append(
                        subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                    )

    def pids(self) -> List[int]:
        """The two rank processes (under the local launcher: its children, the ranks)."""
        if len(self._pids) < 2:
            self._pids = (
                children(self.procs[0].pid, "slurm_ddp.worker")
                if self.kind != "minimal"
                else [p.pid for p in self.procs]
            )
        return self._pids

    def poll(self) -> List[Tuple[int, float]]:
        """Read new train records; returns them."""
        if not self.metrics.exists():
            return []
        with open(self.metrics) as f:
            f.seek(self._offset)
            data = f.read()
            self._offset = f.tell()
        self._buf += data
        *lines, self._buf = self._buf.split("\n")
        new = []
        for line in lines:
            if line.strip():
                r = json.loads(line)
                if r.get("event") == "train":
                    new.append((r["step"], r["time"]))
        self.records += new
        return new

    @property
    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def check(self) -> None:
        if any(p.returncode for p in self.procs):
            text = (
                "".join(self.log)
                if self.kind != "minimal"
                else "\n".join((self.out / f"rank-{r}.log").read_text() for r in range(2))
            )
            raise RuntimeError(f"{self.kind} run in {self.out} failed:\n{text[-4000:]}")

    def kill(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def step_at(self, t: float) -> float:
        """The step count at time ``t``, interpolated linearly between train records."""
        recs = self.records
        for (s0, t0), (s1, t1) in zip(recs, recs[1:]):
            if t0 <= t <= t1:
                return s0 + (s1 - s0) * (t - t0) / (t1 - t0)
        raise ValueError(f"{self.kind}: time {t} outside its records")


def run_alone(kind: str, out: Path, args: argparse.Namespace, ckpt: bool) -> Tuple[float, float]:
    """Sequential mode: (steps/s, CPU s per step) of one job running alone, over its steady window."""
    job = Job(kind, out, args.steps, args.ckpt_every if ckpt else 0, args)
    points = []  # (step, time, cpu)
    while job.running:
        for step, t in job.poll():
            points.append((step, t, cpu_seconds(job.pids())))
        time.sleep(0.005)
    for step, t in job.poll():
        points.append((step, t, cpu_seconds(job.pids())))
    job.check()
    pts = [p for p in points if p[0] >= args.warmup]
    (s0, t0, c0), (s1, t1, c1) = pts[0], pts[-1]
    return (s1 - s0) / (t1 - t0), (c1 - c0) / (s1 - s0)


def run_alternating(args: argparse.Namespace, configs: List[Tuple[str, bool]], root: Path) -> Dict:
    """All jobs run at once but take turns: each slot resumes one job (SIGCONT), lets it settle, measures
    its steady-state steps/s and CPU per step for ``--slot`` seconds, and stops it again (SIGSTOP)."""
    jobs = {
        c: Job(c[0], root / f"{c[0]}-{'ckpt' if c[1] else 'nockpt'}", 10**6, args.ckpt_every if c[1] else 0, args)
        for c in configs
    }
    results: Dict[Tuple[str, bool], List[Tuple[float, float]]] = {c: [] for c in configs}

    def pause(job: Job, sig: int) -> None:
        for pid in job.pids():
            os.kill(pid, sig)

    try:
        for c, job in jobs.items():  # start-up, one at a time, to the end of the warm-up steps
            deadline = time.monotonic() + 600
            while len(job.pids()) < 2 or not job.records or job.records[-1][0] < args.warmup:
                job.poll()
                if not job.running:
                    job.check()
                    raise RuntimeError(f"{c} ended early")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{c} did not reach step {args.warmup}")
                time.sleep(0.02)
            pause(job, signal.SIGSTOP)
        for rnd in range(args.rounds):
            k = rnd % len(configs)
            for c in configs[k:] + configs[:k]:  # rotate the order each round
                job = jobs[c]
                pause(job, signal.SIGCONT)
                time.sleep(args.settle)
                job.poll()
                (s0, t0), c0 = job.records[-1], cpu_seconds(job.pids())
                time.sleep(args.slot)
                job.poll()
                (s1, t1), c1 = job.records[-1], cpu_seconds(job.pids())
                pause(job, signal.SIGSTOP)
                if not job.running:
                    job.check()
                results[c].append(((s1 - s0) / (t1 - t0), (c1 - c0) / (s1 - s0)))
                print(
                    f"  round {rnd}: {c[0]:8s} checkpoint {'on ' if c[1] else 'off'}: {results[c][-1][0]:6.2f} "
                    f"steps/s, {results[c][-1][1] * 1e3:6.2f} CPU-ms/step (2 ranks; steps {s0}..{s1})",
                    flush=True,
                )
    finally:
        for job in jobs.values():
            try:
                pause(job, signal.SIGCONT)
            except ProcessLookupError:
                pass
            job.kill()
    return results


PAIRS = [  # label, worker checkpointing, minimal checkpointing, goal
    ("checkpointing off in both", False, False, 0.98),
    ("checkpointing on in both", True, True, 0.95),
    ("worker checkpointing on vs minimal off", True, False, 0.95),
]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=["alternating", "sequential"], default="alternating")
    p.add_argument("--rounds", type=int, default=8, help="slots per job (alternating) or runs per job (sequential)")
    p.add_argument("--slot", type=float, default=4.0, help="alternating: seconds measured per slot")
    p.add_argument("--settle", type=float, default=1.0, help="alternating: seconds run before measuring")
    p.add_argument("--steps", type=int, default=300, help="sequential: steps of each run")
    p.add_argument("--warmup", type=int, default=50, help="steps excluded at the start (a multiple of --log-every)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS per rank; 0 = leave unset")
    p.add_argument("--only", choices=["off", "on", "on-vs-off"], help="only one configuration")
    p.add_argument(
        "--baseline-repo",
        metavar="DIR",
        help="alternating: also run the worker of this checkout (e.g. `git archive HEAD` unpacked), "
        "for before/after comparisons",
    )
    p.add_argument(
        "--worker-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra --set for the worker, e.g. train.gradient_as_bucket_view=false (the minimal script's DDP default)",
    )
    args = p.parse_args(argv)

    pairs = PAIRS
    if args.only:
        pairs = [PAIRS[["off", "on", "on-vs-off"].index(args.only)]]
    root = Path(tempfile.mkdtemp(prefix="bench_worker_"))
    windows = (
        f"{args.rounds} slots of {args.slot:g} s per job after step {args.warmup}"
        if args.mode == "alternating"
        else f"{args.rounds} runs per job, window steps {args.warmup}..{args.steps}"
    )
    print(
        f"P1 ({args.mode}): 2 gloo ranks per job, digits width 32, batch 32/rank, {windows}, "
        f"OMP_NUM_THREADS={args.threads or 'unset'}, checkpoint every "
        f"{args.ckpt_every} steps when on; worker --set {' '.join(args.worker_set) or '(none)'}; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        flush=True,
    )
    summary = []
    try:
        if args.mode == "alternating":
            configs = [("worker", False), ("minimal", False), ("worker", True), ("minimal", True)]
            if args.only:
                configs = sorted({("worker", w) for _, w, _, _ in pairs} | {("minimal", m) for _, _, m, _ in pairs})
            if args.baseline_repo:
                configs += [("baseline", w) for w in sorted({w for _, w, _, _ in pairs})]
            res = run_alternating(args, configs, root)
            for label, w_ckpt, m_ckpt, goal in pairs:
                w, m = res[("worker", w_ckpt)], res[("minimal", m_ckpt)]
                ratios = [a[0] / b[0] for a, b in zip(w, m)]  # slots of the same round
                med = statistics.median(ratios)
                cpu_ratio = statistics.median(b[1] for b in m) / statistics.median(a[1] for a in w)
                print(
                    f"{label}: worker {statistics.median(a[0] for a in w):.2f} / minimal "
                    f"{statistics.median(b[0] for b in m):.2f} steps/s (medians); per-round ratios "
                    f"{', '.join(f'{r:.3f}' for r in ratios)}; median {med:.3f} (goal >= {goal}: "
                    f"{'met' if med >= goal else 'NOT met'}); steps per CPU-second ratio {cpu_ratio:.3f}",
                    flush=True,
                )
                summary.append(f"{label} {med:.3f} (CPU {cpu_ratio:.3f})")
                if args.baseline_repo:
                    b = res[("baseline", w_ckpt)]
                    bmed = statistics.median(x[0] / y[0] for x, y in zip(b, m))
                    bcpu = statistics.median(y[1] for y in m) / statistics.median(x[1] for x in b)
                    print(
                        f"  baseline worker ({args.baseline_repo}) / minimal, {label}: median {bmed:.3f}; "
                        f"steps per CPU-second ratio {bcpu:.3f}",
                        flush=True,
                    )
                    summary.append(f"baseline {label} {bmed:.3f} (CPU {bcpu:.3f})")
        else:
            configs = sorted({("worker", w) for _, w, _, _ in pairs} | {("minimal", m) for _, _, m, _ in pairs})
            wall: Dict[tuple, List[float]] = {c: [] for c in configs}
            for rnd in range(args.rounds):
                k = rnd % len(configs)
                for kind, ckpt in configs[k:] + configs[:k]:  # rotate the order each round
                    rate, cpu = run_alone(kind, root / f"{kind}-{ckpt}", args, ckpt)
                    wall[(kind, ckpt)].append(rate)
                    print(
                        f"  round {rnd}: {kind:7s} checkpoint {'on ' if ckpt else 'off'}: {rate:6.2f} steps/s, "
                        f"{cpu * 1e3:6.2f} CPU-ms/step",
                        flush=True,
                    )
            for label, w_ckpt, m_ckpt, goal in pairs:
                rs = [a / b for a, b in zip(wall[("worker", w_ckpt)], wall[("minimal", m_ckpt)])]
                med = statistics.median(rs)
                print(
                    f"{label}: per-round ratios {', '.join(f'{r:.3f}' for r in rs)}; median {med:.3f} "
                    f"(goal >= {goal}: {'met' if med >= goal else 'NOT met'})"
                )
                summary.append(f"{label} {med:.3f}")
    except BaseException:
        print(f"(run directories kept in {root})", file=sys.stderr)
        raise
    shutil.rmtree(root, ignore_errors=True)
    print(f"P1 worker/minimal steady-state steps/s ({args.mode}): " + "; ".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
