"""A Hugging Face ``Trainer`` script (a 2-layer GPT-2 on synthetic tokens) run by slurm_ddp as ``train.command``.

The ``Trainer`` starts no processes of its own here: every rank is started by slurm_ddp's rank wrapper,
and Accelerate (under the ``Trainer``) reads the layout from the torchrun variables slurm_ddp sets
(``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``): DDP over gloo on CPU,
NCCL on GPUs. No ``torchrun``/``accelerate launch``.

    slurm-ddp submit examples/transformers/job.yaml --backend local      # 2 ranks on CPU (gloo)
    slurm-ddp submit examples/transformers/job.yaml --set slurm.nodes=2  # sbatch

Checkpoints go to ``$SLURM_DDP_RUN_DIR/hf`` (the run directory survives requeues) every ``--save-steps``
and, through ``SlurmDDPCallback``, at a stop signal; ``train(resume_from_checkpoint=get_last_checkpoint(...))``
resumes from the newest one. The model is built from a config and the data are random token sequences
from a fixed seed: nothing is downloaded. ``--plain`` leaves the callback out (what a script without
it gets: it dies of the signal and resumes from its last ``checkpoint-N``).
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from slurm_ddp.transformers import SlurmDDPCallback


class RandomTokens(torch.utils.data.Dataset):
    """``n`` sequences of ``length`` tokens below ``vocab``, fixed by ``seed``; labels = inputs (causal LM)."""

    def __init__(self, n: int, length: int, vocab: int, seed: int = 0):
        self.tokens = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class StepSleep(TrainerCallback):
    """Slower steps, to try a stop by hand."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(self.seconds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=8, help="per rank")
    p.add_argument("--save-steps", type=int, default=50)
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--output-dir", default=None, help="default: $SLURM_DDP_RUN_DIR/hf")
    p.add_argument("--report-to", default="none", help="the Trainer's report_to: none, wandb, mlflow, ...")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep per training step")
    p.add_argument("--plain", action="store_true", help="without SlurmDDPCallback")
    args = p.parse_args()

    output_dir = args.output_dir or os.path.join(os.environ.get("SLURM_DDP_RUN_DIR", "."), "hf")
    config = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)  # the same initial weights on every rank and every start (a resume loads its own)
    model = GPT2LMHeadModel(config)
    training_args = TrainingArguments(
        output_dir=output_dir,
        max_steps=args.max_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        logging_steps=args.logging_steps,
        save_steps=args.save_steps,
        report_to=args.report_to,
        seed=0,
        ddp_find_unused_parameters=False,
        use_cpu=not torch.cuda.is_available(),  # on CPU Accelerate runs DDP (gloo) only when told: MULTI_CPU
    )
    callbacks: list[TrainerCallback] = [] if args.plain else [SlurmDDPCallback()]
    if args.step_sleep:
        callbacks.append(StepSleep(args.step_sleep))
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=RandomTokens(n=2048, length=32, vocab=config.vocab_size),
        callbacks=callbacks,
    )
    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    if last and trainer.is_world_process_zero():
        print(f"resuming from {last}", flush=True)
    result = trainer.train(resume_from_checkpoint=last)  # a requeued job resumes from the newest checkpoint-N
    if trainer.is_world_process_zero():
        print(f"done: step {trainer.state.global_step}, loss {result.training_loss:.4f}", flush=True)
    # the DDP model goes before its process group, and the group before interpreter teardown: left to teardown,
    # a gloo rank can abort ("terminate called without an active exception") or hang in the model's destructor
    trainer.accelerator.free_memory()
    del trainer, model
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
