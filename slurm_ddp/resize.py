"""Resuming a run on another world size: where the epoch goes on, and the gradient accumulation.

Pure (no torch, no I/O). The worker consumes each epoch's permutation (``DistributedSampler``'s
``randperm`` seeded by ``train.seed + epoch``, the same on any world size) as one global stream: an
optimizer step of ``W`` ranks × ``batch_size`` × ``grad_accum_steps`` takes the next contiguous
``global batch`` of it (rank ``r`` gets every ``W``-th sample of that block). So the position in an
epoch is one number, the samples consumed over all ranks, and a run resumed on ``W'`` ranks goes on
from that sample: every remaining sample of the epoch is trained exactly once (a tail shorter than
one global batch is dropped at the end of each epoch, as ``drop_last`` does in an uninterrupted run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Accumulation:
    """The micro-steps per optimizer step on a world size, and why the global batch changed (or None)."""

    grad_accum_steps: int
    global_batch: int  #: samples per optimizer step with ``grad_accum_steps`` on this world size
    why_not_kept: Optional[str] = None  #: one line when ``global_batch`` differs from the target


def accumulation_for(target_global_batch: int, world_size: int, batch_size: int) -> Accumulation:
    """``grad_accum_steps`` that keeps ``target_global_batch`` samples per step on ``world_size`` ranks of
    ``batch_size`` each, when ``world_size × batch_size`` divides it; otherwise the nearest count (at
    least 1) and a sentence saying why the global batch cannot be kept.
    """
    per_micro = world_size * batch_size
    if target_global_batch % per_micro == 0:
        accum = target_global_batch // per_micro
        return Accumulation(accum, target_global_batch)
    accum = max(1, round(target_global_batch / per_micro))
    why = (
        f"the global batch of {target_global_batch} samples cannot be kept on {world_size} ranks: "
        f"{world_size} × train.batch_size {batch_size} = {per_micro} does not divide it; "
        f"grad_accum_steps {accum} gives {accum * per_micro} samples per step (choose a world size that divides "
        "it to keep the optimization unchanged)"
    )
    return Accumulation(accum, accum * per_micro, why)


def samples_in_epoch(epoch_base: int, batch_in_epoch: int, world_size: int, batch_size: int) -> int:
    """Samples of the current epoch consumed over all ranks: ``epoch_base`` (consumed before this world
    size took over the epoch) plus ``batch_in_epoch`` micro-batches of ``world_size × batch_size``."""
    return epoch_base + batch_in_epoch * world_size * batch_size
