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
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=40, help="blocks of log_every steps per mode")
    ap.add_argument("--width", type=int, default=32, help="DigitsNet width (the example's job.yaml: 32)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (a 1-CPU rank: 1)")
    ap.add_argument("--only", choices=("mlflow", "wandb"), help="one tracker (default: both)")
    args = ap.parse_args()
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
