"""A run's logs: which files there are (:func:`log_sources`), showing them once
(:func:`show_logs`) and following them across requeues until the run ends (:func:`follow_logs`).

Side effects: reads log files of a run directory (``logs/`` under the run directory, and the
per-task logs of submitit's folder); :func:`follow_logs` also asks for the run's state
(:mod:`.status`) on the polling schedule of :mod:`.poll` and sleeps between polls. Lines go to an injected
``write`` callable: where they end up (and what a closed pipe means) is the CLI's business.
Imports no torch.
"""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Pattern, Sequence, Tuple

from ..errors import UserError
from ..rundir import LOGS_DIR, SUBMITIT_DIR, batch_log_name, rank_log_name
from .poll import POLL, Poller, PollPolicy, ask_runs, run_events, status_key
from .runs import Run, read_run
from .slurm import Runner
from .status import RunStatus


def _name_pattern(name_of: Callable[[str], str], group: str) -> Pattern[str]:
    """A regex matching ``name_of(X)`` for every X that matches ``group`` (captured): it parses
    the log names that :mod:`slurm_ddp.rundir` builds, so the two cannot drift."""
    prefix, suffix = name_of("\0").split("\0")
    return re.compile(f"^{re.escape(prefix)}({group}){re.escape(suffix)}$")


# Rank N's log and the batch shell's, in LOGS_DIR (slurm_ddp.rundir names them); submitit
# writes ``JOBID_TASK_log.{out,err}`` in its folder ``submitit/JOBID/`` (its backend's choice).
_RANK_LOG = _name_pattern(rank_log_name, r"\d+")
_BATCH_LOG = _name_pattern(batch_log_name, r".+")
_SUBMITIT_LOG = re.compile(r"^(.+)_(\d+)_log\.(out|err)$")
_TIMESTAMP = re.compile(rb"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2})")


@dataclass(frozen=True)
class LogSource:
    """One log file and the label its lines get when ranks are interleaved."""

    label: str  #: "rank 0", "batch 1234"
    path: Path
    order: Tuple[int, int, str]  #: sort key: batch logs first, then ranks by number


def _job_order(text: str) -> Tuple[int, str]:
    m = re.match(r"(\d+)", text)
    return (int(m.group(1)) if m else 0, text)


def log_sources(run_dir: Path, rank: Optional[int] = None) -> List[LogSource]:
    """The log files of a run: each rank's log in ``LOGS_DIR`` (sbatch, local) or submitit's
    per-task logs, and (when ``rank`` is None) each batch shell's log. Existing files only."""
    run_dir = Path(run_dir)
    out: List[LogSource] = []
    logs = run_dir / LOGS_DIR
    if logs.is_dir():
        for p in logs.iterdir():
            m = _RANK_LOG.match(p.name)
            if m and (rank is None or int(m.group(1)) == rank):
                out.append(LogSource(f"rank {int(m.group(1))}", p, (1, int(m.group(1)), "")))
            b = _BATCH_LOG.match(p.name)
            if b and rank is None:
                n, s = _job_order(b.group(1))
                out.append(LogSource(f"batch {b.group(1)}", p, (0, n, s)))
    sub = run_dir / SUBMITIT_DIR
    if sub.is_dir():
        for p in sub.glob("*/*_log.*"):
            m = _SUBMITIT_LOG.match(p.name)
            if m and (rank is None or int(m.group(2)) == rank):
                n, s = _job_order(m.group(1))
                out.append(LogSource(f"rank {int(m.group(2))}", p, (1, int(m.group(2)), f"{n:012d}{s}.{m.group(3)}")))
    return sorted(out, key=lambda s: s.order)


def check_rank(run: Run, rank: int) -> None:
    """Raises ``UserError`` unless ``rank`` is one of the run's ranks."""
    if run.world_size:
        if not 0 <= rank < run.world_size:
            raise UserError(
                f"--rank {rank}: run {run.name!r} has {run.world_size} rank"
                f"{'s' if run.world_size > 1 else ''} (0..{run.world_size - 1})"
            )
        return
    known = sorted({int(s.label.split()[1]) for s in log_sources(run.path) if s.label.startswith("rank ")})
    if rank not in known:
        raise UserError(f"--rank {rank}: run {run.name!r} has logs of ranks {', '.join(map(str, known)) or 'none'}")


