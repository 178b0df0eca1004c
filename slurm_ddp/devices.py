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
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .env import expand_tasks_per_node
from .errors import UserError

__all__ = [
    "DeviceChoice",
    "DeviceSelectionError",
    "NCCL_DEFAULTS",
    "NCCL_PASS_THROUGH",
    "nccl_environment",
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
    physical: str  #: the node's GPU behind it (SLURM_STEP_GPUS/SLURM_JOB_GPUS index, else CUDA_VISIBLE_DEVICES entry)
    visible: Tuple[str, ...]  #: what this process sees (CUDA_VISIBLE_DEVICES entries, in CUDA's order)
    local_rank: int  #: LOCAL_RANK / SLURM_LOCALID
    local_world_size: int  #: LOCAL_WORLD_SIZE / tasks on this node
    rule: str  #: why this device, in words

    @property
    def device(self) -> str:
        """``"cuda:N"``: what to pass to ``torch.device``."""
        return f"cuda:{self.ordinal}"

    def describe(self) -> str:
        """One line: ``cuda:1 (physical GPU 1; CUDA_VISIBLE_DEVICES=0,1; rule: …)``."""
        return (
            f"{self.device} (physical GPU {self.physical}; CUDA_VISIBLE_DEVICES={','.join(self.visible)}; "
            f"rule: {self.rule})"
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


def select_device(environ: Mapping[str, str], device_count: Optional[int] = None) -> DeviceChoice:
    """The CUDA device of the rank whose environment is ``environ``. Pure; no torch.

    Inputs read: ``CUDA_VISIBLE_DEVICES`` (else ``GPU_DEVICE_ORDINAL``), ``SLURM_STEP_GPUS``
    (else ``SLURM_JOB_GPUS``), ``LOCAL_RANK`` (else ``SLURM_LOCALID``), ``LOCAL_WORLD_SIZE``
    (else the node's entry of ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE``).
    ``device_count``: what ``torch.cuda.device_count()`` says, used only when no variable
    restricts the visible devices.

    The rule: 1 visible device → ``cuda:0``; visible devices ≥ tasks on this node →
    ``cuda:LOCAL_RANK``; else ``DeviceSelectionError``. The physical GPU is the matching entry
    of SLURM_STEP_GPUS when it lists as many GPUs as are visible (Slurm's own indices, also
    under cgroup device constraints where CUDA_VISIBLE_DEVICES is renumbered from 0), else the
    CUDA_VISIBLE_DEVICES entry.

    Raises ``DeviceSelectionError`` (one line naming CUDA_VISIBLE_DEVICES, SLURM_STEP_GPUS,
    LOCAL_RANK and LOCAL_WORLD_SIZE) when no device is visible or the visible ones cannot be
    shared out one per task.
    """
    visible = visible_devices(environ)
    if visible is None and device_count is not None:
        visible = tuple(str(i) for i in range(device_count))
    step_gpus = _split(environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS"))
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
    entry = visible[ordinal]
    if len(step_gpus) == len(visible):
        physical = step_gpus[ordinal]
    else:
        physical = entry
    return DeviceChoice(
        ordinal=ordinal,
        physical=physical,
        visible=visible,
        local_rank=lr,
        local_world_size=n_local,
        rule=rule,
    )


def slot_gpus(environ: Mapping[str, str]) -> List[Optional[str]]:
    """The physical GPU of every local task on this node (index = LOCAL_RANK; None = unknown). Pure.

    When this task sees the node's GPUs (``cuda:LOCAL_RANK``), task k has the k-th of them. When it
    sees one, only its own is known from its variables; the others are taken from
    ``SLURM_JOB_GPUS`` in order when that lists exactly one GPU per task (Slurm's assignment under
    ``--gpus-per-task=1`` without ``--gpu-bind``), else left unknown. Feeds the GPU-affine CPU
    choice (``slurm_ddp.binding.choose_cpus``). Empty when no task place or GPU is known.
    """
    try:
        mine = select_device(environ)
    except UserError:
        return []
    n = mine.local_world_size
    if len(mine.visible) >= n:
        step = _split(environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS"))
        names = step if len(step) == len(mine.visible) else mine.visible
        return list(names[:n])
    job = _split(environ.get("SLURM_JOB_GPUS"))
    if len(job) == n and job[mine.local_rank] == mine.physical:
        return list(job)
    return [mine.physical if k == mine.local_rank else None for k in range(n)]


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
) -> Dict[str, str]:
    """The GPU variables Slurm would give local task ``local_rank`` of a node with ``node_gpus`` GPUs.

    For ``env --explain`` (no cluster): ``--gpus-per-task=G`` (or ``--gpu-bind=per_task:G``) gives
    task k GPUs k·G…(k+1)·G-1; ``single:N`` gives GPU k // N; ``map_gpu:L`` entry k of L (reused
    cyclically); ``mask_gpu:M`` the bits of entry k; otherwise (``--gpus-per-node``, ``none``,
    ``closest`` — which on a real node picks the GPUs nearest the task's CPUs and is assumed here
    to give all) every GPU of the node. Without cgroup device constraints, as in srun(1)'s
    examples: CUDA_VISIBLE_DEVICES lists the node's indices; SLURM_JOB_GPUS lists all of the node's
    GPUs (the job has them all). Empty for ``node_gpus`` 0.
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
    return {
        "CUDA_VISIBLE_DEVICES": text,
        "SLURM_STEP_GPUS": text,
        "GPU_DEVICE_ORDINAL": text,
        "SLURM_JOB_GPUS": ",".join(map(str, everything)),
    }


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


def probe_record(environ: Mapping[str, str]) -> Dict[str, object]:
    """One JSON-able record: this task's Slurm place, what it sees, and the device the rule chooses
    (``device``/``physical``), or the rule's one-line ``error``."""
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
        )
    }
    try:
        choice = select_device(environ)
    except UserError as e:
        record["error"] = str(e)
    else:
        record.update({k: v for k, v in asdict(choice).items() if k in ("ordinal", "physical", "rule")})
        record["device"] = choice.device
    return record


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m slurm_ddp.devices``: print this task's ``probe_record`` as one JSON line; exit 0."""
    import os

    del argv
    print(json.dumps(probe_record(os.environ), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
