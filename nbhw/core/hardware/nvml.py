"""NVML, read without a CUDA context: initialised lazily once, every failure returned as a value.

NVML numbers GPUs in PCI bus order, like nvidia-smi. Tests swap the ``pynvml`` module in ``sys.modules``
for a fake; every call here goes through :func:`_lib` so the swap takes effect.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {}


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML sees it (index = nvidia-smi index)."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    memory_free: int | None = None
    compute_capability: tuple[int, int] | None = None
    error: str | None = None


@dataclass(frozen=True)
class NvmlView:
    """What NVML says about this machine; ``error`` explains why it says nothing."""

    available: bool
    error: str | None = None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    gpus: list[NvmlGpu] = field(default_factory=list)


@dataclass(frozen=True)
class GpuProcess:
    """A process holding memory on a GPU."""

    pid: int
    used_memory: int | None


def _lib() -> ModuleType:
    return importlib.import_module("pynvml")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _explain(exc: BaseException) -> str:
    name = type(exc).__name__
    if "LibraryNotFound" in name or isinstance(exc, OSError):
        return "NVIDIA driver not found (the NVML library libnvidia-ml.so.1 could not be loaded)"
    if "DriverNotLoaded" in name:
        return "the NVIDIA kernel driver is not loaded"
    if "NoPermission" in name:
        return "no permission to query the NVIDIA driver (NVML)"
    return f"NVML failed: {exc}"


def init() -> str | None:
    """Initialise NVML once; return None when it works, else why it doesn't."""
    with _lock:
        if "error" not in _state:
            try:
                lib = _lib()
            except ImportError:
                _state["error"] = "the nvidia-ml-py package is not installed (pip install nvidia-ml-py)"
            else:
                try:
                    lib.nvmlInit()
                    _state["error"] = None
                except Exception as exc:
                    _state["error"] = _explain(exc)
        error: str | None = _state["error"]
        return error


def reset() -> None:
    """Forget the init result (used by tests, and to retry after a driver install)."""
    with _lock:
        if _state.get("error", "x") is None:
            with contextlib.suppress(Exception):
                _lib().nvmlShutdown()
        _state.clear()


def _gpu(lib: ModuleType, index: int) -> NvmlGpu:
    try:
        handle = lib.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:
        return NvmlGpu(index=index, error=f"GPU {index} did not answer: {exc}")
    values: dict[str, Any] = {"index": index}
    try:
        values["name"] = _text(lib.nvmlDeviceGetName(handle))
        values["uuid"] = _text(lib.nvmlDeviceGetUUID(handle))
        values["pci_bus_id"] = _text(lib.nvmlDeviceGetPciInfo(handle).busId)
        mem = lib.nvmlDeviceGetMemoryInfo(handle)
        values.update(memory_total=int(mem.total), memory_used=int(mem.used), memory_free=int(mem.free))
        major, minor = lib.nvmlDeviceGetCudaComputeCapability(handle)
        values["compute_capability"] = (int(major), int(minor))
    except Exception as exc:
        values["error"] = f"GPU {index}: {exc}"
    return NvmlGpu(**values)


def _cuda_driver_version(lib: ModuleType) -> str | None:
    try:
        v = int(lib.nvmlSystemGetCudaDriverVersion())
    except Exception:
        return None
    return f"{v // 1000}.{(v % 1000) // 10}"


def read() -> NvmlView:
    """Every GPU NVML can see, in NVML (PCI bus) order."""
    error = init()
    if error is not None:
        return NvmlView(available=False, error=error)
    lib = _lib()
    try:
        count = int(lib.nvmlDeviceGetCount())
    except Exception as exc:
        return NvmlView(available=False, error=_explain(exc))
    try:
        driver = _text(lib.nvmlSystemGetDriverVersion())
    except Exception:
        driver = None
    return NvmlView(
        available=True,
        driver_version=driver,
        cuda_driver_version=_cuda_driver_version(lib),
        gpus=[_gpu(lib, i) for i in range(count)],
    )


def memory(index: int) -> tuple[int, int]:
    """(used, total) bytes on the GPU with this NVML index, across all processes; raises on failure."""
    error = init()
    if error is not None:
        raise RuntimeError(error)
    lib = _lib()
    mem = lib.nvmlDeviceGetMemoryInfo(lib.nvmlDeviceGetHandleByIndex(index))
    return int(mem.used), int(mem.total)


def processes(index: int) -> list[GpuProcess]:
    """Processes holding memory on the GPU with this NVML index (compute and graphics); raises on failure."""
    error = init()
    if error is not None:
        raise RuntimeError(error)
    lib = _lib()
    handle = lib.nvmlDeviceGetHandleByIndex(index)
    seen: dict[int, GpuProcess] = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(lib, getter, None)
        if fn is None:
            continue
        for proc in fn(handle):
            used = getattr(proc, "usedGpuMemory", None)
            seen.setdefault(int(proc.pid), GpuProcess(int(proc.pid), int(used) if isinstance(used, int) else None))
    return list(seen.values())
