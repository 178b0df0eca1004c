"""Goodput under interruptions: what ``checkpoint.every_steps`` buys.

    python benchmarks/goodput.py                      # every_steps 20, 40, 80; ~15 min on 2 busy cores
    python benchmarks/goodput.py --every 40 --json out.json
    python benchmarks/goodput.py --every-steps 80     # that one setting only (~6 min)

The digits job (``examples/digits``, 2 ranks on one node of a private Slurm sandbox started here,
``slurm_ddp.sandbox``; root) runs under the same fixed schedule of 10 interruptions (:data:`SCHEDULE`),
once per ``checkpoint.every_steps`` value (the base, halved and doubled). Each interruption comes a
fixed number of steps after the step the current start resumed from:

- ``usr2``: ``scancel --signal=USR2 JOB`` (the ranks; the time-limit signal): checkpoint, requeue itself;
- ``requeue``: ``scontrol requeue JOB`` (SIGTERM, as a preemption): checkpoint, Slurm requeues it;
- ``kill9``: ``kill -9`` of every rank (a crash, an OOM kill): the job fails, the steps since the last
  checkpoint are lost; the benchmark submits the run again (``slurm-ddp submit`` of the same run
  directory), which resumes from that checkpoint.

After the run finishes, ``slurm-ddp report RUN --json`` gives its goodput, redone steps and largest
losses; one line per setting is printed (and ``--json FILE`` keeps every report).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "digits" / "job.yaml"
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


def run_one(sb: Any, work: Path, every: int, say: Callable[[str], None]) -> Dict[str, Any]:
    run = work / f"every-{every}"
    sets = [
        f"train.max_steps={MAX_STEPS}",
        "train.log_every=1",
        "train.eval_every=200",
        "train.args.width=16",
        f"checkpoint.every_steps={every}",
        "checkpoint.keep_last=2",
        "requeue.max_requeues=20",
        "slurm.time=00:30:00",
    ]

    def submit() -> str:
        cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--run-dir", str(run), "--no-check-task"]
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
    job = submit()
    for k, (kind, after) in enumerate(SCHEDULE, start=1):
        wait(lambda k=k, after=after: trained_past(run, k, after), 600, f"start {k} to train {after} steps")
        if kind == "usr2":
            sb.run(["scancel", "--signal=USR2", job], check=True, timeout=20)
        elif kind == "requeue":
            sb.run(["scontrol", "requeue", job], check=True, timeout=20)
        else:
            for pid in rank_pids(run):
                os.kill(pid, signal.SIGKILL)
            wait(lambda job=job: job_gone(job), 120, f"job {job} to end after the kill")
            job = submit()
        wait(lambda k=k: starts_seen(run) > k or (run / "FINISHED").exists(), 600, f"start {k + 1}")
        say(f"  every_steps={every}: interruption {k} ({kind} {after} steps after the resume) done")
    wait(lambda: (run / "FINISHED").exists(), 900, "the run to finish")
    wait(lambda: job_gone(job), 120, f"job {job} to end")
    r = sb.run([sys.executable, "-m", "slurm_ddp", "report", str(run), "--json"], capture_output=True, text=True)
    rep: Dict[str, Any] = json.loads(r.stdout)
    rep["bench_wall_s"] = time.monotonic() - t0
    return rep


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=int, default=40, help="the base checkpoint.every_steps (halved and doubled too)")
    ap.add_argument("--every-steps", type=int, metavar="N", help="run only this checkpoint.every_steps setting")
    ap.add_argument("--json", metavar="FILE", help="write every report here")
    ap.add_argument("--work", help="directory for the sandbox and the runs (default: a temporary one)")
    args = ap.parse_args()
    if args.every_steps is not None and args.every_steps < 1:
        ap.error(f"--every-steps must be a positive number of steps, got {args.every_steps}")
    settings = [args.every_steps] if args.every_steps else [args.every // 2, args.every, args.every * 2]
    from slurm_ddp.sandbox import SlurmSandbox

    work = Path(args.work or tempfile.mkdtemp(prefix="goodput-", dir="/tmp"))
    out: Dict[str, Any] = {}
    with SlurmSandbox(work / "sb", nodes=1, cpus_per_node=2) as sb:
        for every in settings:
            rep = run_one(sb, work, every, lambda s: print(s, flush=True))
            out[str(every)] = rep
            losses = "; ".join(loss["words"] for loss in rep["losses"])
            print(
                f"every_steps={every:4d}: goodput {rep['goodput'] * 100:5.1f} %  allocated {rep['allocated_node_s']:7.1f} "
                f"node-s  starts {len(rep['starts'])}  redone steps {rep['redone_steps']:4d}  losses: {losses}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
