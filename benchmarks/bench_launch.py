"""P5 launch overhead: rank start → process group ready, minus the time of ``import torch``.

    python benchmarks/bench_launch.py            # ~1 min; --trials N to change

Measured on the shared 2-core test VM (medians of 5 trials): slurm_ddp 0.259 s (goal < 0.5 s),
torchrun 0.076 s; from the command to all ranks ready: slurm_ddp 1.90 s, torchrun 3.02 s (torchrun's
agent imports torch before it starts the ranks). Of slurm_ddp's 0.26 s: 0.18 s from process start
to a running interpreter (the binding wrapper's own interpreter, then exec of the worker's), 0.06 s of
imports and config after torch, and init_process_group waiting for the later rank. Under heavier
load an earlier run gave 0.47 s vs 0.10 s.

Three launches of 2 gloo ranks on this machine, interleaved ``--trials`` times (medians reported):

* **slurm_ddp**: ``slurm-ddp submit examples/digits/job.yaml --backend local`` — each rank is what
  srun starts in the sbatch script: ``python -m slurm_ddp.launch`` (the binding wrapper), which
  execs ``python -m slurm_ddp.worker``; the worker reads the run directory's config, derives its
  ``DistEnv`` from the SLURM task variables and calls ``init_distributed``.
* **sd_torchrun**: slurm_ddp's torchrun launcher (``slurm.launcher: torchrun``): the rendered
  ``python -m torch.distributed.run`` line (c10d rendezvous, ``--signals-to-handle``) on one node,
  whose entry point is the binding wrapper (``--rank-log``), which execs the worker; the worker
  reads torchrun's RANK/LOCAL_RANK/… (``DistEnv.from_environ``).
* **torchrun**: ``torchrun --nproc_per_node=2`` running a tiny script that takes the same code
  path (``slurm_ddp.worker.runtime.init_distributed`` from a ``DistEnv``), built from torchrun's
  ``RANK``/``WORLD_SIZE``/``MASTER_*`` variables.

A ``sitecustomize.py`` put on ``PYTHONPATH`` instruments every rank without changing the worker:
it times ``import torch`` (done first, so the worker's own import finds it loaded) and wraps
``init_distributed`` to record when the group is ready, then the ranks stop there. A rank's
start is its process start time from ``/proc/PID/stat`` (10 ms resolution; under slurm_ddp the
wrapper's start, as ``exec`` keeps the PID). Reported per launch:

* *rank start → group ready*: latest ready − earliest rank start (the job's ranks all ready);
* *minus import torch*: that, minus the slowest rank's ``import torch`` (goal < 0.5 s);
* *command → group ready*: from starting ``slurm-ddp submit`` / ``torchrun`` (torchrun's agent
  imports torch itself before it starts the ranks).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "examples" / "digits" / "job.yaml"

SITECUSTOMIZE = r"""
import os, sys, time
_out = os.environ.get("BENCH_LAUNCH_OUT")
_cmd = open("/proc/self/cmdline", "rb").read().split(b"\0")
_is_worker = b"slurm_ddp.worker" in _cmd and b"slurm_ddp.launch" not in _cmd  # not the binding wrapper
_is_torchrun_rank = (any(c.endswith(b"torchrun_rank.py") for c in _cmd)
                     and not any(c.startswith(b"--nproc_per_node") for c in _cmd))  # not torchrun's agent
