"""Crash safety of checkpoint saves: kill -9 the writing process at many points of a save, check that
a valid latest checkpoint always exists and that resuming from it works.

    python benchmarks/crash_points.py                  # 140+ kill points, ~1-2 minutes on 2 cores
    python benchmarks/crash_points.py --points 300 --mib 64

Each kill point is a fresh checkpoint directory holding one committed checkpoint (the "old" one) and a
forked child process that saves a "new" one with ``CheckpointManager`` (~34 MB of tensors by default,
shaped like model + AdamW state) and is killed with SIGKILL:

- *time-spread* kills: after a delay spread from 0 to the measured duration of that save, so they
  land in torch.save's serialization, in the hashing/writing of the data, in the fsyncs, between the
  renames, in the manifest and in the retention that deletes the old checkpoint;
- *event* kills: the child kills itself (SIGKILL, itself) right after its k-th ``os.fsync``/``os.replace``/
  ``os.unlink``, for every k, so each window between two steps of the commit protocol is hit for sure.

Three kinds of save rotate: ``next-step`` (step 2 over step 1, ``keep_last=1``, so the old one is
pruned at the end), ``same-step`` (step 1 saved again with different contents, as a preemption save
right after a periodic one of the same step can be) and ``async`` (step 2 through ``AsyncCheckpointer``:
snapshot, background thread, ``wait()``).

After every kill, in this (the parent) process: ``latest()`` must exist, load with
``torch.load(weights_only=True)``, be the old or the new step, and hold exactly the tensors saved for
it (never a mix); then a resumed run saves the next checkpoint into the same directory (leftover temp
files and all), which must become the latest and load back exactly.

The children are forked from this process (torch already imported, states already built; a child runs
torch on one thread, since the parent's OpenMP pool does not survive fork), so a kill point costs
~0.1-0.3 s instead of a Python start.
``tests/local/test_crash_safety.py`` runs the same harness with fewer points.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import select
import shutil
import signal
import statistics
import struct
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from slurm_ddp.checkpoint import AsyncCheckpointer, CheckpointManager

CHILD_TIMEOUT_S = 120
EVENTS = ("fsync", "replace", "unlink")  # the os calls of the commit protocol a child can die right after


def make_state(step: int, variant: int = 0, mib: int = 40) -> dict:
    """A training-like state of roughly ``mib`` MiB: model weights + AdamW moments, a few small entries.

    Tensors of 4 MiB (a Linear(1024, 1024)), one of ``mib / 5`` MiB (written in several pieces).
    """
    g = torch.Generator().manual_seed(1000 * step + variant)
    n_layers = max(1, (mib * 4 // 5) // 12)  # weight + exp_avg + exp_avg_sq, 4 MiB each
    big = max(1, mib // 5) << 18
    model = {}
    for i in range(n_layers):
        model[f"layers.{i}.weight"] = torch.randn(1024, 1024, generator=g)
        model[f"layers.{i}.bias"] = torch.randn(1024, generator=g)
    model["embedding.weight"] = torch.randn(big, generator=g)
    names = list(model)
    opt_state = {
        i: {
            "step": torch.tensor(float(step)),
            "exp_avg": torch.randn(t.shape, generator=g) * 0.1,
            "exp_avg_sq": torch.rand(t.shape, generator=g),
        }
        for i, t in enumerate(model.values())
        if t.dim() == 2
    }
    return {
        "model": model,
        "optimizer": {"state": opt_state, "param_groups": [{"lr": 1e-3, "params": list(range(len(names)))}]},
        "step": step,
        "epoch": step // 7,
        "rng": {"torch": g.get_state(), "python": [3, variant, step]},
        "variant": variant,
    }


def nbytes(state: Any) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(nbytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(nbytes(v) for v in state)
    return 0


def same(a: Any, b: Any) -> bool:
    """Exact equality of nested states (tensors bitwise, with dtype and shape)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@dataclass(frozen=True)
class Scenario:
    name: str
    old: Tuple[int, int]  #: (step, variant) committed before the child runs
    new: Tuple[int, int]  #: (step, variant) the child saves
    mode: str = "sync"  #: "sync": CheckpointManager.save; "async": AsyncCheckpointer.save + wait
    keep_last: int = 1


SCENARIOS = (
    Scenario("next-step", old=(1, 0), new=(2, 0)),
    Scenario("same-step", old=(1, 0), new=(1, 1)),
    Scenario("async", old=(1, 0), new=(2, 0), mode="async"),
)


@dataclass
class Outcome:
    scenario: str
    how: str  #: "t=12.3ms" or "after fsync #2"
    killed: bool  #: False when the save had finished before the kill
    found: Optional[str] = None  #: "old" / "new": what latest() held
    problem: Optional[str] = None  #: None when everything checked out
    duration: Optional[float] = None  #: the save's duration when it finished
    events: List[str] = field(default_factory=list)


