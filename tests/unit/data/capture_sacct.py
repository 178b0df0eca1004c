"""Capture real ``sacct`` output for tests/unit/test_accounting.py (writes ``sacct_<version>.txt``).

Starts a private accounting sandbox (slurmdbd + private MariaDB, 2 nodes x 2 CPUs x 2 emulated
GPUs, ``SlurmdTimeout`` 4 s), runs small ``sbatch --wrap`` jobs that end in every state ``status``
tells apart, waits until accounting has them all, and writes exactly what
``sacct_command(<their ids>)`` (slurm_ddp.ops.accounting) prints, after ``#`` header lines that say
the Slurm version, the date, the command and which job id is which case. Stops the sandbox (by PID)
whatever happens. About 3 minutes (the TIMEOUT job alone needs its 1-minute limit plus Slurm's
30 s check interval). Needs what the accounting test needs (slurmdbd, mariadb-server, root).

    flock /tmp/heavy.lock python tests/unit/data/capture_sacct.py [--out tests/unit/data/sacct_22.05.txt]

Cases (a job that runs again after a requeue exits 0 in its second start, ``SLURM_RESTART_COUNT`` >= 1):
``completed`` (exit 0, 1 GPU), ``failed`` (exit 3), ``cancelled`` (scancel while running),
``cancelled_pending`` (scancel while held, never started), ``timeout`` (``--time=1``),
``requeued`` (``scontrol requeue`` from outside, 2 GPUs, then completes), ``self_requeued`` (the
batch script requeues itself, as job_templates/sbatch.sh.j2 does at the time-limit signal),
``array_0``/``array_1`` (a two-task array as a sweep submits it, task 1 requeued by ``scontrol``),
``preempted`` (a ``high`` partition job takes its node, Slurm requeues it, then it completes),
``node_fail`` (its node's slurmd is killed; requeued; completes once the node is back) and
``node_fail_norequeue`` (same loss, ``--no-requeue``: ends NODE_FAIL).
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

from slurm_ddp.ops.accounting import sacct_command
from slurm_ddp.sandbox import SlurmSandbox

HERE = Path(__file__).resolve().parent
AGAIN_OK = '[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ] && exit 0; '


def wait(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="default: tests/unit/data/sacct_<major.minor>.txt")
    ap.add_argument("--root", type=Path, default=None, help="sandbox directory (default: a new temporary one)")
    args = ap.parse_args()
    root = args.root or Path(tempfile.mkdtemp(prefix="sacct-capture-"))
    sb = SlurmSandbox(root, nodes=2, cpus_per_node=2, gpus_per_node=2, accounting=True, slurmd_timeout_s=10,
                      message_timeout_s=2, kill_wait_s=2)  # fmt: skip
    try:
        sb.up(timeout_s=180)
        return capture(sb, root, args.out)
    finally:
        sb.down()


def capture(sb: SlurmSandbox, root: Path, out: Path | None) -> int:
    def run(argv: List[str]) -> str:
        r = sb.run(argv, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
        return str(r.stdout)

    def sbatch(script: str, *opts: str) -> str:
        return run(["sbatch", "--parsable", f"--output={root}/%j.out", *opts, "--wrap", script]).strip().split(";")[0]

    def show(job: str) -> Dict[str, str]:
        text = run(["scontrol", "show", "job", "-o", job])
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def state(job: str) -> str:
        return show(job).get("JobState", "?")

    def ends(job: str, final: str, restarts: int = 0) -> Callable[[], bool]:
        return lambda: (i := show(job)).get("JobState") == final and int(i.get("Restarts", "0")) >= restarts

    jobs: Dict[str, str] = {}
    # n2: the time-limit job first (it needs ~1.5 min), while n1 runs the rest
    jobs["timeout"] = sbatch("sleep 600", "-w", "n2", "-n1", "--time=1")
    jobs["completed"] = sbatch("true", "-w", "n1", "-n1", "--gres=gpu:1")
    jobs["failed"] = sbatch("exit 3", "-w", "n1", "-n1")
    wait(ends(jobs["completed"], "COMPLETED"), 60, "completed")
    wait(ends(jobs["failed"], "FAILED"), 60, "failed")
    jobs["cancelled"] = sbatch("sleep 600", "-w", "n1", "-n1")
    jobs["cancelled_pending"] = sbatch("sleep 600", "-w", "n1", "-n1", "--hold")
    wait(lambda: state(jobs["cancelled"]) == "RUNNING", 60, "cancelled to run")
    run(["scancel", jobs["cancelled"], jobs["cancelled_pending"]])
    jobs["requeued"] = sbatch(AGAIN_OK + "sleep 600", "-w", "n1", "-n1", "--gres=gpu:2")
    wait(lambda: state(jobs["requeued"]) == "RUNNING", 60, "requeued to run")
    run(["scontrol", "requeue", jobs["requeued"]])
    wait(ends(jobs["requeued"], "COMPLETED", 1), 120, "requeued to complete")
    jobs["self_requeued"] = sbatch(AGAIN_OK + 'scontrol requeue "$SLURM_JOB_ID"; sleep 600', "-w", "n1", "-n1")
    wait(ends(jobs["self_requeued"], "COMPLETED", 1), 120, "self_requeued to complete")
    # a two-task array (as a sweep submits), its task 1 requeued
    arr = sbatch(AGAIN_OK + '[ "$SLURM_ARRAY_TASK_ID" = 1 ] && sleep 600; exit 0', "--array=0-1", "-w", "n1", "-n1")
    jobs["array_0"], jobs["array_1"] = f"{arr}_0", f"{arr}_1"
    wait(lambda: state(jobs["array_1"]) == "RUNNING", 60, "array_1 to run")
    run(["scontrol", "requeue", jobs["array_1"]])
    wait(ends(jobs["array_1"], "COMPLETED", 1), 120, "array_1 to complete")
    wait(ends(jobs["array_0"], "COMPLETED"), 60, "array_0")
    # partition preemption: the victim holds all of n1, a higher-tier job needs it
    jobs["preempted"] = sbatch(AGAIN_OK + "sleep 600", "-p", "debug", "-w", "n1", "-n2")
    wait(lambda: state(jobs["preempted"]) == "RUNNING", 60, "preempted to run")
    sbatch("sleep 1", "-p", "high", "-w", "n1", "-n2")
    wait(ends(jobs["preempted"], "COMPLETED", 1), 180, "preempted to complete")
    wait(ends(jobs["timeout"], "TIMEOUT"), 180, "timeout")
    # node loss: both jobs on n2, its slurmd and their processes SIGKILLed
    jobs["node_fail"] = sbatch(AGAIN_OK + "sleep 600", "-w", "n2", "-n1", "--requeue")
    jobs["node_fail_norequeue"] = sbatch("sleep 600", "-w", "n2", "-n1", "--no-requeue")
    wait(lambda: all(state(jobs[k]) == "RUNNING" for k in ("node_fail", "node_fail_norequeue")), 60, "n2 jobs to run")
    sb.kill_node("n2")
    wait(ends(jobs["node_fail_norequeue"], "NODE_FAIL"), 120, "node_fail_norequeue")
    wait(lambda: int(show(jobs["node_fail"]).get("Restarts", "0")) >= 1, 120, "node_fail to be requeued")
    run(["scontrol", "hold", jobs["node_fail"]])  # else it takes n2 at once and restart_node never sees it idle
    sb.restart_node("n2")
    run(["scontrol", "release", jobs["node_fail"]])
    wait(ends(jobs["node_fail"], "COMPLETED", 1), 120, "node_fail to complete")

    argv = sacct_command(list(jobs.values()))
    expected_rows = len(jobs) + 5  # one more row each for requeued, self_requeued, array_1, preempted, node_fail
    text = ""

    def recorded() -> bool:
        nonlocal text
        text = run(argv)
        return len(text.splitlines()) >= expected_rows and "RUNNING" not in text and "PENDING" not in text

    wait(recorded, 120, f"sacct to show {expected_rows} rows")
    version = run(["sinfo", "--version"]).strip()  # "slurm 22.05.8"
    major_minor = ".".join(version.split()[-1].split(".")[:2])
    out = out or HERE / f"sacct_{major_minor}.txt"
    header = [
        f"# Real output of {version}'s sacct, captured by tests/unit/data/capture_sacct.py on "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d} (private accounting sandbox).",
        f"# command: {' '.join(argv)}",
        "# jobs: " + " ".join(f"{k}={v}" for k, v in jobs.items()),
    ]
    out.write_text("\n".join(header) + "\n" + text)
    print(f"wrote {out}:\n{out.read_text()}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except subprocess.TimeoutExpired as e:
        sys.exit(f"a Slurm client did not answer: {e}")
