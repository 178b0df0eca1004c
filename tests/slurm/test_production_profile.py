"""The real-Slurm tier on the sandbox's production profile (``SlurmSandbox(profile="production")``).

What most clusters run and the session sandbox does not: ``proctrack/cgroup``, ``task/cgroup,task/affinity``
with cores, RAM and devices constrained in cgroup v1, memory as a consumable resource (``CR_Core_Memory``,
``DefMemPerCPU``), ``PrologFlags=Contain``, a private ``/tmp`` per job (``job_container/tmpfs``) and
``SlurmUser=slurm``, and jobs of an ordinary user (``slurm_ddp.sandbox.users.JOB_USER``). One 2-node
sandbox with accounting for the module (its root and the run directories outside ``/tmp``, which the jobs
do not share; ``SlurmdTimeout=10`` for the lost node):

* each task sees the constraints (memory, CPU, devices, /tmp) as the profile sets them;
* a rank of the job user's that allocates more than ``slurm.mem_gb`` is killed by the memory cgroup: Slurm
  says so (srun, slurmstepd, sacct's OUT_OF_MEMORY step), and so do the batch log and ``slurm-ddp status``,
  naming the rank, its node, the memory per node and ``slurm.mem_gb``;
* the digits job under those plugins, submitted by the job user, whose uid its batch shell, srun and ranks
  run as: the batch-shell time-limit signal, then partition preemption, each with a checkpoint, Slurm's
  requeue and the resume at the exact step; then its node lost and the job requeued onto the other node,
  resumed from the newest periodic checkpoint; CPU binding by Slurm's masks, and its memory limit as the
  cgroup holds it;
* a rank's GPU identity under ConstrainDevices, in a job of the job user's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import pytest
from lib import wait_for
from lib.slurm_jobs import (
    DIGITS_JOB,
    REPO,
    DigitsJob,
    cli,
    committed_steps,
    logs,
    record_timing,
    submit_digits,
    train_steps,
)

from slurm_ddp.rundir import read_preempted
from slurm_ddp.sandbox import SlurmSandbox
from slurm_ddp.sandbox.cgroups import cgroup_v1_problems
from slurm_ddp.sandbox.users import SandboxUser, ensure_user, reachable_path, reachable_prefix
from slurm_ddp.testing import missing_prerequisite, running_sandbox

pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("production_profile")]  # one sandbox for the module

OWN_SCRIPT_JOB = REPO / "examples" / "own_script" / "job.yaml"
# A lost node is DOWN after two failed pings, ~9-18 s with these (test_node_loss; ~80 s with Slurm's defaults)
SLURMD_TIMEOUT_S = 10
MESSAGE_TIMEOUT_S = 2


@dataclass(frozen=True)
class JobUser:
    """The unprivileged account the module's jobs are submitted as, the interpreter it runs and where its jobs
    see the checkout (``REPO`` itself, or a read-only bind of it: ``users.reachable_path``)."""

    user: SandboxUser
    python: str
    sandbox: SlurmSandbox
    checkout: Path

    def seen(self, path: str | Path) -> Path:
        """``path`` as the user's jobs see it: below :attr:`checkout` when it lies in the checkout."""
        p = Path(path).resolve()
        return self.checkout / p.relative_to(REPO) if p.is_relative_to(REPO) else Path(path)

    def submit_kw(self) -> Dict[str, Any]:
        """``submit_digits`` keywords: this interpreter and the digits example where the jobs see it, run as
        the user (:meth:`run_kw`)."""
        return {"python": self.python, "job": self.seen(DIGITS_JOB), **self.run_kw()}

    def run_kw(self) -> Dict[str, Any]:
        """``SlurmSandbox.run``/``cli`` keywords that run a command as the user in its home, with its login
        variables, the sandbox's Slurm client settings and ``PYTHONPATH``'s entries in the checkout where the
        jobs see them (:meth:`seen`; sbatch exports it to the job, whose /tmp is its own)."""
        env = self.user.env(self.sandbox.client_env())
        if env.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.pathsep.join(str(self.seen(e)) for e in env["PYTHONPATH"].split(os.pathsep))
        return {**self.user.popen_kwargs(), "env": env}

    def run_dir(self, request: pytest.FixtureRequest) -> Path:
        """A run directory for the test, below the user's home (``slurm-ddp submit`` makes it, as them)."""
        return self.user.home / re.sub(r"\W", "_", request.node.name)


