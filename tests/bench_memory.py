"""Benchmark of the memory graph (a script, not a test): python tests/bench_memory.py [--repeats N] [--quick]

1. A CPU-bound torch loop with the sampler off, on at the default interval and at 10 Hz (each with and
   without a live graph fed through a recording comm), alternating in one run: median time -> slowdown,
   the loop thread's own CPU time vs off, and the CPU time the process's other threads (the sampler) used as a
   share of the loop's wall time. On a shared machine the wall ratio is noisy; the CPU columns are not.
2. Bytes sent to the browser per tick at ticks 100, 1,200 (the default window is full) and 10,000, through
   the real widget with a recording comm, every tick changing (the worst case: no tick skipped).
3. What the cell hooks cost per cell in the real IPython shell: no extension, extension loaded, sampling.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from collections.abc import Callable

import torch

from nbhw.core import memory
from nbhw.core.fmt import text_table
from nbhw.ui import memory as ui
from tests.memcomm import recording_comms


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


def overhead(repeats: int, steps: int) -> list[list[str]]:
    settings = [
        Setting("sampler off", None, False),
        Setting("on, every 0.5 s (default)", 0.5, False),
        Setting("on, every 0.5 s + graph", 0.5, True),
        Setting("on, 10 Hz", 0.1, False),
        Setting("on, 10 Hz + graph", 0.1, True),
    ]
    workload(steps // 4)  # warm up
    with recording_comms():
        for i in range(repeats):
            order = settings if i % 2 == 0 else settings[::-1]
            for s in order:
                s.run(steps)
    base, base_own = statistics.median(settings[0].times), statistics.median(settings[0].own)
    return [
        [
            s.name,
            f"{statistics.median(s.times) * 1000:.0f} ms",
            f"{statistics.median(s.times) / base:.3f}",
            f"{statistics.median(s.own) / base_own:.3f}",
            f"{max(0.0, statistics.median(s.others)) * 100:.2f} %",
        ]
        for s in settings
    ]


class Growing(memory.Source):
    """A device whose allocation changes every tick, so no tick is skipped."""

    name = "bench:0 (fake)"
    device = "bench:0"
    kinds = ("allocated", "reserved", "capacity")
    primary = "allocated"

    def __init__(self) -> None:
        self.n = 0

    def read(self) -> dict[str, int]:
        self.n += 1
        return {"allocated": (self.n % 977) * 2**20, "reserved": (self.n % 977 + 64) * 2**20, "capacity": 80 * 2**30}


def bytes_per_tick(window: float, marks: tuple[int, ...]) -> list[list[str]]:
    rows = []
    with recording_comms() as rec:
        sampler = memory.Sampler(interval=0.5, window=window, sources=[memory.HostSource(), Growing()])
        view = ui.MemoryView(sampler, memory.CellLog(sampler))
        rec.drain()
        tick_ms: list[float] = []
        sent: list[int] = []
        for tick in range(1, max(marks) + 1):
            start = time.perf_counter()
            sampler.tick()
            tick_ms.append((time.perf_counter() - start) * 1000)
            messages, nbytes, _ = rec.drain()
            sent.append(nbytes)
            if tick in marks:
                rows.append(
                    [
                        f"{window:g} s / {sampler.slots}",
                        f"{tick:,}",
                        f"{nbytes:,}",
                        f"{statistics.median(sent[-100:]):,.0f} / {max(sent[-100:]):,}",
                        str(messages),
                        f"{statistics.median(tick_ms[-100:]):.2f}",
                    ]
                )
        view.close()
    return rows


def cell_cost(cells: int, repeats: int = 7) -> list[list[str]]:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and ticks")
    args = parser.parse_args()
    repeats, steps = (3, 2000) if args.quick else (args.repeats, args.steps)
    torch.set_num_threads(1)  # one intra-op thread: the CPU time of other threads is the sampler's
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {repeats} alternating runs\n")
    print("CPU-bound torch loop, sampler off vs on")
    headers = ("setting", "median wall", "wall vs off", "loop CPU vs off", "sampler CPU / wall")
    print(text_table(headers, overhead(repeats, steps), indent="  "))
    marks = (100, 1200, 2400, 10_000) if not args.quick else (100, 1200, 2400)
    print("\nBytes sent per tick (every tick changes: none skipped), real widget, recording comm")
    rows = bytes_per_tick(600, marks) + bytes_per_tick(60, (100, 1200, 10_000) if not args.quick else (100, 1200))
    headers = ("window / slots", "tick", "bytes", "median / max of the last 100", "messages", "ms per tick")
    print(text_table(headers, rows, indent="  "))
    print("\nCell hooks: time per trivial cell in the real IPython shell")
    print(text_table(("state", "per cell"), cell_cost(200), indent="  "))


if __name__ == "__main__":
    main()
