"""A Hugging Face Accelerate script (``Accelerator``, ``save_state``/``load_state``) run by slurm_ddp as ``train.command``.

No ``accelerate launch``: every rank is started by slurm_ddp's rank wrapper, and ``Accelerator()`` reads
the layout from the torchrun variables slurm_ddp sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) and starts DDP: NCCL on GPUs; on CPU only when
told (``cpu=True`` here, or ``ACCELERATE_USE_CPU=true``), else each CPU rank would train alone.

    slurm-ddp submit examples/accelerate/job.yaml --backend local      # 2 ranks on CPU (gloo)
    slurm-ddp submit examples/accelerate/job.yaml --set slurm.nodes=2  # sbatch

State (model, optimizer, scheduler, every rank's RNG) goes to ``$SLURM_DDP_RUN_DIR/accelerate/step-N`` via
``accelerator.save_state`` every ``--save-every`` steps and, through ``slurm_ddp.preemption``, at the step the
ranks agree on after the requeue signal or SIGTERM (then every rank exits 75 and the job is requeued); a start
``load_state``s the newest one and skips the batches of its epoch already trained: no step is redone. A save is
written under a temporary name and renamed once every rank is done, so a half-written one is never loaded.
The data are a fixed random linear regression problem (no download).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch.utils.data import DataLoader, TensorDataset

from slurm_ddp import preemption, progress


def saved_states(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete save under ``root``, oldest first."""
    return sorted((int(m.group(1)), p) for p in root.glob("step-*") if (m := re.fullmatch(r"step-(\d+)", p.name)))


def newest_state(root: Path) -> tuple[int, Path | None]:
    """(step, directory) of the newest complete save under ``root``; (0, None) when there is none."""
    states = saved_states(root)
    return states[-1] if states else (0, None)


def save(accelerator: Accelerator, root: Path, step: int, keep: int = 2) -> Path:
    """``save_state`` to ``root/step-<step>`` (every rank calls it), atomically; keeps the newest ``keep``."""
    final, partial = root / f"step-{step}", root / f"step-{step}.partial"
    with progress.phase("checkpoint"):
        accelerator.save_state(str(partial))  # the main process writes the model and optimizer, each rank its RNG
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            if final.exists():
                shutil.rmtree(final)
            partial.rename(final)
            for _, old in saved_states(root)[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
        accelerator.wait_for_everyone()
    return final


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--save-every", type=int, default=100)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep per training step")
    args = p.parse_args()

    preemption.install()  # the requeue signal and SIGTERM set a flag instead of killing the rank
    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),  # the same order on every start
    )
    run_dir = Path(os.environ.get("SLURM_DDP_RUN_DIR", "."))
    root = run_dir / "accelerate"
    metrics = run_dir / "metrics.jsonl" if accelerator.is_main_process and "SLURM_DDP_RUN_DIR" in os.environ else None

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 32, generator=g)
    y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(4096, 1, generator=g)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    total = args.steps * accelerator.num_processes  # a prepared scheduler steps once per process at each step
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1.0 - s / total))
    # a generator of its own: iter(loader) then draws its worker seed from it, not from the global RNG (the
    # dropout's), so a resumed start that starts its iterator after load_state draws the same dropout masks
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True, generator=torch.Generator())
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

    step, state = newest_state(root)
    if state is not None:
        accelerator.load_state(str(state))
        accelerator.print(f"resumed from {state} at step {step}")
        if metrics is not None:
            with metrics.open("a") as f:
                f.write(json.dumps({"event": "resume", "step": step, "time": time.time()}) + "\n")
    per_epoch = len(loader)
    mean, batches = float("nan"), None  # a start at the last step trains nothing
    while step < args.steps:
        epoch, done_in_epoch = divmod(step, per_epoch)
        loader.set_epoch(epoch)
        batches = accelerator.skip_first_batches(loader, done_in_epoch) if done_in_epoch else loader
        for xb, yb in batches:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            progress.step(step)
            mean = accelerator.reduce(loss.detach(), reduction="mean").item()
            if metrics is not None:
                with metrics.open("a") as f:
                    f.write(json.dumps({"event": "train", "step": step, "loss": mean, "time": time.time()}) + "\n")
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if preemption.should_stop():  # every rank, every step: the flag agreed across ranks
                path = save(accelerator, root, step)
                accelerator.print(f"stopping at step {step}: saved {path}")
                preemption.exit_preempted(step)  # every rank: waits for all, exits with status 75
            if step % args.save_every == 0 or step == args.steps:
                save(accelerator, root, step)
            if step == args.steps:
                break
    accelerator.print(f"done: step {step}, loss {mean:.6f}")
    # the DDP model goes before its process group, and the group before interpreter teardown (see
    # examples/transformers/train.py): end_training destroys the group
    accelerator.free_memory()
    del model, optimizer, loader, scheduler, batches
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
