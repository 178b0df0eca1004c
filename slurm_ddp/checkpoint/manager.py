"""Checkpoints in one directory and their manifests: ``CheckpointManager``, ``CheckpointInfo``.

Side effects: writes, renames and deletes files in the checkpoint directory (``save``, ``prune``);
logs skipped manifests and invalid checkpoints on the ``slurm_ddp.checkpoint`` logger. Imports
torch only inside ``save`` and ``load``: ``committed``/``verify``/``latest`` run on a login node
(``slurm_ddp.rundir`` reads the newest committed step with ``committed(quiet=True)``). This module
alone knows the manifest's file-name pattern and its fields.

A checkpoint is two files: ``step-00000120.pt`` (``torch.save`` of a dict) and
``step-00000120.json``, its manifest (step, world size, config hash, byte size, sha256,
and the data file's name: a step saved again while committed goes to ``step-00000120.1.pt``,
so the committed data is never overwritten in place).

Per-rank state (each rank's RNG streams: a few kB per rank) is not gathered to rank 0: every rank
writes its own ``step-00000120.rank-00003.pt`` (``save_rank_state``, atomic and durable) before the
checkpoint is committed, and the manifest's ``rank_states`` field (the number of such files) commits
them together with the data file. ``rank_states_size_bytes`` and ``rank_states_sha256`` (lists, by
rank) record each file's size and digest (each rank hashes its own file while writing it; rank 0 gets
the digests through the collective that orders the writes before the commit), so a truncated or
corrupted rank file invalidates its checkpoint like a damaged data file. A manifest without
``rank_states`` (an older checkpoint) has none; its data file holds the gathered states itself; one
with ``rank_states`` but no digests is checked for the files' presence only.
The commit protocol (what makes a crash at any instant leave a valid latest checkpoint):

1. write the data to a temporary name in the same directory, ``fsync`` it, ``rename`` it;
2. write the manifest the same way, last: the manifest is the commit marker;
3. ``fsync`` the directory so both renames survive a power loss (rename(2) is atomic,
   but durable only once the directory entry is flushed; see fsync(2) NOTES).

An *emergency* checkpoint is one rank's alone, when its peers are gone and no collective can run
(a lost node): every DDP rank holds the whole model and optimizer state of the last completed step,
so the first survivor to ``claim`` the step (an exclusive file create) commits it with no per-rank
states and an ``emergency`` record in the manifest; the worker resumes it exactly on the same world
size (each step's random streams derive from the seed, rank and step: ``worker.runtime.step_seed``) and
sample-exactly on another.

``latest()`` is the newest checkpoint whose manifest parses and whose data file has the
recorded size and sha256; a truncated or corrupted one is reported and skipped.
``keep_last`` retention never deletes the newest valid checkpoint. Loading uses
``torch.load(weights_only=True)``: a checkpoint file cannot run code.
"""

from __future__ import annotations

import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..durable import (
    PathArg,
    atomic_write,
    atomic_write_text,
    claim_file,
    end_claim_file,
    sha256_file,
    wait_claim_file,
    write_once,
)
from ..errors import CheckpointError

log = logging.getLogger("slurm_ddp.checkpoint")
#: a manifest's file name: ``step-`` and the step, zero-padded to 8 digits or more
_NAME = re.compile(r"^step-(\d{8,})\.json$")
#: a per-rank state file's name: the step and the rank
_RANK_NAME = re.compile(r"^step-(\d{8,})\.rank-(\d{5,})\.pt$")
#: a claim on writing the checkpoint of a step (``claim``): the step
_CLAIM_NAME = re.compile(r"^step-(\d{8,})\.claim$")


@dataclass(frozen=True)
class CheckpointInfo:
    """One committed checkpoint, as its manifest describes it."""

    step: int
    path: Path  #: the data file (``step-NNNNNNNN.pt``)
    manifest: Path
    world_size: int
    config_hash: str
    size_bytes: int
    sha256: str
    created: float  #: time.time() when committed
    rank_states: int = 0  #: per-rank state files committed with it (ranks 0..N-1); 0: none
    #: each rank file's ``(size_bytes, sha256)``, by rank; empty: not recorded (an older manifest)
    rank_digests: Tuple[Tuple[int, str], ...] = ()
    #: the manifest's ``emergency`` record (who wrote it, why) when one rank alone committed it
    #: (a survivor of a lost peer: ``claim``); None for a checkpoint the ranks committed together
    emergency: Optional[Dict[str, Any]] = None


