"""In-process recovery's plan (``slurm_ddp.worker.inprocess.next_plan``, pure) and its store protocol
(``Membership``, with a real ``TCPStore`` on loopback and members in threads of this process)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, List, Sequence

import pytest

from slurm_ddp.config import config_from_dict
from slurm_ddp.errors import ConfigError
from slurm_ddp.rundir.inprocess_nodes import still_lost
from slurm_ddp.rundir.recovery import step_with_spares
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


def test_the_state_comes_from_rank_0_at_its_step_even_when_another_survivor_is_a_step_ahead():
    """Issue 52 item 10: a source other than rank 0 would replace rank 0's BatchNorm buffers and log window."""
    p = first_plan(["n1", "n2", "n3", "n4"], 1)
    new = next_plan(p, {"n1/0": 9, "n3/0": 10, "n4/0": 10}, [], tasks_per_node=1, min_nodes=1, max_generations=1)
    assert isinstance(new, Plan) and new.step == 9 and new.source == new.ranks["n1/0"] == 0


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
    assert isinstance(two, str) and two.startswith("recovery.max_restarts reached: the 1 recoveries"), two
    none_left = next_plan(p, {"n1/0": 1}, ["n3/0"], tasks_per_node=1, min_nodes=1, max_generations=0)
    assert isinstance(none_left, str) and "the 0 recoveries" in none_left, none_left


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
    assert still_lost(records, "5", 0) == ["n2", "n4"]


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
    m0 = Membership("127.0.0.1", port, "n1/0", serve=True, timeout_s=30, dead_after_s=1.0)
    m1 = Membership("127.0.0.1", port, "n2/0", serve=False, timeout_s=30, dead_after_s=1.0)
    spare = Membership("127.0.0.1", port, "n3/0", serve=False, timeout_s=30, dead_after_s=1.0)
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
    m0 = Membership("127.0.0.1", port, "n1/0", serve=True, timeout_s=30, dead_after_s=1.0)
    m1 = Membership("127.0.0.1", port, "n2/0", serve=False, timeout_s=30, dead_after_s=1.0)
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


def member(port, slot, serve=False, **kw):
    return Membership("127.0.0.1", port, slot, serve=serve, timeout_s=30, dead_after_s=1.0, **kw)


def test_a_member_taken_for_lost_while_slow_can_wait_as_a_spare_and_be_called_in_later():
    """Issue 52 item 1: n2 silent past the timeout (only slow) is left out of generation 1; awake again it
    waits as a spare (``spare_ready``, ``wait_for_call`` from generation 2) and takes the next lost node."""
    port = free_port()
    m1, m2, m3 = member(port, "n1/0", serve=True), member(port, "n2/0"), member(port, "n3/0")
    try:
        plan = first_plan(["n1", "n2", "n3"], 1)
        m2.close()  # n2 stops beating (SIGSTOPped)
        m1.check_in(plan, 5)
        m3.check_in(plan, 5)
        g1 = m1.coordinate(plan, [], tasks_per_node=1, min_nodes=1, max_generations=3, deadline_s=20)
        assert g1.nodes == ("n1", "n3") and g1.lost == ("n2",)
        woke = member(port, "n2/0")  # n2 wakes: its heartbeat moves again, it reads g1 and is not in it
        assert "n2/0" not in m1.wait_plan(1, 1).ranks
        woke.spare_ready()
        called = []
        waiter = threading.Thread(target=lambda: called.append(woke.wait_for_call(2)))
        waiter.start()
        m3.close()  # n3 lost in generation 1
        m1.check_in(g1, 9)
        g2 = m1.coordinate(g1, ["n2/0"], tasks_per_node=1, min_nodes=1, max_generations=3, deadline_s=20)
        waiter.join(timeout=20)
        assert g2.nodes == ("n1", "n2") and g2.spares_used == ("n2",) and g2.lost == ("n3",) and g2.step == 9
        assert called == [g2]
        m1.done()
        woke.close()
    finally:
        for m in (m3, m2, m1):
            m.close()


