"""A simulated Slurm controller on a simulated clock, for counting the questions the login-node verbs ask.

``SimSlurm`` is a ``Runner`` (``subprocess.run``'s signature, ``slurm_ddp.ops.slurm.Runner``) that answers
``scontrol show job -o``, ``squeue --jobs=… [--array]`` and ``sacct`` the way Slurm 22.05 does, from job
timelines on :class:`SimClock`'s time, and records every call (``calls``: time and argv). Time passes only
through ``SimClock.sleep``, so a wait of an hour takes milliseconds. A job the controller ended is kept
for ``min_job_age_s`` (slurm.conf(5) ``MinJobAge``, default 300 s), then only accounting knows it
(``accounting=False``: sacct answers as on a cluster without slurmdbd). ``fail(cmd, n)`` makes the next
``n`` calls of ``cmd`` answer a transient error ("Socket timed out").

``write_run`` / ``write_sweep`` write the run and sweep directories these jobs belong to (the files
``slurm_ddp.rundir`` reads: ``config.yaml``, ``jobs.jsonl``, ``sweep.json``, ``sweep-jobs.jsonl``).
Used by tests/unit/test_poll.py and benchmarks/bench_scheduler_load.py.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import yaml

from slurm_ddp.rundir import element_dir_name

FIELD_SEP = "\x1f"  # slurm_ddp.ops.slurm.FIELD_SEP: the squeue/sacct field separator the ops ask for


class SimClock:
    """Seconds since the simulation began; ``sleep`` is the only thing that moves it, and runs the
    callbacks ``at`` scheduled for the time it passes (a file the job writes at that time)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: List[float] = []
        self._at: List[Tuple[float, Callable[[], Any]]] = []

    def __call__(self) -> float:
        return self.now

    def at(self, t: float, fn: Callable[[], Any]) -> None:
        self._at.append((t, fn))

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += max(0.0, s)
        due = [a for a in self._at if a[0] <= self.now]
        self._at = [a for a in self._at if a[0] > self.now]
        for _t, fn in sorted(due, key=lambda a: a[0]):
            fn()


