"""CPU lists (the Linux "cpulist" format, OpenMP place lists) and srun's ``SLURM_CPU_BIND``, parsed and
formatted. Part of :mod:`slurm_ddp.binding` (its docstring gives the sources). Pure; imports no torch.
"""

from __future__ import annotations

import re
from typing import (
    TYPE_CHECKING,
    FrozenSet,
    Iterable,
    List,
    Sequence,
    Set,
    Tuple,
)

if TYPE_CHECKING:
    pass


# --------------------------------------------------------------------------- cpu lists


def parse_cpulist(text: str) -> FrozenSet[int]:
    """``"0-3,8,10-11"`` → ``{0, 1, 2, 3, 8, 10, 11}`` (Linux cpulist format, cpuset(7)).

    Also accepts ``a-b:stride`` ranges. Raises ``ValueError`` for anything else.
    """
    cpus: Set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+)(?::(\d+))?)?", part)
        if not m:
            raise ValueError(f"bad CPU list {text!r}: expected e.g. 0-3,8,10-11")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise ValueError(f"bad CPU list {text!r}: range {part!r} is empty")
        cpus.update(range(lo, hi + 1, step))
    return frozenset(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 3, 8}`` → ``"0-3,8"`` (sorted; Linux cpulist format). Empty → ``""``."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in _runs(sorted(set(cpus))))


def omp_places(cpus: Sequence[int]) -> str:
    """OMP_PLACES with one place per CPU, in the given order, runs written as intervals.

    ``[0, 1, 2, 3, 8]`` → ``"{0}:4,{8}"`` (OpenMP 5.2 §21.1.6: ``{0}:4`` = ``{0},{1},{2},{3}``).
    """
    parts = []
    i = 0
    cpus = list(cpus)
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        n = j - i + 1
        parts.append(f"{{{cpus[i]}}}" + (f":{n}" if n > 1 else ""))
        i = j + 1
    return ",".join(parts)


def _runs(sorted_cpus: List[int]) -> List[Tuple[int, int]]:
    runs: List[Tuple[int, int]] = []
    for c in sorted_cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], c)
        else:
            runs.append((c, c))
    return runs


# --------------------------------------------------------------------------- SLURM_CPU_BIND


#: srun --cpu-bind types that bind each task to a subset of the node (srun(1)).
_SLURM_BINDING_TYPES = (
    "cores",
    "threads",
    "sockets",
    "ldoms",
    "rank",
    "rank_ldom",
    "boards",
    "map_cpu",
    "mask_cpu",
    "map_ldom",
    "mask_ldom",
)


def parse_slurm_cpu_bind(value: str) -> Tuple[str, Tuple[FrozenSet[int], ...]]:
    """``SLURM_CPU_BIND`` → ``(type, per-task CPU sets)``.

    ``"quiet,mask_cpu:0x3,0xC"`` → ``("mask_cpu", ({0, 1}, {2, 3}))``;
    ``"verbose,map_cpu:0,4"`` → ``("map_cpu", ({0}, {4}))``; ``"quiet,cores"`` → ``("cores", ())``;
    ``""`` or ``"none"`` → ``("none", ())``. Masks are hexadecimal, map entries CPU ids, and
    ``ITEM*N`` repeats an item N times (srun(1), ``--cpu-bind``). Raises ``ValueError`` for
    a list that cannot be read.
    """
    tokens = [t for t in (value or "").split(",") if t]
    kind = "none"
    items: List[str] = []
    seen_type = False
    for tok in tokens:
        if not seen_type:
            head = tok.split(":", 1)
            if head[0] in ("quiet", "verbose"):
                continue
            kind = head[0] or "none"
            seen_type = True
            if len(head) == 2 and head[1]:
                items.append(head[1])
        else:
            items.append(tok)
    if kind not in ("mask_cpu", "map_cpu"):
        return kind, ()
    sets: List[FrozenSet[int]] = []
    for item in items:
        text, _, times = item.partition("*")
        count = int(times) if times else 1
        if kind == "mask_cpu":
            mask = int(text, 16)
            cpus = frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)
        else:
            cpus = frozenset([int(text, 0)])
        sets.extend([cpus] * count)
    return kind, tuple(sets)
