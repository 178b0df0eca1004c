"""Evaluate one digits run's final weights: a ``train.command`` script (one rank, no DDP).

    python evaluate.py TRAIN_RUN_DIR

Loads TRAIN_RUN_DIR's ``final_model.pt`` (rank 0's ``state_dict()`` of ``DigitsNet``, with the
width its ``config.yaml`` gave) and classifies the 360 held-out digits of ``load_split()``, the
images the worker's own eval used. Prints one JSON line and writes it to ``accuracy.json`` in this
job's run directory (``SLURM_DDP_RUN_DIR``; the current directory when run by hand):
``{"run": ..., "eval_accuracy": correct / samples, "correct": ..., "samples": 360}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import yaml

import slurm_ddp

# the digits example's model and data split (examples/digits, next to this directory)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "digits"))
from digits_task import DigitsNet, load_split


def main(argv: list) -> int:
    if len(argv) != 1:
        print("usage: python evaluate.py TRAIN_RUN_DIR", file=sys.stderr)
        return 2
    run = slurm_ddp.Run(argv[0])
    weights = run.final().weights  # UserError when that run has not finished
    cfg = yaml.safe_load((run.path / "config.yaml").read_text())
    model = DigitsNet(width=int((cfg["train"].get("args") or {}).get("width", 16)))
    model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    model.eval()
    _, _, x_eval, y_eval = load_split()
    with torch.inference_mode():
        correct = int((model(x_eval).argmax(dim=1) == y_eval).sum())
    result = {"run": str(run.path), "eval_accuracy": correct / len(y_eval), "correct": correct, "samples": len(y_eval)}
    print(json.dumps(result), flush=True)
    out = Path(os.environ.get("SLURM_DDP_RUN_DIR", ".")) / "accuracy.json"
    out.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
