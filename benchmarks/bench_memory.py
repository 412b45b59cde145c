"""The memory graph's part of ``benchmarks/bench.py`` (a benchmark, not a test; pytest does not collect it).

1. A CPU-bound torch loop with the sampler off, on at the default interval and at 10 Hz (each with and without a
   live graph fed through a recording comm), alternating in one run: the median over rounds of each setting's
   time over the sampler-off time of the same round (the slowdown), the loop thread's own CPU time vs off, and
   the CPU time the process's other threads (the sampler) used as a share of the loop's wall time: the most the
   sampler can hold the loop up by, since it can only do so while it holds the GIL. On a shared machine the wall
   ratio is noisy; the CPU columns are not.
2. Bytes the graph sends to the browser per tick at ticks 100, 1,200 (the default window is full) and 10,000,
   through the real widget with a recording comm, every source changing every tick (the worst case: nothing
   skipped), the sampler counting as running so the status line carries every figure as it does in a kernel.
3. What the cell hooks cost per cell in the real IPython shell: no extension, extension loaded, sampling.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nbhw.core import memory
from nbhw.core.render import GIB, MIB
from nbhw.ui import memory as ui
from tests.support.memcomm import counter_bytes, recording_comms


def workload(steps: int) -> tuple[float, float, float]:
    """Small torch ops in a Python loop (the GIL-heavy kind a sampler thread could slow down).

    Returns the wall time, the loop thread's CPU time, and the CPU time the process's other threads used
    meanwhile (the sampler's).
    """
    torch.manual_seed(0)
    x = torch.rand(4096)
    w = torch.rand(64, 64)
    m = torch.rand(64, 64)
    start, cpu, main = time.perf_counter(), time.process_time(), time.thread_time()
    for _ in range(steps):
        x = torch.tanh(x * 1.0001 + 0.0001)
        m = torch.relu(m @ w) * 0.01 + 0.5
    wall, own = time.perf_counter() - start, time.thread_time() - main
    return wall, own, (time.process_time() - cpu) - own


class Setting:
    """One way to run the loop: sampler off, or on at an interval, with or without a graph."""

    def __init__(self, name: str, interval: float | None, graph: bool) -> None:
        self.name, self.interval, self.graph = name, interval, graph
        self.times: list[float] = []
        self.own: list[float] = []
        self.others: list[float] = []

    def run(self, steps: int) -> None:
        sampler = memory.Sampler(interval=self.interval or 0.5, window=600)
        view = ui.MemoryView(sampler, memory.CellLog(sampler)) if self.graph else None
        if self.interval is not None:
            sampler.start()
            time.sleep(self.interval / 2)
        try:
            wall, own, others = workload(steps)
            self.times.append(wall)
            self.own.append(own)
            self.others.append(others / wall)
        finally:
            sampler.stop()
            if view is not None:
                view.close()

    def wall(self) -> float:
        return statistics.median(self.times)

    def slowdown(self, off: Setting) -> float:
        """The median over rounds of this setting's time / the sampler-off time of the same round.

        Pairing runs of one round cancels the slow drift of a shared machine's load.
        """
        return statistics.median(a / b for a, b in zip(self.times, off.times, strict=True))

    def cpu_share(self) -> float:
        """The median CPU the sampler thread used, as a share of the loop's wall time."""
        return max(0.0, statistics.median(self.others))


def overhead(repeats: int, steps: int) -> list[Setting]:
    """The loop under each setting, alternating order each round; the first setting is 'sampler off'."""
    settings = [
        Setting("sampler off", None, False),
        Setting("on, every 0.5 s (default)", 0.5, False),
        Setting("on, every 0.5 s + graph", 0.5, True),
        Setting("on, 10 Hz", 0.1, False),
        Setting("on, 10 Hz + graph", 0.1, True),
    ]
    torch.set_num_threads(1)  # one intra-op thread: the CPU time of other threads is the sampler's
    workload(steps // 4)  # warm up
    with recording_comms():
        for i in range(repeats):
            for s in settings if i % 2 == 0 else settings[::-1]:
                s.run(steps)
    return settings


def overhead_rows(settings: list[Setting]) -> list[list[str]]:
    off = settings[0]
    base_own = statistics.median(off.own)
    return [
        [
            s.name,
            f"{s.wall() * 1000:.0f} ms",
            f"{s.slowdown(off):.3f}",
            f"{statistics.median(s.own) / base_own:.3f}",
            f"{s.cpu_share() * 100:.2f} %",
        ]
        for s in settings
    ]


OVERHEAD_HEADERS = ("setting", "median wall", "wall vs off (paired)", "loop CPU vs off", "sampler CPU / wall")


class Changing(memory.Source):
    """A device whose every reading but capacity changes every tick, between 1 and 9 GiB (one printed width)."""

    def __init__(self, device: str, kinds: tuple[str, ...]) -> None:
        self.device, self.name, self.kinds = device, f"{device} (bench)", kinds
        self.primary = kinds[0]
        self.n = 0

    def read(self) -> dict[str, int]:
        self.n += 1
        return {
            kind: 80 * GIB if kind == "capacity" else GIB + (self.n * 7 + i * 13) % 97 * 80 * MIB
            for i, kind in enumerate(self.kinds)
        }


HOST = ("rss", "available", "capacity")
NVIDIA = ("allocated", "reserved", "used", "capacity")  # torch's two counters, NVML's used and total: the most


class Running(memory.Sampler):
    """Ticks driven by hand, but the view sees a running sampler (its status line lists every figure)."""

    @property
    def running(self) -> bool:
        return True


@dataclass
class Sent:
    """What one tick sent: bytes on the wire, of which plotly's edit counters, and the messages."""

    nbytes: int
    counters: int
    messages: int


def tick_bytes(gpus: int, marks: tuple[int, ...], window: float = 600, interval: float = 0.5) -> dict[int, Sent]:
    """What the graph sends at each tick in ``marks``, with the host and ``gpus`` NVIDIA-like devices."""
    found: dict[int, Sent] = {}
    with recording_comms() as rec:
        sources = [Changing("host", HOST)] + [Changing(f"cuda:{i}", NVIDIA) for i in range(gpus)]
        sampler = Running(interval=interval, window=window, sources=sources)
        view = ui.MemoryView(sampler, memory.CellLog(sampler))
        rec.drain()
        for tick in range(1, max(marks) + 1):
            sampler.tick()
            count, nbytes, messages = rec.drain()
            if tick in marks:
                found[tick] = Sent(nbytes, counter_bytes(messages), count)
        view.close()
    return found


def bytes_rows(marks: tuple[int, ...]) -> tuple[list[list[str]], dict[str, float]]:
    """Rows for ticks ``marks`` (host + 1 GPU) and the per-device figures: host alone, and what a GPU adds."""
    long = tick_bytes(1, marks)
    rows = [[f"{t:,}", f"{s.nbytes:,}", f"{s.nbytes - s.counters:,}", str(s.messages)] for t, s in long.items()]
    at = {gpus: tick_bytes(gpus, (100,))[100] for gpus in (0, 1, 2)}
    host = at[0].nbytes
    gpu = max(at[1].nbytes - at[0].nbytes, at[2].nbytes - at[1].nbytes)
    figures = {
        "first": long[min(marks)].nbytes,
        "last": long[max(marks)].nbytes,
        "first_payload": long[min(marks)].nbytes - long[min(marks)].counters,
        "last_payload": long[max(marks)].nbytes - long[max(marks)].counters,
        "host": host,
        "gpu": gpu,
    }
    return rows, figures


BYTES_HEADERS = ("tick", "bytes", "less plotly's edit counters", "messages")


def cell_cost(cells: int, repeats: int = 7) -> list[list[str]]:
    """Time per trivial cell in the real IPython shell: no extension, extension loaded, sampling."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()

    def per_cell() -> float:
        start = time.perf_counter()
        for i in range(cells):
            ip.run_cell(f"_x = {i}", store_history=True)
        return (time.perf_counter() - start) / cells * 1e6

    def unloaded() -> None:
        if "nbhw" in ip.extension_manager.loaded:
            ip.run_line_magic("unload_ext", "nbhw")

    def loaded() -> None:
        unloaded()
        ip.run_line_magic("load_ext", "nbhw")

    def sampling() -> None:
        loaded()
        with contextlib.redirect_stdout(io.StringIO()):
            ip.run_line_magic("hw", "memory")

    states: list[tuple[str, Callable[[], None]]] = [
        ("no extension", unloaded),
        ("%load_ext nbhw, not sampling", loaded),
        ("sampling (%hw memory)", sampling),
    ]
    times: dict[str, list[float]] = {name: [] for name, _ in states}
    for i in range(repeats):
        for name, enter in states if i % 2 == 0 else states[::-1]:
            enter()
            per_cell()  # warm up
            times[name].append(per_cell())
    unloaded()
    return [[name, f"{statistics.median(values):.0f} µs"] for name, values in times.items()]
