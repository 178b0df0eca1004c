"""The submit-time task import check with its cache (``preflight.ImportCache``) hit ÷ missed.

``python benchmarks/bench_submit_check.py [--pairs 5] [--job examples/digits/job.yaml]``

Each pair checks the job's ``train.task`` twice in this process: once with an emptied cache (a miss: the child
imports the task, torch with it) and once with the cache the miss wrote (a hit: a stat of every file the
import loaded). Wall seconds and this process's children's CPU seconds per check; prints the medians and the
ratio hit ÷ miss (goal: ≤ 0.05, a submit that does not pay ``import torch`` again). The cache lives in a
temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurm_ddp.config import JobConfig, load_config  # noqa: E402
from slurm_ddp.preflight import ImportCache, check_task_imports  # noqa: E402


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(cfg: JobConfig, cache: ImportCache) -> tuple:
    t0, c0 = time.perf_counter(), children_cpu_s()
    check_task_imports(cfg, cache=cache)
    return time.perf_counter() - t0, children_cpu_s() - c0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--job", default=str(REPO / "examples" / "digits" / "job.yaml"))
    args = ap.parse_args()
    cfg = load_config(args.job)
    root = Path(tempfile.mkdtemp(prefix="bench-submit-check-"))
    try:
        cache = ImportCache(root / "cache")
        miss, hit = [], []
        for _ in range(args.pairs):
            shutil.rmtree(cache.directory, ignore_errors=True)
            miss.append(timed(cfg, cache))
            hit.append(timed(cfg, cache))
        entry = next(cache.directory.glob("*.json"))
        files = entry.read_text().count('"/')
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mw, mc = statistics.median(m[0] for m in miss), statistics.median(m[1] for m in miss)
    hw, hc = statistics.median(h[0] for h in hit), statistics.median(h[1] for h in hit)
    print(f"train.task {cfg.train.task}: {args.pairs} pairs; the hit stats {files} files and directories")
    print(f"miss (child imports the task): {mw:.3f} s wall, {mc:.2f} s children's CPU")
    print(f"hit  (cache):                  {hw:.3f} s wall, {hc:.2f} s children's CPU")
    print(f"ratio hit / miss (wall): {hw / mw:.4f}  (goal <= 0.05)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
