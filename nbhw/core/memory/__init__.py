"""Memory over time: sources for every usable device and the host, one sampler thread, per-cell attribution.

The modules below hold the pieces; this package gives them one face for users and tests (``memory.Sampler``),
imported on first use, so that ``%load_ext nbhw`` and the per-cell hooks stay free of numpy and the sampler until
``%hw memory`` or ``nbhw.monitor()`` asks for them. nbhw's own modules import the module they need.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module of this package that defines it.
_WHERE = {
    "CELL_HEADERS": "summary",
    "CellLog": "cell_records",
    "CellMemory": "cell_records",
    "CellRecord": "cell_records",
    "Counters": "sources",
    "FIGURE_HEADERS": "summary",
    "HostSource": "sources",
    "KINDS": "sources",
    "LABELS": "sources",
    "MAX_INTERVAL": "sampling",
    "MAX_SLOTS": "sampling",
    "MIN_INTERVAL": "sampling",
    "MachineSource": "sources",
    "NvmlSource": "sources",
    "Ring": "ring",
    "Sample": "sources",
    "Sampler": "sampling",
    "Samples": "ring",
    "Source": "sources",
    "Subscriber": "sampling",
    "THREAD_NAME": "sampling",
    "TorchSource": "sources",
    "Trace": "sources",
    "cell_finished": "process",
    "cell_rows": "summary",
    "cell_started": "process",
    "cells": "process",
    "discover_sources": "sources",
    "existing": "process",
    "figures": "summary",
    "first_line": "cell_records",
    "gib": "summary",
    "machine_sources": "sources",
    "sampler": "process",
    "schedule": "sampling",
    "status": "summary",
    "stop_all": "sampling",
    "take_sample": "sources",
    "text": "summary",
    "torch_counters": "sources",
    "validate": "sampling",
}

__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
