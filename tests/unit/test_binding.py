"""Binding plans (pure): tables of allocations, OpenMP/KMP variables, user-set values,
LD_PRELOAD, numactl, library lookup errors, the /sys readers on fake trees, the rank
wrapper's argument handling, and ``slurm-ddp env`` (``--explain`` and inside a task)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from slurm_ddp import binding
from slurm_ddp.binding import (
    BindingError,
    format_cpulist,
    locate_library,
    omp_places,
    parse_cpulist,
    parse_slurm_cpu_bind,
    plan_binding,
    plan_for_task,
)
from slurm_ddp.env import DistEnv, synthetic_slurm_env

JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
LIBS = {"jemalloc": JEMALLOC, "tcmalloc": "/usr/lib/libtcmalloc_minimal.so.4", "iomp5": "/opt/venv/lib/libiomp5.so"}


def cpus(text: str) -> tuple:
    return tuple(sorted(parse_cpulist(text)))


def plan(slot, slots, cpt, allowed, **kw):
    if isinstance(allowed, str):
        allowed = parse_cpulist(allowed)
    kw.setdefault("cpu_bind", "cores")
    return plan_binding(slot=slot, slots=slots, cpus_per_task=cpt, allowed=allowed, **kw)


# --------------------------------------------------------------------------- cpu lists


@pytest.mark.parametrize(
    "text,expected",
    [
        ("0-3", {0, 1, 2, 3}),
        ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}),
        ("5", {5}),
        ("0-6:2", {0, 2, 4, 6}),
        ("0-1,\n", {0, 1}),
        ("", set()),
    ],
)
def test_parse_cpulist(text, expected):
    assert parse_cpulist(text) == expected


@pytest.mark.parametrize("bad", ["a", "3-1", "1-", "0-4:0"])
def test_parse_cpulist_rejects(bad):
    with pytest.raises(ValueError):
        parse_cpulist(bad)


def test_format_cpulist_and_places():
    assert format_cpulist([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11"
    assert format_cpulist([]) == ""
    assert omp_places([0, 1, 2, 3, 8]) == "{0}:4,{8}"
    assert omp_places([4, 0]) == "{4},{0}"


@pytest.mark.parametrize(
    "value,kind,sets",
    [
        ("", "none", ()),
        ("none", "none", ()),
        ("quiet,none", "none", ()),
        ("quiet,cores", "cores", ()),
        ("quiet,mask_cpu:0x3,0xC", "mask_cpu", ({0, 1}, {2, 3})),
        ("verbose,mask_cpu:F0", "mask_cpu", ({4, 5, 6, 7},)),
        ("map_cpu:0,4", "map_cpu", ({0}, {4})),
        ("quiet,map_cpu:0*2,5", "map_cpu", ({0}, {0}, {5})),
    ],
)
def test_parse_slurm_cpu_bind(value, kind, sets):
    got_kind, got_sets = parse_slurm_cpu_bind(value)
    assert got_kind == kind
    assert [set(s) for s in got_sets] == [set(s) for s in sets]


# --------------------------------------------------------------------------- CPU sets: allocation tables

TWO_SOCKETS_32 = {0: parse_cpulist("0-15"), 1: parse_cpulist("16-31")}


@pytest.mark.parametrize("slot,expected,node", [(0, "0-7", 0), (1, "8-15", 0), (2, "16-23", 1), (3, "24-31", 1)])
def test_one_node_four_tasks_eight_cpus(slot, expected, node):
    p = plan(slot, 4, 8, "0-31", numa=TWO_SOCKETS_32)
    assert p.cpus == cpus(expected)
    assert p.affinity == cpus(expected)
    assert p.numa_nodes == (node,)
    assert p.threads == 8
    assert p.env["OMP_NUM_THREADS"] == "8"  # the task's CPUs, not the node's 32
    assert p.env["OMP_PROC_BIND"] == "close"
    assert p.env["OMP_PLACES"] == omp_places(cpus(expected))
    assert p.env["OMP_SCHEDULE"] == "STATIC"
    assert p.prefix == () and p.notes == ()


@pytest.mark.parametrize("slot,expected", [(0, "0"), (1, "1"), (2, "2"), (3, "3")])
def test_cpus_per_task_one(slot, expected):
    p = plan(slot, 4, 1, "0-3")
    assert p.cpus == cpus(expected)
    assert p.env["OMP_NUM_THREADS"] == "1"
    assert p.env["OMP_PLACES"] == f"{{{expected}}}"


@pytest.mark.parametrize(
    "slots,cpt,allowed,expected,note",
    [
        # fewer CPUs than asked: blocks differing by at most one CPU
        (3, 4, "0-7", ["0-1", "2-4", "5-7"], "8 CPUs for 3 tasks"),
        # more CPUs than asked (one NUMA node): packed blocks of cpus_per_task
        (3, 2, "0-7", ["0-1", "2-3", "4-5"], None),
        # 2 tasks on 3 CPUs, 1 CPU each asked
        (2, 1, "0-2", ["0", "1"], None),
        # fewer CPUs than tasks: one CPU each, reused
        (4, 1, "0-1", ["0", "1", "0", "1"], "oversubscribed"),
    ],
)
def test_uneven_counts(slots, cpt, allowed, expected, note):
    for slot in range(slots):
        p = plan(slot, slots, cpt, allowed)
        assert p.cpus == cpus(expected[slot]), slot
        assert p.threads == len(p.cpus)
        if note:
            assert any(note in n for n in p.notes), p.notes
        else:
            assert p.notes == ()


def test_non_contiguous_cpuset():
    allowed = "0-1,4-5,8-9,12-13"  # e.g. a cgroup cpuset of every other core pair
    p0, p1 = plan(0, 2, 4, allowed), plan(1, 2, 4, allowed)
    assert p0.cpus == cpus("0-1,4-5") and p1.cpus == cpus("8-9,12-13")
    assert p0.env["OMP_PLACES"] == "{0}:2,{4}:2"
    assert format_cpulist(p1.affinity) == "8-9,12-13"


def test_affinity_already_the_tasks_share_is_kept():
    # task/affinity bound this task to 8-15 (its share): keep it, do not split it 4 ways.
    p = plan(1, 4, 8, "8-15", numa=TWO_SOCKETS_32)
    assert p.cpus == cpus("8-15")
    assert "kept" in p.source
    assert p.env["OMP_NUM_THREADS"] == "8"


def test_slurm_cpu_bind_type_means_bound():
    p = plan(0, 2, 2, "4-5,36-37", slurm_cpu_bind="quiet,cores")
    assert p.cpus == cpus("4-5,36-37") and "cores" in p.source


def test_slurm_cpu_bind_mask_list():
    p = plan(1, 2, 2, "0-3", slurm_cpu_bind="quiet,mask_cpu:0x3,0xC")
    assert p.cpus == (2, 3) and "mask_cpu" in p.source
    # the list is reused cyclically, as srun does
    assert plan(2, 3, 1, "0-3", slurm_cpu_bind="map_cpu:3,1").cpus == (3,)


def test_local_backend_pool_is_never_taken_as_a_share():
    # The local backend: all ranks share the machine's 2 CPUs even with cpus_per_task=2.
    a = plan(0, 2, 2, "0-1", shared_pool=True)
    b = plan(1, 2, 2, "0-1", shared_pool=True)
    assert (a.cpus, b.cpus) == ((0,), (1,))


def test_slack_spreads_over_numa_nodes():
    p0, p1 = plan(0, 2, 4, "0-31", numa=TWO_SOCKETS_32), plan(1, 2, 4, "0-31", numa=TWO_SOCKETS_32)
    assert p0.cpus == cpus("0-3") and p1.cpus == cpus("16-19")
    assert (p0.numa_nodes, p1.numa_nodes) == ((0,), (1,))


def test_hyperthread_siblings_stay_together():
    # CPUs 0/2 and 1/3 are sibling pairs (Intel numbering): a 2-CPU task gets one whole core.
    core = {0: 0, 1: 1, 2: 0, 3: 1}
    assert plan(0, 2, 2, "0-3", core_ids=core).cpus == (0, 2)
    assert plan(1, 2, 2, "0-3", core_ids=core).cpus == (1, 3)


def test_gpu_numa_node_chooses_the_cpus():
    numa = {0: parse_cpulist("0-7"), 1: parse_cpulist("8-15")}
    gpus = [1, 1, 0, 0]  # GPUs 0-1 hang off socket 1
    got = [plan(s, 4, 4, "0-15", numa=numa, gpu_numa_nodes=gpus) for s in range(4)]
    assert [p.cpus for p in got] == [cpus("8-11"), cpus("12-15"), cpus("0-3"), cpus("4-7")]
    assert [p.numa_nodes for p in got] == [(1,), (1,), (0,), (0,)]
    unknown = plan(0, 4, 4, "0-15", numa=numa, gpu_numa_nodes=[-1, -1, -1, -1])
    assert unknown.cpus == cpus("0-3") and any("GPU NUMA nodes unknown" in n for n in unknown.notes)


def test_no_cpu_allowed_is_an_error():
    with pytest.raises(BindingError, match="no CPU"):
        plan(0, 1, 1, set())
    with pytest.raises(ValueError):
        plan(2, 2, 1, "0-1")


# --------------------------------------------------------------------------- two nodes, through the task variables


def test_two_nodes_plan_for_task(make_config):
    cfg = make_config(
        {"slurm": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 4}, "environment": {"cpu_bind": "cores"}}
    )
    got = {}
    for rank in range(4):
        env = synthetic_slurm_env(rank=rank, nodes=2, tasks_per_node=2, cpus_per_task=4)
        got[rank] = plan_for_task(cfg, env, allowed=range(8)).cpus
    # each node has its own CPUs 0-7: local rank k gets the same block on both nodes
    assert got == {0: cpus("0-3"), 1: cpus("4-7"), 2: cpus("0-3"), 3: cpus("4-7")}


def test_local_backend_divides_the_machine_among_all_ranks(make_config):
    cfg = make_config(
        {"slurm": {"nodes": 2, "tasks_per_node": 1, "cpus_per_task": 1}, "environment": {"cpu_bind": "cores"}}
    )
    out = []
    for rank in range(2):
        env = synthetic_slurm_env(rank=rank, nodes=2, tasks_per_node=1, cpus_per_task=1)
        env["SLURM_DDP_BACKEND"] = "local"
        env["SLURM_CPU_BIND"] = "quiet,cores"  # ignored: nothing bound the local ranks
        out.append(plan_for_task(cfg, env, allowed={0, 1}).cpus)
    assert out == [(0,), (1,)]  # both are local rank 0 of their "node", yet they do not share a CPU


def test_cpus_per_task_from_slurm_wins_over_config(make_config):
    cfg = make_config({"slurm": {"tasks_per_node": 2, "cpus_per_task": 1}})
    env = synthetic_slurm_env(rank=1, nodes=1, tasks_per_node=2, cpus_per_task=3)
    assert plan_for_task(cfg, env, allowed=range(8)).cpus == cpus("3-5")


# --------------------------------------------------------------------------- variables, user values, modes


def test_none_mode_sets_only_thread_count():
    p = plan(1, 2, 4, "0-7", cpu_bind="none")
    assert dict(p.env) == {"OMP_NUM_THREADS": "4"}
    assert p.affinity is None and p.prefix == ()
    assert p.cpus == cpus("4-7")  # still planned (and shown by `env --explain`)


def test_user_set_variables_are_kept_unless_override():
    environ = {"OMP_NUM_THREADS": "3", "OMP_PROC_BIND": "spread"}
    p = plan(0, 2, 4, "0-7", environ=environ)
    assert "OMP_NUM_THREADS" not in p.env and "OMP_PROC_BIND" not in p.env
    assert dict(p.kept) == environ
    assert p.environ(environ)["OMP_NUM_THREADS"] == "3"
    assert p.env["OMP_PLACES"] == "{0}:4"  # what the user did not set is still set
    o = plan(0, 2, 4, "0-7", environ=environ, override_env=True)
    assert o.env["OMP_NUM_THREADS"] == "4" and o.env["OMP_PROC_BIND"] == "close" and not o.kept


def test_allocator_preload_and_merge_with_user_ld_preload():
    p = plan(0, 1, 1, "0", allocator="jemalloc", libraries=LIBS)
    assert p.env["LD_PRELOAD"] == JEMALLOC and p.preload == (JEMALLOC,)
    user = {"LD_PRELOAD": "/opt/libfoo.so /opt/libbar.so"}
    p = plan(0, 1, 1, "0", allocator="jemalloc", libraries=LIBS, environ=user)
    assert p.env["LD_PRELOAD"] == f"/opt/libfoo.so:/opt/libbar.so:{JEMALLOC}"  # user's first
    p = plan(0, 1, 1, "0", allocator="jemalloc", libraries=LIBS, environ=user, override_env=True)
    assert p.env["LD_PRELOAD"] == f"{JEMALLOC}:/opt/libfoo.so:/opt/libbar.so"
    p = plan(0, 1, 1, "0", allocator="jemalloc", libraries=LIBS, environ={"LD_PRELOAD": JEMALLOC})
    assert p.env["LD_PRELOAD"] == JEMALLOC  # not twice
    p = plan(0, 1, 1, "0", allocator="tcmalloc", libraries=LIBS)
    assert p.env["LD_PRELOAD"] == LIBS["tcmalloc"]


def test_intel_openmp():
    p = plan(1, 2, 2, "0-3", openmp="intel", allocator="jemalloc", libraries=LIBS)
    assert p.env["KMP_AFFINITY"] == "granularity=fine,explicit,proclist=[2,3]"
    assert p.env["KMP_BLOCKTIME"] == "1"
    assert "OMP_PROC_BIND" not in p.env and "OMP_PLACES" not in p.env  # KMP_AFFINITY binds
    assert p.env["LD_PRELOAD"] == f"{LIBS['iomp5']}:{JEMALLOC}"
    n = plan(1, 2, 2, "0-3", cpu_bind="none", openmp="intel", libraries=LIBS)
    assert dict(n.env) == {"OMP_NUM_THREADS": "2", "KMP_BLOCKTIME": "1", "LD_PRELOAD": LIBS["iomp5"]}


@pytest.mark.parametrize(
    "kw,needle",
    [
        ({"allocator": "jemalloc"}, "libjemalloc2"),
        ({"allocator": "tcmalloc"}, "libtcmalloc-minimal4"),
        ({"openmp": "intel"}, "intel-openmp"),
    ],
)
def test_missing_library_in_plan_names_the_package(kw, needle):
    with pytest.raises(BindingError, match=needle):
        plan(0, 1, 1, "0", libraries={}, **kw)


def test_numa_mode():
    numa = {0: parse_cpulist("0-7"), 1: parse_cpulist("8-15")}
    p = plan(2, 4, 4, "0-15", cpu_bind="numa", numa=numa, numactl="/usr/bin/numactl")
    assert p.cpus == cpus("8-11") and p.numa_nodes == (1,)
    assert p.affinity == cpus("8-15")  # the whole node; the OpenMP threads go on the task's own CPUs
    assert p.env["OMP_PLACES"] == "{8}:4" and p.env["OMP_NUM_THREADS"] == "4"
    assert p.prefix == ("/usr/bin/numactl", "--cpunodebind=1", "--membind=1")
    assert p.command(["python", "x.py"]) == ["/usr/bin/numactl", "--cpunodebind=1", "--membind=1", "python", "x.py"]
    # a task straddling two nodes binds to both
    s = plan(1, 3, 5, "0-15", cpu_bind="numa", numa=numa, numactl="numactl")
    assert s.cpus == cpus("5-9") and s.prefix[1:] == ("--cpunodebind=0,1", "--membind=0,1")


def test_unpinned_threads_when_dataloader_workers_are_used(make_config):
    p = plan(1, 2, 2, "0-3", pin_threads=False)
    assert p.env["OMP_PROC_BIND"] == "false" and "OMP_PLACES" not in p.env
    assert p.affinity == (2, 3) and any("not pinned" in n for n in p.notes)
    i = plan(1, 2, 2, "0-3", pin_threads=False, openmp="intel", libraries=LIBS)
    assert i.env["KMP_AFFINITY"] == "disabled"
    cfg = make_config(
        {
            "slurm": {"tasks_per_node": 2, "cpus_per_task": 2},
            "environment": {"cpu_bind": "cores"},
            "train": {"num_workers": 2},
        }
    )
    env = synthetic_slurm_env(rank=0, nodes=1, tasks_per_node=2, cpus_per_task=2)
    assert plan_for_task(cfg, env, allowed=range(4)).env["OMP_PROC_BIND"] == "false"


def test_numa_mode_without_numactl_names_the_package():
    with pytest.raises(BindingError) as e:
        plan(0, 1, 1, "0", cpu_bind="numa", numactl=None)
    assert "apt-get install numactl" in str(e.value) and "RPM" in str(e.value)


def test_summary_line():
    p = plan(0, 2, 2, "0-3", numa={0: parse_cpulist("0-3")})
    assert p.summary() == "cpus=0-1 numa=0 threads=2 bind=cores"


# --------------------------------------------------------------------------- library lookup


LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibjemalloc.so.2 (libc6) => /usr/lib/i386-linux-gnu/libjemalloc.so.2
\tlibjemalloc.so.2 (libc6,x86-64) => /lib/x86_64-linux-gnu/libjemalloc.so.2
\tlibtcmalloc.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libtcmalloc.so.4
\tlibtcmalloc_minimal.so.4 (libc6,x86-64) => /lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
"""


