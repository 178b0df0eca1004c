"""The pieces of ``train.command`` and ``slurm.launcher: torchrun`` that need no cluster.

DistEnv from torchrun's variables and the binding slot it gives; the rank wrapper's torchrun
environment contract, rank log and OMP default; ``env --explain`` and ``render`` of a command-mode
torchrun job where torch cannot be imported; the requeue rule's ``got_signal``; the FINISHED of a
command; the preemption API in a real process (flag, agreement without a group, exit 75 + marker).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.config import dump_config
from slurm_ddp.env import DistEnv, synthetic_slurm_env
from slurm_ddp.rundir import decide_requeue, mark_command_finished, read_finished, read_preempted

REPO = Path(__file__).resolve().parents[2]
OWN = REPO / "examples" / "own_script" / "job.yaml"


def torchrun_environ(rank: int, nodes: int = 2, per_node: int = 2, cpus_per_rank: int = 1) -> dict:
    """A worker's variables under the torchrun launcher: the node task's SLURM_* plus torchrun's."""
    node = rank // per_node
    env = synthetic_slurm_env(rank=node, nodes=nodes, tasks_per_node=1, cpus_per_task=per_node * cpus_per_rank)
    env.update(
        TORCHELASTIC_RUN_ID="7",
        RANK=str(rank),
        LOCAL_RANK=str(rank % per_node),
        WORLD_SIZE=str(nodes * per_node),
        LOCAL_WORLD_SIZE=str(per_node),
        GROUP_RANK=str(node),
        GROUP_WORLD_SIZE=str(nodes),
        MASTER_ADDR="node0",
        MASTER_PORT="29400",
    )
    return env


def test_dist_env_from_torchrun_variables(make_config):
    d = DistEnv.from_environ(torchrun_environ(3))
    assert (d.rank, d.local_rank, d.world_size, d.local_world_size, d.node_rank, d.num_nodes) == (3, 1, 4, 2, 1, 2)
    assert (d.master_addr, d.master_port, d.launcher, d.job_id) == ("node0", 29400, "torchrun", "1")
    d.validate_against(make_config({"slurm": {"nodes": 2, "tasks_per_node": 2, "launcher": "torchrun"}}))
    assert d.torch_env()["GROUP_RANK"] == "1" and d.torch_env()["LOCAL_WORLD_SIZE"] == "2"
    srun = DistEnv.from_environ(synthetic_slurm_env(rank=1, nodes=1, tasks_per_node=2))
    assert srun.launcher == "srun" and srun.local_rank == 1


def test_binding_slot_under_torchrun_is_local_rank(make_config):
    """The node task holds 4 CPUs; torchrun's LOCAL_RANK picks the rank's block, with cpus_per_task
    from the config (SLURM_CPUS_PER_TASK is the node task's) and SLURM_CPU_BIND ignored."""
    from slurm_ddp.binding import plan_for_task

    cfg = make_config(
        {
            "slurm": {"nodes": 2, "tasks_per_node": 2, "cpus_per_task": 2, "launcher": "torchrun"},
            "environment": {"cpu_bind": "cores"},
        }
    )
    cpus = []
    for rank in (2, 3):
        env = {**torchrun_environ(rank, cpus_per_rank=2), "SLURM_CPU_BIND": "quiet,mask_cpu:0xF"}
        cpus.append(plan_for_task(cfg, env, allowed=range(4)).cpus)
    assert cpus == [(0, 1), (2, 3)]


def _run_dir(tmp_path: Path, make_config, patch: dict) -> Path:
    rd = tmp_path / "run"
    (rd / "logs").mkdir(parents=True)
    (rd / "config.yaml").write_text(dump_config(make_config(patch)))
    return rd


def _clean_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMP_", "KMP_", "TORCHELASTIC"))}
    env.update(extra)
    return env


