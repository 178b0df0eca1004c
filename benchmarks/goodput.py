"""Goodput under interruptions: what ``checkpoint.every_steps`` buys.

    python benchmarks/goodput.py                      # every_steps 20, 40, 80 side by side; ~15-20 min on 2 busy cores
    python benchmarks/goodput.py --every 40 --json out.json
    python benchmarks/goodput.py --every-steps 80     # that one setting only
    python benchmarks/goodput.py --step-sleep-s 0     # the bare digits step (~20-40 ms here)

The digits job (``examples/digits``'s model and data through ``benchmarks/soak_task.py``, 2 ranks on one
node of a private Slurm sandbox started here, ``slurm_ddp.sandbox``; root) runs under the same fixed
schedule of 10 interruptions (:data:`SCHEDULE`), once per ``checkpoint.every_steps`` value (the base,
halved and doubled). **The settings run at the same time**, one run per sandbox node (each node has the
2 CPUs its job asks for; the VM's cores are shared by all), so they share the machine's load and their
figures can be compared; each training step also sleeps ``--step-sleep-s`` (default 0.1 s,
``train.args.step_sleep_s``) so that a step has a realistic length and redone steps cost what they
would on a real model. Each interruption comes a fixed number of steps after the step the current start
resumed from:

- ``usr2``: ``scancel --signal=USR2 JOB`` (the ranks; the time-limit signal): checkpoint, requeue itself;
- ``requeue``: ``scontrol requeue JOB`` (SIGTERM, as a preemption): checkpoint, Slurm requeues it;
- ``kill9``: ``kill -9`` of every rank (a crash, an OOM kill): the job fails, the steps since the last
  checkpoint are lost; the benchmark submits the run again (``slurm-ddp submit`` of the same run
  directory), which resumes from that checkpoint.

After the runs finish, ``slurm-ddp report RUN --json`` gives each one's goodput, redone steps and losses.
Printed per setting: goodput (load-dependent: start-up time varies with the machine's load), and the
load-independent parts: redone steps (× the median step time = seconds they cost), the periodic
checkpoints (count × the median time a save blocked training, from the ``checkpoint`` events), and the
node-seconds of every phase; the load average before and after. ``--json FILE`` keeps every report.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "digits" / "job.yaml"  # the base config (its model, data, requeue signal)
#: (kind, steps after the current start's resume step): 10 interruptions, signals and kills mixed
SCHEDULE = [
    ("usr2", 37),
    ("kill9", 55),
    ("requeue", 23),
    ("kill9", 71),
    ("usr2", 44),
    ("kill9", 29),
    ("requeue", 63),
    ("usr2", 50),
    ("kill9", 35),
    ("usr2", 58),
]
MAX_STEPS = 800


def job_yaml(work: Path, step_sleep_s: float) -> Path:
    """The digits job with the benchmark task (``soak_task:SoakTask``, whose steps sleep ``step_sleep_s``)."""
    import yaml

    data = yaml.safe_load(JOB.read_text())
    data["train"]["task"] = "soak_task:SoakTask"
    data["train"]["pythonpath"] = [str(REPO / "benchmarks"), str(REPO / "examples" / "digits")]
    data["train"]["args"] = {"width": 16, "augment": True, "step_sleep_s": float(step_sleep_s)}
    path = work / "goodput.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def wait(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def metrics(run: Path) -> List[Dict[str, Any]]:
    from slurm_ddp.rundir import read_metrics

    return read_metrics(run)


def starts_seen(run: Path) -> int:
    return sum(1 for m in metrics(run) if m.get("event") == "first_step")


def trained_past(run: Path, n_start: int, steps: int) -> bool:
    """The ``n_start``-th start (1-based) has trained ``steps`` steps past the step it resumed from."""
    ev = metrics(run)
    firsts = [i for i, m in enumerate(ev) if m.get("event") == "first_step"]
    if len(firsts) < n_start:
        return False
    mine = ev[firsts[n_start - 1] :]
    base = int(mine[0]["step"]) - 1
    return any(m.get("event") == "train" and m["step"] >= base + steps for m in mine)


def rank_pids(run: Path) -> List[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"slurm_ddp.worker" in cmd and str(run).encode() in cmd:
            out.append(int(d.name))
    return out


def run_one(sb: Any, work: Path, job: Path, every: int, say: Callable[[str], None]) -> Dict[str, Any]:
    run = work / f"every-{every}"
    sets = [
        f"train.max_steps={MAX_STEPS}",
        "train.log_every=1",
        "train.eval_every=200",
        f"checkpoint.every_steps={every}",
        "checkpoint.keep_last=2",
        "requeue.max_requeues=20",
        "slurm.time=00:30:00",
    ]

    def submit() -> str:
        cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--run-dir", str(run), "--no-check-task"]
        for s in sets:
            cmd += ["--set", s]
        r = sb.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(r.stdout + r.stderr)
        m = re.search(r"submitted job (\d+)", r.stdout)
        if m is None:
            raise RuntimeError(r.stdout + r.stderr)
        return m.group(1)

    def job_gone(job: str) -> bool:
        r = sb.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=20)
        return not r.stdout.strip()

    t0 = time.monotonic()
    job_id = submit()
    for k, (kind, after) in enumerate(SCHEDULE, start=1):
        wait(lambda k=k, after=after: trained_past(run, k, after), 900, f"start {k} to train {after} steps")
        if kind == "usr2":
            sb.run(["scancel", "--signal=USR2", job_id], check=True, timeout=20)
        elif kind == "requeue":
            sb.run(["scontrol", "requeue", job_id], check=True, timeout=20)
        else:
            for pid in rank_pids(run):
                os.kill(pid, signal.SIGKILL)
            wait(lambda j=job_id: job_gone(j), 120, f"job {job_id} to end after the kill")
            job_id = submit()
        wait(lambda k=k: starts_seen(run) > k or (run / "FINISHED").exists(), 900, f"start {k + 1}")
        say(f"  every_steps={every}: interruption {k} ({kind} {after} steps after the resume) done")
    wait(lambda: (run / "FINISHED").exists(), 900, "the run to finish")
    wait(lambda: job_gone(job_id), 120, f"job {job_id} to end")
    r = sb.run([sys.executable, "-m", "slurm_ddp", "report", str(run), "--json"], capture_output=True, text=True)
    rep: Dict[str, Any] = json.loads(r.stdout)
    rep["bench_wall_s"] = time.monotonic() - t0
    rep["bench"] = load_independent(run, rep)
    return rep


def load_independent(run: Path, rep: Dict[str, Any]) -> Dict[str, Any]:
    """The figures that do not move with the machine's load: redone steps and what they cost at the
    median step time, the periodic saves (count, median blocked seconds, their product), and the
    node-seconds of every phase (the report's)."""
    ev = metrics(run)
    step_s: List[float] = []
    prev: Any = None
    for m in ev:
        if m.get("event") == "train" and prev is not None and m.get("step") == prev["step"] + 1:
            step_s.append(float(m["time"]) - float(prev["time"]))
        prev = m if m.get("event") in ("train", "first_step") else None
    saves = [
        float(m["blocked_s"])
        for m in ev
        if m.get("event") == "checkpoint" and m.get("reason") == "periodic" and "blocked_s" in m
    ]
    step_med = statistics.median(step_s) if step_s else float("nan")
    save_med = statistics.median(saves) if saves else 0.0
    return {
        "step_s_median": step_med,
        "redone_steps": rep["redone_steps"],
        "redone_s_at_median_step": rep["redone_steps"] * step_med,
        "periodic_saves": len(saves),
        "save_blocked_s_median": save_med,
        "saves_x_median_s": len(saves) * save_med,
        "saves_blocked_s_sum": sum(saves),
        "phases_node_s": rep["phases_node_s"],
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=int, default=40, help="the base checkpoint.every_steps (halved and doubled too)")
    ap.add_argument("--every-steps", type=int, metavar="N", help="run only this checkpoint.every_steps setting")
    ap.add_argument("--step-sleep-s", type=float, default=0.1, help="seconds each training step also sleeps")
    ap.add_argument("--json", metavar="FILE", help="write every report here")
    ap.add_argument("--work", help="directory for the sandbox and the runs (default: a temporary one)")
    args = ap.parse_args()
    if args.every_steps is not None and args.every_steps < 1:
        ap.error(f"--every-steps must be a positive number of steps, got {args.every_steps}")
    if args.step_sleep_s < 0:
        ap.error(f"--step-sleep-s must be >= 0 seconds, got {args.step_sleep_s}")
    settings = [args.every_steps] if args.every_steps else [args.every // 2, args.every, args.every * 2]
    from slurm_ddp.sandbox import SlurmSandbox

    work = Path(args.work or tempfile.mkdtemp(prefix="goodput-", dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    job = job_yaml(work, args.step_sleep_s)
    out: Dict[str, Any] = {}
    errors: List[str] = []
    lock = threading.Lock()

    def say(s: str) -> None:
        with lock:
            print(s, flush=True)

    load_before = loadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    say(f"{started}: settings {settings} side by side, step sleep {args.step_sleep_s} s; load average {load_before}")
    with SlurmSandbox(work / "sb", nodes=len(settings), cpus_per_node=2) as sb:

        def one(every: int) -> None:
            try:
                out[str(every)] = run_one(sb, work, job, every, say)
            except Exception as e:  # reported below; the other settings go on
                errors.append(f"every_steps={every}: {type(e).__name__}: {e}")

        threads = [threading.Thread(target=one, args=(every,), name=f"every-{every}") for every in settings]
        for t in threads:
            t.start()
            time.sleep(1.0)  # staggered submits: the three jobs' first starts still overlap
        for t in threads:
            t.join()
    load_after = loadavg()
    say(f"load average before {load_before}, after {load_after}")
    say(
        "every_steps  goodput  allocated  starts  redone  step   redone-s  saves  save-blocked  saves*med  "
        "| node-s: startup train_kept train_redone eval checkpoint stop other"
    )
    for every in settings:
        rep = out.get(str(every))
        if rep is None:
            continue
        b = rep["bench"]
        ph = b["phases_node_s"]
        say(
            f"{every:11d}  {rep['goodput'] * 100:6.1f} %  {rep['allocated_node_s']:7.1f}  {len(rep['starts']):6d}  "
            f"{b['redone_steps']:6d}  {b['step_s_median'] * 1e3:4.0f}ms  {b['redone_s_at_median_step']:7.1f}s  "
            f"{b['periodic_saves']:5d}  {b['save_blocked_s_median'] * 1e3:9.1f} ms  {b['saves_x_median_s']:7.2f}s  "
            "| " + " ".join(f"{ph[k]:.1f}" for k in ph)
        )
        say("             losses: " + "; ".join(loss["words"] for loss in rep["losses"]))
    if args.json:
        meta = {
            "date": started,
            "load_before": load_before,
            "load_after": load_after,
            "step_sleep_s": args.step_sleep_s,
        }
        Path(args.json).write_text(json.dumps({"meta": meta, **out}, indent=1))
    for e in errors:
        say(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