def test_locate_library_from_ldconfig():
    found = locate_library("jemalloc", ldconfig_text=LDCONFIG, exists=lambda p: True)
    assert found == "/lib/x86_64-linux-gnu/libjemalloc.so.2"  # the 64-bit entry
    assert locate_library("tcmalloc", ldconfig_text=LDCONFIG, exists=lambda p: True).endswith(
        "libtcmalloc_minimal.so.4"
    )  # the minimal library is preferred


def test_locate_library_from_usual_dirs(tmp_path: Path):
    (tmp_path / "libiomp5.so").write_bytes(b"")
    assert locate_library("iomp5", ldconfig_text="", search_dirs=["/nonexistent", str(tmp_path)]) == str(
        tmp_path / "libiomp5.so"
    )


@pytest.mark.parametrize(
    "kind,debian,rpm",
    [
        ("jemalloc", "apt-get install libjemalloc2", "dnf install jemalloc"),
        ("tcmalloc", "apt-get install libtcmalloc-minimal4", "gperftools-libs"),
        ("iomp5", "pip install intel-openmp", "conda install intel-openmp"),
    ],
)
def test_locate_library_missing_names_the_packages(kind, debian, rpm, tmp_path: Path):
    with pytest.raises(BindingError) as e:
        locate_library(kind, ldconfig_text=LDCONFIG.replace("lib", "xx"), search_dirs=[str(tmp_path)])
    msg = str(e.value)
    assert debian in msg and rpm in msg and "\n" not in msg