def test_launch_gives_the_command_the_torchrun_contract_and_its_rank_log(tmp_path, make_config):
    rd = _run_dir(tmp_path, make_config, {"slurm": {"nodes": 2, "tasks_per_node": 2, "launcher": "torchrun"}})
    env = _clean_env({**torchrun_environ(3), "OMP_NUM_THREADS": "1", "SLURM_DDP_OMP_FROM_TORCHRUN": "1"})
    show = "import json, os; print(json.dumps({k: os.environ.get(k) for k in %r}))" % [
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_DDP_RUN_DIR",
        "SLURM_DDP_REQUEUE_SIGNAL",
        "OMP_NUM_THREADS",
    ]
    cmd = [
        sys.executable,
        "-m",
        "slurm_ddp.launch",
        "--run-dir",
        str(rd),
        "--rank-log",
        "--",
        sys.executable,
        "-c",
        show,
    ]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "", r.stderr
    got = json.loads((rd / "logs" / "rank-3.log").read_text())  # --rank-log: the rank's output in its log
    assert got == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "GROUP_RANK": "1",
        "NODE_RANK": "1",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29400",
        "SLURM_DDP_RUN_DIR": str(rd.resolve()),
        "SLURM_DDP_REQUEUE_SIGNAL": "USR2",
        "OMP_NUM_THREADS": str(make_config().slurm.cpus_per_task),  # the rank's own, not torchrun's default 1
    }


def test_launch_sets_the_contract_under_srun_too(tmp_path, make_config, monkeypatch, capsys):
    from slurm_ddp.launch import main

    rd = _run_dir(tmp_path, make_config, {"slurm": {"nodes": 2, "tasks_per_node": 1}})
    for k in [k for k in os.environ if k.startswith(("SLURM_", "TORCHELASTIC", "MASTER_"))]:
        monkeypatch.delenv(k)
    for k, v in synthetic_slurm_env(rank=1, nodes=2, tasks_per_node=1).items():
        monkeypatch.setenv(k, v)
    assert main(["--run-dir", str(rd), "--dry-run", "--", "python", "train.py"]) == 0
    torch_env = json.loads(capsys.readouterr().out)["torch_env"]
    assert (torch_env["RANK"], torch_env["LOCAL_RANK"], torch_env["NODE_RANK"], torch_env["WORLD_SIZE"]) == (
        "1",
        "0",
        "1",
        "2",
    )


def _no_torch_env(tmp_path: Path) -> dict:
    fake = tmp_path / "no-torch"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('torch is not importable on this login node')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(fake), env.get("PYTHONPATH", "")] if p)
    return env


