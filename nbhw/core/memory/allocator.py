"""The allocator's figures per device, as the holders view and ``free`` read them: allocated, reserved, empty_cache.

torch is never imported here, only read from ``sys.modules`` once the user imported it; the counters are nbhw's one
source for them (:func:`nbhw.core.memory.sources.torch_counters`, which the sampler reads too).
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from nbhw.core.memory.sources import Counters, torch_counters


class DeviceMemory(Protocol):
    """The allocator's figures per device (None where the backend keeps none, such as the CPU)."""

    def allocated(self, device: str) -> int | None: ...

    def reserved(self, device: str) -> int | None: ...

    def empty_cache(self, device: str) -> bool: ...

    def devices(self) -> list[str]: ...


class TorchMemory:
    """The allocator counters of torch's device modules.

    A backend that is not initialised is never asked: asking could create a context, and it holds nothing yet.
    """

    def _counters(self, device: str) -> tuple[Counters, int] | None:
        torch = sys.modules.get("torch")
        kind, _, index = device.partition(":")
        if torch is None or kind in ("cpu", "meta"):
            return None
        counters = torch_counters(torch, kind)
        if counters is None or (counters.initialized is not None and not counters.initialized()):
            return None
        return counters, int(index or 0)

    def allocated(self, device: str) -> int | None:
        found = self._counters(device)
        return None if found is None else int(found[0].allocated(found[1]))

    def reserved(self, device: str) -> int | None:
        found = self._counters(device)
        if found is None or found[0].reserved is None:
            return None
        return int(found[0].reserved(found[1]))

    def empty_cache(self, device: str) -> bool:
        module: Any = getattr(sys.modules.get("torch"), device.partition(":")[0], None)
        if self._counters(device) is None or not hasattr(module, "empty_cache"):
            return False
        module.empty_cache()
        return True

    def devices(self) -> list[str]:
        """Initialised CUDA devices: they may hold cached memory and no tensor."""
        cuda = getattr(sys.modules.get("torch"), "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return []
        return [f"cuda:{i}" for i in range(cuda.device_count())]
