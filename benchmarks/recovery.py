"""Node losses: in-process recovery, in-job restart (config section ``recovery``) and Slurm's requeue, under one
fixed schedule.

    python3 benchmarks/recovery.py                    # 2 losses per mode, 4-node sandbox; ~5-7 min (root)
    python3 benchmarks/recovery.py --losses 1         # one loss per mode, 3 nodes
    python3 benchmarks/recovery.py --slurmd-timeout-s 10 --message-timeout-s 2   # a fast-noticing Slurm

A private Slurm sandbox (``slurm_ddp.sandbox``, root) of ``2 + N`` nodes (N = ``--losses``) runs the digits
job (``examples/digits``) on 2 nodes × 1 task, ``train.log_every=1``, ``checkpoint.every_steps`` 20 (async),
three times, one after the other:

- ``in-process``: as ``in-job`` with ``recovery.in_process=true``: one srun step on the training nodes and the
  spares; on a loss the survivors keep their processes, a warm spare takes the lost ranks and gets the state
  from a survivor's memory (``slurm_ddp.worker.inprocess``), in the same step;
- ``in-job``: ``recovery.spare_nodes=N``, ``recovery.max_restarts=N`` (``sbatch --no-kill``, N hot spares):
  the batch script starts the next training step on the batch host and a spare, in the same job;
- ``requeue``: no ``recovery`` section: Slurm marks the lost node DOWN after ``SlurmdTimeout`` (here
  ``--slurmd-timeout-s``, default 60; Slurm's own default is 300), ends the job with NODE_FAIL and requeues
  it (``--requeue``); it starts again on two healthy nodes and resumes from the newest periodic checkpoint.
  A lost node is brought back (``SlurmSandbox.restart_node``) once the requeued job resumed, so every loss
  finds the same number of healthy nodes.

The schedule is the same in both: loss k (k = 0..N-1) comes once training logged step ``35 + 60·k``; the
lost node is the step's non-batch node (rank 1's), lost as a power cut would lose it
(``SlurmSandbox.kill_node``: its slurmd and every process of the job there SIGKILLed). For each loss, from
``metrics.jsonl`` (rank 0's records, wall-clock times of this machine):

- ``kill→resume``: seconds from the kill to the ``resume`` event (the checkpoint loaded by the next start);
- ``kill→step``: seconds from the kill to the next ``first_step`` event (the first training step completed
  after it) — the recovery time;
- ``redone``: the last step logged before that resume minus the step it resumed at;
- the Slurm job id of the next step and Slurm's ``Restarts`` counter (a requeued job keeps its id: the
  counter tells a requeue from an in-job restart).

Prints one line per loss, the means per mode, and the ratios in-process ÷ in-job, in-process ÷ requeue and
in-job ÷ requeue of the mean recovery time.
The runs then finish (``FINISHED``, the digits accuracy). Everything started here is stopped: the sandbox
(``down()``, by PID) on any exit (SIGTERM and Ctrl-C included), jobs cancelled if they did not finish; the
temporary work directory is removed after a run without error (``--work DIR`` keeps everything there).
``--json FILE`` keeps the records.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

JOB = REPO / "examples" / "digits" / "job.yaml"
FIRST_LOSS_STEP = 35  # loss k comes once step FIRST_LOSS_STEP + k·LOSS_GAP_STEPS is logged
LOSS_GAP_STEPS = 60
STEPS_AFTER_LAST = 40  # train.max_steps = the last loss's step + this
EVERY_STEPS = 20  # checkpoint.every_steps, both modes
WAIT_S = 900.0  # generous per wait: start-ups import torch on busy cores
MODES = ("in-process", "in-job", "requeue")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@dataclass
class Loss:
    """One node loss and what it cost."""

    mode: str
    k: int
    victim: str
    job_before: str
    last_step_before: int  # the last train step logged before the resume that followed the loss
    resumed_step: int
    redone_steps: int
    kill_to_resume_s: float
    kill_to_step_s: float
    job_after: str  # the Slurm job id of the first step after the loss
    slurm_restarts: int  # Slurm's Restarts (requeues) of the job after the loss
    emergency: bool  # resumed from a survivor's emergency checkpoint
    killed_at: float  # time.time() of the kill


def wait(pred: Callable[[], Any], timeout_s: float, what: str, diag: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{diag()}")


def metrics(run: Path) -> List[Dict[str, Any]]:
    from slurm_ddp.rundir import read_metrics

    return read_metrics(run)


def show_job(sb: Any, job: str) -> Dict[str, str]:
    r = sb.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30)
    return dict(re.findall(r"(\w+)=(\S*)", r.stdout))


def hostnames(sb: Any, nodelist: str) -> List[str]:
    r = sb.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    return r.stdout.split()


def batch_log(run: Path) -> str:
    from slurm_ddp.rundir import LOGS_DIR, batch_log_name

    return "".join(p.read_text(errors="replace") for p in sorted((run / LOGS_DIR).glob(batch_log_name("*"))))


def diagnostics(sb: Any, run: Path, job: str) -> str:
    from slurm_ddp.rundir import LOGS_DIR

    parts = [str(show_job(sb, job))]
    for p in sorted((run / LOGS_DIR).glob("*")) if (run / LOGS_DIR).exists() else []:
        parts.append(f"==> {p.name} <==\n{p.read_text(errors='replace')[-2000:]}")
    return "\n".join(parts)


def step_nodes(sb: Any, run: Path, job: str, in_job: bool) -> List[str]:
    """The nodes of the job's current training step, the batch host first."""
    from slurm_ddp.rundir import read_recoveries

    in_process = [r for r in read_recoveries(run) if r.get("action") == "in_process"]
    if in_process:  # the same srun step goes on: the last in-process recovery names the training nodes
        return [str(n) for n in in_process[-1]["nodes"]]
    if in_job:  # the allocation holds the spares too: the batch script names the step's nodes
        found = re.findall(r"training step on (\S+) \(\d+ nodes, in-job restart \d+\)", batch_log(run))
        if found:
            return found[-1].split(",")
        return []
    info = show_job(sb, job)
    nodes = hostnames(sb, info.get("NodeList", ""))
    return sorted(nodes, key=lambda n: n != info.get("BatchHost"))


