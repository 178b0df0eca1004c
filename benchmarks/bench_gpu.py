"""GPU practices: bf16 autocast + channels_last + torch.compile vs naive fp32 on a ResNet-50-style model.

    python benchmarks/bench_gpu.py               # needs a CUDA device; prints "no CUDA device: skipped" without

Not measured yet: the session that wrote it had no GPU (``--device cpu`` with a tiny model was used
to check the script runs).

Trains (forward, backward, SGD step) a ResNet-50-style network (bottleneck blocks [3, 4, 6, 3],
written here: no torchvision needed) on synthetic 224×224 images, batch ``--batch`` (default 128),
on one GPU, in the configurations the worker's switches give (``train.amp``,
``train.channels_last``, ``train.compile``):

* **naive**: fp32, NCHW, eager — PyTorch's defaults otherwise (so cuDNN may use TF32 for
  convolutions, which is its default; matmuls stay fp32);
* **bf16**: + ``torch.autocast(dtype=torch.bfloat16)``;
* **bf16+cl**: + channels_last model and inputs;
* **bf16+cl+compile**: + ``torch.compile`` (the compile time is reported, not timed in the rate).

Each configuration runs ``--warmup`` steps, then ``--steps`` timed steps between two
``torch.cuda.synchronize()`` calls; configurations are repeated ``--repeats`` times interleaved and
the best rate is kept. It prints images/s of each and the ratio of the full set to naive
(goal ≥ 2.5×). ``--device cpu`` runs the same code on the CPU (a smoke test of this script only,
use with a small ``--batch``/``--size``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int = 1):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """ResNet-50 layout (He et al. 2016): stem, 4 stages of bottlenecks, global pool, linear head."""

    def __init__(self, layers=(3, 4, 6, 3), num_classes: int = 1000):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        )
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            for j in range(n):
                blocks.append(Bottleneck(cin, width, stride=2 if (j == 0 and i > 0) else 1))
                cin = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


CONFIGS = {
    "naive": dict(bf16=False, channels_last=False, compile=False),
    "bf16": dict(bf16=True, channels_last=False, compile=False),
    "bf16+cl": dict(bf16=True, channels_last=True, compile=False),
    "bf16+cl+compile": dict(bf16=True, channels_last=True, compile=True),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Runner:
    """One configuration's model, optimizer and compiled step, kept between repeats."""

    def __init__(self, name: str, device: torch.device, args: argparse.Namespace):
        opts = CONFIGS[name]
        self.name, self.device, self.opts = name, device, opts
        torch.manual_seed(0)
        model = ResNet(layers=tuple(args.layers)).to(device)
        if opts["channels_last"]:
            model = model.to(memory_format=torch.channels_last)
        self.model = model
        self.forward = torch.compile(model) if opts["compile"] else model
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        g = torch.Generator(device="cpu").manual_seed(1)
        x = torch.randn(args.batch, 3, args.size, args.size, generator=g)
        self.x = x.to(device, memory_format=torch.channels_last if opts["channels_last"] else torch.contiguous_format)
        self.y = torch.randint(0, 1000, (args.batch,), generator=g).to(device)
        self.compile_s = 0.0
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            self.step()
        sync(device)
        if opts["compile"]:
            self.compile_s = time.perf_counter() - t0

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.opts["bf16"]):
            loss = F.cross_entropy(self.forward(self.x), self.y)
        loss.backward()
        self.opt.step()

    def rate(self, steps: int, batch: int) -> float:
        sync(self.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync(self.device)
        return steps * batch / (time.perf_counter() - t0)


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test of the script)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--layers", type=int, nargs=4, default=[3, 4, 6, 3])
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated subset of " + ",".join(CONFIGS))
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: skipped (bench_gpu needs a GPU; torch.cuda.is_available() is False)")
        return 0
    device = torch.device(args.device)
    names = [n for n in args.configs.split(",") if n]
    if device.type == "cuda":
        print(
            f"GPU: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, ResNet layers {args.layers}, "
            f"batch {args.batch}, {args.size}x{args.size}",
            flush=True,
        )
        if "bf16" in args.configs and not torch.cuda.is_bf16_supported():
            print("this GPU has no bf16 support: skipped")
            return 0
    runners = {}
    for n in names:
        runners[n] = Runner(n, device, args)
        extra = f" (compile + warm-up {runners[n].compile_s:.1f} s)" if runners[n].compile_s else ""
        print(f"  built {n}{extra}", flush=True)
    best: Dict[str, float] = {n: 0.0 for n in names}
    for rep in range(args.repeats):
        for n in names if rep % 2 == 0 else names[::-1]:
            r = runners[n].rate(args.steps, args.batch)
            best[n] = max(best[n], r)
            print(f"  repeat {rep}: {n:16s} {r:9.1f} images/s", flush=True)
    base = best.get("naive")
    for n in names:
        ratio = f" = {best[n] / base:.2f}× naive" if base else ""
        print(f"{n:16s} {best[n]:9.1f} images/s{ratio}")
    if base and "bf16+cl+compile" in best:
        ratio = best["bf16+cl+compile"] / base
        print(
            f"GPU ratio (bf16 + channels_last + compile vs naive fp32): {ratio:.2f}× "
            f"(goal >= 2.5×: {'met' if ratio >= 2.5 else 'NOT met'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
