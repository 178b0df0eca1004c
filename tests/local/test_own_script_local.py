"""``train.command`` on the local backend: examples/own_script with 2 gloo ranks, as the README runs it.

Covers: the plain script finishes every epoch on both ranks (FINISHED written by the local supervisor,
``runs``/``status`` report it); the preemption-API variant, given SIGUSR2 at the ``submit``
process, stops every rank after the same step with status 75 and a second ``submit`` resumes
mid-epoch and finishes; a crashing script ends with its status and no FINISHED; a command line and
``train.args`` numbers reach every rank as written (``5e-5``, ``1e3``), and resubmitting the run directory's
``config.yaml`` warns about nothing; the stop signal
the ranks agree on (SIGTERM to one rank only outweighs the requeue signal) is the one rank 0's
``PREEMPTED`` marker names and the requeue rule reads.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from lib import wait_process

from slurm_ddp import PREEMPTED_EXIT_CODE
from slurm_ddp.rundir import read_finished

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own_script"


def submit_cmd(job: str, run_dir: Path, *sets: str) -> list:
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(EXAMPLE / job), "--backend", "local"]
    cmd += ["--run-dir", str(run_dir)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def rank_log(run_dir: Path, rank: int) -> str:
    p = run_dir / "logs" / f"rank-{rank}.log"
    return p.read_text() if p.exists() else ""


def test_plain_script_two_ranks_finishes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = subprocess.run(
        submit_cmd("job.yaml", run_dir, "train.command=python train.py --epochs 3"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every rank of train.command exited with status 0" in r.stdout
    rec = read_finished(run_dir)
    assert rec is not None and rec["command"] is True, rec
    for rank in (0, 1):
        text = rank_log(run_dir, rank)
        assert f"[rank {rank}] done: 3 epochs" in text and f"local_rank {rank} of world 2" in text, text
    assert (run_dir / "snapshot.pt").exists()  # the script's own snapshot, in $SLURM_DDP_RUN_DIR
    status = subprocess.run(
        [sys.executable, "-m", "slurm_ddp", "status", str(run_dir)], capture_output=True, text=True, timeout=60
    )
    assert "finished:   yes, every rank of train.command exited with status 0" in status.stdout, status.stdout
    assert re.search(r"step:\s+96\n", status.stdout), status.stdout  # from the script's metrics.jsonl (3 × 32)
    again = subprocess.run(
        submit_cmd("job.yaml", run_dir, "train.command=python train.py --epochs 3"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and "already finished" in again.stderr, again.stderr


def test_api_variant_stops_every_rank_with_status_75_then_resumes(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = ("train.command=python train_preemptible.py --epochs 2 --sleep 6",)
    proc = subprocess.Popen(
        submit_cmd("job_preemptible.yaml", run_dir, *sets), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_process(proc, lambda: "epoch 0 loss" in rank_log(run_dir, 0), 240, "epoch 0", lambda: proc.stdout.read())
        proc.send_signal(signal.SIGUSR2)  # the local supervisor forwards it to every rank, as srun does
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The local supervisor returns 75 only when no rank failed (any status but 0/75 is a failure).
    assert proc.returncode == PREEMPTED_EXIT_CODE, out
    stops = [re.findall(r"stopping for preemption after epoch (\d+) batch (\d+)", rank_log(run_dir, r)) for r in (0, 1)]
    assert len(stops[0]) == 1 and stops[0] == stops[1], stops
    assert (run_dir / "PREEMPTED").read_text().split()[3] == "SIGUSR2"
    assert read_finished(run_dir) is None

    r = subprocess.run(submit_cmd("job_preemptible.yaml", run_dir, *sets), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    epoch, batch = stops[0][0]
    for rank in (0, 1):
        text = rank_log(run_dir, rank)
        assert f"at epoch {epoch} batch {batch}" in text and f"[rank {rank}] done: 2 epochs" in text, text


def test_a_crashing_script_fails_without_finishing(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = subprocess.run(
        submit_cmd("job.yaml", run_dir, "train.command=[python, -c, 'raise SystemExit(3)']"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 3, r.stdout + r.stderr
    assert "job failed with status 3" in r.stderr
    assert read_finished(run_dir) is None


def test_the_command_line_reaches_every_rank_as_written(tmp_path: Path) -> None:
    # issue 49: 5e-5 in train.command came back from the run directory's config.yaml as a float (exit 2)
    job = tmp_path / "job.yaml"
    job.write_text(
        "name: argv\nslurm: {nodes: 1, tasks_per_node: 2}\ntrain:\n"
        '  command: python -c "import sys; print(sys.argv[1:])" --learning_rate 5e-5 --adam_epsilon 1e-8\n'
        "  args: {lr: 1e3, weight_decay: 0.10, steps: 1_000}\n"
    )
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(job), "--backend", "local", "--run-dir", str(run_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    want = "['--learning_rate', '5e-5', '--adam_epsilon', '1e-8', '--lr=1e3', '--weight_decay=0.10', '--steps=1_000']"
    for rank in (0, 1):
        assert want in rank_log(run_dir, rank).splitlines(), rank_log(run_dir, rank)
    # resubmitting the run directory's config.yaml (what cancel suggests): no warning about its defaults
    again = subprocess.run(
        [*cmd[:4], str(run_dir / "config.yaml"), *cmd[5:]], capture_output=True, text=True, timeout=60
    )
    assert again.returncode == 0 and "already finished" in again.stderr, again.stderr
    assert "warning" not in again.stderr, again.stderr


# --------------------------------------------------------------------------- the agreed stop signal
#: Two gloo ranks using the preemption API; each touches ``ready-RANK`` once it has polled (handlers in).
_API_RANK = """
import os, sys, time
from pathlib import Path
import torch.distributed as dist
from slurm_ddp import preemption
preemption.install()
dist.init_process_group("gloo")
rank, step = dist.get_rank(), 0
while True:
    step += 1
    time.sleep(0.005)
    stop = preemption.should_stop()
    if step == 1:
        Path(sys.argv[1], f"ready-{rank}").touch()
    if stop:
        preemption.exit_preempted(step)
