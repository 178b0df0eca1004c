"""Checkpoint benchmarks, one command, ratios measured in one run:

1. **training time blocked per checkpoint, async ÷ sync** (goal <= 0.05): a training loop of a stack of
   Linear layers + AdamW whose checkpoint (model + optimizer) is ~200 MB checkpoints every few steps,
   alternately with ``CheckpointManager.save`` on the training thread (sync) and with
   ``AsyncCheckpointer`` (async), so both see the same machine conditions. Blocked = wall time from
   calling save to getting back to training; for async that includes any wait for its write at the
   next checkpoint (and at the end).
2. **durable save bandwidth ÷ ``dd if=/dev/zero of=… bs=1M count=… conv=fsync``** (goal >= 0.8) on the
   same filesystem and size, for ~10 MB, ~100 MB and ~1 GB checkpoints made of 4 MiB tensors
   (``--skip-1gb`` leaves the last out). ``dd``'s own reported time is used (its process start is not
   counted against it); the save is a full ``CheckpointManager.save`` commit (data file + manifest,
   fsyncs, renames, directory fsync) into a fresh directory (no older checkpoint to prune).

    python benchmarks/bench_checkpoint.py                 # both, ~1-2 minutes on 2 cores
    python benchmarks/bench_checkpoint.py --skip-1gb --reps 3
    python benchmarks/bench_checkpoint.py --only bandwidth --dir /scratch/me/ckpt-bench

Everything written goes under ``--dir`` (default: a fresh directory in the current one, i.e. the
filesystem checkpoints would go to when run from a run directory) and is deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from slurm_ddp.checkpoint import AsyncCheckpointer, CheckpointManager

MB = 1_000_000
MIB = 1 << 20


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = float("nan")
    return (
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} cores, {mem:.0f} GiB RAM, "
        f"python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )


def filesystem(path: Path) -> str:
    try:
        out = subprocess.run(["df", "-hT", str(path)], capture_output=True, text=True, check=True).stdout
        fields = out.splitlines()[-1].split()
        return f"{fields[0]} ({fields[1]}, {fields[4]} free)"
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "?"


class OtherLoad:
    """How busy the machine was with *other* processes during a measurement (Linux ``/proc/stat``)."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        import resource

        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return None
        me = sum(
            getattr(resource.getrusage(w), a)
            for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
            for a in ("ru_utime", "ru_stime")
        )
        return sum(fields), fields[3] + fields[4], me, time.perf_counter()

    def percent(self) -> float:
        """CPU time of other processes, in % of all the cores' time, since construction."""
        end = self._sample()
        if self.start is None or end is None:
            return float("nan")
        hz = os.sysconf("SC_CLK_TCK")
        total = (end[0] - self.start[0]) / hz
        busy = total - (end[1] - self.start[1]) / hz
        return 100.0 * max(0.0, busy - (end[2] - self.start[2])) / total if total > 0 else float("nan")


# --------------------------------------------------------------------------- blocked time


