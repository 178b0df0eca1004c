"""How much memory a job will get: what it asks for (``slurm.mem_gb``, ``slurm.extra``), else the
site's default, asked of Slurm (``scontrol show config``, ``scontrol show partition``).

``submit`` and ``submit --dry-run`` print :func:`memory_line`. Slurm's rule (slurm.conf(5)
``DefMemPerCPU``/``DefMemPerNode``/``DefMemPerGPU``, "mutually exclusive"; sbatch(1) ``--mem``,
``--mem-per-cpu``): a job that asks for no memory gets the partition's default when the partition
sets one (``scontrol show partition``), else the cluster's (``scontrol show config``); a per-CPU
default counts the job's CPUs on the node, ``cpus_per_task`` × ranks per node; none set is
unlimited. Where memory is not a consumable resource (``SelectTypeParameters`` without
``_Memory``, e.g. ``CR_Core``) Slurm schedules none. Side effects: :func:`ask_site_memory` runs
``scontrol`` through an injectable runner; the rest is pure. Imports no torch.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from typing import Dict, Optional

from ..config import JobConfig
from ..render import sbatch_options
from ..rundir import MEM_KEY
from .slurm import Runner, call, last_line

_UNITS_MB = {"K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


def size_mb(text: str) -> Optional[float]:
    """An sbatch/scontrol memory size (``4096``, ``4096M``, ``4G``, ``1000``; default unit MB,
    sbatch(1) ``--mem``) in MB; None for ``UNLIMITED``, ``0`` and what is not a size."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)B?\s*", text.upper())
    if not m or float(m.group(1)) == 0:
        return None
    return float(m.group(1)) * _UNITS_MB[m.group(2) or "M"]


@dataclass(frozen=True)
class SiteMemory:
    """What Slurm says about default memory. ``unknown``: why it could not be asked ("" when it was)."""

    select_type_parameters: str = ""  #: e.g. ``CR_Core_Memory`` (scontrol prints it upper case)
    def_mem_per_cpu_mb: Optional[float] = None
    def_mem_per_node_mb: Optional[float] = None
    def_mem_per_gpu_mb: Optional[float] = None
    source: str = ""  #: where the default was set: ``partition debug`` or ``slurm.conf``
    partition: str = ""  #: the partition the job goes to (the one asked, else the default one)
    unknown: str = ""

    @property
    def memory_scheduled(self) -> bool:
        """True when memory is a consumable resource (``SelectTypeParameters=CR_*_Memory``)."""
        return "MEMORY" in self.select_type_parameters.upper()


def _fields(text: str) -> Dict[str, str]:
    return dict(re.findall(r"(?:^|\s)([A-Za-z]+)\s*=\s*(\S+)", text))


def parse_site_memory(config_text: str, partition_text: str) -> SiteMemory:
    """:class:`SiteMemory` from ``scontrol show config`` and ``scontrol show partition -o`` (the job's
    partition's one line, or every partition's: the ``Default=YES`` one is taken). The partition's own
    ``DefMemPer*`` wins over the cluster's (slurm.conf(5): set per partition, it overrides)."""
    conf = _fields(config_text)
    lines = [ln for ln in partition_text.splitlines() if "PartitionName=" in ln]
    part = next((ln for ln in lines if " Default=YES" in f" {ln}"), lines[0] if lines else "")
    pfields = _fields(part)
    jobdef = _fields(pfields.get("JobDefaults", "").replace(",", " "))
    select = conf.get("SelectTypeParameters", "")
    name = pfields.get("PartitionName", "")
    for fields, where in ((pfields, f"partition {name}"), (conf, "slurm.conf")):
        cpu, node = size_mb(fields.get("DefMemPerCPU", "")), size_mb(fields.get("DefMemPerNode", ""))
        gpu = size_mb((jobdef if where.startswith("partition") else fields).get("DefMemPerGPU", ""))
        if cpu or node or gpu:
            return SiteMemory(select, cpu, node, gpu, source=where, partition=name)
    return SiteMemory(select, partition=name)


def ask_site_memory(partition: Optional[str], run: Runner = subprocess.run) -> SiteMemory:
    """Ask Slurm (``scontrol show config``, ``scontrol show partition -o [PARTITION]``) for the
    defaults :func:`parse_site_memory` reads; a question that cannot be asked (no scontrol on PATH,
    no answer, an error) is :attr:`SiteMemory.unknown`, never raised."""
    answers = []
    for argv in (
        ["scontrol", "show", "config"],
        ["scontrol", "show", "partition", "-o", *([partition] if partition else [])],
    ):
        proc, why = call(run, argv, timeout=10)
        if proc is None:
            return SiteMemory(unknown=why)
        if proc.returncode != 0:
            return SiteMemory(unknown=f"{' '.join(argv[:3])}: {last_line(proc)}")
        answers.append(proc.stdout or "")
    return parse_site_memory(*answers)


