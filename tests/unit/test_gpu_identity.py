"""Which physical GPU a rank has (``slurm_ddp.devices.physical_gpus`` and the readers around it), with the
variable sets Slurm 22.05 gave on the sandbox's production profile (cgroup v1 ``ConstrainDevices=yes``) and on
the basic one (SLURM-FACTS.md "A production profile", "Emulated GPUs"), a fake slurm.conf/cgroup.conf, a fake
``/proc/driver/nvidia`` and ``/sys/bus/pci/devices``, and torch's device properties faked at the function
boundary (no GPU here).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Dict, Optional

import pytest

from slurm_ddp.binding import read_gpu_numa_by_index
from slurm_ddp.devices import (
    cuda_pci_address,
    identify_cuda_device,
    physical_gpus,
    read_devices_constrained,
    select_device,
    slot_gpus,
)


def task(node: str, local: int, cvd: str, step: str, job: Optional[str], bind: Optional[str], **extra: str):
    """One task's GPU variables as srun gave them: 2 nodes n1 (batch host) and n2, 2 tasks a node."""
    env: Dict[str, str] = {
        "SLURMD_NODENAME": node,
        "SLURM_JOB_NODELIST": "n[1-2]",
        "SLURM_LOCALID": str(local),
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_NODEID": str(int(node[1:]) - 1),
        "CUDA_VISIBLE_DEVICES": cvd,
        "GPU_DEVICE_ORDINAL": cvd,
        "SLURM_STEP_GPUS": step,
        "SLURM_GPUS_ON_NODE": "2",
        **extra,
    }
    if job is not None:  # set in the batch script (n1's list), inherited by every task
        env["SLURM_JOB_GPUS"] = job
    if bind is not None:
        env["SLURMD_TRES_BIND"] = bind
    return env


