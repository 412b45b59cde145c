"""On a real NVIDIA GPU: the memory graph and the per-cell records follow a 2 GiB tensor allocated and freed."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.gpu.gpuenv import GIB, MIB, gpu_only

pytestmark = gpu_only()

SIZE = 2 * GIB
ALLOCATED, RESERVED, USED = "cuda:0 allocated", "cuda:0 reserved", "cuda:0 used"


def _context() -> Any:
    """Start CUDA first, so the baselines already include the context's own memory."""
    import torch

    torch.zeros(1, device="cuda:0")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch


def _wait(sampler: Any, ok: Callable[[dict[str, int]], bool], what: str, timeout: float = 10.0) -> dict[str, int]:
    """The sampler's latest reading once ``ok`` holds for it (the sampler thread takes it, not this test)."""
    deadline = time.monotonic() + timeout
    seen = sampler.ticks_taken
    while time.monotonic() < deadline:
        latest = dict(sampler.latest)
        if sampler.ticks_taken > seen and all(k in latest for k in (ALLOCATED, RESERVED, USED)) and ok(latest):
            return latest
        time.sleep(0.02)
    raise AssertionError(f"the sampler never showed {what}; latest: {sampler.latest}; errors: {sampler.errors}")


def _graph_series(view: Any, key: str) -> list[float]:
    from nbhw.core.memory import Trace

    device, kind = key.split(" ")
    label = Trace(device, kind).label
    trace = next(t for t in view.figure.data if t.name == label)
    return [float(y) for y in trace.y]


def test_graph_figures_rise_by_2_gib_and_fall_back_when_freed(record_property: Any) -> None:
    from nbhw.core import memory

    torch = _context()
    sampler = memory.Sampler(interval=0.05, window=60)
    widgets = all(importlib.util.find_spec(m) for m in ("ipywidgets", "plotly", "anywidget"))
    view = None
    try:
        sampler.start()
        if widgets:
            from nbhw.ui.memory import MemoryView

            view = MemoryView(sampler, memory.CellLog(sampler), refresh=0.0)
        base = _wait(sampler, lambda v: True, "cuda:0 traces")
        started = sampler.wall_time()
        tensor = torch.empty(SIZE, dtype=torch.uint8, device="cuda:0")
        torch.cuda.synchronize()
        high = _wait(sampler, lambda v: v[ALLOCATED] >= base[ALLOCATED] + SIZE, "the 2 GiB allocation")
        del tensor
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        low = _wait(
            sampler,
            lambda v: v[ALLOCATED] <= base[ALLOCATED] and v[USED] < high[USED] - SIZE // 2,
            "the memory freed",
        )
        rows = memory.figures(sampler)
        samples = sampler.samples(since=started)
    finally:
        sampler.stop()
        if view is not None:
            view.close()
    assert high[ALLOCATED] - base[ALLOCATED] == SIZE
    assert high[RESERVED] - base[RESERVED] >= SIZE
    assert high[USED] - base[USED] >= SIZE * 0.98, (base[USED], high[USED])
    assert low[ALLOCATED] == base[ALLOCATED] and low[RESERVED] == base[RESERVED]
    assert abs(low[USED] - base[USED]) < 64 * MIB, (base[USED], low[USED])
    # What the graph draws: the ring's samples (float32) and the text view's peak column.
    peak = float(np.nanmax(samples.values[ALLOCATED]))
    assert abs(peak - (base[ALLOCATED] + SIZE)) < MIB
    allocated_row = next(r for r in rows if r[0] == "cuda:0" and r[1] == memory.LABELS["allocated"])
    assert allocated_row[3] == memory.gib(base[ALLOCATED] + SIZE), allocated_row
    if view is not None:
        drawn = _graph_series(view, ALLOCATED)
        assert np.nanmax(drawn) >= (base[ALLOCATED] + SIZE) / GIB - 0.001, "the widget's allocated line missed 2 GiB"
        assert drawn[-1] <= base[ALLOCATED] / GIB + 0.001
    record_property("allocated_rise_gib", round((high[ALLOCATED] - base[ALLOCATED]) / GIB, 3))
    record_property("reserved_rise_gib", round((high[RESERVED] - base[RESERVED]) / GIB, 3))
    record_property("nvml_used_rise_gib", round((high[USED] - base[USED]) / GIB, 3))
    record_property("nvml_used_after_free_mib", round((low[USED] - base[USED]) / MIB, 1))
    record_property("widget_checked", view is not None)


def test_per_cell_records_attribute_the_cells_to_cuda0(ip: Any, record_property: Any) -> None:
    from nbhw.core import memory

    _context()
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_cell("%hw memory --interval 0.05 --window 120", store_history=True)
    try:
        alloc = ip.run_cell(
            f"import torch\nx = torch.empty({SIZE}, dtype=torch.uint8, device='cuda')", store_history=True
        )
        free = ip.run_cell("del x\ntorch.cuda.empty_cache()", store_history=True)
        spike = ip.run_cell(
            f"y = torch.empty({SIZE}, dtype=torch.uint8, device='cuda')\ntorch.cuda.synchronize()\ndel y",
            store_history=True,
        )
        small = ip.run_cell("z = 1", store_history=True)
        table = memory.cell_rows(memory.cells(), n=10)
    finally:
        ip.run_line_magic("hw", "memory --stop")
    cells = [alloc, free, spike, small]
    assert all(c.success for c in cells), [c.error_in_exec for c in cells]
    got = {r.execution_count: r for r in memory.cells().records}
    a, f, s, z = (got[c.execution_count] for c in cells)
    assert a.first_line == "import torch" and a.most is not None and a.most.device == "cuda:0"
    assert a.memory["cuda:0"].delta == SIZE and a.memory["cuda:0"].trace == "cuda:0 allocated"
    assert f.memory["cuda:0"].delta == -SIZE
    # Allocated and freed inside one cell: nothing left, but the allocator's peak counter saw it.
    spiked = s.memory["cuda:0"]
    assert spiked.delta == 0 and spiked.used == SIZE and spiked.peak_from == "allocator"
    assert z.memory["cuda:0"].used == 0
    listed = {row[0]: row for row in table}
    for cell, record in ((alloc, a), (spike, s)):
        row = listed[f"[{cell.execution_count}]"]
        assert row[2] == "cuda:0" and row[4] == memory.gib(record.memory["cuda:0"].start + SIZE), row
    record_property("alloc_cell_delta_gib", round(a.memory["cuda:0"].delta / GIB, 3))
    record_property("spike_cell_used_gib", round(spiked.used / GIB, 3))
