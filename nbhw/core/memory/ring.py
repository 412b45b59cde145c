"""The fixed-size ring buffer of samples (float32, ``window / interval`` slots), and the samples it hands out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from nbhw.core.memory.sources import Trace

# ---------------------------------------------------------------- ring buffer


class Ring:
    """The last ``slots`` ticks of each trace as float32 bytes; NaN where a tick has no reading."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a ring needs at least one slot")
        self.slots = slots
        self.series: dict[str, np.ndarray] = {}
        self.first_tick = 0
        self.last_tick = -1

    def __len__(self) -> int:
        return self.last_tick - self.first_tick + 1

    def add(self, key: str) -> None:
        """Start a series (NaN for the ticks before it existed)."""
        if key not in self.series:
            self.series[key] = np.full(self.slots, np.nan, dtype=np.float32)

    def drop(self, key: str) -> None:
        """Forget a series."""
        self.series.pop(key, None)

    def put(self, tick: int, values: Mapping[str, float]) -> None:
        """Store one tick; ticks skipped since the last one become NaN."""
        if tick <= self.last_tick:
            raise ValueError(f"tick {tick} is not after {self.last_tick}")
        if len(self) == 0:
            self.first_tick = tick
        else:
            gap = np.arange(max(self.last_tick + 1, tick - self.slots + 1), tick) % self.slots
            for array in self.series.values():
                array[gap] = np.nan
        i = tick % self.slots
        for key, array in self.series.items():
            array[i] = values.get(key, np.nan)
        self.last_tick = tick
        self.first_tick = max(self.first_tick, tick - self.slots + 1)

    def ticks(self) -> np.ndarray:
        """The tick numbers held, oldest first."""
        return np.arange(self.first_tick, self.last_tick + 1, dtype=np.int64)

    def ordered(self, key: str, start_tick: int | None = None) -> np.ndarray:
        """One series oldest first (a float32 copy), from ``start_tick`` on."""
        first = self.first_tick if start_tick is None else max(self.first_tick, start_tick)
        n = self.last_tick - first + 1
        if n <= 0:
            return np.empty(0, dtype=np.float32)
        array = self.series.get(key)
        if array is None:
            return np.full(n, np.nan, dtype=np.float32)
        lo = first % self.slots
        if lo + n <= self.slots:
            return array[lo : lo + n].copy()
        return np.concatenate((array[lo:], array[: lo + n - self.slots]))

    def resized(self, slots: int) -> Ring:
        """A copy with another number of slots, keeping the newest ticks."""
        ring = Ring(slots)
        start = max(self.first_tick, self.last_tick - slots + 1)
        for key in self.series:
            ring.add(key)
        if len(self) == 0:
            return ring
        where = np.arange(start, self.last_tick + 1) % slots
        for key in self.series:
            ring.series[key][where] = self.ordered(key, start)
        ring.first_tick, ring.last_tick = start, self.last_tick
        return ring


# ---------------------------------------------------------------- samples handed out


@dataclass(frozen=True)
class Samples:
    """Recorded samples: wall-clock ``times`` (s) and, per trace key, float32 bytes (NaN: no reading)."""

    interval: float
    ticks: np.ndarray
    times: np.ndarray
    values: dict[str, np.ndarray]
    traces: tuple[Trace, ...]
    errors: dict[str, str]

    def __len__(self) -> int:
        return len(self.times)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: lists of numbers, None where a tick has no reading."""
        return {
            "interval": self.interval,
            "times": self.times.tolist(),
            "traces": [{"key": t.key, "device": t.device, "kind": t.kind, "label": t.label} for t in self.traces],
            "values": {k: [None if math.isnan(x) else int(x) for x in v.tolist()] for k, v in self.values.items()},
            "errors": dict(self.errors),
        }
