"""Goodput under node losses at a realistic step time, once per recovery mode, with ``checkpoint.every_steps: auto``.

    python3 benchmarks/goodput_modes.py --quick       # 300 steps, M = 20 s, at most 2 losses per mode; ~10-15 min (root)
    python3 benchmarks/goodput_modes.py               # 800 steps, M = 60 s, at most 3 losses per mode
    python3 benchmarks/goodput_modes.py --quick --work /tmp/gm --json out.json   # keep the runs and the figures
    python3 benchmarks/goodput_modes.py --refigure /tmp/gm   # the table again from the runs kept there

A private Slurm sandbox (``slurm_ddp.sandbox``, root) of ``2 + N`` nodes (N = ``--losses``) trains the task of
``goodput_interval.py`` (``benchmarks/realistic_task.py``, here ``--width`` 2048: an MLP of 8.9 M parameters whose
step is ~0.2-0.5 s of real compute plus DDP's gloo all-reduce on this machine; a ~107 MB checkpoint written
synchronously, so that a save blocks training a measurable C) on 2 nodes x 1 task with ``checkpoint.every_steps: auto`` (its prior ``checkpoint.mtbf_s`` = the schedule's M),
``train.log_every=1``, three times, one after the other, once per recovery mode:

- ``in-process``: ``recovery.in_process=true``, ``recovery.spare_nodes=N``: one srun step on the training nodes
  and the spares, whose ranks wait warm; on a loss the survivor keeps its process and state and a spare takes
  the lost rank, in the same step (``slurm_ddp.worker.inprocess``);
- ``in-job``: ``recovery.spare_nodes=N`` (``sbatch --no-kill``, N hot spares), in_process false: the batch
  script ends the step, probes the nodes and starts the next step on the survivor and a spare, in the same job;
- ``requeue``: no ``recovery`` section: Slurm marks the lost node DOWN after ``SlurmdTimeout`` (``--slurmd-
  timeout-s``, default 60; Slurm's own default is 300), ends the job with NODE_FAIL and requeues it; it starts
  again on two healthy nodes and resumes from the newest periodic checkpoint. The lost node is brought back
  (``SlurmSandbox.restart_node``) once the requeued job trains again, so every loss finds free nodes.

**The failure** is a node loss: the training step's non-batch node (rank 1's) loses its rank process and its
slurmd at once (``SlurmSandbox.kill_node``: SIGKILL of every process in the node's namespace, as a power cut or
a kernel panic would). A ``kill -9`` of the rank process alone, its slurmd alive, is not a node loss for the
in-job rule (``rundir.recovery.decide_recovery``: every probe passes, "a crash, not a node": the job ends, and
the requeue rule does not requeue a crash), so only the node loss has a recovery path in all three modes.
**The schedule** is the same for every mode: the gaps between losses are drawn from an exponential distribution
of mean M (``--mtbf-s``; seed ``--seed``), counted in seconds since training (re)started (the latest
``first_step`` event: a start's, or the first step after an in-process recovery); at most N losses per run (one
spare per loss: a lost node is given back to Slurm, never to the job again).

Per mode, from ``slurm-ddp report --json`` through ``goodput_interval.figures`` (THE arithmetic, shared): ETTR =
kept training ÷ the wall time from the first start's first step to the last start's end; the time lost per
cause — re-start-ups (each new start's job start → first step: the restart), between starts (a lost start's
end → the next start: detection, probes, Slurm's notice, the requeue's hold-off), in-process recovery (the
report's ``recovery`` phase: the last step before the loss → the survivors' state restored), redone steps,
checkpoint stalls, other; the measured C (mean seconds a periodic save blocked), tau (compute seconds between
saves), R (the last step before a loss → the next first step), the deaths met (M as met = wall ÷ deaths); the
first-order limit ``1 - C/tau - (tau/2 + R)/M`` for those measured figures
(``slurm_ddp.rundir.interval.expected_efficiency``) and ETTR ÷ limit. Everything started here is stopped: the
sandbox (``down()``, by PID) on any exit (SIGTERM and Ctrl-C included), jobs cancelled if they did not finish;
the work directory is removed after a run without error unless ``--work DIR`` keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from goodput_interval import figures, job_yaml, report_json  # noqa: E402  (THE ETTR/limit arithmetic)
from recovery import (  # noqa: E402  (the sandbox's reads and the harness of the recovery-mode benchmarks)
    ENDED,
    MODES,
    add_sandbox_args,
    check_sandbox_args,
    diagnostics,
    finish,
    load_words,
    metrics,
    mode_sandbox,
    prepare_work,
    show_job,
    start_line,
    step_nodes,
    wait,
)


def mode_sets(mode: str, args: argparse.Namespace) -> List[str]:
    """The ``--set`` overrides of ``goodput_interval.job_yaml``'s job for one mode on the sandbox."""
    sets = [
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "slurm.cpus_per_task=1",
        "slurm.time=00:40:00",
        "train.pg_timeout_s=30",
        "checkpoint.every_steps=auto",
        f"checkpoint.mtbf_s={args.mtbf_s}",
        f"requeue.max_requeues={args.losses + 2}",
    ]
    if mode in ("in-process", "in-job"):
        sets += [f"recovery.spare_nodes={args.losses}", f"recovery.max_restarts={args.losses}"]
    if mode == "in-process":
        sets += ["recovery.in_process=true"]
    return sets