@dataclass
class SimJob:
    """One job: its states from the times given on (``timeline``: (t, state, reason, exit code)), and what
    identifies it (its directory: Command/WorkDir/StdOut lie in it)."""

    job_id: str
    work_dir: Path
    timeline: List[Tuple[float, str, str, str]]
    name: str = "digits"
    user: str = "root"
    restarts: int = 0

    def at(self, t: float) -> Tuple[str, str, str]:
        state, reason, exit_code = "PENDING", "Priority", "0:0"
        for t0, s, r, e in self.timeline:
            if t0 <= t:
                state, reason, exit_code = s, r, e
        return state, reason, exit_code

    def ended_at(self) -> Optional[float]:
        final = [t0 for t0, s, _r, _e in self.timeline if s in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")]
        return final[-1] if final else None


@dataclass
class SimSlurm:
    """The simulated controller (see the module docstring); call it as ``subprocess.run``."""

    clock: SimClock
    accounting: bool = True
    min_job_age_s: float = 300.0
    jobs: Dict[str, SimJob] = field(default_factory=dict)
    calls: List[Tuple[float, List[str]]] = field(default_factory=list)
    _fail: Dict[str, int] = field(default_factory=dict)

    def add(self, job: SimJob) -> SimJob:
        self.jobs[job.job_id] = job
        return job

    def fail(self, cmd: str, n: int = 1) -> None:
        self._fail[cmd] = self._fail.get(cmd, 0) + n

    def count(self, cmd: Optional[str] = None, since: float = 0.0) -> int:
        """Calls of ``cmd`` (every Slurm client: None) from time ``since`` on."""
        return sum(1 for t, argv in self.calls if t >= since and (cmd is None or argv[0] == cmd))

    def _known(self, job: SimJob) -> bool:
        end = job.ended_at()
        return end is None or self.clock.now < end + self.min_job_age_s

    def __call__(self, argv: Sequence[str], **_kw: Any) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append((self.clock.now, argv))
        cmd = argv[0]
        if self._fail.get(cmd):
            self._fail[cmd] -= 1
            return subprocess.CompletedProcess(argv, 1, "", f"{cmd}: error: Socket timed out on send/recv operation\n")
        if cmd == "scontrol" and argv[1:3] == ["show", "job"]:
            return self._scontrol(argv, argv[-1])
        if cmd == "squeue":
            return self._squeue(argv)
        if cmd == "sacct":
            return self._sacct(argv)
        return subprocess.CompletedProcess(argv, 1, "", f"{cmd}: not simulated\n")

    def _tasks(self, ids: Sequence[str], array: bool) -> List[SimJob]:
        out = []
        for jid in ids:
            if array:
                out += [j for k, j in self.jobs.items() if k.split("_", 1)[0] == jid and "_" in k]
            elif jid in self.jobs:
                out.append(self.jobs[jid])
        return out

    def _scontrol(self, argv: List[str], jid: str) -> subprocess.CompletedProcess[str]:
        job = self.jobs.get(jid)
        if job is None or not self._known(job):
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        state, reason, exit_code = job.at(self.clock.now)
        d = job.work_dir
        line = (
            f"JobId={jid} JobName={job.name} UserId={job.user}(0) JobState={state} Reason={reason} "
            f"Dependency=(null) Restarts={job.restarts} ExitCode={exit_code} NodeList=n1 "
            f"SubmitTime=2026-01-01T00:00:00 Command={d}/job.sbatch WorkDir={d} StdOut={d}/logs/batch-{jid}.out\n"
        )
        return subprocess.CompletedProcess(argv, 0, line, "")

    def _squeue(self, argv: List[str]) -> subprocess.CompletedProcess[str]:
        ids = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--jobs=")), [])
        jobs = [j for j in self._tasks(ids, "--array" in argv) if self._known(j)]
        if ids and not jobs:
            return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
        lines = []
        for j in jobs:
            state, reason, _ = j.at(self.clock.now)
            f = [j.job_id, state, reason, "n1", j.user, "2026-01-01T00:00:00", j.name, str(j.work_dir)]
            lines.append(FIELD_SEP.join([*f, f"{j.work_dir}/job.sbatch"]) + "\n")
        return subprocess.CompletedProcess(argv, 0, "".join(lines), "")

    def _sacct(self, argv: List[str]) -> subprocess.CompletedProcess[str]:
        if not self.accounting:
            return subprocess.CompletedProcess(argv, 1, "", "sacct: error: Slurm accounting storage is disabled\n")
        ids = next((a.split("=", 1)[1].split(",") for a in argv if a.startswith("--jobs=")), [])
        lines = []
        for jid in ids:
            for j in self._tasks([jid], "_" not in jid and any(k.startswith(f"{jid}_") for k in self.jobs)):
                state, _reason, exit_code = j.at(self.clock.now)
                f = [j.job_id, state, exit_code, "n1", j.user, "2026-01-01T00:00:00", "", j.name, str(j.work_dir)]
                lines.append(FIELD_SEP.join(f) + "\n")
        return subprocess.CompletedProcess(argv, 0, "".join(lines), "")


def write_run(path: Path, job_id: str, name: str = "digits", finished: bool = False) -> Path:
    """A run directory whose one job is ``job_id`` (a record as ``submit`` writes it, without identity fields:
    checked by its directory)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "logs").mkdir(exist_ok=True)
    cfg = {"name": name, "slurm": {"nodes": 1, "tasks_per_node": 1}, "train": {"task": "t:T", "max_steps": 100}}
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    with open(path / "jobs.jsonl", "a") as f:
        f.write(json.dumps({"backend": "sbatch", "job_id": job_id, "time": 1_700_000_000.0}) + "\n")
    if finished:
        (path / "FINISHED").write_text('{"step": 100}\n')
    return path


def write_sweep(path: Path, array_id: str, n: int, name: str = "lr") -> List[Path]:
    """A sweep directory of ``n`` elements, one array job ``array_id`` (element ``i`` is ``ARRAY_i``);
    returns the element directories."""
    path.mkdir(parents=True, exist_ok=True)
    elements = [{"index": i, "label": str(i), "values": {"train.lr": i}} for i in range(n)]
    (path / "sweep.json").write_text(json.dumps({"name": name, "keys": ["train.lr"], "elements": elements}))
    with open(path / "sweep-jobs.jsonl", "w") as f:
        f.write(json.dumps({"backend": "sbatch", "job_id": array_id, "offset": 0, "time": 1_700_000_000.0}) + "\n")
    dirs = []
    for i in range(n):
        d = write_run(path / element_dir_name(i, n), f"{array_id}_{i}", name=f"{name}-{i}")
        dirs.append(d)
    return dirs