def test_a_failed_spare_is_left_out_named_in_the_plan_and_blocks_no_recovery():
    """Issue 52 item 2: a spare's own failure is no ``crash``: the next recovery uses the other spare."""
    port = free_port()
    m1, m2 = member(port, "n1/0", serve=True), member(port, "n2/0")
    bad, good = member(port, "n3/0"), member(port, "n4/0")
    try:
        for sp in (bad, good):
            sp.spare_ready()
        bad.spare_failed("ImportError: no module named data_on_n3")
        bad.close()
        plan = first_plan(["n1", "n2"], 1)
        m2.close()
        m1.check_in(plan, 4)
        new = m1.coordinate(plan, ["n3/0", "n4/0"], tasks_per_node=1, min_nodes=2, max_generations=2, deadline_s=20)
        assert new.nodes == ("n1", "n4") and new.spares_used == ("n4",) and new.spares_failed == ("n3/0",)
        assert Plan.from_json(new.to_json()) == new
    finally:
        for m in (good, bad, m2, m1):
            m.close()


def test_a_spare_lost_before_its_generation_formed_is_planned_again_not_waited_out():
    """Issue 52 item 5: the spare called into generation 1 dies before it joins: rank 0's ``enter`` answers
    why at once (not after train.pg_timeout_s) and generation 2 calls the next spare in."""
    port = free_port()
    m1, m2 = member(port, "n1/0", serve=True), member(port, "n2/0")
    s3, s4 = member(port, "n3/0"), member(port, "n4/0")
    try:
        for sp in (s3, s4):
            sp.spare_ready()
        plan = first_plan(["n1", "n2"], 1)
        m2.close()
        m1.check_in(plan, 7)
        g1 = m1.coordinate(plan, ["n3/0", "n4/0"], tasks_per_node=1, min_nodes=2, max_generations=3, deadline_s=20)
        assert g1.spares_used == ("n3",)
        s3.close()  # n3 dies as it is called in: it never joins
        why = m1.enter(g1, deadline_s=600)
        assert why == "n3/0 stopped beating before generation 1 formed"
        m1.check_in(g1, 7)
        g2 = m1.coordinate(
            g1, ["n3/0", "n4/0"], tasks_per_node=1, min_nodes=2, max_generations=3, deadline_s=20, replanned=why
        )
        assert g2.nodes == ("n1", "n4") and g2.lost == ("n3",) and g2.replanned == why and g2.step == 7
        answers = []
        joiner = threading.Thread(target=lambda: answers.append(s4.enter(g2, deadline_s=20)))
        joiner.start()
        assert m1.enter(g2, deadline_s=20) == ""
        joiner.join(timeout=20)
        assert answers == [""]
    finally:
        for m in (s4, s3, m2, m1):
            m.close()


def test_a_failed_heartbeat_is_logged_and_the_heartbeat_goes_on(caplog):
    """Issue 52 item 9: the heartbeat thread survives a store error (it reconnects)."""

    class Broken:
        def add(self, key, n):
            raise RuntimeError("Connection reset by peer")

    port = free_port()
    m1 = member(port, "n1/0", serve=True, heartbeat_s=0.05)
    try:
        caplog.set_level("WARNING", logger="slurm_ddp.worker")
        m1._beat_store = Broken()
        before = m1._counter("hb/n1/0")
        deadline = time.monotonic() + 30
        while not (m1.beat_errors and m1._counter("hb/n1/0") > before + 1):
            assert time.monotonic() < deadline, (m1.beat_errors, before)
            time.sleep(0.05)
        assert "heartbeat of n1/0 failed (Connection reset by peer)" in caplog.text
    finally:
        m1.close()


