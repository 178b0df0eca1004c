"""What experiment tracking (``slurm_ddp.tracking``) adds per logged step, and that as a fraction of step time.

One process runs the task worker's training step of the digits example (``examples/digits``: its
``DigitsNet``, width 32, batch 32 of 8×8 images, AdamW + cosine schedule; forward, cross-entropy,
backward, optimizer and scheduler step) on CPU in blocks of ``--log-every`` steps. Each block ends with
a log step that writes the worker's train row to ``metrics.jsonl`` and, in the tracked blocks, hands it
to the ``Tracker`` (MLflow: a SQLite store in a temporary run directory, buffered; W&B: offline mode,
``run.log`` on the tracker's thread), as rank 0 of the worker does. Tracked and untracked blocks
alternate in phases of 4 so both see the same machine. Printed: the time tracking adds per logged step
(median tracked block − median untracked block, µs), that ÷ the untracked block (the fraction of step
time at this ``log_every``; goal < 2 %), the time ``Tracker.log`` holds the training thread, the step
size for which the measured cost is 2 %, and the one-off costs (create at submit, open at a start).

    python benchmarks/bench_tracking.py                  # both trackers, log_every 50, 40 blocks each
    python benchmarks/bench_tracking.py --only wandb --blocks 100
    python benchmarks/bench_tracking.py --e2e --pairs 4  # end to end: the digits job, tracking off vs on

``--e2e``: the whole digits job (``examples/digits/job.yaml``: the task worker, 2 ranks, local backend,
``train.max_steps`` ``--max-steps``, ``log_every`` ``--log-every``) runs ``--pairs`` times with tracking off
and as often with MLflow (its default SQLite store in the run directory) + W&B (offline) on, interleaved
in pairs (off, on), (on, off), (off, on) … so that both see the same machine. Per pair, the ratio on ÷ off
of (a) the training wall time, first step done → ``finished`` (``metrics.jsonl``: every logged step's
tracking, evaluations and checkpoints included; the goal is about this one) and (b) the whole
``slurm-ddp submit --wait`` wall time (adds the one-off costs: creating the tracker runs at submit,
opening them at the start, closing them). Printed: each pair, and the median ratio with its quartiles.
``--concurrent``: each pair's two runs at the same time instead; then (a) is the step-time ratio over the
seconds in which both trained (steps done by the untracked ÷ by the tracked run in that window, from their
``train`` rows): they see the same load at the same moment, so it is far less noisy on a shared machine,
while their whole training walls are not comparable (the tracked run starts training later, after the
other's start-up). The tracked run's extra CPU work (threads, wandb-core) also slows the untracked one
then, which hides up to about half of it on a saturated machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "digits"))

import torch
from digits_task import DigitsNet, load_split

from slurm_ddp.config import config_from_dict
from slurm_ddp.rundir import append_jsonl
from slurm_ddp.tracking import Tracker, prepare_run

#: blocks per phase (see the loop)
PHASE = 4


def _descendants(pid: int) -> list:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
        for kid in kids:
            out += [kid, *_descendants(kid)]
    return out


def cpu_s() -> float:
    """CPU seconds used so far by this process (all threads) and its live descendants (W&B's wandb-core)."""
    t = os.times()
    total = t.user + t.system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in _descendants(os.getpid()):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


REPO = Path(__file__).resolve().parents[1]


def e2e_run(work: Path, name: str, tracked: bool, max_steps: int, log_every: int) -> dict:
    """One run of the digits job (local backend, 2 ranks); its training and total wall seconds."""
    import json

    run = work / name
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(REPO / "examples" / "digits" / "job.yaml")]
    cmd += ["--backend", "local", "--wait", "--run-dir", str(run)]
    sets = [f"train.max_steps={max_steps}", f"train.log_every={log_every}"]
    sets += [f"tracking.mlflow.enabled={str(tracked).lower()}", f"tracking.wandb.enabled={str(tracked).lower()}"]
    for kv in sets:
        cmd += ["--set", kv]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    total = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{name}: exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    first = next(float(m["time"]) for m in events if m.get("event") == "first_step")
    done = next(float(m["time"]) for m in events if m.get("event") == "finished")
    points = [(float(m["time"]), int(m["step"])) for m in events if m.get("event") in ("first_step", "train")]
    if tracked and not ((run / "mlflow.db").exists() and (run / "wandb").is_dir()):
        raise RuntimeError(f"{name}: tracking was on but {run} holds no mlflow.db or wandb/")
    shutil.rmtree(run, ignore_errors=True)
    return {"train_s": done - first, "total_s": total, "points": points}


