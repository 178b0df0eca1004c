"""A task whose step takes a realistic time on this machine, for ``goodput_interval.py``.

An MLP (``args.in_dim`` → ``args.width`` × ``args.depth`` → 10 classes) on a fixed synthetic dataset
(seeded; labels from a fixed random linear teacher, so the loss falls): with the defaults (width 1536,
depth 3, batch 128 per rank) a step is ~3.8 GFLOP of real compute per rank plus DDP's gloo all-reduce of
the ~5.1 M-parameter gradient (20 MB), 0.2-0.5 s on one core here; its checkpoint (model + AdamW state,
~61 MB) takes a measurable time to write.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

import torch

from slurm_ddp.task import Task


class RealisticTask(Task):
    def _arg(self, name: str, default: Any) -> Any:
        return self.args.get(name, default)

    def build_model(self) -> torch.nn.Module:
        in_dim, width, depth = int(self._arg("in_dim", 256)), int(self._arg("width", 1536)), int(self._arg("depth", 3))
        layers: list = [torch.nn.Linear(in_dim, width), torch.nn.ReLU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(width, 10))
        return torch.nn.Sequential(*layers)

    def build_datasets(self) -> Tuple[torch.utils.data.Dataset[Any], Optional[torch.utils.data.Dataset[Any]]]:
        g = torch.Generator().manual_seed(1234)
        in_dim, n = int(self._arg("in_dim", 256)), int(self._arg("samples", 20000))
        x = torch.randn(n, in_dim, generator=g)
        teacher = torch.randn(in_dim, 10, generator=g)
        y = (x @ teacher).argmax(dim=1)
        split = n - 512
        train = torch.utils.data.TensorDataset(x[:split], y[:split])
        val = torch.utils.data.TensorDataset(x[split:], y[split:])
        return train, val
