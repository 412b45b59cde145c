"""A device that runs out of memory, faked at the allocator boundary: a caching allocator over CPU tensors.

While active (``with gpu:``, a TorchDispatchMode), every storage an op creates is counted as this device's memory;
a weakref finalizer on the storage (torch keeps one Python storage object per StorageImpl, alive as long as C++
holds the storage, autograd's saved tensors included) returns its bytes to the cache when it dies, and
``empty_cache()`` releases the cache. An op whose new storages would take the allocated bytes over ``limit`` raises
what the backend raises: ``torch.OutOfMemoryError`` with CUDA's message, or (``words="cpu"``) the CPU allocator's
RuntimeError. :class:`FakeMemory` is the ``DeviceMemory`` nbhw reads: the fake's counters, for the "cpu" device
the tensors really live on.
"""

from __future__ import annotations

import weakref
from typing import Any, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def format_size(nbytes: int) -> str:
    """c10's format_size (CUDACachingAllocator): bytes up to 1 KiB, then two decimals."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    for unit, scale in (("KiB", 1024), ("MiB", 1024**2)):
        if nbytes <= scale * 1024:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes / 1024**3:.2f} GiB"


class FakeDevice(TorchDispatchMode):  # type: ignore[misc]
    """``with FakeDevice(limit=...) as gpu:`` — CPU tensors made inside count as this device's memory."""

    def __init__(self, limit: int, index: int = 0, words: Literal["cuda", "cpu"] = "cuda") -> None:
        super().__init__()
        self.limit = limit
        self.index = index
        self.words = words
        self.live: dict[int, int] = {}  # data pointer -> bytes
        self.cached = 0
        self.ooms = 0

    @property
    def allocated(self) -> int:
        return sum(self.live.values())

    @property
    def reserved(self) -> int:
        return self.allocated + self.cached

    def empty_cache(self) -> None:
        self.cached = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        new = {s.data_ptr(): s for s in _storages(out) if s.data_ptr() not in self.live and s.nbytes()}
        need = sum(s.nbytes() for s in new.values())
        if need and self.allocated + need > self.limit:
            self.ooms += 1
            failed = max(s.nbytes() for s in new.values())
            del out, new  # the failed allocation never existed
            raise self._error(failed)
        for storage in new.values():
            self._add(storage)
        return out

    def _add(self, storage: torch.UntypedStorage) -> None:
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if ptr in self.live or not nbytes:
            return
        self.live[ptr] = nbytes
        self.cached = max(0, self.cached - nbytes)  # served from the cache first, like a caching allocator
        weakref.finalize(storage, self._freed, ptr, nbytes)

    def _freed(self, ptr: int, nbytes: int) -> None:
        if self.live.pop(ptr, None) is not None:
            self.cached += nbytes

    def _error(self, failed: int) -> BaseException:
        if self.words == "cpu":
            return RuntimeError(
                "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried "
                f"to allocate {failed} bytes. Error code 12 (Cannot allocate memory)"
            )
        free = max(0, self.limit - self.reserved)
        return torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {format_size(failed)}. GPU {self.index} has a total capacity of "
            f"{format_size(self.limit)} of which {format_size(free)} is free. Of the allocated memory "
            f"{format_size(self.allocated)} is allocated by PyTorch, and {format_size(self.cached)} is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
        )


def _storages(out: Any) -> list[torch.UntypedStorage]:
    return [t.untyped_storage() for t in tree_leaves(out) if isinstance(t, torch.Tensor) and t.device.type == "cpu"]


class FakeMemory:
    """The DeviceMemory that nbhw's holders / free / OOM report read: the fake device's counters, for "cpu"."""

    def __init__(self, gpu: FakeDevice, device: str = "cpu") -> None:
        self.gpu = gpu
        self.device = device

    def allocated(self, device: str) -> int | None:
        return self.gpu.allocated if device == self.device else None

    def reserved(self, device: str) -> int | None:
        return self.gpu.reserved if device == self.device else None

    def empty_cache(self, device: str) -> bool:
        if device != self.device:
            return False
        self.gpu.empty_cache()
        return True

    def devices(self) -> list[str]:
        return [self.device]