def build(width: int, layers: int, seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def bench_blocked(workdir: Path, args) -> float:
    """One training loop whose checkpoints alternate sync, async, sync, async, ... in pairs, so both
    modes see the same conditions.

    Before every checkpoint the loop waits for a pending background write, as the worker does before
    a sync save; that wait is charged to the async checkpoint whose write it waits for. A sync
    checkpoint's blocked time is its ``CheckpointManager.save``; an async one's is its
    ``AsyncCheckpointer.save`` (snapshot to CPU, hand-off to the writer thread) plus that wait.
    A pair during which other processes used more than ``--quiet`` % of the CPU is not counted
    (and another pair is run, up to ``--patience`` x as many as asked).
    """
    width, layers = args.width, args.layers
    params = layers * (width * width + width)
    want = max(1, args.checkpoints // 2)
    print(
        f"\n== training time blocked per checkpoint: {layers} x Linear({width}, {width}) + AdamW, "
        f"{params / 1e6:.1f} M parameters, batch {args.batch}; {want} pairs of checkpoints (sync, then async), "
        f"one every {args.every} steps"
    )
    torch.set_flush_denormal(True)
    model, opt = build(width, layers)
    x = torch.randn(args.batch, width, generator=torch.Generator().manual_seed(1))
    y = torch.randn(args.batch, width, generator=torch.Generator().manual_seed(2))
    mgr = CheckpointManager(workdir / "blocked", keep_last=2)
    writer = AsyncCheckpointer(mgr)
    steps_after = {"sync": [], "async": []}  # step times while the previous checkpoint was sync / async
    state_of = {"step": 0, "last": None}

    def train(n: int) -> dict:
        for _ in range(n):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            writer.check()  # what the worker does every step: surface a writer error
            state_of["step"] += 1
            if state_of["last"] is not None:
                steps_after[state_of["last"]].append(time.perf_counter() - t0)
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": state_of["step"]}

    pairs, pending, load = [], None, None
    t_start = time.perf_counter()
    prepare_s = None
    if not args.no_prepare and hasattr(writer, "prepare"):
        # what the worker does after its first step: the snapshot buffers are allocated on the
        # writer thread while training goes on, so no checkpoint waits for fresh memory
        state = train(1)
        t0 = time.perf_counter()
        writer.prepare({"model": state["model"], "optimizer": state["optimizer"]})
        prepare_s = time.perf_counter() - t0
    while True:
        state = train(args.every)
        t0 = time.perf_counter()
        writer.wait()  # a pending background write: part of the previous (async) checkpoint's cost
        waited = time.perf_counter() - t0
        if pending is not None:
            pending["async"] += waited
            pending["wait"] = waited
            pending["other"] = load.percent()
            pairs.append(pending)
            pending = None
        if sum(p["other"] <= args.quiet for p in pairs) >= want or len(pairs) >= args.patience * want:
            break
        load = OtherLoad()
        t0 = time.perf_counter()
        mgr.save(state, state["step"])
        sync = time.perf_counter() - t0
        state_of["last"] = "sync"
        state = train(args.every)
        t0 = time.perf_counter()
        writer.save(state, state["step"])
        pending = {"sync": sync, "async": time.perf_counter() - t0, "first": not pairs}
        state_of["last"] = "async"
    total = time.perf_counter() - t_start
    info = mgr.latest()
    assert info is not None and info.step == state_of["step"] - args.every, info
    getattr(writer, "close", writer.wait)()  # (close: this version; wait: older ones)
    shutil.rmtree(workdir / "blocked", ignore_errors=True)

    clean = [p for p in pairs if p["other"] <= args.quiet]
    print(
        f"  checkpoint {info.size_bytes / MB:.0f} MB; {state_of['step']} steps in {total:.1f} s; "
        f"{len(pairs)} pairs, {len(pairs) - len(clean)} of them disturbed by other processes (> {args.quiet:.0f} % "
        f"of the CPU) and not counted: " + ", ".join(f"{p['other']:.0f}" for p in pairs) + " %"
    )
    if not clean:
        print("  never quiet enough: run again, or raise --quiet")
        return float("nan")
    for mode in ("sync", "async"):
        b = [p[mode] for p in clean]
        print(
            f"  {mode:5s}: blocked per checkpoint: mean {statistics.mean(b) * 1e3:7.1f} ms, median "
            f"{statistics.median(b) * 1e3:7.1f} ms, max {max(b) * 1e3:7.1f} ms "
            f"({', '.join(f'{v * 1e3:.0f}' for v in b)} ms)"
        )
    waits = ", ".join(f"{p['wait'] * 1e3:.0f}" for p in clean)
    if prepare_s is None:
        print(
            f"  (async: the first checkpoint allocates the snapshot buffers: {pairs[0]['async'] * 1e3:.0f} ms; "
            f"of the async times, waiting for the write at the next checkpoint: {waits} ms)"
        )
    else:
        print(
            f"  (async: the snapshot buffers were allocated in the background after step 1 (prepare: "
            f"{prepare_s * 1e3:.1f} ms blocked); the first checkpoint took {pairs[0]['async'] * 1e3:.0f} ms; "
            f"of the async times, waiting for the write at the next checkpoint: {waits} ms)"
        )
    s_, a_ = [p["sync"] for p in clean], [p["async"] for p in clean]
    ratio = statistics.mean(a_) / statistics.mean(s_)
    steady = [p for p in clean if not p["first"]]
    line = f"  blocked per checkpoint, async / sync: {ratio:.3f} (means over the counted pairs; goal <= 0.05)"
    if steady:
        sr = statistics.mean(p["async"] for p in steady) / statistics.mean(p["sync"] for p in steady)
        line += f"; {sr:.3f} without the first checkpoint"
    print(line)
    if steps_after["sync"] and steps_after["async"]:
        ms, ma = statistics.median(steps_after["sync"]), statistics.median(steps_after["async"])
        print(
            f"  (not counted as blocked: the background write shares the {os.cpu_count()} cores with training; "
            f"median step {ma * 1e3:.0f} ms after an async checkpoint vs {ms * 1e3:.0f} ms after a sync one)"
        )
    return ratio


# --------------------------------------------------------------------------- bandwidth


_DD_TIME = re.compile(r"copied, ([0-9.,eE+-]+) s")


def dd_seconds(path: Path, count: int) -> float:
    t0 = time.perf_counter()
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={count}", "conv=fsync"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LC_ALL": "C"},
    )
    wall = time.perf_counter() - t0
    m = _DD_TIME.search(out.stderr)
    return float(m.group(1).replace(",", ".")) if m else wall


