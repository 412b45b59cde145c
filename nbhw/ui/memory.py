"""The live memory graph: a plotly FigureWidget over the kernel's one sampler, with per-cell markers and table.

Every view subscribes to the same :class:`~nbhw.core.memory.Sampler`; the sampler thread updates the widgets
under :data:`LOCK` (the one lock for every memory widget), never prints, and sends at most one
``batch_update`` per tick. What a tick sends does not grow with the session or the window: each trace travels as
the same number of float32 points from the first tick on (:func:`display_points`: NaN where nothing was sampled
yet, more samples than points reduced to each bucket's min and max so peaks survive) in a binary buffer with an
implied x axis (``x0`` + ``dx``), and a trace whose points did not change is not sent again. Ticks that change
nothing visible are skipped, except for a refresh every few seconds so the time axis keeps moving. Closing the
last view stops the sampler.
"""

from __future__ import annotations

import copy
import functools
import math
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import ipywidgets
import numpy as np
from IPython import get_ipython

from nbhw.core.memory import process, summary
from nbhw.core.memory.cell_records import CellLog, CellRecord
from nbhw.core.memory.ring import Samples
from nbhw.core.memory.sampling import Sampler
from nbhw.core.memory.sources import Trace
from nbhw.core.render import GIB, MIB, device_color, esc, html_table
from nbhw.ui.tree import close_tree

LOCK = threading.RLock()
WIDTH = 860
ROW_HEIGHT = 230
REFRESH = 2.0
MAX_CELL_MARKERS = 20
# Points per trace on the graph, whatever the window: about one per 3 px of the plot, and what keeps a device's
# traces within 4 KB per tick (float32).
POINTS = 240
DASH = {"allocated": "solid", "reserved": "dash", "used": "dot", "rss": "solid", "available": "dot"}
BOX_CLASS = "nbhw-memory"
GRAPH_CLASS = "nbhw-memory-graph"
STATUS_CLASS = "nbhw-memory-status"
ERRORS_CLASS = "nbhw-memory-errors"
CELLS_CLASS = "nbhw-memory-cells"
LOADED_CLASS = "nbhw-memory-loaded"

_views: list[MemoryView] = []
_shared: dict[str, MemoryView] = {}

STYLE = f"""<style>
.{BOX_CLASS} {{ font-family: var(--jp-ui-font-family, sans-serif); font-size: 13px; }}
.{STATUS_CLASS} .state {{ font-weight: 600; }}
.{STATUS_CLASS} .state[data-state="stopped"] {{ color: var(--jp-warn-color1, #9a6700); }}
.{ERRORS_CLASS} {{ color: var(--jp-error-color1, #b42318); }}
.{CELLS_CLASS} table {{ border-collapse: collapse; }}
.{CELLS_CLASS} th, .{CELLS_CLASS} td {{ text-align: left; padding: 1px 8px;
  border-bottom: 1px solid var(--jp-border-color2, #ddd); }}
</style>"""


def in_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (widgets render) rather than a terminal or a script."""
    return getattr(get_ipython(), "kernel", None) is not None


def _stamp(t: float) -> str:
    """A wall-clock time as plotly reads dates on a date axis (local time, milliseconds)."""
    return datetime.fromtimestamp(t).isoformat(sep=" ", timespec="milliseconds")


def _exact(nbytes: float) -> str:
    """GiB with the MiB behind it: exact to the shown digit even from float32 samples."""
    return f"{nbytes / GIB:.3f} GiB ({nbytes / MIB:,.1f} MiB)"


def point_count(slots: int, points: int = POINTS) -> int:
    """How many points a trace has on the graph: the window's samples, at most ``points``."""
    return min(slots, points)