@dataclass(frozen=True)
class Production:
    """The module's sandbox and the unprivileged account its jobs are submitted as."""

    sandbox: SlurmSandbox
    job_user: JobUser


@pytest.fixture(scope="module")
def production() -> Iterator[Production]:
    """A 2-node production-profile sandbox (2 CPUs, 2 emulated GPUs and 2000 MB a node) rooted under
    /var/tmp: its jobs have a private /tmp, so nothing they read (slurm.conf, run directories) may be there.
    Its job user: ``users.JOB_USER`` (useradd'ed once per machine) with a home beside the sandbox, and this
    interpreter's environment and the checkout where their jobs can reach them (each mounted read-only there,
    before the nodes start, when it lies below a directory they cannot search, as /root, or below /tmp, as a
    clone in /tmp does: ``users.reachable_path``)."""
    problems = cgroup_v1_problems()
    if problems:
        missing_prerequisite("; ".join(problems))
    root = Path(tempfile.mkdtemp(prefix="slurm-ddp-prod-", dir="/var/tmp"))
    root.chmod(0o755)  # slurmctld runs as SlurmUser=slurm and reads its config below
    try:
        user = ensure_user(root / "home")
        with reachable_prefix(user, root / "python") as prefix, reachable_path(
            user, REPO, root / "checkout"
        ) as checkout, running_sandbox(
            root / "sandbox", nodes=2, cpus_per_node=2, gpus_per_node=2, profile="production", accounting=True,
            slurmd_timeout_s=SLURMD_TIMEOUT_S, message_timeout_s=MESSAGE_TIMEOUT_S,
        ) as sb:  # fmt: skip
            subtrees = [Path(d) for d in sb._state["cgroups"].values()]
            yield Production(sb, JobUser(user, str(prefix / "bin" / Path(sys.executable).name), sb, checkout))
        # down() killed what was left in the nodes' cgroups and removed the subtrees
        assert [d for d in subtrees if d.exists()] == [], "the nodes' cgroup subtrees outlived the sandbox"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def production_sandbox(production: Production) -> SlurmSandbox:
    return production.sandbox


@pytest.fixture(scope="module")
def job_user(production: Production) -> JobUser:
    return production.job_user


def job_processes(sandbox: SlurmSandbox, node: str) -> Dict[int, Tuple[str, str]]:
    """PID → (command line, ``Uid:`` of proc(5): real, effective, saved, filesystem) of every process on
    ``node`` but Slurm's own, which run as root: ``slurmd``, ``slurmstepd`` and the extern step's placeholder
    (``PrologFlags=Contain``: slurmstepd's ``sleep 100000000``)."""
    out = {}
    for pid in sandbox.node_pids(node):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            uid = re.search(r"^Uid:\s+(.*)$", Path(f"/proc/{pid}/status").read_text(), re.M)
        except OSError:
            continue
        if comm not in ("slurmd", "slurmstepd") and cmd != "sleep 100000000 " and uid:
            out[pid] = (cmd, " ".join(uid.group(1).split()))
    return out


# For each emulated GPU: "allowed" when open() gets past the devices cgroup (ENXIO: a placeholder device has
# no driver), "denied" when the cgroup refuses it (EPERM).
GPU_PROBE = """
import errno, os, sys
for k in (0, 1):
    try:
        os.close(os.open(f"{sys.argv[1]}/nvidia{k}", os.O_RDONLY))
        verdict = "opened"
    except OSError as e:
        verdict = {errno.ENXIO: "allowed", errno.EPERM: "denied"}.get(e.errno, errno.errorcode[e.errno])
    print(f"gpu{k}={verdict}", end=" ")
"""


