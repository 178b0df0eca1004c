"""AsyncCheckpointer: the snapshot is isolated from the live tensors, at most one write is in flight,
a writer's error surfaces in the training loop (check/wait/next save) and is never lost, wait()
flushes; and snapshot_to_cpu (buffer reuse, OrderedDict metadata)."""

from __future__ import annotations

import collections
import hashlib
import threading
from pathlib import Path

import pytest
from lib import require_module, wait_for

torch = require_module("torch")

from slurm_ddp.checkpoint import AsyncCheckpointer, CheckpointManager, snapshot_to_cpu  # noqa: E402
from slurm_ddp.errors import CheckpointError  # noqa: E402


def live_state(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.BatchNorm1d(32))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return {
        "model": model.state_dict(),  # views of the live parameters: mutated by "training" below
        "optimizer": {
            "state": {0: {"exp_avg": torch.randn(32, 64, generator=g), "step": torch.tensor(3.0)}},
            "param_groups": [{"lr": 0.1, "params": [0, 1]}],
        },
        "step": 7,
        "rngs": [torch.randn(5, generator=g), (1, 2)],
    }


def clone(state):
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: clone(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(clone(v) for v in state)
    return state


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def mutate(state) -> None:
    """What an optimizer step does to the live tensors: change them in place."""
    with torch.no_grad():
        for v in list(state["model"].values()) + [state["optimizer"]["state"][0]["exp_avg"], state["rngs"][0]]:
            if v.is_floating_point():
                v.add_(1.0)
            else:
                v.add_(1)


class Gate:
    """Wraps ``manager.save``: each call waits until released; records how many run at once."""

    def __init__(self, mgr: CheckpointManager, monkeypatch):
        self.real = mgr.save
        self.entered = threading.Event()
        self.release = threading.Event()
        self.running = 0
        self.max_running = 0
        self.calls = []
        self._lock = threading.Lock()
        monkeypatch.setattr(mgr, "save", self.save)

    def save(self, state, step, world_size=1):
        with self._lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
            self.calls.append(step)
        self.entered.set()
        try:
            assert self.release.wait(30), "the test never released the write"
            return self.real(state, step, world_size=world_size)
        finally:
            with self._lock:
                self.running -= 1


class WatchedDone(threading.Event):
    """Stands in for a pending write's ``done`` event: ``waited`` is set once someone waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = threading.Event()

    def wait(self, timeout=None):
        self.waited.set()
        return super().wait(timeout)


def watch_pending_write(writer: AsyncCheckpointer) -> WatchedDone:
    """Swap the pending write's ``done`` event for a ``WatchedDone`` (the write must be held at a
    ``Gate``, so that the writer thread has not set it yet) and return it."""
    job = writer._job
    assert job is not None and not job.done.is_set()
    watched = WatchedDone()
    job.done = watched
    return watched


def wait_until(predicate, what: str) -> None:
    wait_for(predicate, 30, what, interval_s=0.005)


# --------------------------------------------------------------------------- isolation


@pytest.mark.parametrize("reuse", [True, False])
def test_snapshot_is_isolated_from_later_in_place_mutation(tmp_path, monkeypatch, reuse):
    mgr = CheckpointManager(tmp_path, keep_last=5)
    gate = Gate(mgr, monkeypatch)
    writer = AsyncCheckpointer(mgr, reuse_buffers=reuse)
    state = live_state()
    expected = clone(state)
    writer.save(state, 1)
    assert gate.entered.wait(30) and writer.in_flight
    mutate(state)  # training goes on while the write has not even started writing
    assert not same(state, expected)
    gate.release.set()
    info = writer.wait()
    assert info.step == 1 and not writer.in_flight
    assert same(mgr.load(info), expected)

    # the second save (into the reused buffers) sees the mutated state, and is isolated in turn
    gate.release.clear()
    gate.entered.clear()
    expected2 = clone(state)
    writer.save(state, 2)
    assert gate.entered.wait(30)
    mutate(state)
    gate.release.set()
    assert writer.wait().step == 2
    assert same(mgr.load(mgr.latest()), expected2)
    assert same(mgr.load([i for i in mgr.committed() if i.step == 1][0]), expected)  # untouched


@pytest.mark.parametrize("copier", ["memmove", "torch"])
def test_snapshot_reuses_the_previous_buffers_only_when_they_fit(copier):
    state = {
        "a": torch.arange(6.0).reshape(2, 3),
        "b": [torch.ones(4)],
        "c": torch.zeros(3, dtype=torch.int64),
        "t": torch.arange(6.0).reshape(3, 2).t(),
    }  # non-contiguous
    first = snapshot_to_cpu(state, copier=copier)
    assert first["a"].data_ptr() != state["a"].data_ptr() and torch.equal(first["a"], state["a"])
    ptrs = {k: first[k].data_ptr() for k in ("a", "c", "t")}
    state["a"].mul_(2)
    state["c"] = torch.zeros(5, dtype=torch.int64)  # shape changed: a new buffer
    second = snapshot_to_cpu(state, first, copier)
    assert second["a"].data_ptr() == ptrs["a"] and torch.equal(second["a"], torch.arange(6.0).reshape(2, 3) * 2)
    assert second["b"][0].data_ptr() == first["b"][0].data_ptr()
    assert second["c"].data_ptr() != ptrs["c"] and second["c"].shape == (5,)
    assert torch.equal(second["t"], state["t"]) and second["t"].stride() == state["t"].stride()
    assert second["t"].data_ptr() == ptrs["t"]
    state["x"] = torch.ones(2)  # a new key, a dtype change: fresh copies, right values
    state["a"] = state["a"].double()
    third = snapshot_to_cpu(state, second, copier)
    assert third["a"].dtype == torch.float64 and torch.equal(third["a"], state["a"])
    assert torch.equal(third["x"], state["x"]) and third["x"].data_ptr() != state["x"].data_ptr()


def test_prepare_allocates_the_buffers_the_first_save_copies_into(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=5)
    writer = AsyncCheckpointer(mgr)
    state = live_state()
    writer.prepare({"model": state["model"], "optimizer": state["optimizer"]})  # the big part only
    mutate(state)  # training goes on while the buffers are allocated
    writer.wait()
    buffers = writer._staging
    assert buffers is not None and mgr.committed() == []  # allocating writes no checkpoint
    ptr = buffers["model"]["0.weight"].data_ptr()
    assert ptr != state["model"]["0.weight"].data_ptr()
    writer.prepare(state)  # buffers exist: a no-op
    assert writer._staging is buffers
    expected = clone(state)
    writer.save(state, 1)
    assert writer._staging["model"]["0.weight"].data_ptr() == ptr  # the prepared buffer was used
    mutate(state)
    assert same(mgr.load(writer.wait()), expected)  # exact, whatever the buffers held


def test_a_save_right_after_prepare_waits_for_it_and_is_exact(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=5)
    writer = AsyncCheckpointer(mgr)
    state = live_state()
    writer.prepare(state)
    expected = clone(state)
    writer.save(state, 3)
    mutate(state)
    assert same(mgr.load(writer.wait()), expected)
    unbuffered = AsyncCheckpointer(mgr, reuse_buffers=False)
    unbuffered.prepare(state)
    assert unbuffered._job is None and unbuffered._staging is None  # nothing to keep buffers for


def test_snapshot_copier_must_be_known():
    with pytest.raises(ValueError, match="copier"):
        snapshot_to_cpu({"a": torch.ones(1)}, copier="dma")


def test_the_checkpointer_tries_both_copiers_and_every_checkpoint_is_exact(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=10)
    writer = AsyncCheckpointer(mgr)
    state = live_state()
    expected = {}
    for step in range(1, 6):
        expected[step] = clone(state)
        writer.save(state, step)
        mutate(state)  # while the write is (maybe) in flight
    writer.close()
    assert set(writer._copy_cost) == {"memmove", "torch"}
    for info in mgr.committed():
        assert same(mgr.load(info), expected[info.step]), info.step


def test_snapshot_keeps_ordered_dicts_and_module_metadata(tmp_path):
    """An async checkpoint is byte-identical to a sync one of the same state (load_state_dict reads
    the per-module versions in ``_metadata``)."""
    state = live_state()
    snap = snapshot_to_cpu(state)
    assert isinstance(snap["model"], collections.OrderedDict)
    assert snap["model"]._metadata == state["model"]._metadata and snap["model"]._metadata
    assert snapshot_to_cpu((1, torch.ones(1)))[0] == 1
    Point = collections.namedtuple("Point", "x y")
    p = snapshot_to_cpu(Point(torch.ones(1), 2))
    assert isinstance(p, Point) and p.y == 2

    sync_info = CheckpointManager(tmp_path / "sync").save(state, 3)
    writer = AsyncCheckpointer(CheckpointManager(tmp_path / "async"))
    writer.save(state, 3)
    async_info = writer.wait()
    assert async_info.sha256 == sync_info.sha256
    assert hashlib.sha256(async_info.path.read_bytes()).hexdigest() == sync_info.sha256


# --------------------------------------------------------------------------- one write in flight


def test_at_most_one_write_in_flight_and_a_second_save_waits(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path, keep_last=5)
    gate = Gate(mgr, monkeypatch)
    writer = AsyncCheckpointer(mgr)
    state = live_state()
    first = clone(state)
    writer.save(state, 1)
    assert gate.entered.wait(30)

    mutate(state)
    second = clone(state)
    returned = threading.Event()
    errors = []

    def save_again():
        try:
            writer.save(state, 2)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        returned.set()

    done = watch_pending_write(writer)
    t = threading.Thread(target=save_again)
    t.start()
    assert done.waited.wait(30), "the second save did not wait for the first write"
    assert not returned.is_set() and gate.calls == [1] and gate.running == 1  # the first is held at the gate
    gate.release.set()
    assert returned.wait(30)
    t.join()
    assert errors == []
    assert writer.wait().step == 2
    assert gate.max_running == 1 and gate.calls == [1, 2]
    got = {i.step: mgr.load(i) for i in mgr.committed()}
    assert same(got[1], first) and same(got[2], second)  # the first write's snapshot was not reused early


def test_save_returns_the_blocked_seconds_and_wait_flushes(tmp_path):
    mgr = CheckpointManager(tmp_path)
    writer = AsyncCheckpointer(mgr)
    assert writer.wait() is None and not writer.in_flight  # nothing pending: no-op
    blocked = writer.save(live_state(), 5, world_size=2)
    assert isinstance(blocked, float) and blocked >= 0
    info = writer.wait()
    assert not writer.in_flight
    fresh = CheckpointManager(tmp_path).latest()  # committed on disk, as another process sees it
    assert fresh is not None and (fresh.step, fresh.world_size) == (5, 2) == (info.step, info.world_size)
    assert writer.wait() is info  # idempotent


def test_wait_flushes_a_slow_write(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path)
    gate = Gate(mgr, monkeypatch)
    writer = AsyncCheckpointer(mgr)
    writer.save(live_state(), 9)
    assert gate.entered.wait(30)
    assert writer.in_flight and CheckpointManager(tmp_path).latest() is None
    done = watch_pending_write(writer)

    def release_once_waited():  # the write goes on only once wait() below is blocked on it
        done.waited.wait(30)
        gate.release.set()

    releaser = threading.Thread(target=release_once_waited)
    releaser.start()
    assert writer.wait().step == 9
    releaser.join()
    assert done.waited.is_set()  # wait() did wait for the write
    assert CheckpointManager(tmp_path).latest().step == 9


# --------------------------------------------------------------------------- errors surface


def failing_writer(tmp_path, monkeypatch, exc):
    mgr = CheckpointManager(tmp_path)

    def boom(state, step, world_size=1):
        raise exc

    monkeypatch.setattr(mgr, "save", boom)
    return AsyncCheckpointer(mgr)


def test_a_writer_error_surfaces_in_check(tmp_path, monkeypatch):
    writer = failing_writer(tmp_path, monkeypatch, RuntimeError("disk on fire"))
    writer.save(live_state(), 1)
    wait_until(lambda: not writer.in_flight, "the failed write to end")
    with pytest.raises(CheckpointError, match="background checkpoint write failed: disk on fire") as ei:
        writer.check()
    assert isinstance(ei.value.__cause__, RuntimeError)
    writer.check()  # raised once, then cleared
    assert writer.wait() is None


def test_a_checkpoint_error_surfaces_as_itself_in_wait(tmp_path, monkeypatch):
    err = CheckpointError("could not write checkpoint of step 1: no space left")
    writer = failing_writer(tmp_path, monkeypatch, err)
    writer.save(live_state(), 1)
    with pytest.raises(CheckpointError) as ei:
        writer.wait()
    assert ei.value is err


def test_a_writer_error_surfaces_in_the_next_save_which_writes_nothing(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path)
    real = mgr.save
    calls = []

    def first_fails(state, step, world_size=1):
        calls.append(step)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(state, step, world_size=world_size)

    monkeypatch.setattr(mgr, "save", first_fails)
    writer = AsyncCheckpointer(mgr)
    writer.save(live_state(), 1)
    with pytest.raises(CheckpointError, match="No space left on device"):
        writer.save(live_state(), 2)
    assert calls == [1] and not writer.in_flight  # the failed save started no write
    writer.save(live_state(), 3)  # the error was reported once; the writer goes on
    assert writer.wait().step == 3 and calls == [1, 3]


def test_an_unwritable_directory_surfaces_as_a_checkpoint_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")  # chmod would not stop root; a file in the way does
    writer = AsyncCheckpointer(CheckpointManager(blocker / "ckpt"))
    writer.save(live_state(), 4)
    with pytest.raises(CheckpointError, match="step 4"):
        writer.wait()


def test_a_state_that_cannot_be_pickled_surfaces(tmp_path):
    writer = AsyncCheckpointer(CheckpointManager(tmp_path))
    state = live_state()
    state["hook"] = lambda: None
    writer.save(state, 6)
    wait_until(lambda: not writer.in_flight, "the failed write to end")
    with pytest.raises(CheckpointError, match="background checkpoint write failed"):
        writer.check()
    assert CheckpointManager(tmp_path).latest() is None
    assert [p.name for p in Path(tmp_path).iterdir()] == []  # the temporary file was removed


# --------------------------------------------------------------------------- the writer thread


def test_one_writer_thread_serves_every_save_and_ends_with_close(tmp_path):
    writer = AsyncCheckpointer(CheckpointManager(tmp_path, keep_last=3))
    assert writer._worker is None  # no thread until the first save
    threads = set()
    for step in (1, 2, 3):
        writer.save(live_state(step), step)
        threads.add(writer._worker)
    (thread,) = threads
    assert thread.is_alive() and thread.name == "checkpoint-writer" and thread.daemon
    assert writer.close().step == 3
    assert not thread.is_alive()
    writer.save(live_state(4), 4)  # usable after close: a new thread
    assert writer._worker is not thread
    assert writer.close().step == 4
    assert CheckpointManager(tmp_path).latest().step == 4


def test_the_writer_thread_ends_when_the_checkpointer_is_garbage_collected(tmp_path):
    import gc

    writer = AsyncCheckpointer(CheckpointManager(tmp_path))
    writer.save(live_state(), 1)
    writer.wait()
    thread = writer._worker
    del writer
    gc.collect()
    wait_until(lambda: not thread.is_alive(), "the writer thread to end")


# --------------------------------------------------------------------------- the write path (sync and async)


def helper_threads():
    return [t for t in threading.enumerate() if t.name.startswith(("checkpoint-hash", "checkpoint-writeback"))]


@pytest.mark.parametrize(
    "sizes",
    [
        [10, 0, 3],  # small: hashed inline
        [100, (1 << 20) + 7, 5, 9 << 20, 0, 1],  # large ones: read back and hashed by a helper
        [(4 << 20) * 3, 1 << 20, (1 << 20) - 1, 17],  # exact pieces, then just below the threshold
    ],
)
def test_atomic_write_hashes_exactly_what_it_wrote(tmp_path, sizes):
    import os

    from slurm_ddp.checkpoint import atomic_write

    chunks = [os.urandom(n) for n in sizes]
    size, digest = atomic_write(tmp_path / "f.bin", lambda f: [f.write(c) for c in chunks])
    data = b"".join(chunks)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    assert helper_threads() == []


def test_atomic_write_of_typed_buffers(tmp_path):
    import array

    from slurm_ddp.checkpoint import atomic_write

    doubles = array.array("d", range(300_000))  # 2.4 MB, itemsize 8: counted in bytes
    size, digest = atomic_write(tmp_path / "d.bin", lambda f: f.write(doubles))
    assert size == len(doubles.tobytes()) and digest == hashlib.sha256(doubles.tobytes()).hexdigest()


def test_a_write_that_fails_after_large_pieces_stops_the_helpers_and_leaves_nothing(tmp_path):
    from slurm_ddp.checkpoint import atomic_write

    def writer(f):
        f.write(b"x" * (9 << 20))
        raise RuntimeError("serialization failed halfway")

    with pytest.raises(RuntimeError, match="halfway"):
        atomic_write(tmp_path / "f.bin", writer)
    assert list(tmp_path.iterdir()) == [] and helper_threads() == []


def test_a_large_checkpoint_round_trips_through_both_modes(tmp_path):
    state = {"big": torch.randn(3 << 20), "small": torch.arange(5), "nested": [torch.randn(1 << 19)]}
    sync = CheckpointManager(tmp_path / "s").save(state, 1)
    writer = AsyncCheckpointer(CheckpointManager(tmp_path / "a"))
    writer.save(state, 1)
    info = writer.close()
    assert info.sha256 == sync.sha256 == hashlib.sha256(sync.path.read_bytes()).hexdigest()
    assert same(CheckpointManager(tmp_path / "a").load(), state)


def test_the_hashing_writer_falls_back_to_inline_hashing_on_a_write_only_file(tmp_path):
    from slurm_ddp.checkpoint import _HashingWriter

    data = bytes(range(256)) * (12 << 12)  # 12 MiB
    with open(tmp_path / "w.bin", "wb") as f:  # O_WRONLY: nothing to read back
        hw = _HashingWriter(f)
        hw.write(data)
        hw.finish()
        hw.close()
    assert (hw.size, hw.sha256.hexdigest()) == (len(data), hashlib.sha256(data).hexdigest())
    assert (tmp_path / "w.bin").read_bytes() == data and helper_threads() == []