"""


@pytest.mark.parametrize(
    "sent, agreed, requeue",
    [
        ({1: signal.SIGTERM}, "SIGTERM", False),  # scancel of rank 1's node: a stop, not the requeue signal
        ({1: signal.SIGUSR2}, "SIGUSR2", True),  # the time-limit signal, to one rank only
        ({0: signal.SIGUSR2, 1: signal.SIGTERM}, "SIGTERM", False),  # SIGTERM outweighs the requeue signal
    ],
    ids=["term-to-rank-1", "usr2-to-rank-1", "usr2-to-0-term-to-1"],
)
def test_the_marker_names_the_signal_any_rank_got(tmp_path: Path, sent: dict, agreed: str, requeue: bool) -> None:
    """Real gloo ranks of the preemption API; the signal reaches only the ranks in ``sent``: every rank
    stops with 75, rank 0's PREEMPTED marker names the agreed signal (SIGTERM over SIGUSR2), and the
    requeue rule decides from it (a SIGTERM stop is not requeued)."""
    import socket

    from slurm_ddp.rundir import decide_requeue, read_preempted

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
        env.update(
            RANK=str(rank),
            WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SLURM_DDP_RUN_DIR=str(run_dir),
            SLURM_DDP_REQUEUE_SIGNAL="USR2",
            SLURM_JOB_ID="4711",
            SLURM_RESTART_COUNT="0",
        )
        cmd = [sys.executable, "-c", _API_RANK, str(tmp_path)]
        ranks.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        for rank, proc in enumerate(ranks):
            wait_process(proc, (tmp_path / f"ready-{rank}").exists, 120, f"rank {rank} to poll")
        # SIGTERM first: the ranks may agree between two sends, and the agreed signal must not depend on it
        for rank, sig in sorted(sent.items(), key=lambda kv: kv[1] != signal.SIGTERM):
            ranks[rank].send_signal(sig)
        outs = [p.communicate(timeout=120)[0] for p in ranks]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in ranks] == [PREEMPTED_EXIT_CODE] * 2, outs
    marker = read_preempted(run_dir)
    assert marker is not None and marker.signal == agreed, (marker, outs)
    decision = decide_requeue(
        exit_code=PREEMPTED_EXIT_CODE,
        marker=marker,
        job_id="4711",
        restart_count=0,
        max_requeues=3,
        got_term=False,  # the batch shell got nothing: only ranks were signalled
        can_requeue=True,
        command=True,
    )
    assert decision.preempted and decision.requeue is requeue, decision


# --------------------------------------------------------------------------- a lost peer (exit_if_peer_lost)
#: A gloo rank of a tiny DDP model that uses ``exit_if_peer_lost`` around its loop: ``save`` appends
#: ``RANK STEP`` to ``saves`` (the script's own snapshot); it touches ``ready-RANK`` after step 3.
_PEER_LOST_RANK = """
import sys, time
from datetime import timedelta
from pathlib import Path
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from slurm_ddp import preemption
out = Path(sys.argv[1])
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, done = dist.get_rank(), 0
torch.manual_seed(0)
ddp = DDP(torch.nn.Linear(4, 1))
def save():
    with open(out / "saves", "a") as f:
        f.write(f"{rank} {done}\\n")