def test_default_library_dirs():
    dirs = binding.default_library_dirs({"LD_LIBRARY_PATH": "/a:/b", "CONDA_PREFIX": "/c"}, prefix="/venv")
    assert dirs[:4] == ["/a", "/b", "/venv/lib", "/c/lib"]
    assert "/usr/lib64" in dirs


def test_ldconfig_cache_uses_injected_runner():
    class Done:
        stdout = LDCONFIG

    calls = []
    text = binding.ldconfig_cache(run=lambda argv, **kw: calls.append(argv) or Done())
    if calls:  # ldconfig exists here
        assert calls[0][-1] == "-p" and text == LDCONFIG


# --------------------------------------------------------------------------- /sys readers on fake trees


def test_read_numa_nodes(tmp_path: Path):
    for n, lst in ((0, "0-3,8-11\n"), (1, "4-7,12-15\n"), (2, "\n")):  # node 2: memory only
        d = tmp_path / f"node{n}"
        d.mkdir()
        (d / "cpulist").write_text(lst)
    (tmp_path / "possible").write_text("0-2\n")
    assert binding.read_numa_nodes(str(tmp_path)) == {0: parse_cpulist("0-3,8-11"), 1: parse_cpulist("4-7,12-15")}
    assert binding.read_numa_nodes(str(tmp_path / "missing")) == {}


