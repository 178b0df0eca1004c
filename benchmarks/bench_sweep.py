"""Scale of a sweep: ``render``, ``submit --dry-run``, ``submit`` and ``status`` of a 1,000-element sweep.

    python benchmarks/bench_sweep.py [--elements 1000] [--rounds 3]

Writes a sweep of the digits example (``train.lr`` x ``train.seed``, ``--elements`` in all) to a
temporary directory and times, as the user runs them (``python -m slurm_ddp ...`` in a fresh
process, wall clock, best of ``--rounds``): ``render``, ``submit --dry-run`` (it asks ``scontrol
show config`` for MaxArraySize), ``submit`` (writes the sweep directory and its 1,000 run
directories, one ``sbatch --array``), and ``status SWEEP`` (one ``squeue --array`` for all elements).
Slurm's commands are fakes on PATH that answer at once (``sbatch`` prints a job id, ``squeue``
prints one line per task, ``scontrol`` a MaxArraySize), so the numbers are slurm_ddp's own cost.
Goal: render, dry run and status each under 2 s. Prints the numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fake_slurm(bindir: Path, n: int) -> None:
    bindir.mkdir(parents=True)
    lines = "".join(f"4242_{i}|{'RUNNING' if i < 8 else 'PENDING'}|None|n1\n" for i in range(n))
    (bindir / "squeue.out").write_text(lines)
    (bindir / "sbatch").write_text("#!/bin/sh\necho 4242\n")
    (bindir / "scontrol").write_text("#!/bin/sh\necho 'MaxArraySize            = 1001'\n")
    (bindir / "squeue").write_text(f"#!/bin/sh\ncat {bindir / 'squeue.out'}\n")
    (bindir / "sacct").write_text("#!/bin/sh\nexit 1\n")
    for p in ("sbatch", "scontrol", "squeue", "sacct"):
        (bindir / p).chmod(0o755)


def sweep_yaml(path: Path, n: int) -> None:
    seeds = max(1, n // 10)
    lrs = [round(0.001 * (i + 1), 6) for i in range(n // seeds)]
    text = (REPO / "examples" / "digits" / "sweep.yaml").read_text().split("sweep:")[0]
    text = text.replace(
        "task: digits_task:DigitsTask", f"task: digits_task:DigitsTask\n  pythonpath: [{REPO}/examples/digits]"
    )
    text += f"sweep:\n  grid:\n    train.lr: {lrs}\n    train.seed: {list(range(seeds))}\n"
    path.write_text(text)


def timed(argv, env, rounds: int, cwd: Path):
    """(best wall seconds, its CPU seconds: user + system of the process and its children)."""
    best = (float("inf"), 0.0)
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        r = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
        dt = time.perf_counter() - t
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed: {r.stderr.strip()}")
        best = min(best, (dt, cpu))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elements", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        fake_slurm(tmp / "bin", a.elements)
        job = tmp / "sweep.yaml"
        sweep_yaml(job, a.elements)
        env = {**os.environ, "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
        py = [sys.executable, "-m", "slurm_ddp"]
        sd = tmp / "sweep"
        results = {
            "render": timed([*py, "render", str(job), "--run-dir", str(sd)], env, a.rounds, tmp),
            "submit --dry-run": timed(
                [*py, "submit", str(job), "--backend", "sbatch", "--dry-run", "--run-dir", str(sd)], env, a.rounds, tmp
            ),
            "submit (writes 1 + N run directories, one sbatch)": timed(
                [*py, "submit", str(job), "--backend", "sbatch", "--no-check-task", "--run-dir", str(sd)], env, 1, tmp
            ),
            "status SWEEP (one squeue for all elements)": timed([*py, "status", str(sd)], env, a.rounds, tmp),
            "runs (the sweep as one line)": timed([*py, "runs", str(tmp)], env, a.rounds, tmp),
        }
        n = len([p for p in sd.iterdir() if p.is_dir()])
        print(f"sweep of {a.elements} elements ({n} element directories), best of {a.rounds} rounds:")
        print(f"  {'':<52} {'wall':>8} {'CPU':>8}")
        for k, (wall, cpu) in results.items():
            goal = k in ("render", "submit --dry-run") or k.startswith("status")
            print(f"  {k:<52} {wall:6.3f} s {cpu:6.3f} s" + ("   (goal: wall < 2 s)" if goal else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
