"""Goodput under process deaths at a realistic step time: fixed checkpoint intervals vs ``every_steps: auto``.

    python benchmarks/goodput_interval.py --quick        # CI-sized: 3 fixed intervals + auto, 1 round, ~8-12 min
    python benchmarks/goodput_interval.py                # 5 fixed intervals + auto, 2 interleaved rounds
    python benchmarks/goodput_interval.py --json out.json --work /tmp/gi   # keep the runs and the figures

Each setting trains the same job (``benchmarks/realistic_task.py``: an MLP whose step is ~0.2-0.5 s of real
compute per rank plus DDP's gloo all-reduce, 2 ranks on the local backend; a ~61 MB checkpoint, written
synchronously — ``checkpoint.async_save: false`` — so that a save blocks training for a measurable time) under
the same seeded failure schedule: the gaps between process deaths are drawn from an exponential distribution of
mean ``--mtbf-s`` (the scaled MTBF; seed ``--seed`` + round), measured in seconds of training since the current
start's first step; at each one every rank is killed (``kill -9``: a crash, an OOM kill) and the benchmark submits
the run again (the same run directory), which resumes from its newest checkpoint. Rounds are interleaved: each
round runs every setting once, in a rotated order, under that round's schedule.

Per run, from ``slurm-ddp report --json`` and ``metrics.jsonl``: the effective training time ratio (kept training ÷
the wall time after the first start's first step: the first start-up is no cost of failures, and all settings pay
it alike), the time lost per cause (re-start-ups, redone steps, checkpoint stalls, other), the measured figures —
``C`` (mean seconds a periodic save blocked), ``tau`` (mean compute seconds between saves), ``R`` (mean seconds
from a kill to the next start's first step) and ``M`` (the schedule's MTBF) — and the analytic limit
``1 - C/tau - (tau/2 + R)/M`` for them (``slurm_ddp.rundir.interval.expected_efficiency``). Prints per setting:
ETTR, limit, ETTR ÷ limit, and auto's ETTR ÷ the best fixed interval's. Only process deaths here, on the local
backend: ``goodput_modes.py`` trains the same task on the Slurm sandbox under node losses once per recovery mode
(in-process with a warm spare, in-job restart, requeue), through the same :func:`figures`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurm_ddp.rundir import read_metrics  # noqa: E402
from slurm_ddp.rundir.interval import expected_efficiency  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
from goodput import rank_pids  # noqa: E402  (the ranks of a run, from /proc: one copy)


def job_yaml(work: Path, args: argparse.Namespace) -> Path:
    import yaml

    data = {
        "name": "goodput-interval",
        "slurm": {"nodes": 1, "tasks_per_node": 2, "cpus_per_task": 1, "time": "01:00:00"},
        "train": {
            "task": "realistic_task:RealisticTask",
            "snapshot": False,  # the checkout itself: a resubmit after an edit of it must not be refused
            "pythonpath": [str(REPO / "benchmarks")],
            "max_steps": args.max_steps,
            "batch_size": 128,
            "lr": 0.001,
            "eval_every": 0,
            "log_every": 1,
            "args": {"width": args.width, "depth": 3, "in_dim": 256, "samples": 20000},
        },
        "checkpoint": {"keep_last": 2, "async_save": False},
        "requeue": {"max_requeues": 0},
    }
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def current_first_step(run: Path, starts_before: int) -> Optional[float]:
    firsts = [m for m in read_metrics(run) if m.get("event") == "first_step"]
    return float(firsts[starts_before]["time"]) if len(firsts) > starts_before else None


def run_one(work: Path, job: Path, setting: str, gaps: List[float], say: Any) -> Dict[str, Any]:
    run = work / f"{setting}-{int(time.time() * 1000) % 10**8}"
    every = "auto" if setting == "auto" else setting
    sets = ["--set", f"checkpoint.every_steps={every}"]
    if setting == "auto":
        sets += ["--set", f"checkpoint.mtbf_s={ARGS.mtbf_s}"]
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run)]
    cmd += sets + ["--no-check-task"]
    kills: List[float] = []
    starts = 0
    t0 = time.time()
    while True:
        with open(work / f"{run.name}.submit.log", "a") as out:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        gap = gaps[len(kills)] if len(kills) < len(gaps) else float("inf")
        killed = False
        while proc.poll() is None:
            first = current_first_step(run, starts)
            if first is not None and time.time() - first >= gap:
                kills.append(time.time())
                for pid in rank_pids(run):
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                killed = True
                proc.wait()
                break
            time.sleep(0.2)
        starts += 1 if current_first_step(run, starts) is not None else 0
        if (run / "FINISHED").exists():
            break
        if not killed:
            tail = (work / f"{run.name}.submit.log").read_text()[-2000:]
            raise RuntimeError(f"{run}: the run ended without finishing (exit {proc.returncode}): {tail}")
        say(f"  {setting}: kill {len(kills)} after {gap:.1f} s of training")
    rep = report_json(run)
    return figures(run, rep, setting, time.time() - t0, ARGS.mtbf_s)


def report_json(run: Path, runner: Callable[..., Any] = subprocess.run) -> Dict[str, Any]:
    """``slurm-ddp report RUN --json``; ``runner``: ``subprocess.run`` or a sandbox's ``run`` (its Slurm)."""
    r = runner([sys.executable, "-m", "slurm_ddp", "report", str(run), "--json"], capture_output=True, text=True)
    return json.loads(r.stdout)


