"""What binding needs to know about this machine: where the preloadable libraries are
(:func:`locate_library`, ``ldconfig -p``) and the NUMA, core and GPU topology in ``/sys``. Part of
:mod:`slurm_ddp.binding`. Side effects: reads ``/sys``, runs ``ldconfig -p``; imports no torch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Callable,
    Dict,
    FrozenSet,
    Iterable,
    List,
    Mapping,
    Sequence,
    Tuple,
)

from ..errors import BindingError
from .cpulist import parse_cpulist

if TYPE_CHECKING:
    pass


# --------------------------------------------------------------------------- libraries


@dataclass(frozen=True)
class LibrarySpec:
    """A preloadable library: its file names (preferred first) and who ships it."""

    sonames: Tuple[str, ...]
    install: str  #: how to install it, naming the Debian and RPM packages


LIBRARIES: Mapping[str, LibrarySpec] = {
    "jemalloc": LibrarySpec(
        ("libjemalloc.so.2", "libjemalloc.so"),
        "Debian/Ubuntu: apt-get install libjemalloc2; RHEL/Fedora: dnf install jemalloc (EPEL); "
        "conda: conda install jemalloc",
    ),
    "tcmalloc": LibrarySpec(
        ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"),
        "Debian/Ubuntu: apt-get install libtcmalloc-minimal4; RHEL/Fedora: dnf install gperftools-libs; "
        "conda: conda install gperftools",
    ),
    "iomp5": LibrarySpec(
        ("libiomp5.so",),
        "pip install intel-openmp (into the ranks' environment; it lands in <prefix>/lib) or "
        "conda install intel-openmp; Debian/Ubuntu non-free: apt-get install libiomp5",
    ),
}


def missing_library_message(kind: str) -> str:
    """The one-line error for a library that ``locate_library`` could not find."""
    spec = LIBRARIES[kind]
    what = {
        "jemalloc": "environment.allocator=jemalloc",
        "tcmalloc": "environment.allocator=tcmalloc",
        "iomp5": "environment.openmp=intel",
    }[kind]
    return (
        f"{what} needs {spec.sonames[0]}, which is not installed on {os.uname().nodename} "
        f"(looked in `ldconfig -p` and the usual library directories). Install it — {spec.install} — "
        f"or set {what.split('=')[0]} back to {'gnu' if kind == 'iomp5' else 'system'}"
    )


def default_library_dirs(environ: Mapping[str, str], prefix: str = sys.prefix) -> List[str]:
    """Directories searched after ``ldconfig -p``, in order: LD_LIBRARY_PATH, the Python
    prefix's and conda's ``lib`` (pip's intel-openmp installs there), the Debian multiarch
    and RPM ``lib64`` directories, ``/usr/local/lib``, oneAPI's compiler directory."""
    import sysconfig

    arch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [os.path.join(prefix, "lib")]
    if environ.get("CONDA_PREFIX"):
        dirs.append(os.path.join(environ["CONDA_PREFIX"], "lib"))
    dirs += [
        f"/usr/lib/{arch}",
        f"/lib/{arch}",
        "/usr/lib64",
        "/lib64",
        "/usr/local/lib",
        "/usr/lib",
        "/lib",
        "/opt/intel/oneapi/compiler/latest/lib",
    ]
    return list(dict.fromkeys(dirs))


def locate_library(
    kind: str,
    *,
    ldconfig_text: str = "",
    search_dirs: Sequence[str] = (),
    exists: Callable[[str], bool] = os.path.isfile,
) -> str:
    """Absolute path of the ``kind`` library (``jemalloc``, ``tcmalloc`` or ``iomp5``).

    Looks first in ``ldconfig_text`` (the output of ``ldconfig -p``: lines
    ``\\tNAME (FLAGS) => PATH``; on a 64-bit Python, entries whose FLAGS name a 64-bit ABI
    are preferred), then for each file name in ``search_dirs``. Raises ``BindingError``
    naming the Debian and RPM packages when nothing is found.
    """
    spec = LIBRARIES[kind]
    entries: Dict[str, List[Tuple[str, str]]] = {}
    for line in ldconfig_text.splitlines():
        m = re.match(r"\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)", line)
        if m:
            entries.setdefault(m.group(1), []).append((m.group(2), m.group(3)))
    want64 = sys.maxsize > 2**32
    for name in spec.sonames:
        found = entries.get(name, [])
        found = sorted(found, key=lambda e: ("64" in e[0]) != want64)
        for _, path in found:
            if exists(path):
                return path
    for name in spec.sonames:
        for d in search_dirs:
            path = os.path.join(d, name)
            if exists(path):
                return path
    raise BindingError(missing_library_message(kind))


def ldconfig_cache(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> str:
    """Output of ``ldconfig -p`` (the dynamic linker's cache), or "" when ldconfig is missing.

    ldconfig lives in /sbin, which is not on an ordinary user's PATH on Debian.
    """
    import shutil

    exe = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if exe is None:
        return ""
    try:
        return run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout or ""
    except (OSError, subprocess.SubprocessError):
        return ""


def locate_libraries(kinds: Sequence[str], environ: Mapping[str, str]) -> Dict[str, str]:
    """``{kind: path}`` for each kind, with ``ldconfig -p`` run once. Raises ``BindingError``."""
    if not kinds:
        return {}
    text = ldconfig_cache()
    dirs = default_library_dirs(environ)
    return {k: locate_library(k, ldconfig_text=text, search_dirs=dirs) for k in kinds}


# --------------------------------------------------------------------------- readers of /sys


def read_numa_nodes(root: str = "/sys/devices/system/node") -> Dict[int, FrozenSet[int]]:
    """``{node: CPU ids}`` from ``ROOT/nodeN/cpulist``; ``{}`` when the kernel shows no NUMA
    information (then the planner treats the machine as one node). Nodes without CPUs are left out."""
    out: Dict[int, FrozenSet[int]] = {}
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        m = re.fullmatch(r"node(\d+)", name)
        if not m:
            continue
        try:
            cpus = parse_cpulist(Path(root, name, "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:
            out[int(m.group(1))] = cpus
    return out


def read_core_ids(cpus: Iterable[int], root: str = "/sys/devices/system/cpu") -> Dict[int, int]:
    """``{cpu: core}``, the core being the smallest CPU id among the CPU's hyperthread
    siblings (``cpuN/topology/thread_siblings_list``). CPUs without that file are their own core."""
    out: Dict[int, int] = {}
    for c in cpus:
        try:
            out[c] = min(parse_cpulist(Path(root, f"cpu{c}", "topology", "thread_siblings_list").read_text()))
        except (OSError, ValueError):
            out[c] = c
    return out


#: PCI vendor ids of GPUs whose CUDA/ROCm index follows PCI bus order: NVIDIA, AMD.
_GPU_VENDORS = ("0x10de", "0x1002")


def read_gpu_pci_devices(root: str = "/sys/bus/pci/devices") -> List[Tuple[str, int]]:
    """``(PCI address, NUMA node)`` of each GPU of this machine, in bus order (NUMA node -1 = unknown).

    GPUs are the PCI display/3D controllers (class 0x03xxxx) of NVIDIA and AMD (``ROOT/<address>/class``,
    ``vendor``, ``numa_node``)."""
    gpus: List[Tuple[str, int]] = []
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return gpus
    for name in names:
        d = Path(root, name)
        try:
            if not d.joinpath("class").read_text().strip().startswith("0x03"):
                continue
            if d.joinpath("vendor").read_text().strip() not in _GPU_VENDORS:
                continue
            node = int(d.joinpath("numa_node").read_text().strip())
        except (OSError, ValueError):
            continue
        gpus.append((name, node))
    return gpus


def read_gpu_numa_by_index(
    root: str = "/sys/bus/pci/devices", driver_root: str = "/proc/driver/nvidia/gpus"
) -> Dict[int, int]:
    """``{GPU index: NUMA node}`` for this machine's GPUs (-1 = unknown). The index is the ``N`` of
    ``/dev/nvidiaN`` where the NVIDIA driver names it (``DRIVER_ROOT/<address>/information``, "Device
    Minor"; what gres.conf's ``File=/dev/nvidia[0-N]`` and Slurm's indices follow), else the bus order."""
    from ..devices import nvidia_minor

    out: Dict[int, int] = {}
    for k, (address, node) in enumerate(read_gpu_pci_devices(root)):
        minor = nvidia_minor(address, driver_root)
        out[k if minor is None else minor] = node
    return out


def read_gpu_numa_nodes(environ: Mapping[str, str], root: str = "/sys/bus/pci/devices") -> List[int]:
    """NUMA node of each GPU this task sees, in device-index order (-1 = unknown).

    GPUs are ``read_gpu_pci_devices``' in bus order
    (CUDA's order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; the usual one on servers), filtered
    by ``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` when those hold integer indices.
    """
    gpus = [node for _, node in read_gpu_pci_devices(root)]
    visible = environ.get("CUDA_VISIBLE_DEVICES") or environ.get("ROCR_VISIBLE_DEVICES")
    if visible:
        try:
            idx = [int(v) for v in visible.split(",") if v.strip()]
        except ValueError:  # GPU UUIDs: the order cannot be matched to PCI devices here
            return [-1] * len(visible.split(","))
        gpus = [gpus[i] if 0 <= i < len(gpus) else -1 for i in idx]
    return gpus
