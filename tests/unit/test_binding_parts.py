"""The two halves of ``plan_binding``, each on its own: ``choose_cpus`` (which CPUs a rank gets,
and why) and ``plan_environment`` (OMP_*/KMP_*, LD_PRELOAD, the numactl prefix). Pure."""

from __future__ import annotations

import pytest

from slurm_ddp.binding import (
    BindingError,
    CpuChoice,
    EnvironmentPlan,
    choose_cpus,
    plan_binding,
    plan_environment,
)

TWO_NODES = {0: range(4), 1: range(4, 8)}  # 2 NUMA nodes x 4 CPUs
IOMP = "/opt/lib/libiomp5.so"
JEMALLOC = "/usr/lib/libjemalloc.so.2"


# --------------------------------------------------------------------------- choose_cpus


@pytest.mark.parametrize("slot, cpus, node", [(0, (0, 1), 0), (1, (4, 5), 1)])
def test_choose_cpus_spreads_slots_over_numa_nodes(slot, cpus, node):
    c = choose_cpus(slot=slot, slots=2, cpus_per_task=2, allowed=range(8), numa=TWO_NODES)
    assert isinstance(c, CpuChoice)
    assert (c.cpus, c.numa_nodes, c.numa_cpus) == (cpus, (node,), tuple(TWO_NODES[node]))
    assert "spread over the nodes" in c.source and c.notes == ()


@pytest.mark.parametrize("slot, cpus", [(0, (0, 1)), (1, (2, 3)), (3, (6, 7))])
def test_choose_cpus_blocks_when_exactly_enough(slot, cpus):
    c = choose_cpus(slot=slot, slots=4, cpus_per_task=2, allowed=range(8))
    assert c.cpus == cpus and c.numa_nodes == (0,) and "(block)" in c.source


def test_choose_cpus_keeps_slurms_binding_and_reads_a_mask_list():
    kept = choose_cpus(slot=1, slots=2, cpus_per_task=2, allowed={6, 7}, slurm_cpu_bind="quiet,cores")
    assert kept.cpus == (6, 7) and kept.source.startswith("kept: Slurm already bound")
    mask = choose_cpus(slot=1, slots=2, cpus_per_task=1, allowed=range(4), slurm_cpu_bind="map_cpu:3,2")
    assert mask.cpus == (2,) and "entry 1 of the task list" in mask.source


def test_choose_cpus_follows_the_gpus_numa_node_or_says_why_not():
    c = choose_cpus(slot=0, slots=2, cpus_per_task=1, allowed=range(8), numa=TWO_NODES, gpu_numa_nodes=[1, 0])
    assert c.numa_nodes == (1,) and set(c.cpus) <= set(TWO_NODES[1]) and "of this task's GPU" in c.source
    unknown = choose_cpus(slot=0, slots=2, cpus_per_task=1, allowed=range(8), numa=TWO_NODES, gpu_numa_nodes=[-1, -1])
    assert any("GPU NUMA nodes unknown" in n for n in unknown.notes)


def test_choose_cpus_oversubscribed_and_refusals():
    c = choose_cpus(slot=3, slots=4, cpus_per_task=1, allowed={5, 9}, shared_pool=True)
    assert c.cpus == (9,) and any("oversubscribed" in n for n in c.notes)
    with pytest.raises(BindingError, match="no CPU"):
        choose_cpus(slot=0, slots=1, cpus_per_task=1, allowed=())
    with pytest.raises(ValueError, match="slot 2 is outside"):
        choose_cpus(slot=2, slots=2, cpus_per_task=1, allowed=range(4))


# --------------------------------------------------------------------------- plan_environment


def test_plan_environment_gnu_cores():
    p = plan_environment(cpus=(4, 5, 6), numa_nodes=(1,), cpu_bind="cores")
    assert isinstance(p, EnvironmentPlan)
    assert dict(p.env) == {
        "OMP_NUM_THREADS": "3",
        "OMP_SCHEDULE": "STATIC",
        "OMP_PROC_BIND": "close",
        "OMP_PLACES": "{4}:3",
    }
    assert (dict(p.kept), p.preload, p.prefix, p.notes) == ({}, (), (), ())


def test_plan_environment_intel_jemalloc_keeps_the_users_values_first():
    environ = {"OMP_NUM_THREADS": "7", "LD_PRELOAD": "/mine.so"}
    p = plan_environment(
        cpus=(0, 2),
        numa_nodes=(0,),
        cpu_bind="cores",
        openmp="intel",
        allocator="jemalloc",
        environ=environ,
        libraries={"iomp5": IOMP, "jemalloc": JEMALLOC},
    )
    assert dict(p.kept) == {"OMP_NUM_THREADS": "7"}
    assert p.env["KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[0,2]" and p.env["KMP_BLOCKTIME"] == "1"
    assert p.env["LD_PRELOAD"] == f"/mine.so:{IOMP}:{JEMALLOC}" and p.preload == (IOMP, JEMALLOC)
    over = plan_environment(
        cpus=(0, 2),
        numa_nodes=(0,),
        cpu_bind="cores",
        openmp="intel",
        override_env=True,
        environ=environ,
        libraries={"iomp5": IOMP},
    )
    assert over.env["OMP_NUM_THREADS"] == "2" and over.env["LD_PRELOAD"] == f"{IOMP}:/mine.so"


def test_plan_environment_unpinned_threads_and_numactl():
    p = plan_environment(cpus=(4, 5), numa_nodes=(1,), cpu_bind="numa", numactl="/usr/bin/numactl", pin_threads=False)
    assert p.env["OMP_PROC_BIND"] == "false" and "OMP_PLACES" not in p.env
    assert p.prefix == ("/usr/bin/numactl", "--cpunodebind=1", "--membind=1")
    assert len(p.notes) == 1 and "not pinned" in p.notes[0]
    assert dict(plan_environment(cpus=(0,), numa_nodes=(0,)).env) == {"OMP_NUM_THREADS": "1"}  # cpu_bind none


@pytest.mark.parametrize(
    "kw, needle",
    [({"cpu_bind": "numa"}, "numactl"), ({"allocator": "tcmalloc"}, "tcmalloc"), ({"openmp": "intel"}, "iomp5")],
)
def test_plan_environment_names_what_is_missing(kw, needle):
    with pytest.raises(BindingError, match=needle):
        plan_environment(cpus=(0,), numa_nodes=(0,), **kw)


# --------------------------------------------------------------------------- together


def test_plan_binding_is_the_two_halves_put_together():
    kw = {"slot": 1, "slots": 2, "cpus_per_task": 2, "allowed": range(8), "numa": TWO_NODES}
    c = choose_cpus(**kw)
    e = plan_environment(
        cpus=c.cpus, numa_nodes=c.numa_nodes, cpu_bind="numa", numactl="/bin/numactl", pin_threads=False
    )
    p = plan_binding(cpu_bind="numa", numactl="/bin/numactl", pin_threads=False, **kw)
    assert (p.cpus, p.numa_nodes, p.source, p.affinity, p.threads) == (
        c.cpus,
        c.numa_nodes,
        c.source,
        c.numa_cpus,
        len(c.cpus),
    )
    assert (dict(p.env), p.prefix, p.notes) == (dict(e.env), e.prefix, c.notes + e.notes)