def figures(run: Path, rep: Dict[str, Any], setting: str, wall: float, mtbf_s: float) -> Dict[str, Any]:
    """The figures of one run (``slurm-ddp report --json``'s ``rep`` and ``metrics.jsonl``): ETTR, the time
    lost per cause, the measured C, tau, R, the deaths met and the analytic limit for them; ``mtbf_s``: the
    schedule's stated M. THE arithmetic of ``goodput_interval.py`` and ``goodput_modes.py``.

    The wall time counted is the first start's first step → the last start's end (the first start-up is no
    cost of failures); the time lost is the report's phases of each start plus the time between starts
    (a killed start's end → the next start: detection, a requeue's hold-off, a resubmission, the next
    launch), so that kept + lost = that wall time."""
    ev = read_metrics(run)
    saves = [m for m in ev if m.get("event") == "checkpoint" and m.get("reason") == "periodic"]
    cost = statistics.mean(float(m["blocked_s"]) for m in saves) if saves else 0.0
    steps = [m for m in ev if m.get("event") == "train"]
    step_gaps = [float(b["time"]) - float(a["time"]) for a, b in zip(steps, steps[1:]) if b["step"] == a["step"] + 1]
    step_s = statistics.median(step_gaps) if step_gaps else float("nan")
    save_steps = sorted({int(m["step"]) for m in saves})
    spacing = [b - a for a, b in zip(save_steps, save_steps[1:]) if b > a]
    tau = (statistics.median(spacing) if spacing else float(rep["starts"][-1]["last_step"] or 0)) * step_s
    # R: a death (the killed start's last train record: log_every 1, within a step of the kill) → the next
    # start's first step
    restarts: List[float] = []
    last: Optional[float] = None
    for m in ev:
        if m.get("event") == "first_step" and last is not None:
            restarts.append(float(m["time"]) - last)
        if m.get("event") == "train":
            last = float(m["time"])
    kills = len(restarts)
    restart_s = statistics.mean(restarts) if restarts else 0.0
    starts = rep["starts"]
    first_step_at = starts[0]["start"] + starts[0]["phases_s"]["startup"]
    wall_after_first = max(s["end"] for s in starts) - first_step_at
    in_starts = sum(s["wall_s"] for s in starts) - starts[0]["phases_s"]["startup"]
    kept = sum(s["phases_s"]["train_kept"] for s in starts)
    lost = {
        "re-start-ups": sum(s["phases_s"]["startup"] for s in starts[1:]),
        # a lost start's tail: its last record → its end (the failure noticed: a collective's error, the probes,
        # Slurm's SlurmdTimeout), the report's "other" of every start that did not finish
        "lost starts' tails": sum(s["phases_s"]["other"] for s in starts if s["ended"] != "finished"),
        "between starts": max(wall_after_first - in_starts, 0.0),
        "in-process recovery": sum(s["phases_s"].get("recovery", 0.0) for s in starts),
        "redone": sum(s["phases_s"]["train_redone"] for s in starts),
        "checkpoint": sum(s["phases_s"]["checkpoint"] for s in starts),
        "other": sum(
            s["phases_s"]["stop"]
            + s["phases_s"]["unknown"]
            + s["phases_s"]["eval"]
            + (s["phases_s"]["other"] if s["ended"] == "finished" else 0.0)
            for s in starts
        ),
    }
    ettr = kept / wall_after_first if wall_after_first > 0 else float("nan")
    # M as this run met it (its deaths over its wall time after the first start-up; the schedule's mean is
    # mtbf_s, but a run of a few minutes meets few of its draws)
    m_met = wall_after_first / kills if kills else float("inf")
    limit = expected_efficiency(tau, cost, restart_s, m_met)
    # the same without the tau/2 a death redoes: for a recovery that rolls nothing back (in-process, an in-job
    # restart from the emergency checkpoint), whose redone time is ~0
    limit_no_rollback = expected_efficiency(tau, cost, restart_s, m_met, redo_fraction=0.0)
    limit_stated = expected_efficiency(tau, cost, restart_s, mtbf_s)
    chosen = [m for m in ev if m.get("event") == "checkpoint_interval"]
    return {
        "setting": setting,
        "run": str(run),
        "kills": kills,
        "ettr": ettr,
        "ettr_allocation": rep.get("ettr"),
        "limit": limit,
        "limit_at_stated_M": limit_stated,
        "M_met_s": m_met,
        "ratio_to_limit": ettr / limit if limit > 0 else float("nan"),
        "limit_no_rollback": limit_no_rollback,
        "ratio_to_limit_no_rollback": ettr / limit_no_rollback if limit_no_rollback > 0 else float("nan"),
        "C_s": cost,
        "tau_s": tau,
        "tau_steps": tau / step_s if step_s == step_s and step_s > 0 else None,
        "R_s": restart_s,
        "M_s": mtbf_s,
        "step_s": step_s,
        "lost_s": lost,
        "wall_s": wall,
        "auto_last_interval": chosen[-1] if chosen else None,
    }


