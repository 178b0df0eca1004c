"""Runtime pieces of a DDP training process, usable from a user's own training script.

Everything here is public and composes into ``slurm_ddp.worker.train``: process-group
setup from a ``DistEnv``, per-rank RNG state capture/restore (for exact resume), a
``DistributedSampler`` that can start mid-epoch, and an exact distributed evaluation
(each eval sample counted once: sequential shards, no padding, sums added over ranks —
the "distributed inference" recipe: split, gather, trim to the dataset length).
"""

from __future__ import annotations

import logging
import random
import time
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from ..env import DistEnv

log = logging.getLogger("slurm_ddp.worker")


def choose_backend(requested: str = "auto") -> str:
    """``"nccl"`` when CUDA is available, else ``"gloo"``; an explicit choice wins."""
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_distributed(denv: DistEnv, backend: str = "auto", timeout_s: float = 600) -> torch.device:
    """``init_process_group`` over TCP at ``MASTER_ADDR:MASTER_PORT``; returns this rank's device.

    With NCCL the device is ``cuda:LOCAL_RANK`` (one process per GPU, the DDP recipe);
    with gloo it is the CPU. ``timeout_s`` bounds every collective (a dead peer turns
    into an error after it instead of a hang). Returns after the group formed.
    """
    backend = choose_backend(backend)
    device = torch.device("cpu")
    kwargs: Dict[str, Any] = {}
    if backend == "nccl":
        device = torch.device("cuda", denv.local_rank)
        torch.cuda.set_device(device)
        kwargs["device_id"] = device
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{denv.master_addr}:{denv.master_port}",
        rank=denv.rank,
        world_size=denv.world_size,
        timeout=timedelta(seconds=timeout_s),
        **kwargs,
    )
    return device


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> Dict[str, Any]:
    """This process's RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: Dict[str, Any] = {
        "python": random.getstate(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Dict[str, Any]) -> None:
    """Inverse of ``capture_rng``."""
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def gather_to_main(obj: Any, denv: DistEnv) -> Optional[List[Any]]:
    """Collective: every rank's ``obj`` as a list on rank 0 (None elsewhere)."""
    if not dist.is_initialized() or denv.world_size == 1:
        return [obj]
    out: Optional[List[Any]] = [None] * denv.world_size if denv.is_main else None
    dist.gather_object(obj, out, dst=0)
    return out


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can skip the first ``start_index`` samples of an epoch.

    The order within an epoch depends only on ``(seed, epoch)``, as in PyTorch's sampler,
    so a resumed run that sets the same epoch and skips the samples already seen gets
    exactly the rest of the epoch.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int = 0, drop_last: bool = True):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=drop_last)
        self.start_index = 0

    def set_start(self, start_index: int) -> None:
        """Skip the first ``start_index`` samples of this rank's share of the current epoch."""
        self.start_index = start_index

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        return iter(indices[self.start_index:])

    def __len__(self) -> int:
        return max(self.num_samples - self.start_index, 0)


def eval_shard(n: int, rank: int, world_size: int) -> range:
    """Contiguous, non-overlapping share of ``range(n)`` for ``rank``; sizes differ by at most one."""
    return range(rank * n // world_size, (rank + 1) * n // world_size)


def evaluate(
    model: torch.nn.Module,
    dataset: Dataset,
    eval_sums: Callable[[torch.Tensor, torch.Tensor], Dict[str, torch.Tensor]],
    denv: DistEnv,
    batch_size: int,
    device: torch.device,
) -> Dict[str, float]:
    """Exact distributed evaluation: each sample of ``dataset`` counted exactly once.

    ``model`` is the *unwrapped* module (ranks run different numbers of batches, which a
    DDP forward would turn into a hang). Returns ``{"eval_<name>": sum / len(dataset)}``
    and ``eval_samples``. A collective: every rank must call it.
    """
    shard = Subset(dataset, eval_shard(len(dataset), denv.rank, denv.world_size))
    loader = DataLoader(shard, batch_size=batch_size, shuffle=False)
    sums: Dict[str, torch.Tensor] = {}
    count = 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for inputs, targets in loader:
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            for k, v in eval_sums(model(inputs), targets).items():
                sums[k] = sums.get(k, 0) + v.detach().to(torch.float64)
            count += len(targets)
    model.train(was_training)
    local = {"count": count, **{k: float(v) for k, v in sums.items()}}
    parts = [local]
    if dist.is_initialized() and denv.world_size > 1:
        parts = [None] * denv.world_size  # type: ignore[list-item]
        dist.all_gather_object(parts, local)
    total = sum(p["count"] for p in parts)
    keys = sorted({k for p in parts for k in p if k != "count"})
    out = {f"eval_{k}": sum(p.get(k, 0.0) for p in parts) / max(total, 1) for k in keys}
    out["eval_samples"] = total
    return out


class Stopwatch:
    """Seconds since ``start()``; ``lap()`` returns and restarts."""

    def __init__(self) -> None:
        self.t = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        dt, self.t = now - self.t, now
        return dt
