"""Runtime pieces of a DDP training process, usable from a user's own training script.

Everything here is public and composes into ``slurm_ddp.worker.train``: process-group
setup from a ``DistEnv``, per-rank RNG state capture/restore (for exact resume), a
``DistributedSampler`` that can start mid-epoch, and an exact distributed evaluation
(each eval sample counted once: sequential shards, no padding, sums added over ranks —
the "distributed inference" recipe: split, gather, trim to the dataset length).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import sys
import time
from datetime import timedelta
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sized, Tuple, cast

import numpy as np
import torch
import torch.distributed as dist

# torch.distributed.nn.functional binds ``group=group.WORLD`` as default arguments when it is
# imported; DDP imports it lazily (through torch.distributed._shard), so imported after
# init_process_group those defaults would hold the world group for good: destroy_process_group
# could never free it, and gloo's worker threads would outlive the interpreter, where one that
# still drops a finished collective aborts the process at exit ("terminate called without an
# active exception", pytorch/pytorch#190489). Imported here, before any group exists, they are None.
import torch.distributed.nn.functional
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset, get_worker_info

from ..devices import (
    DeviceSelectionError,
    identify_cuda_device,
    read_devices_constrained,
    select_device,
    visible_devices,
)
from ..env import DistEnv

log = logging.getLogger("slurm_ddp.worker")


def choose_backend(requested: str = "auto") -> str:
    """``"nccl"`` when CUDA is available, else ``"gloo"``; an explicit choice wins."""
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() else "gloo"


def rank_device(
    denv: DistEnv, backend: str = "auto", environ: Optional[Mapping[str, str]] = None
) -> Tuple[str, torch.device]:
    """The process group backend (``choose_backend``) and this rank's device, before any group exists.

    With NCCL the device is the one ``slurm_ddp.devices.select_device`` chooses from what Slurm
    made visible (``environ``, default ``os.environ``, with this rank's LOCAL_RANK and
    LOCAL_WORLD_SIZE): ``cuda:0`` when the task sees one GPU, ``cuda:LOCAL_RANK`` when it sees
    the node's GPUs (one process per GPU, the DDP recipe), made current; the log names the physical GPU from
    the device's PCI address (``slurm_ddp.devices.identify_cuda_device``); with gloo it is the CPU. When GPUs
    are visible but CUDA is not usable here (``backend="auto"``: gloo on the CPU), the device the rule
    would choose is still logged. Raises ``DeviceSelectionError`` (one line) when the visible GPUs do not
    fit the rank's place.
    """
    backend = choose_backend(backend)
    device = torch.device("cpu")
    env = {**(os.environ if environ is None else environ)}
    env.update(LOCAL_RANK=str(denv.local_rank), LOCAL_WORLD_SIZE=str(denv.local_world_size))
    rank_log = logging.getLogger("slurm_ddp.rank")
    if backend == "nccl":
        choice = select_device(env, device_count=torch.cuda.device_count(), constrained=read_devices_constrained(env))
        device = torch.device("cuda", choice.ordinal)
        torch.cuda.set_device(device)
        choice = identify_cuda_device(choice, torch.cuda.get_device_properties(choice.ordinal))
        rank_log.info("device %s", choice.describe())
    elif visible_devices(env):
        try:
            rule = select_device(env, constrained=read_devices_constrained(env)).describe()
        except DeviceSelectionError as e:
            rule = f"none ({e})"
        rank_log.info("device cpu (backend %s); the GPU rule gives %s", backend, rule)
    return backend, device


def init_distributed(
    denv: DistEnv,
    backend: str = "auto",
    timeout_s: float = 600,
    environ: Optional[Mapping[str, str]] = None,
    store: Any = None,
    device: Optional[torch.device] = None,
) -> torch.device:
    """``init_process_group`` over TCP at ``MASTER_ADDR:MASTER_PORT`` (or through ``store``, a
    ``torch.distributed.Store``: in-process recovery forms each generation's group through its own
    prefix); returns this rank's device (``rank_device``, unless ``device`` was chosen before).
    ``timeout_s`` bounds every collective (a dead peer turns into an error after it instead of a hang).
    Returns after the group formed. Raises ``DeviceSelectionError`` (one line) when the visible GPUs do not
    fit the rank's place.
    """
    backend = choose_backend(backend)
    if device is None:
        backend, device = rank_device(denv, backend, environ)
    kwargs: Dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    where: Dict[str, Any] = (
        {"store": store} if store is not None else {"init_method": f"tcp://{denv.master_addr}:{denv.master_port}"}
    )
    dist.init_process_group(
        backend=backend,
        rank=denv.rank,
        world_size=denv.world_size,
        timeout=timedelta(seconds=timeout_s),
        **where,
        **kwargs,
    )
    return device


def shutdown_distributed() -> None:
    """Destroy the process group and free it now, while the interpreter is fully alive.

    ``dist.destroy_process_group`` only unregisters the group; its backend (gloo's worker threads,
    NCCL's communicators) goes when the last reference does. Drop the DDP wrappers first (they hold
    the group), then call this: the garbage collection here frees the group and joins its threads,
    instead of leaving them to race interpreter teardown. Safe to call when no group exists.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()


