"""CPU, NUMA, OpenMP and allocator binding of one rank: planned purely, applied at the edge.

``plan_binding()`` is pure: from explicit inputs (the config's ``environment`` section, the
rank's slot on its node, ``cpus_per_task``, the CPUs the process may use, the NUMA topology,
the task's environment, the located libraries) it returns a :class:`BindingPlan` — the CPU
set of the rank, its NUMA node(s), the variables to set, the libraries to preload and a
command prefix (``numactl`` in ``numa`` mode). ``plan_for_task()`` takes the slot from the
SLURM task variables. Nothing here changes the process.

The readers (``read_numa_nodes``, ``read_core_ids``, ``read_gpu_numa_nodes``,
``ldconfig_cache``) read ``/sys`` or run ``ldconfig -p`` and are the only functions with
inputs from the machine; the caller passes what they return into the planner.
Applying the plan (``sched_setaffinity``, the environment, ``exec``) is
``slurm_ddp.launch``: ``LD_PRELOAD`` must be in place before the interpreter starts, so it
cannot be set from inside the worker. Imports no torch.

Conventions and sources:

- CPU lists use the Linux "cpulist" format (``0-3,8,10-11``; cpuset(7), "FORMATS").
- ``SLURM_CPU_BIND`` is the task's value of ``srun --cpu-bind`` (srun(1), "--cpu-bind" and
  "OUTPUT ENVIRONMENT VARIABLES"): ``[quiet|verbose,]TYPE[:LIST]``.
- ``OMP_NUM_THREADS``, ``OMP_PROC_BIND``, ``OMP_PLACES``, ``OMP_SCHEDULE``: OpenMP API
  specification 5.2, chapter 21 "Environment Variables" (``{c}:n`` is a place interval:
  ``n`` places of one CPU from CPU ``c``).
- ``KMP_AFFINITY``, ``KMP_BLOCKTIME``: Intel OpenMP runtime ("Thread Affinity Interface",
  "Supported Environment Variables" of the Intel C++ compiler / oneAPI documentation).
  KMP_AFFINITY takes precedence over OMP_PROC_BIND/OMP_PLACES in libiomp5 (and warns when
  both are set), so with ``openmp: intel`` only the KMP_ variables bind threads.
- The values follow PyTorch's CPU performance tuning guide: OMP_NUM_THREADS = the task's
  physical CPUs, ``OMP_SCHEDULE=STATIC``, ``OMP_PROC_BIND=CLOSE``, ``KMP_BLOCKTIME=1``.

The parts, one job each, re-exported here (``slurm_ddp.binding`` is the public path): ``cpulist``
(CPU lists, ``SLURM_CPU_BIND``), ``plan`` (the pure planner) and ``machine`` (the readers of ``/sys``
and the library lookup).
"""

from __future__ import annotations

from ..errors import BindingError  # what the planner and the readers raise, importable from here as before
from .cpulist import format_cpulist, omp_places, parse_cpulist, parse_slurm_cpu_bind
from .machine import (
    LIBRARIES,
    LibrarySpec,
    default_library_dirs,
    ldconfig_cache,
    locate_libraries,
    locate_library,
    missing_library_message,
    read_core_ids,
    read_gpu_numa_by_index,
    read_gpu_numa_nodes,
    read_gpu_pci_devices,
    read_numa_nodes,
)
from .plan import (
    APPLIED_VAR,
    PLAN_VARS,
    BindingPlan,
    CpuChoice,
    EnvironmentPlan,
    choose_cpus,
    needed_libraries,
    plan_binding,
    plan_environment,
    plan_for_task,
)

__all__ = [
    "BindingError",
    "APPLIED_VAR",
    "BindingPlan",
    "CpuChoice",
    "EnvironmentPlan",
    "LIBRARIES",
    "LibrarySpec",
    "PLAN_VARS",
    "choose_cpus",
    "default_library_dirs",
    "format_cpulist",
    "ldconfig_cache",
    "locate_libraries",
    "locate_library",
    "missing_library_message",
    "needed_libraries",
    "omp_places",
    "parse_cpulist",
    "parse_slurm_cpu_bind",
    "plan_binding",
    "plan_environment",
    "plan_for_task",
    "read_core_ids",
    "read_gpu_numa_by_index",
    "read_gpu_numa_nodes",
    "read_gpu_pci_devices",
    "read_numa_nodes",
]