def bench_bandwidth(workdir: Path, sizes_mib, reps: int, quiet: float, patience: int) -> dict:
    print(
        f"\n== durable save bandwidth vs dd conv=fsync: {reps} rounds of (dd, save) per size, medians; the state "
        f"is made of 4 MiB tensors, like a model's"
    )
    if quiet < 100:
        print(
            f"   a round during which other processes used more than {quiet:.0f} % of the CPU is not counted and "
            f"run again (up to {patience} x {reps} rounds in all)"
        )
    ratios = {}
    for mib in sizes_mib:
        # shaped like a model's state: 4 MiB tensors (a Linear(1024, 1024) weight each) and the rest
        g = torch.Generator().manual_seed(mib)
        n = mib * MIB // 4
        state = {
            f"layer.{i}.weight": torch.randn(min(1 << 20, n - i * (1 << 20)), generator=g)
            for i in range((n + (1 << 20) - 1) >> 20)
        }
        dd_bw, save_bw, disturbed = [], [], []
        rounds = 0
        while len(dd_bw) < reps and rounds < patience * reps + 1:
            rounds += 1
            os.sync()
            load = OtherLoad()
            f = workdir / f"dd-{mib}.bin"
            t = dd_seconds(f, mib)
            f.unlink()
            os.sync()
            d = workdir / f"save-{mib}-{rounds}"
            mgr = CheckpointManager(d, keep_last=1)
            t0 = time.perf_counter()
            info = mgr.save(state, rounds)
            ts = time.perf_counter() - t0
            other = load.percent()
            shutil.rmtree(d)
            if rounds == 1:
                continue  # warm-up (allocations, page cache, first fsyncs); not counted
            if other > quiet:
                disturbed.append(other)
                time.sleep(1.0)
                continue
            dd_bw.append(mib * MIB / t)
            save_bw.append(info.size_bytes / ts)
        if not dd_bw:
            print(
                f"  {mib * MIB / MB:6.0f} MB: never quiet enough ({len(disturbed)} rounds disturbed); "
                f"run again, or raise --quiet"
            )
            continue
        dd_m, save_m = statistics.median(dd_bw), statistics.median(save_bw)
        ratios[mib] = save_m / dd_m
        print(
            f"  {mib * MIB / MB:6.0f} MB: save {save_m / MB:7.1f} MB/s  dd {dd_m / MB:7.1f} MB/s  "
            f"ratio {ratios[mib]:.2f} (goal >= 0.8)   [save {', '.join(f'{b / MB:.0f}' for b in save_bw)}; "
            f"dd {', '.join(f'{b / MB:.0f}' for b in dd_bw)}; {len(disturbed)} disturbed rounds not counted]"
        )
    return ratios


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--only", choices=["blocked", "bandwidth"], help="run one of the two benchmarks")
    p.add_argument("--dir", type=Path, help="where to write (default: a fresh directory in the current one)")
    p.add_argument("--skip-1gb", action="store_true", help="leave the ~1 GB bandwidth point out (short on disk)")
    p.add_argument("--reps", type=int, default=5, help="bandwidth rounds per size (default 5)")
    p.add_argument(
        "--quiet",
        type=float,
        default=10.0,
        help="rounds during which other processes used more "
        "than this %% of the machine's CPU are run again (default 10; 100 counts every round)",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=6,
        help="at most PATIENCE x REPS rounds per size, or PATIENCE x CHECKPOINTS checkpoints (default 6)",
    )
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--layers", type=int, default=16, help="Linear layers (default 16: a ~200 MB checkpoint)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument(
        "--checkpoints", type=int, default=12, help="checkpoints counted, half sync, half async (default 12)"
    )
    p.add_argument("--every", type=int, default=8, help="a checkpoint every N steps (default 8)")
    p.add_argument(
        "--no-prepare",
        action="store_true",
        help="do not call AsyncCheckpointer.prepare after the "
        "first step: the first async checkpoint then allocates its snapshot buffers itself",
    )
    args = p.parse_args(argv)

    base = args.dir or Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=".bench-checkpoint-", dir=base))
    sizes = [10, 100] + ([] if args.skip_1gb else [1000])
    need = (max(sizes) * 2 + 100) * MIB
    free = shutil.disk_usage(workdir).free
    try:
        print(f"machine: {machine()}")
        print(f"filesystem of {workdir}: {filesystem(workdir)}")
        if free < need:
            print(
                f"only {free / 2**30:.1f} GiB free in {workdir}, need {need / 2**30:.1f} GiB: use --skip-1gb or --dir"
            )
            return 2
        summary = []
        if args.only in (None, "blocked"):
            summary.append(f"blocked async/sync {bench_blocked(workdir, args):.3f}")
        if args.only in (None, "bandwidth"):
            ratios = bench_bandwidth(workdir, sizes, args.reps, args.quiet, args.patience)
            summary.append(
                "bandwidth save/dd " + ", ".join(f"{m * MIB / MB:.0f} MB {r:.2f}" for m, r in ratios.items())
            )
        print("\nsummary: " + "; ".join(summary))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