def run_mode(sb: Any, work: Path, job: Path, mode: str, gaps: List[float], args: argparse.Namespace, say: Any) -> Path:
    """Train ``job`` in ``mode`` under the losses of ``gaps`` (at most ``args.losses``); the run directory."""
    in_job = mode in ("in-job", "in-process")
    run = work / mode
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--run-dir", str(run), "--no-check-task"]
    for s in mode_sets(mode, args):
        cmd += ["--set", s]
    r = sb.run(cmd, capture_output=True, text=True, timeout=300)
    m = re.search(r"submitted job (\d+)", r.stdout)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"submit failed ({r.returncode}): {r.stdout}{r.stderr}")
    job_id = m.group(1)

    def diag() -> str:
        return diagnostics(sb, run, job_id)

    kills: List[float] = []
    victims: List[str] = []  # lost and not brought back yet
    back: Optional[threading.Thread] = None
    polls = 0
    try:
        while not (run / "FINISHED").exists():
            ev = metrics(run)
            firsts = [float(e["time"]) for e in ev if e.get("event") == "first_step"]
            since = firsts[-1] if firsts else None
            due = len(kills) < args.losses and since is not None and (not kills or since > kills[-1])
            if due and since is not None and time.time() - since >= gaps[len(kills)]:
                if back is not None:
                    back.join()
                nodes = step_nodes(sb, run, job_id, in_job)
                if len(nodes) != 2:
                    raise RuntimeError(f"{mode}: expected a 2-node step, found {nodes}\n{diag()}")
                t_kill = time.time()
                if not sb.kill_node(nodes[1]):
                    raise RuntimeError(f"{mode}: no process in {nodes[1]}'s namespace")
                kills.append(t_kill)
                victims.append(nodes[1])
                step = max((int(e["step"]) for e in ev if e.get("event") == "train"), default=0)
                say(f"  {mode}: loss {len(kills)} ({nodes[1]}) after {t_kill - since:.1f} s of training, ~step {step}")
            if (
                mode == "requeue"
                and victims
                and back is None
                and kills
                and firsts
                and firsts[-1] > kills[-1]  # the requeued job trains again: the lost node is DOWN by now
            ):
                victim = victims.pop()
                back = threading.Thread(target=sb.restart_node, args=(victim,), kwargs={"timeout_s": 300})
                back.start()
            elif back is not None and not back.is_alive():
                back.join()
                back = None
            polls += 1
            state = show_job(sb, job_id).get("JobState") if polls % 10 == 0 else None  # scontrol every ~2 s
            if state in ENDED and not (run / "FINISHED").exists():
                time.sleep(2)  # FINISHED is written before the job ends
                if not (run / "FINISHED").exists():
                    raise RuntimeError(f"{mode}: job {job_id} ended {state} without finishing\n{diag()}")
            time.sleep(0.2)
        wait(lambda: show_job(sb, job_id).get("JobState") in ENDED, 180, f"{mode}: job {job_id} to end", diag)
        say(
            f"  {mode}: finished; job {job_id} {show_job(sb, job_id).get('JobState')}, Slurm restarts "
            f"{show_job(sb, job_id).get('Restarts')}, {len(kills)} losses"
        )
    finally:
        if show_job(sb, job_id).get("JobState") not in ENDED:
            sb.run(["scancel", job_id], capture_output=True, timeout=30)
            wait(lambda: show_job(sb, job_id).get("JobState") in ENDED, 120, f"job {job_id} to end after scancel")
        if back is not None:
            back.join()
        for v in victims:  # the in-job runs' lost nodes, back for the next mode
            sb.restart_node(v, timeout_s=300)
    return run