def _child(directory: Path, sc: Scenario, state: dict, wfd: int, kill_at_event: Optional[int], trace: bool) -> None:
    """In the forked child: save, optionally dying right after the k-th protocol event. Never returns."""
    status = 0
    try:
        # The parent's OpenMP pool does not survive fork(): a parallel torch op (the async snapshot's
        # copies) would wait forever for its threads. One thread: torch runs those ops inline.
        torch.set_num_threads(1)
        events: List[str] = []
        if kill_at_event is not None or trace:
            for name in EVENTS:
                real = getattr(os, name)

                def hooked(*a, _real=real, _name=name, **k):
                    r = _real(*a, **k)
                    events.append(_name)
                    if kill_at_event is not None and len(events) == kill_at_event + 1:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return r

                setattr(os, name, hooked)
        mgr = CheckpointManager(directory, keep_last=sc.keep_last)
        os.write(wfd, b"s")
        t0 = time.perf_counter()
        if sc.mode == "async":
            w = AsyncCheckpointer(mgr)
            w.save(state, sc.new[0])
            w.close()  # the write, then the writer thread joined: no thread left to interpreter teardown
        else:
            mgr.save(state, sc.new[0])
        dt = time.perf_counter() - t0
        payload = json.dumps({"duration": dt, "events": events}).encode()
        os.write(wfd, struct.pack("<I", len(payload)) + payload)
    except BaseException:
        traceback.print_exc()
        status = 3
    finally:
        os._exit(status)


