"""Memory over time: sources for every usable device and the host, one sampler thread, per-cell attribution.

The families below, re-exported here as one face for users and tests; nbhw's own modules import the one they need.
"""

from __future__ import annotations

from nbhw.core.memory.cell_records import CellLog, CellMemory, CellRecord, first_line
from nbhw.core.memory.process import cell_finished, cell_started, cells, existing, sampler
from nbhw.core.memory.ring import Ring, Samples
from nbhw.core.memory.sampling import (
    MAX_INTERVAL,
    MAX_SLOTS,
    MIN_INTERVAL,
    THREAD_NAME,
    Sampler,
    Subscriber,
    schedule,
    stop_all,
    validate,
)
from nbhw.core.memory.sources import (
    KINDS,
    LABELS,
    Counters,
    HostSource,
    MachineSource,
    NvmlSource,
    Sample,
    Source,
    TorchSource,
    Trace,
    discover_sources,
    machine_sources,
    take_sample,
    torch_counters,
)
from nbhw.core.memory.summary import CELL_HEADERS, FIGURE_HEADERS, cell_rows, figures, gib, status, text

__all__ = [
    "CELL_HEADERS",
    "FIGURE_HEADERS",
    "KINDS",
    "LABELS",
    "MAX_INTERVAL",
    "MAX_SLOTS",
    "MIN_INTERVAL",
    "THREAD_NAME",
    "CellLog",
    "CellMemory",
    "CellRecord",
    "Counters",
    "HostSource",
    "MachineSource",
    "NvmlSource",
    "Ring",
    "Sample",
    "Sampler",
    "Samples",
    "Source",
    "Subscriber",
    "TorchSource",
    "Trace",
    "cell_finished",
    "cell_rows",
    "cell_started",
    "cells",
    "discover_sources",
    "existing",
    "figures",
    "first_line",
    "gib",
    "machine_sources",
    "sampler",
    "schedule",
    "status",
    "stop_all",
    "take_sample",
    "text",
    "torch_counters",
    "validate",
]