def run_mode(sb: Any, work: Path, mode: str, losses: int, say: Callable[[str], None]) -> List[Loss]:
    in_job = mode in ("in-job", "in-process")
    run = work / mode
    schedule = [FIRST_LOSS_STEP + k * LOSS_GAP_STEPS for k in range(losses)]
    sets = [
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "slurm.time=00:30:00",
        f"train.max_steps={schedule[-1] + STEPS_AFTER_LAST}",
        "train.log_every=1",
        "train.eval_every=0",
        "train.pg_timeout_s=30",
        f"checkpoint.every_steps={EVERY_STEPS}",
        f"requeue.max_requeues={losses + 2}",
    ]
    if in_job:
        sets += [f"recovery.spare_nodes={losses}", f"recovery.max_restarts={losses}"]
    if mode == "in-process":
        sets += ["recovery.in_process=true"]
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(JOB), "--run-dir", str(run), "--no-check-task"]
    for s in sets:
        cmd += ["--set", s]
    r = sb.run(cmd, capture_output=True, text=True, timeout=300)
    m = re.search(r"submitted job (\d+)", r.stdout)
    if r.returncode != 0 or m is None:
        raise RuntimeError(f"submit failed ({r.returncode}): {r.stdout}{r.stderr}")
    job = m.group(1)

    def diag() -> str:
        return diagnostics(sb, run, job)

    out: List[Loss] = []
    victims: List[str] = []
    try:
        for k, at in enumerate(schedule):
            wait(
                lambda at=at: any(e.get("event") == "train" and e["step"] >= at for e in metrics(run)),
                WAIT_S,
                f"{mode}: step {at}",
                diag,
            )
            nodes = step_nodes(sb, run, job, in_job)
            if len(nodes) != 2:
                raise RuntimeError(f"{mode}: expected a 2-node step, found {nodes}\n{diag()}")
            victim = nodes[1]
            t_kill = time.time()
            if not sb.kill_node(victim):
                raise RuntimeError(f"{mode}: no process in {victim}'s namespace")
            victims.append(victim)
            first = wait(
                lambda t=t_kill: next(
                    (e for e in metrics(run) if e.get("event") == "first_step" and e.get("time", 0) > t), None
                ),
                WAIT_S,
                f"{mode}: the first training step after loss {k + 1}",
                diag,
            )
            events = metrics(run)
            resume = next(e for e in events if e.get("event") == "resume" and e["time"] > t_kill)
            before = [e["step"] for e in events if e.get("event") == "train" and e["time"] < resume["time"]]
            loss = Loss(
                mode=mode,
                k=k + 1,
                victim=victim,
                job_before=job,
                last_step_before=max(before),
                resumed_step=int(resume["step"]),
                redone_steps=max(before) - int(resume["step"]),
                kill_to_resume_s=resume["time"] - t_kill,
                kill_to_step_s=first["time"] - t_kill,
                job_after=str(first.get("job_id", "?")),
                slurm_restarts=int(show_job(sb, job).get("Restarts", "0") or 0),
                emergency=bool(resume.get("emergency")),
                killed_at=t_kill,
            )
            out.append(loss)
            say(line(loss))
            if not in_job:  # requeued: the node is DOWN by now; bring it back for the next loss
                sb.restart_node(victim, timeout_s=300)
                victims.remove(victim)
        wait(lambda: (run / "FINISHED").exists(), WAIT_S, f"{mode}: the run to finish", diag)
        wait(lambda: show_job(sb, job).get("JobState") in ENDED, 120, f"{mode}: job {job} to end", diag)
        finished = json.loads((run / "FINISHED").read_text())
        say(
            f"{mode}: finished at step {finished.get('step')}, eval accuracy {finished.get('eval_accuracy')}, "
            f"job {job} {show_job(sb, job).get('JobState')}, Slurm restarts {show_job(sb, job).get('Restarts')}"
        )
    finally:
        if show_job(sb, job).get("JobState") not in ENDED:
            sb.run(["scancel", job], capture_output=True, timeout=30)
            wait(lambda: show_job(sb, job).get("JobState") in ENDED, 120, f"job {job} to end after scancel")
        for v in victims:  # the in-job run's lost nodes, back for the next mode
            sb.restart_node(v, timeout_s=300)
    return out


