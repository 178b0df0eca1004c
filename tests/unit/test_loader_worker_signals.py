"""``signals.ignore_in_loader_workers``: a DataLoader's worker processes ignore the rank's stop signals, so the
SIGTERM that Slurm sends to every process of a step (or the local supervisor to a rank's process group) is the
rank's to act on. End to end: the preemption soak (SIGTERM to the local supervisor, ``num_workers=2``) and the Slurm
partition-preemption test (``train.num_workers=2``).

Each test runs its loaders under every start method of ``multiprocessing`` (``start_method``): ``fork`` (Linux's
default up to Python 3.13), ``forkserver`` (its default since 3.14) and ``spawn``. A fork server a test starts is
stopped when the test ends (and one running before it is stopped first, so that the server has this test's
environment and signal mask, as a rank's first loader gives it): none outlives its test."""

from __future__ import annotations

import gc
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, List

import pytest
import torch
from lib import wait_for
from torch.utils.data import DataLoader

from slurm_ddp.signals import blocked, ignore_in_loader_workers, worker_signals


def _ignored(pid: int) -> int:
    """The SigIgn mask of process ``pid`` (proc(5))."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no SigIgn line for {pid}")


def _bit(sig: signal.Signals) -> int:
    return 1 << (int(sig) - 1)


def _stop_fork_server() -> None:
    # multiprocessing's own way to stop its server, "used by unit tests" (CPython's forkserver.py)
    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]


@pytest.fixture(params=["fork", "forkserver", "spawn"])
def start_method(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A ``multiprocessing`` context of each start method, for ``DataLoader(multiprocessing_context=…)``."""
    if request.param == "forkserver":
        _stop_fork_server()
    try:
        yield multiprocessing.get_context(request.param)
    finally:
        if request.param == "forkserver":
            gc.collect()  # a loader iterator still referenced by a failed assertion's frame lets go of its workers
            _stop_fork_server()


def test_loader_workers_ignore_the_stop_signals_and_keep_loading_after_a_sigterm(start_method: Any) -> None:
    data = torch.arange(64, dtype=torch.float32)
    loader = DataLoader(
        data,
        batch_size=2,
        num_workers=2,
        worker_init_fn=ignore_in_loader_workers(worker_signals("USR2")),
        multiprocessing_context=start_method,
    )
    it = iter(loader)
    first = next(it)  # a batch came back: each worker that made one ran its init function
    second = next(it)
    pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]
    for pid in pids:
        mask = _ignored(pid)
        assert mask & _bit(signal.SIGTERM) and mask & _bit(signal.SIGUSR2), (pid, hex(mask))
    # SIGTERM from another process (as slurmstepd sends it): ignored, so the rest still loads
    subprocess.run(["kill", "-TERM", *map(str, pids)], check=True)
    rest = list(it)
    assert torch.cat([first, second, *rest]).tolist() == data.tolist()


def test_without_it_the_workers_keep_torchs_sigterm_handling() -> None:
    """The case the function is for: a plain loader's workers do not ignore SIGTERM."""
    loader = DataLoader(
        torch.arange(8, dtype=torch.float32), batch_size=2, num_workers=1, multiprocessing_context="fork"
    )
    it = iter(loader)
    next(it)
    (pid,) = [w.pid for w in it._workers]  # type: ignore[attr-defined]
    assert not _ignored(pid) & _bit(signal.SIGTERM)
    del it


@pytest.mark.parametrize("start_method", ["fork", "forkserver"], indirect=True)  # spawn: as fork, slower
def test_preemption_loader_worker_init_ignores_the_jobs_requeue_signal_and_sigterm(
    monkeypatch: pytest.MonkeyPatch, start_method: Any
) -> None:
    """The own-script API's ``worker_init_fn``: the job's ``requeue.signal`` comes from the rank wrapper's
    ``SLURM_DDP_REQUEUE_SIGNAL``, read in the worker (its environment is the rank's, for ``forkserver`` the
    rank's when the server started: at its first loader, after the rank wrapper set it)."""
    from slurm_ddp import preemption

    monkeypatch.setenv(preemption.SIGNAL_VAR, "USR1")
    loader = DataLoader(
        torch.arange(8, dtype=torch.float32),
        batch_size=2,
        num_workers=1,
        worker_init_fn=preemption.loader_worker_init,
        multiprocessing_context=start_method,
    )
    it = iter(loader)
    next(it)
    (pid,) = [w.pid for w in it._workers]  # type: ignore[attr-defined]
    mask = _ignored(pid)
    assert mask & _bit(signal.SIGUSR1) and mask & _bit(signal.SIGTERM), hex(mask)
    assert not mask & _bit(signal.SIGUSR2), hex(mask)
    del it


