"""SLURM variables → ``DistEnv``: parametrized tables of task environments and nodelists, the
port fallback, the config check, the synthetic environment the local backend uses, and the
batch shell's rendezvous choice. Pure: every input is an explicit mapping."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import MappingProxyType

import pytest

from slurm_ddp import rendezvous
from slurm_ddp.env import (
    PORT_BASE,
    PORT_SPAN,
    DistEnv,
    expand_nodelist,
    expand_tasks_per_node,
    fallback_port,
    fold_nodelist,
    synthetic_slurm_env,
)
from slurm_ddp.errors import EnvironmentMismatch, UserError

JOB_ID = "4242"
PORT_OF_JOB = 15000 + 4242  # PORT_BASE + job id % PORT_SPAN


def task_env(*, procid, localid, nodeid, ntasks, nnodes, nodelist, tasks_per_node, job_id=JOB_ID, **extra):
    """What srun sets for one task (srun(1), OUTPUT ENVIRONMENT VARIABLES), written out by hand."""
    env = {
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(localid),
        "SLURM_NODEID": str(nodeid),
        "SLURM_NTASKS": str(ntasks),
        "SLURM_NNODES": str(nnodes),
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": tasks_per_node,
        "SLURM_JOB_ID": job_id,
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


# --------------------------------------------------------------------------- rank tables


@pytest.mark.parametrize("rank", [0, 1])
def test_one_node_two_tasks(rank):
    env = DistEnv.from_slurm(
        task_env(
            procid=rank,
            localid=rank,
            nodeid=0,
            ntasks=2,
            nnodes=1,
            nodelist="cn01",
            tasks_per_node="2",
            SLURMD_NODENAME="cn01",
            SLURM_RESTART_COUNT=1,
        )
    )
    assert (env.rank, env.local_rank, env.world_size) == (rank, rank, 2)
    assert (env.node_rank, env.num_nodes, env.local_world_size) == (0, 1, 2)
    assert (env.master_addr, env.master_port) == ("cn01", PORT_OF_JOB)
    assert (env.job_id, env.hostname, env.restart_count) == (JOB_ID, "cn01", 1)
    assert env.is_main == (rank == 0)


# every rank of a 2-node × 4-task job: (rank, local_rank, node_rank)
TWO_BY_FOUR = [(r, r % 4, r // 4) for r in range(8)]


@pytest.mark.parametrize("rank, local_rank, node_rank", TWO_BY_FOUR)
def test_two_nodes_four_tasks_every_rank(rank, local_rank, node_rank):
    env = DistEnv.from_slurm(
        task_env(
            procid=rank,
            localid=local_rank,
            nodeid=node_rank,
            ntasks=8,
            nnodes=2,
            nodelist="gpu-[001-002]",
            tasks_per_node="4(x2)",
        )
    )
    assert env.rank == rank
    assert env.local_rank == local_rank
    assert env.node_rank == node_rank
    assert env.local_world_size == 4
    assert env.world_size == 8 and env.num_nodes == 2
    assert env.master_addr == "gpu-001"  # the first host, on every rank
    assert env.master_port == PORT_OF_JOB


def test_shared_fields_are_identical_on_every_rank():
    envs = [
        DistEnv.from_slurm(
            task_env(
                procid=r, localid=lr, nodeid=n, ntasks=8, nnodes=2, nodelist="gpu-[001-002]", tasks_per_node="4(x2)"
            )
        )
        for r, lr, n in TWO_BY_FOUR
    ]
    assert len({(e.master_addr, e.master_port, e.world_size, e.num_nodes, e.job_id) for e in envs}) == 1
    assert sorted(e.rank for e in envs) == list(range(8))


@pytest.mark.parametrize(
    "nodeid, localid, expected_local_world",
    [(0, 1, 2), (1, 0, 2), (2, 1, 2), (3, 0, 1)],
)
def test_uneven_tasks_per_node(nodeid, localid, expected_local_world):
    env = DistEnv.from_slurm(
        task_env(
            procid=2 * nodeid + localid,
            localid=localid,
            nodeid=nodeid,
            ntasks=7,
            nnodes=4,
            nodelist="n[1-4]",
            tasks_per_node="2(x3),1",
        )
    )
    assert env.local_world_size == expected_local_world
    assert env.master_addr == "n1"


def test_without_tasks_per_node_the_local_world_is_the_even_share():
    environ = task_env(procid=5, localid=1, nodeid=1, ntasks=8, nnodes=2, nodelist="a[1-2]", tasks_per_node="")
    assert DistEnv.from_slurm(environ).local_world_size == 4


def test_step_tasks_per_node_is_the_fallback():
    environ = task_env(
        procid=0,
        localid=0,
        nodeid=0,
        ntasks=3,
        nnodes=1,
        nodelist="a1",
        tasks_per_node="",
        SLURM_STEP_TASKS_PER_NODE="3",
    )
    assert DistEnv.from_slurm(environ).local_world_size == 3


def test_old_variable_names_are_understood():
    environ = {
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_NODELIST": "x[7-8]",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_JOBID": "99",
    }
    env = DistEnv.from_slurm(environ)
    assert (env.master_addr, env.num_nodes, env.job_id, env.local_world_size) == ("x7", 1, "99", 2)
    assert env.master_port == PORT_BASE + 99


# --------------------------------------------------------------------------- nodelists


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("gpu-[001-004]", ["gpu-001", "gpu-002", "gpu-003", "gpu-004"]),
        ("a[1-2],b3", ["a1", "a2", "b3"]),
        ("node7", ["node7"]),
        ("n[1-2,5]", ["n1", "n2", "n5"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("b3,a1", ["b3", "a1"]),  # order is kept: the first host is rank 0's
        ("n[1-2]x[01-02]", ["n1x01", "n1x02", "n2x01", "n2x02"]),
        ("gpu[09-10],cpu[1-2,4]", ["gpu09", "gpu10", "cpu1", "cpu2", "cpu4"]),
        ("n[001-003,010]", ["n001", "n002", "n003", "n010"]),
        ("a1,a1,a2", ["a1", "a2"]),  # a host counts once
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts
    env = DistEnv.from_slurm(
        task_env(
            procid=0,
            localid=0,
            nodeid=0,
            ntasks=len(hosts),
            nnodes=len(hosts),
            nodelist=nodelist,
            tasks_per_node=f"1(x{len(hosts)})",
        )
    )
    assert env.master_addr == hosts[0]


@pytest.mark.parametrize(
    "nodelist",
    # unclosed, reversed, unclosed, padding mismatch, empty bracket, empty element, and
    # ClusterShell's own set operators and groups, which SLURM's syntax does not have
    ["gpu-[001-", "n[3-1]", "a[1-2", "n[8-010]", "n[]", "a1,,a2", ",", "a1!a2", "a[1-4]&a[2-3]", "@gpus", "n*"],
)
def test_bad_nodelist(nodelist):
    with pytest.raises(UserError) as ei:
        expand_nodelist(nodelist)
    msg = str(ei.value)
    assert repr(nodelist) in msg and "\n" not in msg


def test_empty_nodelist():
    with pytest.raises(UserError, match="empty SLURM nodelist"):
        expand_nodelist("")


@pytest.mark.parametrize(
    "hosts, folded",
    [
        (["node0", "node1", "node2"], "node[0-2]"),
        (["gpu-007", "gpu-008"], "gpu-[007-008]"),
        (["b1", "a1"], "b1,a1"),  # folding would sort: the order is kept instead
        (["x"], "x"),
    ],
)
def test_fold_nodelist_round_trips_in_order(hosts, folded):
    assert fold_nodelist(hosts) == folded
    assert expand_nodelist(fold_nodelist(hosts)) == hosts


def test_synthetic_env_keeps_the_order_of_given_node_names():
    environ = synthetic_slurm_env(rank=0, nodes=2, tasks_per_node=1, node_names=["zeta", "alpha"])
    env = DistEnv.from_slurm(environ)
    assert env.master_addr == "zeta" == env.hostname


@pytest.mark.parametrize(
    "spec, counts",
    [
        ("2(x3),1", [2, 2, 2, 1]),
        ("4", [4]),
        ("4(x2)", [4, 4]),
        ("1,2,3", [1, 2, 3]),
        ("8(x1)", [8]),
        ("2(x2),1,3(x2)", [2, 2, 1, 3, 3]),
    ],
)
def test_expand_tasks_per_node(spec, counts):
    assert expand_tasks_per_node(spec) == counts


@pytest.mark.parametrize("spec", ["x", "2(x)", "2(3)", "2,,1", "-1"])
def test_bad_tasks_per_node(spec):
    with pytest.raises(UserError) as ei:
        expand_tasks_per_node(spec)
    assert "SLURM_TASKS_PER_NODE" in str(ei.value) and "2(x3),1" in str(ei.value)


# --------------------------------------------------------------------------- rendezvous port/address


def test_master_port_and_addr_from_the_environment_win():
    envs = [
        DistEnv.from_slurm(
            task_env(
                procid=r,
                localid=r % 2,
                nodeid=r // 2,
                ntasks=4,
                nnodes=2,
                nodelist="a[1-2]",
                tasks_per_node="2(x2)",
                MASTER_PORT=29500,
                MASTER_ADDR="10.0.0.5",
            )
        )
        for r in range(4)
    ]
    assert {(e.master_addr, e.master_port) for e in envs} == {("10.0.0.5", 29500)}


def test_without_master_port_every_rank_derives_the_same_port():
    ports = {
        DistEnv.from_slurm(
            task_env(
                procid=r,
                localid=r % 2,
                nodeid=r // 2,
                ntasks=4,
                nnodes=2,
                nodelist="a[1-2]",
                tasks_per_node="2(x2)",
                job_id="987654",
            )
        ).master_port
        for r in range(4)
    }
    assert ports == {fallback_port("987654")}


@pytest.mark.parametrize(
    "job_id, port",
    [
        ("4242", 19242),
        ("0", 15000),
        ("15000", 15000),
        ("29999", 29999),
        ("123456789", 15000 + 123456789 % 15000),
        ("12_3", 15123),
        ("abc", 15000),
        ("", 15000),
    ],
)
def test_fallback_port(job_id, port):
    assert fallback_port(job_id) == port
    assert PORT_BASE <= fallback_port(job_id) < PORT_BASE + PORT_SPAN


def test_bad_master_port():
    for value in ("http", "0", "70000"):
        environ = task_env(
            procid=0, localid=0, nodeid=0, ntasks=1, nnodes=1, nodelist="a1", tasks_per_node="1", MASTER_PORT=value
        )
        with pytest.raises(UserError) as ei:
            DistEnv.from_slurm(environ)
        assert "MASTER_PORT" in str(ei.value)


# --------------------------------------------------------------------------- not a task / inconsistent


@pytest.mark.parametrize("missing", ["SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"])
def test_missing_task_variable(missing):
    environ = task_env(procid=0, localid=0, nodeid=0, ntasks=1, nnodes=1, nodelist="a1", tasks_per_node="1")
    del environ[missing]
    with pytest.raises(UserError) as ei:
        DistEnv.from_slurm(environ)
    msg = str(ei.value)
    assert missing in msg and "srun" in msg and "\n" not in msg


def test_empty_environment_is_not_a_task():
    with pytest.raises(UserError) as ei:
        DistEnv.from_slurm({})
    assert "SLURM_PROCID" in str(ei.value) and "srun" in str(ei.value)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        ({"SLURM_PROCID": "8"}, "SLURM_PROCID=8"),
        ({"SLURM_PROCID": "-1"}, "SLURM_PROCID=-1"),
        ({"SLURM_LOCALID": "4"}, "SLURM_LOCALID=4"),
        ({"SLURM_PROCID": "one"}, "SLURM_PROCID='one'"),
        ({"SLURM_RESTART_COUNT": "x"}, "SLURM_RESTART_COUNT"),
    ],
)
def test_inconsistent_task_variables(overrides, fragment):
    environ = task_env(procid=0, localid=0, nodeid=0, ntasks=8, nnodes=2, nodelist="a[1-2]", tasks_per_node="4(x2)")
    environ.update(overrides)
    with pytest.raises(UserError) as ei:
        DistEnv.from_slurm(environ)
    assert fragment in str(ei.value)


def test_from_slurm_only_reads_its_input(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    environ = MappingProxyType(
        task_env(procid=1, localid=1, nodeid=0, ntasks=2, nnodes=1, nodelist="a1", tasks_per_node="2")
    )
    env = DistEnv.from_slurm(environ)  # a read-only mapping is enough
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ
    assert env.rank == 1


# --------------------------------------------------------------------------- validate_against


def test_validate_against_matching_config(make_config):
    cfg = make_config({"slurm": {"nodes": 2, "tasks_per_node": 4}})
    env = DistEnv.from_slurm(
        task_env(procid=5, localid=1, nodeid=1, ntasks=8, nnodes=2, nodelist="gpu-[001-002]", tasks_per_node="4(x2)")
    )
    env.validate_against(cfg)  # no error


def test_validate_against_wrong_number_of_nodes(make_config):
    cfg = make_config({"slurm": {"nodes": 2, "tasks_per_node": 4}})
    env = DistEnv.from_slurm(
        task_env(procid=0, localid=0, nodeid=0, ntasks=4, nnodes=1, nodelist="gpu-001", tasks_per_node="4")
    )
    with pytest.raises(EnvironmentMismatch) as ei:
        env.validate_against(cfg)
    msg = str(ei.value)
    assert "SLURM_NNODES=1" in msg and "slurm.nodes=2" in msg and "HINT" in msg and "--nodes=2" in msg
    assert ei.value.exit_code == 2


def test_validate_against_wrong_tasks_per_node(make_config):
    cfg = make_config({"slurm": {"nodes": 2, "tasks_per_node": 4}})
    env = DistEnv.from_slurm(
        task_env(procid=0, localid=0, nodeid=0, ntasks=4, nnodes=2, nodelist="gpu-[001-002]", tasks_per_node="2(x2)")
    )
    with pytest.raises(EnvironmentMismatch) as ei:
        env.validate_against(cfg)
    msg = str(ei.value)
    assert "2 tasks on this node" in msg and "slurm.tasks_per_node=4" in msg and "HINT" in msg
    assert "--ntasks-per-node=4" in msg


# --------------------------------------------------------------------------- synthetic env


@pytest.mark.parametrize(
    "nodes, tasks_per_node, nodelist",
    [(1, 1, None), (1, 2, None), (2, 4, None), (3, 2, None), (2, 2, "gpu-[007-008]"), (4, 1, "a[1-2],b[1-2]")],
)
def test_synthetic_env_round_trips_for_every_rank(nodes, tasks_per_node, nodelist):
    world = nodes * tasks_per_node
    hosts = expand_nodelist(nodelist) if nodelist else [f"node{i}" for i in range(nodes)]
    for rank in range(world):
        environ = synthetic_slurm_env(
            rank=rank, nodes=nodes, tasks_per_node=tasks_per_node, job_id="31337", nodelist=nodelist, restart_count=2
        )
        env = DistEnv.from_slurm(environ)
        assert env.rank == rank
        assert env.local_rank == rank % tasks_per_node
        assert env.node_rank == rank // tasks_per_node
        assert env.world_size == world and env.num_nodes == nodes
        assert env.local_world_size == tasks_per_node
        assert env.master_addr == hosts[0]
        assert env.hostname == hosts[rank // tasks_per_node]
        assert env.master_port == fallback_port("31337")
        assert (env.job_id, env.restart_count) == ("31337", 2)
        assert all(isinstance(v, str) for v in environ.values())


def test_synthetic_env_validates_against_its_config(make_config):
    cfg = make_config({"slurm": {"nodes": 3, "tasks_per_node": 2}})
    for rank in range(6):
        DistEnv.from_slurm(synthetic_slurm_env(rank=rank, nodes=3, tasks_per_node=2)).validate_against(cfg)


def test_torch_env_keys_and_values():
    env = DistEnv.from_slurm(
        synthetic_slurm_env(rank=5, nodes=2, tasks_per_node=4, job_id="77", nodelist="gpu-[001-002]")
    )
    te = env.torch_env()
    assert set(te) == {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
    assert all(isinstance(v, str) for v in te.values())
    assert te == {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "LOCAL_WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "gpu-001",
        "MASTER_PORT": str(fallback_port("77")),
    }


# --------------------------------------------------------------------------- rendezvous.choose


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def test_choose_honours_user_set_master_addr_and_port(monkeypatch):
    def no_probe(*a, **k):
        raise AssertionError("must not probe a port the user set")

    monkeypatch.setattr(rendezvous, "choose_port", no_probe)
    environ = {
        "SLURM_JOB_NODELIST": "gpu-[003-004]",
        "SLURM_JOB_ID": "5",
        "MASTER_ADDR": "login7",
        "MASTER_PORT": "29400",
    }
    assert rendezvous.choose(environ) == ("login7", 29400)


def test_choose_picks_the_first_host_and_a_free_port():
    addr, port = rendezvous.choose({"SLURM_JOB_NODELIST": "gpu-[003-004]", "SLURM_JOB_ID": "5"})
    assert addr == "gpu-003"
    assert isinstance(port, int) and 1 <= port <= 65535


def test_choose_uses_the_old_nodelist_name_and_the_hostname_as_last_resort():
    assert rendezvous.choose({"SLURM_NODELIST": "b[2-3]", "MASTER_PORT": "1234"}) == ("b2", 1234)
    assert rendezvous.choose({"MASTER_PORT": "1234"}) == (socket.gethostname(), 1234)


def test_choose_user_port_only():
    addr, port = rendezvous.choose({"SLURM_JOB_NODELIST": "n9", "MASTER_PORT": "20001"})
    assert (addr, port) == ("n9", 20001)


def test_choose_port_returns_a_bindable_port():
    port = rendezvous.choose_port("424242")
    assert _bindable(port)


def test_choose_port_starts_at_the_job_port_and_leaves_a_busy_one_for_an_ephemeral_one():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        for job_id in map(str, range(8123, 8123 + 200)):  # a job whose port this test can hold busy
            start = fallback_port(job_id)
            try:
                busy.bind(("", start))
                break
            except OSError:
                continue
        else:
            raise AssertionError("200 job ports in a row are in use on this machine")
        busy.listen()
        assert not rendezvous.port_is_free(start)
        port = rendezvous.choose_port(job_id)
        assert port != start
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        assert low <= port <= high  # the kernel's pick, not the next job's derived port
    assert _bindable(port)


def test_choose_port_falls_back_to_an_ephemeral_port(monkeypatch):
    monkeypatch.setattr(rendezvous, "port_is_free", lambda port, host="": False)
    port = rendezvous.choose_port("1")
    assert _bindable(port)


@pytest.mark.parametrize("port", ["abc", "0", "70000", "-1", "29 500"])
def test_choose_refuses_a_user_port_that_is_not_a_port(port):
    with pytest.raises(ValueError, match="MASTER_PORT=.* is not a TCP port"):
        rendezvous.choose({"SLURM_JOB_NODELIST": "n1", "MASTER_PORT": port})


def test_rendezvous_main_says_why_in_one_line(monkeypatch, capsys):
    monkeypatch.setenv("MASTER_PORT", "not-a-port")
    assert rendezvous.main() == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "MASTER_PORT='not-a-port'" in err[0] and "Traceback" not in err[0]


def test_synthetic_env_refuses_too_few_node_names_and_ranks_outside_the_job():
    with pytest.raises(ValueError, match="1 node name"):
        synthetic_slurm_env(rank=2, nodes=2, tasks_per_node=2, nodelist="a1")
    with pytest.raises(ValueError, match="rank 4 is outside"):
        synthetic_slurm_env(rank=4, nodes=2, tasks_per_node=2)


def test_a_reserved_port_is_not_handed_out_again_until_released(tmp_path, monkeypatch):
    """Two launches whose job ids derive one port: the second gets another while the first holds it
    (rendezvous.reserve_port's lock), and the derived one again once it is released."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(rendezvous, "PORTS_DIR", tmp_path / "ports")
    monkeypatch.setattr(rendezvous, "fallback_port", lambda job_id: port)
    first = rendezvous.reserve_port("1")
    second = rendezvous.reserve_port("2")
    try:
        assert first.port == port and second.port != port
    finally:
        first.release()
        second.release()
    third = rendezvous.reserve_port("3")
    third.release()
    assert third.port == port