def test_the_profile_is_in_effect(production_sandbox: SlurmSandbox) -> None:
    """Each task: a private, empty /tmp; the job's memory cgroup at its --mem, in its node's own subtree; a
    cpuset and an affinity of the one CPU Slurm gave it; only the GPU it was given (ConstrainDevices)."""
    sb = production_sandbox
    probe = (
        f"{sys.executable} -c '{GPU_PROBE}' {sb.gpu_dir}; echo host=$(hostname) tmp=$(ls -A /tmp | wc -l)"
        " bind=$SLURM_CPU_BIND cpus=$(grep Cpus_allowed_list /proc/self/status | cut -f2)"
        " mem=$(cat /sys/fs/cgroup/memory/slurm_$(hostname)/uid_0/job_$SLURM_JOB_ID/memory.limit_in_bytes)"
        " cg=$(grep :memory: /proc/self/cgroup | cut -d: -f3)"
    )
    r = sb.run(
        ["srun", "-N2", "-n2", "--mem=300M", "--gpus-per-node=1", "sh", "-c", probe],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    tasks = {m["host"]: m for m in (dict(re.findall(r"(\w+)=(\S*)", line)) for line in r.stdout.splitlines())}
    assert sorted(tasks) == ["n1", "n2"], r.stdout
    for node, t in tasks.items():
        assert t["tmp"] == "0" and t["mem"] == str(300 << 20), t
        assert re.fullmatch(r"quiet,mask_cpu:0x[12]", t["bind"]) and t["cpus"] in ("0", "1"), t
        # the task's cgroup: task_<its node-local id> (22.05), task_<its global id> (24.11, 26.05)
        assert re.search(rf"/slurm-ddp-{sb.id}/{node}/slurm_{node}/uid_0/job_\d+/step_0/task_\d+$", t["cg"]), t
        assert sorted([t["gpu0"], t["gpu1"]]) == ["allowed", "denied"], t
    r = sb.run(
        ["srun", "-N1", "-n1", sys.executable, "-c", GPU_PROBE, str(sb.gpu_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.stdout.split() == ["gpu0=denied", "gpu1=denied"], r.stdout + r.stderr  # no GPU asked for


def submit_own_script(sandbox: SlurmSandbox, run_dir: Path, *sets: str, as_user: JobUser | None = None) -> DigitsJob:
    python = as_user.python if as_user else sys.executable
    job = as_user.seen(OWN_SCRIPT_JOB) if as_user else OWN_SCRIPT_JOB
    cmd = [python, "-m", "slurm_ddp", "submit", str(job), "--run-dir", str(run_dir)]
    for s in ("slurm.time=00:05:00", *sets):
        cmd += ["--set", s]
    r = sandbox.run(cmd, capture_output=True, text=True, timeout=120, **(as_user.run_kw() if as_user else {}))
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"submitted job (\d+)", r.stdout)
    assert m, r.stdout
    return DigitsJob(sandbox, run_dir, m.group(1))


# Rank 1 touches 1 GiB (bytes of b"x", not calloc's untouched zero pages); rank 0 allocates nothing.
GREEDY_RANK = (
    "import os; x = b'x' * (1 << 30) if os.environ['RANK'] == '1' else b''; print('rank', os.environ['RANK'], 'alive')"
)


def test_oom_kill_is_named(production_sandbox: SlurmSandbox, job_user: JobUser, request: pytest.FixtureRequest) -> None:
    """Submitted by the unprivileged job user: the cgroup's kill, Slurm's words and the project's note."""
    run_dir = job_user.run_dir(request)
    job = submit_own_script(
        production_sandbox,
        run_dir,
        "slurm.nodes=2",
        "slurm.tasks_per_node=1",
        "slurm.mem_gb=0.4",
        f"train.command=[python, -c, {GREEDY_RANK!r}]",
        as_user=job_user,
    )
    state = job.wait_ended(timeout_s=120)
    assert job.show().get("MinMemoryNode") == "410M", job.show()  # round(0.4 x 1024) MB per node: render's --mem
    assert state in ("FAILED", "OUT_OF_MEMORY"), job.diag()
    assert job.restarts() == 0 and not (run_dir / "FINISHED").exists(), job.diag()
    batch = job.batch_log()
    # Slurm's own evidence: srun (in the batch log) names the task and its node; slurmstepd writes the memory
    # cgroup's OOM events to the killed task's stderr (its rank log; 26.05: after a timestamp, not its name)
    assert re.search(r"srun: error: n2: task 1: Out Of Memory", batch), job.diag()
    rank1 = job.rank_log(1)
    assert re.search(
        rf"(slurmstepd-n2:|\[[\d:.T-]+\]) error: Detected \d+ oom[-_]kill event(\(s\))? in StepId={job.id}\.0", rank1
    ), job.diag()
    assert "rank 0 alive" in job.rank_log(0) and "rank 1 alive" not in rank1, job.diag()

    def steps() -> dict:  # accounting: each step's state, once slurmdbd has them
        r = production_sandbox.run(
            ["sacct", "-n", "-P", "-j", job.id, "-o", "JobID,State"], capture_output=True, text=True, timeout=30
        )
        return dict(line.split("|", 1) for line in r.stdout.split())

    def with_the_step() -> dict:
        rows = steps()
        return rows if f"{job.id}.0" in rows else {}

    rows = wait_for(with_the_step, 30, "sacct's row of the step", job.diag)
    assert rows[f"{job.id}.0"] == "OUT_OF_MEMORY" and rows[job.id] == "FAILED", rows
    # The project names it (rundir.oom): the rank, its node, the memory the job had per node, the key to raise;
    # in the batch log, and in `slurm-ddp status` from the start's end record
    named = (
        r"out of memory: the memory cgroup killed rank 1 on n2 \(srun: Out Of Memory; 1 oom-kill event\(s\) in "
        rf"step {job.id}\.0\); the job had 410 MB per node; raise slurm\.mem_gb"
    )
    assert re.search(named, batch), job.diag()
    r = cli(production_sandbox, "status", str(run_dir))
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^state:\s+FAILED\b", r.stdout, re.M) and re.search(rf"^note:\s+{named}$", r.stdout, re.M), (
        r.stdout
    )


# The digits job's steps: enough that a preemption (sbatch, scheduling, SIGTERM: ~1 s) lands before the resumed
# job ends (~70 steps/s on 2 busy cores; 120 steps ended in ~1 s on an idle machine, test_node_loss)
DIGITS_STEPS = 800
EVERY_STEPS = 50  # checkpoint.every_steps: bounds the steps the lost node costs


def test_digits_time_limit_signal_preemption_and_node_loss_resume(
    production_sandbox: SlurmSandbox, job_user: JobUser, request: pytest.FixtureRequest
) -> None:
    """The session tier's batch-shell signal, partition-preemption and lost-node cases (test_slurm_jobs,
    test_node_loss) in one job, under cgroups, memory and a private /tmp, submitted by the unprivileged job
    user: its processes run as that uid, every file of its run is theirs, each stop resumes at the exact
    step and the lost node's restart from the newest periodic checkpoint."""
    sb, uid = production_sandbox, job_user.user.uid
    run_dir = job_user.run_dir(request)
    job = submit_digits(
        sb, run_dir, "slurm.nodes=1", "slurm.tasks_per_node=2", "slurm.partition=debug",
        f"train.max_steps={DIGITS_STEPS}", f"checkpoint.every_steps={EVERY_STEPS}", **job_user.submit_kw(),
    )  # fmt: skip
    job.wait_step(30)
    assert job.show()["UserId"] == f"{job_user.user.name}({uid})", job.show()
    # the batch shell, srun, the ranks (and their helpers): all the job user's, real to filesystem uid
    procs = job_processes(sb, job.show()["BatchHost"])
    assert {u for _, u in procs.values()} == {f"{uid} {uid} {uid} {uid}"}, procs
    assert sum("slurm_ddp.worker" in cmd for cmd, _ in procs.values()) >= 2, procs
    t_stop = time.time()
    job.scancel("--batch", "--signal=USR2")  # what Slurm does signal_delay_s before the time limit
    wait_for(lambda: job.restarts() >= 1, 90, "the job to requeue itself", job.diag)

    def resumed() -> List[str]:
        return re.findall(r"resumed from checkpoint of step (\d+)", job.rank_log(0))

    wait_for(lambda: len(resumed()) == 1, 120, "the requeued job to resume", job.diag)
    record_timing("production profile: time-limit signal → resumed", time.time() - t_stop)
    t_stop = time.time()
    # Every CPU of the digits job's node: the scheduler preempts it (PreemptMode=REQUEUE: SIGTERM), which may
    # start again at once on the other node
    hi = sb.run(
        ["sbatch", "--parsable", "--partition=high", "--nodes=1", "--ntasks-per-node=2",
         f"--nodelist={job.show()['BatchHost']}", f"--output={run_dir.parent}/high-%j.out", "--wrap", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert hi.returncode == 0, hi.stderr
    wait_for(lambda: len(resumed()) == 2, 120, "the preempted job to resume", job.diag)
    record_timing("production profile: preemption → resumed", time.time() - t_stop)
    # then its node is lost (slurmd and every process of it SIGKILLed): NODE_FAIL, requeued onto the other
    # node, resumed from the newest checkpoint committed there (checkpoint.every_steps) at or after the loss
    preempted_at = int(resumed()[1])
    wait_for(lambda: max(committed_steps(run_dir), default=0) > preempted_at, 120, "a periodic checkpoint", job.diag)
    victim = job.show()["BatchHost"]
    try:
        newest = committed_steps(run_dir)[-1]
        t_stop = time.time()
        assert sb.kill_node(victim), f"no process in {victim}'s namespace"
        wait_for(lambda: len(resumed()) == 3, 180, "the job to resume after the node loss", job.diag)
        record_timing("production profile: node lost → resumed", time.time() - t_stop)
        finished = job.wait_finished(timeout_s=240)
        assert finished and job.state() == "COMPLETED" and job.restarts() == 3, job.diag()
        assert job.show()["BatchHost"] != victim, job.show()
    finally:
        if job.state() not in ("COMPLETED", "FAILED", "CANCELLED"):
            job.scancel()
        sb.restart_node(victim)
    rank0 = job.rank_log(0)
    stops = re.findall(r"stopping for preemption \((\w+)\) after step (\d+)", rank0)
    assert [sig for sig, _ in stops] == ["SIGUSR2", "SIGTERM"], (stops, job.diag())
    assert resumed()[:2] == [step for _, step in stops], (resumed(), stops, job.diag())  # each from its stop's
    assert int(resumed()[2]) >= newest, (resumed(), newest)
    marker = read_preempted(run_dir)  # the last stop's, by rank 0 of the job's restart 1
    assert marker and (marker.restart, str(marker.step), marker.signal) == (1, stops[-1][1], "SIGTERM"), marker
    # the train events (every train.log_every steps) rise but once, where the steps since `newest` came again
    steps = train_steps(run_dir)
    again = [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]]
    assert len(again) <= 1 and steps[-1] == DIGITS_STEPS, steps
    assert not again or steps[again[0]] > int(resumed()[2]) >= steps[again[0] - 1] - 2 * EVERY_STEPS, steps
    assert "received SIGUSR2; forwarding it to the ranks" in job.batch_log()
    # task/affinity binds each rank to its own CPU, as Slurm's masks say; the job has DefMemPerCPU x 2 CPUs
    for rank in (0, 1):
        assert f"rank {rank}/2 local_rank {rank}/2" in job.rank_log(rank), logs(run_dir)
    assert job.show().get("MinMemoryCPU") == "1000M", job.show()
    # every file of the run directory is the user's: submit's, Slurm's logs, the ranks' checkpoints and metrics
    written = [p for p in run_dir.rglob("*") if p.is_file()]
    assert written and {p.stat().st_uid for p in written} == {uid}, {str(p): p.stat().st_uid for p in written}


# Each rank: what slurm_ddp decides (python -m slurm_ddp.devices' record) and which emulated GPU the devices
# cgroup lets it open (ENXIO: allowed, a placeholder without a driver; EPERM: denied; anything else, e.g. the
# job user's EACCES, fails the probe), as one JSON line.
GPU_IDENTITY = """
import errno, json, os, sys
from slurm_ddp.devices import probe_record, read_devices_constrained
record = probe_record(os.environ, read_devices_constrained(os.environ))
allowed = []
for k in (0, 1):
    try:
        os.close(os.open(f"{sys.argv[1]}/nvidia{k}", os.O_RDONLY))
    except OSError as e:
        if e.errno == errno.EPERM:
            continue
        if e.errno != errno.ENXIO:
            raise
    allowed.append(str(k))
print("GPU-IDENTITY " + json.dumps({**record, "allowed": allowed}, sort_keys=True), flush=True)
"""


def test_gpu_identity_under_constrain_devices(
    production_sandbox: SlurmSandbox, job_user: JobUser, request: pytest.FixtureRequest
) -> None:
    """``--gpus-per-task=1`` on 2 tasks of one node under ConstrainDevices, submitted by the job user: Slurm
    renumbers both CUDA_VISIBLE_DEVICES and SLURM_STEP_GPUS to 0; each rank still names the GPU the devices
    cgroup lets it open (the per_task binding over SLURM_JOB_GPUS of the batch host), never rank 1 as GPU 0."""
    run_dir = job_user.run_dir(request)
    probe = job_user.user.home / "gpu_identity.py"
    probe.write_text(GPU_IDENTITY)
    probe.chmod(0o644)
    job = submit_own_script(
        production_sandbox,
        run_dir,
        "slurm.nodes=1",
        "slurm.tasks_per_node=2",
        "slurm.gpus_per_task=1",
        f"train.command=[python, {probe}, {production_sandbox.gpu_dir}]",
        as_user=job_user,
    )
    assert job.show()["UserId"].startswith(f"{job_user.user.name}("), job.show()
    assert job.wait_ended(timeout_s=120) == "COMPLETED", job.diag()
    records = {}
    for rank in (0, 1):
        m = re.search(r"GPU-IDENTITY (\{.*\})", job.rank_log(rank))
        assert m, job.diag()
        records[rank] = json.loads(m.group(1))
    # slurmd's --tres-bind: "gpu:per_task:1" (22.05), "gres/gpu:per_task:1" (24.11, 26.05; in .ci/other-debian's
    # chroots; the releases between were not tried)
    tres_bind = "gres/gpu:per_task:1" if production_sandbox.slurm_version() >= (24, 11) else "gpu:per_task:1"
    for r in records.values():
        assert (r["CUDA_VISIBLE_DEVICES"], r["SLURM_STEP_GPUS"], r["SLURMD_TRES_BIND"]) == ("0", "0", tres_bind), r
        assert r["devices_constrained"] is True and r["device"] == "cuda:0", r
        assert len(r["allowed"]) == 1 and r["physical"] == r["allowed"][0], r  # the cgroup's verdict
    assert sorted(r["physical"] for r in records.values()) == ["0", "1"], records
