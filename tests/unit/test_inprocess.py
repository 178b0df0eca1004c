"""In-process recovery's plan (``slurm_ddp.worker.inprocess.next_plan``, pure) and its store protocol
(``Membership``, with a real ``TCPStore`` on loopback and members in threads of this process)."""

from __future__ import annotations

import socket
import threading

import pytest

from slurm_ddp.config import config_from_dict
from slurm_ddp.errors import ConfigError
from slurm_ddp.rundir.recovery import in_process_lost, step_with_spares
from slurm_ddp.worker.inprocess import Membership, Plan, RecoveryAbandoned, first_plan, next_plan


def plan_of(nodes, tpn=1):
    return first_plan(nodes, tpn)


def test_the_first_plan_numbers_ranks_as_srun_would_on_the_training_nodes():
    p = first_plan(["n1", "n2"], 2)
    assert p.ranks == {"n1/0": 0, "n1/1": 1, "n2/0": 2, "n2/1": 3} and p.world_size == 4 and p.generation == 0


def test_a_spare_node_takes_the_lost_node_s_ranks_local_rank_for_local_rank():
    p = first_plan(["n1", "n2", "n3"], 2)
    alive = {"n1/0": 7, "n1/1": 7, "n3/0": 7, "n3/1": 7}
    new = next_plan(p, alive, ["n4/0", "n4/1"], tasks_per_node=2, min_nodes=3, max_generations=2)
    assert isinstance(new, Plan)
    assert new.nodes == ("n1", "n4", "n3") and new.lost == ("n2",) and new.spares_used == ("n4",)
    assert new.ranks == {"n1/0": 0, "n1/1": 1, "n4/0": 2, "n4/1": 3, "n3/0": 4, "n3/1": 5}
    assert (new.generation, new.step, new.source, new.world_before) == (1, 7, 0, 6)


def test_without_a_spare_the_survivors_renumber_in_their_order_down_to_min_nodes():
    p = first_plan(["n1", "n2", "n3"], 1)
    new = next_plan(p, {"n1/0": 4, "n3/0": 4}, [], tasks_per_node=1, min_nodes=2, max_generations=2)
    assert isinstance(new, Plan) and new.nodes == ("n1", "n3") and new.ranks == {"n1/0": 0, "n3/0": 1}
    refused = next_plan(p, {"n1/0": 4, "n3/0": 4}, [], tasks_per_node=1, min_nodes=3, max_generations=2)
    assert refused == "2 node(s) would be left, fewer than recovery.min_nodes=3 (no spare left)"


def test_the_state_comes_from_the_survivor_with_the_most_steps_then_the_lowest_rank():
    p = first_plan(["n1", "n2", "n3", "n4"], 1)
    new = next_plan(p, {"n1/0": 9, "n3/0": 10, "n4/0": 10}, [], tasks_per_node=1, min_nodes=1, max_generations=1)
    assert isinstance(new, Plan) and new.step == 10 and new.source == new.ranks["n3/0"] == 1


def test_an_incomplete_spare_node_is_not_called_in():
    p = first_plan(["n1", "n2"], 2)
    alive = {"n1/0": 3, "n1/1": 3}
    new = next_plan(p, alive, ["n3/0"], tasks_per_node=2, min_nodes=1, max_generations=1)
    assert isinstance(new, Plan) and new.spares_used == () and new.nodes == ("n1",)


@pytest.mark.parametrize(
    "alive, why",
    [
        ({"n1/0": 1, "n2/0": 1}, "no rank was lost"),
        ({"n2/0": 1}, "the batch host n1 (rank 0) is lost"),
    ],
)
def test_no_plan_when_nothing_or_the_batch_host_was_lost(alive, why):
    got = next_plan(first_plan(["n1", "n2"], 1), alive, ["n3/0"], tasks_per_node=1, min_nodes=1, max_generations=2)
    assert isinstance(got, str) and got.startswith(why), got


def test_one_rank_gone_on_a_node_whose_other_rank_lives_is_a_crash_not_a_lost_node():
    got = next_plan(
        first_plan(["n1", "n2"], 2),
        {"n1/0": 1, "n1/1": 1, "n2/0": 1},
        ["n3/0", "n3/1"],
        tasks_per_node=2,
        min_nodes=1,
        max_generations=2,
    )
    assert isinstance(got, str) and "a crash, not a lost node" in got


