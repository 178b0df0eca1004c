"""What experiment tracking (``slurm_ddp.tracking``) adds per logged step, as a fraction of step time.

One process trains a small model on CPU (the digits-sized MLP of examples/digits: 64 → WIDTH → 10,
batch 32, SGD) in blocks of ``--log-every`` steps. Each block ends with a log step that writes the
worker's train row to ``metrics.jsonl`` and, in the tracked blocks, hands it to the ``Tracker`` (MLflow:
a SQLite store in a temporary run directory, queued with ``synchronous=False``; W&B: offline mode), as
rank 0 of the worker does. Tracked and untracked blocks alternate (ABAB…) so both see the same machine;
the overhead is (median tracked block − median untracked block) ÷ median untracked block, that is the
time tracking adds per logged step as a fraction of the ``log_every`` steps' time (goal < 2 %). Also
printed: the time ``Tracker.log`` itself holds the training thread (median, µs), and the one-off costs
(creating the run at submit, opening it at a start) that are not per step.

    python benchmarks/bench_tracking.py                  # both trackers, log_every 50, 40 blocks each
    python benchmarks/bench_tracking.py --only mlflow --blocks 100
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

import torch

from slurm_ddp.config import config_from_dict
from slurm_ddp.rundir import append_jsonl
from slurm_ddp.tracking import Tracker, prepare_run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--blocks", type=int, default=40, help="blocks of log_every steps per mode")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--only", choices=("mlflow", "wandb"), help="one tracker (default: both)")
    args = ap.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, args.width), torch.nn.ReLU(), torch.nn.Linear(args.width, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

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

        def block(tracked: bool) -> tuple:
            nonlocal step
            t0 = time.perf_counter()
            for _ in range(args.log_every):
                opt.zero_grad(set_to_none=True)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                loss_sum.add_(loss.detach())
                step += 1
            row = {"event": "train", "step": step, "epoch": 0, "loss": float(loss_sum) / args.log_every}
            row.update(steps_per_s=1.0, lr=0.05, time=time.time())
            loss_sum.zero_()
            append_jsonl(metrics, row)
            t_log = time.perf_counter()
            if tracked:
                tracker.log(row)
            t_end = time.perf_counter()
            return t_end - t0, t_end - t_log

        for _ in range(3):  # warm-up: allocator, first MLflow batch, W&B's first history row
            block(False)
            block(True)
        off, tracked, held = [], [], []
        for _ in range(args.blocks):
            off.append(block(False)[0])
            t, h = block(True)
            tracked.append(t)
            held.append(h)
        t0 = time.perf_counter()
        tracker.close()
        t_close = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)

    m_off, m_on = statistics.median(off), statistics.median(tracked)
    overhead = (m_on - m_off) / m_off
    names = "+".join(k for k, v in on.items() if v)
    print(f"trackers: {names}; log_every {args.log_every}; {args.blocks} blocks per mode (ABAB), 1 torch thread")
    print(f"step time (untracked): {m_off / args.log_every * 1e3:.3f} ms median over blocks")
    print(f"block of {args.log_every} steps: untracked {m_off * 1e3:.2f} ms, tracked {m_on * 1e3:.2f} ms (medians)")
    print(f"Tracker.log on the training thread: {statistics.median(held) * 1e6:.0f} us median per logged step")
    print(
        f"tracking adds {overhead * 100:+.2f} % of step time per logged step (goal < 2 %): ratio {overhead / 0.02:.2f}"
    )
    print(f"one-off: create at submit {t_create:.2f} s, open at a start {t_open:.2f} s, close {t_close:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
