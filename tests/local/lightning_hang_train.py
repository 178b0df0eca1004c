"""The Lightning example (``train.py``, copied beside this file by the test) with a rank that blocks for good
in data loading: ``--hang-rank R --hang-after N``: rank R's training set blocks in ``__getitem__`` from
its N-th item on (``DataLoader(num_workers=0)``: in the rank's main process)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import train  # examples/lightning/train.py
from torch.utils.data import Dataset


class Hanging(Dataset):
    def __init__(self, inner: Any, hang: bool, after: int):
        self.inner, self.hang, self.after, self.items = inner, hang, after, 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int) -> Any:
        self.items += 1
        if self.hang and self.items > self.after:
            while True:
                time.sleep(3600)  # HANG-HERE: rank blocked for good in data loading
        return self.inner[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hang-rank", type=int, required=True)
    p.add_argument("--hang-after", type=int, required=True)
    args, rest = p.parse_known_args()
    hang = int(os.environ.get("RANK", "-1")) == args.hang_rank
    split = train.load_split

    def hanging_split() -> Any:
        tr, val = split()
        return Hanging(tr, hang, args.hang_after), val

    train.load_split = hanging_split
    sys.argv = [sys.argv[0], *rest]
    train.main()


if __name__ == "__main__":
    main()
