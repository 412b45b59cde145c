"""Which process holds memory on which GPU (NVML), and which of this server's kernels each one belongs to.

A GPU process belongs to a kernel when it is the kernel's own process or one of its descendants (a kernel
started through a wrapper script, a DataLoader worker, a subprocess the notebook started). Processes of other
servers, other users, or kernels this server did not start are listed with no kernel. NVML reports PIDs as the
host sees them: inside a container with its own PID namespace they may match nothing here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nbhw.core.hardware import nvml
from nbhw.core.memory import NvmlSource, Source


@dataclass(frozen=True)
class KernelRef:
    """One of this server's kernels, as the process table sees it."""

    id: str
    name: str | None  # the kernelspec name (python3, ...)
    pid: int
    path: str | None = None  # the notebook whose session uses it

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"id": self.id, "name": self.name, "pid": self.pid, "path": self.path}


@dataclass(frozen=True)
class GpuProcessMemory:
    """One process's memory on one GPU, with the kernel it belongs to (None: not one of this server's)."""

    device: str
    pid: int
    used_memory: int | None
    kernel: KernelRef | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "device": self.device,
            "pid": self.pid,
            "used_memory": self.used_memory,
            "kernel": self.kernel.to_dict() if self.kernel else None,
        }


def kernel_pid(kernel: Any) -> int | None:
    """The local PID of a kernel manager's kernel: its provisioner's process; None for remote kernels."""
    provisioner = getattr(kernel, "provisioner", None)
    pid = getattr(provisioner, "pid", None)
    if pid is None:
        pid = getattr(getattr(provisioner, "process", None), "pid", None)
    return int(pid) if isinstance(pid, int) else None


def server_kernels(kernel_manager: Any, paths: Mapping[str, str] | None = None) -> dict[int, KernelRef]:
    """PID -> kernel for every kernel of this server that runs as a local process."""
    found: dict[int, KernelRef] = {}
    for kernel_id in list(kernel_manager.list_kernel_ids()):
        try:
            kernel = kernel_manager.get_kernel(kernel_id)
        except KeyError:  # shut down between the two calls
            continue
        pid = kernel_pid(kernel)
        if pid is not None:
            name = getattr(kernel, "kernel_name", None)
            found[pid] = KernelRef(kernel_id, name, pid, (paths or {}).get(kernel_id))
    return found


def ancestors(pid: int) -> list[int]:
    """The PIDs above a process, nearest first; empty when the process can't be seen."""
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).parents()]
    except (psutil.Error, OSError):
        return []


def owner(pid: int, kernels: Mapping[int, KernelRef]) -> KernelRef | None:
    """The kernel a process belongs to: itself or its nearest ancestor that is a kernel."""
    if pid in kernels:
        return kernels[pid]
    return next((kernels[p] for p in ancestors(pid) if p in kernels), None) if kernels else None


def nvml_gpus(sources: Iterable[Source]) -> list[tuple[str, int]]:
    """(device name, NVML index) of every NVML source sampled."""
    return [(s.device, s.nvml_index) for s in sources if isinstance(s, NvmlSource)]


def gpu_processes(
    gpus: Sequence[tuple[str, int]], kernels: Mapping[int, KernelRef]
) -> tuple[list[GpuProcessMemory], dict[str, str]]:
    """Every process on these GPUs with its kernel, and why a GPU could not list its processes."""
    found: list[GpuProcessMemory] = []
    errors: dict[str, str] = {}
    for device, index in gpus:
        try:
            listed = nvml.processes(index)
        except Exception as exc:
            errors[device] = f"{type(exc).__name__}: {exc}"
            continue
        found += [GpuProcessMemory(device, p.pid, p.used_memory, owner(p.pid, kernels)) for p in listed]
    return found, errors
