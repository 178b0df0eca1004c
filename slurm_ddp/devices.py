"""Which GPU a rank uses, from what Slurm made visible, and the NCCL variables GPU ranks get. Pure.

Imports no torch: ``select_device(environ)`` takes a ``Mapping`` (a task's environment) and
returns the CUDA ordinal of this rank (``cuda:N``) and the physical GPU behind it, the same
answer whether or not this machine can use CUDA (a login node, the sandbox's placeholder
devices). The worker (``slurm_ddp.worker.runtime.init_distributed``), ``slurm-ddp env`` inside a
task, and a user's own script (``python -m slurm_ddp.devices`` prints the record as JSON) use it.

How Slurm hands out GPUs (srun(1)/sbatch(1) "--gpus-per-node", "--gpus-per-task",
"--gpu-bind"; gres.conf(5); "OUTPUT ENVIRONMENT VARIABLES"): each task gets
``CUDA_VISIBLE_DEVICES`` (the devices CUDA will number 0, 1, … in this process),
``SLURM_STEP_GPUS`` / ``SLURM_JOB_GPUS`` (the node's GPU indices of the step / job, as in
gres.conf) and ``GPU_DEVICE_ORDINAL`` (the same list for ROCm). With ``--gpus-per-node=N
--ntasks-per-node=N`` every task sees all N GPUs; with ``--gpus-per-task=1``,
``--gpu-bind=single:1|map_gpu:…|mask_gpu:…`` (or cgroup device constraints) each task sees
one GPU — which CUDA numbers ``cuda:0`` whatever its physical index.

The rule (``select_device``): one visible GPU → ``cuda:0``; at least as many visible GPUs as
tasks on the node (the node's GPUs shared by its tasks) → ``cuda:LOCAL_RANK`` (torchrun's
convention); anything else is an error naming ``CUDA_VISIBLE_DEVICES``, ``SLURM_STEP_GPUS``,
``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``.

Which physical GPU that is (``physical_gpus``, the one owner of this answer; ``slot_gpus`` for every
task of the node) — what Slurm 22.05 gave on the sandbox, SLURM-FACTS.md "A production profile":

- Without cgroup device constraints ``SLURM_STEP_GPUS`` holds the node's indices (gres.conf order).
- With ``ConstrainDevices=yes`` (cgroup.conf(5), under ``TaskPlugin=task/cgroup``) a task bound to
  its own GPUs (``SLURMD_TRES_BIND=gpu:per_task:1`` from ``--gpus-per-task``, ``gpu:single:N``,
  ``gpu:map_gpu:…``) gets both ``CUDA_VISIBLE_DEVICES`` and ``SLURM_STEP_GPUS`` renumbered from
  0: every task reads ``0``. Without a task binding ``SLURM_STEP_GPUS`` keeps the node's indices
  (only ``CUDA_VISIBLE_DEVICES`` is renumbered).
- ``SLURM_JOB_GPUS`` keeps the node's indices, but it is set in the batch script and inherited by
  the tasks: it describes the batch host (the first node of ``SLURM_JOB_NODELIST``, sbatch(1)
  "DESCRIPTION"), and is wrong on the others.

So a renumbered task's GPU is worked out from the binding Slurm applied: ``map_gpu``/``mask_gpu``
name node indices (srun(1): only with the whole node); ``per_task:G`` hands the node's GPUs out in
order, task k the k-th G of them — known where the node's list is (``SLURM_JOB_GPUS`` on the batch
host, or all of the node's GPUs when ``SLURM_GPUS_ON_NODE`` says the job has them all); ``single``
and ``closest`` follow the CPU topology and stay unknown. Whenever the variables admit two answers
the physical GPU is ``None`` ("unknown"), never a guess. Where CUDA works, the device's own PCI
address (``torch.cuda.get_device_properties``) names it for certain (``cuda_pci_address``,
``nvidia_minor``), and sysfs gives its NUMA node (``pci_numa_node``).

Readers of this machine (not pure; each takes its root as a parameter for tests):
``read_devices_constrained`` (slurm.conf/cgroup.conf), ``nvidia_minor`` (/proc/driver/nvidia),
``pci_numa_node`` (/sys/bus/pci/devices).

Why over 600 lines: it is the one owner of a rank's GPU: the selection rule, the physical GPU under each
Slurm binding and the NCCL variables all read the same Slurm GPU variables, parsed here once.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .env import expand_nodelist, expand_tasks_per_node
from .errors import UserError

__all__ = [
    "DeviceChoice",
    "DeviceSelectionError",
    "NCCL_DEFAULTS",
    "NCCL_PASS_THROUGH",
    "cuda_pci_address",
    "identify_cuda_device",
    "nccl_environment",
    "nvidia_minor",
    "pci_numa_node",
    "physical_gpus",
    "read_devices_constrained",
    "select_device",
    "slot_gpus",
    "synthetic_gpu_env",
    "visible_devices",
]

#: NCCL/PyTorch variables a GPU rank gets when the user has not set them (nor their older name).
#:
#: - ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``: on a NCCL error or a collective past the process
#:   group's timeout, the watchdog aborts the communicator and tears the process down, so a dead
#:   peer ends the job (srun --kill-on-bad-exit stops the rest) instead of hanging it. PyTorch's
#:   default is 3 (tear down without aborting the communicator). Source: PyTorch docs,
#:   "PYTORCH ProcessGroupNCCL Environment Variables" (torch_nccl_environment_variables.html);
#:   the older name ``NCCL_ASYNC_ERROR_HANDLING`` is honoured as set by the user.
#: - ``NCCL_DEBUG=WARN``: NCCL prints an explicit message whenever a NCCL call fails (and nothing
#:   otherwise). Source: NCCL User Guide, "Environment Variables", NCCL_DEBUG (VERSION, WARN,
#:   INFO, TRACE).
NCCL_DEFAULTS: Tuple[Tuple[str, str, Tuple[str, ...]], ...] = (
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", ("NCCL_ASYNC_ERROR_HANDLING",)),
    ("NCCL_DEBUG", "WARN", ()),
)

#: Network selection NCCL reads (NCCL User Guide, "Environment Variables": NCCL_SOCKET_IFNAME,
#: NCCL_IB_HCA, NCCL_IB_GID_INDEX, …): never set by slurm_ddp; a value from the submitting
#: environment (sbatch exports it: ``--export=ALL`` is the default) or ``environment.env``
#: reaches every rank unchanged, and ``env --explain`` lists it.
NCCL_PASS_THROUGH = ("NCCL_SOCKET_IFNAME", "NCCL_IB_")


class DeviceSelectionError(UserError):
    """The GPUs this task can see do not fit its place on the node (one line, exit 2)."""


@dataclass(frozen=True)
class DeviceChoice:
    """The GPU of one rank (``select_device``)."""

    ordinal: int  #: CUDA device index in this process: the rank uses ``cuda:<ordinal>``
    physical: Optional[str]  #: the node's GPU behind it (Slurm's index, as in gres.conf); None = unknown
    visible: Tuple[str, ...]  #: what this process sees (CUDA_VISIBLE_DEVICES entries, in CUDA's order)
    local_rank: int  #: LOCAL_RANK / SLURM_LOCALID
    local_world_size: int  #: LOCAL_WORLD_SIZE / tasks on this node
    rule: str  #: why this device, in words
    physical_source: str = ""  #: how the physical GPU was known, or why it is unknown, in words
    pci_address: Optional[str] = None  #: the device's PCI address (``0000:3b:00.0``) where CUDA told it
    numa_node: Optional[int] = None  #: the NUMA node of that PCI device (sysfs); None = unknown

    @property
    def device(self) -> str:
        """``"cuda:N"``: what to pass to ``torch.device``."""
        return f"cuda:{self.ordinal}"

    @property
    def physical_text(self) -> str:
        """``"1"``, ``"1 (PCI 0000:3b:00.0, NUMA node 0)"``, ``"unknown"``: the physical GPU in words."""
        extra = ", ".join(
            [f"PCI {self.pci_address}"] * bool(self.pci_address)
            + [f"NUMA node {self.numa_node}"] * (self.numa_node is not None and self.numa_node >= 0)
        )
        return (self.physical or "unknown") + (f" ({extra})" if extra else "")

    def describe(self) -> str:
        """One line: ``cuda:1 (physical GPU 1 [SLURM_STEP_GPUS]; CUDA_VISIBLE_DEVICES=0,1; rule: …)``."""
        return (
            f"{self.device} (physical GPU {self.physical_text} [{self.physical_source}]; "
            f"CUDA_VISIBLE_DEVICES={','.join(self.visible)}; rule: {self.rule})"
        )


def _split(value: Optional[str]) -> Tuple[str, ...]:
    return tuple(v.strip() for v in (value or "").split(",") if v.strip())


def visible_devices(environ: Mapping[str, str]) -> Optional[Tuple[str, ...]]:
    """The devices this process sees, in CUDA's order; None when nothing restricts them.

    ``CUDA_VISIBLE_DEVICES`` (CUDA C Programming Guide, "CUDA Environment Variables"); when it
    is unset, ``GPU_DEVICE_ORDINAL`` (Slurm sets it for ROCm). An empty value, or Slurm's
    ``NoDevFiles``, means no device.
    """
    for name in ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"):
        if name in environ:
            value = environ[name]
            return () if value.strip() in ("", "NoDevFiles") else _split(value)
    return None


def _int(environ: Mapping[str, str], names: Sequence[str]) -> Optional[int]:
    for name in names:
        text = environ.get(name, "").strip()
        if text:
            try:
                return int(text)
            except ValueError:
                raise DeviceSelectionError(f"{name}={text!r} is not an integer") from None
    return None


def _local_world_size(environ: Mapping[str, str]) -> Optional[int]:
    lws = _int(environ, ("LOCAL_WORLD_SIZE",))
    if lws is not None:
        return lws
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if spec:
        per_node = expand_tasks_per_node(spec)
        node = _int(environ, ("SLURM_NODEID",)) or 0
        return per_node[node] if node < len(per_node) else per_node[-1]
    return None


def select_device(
    environ: Mapping[str, str],
    device_count: Optional[int] = None,
    *,
    constrained: Optional[bool] = None,
    node_gpu_count: Optional[int] = None,
) -> DeviceChoice:
    """The CUDA device of the rank whose environment is ``environ``. Pure; no torch.

    Inputs read: ``CUDA_VISIBLE_DEVICES`` (else ``GPU_DEVICE_ORDINAL``), ``SLURM_STEP_GPUS``,
    ``LOCAL_RANK`` (else ``SLURM_LOCALID``), ``LOCAL_WORLD_SIZE``
    (else the node's entry of ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE``), and for the
    physical GPU what ``physical_gpus`` reads. ``device_count``: what ``torch.cuda.device_count()``
    says, used only when no variable restricts the visible devices. ``constrained``/``node_gpu_count``:
    ``physical_gpus``'s evidence from the machine (None = not known).

    The rule: 1 visible device → ``cuda:0``; visible devices ≥ tasks on this node →
    ``cuda:LOCAL_RANK``; else ``DeviceSelectionError``. The physical GPU is ``physical_gpus``'
    entry for that device (None when the variables do not say it for certain).

    Raises ``DeviceSelectionError`` (one line naming CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS,
    LOCAL_RANK and LOCAL_WORLD_SIZE) when no device is visible or the visible ones cannot be
    shared out one per task.
    """
    visible = visible_devices(environ)
    if visible is None and device_count is not None:
        visible = tuple(str(i) for i in range(device_count))
    step_gpus = _split(environ.get("SLURM_STEP_GPUS"))
    local_rank = _int(environ, ("LOCAL_RANK", "SLURM_LOCALID"))
    lws = _local_world_size(environ)

    def fail(why: str) -> DeviceSelectionError:
        shown = "unset" if "CUDA_VISIBLE_DEVICES" not in environ else repr(environ["CUDA_VISIBLE_DEVICES"])
        return DeviceSelectionError(
            f"cannot choose this rank's GPU: {why} (CUDA_VISIBLE_DEVICES={shown}, "
            f"SLURM_STEP_GPUS={','.join(step_gpus) or 'unset'}, LOCAL_RANK={local_rank if local_rank is not None else 'unset'}, "
            f"LOCAL_WORLD_SIZE={lws if lws is not None else 'unset'}). HINT: ask for one GPU per task "
            "(slurm.gpus_per_task: 1) or for as many GPUs per node as tasks (slurm.gpus_per_node = slurm.tasks_per_node)"
        )

    if visible is None:
        raise fail("no GPU is visible to this task (nothing restricts CUDA's devices and their count is unknown)")
    if not visible:
        raise fail("no GPU is visible to this task")
    lr = 0 if local_rank is None else local_rank
    n_local = 1 if lws is None else lws
    if len(visible) == 1:
        ordinal, rule = 0, "one GPU visible: cuda:0"
    elif local_rank is None or lws is None:
        raise fail(f"{len(visible)} GPUs visible, and this task's place on the node is unknown")
    elif not 0 <= lr < n_local:
        raise fail(f"LOCAL_RANK {lr} is outside 0..{n_local - 1}")
    elif len(visible) >= n_local:
        ordinal, rule = lr, f"{len(visible)} GPUs visible to {n_local} task(s) on the node: cuda:LOCAL_RANK"
    else:
        raise fail(f"{len(visible)} GPUs visible to each of {n_local} tasks on the node: neither one each nor all")
    names, source = physical_gpus(environ, visible, constrained=constrained, node_gpu_count=node_gpu_count)
    return DeviceChoice(
        ordinal=ordinal,
        physical=names[ordinal] if names is not None else None,
        visible=visible,
        local_rank=lr,
        local_world_size=n_local,
        rule=rule,
        physical_source=source,
    )


def _renumbered(gpus: Sequence[str]) -> bool:
    """``0,1,…,k-1``: the form a cgroup-constrained list takes (it may also be the node's own indices)."""
    return list(gpus) == [str(i) for i in range(len(gpus))]


def _task_bind(environ: Mapping[str, str]) -> Tuple[str, str]:
    """The GPU binding Slurm applied to this task, from ``SLURMD_TRES_BIND`` (``gpu:per_task:1`` →
    ``("per_task", "1")``; set by srun for ``--gpus-per-task`` and ``--gpu-bind``); ``("", "")`` = none.
    Slurm 22.05 writes ``gpu:per_task:1``, 24.11 and 26.05 ``gres/gpu:per_task:1`` (seen in
    .ci/other-debian's chroots); both are read."""
    for part in environ.get("SLURMD_TRES_BIND", "").split("+"):
        part = part.removeprefix("gres/")
        if part.startswith("gpu:"):
            kind, _, arg = part[4:].removeprefix("verbose,").partition(":")
            return ("", "") if kind == "none" else (kind, arg)
    return "", ""


def _node_gpu_list(environ: Mapping[str, str], node_gpu_count: Optional[int]) -> Tuple[Optional[Tuple[str, ...]], str]:
    """The node indices of the job's GPUs on this node, in order, and where that came from; None = unknown.

    ``SLURM_JOB_GPUS`` only on the batch host (sbatch(1): the script runs on the first node of the
    allocation; the tasks inherit its value), and only when it has ``SLURM_GPUS_ON_NODE`` entries; else
    ``0..n-1`` when ``SLURM_GPUS_ON_NODE`` equals ``node_gpu_count`` (the job has the whole node).
    """
    on_node = _split(environ.get("SLURM_GPUS_ON_NODE"))
    count = int(on_node[0]) if len(on_node) == 1 and on_node[0].isdigit() else None
    job = _split(environ.get("SLURM_JOB_GPUS"))
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST") or ""
    here = environ.get("SLURMD_NODENAME")
    try:
        batch_host = expand_nodelist(nodelist)[0] if nodelist else None
    except (ValueError, IndexError):
        batch_host = None
    if job and here and here == batch_host and (count is None or count == len(job)):
        return tuple(
            sorted(job, key=lambda g: int(g) if g.isdigit() else g)
        ), f"SLURM_JOB_GPUS={','.join(job)} (batch host)"
    if count is not None and node_gpu_count is not None and count == node_gpu_count:
        return tuple(str(i) for i in range(count)), f"all {count} GPUs of the node (SLURM_GPUS_ON_NODE={count})"
    return None, ""


def _bound_slot(kind: str, arg: str, slot: int, node: Optional[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
    """The node indices Slurm binds local task ``slot`` to under ``--gpu-bind=kind:arg`` (srun(1));
    None where that depends on more than the variables (``single``, ``closest``: the CPU topology)."""
    try:
        if kind == "per_task" and node is not None:
            g = int(arg or 1)
            out = node[slot * g : (slot + 1) * g]
            return out if len(out) == g else None
        if kind in ("map_gpu", "mask_gpu") and arg:
            lists = _bind_lists(kind, arg)
            return tuple(str(g) for g in lists[slot % len(lists)])
    except ValueError:
        return None
    return None


def physical_gpus(
    environ: Mapping[str, str],
    visible: Sequence[str],
    *,
    constrained: Optional[bool] = None,
    node_gpu_count: Optional[int] = None,
) -> Tuple[Optional[Tuple[str, ...]], str]:
    """The node's index (gres.conf order) of each ``visible`` device, in CUDA's order, and how it was
    known; ``(None, why)`` when the variables do not say it for certain. Pure.

    Inputs: ``SLURM_STEP_GPUS``, ``SLURMD_TRES_BIND`` (the task's GPU binding), ``SLURM_LOCALID`` (else
    ``LOCAL_RANK``), ``SLURM_JOB_GPUS`` with ``SLURMD_NODENAME``/``SLURM_JOB_NODELIST`` (trusted on the
    batch host only), ``SLURM_GPUS_ON_NODE``. ``constrained``: whether the node constrains devices
    (``read_devices_constrained``; None = not known). ``node_gpu_count``: the GPUs the node has (sysfs),
    or None. The reasoning (module docstring): a list that is not ``0..k-1`` holds node indices; without
    a task binding ``SLURM_STEP_GPUS`` holds them also under ``ConstrainDevices``; with one, the binding
    gives the task's GPUs where it can (``_bound_slot``) and that answer is taken when the node is known
    to constrain devices or when it agrees with ``SLURM_STEP_GPUS``; anything else is unknown.
    Without ``SLURM_STEP_GPUS`` (outside a Slurm step) the ``CUDA_VISIBLE_DEVICES`` entries, unless the
    node constrains devices.
    """
    visible = tuple(visible)
    step = _split(environ.get("SLURM_STEP_GPUS"))
    if len(step) != len(visible):
        node, node_source = _node_gpu_list(environ, node_gpu_count)
        if node is not None and len(node) == len(visible):
            return node, node_source
        if constrained is False or (not step and constrained is None):
            return visible, "CUDA_VISIBLE_DEVICES" + (" (no SLURM_STEP_GPUS)" if not step else "")
        return None, (
            f"SLURM_STEP_GPUS={','.join(step) or 'unset'} does not list the {len(visible)} visible device(s)"
            + (", which ConstrainDevices renumbered" if constrained else "")
        )
    kind, arg = _task_bind(environ)
    if not kind or not _renumbered(step):
        why = "SLURM_STEP_GPUS" if not kind else "SLURM_STEP_GPUS, not renumbered"
        return step, why
    if constrained is False:
        return step, "SLURM_STEP_GPUS (devices not constrained)"
    slot = _int(environ, ("SLURM_LOCALID", "LOCAL_RANK")) or 0
    node, node_source = _node_gpu_list(environ, node_gpu_count)
    bound = _bound_slot(kind, arg, slot, node)
    if bound is None and node is not None and len(node) == len(step):
        bound = node  # the task has all of the node's GPUs, renumbered in order
    renumber = f"SLURM_STEP_GPUS={','.join(step)} under --gpu-bind={kind}{':' + arg if arg else ''}"
    if bound is not None and len(bound) == len(step) and (constrained or bound == step):
        via = f" of {node_source}" if kind == "per_task" or bound == node else ""
        return bound, f"local task {slot}'s GPU by {kind}{via}"
    if constrained:
        return None, (
            f"{renumber} is renumbered by ConstrainDevices, and which of the node's GPUs is this task's "
            "cannot be told from the variables here"
        )
    return None, f"{renumber} is this GPU, or renumbered from 0 by cgroup ConstrainDevices: not known which"


def slot_gpus(
    environ: Mapping[str, str], *, constrained: Optional[bool] = None, node_gpu_count: Optional[int] = None
) -> List[Optional[str]]:
    """The physical GPU of every local task on this node (index = LOCAL_RANK; None = unknown). Pure.

    When this task sees the node's GPUs (``cuda:LOCAL_RANK``), task k has the k-th of them. When it
    sees one, its own is ``physical_gpus``'; the others are what Slurm's task binding gives them
    (``per_task`` over the node's list, ``map_gpu``/``mask_gpu``), else unknown. ``constrained`` and
    ``node_gpu_count`` as in ``physical_gpus``. Feeds the GPU-affine CPU choice
    (``slurm_ddp.binding.choose_cpus``). Empty when no task place or GPU is known.
    """
    try:
        mine = select_device(environ, constrained=constrained, node_gpu_count=node_gpu_count)
    except UserError:
        return []
    n = mine.local_world_size
    if len(mine.visible) >= n:
        names, _ = physical_gpus(environ, mine.visible, constrained=constrained, node_gpu_count=node_gpu_count)
        return list(names[:n]) if names is not None else [None] * n
    kind, arg = _task_bind(environ)
    node, _ = _node_gpu_list(environ, node_gpu_count)
    out: List[Optional[str]] = []
    for k in range(n):
        bound = _bound_slot(kind, arg, k, node)
        out.append(bound[0] if bound and len(bound) == 1 else None)
    if out[mine.local_rank] != mine.physical:  # the variables disagree: keep only what is certain
        out = [None] * n
    out[mine.local_rank] = mine.physical
    return out


def _conf_values(text: str) -> Dict[str, str]:
    """``{key (lower case): value}`` of a Slurm configuration file's text (``Key=Value``, ``#`` comments;
    an ``Include FILE`` line is kept as ``{"include": FILE}``)."""
    out: Dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, eq, value = line.partition("=")
        if eq and " " not in key.strip():
            out[key.strip().lower()] = value.strip()
        elif line.lower().startswith("include "):
            out["include"] = line.split(None, 1)[1]
    return out


def read_devices_constrained(environ: Mapping[str, str], default_conf: str = "/etc/slurm/slurm.conf") -> Optional[bool]:
    """Whether this node's tasks are held to their own GPUs by the devices cgroup; None = not known.

    True when slurm.conf (``SLURM_CONF``, else ``default_conf``; a configless node's slurmd sets
    ``SLURM_CONF`` for its jobs) names ``task/cgroup`` in ``TaskPlugin`` and the ``cgroup.conf``
    beside it says ``ConstrainDevices=yes`` (slurm.conf(5), cgroup.conf(5)); False when either says
    otherwise (cgroup.conf absent: its default ``no``); None when a file cannot be read, or
    ``TaskPlugin`` is not in slurm.conf but an ``Include`` line is.
    """
    conf = Path(environ.get("SLURM_CONF") or default_conf)
    try:
        slurm = _conf_values(conf.read_text())
    except (OSError, UnicodeDecodeError):
        return None
    if "taskplugin" not in slurm:
        return None if "include" in slurm else False
    if "task/cgroup" not in slurm["taskplugin"].lower():
        return False
    try:
        cgroup = _conf_values(conf.with_name("cgroup.conf").read_text())
    except FileNotFoundError:
        return False
    except (OSError, UnicodeDecodeError):
        return None
    return cgroup.get("constraindevices", "no").lower() == "yes"


def cuda_pci_address(props: Any) -> Optional[str]:
    """The sysfs PCI address (``0000:3b:00.0``) of a CUDA device from its
    ``torch.cuda.get_device_properties(i)`` (``pci_domain_id``, ``pci_bus_id``, ``pci_device_id``,
    function 0; the format ``torch.numa.binding`` uses in torch 2.13); None when torch does not say."""
    try:
        domain, bus, device = (int(getattr(props, k)) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
    except (AttributeError, TypeError, ValueError):
        return None
    return f"{domain:04x}:{bus:02x}:{device:02x}.0"


def nvidia_minor(pci_address: str, root: str = "/proc/driver/nvidia/gpus") -> Optional[int]:
    """The minor number N of ``/dev/nvidiaN`` for the NVIDIA GPU at ``pci_address``, from the driver's
    ``ROOT/<address>/information`` (``Device Minor: N``); None without the NVIDIA driver's file."""
    try:
        text = Path(root, pci_address, "information").read_text()
    except OSError:
        return None
    m = re.search(r"^Device Minor:\s*(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def pci_numa_node(pci_address: str, root: str = "/sys/bus/pci/devices") -> Optional[int]:
    """The NUMA node of the PCI device at ``pci_address`` (``ROOT/<address>/numa_node``); None when
    unreadable or -1 (the kernel's "no NUMA information")."""
    try:
        node = int(Path(root, pci_address, "numa_node").read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def identify_cuda_device(
    choice: DeviceChoice,
    props: Any,
    *,
    driver_root: str = "/proc/driver/nvidia/gpus",
    sysfs_root: str = "/sys/bus/pci/devices",
) -> DeviceChoice:
    """``choice`` with what the device itself says: its PCI address (``props``: what
    ``torch.cuda.get_device_properties(choice.ordinal)`` returned), its NUMA node, and — where the NVIDIA
    driver names the address's ``/dev/nvidiaN`` — the physical GPU N, which wins over the variables'
    answer (the source says when they differed). Unchanged when torch gives no PCI address."""
    addr = cuda_pci_address(props)
    if addr is None:
        return choice
    minor = nvidia_minor(addr, driver_root)
    physical, source = choice.physical, choice.physical_source
    if minor is not None:
        differs = choice.physical is not None and choice.physical != str(minor)
        physical = str(minor)
        source = f"the device: /dev/nvidia{minor}" + (f"; the variables said {choice.physical}" if differs else "")
    return replace(
        choice, physical=physical, physical_source=source, pci_address=addr, numa_node=pci_numa_node(addr, sysfs_root)
    )


def _bind_lists(kind: str, spec: str) -> List[List[int]]:
    """Expand ``map_gpu``/``mask_gpu`` lists (``0*2,1`` repeats entries) into GPU sets."""
    out: List[List[int]] = []
    for item in spec.split(","):
        value, _, times = item.partition("*")
        if kind == "map_gpu":
            gpus = [int(value)]
        else:
            mask = int(value, 16)
            gpus = [b for b in range(mask.bit_length()) if mask >> b & 1]
        out += [gpus] * int(times or 1)
    return out


def synthetic_gpu_env(
    *,
    local_rank: int,
    tasks_per_node: int,
    node_gpus: int,
    gpus_per_task: int = 0,
    gpu_bind: Optional[str] = None,
    constrained: bool = False,
) -> Dict[str, str]:
    """The GPU variables Slurm would give local task ``local_rank`` of a node with ``node_gpus`` GPUs.

    For ``env --explain`` (no cluster): ``--gpus-per-task=G`` (or ``--gpu-bind=per_task:G``) gives
    task k GPUs k·G…(k+1)·G-1; ``single:N`` gives GPU k // N; ``map_gpu:L`` entry k of L (reused
    cyclically); ``mask_gpu:M`` the bits of entry k; otherwise (``--gpus-per-node``, ``none``,
    ``closest`` — which on a real node picks the GPUs nearest the task's CPUs and is assumed here
    to give all) every GPU of the node. Without cgroup device constraints, as in srun(1)'s
    examples: CUDA_VISIBLE_DEVICES lists the node's indices; SLURM_JOB_GPUS lists all of the node's
    GPUs (the job has them all). With ``constrained`` (cgroup ``ConstrainDevices=yes``), as seen on
    Slurm 22.05 (SLURM-FACTS.md "A production profile"): CUDA_VISIBLE_DEVICES counts from 0, and so does
    SLURM_STEP_GPUS of a task Slurm bound to its own GPUs. ``SLURMD_TRES_BIND`` and
    ``SLURM_GPUS_ON_NODE`` as srun sets them. Empty for ``node_gpus`` 0.
    """
    if node_gpus <= 0:
        return {}
    bind = (gpu_bind or "").removeprefix("verbose,")
    kind, _, arg = bind.partition(":")
    everything = list(range(node_gpus))
    if kind == "per_task" or (gpus_per_task and kind not in ("single", "map_gpu", "mask_gpu")):
        g = int(arg) if kind == "per_task" else gpus_per_task
        gpus = everything[local_rank * g : (local_rank + 1) * g]
    elif kind == "single":
        gpus = [min(local_rank // int(arg), node_gpus - 1)]
    elif kind in ("map_gpu", "mask_gpu"):
        lists = _bind_lists(kind, arg)
        gpus = [g for g in lists[local_rank % len(lists)] if g < node_gpus]
    else:
        gpus = everything
    text = ",".join(map(str, gpus))
    renumbered = ",".join(map(str, range(len(gpus))))
    if kind in ("per_task", "single", "map_gpu", "mask_gpu", "closest"):
        tres = f"gpu:{bind}"
    elif gpus_per_task:
        tres = f"gpu:per_task:{gpus_per_task}"
    else:
        tres = ""
    env = {
        "CUDA_VISIBLE_DEVICES": renumbered if constrained else text,
        "SLURM_STEP_GPUS": renumbered if constrained and tres else text,
        "GPU_DEVICE_ORDINAL": renumbered if constrained else text,
        "SLURM_JOB_GPUS": ",".join(map(str, everything)),
        "SLURM_GPUS_ON_NODE": str(node_gpus),
    }
    if tres:
        env["SLURMD_TRES_BIND"] = tres
    return env


def nccl_environment(environ: Mapping[str, str]) -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
    """``(set, kept, passed)`` for a GPU rank whose environment is ``environ``. Pure.

    ``set``: the ``NCCL_DEFAULTS`` the user did not set (under either name); ``kept``: the ones
    the user set, as set; ``passed``: ``NCCL_SOCKET_IFNAME`` and ``NCCL_IB_*`` found in
    ``environ`` (never changed, listed so ``env --explain`` can show them).
    """
    out: Dict[str, str] = {}
    kept: Dict[str, str] = {}
    for name, value, older in NCCL_DEFAULTS:
        user = [n for n in (name, *older) if n in environ]
        if user:
            kept.update({n: environ[n] for n in user})
        else:
            out[name] = value
    passed = {k: v for k, v in sorted(environ.items()) if k == NCCL_PASS_THROUGH[0] or k.startswith("NCCL_IB_")}
    return out, kept, passed


def probe_record(environ: Mapping[str, str], constrained: Optional[bool] = None) -> Dict[str, object]:
    """One JSON-able record: this task's Slurm place, what it sees, and the device the rule chooses
    (``device``/``physical`` — None when unknown — and ``physical_source``), or the rule's one-line
    ``error``. ``constrained``: ``read_devices_constrained``'s answer (None = not known)."""
    record: Dict[str, object] = {
        k: environ.get(k)
        for k in (
            "SLURMD_NODENAME",
            "SLURM_NODEID",
            "SLURM_PROCID",
            "SLURM_LOCALID",
            "CUDA_VISIBLE_DEVICES",
            "SLURM_STEP_GPUS",
            "SLURM_JOB_GPUS",
            "GPU_DEVICE_ORDINAL",
            "SLURMD_TRES_BIND",
            "SLURM_GPUS_ON_NODE",
        )
    }
    record["devices_constrained"] = constrained
    try:
        choice = select_device(environ, constrained=constrained)
    except UserError as e:
        record["error"] = str(e)
    else:
        record.update(
            {k: v for k, v in asdict(choice).items() if k in ("ordinal", "physical", "physical_source", "rule")}
        )
        record["device"] = choice.device
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m slurm_ddp.devices``: print this task's ``probe_record`` as one JSON line; exit 0."""
    import os

    del argv
    print(json.dumps(probe_record(os.environ, read_devices_constrained(os.environ)), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