_is_rank = _out and (_is_worker or _is_torchrun_rank)
if _is_rank:
    def _proc_start() -> float:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        uptime = float(open("/proc/uptime").read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")

    _rec = {"pid": os.getpid(), "start": _proc_start(), "interpreter_ready": time.time()}
    _t = time.perf_counter()
    import torch
    _rec["import_torch_s"] = time.perf_counter() - _t
    import slurm_ddp.worker.runtime as _rt

    _orig = _rt.init_distributed

    def _ready(denv, *args, **kwargs):
        _rec["init_called"] = time.time()
        device = _orig(denv, *args, **kwargs)
        _rec["ready"] = time.time()
        _rec["rank"] = denv.rank
        import torch.distributed as dist
        dist.barrier()  # both ranks recorded before rank 0 (the store's host) leaves
        with open(os.path.join(_out, f"rank-{denv.rank}.json"), "w") as f:
            f.write(__import__("json").dumps(_rec))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    _rt.init_distributed = _ready
    if _is_worker:  # the worker's Trainer calls the name it imported into slurm_ddp.worker.train
        import slurm_ddp.worker.train as _tr

        _tr.init_distributed = _ready
"""

TORCHRUN_RANK = r'''
"""torchrun's rank: the worker's code path to a process group (DistEnv → init_distributed)."""
import os
from slurm_ddp.env import DistEnv
from slurm_ddp.worker import runtime

denv = DistEnv(rank=int(os.environ["RANK"]), local_rank=int(os.environ["LOCAL_RANK"]),
               world_size=int(os.environ["WORLD_SIZE"]), node_rank=int(os.environ.get("GROUP_RANK", "0")),
               num_nodes=1, local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
               master_addr=os.environ["MASTER_ADDR"], master_port=int(os.environ["MASTER_PORT"]),
               job_id="torchrun", hostname="", restart_count=0)
runtime.init_distributed(denv, "gloo", 600)
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_for(tools: Path, out: Path) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tools), str(REPO)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env["BENCH_LAUNCH_OUT"] = str(out)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def collect(out: Path, t_cmd: float) -> Dict[str, float]:
    recs = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    start = min(r["start"] for r in recs)
    ready = max(r["ready"] for r in recs)
    torch_s = max(r["import_torch_s"] for r in recs)
    return {
        "start_to_ready": ready - start,
        "import_torch": torch_s,
        "overhead": ready - start - torch_s,
        "cmd_to_ready": ready - t_cmd,
        "init_process_group": max(r["ready"] - r["init_called"] for r in recs),
        "cmd_to_first_rank": start - t_cmd,
        # per-rank phases, the slowest rank: process start → sitecustomize (interpreter start, and
        # under slurm_ddp the binding wrapper's interpreter + exec), other imports/config → init call
        "to_interpreter": max(r["interpreter_ready"] - r["start"] for r in recs),
        "imports_config": max(r["init_called"] - r["interpreter_ready"] - r["import_torch_s"] for r in recs),
        "rank_start_skew": abs(recs[0]["start"] - recs[1]["start"]),
        "init_skew": abs(recs[0]["init_called"] - recs[1]["init_called"]),
    }


def run_slurm_ddp(tools: Path, work: Path) -> Dict[str, float]:
    out, run_dir = work / "out", work / "run"
    out.mkdir(parents=True)
    cmd = [
        sys.executable,
        "-m",
        "slurm_ddp",
        "submit",
        str(JOB),
        "--backend",
        "local",
        "--run-dir",
        str(run_dir),
        "--no-check-task",
        "--set",
        "train.max_steps=1",
    ]
    t_cmd = time.time()
    r = subprocess.run(cmd, env=env_for(tools, out), capture_output=True, text=True, timeout=300)
    if not (out / "rank-1.json").exists():
        raise RuntimeError(f"slurm_ddp launch failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return collect(out, t_cmd)


def run_torchrun(tools: Path, work: Path) -> Dict[str, float]:
    out = work / "out"
    out.mkdir(parents=True)
    torchrun = shutil.which("torchrun")
    launcher = [torchrun] if torchrun else [sys.executable, "-m", "torch.distributed.run"]
    cmd = launcher + [
        "--nproc_per_node=2",
        "--nnodes=1",
        "--master_addr=127.0.0.1",
        f"--master_port={free_port()}",
        str(tools / "torchrun_rank.py"),
    ]
    t_cmd = time.time()
    r = subprocess.run(cmd, env=env_for(tools, out), capture_output=True, text=True, timeout=300)
    if not (out / "rank-1.json").exists():
        raise RuntimeError(f"torchrun launch failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return collect(out, t_cmd)


def run_slurm_ddp_torchrun(tools: Path, work: Path) -> Dict[str, float]:
    """slurm_ddp's torchrun launcher (``slurm.launcher: torchrun``) on one node: the torchrun line the
    batch script renders (``render.torchrun_flags``), the launch wrapper as torchrun's entry point
    (binding by LOCAL_RANK, --rank-log), execing the worker, which reads torchrun's variables."""
    from slurm_ddp.config import config_from_dict, dump_config, read_yaml
    from slurm_ddp.render import torchrun_flags

    out, run_dir = work / "out", work / "run"
    out.mkdir(parents=True)
    (run_dir / "logs").mkdir(parents=True)
    data = read_yaml(JOB)
    data["slurm"] = {**data["slurm"], "nodes": 1, "tasks_per_node": 2, "launcher": "torchrun"}
    data["train"] = {**data["train"], "max_steps": 1, "pythonpath": [str(JOB.parent)]}
    cfg = config_from_dict(data)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    py = sys.executable
    cmd = [py, "-m", "torch.distributed.run", *torchrun_flags(cfg), f"--rdzv-endpoint=127.0.0.1:{free_port()}"]
    cmd += ["--rdzv-id=bench", "--no-python", py, "-m", "slurm_ddp.launch", "--run-dir", str(run_dir), "--rank-log"]
    cmd += ["--", py, "-u", "-m", "slurm_ddp.worker", "--run-dir", str(run_dir)]
    t_cmd = time.time()
    r = subprocess.run(cmd, env=env_for(tools, out), capture_output=True, text=True, timeout=300)
    if not (out / "rank-1.json").exists():
        logs = "".join(p.read_text()[-2000:] for p in sorted((run_dir / "logs").glob("*")))
        raise RuntimeError(f"slurm_ddp torchrun launch failed ({r.returncode}):\n{r.stderr[-3000:]}\n{logs}")
    return collect(out, t_cmd)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=5)
    args = p.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench_launch_"))
    tools = root / "tools"
    tools.mkdir()
    (tools / "sitecustomize.py").write_text(textwrap.dedent(SITECUSTOMIZE))
    (tools / "torchrun_rank.py").write_text(textwrap.dedent(TORCHRUN_RANK))
    results: Dict[str, List[Dict[str, float]]] = {"slurm_ddp": [], "sd_torchrun": [], "torchrun": []}
    print(
        f"P5: 2 gloo ranks on this machine, {args.trials} interleaved trials; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}",
        flush=True,
    )
    try:
        for i in range(args.trials):
            order = [("slurm_ddp", run_slurm_ddp), ("sd_torchrun", run_slurm_ddp_torchrun), ("torchrun", run_torchrun)]
            for name, fn in order if i % 2 == 0 else order[::-1]:
                r = fn(tools, root / f"{name}-{i}")
                results[name].append(r)
                print(
                    f"  trial {i} {name:9s}: rank start → group ready {r['start_to_ready']:.3f} s, import torch "
                    f"{r['import_torch']:.3f} s, overhead {r['overhead']:.3f} s; command → ready "
                    f"{r['cmd_to_ready']:.3f} s",
                    flush=True,
                )
    finally:
        shutil.rmtree(root, ignore_errors=True)

    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in results.items()}
    for n, m in med.items():
        print(
            f"{n:9s} (medians): rank start → process group ready {m['start_to_ready']:.3f} s = import torch "
            f"{m['import_torch']:.3f} s + {m['overhead']:.3f} s (of which init_process_group "
            f"{m['init_process_group']:.3f} s, waiting for the later rank included); command → ready "
            f"{m['cmd_to_ready']:.3f} s (command → first rank started {m['cmd_to_first_rank']:.3f} s)"
        )
        print(
            f"{'':9s}  slowest rank: process start → interpreter running {m['to_interpreter']:.3f} s, imports "
            f"and config after torch {m['imports_config']:.3f} s; ranks' init calls {m['init_skew']:.3f} s apart"
        )
    s, st, t = med["slurm_ddp"], med["sd_torchrun"], med["torchrun"]
    print(
        f"P5 launch overhead (rank start → group ready − import torch): slurm_ddp {s['overhead']:.3f} s "
        f"(goal < 0.5 s: {'met' if s['overhead'] < 0.5 else 'NOT met'}), slurm_ddp under its torchrun launcher "
        f"{st['overhead']:.3f} s ({'met' if st['overhead'] < 0.5 else 'NOT met'}), plain torchrun "
        f"{t['overhead']:.3f} s; command → ready: slurm_ddp {s['cmd_to_ready']:.3f} s, torchrun launcher "
        f"{st['cmd_to_ready']:.3f} s, plain torchrun {t['cmd_to_ready']:.3f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