def end_startup_gc() -> bool:
    """End a start-up run with Python's cyclic garbage collector off: collect once, move every object
    that survived into the permanent generation (``gc.freeze``), and turn collection back on.

    For a process that called ``gc.disable()`` before importing torch — ``python -m slurm_ddp.worker``
    does, and calls this once the model is wrapped in DDP and the datasets are built (a script of one's
    own may do the same). Start-up makes a few million objects that live as long as the process (torch's
    modules; ``torch._dynamo``, which ``DistributedDataParallel.__init__`` imports; sympy; the task's model
    and data), and each time allocations crossed the collector's thresholds it walked them all again,
    freeing next to nothing: ~2 of a digits rank's ~6 CPU-s (``benchmarks/rank_startup.py``). Frozen, they
    are not walked by the training loop's full collections either. The one collection first keeps the
    start-up's own garbage from being frozen for good. Python's ``gc.freeze`` documentation describes the
    same pattern for pre-fork servers.

    Returns False, changing nothing, where the collector is on (the process did not pause it).
    """
    if gc.isenabled():
        return False
    gc.collect()
    gc.freeze()
    gc.enable()
    return True


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> Dict[str, Any]:
    """This process's RNG states, in types ``torch.load(weights_only=True)`` accepts."""
    # the legacy form (numpy.random.get_state(legacy=True)): ("MT19937", keys, pos, has_gauss, cached_gaussian)
    legacy = cast(Tuple[str, "np.ndarray[Any, Any]", int, int, float], np.random.get_state(legacy=True))
    name, keys, pos, has_gauss, cached = legacy
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