def mode_figures(run: Path, mode: str, mtbf_s: float, runner: Callable[..., Any]) -> Dict[str, Any]:
    res = figures(run, report_json(run, runner), mode, float("nan"), mtbf_s)
    res["mode"] = mode
    return res


def table(results: List[Dict[str, Any]]) -> List[str]:
    causes = list(results[0]["lost_s"]) if results else []
    out = [
        "| mode | ETTR | limit | ETTR ÷ limit | limit, no rollback | ETTR ÷ it | C (s) | τ (s) | R (s) | deaths "
        "| M met (s) | auto chose | lost: " + " / ".join(causes) + " (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for x in results:
        iv = x.get("auto_last_interval") or {}
        chose = f"{iv.get('every_steps')} steps = {iv.get('every_s', 0):.1f} s" if iv else "?"
        out.append(
            f"| {x['mode']} | {x['ettr']:.3f} | {x['limit']:.3f} | **{x['ratio_to_limit']:.3f}** | "
            f"{x['limit_no_rollback']:.3f} | {x['ratio_to_limit_no_rollback']:.3f} | {x['C_s']:.3f} | "
            f"{x['tau_s']:.1f} | {x['R_s']:.1f} | {x['kills']} | {x['M_met_s']:.0f} | {chose} | "
            + " / ".join(f"{x['lost_s'][k]:.1f}" for k in causes)
            + " |"
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="300 steps, M 20 s, at most 2 losses per mode")
    ap.add_argument("--max-steps", type=int, default=800)
    ap.add_argument("--mtbf-s", type=float, default=None, help="the scaled MTBF M, seconds (default 60; --quick 20)")
    ap.add_argument(
        "--losses", type=int, default=None, help="at most this many losses per mode = spares (default 3; --quick 2)"
    )
    ap.add_argument("--width", type=int, default=2048, help="the MLP's width (realistic_task.py; default 2048)")
    ap.add_argument("--seed", type=int, default=53)
    add_sandbox_args(ap)
    ap.add_argument("--work", type=Path, help="directory for the sandbox and the runs (kept); default a temporary one")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write every mode's figures here")
    ap.add_argument("--refigure", type=Path, metavar="WORK", help="only the table again, from the runs kept in WORK")
    args = ap.parse_args()
    if args.quick:
        args.max_steps = min(args.max_steps, 300)
    args.mtbf_s = args.mtbf_s or (20.0 if args.quick else 60.0)
    args.losses = args.losses if args.losses is not None else (2 if args.quick else 3)
    say = lambda s: print(s, flush=True)  # noqa: E731
    import subprocess

    if args.refigure:
        results = [
            mode_figures(args.refigure / m, m, args.mtbf_s, subprocess.run)
            for m in MODES
            if (args.refigure / m / "FINISHED").exists()
        ]
        for s in table(results):
            say(s)
        return 0
    check_sandbox_args(ap, args)
    work, own_work = prepare_work(args.work, "goodput-modes-")
    job = job_yaml(work, args)
    rng = random.Random(args.seed)
    gaps = [rng.expovariate(1.0 / args.mtbf_s) for _ in range(args.losses)]
    modes = [args.only] if args.only else list(MODES)
    t0 = time.time()
    say(
        start_line(
            args,
            work,
            f"; {args.max_steps} steps; M = {args.mtbf_s:.0f} s, seed {args.seed}: gaps {[round(g, 1) for g in gaps]} s",
        )
    )
    results: List[Dict[str, Any]] = []
    with mode_sandbox(work, args) as sb:
        for mode in modes:
            t_mode = time.time()
            run = run_mode(sb, work, job, mode, gaps, args, say)
            res = mode_figures(run, mode, args.mtbf_s, sb.run)
            res["wall_s"] = time.time() - t_mode
            res["load_after"] = os.getloadavg()
            results.append(res)
            say(
                f"  {mode}: ETTR {res['ettr']:.3f}  limit {res['limit']:.3f}  ratio {res['ratio_to_limit']:.3f}  "
                f"C {res['C_s']:.3f} s  tau {res['tau_s']:.1f} s  R {res['R_s']:.1f} s  deaths {res['kills']}  "
                f"lost {', '.join(f'{k} {v:.1f} s' for k, v in res['lost_s'].items())}  ({res['wall_s']:.0f} s; "
                f"{load_words()})"
            )
    for s in table(results):
        say(s)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    finish(work, own_work, t0, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