HEADER = (
    f"{'mode':<10} {'loss':>4} {'node':<6} {'last step':>9} {'resumed':>7} {'redone':>6} "
    f"{'kill→resume':>11} {'kill→step':>9}  job (before→after), Slurm requeues"
)


def line(x: Loss) -> str:
    return (
        f"{x.mode:<10} {x.k:>4} {x.victim:<6} {x.last_step_before:>9} {x.resumed_step:>7} {x.redone_steps:>6} "
        f"{x.kill_to_resume_s:>10.1f}s {x.kill_to_step_s:>8.1f}s  {x.job_before}→{x.job_after}, {x.slurm_restarts}"
        + (" (emergency checkpoint)" if x.emergency else "")
    )


def summary(results: Dict[str, List[Loss]]) -> List[str]:
    out = []
    means: Dict[str, float] = {}
    for mode, xs in results.items():
        if not xs:
            continue
        means[mode] = statistics.mean(x.kill_to_step_s for x in xs)
        out.append(
            f"{mode:<10} mean kill→step {means[mode]:6.1f} s  mean kill→resume "
            f"{statistics.mean(x.kill_to_resume_s for x in xs):6.1f} s  mean steps redone "
            f"{statistics.mean(x.redone_steps for x in xs):5.1f}  same job id: "
            f"{all(x.job_after == x.job_before for x in xs)}  requeued: {any(x.slurm_restarts > 0 for x in xs)}"
        )
    for a, b in (("in-process", "in-job"), ("in-process", "requeue"), ("in-job", "requeue")):
        if a in means and b in means:
            out.append(f"ratio {a} ÷ {b} of the mean recovery time (kill→step): {means[a] / means[b]:.3f}")
    return out


def add_sandbox_args(ap: argparse.ArgumentParser) -> None:
    """The options every sandbox benchmark of the recovery modes takes (this one, ``goodput_modes.py``)."""
    ap.add_argument("--slurmd-timeout-s", type=int, default=60, help="the sandbox's SlurmdTimeout (default 60)")
    ap.add_argument("--message-timeout-s", type=int, default=10, help="the sandbox's MessageTimeout (default 10)")
    ap.add_argument("--only", choices=MODES, help="run one mode only")