def test_recoveries_stop_at_max_restarts():
    p = first_plan(["n1", "n2"], 1)
    one = next_plan(p, {"n1/0": 1}, ["n3/0"], tasks_per_node=1, min_nodes=1, max_generations=1)
    assert isinstance(one, Plan)
    two = next_plan(one, {"n1/0": 2}, ["n4/0"], tasks_per_node=1, min_nodes=1, max_generations=1)
    assert two == "recovery.max_restarts=1 recoveries done"


def test_a_plan_survives_its_json():
    p = next_plan(first_plan(["n1", "n2"], 1), {"n1/0": 5}, ["n3/0"], tasks_per_node=1, min_nodes=1, max_generations=1)
    assert isinstance(p, Plan) and Plan.from_json(p.to_json()) == p and p.ranks == Plan.from_json(p.to_json()).ranks


def test_the_batch_script_s_node_lists():
    assert step_with_spares(["n1", "n2"], ["n1", "n2", "n3", "n4"], ["n4"]) == ["n1", "n2", "n3"]
    records = [
        {"action": "in_process", "job_id": "5", "restart": 0, "bad": ["n2"]},
        {"action": "restart", "job_id": "5", "restart": 0, "bad": ["n9"]},
        {"action": "in_process", "job_id": "5", "restart": 1, "bad": ["n3"]},
        {"action": "in_process", "job_id": "5", "restart": 0, "bad": ["n4", "n2"]},
    ]
    assert in_process_lost(records, "5", 0) == ["n2", "n4"]


@pytest.mark.parametrize(
    "change, why",
    [
        ({"train": {"command": "python train.py"}}, "train.command"),
        ({"slurm": {"launcher": "torchrun"}}, "slurm.launcher: torchrun"),
        ({"recovery": {"in_process": True, "spare_nodes": 0}}, "no in-job recovery"),
    ],
)
def test_in_process_needs_the_shared_worker_srun_and_in_job_recovery(change, why):
    data = {
        "name": "x",
        "slurm": {"nodes": 2},
        "train": {"task": "m:T"},
        "recovery": {"in_process": True, "spare_nodes": 1},
    }
    for k, v in change.items():
        data[k] = {**data[k], **v} if k != "train" else v
    with pytest.raises(ConfigError, match="recovery.in_process") as e:
        config_from_dict(data)
    assert why in str(e.value)


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_the_coordinator_calls_the_spare_in_for_a_member_that_stopped_beating():
    port = free_port()
    m0 = Membership("127.0.0.1", port, "n1/0", serve=True, timeout_s=30)
    m1 = Membership("127.0.0.1", port, "n2/0", serve=False, timeout_s=30)
    spare = Membership("127.0.0.1", port, "n3/0", serve=False, timeout_s=30)
    try:
        spare.spare_ready()
        called = []
        waiter = threading.Thread(target=lambda: called.append(spare.wait_for_call()))
        waiter.start()
        plan = first_plan(["n1", "n2"], 1)
        m1.close()  # n2's process is gone: its heartbeat stops
        m0.check_in(plan, 12)
        new = m0.coordinate(plan, ["n3/0"], tasks_per_node=1, min_nodes=1, max_generations=2, deadline_s=20)
        waiter.join(timeout=20)
        assert new.ranks == {"n1/0": 0, "n3/0": 1} and new.lost == ("n2",) and new.step == 12
        assert called == [new]
        assert m0.wait_plan(1, 1) == new  # what every survivor reads
        m0.done()
    finally:
        for m in (spare, m1, m0):
            m.close()


def test_a_crash_reported_by_a_rank_makes_the_survivors_give_up():
    port = free_port()
    m0 = Membership("127.0.0.1", port, "n1/0", serve=True, timeout_s=30)
    m1 = Membership("127.0.0.1", port, "n2/0", serve=False, timeout_s=30)
    try:
        plan = first_plan(["n1", "n2"], 1)
        m1.report_crash("ValueError: bad batch")
        m1.close()
        m0.check_in(plan, 3)
        with pytest.raises(RecoveryAbandoned, match="a rank crashed .*ValueError: bad batch"):
            m0.coordinate(plan, [], tasks_per_node=1, min_nodes=1, max_generations=2, deadline_s=20)
        with pytest.raises(RecoveryAbandoned, match="a rank crashed"):
            m0.wait_plan(1, 1)
    finally:
        m1.close()
        m0.close()
