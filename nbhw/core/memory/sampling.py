"""The one sampler thread: a tick every ``interval`` seconds into the ring buffer, subscribers told.

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
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from nbhw.core.errors import UserError
from nbhw.core.memory.ring import Ring, Samples
from nbhw.core.memory.sources import Sample, Source, Trace, discover_sources, take_sample

THREAD_NAME = "nbhw-sampler"
MIN_INTERVAL = 0.05
MAX_INTERVAL = 3600.0
MAX_SLOTS = 20_000

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
