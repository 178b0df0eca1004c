"""A Hugging Face ``Trainer`` script of the project's own (tests only), written the way the current
Transformers examples are (``examples/pytorch/language-modeling/run_clm.py``): ``HfArgumentParser`` over
``TrainingArguments`` and dataclasses of its own, a ``Trainer``, a checkpoint every ``--save_steps``, and a
resume ONLY through ``--resume_from_checkpoint PATH`` (no ``get_last_checkpoint``: what the script is given
is what it resumes from). Nothing is downloaded: a 2-layer GPT-2 from a config, random token sequences from
a fixed seed — the same model, data and ``TrainingArguments`` as ``examples/transformers/train.py``, so
that both train the same losses step by step.

For the tests, rank 0 appends one line per optimizer step to ``steps.jsonl`` in its working directory:
``{"pid", "resume_from_checkpoint", "step"}`` (which start trained which step). ``--step_sleep``: seconds
of sleep per step, room for a stop between two saves.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments


@dataclass
class ModelArguments:
    """The GPT-2 built from a config (no hub model)."""

    n_layer: int = field(default=2, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=64, metadata={"help": "embedding width"})
    n_head: int = field(default=2, metadata={"help": "attention heads"})
    n_positions: int = field(default=64, metadata={"help": "longest sequence"})


@dataclass
class DataArguments:
    """The synthetic corpus: ``num_sequences`` sequences of ``block_size`` tokens below ``vocab_size``."""

    num_sequences: int = field(default=2048, metadata={"help": "sequences in the corpus"})
    block_size: int = field(default=32, metadata={"help": "tokens per sequence"})
    vocab_size: int = field(default=512, metadata={"help": "tokens of the vocabulary"})
    corpus_seed: int = field(default=0, metadata={"help": "seed of the corpus"})
    step_sleep: float = field(default=0.0, metadata={"help": "seconds of sleep per training step"})


class Corpus(torch.utils.data.Dataset):
    """Causal LM samples whose labels are their inputs."""

    def __init__(self, a: DataArguments) -> None:
        g = torch.Generator().manual_seed(a.corpus_seed)
        self.tokens = torch.randint(0, a.vocab_size, (a.num_sequences, a.block_size), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class StepRecord(TrainerCallback):
    """Rank 0: one ``steps.jsonl`` line per optimizer step; every rank: ``step_sleep`` seconds of sleep."""

    def __init__(self, resumed_from: str | None, sleep_s: float) -> None:
        self.resumed_from, self.sleep_s = resumed_from, sleep_s

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.is_world_process_zero:
            line = {"pid": os.getpid(), "resume_from_checkpoint": self.resumed_from, "step": state.global_step}
            with open("steps.jsonl", "a") as f:
                f.write(json.dumps(line) + "\n")
        if self.sleep_s:
            time.sleep(self.sleep_s)


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    config = GPT2Config(
        vocab_size=data_args.vocab_size,
        n_positions=model_args.n_positions,
        n_embd=model_args.n_embd,
        n_layer=model_args.n_layer,
        n_head=model_args.n_head,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)  # the same initial weights on every rank (a resume loads its own)
    model = GPT2LMHeadModel(config)
    resume = training_args.resume_from_checkpoint
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=Corpus(data_args),
        callbacks=[StepRecord(resume, data_args.step_sleep)],
    )
    if trainer.is_world_process_zero():
        print(f"resume_from_checkpoint: {resume}", file=sys.stderr, flush=True)
    result = trainer.train(resume_from_checkpoint=resume)
    if trainer.is_world_process_zero():
        print(f"done: step {trainer.state.global_step}, loss {result.training_loss:.4f}", flush=True)
    # the DDP model before its process group, the group before interpreter teardown (a gloo rank left to
    # teardown can abort or hang in the model's destructor)
    trainer.accelerator.free_memory()
    del trainer, model
    gc.collect()
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