def bucket_size(samples: int, slots: int, points: int = POINTS) -> int:
    """Samples per drawn point pair: 1 while the samples fit, else enough to draw each bucket as its min and max."""
    count = point_count(slots, points)
    return 1 if samples <= count else math.ceil(samples / (count // 2))


def display_points(series: np.ndarray, slots: int, points: int = POINTS) -> np.ndarray:
    """The samples in a window (oldest first) as the graph's float32 points, the newest sample last.

    The length is :func:`point_count`, whatever the number of samples so far: NaN stands for what was not sampled
    yet. Once there are more samples than points, they are cut into buckets (the newest ending at the newest
    sample) and each bucket is drawn as its min and its max in the order they happened, so a spike shorter than a
    bucket is still drawn at its height.
    """
    count = point_count(slots, points)
    per = bucket_size(len(series), slots, points)
    out = np.full(count, np.nan, dtype=np.float32)
    if not len(series):
        return out
    if per == 1:
        out[count - len(series) :] = series
        return out
    buckets = math.ceil(len(series) / per)
    flat = np.full(buckets * per, np.nan, dtype=np.float32)
    flat[len(flat) - len(series) :] = series
    rows = flat.reshape(buckets, per)
    missing = np.isnan(rows)
    low = np.where(missing, np.inf, rows).argmin(axis=1)
    high = np.where(missing, -np.inf, rows).argmax(axis=1)
    which = np.arange(buckets)
    out[count - 2 * buckets :: 2] = rows[which, np.minimum(low, high)]
    out[count - 2 * buckets + 1 :: 2] = rows[which, np.maximum(low, high)]
    return out


def point_spacing(samples: int, slots: int, interval: float, points: int = POINTS) -> float:
    """Seconds between two of :func:`display_points`' points."""
    per = bucket_size(samples, slots, points)
    return interval if per == 1 else per * interval / 2


@functools.cache
def _classes() -> tuple[type, type]:
    """The figure and box classes, built on first use: plotly's FigureWidget import is slow (plotly#5143)."""
    import plotly.graph_objects as go  # lazy: plotly loads only when a graph is drawn

    class Figure(go.FigureWidget):  # type: ignore[misc]
        """A FigureWidget whose messages from the browser are handled under the memory views' lock."""

        # plotly's FigureWidget names its front-end code as a file, and anywidget then ties every instance to that
        # file's change signal with a strong reference that is never dropped: no figure is ever freed (about
        # 0.2 MiB per graph, a graph per %hw memory after a reload). The same code as a string ties nothing.
        _esm = str(go.FigureWidget._esm)

        def _handle_msg(self, msg: Any) -> None:
            # JupyterLab handles widget messages on a second kernel thread while cells run; plotly's
            # handlers mutate the same figure state the sampler thread updates.
            with LOCK:
                super()._handle_msg(msg)

    class Box(ipywidgets.VBox):  # type: ignore[misc]
        """The view's box: closing it closes the view."""

        view: MemoryView | None = None

        def close(self) -> None:
            view, self.view = self.view, None
            if view is not None:
                view.close()
            super().close()

    return Figure, Box


class MemoryView:
    """One live graph: status line, errors, the figure and the per-cell table, in a box this view owns."""

    def __init__(
        self,
        sampler: Sampler,
        log: CellLog,
        *,
        width: int = WIDTH,
        row_height: int = ROW_HEIGHT,
        refresh: float = REFRESH,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _, box_class = _classes()
        self.sampler, self.log = sampler, log
        self.width, self.row_height, self.refresh, self.clock = width, row_height, refresh, clock
        self.closed = False
        self.frames_sent = 0
        self.ticks_seen = 0
        self.style = ipywidgets.HTML(STYLE)
        self.status = ipywidgets.HTML()
        self.status.add_class(STATUS_CLASS)
        self.errors = ipywidgets.HTML()
        self.errors.add_class(ERRORS_CLASS)
        self.table = ipywidgets.HTML()
        self.table.add_class(CELLS_CLASS)
        self.figure: Any = None
        self._keys: tuple[str, ...] | None = None
        self._index: dict[str, int] = {}
        self._peak_index: dict[int, int] = {}
        self._signature: tuple[Any, ...] | None = None
        self._sent_at = -math.inf
        self._cells_version: tuple[int, int] = (-1, -1)
        self._shapes: list[dict[str, Any]] = []
        self._sent: dict[str, np.ndarray] = {}
        self.box = box_class(layout=ipywidgets.Layout(width=f"{width + 20}px"))
        self.box.view = self
        self.box.add_class(BOX_CLASS)
        self.box.add_class("nbhw")
        with LOCK:
            _views.append(self)
            self.render(force=True)
        self._unsubscribe = sampler.subscribe(self._on_tick)

    # -- lifecycle

    def close(self) -> None:
        """Close the widgets (with their layouts and styles); the last view to close stops the sampler."""
        with LOCK:
            if self.closed:
                return
            self.closed = True
            self._unsubscribe()
            if self in _views:
                _views.remove(self)
            last = not _views
            if self.box.view is self:
                self.box.view = None
            close_tree(self.box, self.figure, self.style, self.status, self.errors, self.table)
        # Outside the lock: stop() joins the sampler thread, which may be waiting for the lock.
        if last:
            self.sampler.stop()

    def _on_tick(self, sampler: Sampler) -> None:
        with LOCK:
            self.ticks_seen += 1
            self.render()

    # -- rendering

    def render(self, force: bool = False) -> bool:
        """Bring the widgets up to date; whether anything was sent. Call under LOCK."""
        if self.closed:
            return False
        data = self.sampler.samples()
        keys = tuple(t.key for t in data.traces)
        if keys != self._keys:
            self._rebuild(data)
            force = True
        now = self.clock()
        latest = self.sampler.latest
        signature = (
            self.sampler.running,
            self.sampler.interval,
            tuple(round(latest[k] / MIB) if k in latest else None for k in keys),
            self.log.version,
            _loaded_lines()[0],
            len(data.errors),
        )
        if not force and signature == self._signature and now - self._sent_at < self.refresh:
            return False
        stopped = bool(self._signature and self._signature[0]) and not self.sampler.running
        self._signature, self._sent_at = signature, now
        self._draw(data)
        self._texts(data)
        if stopped:
            self._settle()
        self.frames_sent += 1
        return True

    def _settle(self) -> None:
        """A stopped graph's points into the widget state a saved notebook keeps. Each tick reaches the browser as
        an update message, which saving (and the documentation site) drops: the saved graph was empty axes. plotly's
        front end ignores these two traits once drawn, and plotly itself sets them so when a figure is displayed."""
        self.figure._widget_data = copy.deepcopy(self.figure._data)
        self.figure._widget_layout = copy.deepcopy(self.figure._layout_obj._props)

    def _rebuild(self, data: Samples) -> None:
        figure_class, _ = _classes()
        old = self.figure
        self.figure = figure_class(self._figure_dict(data.traces))
        self.figure.add_class(GRAPH_CLASS)
        self._keys = tuple(t.key for t in data.traces)
        self._index = {t.key: i for i, t in enumerate(data.traces)}
        n = len(data.traces)
        rows = self._rows(data.traces)
        self._peak_index = {row: n + i for i, row in enumerate(sorted(set(rows.values())))}
        self._shapes = []
        self._sent = {}
        self.box.children = (self.style, self.status, self.errors, self.figure, self.table)
        if old is not None:
            old.close()

    @staticmethod
    def _rows(traces: tuple[Trace, ...]) -> dict[str, int]:
        has_devices = any(t.device != "host" for t in traces)
        return {t.key: 1 if t.device == "host" or not has_devices else 2 for t in traces}

    def _figure_dict(self, traces: tuple[Trace, ...]) -> dict[str, Any]:
        from plotly.subplots import make_subplots  # lazy: plotly loads only when a graph is drawn

        rows = self._rows(traces)
        nrows = max(rows.values(), default=1)
        titles = ["host (this kernel and the machine)", "devices"][:nrows]
        # The machine's figures (hundreds of GiB) get the host row's right axis, so this kernel's RSS stays readable.
        specs = [[{"secondary_y": True}]] + [[{}]] * (nrows - 1)
        fig = make_subplots(
            rows=nrows, cols=1, shared_xaxes=True, vertical_spacing=0.1, subplot_titles=titles, specs=specs
        )
        for trace in traces:
            color = device_color(trace.device)
            style: dict[str, Any] = {"color": color, "width": 1.5, "dash": DASH.get(trace.kind, "solid")}
            if trace.kind == "capacity":
                style = {"color": color, "width": 1, "dash": "longdash"}
            fig.add_scatter(
                name=trace.label,
                mode="lines",
                line=style,
                y=np.empty(0, dtype=np.float32),
                hovertemplate="%{y:.3f} GiB",
                row=rows[trace.key],
                col=1,
                secondary_y=_machine(trace) or None,
            )
        for row in sorted(set(rows.values())):
            fig.add_scatter(
                name="peak",
                mode="markers",
                marker={"symbol": "triangle-down", "size": 9, "color": "#444"},
                hoverinfo="text",
                cliponaxis=False,  # a peak at the newest sample sits on the axis' end: draw all of it
                showlegend=row == 1,
                legendgroup="peak",
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text="GiB", rangemode="tozero")
        fig.update_yaxes(title_text="GiB, this kernel", row=1, col=1, secondary_y=False)
        fig.update_yaxes(title_text="GiB, machine", showgrid=False, row=1, col=1, secondary_y=True)
        fig.update_xaxes(type="date")
        fig.update_layout(
            width=self.width,
            height=self.row_height * nrows + 140,
            autosize=False,
            margin={"l": 60, "r": 20, "t": 40, "b": 20},
            legend={"orientation": "h", "y": -0.12, "font": {"size": 11}},
            hovermode="x unified",
            uirevision="nbhw-memory",
            template="plotly_white",
        )
        result: dict[str, Any] = fig.to_dict()
        return result

    def _draw(self, data: Samples) -> None:
        fig = self.figure
        if len(data) == 0:
            return
        slots = self.sampler.slots
        spacing = point_spacing(len(data), slots, data.interval)
        newest = float(data.times[-1])
        # Every trace has the same fixed number of points ending at the newest sample: x0 moves, the length doesn't.
        x0 = _stamp(newest - (point_count(slots) - 1) * spacing)
        first, last = _stamp(float(data.times[0])), _stamp(newest)
        rows = self._rows(data.traces)
        peaks: dict[int, tuple[list[str], list[float], list[str]]] = {r: ([], [], []) for r in self._peak_index}
        with fig.batch_update():
            # The time axis ends at the newest sample and, until the window is full, starts at the first one:
            # neither the NaN padding nor the margin plotly leaves for the peak markers (5 % of the padded span)
            # stretch it. clipmin is sent once per history, clipmax every tick.
            clip = {"clipmax": last} if len(data) == slots else {"clipmin": first, "clipmax": last}
            fig.update_xaxes(autorangeoptions=clip)
            for trace in data.traces:
                target = fig.data[self._index[trace.key]]
                series = data.values[trace.key]
                if trace.kind == "capacity":
                    self._capacity(target, series, first, last)
                    continue
                target.x0, target.dx = x0, spacing * 1000.0
                points = display_points(series / np.float32(GIB), slots)
                # plotly compares arrays without equal_nan, so it would resend every padded trace: skip them here.
                sent = self._sent.get(trace.key)
                if sent is None or not np.array_equal(points, sent, equal_nan=True):
                    target.y = points
                    self._sent[trace.key] = points
                if trace.kind != "available":
                    self._peak(peaks[rows[trace.key]], trace, series, data.times)
            for row, (xs, ys, texts) in peaks.items():
                marker = fig.data[self._peak_index[row]]
                marker.x, marker.y, marker.hovertext = xs, ys, texts
            self._cell_markers(data)

    @staticmethod
    def _capacity(target: Any, series: np.ndarray, first: str, last: str) -> None:
        finite = series[~np.isnan(series)]
        if not len(finite):
            target.x, target.y = [], []
            return
        value = float(finite[-1])
        target.x, target.y = [first, last], [value / GIB, value / GIB]
        target.hovertemplate = f"capacity {_exact(value)}<extra></extra>"

    @staticmethod
    def _peak(
        into: tuple[list[str], list[float], list[str]], trace: Trace, series: np.ndarray, times: np.ndarray
    ) -> None:
        if not len(series) or np.isnan(series).all():
            return
        i = int(np.nanargmax(series))
        value = float(series[i])
        into[0].append(_stamp(float(times[i])))
        into[1].append(value / GIB)
        into[2].append(f"peak {trace.label}: {_exact(value)} at {_stamp(float(times[i]))[11:19]}")

    def _cell_markers(self, data: Samples) -> None:
        if not len(data):
            return
        start = float(data.times[0])
        marks: list[tuple[float, float, str, str]] = []
        for record in list(self.log.records)[-MAX_CELL_MARKERS:]:
            if record.ended >= start:
                marks.append((record.started, record.ended, _cell_label(record), _cell_hover(record)))
        running = self.log.running_since
        if running is not None:
            marks.append((running, self.sampler.wall_time(), "▶", "the cell running now"))
        shapes = [
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": _stamp(max(a, start)),
                "x1": _stamp(b),
                "y0": 0,
                "y1": 1,
                "fillcolor": "rgba(100, 100, 100, 0.07)",
                "line": {"width": 0.5, "color": "rgba(100, 100, 100, 0.5)"},
                "layer": "below",
            }
            for a, b, _, _ in marks
        ]
        if shapes == self._shapes:
            return
        self._shapes = shapes
        annotations = [
            {
                "x": _stamp(max(a, start)),
                "xref": "x",
                "y": 1.0,
                "yref": "paper",
                "yanchor": "top",
                "xanchor": "left",
                "text": label,
                "hovertext": hover,
                "showarrow": False,
                "font": {"size": 10, "color": "#555"},
            }
            for a, _, label, hover in marks
        ]
        titles = [a for a in self.figure.layout.annotations if a.name != "cell"]
        self.figure.layout.shapes = shapes
        self.figure.layout.annotations = [*titles, *({**a, "name": "cell"} for a in annotations)]

    def _texts(self, data: Samples) -> None:
        state = "running" if self.sampler.running else "stopped"
        now = []
        for trace in data.traces:
            value = self.sampler.latest.get(trace.key)
            if value is None or trace.kind in {"capacity", "available"}:
                continue
            now.append(
                f'<span title="{value:,} bytes">{esc(trace.device)} {esc(trace.kind)} '
                f"<b>{esc(summary.gib(value))}</b></span>"
            )
        figures = " · ".join(now) if self.sampler.running else ""
        self.status.value = f'<span class="state" data-state="{state}">{esc(summary.status(self.sampler))}</span>' + (
            f" — {figures}" if figures else ""
        )
        self.errors.value = "<br>".join(
            f"⚠ {esc(name)}: {esc(message)} (its traces are empty; the others continue)"
            for name, message in data.errors.items()
        )
        version, lines = _loaded_lines()
        if (self.log.version, version) != self._cells_version:
            self._cells_version = (self.log.version, version)
            self.table.value = cells_html(self.log) + loaded_html(lines)


def _machine(trace: Trace) -> bool:
    """Whether a trace is a machine-wide host figure (drawn on the host row's right axis)."""
    return trace.device == "host" and trace.kind in {"available", "capacity"}


def _cell_label(record: CellRecord) -> str:
    return f"[{record.execution_count}]" if record.execution_count is not None else "[ ]"


def _cell_hover(record: CellRecord) -> str:
    lines = [f"{_cell_label(record)} {esc(record.first_line)}"]
    for m in record.memory.values():
        lines.append(f"{esc(m.device)}: delta {summary.gib(m.delta, signed=True)}, peak {summary.gib(m.peak)}")
    return "<br>".join(lines)


def cells_html(log: CellLog, n: int = 5) -> str:
    """The table of cells that used the most memory, as HTML."""
    rows = summary.cell_rows(log, n)
    if not rows:
        return "<b>Cells that used the most memory</b>: none yet (cells are recorded while sampling runs)"
    table = html_table(summary.CELL_HEADERS, rows, css_class="nbhw-table nbhw-memory-table")
    return f"<b>Cells that used the most memory</b>{table}"


def _loaded_lines() -> tuple[int, dict[int, list[str]]]:
    """The lines the cell hook noted for cells that loaded a model (nothing before transformers is imported)."""
    report = sys.modules.get("nbhw.core.measured.report")
    return report.noted_cell_lines() if report is not None else (-1, {})


def loaded_html(lines: dict[int, list[str]]) -> str:
    """The Memory tab's lines for the cells that loaded a model still alive, newest cell first."""
    if not lines:
        return ""
    items = "".join(
        f'<li data-cell="{count}">[{count}] {esc(line)}</li>'
        for count in sorted(lines, reverse=True)
        for line in lines[count]
    )
    return f'<div class="{LOADED_CLASS}"><b>Cells that loaded a model</b> (%hw loaded for all)<ul>{items}</ul></div>'


class Monitor:
    """Live memory graphs for this kernel (``%hw memory``): one sampler thread shared by every graph.

    Display it (or run ``%hw memory``) for a graph; ``.samples`` and ``.cells`` hold the data;
    ``.stop()`` stops sampling (every graph says so), ``.start()`` resumes.
    """

    def __init__(self, sampler: Sampler, log: CellLog) -> None:
        self.sampler, self.log = sampler, log

    def start(self) -> Monitor:
        """Resume sampling; returns self."""
        self.sampler.start()
        return self

    def stop(self) -> None:
        """Stop sampling; the graphs stay and say it stopped."""
        self.sampler.stop()

    @property
    def running(self) -> bool:
        """Whether the sampler runs."""
        return self.sampler.running

    @property
    def samples(self) -> Samples:
        """Everything in the window: wall-clock times and float32 bytes per trace."""
        return self.sampler.samples()

    @property
    def cells(self) -> list[CellRecord]:
        """One record per cell run while sampling: execution count, first line, delta and peak per device."""
        return list(self.log.records)

    def text(self) -> str:
        """The current figures and the per-cell table as text."""
        return summary.text(self.sampler, self.log)

    def view(self) -> MemoryView:
        """A new live graph of the same sampler, with widgets of its own."""
        return MemoryView(self.sampler, self.log)

    def shared_view(self) -> MemoryView:
        """The graph displaying a monitor shows: one widget, however often it is displayed.

        Re-running ``%hw memory`` shows the same widget again, so the kernel keeps updating one graph rather
        than one per run.
        """
        with LOCK:
            view = _shared.get("view")
            if view is None or view.closed or view.sampler is not self.sampler:
                view = _shared["view"] = MemoryView(self.sampler, self.log)
            return view

    def __repr__(self) -> str:
        return self.text()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        bundle: dict[str, Any] = {}
        if in_kernel():
            bundle.update(self.shared_view().box._repr_mimebundle_() or {})
        bundle["text/plain"] = self.text()
        return bundle


def monitor(interval: float = 0.5, window: float = 600.0) -> Monitor:
    """Start this kernel's memory sampler (or retune it) and return its live graph. ``%hw memory`` in words.

    ``interval``: seconds between samples; ``window``: seconds of history kept. One thread samples for every
    graph; ``mon.stop()`` or ``%hw memory --stop`` stops it, and so does closing the last graph.
    """
    sampler = process.sampler()
    sampler.start(interval, window)
    return Monitor(sampler, process.cells())


def stop() -> bool:
    """Stop this kernel's sampler if it exists; whether it was running."""
    sampler = process.existing()
    if sampler is None:
        return False
    running = bool(sampler.running)
    sampler.stop()
    return running


def views() -> list[MemoryView]:
    """The open views."""
    with LOCK:
        return list(_views)


def close_all() -> None:
    """Close every graph of this kernel, which stops the sampler (``%unload_ext nbhw``)."""
    with LOCK:
        _shared.clear()
    for view in views():
        view.close()  # outside the lock: the last one joins the sampler thread
