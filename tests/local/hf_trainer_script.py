"""A tiny Hugging Face ``Trainer`` script of one's own (tests only): a 1-layer GPT-2 from ``GPT2Config``
on synthetic tokens, no hub download, run unchanged by slurm_ddp as ``train.command``.

It writes by relative path, as such scripts do: ``output_dir="out"`` with a checkpoint every
``--save-steps`` (``rng_state*.pth``, ``model.safetensors``, ``optimizer.pt``, ...), ``model.pth``
(``torch.save`` of the weights) beside them, and resumes from ``get_last_checkpoint("out")``. For the
tests it records what each start saw in ``starts.jsonl`` (its ``--lr``, its working directory, the
checkpoint it resumed from and the ``--lr`` of the run that saved that checkpoint, kept in
``lr.txt`` in every checkpoint). With ``--hold`` a start that did not resume waits after its first
save until it is stopped (the test's signal), touching ``held`` first: a stop after a save, by event.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset):
    """64 fixed random sequences of 16 tokens: causal LM inputs that are their own labels."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (64, 16), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Marks(TrainerCallback):
    """At every save: this run's lr into the checkpoint, ``model.pth`` beside the script's outputs,
    and (``hold``, a fresh start) ``held`` then a wait until the stop signal ends the process."""

    def __init__(self, lr: float, hold: bool) -> None:
        self.lr, self.hold = lr, hold

    def on_save(self, args, state, control, model=None, **kwargs):  # type: ignore[no-untyped-def]
        ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        with open(os.path.join(ckpt, "lr.txt"), "w") as f:
            f.write(repr(self.lr))
        torch.save(model.state_dict(), "model.pth")
        if self.hold:
            open("held", "w").close()
            while True:  # the test sends the stop signal, whose default action ends this process
                time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max-steps", type=int, default=4)
    p.add_argument("--save-steps", type=int, default=2)
    p.add_argument("--hold", action="store_true")
    a = p.parse_args()
    last = get_last_checkpoint("out") if os.path.isdir("out") else None
    start = {"lr": a.lr, "cwd": os.getcwd(), "resumed_from": last, "resumed_lr": None}
    if last:
        with open(os.path.join(last, "lr.txt")) as f:
            start["resumed_lr"] = float(f.read())
    with open("starts.jsonl", "a") as f:
        f.write(json.dumps(start) + "\n")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    args = TrainingArguments(
        output_dir="out",
        max_steps=a.max_steps,
        save_steps=a.save_steps,
        per_device_train_batch_size=4,
        learning_rate=a.lr,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        dataloader_num_workers=0,
        save_total_limit=None,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[Marks(a.lr, a.hold and not last)])
    trainer.train(resume_from_checkpoint=last)
    with open("done.json", "w") as f:
        json.dump({"lr": a.lr, "step": trainer.state.global_step}, f)


if __name__ == "__main__":
    main()
