"""Checkpoints (atomic save, manifest, latest-valid discovery, retention, weights-only load) and
the preemption flag (a signal only sets a flag; handlers restored; ``sync`` without a group)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import time
from pathlib import Path

import pytest
from lib import require_module, wait_for

torch = require_module("torch")

from slurm_ddp.checkpoint import CheckpointManager, atomic_write, atomic_write_text  # noqa: E402
from slurm_ddp.errors import CheckpointError  # noqa: E402
from slurm_ddp.signals import PreemptionFlag, to_signal  # noqa: E402

LOGGER = "slurm_ddp.checkpoint"


def state(step: int) -> dict:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"weight": torch.randn(4, 3, generator=g), "bias": torch.zeros(4)},
        "optimizer": {"state": {}, "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
        "step": step,
        "rng": torch.get_rng_state(),
        "name": "unit",
    }


def saved(directory: Path, steps, keep_last: int = 10) -> CheckpointManager:
    mgr = CheckpointManager(directory, keep_last=keep_last, config_hash="cafe")
    for s in steps:
        mgr.save(state(s), s, world_size=2)
    return mgr


def flip_byte(path: Path, offset: int = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


# --------------------------------------------------------------------------- save / latest / load


def test_round_trip(tmp_path):
    mgr = saved(tmp_path / "ckpt", [10])
    info = mgr.latest()
    assert info is not None and info.step == 10 and info.world_size == 2 and info.config_hash == "cafe"
    loaded = mgr.load()
    expected = state(10)
    assert torch.equal(loaded["model"]["weight"], expected["model"]["weight"])
    assert torch.equal(loaded["model"]["bias"], expected["model"]["bias"])
    assert torch.equal(loaded["rng"], expected["rng"])
    assert loaded["optimizer"] == expected["optimizer"]
    assert (loaded["step"], loaded["name"]) == (10, "unit")
    assert mgr.load(info)["step"] == 10


def test_empty_or_missing_directory(tmp_path):
    mgr = CheckpointManager(tmp_path / "nothing-here")
    assert mgr.committed() == [] and mgr.latest() is None and mgr.load() is None
    mgr.prune()  # nothing to do, no error


def test_latest_is_the_highest_step(tmp_path):
    mgr = saved(tmp_path, [5, 100, 20])
    assert [i.step for i in mgr.committed()] == [5, 20, 100]
    assert mgr.latest().step == 100


def test_manifest_fields(tmp_path):
    before = time.time()
    mgr = saved(tmp_path, [7])
    after = time.time()
    manifest = json.loads((tmp_path / "step-00000007.json").read_text())
    data = tmp_path / "step-00000007.pt"
    assert set(manifest) == {
        "step",
        "file",
        "world_size",
        "config_hash",
        "size_bytes",
        "sha256",
        "created",
        "torch_version",
    }
    assert manifest["step"] == 7 and manifest["file"] == "step-00000007.pt"
    assert manifest["world_size"] == 2 and manifest["config_hash"] == "cafe"
    assert manifest["size_bytes"] == data.stat().st_size
    assert manifest["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert manifest["torch_version"] == torch.__version__
    assert before <= manifest["created"] <= after  # the wall-clock time of the save
    info = mgr.latest()
    assert (info.path, info.manifest, info.size_bytes, info.sha256) == (
        data,
        tmp_path / "step-00000007.json",
        manifest["size_bytes"],
        manifest["sha256"],
    )


class _RunsCode:
    """Unpickling this calls ``os.mkdir(marker)``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_load_is_weights_only(tmp_path):
    marker = tmp_path / "code-ran"
    mgr = CheckpointManager(tmp_path / "ckpt")
    mgr.save({"model": {"w": torch.ones(1)}, "payload": _RunsCode(marker)}, 1)
    assert mgr.latest().step == 1  # a valid file, as far as size and checksum go
    with pytest.raises(CheckpointError) as ei:
        mgr.load()
    assert "step-00000001.pt" in str(ei.value)
    assert not marker.exists()


# --------------------------------------------------------------------------- retention


def test_keep_last_keeps_the_newest_n(tmp_path):
    mgr = saved(tmp_path, [1, 2, 3, 4, 5], keep_last=2)
    assert [i.step for i in mgr.committed()] == [4, 5]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step-00000004.json",
        "step-00000004.pt",
        "step-00000005.json",
        "step-00000005.pt",
    ]


def test_keep_last_one(tmp_path):
    mgr = saved(tmp_path, [1, 2, 3], keep_last=1)
    assert [i.step for i in mgr.committed()] == [3]
    assert mgr.load()["step"] == 3


