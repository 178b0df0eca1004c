"""The private Slurm sandbox is a real cluster: nodes, network, preemption, clean stop.

Every wait has its own timeout: a job Slurm cannot place pends forever.
Timings are printed (run with ``-s`` to see them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from lib import missing_prerequisite, wait_for

import slurm_ddp
from slurm_ddp.errors import SandboxUnavailable
from slurm_ddp.sandbox import SlurmSandbox, check_prerequisites
from slurm_ddp.testing import sandbox_unavailable

pytestmark = pytest.mark.slurm

REPO = Path(slurm_ddp.__file__).resolve().parent.parent


def sbatch(sb: SlurmSandbox, *args: str) -> str:
    out = sb.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def scancel(sb: SlurmSandbox, *job_ids: str) -> None:
    if job_ids:
        sb.run(["scancel", *job_ids], capture_output=True, timeout=30)


def lines(path: Path) -> list:
    try:
        return path.read_text().split("\n")[:-1]  # complete lines only
    except FileNotFoundError:
        return []


def not_running(pid: int) -> bool:
    """True if ``pid`` is gone or a zombie (exited, merely not yet reaped by its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


def netns_list() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True, timeout=10).returncode == 0


def test_prerequisites_and_status(slurm_sandbox):
    assert check_prerequisites() == []
    st = slurm_sandbox.status()
    assert st["up"] is True
    assert [n["name"] for n in st["nodes"]] == ["n1", "n2"]
    # the fixture hands every test the session's cluster settled: no job queued, every node idle
    assert all(n["state"] == "idle" for n in st["nodes"]), st["nodes"]
    assert set(st["pids"]) == {"munged", "slurmctld", "slurmd-n1", "slurmd-n2"}
    assert Path(st["slurm_conf"]).is_file()
    assert slurm_sandbox.env["SLURM_CONF"] == st["slurm_conf"]
    out = slurm_sandbox.run(["sinfo", "-h", "-o", "%P %D"], capture_output=True, text=True, timeout=30)
    assert out.stdout.split("\n")[:2] == ["debug* 2", "high 2"], out.stdout


def test_srun_runs_on_two_named_nodes(slurm_sandbox):
    t0 = time.monotonic()
    out = slurm_sandbox.run(["srun", "-N2", "-n2", "hostname"], capture_output=True, text=True, timeout=60)
    print(f"\nsrun -N2 -n2 hostname: {time.monotonic() - t0:.2f} s")
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split()) == ["n1", "n2"]


TCP_PAIR = textwrap.dedent(
    """
    import os, socket, sys, time
    rank, port = int(os.environ["SLURM_PROCID"]), int(sys.argv[1])
    if rank == 0:
        srv = socket.create_server(("0.0.0.0", port))
        srv.settimeout(30)
        conn, peer = srv.accept()
        msg = conn.recv(100).decode()
        conn.sendall(b"pong from " + socket.gethostname().encode())
        print(f"rank0 on {socket.gethostname()} got {msg!r} from {peer[0]}", flush=True)
    else:
        end = time.time() + 30
        while True:
            try:
                conn = socket.create_connection(("n1", port), timeout=5)
                break
            except OSError:
                if time.time() > end:
                    raise
                time.sleep(0.05)
        conn.sendall(b"ping from " + socket.gethostname().encode())
        print(f"rank1 got {conn.recv(100).decode()!r}", flush=True)
    """
)