def broadcast_from_main(obj: Any, denv: DistEnv) -> Any:
    """Collective: rank 0's ``obj`` (picklable) on every rank (``dist.broadcast_object_list``)."""
    if not dist.is_initialized() or denv.world_size == 1:
        return obj
    box = [obj if denv.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` that can skip the first ``start_index`` samples of an epoch.

    The order within an epoch depends only on ``(seed, epoch)``, as in PyTorch's sampler,
    so a resumed run that sets the same epoch and skips the samples already seen gets
    exactly the rest of the epoch.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int = 0, drop_last: bool = True):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=drop_last)
        self.start_index = 0
        self.global_start = 0

    def set_start(self, start_index: int) -> None:
        """Skip the first ``start_index`` samples of this rank's share of the current epoch."""
        self.start_index = start_index

    def set_global_start(self, consumed: int) -> None:
        """Share out only the epoch's order after its first ``consumed`` samples (counted over all
        ranks, possibly of another world size: ``slurm_ddp.resize``): rank ``r`` of ``W`` gets every
        ``W``-th of the rest from the ``r``-th, the rest cut to a multiple of ``W`` (as ``drop_last``).
        0 is ``DistributedSampler``'s own split. ``set_start`` then skips within that share."""
        self.global_start = consumed

    def share_size(self) -> int:
        """Samples of this rank's share of the epoch (before ``set_start``'s skip)."""
        if self.global_start == 0:
            return self.num_samples
        return max(len(self.dataset) - self.global_start, 0) // self.num_replicas  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[int]:
        if self.global_start == 0:
            indices = list(super().__iter__())
        else:  # DistributedSampler's permutation of this epoch (drop_last), after its consumed part
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            rest = torch.randperm(len(self.dataset), generator=g).tolist()[self.global_start :]  # type: ignore[arg-type]
            indices = rest[: len(rest) - len(rest) % self.num_replicas][self.rank :: self.num_replicas]
        return iter(indices[self.start_index :])

    def __len__(self) -> int:
        return max(self.share_size() - self.start_index, 0)


def batch_seed(seed: int, rank: int, epoch: int, batch: int) -> int:
    """The seed of one batch's randomness: a pure function of (seed, rank, epoch, batch index).

    A 63-bit mix (splitmix64's finalizer, Steele et al. 2014) so nearby inputs give unrelated seeds.
    """
    x = (seed * 0x9E3779B97F4A7C15 + rank * 0xBF58476D1CE4E5B9 + epoch * 0x94D049BB133111EB + batch) % 2**64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) % 2**64
    return (x ^ (x >> 31)) % 2**63


#: the "epoch" slot of ``batch_seed`` that ``step_seed`` uses: no data epoch reaches it, so a step's
#: seed never equals a batch's
STEP_STREAM = 2**40


def step_seed(seed: int, rank: int, step: int) -> int:
    """The seed of the random streams (dropout …) of optimizer step ``step`` (1-based) on ``rank``: a pure
    function of ``(seed, rank, step)``, ``batch_seed``'s mix.

    Counter-based, like JAX's ``jax.random.fold_in(key, step)``: the streams at any step boundary are
    known without a saved state, so a resume from a checkpoint that holds no per-rank RNG state (one
    survivor's emergency checkpoint, another world size) is exact on the same world size.
    """
    return batch_seed(seed, rank, STEP_STREAM, step)


def seed_step(seed: int, rank: int, step: int, device: torch.device) -> None:
    """Seed Python's ``random``, NumPy's global RNG, torch's CPU generator and ``device``'s CUDA
    generator (the current device only: ``torch.manual_seed`` would seed every device, ~0.4 ms) with
    ``step_seed(seed, rank, step)``. Called by the worker before each optimizer step (~30 µs)."""
    s = step_seed(seed, rank, step)
    _seed_cpu_rngs(s)
    if device.type == "cuda":
        torch.cuda.manual_seed(s)


class SeededBatchSampler:
    """Batches of ``(batch_seed, index)`` keys over a ``ResumableDistributedSampler``.

    Yields ``batch_size`` keys per batch (the last partial batch dropped), starting at batch
    ``start_batch`` of the epoch. With ``SeededDataset`` each batch's random augmentation is
    drawn from RNGs seeded by ``batch_seed(seed, rank, epoch, b)`` — whichever process
    (main or DataLoader worker) loads it and however many batches were loaded before. That
    makes resume exact for any ``num_workers`` without saving worker RNG states.
    """

    def __init__(self, sampler: ResumableDistributedSampler, batch_size: int, seed: int, rank: int):
        self.sampler, self.batch_size, self.seed, self.rank = sampler, batch_size, seed, rank
        self.epoch = 0
        self.start_batch = 0
        self.consumed = 0

    def set_position(self, epoch: int, start_batch: int, consumed: int = 0) -> None:
        """Iterate epoch ``epoch`` from its batch ``start_batch`` on; with ``consumed`` > 0 (a run
        resumed on another world size) batches count from the epoch's sample ``consumed`` (over all ranks)."""
        self.epoch, self.start_batch, self.consumed = epoch, start_batch, consumed
        self.sampler.set_epoch(epoch)
        self.sampler.set_global_start(consumed)
        self.sampler.set_start(start_batch * self.batch_size)

    def batches_per_epoch(self) -> int:
        return self.sampler.share_size() // self.batch_size

    def __iter__(self) -> Iterator[List[tuple]]:
        indices = list(iter(self.sampler))
        for i in range(len(indices) // self.batch_size):
            b = self.consumed + self.start_batch + i  # the batch's seed index
            s = batch_seed(self.seed, self.rank, self.epoch, b)
            yield [(s, idx) for idx in indices[i * self.batch_size : (i + 1) * self.batch_size]]

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size


class SeededDataset(Dataset):
    """Wraps a map-style dataset; loads a batch of ``(seed, index)`` keys under that seed.

    Python's ``random``, NumPy's global RNG and torch's CPU RNG are seeded for the batch. In
    the main process (``num_workers=0``) they are restored afterwards, so loading leaves the
    training RNG (dropout …) untouched; a DataLoader worker process skips the save/restore
    (its RNG is nobody else's). Only the CPU generator is seeded — ``torch.manual_seed`` would
    also reseed every CUDA device (and costs ~0.4 ms a call); data loading draws on the CPU.
    """

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, key: tuple) -> Any:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: List[tuple]) -> List[Any]:
        s = keys[0][0]
        if get_worker_info() is not None:  # a DataLoader worker: nothing to restore
            _seed_cpu_rngs(s)
            return [self.dataset[idx] for _, idx in keys]
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        try:
            _seed_cpu_rngs(s)
            return [self.dataset[idx] for _, idx in keys]
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


def _seed_cpu_rngs(seed: int) -> None:
    """Seed ``random``, NumPy's global RNG and torch's CPU generator (not CUDA's) with ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)


class StepAgreement:
    """Ranks agree at a step boundary whether any rank was signalled, checking every ~``interval_s``.

    ``PreemptionFlag.sync`` is one blocking all-reduce per step: each step then waits a round
    trip for the slowest peer (~1 ms between two processes on a busy 2-core machine, ~0.2 ms
    of CPU; with NCCL also a host-device synchronisation) — several percent of a short step.
    ``poll()``, called once per step on every rank, all-reduces only on *check steps*: the
    flag (MAX of ``PreemptionFlag.code()``: the ranks also agree on the signal, SIGTERM over the
    requeue signal, which ``flag.received`` then names on every rank) together with each rank's proposal for the distance to the next check —
    ``interval_s`` divided by its mean step time since the last check, at least 1, at most
    ``max_every`` — of which the smallest wins. All ranks therefore check at the same steps
    and stop after the same step, at most about ``interval_s`` plus one step after the signal
    (0 steps lost: the checkpoint is of that step). Slow steps (> ``interval_s``) are checked
    every step. The first check (at the first ``poll``) proposes 1: the time since construction
    is no step time (it may be a few microseconds, or all of the setup), so the interval is
    measured from the first check on. ``group``: a gloo process group (the flag lives on the CPU; pass
    ``dist.new_group(backend="gloo")`` when the default group is NCCL).
    """

    def __init__(self, flag: Any, group: Any = None, interval_s: float = 0.5, max_every: int = 1000):
        self.flag, self.group, self.interval_s, self.max_every = flag, group, interval_s, max_every
        self._countdown = 1  # the first check is at the first step
        self._steps = 0
        self._t = time.perf_counter()
        self._measured = False  # no step time measured yet: the first check proposes 1
        #: steps between the last two checks (for tests and logs)
        self.every = 1

    def poll(self) -> bool:
        """Call once per step on every rank (a collective on check steps); True on every rank to stop."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.flag.received is not None
        self._steps += 1
        self._countdown -= 1
        if self._countdown > 0:
            return False
        now = time.perf_counter()
        step_s = (now - self._t) / self._steps
        propose = self.max_every if step_s <= 0 else int(min(max(self.interval_s / step_s, 1), self.max_every))
        if not self._measured:
            propose, self._measured = 1, True
        # the flag as its signal's code (signals.signal_code: SIGTERM outweighs the requeue signal), so
        # the ranks agree on whether to stop and on the signal they stop for (rank 0's PREEMPTED marker)
        t = torch.tensor([self.flag.code(), -propose], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        self.every = int(-t[1])
        self._countdown, self._steps, self._t = self.every, 0, now
        return bool(self.flag.agree(int(t[0])))

    def settle(self) -> bool:
        """Agree once more on the signal after :meth:`poll` said stop (a collective: call it on every rank,
        e.g. after the preemption checkpoint). A signal whose handler ran only after that check's all-reduce,
        on a rank that was inside it, still counts: SIGTERM on any rank by now outweighs the requeue signal
        in ``flag.received`` on every rank, so rank 0's PREEMPTED marker names it (a scancel is not
        requeued). True when any rank holds a signal."""
        if not (dist.is_available() and dist.is_initialized()):
            return self.flag.received is not None
        t = torch.tensor([self.flag.code()], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(self.flag.agree(int(t[0])))


#: words of a collective's error that mean a peer rank died or stopped answering (gloo: "Connection
#: closed by peer", "Connection reset by peer"; a timed-out wait: "Timed out"; NCCL: "remote process exited")
_PEER_FAILURE_WORDS = (
    "timed out",
    "timeout",
    "connection closed",
    "connection reset",
    "broken pipe",
    "connection refused",
    "peer",
)


def is_peer_failure(e: BaseException) -> bool:
    """True when ``e``, raised by a collective (or by DDP's backward, which runs them), means that a peer
    rank died or stopped responding: any ``torch.distributed.DistBackendError``, or a ``RuntimeError``
    whose message names a lost connection or a timeout (``_PEER_FAILURE_WORDS``). The one
    classification of the shared worker and of ``slurm_ddp.preemption.exit_if_peer_lost``. Pure."""
    if isinstance(e, dist.DistBackendError):
        return True
    if not isinstance(e, RuntimeError):
        return False
    text = str(e).lower()
    return any(k in text for k in _PEER_FAILURE_WORDS)


def optimizer_step(
    ddp: torch.nn.Module,
    micro_batches: List[tuple],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    device: torch.device,
    scaler: Optional[Any] = None,
    autocast_dtype: Optional[torch.dtype] = None,
    clip_grad_norm: float = 0.0,
    channels_last: bool = False,
) -> torch.Tensor:
    """One optimizer step over ``micro_batches`` (gradient accumulation); returns the mean loss (on device).

    Gradients are all-reduced once per step: every micro-batch but the last runs under
    ``ddp.no_sync()`` (PyTorch DDP docs, "no_sync"). Each micro-batch's loss is divided by
    their number so the step equals one over the concatenated batch. ``scaler`` is an AMP
    ``GradScaler`` (fp16); ``clip_grad_norm`` > 0 clips the global gradient norm after
    unscaling. No host synchronisation happens here.
    """
    optimizer.zero_grad(set_to_none=True)
    n = len(micro_batches)
    total = torch.zeros((), device=device)
    non_blocking = device.type == "cuda"
    for i, (inputs, targets) in enumerate(micro_batches):
        inputs = inputs.to(device, non_blocking=non_blocking)
        if channels_last and inputs.dim() == 4:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        targets = targets.to(device, non_blocking=non_blocking)
        sync = i == n - 1
        no_sync = getattr(ddp, "no_sync", None)  # DDP has it; a plain module (one rank) does not
        ctx = contextlib.nullcontext() if sync or no_sync is None else no_sync()
        with ctx:
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = loss_fn(ddp(inputs), targets) / n
            (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.detach().float()
    if scaler is not None:
        if clip_grad_norm:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(_params(optimizer), clip_grad_norm)
        scaler.step(optimizer)
        scaler.update()
    else:
        if clip_grad_norm:
            torch.nn.utils.clip_grad_norm_(_params(optimizer), clip_grad_norm)
        optimizer.step()
    return total


def _params(optimizer: torch.optim.Optimizer) -> List[torch.Tensor]:
    return [p for g in optimizer.param_groups for p in g["params"]]


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
    n = len(cast(Sized, dataset))  # a map-style dataset with __len__ (the Task contract)
    shard = Subset(dataset, eval_shard(n, denv.rank, denv.world_size))
    # A dedicated generator: the eval iterator draws nothing from the global torch RNG.
    loader = DataLoader(shard, batch_size=batch_size, shuffle=False, generator=torch.Generator())
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


def setup_logging(rank: int) -> None:
    """Rank 0 logs INFO; the other ranks WARNING and above (the per-rank logging recipe).

    The ``slurm_ddp.rank`` logger logs INFO on every rank (host/rank facts at start).
    """
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(message)s", "%Y-%m-%dT%H:%M:%S")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    root = logging.getLogger("slurm_ddp")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    logging.getLogger("slurm_ddp.rank").setLevel(logging.INFO)