def _read_exact(fd: int, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = os.read(fd, n - len(out))
        if not chunk:
            break
        out += chunk
    return out


def run_child(
    directory: Path,
    sc: Scenario,
    state: dict,
    kill_after: Optional[float] = None,
    kill_at_event: Optional[int] = None,
    trace: bool = False,
) -> Tuple[bool, Optional[dict]]:
    """Fork a child that saves ``state`` into ``directory``; kill it ``kill_after`` s after it starts.

    Returns ``(killed, report)``: report = {"duration", "events"} when the save finished.
    """
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        _child(directory, sc, state, w, kill_at_event, trace)
    os.close(w)
    try:
        started = os.read(r, 1)
        if started and kill_after is not None:
            time.sleep(kill_after)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not select.select([r], [], [], CHILD_TIMEOUT_S)[0]:
            os.kill(pid, signal.SIGKILL)
            raise RuntimeError(f"the saving child did not finish in {CHILD_TIMEOUT_S} s (killed)")
        head = _read_exact(r, 4)
        report = json.loads(_read_exact(r, struct.unpack("<I", head)[0])) if len(head) == 4 else None
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    if not killed and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        raise RuntimeError(f"the saving child failed (status {status:#x}); its traceback is above")
    if killed:
        report = None
    return killed, report


class Harness:
    """States built once; one kill point = fresh directory, old checkpoint, child, kill, checks."""

    def __init__(self, root: Path, mib: int = 40):
        self.root = Path(root)
        self.mib = mib
        self._states: Dict[Tuple[int, int], dict] = {}
        self._n = 0
        self.durations: Dict[str, float] = {}

    def state(self, step: int, variant: int = 0) -> dict:
        key = (step, variant)
        if key not in self._states:
            self._states[key] = make_state(step, variant, self.mib)
        return self._states[key]

    def _fresh(self, sc: Scenario) -> Path:
        self._n += 1
        d = self.root / f"kill-{self._n:04d}"
        CheckpointManager(d, keep_last=sc.keep_last).save(self.state(*sc.old), sc.old[0])
        return d

    def measure(self, sc: Scenario, reps: int = 3) -> Tuple[float, List[str]]:
        """Median duration of an uninterrupted save of this scenario, and its protocol events."""
        times, events = [], []
        for _ in range(reps):
            d = self._fresh(sc)
            killed, report = run_child(d, sc, self.state(*sc.new), trace=True)
            assert not killed and report is not None
            times.append(report["duration"])
            events = report["events"]
            shutil.rmtree(d)
        self.durations[sc.name] = statistics.median(times)
        return self.durations[sc.name], events

    def kill_point(
        self,
        sc: Scenario,
        kill_after: Optional[float] = None,
        kill_at_event: Optional[int] = None,
        event_names: Optional[List[str]] = None,
    ) -> Outcome:
        d = self._fresh(sc)
        if kill_after is not None:
            how = f"t={kill_after * 1e3:.1f}ms"
        else:
            name = event_names[kill_at_event] if event_names else "event"
            how = f"after {name} #{kill_at_event}"
        killed, report = run_child(d, sc, self.state(*sc.new), kill_after=kill_after, kill_at_event=kill_at_event)
        out = Outcome(sc.name, how, killed, duration=report and report["duration"])
        out.found, out.problem = self.check(d, sc)
        shutil.rmtree(d, ignore_errors=True)
        return out

    def check(self, d: Path, sc: Scenario) -> Tuple[Optional[str], Optional[str]]:
        """What the latest checkpoint is ("old"/"new") and what is wrong (None: nothing)."""
        mgr = CheckpointManager(d, keep_last=sc.keep_last)
        info = mgr.latest()
        if info is None:
            return None, "no valid checkpoint after the kill"
        try:
            loaded = mgr.load(info)  # torch.load(weights_only=True)
        except Exception as e:
            return None, f"latest checkpoint (step {info.step}) does not load: {e}"
        found = None
        for label, (step, variant) in (("new", sc.new), ("old", sc.old)):
            if info.step == step and same(loaded, self.state(step, variant)):
                found = label
                break
        if found is None:
            return None, (
                f"latest checkpoint (step {info.step}, variant {loaded.get('variant')}) holds neither "
                f"the old nor the new state"
            )
        # Resume: a restarted run loads it (above) and saves its next checkpoint into the same directory.
        nxt = max(sc.old[0], sc.new[0]) + 1
        try:
            mgr.save(self.state(nxt), nxt)
            info = mgr.latest()
            if info is None or info.step != nxt or not same(mgr.load(info), self.state(nxt)):
                return found, f"after resuming, the next checkpoint (step {nxt}) is not the latest or differs"
        except Exception as e:
            return found, f"after resuming, saving the next checkpoint failed: {e}"
        return found, None


def plan(
    h: Harness, n_time: int, scenarios=SCENARIOS, event_scenarios=None, reps: int = 3, spread: float = 1.0
) -> List[dict]:
    """The kill points: every protocol event of every scenario (or of ``event_scenarios``), then
    ``n_time`` kills at delays from 0 to ``spread`` x the measured save durations (median of ``reps``)."""
    points: List[dict] = []
    durations = {}
    for sc in scenarios:
        dur, events = h.measure(sc, reps)
        durations[sc.name] = dur
        if event_scenarios is None or sc.name in event_scenarios:
            points += [{"sc": sc, "kill_at_event": k, "event_names": events} for k in range(len(events))]
    per = [n_time // len(scenarios) + (1 if i < n_time % len(scenarios) else 0) for i in range(len(scenarios))]
    for sc, n in zip(scenarios, per):
        for i in range(n):
            points.append({"sc": sc, "kill_after": spread * durations[sc.name] * i / max(1, n - 1)})
    return points


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--points",
        type=int,
        default=120,
        help="time-spread kill points (default 120); the "
        "event kill points (every step of the commit protocol, per kind of save) come on top",
    )
    p.add_argument(
        "--spread",
        type=float,
        default=1.0,
        help="time-spread kills at 0..SPREAD x the measured save duration (default 1.0)",
    )
    p.add_argument("--mib", type=int, default=40, help="size of the saved state in MiB (default 40)")
    p.add_argument("--dir", type=Path, help="where to write (default: a fresh directory in the current one)")
    p.add_argument("-v", "--verbose", action="store_true", help="one line per kill point")
    args = p.parse_args(argv)
    # latest() warns about every damaged checkpoint it skips: expected here, shown with -v
    logging.basicConfig(level=logging.WARNING if args.verbose else logging.ERROR, format="    %(message)s")
    base = args.dir or Path.cwd()
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".crash-points-", dir=base))
    t0 = time.perf_counter()
    try:
        h = Harness(root, args.mib)
        size = nbytes(h.state(1)) / 1e6
        points = plan(h, args.points, spread=args.spread)
        print(
            f"state {size:.0f} MB; save durations (median of 3): "
            + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in h.durations.items())
        )
        outcomes = []
        for pt in points:
            o = h.kill_point(
                pt["sc"],
                kill_after=pt.get("kill_after"),
                kill_at_event=pt.get("kill_at_event"),
                event_names=pt.get("event_names"),
            )
            outcomes.append(o)
            if args.verbose or o.problem:
                print(
                    f"  {o.scenario:9s} {o.how:22s} {'killed' if o.killed else 'finished first'}: "
                    f"latest = {o.found}{'' if o.problem is None else '  PROBLEM: ' + o.problem}"
                )
        bad = [o for o in outcomes if o.problem]
        unloadable = [o for o in outcomes if o.found is None]
        killed = sum(o.killed for o in outcomes)
        for sc in SCENARIOS:
            mine = [o for o in outcomes if o.scenario == sc.name]
            print(
                f"  {sc.name:9s}: {len(mine)} points, killed mid-save {sum(o.killed for o in mine)}, "
                f"latest old {sum(o.found == 'old' for o in mine)}, new {sum(o.found == 'new' for o in mine)}"
            )
        print(
            f"kill points tried: {len(outcomes)}, unloadable latest checkpoints: {len(unloadable)} "
            f"(killed mid-save: {killed}, the others finished first; other problems: {len(bad) - len(unloadable)}; "
            f"{time.perf_counter() - t0:.0f} s)"
        )
        return 1 if bad else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