class CheckpointManager:
    """Save, find and load checkpoints in ``directory``; call ``save`` on rank 0 only.

    ``keep_last``: how many committed checkpoints to keep (>= 1). ``config_hash``: recorded
    in each manifest so a resume can tell a checkpoint of another config.
    """

    def __init__(self, directory: PathArg, keep_last: int = 2, config_hash: str = ""):
        if keep_last < 1:
            raise ValueError("keep_last must be >= 1")
        self.directory = Path(directory)
        self.keep_last = keep_last
        self.config_hash = config_hash

    def _paths(self, step: int) -> Tuple[Path, Path]:
        stem = f"step-{step:08d}"
        return self.directory / f"{stem}.pt", self.directory / f"{stem}.json"

    def rank_state_path(self, step: int, rank: int) -> Path:
        """The per-rank state file of ``rank`` for the checkpoint of ``step``."""
        return self.directory / f"step-{step:08d}.rank-{rank:05d}.pt"

    def save_rank_state(self, state: Dict[str, Any], step: int, rank: int) -> Tuple[int, str]:
        """Write ``rank``'s own state for the checkpoint of ``step`` (every rank, before rank 0's ``save``
        with ``rank_states``: the caller makes sure all are written first, e.g. with a barrier).

        Atomic and durable; not committed until a manifest names it. Returns ``(size_bytes, sha256_hex)``
        of the file (hashed while writing: pass them to ``save``'s ``rank_digests``).
        Raises ``CheckpointError`` when it cannot be written.
        """
        import torch

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            size, digest = atomic_write(self.rank_state_path(step, rank), lambda f: torch.save(state, f))
        except OSError as e:
            raise CheckpointError(f"could not write rank {rank}'s state of step {step} to {self.directory}: {e}") from e
        return size, digest

    def load_rank_state(self, info: CheckpointInfo, rank: int) -> Dict[str, Any]:
        """``rank``'s own state committed with ``info`` (``torch.load(weights_only=True)``).

        Raises ``CheckpointError`` when ``info`` has no state for ``rank`` or it cannot be loaded.
        """
        import torch

        if not 0 <= rank < info.rank_states:
            raise CheckpointError(
                f"checkpoint of step {info.step} has no state of rank {rank} ({info.rank_states} ranks)"
            )
        path = self.rank_state_path(info.step, rank)
        try:
            state: Dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # missing or corrupted: data corruption, not a bug here
            raise CheckpointError(f"could not load rank {rank}'s state {path}: {e}") from e
        return state

    def save(
        self,
        state: Dict[str, Any],
        step: int,
        world_size: int = 1,
        rank_states: int = 0,
        rank_digests: Optional[Sequence[Tuple[int, str]]] = None,
        emergency: Optional[Dict[str, Any]] = None,
    ) -> CheckpointInfo:
        """Commit ``state`` (a dict of tensors/containers/primitives) as the checkpoint of ``step``.

        ``rank_states``: how many per-rank state files (``save_rank_state``, ranks 0..N-1, already
        written) this commit includes; ``rank_digests``: their ``(size_bytes, sha256_hex)`` by rank, as
        ``save_rank_state`` returned them (None: not recorded; else one per rank). ``emergency``: a
        JSON-able record for a checkpoint one rank wrote alone (no per-rank states: a resume takes it as
        a checkpoint of another world size), kept in the manifest. Durable and atomic (see the module
        docstring); prunes to ``keep_last`` afterwards. Raises ``CheckpointError`` when the data cannot be written.
        """
        import torch

        digests = tuple((int(n), str(h)) for n, h in rank_digests or ())
        if digests and len(digests) != rank_states:
            raise ValueError(f"rank_digests has {len(digests)} entries for rank_states={rank_states}")
        data_path, manifest_path = self._paths(step)
        # Saving a step that is already committed (a preemption save right after the periodic save
        # of the same step): never overwrite the data file the committed manifest vouches for, or a
        # crash between the two renames leaves a manifest whose data no longer matches it, and no
        # valid checkpoint at all with keep_last=1. Write the other of two names; the new manifest
        # switches to it atomically, and the superseded file is deleted after the commit.
        superseded = self._committed_data_file(manifest_path)
        if superseded is not None and superseded.name == data_path.name:
            data_path = data_path.with_name(f"{data_path.stem}.1{data_path.suffix}")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # the directory's fsync after the manifest's rename makes both renames durable
            size, digest = atomic_write(data_path, lambda f: torch.save(state, f), sync_dir=False)
            info = CheckpointInfo(
                step=step,
                path=data_path,
                manifest=manifest_path,
                world_size=world_size,
                config_hash=self.config_hash,
                size_bytes=size,
                sha256=digest,
                created=time.time(),
                rank_states=rank_states,
                rank_digests=digests,
                emergency=emergency,
            )
            manifest: Dict[str, Any] = {
                "step": step,
                "file": data_path.name,
                "world_size": world_size,
                "config_hash": self.config_hash,
                "size_bytes": size,
                "sha256": digest,
                "created": info.created,
                "torch_version": torch.__version__,
            }
            if rank_states:
                manifest["rank_states"] = rank_states
            if digests:
                manifest["rank_states_size_bytes"] = [n for n, _ in digests]
                manifest["rank_states_sha256"] = [h for _, h in digests]
            if emergency is not None:
                manifest["emergency"] = emergency
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1) + "\n")
        except OSError as e:
            raise CheckpointError(f"could not write checkpoint of step {step} to {self.directory}: {e}") from e
        if superseded is not None and superseded != data_path:
            superseded.unlink(missing_ok=True)  # no manifest refers to it any more
        self.prune(newest_valid=info)
        return info

    @staticmethod
    def _committed_data_file(manifest: Path) -> Optional[Path]:
        """The data file an existing manifest refers to (None: no manifest, or an unreadable one)."""
        try:
            return manifest.with_name(str(json.loads(manifest.read_text())["file"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _read_manifest(self, manifest: Path, quiet: bool = False) -> Optional[CheckpointInfo]:
        try:
            m = json.loads(manifest.read_text())
            if not isinstance(m, dict):
                raise ValueError("not a JSON object")
            rank_states = int(m.get("rank_states", 0))
            sizes, hashes = m.get("rank_states_size_bytes", []), m.get("rank_states_sha256", [])
            if len(sizes) != len(hashes) or (sizes and len(sizes) != rank_states):
                raise ValueError(f"{len(sizes)} rank sizes and {len(hashes)} rank digests for {rank_states} ranks")
            return CheckpointInfo(
                step=int(m["step"]),
                path=manifest.with_name(m["file"]),
                manifest=manifest,
                world_size=int(m["world_size"]),
                config_hash=str(m.get("config_hash", "")),
                size_bytes=int(m["size_bytes"]),
                sha256=str(m["sha256"]),
                created=float(m.get("created", 0.0)),
                rank_states=rank_states,
                rank_digests=tuple((int(n), str(h)) for n, h in zip(sizes, hashes)),
                emergency=m["emergency"] if isinstance(m.get("emergency"), dict) else None,
            )
        except (OSError, ValueError, KeyError, TypeError) as e:
            if not quiet:
                log.warning("skipping checkpoint manifest %s: unreadable (%s)", manifest, e)
            return None

    def committed(self, quiet: bool = False) -> List[CheckpointInfo]:
        """Checkpoints whose manifest exists and parses, oldest first (not yet verified).

        ``quiet``: skip unreadable manifests without a warning (a login-node reader).
        """
        try:
            entries = list(self.directory.iterdir())
        except OSError:
            return []
        infos = []
        for p in entries:
            if _NAME.match(p.name):
                info = self._read_manifest(p, quiet)
                if info is not None:
                    infos.append(info)
        return sorted(infos, key=lambda i: i.step)

    def verify(self, info: CheckpointInfo) -> Optional[str]:
        """None when the data file and the rank state files match the manifest, else what is wrong."""
        try:
            size = info.path.stat().st_size
        except OSError:
            return "data file missing"
        if size != info.size_bytes:
            return f"size {size} B, manifest says {info.size_bytes} B (truncated?)"
        if sha256_file(info.path) != info.sha256:
            return "sha256 does not match the manifest (corrupted)"
        for rank in range(info.rank_states):
            path = self.rank_state_path(info.step, rank)
            try:
                size = path.stat().st_size
            except OSError:
                return f"rank {rank}'s state file is missing"
            if not info.rank_digests:  # an older manifest: presence only
                continue
            want_size, want_sha256 = info.rank_digests[rank]
            if size != want_size:
                return f"rank {rank}'s state file is {size} B, manifest says {want_size} B (truncated?)"
            if sha256_file(path) != want_sha256:
                return f"rank {rank}'s state file's sha256 does not match the manifest (corrupted)"
        return None

    def latest(self) -> Optional[CheckpointInfo]:
        """The newest checkpoint that verifies; invalid newer ones are logged and skipped."""
        for info in reversed(self.committed()):
            problem = self.verify(info)
            if problem is None:
                return info
            log.warning(
                "checkpoint of step %d in %s is invalid (%s); falling back to an older one",
                info.step,
                self.directory,
                problem,
            )
        return None

    def load(self, info: Optional[CheckpointInfo] = None, map_location: Any = "cpu") -> Optional[Dict[str, Any]]:
        """Load ``info`` (default: ``latest()``) with ``torch.load(weights_only=True)``; None if none."""
        import torch

        info = info or self.latest()
        if info is None:
            return None
        try:
            state: Dict[str, Any] = torch.load(info.path, map_location=map_location, weights_only=True)
        except Exception as e:  # an unpickling error is data corruption, not a bug here
            raise CheckpointError(f"could not load checkpoint {info.path}: {e}") from e
        return state

    def claim_path(self, step: int) -> Path:
        """The claim file of the checkpoint of ``step`` (``claim``)."""
        return self.directory / f"step-{step:08d}.claim"

    def claim(self, step: int) -> bool:
        """Claim the right to write the checkpoint of ``step`` alone (``durable.claim_file`` on
        :meth:`claim_path`): True for the first process of every node sharing the directory, False for
        every later one. Used when ranks cannot agree through a collective (a peer is lost) but any one
        of them holds the whole state; :meth:`write_once` is the whole protocol."""
        return claim_file(self.claim_path(step))

    def end_claim(self, step: int, outcome: str) -> None:
        """Record ``outcome`` (one line: ``committed`` or what failed) in the claim of ``step``; best effort."""
        end_claim_file(self.claim_path(step), outcome)

    def wait_claim(self, step: int, timeout_s: float, poll_s: float = 0.1) -> Optional[str]:
        """The outcome the claimant of ``step`` recorded (``end_claim``), waiting up to ``timeout_s``
        seconds for it; None when it recorded none by then (or there is no claim)."""
        return wait_claim_file(self.claim_path(step), timeout_s, poll_s)

    def write_once(self, step: int, write: Callable[[], object], timeout_s: float) -> Tuple[bool, Optional[str]]:
        """``durable.write_once`` with the claim of ``step``: the first caller runs ``write()`` (e.g. an
        emergency ``save`` of ``step``), the others wait up to ``timeout_s`` seconds for its outcome.
        Returns ``(True, "committed")`` for the writer, ``(False, outcome or None)`` for the others;
        re-raises what ``write`` raised (after recording it)."""
        return write_once(self.claim_path(step), write, timeout_s)

    def prune(self, newest_valid: Optional[CheckpointInfo] = None) -> None:
        """Delete all but the newest ``keep_last`` committed checkpoints; never the newest valid one.

        ``newest_valid``: the checkpoint just committed, when the caller knows it (saves re-hashing).
        """
        infos = self.committed()
        if len(infos) <= self.keep_last:
            return
        newest_valid = newest_valid or self.latest()
        for info in infos[: -self.keep_last]:
            if newest_valid is not None and info.step == newest_valid.step:
                continue
            ranks = [self.rank_state_path(info.step, r) for r in range(info.rank_states)]
            for p in (info.manifest, info.path, *ranks):  # manifest first: uncommit, then delete data
                try:
                    p.unlink()
                except FileNotFoundError:
                    pass
        kept = self.committed(quiet=True)
        oldest = kept[0].step if kept else None
        for p in self.directory.glob("step-*.rank-*.pt"):  # of saves that never committed
            m = _RANK_NAME.match(p.name)
            if m and oldest is not None and int(m.group(1)) < oldest:
                p.unlink(missing_ok=True)
        for p in self.directory.glob("step-*.claim"):  # claims of checkpoints no longer kept
            m = _CLAIM_NAME.match(p.name)
            if m and oldest is not None and int(m.group(1)) < oldest:
                p.unlink(missing_ok=True)
        for p in self.directory.glob(".step-*.tmp"):  # leftovers of a crash mid-write
            try:
                if time.time() - p.stat().st_mtime > 60:
                    p.unlink()
            except FileNotFoundError:  # renamed or removed meanwhile
                pass