def _mb(x: float) -> str:
    return f"{x:.0f} MB"


def memory_line(cfg: JobConfig, site: Optional[SiteMemory]) -> str:
    """One line: the memory the job will get per node and per rank, and the key to set
    (:data:`MEM_KEY`). What the job asks for (``--mem`` from ``slurm.mem_gb`` or ``slurm.extra``,
    ``--mem-per-cpu``/``--mem-per-gpu`` from ``slurm.extra``) needs no ``site``; else ``site`` says
    the default, or why it is unknown (None: not asked)."""
    s = cfg.slurm
    opts = sbatch_options(cfg)
    ranks, cpus = s.tasks_per_node, s.cpus_per_task * s.tasks_per_node
    key = f"{MEM_KEY}={s.mem_gb:g}" if s.mem_gb is not None else "slurm.extra.mem"
    node_note = ""
    if site is not None and site.select_type_parameters and not site.memory_scheduled:
        node_note = f" (memory is not a consumable resource here: SelectTypeParameters={site.select_type_parameters})"
    node = size_mb(opts.get("mem") or "")
    if node:
        return f"memory: {_mb(node)} per node ({key}), {_mb(node / ranks)} per rank ({ranks} per node){node_note}"
    for opt, unit in (("mem_per_cpu", "CPU"), ("mem_per_gpu", "GPU")):
        if opts.get(opt):
            return f"memory: {opts[opt]} per {unit} (slurm.extra.{opt}){node_note}"
    unset = f"{MEM_KEY} unset"
    fix = f"set {MEM_KEY} (GB per node) to choose"
    if site is None or site.unknown:
        why = site.unknown if site is not None else "Slurm not asked"
        return (
            f"memory: unknown ({why}); {unset}: the job gets the site's default (DefMemPerCPU × its CPUs, "
            f"or DefMemPerNode); {fix}"
        )
    where = f" ({site.source})"
    if not site.memory_scheduled:
        default = next(
            (
                f"; the job records {name}={_mb(v)}{where} as its request, not enforced by the scheduler"
                for name, v in (
                    ("DefMemPerCPU", site.def_mem_per_cpu_mb),
                    ("DefMemPerNode", site.def_mem_per_node_mb),
                    ("DefMemPerGPU", site.def_mem_per_gpu_mb),
                )
                if v
            ),
            "",
        )
        return (
            f"memory: not a consumable resource here (SelectTypeParameters={site.select_type_parameters or '?'}): "
            f"Slurm allocates none ({unset}){default}"
        )
    if site.def_mem_per_cpu_mb:
        per = site.def_mem_per_cpu_mb
        if s.exclusive:
            return f"memory: {unset}: DefMemPerCPU={_mb(per)}{where} × every CPU of each node (slurm.exclusive); {fix}"
        return (
            f"memory: {unset}: DefMemPerCPU={_mb(per)}{where} × {s.cpus_per_task} CPU(s) per rank = "
            f"{_mb(per * s.cpus_per_task)} per rank, {_mb(per * cpus)} per node ({ranks} ranks); {fix}"
        )
    if site.def_mem_per_node_mb:
        node = site.def_mem_per_node_mb
        return (
            f"memory: {unset}: DefMemPerNode={_mb(node)}{where} per node = {_mb(node / ranks)} per rank "
            f"({ranks} per node); {fix}"
        )
    if site.def_mem_per_gpu_mb:
        gpus = s.gpus_per_node or (s.gpus_per_task or 0) * ranks
        if gpus:
            return (
                f"memory: {unset}: DefMemPerGPU={_mb(site.def_mem_per_gpu_mb)}{where} × {gpus} GPU(s) per node = "
                f"{_mb(site.def_mem_per_gpu_mb * gpus)} per node, {_mb(site.def_mem_per_gpu_mb * gpus / ranks)} per "
                f"rank; {fix}"
            )
    return (
        f"memory: {unset} and no default set (DefMemPerCPU/DefMemPerNode unlimited in slurm.conf and partition "
        f"{site.partition or '?'}): Slurm's default is unlimited; {fix}"
    )


__all__ = ["MEM_KEY", "SiteMemory", "ask_site_memory", "memory_line", "parse_site_memory", "size_mb"]
