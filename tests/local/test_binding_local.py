"""Binding applied for real: rank processes started through ``python -m slurm_ddp.launch``.

Each rank reports from inside itself — ``torch.get_num_threads()``, ``os.sched_getaffinity(0)``,
the libraries mapped in ``/proc/self/maps`` and its OMP/KMP variables — and the report is
compared with the plan ``slurm_ddp.binding`` makes for the same inputs. One test goes through
``slurm-ddp submit --backend local`` (2 DDP ranks of a tiny task), the others run the wrapper
directly with a small reporting program.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from lib import missing_prerequisite, require_executable, require_library

from slurm_ddp import binding
from slurm_ddp.config import dump_config, load_config
from slurm_ddp.env import synthetic_slurm_env

pytestmark = pytest.mark.local

REPORT = r"""
import json, os, sys
affinity = sorted(os.sched_getaffinity(0))  # the process's, as the wrapper (and numactl) left it
status = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l)
import torch
maps = open('/proc/self/maps').read()
json.dump({
    'rank': int(os.environ['SLURM_PROCID']),
    'threads': torch.get_num_threads(),
    'affinity': affinity,
    'affinity_after_torch': sorted(os.sched_getaffinity(0)),  # OpenMP may have pinned the main thread
    'mems_allowed': status['Mems_allowed_list'].strip(),
    'jemalloc': 'libjemalloc' in maps,
    'tcmalloc': 'libtcmalloc' in maps,
    'env': {k: v for k, v in os.environ.items()
            if k.startswith(('OMP_', 'KMP_')) or k in ('LD_PRELOAD', 'SLURM_DDP_BINDING')},
}, open(os.path.join(sys.argv[1], 'report-%s.json' % os.environ['SLURM_PROCID']), 'w'))
"""

TASK = """
import json, os
import torch
from torch.utils.data import TensorDataset
from slurm_ddp.task import Task

class ReportTask(Task):
    def build_model(self):
        maps = open('/proc/self/maps').read()
        rank = os.environ['SLURM_PROCID']
        with open(os.path.join(os.environ['SLURM_DDP_RUN_DIR'], 'report-%s.json' % rank), 'w') as f:
            json.dump({'rank': int(rank), 'threads': torch.get_num_threads(),
                       'affinity': sorted(os.sched_getaffinity(0)), 'jemalloc': 'libjemalloc' in maps,
                       'env': {k: v for k, v in os.environ.items() if k.startswith('OMP_')}}, f)
        return torch.nn.Linear(4, 2)

    def build_datasets(self):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=g)
        return TensorDataset(x, (x[:, 0] > 0).long()), None
"""


def clean_environ() -> dict:
    """This process's environment without SLURM_/OMP_/KMP_ variables or LD_PRELOAD (the test
    runner's own values would count as user-set)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_", "KMP_")) and k != "LD_PRELOAD"}


def expected_plan(cfg, env):
    allowed = os.sched_getaffinity(0)
    return binding.plan_for_task(
        cfg,
        env,
        allowed=allowed,
        numa=binding.read_numa_nodes(),
        core_ids=binding.read_core_ids(allowed),
        libraries=binding.locate_libraries(binding.needed_libraries(cfg), env),
        numactl=shutil.which("numactl"),
    )


def make_run_dir(tmp_path: Path, *sets: str) -> Path:
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: bind\nslurm: {nodes: 1, tasks_per_node: 2, cpus_per_task: 1}\ntrain: {task: 'report_task:ReportTask'}\n"
    )
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "config.yaml").write_text(dump_config(load_config(job, list(sets))))
    return rd


