"""Scheduler load: the Slurm queries ``status``, ``wait``, ``logs -f`` and a 1,000-element sweep make per
minute, counted, against the rates docs/guides/operating.md ("Scheduler load") states.

    python benchmarks/bench_scheduler_load.py [--minutes 60] [--runs 100] [--elements 1000] [--sweep-minutes 10]

A count, not a timing: every verb runs against a simulated controller on a simulated clock
(tests/lib/sim_slurm.py: a ``Runner`` that answers ``scontrol show job``/``squeue``/``sacct`` as Slurm
22.05 does and records each call; time passes only when the verb sleeps), so an hour's wait takes
seconds and the counts are exact and the same on every run (one round is enough; there is nothing to
interleave). Each job pends 117 s, runs ``--minutes`` minutes, then completes; rank 0 writes the
``FINISHED`` marker as it ends, and (a single run) its log grows every 10 s. The row "job fails" has a job
that fails instead, leaving no marker: its end is seen by a question, not a file. The sweep's jobs run
``--sweep-minutes`` (10): each of its questions reads every element's directory (about 1 s of CPU for
1,000), so re-enacting the old 5 s loop for an hour would take long. The controller keeps an ended job for
``MinJobAge`` (300 s); accounting is on.

Rows: ``status RUN`` and ``status SWEEP`` (one call each: queries per call); ``Run.wait``, ``logs -f``,
``wait_all`` of ``--runs`` runs and ``Sweep.wait`` of ``--elements`` elements, each as it is now (the
``ops.poll`` policy: one batched question per tick, 5 s doubling to 60 s while nothing changes) and as it
was before (commit 06bbb88: one ``scontrol`` per run every 5 s, ``logs -f`` every 2 s; the same loops,
re-enacted here). "per min" is over the whole wait; "steady" over the second half of the job's running
minutes; "stated" is the documented rate; the ratio is now ÷ before; "late s" is the seconds from the
jobs' end to the wait's return (before / now). Prints the table; asserts nothing
but exits 1 when a measured rate is above its stated one.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from lib.sim_slurm import SimClock, SimJob, SimSlurm, write_run, write_sweep  # noqa: E402

from slurm_ddp import api  # noqa: E402
from slurm_ddp.ops import poll  # noqa: E402
from slurm_ddp.ops import slurm as ops_slurm  # noqa: E402
from slurm_ddp.ops.logs import follow_logs  # noqa: E402
from slurm_ddp.ops.overview import status_report  # noqa: E402
from slurm_ddp.ops.runs import read_run  # noqa: E402
from slurm_ddp.ops.status import run_status  # noqa: E402
from slurm_ddp.ops.sweeps import read_sweep, sweep_status  # noqa: E402
from slurm_ddp.rundir import FINISHED_NAME  # noqa: E402

PENDING_S = 117.0  # so that the end falls between two of the old 5 s questions
#: The rates docs/guides/operating.md states ("Scheduler load"), queries per minute of a wait (per call
#: for status): (over the whole wait, steady state while the job runs).
STATED = {
    "status RUN (per call)": (2.0, None),
    "status SWEEP (per call)": (1.0, None),
    "Run.wait": (2.0, 1.0),
    "Run.wait, job fails": (2.0, 1.0),
    "logs -f": (2.0, 1.0),
    "wait_all": (2.0, 1.0),
    "Sweep.wait": (2.0, 1.0),
}


class World:
    """A simulated controller with ``n`` runs (or one sweep of ``n`` elements) that pend, run, complete."""

    def __init__(self, root: Path, n: int, minutes: float, sweep: bool = False, fails: bool = False) -> None:
        self.clock = SimClock()
        self.sim = SimSlurm(self.clock)
        end = PENDING_S + minutes * 60
        self.end_s, self.steady = end, (PENDING_S + minutes * 30, end)  # the second half of its running time
        timeline = [(0.0, "PENDING", "Priority", "0:0"), (PENDING_S, "RUNNING", "None", "0:0")]
        timeline.append((end, "FAILED", "NonZeroExitCode", "1:0") if fails else (end, "COMPLETED", "None", "0:0"))
        if sweep:
            self.sweep: Optional[Path] = root / "sweep"
            self.dirs = write_sweep(self.sweep, "5000", n)
            ids = [f"5000_{i}" for i in range(n)]
        else:
            self.sweep = None
            self.dirs = [write_run(root / f"run{i}", str(1000 + i)) for i in range(n)]
            ids = [str(1000 + i) for i in range(n)]
        for jid, d in zip(ids, self.dirs):
            self.sim.add(SimJob(jid, self.sweep or d, list(timeline)))
            if not fails:  # rank 0 writes the marker as it ends; a job that fails leaves none
                self.clock.at(end, functools.partial(_append, d / FINISHED_NAME, '{"step": 100}\n'))
        if n == 1:  # rank 0's log grows every 10 s while it runs (what logs -f follows)
            log = self.dirs[0] / "logs" / "rank-0.log"
            log.write_text("")
            for t in range(int(PENDING_S), int(end), 10):
                self.clock.at(float(t), functools.partial(_append, log, f"step {t}\n"))

    def rates(self) -> Tuple[float, float, int, float]:
        """(queries per minute over the wait, per minute in the steady window, queries in all, seconds from
        the jobs' end to the wait's return)."""
        total, wall = self.sim.count(), max(self.clock.now, 1.0) / 60
        a, b = self.steady
        steady = sum(1 for t, _ in self.sim.calls if a <= t < b) / ((b - a) / 60)
        return total / wall, steady, total, self.clock.now - self.end_s


def _append(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def before_loop(world: World, ask: Callable[[], bool], every_s: float) -> None:
    """The loops as of commit 06bbb88: ask, stop when ``ask()`` says it ended, else sleep ``every_s``."""
    while not ask():
        world.clock.sleep(every_s)


def ended_all(world: World) -> bool:
    """Each run's own Run.wait asked about it (no short cut: every waiter asks)."""
    return all([api._ended(run_status(read_run(d), world.sim)) for d in world.dirs])


