"""Where memory readings come from: the host, the machine, torch's counters per device, NVML; one sample of all.

torch is never imported here: device sources appear only once the user has imported it, and torch's CUDA counters
are read only after torch itself has initialised CUDA (no new context).
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from types import ModuleType
from typing import Any

from nbhw.core.hardware import backends, nvml

KINDS = ("allocated", "reserved", "used", "rss", "available", "capacity")
LABELS = {
    "allocated": "allocated by torch (this process)",
    "reserved": "reserved by torch (this process)",
    "used": "used (all processes, driver)",
    "rss": "RSS (this process)",
    "available": "available (machine)",
    "capacity": "capacity",
}


@dataclass(frozen=True)
class Trace:
    """One line on the graph: a device and what is measured on it."""

    device: str
    kind: str

    @property
    def key(self) -> str:
        """The name samples use: 'cuda:0 allocated', 'host rss'."""
        return f"{self.device} {self.kind}"

    @property
    def label(self) -> str:
        """The legend text."""
        return f"{self.device} {LABELS.get(self.kind, self.kind)}"


# ---------------------------------------------------------------- sources


class Source:
    """One thing that reports memory (the host, a torch allocator, a GPU as NVML sees it)."""

    name = "source"
    device = "?"
    kinds: tuple[str, ...] = ()
    primary: str | None = None  # the kind a cell's delta and peak are measured on
    peak_from = "allocator"  # who keeps the peak :meth:`peak` reads

    @property
    def traces(self) -> tuple[Trace, ...]:
        """The lines this source draws."""
        return tuple(Trace(self.device, k) for k in self.kinds)

    def read(self) -> dict[str, int]:
        """kind -> bytes, now; raises when the source can't answer."""
        raise NotImplementedError

    def read_primary(self) -> int:
        """The primary kind alone (what a cell is measured on); sources override it when that is cheaper."""
        assert self.primary is not None
        return self.read()[self.primary]

    def reset_peak(self) -> bool:
        """Start a new peak measurement where the backend keeps one; whether it does."""
        return False

    def peak(self) -> int | None:
        """The primary kind's peak since :meth:`reset_peak`, where the backend keeps it."""
        return None


class HostSource(Source):
    """This process's resident memory (psutil)."""

    # Apart from MachineSource: a process whose own memory psutil may not read still sees the machine's, and the
    # other way round (a sandbox hiding /proc/meminfo); each failure shows under its own name.
    name = "host (this process, psutil)"
    device = "host"
    kinds = ("rss",)
    primary = "rss"

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()

    def read(self) -> dict[str, int]:
        return {"rss": int(self._process.memory_info().rss)}

    # Linux keeps this process's peak RSS (VmHWM) and lets the process restart it: the peak of a cell is then exact,
    # not sampled. The C heap is trimmed first, so memory freed earlier but still resident (glibc keeps freed chunks
    # and reuses them) does not hide what the cell takes: the rise from the start is what the cell added.
    peak_from = "kernel"

    def reset_peak(self) -> bool:
        _trim_c_heap()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            return False
        return self.peak() is not None

    def peak(self) -> int | None:
        try:
            with open("/proc/self/status") as f:
                status = f.read()
        except OSError:
            return None
        kib = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), None)
        return int(kib) * 1024 if kib is not None else None


@lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, looked up once (None where the C library has none)."""
    try:
        return ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None


def _trim_c_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's malloc_trim); nothing elsewhere."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class MachineSource(Source):
    """The machine's available and total memory (psutil)."""

    name = "host (machine, psutil)"
    device = "host"
    kinds = ("available", "capacity")

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil

    def read(self) -> dict[str, int]:
        vm = self._psutil.virtual_memory()
        return {"available": int(vm.available), "capacity": int(vm.total)}


@dataclass(frozen=True)
class Counters:
    """How to read one torch backend's allocator counters (device index -> bytes)."""

    allocated: Callable[[int], int]
    reserved: Callable[[int], int] | None = None
    peak: Callable[[int], int] | None = None
    reset_peak: Callable[[int], None] | None = None
    initialized: Callable[[], bool] | None = None


