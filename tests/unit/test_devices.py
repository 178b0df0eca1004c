"""The GPU selection rule (``slurm_ddp.devices.select_device``) as a table: every layout Slurm can
hand out, the device each local rank must use, and the layouts that must fail with one line.

The task variables are what Slurm 22.05 gave on the emulated-GPU sandbox (SLURM-FACTS.md,
"Emulated GPUs") and what srun(1) documents for cgroup-constrained devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Dict, Optional

import pytest

from slurm_ddp.config import check_gpu_bind
from slurm_ddp.devices import (
    DeviceSelectionError,
    nccl_environment,
    probe_record,
    select_device,
    synthetic_gpu_env,
)


def task(visible: Optional[str], step: Optional[str], local: int, tasks: int, **extra: str) -> Dict[str, str]:
    env = {"SLURM_LOCALID": str(local), "SLURM_TASKS_PER_NODE": str(tasks), "SLURM_NODEID": "0", **extra}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    if step is not None:
        env["SLURM_STEP_GPUS"] = step
    return env


# (layout, environment) -> (cuda ordinal, physical GPU)
GOOD = {
    "gpus_per_node=2, 2 tasks: rank 0 sees both": (task("0,1", "0,1", 0, 2), (0, "0")),
    "gpus_per_node=2, 2 tasks: rank 1 sees both": (task("0,1", "0,1", 1, 2), (1, "1")),
    "gpus_per_node=4, 4 tasks: rank 3": (task("0,1,2,3", "0,1,2,3", 3, 4), (3, "3")),
    "gpus_per_task=1: rank 0 sees GPU 0": (task("0", "0", 0, 2), (0, "0")),
    "gpus_per_task=1: rank 1 sees GPU 1, which CUDA calls cuda:0": (task("1", "1", 1, 2), (0, "1")),
    "step lists both GPUs, one visible, devices not constrained": (
        task("1", "0,1", 1, 2, constrained="no"),
        (0, "1"),
    ),
    "cgroup-constrained: renumbered from 0, SLURM_STEP_GPUS physical": (task("0", "3", 1, 4), (0, "3")),
    "gpu_bind=closest without topology: all visible": (task("0,1", "0,1", 1, 2), (1, "1")),
    "map_gpu:1,0: rank 0 on physical 1": (task("1", "1", 0, 2), (0, "1")),
    "two nodes, node 1, rank 1 of the node": (task("0,1", "0,1", 1, 2, SLURM_NODEID="1"), (1, "1")),
    "SLURM_JOB_GPUS on the batch host when no step list": (
        task("0,1", None, 1, 2, SLURM_JOB_GPUS="4,5", SLURMD_NODENAME="n1", SLURM_JOB_NODELIST="n[1-2]"),
        (1, "5"),
    ),
    "no step list elsewhere: CUDA_VISIBLE_DEVICES": (
        task("0,1", None, 1, 2, SLURM_JOB_GPUS="4,5", SLURMD_NODENAME="n2", SLURM_JOB_NODELIST="n[1-2]"),
        (1, "1"),
    ),
    "more visible than tasks (8 GPUs, 4 tasks)": (task("0,1,2,3,4,5,6,7", None, 2, 4), (2, "2")),
    "torchrun variables win over Slurm's": (
        task("0,1", "0,1", 0, 1, LOCAL_RANK="1", LOCAL_WORLD_SIZE="2"),
        (1, "1"),
    ),
    "one task, one GPU": (task("2", "2", 0, 1), (0, "2")),
    "GPU UUIDs": (task("GPU-aa,GPU-bb", None, 1, 2), (1, "GPU-bb")),
    "ROCm: GPU_DEVICE_ORDINAL": (task(None, "0,1", 1, 2, GPU_DEVICE_ORDINAL="0,1"), (1, "1")),
    "tasks per node in Slurm's compressed form": (
        task("0,1", None, 1, 2, SLURM_TASKS_PER_NODE="2(x3)", SLURM_NODEID="2"),
        (1, "1"),
    ),
}


@pytest.mark.parametrize("layout", list(GOOD))
def test_device_table(layout: str) -> None:
    env, (ordinal, physical) = GOOD[layout]
    env = dict(env)
    constrained = {"no": False, "yes": True}.get(env.pop("constrained", ""))
    choice = select_device(env, constrained=constrained)
    assert (choice.ordinal, choice.physical) == (ordinal, physical)
    assert choice.device == f"cuda:{ordinal}"
    assert choice.device in choice.describe() and physical in choice.describe()


BAD = {
    "2 GPUs visible to each of 4 tasks": (task("0,1", "0,1", 3, 4), "2 GPUs visible to each of 4 tasks"),
    "no GPU visible (empty)": (task("", None, 0, 2), "no GPU is visible"),
    "Slurm's NoDevFiles": (task("NoDevFiles", None, 0, 2), "no GPU is visible"),
    "nothing restricts the devices": (task(None, None, 0, 2), "no GPU is visible"),
    "several GPUs, place unknown": ({"CUDA_VISIBLE_DEVICES": "0,1"}, "place on the node is unknown"),
    "LOCAL_RANK outside the node": (task("0,1", "0,1", 0, 2, LOCAL_RANK="2"), "LOCAL_RANK 2 is outside 0..1"),
    "LOCAL_RANK not a number": (task("0,1", None, 0, 2, LOCAL_RANK="x"), "LOCAL_RANK='x' is not an integer"),
}


@pytest.mark.parametrize("layout", list(BAD))
def test_device_table_failures_are_one_line(layout: str) -> None:
    env, fragment = BAD[layout]
    with pytest.raises(DeviceSelectionError) as info:
        select_device(env)
    text = str(info.value)
    assert fragment in text and "\n" not in text
    if "integer" not in fragment:
        for name in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            assert name in text
    assert info.value.exit_code == 2


def test_device_count_is_used_only_when_nothing_restricts_the_devices() -> None:
    assert select_device(task(None, None, 1, 2), device_count=2).ordinal == 1
    assert select_device(task("3", None, 1, 2), device_count=8).ordinal == 0


@pytest.mark.parametrize(
    "value",
    [
        "closest",
        "none",
        "verbose,closest",
        "single:1",
        "per_task:1",
        "map_gpu:0,1",
        "map_gpu:1*2,0",
        "mask_gpu:0x3,0xC",
    ],
)
def test_gpu_bind_values_srun_accepts(value: str) -> None:
    assert check_gpu_bind(value) is None


@pytest.mark.parametrize(
    "value", ["nearest", "single", "single:0", "map_gpu:", "mask_gpu:xyz", "closest;rm", "CLOSEST"]
)
def test_gpu_bind_values_srun_refuses(value: str) -> None:
    assert "closest" in (check_gpu_bind(value) or "")


@pytest.mark.parametrize(
    "kw, per_rank",
    [
        ({"node_gpus": 2}, ["0,1", "0,1"]),
        ({"node_gpus": 2, "gpus_per_task": 1}, ["0", "1"]),
        ({"node_gpus": 2, "gpu_bind": "single:1"}, ["0", "1"]),
        ({"node_gpus": 2, "gpu_bind": "closest"}, ["0,1", "0,1"]),
        ({"node_gpus": 2, "gpu_bind": "map_gpu:1,0"}, ["1", "0"]),
        ({"node_gpus": 4, "gpu_bind": "mask_gpu:0x1,0x8"}, ["0", "3"]),
    ],
)
def test_synthetic_gpu_env_follows_slurm_and_the_rule_maps_it(kw, per_rank) -> None:
    got = [synthetic_gpu_env(local_rank=r, tasks_per_node=2, **kw)["CUDA_VISIBLE_DEVICES"] for r in range(2)]
    assert got == per_rank
    physical = [
        select_device(
            {**synthetic_gpu_env(local_rank=r, tasks_per_node=2, **kw), **task(None, None, r, 2)}, constrained=False
        ).physical
        for r in range(2)
    ]
    assert len(set(physical)) == 2 and None not in physical  # every layout gives the two ranks different GPUs


def test_nccl_defaults_only_where_the_user_set_nothing() -> None:
    out, kept, passed = nccl_environment({})
    assert out == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"} and not kept and not passed
    out, kept, passed = nccl_environment(
        {"NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5"}
    )
    assert out == {}
    assert kept == {"NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_DEBUG": "INFO"}
    assert passed == {"NCCL_IB_HCA": "mlx5", "NCCL_SOCKET_IFNAME": "ib0"}


def test_probe_record_names_the_choice_or_the_error() -> None:
    rec = probe_record(task("1", "1", 1, 2, SLURM_PROCID="1"))
    assert rec["device"] == "cuda:0" and rec["physical"] == "1" and rec["CUDA_VISIBLE_DEVICES"] == "1"
    rec = probe_record(task("0,1", "0,1", 3, 4))
    assert "error" in rec and "device" not in rec


# --------------------------------------------------------------------------- env --explain
def _cfg(**slurm):
    from slurm_ddp.config import config_from_dict

    return config_from_dict({"name": "g", "train": {"task": "m:T"}, "slurm": {"time": "10", **slurm}})


def test_explain_job_shows_each_ranks_gpu_numa_node_and_cpus() -> None:
    from slurm_ddp.explain import explain_job

    text = explain_job(_cfg(gpus_per_task=1, tasks_per_node=2, nodes=2), numa_nodes=2, environ={})
    gpu = [line for line in text.splitlines() if line.startswith("  gpu:")]
    assert [g.split(";")[0] for g in gpu] == [
        "  gpu: cuda:0 = physical GPU 0 (NUMA node 0)",
        "  gpu: cuda:0 = physical GPU 1 (NUMA node 1)",
    ] * 2
    assert "rank 1: local_rank=1/2 node=0 host=node0 cpus=1 numa=1" in text
    assert "NUMA node 1 of this task's GPU" in text
    assert "nccl: TORCH_NCCL_ASYNC_ERROR_HANDLING=1 NCCL_DEBUG=WARN (set where unset)" in text
    text = explain_job(_cfg(gpus_per_node=2), environ={"NCCL_SOCKET_IFNAME": "ib0", "NCCL_DEBUG": "INFO"})
    assert "  gpu: cuda:1 = physical GPU 1 (NUMA node 0); CUDA_VISIBLE_DEVICES=0,1" in text
    assert "kept (set by the user): NCCL_DEBUG=INFO" in text and "passed through: NCCL_SOCKET_IFNAME=ib0" in text


def test_explain_task_names_the_cuda_device_of_this_task() -> None:
    from slurm_ddp.binding import plan_for_task
    from slurm_ddp.env import synthetic_slurm_env
    from slurm_ddp.explain import explain_task

    cfg = _cfg(gpus_per_task=1, tasks_per_node=2)
    env = {
        **synthetic_slurm_env(rank=1, nodes=1, tasks_per_node=2),
        "CUDA_VISIBLE_DEVICES": "1",
        "SLURM_STEP_GPUS": "1",
    }
    text = explain_task(cfg, env, plan_for_task(cfg, env, allowed=range(2)))
    assert "gpu: cuda:0 = physical GPU 1; CUDA_VISIBLE_DEVICES=1" in text
    env["CUDA_VISIBLE_DEVICES"] = env["SLURM_STEP_GPUS"] = "0,1"
    env["SLURM_TASKS_PER_NODE"] = "4"
    text = explain_task(cfg, env, plan_for_task(cfg, env, allowed=range(2)))
    assert "gpu: cannot choose this rank's GPU" in text


@pytest.mark.parametrize("gpu_job", [True, False], ids=["gpu-job", "cpu-job"])
def test_the_launch_wrapper_gives_a_gpu_rank_nccls_settings_where_unset(tmp_path, make_config, gpu_job):
    """The one place NCCL's defaults are applied: the rank wrapper, for GPU jobs, never over the user's."""
    from slurm_ddp.config import dump_config
    from slurm_ddp.env import synthetic_slurm_env

    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    slurm = {"tasks_per_node": 2, "gpus_per_node": 2} if gpu_job else {"tasks_per_node": 2}
    (rd / "config.yaml").write_text(dump_config(make_config({"slurm": slurm})))
    names = ["TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_", "KMP_", "NCCL_", "TORCH"))}
    env.update(synthetic_slurm_env(rank=1, nodes=1, tasks_per_node=2))
    env.update(
        {"CUDA_VISIBLE_DEVICES": "0,1", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "ib0", "NCCL_IB_HCA": "mlx5"}
    )
    show = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {names!r}}}))"
    cmd = [sys.executable, "-m", "slurm_ddp.launch", "--run-dir", str(rd), "--", sys.executable, "-c", show]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    # the user's NCCL_DEBUG and pass-through variables are kept as set, on either kind of job
    assert (got["NCCL_DEBUG"], got["NCCL_SOCKET_IFNAME"], got["NCCL_IB_HCA"]) == ("INFO", "ib0", "mlx5")
    assert got["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == ("1" if gpu_job else None)