def test_heartbeat_timeout_below_two_intervals_is_refused():
    data = {
        "name": "x",
        "slurm": {"nodes": 2},
        "train": {"task": "m:T"},
        "recovery": {"in_process": True, "spare_nodes": 1, "heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 1.5},
    }
    with pytest.raises(ConfigError, match="recovery.heartbeat_timeout_s"):
        config_from_dict(data)


def test_a_recovery_given_up_mid_step_keeps_what_the_emergency_save_needs():
    """Issue 52 item 4 (unit: the real-Slurm scenario, the batch host lost under a BatchNorm model, is not
    run): the survivor's failed step had updated its BatchNorm buffers; recovery puts back those of the step's
    start (rank 0's, broadcast by DDP) and, when it is given up, leaves ``in_step``/``buffers_kept`` set, so
    ``emergency_save`` commits the step (on main it reset ``in_step`` first, and the save was skipped as "this
    rank's buffers are its own")."""
    import torch

    from slurm_ddp.env import DistEnv
    from slurm_ddp.progress import DISABLED
    from slurm_ddp.worker.fault import FaultTolerance
    from slurm_ddp.worker.inprocess import Place
    from slurm_ddp.worker.train import Trainer

    class GivesUp:
        def watch(self, plan):
            pass

        def check_in(self, plan, step):
            pass

        def wait_plan(self, generation, deadline_s):
            raise RecoveryAbandoned("the step's store is gone (Connection reset by peer)")

    cfg = config_from_dict(
        {
            "name": "x",
            "slurm": {"nodes": 2},
            "train": {"task": "m:T"},
            "recovery": {"in_process": True, "spare_nodes": 1},
        }
    )
    t = Trainer.__new__(Trainer)
    model = torch.nn.BatchNorm1d(3)
    t.cfg, t.tc, t.model, t.step = cfg, cfg.train, model, 11
    t.denv = DistEnv(1, 0, 2, 1, 2, 1, "n1", 29500, "5", "n2", 0)
    ft = t.fault = FaultTolerance(t, Place("n2", 0, False, ("n1", "n2"), ("n3",), 1))
    ft.plan, ft.membership, t.progress = first_plan(["n1", "n2"], 1), GivesUp(), DISABLED
    t.stop = type("Stop", (), {"group": None})()
    ft.kept_buffers = {k: v.clone() for k, v in model.state_dict().items() if k.startswith("running")}
    ft.in_step, ft.buffers_kept = True, True
    with torch.no_grad():
        model.running_mean.add_(1.0)  # the failed step's forward
    assert not ft.recover_in_process(RuntimeError("Connection closed by peer"))
    assert ft.in_step and ft.buffers_kept  # the emergency save's "the buffers are the step's start"
    assert torch.equal(model.running_mean, ft.kept_buffers["running_mean"])


@pytest.mark.parametrize(
    "slurm, train",
    [({"gpus_per_node": 2}, {}), ({"gpus_per_node": 2}, {"backend": "nccl"}), ({}, {"backend": "nccl"})],
)
def test_in_process_is_refused_for_a_nccl_job_naming_the_in_job_restart(slurm, train):
    """Issue 52 item 7: in-process recovery is not correct for NCCL as written: refused, with what the job gets."""
    data = {
        "name": "x",
        "slurm": {"nodes": 2, **slurm},
        "train": {"task": "m:T", **train},
        "recovery": {"in_process": True, "spare_nodes": 1},
    }
    with pytest.raises(ConfigError, match="recovery.in_process.*NCCL job.*in-job restart") as e:
        config_from_dict(data)
    assert "\n" not in str(e.value)
    data["train"] = {"task": "m:T", "backend": "gloo"}  # gloo on a GPU node: accepted
    assert config_from_dict(data).recovery.in_process


def test_a_rank_without_its_node_name_in_a_container_is_told_what_did_not_reach_it():
    """Issue 52 item 8: the message names SLURMD_NODENAME and the container's clean environment."""
    from slurm_ddp.env import DistEnv
    from slurm_ddp.errors import UserError
    from slurm_ddp.worker.inprocess import place_in_step

    denv = DistEnv(0, 0, 2, 0, 2, 1, "n1", 29500, "5", "", 0)
    environ = {"SLURM_DDP_STEP_NODES": "n1,n2", "SLURM_STEP_NODELIST": "n[1-3]", "APPTAINER_CONTAINER": "/i.sif"}
    with pytest.raises(UserError, match="SLURMD_NODENAME .* inside its container.*APPTAINERENV_SLURMD_NODENAME"):
        place_in_step(denv, environ, 1)
    _, place = place_in_step(denv, {**environ, "SLURMD_NODENAME": "n3"}, 1)
    assert place.spare and place.spare_nodes == ("n3",)


def test_a_node_silent_while_training_raises_the_alarm_and_its_connections_are_shut():
    """Issue 52 item 3: rank 0's monitor sees n2 fall silent while generation 0 trains (no collective has
    failed: a frozen node sends no FIN), raises ``alarm/g0`` naming it, and a blocked socket to its address is
    shut, so the collective fails at once instead of after train.pg_timeout_s."""
    from slurm_ddp.worker.inprocess import cut_connections

    server = socket.socket()
    server.bind(("127.0.0.3", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    try:
        assert cut_connections(["127.0.0.3"], keep_local_port=server.getsockname()[1]) == 1  # the client's only
        client.settimeout(10)
        assert client.recv(1) == b""  # what gloo's blocked read sees: the connection is closed
    finally:
        for s in (client, peer, server):
            s.close()

    port = free_port()
    m1, m2 = member(port, "n1/0", serve=True, heartbeat_s=0.05), member(port, "n2/0", heartbeat_s=0.05)
    try:
        plan = first_plan(["n1", "n2"], 1)
        m1.watch(plan)
        m2.watch(plan)
        m2.close()  # n2 frozen: its heartbeat stops, nothing fails
        deadline = time.monotonic() + 30
        while not m1._has("alarm/g0"):
            assert time.monotonic() < deadline, "no alarm"
            time.sleep(0.05)
        assert m1.store.get("alarm/g0") == b"n2"
        # the coordinator then starts from the monitor's view: n2 is already silent
        m1.watch(None)
        assert m1.seen["n2/0"][0] == m1._counter("hb/n2/0")
        m1.check_in(plan, 3)
        new = m1.coordinate(plan, [], tasks_per_node=1, min_nodes=1, max_generations=2, deadline_s=20)
        assert new.lost == ("n2",)
    finally:
        m2.close()
        m1.close()


def test_a_member_named_silent_by_the_alarm_cuts_its_connections_to_the_others(monkeypatch):
    """Issue 52 item 1: n2 was only stopped past the heartbeat timeout and wakes to an alarm naming its own node:
    it shuts its connections to the other nodes' ranks (its own are kept), so its blocked collective fails and it
    can wait as a spare; before, it cut nothing and stayed in the collective until train.pg_timeout_s."""
    from slurm_ddp.worker import inprocess

    port = free_port()
    m1, m2 = member(port, "n1/0", serve=True), member(port, "n2/0")
    cut: list = []
    monkeypatch.setattr(inprocess, "cut_connections", lambda peers, **keep: cut.append((peers, keep)) or 1)
    try:
        plan = first_plan(["n1", "n2"], 1)
        m1.store.set("addr/n1/0", "10.9.0.1")
        m1.store.set("addr/n2/0", "10.9.0.2")
        m2._cut(m1.store, plan, ["n2"])  # the alarm names n2 itself
        m1._cut(m1.store, plan, ["n2"])  # rank 0: the silent node's connections, as before
        # n2 keeps only its link to the store (on n1, at its port); rank 0 serves the store: its own port kept
        assert cut == [
            (["10.9.0.1"], {"keep_local_port": 0, "keep_remote_port": port}),
            (["10.9.0.2"], {"keep_local_port": port, "keep_remote_port": 0}),
        ]
    finally:
        m2.close()
        m1.close()
    # with real sockets: the link to the store's port stays, the one to a collective's port is shut
    store, gloo = socket.socket(), socket.socket()
    for srv in (store, gloo):
        srv.bind(("127.0.0.4", 0))
        srv.listen()
    to_store, to_gloo = socket.create_connection(store.getsockname()), socket.create_connection(gloo.getsockname())
    try:
        monkeypatch.undo()
        assert inprocess.cut_connections(["127.0.0.4"], keep_remote_port=store.getsockname()[1]) == 1
        to_gloo.settimeout(10)
        assert to_gloo.recv(1) == b""
        to_store.setblocking(False)
        with pytest.raises(BlockingIOError):  # still open: nothing to read, no EOF
            to_store.recv(1)
    finally:
        for x in (to_store, to_gloo, store, gloo):
            x.close()


def test_the_hang_saver_of_a_spare_watches_its_slurm_task_s_report(monkeypatch):
    """Issue 52 item 10: the watchdog's report is named by Slurm's task number; a warm spare's training rank
    is -1 (it watched ``rank--1.json``, which never appears)."""
    from slurm_ddp.env import DistEnv
    from slurm_ddp.worker.fault import FaultTolerance
    from slurm_ddp.worker.inprocess import Place
    from slurm_ddp.worker.train import Trainer

    t = Trainer.__new__(Trainer)
    t.denv = DistEnv(-1, 0, 2, -1, 2, 1, "n1", 29500, "5", "n3", 0)
    t.fault = FaultTolerance(t, Place("n3", 0, True, ("n1", "n2"), ("n3",), 1))
    monkeypatch.setenv("SLURM_PROCID", "2")
    assert t.fault.watchdog_rank() == 2
    t.fault.place = None
    assert t.fault.watchdog_rank() == -1


def test_the_store_is_read_in_few_requests_and_missing_keys_are_left_out():
    """Issue 52 item 9: ``present_values`` and ``heartbeat_counts`` (``multi_get``) see what exists."""
    from datetime import timedelta

    import torch.distributed as dist

    from slurm_ddp.worker.inprocess import heartbeat_counts, present_values

    store = dist.TCPStore(
        "127.0.0.1", free_port(), is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    for i in range(150):
        if i != 70:
            store.set(f"k{i}", str(i))
    got = present_values(store, [f"k{i}" for i in range(150)])
    assert sorted(got) == sorted(f"k{i}" for i in range(150) if i != 70) and got["k149"] == b"149"
    store.add("hb/n1/0", 3)
    made: set = set()
    assert heartbeat_counts(store, ["n1/0", "n2/0"], made) == {"n1/0": 3, "n2/0": 0} and made == {"n1/0", "n2/0"}


def test_a_node_taken_for_lost_then_called_back_in_is_not_lost_for_the_batch_side():
    """Issue 52 item 1, batch side (pure; the job's supervisor asks it after an in-process step)."""
    records = [
        {"action": "in_process", "job_id": "5", "restart": 0, "bad": ["n2"], "nodes": ["n1", "n3"], "spares_used": []},
        {
            "action": "in_process",
            "job_id": "5",
            "restart": 0,
            "bad": ["n3"],
            "nodes": ["n1", "n2"],
            "spares_used": ["n2"],
        },
        {"action": "in_process", "job_id": "5", "restart": 1, "bad": ["n4"], "nodes": ["n1"], "spares_used": []},
    ]
    assert still_lost(records, "5", 0) == ["n3"]
    assert still_lost(records[:1], "5", 0) == ["n2"]


def rank0_fault_tolerance(port: int, nodes: Sequence[str], max_restarts: int) -> Any:
    """Rank 0's real ``FaultTolerance`` of an in-process step on ``nodes`` (no spare, ``min_nodes`` 1), its
    ``Membership`` serving the step's store on loopback; the trainer only as far as a recovery reads it."""
    from slurm_ddp.env import DistEnv
    from slurm_ddp.progress import DISABLED
    from slurm_ddp.worker.fault import FaultTolerance
    from slurm_ddp.worker.inprocess import Place
    from slurm_ddp.worker.train import Trainer

    cfg = config_from_dict(
        {
            "name": "x",
            "slurm": {"nodes": len(nodes)},
            "train": {"task": "m:T"},
            "recovery": {"in_process": True, "min_nodes": 1, "max_restarts": max_restarts},
        }
    )
    t = Trainer.__new__(Trainer)
    t.cfg, t.tc, t.step, t.progress = cfg, cfg.train, 5, DISABLED
    t.denv = DistEnv(0, 0, len(nodes), 0, len(nodes), 1, "127.0.0.1", port, "5", nodes[0], 0)
    t.stop = type("Stop", (), {"group": None})()
    ft = t.fault = FaultTolerance(t, Place(nodes[0], 0, False, tuple(nodes), (), 1))
    ft.membership, ft.plan = member(port, f"{nodes[0]}/0", serve=True), first_plan(nodes, 1)
    return ft


@pytest.mark.parametrize("left", [0, 1, None])
def test_the_worker_recovers_in_process_only_as_often_as_the_supervisor_left_it(monkeypatch, caplog, left):
    """Issue 52 item 10, worker side: ``SLURM_DDP_RECOVERIES_LEFT`` (``rundir.recovery.RECOVERIES_LEFT_VAR``, read
    by ``recoveries_left`` in rank 0's ``FaultTolerance._next_generation``) bounds the step's in-process
    recoveries below ``recovery.max_restarts`` (2 here). 0 left: the first lost node is not recovered from in the
    process (``recover_in_process`` is False: the rank's peer-failure path ends the step and the batch side
    decides); 1 left: one recovery (n2 lost → n1,n3,n4), the second loss (n3) is not; unset (a step started outside
    the supervisor): the whole ``max_restarts``. The real reader, store, heartbeats and coordinator."""
    from slurm_ddp.rundir.recovery import RECOVERIES_LEFT_VAR

    if left is None:
        monkeypatch.delenv(RECOVERIES_LEFT_VAR, raising=False)
    else:
        monkeypatch.setenv(RECOVERIES_LEFT_VAR, str(left))
    port = free_port()
    ft = rank0_fault_tolerance(port, ["n1", "n2", "n3", "n4"], max_restarts=2)
    others = {n: member(port, f"{n}/0") for n in ("n2", "n3", "n4")}
    joined: List[Any] = []

    def follow(plan: Any, t_fail: float, why: str) -> bool:  # joining the new group is not what is tested here
        joined.append(plan)
        ft.plan = plan
        return True

    monkeypatch.setattr(ft, "_follow", follow)
    caplog.set_level("ERROR", logger="slurm_ddp.worker")
    try:
        for lost in ("n2", "n3", "n4"):
            others.pop(lost).close()  # the node's process is gone: its heartbeat stops
            assert ft.plan is not None
            for m in others.values():
                m.check_in(ft.plan, 5)
            if not ft.recover_in_process(RuntimeError("Connection closed by peer")):
                break
        made = {0: 0, 1: 1, None: 2}[left]
        assert [p.nodes for p in joined] == [("n1", "n3", "n4"), ("n1", "n4")][:made]
        given_up = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
        assert given_up == [
            "in-process recovery given up: recovery.max_restarts reached: the "
            f"{made} recoveries this job start had left for the step were done"
        ]
    finally:
        for m in others.values():
            m.close()
        assert ft.membership is not None
        ft.membership.close()


def test_a_rank_s_no_restart_is_recorded_for_the_batch_side(tmp_path) -> None:
    """Issue 52: ``FaultTolerance.report_no_restart`` (``Trainer.run``'s answer to ``errors.NoRestart``) leaves the
    record the batch side's rules read (``rundir.read_no_restart``: this job and restart)."""
    from pathlib import Path

    from slurm_ddp.env import DistEnv
    from slurm_ddp.errors import NoRestart
    from slurm_ddp.rundir import read_no_restart
    from slurm_ddp.worker.fault import FaultTolerance
    from slurm_ddp.worker.train import Trainer

    t = Trainer.__new__(Trainer)
    t.run_dir = Path(tmp_path)
    t.denv = DistEnv(1, 0, 2, 1, 2, 1, "n1", 29500, "5", "n2", 3)
    FaultTolerance(t, None).report_no_restart(NoRestart("labels out of range in shard 3"))
    said = read_no_restart(tmp_path, "5", 3)
    assert said is not None and said["rank"] == 1 and said["host"] == "n2" and said["by"] == "worker"
    assert said["reason"] == "labels out of range in shard 3" and read_no_restart(tmp_path, "5", 2) is None
