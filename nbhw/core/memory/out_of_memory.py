"""Whether a cell failed for memory, and what the allocator's message says about the allocation that failed.

Cheap by design: the front end calls :func:`is_out_of_memory` on every failed cell's exception (an isinstance and a
look at the message; nothing is walked) and builds the report (:mod:`nbhw.core.measured.oom_report`) only when it
is true. Which classes are out-of-memory errors is read from torch and its backend modules at run time (torch 2.13
has one, ``torch.OutOfMemoryError``, which ``torch.cuda`` re-exports, raised by the CUDA and XPU allocators); MPS
and the CPU allocator raise a plain RuntimeError in their own words. The messages are the only carrier of the
failed size.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

# The allocators' messages, as patterns: compiled by re on the first out-of-memory error (its cache keeps them), not
# at import, which %load_ext pays for (eight compiles: most of this module's import time).
# c10's format_size (CUDA, XPU, NPU: KiB/MiB/GiB; MPS: KB/MB/GB, also powers of 1024), or exact bytes.
_UNITS = {"bytes": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_UNITS |= {"KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
_SIZE = r"(\d+(?:\.\d+)?) ?(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b"
_TRIED = r"[Tt]ried to allocate " + _SIZE
_CPU = r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory): you tried to allocate (\d+) bytes"
# "CUDA out of memory" (HIP on ROCm builds; XPU, NPU, MLU and MUSA print the same shape), "MPS backend out of memory".
_BACKEND = r"\b(CUDA|HIP|XPU|NPU|MLU|MUSA|HPU|MTIA|MPS)\b(?: backend)?( error:)? out of memory"
_GPU_INDEX = r"\((?:GPU|NPU|MLU) (\d+);|\. (?:GPU|NPU) (\d+) has a total capacity"
_CAPACITY = r"total capacity of " + _SIZE + r"|; " + _SIZE + r" total capacity"
_FREE = r"of which " + _SIZE + r" is free|; " + _SIZE + r" free;"
_BY_TORCH = r"memory " + _SIZE + r" is allocated by PyTorch|" + _SIZE + r" already allocated"
_UNUSED = _SIZE + r" is reserved by PyTorch but unallocated"
_PHRASES = ("out of memory", "DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")
_DEVICE_TYPES = {"CUDA": "cuda", "HIP": "cuda", "XPU": "xpu", "NPU": "npu", "MLU": "mlu", "MUSA": "musa"}
_DEVICE_TYPES |= {"HPU": "hpu", "MTIA": "mtia", "MPS": "mps"}


_FOUND: dict[str, Any] = {"modules": -1, "types": ()}


def out_of_memory_types() -> tuple[type[BaseException], ...]:
    """Every ``OutOfMemoryError`` class torch and its loaded backend modules define (torch is not imported here).

    Read again only when modules were imported since (a backend plugin such as torch_npu may add one).
    """
    if len(sys.modules) == _FOUND["modules"]:
        cached: tuple[type[BaseException], ...] = _FOUND["types"]
        return cached
    found: dict[int, type[BaseException]] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "torch" or name.startswith(("torch.", "torch_"))) or name.count(".") > 1:
            continue
        cls = getattr(module, "OutOfMemoryError", None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found[id(cls)] = cls
    _FOUND.update(modules=len(sys.modules), types=tuple(found.values()))
    return tuple(found.values())


def is_out_of_memory(exc: BaseException | None) -> bool:
    """Whether a cell failed for memory: a backend's OutOfMemoryError, or a RuntimeError in an allocator's words."""
    if exc is None:
        return False
    if isinstance(exc, out_of_memory_types()):
        return True
    # Outside the caching allocator (cuBLAS handles, a context) CUDA fails as torch.AcceleratorError "CUDA error:
    # out of memory"; the CPU allocator raises a plain RuntimeError.
    return isinstance(exc, RuntimeError) and any(p in str(exc) for p in _PHRASES)


@dataclass(frozen=True)
class FailedAllocation:
    """What the allocator's message says about the allocation that failed."""

    device: str | None  # "cuda:0", "mps", "cpu"; None when the message doesn't say
    nbytes: int | None  # None when the message carries no size
    printed: str | None  # the size as printed ("2.00 GiB": two decimals, so nbytes is within 0.5% of the truth)
    exact: bool  # the CPU allocator prints exact bytes; CUDA prints its rounded segment size, not the tensor's
    capacity: int | None = None
    free: int | None = None
    allocated: int | None = None  # by PyTorch at the failure, from the message
    reserved_unused: int | None = None


def failed_allocation(exc: BaseException) -> FailedAllocation:
    """Read the failed allocation's size and device from the message."""
    message = str(exc)
    cpu = re.search(_CPU, message)
    if cpu:
        return FailedAllocation("cpu", int(cpu.group(1)), f"{cpu.group(1)} bytes", True)
    backend = re.search(_BACKEND, message)
    device = None
    if backend:
        device = _DEVICE_TYPES[backend.group(1)]
        index = re.search(_GPU_INDEX, message)
        if index and device != "mps":
            device = f"{device}:{index.group(1) or index.group(2)}"
        # "CUDA error: out of memory" (torch.AcceleratorError, outside the caching allocator) names no device index.
        elif device != "mps" and not backend.group(2):
            device = f"{device}:0"
    tried = re.search(_TRIED, message)
    return FailedAllocation(
        device,
        _bytes(tried.group(1), tried.group(2)) if tried else None,
        f"{tried.group(1)} {tried.group(2)}" if tried else None,
        False,
        _first(_CAPACITY, message),
        _first(_FREE, message),
        _first(_BY_TORCH, message),
        _first(_UNUSED, message),
    )


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


def _first(pattern: str, message: str) -> int | None:
    found = re.search(pattern, message)
    if not found:
        return None
    groups = [g for g in found.groups() if g is not None]
    return _bytes(groups[0], groups[1]) if len(groups) >= 2 else None
