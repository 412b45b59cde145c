"""Memory over time: sources for every usable device and the host, one sampler thread, per-cell attribution.

Plain data in and out, no IPython and no widgets, so the notebook view and the Jupyter server share it:
``Sampler`` takes one sample per tick into a fixed-size ring buffer (float32, ``window / interval`` slots)
and tells its subscribers; ``samples(since=t)`` hands out what was recorded. ``take_sample`` is the plain
function behind a tick. torch is never imported here: device sources appear only once the user has imported
it, and torch's CUDA counters are read only after torch itself has initialised CUDA (no new context).
"""

from __future__ import annotations

import atexit
import math
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from nbhw.core.errors import UserError
from nbhw.core.hardware import nvml
from nbhw.core.render import GIB, MIB, size, text_table

THREAD_NAME = "nbhw-sampler"
MIN_INTERVAL = 0.05
MAX_INTERVAL = 3600.0
MAX_SLOTS = 20_000
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
    from nbhw.core.hardware import backends

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


# ---------------------------------------------------------------- schedule


def schedule(start: float, interval: float, clock: Callable[[], float], first: int = 0) -> Iterator[tuple[int, float]]:
    """Yield (tick, seconds to wait) forever; tick k is due at ``start + k * interval``.

    The deadlines never drift (``next += interval``): a slow tick does not shift later ones. When the
    caller falls a whole interval or more behind, the missed ticks are skipped, never run in a burst.
    """
    tick = first
    while True:
        now = clock()
        due = start + tick * interval
        if now - due >= interval:
            tick = int((now - start) // interval)
            due = start + tick * interval
        yield tick, max(0.0, due - now)
        tick += 1


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


Subscriber = Callable[["Sampler"], None]


def validate(interval: float, window: float) -> int:
    """The number of ring slots for these settings; a UserError naming the valid range otherwise."""
    if not isinstance(interval, (int, float)) or not MIN_INTERVAL <= interval <= MAX_INTERVAL:
        raise UserError(f"interval must be between {MIN_INTERVAL} and {MAX_INTERVAL:g} seconds; got {interval!r}")
    if not isinstance(window, (int, float)) or not 0 < window < math.inf:
        raise UserError(f"window must be a positive number of seconds; got {window!r}")
    slots = math.ceil(window / interval - 1e-9)
    if slots > MAX_SLOTS:
        many = slots if slots < 10**9 else f"{window / interval:.3g}"  # not a 300-digit number for window=1e300
        raise UserError(
            f"window {window:g} s / interval {interval:g} s is {many} samples; at most {MAX_SLOTS}: "
            "use a longer interval or a shorter window"
        )
    return max(2, slots)


class Sampler:
    """Samples every source each ``interval`` seconds on one daemon thread, keeping ``window`` seconds.

    ``start()`` / ``stop()`` (idempotent, joins) may be called any number of times; subscribers are called
    on the sampler thread after every tick and on the caller's thread when it starts or stops. A source that
    raises leaves its traces empty for that tick; its first error is kept in ``errors`` until it answers again.
    """

    def __init__(
        self,
        interval: float = 0.5,
        window: float = 600.0,
        *,
        sources: Sequence[Source] | None = None,
        discover: Callable[[], list[Source]] = discover_sources,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._lock = threading.RLock()
        self._clock, self._wall, self._discover = clock, wall, discover
        self._sources: list[Source] | None = None
        # Given sources are fixed (tests, the server); discovered ones are looked for again once torch appears.
        self._torch_seen = sources is not None
        self._subscribers: list[Subscriber] = []
        self._thread: threading.Thread | None = None
        # The current thread's stop event, in a box the finalizer below can see after start() replaces it.
        self._stop_box = [threading.Event()]
        self.errors: dict[str, str] = {}
        self.subscriber_errors: list[str] = []
        self.latest: dict[str, int] = {}
        self.ticks_taken = 0
        self._interval = interval
        self._window = window
        self._ring = Ring(validate(interval, window))
        self._origin, self._wall_origin = clock(), wall()
        if sources is not None:
            self._set_sources(list(sources))
        _live.add(self)
        # Backstop: if a sampler is dropped while running, its thread ends (the thread holds no strong ref).
        weakref.finalize(self, _stop_thread, self._stop_box)

    # -- settings

    @property
    def interval(self) -> float:
        """Seconds between samples."""
        return self._interval

    @property
    def window(self) -> float:
        """Seconds of history kept."""
        return self._window

    @property
    def slots(self) -> int:
        """Ring buffer slots (window / interval)."""
        return self._ring.slots

    @property
    def running(self) -> bool:
        """Whether the sampler thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def origin(self) -> float:
        """Wall-clock time of tick 0 (tick k is at ``origin + k * interval``)."""
        return self._wall_origin

    def configure(self, interval: float | None = None, window: float | None = None) -> None:
        """Change the settings: a new interval starts a new history, a new window keeps the newest samples."""
        interval = self._interval if interval is None else interval
        window = self._window if window is None else window
        slots = validate(interval, window)
        was_running = self.running
        if interval != self._interval or slots != self._ring.slots:
            self.stop(notify=False)
        with self._lock:
            if interval != self._interval:
                self._ring = Ring(slots)
                for key in self._ring_keys():
                    self._ring.add(key)
                self._origin, self._wall_origin = self._clock(), self._wall()
            elif slots != self._ring.slots:
                self._ring = self._ring.resized(slots)
            self._interval, self._window = interval, window
        if was_running and not self.running:
            self.start()

    # -- sources

    def sources(self) -> list[Source]:
        """The sources sampled now (discovered on first use)."""
        with self._lock:
            if self._sources is None:
                self._torch_seen = "torch" in sys.modules
                self._set_sources(self._discover())
            assert self._sources is not None
            return list(self._sources)

    @property
    def traces(self) -> tuple[Trace, ...]:
        """Every line, in source order."""
        return tuple(t for s in self.sources() for t in s.traces)

    def _ring_keys(self) -> list[str]:
        return [t.key for s in self._sources or [] for t in s.traces]

    def _set_sources(self, sources: list[Source]) -> None:
        keep = {t.key for s in sources for t in s.traces}
        for key in [k for k in self._ring.series if k not in keep]:
            self._ring.drop(key)
        for key in keep:
            self._ring.add(key)
        self._sources = sources

    def refresh_sources(self) -> bool:
        """Rediscover the sources if torch was imported since the last discovery; whether they changed.

        Call it on the main thread (discovery may import a vendor plugin); the cell hook does.
        """
        if self._torch_seen or "torch" not in sys.modules:
            return False
        self._torch_seen = True
        found = self._discover()
        with self._lock:
            before = [t.key for s in self._sources or [] for t in s.traces]
            self._set_sources(found)
            changed = before != self._ring_keys()
        if changed:
            self._notify()
        return changed

    # -- sampling

    def wall_time(self) -> float:
        """The wall clock this sampler stamps samples with."""
        return self._wall()

    def read_now(self) -> Sample:
        """One reading of every source, not stored (the cell hooks use it)."""
        return take_sample(self.sources())

    def tick(self, tick: int | None = None) -> Sample:
        """Take one sample into the ring as tick number ``tick`` (default: the next), then notify subscribers."""
        sources = self.sources()
        sample = take_sample(sources)
        with self._lock:
            number = self._ring.last_tick + 1 if tick is None else tick
            if number > self._ring.last_tick:
                self._ring.put(number, sample.values)
                for name, message in sample.errors.items():
                    self.errors.setdefault(name, message)
                # A source that answers again (a GPU back after a driver reset) is no longer missing.
                for source in sources:
                    if source.name not in sample.errors:
                        self.errors.pop(source.name, None)
                self.latest = dict(sample.values)
                self.ticks_taken += 1
        self._notify()
        return sample

    def samples(self, since: float | None = None) -> Samples:
        """What the ring holds, oldest first; with ``since``, only samples taken after that wall-clock time."""
        with self._lock:
            traces = tuple(t for s in self._sources or [] for t in s.traces)
            ticks = self._ring.ticks()
            if since is not None and len(ticks):
                ticks = ticks[self._wall_origin + ticks * self._interval > since]
            start = int(ticks[0]) if len(ticks) else self._ring.last_tick + 1
            values = {t.key: self._ring.ordered(t.key, start) for t in traces}
            return Samples(
                interval=self._interval,
                ticks=ticks,
                times=self._wall_origin + ticks * self._interval,
                values=values,
                traces=traces,
                errors=dict(self.errors),
            )

    def max_between(self, key: str, start: float, end: float) -> float | None:
        """The largest sampled value of one trace between two wall-clock times."""
        with self._lock:
            ticks = self._ring.ticks()
            if not len(ticks):
                return None
            times = self._wall_origin + ticks * self._interval
            chosen = (times >= start) & (times <= end)
            values = self._ring.ordered(key)[chosen]
            values = values[~np.isnan(values)]
            return float(values.max()) if len(values) else None

    # -- thread

    def start(self, interval: float | None = None, window: float | None = None) -> Sampler:
        """Start sampling (no-op when running with these settings); returns self."""
        if interval is not None or window is not None:
            self.configure(interval, window)
        with self._lock:
            if self.running:
                return self
            self.sources()
            self._stop_box[0] = event = threading.Event()
            first = max(self._ring.last_tick + 1, math.ceil((self._clock() - self._origin) / self._interval - 1e-9))
            self._thread = threading.Thread(
                target=_loop,
                args=(weakref.ref(self), event),
                kwargs={"origin": self._origin, "interval": self._interval, "clock": self._clock, "first": first},
                name=THREAD_NAME,
                daemon=True,
            )
            self._thread.start()
        self._notify()
        return self

    def stop(self, timeout: float = 5.0, *, notify: bool = True) -> None:
        """Stop sampling and wait for the thread to end; safe to call when already stopped."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop_box[0].set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if thread is not None and notify:
            self._notify()

    # -- subscribers

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn(sampler)`` after every tick and on start/stop; returns the function that unsubscribes."""
        with self._lock:
            self._subscribers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subscribers:
                    self._subscribers.remove(fn)

        return unsubscribe

    @property
    def subscribers(self) -> int:
        """How many subscribers there are."""
        return len(self._subscribers)

    def _notify(self) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for fn in subscribers:
            try:
                fn(self)
            except Exception as exc:
                # Never print from here (it runs on the sampler thread): keep the first few errors.
                if len(self.subscriber_errors) < 10:
                    self.subscriber_errors.append(f"{type(exc).__name__}: {exc}")


def _stop_thread(box: list[threading.Event]) -> None:
    box[0].set()


def _loop(
    ref: weakref.ref[Sampler],
    stop: threading.Event,
    *,
    origin: float,
    interval: float,
    clock: Callable[[], float],
    first: int,
) -> None:
    for tick, wait in schedule(origin, interval, clock, first):
        if stop.wait(wait):
            return
        sampler = ref()
        if sampler is None:
            return
        try:
            sampler.tick(tick)
        except Exception as exc:
            sampler.errors.setdefault("sampler", f"{type(exc).__name__}: {exc}")
        del sampler


_live: weakref.WeakSet[Sampler] = weakref.WeakSet()


@atexit.register
def stop_all() -> None:
    """Stop every sampler in this process (run at interpreter exit and by ``%unload_ext nbhw``)."""
    for sampler in list(_live):
        sampler.stop()


# ---------------------------------------------------------------- per-cell attribution


@dataclass(frozen=True)
class CellMemory:
    """One cell's memory on one device: at its start, at its end, and at its peak."""

    device: str
    trace: str
    start: int
    end: int
    peak: int
    peak_from: str  # "allocator" (the backend's peak counter) or "samples" (the sampled maximum)

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
                return value, "allocator"
        sampled = self.sampler.max_between(trace, opened.started, ended)
        return (int(sampled) if sampled is not None else 0), "samples"

    def top(self, n: int = 5) -> list[CellRecord]:
        """The cells that needed the most memory above their start, on any device."""
        # A snapshot: the sampler thread renders this while the main thread may append a record.
        ranked = [r for r in list(self.records) if r.most is not None]
        ranked.sort(key=lambda r: (r.most.used, r.most.delta) if r.most else (0, 0), reverse=True)
        return ranked[:n]


# ---------------------------------------------------------------- the process's sampler and cells

_process: dict[str, Any] = {}
_process_lock = threading.Lock()


def sampler() -> Sampler:
    """The one sampler of this process, shared by every graph (created on first use, not started)."""
    with _process_lock:
        if "sampler" not in _process:
            _process["sampler"] = Sampler()
            _process["cells"] = CellLog(_process["sampler"])
        found: Sampler = _process["sampler"]
        return found


def existing() -> Sampler | None:
    """This process's sampler if something created it, without creating it."""
    found: Sampler | None = _process.get("sampler")
    return found


def cells() -> CellLog:
    """The per-cell records of this process's sampler."""
    sampler()
    log: CellLog = _process["cells"]
    return log


def cell_started(key: object, source: str) -> None:
    """The pre-run-cell hook: cheap unless this process's sampler runs."""
    found = _process.get("sampler")
    if found is not None and found.running:
        _process["cells"].begin(key, source)


def cell_finished(key: object, execution_count: int | None, succeeded: bool | None) -> None:
    """The post-run-cell hook: record the cell, and add device traces once the user has imported torch."""
    found: Sampler | None = _process.get("sampler")
    if found is None:
        return
    _process["cells"].end(key, execution_count, succeeded)
    if found.running:
        found.refresh_sources()


# ---------------------------------------------------------------- text


def gib(nbytes: float | None, signed: bool = False) -> str:
    """Bytes in GiB with three decimals (MiB below 1 GiB), for tables of memory over time."""
    if nbytes is None or (isinstance(nbytes, float) and math.isnan(nbytes)):
        return "N/A"
    sign = "+" if signed and nbytes > 0 else ""
    if abs(nbytes) < GIB:
        return f"{sign}{nbytes / MIB:.1f} MiB"
    return f"{sign}{nbytes / GIB:.3f} GiB"


def status(sampler: Sampler) -> str:
    """'sampling every 0.5 s, window 10 min' or 'stopped'."""
    if not sampler.running:
        return "stopped"
    window = f"{sampler.window / 60:g} min" if sampler.window >= 60 else f"{sampler.window:g} s"
    return f"sampling every {sampler.interval:g} s, window {window}"


def figures(sampler: Sampler) -> list[list[str]]:
    """Rows of (device, memory, now, peak in window) for the text view."""
    data = sampler.samples()
    latest = sampler.latest or sampler.read_now().values
    rows = []
    for trace in data.traces:
        if trace.kind == "capacity":
            continue
        series = data.values[trace.key]
        finite = series[~np.isnan(series)]
        peak = float(finite.max()) if len(finite) and trace.kind != "available" else None
        capacity = latest.get(f"{trace.device} capacity")
        rows.append(
            [
                trace.device,
                LABELS[trace.kind],
                gib(latest.get(trace.key)),
                gib(peak) if peak is not None else "",
                size(capacity) if capacity else "",
            ]
        )
    return rows


def cell_rows(log: CellLog, n: int = 5) -> list[list[str]]:
    """Rows of (cell, first line, device, delta, peak) for the cells that needed the most memory."""
    rows = []
    for record in log.top(n):
        most = record.most
        assert most is not None
        count = f"[{record.execution_count}]" if record.execution_count is not None else "[ ]"
        rows.append([count, record.first_line, most.device, gib(most.delta, signed=True), gib(most.peak)])
    return rows


CELL_HEADERS = ("cell", "first line", "device", "delta", "peak")
FIGURE_HEADERS = ("device", "memory", "now", "peak (window)", "capacity")


def text(sampler: Sampler, log: CellLog) -> str:
    """The memory view for terminals: current figures, errors, and the per-cell table."""
    out = [f"nbhw memory: {status(sampler)}", "", text_table(FIGURE_HEADERS, figures(sampler), indent="  ")]
    out += [f"  {name}: {message}" for name, message in sampler.errors.items()]
    rows = cell_rows(log)
    out += ["", "Cells that used the most memory"]
    if rows:
        out.append(text_table(CELL_HEADERS, rows, indent="  "))
    else:
        out.append("  none recorded yet (cells are recorded while sampling runs)")
    return "\n".join(out)