def torch_counters(torch: ModuleType, device_type: str) -> Counters | None:
    """The allocator counters of ``torch.<device_type>``, else of ``torch.accelerator`` when it is that device."""
    if device_type == "mps":
        mps: Any = getattr(torch, "mps", None)
        if mps is None or not hasattr(mps, "current_allocated_memory"):
            return None
        return Counters(
            allocated=lambda i: int(mps.current_allocated_memory()),
            reserved=lambda i: int(mps.driver_allocated_memory()),
        )
    module: Any = getattr(torch, device_type, None)
    if module is not None and hasattr(module, "memory_allocated"):
        return Counters(
            allocated=module.memory_allocated,
            reserved=getattr(module, "memory_reserved", None),
            peak=getattr(module, "max_memory_allocated", None),
            reset_peak=getattr(module, "reset_peak_memory_stats", None),
            initialized=getattr(module, "is_initialized", None),
        )
    accelerator: Any = getattr(torch, "accelerator", None)
    try:
        current = accelerator.current_accelerator() if accelerator is not None else None
    except Exception:
        current = None
    if current is None or current.type != device_type or not hasattr(accelerator, "memory_allocated"):
        return None
    return Counters(
        allocated=accelerator.memory_allocated,
        reserved=getattr(accelerator, "memory_reserved", None),
        peak=getattr(accelerator, "max_memory_allocated", None),
        reset_peak=getattr(accelerator, "reset_peak_memory_stats", None),
    )


class TorchSource(Source):
    """What torch's allocator holds on one device in this process: allocated and reserved."""

    primary = "allocated"

    def __init__(self, device: str, index: int, counters: Counters, capacity: int | None = None) -> None:
        self.device = device
        self.name = f"{device} (torch)"
        self.index = index
        self.counters = counters
        self.capacity = capacity
        kinds = ["allocated"] + (["reserved"] if counters.reserved else []) + (["capacity"] if capacity else [])
        self.kinds = tuple(kinds)

    def _live(self) -> bool:
        # Asking an uninitialised backend for stats could initialise it (a CUDA context): its counters are 0.
        return self.counters.initialized is None or bool(self.counters.initialized())

    def read(self) -> dict[str, int]:
        live = self._live()
        values = {"allocated": int(self.counters.allocated(self.index)) if live else 0}
        if self.counters.reserved is not None:
            values["reserved"] = int(self.counters.reserved(self.index)) if live else 0
        if self.capacity:
            values["capacity"] = self.capacity
        return values

    def reset_peak(self) -> bool:
        if self.counters.reset_peak is None or self.counters.peak is None:
            return False
        if self._live():
            self.counters.reset_peak(self.index)
        return True

    def peak(self) -> int | None:
        if self.counters.peak is None:
            return None
        return int(self.counters.peak(self.index)) if self._live() else 0


class NvmlSource(Source):
    """An NVIDIA GPU's used and total memory across all processes, from the driver (no CUDA context)."""

    kinds = ("used", "capacity")
    primary = "used"

    def __init__(self, nvml_index: int, device: str) -> None:
        self.nvml_index = nvml_index
        self.device = device
        self.name = f"{device} (NVML)"

    def read(self) -> dict[str, int]:
        used, total = nvml.memory(self.nvml_index)
        return {"used": used, "capacity": total}


def _device_sources(torch: ModuleType) -> list[Source]:
    found: list[Source] = []
    for row in backends.probe_all():
        if not row.usable or row.key == "cpu":
            continue
        counters = torch_counters(torch, row.device)
        for dev in row.devices:
            nvml_index = dev.details.get("nvml_index")
            if counters is not None:
                capacity = None if nvml_index is not None else dev.total_memory
                found.append(TorchSource(dev.device, dev.index, counters, capacity))
            if nvml_index is not None:
                found.append(NvmlSource(int(nvml_index), dev.device))
    return found


def _nvml_sources() -> list[Source]:
    view = nvml.read()
    return [NvmlSource(g.index, f"gpu{g.index}") for g in view.gpus if g.error is None] if view.available else []


def machine_sources() -> list[Source]:
    """The host and every NVIDIA GPU by nvidia-smi index (NVML): what a process holding no device memory watches."""
    return [HostSource(), MachineSource(), *_nvml_sources()]


def discover_sources() -> list[Source]:
    """The host, then every usable device; without torch imported, NVIDIA GPUs by nvidia-smi index (NVML only)."""
    sources: list[Source] = [HostSource(), MachineSource()]
    torch = sys.modules.get("torch")
    if torch is None:
        return sources + _nvml_sources()
    return sources + _device_sources(torch)


# ---------------------------------------------------------------- one sample


@dataclass(frozen=True)
class Sample:
    """One reading of every source: trace key -> bytes, and why a source gave nothing."""

    values: dict[str, int]
    errors: dict[str, str] = field(default_factory=dict)


def take_sample(sources: Sequence[Source]) -> Sample:
    """Read every source once; a source that raises gives no values and an error, the others still count."""
    values: dict[str, int] = {}
    errors: dict[str, str] = {}
    for source in sources:
        try:
            reading = source.read()
        except Exception as exc:
            errors[source.name] = f"{type(exc).__name__}: {exc}"
            continue
        values.update({f"{source.device} {kind}": int(v) for kind, v in reading.items()})
    return Sample(values, errors)
