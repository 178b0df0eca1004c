"""Preemption soak: N interruptions of one run at random moments, compared with the uninterrupted run.

    python benchmarks/preemption_soak.py --n 100            # ~15-30 minutes on 2 busy cores
    python benchmarks/preemption_soak.py --n 5 --seed 3     # what tests/local/test_preemption_soak.py runs

Local backend (2 gloo ranks on this machine, through ``slurm-ddp submit --backend local``, the launcher
that stands in for srun). The digits job (``benchmarks/soak_task.py``: the digits task plus handshake
hooks that are inert unless the harness arms them) with ``log_every=1``, ``eval_every=50``,
``checkpoint.every_steps=10`` (async), ``keep_last=2``, random augmentation loaded by two DataLoader workers
(``num_workers=2``), and enough steps
(``100·N + 500``) that the run cannot finish before its N-th interruption.

Each interruption is one ``submit`` of the same run directory that is stopped by one of

- ``usr2-ranks``: SIGUSR2 to every rank (``scancel --signal=USR2``);
- ``usr2-launcher``: SIGUSR2 to the launcher, which forwards it (the batch shell's time-limit signal);
- ``term-launcher``: SIGTERM to the launcher (forwarded: preemption, ``scancel``);
- ``kill9-rank``: SIGKILL of one random rank (the launcher then stops the other one, like
  ``srun --kill-on-bad-exit``);
- ``kill9-all``: SIGKILL of the launcher and every rank at once (a node lost, an OOM killer),

at one of three moments:

- ``step``: once training passed a random step 1-25 steps after the checkpoint it resumed from;
- ``checkpoint``: while rank 0 is inside a checkpoint save, paused right after its K-th
  ``fsync``/``replace``/``unlink`` (K uniform in 0-5; 0 = on entry) of the commit protocol;
- ``eval``: while a rank is inside an evaluation.

The last two are aimed with a handshake, not a timer: the harness writes ``arm``, the worker's hook
pauses at that point and writes ``ready``, the harness interrupts and then writes ``go``. Kinds and
moments are drawn as shuffled rounds (every kind and moment occurs once per round of 5 resp. 3), so
any N ≥ 5 covers all of them. After every interruption each committed checkpoint must verify (size,
sha256) and load with ``torch.load(weights_only=True)``; the process group must end within
``HANG_S`` (a hang is a failure). Then the run is submitted until it finishes, and compared with an
uninterrupted run of the same config:

- the final weights (``final_model.pt``) bitwise equal;
- the train metrics: every segment (a submit, from the step it resumed at) logs consecutive steps
  with none repeated; the parts that the next segment kept (up to the checkpoint it resumed from)
  join into exactly steps 1..max_steps; and every logged loss and eval value (including steps
  trained again after a kill -9) equals the uninterrupted run's at that step;
- no committed checkpoint unloadable, at any time.

Prints one line per interruption and a summary; ``--json FILE`` writes the result. Exit status 0
when there are 0 differences.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KINDS = ("usr2-ranks", "usr2-launcher", "term-launcher", "kill9-rank", "kill9-all")
MOMENTS = ("step", "checkpoint", "eval")
HANG_S = 180.0  # a submit that does not end this long after its interruption is a hang
START_S = 300.0  # generous: ranks import torch on busy cores
EVERY_STEPS = 10
EVAL_EVERY = 50


def job_yaml(work: Path, max_steps: int) -> Path:
    import yaml

    data = {
        "name": "soak",
        "slurm": {"nodes": 1, "tasks_per_node": 2, "cpus_per_task": 1, "time": "01:00:00"},
        "train": {
            "task": "soak_task:SoakTask",
            "pythonpath": [str(REPO / "benchmarks"), str(REPO / "examples" / "digits")],
            "max_steps": max_steps,
            "batch_size": 16,
            "lr": 0.003,
            "seed": 0,
            "log_every": 1,
            "eval_every": EVAL_EVERY,
            "num_workers": 2,  # DataLoader workers: their seeding must resume exactly too
            "args": {"width": 8, "augment": True},
        },
        "checkpoint": {"every_steps": EVERY_STEPS, "keep_last": 2, "async_save": True},
        "requeue": {"signal": "USR2", "signal_delay_s": 60},
    }
    path = work / "soak.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def records(run_dir: Path) -> List[Dict[str, Any]]:
    out = []
    p = run_dir / "metrics.jsonl"
    if p.exists():
        for line in p.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a line a kill -9 cut short
    return out


def latest_step(run_dir: Path) -> int:
    from slurm_ddp.rundir import latest_checkpoint_step

    return latest_checkpoint_step(run_dir) or 0


def check_checkpoints(run_dir: Path) -> List[str]:
    """Problems of the committed checkpoints (each must verify and load); [] when all are fine."""
    import torch

    from slurm_ddp.checkpoint import CheckpointManager
    from slurm_ddp.rundir import checkpoint_dir

    mgr = CheckpointManager(checkpoint_dir(run_dir))
    problems = []
    for info in mgr.committed(quiet=True):
        problem = mgr.verify(info)
        if problem is None:
            try:
                torch.load(info.path, weights_only=True, map_location="cpu")
            except Exception as e:  # any failure to load is the finding
                problem = f"does not load: {e}"
        if problem is not None:
            problems.append(f"checkpoint of step {info.step}: {problem}")
    return problems


@dataclass
class Interruption:
    i: int
    kind: str
    moment: str
    resumed_from: int
    aimed: str = ""
    status: Optional[int] = None
    last_step: int = 0
    seconds: float = 0.0
    problems: List[str] = field(default_factory=list)


@dataclass
class SoakResult:
    n: int
    seed: int
    max_steps: int
    interruptions: List[Interruption]
    differences: List[str]
    reference_s: float
    soak_s: float
    work: str

    @property
    def ok(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        by = collections.Counter((x.kind, x.moment) for x in self.interruptions)
        lines = [f"{'kind':<14}" + "".join(f"{m:>12}" for m in MOMENTS)]
        for k in KINDS:
            lines.append(f"{k:<14}" + "".join(f"{by[(k, m)]:>12}" for m in MOMENTS))
        statuses = collections.Counter(str(x.status) for x in self.interruptions)
        redone = sum(1 for x in self.interruptions if x.kind.startswith("kill9"))
        lines += [
            f"interruptions: {len(self.interruptions)} of {self.n} (seed {self.seed}, max_steps {self.max_steps}); "
            f"exit statuses {dict(sorted(statuses.items()))}; kill -9 (steps redone after it): {redone}",
            f"uninterrupted run {self.reference_s:.0f} s; interrupted run, all submits {self.soak_s:.0f} s",
            f"differences: {len(self.differences)}" + "".join(f"\n  {d}" for d in self.differences[:20]),
        ]
        return "\n".join(lines)


class Soak:
    def __init__(self, n: int, seed: int, work: Path, max_steps: Optional[int] = None, say: Any = print):
        self.n, self.seed, self.work, self.say = n, seed, work, say
        self.rng = random.Random(seed)
        self.max_steps = max_steps or 100 * n + 500
        self.job = job_yaml(work, self.max_steps)
        self.reference, self.run_dir = work / "reference", work / "interrupted"
        self.hooks = work / "hooks"
        self.hooks.mkdir(exist_ok=True)
        self.differences: List[str] = []
        self.log_dir = work / "submits"
        self.log_dir.mkdir(exist_ok=True)

    # ---------------------------------------------------------------- processes
    def submit(self, run_dir: Path, hooks: bool, tag: str) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        if hooks:
            env["SOAK_HOOK_DIR"] = str(self.hooks)
        cmd = [sys.executable, "-m", "slurm_ddp", "submit", str(self.job), "--backend", "local"]
        cmd += ["--run-dir", str(run_dir), "--no-check-task"]
        with open(self.log_dir / f"{tag}.log", "wb") as out:  # the child keeps its own copy of the fd
            return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    @staticmethod
    def ranks(proc: subprocess.Popen) -> List[int]:
        r = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split()]

    def wait_until(self, pred: Any, proc: subprocess.Popen, timeout_s: float) -> bool:
        """Poll ``pred`` until true (True), or until ``proc`` exits or the deadline (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if pred():
                return True
            if proc.poll() is not None:
                return bool(pred())
            time.sleep(0.02)
        return False

    def end(self, proc: subprocess.Popen, timeout_s: float = HANG_S) -> Tuple[Optional[int], bool]:
        """Wait for ``proc``; on a hang kill it and its ranks. Returns (status, hung)."""
        try:
            return proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            for pid in self.ranks(proc):
                _kill(pid, signal.SIGKILL)
            proc.kill()
            proc.wait()
            return proc.returncode, True

    # ---------------------------------------------------------------- one interruption
    def _clear_hooks(self) -> None:
        for p in self.hooks.iterdir():
            p.unlink()

    def interrupt(self, x: Interruption) -> None:
        since = len(records(self.run_dir))
        self._clear_hooks()
        t0 = time.monotonic()
        proc = self.submit(self.run_dir, hooks=True, tag=f"{x.i:03d}-{x.kind}-{x.moment}")

        def trained(step: int) -> bool:
            return any(r.get("event") == "train" and r["step"] >= step for r in records(self.run_dir)[since:])

        if x.moment == "step":
            target = x.resumed_from + self.rng.randint(1, 25)
            x.aimed = f"step {target}"
            reached = self.wait_until(lambda: trained(target), proc, START_S)
        else:
            if not self.wait_until(lambda: trained(x.resumed_from + 1), proc, START_S):
                reached = False
            else:
                arm = f"ckpt {self.rng.randint(0, 5)}" if x.moment == "checkpoint" else "eval"
                x.aimed = arm
                (self.hooks / "arm.tmp").write_text(arm + "\n")
                os.rename(self.hooks / "arm.tmp", self.hooks / "arm")
                reached = self.wait_until(lambda: (self.hooks / "ready").exists(), proc, START_S)
                if reached:
                    x.aimed = (self.hooks / "ready").read_text().strip()
        if not reached:
            x.problems.append(f"the moment ({x.aimed or x.moment}) was not reached: submit status {proc.poll()}")
        ranks = self.ranks(proc)
        if x.kind == "usr2-ranks":
            for pid in ranks:
                _kill(pid, signal.SIGUSR2)
        elif x.kind == "usr2-launcher":
            _kill(proc.pid, signal.SIGUSR2)
        elif x.kind == "term-launcher":
            _kill(proc.pid, signal.SIGTERM)
        elif x.kind == "kill9-rank":
            if ranks:
                _kill(self.rng.choice(ranks), signal.SIGKILL)
        else:
            _kill(proc.pid, signal.SIGKILL)
            for pid in ranks:
                _kill(pid, signal.SIGKILL)
        (self.hooks / "go").write_text("go\n")  # a paused process goes on (and meets the signal)
        status, hung = self.end(proc)
        x.status, x.seconds = status, time.monotonic() - t0
        if hung:
            x.problems.append(f"the submit did not end within {HANG_S:.0f} s of the interruption (killed)")
        expected = {"usr2-ranks": (75,), "usr2-launcher": (75,), "term-launcher": (75,)}.get(x.kind)
        if reached and expected is not None and status not in expected:
            x.problems.append(f"exit status {status}, expected {expected} (stopped for preemption)")
        if reached and expected is None and status in (0, 75):
            x.problems.append(f"exit status {status} after a kill -9")
        for pid in ranks:  # every rank must be gone (PR_SET_PDEATHSIG / the launcher's kill)
            deadline = time.monotonic() + 30  # a SIGKILLed process may take a moment to exit (and be reaped)
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                x.problems.append(f"rank pid {pid} outlived the submit")
                _kill(pid, signal.SIGKILL)
        x.problems += check_checkpoints(self.run_dir)
        x.last_step = max((r["step"] for r in records(self.run_dir)[since:] if r.get("event") == "train"), default=0)
        if (self.run_dir / "FINISHED").exists():
            x.problems.append("the run finished before it was interrupted (raise max_steps)")

    # ---------------------------------------------------------------- the whole soak
    def run(self) -> SoakResult:
        t0 = time.monotonic()
        ref = self.submit(self.reference, hooks=False, tag="reference")
        status, hung = self.end(ref, timeout_s=3600)
        reference_s = time.monotonic() - t0
        if status != 0:
            raise RuntimeError(f"the uninterrupted run failed with status {status} (see {self.log_dir})")
        self.say(f"uninterrupted run: {self.max_steps} steps in {reference_s:.0f} s")

        kinds = _rounds(KINDS, self.n, self.rng)
        moments = _rounds(MOMENTS, self.n, self.rng)
        done: List[Interruption] = []
        t1 = time.monotonic()
        for i in range(self.n):
            x = Interruption(i + 1, kinds[i], moments[i], resumed_from=latest_step(self.run_dir))
            self.interrupt(x)
            done.append(x)
            self.say(
                f"{x.i:4d} {x.kind:<14} {x.moment:<10} from step {x.resumed_from:5d} to {x.last_step:5d} "
                f"status {x.status} {x.seconds:5.1f} s  [{x.aimed}]"
                + (f"  PROBLEMS: {x.problems}" if x.problems else "")
            )
            self.differences += [f"interruption {x.i} ({x.kind} at {x.moment}): {p}" for p in x.problems]
            if (self.run_dir / "FINISHED").exists():
                break
        for attempt in range(3):  # then let it finish
            if (self.run_dir / "FINISHED").exists():
                break
            proc = self.submit(self.run_dir, hooks=False, tag=f"final-{attempt}")
            status, hung = self.end(proc, timeout_s=3600)
            if status != 0:
                self.differences.append(f"the final submit {attempt} exited with status {status}")
        soak_s = time.monotonic() - t1
        self.compare()
        return SoakResult(
            n=self.n,
            seed=self.seed,
            max_steps=self.max_steps,
            interruptions=done,
            differences=self.differences,
            reference_s=reference_s,
            soak_s=soak_s,
            work=str(self.work),
        )

    def compare(self) -> None:
        import torch

        d = self.differences
        if not (self.run_dir / "FINISHED").exists():
            d.append("the interrupted run never finished")
            return
        a = torch.load(self.reference / "final_model.pt", weights_only=True)
        b = torch.load(self.run_dir / "final_model.pt", weights_only=True)
        if a.keys() != b.keys():
            d.append("final weights: different keys")
        else:
            d += [f"final weights: {k} differs" for k in a if not torch.equal(a[k], b[k])]
        ref = {(r["event"], r["step"]): r for r in records(self.reference) if r.get("event") in ("train", "eval")}
        segments: List[List[Dict[str, Any]]] = [[]]
        starts = [0]
        for r in records(self.run_dir):
            if r.get("event") == "resume":
                segments.append([])
                starts.append(int(r["step"]))
            elif r.get("event") in ("train", "eval"):
                segments[-1].append(r)
        kept: List[int] = []
        for k, (seg, start) in enumerate(zip(segments, starts)):
            steps = [r["step"] for r in seg if r["event"] == "train"]
            if steps != list(range(start + 1, start + 1 + len(steps))):
                d.append(f"segment {k} (resumed at step {start}): train steps not consecutive: {_ranges(steps)}")
            end = starts[k + 1] if k + 1 < len(starts) else self.max_steps
            kept += [s for s in steps if s <= end]
            for r in seg:
                want = ref.get((r["event"], r["step"]))
                if want is None:
                    d.append(f"segment {k}: {r['event']} at step {r['step']} is not in the uninterrupted run")
                    continue
                for key in ("loss", "eval_accuracy", "eval_loss"):
                    if key in want and r.get(key) != want[key]:
                        d.append(f"{r['event']} step {r['step']}: {key} {r.get(key)} != {want[key]} (uninterrupted)")
        if kept != list(range(1, self.max_steps + 1)):
            d.append(f"train steps kept across segments are not exactly 1..{self.max_steps}: {_ranges(kept)[:300]}")
        fa = json.loads((self.reference / "FINISHED").read_text())
        fb = json.loads((self.run_dir / "FINISHED").read_text())
        for key in ("eval_accuracy", "eval_loss", "step"):
            if fa.get(key) != fb.get(key):
                d.append(f"FINISHED {key}: {fb.get(key)} != {fa.get(key)} (uninterrupted)")


def _rounds(values: Tuple[str, ...], n: int, rng: random.Random) -> List[str]:
    out: List[str] = []
    while len(out) < n:
        block = list(values)
        rng.shuffle(block)
        out += block
    return out[:n]


def _ranges(steps: List[int]) -> str:
    """Compact text of a list of steps: "1-40, 38-90"."""
    parts, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        parts.append(f"{steps[i]}-{steps[j]}" if j > i else str(steps[i]))
        i = j + 1
    return ", ".join(parts)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_soak(
    n: int, seed: int = 0, work: Optional[Path] = None, max_steps: Optional[int] = None, say: Any = print
) -> SoakResult:
    """Run the soak in ``work`` (default: a fresh temporary directory, removed when it passed)."""
    own = work is None
    work = Path(tempfile.mkdtemp(prefix="soak-")) if work is None else work
    work.mkdir(parents=True, exist_ok=True)
    result = Soak(n, seed, work, max_steps=max_steps, say=say).run()
    if own and result.ok:
        shutil.rmtree(work, ignore_errors=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100, help="interruptions (default 100)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kinds, moments and targets")
    ap.add_argument("--work", type=Path, help="working directory (default: a temporary one, removed on success)")
    ap.add_argument("--max-steps", type=int, help="default 100·N + 500")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args()
    t0 = time.time()
    result = run_soak(args.n, args.seed, args.work, args.max_steps, say=lambda s: print(s, flush=True))
    print(result.summary())
    print(
        f"total {time.time() - t0:.0f} s; work directory {result.work}"
        + (" (removed)" if result.ok and not args.work else "")
    )
    if args.json:
        data = asdict(result)
        data["ok"] = result.ok
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