def test_read_core_ids(tmp_path: Path):
    for c, sib in ((0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")):
        d = tmp_path / f"cpu{c}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(sib + "\n")
    assert binding.read_core_ids([0, 1, 2, 3, 9], str(tmp_path)) == {0: 0, 1: 1, 2: 0, 3: 1, 9: 9}


def test_read_gpu_numa_nodes(tmp_path: Path):
    devs = [
        ("0000:17:00.0", "0x030200", "0x10de", "0"),
        ("0000:03:00.0", "0x030000", "0x1a03", "0"),  # BMC VGA
        ("0000:ca:00.0", "0x030200", "0x10de", "1"),
        ("0000:65:00.0", "0x030200", "0x10de", "0"),
        ("0000:b1:00.0", "0x020000", "0x15b3", "1"),
    ]  # a NIC
    for bdf, cls, vendor, node in devs:
        d = tmp_path / bdf
        d.mkdir()
        (d / "class").write_text(cls + "\n")
        (d / "vendor").write_text(vendor + "\n")
        (d / "numa_node").write_text(node + "\n")
    assert binding.read_gpu_numa_nodes({}, str(tmp_path)) == [0, 0, 1]  # bus order: 17, 65, ca
    assert binding.read_gpu_numa_nodes({"CUDA_VISIBLE_DEVICES": "2,0"}, str(tmp_path)) == [1, 0]
    assert binding.read_gpu_numa_nodes({"CUDA_VISIBLE_DEVICES": "GPU-ab,GPU-cd"}, str(tmp_path)) == [-1, -1]


def test_readers_on_this_machine():
    allowed = os.sched_getaffinity(0)
    numa = binding.read_numa_nodes()
    p = plan_binding(
        slot=0, slots=1, cpus_per_task=len(allowed), allowed=allowed, numa=numa, core_ids=binding.read_core_ids(allowed)
    )
    assert set(p.cpus) == allowed


# --------------------------------------------------------------------------- the rank wrapper (no exec)


def test_launch_parse_args():
    from slurm_ddp.errors import UserError
    from slurm_ddp.launch import parse_args

    assert parse_args(["--run-dir", "/r", "--", "python", "-c", "1"]) == ("/r", False, ["python", "-c", "1"])
    assert parse_args(["--run-dir=/r", "--dry-run", "--", "x", "--", "y"]) == ("/r", True, ["x", "--", "y"])
    for bad in (["--run-dir", "/r"], ["--", "x"], ["--run-dir", "/r", "--bogus", "--", "x"], ["--run-dir", "/r", "--"]):
        with pytest.raises(UserError, match="usage|unknown option|no command"):
            parse_args(bad)


def _run_dir(tmp_path: Path, make_config, patch) -> Path:
    from slurm_ddp.config import dump_config

    rd = tmp_path / "run"
    rd.mkdir()
    (rd / "config.yaml").write_text(dump_config(make_config(patch)))
    return rd


def test_launch_dry_run_prints_the_plan(tmp_path, make_config, monkeypatch, capsys):
    from slurm_ddp.launch import main

    rd = _run_dir(
        tmp_path,
        make_config,
        {"slurm": {"tasks_per_node": 2, "cpus_per_task": 1}, "environment": {"cpu_bind": "cores"}},
    )
    for k in [k for k in os.environ if k.startswith(("SLURM_", "OMP_", "KMP_"))]:
        monkeypatch.delenv(k)
    for k, v in synthetic_slurm_env(rank=1, nodes=1, tasks_per_node=2).items():
        monkeypatch.setenv(k, v)
    assert main(["--run-dir", str(rd), "--dry-run", "--", "python", "-c", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    allowed = sorted(os.sched_getaffinity(0))
    expected = [allowed[1 % len(allowed)]] if len(allowed) >= 1 else []
    assert out["threads"] == 1 and out["cpus"] == format_cpulist(expected)
    assert out["env"]["OMP_NUM_THREADS"] == "1" and out["command"] == ["python", "-c", "1"]


def test_launch_errors_are_one_line(tmp_path, make_config, monkeypatch, capsys):
    from slurm_ddp.launch import main

    assert main(["--run-dir", str(tmp_path / "nope"), "--", "true"]) == 2
    assert "does not exist" in capsys.readouterr().err
    rd = _run_dir(tmp_path, make_config, {"environment": {"cpu_bind": "numa"}})
    for k, v in synthetic_slurm_env(rank=0, nodes=1, tasks_per_node=1).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("PATH", str(tmp_path))  # no numactl on this PATH
    assert main(["--run-dir", str(rd), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("slurm_ddp launch: error: ") and "numactl" in err and err.count("\n") == 1


def test_launch_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, slurm_ddp.launch, slurm_ddp.binding, slurm_ddp.explain; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------- slurm-ddp env


def _blocks(text: str) -> dict:
    """``{rank: [lines]}`` from the env text."""
    out, cur = {}, None
    for line in text.splitlines():
        if line.startswith("rank "):
            cur = int(line.split()[1].rstrip(":"))
            out[cur] = [line]
        elif cur is not None and line.startswith("  "):
            out[cur].append(line.strip())
    return out


def test_env_explain_two_nodes_two_tasks_matches_the_plan(write_job, capsys, monkeypatch):
    from slurm_ddp.cli import main
    from slurm_ddp.config import load_config

    for k in [k for k in os.environ if k.startswith(("OMP_", "KMP_")) or k == "LD_PRELOAD"]:
        monkeypatch.delenv(k)
    job = write_job(
        {
            "name": "explained",
            "slurm": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 4, "time": "1:00:00"},
            "environment": {"cpu_bind": "cores", "env": {"OMP_SCHEDULE": "DYNAMIC"}},
            "requeue": {"signal": "USR1", "signal_delay_s": 300, "max_requeues": 5},
        }
    )
    rc = main(["env", str(job), "--explain", "--nodelist", "gpu[07-08]", "--job-id", "4242", "--numa-nodes", "2"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "MASTER_ADDR=gpu07" in out and "15000 + job_id % 15000 = 19242" in out
    assert "SIGUSR1 300 s before the time limit" in out and "at most 5 times" in out
    # USR1 is PyTorch Lightning's auto-requeue signal too (issue 33): the setting that turns it off is named
    assert "SIGUSR1 is also PyTorch Lightning's own auto-requeue signal" in out, out
    assert "SLURMEnvironment(auto_requeue=False)" in out, out
    blocks = _blocks(out)
    assert sorted(blocks) == [0, 1, 2, 3]
    cfg = load_config(job)
    numa = {0: frozenset(range(0, 4)), 1: frozenset(range(4, 8))}
    for rank, lines in blocks.items():
        env = synthetic_slurm_env(
            rank=rank, nodes=2, tasks_per_node=2, job_id="4242", cpus_per_task=4, nodelist="gpu[07-08]"
        )
        env["OMP_SCHEDULE"] = "DYNAMIC"
        denv = DistEnv.from_slurm(env)
        p = plan_for_task(cfg, env, allowed=range(8), numa=numa)
        head = dict(kv.split("=", 1) for kv in lines[0].split()[2:])
        assert head == {
            "local_rank": f"{denv.local_rank}/2",
            "node": str(denv.node_rank),
            "host": ["gpu07", "gpu08"][rank // 2],
            "cpus": format_cpulist(p.cpus),
            "numa": ",".join(map(str, p.numa_nodes)),
            "affinity": format_cpulist(p.affinity),
            "threads": str(p.threads),
        }
        env_line = next(x for x in lines if x.startswith("env: "))
        assert env_line.split()[1:] == [f"{k}={v}" if "{" not in v else f"{k}='{v}'" for k, v in p.env.items()]
        assert "kept (set by the user): OMP_SCHEDULE=DYNAMIC" in lines
        assert "LD_PRELOAD: (none)" in lines
    assert blocks[1][0].split()[5] == "cpus=4-7" and blocks[2][0].split()[5] == "cpus=0-3"


def test_env_explain_bad_nodelist_and_missing_library(write_job, capsys):
    from slurm_ddp.cli import main

    job = write_job({"slurm": {"nodes": 2}})
    assert main(["env", str(job), "--explain", "--nodelist", "a1"]) == 2
    assert "names 1 host(s), but slurm.nodes=2" in capsys.readouterr().err
    job = write_job({"environment": {"allocator": "tcmalloc"}}, name="tc.yaml")
    assert main(["env", str(job), "--explain"]) == 0  # a library missing on the login node is not fatal here
    assert "LD_PRELOAD: " in capsys.readouterr().out


def test_env_outside_and_inside_a_task(write_job, capsys, monkeypatch):
    from slurm_ddp.cli import main

    job = write_job({"slurm": {"tasks_per_node": 2}})
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    assert main(["env", str(job)]) == 2
    assert "--explain" in capsys.readouterr().err
    for k, v in synthetic_slurm_env(rank=1, nodes=1, tasks_per_node=2, job_id="77").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.setenv("MASTER_PORT", "15077")
    monkeypatch.setenv(binding.APPLIED_VAR, "cpus=1 numa=0 threads=1 bind=none")
    assert main(["env", str(job)]) == 0
    out = capsys.readouterr().out
    assert "SLURM job 77" in out and "MASTER_PORT=15077" in out and "applied: cpus=1" in out
    assert sorted(_blocks(out)) == [1]