class _TermOnArrival(torch.utils.data.Dataset):
    """A dataset whose copy in a worker sends that worker SIGTERM as it is unpickled — under ``spawn`` and
    ``forkserver`` the worker process unpickles its arguments (the dataset among them) before it calls the
    init function: Slurm's SIGTERM in the window between a worker's start and its init function."""

    def __init__(self, n: int) -> None:
        self.data = torch.arange(n, dtype=torch.float32)
        self.made_in = os.getpid()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if os.getpid() != self.made_in:  # a worker (this test's process never unpickles it)
            os.kill(os.getpid(), signal.SIGTERM)


# "not blocked": a worker killed while torch still builds the iterator leaves a half-made one, whose __del__
# then fails (torch's, not ours): pytest reports that as an unraisable exception
# (and its queue feeder threads may fail on a closed pipe: pytest's unhandled-thread-exception warning)
# (a thread's exception may surface in the next test of the module: the filter is on both variants)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("mask", ["blocked", "not blocked"])
def test_a_sigterm_between_the_start_and_the_init_function(
    monkeypatch: pytest.MonkeyPatch, mask: str, start_method: Any
) -> None:
    """The window the worker's own ignoring leaves: Slurm's SIGTERM reaches a worker the loader has just
    started, before its init function ran (a loaded machine, an epoch's new workers). Made certain here:
    under ``fork`` the parent sends it the moment ``os.fork`` returns; under ``spawn`` and ``forkserver``
    the worker sends it to itself while it unpickles its dataset. An iterator created inside
    ``signals.blocked`` (as the worker's trainer does) starts its workers with the signal blocked — under
    ``forkserver`` through the server, which the first loader starts inside it — and they load
    everything; without it the worker dies of it."""
    real_fork = os.fork

    def fork() -> int:
        pid = real_fork()
        if pid > 0:
            os.kill(pid, signal.SIGTERM)
        return pid

    sigs = worker_signals("USR2")
    data = torch.arange(16, dtype=torch.float32)
    dataset: Any = data if start_method.get_start_method() == "fork" else _TermOnArrival(16)
    loader = DataLoader(
        dataset,
        batch_size=2,
        num_workers=2,
        worker_init_fn=ignore_in_loader_workers(sigs),
        multiprocessing_context=start_method,
    )
    if start_method.get_start_method() == "fork":
        monkeypatch.setattr(os, "fork", fork)
    if mask == "blocked":
        with blocked(sigs):
            it = iter(loader)
        monkeypatch.undo()
        assert torch.cat(list(it)).tolist() == data.tolist()
        assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & set(sigs)  # this thread's mask is back
    else:  # torch's SIGCHLD handler may raise it as soon as the worker is gone, in any line of this block, also
        # inside the standard library (seen in CI: in Thread.start, whose own cleanup then raised KeyError)
        with pytest.raises(Exception) as caught:
            it = iter(loader)
            monkeypatch.undo()
            list(it)
        monkeypatch.undo()
        chain: List[BaseException] = []
        e: Any = caught.value
        while e is not None and len(chain) < 10:
            chain.append(e)
            e = e.__cause__ or e.__context__
        assert any(isinstance(x, RuntimeError) and "DataLoader worker" in str(x) for x in chain), repr(chain)
        del caught, chain, e
        gc.collect()  # a half-made iterator goes here, under this test's filter, not in a later test


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _ppid(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _children(pid: int) -> List[int]:
    out: List[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out += [int(c) for c in text]
    return out


@pytest.mark.parametrize("start_method", ["forkserver"], indirect=True)
def test_workers_that_ignore_sigterm_end_with_their_rank_and_so_does_the_fork_server(start_method: Any) -> None:
    """A rank that dies (SIGKILL: KillWait, the OOM killer) while its loader workers wait for work: the
    workers, which ignore SIGTERM, and the fork server that started them end too. Without
    ``ignore_in_loader_workers``'s watch they stayed (torch's worker watches its parent process, under
    ``forkserver`` the server, and the server ends only when its last child is gone): seen as
    ``multiprocessing.forkserver`` processes that outlived the test suite on Python 3.14."""
    rank_code = (
        "import multiprocessing, os, sys, torch\n"
        "from torch.utils.data import DataLoader\n"
        "from slurm_ddp.signals import ignore_in_loader_workers\n"
        "loader = DataLoader(torch.arange(64.0), batch_size=2, num_workers=2, persistent_workers=True,\n"
        "    worker_init_fn=ignore_in_loader_workers(['USR2', 'TERM']),\n"
        "    multiprocessing_context=multiprocessing.get_context('forkserver'))\n"
        "it = iter(loader)\n"
        "next(it)\n"
        "print(' '.join(str(w.pid) for w in it._workers), flush=True)\n"
        "sys.stdin.read()\n"  # wait for the kill
    )
    rank = subprocess.Popen(
        [sys.executable, "-c", rank_code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert rank.stdout is not None
        workers = [int(p) for p in rank.stdout.readline().split()]
        assert len(workers) == 2
        # the fork server (the workers' parent) and multiprocessing's resource tracker
        helpers = [p for p in _children(rank.pid) if p not in workers]
        assert {_ppid(w) for w in workers} <= set(helpers), (workers, helpers)
        # the batch came from one worker: the other may still be on its way to its init function
        wait_for(
            lambda: all(_ignored(pid) & _bit(signal.SIGTERM) for pid in workers),
            60,
            "both loader workers to ignore SIGTERM",
            lambda: str([hex(_ignored(pid)) for pid in workers]),
        )
    finally:
        rank.kill()
        rank.wait()

    def running() -> List[int]:
        for p in (*workers, *helpers):
            try:  # reap what is ours (the rank's children are re-parented to init, or to a subreaper)
                os.waitpid(p, os.WNOHANG)
            except ChildProcessError:
                pass
        return [p for p in (*workers, *helpers) if _alive(p)]

    try:  # an upper bound: they end within a second of the rank when they end
        wait_for(lambda: not running(), 60, "the rank's loader workers and fork server to end", lambda: str(running()))
    finally:
        for p in running():
            os.kill(p, signal.SIGKILL)  # do not leave them behind when the test fails


def test_loader_context_starts_a_fork_server_with_torch_and_the_signals_blocked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``forkserver`` (Linux's default since Python 3.14; made the default here on any Python) the
    trainer's context comes with a server already running that has torch imported (a worker forked from
    it starts without importing torch again: the stop at an epoch boundary is not late) and the stop
    signals blocked (its workers start with them blocked); under ``fork`` it is the plain context."""
    from slurm_ddp.signals import loader_context

    _stop_fork_server()
    real = multiprocessing.get_start_method(allow_none=True)
    monkeypatch.setattr(multiprocessing.forkserver._forkserver, "_preload_modules", ["__main__"])
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        sigs = worker_signals("USR2")
        ctx = loader_context(sigs, preload=["slurm_ddp.worker.runtime"])
        assert ctx.get_start_method() == "forkserver"
        server = multiprocessing.forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        assert server is not None and _ppid(server) == os.getpid()
        blk = next(ln for ln in Path(f"/proc/{server}/status").read_text().splitlines() if ln.startswith("SigBlk:"))
        assert int(blk.split()[1], 16) & _bit(signal.SIGTERM) and int(blk.split()[1], 16) & _bit(signal.SIGUSR2), blk
        assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & set(sigs)  # this thread's mask is back

        def has_torch() -> bool:  # the server imports its preload after it started: wait for libtorch
            return "libtorch" in Path(f"/proc/{server}/maps").read_text()

        wait_for(has_torch, 120, "the fork server to import torch")
        data = torch.arange(8, dtype=torch.float32)
        loader = DataLoader(
            data,
            batch_size=2,
            num_workers=1,
            worker_init_fn=ignore_in_loader_workers(sigs),
            multiprocessing_context=ctx,
        )
        it = iter(loader)
        first = next(it)
        (pid,) = [w.pid for w in it._workers]  # type: ignore[attr-defined]
        assert _ppid(pid) == server and _ignored(pid) & _bit(signal.SIGTERM)
        assert torch.cat([first, *it]).tolist() == data.tolist()
        del it
        multiprocessing.set_start_method("fork", force=True)
        assert loader_context(sigs).get_start_method() == "fork"
    finally:
        multiprocessing.set_start_method(real, force=True)
        gc.collect()
        _stop_fork_server()
