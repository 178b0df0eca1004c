"""What the goodput report's records cost the training process (issue 23: "nothing measurable on step time").

The records: the worker's one ``first_step`` line per start (and, per save or evaluation, two clock
reads for ``blocked_s``/``duration_s``), and for a ``train.command`` script rank 0's watchdog samples
of its ``slurm_ddp.progress`` reports (``rundir.PROGRESS_NAME``: a separate process appends a line at
most once a second; the rank's only new work is writing its first step into the record once).

One process trains a small model on CPU (64 → WIDTH → 10 MLP, batch 32, SGD, 1 torch thread) in blocks
of about ``--block-s`` seconds, reporting every step through ``progress`` (``Progress.mark_step``, as
``progress.step`` does). Two progress records, each with a real watchdog process of this process
(``slurm_ddp.watchdog``, polling once a second): A's watchdog without samples, B's with samples into a
temporary run directory; B's blocks also start with the worker's ``first_step`` line in
``metrics.jsonl`` (a start per block, far more often than a real run). A and B blocks alternate (ABAB…)
so both see the same machine; printed: the median block time of each and B ÷ A in wall time and in the
training thread's CPU time (``time.thread_time``: what the records cost the rank, less the machine's other
load), the CPU time of each watchdog process over the run, the lines B's watchdog wrote, and
``mark_step``'s cost per call (``timeit``).

    python benchmarks/bench_report_records.py                 # 30 blocks each of ~1.5 s, width 256
    python benchmarks/bench_report_records.py --blocks 60 --width 64
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from slurm_ddp import progress, watchdog
from slurm_ddp.rundir import METRICS_NAME, append_jsonl, read_progress_samples


def _cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` in seconds (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _WithoutFirstStep(progress.Progress):
    """``mark_step`` as it was before the report's first-step record."""

    def mark_step(self, step: int) -> None:
        self._steps_reported += 1
        self.mark(step, progress.STEP)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=30, help="blocks per mode")
    ap.add_argument("--block-s", type=float, default=1.5, help="about this long each (the steps are calibrated)")
    ap.add_argument("--width", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def train_step() -> None:
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    work = Path(tempfile.mkdtemp(prefix="bench-report-records-"))
    limits = watchdog.Limits(timeout_floor_s=1e6, startup_s=1e6, eval_s=1e6, checkpoint_s=1e6, poll_interval_s=1.0)
    fds, pids, recs = [], [], []
    try:
        for samples in (False, True):
            fd = progress.create_record()
            argv = watchdog.command(
                sys.executable, pid=os.getpid(), fd=fd, run_dir=str(work), rank=0, world_size=1, host="bench",
                job_id="1", restart=0, limits=limits, samples=samples,
            )  # fmt: skip
            pids.append(watchdog.spawn(argv))
            fds.append(fd)
            recs.append(progress.Progress(fd))
            recs[-1].install_dump()
        rec_a, rec_b = recs
        for _ in range(200):  # warm up
            train_step()
        t0 = time.perf_counter()
        for _ in range(200):
            train_step()
        steps = max(int(args.block_s / ((time.perf_counter() - t0) / 200)), 100)
        print(f"width {args.width}: {steps} steps per block, {args.blocks} blocks per mode", flush=True)
        times = {"A": [], "B": []}  # type: dict[str, list[float]]
        cpu = {"A": [], "B": []}  # type: dict[str, list[float]]
        wd_cpu0 = [_cpu_s(p) for p in pids]
        n = 0
        for i in range(2 * args.blocks):
            mode = "AB"[i % 2]
            rec = rec_a if mode == "A" else rec_b
            t, c = time.perf_counter(), time.thread_time()
            if mode == "B":  # the worker's record of a start's first step (one line per start)
                append_jsonl(work / METRICS_NAME, {"event": "first_step", "step": n + 1, "job_id": "1", "time": 0.0})
            for _ in range(steps):
                train_step()
                n += 1
                rec.mark_step(n)
            times[mode].append(time.perf_counter() - t)
            cpu[mode].append(time.thread_time() - c)
        wd_cpu = [_cpu_s(p) - c0 for p, c0 in zip(pids, wd_cpu0)]
        med = {k: statistics.median(v) for k, v in times.items()}
        lines = len(read_progress_samples(work))
        wall = sum(times["A"]) + sum(times["B"])
        per_step_ms = med["A"] / steps * 1e3
        print(f"step time {per_step_ms:.3f} ms; median block A {med['A']:.4f} s, B {med['B']:.4f} s")
        print(f"B / A = {med['B'] / med['A']:.4f} ({(med['B'] / med['A'] - 1) * 100:+.2f} %)")
        mc = {k: statistics.median(v) for k, v in cpu.items()}
        print(
            f"CPU time of the training thread per block: A {mc['A']:.4f} s, B {mc['B']:.4f} s, B / A = {mc['B'] / mc['A']:.4f}"
        )
        print(f"watchdogs' CPU over the run: A (no samples) {wd_cpu[0]:.3f} s, B (samples) {wd_cpu[1]:.3f} s")
        q = [b / a for a, b in zip(times["A"], times["B"])]
        print(f"per-pair B/A: median {statistics.median(q):.4f}, quartiles {statistics.quantiles(q, n=4)}")
        print(
            f"B's watchdog wrote {lines} sample lines in {wall:.1f} s ({lines / wall:.2f}/s; B's steps only in B blocks)"
        )
        probe = progress.Progress(progress.create_record())
        k = 1_000_000
        t_mark = timeit.timeit(lambda: probe.mark(1, progress.STEP), number=k) / k * 1e6
        t_step = timeit.timeit(lambda: probe.mark_step(2), number=k) / k * 1e6
        old = _WithoutFirstStep(progress.create_record())
        t_old = timeit.timeit(lambda: old.mark_step(2), number=k) / k * 1e6
        print(
            f"per call (timeit, 10⁶ calls): Progress.mark {t_mark:.2f} µs, mark_step {t_step:.2f} µs, "
            f"mark_step without the first-step record {t_old:.2f} µs"
        )
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        for fd in fds:
            os.close(fd)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
