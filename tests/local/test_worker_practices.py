"""The worker's DDP practices (train.* switches), with real gloo process groups of 2 ranks on this CPU.

- gradient accumulation: ``optimizer_step`` over 4 micro-batches all-reduces each gradient bucket
  exactly once per optimizer step (counted by a DDP communication hook; a loop without ``no_sync``
  counts 4), and ends with the same parameters as one step over the concatenated batch;
- ``StepAgreement``: a flag raised on one rank stops both ranks after the same step, and ``settle`` makes a
  SIGTERM that came after the check win;
- one local-backend run of the digits job with many switches on at once (accumulation, bf16
  autocast, channels_last, clipping, DataLoader workers, profiler window, deterministic mode), and a
  short fp16 run (GradScaler);
- ``nan_check``: a task whose loss turns NaN ends the job non-zero, naming NaN, and the last good
  checkpoint stays valid;
- ``torch.compile`` opt-in (needs a C++ compiler: `.ci/run` installs g++);
- a finished worker has freed its process group (no gloo thread left) before interpreter teardown.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import List

import pytest
import torch
from lib import require_executable, require_module

pytestmark = pytest.mark.local

REPO = Path(__file__).resolve().parents[2]
JOB = REPO / "examples" / "digits" / "job.yaml"
DIGITS_DIR = REPO / "examples" / "digits"
#: a run of ~8 small steps: the startup (imports, data, process group) dominates
SMALL = ["train.eval_every=0", "train.batch_size=16", "train.args.width=8"]


def submit(run_dir: Path, sets: List[str], timeout: float = 240, env: dict = None) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "slurm_ddp",
        "submit",
        str(JOB),
        "--backend",
        "local",
        "--run-dir",
        str(run_dir),
        "--no-check-task",
    ]
    for s in sets:
        cmd += ["--set", s]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- in-process ranks


def _init(rank: int, port: int) -> torch.device:
    from slurm_ddp.env import DistEnv
    from slurm_ddp.worker.runtime import init_distributed

    torch.set_num_threads(1)
    denv = DistEnv(
        rank=rank,
        local_rank=rank,
        world_size=2,
        node_rank=0,
        num_nodes=1,
        local_world_size=2,
        master_addr="127.0.0.1",
        master_port=port,
        job_id="test",
        hostname="",
        restart_count=0,
    )
    return init_distributed(denv, "gloo", timeout_s=60)


def _gloo_threads() -> int:
    """How many of this process's threads are gloo's (``pt_gloo_*``, ``gloo_*``), from /proc."""
    tasks = Path("/proc/self/task")
    return sum((t / "comm").read_text().startswith(("pt_gloo", "gloo")) for t in tasks.iterdir())


def _accum_rank(rank: int, port: int, out_dir: str) -> None:
    """One rank of the accumulation test; writes its observations to OUT_DIR/rank-N.json."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    from slurm_ddp.worker.runtime import optimizer_step, shutdown_distributed

    device = _init(rank, port)
    accum, micro, steps = 4, 8, 3

    def build(hook_calls=None):
        torch.manual_seed(0)  # the same initial weights in every copy
        model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 10))
        # a tiny bucket cap: one bucket per parameter, so "once per bucket" means something
        ddp = DDP(model, bucket_cap_mb=0.0001, gradient_as_bucket_view=True)
        if hook_calls is not None:

            def counting_allreduce(state, bucket):
                hook_calls.append(bucket.index())
                return default_hooks.allreduce_hook(state, bucket)

            ddp.register_comm_hook(None, counting_allreduce)
        return model, ddp, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    calls: List[int] = []
    model_acc, ddp_acc, opt_acc = build(calls)
    model_ref, ddp_ref, opt_ref = build()
    per_step = []
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data: the all-reduce matters
    for _ in range(steps):
        x = torch.randn(accum * micro, 1, 8, 8, generator=gen)
        y = torch.randint(0, 10, (accum * micro,), generator=gen)
        micro_batches = [(x[i * micro : (i + 1) * micro], y[i * micro : (i + 1) * micro]) for i in range(accum)]
        calls.clear()
        optimizer_step(ddp_acc, micro_batches, F.cross_entropy, opt_acc, device=device, clip_grad_norm=0.5)
        per_step.append(list(calls))
        optimizer_step(ddp_ref, [(x, y)], F.cross_entropy, opt_ref, device=device, clip_grad_norm=0.5)
    max_diff = max(
        float((a.detach() - b.detach()).abs().max()) for a, b in zip(model_acc.parameters(), model_ref.parameters())
    )
    close = all(
        torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(model_acc.parameters(), model_ref.parameters())
    )

    # Negative control: the same accumulation without no_sync all-reduces at every backward.
    naive_calls: List[int] = []
    _, ddp_naive, opt_naive = build(naive_calls)
    optimizer_step(ddp_naive, micro_batches[:1], F.cross_entropy, opt_naive, device=device)  # DDP rebuilds
    naive_calls.clear()  # its buckets after the first iteration: count from the second on
    opt_naive.zero_grad(set_to_none=True)
    for xb, yb in micro_batches:
        (F.cross_entropy(ddp_naive(xb), yb) / accum).backward()
    opt_naive.step()

    flat = torch.cat([p.detach().reshape(-1) for p in model_acc.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    ranks_equal = bool(torch.equal(gathered[0], gathered[1]))

    # The DDP wrappers hold the group: drop them, then shut down. The group must really go, with
    # its gloo threads, before the interpreter exits: a thread left behind can abort the process
    # at exit ("terminate called without an active exception").
    gloo_threads_before = _gloo_threads()
    del ddp_acc, ddp_ref, ddp_naive
    shutdown_distributed()
    Path(out_dir, f"rank-{rank}.json").write_text(
        json.dumps(
            {
                "per_step": per_step,
                "naive": naive_calls,
                "allclose": close,
                "max_diff": max_diff,
                "ranks_equal": ranks_equal,
                "gloo_threads_before": gloo_threads_before,
                "gloo_threads_after": _gloo_threads(),
            }
        )
    )


def _agreement_rank(rank: int, port: int, out_dir: str) -> None:
    """Rank 1 alone gets the "signal" after step 7; both ranks must stop after the same step."""
    import torch.distributed as dist

    from slurm_ddp.signals import PreemptionFlag
    from slurm_ddp.worker.runtime import StepAgreement

    _init(rank, port)
    flag = PreemptionFlag(["USR2"])  # not installed: raised by hand
    agree = StepAgreement(flag, interval_s=0.02)
    stopped = None
    for step in range(1, 400):
        time.sleep(0.004 if rank == 0 else 0.002)  # ranks of different speeds (DDP would pace them)
        if rank == 1 and step == 7:
            flag.set("USR2")
        if agree.poll():
            stopped = step
            break
    agreed = flag.received.name if flag.received else None
    if rank == 1:  # a SIGTERM whose handler ran only after the stopping check
        flag.set("TERM")
    agree.settle()
    settled = flag.received.name if flag.received else None
    Path(out_dir, f"agree-{rank}.json").write_text(
        json.dumps({"stopped": stopped, "every": agree.every, "agreed": agreed, "settled": settled})
    )
    dist.destroy_process_group()


def _spawn(fn, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(fn, args=(free_port(), str(tmp_path)), nprocs=2, join=True)


def test_accumulation_all_reduces_once_per_step_and_equals_the_big_batch(tmp_path: Path) -> None:
    _spawn(_accum_rank, tmp_path)
    for rank in range(2):
        r = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        for step, calls in enumerate(r["per_step"]):
            buckets = sorted(set(calls))
            assert calls and sorted(calls) == buckets == list(range(len(buckets))), (
                f"rank {rank} step {step}: hook calls per bucket {calls} (expected each bucket once)"
            )
        assert max(len(c) for c in r["per_step"]) > 1, "the test needs several buckets"
        # without no_sync each of the 4 backward passes all-reduces every bucket
        assert len(r["naive"]) == 4 * len(set(r["naive"])), r["naive"]
        assert r["allclose"], f"rank {rank}: accumulated step differs from the big batch by {r['max_diff']}"
        assert r["ranks_equal"]
        assert r["gloo_threads_before"] > 0, "the thread count cannot see gloo's threads"
        assert r["gloo_threads_after"] == 0, (
            f"rank {rank}: {r['gloo_threads_after']} gloo threads outlive shutdown_distributed()"
        )


def test_step_agreement_stops_every_rank_after_the_same_step(tmp_path: Path) -> None:
    _spawn(_agreement_rank, tmp_path)
    a, b = (json.loads((tmp_path / f"agree-{r}.json").read_text()) for r in range(2))
    assert a["stopped"] is not None and a["stopped"] == b["stopped"] >= 7, (a, b)
    assert a["stopped"] <= 7 + 30, (a, b)  # checks ~every 20 ms of 4 ms steps: stopped soon after
    assert a["agreed"] == b["agreed"] == "SIGUSR2", (a, b)  # rank 0 names the signal rank 1 got
    assert a["settled"] == b["settled"] == "SIGTERM", (a, b)  # settle: the later SIGTERM outweighs it


# --------------------------------------------------------------------------- local-backend runs


def _trace_files(run_dir: Path) -> List[Path]:
    return sorted((run_dir / "profile").glob("*.pt.trace.json"))


def test_many_switches_at_once_train_and_profile(tmp_path: Path) -> None:
    run = tmp_path / "run"
    sets = SMALL + [
        "train.max_steps=8",
        "train.log_every=4",
        "train.grad_accum_steps=2",
        "train.amp=bf16",
        "train.channels_last=true",
        "train.clip_grad_norm=1.0",
        "train.num_workers=2",
        "train.persistent_workers=true",
        "train.profile_first_step=3",
        "train.profile_last_step=5",
        "train.deterministic=true",
        "checkpoint.every_steps=4",
    ]
    r = submit(run, sets)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    finished = json.loads((run / "FINISHED").read_text())
    assert finished["step"] == 8
    assert "2 ranks × batch 16 × 2 micro-steps" in (run / "logs" / "rank-0.log").read_text()

    final = torch.load(run / "checkpoints" / "step-00000008.pt", weights_only=True)
    assert (final["epoch"], final["batch_in_epoch"]) == (0, 16)  # 2 micro-batches per optimizer step
    weights = torch.load(run / "final_model.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())

    traces = _trace_files(run)
    # tensorboard_trace_handler's names: <worker>.<time>.pt.trace.json, one per rank
    assert sorted(p.name.split(".")[0] for p in traces) == ["rank0", "rank1"], traces
    for path in traces:
        trace = json.loads(path.read_text())
        steps = {e["name"] for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")}
        assert len(steps) == 3, (path, steps)  # steps 3, 4 and 5
        assert any(e.get("name") == "aten::convolution" for e in trace["traceEvents"])


def test_fp16_uses_a_grad_scaler(tmp_path: Path) -> None:
    run = tmp_path / "run"
    r = submit(run, SMALL + ["train.max_steps=4", "train.log_every=2", "train.amp=fp16", "checkpoint.every_steps=2"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    state = torch.load(run / "checkpoints" / "step-00000004.pt", weights_only=True)
    assert state["scaler"] is not None and state["scaler"]["scale"] > 0
    assert math.isfinite(json.loads((run / "FINISHED").read_text())["eval_loss"])


def test_metrics_go_to_tensorboard_on_rank_0(tmp_path: Path) -> None:
    require_module("tensorboard", "train.tensorboard")  # optional for users; the test extra installs it
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    r = submit(run, SMALL + ["train.max_steps=6", "train.log_every=2", "train.eval_every=3"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    event_files = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert len(event_files) == 1, event_files  # rank 0 only
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [(m["step"], m["loss"]) for m in metrics if m["event"] == "train"]
    evals = sorted({m["step"]: m["eval_accuracy"] for m in metrics if m["event"] == "eval"}.items())
    assert [e.step for e in acc.Scalars("loss")] == [s for s, _ in train] == [2, 4, 6]
    assert [e.value for e in acc.Scalars("loss")] == pytest.approx([v for _, v in train], rel=1e-6)
    assert [e.step for e in acc.Scalars("eval_accuracy")] == [s for s, _ in evals] == [3, 6]
    assert [e.value for e in acc.Scalars("eval_accuracy")] == pytest.approx([v for _, v in evals], rel=1e-6)
    assert {"steps_per_s", "eval_loss"} <= set(acc.Tags()["scalars"])


EXIT_TASK = """
import atexit, gc, json, os, threading
from pathlib import Path

from digits_task import DigitsTask

# The Trainer, kept to interpreter exit: whatever it left running is then still there at _report
# (a trainer that dies with run() would stop its checkpoint writer by chance, not by design).
_TRAINER = []


def _comm(task):
    try:
        return (task / "comm").read_text()
    except OSError:  # the thread ended since the directory was listed
        return ""


def _report():  # atexit: after the worker returned, before interpreter teardown
    tasks = Path("/proc/self/task")
    gloo = sum(_comm(t).startswith(("pt_gloo", "gloo")) for t in tasks.iterdir())
    rank = os.environ["SLURM_PROCID"]
    Path(os.environ["SLURM_DDP_RUN_DIR"], f"exit-threads-{rank}.json").write_text(json.dumps({
        "gloo": gloo, "threads": [t.name for t in threading.enumerate()],
        "had_writer": any(t.writer is not None for t in _TRAINER),
    }))


class ExitReport(DigitsTask):
    def build_model(self):
        _TRAINER.extend(o for o in gc.get_objects() if type(o).__name__ == "Trainer")
        atexit.register(_report)
        return super().build_model()
"""


def _submit_exit_report(tmp_path: Path, sets: List[str], timeout: float = 240, env: dict = None) -> Path:
    """A local run of ``ExitReport`` (the digits task reporting what is left at exit); its run directory."""
    task_dir = tmp_path / "tasks"
    task_dir.mkdir()
    (task_dir / "exit_task.py").write_text(EXIT_TASK)
    run = tmp_path / "run"
    r = submit(
        run,
        SMALL
        + [
            "train.task=exit_task:ExitReport",
            f"train.pythonpath=[{json.dumps(str(task_dir))}, {json.dumps(str(DIGITS_DIR))}]",
            *sets,
        ],
        timeout=timeout,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run


def _assert_nothing_left_at_exit(run: Path) -> None:
    """No gloo thread and no checkpoint-writer thread alive on any rank at interpreter exit."""
    for rank in range(2):
        path = run / f"exit-threads-{rank}.json"
        log = (run / "logs" / f"rank-{rank}.log").read_text()
        assert path.exists(), f"rank {rank} wrote no exit report; its log:\n{log[-3000:]}"
        report = json.loads(path.read_text())
        assert report["gloo"] == 0, f"rank {rank}: {report['gloo']} gloo threads left at interpreter exit"
        assert report["had_writer"] == (rank == 0), report  # rank 0 writes checkpoints in the background
        assert "checkpoint-writer" not in report["threads"], (
            f"rank {rank}: the checkpoint writer thread is still alive at interpreter exit: {report['threads']}"
        )


def test_a_finished_worker_frees_its_process_group_before_exit(tmp_path: Path) -> None:
    # A thread still running at interpreter teardown can abort a finished rank with SIGABRT ("terminate
    # called without an active exception"): gloo's threads (the group must be freed) and the checkpoint
    # writer's (it frees tensors when woken at exit) must both be gone when the worker returns.
    run = _submit_exit_report(tmp_path, ["train.max_steps=4", "train.log_every=2", "checkpoint.every_steps=2"])
    _assert_nothing_left_at_exit(run)


NAN_TASK = '''
from digits_task import DigitsTask


class NaNFrom(DigitsTask):
    """The digits task whose loss is NaN from its ``args.nan_from``-th loss call on (one per step)."""

    calls = 0

    def loss(self, outputs, targets):
        type(self).calls += 1
        loss = super().loss(outputs, targets)
        if type(self).calls >= int(self.args["nan_from"]):
            loss = loss * float("nan")
        return loss
'''


def test_nan_check_stops_the_job_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    from slurm_ddp.checkpoint import CheckpointManager

    task_dir = tmp_path / "tasks"
    task_dir.mkdir()
    (task_dir / "nan_task.py").write_text(textwrap.dedent(NAN_TASK))
    run = tmp_path / "run"
    sets = SMALL + [
        "train.task=nan_task:NaNFrom",
        f"train.pythonpath=[{json.dumps(str(task_dir))}, {json.dumps(str(DIGITS_DIR))}]",
        "train.args.nan_from=8",
        "train.nan_check=true",
        "train.max_steps=30",
        "train.log_every=100",
        "checkpoint.every_steps=5",
        "checkpoint.keep_last=2",
    ]
    r = submit(run, sets)
    out = r.stdout + r.stderr
    assert r.returncode not in (0, 75), out[-3000:]
    assert "NaN" in out and "nan_check" in out, out[-3000:]
    assert not (run / "FINISHED").exists()

    manager = CheckpointManager(run / "checkpoints", keep_last=2)  # latest() checks size and sha256
    info = manager.latest()
    assert info is not None and info.step == 5, info  # step 10's save was refused: the loss was NaN
    state = manager.load(info)
    assert state["step"] == 5
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())
    assert not list((run / "checkpoints").glob("step-00000010*"))


def test_torch_compile_opt_in(tmp_path: Path) -> None:
    require_executable("c++", "g++", "clang++", why="torch.compile (inductor) needs a C++ compiler on the CPU")
    t0 = time.monotonic()
    # ~10-15 s of start-up plus ~20-60 s of compiling on an idle CPU; the deadline only ends a hang.
    # Exit status 0 and nothing left at exit: this run used to abort rank 0 at exit now and then.
    run = _submit_exit_report(
        tmp_path,
        ["train.max_steps=4", "train.log_every=2", "train.compile=true", "checkpoint.every_steps=0"],
        timeout=480,
        env={"TORCHINDUCTOR_COMPILE_THREADS": "1"},
    )
    assert json.loads((run / "FINISHED").read_text())["step"] == 4
    _assert_nothing_left_at_exit(run)
    print(f"compiled 4-step run: {time.monotonic() - t0:.1f} s")