try:
    while True:
        ddp(torch.randn(8, 4)).sum().backward()  # the gradient all-reduce: where a lost peer shows
        done += 1
        if done == 3:
            (out / f"ready-{rank}").touch()
        time.sleep(0.01)
except Exception as e:
    preemption.exit_if_peer_lost(e, step=done, save=save)
    raise
"""


def test_a_lost_peer_gets_one_survivor_save_and_the_peer_lost_marker(tmp_path: Path) -> None:
    """Three real gloo ranks; rank 1 is killed -9 mid-training. Both survivors' gradient all-reduce fails,
    ``exit_if_peer_lost`` classifies it as a lost peer: exactly one survivor runs the script's save (the
    step's claim beside the marker says ``committed``; the other survivor waited for it), each survivor appends its
    record (rank, last completed step) to the peer-lost marker, and both exit with status 1."""
    import json
    import socket

    from slurm_ddp.rundir import PEER_LOST_VAR, read_jsonl, survivor_claim_path

    run_dir, marker = tmp_path / "run", tmp_path / "run" / "recovery" / "peer-lost.1.0.0"
    run_dir.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = []
    for rank in range(3):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))}
        env.update(
            RANK=str(rank),
            WORLD_SIZE="3",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            SLURM_DDP_RUN_DIR=str(run_dir),
            **{PEER_LOST_VAR: str(marker)},
        )
        cmd = [sys.executable, "-c", _PEER_LOST_RANK, str(tmp_path)]
        ranks.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        for rank, proc in enumerate(ranks):
            wait_process(proc, (tmp_path / f"ready-{rank}").exists, 120, f"rank {rank}'s third step")
        ranks[1].kill()
        outs = {r: ranks[r].communicate(timeout=120)[0] for r in (0, 2)}
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [ranks[r].returncode for r in (0, 2)] == [1, 1], outs
    saves = (tmp_path / "saves").read_text().splitlines()
    assert len(saves) == 1, (saves, outs)
    saver, step = (int(x) for x in saves[0].split())
    assert saver in (0, 2) and step >= 3, saves
    assert f"slurm_ddp[rank {saver}]: survivor save of step {step} done by this rank" in outs[saver], outs[saver]
    other = 2 if saver == 0 else 0
    records = read_jsonl(marker)
    assert sorted(r["rank"] for r in records) == [0, 2], records
    # every survivor left the step it completed; one step apart at most (the failed all-reduce is one step)
    by_rank = {r["rank"]: r for r in records}
    assert by_rank[saver]["step"] == step and abs(by_rank[other]["step"] - step) <= 1, records
    assert all(r["error"] and r["host"] for r in records), json.dumps(records)
    # one claim for the job step, whatever step each survivor completed: the other waited for the outcome
    claim = survivor_claim_path(run_dir, {PEER_LOST_VAR: str(marker)})
    assert claim.parent == marker.parent and claim.read_text() == "committed\n"
    assert f"survivor save of step {by_rank[other]['step']} by another rank: committed" in outs[other], outs[other]
    assert not list(run_dir.glob("PREEMPTED")) and not (run_dir / "FINISHED").exists()