def run_ranks(rd: Path, ranks, extra_env: dict = None) -> list:
    """Start ``ranks`` of a 1-node × 2-task job through the wrapper (local backend rules), all
    at once; returns [(report, the environment the rank was started with)] in ``ranks`` order."""
    procs = []
    for rank in ranks:
        env = clean_environ()
        env.update(synthetic_slurm_env(rank=rank, nodes=1, tasks_per_node=2, cpus_per_task=1))
        env["SLURM_DDP_BACKEND"] = "local"
        env.update(extra_env or {})
        procs.append(
            (
                rank,
                env,
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "slurm_ddp.launch",
                        "--run-dir",
                        str(rd),
                        "--",
                        sys.executable,
                        "-c",
                        REPORT,
                        str(rd),
                    ],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    out = []
    for rank, env, p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        out.append((json.loads((rd / f"report-{rank}.json").read_text()), env))
    return out


def run_rank(rd: Path, rank: int, extra_env: dict = None) -> tuple:
    return run_ranks(rd, [rank], extra_env)[0]


def test_local_backend_ranks_get_the_planned_threads_affinity_and_jemalloc(tmp_path: Path) -> None:
    """Two real DDP ranks through `slurm-ddp submit --backend local` with cores + jemalloc."""
    require_library("jemalloc", why="the ranks preload it")
    (tmp_path / "report_task.py").write_text(TASK)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: bindjob\n"
        "slurm: {nodes: 1, tasks_per_node: 2, cpus_per_task: 1}\n"
        "environment: {cpu_bind: cores, allocator: jemalloc}\n"
        "train: {task: 'report_task:ReportTask', max_steps: 2, batch_size: 4, log_every: 1}\n"
        "checkpoint: {every_steps: 0}\n"
    )
    rd = tmp_path / "run"
    res = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(rd)],
        env=clean_environ(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, (
        res.stdout + res.stderr + "".join(p.read_text() for p in (rd / "logs").glob("rank-*.log"))
    )
    cfg = load_config(rd / "config.yaml")
    for rank in (0, 1):
        report = json.loads((rd / f"report-{rank}.json").read_text())
        env = synthetic_slurm_env(rank=rank, nodes=1, tasks_per_node=2, cpus_per_task=1)
        env["SLURM_DDP_BACKEND"] = "local"
        plan = expected_plan(cfg, env)
        assert report["threads"] == plan.threads == 1
        assert tuple(report["affinity"]) == plan.affinity
        assert report["jemalloc"], "libjemalloc is not mapped in the rank"
        assert report["env"]["OMP_PLACES"] == plan.env["OMP_PLACES"]
    if len(os.sched_getaffinity(0)) >= 2:  # two ranks, two different CPUs
        a0 = json.loads((rd / "report-0.json").read_text())["affinity"]
        a1 = json.loads((rd / "report-1.json").read_text())["affinity"]
        assert not set(a0) & set(a1)


@pytest.mark.parametrize("cpu_bind", ["none", "cores"])
def test_wrapper_threads_and_affinity(tmp_path: Path, cpu_bind: str) -> None:
    rd = make_run_dir(tmp_path, f"environment.cpu_bind={cpu_bind}", "slurm.cpus_per_task=2")
    cfg = load_config(rd / "config.yaml")
    for report, env in run_ranks(rd, (0, 1), {"SLURM_CPUS_PER_TASK": "2"}):
        plan = expected_plan(cfg, env)
        assert report["threads"] == plan.threads
        assert report["env"]["OMP_NUM_THREADS"] == str(plan.threads)
        assert report["env"]["SLURM_DDP_BINDING"] == plan.summary()
        if cpu_bind == "cores":
            assert tuple(report["affinity"]) == plan.affinity
            # libgomp pins the initial thread to the first place when torch loads it
            assert report["affinity_after_torch"] == [plan.cpus[0]]
        else:
            assert set(report["affinity"]) == os.sched_getaffinity(0)  # left as it was
            assert "OMP_PROC_BIND" not in report["env"] and "LD_PRELOAD" not in report["env"]
        assert not report["jemalloc"]


def test_wrapper_keeps_a_user_thread_count(tmp_path: Path) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        missing_prerequisite("needs 2 CPUs (torch caps its threads at the CPUs)")
    rd = make_run_dir(tmp_path, "environment.cpu_bind=cores")  # planned: 1 thread per rank
    report, _ = run_rank(rd, 0, {"OMP_NUM_THREADS": "2"})
    assert report["threads"] == 2 and report["env"]["OMP_NUM_THREADS"] == "2"
    (tmp_path / "override").mkdir()
    rd2 = make_run_dir(tmp_path / "override", "environment.cpu_bind=cores", "environment.override_env=true")
    report, _ = run_rank(rd2, 0, {"OMP_NUM_THREADS": "2"})
    assert report["threads"] == 1


def test_wrapper_numa_mode_runs_under_numactl(tmp_path: Path) -> None:
    require_executable("numactl", why="environment.cpu_bind=numa (apt-get install numactl)")
    require_library("jemalloc", why="the rank preloads it")
    rd = make_run_dir(tmp_path, "environment.cpu_bind=numa", "environment.allocator=jemalloc")
    cfg = load_config(rd / "config.yaml")
    report, env = run_rank(rd, 1)
    plan = expected_plan(cfg, env)
    assert plan.prefix[0].endswith("numactl")
    assert tuple(report["affinity"]) == plan.affinity  # the NUMA node's CPUs (numactl --cpunodebind)
    assert report["mems_allowed"] == ",".join(map(str, plan.numa_nodes))  # numactl --membind
    assert report["threads"] == plan.threads
    assert report["env"]["OMP_PLACES"] == plan.env["OMP_PLACES"]
    assert report["jemalloc"]


def test_wrapper_tcmalloc_when_installed(tmp_path: Path) -> None:
    try:
        binding.locate_libraries(["tcmalloc"], os.environ)
    except binding.BindingError as e:
        rd = make_run_dir(tmp_path, "environment.allocator=tcmalloc")
        env = clean_environ()
        env.update(synthetic_slurm_env(rank=0, nodes=1, tasks_per_node=2))
        res = subprocess.run(
            [sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(rd), "--", "true"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert res.returncode == 2 and "libtcmalloc-minimal4" in res.stderr and str(e) in res.stderr
        return
    rd = make_run_dir(tmp_path, "environment.allocator=tcmalloc")
    report, _ = run_rank(rd, 0)
    assert report["tcmalloc"] and not report["jemalloc"]