def test_tcp_connection_between_nodes(slurm_sandbox, tmp_path):
    script = tmp_path / "tcp_pair.py"
    script.write_text(TCP_PAIR)
    port = random.randrange(30000, 31000)
    out = slurm_sandbox.run(
        ["srun", "-N2", "-n2", sys.executable, str(script), str(port)],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    n2_addr = slurm_sandbox.node_addr("n2")
    assert f"rank0 on n1 got 'ping from n2' from {n2_addr}" in out.stdout, out.stdout
    assert "rank1 got 'pong from n1'" in out.stdout, out.stdout


GLOO = textwrap.dedent(
    """
    import os, socket, torch, torch.distributed as dist
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    x = torch.tensor([rank + 1.0])
    dist.all_reduce(x)
    print(f"{socket.gethostname()} rank {rank} sum {x.item()}", flush=True)
    dist.destroy_process_group()
    """
)


def test_gloo_all_reduce_across_nodes(slurm_sandbox, tmp_path):
    if importlib.util.find_spec("torch") is None:
        missing_prerequisite("torch is not installed")
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    env = dict(os.environ, MASTER_ADDR="n1", MASTER_PORT=str(random.randrange(31000, 32000)))
    out = slurm_sandbox.run(
        ["srun", "-N2", "-n2", sys.executable, str(script)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split("\n")[:-1]) == ["n1 rank 0 sum 3.0", "n2 rank 1 sum 3.0"], out.stdout


def test_sbatch_job_starts_quickly(slurm_sandbox, tmp_path):
    stamp = tmp_path / "started"
    t0 = time.time()
    job = sbatch(slurm_sandbox, "-N1", "-o", str(tmp_path / "%j.out"), "--wrap", f"date +%s.%N > {stamp}")
    try:
        wait_for(lambda: lines(stamp), 30, f"job {job} to start")
        latency = float(lines(stamp)[0]) - t0
        print(f"\nsbatch -> job start: {latency:.2f} s")
        assert latency < 15
    finally:
        scancel(slurm_sandbox, job)


def test_high_partition_preempts_and_requeues_debug_job(slurm_sandbox, tmp_path):
    starts, hi = tmp_path / "victim_starts", tmp_path / "high_started"
    victim = sbatch(
        slurm_sandbox, "-p", "debug", "-N2", "--exclusive", "--requeue", "-o", str(tmp_path / "victim-%j.out"),
        "--wrap", f'echo "${{SLURM_RESTART_COUNT:-0}} $(date +%s.%N)" >> {starts}; exec sleep 300',
    )  # fmt: skip
    jobs = [victim]
    try:
        wait_for(lambda: lines(starts), 30, "the debug job to start")
        t_submit = time.time()
        high = sbatch(
            slurm_sandbox, "-p", "high", "-N1", "-o", str(tmp_path / "high-%j.out"),
            "--wrap", f"date +%s.%N > {hi}; sleep 1",
        )  # fmt: skip
        jobs.append(high)
        wait_for(lambda: lines(hi), 30, "the high-priority job to start (preempting)")
        t_high = float(lines(hi)[0])
        restarted = wait_for(
            lambda: [ln for ln in lines(starts) if ln.split()[0] == "1"], 60, "the preempted job to run again"
        )
        t_restart = float(restarted[0].split()[1])
        print(
            f"\npreemption: high job started {t_high - t_submit:.2f} s after sbatch; "
            f"victim re-ran (SLURM_RESTART_COUNT=1) {t_restart - t_high:.2f} s after that"
        )
        show = slurm_sandbox.run(["scontrol", "show", "job", victim], capture_output=True, text=True, timeout=30)
        assert "Restarts=1" in show.stdout, show.stdout
    finally:
        scancel(slurm_sandbox, *jobs)


def test_second_sandbox_coexists_and_down_leaves_nothing(slurm_sandbox, tmp_path):
    sb = SlurmSandbox(tmp_path / "second", nodes=1)
    t0 = time.monotonic()
    sb.up(timeout_s=60)
    t_up = time.monotonic() - t0
    try:
        st = sb.status()
        assert st["up"] and st["controller"] != slurm_sandbox.status()["controller"]
        assert sb.bridge != slurm_sandbox.bridge
        with pytest.raises(SandboxUnavailable, match="in use"):  # same id twice: refused, nothing harmed
            SlurmSandbox(tmp_path / "clash", nodes=1, name=sb.id).up(timeout_s=30)
        assert sb.status()["up"]
        out = sb.run(["srun", "-N1", "hostname"], capture_output=True, text=True, timeout=60)
        assert out.stdout.split() == ["n1"], out.stderr
        # a running job: down() must also stop its slurmstepd and task
        sbatch(sb, "-o", str(tmp_path / "%j.out"), "--wrap", "srun sleep 300")

        def queue() -> str:
            return sb.run(["squeue", "-h", "-o", "%i %t %r"], capture_output=True, text=True, timeout=30).stdout

        # a deadline for a loaded machine (once 30 s in CI's other-Debian tier under load): the event is the state
        wait_for(lambda: "R" in [line.split()[1] for line in queue().splitlines() if line.split()], 120,
                 "the job to run", diag=queue)  # fmt: skip
        job_pids = subprocess.run(
            ["ip", "netns", "pids", sb.netns("n1")], capture_output=True, text=True, timeout=10
        ).stdout.split()
        assert len(job_pids) > 1  # slurmd + stepds + tasks
        pids = list(st["pids"].values())
    finally:
        t0 = time.monotonic()
        sb.down()
        t_down = time.monotonic() - t0
    print(f"\nsandbox (1 node) up {t_up:.2f} s, down {t_down:.2f} s")
    assert all(not_running(p) for p in pids + [int(p) for p in job_pids])
    assert sb.netns("n1") not in netns_list() and sb.netns("ctl") not in netns_list()
    assert not link_exists(sb.bridge)
    assert not Path(st["short_dir"]).exists()
    sb.down()  # twice is fine
    assert sb.status()["up"] is False
    assert slurm_sandbox.status()["up"]  # the other sandbox was not touched


def test_load_attaches_from_another_process_and_stops_it(tmp_path):
    problems = check_prerequisites()
    if problems:
        sandbox_unavailable("; ".join(problems))
    root = tmp_path / "detached"
    start = (
        "import sys; from slurm_ddp.sandbox import SlurmSandbox; "
        f"SlurmSandbox({str(root)!r}, nodes=2, name='ldt{os.getpid() % 10000}').up(timeout_s=60)"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", start], check=True, timeout=90, env=env, cwd=str(tmp_path))
    t_up = time.monotonic() - t0
    sb = SlurmSandbox.load(root)
    try:
        st = sb.status()
        assert st["up"], st
        assert json.loads((root / "sandbox.json").read_text())["pids"] == st["pids"]
        out = sb.run(["srun", "-N2", "-n2", "hostname"], capture_output=True, text=True, timeout=60)
        assert sorted(out.stdout.split()) == ["n1", "n2"], out.stderr
    finally:
        t0 = time.monotonic()
        SlurmSandbox.load(root).down()
        t_down = time.monotonic() - t0
    print(f"\nsandbox (2 nodes, started by a subprocess) up {t_up:.2f} s incl. python start, down {t_down:.2f} s")
    assert all(not_running(p) for p in st["pids"].values())
    assert all(sb.netns(n) not in netns_list() for n in ("ctl", "n1", "n2"))
    assert not link_exists(sb.bridge)
    assert SlurmSandbox.load(root).status()["up"] is False
