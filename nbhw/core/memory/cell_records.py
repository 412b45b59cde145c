"""Per-cell attribution: the memory each cell left behind and its peak, per device."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from nbhw.core.memory.sampling import Sampler
from nbhw.core.memory.sources import Source

# ---------------------------------------------------------------- per-cell attribution


@dataclass(frozen=True)
class CellMemory:
    """One cell's memory on one device: at its start, at its end, and at its peak."""

    device: str
    trace: str
    start: int
    end: int
    peak: int
    peak_from: str  # "allocator" (the backend's peak counter), "kernel" (Linux's peak RSS) or "samples" (sampled)

    @property
    def delta(self) -> int:
        """What the cell left behind (end - start)."""
        return self.end - self.start

    @property
    def used(self) -> int:
        """The most the cell needed above its start (peak - start)."""
        return self.peak - self.start


@dataclass(frozen=True)
class CellRecord:
    """One cell run while the sampler ran."""

    execution_count: int | None
    first_line: str
    started: float
    ended: float
    succeeded: bool | None
    memory: dict[str, CellMemory]

    @property
    def most(self) -> CellMemory | None:
        """The device where the cell needed the most memory."""
        return max(self.memory.values(), key=lambda m: (m.used, m.delta), default=None)


@dataclass
class _Open:
    started: float
    first_line: str
    start: dict[int, int]
    primaries: list[Source]
    counted: set[int]


def _read_primaries(sources: Sequence[Source]) -> dict[int, int]:
    """id(source) -> its primary reading; a source that raises is left out (its error shows on the graph)."""
    values = {}
    for source in sources:
        try:
            values[id(source)] = int(source.read_primary())
        except Exception:
            continue
    return values


def _reset(source: Source) -> bool:
    try:
        return source.reset_peak()
    except Exception:
        return False


def first_line(source: str, width: int = 60) -> str:
    """The first non-blank line of a cell, shortened for a table."""
    line = next((s.strip() for s in source.splitlines() if s.strip()), "")
    return line if len(line) <= width else line[: width - 1] + "…"


class CellLog:
    """Per-cell memory: ``begin`` before a cell runs and ``end`` after (on the main thread), while sampling."""

    def __init__(self, sampler: Sampler, keep: int = 1000) -> None:
        self.sampler = sampler
        self.records: deque[CellRecord] = deque(maxlen=keep)
        self.version = 0
        self._open: dict[object, _Open] = {}

    @property
    def running_since(self) -> float | None:
        """Wall-clock start of the cell running now, if one is being recorded."""
        opened = list(self._open.values())
        return opened[-1].started if opened else None

    def begin(self, key: object, source: str) -> None:
        """A cell starts: read every device and reset the allocator peak counters."""
        if not self.sampler.running:
            return
        primaries = self._primaries()
        counted = {id(s) for s in primaries if _reset(s)}
        started, start = self.sampler.wall_time(), _read_primaries(primaries)
        self._open[key] = _Open(started, first_line(source), start, primaries, counted)
        self.version += 1

    def end(self, key: object, execution_count: int | None, succeeded: bool | None) -> CellRecord | None:
        """The cell ended: its delta and peak per device, added to ``records``."""
        opened = self._open.pop(key, None)
        if opened is None:
            return None
        ended = self.sampler.wall_time()
        now = _read_primaries(opened.primaries)
        memory: dict[str, CellMemory] = {}
        for source in opened.primaries:
            if source.device in memory or id(source) not in opened.start or id(source) not in now:
                continue
            trace = f"{source.device} {source.primary}"
            start, end = opened.start[id(source)], now[id(source)]
            peak, how = self._peak(source, trace, opened, ended)
            memory[source.device] = CellMemory(source.device, trace, start, end, max(peak, start, end), how)
        record = CellRecord(execution_count, opened.first_line, opened.started, ended, succeeded, memory)
        self.records.append(record)
        self.version += 1
        return record

    def _primaries(self) -> list[Source]:
        return [s for s in self.sampler.sources() if s.primary is not None]

    def _peak(self, source: Source, trace: str, opened: _Open, ended: float) -> tuple[int, str]:
        if id(source) in opened.counted:
            try:
                value = source.peak()
            except Exception:
                value = None
            if value is not None:
                return value, source.peak_from
        sampled = self.sampler.max_between(trace, opened.started, ended)
        return (int(sampled) if sampled is not None else 0), "samples"

    def top(self, n: int = 5) -> list[CellRecord]:
        """The cells that needed the most memory above their start, on any device."""
        # A snapshot: the sampler thread renders this while the main thread may append a record.
        ranked = [r for r in list(self.records) if r.most is not None]
        ranked.sort(key=lambda r: (r.most.used, r.most.delta) if r.most else (0, 0), reverse=True)
        return ranked[:n]