@pytest.mark.parametrize("verb", ["render", "env"])
def test_render_and_explain_a_torchrun_command_job_without_torch(tmp_path, verb):
    argv = [
        sys.executable,
        "-m",
        "slurm_ddp",
        verb,
        str(OWN),
        "--set",
        "slurm.nodes=2",
        "--set",
        "slurm.launcher=torchrun",
    ]
    if verb == "env":
        argv += ["--explain", "--nodelist", "n[1-2]"]
    out = subprocess.run(argv, env=_no_torch_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    train_py = str(REPO / "examples" / "own_script" / "train.py")
    if verb == "render":
        assert '"$PYTHON" -m torch.distributed.run --nnodes=2 --nproc-per-node=2' in out.stdout
        # the script as submit would write it: train.py from the code snapshot of the default run directory
        snap = re.escape(f"{tmp_path}/runs/own-script/code/") + r"[0-9a-f]{16}/0/examples/own_script/train\.py"
        # the supervisor's step, printed after the script (its plan)
        assert re.search(f'--rank-log -- "\\$PYTHON" {snap} --epochs 5$', out.stdout, re.M), out.stdout
    else:
        assert "launcher: torchrun: one Slurm task per node" in out.stdout
        assert out.stdout.count(f"exec: PYTHON {train_py} --epochs 5") == 4
        assert "rank 3: local_rank=1/2 node=1 host=n2" in out.stdout


@pytest.mark.parametrize(
    "status, got_signal, finished, requeue, exit_code",
    [
        (128 + 12, True, False, True, PREEMPTED_EXIT_CODE),  # a plain script killed by the time-limit signal
        (1, True, False, True, PREEMPTED_EXIT_CODE),  # signalled, then failed: still the time limit
        (1, False, False, False, 1),  # a crash: never requeued
        (0, True, True, False, 0),  # it finished anyway
    ],
)
@pytest.mark.parametrize("command", [True, False], ids=["command", "worker"])
def test_the_rule_for_a_signalled_script(status, got_signal, finished, requeue, exit_code, command):
    if not command and status != PREEMPTED_EXIT_CODE:
        # the shared worker states a preemption itself (status 75 and its marker): a signal alone requeues nothing
        requeue, exit_code = False, status
    d = decide_requeue(
        exit_code=status,
        marker=None,
        job_id="5",
        restart_count=0,
        max_requeues=2,
        got_term=False,
        can_requeue=True,
        finished=finished,
        got_signal=got_signal,
        command=command,
    )
    assert (d.requeue, d.exit_code) == (requeue, exit_code), d.reason


def test_a_commands_status_0_is_its_finished(tmp_path):
    assert not mark_command_finished(tmp_path, exit_code=3, environ={})
    assert read_finished(tmp_path) is None
    assert mark_command_finished(tmp_path, exit_code=0, environ={"SLURM_JOB_ID": "9"})
    assert read_finished(tmp_path)["command"] is True and read_finished(tmp_path)["job_id"] == "9"
    assert not mark_command_finished(tmp_path, exit_code=0, environ={})  # written once


def test_a_requeue_signal_after_the_last_step_requeues_unless_the_script_marked_finished(tmp_path, monkeypatch):
    """The race the real-Slurm API-variant test (torchrun, signalled at the batch shell) lost under load: the
    requeue signal reached the ranks after their last ``should_stop()``, while they tore down. Their wrappers
    recorded it, so status 0 (or 1: torchrun exits 1 on a signal it handled) is no finish: the rule requeues,
    and the requeued start resumes at the end and is done with no rank ever stopped at a step. A script whose
    rank 0 calls ``preemption.mark_finished()`` once training ended is finished whatever arrives after."""
    from slurm_ddp import preemption
    from slurm_ddp.rundir import decide_requeue_here, record_rank_stop

    env = {"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": "0"}
    for rank in range(4):
        record_rank_stop(tmp_path, job_id="7", restart=0, rank=rank, signal="SIGUSR2", requeue=True)

    def decide(status: int):
        return decide_requeue_here(
            tmp_path,
            exit_code=status,
            max_requeues=3,
            got_term=False,
            can_requeue=True,
            environ=env,
            got_signal=True,
            command=True,
        )

    for status in (0, 1):
        assert not mark_command_finished(tmp_path, exit_code=status, environ=env, told_to_stop=True)
        d = decide(status)
        assert d.requeue and d.preempted and "before the run finished" in d.reason, d.reason
    monkeypatch.setenv("SLURM_DDP_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert preemption.mark_finished(epochs=3)
    for status in (0, 1):
        d = decide(status)
        assert not d.requeue and not d.preempted and "the run finished" in d.reason, d.reason
    assert decide(0).exit_code == 0


def test_preemption_api_in_a_process(tmp_path):
    """install → the signal sets the flag → should_stop (no group: the local flag) → exit_preempted
    writes rank 0's marker and exits 75, without interpreter teardown."""
    code = textwrap.dedent("""
        import os, signal
        from slurm_ddp import preemption
        preemption.install()
        assert preemption.should_stop() is False
        os.kill(os.getpid(), signal.SIGUSR1)  # SLURM_DDP_REQUEUE_SIGNAL=USR1
        assert preemption.should_stop() is True
        print("stopping", flush=True)
        preemption.exit_preempted(step=12)
        print("not reached")
    """)
    env = _clean_env(
        {"SLURM_DDP_REQUEUE_SIGNAL": "USR1", "SLURM_DDP_RUN_DIR": str(tmp_path), "SLURM_JOB_ID": "77", "RANK": "0"}
    )
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == PREEMPTED_EXIT_CODE, r.stdout + r.stderr
    assert r.stdout == "stopping\n"
    marker = read_preempted(tmp_path)
    assert marker is not None and (marker.job_id, marker.restart, marker.step, marker.signal) == (
        "77",
        0,
        12,
        "SIGUSR1",
    )


def test_should_stop_needs_install():
    from slurm_ddp import preemption

    preemption._reset_for_tests()
    with pytest.raises(RuntimeError, match="install"):
        preemption.should_stop()


# --------------------------------------------------------------------------- a lost peer (exit_if_peer_lost)
def test_peer_failures_are_told_from_other_errors():
    import torch.distributed as dist

    from slurm_ddp.worker.runtime import is_peer_failure

    lost = [
        dist.DistBackendError("NCCL communicator was aborted"),
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4711"),
        RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms for recv operation"),
        RuntimeError("Connection reset by peer"),
    ]
    other = [RuntimeError("CUDA out of memory"), ValueError("timeout must be positive"), KeyError("peer")]
    assert [is_peer_failure(e) for e in lost] == [True] * 4
    assert [is_peer_failure(e) for e in other] == [False] * 3


def test_exit_if_peer_lost_returns_for_any_other_error(tmp_path, monkeypatch):
    from slurm_ddp import preemption
    from slurm_ddp.rundir import PEER_LOST_VAR

    marker = tmp_path / "peer-lost.1.0.0"
    monkeypatch.setenv("SLURM_DDP_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(PEER_LOST_VAR, str(marker))
    saves = []
    assert preemption.exit_if_peer_lost(RuntimeError("CUDA out of memory"), 3, save=lambda: saves.append(3)) is None
    assert saves == [] and not marker.exists() and not list(tmp_path.rglob("*.claim"))


@pytest.mark.parametrize("run_dir", [True, False], ids=["run-dir", "no-run-dir"])
def test_exit_if_peer_lost_saves_marks_and_exits_1(tmp_path, run_dir):
    """A lost peer in a real process (no group): the save runs (with a run directory to claim it in),
    the peer-lost marker gets the rank's record, the process exits 1 without reaching the next line."""
    from slurm_ddp.rundir import PEER_LOST_VAR, read_jsonl, survivor_claim_path

    code = textwrap.dedent("""
        import sys
        from slurm_ddp import preemption
        def save():
            open(sys.argv[1], "a").write("saved\\n")
        try:
            raise RuntimeError("[pair.cc:534] Connection closed by peer [10.0.0.2]:4711\\nmore")
        except RuntimeError as e:
            preemption.exit_if_peer_lost(e, step=17, save=save)
        print("not reached")
    """)
    marker = tmp_path / "run" / "recovery" / "peer-lost.5.0.1"
    env = _clean_env({"RANK": "1", PEER_LOST_VAR: str(marker), "SLURMD_NODENAME": "n2"})
    if run_dir:
        env["SLURM_DDP_RUN_DIR"] = str(tmp_path / "run")
    saves = tmp_path / "saves"
    r = subprocess.run([sys.executable, "-c", code, str(saves)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == "", r.stdout + r.stderr
    [record] = read_jsonl(marker)
    assert (record["rank"], record["host"], record["step"]) == (1, "n2", 17), record
    assert record["error"] == "[pair.cc:534] Connection closed by peer [10.0.0.2]:4711"
    assert "slurm_ddp[rank 1]: a peer rank died or stopped responding after step 17" in r.stderr, r.stderr
    if run_dir:
        assert saves.read_text() == "saved\n" and "survivor save of step 17 done by this rank" in r.stderr
        assert survivor_claim_path(tmp_path / "run", env).read_text() == "committed\n"
    else:
        assert not saves.exists() and "no survivor save: SLURM_DDP_RUN_DIR is unset" in r.stderr, r.stderr


def test_the_survivor_claim_is_one_per_job_step():
    from slurm_ddp.rundir import PEER_LOST_VAR, survivor_claim_path

    marker = "/runs/a/recovery/peer-lost.42.1.2"
    assert str(survivor_claim_path("/runs/a", {PEER_LOST_VAR: marker})) == marker + ".save.claim"
    env = {"SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "1"}
    assert str(survivor_claim_path("/runs/a", env)) == "/runs/a/recovery/peer-lost.42.1.save.claim"
    assert survivor_claim_path("/runs/a", {}).name == "peer-lost.-.0.save.claim"