def main() -> int:
    global ARGS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized: 3 fixed intervals + auto, 1 round, fewer steps")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--fixed", default="3,6,12,24,48", help="fixed checkpoint.every_steps values, comma-separated")
    ap.add_argument("--max-steps", type=int, default=400)
    ap.add_argument(
        "--mtbf-s", type=float, default=60.0, help="the scaled MTBF: mean seconds of training between deaths"
    )
    ap.add_argument("--width", type=int, default=1536)
    ap.add_argument("--seed", type=int, default=53)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--work", help="directory for the runs (kept); default a temporary one, removed after")
    ap.add_argument("--refigure", metavar="WORK", help="only recompute the figures of the runs kept in WORK")
    ARGS = ap.parse_args()
    if ARGS.refigure:
        runs = [d for d in sorted(Path(ARGS.refigure).iterdir()) if d.is_dir() and (d / "FINISHED").exists()]
        out = [figures(d, report_json(d), d.name.split("-")[0], float("nan"), ARGS.mtbf_s) for d in runs]
        names = sorted({x["setting"] for x in out}, key=lambda s: (s == "auto", int(s) if s.isdigit() else 0))
        summarize(out, names, print)
        return 0
    if ARGS.quick:
        ARGS.rounds, ARGS.fixed, ARGS.max_steps = 1, "4,12,36", min(ARGS.max_steps, 200)
    work = Path(ARGS.work) if ARGS.work else Path(tempfile.mkdtemp(prefix="goodput-interval-"))
    work.mkdir(parents=True, exist_ok=True)
    job = job_yaml(work, ARGS)
    settings = [s.strip() for s in ARGS.fixed.split(",") if s.strip()] + ["auto"]

    def say(s: str) -> None:
        print(s, flush=True)

    say(f"load {' '.join(Path('/proc/loadavg').read_text().split()[:3])}; M = {ARGS.mtbf_s:.0f} s; settings {settings}")
    results: List[Dict[str, Any]] = []
    for r in range(ARGS.rounds):
        rng = random.Random(ARGS.seed + r)
        gaps = [rng.expovariate(1.0 / ARGS.mtbf_s) for _ in range(50)]
        order = settings[r % len(settings) :] + settings[: r % len(settings)]
        say(f"round {r + 1}: gaps {[round(g, 1) for g in gaps[:6]]} ... s; order {order}")
        for s in order:
            res = run_one(work, job, s, gaps, say)
            res["round"] = r + 1
            results.append(res)
            say(
                f"  {s:>5}: ETTR {res['ettr']:.3f}  limit {res['limit']:.3f}  ratio {res['ratio_to_limit']:.3f}  "
                f"C {res['C_s']:.3f} s  tau {res['tau_s']:.1f} s  R {res['R_s']:.1f} s  kills {res['kills']}  "
                f"lost {', '.join(f'{k} {v:.1f} s' for k, v in res['lost_s'].items())}"
            )
    summarize(results, settings, say)
    if ARGS.json:
        Path(ARGS.json).write_text(json.dumps(results, indent=1))
    if not ARGS.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def summarize(results: List[Dict[str, Any]], settings: List[str], say: Any) -> None:
    say("\nsetting  ETTR(mean)  limit(mean)  ETTR/limit  C_s    tau_s  R_s   deaths  M_met_s")
    means: Dict[str, float] = {}
    for s in settings:
        mine = [x for x in results if x["setting"] == s]
        means[s] = statistics.mean(x["ettr"] for x in mine)
        lim = statistics.mean(x["limit"] for x in mine)
        say(
            f"{s:>7}  {means[s]:.3f}       {lim:.3f}        {means[s] / lim if lim > 0 else float('nan'):.3f}       "
            f"{statistics.mean(x['C_s'] for x in mine):.3f}  {statistics.mean(x['tau_s'] for x in mine):5.1f}  "
            f"{statistics.mean(x['R_s'] for x in mine):.1f}  {sum(x['kills'] for x in mine):>6}  "
            f"{statistics.mean(x['M_met_s'] for x in mine):.0f}"
        )
    fixed = [s for s in settings if s != "auto"]
    if not fixed or "auto" not in means:
        return
    best = max(fixed, key=lambda s: means[s])
    say(f"auto ÷ best fixed ({best}): {means['auto'] / means[best]:.3f} (goal >= 0.95)")


ARGS: argparse.Namespace

if __name__ == "__main__":
    sys.exit(main())