def test_retention_never_deletes_the_newest_valid_checkpoint(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    mgr = saved(tmp_path, [1, 2, 3], keep_last=3)
    flip_byte(tmp_path / "step-00000002.pt")
    flip_byte(tmp_path / "step-00000003.pt")
    mgr = CheckpointManager(tmp_path, keep_last=2)
    mgr.prune()  # would drop step 1, the only valid one
    assert [i.step for i in mgr.committed()] == [1, 2, 3]
    assert mgr.latest().step == 1
    one = CheckpointManager(tmp_path, keep_last=1)
    one.prune()
    assert 1 in [i.step for i in one.committed()]
    assert one.load()["step"] == 1


def test_a_new_save_prunes_what_is_old(tmp_path):
    mgr = saved(tmp_path, [1, 2, 3], keep_last=3)
    flip_byte(tmp_path / "step-00000003.pt")
    mgr = CheckpointManager(tmp_path, keep_last=1)
    mgr.save(state(4), 4)
    assert [i.step for i in mgr.committed()] == [4]


def test_keep_last_must_be_positive(tmp_path):
    with pytest.raises(ValueError):
        CheckpointManager(tmp_path, keep_last=0)


# --------------------------------------------------------------------------- damaged checkpoints


def test_truncated_newest_falls_back_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    mgr = saved(tmp_path, [1, 2])
    data = tmp_path / "step-00000002.pt"
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    info = mgr.latest()
    assert info.step == 1
    assert mgr.load()["step"] == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
    assert any("step 2" in r.getMessage() and "truncated" in r.getMessage() for r in warnings)


def test_flipped_byte_falls_back_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    mgr = saved(tmp_path, [1, 2])
    flip_byte(tmp_path / "step-00000002.pt")
    assert mgr.latest().step == 1
    assert any("step 2" in r.getMessage() and "sha256" in r.getMessage() for r in caplog.records)


def test_missing_data_file_falls_back(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    mgr = saved(tmp_path, [1, 2])
    (tmp_path / "step-00000002.pt").unlink()
    assert mgr.latest().step == 1
    assert any("data file missing" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("text", ["", "{not json", '{"step": 2}', "[]"])
def test_unreadable_manifest_is_skipped(tmp_path, caplog, text):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    mgr = saved(tmp_path, [1, 2])
    (tmp_path / "step-00000002.json").write_text(text)
    assert [i.step for i in mgr.committed()] == [1]
    assert mgr.latest().step == 1
    assert any("step-00000002.json" in r.getMessage() for r in caplog.records)


def test_all_damaged_means_no_checkpoint(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    mgr = saved(tmp_path, [1])
    flip_byte(tmp_path / "step-00000001.pt")
    assert mgr.latest() is None and mgr.load() is None


def test_leftover_tmp_files_are_ignored(tmp_path):
    mgr = saved(tmp_path, [3])
    (tmp_path / ".step-00000009.pt.abc123.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / ".step-00000009.json.def456.tmp").write_text('{"step": 9}')
    (tmp_path / "step-00000009.json.tmp").write_text("{}")
    assert [i.step for i in mgr.committed()] == [3]
    assert mgr.latest().step == 3 and mgr.load()["step"] == 3


def test_old_tmp_files_are_cleaned_when_pruning(tmp_path):
    mgr = saved(tmp_path, [1], keep_last=1)
    old = tmp_path / ".step-00000002.pt.zzz.tmp"
    fresh = tmp_path / ".step-00000003.pt.yyy.tmp"  # maybe being written right now: kept
    old.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    mgr.save(state(2), 2)
    assert not old.exists() and fresh.exists()


# --------------------------------------------------------------------------- atomic_write


def test_per_rank_states_are_committed_by_the_one_manifest(tmp_path):
    mgr = CheckpointManager(tmp_path / "ckpt", keep_last=1)
    for rank in range(3):
        mgr.save_rank_state({"torch": torch.full((3,), rank)}, 7, rank)
    info = mgr.save(state(7), 7, world_size=3, rank_states=3)
    assert json.loads(info.manifest.read_text())["rank_states"] == 3
    latest = mgr.latest()
    assert latest is not None and latest.rank_states == 3
    assert [int(mgr.load_rank_state(latest, r)["torch"][0]) for r in range(3)] == [0, 1, 2]
    with pytest.raises(CheckpointError, match="no state of rank 3"):
        mgr.load_rank_state(latest, 3)
    # a missing rank file makes the checkpoint invalid: the older one is used
    for rank in range(3):
        mgr.save_rank_state({"torch": torch.zeros(1)}, 9, rank)
    mgr.keep_last = 2
    mgr.save(state(9), 9, world_size=3, rank_states=3)
    mgr.rank_state_path(9, 1).unlink()
    assert mgr.verify(mgr.committed()[-1]) == "rank 1's state file is missing"
    assert mgr.latest().step == 7
    # pruning deletes a checkpoint's rank files with it, and rank files that were never committed
    mgr.save_rank_state({"torch": torch.zeros(1)}, 8, 0)  # a save that never committed
    mgr.keep_last = 1
    for rank in range(3):
        mgr.save_rank_state({"torch": torch.zeros(1)}, 11, rank)
    mgr.save(state(11), 11, world_size=3, rank_states=3)
    left = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if ".rank-" in p.name)
    assert left == [f"step-00000011.rank-0000{r}.pt" for r in range(3)]


def test_a_manifest_without_rank_states_has_none(tmp_path):
    """Checkpoints written before per-rank files stay loadable: their manifest lacks the field."""
    mgr = saved(tmp_path / "ckpt", [5])
    m = json.loads(mgr.committed()[0].manifest.read_text())
    assert "rank_states" not in m
    assert mgr.latest().rank_states == 0 and mgr.load()["step"] == 5


def rank_saved(mgr: CheckpointManager, step: int, ranks: int = 3, digests: bool = True):
    """Rank files and their commit, as ``Trainer.save_checkpoint`` does it (digests from the writes)."""
    got = [mgr.save_rank_state({"torch": torch.full((3,), step * 10 + r)}, step, r) for r in range(ranks)]
    return mgr.save(state(step), step, world_size=ranks, rank_states=ranks, rank_digests=got if digests else None)


def test_rank_files_size_and_sha256_are_in_the_manifest(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    info = rank_saved(mgr, 4)
    m = json.loads(info.manifest.read_text())
    for r in range(3):
        path = mgr.rank_state_path(4, r)
        assert m["rank_states_size_bytes"][r] == path.stat().st_size
        assert m["rank_states_sha256"][r] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert mgr.committed()[0].rank_digests == info.rank_digests and mgr.verify(info) is None
    with pytest.raises(ValueError, match="2 entries"):
        mgr.save(state(5), 5, world_size=3, rank_states=3, rank_digests=info.rank_digests[:2])


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing"])
def test_a_damaged_rank_file_falls_back_to_the_previous_checkpoint(tmp_path, caplog, damage):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    mgr = CheckpointManager(tmp_path, keep_last=3)
    rank_saved(mgr, 1)
    rank_saved(mgr, 2)
    path = mgr.rank_state_path(2, 1)
    if damage == "flip":
        flip_byte(path)
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:-5])
    else:
        path.unlink()
    problem = mgr.verify(mgr.committed()[-1])
    assert problem is not None and "rank 1" in problem
    want = {"flip": "sha256", "truncate": "truncated", "missing": "missing"}[damage]
    assert want in problem
    latest = mgr.latest()  # what the resume uses: the newest valid checkpoint
    assert latest is not None and latest.step == 1
    assert [int(mgr.load_rank_state(latest, r)["torch"][0]) for r in range(3)] == [10, 11, 12]
    assert mgr.load(latest)["step"] == 1  # as Trainer.resume: latest() once, then load(info)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name == LOGGER]
    assert len(warnings) == 1 and "step 2" in warnings[0] and "rank 1" in warnings[0]


def test_a_manifest_with_rank_states_but_no_digests_still_loads(tmp_path):
    """A checkpoint committed before digests were recorded: presence of the rank files only."""
    mgr = CheckpointManager(tmp_path, keep_last=3)
    info = rank_saved(mgr, 6, digests=False)
    m = json.loads(info.manifest.read_text())
    assert m["rank_states"] == 3 and "rank_states_sha256" not in m and "rank_states_size_bytes" not in m
    flip_byte(mgr.rank_state_path(6, 2), offset=0)  # undetectable without a digest: still valid
    latest = mgr.latest()
    assert latest is not None and latest.step == 6 and latest.rank_digests == ()
    assert int(mgr.load_rank_state(latest, 1)["torch"][0]) == 61 and mgr.load()["step"] == 6


def test_a_manifest_with_mismatched_rank_digests_is_skipped(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    mgr = CheckpointManager(tmp_path, keep_last=3)
    rank_saved(mgr, 1)
    info = rank_saved(mgr, 2)
    m = json.loads(info.manifest.read_text())
    m["rank_states_sha256"] = m["rank_states_sha256"][:2]
    info.manifest.write_text(json.dumps(m))
    assert mgr.latest().step == 1


def test_the_async_writer_commits_the_rank_digests(tmp_path):
    from slurm_ddp.checkpoint import AsyncCheckpointer

    mgr = CheckpointManager(tmp_path, keep_last=3)
    got = [mgr.save_rank_state({"torch": torch.zeros(2)}, 3, r) for r in range(2)]
    writer = AsyncCheckpointer(mgr)
    try:
        writer.save(state(3), 3, world_size=2, rank_states=2, rank_digests=got)
        info = writer.wait()
    finally:
        writer.close()
    assert info is not None and info.rank_digests == tuple(got)
    assert mgr.committed()[-1].rank_digests == tuple(got) and mgr.verify(info) is None


def test_gather_rank_digests_round_trips_through_a_process_group(tmp_path):
    import torch.distributed as dist

    from slurm_ddp.worker.train import gather_rank_digests

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mine = (12345678901, hashlib.sha256(b"rank 0").hexdigest())
        assert gather_rank_digests(mine, torch.device("cpu")) == [mine]
    finally:
        dist.destroy_process_group()


def test_atomic_write_returns_size_and_sha256(tmp_path):
    path = tmp_path / "f.bin"
    size, digest = atomic_write(path, lambda f: (f.write(b"hello "), f.write(b"world")))
    assert path.read_bytes() == b"hello world"
    assert (size, digest) == (11, hashlib.sha256(b"hello world").hexdigest())
    assert os.listdir(tmp_path) == ["f.bin"]


def test_atomic_write_keeps_the_old_file_when_the_writer_raises(tmp_path):
    path = tmp_path / "f.txt"
    atomic_write_text(path, "old contents\n")

    def writer(f):
        f.write(b"new contents, half")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        atomic_write(path, writer)
    assert path.read_text() == "old contents\n"
    assert os.listdir(tmp_path) == ["f.txt"]  # the temporary file is gone


def test_atomic_write_of_a_new_file_that_fails_leaves_nothing(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "new.bin", lambda f: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert os.listdir(tmp_path) == []


def test_save_into_an_unwritable_place_is_a_checkpoint_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    mgr = CheckpointManager(blocker / "ckpt")
    with pytest.raises(CheckpointError) as ei:
        mgr.save(state(1), 1)
    assert "step 1" in str(ei.value)


# --------------------------------------------------------------------------- PreemptionFlag


@pytest.fixture
def usr2_original():
    """A known Python handler for SIGUSR2 during the test; the real original is put back after."""
    before = signal.getsignal(signal.SIGUSR2)

    def original(signum, frame):  # pragma: no cover - must not be called
        raise AssertionError("the original handler ran instead of the flag's")

    signal.signal(signal.SIGUSR2, original)
    yield original
    signal.signal(signal.SIGUSR2, before)


def test_signal_sets_the_flag(usr2_original):
    flag = PreemptionFlag(["USR2"]).install()
    try:
        assert flag.received is None
        os.kill(os.getpid(), signal.SIGUSR2)  # any thread may take it: the handler runs soon after, on the main one
        wait_for(lambda: flag.received is not None, 30, "the handler to set the flag", interval_s=0.005)
        assert flag.received == signal.SIGUSR2
    finally:
        flag.restore()


def test_the_heaviest_signal_is_recorded(usr2_original):
    """SIGTERM after the requeue signal makes the stop SIGTERM's (rundir.stop_precedence); not the reverse."""
    before_term = signal.getsignal(signal.SIGTERM)
    with PreemptionFlag(["USR2", "SIGTERM"]) as flag:
        # raise_signal: delivered to this (the main) thread, its Python handler has run when it returns
        signal.raise_signal(signal.SIGUSR2)
        assert flag.received == signal.SIGUSR2
        signal.raise_signal(signal.SIGTERM)  # handled by the flag: the process lives on
        assert flag.received == signal.SIGTERM
        signal.raise_signal(signal.SIGUSR2)
        assert flag.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before_term


def test_restore_puts_back_the_original_handler(usr2_original):
    flag = PreemptionFlag(["USR2"]).install()
    assert signal.getsignal(signal.SIGUSR2) != usr2_original
    flag.restore()
    assert signal.getsignal(signal.SIGUSR2) is usr2_original


def test_restore_after_installing_twice_puts_back_the_original(usr2_original):
    flag = PreemptionFlag(["USR2"])
    flag.install()
    flag.install()
    flag.restore()
    assert signal.getsignal(signal.SIGUSR2) is usr2_original


def test_context_manager_restores(usr2_original):
    with PreemptionFlag(["USR2"]):
        assert signal.getsignal(signal.SIGUSR2) is not usr2_original
    assert signal.getsignal(signal.SIGUSR2) is usr2_original


def test_default_handler_is_restored_as_default():
    before = signal.getsignal(signal.SIGUSR2)
    signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        with PreemptionFlag(["USR2"]):
            pass
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_sync_without_a_process_group_returns_the_local_flag():
    import torch.distributed as dist

    assert not (dist.is_available() and dist.is_initialized())
    flag = PreemptionFlag(["USR2"])  # not installed: sync only reads the flag
    assert flag.sync() is False
    flag.set("TERM")
    assert flag.sync() is True and flag.received == signal.SIGTERM


def test_install_off_the_main_thread_is_refused():
    import threading

    errors = []
    t = threading.Thread(target=lambda: errors.append(_try_install()))
    t.start()
    t.join()
    assert errors and isinstance(errors[0], RuntimeError) and "main thread" in str(errors[0])


def _try_install():
    try:
        PreemptionFlag(["USR2"]).install()
    except RuntimeError as e:
        return e
    return None


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("USR2", signal.SIGUSR2),
        ("usr2", signal.SIGUSR2),
        ("SIGTERM", signal.SIGTERM),
        (15, signal.SIGTERM),
        (signal.SIGINT, signal.SIGINT),
    ],
)
def test_to_signal(spec, expected):
    assert to_signal(spec) == expected


def test_to_signal_unknown():
    with pytest.raises(ValueError, match="unknown signal 'USR3'"):
        to_signal("USR3")


# --------------------------------------------------------------------------- emergency checkpoints (one writer)


def test_emergency_checkpoint_is_one_claimants_and_says_so_in_its_manifest(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    assert mgr.claim(7) and not mgr.claim(7) and not CheckpointManager(tmp_path).claim(7)  # one claimant, any process
    record = {"rank": 1, "host": "n2", "why": "peer lost"}
    info = mgr.save(state(7), 7, world_size=4, emergency=record)
    mgr.end_claim(7, "committed")
    assert mgr.wait_claim(7, timeout_s=0) == "committed"
    again = mgr.latest()
    assert again.step == 7 and again.emergency == record == info.emergency and again.rank_states == 0
    assert json.loads(again.manifest.read_text())["emergency"] == record
    assert mgr.load(again)["step"] == 7
    mgr.save(state(8), 8)
    assert mgr.latest().emergency is None


def test_waiting_for_a_claim_that_never_ends_gives_up(tmp_path):
    mgr = CheckpointManager(tmp_path)
    assert mgr.wait_claim(3, timeout_s=0) is None  # no claim at all
    assert mgr.claim(3)
    t0 = time.monotonic()
    assert mgr.wait_claim(3, timeout_s=0.3, poll_s=0.05) is None  # the claimant died mid-save
    assert time.monotonic() - t0 >= 0.3


def test_claims_of_pruned_steps_are_removed(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=1)
    assert mgr.claim(1)
    mgr.save(state(1), 1, emergency={"rank": 0})
    mgr.save(state(2), 2)
    mgr.save(state(3), 3)
    assert not mgr.claim_path(1).exists() and [i.step for i in mgr.committed()] == [3]


def test_write_once_runs_the_first_callers_write_and_tells_the_others(tmp_path):
    from slurm_ddp.checkpoint import write_once

    claim = tmp_path / "recovery" / "peer-lost.9.0.0.save.claim"  # parents are created
    calls = []
    assert write_once(claim, lambda: calls.append("first"), timeout_s=0) == (True, "committed")
    assert write_once(claim, lambda: calls.append("second"), timeout_s=0) == (False, "committed")
    assert calls == ["first"] and claim.read_text() == "committed\n"


def test_write_once_records_a_failed_write_and_reraises_it(tmp_path):
    from slurm_ddp.checkpoint import write_once

    def boom() -> None:
        raise OSError("disk full\nsecond line")

    mgr = CheckpointManager(tmp_path)
    with pytest.raises(OSError, match="disk full"):
        mgr.write_once(4, boom, timeout_s=0)
    assert mgr.wait_claim(4, timeout_s=0) == "failed: disk full second line"  # one line
    assert write_once(mgr.claim_path(4), lambda: None, timeout_s=0) == (False, "failed: disk full second line")