def steps_between(points: list, lo: float, hi: float) -> float:
    """Steps done between the times ``lo`` and ``hi`` (linear between the (time, step) rows)."""

    def at(t: float) -> float:
        for (t0, s0), (t1, s1) in zip(points, points[1:]):
            if t0 <= t <= t1:
                return s0 + (s1 - s0) * (t - t0) / (t1 - t0) if t1 > t0 else s1
        return float(points[0][1] if t < points[0][0] else points[-1][1])

    return at(hi) - at(lo)


def e2e(args: argparse.Namespace) -> int:
    """``--e2e``: see the module docstring."""
    os.environ.setdefault("WANDB_SILENT", "true")
    work = Path(tempfile.mkdtemp(prefix="bench-tracking-e2e-"))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: digits job, local backend, 2 ranks, max_steps "
        f"{args.max_steps}, log_every {args.log_every}; {args.pairs} pairs, "
        f"{'each pair at the same time' if args.concurrent else 'one run after the other'}; load average {load}",
        flush=True,
    )
    ratios = {"train_s": [], "total_s": []}
    try:
        for k in range(args.pairs):
            order = (False, True) if k % 2 == 0 else (True, False)
            res: dict = {}
            if args.concurrent:
                failed: list = []

                def one(on: bool, k: int = k, res: dict = res, failed: list = failed) -> None:
                    try:
                        res[on] = e2e_run(work, f"{k}-{'on' if on else 'off'}", on, args.max_steps, args.log_every)
                    except Exception as e:  # raised below, in the main thread
                        failed.append(e)

                threads = [threading.Thread(target=one, args=(on,)) for on in order]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                if failed:
                    raise failed[0]
            else:
                for on in order:
                    res[on] = e2e_run(work, f"{k}-{'on' if on else 'off'}", on, args.max_steps, args.log_every)
            for key in ratios:
                ratios[key].append(res[True][key] / res[False][key])
            if args.concurrent:  # the step-time ratio over the seconds both trained (see the docstring)
                lo = max(res[on]["points"][0][0] for on in res)
                hi = min(res[on]["points"][-1][0] for on in res)
                if hi - lo < 1.0:
                    raise RuntimeError(f"pair {k + 1}: the two runs trained together only {hi - lo:.1f} s")
                done = {on: steps_between(res[on]["points"], lo, hi) for on in res}
                ratios["train_s"][-1] = done[False] / done[True]
            print(
                f"pair {k + 1} ({'off, on' if order[0] is False else 'on, off'}): training {res[False]['train_s']:.1f} s "
                f"off, {res[True]['train_s']:.1f} s on (ratio {ratios['train_s'][-1]:.3f}); whole submit "
                f"{res[False]['total_s']:.1f} s off, {res[True]['total_s']:.1f} s on (ratio {ratios['total_s'][-1]:.3f})",
                flush=True,
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    train_words = (
        "step time over the seconds both trained" if args.concurrent else "training wall (first step -> finished)"
    )
    for key, words in (("train_s", train_words), ("total_s", "whole submit --wait")):
        xs = ratios[key]
        q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) > 1 else (xs[0],) * 3
        print(f"{words}: median ratio on/off {med:.3f} ({(med - 1) * 100:+.1f} %), quartiles {q1:.3f} .. {q3:.3f}")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"load average after: {load} (goal: training wall ratio < 1.02)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--e2e", action="store_true", help="end to end: the digits job, tracking off vs on")
    ap.add_argument("--pairs", type=int, default=4, help="--e2e: (off, on) pairs")
    ap.add_argument("--max-steps", type=int, default=1000, help="--e2e: train.max_steps")
    ap.add_argument("--concurrent", action="store_true", help="--e2e: each pair's two runs at the same time")
    ap.add_argument("--blocks", type=int, default=40, help="blocks of log_every steps per mode")
    ap.add_argument("--width", type=int, default=32, help="DigitsNet width (the example's job.yaml: 32)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a 1-CPU rank: 1)")
    ap.add_argument("--only", choices=("mlflow", "wandb"), help="one tracker (default: both)")
    args = ap.parse_args()
    if args.e2e:
        if args.pairs < 1 or args.max_steps < 1 or args.log_every < 1:
            ap.error("--pairs, --max-steps and --log-every must be positive")
        return e2e(args)
    os.environ.setdefault("WANDB_SILENT", "true")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = DigitsNet(width=args.width)
    opt = torch.optim.AdamW(model.parameters(), lr=0.003, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=10**9)
    x_train, y_train, _, _ = load_split()
    batches = [(x_train[i : i + 32], y_train[i : i + 32]) for i in range(0, len(y_train) - 31, 32)]

    work = Path(tempfile.mkdtemp(prefix="bench-tracking-"))
    try:
        on = {"mlflow": args.only in (None, "mlflow"), "wandb": args.only in (None, "wandb")}
        cfg = config_from_dict(
            {
                "name": "bench-tracking",
                "slurm": {"nodes": 1, "tasks_per_node": 1, "time": "00:10:00"},
                "train": {"command": ["python", "x.py"]},
                "tracking": {"mlflow": {"enabled": on["mlflow"]}, "wandb": {"enabled": on["wandb"]}},
            }
        )
        t0 = time.perf_counter()
        prepare_run(cfg, work)
        t_create = time.perf_counter() - t0
        t0 = time.perf_counter()
        tracker = Tracker.open(work, cfg, job_id="1", restart=0, host="bench")
        t_open = time.perf_counter() - t0
        assert tracker is not None and set(tracker.sinks) == {k for k, v in on.items() if v}, tracker
        metrics = work / "metrics.jsonl"

        step = 0
        loss_sum = torch.zeros(())
        cpu = {False: 0.0, True: 0.0}

        def block(tracked: bool) -> tuple:
            nonlocal step
            c0 = cpu_s()
            t0 = time.perf_counter()
            for _ in range(args.log_every):
                x, y = batches[step % len(batches)]
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                sched.step()
                loss_sum.add_(loss.detach())
                step += 1
            row = {"event": "train", "step": step, "epoch": 0, "loss": float(loss_sum) / args.log_every}
            row.update(steps_per_s=1.0, lr=sched.get_last_lr()[0], time=time.time())
            loss_sum.zero_()
            append_jsonl(metrics, row)
            t_log = time.perf_counter()
            if tracked:
                tracker.log(row)
            t_end = time.perf_counter()
            return t_end - t0, t_end - t_log, cpu_s() - c0

        for _ in range(3):  # warm-up: allocator, first MLflow batch, W&B's first history row
            block(False)
            block(True)
        # Phases of PHASE tracked then PHASE + 1 untracked blocks: W&B's run.log runs on the tracker's
        # thread after its block ended, so the first untracked block after a tracked phase still does
        # tracked work; it is not counted.
        off, tracked, held = [], [], []
        while len(tracked) < args.blocks:
            for _ in range(PHASE):
                t, h, c = block(True)
                tracked.append(t)
                held.append(h)
                cpu[True] += c
            block(False)
            for _ in range(PHASE):
                t, h, c = block(False)
                off.append(t)
                cpu[False] += c
        t0 = time.perf_counter()
        tracker.close()
        t_close = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)

    m_off, m_on = statistics.median(off), statistics.median(tracked)
    added = m_on - m_off
    overhead = added / m_off
    names = "+".join(k for k, v in on.items() if v)
    print(
        f"trackers: {names}; digits step (width {args.width}, batch 32); log_every {args.log_every}; "
        f"{args.blocks} blocks per mode (phases of {PHASE}), {args.threads} torch thread(s)"
    )
    print(f"step time (untracked): {m_off / args.log_every * 1e3:.3f} ms median over blocks")
    print(f"block of {args.log_every} steps: untracked {m_off * 1e3:.2f} ms, tracked {m_on * 1e3:.2f} ms (medians)")
    print(f"Tracker.log on the training thread: {statistics.median(held) * 1e6:.0f} us median per logged step")
    print(f"tracking adds {added * 1e6:.0f} us per logged step (tracked - untracked block, medians)")
    print(
        f"= {overhead * 100:+.2f} % of the {args.log_every} steps' time (goal < 2 %): ratio to goal {overhead / 0.02:.2f}"
    )
    cpu_added = cpu[True] / len(tracked) - cpu[False] / len(off)
    print(
        f"CPU time (this process, all threads, + wandb-core): {cpu_added * 1e6:.0f} us more per tracked block "
        f"= {cpu_added / (cpu[False] / len(off)) * 100:+.2f} % of an untracked block's CPU time"
    )
    print(f"2 % holds at log_every {args.log_every} for steps >= {max(added, 0) / 0.02 / args.log_every * 1e3:.3f} ms")
    print(f"one-off: create at submit {t_create:.2f} s, open at a start {t_open:.2f} s, close {t_close:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
