"""16 ranks on 8 Slurm nodes: the digits job with a signal mid-run, a requeue and a resume.

    python benchmarks/scale_slurm.py                       # 8 nodes × 2 tasks, ~3-6 min on 2 cores
    python benchmarks/scale_slurm.py --nodes 4 --tasks-per-node 2

Root only (it starts a private ``SlurmSandbox``: one network namespace per node; stopped at the
end). Each node advertises ``--tasks-per-node`` CPUs (``SlurmdParameters=config_overrides``) on
this 2-core machine, so batches are tiny (``train.batch_size=8``): the point is the machinery.
The job trains to ``--max-steps``; once it logged step 5, SIGUSR2 goes to the batch shell (the
time-limit signal's path: shell → srun → every rank), rank 0 commits the checkpoint of the
agreed step, the job requeues itself, resumes there on all ranks and finishes. Printed: the
timings, and the checks (resumed at the stopped step; every step logged exactly once; every
rank of both starts on its own node/local-rank place). Exit status 1 when a check fails. The
CI variant is ``tests/slurm/test_many_ranks.py`` (4 nodes × 2 tasks).
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from lib.slurm_jobs import record_timing, submit_digits, train_steps  # noqa: E402

from slurm_ddp.rundir import read_metrics, read_preempted  # noqa: E402
from slurm_ddp.sandbox import SlurmSandbox  # noqa: E402
from slurm_ddp.testing import wait_for  # noqa: E402


def main(argv: Sequence[str] = ()) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--tasks-per-node", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--dir", help="where the sandbox and the run live (default: a temporary directory, deleted)")
    args = ap.parse_args(list(argv) or None)
    world = args.nodes * args.tasks_per_node
    failures: List[str] = []
    with tempfile.TemporaryDirectory(prefix="scale-slurm-", dir=args.dir) as tmp:
        t0 = time.time()
        with SlurmSandbox(Path(tmp) / "sandbox", nodes=args.nodes, cpus_per_node=args.tasks_per_node) as sb:
            record_timing(f"sandbox up ({args.nodes} nodes)", time.time() - t0)
            run_dir = Path(tmp) / "run"
            t_submit = time.time()
            job = submit_digits(
                sb,
                run_dir,
                f"slurm.nodes={args.nodes}",
                f"slurm.tasks_per_node={args.tasks_per_node}",
                "slurm.cpus_per_task=1",
                f"train.max_steps={args.max_steps}",
                "train.batch_size=8",
                "train.log_every=1",
                "checkpoint.every_steps=0",
                "train.pg_timeout_s=300",
            )
            try:
                job.wait_step(5, timeout_s=900)
                rank0 = job.rank_log(0)
                m = re.search(r"process group formed in ([\d.]+) s", rank0)
                record_timing(f"sbatch→first step ({world} ranks)", read_metrics(run_dir)[0]["time"] - t_submit)
                if m:
                    record_timing(f"init_process_group on rank 0 ({world} ranks)", float(m.group(1)))
                t_signal = time.time()
                job.scancel("--batch", "--signal=USR2")
                wait_for(lambda: read_preempted(run_dir), 300, "the preemption checkpoint", job.diag)
                stopped = read_preempted(run_dir)
                assert stopped is not None
                record_timing(f"USR2 at the batch shell→checkpoint committed ({world} ranks)", time.time() - t_signal)
                finished = job.wait_finished(timeout_s=900)
                events = read_metrics(run_dir)
                pre = [e for e in events if e["event"] == "preempted"][-1]
                res = [e for e in events if e["event"] == "resume"][-1]
                record_timing(f"checkpoint→resumed step (requeue + restart, {world} ranks)", res["time"] - pre["time"])
                record_timing("submit→finished (total)", time.time() - t_submit)
                print(f"stopped at step {stopped.step} ({stopped.signal}); restarts {job.restarts()}; {finished}")
                if res["step"] != stopped.step:
                    failures.append(f"resumed at step {res['step']}, stopped at {stopped.step}")
                if train_steps(run_dir) != list(range(1, args.max_steps + 1)):
                    failures.append(f"steps not logged exactly once: {train_steps(run_dir)}")
                if finished.get("world_size") != world or job.restarts() != 1:
                    failures.append(f"world size {finished.get('world_size')}, restarts {job.restarts()}")
                for restart in (0, 1):
                    places = set()
                    for rank in range(world):
                        places |= set(
                            re.findall(
                                rf"host (\S+) \(\S+\) rank {rank}/{world} local_rank (\d+)/\d+ .* restart {restart} pid",
                                job.rank_log(rank),
                            )
                        )
                    hosts = {h for h, _ in places}
                    print(f"restart {restart}: {len(places)} rank places on {len(hosts)} nodes")
                    if len(places) != world or hosts != set(sb.node_names):
                        failures.append(f"restart {restart}: ranks on {sorted(places)}")
            finally:
                if job.state() not in ("COMPLETED", "FAILED", "CANCELLED"):
                    job.scancel()
    print("OK" if not failures else "FAILED:\n  " + "\n  ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