# (case) -> (environment, constrained, node_gpu_count, physical GPU: None = unknown)
CASES = {
    # --gpus-per-task=1, ConstrainDevices: every task reads 0; n1 (batch host) knows from SLURM_JOB_GPUS
    "constrained per_task, n1 task 0": (task("n1", 0, "0", "0", "0,1", "gpu:per_task:1"), True, None, "0"),
    "constrained per_task, n1 task 1 (owns nvidia1)": (
        task("n1", 1, "0", "0", "0,1", "gpu:per_task:1"),
        True,
        None,
        "1",
    ),
    "constrained per_task as Slurm 24.11/26.05 write it (gres/gpu:), n1 task 1": (
        task("n1", 1, "0", "0", "0,1", "gres/gpu:per_task:1"),
        True,
        None,
        "1",
    ),
    "constrained per_task, n2 task 1: SLURM_JOB_GPUS is n1's": (
        task("n2", 1, "0", "0", "0,1", "gpu:per_task:1"),
        True,
        None,
        None,
    ),
    "constrained per_task, n2 task 1, the node's 2 GPUs all the job's": (
        task("n2", 1, "0", "0", "0,1", "gpu:per_task:1"),
        True,
        2,
        "1",
    ),
    "constrained per_task, n2, the node has 4 GPUs, job 2: unknown": (
        task("n2", 1, "0", "0", "0,1", "gpu:per_task:1"),
        True,
        4,
        None,
    ),
    "constrained single:1: topology decides, unknown": (task("n1", 1, "0", "0", "0,1", "gpu:single:1"), True, 2, None),
    "constrained map_gpu:1,0: task 0 has node GPU 1": (task("n1", 0, "0", "0", "0,1", "gpu:map_gpu:1,0"), True, 2, "1"),
    # no task binding: SLURM_STEP_GPUS keeps node indices under ConstrainDevices (seen: cvd=0 step=1 on n2)
    "constrained, no task binding, n2 got GPU 1": (
        task("n2", 0, "0", "1", "0", None, SLURM_GPUS_ON_NODE="1", SLURM_TASKS_PER_NODE="1(x2)"),
        True,
        None,
        "1",
    ),
    "constrained, gpus_per_node=2, both visible": (task("n1", 1, "0,1", "0,1", "0,1", None), True, None, "0,1"),
    # not constrained (the basic sandbox): SLURM_STEP_GPUS holds node indices
    "not constrained per_task, n2 task 0": (task("n2", 0, "0", "0", "0,1", "gpu:per_task:1"), False, None, "0"),
    "not constrained per_task, n2 task 1": (task("n2", 1, "1", "1", "0,1", "gpu:per_task:1"), False, None, "1"),
    # configuration unknown: take an answer only when both readings agree
    "unknown config, a list that is not 0..k-1 is node indices": (
        task("n2", 1, "1", "1", "0,1", "gpu:per_task:1"),
        None,
        None,
        "1",
    ),
    "unknown config, n1 task 0: both readings give 0": (
        task("n1", 0, "0", "0", "0,1", "gpu:per_task:1"),
        None,
        None,
        "0",
    ),
    "unknown config, n1 task 1 reads 0: renumbered or not, unknown": (
        task("n1", 1, "0", "0", "0,1", "gpu:per_task:1"),
        None,
        None,
        None,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_physical_gpu_from_the_variables(case: str) -> None:
    env, constrained, count, want = CASES[case]
    choice = select_device(env, constrained=constrained, node_gpu_count=count)
    names, why = physical_gpus(env, choice.visible, constrained=constrained, node_gpu_count=count)
    assert (",".join(names) if names is not None else None) == want, why
    if "," not in (want or ""):
        assert choice.physical == want and why == choice.physical_source
    assert ("unknown" in choice.describe()) == (choice.physical is None), choice.describe()
    assert choice.physical_source in choice.describe()


def test_slot_gpus_feed_the_numa_choice_only_with_what_is_certain() -> None:
    n1 = task("n1", 1, "0", "0", "0,1", "gpu:per_task:1")
    assert slot_gpus(n1, constrained=True) == ["0", "1"]
    assert slot_gpus(task("n2", 1, "0", "0", "0,1", "gpu:per_task:1"), constrained=True) == [None, None]
    assert slot_gpus(task("n2", 1, "0", "0", "0,1", "gpu:per_task:1"), constrained=True, node_gpu_count=2) == [
        "0",
        "1",
    ]
    assert slot_gpus(task("n1", 1, "0", "0", "0,1", "gpu:single:1"), constrained=True) == [None, None]
    assert slot_gpus(task("n1", 1, "0", "0", "0,1", "gpu:map_gpu:1,0"), constrained=True) == ["1", "0"]
    # what the old rule said for rank 1 on n1 (its own GPU "0") is never said
    assert slot_gpus(n1, constrained=None) == [None, None]


def conf(tmp: Path, slurm: str, cgroup: Optional[str]) -> Dict[str, str]:
    (tmp / "slurm.conf").write_text(slurm)
    if cgroup is not None:
        (tmp / "cgroup.conf").write_text(cgroup)
    return {"SLURM_CONF": str(tmp / "slurm.conf")}


@pytest.mark.parametrize(
    "slurm, cgroup, want",
    [
        ("TaskPlugin=task/cgroup,task/affinity\n", "CgroupPlugin=cgroup/v1\nConstrainDevices=yes  # GPUs\n", True),
        ("taskplugin=task/affinity,task/cgroup\n", "constraindevices=Yes\n", True),
        ("TaskPlugin=task/cgroup\n", "ConstrainCores=yes\n", False),
        ("TaskPlugin=task/cgroup\n", None, False),
        ("TaskPlugin=task/none\n", "ConstrainDevices=yes\n", False),
        ("ClusterName=c\n", "ConstrainDevices=yes\n", False),  # TaskPlugin's default: task/none
        ("ClusterName=c\nInclude /etc/slurm/nodes.conf\n", "ConstrainDevices=yes\n", None),
    ],
)
def test_read_devices_constrained(tmp_path: Path, slurm: str, cgroup: Optional[str], want: Optional[bool]) -> None:
    assert read_devices_constrained(conf(tmp_path, slurm, cgroup)) is want


def test_read_devices_constrained_unreadable_is_unknown(tmp_path: Path) -> None:
    assert read_devices_constrained({"SLURM_CONF": str(tmp_path / "missing.conf")}) is None


def fake_machine(tmp: Path) -> tuple[str, str]:
    """Two NVIDIA GPUs and a NIC in /sys/bus/pci/devices; the driver numbers them against bus order."""
    sysfs, driver = tmp / "pci", tmp / "nvidia"
    for addr, cls, vendor, numa in [
        ("0000:3b:00.0", "0x030200", "0x10de", "0"),
        ("0000:5e:00.0", "0x020000", "0x8086", "0"),
        ("0000:d8:00.0", "0x030200", "0x10de", "1"),
    ]:
        d = sysfs / addr
        d.mkdir(parents=True)
        (d / "class").write_text(cls + "\n")
        (d / "vendor").write_text(vendor + "\n")
        (d / "numa_node").write_text(numa + "\n")
    for addr, minor in [("0000:3b:00.0", 1), ("0000:d8:00.0", 0)]:
        (driver / addr).mkdir(parents=True)
        (driver / addr / "information").write_text(
            f"Model: \t\t NVIDIA H100\nIRQ:   \t\t 42\nDevice Minor: \t {minor}\n"
        )
    return str(sysfs), str(driver)


def test_gpu_numa_by_index_follows_the_driver_minor(tmp_path: Path) -> None:
    sysfs, driver = fake_machine(tmp_path)
    assert read_gpu_numa_by_index(sysfs, driver) == {1: 0, 0: 1}
    assert read_gpu_numa_by_index(sysfs, str(tmp_path / "no-driver")) == {0: 0, 1: 1}  # bus order


def test_the_cuda_device_names_its_physical_gpu(tmp_path: Path) -> None:
    sysfs, driver = fake_machine(tmp_path)
    env = task("n2", 1, "0", "0", "0,1", "gpu:per_task:1")
    choice = select_device(env, constrained=True)
    assert choice.physical is None
    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0xD8, pci_device_id=0)  # torch.cuda.get_device_properties
    assert cuda_pci_address(props) == "0000:d8:00.0"
    seen = identify_cuda_device(choice, props, driver_root=driver, sysfs_root=sysfs)
    assert (seen.physical, seen.pci_address, seen.numa_node) == ("0", "0000:d8:00.0", 1)
    assert "physical GPU 0 (PCI 0000:d8:00.0, NUMA node 1) [the device: /dev/nvidia0]" in seen.describe()
    # the variables' answer differs from the device's: the device wins and the log says so
    wrong = select_device(task("n1", 1, "0", "0", "0,1", "gpu:per_task:1"), constrained=True)
    assert "the variables said 1" in identify_cuda_device(wrong, props, driver_root=driver, sysfs_root=sysfs).describe()
    # no NVIDIA driver file (AMD, or a container without /proc/driver): PCI address and NUMA node only
    amd = identify_cuda_device(choice, props, driver_root=str(tmp_path / "none"), sysfs_root=sysfs)
    assert (amd.physical, amd.numa_node) == (None, 1) and "unknown (PCI 0000:d8:00.0, NUMA node 1)" in amd.describe()
    # an older torch without PCI fields: unchanged
    assert identify_cuda_device(choice, SimpleNamespace(name="x"), driver_root=driver, sysfs_root=sysfs) == choice


def _cfg(**slurm):
    from slurm_ddp.config import config_from_dict

    return config_from_dict({"name": "g", "train": {"task": "m:T"}, "slurm": {"time": "10", **slurm}})


def test_explain_job_predicts_both_numberings() -> None:
    from slurm_ddp.explain import explain_job

    text = explain_job(_cfg(gpus_per_task=1, tasks_per_node=2, nodes=2), environ={})
    lines = [line for line in text.splitlines() if line.startswith("  gpu")]
    assert (
        lines[2]
        == "  gpu: cuda:0 = physical GPU 1 (NUMA node 0); CUDA_VISIBLE_DEVICES=1; rule: one GPU visible: cuda:0"
    )
    assert lines[3].startswith(
        "  gpu under ConstrainDevices: CUDA_VISIBLE_DEVICES=0 SLURM_STEP_GPUS=0 -> physical GPU 1 "
    )
    # node 1: not the batch host; the job holds both of its GPUs (assumed), so per_task still names them
    assert lines[7].startswith(
        "  gpu under ConstrainDevices: CUDA_VISIBLE_DEVICES=0 SLURM_STEP_GPUS=0 -> physical GPU 1 "
    )
    text = explain_job(_cfg(gpus_per_node=2, gpu_bind="single:1"), environ={})
    constrained = [line for line in text.splitlines() if line.startswith("  gpu under")]
    assert len(constrained) == 2 and all("-> physical GPU unknown (" in line for line in constrained), constrained


def test_explain_task_says_unknown_rather_than_wrong(tmp_path: Path) -> None:
    from slurm_ddp.binding import plan_for_task
    from slurm_ddp.explain import explain_task

    cfg = _cfg(gpus_per_task=1, tasks_per_node=2, nodes=2)
    env = {
        **task("n2", 1, "0", "0", "0,1", "gpu:per_task:1"),
        **conf(tmp_path, "TaskPlugin=task/cgroup\n", "ConstrainDevices=yes\n"),
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_ID": "7",
    }
    text = explain_task(cfg, env, plan_for_task(cfg, env, allowed=range(2)))
    assert "gpu: cuda:0 = physical GPU unknown; CUDA_VISIBLE_DEVICES=0; rule: one GPU visible: cuda:0; " in text
    assert (
        "physical GPU unknown: SLURM_STEP_GPUS=0 under --gpu-bind=per_task:1 is renumbered by ConstrainDevices" in text
    )
    env.update(SLURMD_NODENAME="n1")  # the batch host: SLURM_JOB_GPUS is this node's
    text = explain_task(cfg, env, plan_for_task(cfg, env, allowed=range(2)))
    assert "gpu: cuda:0 = physical GPU 1; CUDA_VISIBLE_DEVICES=0" in text