def check_sandbox_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--losses`` 1..8 and the timeouts the sandbox accepts (``sandbox.layout.check_timeouts``), else argparse's
    one-line error naming the option."""
    from slurm_ddp.sandbox.layout import check_timeouts

    if not 1 <= args.losses <= 8:
        ap.error(f"--losses must be 1..8, got {args.losses}")
    try:
        check_timeouts(args.slurmd_timeout_s, args.message_timeout_s)
    except ValueError as e:
        ap.error(
            str(e).replace("slurmd_timeout_s", "--slurmd-timeout-s").replace("message_timeout_s", "--message-timeout-s")
        )


def prepare_work(work_arg: Any, prefix: str) -> Tuple[Path, bool]:
    """SIGTERM unwinds (through the sandbox's ``down()``), the ranks import this checkout, and the work
    directory: ``work_arg`` or a new temporary one (then removed after a run without error). Returns
    (the directory, whether it is this run's own)."""

    def on_term(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)  # unwinds through the sandbox's down()

    signal.signal(signal.SIGTERM, on_term)
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    work = Path(work_arg) if work_arg is not None else Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    work.mkdir(parents=True, exist_ok=True)
    return work, work_arg is None


def load_words() -> str:
    """``load average 1.0 2.0 3.0`` now."""
    return "load average " + " ".join(f"{v:.1f}" for v in os.getloadavg())


def start_line(args: argparse.Namespace, work: Path, more: str = "") -> str:
    """The first line a sandbox benchmark prints: the time, the machine, the sandbox, ``more``."""
    return (
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; {os.cpu_count()} CPUs; {load_words()}"
        f"; sandbox of {2 + args.losses} nodes, SlurmdTimeout={args.slurmd_timeout_s} s, "
        f"MessageTimeout={args.message_timeout_s} s{more}; work {work}"
    )


def mode_sandbox(work: Path, args: argparse.Namespace) -> Any:
    """The benchmark's sandbox: 2 training nodes + one per loss (spares, or nodes for the requeue), 2 CPUs each."""
    from slurm_ddp.sandbox import SlurmSandbox

    return SlurmSandbox(
        work / "sb",
        nodes=2 + args.losses,
        cpus_per_node=2,
        slurmd_timeout_s=args.slurmd_timeout_s,
        message_timeout_s=args.message_timeout_s,
        kill_wait_s=2,
    )


def finish(work: Path, own_work: bool, t0: float, say: Callable[[str], None]) -> None:
    """Remove this run's own work directory (finished without an error: the logs are not needed) and say the total."""
    if own_work:
        shutil.rmtree(work, ignore_errors=True)
    say(f"total {time.time() - t0:.0f} s; {load_words()}; work directory {work}" + (" (removed)" if own_work else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--losses", type=int, default=2, help="node losses per mode (default 2; the sandbox has 2 + N nodes)"
    )
    add_sandbox_args(ap)
    ap.add_argument("--work", type=Path, help="directory for the sandbox and the runs (default: a temporary one)")
    ap.add_argument("--json", type=Path, metavar="FILE", help="write every loss's record here")
    args = ap.parse_args()
    check_sandbox_args(ap, args)
    work, own_work = prepare_work(args.work, "recovery-bench-")
    modes = [args.only] if args.only else list(MODES)
    say = lambda s: print(s, flush=True)  # noqa: E731
    t0 = time.time()
    say(start_line(args, work))
    results: Dict[str, List[Loss]] = {}
    with mode_sandbox(work, args) as sb:
        say(HEADER)
        for mode in modes:
            results[mode] = run_mode(sb, work, mode, args.losses, say)
    say(HEADER)
    for xs in results.values():
        for x in xs:
            say(line(x))
    for s in summary(results):
        say(s)
    if args.json:
        args.json.write_text(json.dumps({m: [asdict(x) for x in xs] for m, xs in results.items()}, indent=1) + "\n")
    finish(work, own_work, t0, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
