"""The memory figures and the top cells as text, for terminals and ``%hw memory`` outside Jupyter."""

from __future__ import annotations

import math

import numpy as np

from nbhw.core.memory.cell_records import CellLog
from nbhw.core.memory.sampling import Sampler
from nbhw.core.memory.sources import LABELS
from nbhw.core.render import GIB, MIB, size, text_table

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