class _Tail:
    """New complete lines of one growing file; ``last_ts`` dates lines without a timestamp."""

    def __init__(self, source: LogSource, seq: int):
        self.source, self.seq = source, seq
        self.pos = 0
        self.partial = b""
        self.last_ts = b""

    def read(self, final: bool = False) -> List[Tuple[bytes, int, int, str]]:
        try:
            size = self.source.path.stat().st_size
        except OSError:
            return []
        if size < self.pos:  # replaced or truncated: start again
            self.pos, self.partial = 0, b""
        data = b""
        if size > self.pos:
            with open(self.source.path, "rb") as f:
                f.seek(self.pos)
                data = f.read(size - self.pos)
            self.pos += len(data)
        chunks = (self.partial + data).split(b"\n")
        self.partial = chunks.pop()
        if final and self.partial:
            chunks.append(self.partial)
            self.partial = b""
        out = []
        for i, raw in enumerate(chunks):
            m = _TIMESTAMP.match(raw)
            if m:
                self.last_ts = m.group(1).replace(b" ", b"T")
            out.append((self.last_ts, self.seq, i, raw.decode("utf-8", errors="replace").rstrip("\r")))
        return out


def _emit(
    lines: List[Tuple[bytes, int, int, str]], tails: Sequence[_Tail], write: Callable[[str], Any], prefix: bool
) -> None:
    # Ordered by timestamp; lines of one file keep their order (the sort is stable, and a
    # file's lines carry non-decreasing timestamps: undated lines inherit the one before).
    for _ts, seq, _, text in sorted(lines, key=lambda t: t[0]):
        write(f"[{tails[seq].source.label}] {text}\n" if prefix else text + "\n")


def show_logs(run: Run, rank: Optional[int], write: Callable[[str], Any]) -> int:
    """Write one rank's log (as is), or every rank's and batch shell's log interleaved by
    timestamp with a ``[rank N]`` / ``[batch JOB]`` prefix. Returns the number of lines.

    Raises ``UserError`` for an unknown rank or when there is no log yet.
    """
    if rank is not None:
        check_rank(run, rank)
    sources = log_sources(run.path, rank)
    if not sources:
        which = f"rank {rank}" if rank is not None else "any rank"
        raise UserError(
            f"no log of {which} in {run.path / LOGS_DIR} yet (the job has not started?); "
            "wait for it with: slurm-ddp logs RUN -f"
        )
    tails = [_Tail(s, i) for i, s in enumerate(sources)]
    lines = [ln for t in tails for ln in t.read(final=True)]
    _emit(lines, tails, write, prefix=rank is None)
    return len(lines)


def follow_logs(
    run_dir: Path,
    rank: Optional[int],
    write: Callable[[str], Any],
    run_cmd: Runner = subprocess.run,
    *,
    poll_s: float = 0.5,
    policy: PollPolicy = POLL,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    timeout_s: Optional[float] = None,
) -> RunStatus:
    """Write what the logs hold, then new lines as they are written, until the run ends (its
    state is final) or ``timeout_s`` passes; Ctrl-C (KeyboardInterrupt) propagates.

    The log files are read every ``poll_s`` seconds (files only: a growing log asks no scheduler).
    Slurm is asked about the run's state on ``ops.poll``'s schedule (``policy``, default
    :data:`~slurm_ddp.ops.poll.POLL`: 5 s after a change, doubling while nothing changes, up to 60 s;
    squeue(1) "PERFORMANCE"), and at once when the run directory shows an event (a new job record, the
    ``FINISHED`` marker: ``ops.poll.run_events``). Across requeues the rank logs are appended to and a
    new batch shell's log appears (both followed). Returns the last status read.
    """
    tails: Dict[Path, _Tail] = {}
    ordered: List[_Tail] = []
    start = clock()
    poller = Poller(policy, clock)
    seen = run_events([run_dir])
    status: Optional[RunStatus] = None
    while True:
        for s in log_sources(run_dir, rank):
            if s.path not in tails:
                t = _Tail(s, len(ordered))
                tails[s.path] = t
                ordered.append(t)
        done = False
        if poller.due():
            status = ask_runs([read_run(run_dir)], run_cmd)[0]
            poller.answered(status_key(status))
            done = status.final
        lines = [ln for t in ordered for ln in t.read(final=done)]
        _emit(lines, ordered, write, prefix=rank is None)
        if done or (timeout_s is not None and clock() - start >= timeout_s):
            assert status is not None
            return status
        sleep(poll_s)
        now = run_events([run_dir])
        if now != seen:  # a new job record, the FINISHED marker: ask now
            seen = now
            poller.poke()