def wait_once(name: str, variant: str, w: World) -> None:
    """Run the wait ``name`` as it is ``now`` or was ``before`` against the world ``w``, to its end."""
    ops_slurm.RETRY = ops_slurm.RetryPolicy(sleep=w.clock.sleep)
    sim, clock, sleep, d = w.sim, w.clock, w.clock.sleep, w.dirs[0]
    if name == "logs -f":
        if variant == "before":  # follow_logs asked run_status every 2 s
            before_loop(w, lambda: run_status(read_run(d), sim).final, 2.0)
        else:
            follow_logs(d, 0, lambda s: None, sim, clock=clock, sleep=sleep)
    elif w.sweep is not None:
        sw = w.sweep
        if variant == "before":  # Sweep.wait: sweep_status every 5 s
            before_loop(w, lambda: all(api._ended(s) for _, s in sweep_status(read_sweep(sw), sim).elements), 5.0)
        else:
            poll.wait_sweep(sw, api._ended, run_cmd=sim, clock=clock, sleep=sleep)
    elif variant == "before":  # Run.wait per run (wait_all did not exist: one waiter per run)
        before_loop(w, lambda: ended_all(w), 5.0)
    else:
        poll.wait_runs(w.dirs, api._ended, check=api._check_dependency, run_cmd=sim, clock=clock, sleep=sleep)


def measure(name: str, args: argparse.Namespace, root: Path) -> List[Tuple[str, str, float, float, int, float]]:
    """Rows (variant, verb, per min, steady, total, seconds late) of one verb, before and now."""
    rows = []
    sweep, fails = name == "Sweep.wait", name == "Run.wait, job fails"
    n = args.elements if sweep else args.runs if name == "wait_all" else 1
    minutes = args.sweep_minutes if sweep else args.minutes
    for variant in ("before", "now"):
        w = World(root / f"{name}-{variant}".replace(" ", "_").replace(",", ""), n, minutes, sweep, fails)
        wait_once(name, variant, w)
        rows.append((variant, name, *w.rates()))
    return rows


def one_call(root: Path, args: argparse.Namespace) -> List[Tuple[str, int]]:
    """Queries of one ``status`` call on a running run and on a running 1,000-element sweep."""
    out = []
    w = World(root / "status-run", 1, args.minutes)
    w.clock.sleep(PENDING_S + 60)
    status_report(w.dirs[0], w.sim)
    out.append(("status RUN (per call)", w.sim.count()))
    w = World(root / "status-sweep", args.elements, args.minutes, sweep=True)
    w.clock.sleep(PENDING_S + 60)
    assert w.sweep is not None
    status_report(w.sweep, w.sim)
    out.append(("status SWEEP (per call)", w.sim.count()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="how long each job runs (simulated)")
    ap.add_argument("--runs", type=int, default=100, help="runs of the wait_all row")
    ap.add_argument("--elements", type=int, default=1000, help="elements of the sweep rows")
    ap.add_argument(
        "--sweep-minutes",
        type=float,
        default=10.0,
        help="how long the sweep's jobs run (each question reads the 1,000 element directories: "
        "about 1 s of CPU, so the old 5 s loop over an hour would take minutes to re-enact)",
    )
    args = ap.parse_args()
    t0 = time.monotonic()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="bench-scheduler-load-") as tmp:
        root = Path(tmp)
        print(f"jobs pend {PENDING_S:g} s, run {args.minutes:g} min, then complete; queries per minute")
        head = ("verb", "before", "", "now", "", "now/before", "stated", "", "queries", "late s")
        sub = ("", "per min", "steady", "per min", "steady", "", "per min", "steady", "now", "before/now")
        fmt = "{:<26} {:>8} {:>7} {:>8} {:>7} {:>10} {:>8} {:>7} {:>8} {:>11}"
        print(fmt.format(*head))
        print(fmt.format(*sub))
        for name, n in one_call(root, args):
            stated = STATED[name][0]
            bad += n > stated
            print(fmt.format(name, "", "", n, "", "", f"{stated:g}", "", n, ""))
        for name in ("Run.wait", "Run.wait, job fails", "logs -f", "wait_all", "Sweep.wait"):
            (_, _, b_min, b_st, _, b_late), (_, _, n_min, n_st, n_all, n_late) = measure(name, args, root)
            s_min, s_st = STATED[name]
            bad += n_min > s_min or (s_st is not None and n_st > s_st)
            label = name + (f" ({args.runs} runs)" if name == "wait_all" else "")
            label += f" ({args.elements}, {args.sweep_minutes:g} min)" if name == "Sweep.wait" else ""
            row = (f"{b_min:.2f}", f"{b_st:.2f}", f"{n_min:.2f}", f"{n_st:.2f}", f"{n_min / b_min:.3f}")
            late = f"{b_late:.0f} / {n_late:.0f}"
            print(fmt.format(label, *row, f"{s_min:g}", f"{s_st:g}" if s_st is not None else "", n_all, late))
    print(f"({time.monotonic() - t0:.0f} s of real time)")
    if bad:
        print(f"{bad} measured rate(s) above the stated one", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
