"""The live memory view: widget messages recorded through a comm stand-in, bounded bytes per tick, one lock."""

from __future__ import annotations

import gc
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pytest

from nbhw.core import memory
from nbhw.ui import memory as ui
from tests.support.fakes import GIB
from tests.support.memcomm import Recorder, counter_bytes, open_widgets, recording_comms
from tests.support.memory_sources import Broken, Clock, FakeSource, Running

MIB = 1024**2


class Changing(FakeSource):
    """A device whose every reading but its capacity grows each tick, so every tick has something to send."""

    def read(self) -> dict[str, int]:
        self.set(**{k: v + 3 * MIB if k != "capacity" else 16 * GIB for k, v in self.values.items()})
        return super().read()


@pytest.fixture
def rec() -> Iterator[Recorder]:
    with recording_comms() as recorder:
        yield recorder
    for view in ui.views():
        view.close()


def updates(messages: list[tuple[dict[str, Any], list[Any]]], name: str) -> list[Any]:
    return [d["state"][name] for d, _ in messages if d.get("method") == "update" and d["state"].get(name)]


class Cycling(FakeSource):
    """Every reading but capacity changes every tick, between 1 and 9 GiB so every figure prints at one width."""

    def __init__(self, device: str, kinds: tuple[str, ...]) -> None:
        super().__init__(device, kinds)
        self.n = 0

    def read(self) -> dict[str, int]:
        self.n += 1
        for i, kind in enumerate(self.kinds):
            self.values[kind] = 80 * GIB if kind == "capacity" else GIB + (self.n * 7 + i * 13) % 97 * 80 * MIB
        return super().read()


HOST = ("rss", "available", "capacity")
NVIDIA = ("allocated", "reserved", "used", "capacity")  # torch's two counters and NVML's used + total


def per_tick(rec: Recorder, gpus: int, marks: tuple[int, ...], ticks: Iterable[int] | None = None) -> dict[int, int]:
    """Bytes the graph sends at each mark (ticks), with the host and ``gpus`` NVIDIA-like devices all changing.

    ``ticks``: the sampler's tick numbers taken, each drawn (default: every one up to the last mark); the tick
    numbered n is the session's (n + 1)th, which is what the marks count. Less the digits of plotly's edit counters,
    the one thing that grows (a byte each at 10, 100, 1,000 ... edits).
    """
    sources = [Cycling("host", HOST)] + [Cycling(f"cuda:{i}", NVIDIA) for i in range(gpus)]
    sampler = Running(interval=0.5, window=600, sources=sources)  # the defaults: 1,200 samples a trace
    ui.MemoryView(sampler, memory.CellLog(sampler))
    rec.drain()
    sent = {}
    for number in range(max(marks)) if ticks is None else ticks:
        sampler.tick(number)
        tick = number + 1  # how many ticks the session has had
        _, nbytes, messages = rec.drain()
        assert len(updates(messages, "_py2js_update")) == 1, tick  # every tick changes: one plotly update each
        assert not updates(messages, "_py2js_restyle") and not updates(messages, "_py2js_relayout")
        if tick in marks:
            sent[tick] = nbytes - counter_bytes(messages)
        if tick == max(marks):
            (update,) = updates(messages, "_py2js_update")
            arrays = [y for y in update["style_data"]["y"] if isinstance(y, dict)]
            # Each changing series (rss, available; allocated, reserved, used per GPU) travels as one float32
            # buffer of the graph's fixed resolution, its x implied (x0 + dx); capacity lines and peak markers are
            # a few points each.
            assert len(arrays) == 2 + 3 * gpus
            assert {y["dtype"] for y in arrays} == {"float32"}
            assert {tuple(y["shape"]) for y in arrays} == {(ui.point_count(sampler.slots),)}
            assert ui.point_count(sampler.slots) <= ui.POINTS < sampler.slots
            assert all(len(x) <= 3 for x in update["style_data"]["x"] if x != "_undefined_")
    return sent


@pytest.mark.slow
def test_a_tick_sends_the_same_bytes_after_100_and_10000_ticks(rec: Recorder) -> None:
    # Ticks 1 to 1,200 fill the window, each drawn. Then the sampler wakes at tick 8,801 as its thread does after a
    # stall (schedule() skips the missed ticks; the ring makes them NaN) and draws the 1,200 ticks to 10,000: the window
    # is full of fresh samples again, the ring has wrapped eight times and its newest slot is elsewhere (399, not
    # 1,199). 2,400 drawn ticks, not 10,000: whatever a draw adds to the next draw's bytes shows between the first two
    # marks (1,100 draws apart) already, and the edit counters' digits, the one thing that grows, are counted out.
    ticks = [*range(0, 1_200), *range(8_800, 10_000)]
    sent = per_tick(rec, gpus=1, marks=(100, 1_200, 10_000), ticks=ticks)
    assert sent[100] == sent[1_200] == sent[10_000], sent


def test_a_tick_sends_at_most_4_kb_per_device(rec: Recorder) -> None:
    # The host row carries everything shared (the message, the status line); each GPU adds its own traces,
    # peak markers and status figures: measured as what one more GPU adds to a tick.
    host, one, two = (per_tick(rec, gpus, (50,))[50] for gpus in (0, 1, 2))
    assert host <= 4096, host
    assert two - one <= 4096 and one - host <= 4096, (host, one, two)
    # The first GPU also brings the devices row (its time axis); after that a device costs the same each.
    assert 0 <= (one - host) - (two - one) <= 128, (host, one, two)


def test_display_points_have_a_fixed_length_keep_peaks_and_end_at_the_newest_sample() -> None:
    slots = 1200  # the defaults: 600 s every 0.5 s
    count = ui.point_count(slots)
    assert count == ui.POINTS < slots
    for n in (0, 1, 7, count, count + 1, 700, slots):
        points = ui.display_points(np.arange(n, dtype=np.float32), slots)
        assert points.dtype == np.float32 and len(points) == count, n
        finite = points[~np.isnan(points)]
        if n:
            assert points[-1] == n - 1 and finite.min() == 0 and finite.max() == n - 1, n
        # Up to `count` samples, every sample is a point; beyond, at least half as many points as there are.
        assert len(finite) == n if n <= count else count // 2 < len(finite) <= count, n
        # What is drawn spans the samples: the spacing times the points that carry samples.
        per = ui.bucket_size(n, slots)
        drawn = np.flatnonzero(~np.isnan(points))
        if n > 1:
            span = (count - 1 - drawn[0]) * ui.point_spacing(n, slots, 0.5)
            assert (n - 1) * 0.5 - per * 0.5 <= span <= (n - 1) * 0.5 + per * 0.5, n
    # A one-sample spike and a one-sample dip anywhere in the window are drawn at their height, in time order.
    series = np.full(slots, 2.0, dtype=np.float32)
    series[123], series[124] = 9.0, -1.0
    points = ui.display_points(series, slots)
    assert points.max() == 9.0 and points.min() == -1.0
    assert int(np.argmax(points)) < int(np.argmin(points))
    # A short window is drawn sample by sample.
    assert ui.point_count(60) == 60 and ui.bucket_size(60, 60) == 1 and ui.point_spacing(60, 60, 0.5) == 0.5


def test_a_trace_whose_points_did_not_change_is_not_sent_again(rec: Recorder) -> None:
    steady, moving = FakeSource("cuda:0"), Changing("cuda:1")
    steady.set(allocated=GIB, capacity=16 * GIB)
    sampler = memory.Sampler(interval=0.5, window=30, sources=[steady, moving])
    view = ui.MemoryView(sampler, memory.CellLog(sampler))
    for _ in range(3):
        sampler.tick()
    rec.drain()
    sampler.tick()
    (update,) = updates(rec.drain()[2], "_py2js_update")
    names = [t.name for t in view.figure.data]
    ys = update["style_data"]["y"]
    # The window is full of the steady value from tick 61 on; before that its padding shrinks each tick.
    assert ys[names.index("cuda:1 allocated by torch (this process)")] != "_undefined_"
    for _ in range(sampler.slots):
        sampler.tick()
    rec.drain()
    sampler.tick()
    (update,) = updates(rec.drain()[2], "_py2js_update")
    assert update["style_data"]["y"][names.index("cuda:0 allocated by torch (this process)")] == "_undefined_"
    assert update["style_data"]["y"][names.index("cuda:1 allocated by torch (this process)")] != "_undefined_"
    # Its x0 still moves with the others, so the steady line ends at the newest sample too.
    assert update["style_data"]["x0"][names.index("cuda:0 allocated by torch (this process)")] != "_undefined_"


def test_ticks_that_change_nothing_send_nothing_until_the_periodic_refresh(rec: Recorder) -> None:
    steady = FakeSource()
    steady.set(allocated=GIB, capacity=4 * GIB)
    sampler = memory.Sampler(interval=0.5, window=30, sources=[steady])
    clock = Clock()
    view = ui.MemoryView(sampler, memory.CellLog(sampler), clock=clock, refresh=2.0)
    sampler.tick()
    rec.drain()
    frames = view.frames_sent
    for _ in range(3):
        clock.now += 0.5
        sampler.tick()
        assert rec.drain()[:2] == (0, 0)
    clock.now += 0.6  # 2.1 s since the last frame: the time axis moves on
    sampler.tick()
    assert len(updates(rec.drain()[2], "_py2js_update")) == 1
    steady.set(allocated=2 * GIB)  # a real change is sent at once
    clock.now += 0.5
    sampler.tick()
    assert len(updates(rec.drain()[2], "_py2js_update")) == 1
    assert view.frames_sent == frames + 2 and view.ticks_seen == 6


def test_the_graph_has_a_trace_per_device_and_kind_capacity_lines_and_peak_markers(rec: Recorder) -> None:
    host = FakeSource("host", kinds=("rss", "available", "capacity"))
    gpu = FakeSource("cuda:0", kinds=("allocated", "reserved", "used", "capacity"))
    sampler = memory.Sampler(interval=0.5, window=30, sources=[host, gpu])
    view = ui.MemoryView(sampler, memory.CellLog(sampler))
    for alloc in (1, 5, 2):
        host.set(rss=alloc * GIB // 2, available=10 * GIB, capacity=32 * GIB)
        gpu.set(allocated=alloc * GIB, reserved=(alloc + 1) * GIB, used=(alloc + 3) * GIB, capacity=80 * GIB)
        sampler.tick()
    fig = view.figure
    names = [t.name for t in fig.data]
    assert names[:7] == [t.label for t in sampler.traces]
    assert names[7:] == ["peak", "peak"]  # one peak-marker trace per row: host, devices
    allocated = fig.data[names.index("cuda:0 allocated by torch (this process)")]
    # The whole window (60 samples) from the first tick: NaN where nothing was sampled yet.
    assert allocated.y.dtype == np.float32 and len(allocated.y) == sampler.slots == 60
    assert allocated.y[-3:].tolist() == [1.0, 5.0, 2.0] and np.isnan(allocated.y[:-3]).all()
    assert allocated.dx == 500 and allocated.yaxis == "y3"  # the devices row
    # The machine's memory is on the host row's right axis, this kernel's RSS on its left.
    assert fig.data[names.index("host available (machine)")].yaxis == "y2"
    assert fig.data[names.index("host RSS (this process)")].yaxis == "y"
    capacity = fig.data[names.index("cuda:0 capacity")]
    assert list(capacity.y) == [80.0, 80.0] and "80.000 GiB (81,920.0 MiB)" in capacity.hovertemplate
    device_peaks = fig.data[8]
    assert list(device_peaks.y) == [5.0, 6.0, 8.0]
    assert device_peaks.hovertext[0].startswith(
        "peak cuda:0 allocated by torch (this process): 5.000 GiB (5,120.0 MiB)"
    )
    assert fig.layout.xaxis.type == "date"


def test_the_view_is_sized_explicitly_and_carries_stable_css_classes(rec: Recorder) -> None:
    sampler = memory.Sampler(interval=0.5, window=30, sources=[FakeSource("host", kinds=("rss",))])
    view = ui.MemoryView(sampler, memory.CellLog(sampler))
    assert (view.figure.layout.width, view.figure.layout.height) == (ui.WIDTH, ui.ROW_HEIGHT + 140)
    assert view.figure.layout.autosize is False
    assert "nbhw-memory" in view.box._dom_classes and "nbhw-memory-graph" in view.figure._dom_classes
    assert "nbhw-memory-status" in view.status._dom_classes and "nbhw-memory-cells" in view.table._dom_classes
    assert view.box.children[3] is view.figure


def test_stopping_makes_every_view_say_stopped(rec: Recorder) -> None:
    sampler = memory.Sampler(interval=0.05, window=5, sources=[FakeSource()])
    log = memory.CellLog(sampler)
    a, b = ui.MemoryView(sampler, log), ui.MemoryView(sampler, log)
    sampler.start()
    deadline = time.monotonic() + 5
    while sampler.ticks_taken < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    with ui.LOCK:
        assert 'data-state="running"' in a.status.value and "sampling every 0.05 s" in a.status.value
    sampler.stop()
    for view in (a, b):
        assert 'data-state="stopped"' in view.status.value and ">stopped<" in view.status.value


def test_a_stopped_graph_keeps_its_points_in_the_state_a_saved_notebook_keeps(rec: Recorder) -> None:
    # Ticks travel as plotly update messages, which a saved notebook's widget state (and the docs site) drop.
    source = Changing()
    sampler = memory.Sampler(interval=0.05, window=5, sources=[source])
    view = ui.MemoryView(sampler, memory.CellLog(sampler))
    sampler.start()
    deadline = time.monotonic() + 5
    while sampler.ticks_taken < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.stop()
    names = [t.name for t in view.figure.data]
    allocated = names.index("fake:0 allocated by torch (this process)")
    saved = view.figure.get_state()["_widget_data"][allocated]["y"]  # numpy arrays travel as binary buffers
    saved = np.frombuffer(saved["buffer"], dtype=saved["dtype"])
    drawn = view.figure.data[allocated].y
    assert np.count_nonzero(~np.isnan(drawn)) >= 3 and np.array_equal(saved, drawn, equal_nan=True)


def test_a_faulting_source_is_shown_once_and_the_rest_of_the_graph_continues(rec: Recorder) -> None:
    fake = Changing()
    sampler = memory.Sampler(interval=0.5, window=30, sources=[Broken(), fake])
    view = ui.MemoryView(sampler, memory.CellLog(sampler))
    for _ in range(4):
        sampler.tick()
    assert view.errors.value.count("GPU is lost") == 1 and "gpu9 (broken)" in view.errors.value
    names = [t.name for t in view.figure.data]
    drawn = view.figure.data[names.index("fake:0 allocated by torch (this process)")].y
    assert np.count_nonzero(~np.isnan(drawn)) == 4


def test_cells_show_as_markers_on_the_graph_and_in_the_table(rec: Recorder) -> None:
    gpu = FakeSource("cuda:0", peaks=True)
    sampler = Running(interval=0.5, window=30, sources=[gpu])
    log = memory.CellLog(sampler)
    view = ui.MemoryView(sampler, log)
    sampler.tick()
    log.begin("a", "model = AutoModel.from_pretrained(path)")
    gpu.set(allocated=3 * GIB)
    sampler.tick()
    assert len(view.figure.layout.shapes) == 1  # the running cell
    log.end("a", 12, True)
    log.begin("b", "x = 1")
    log.end("b", 13, True)
    sampler.tick()
    shapes, labels = view.figure.layout.shapes, [a.text for a in view.figure.layout.annotations if a.name == "cell"]
    assert len(shapes) == 2 and labels == ["[12]", "[13]"]
    hover = next(a.hovertext for a in view.figure.layout.annotations if a.text == "[12]")
    assert "from_pretrained" in hover and "delta +3.000 GiB" in hover
    table = view.table.value
    assert "Cells that used the most memory" in table and "nbhw-memory-table" in table
    assert table.index("[12]") < table.index("[13]") and "+3.000 GiB" in table


def test_two_graphs_share_one_sampler_thread_and_closing_the_last_stops_it(rec: Recorder) -> None:
    mon = ui.monitor(interval=0.05, window=5)
    one, two = mon.view(), ui.monitor(interval=0.05, window=5).view()
    assert one.sampler is two.sampler is memory.sampler()
    assert [t.name for t in threading.enumerate()].count(memory.THREAD_NAME) == 1
    one.close()
    assert mon.running
    two.close()
    assert not mon.running and not [t for t in threading.enumerate() if t.name == memory.THREAD_NAME]
    assert one.figure.comm is None and two.box.comm is None


def test_closing_a_graph_closes_every_widget_it_opened_layouts_and_styles_too(rec: Recorder) -> None:
    before = open_widgets()
    view = ui.monitor(interval=0.05, window=5).view()
    ui.monitor(interval=0.1, window=5)  # a new interval: the figure is rebuilt, the old one closed
    assert open_widgets() > before
    view.close()
    assert open_widgets() == before


def test_a_closed_graph_is_freed_with_its_figure() -> None:
    # Without the recording comms: they keep every widget they ever opened.
    view = ui.monitor(interval=0.05, window=5).view()
    refs = [weakref.ref(view), weakref.ref(view.figure), weakref.ref(view.box)]
    view.close()
    del view
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_closing_the_box_closes_the_view(rec: Recorder) -> None:
    mon = ui.monitor(interval=0.05, window=5)
    view = mon.view()
    view.box.close()
    assert view.closed and view not in ui.views() and not mon.running


def test_browser_messages_wait_for_the_lock_the_sampler_thread_holds(rec: Recorder) -> None:
    sampler = memory.Sampler(interval=0.5, window=30, sources=[FakeSource()])
    view = ui.MemoryView(sampler, memory.CellLog(sampler))
    done = threading.Event()
    msg = {"content": {"data": {"method": "update", "state": {"_js2py_relayout": None}, "buffer_paths": []}}}

    def from_browser() -> None:
        view.figure._handle_msg(msg)
        done.set()

    with ui.LOCK:
        worker = threading.Thread(target=from_browser)
        worker.start()
        assert not done.wait(0.3)
    assert done.wait(5)
    worker.join()


def test_outside_a_kernel_a_monitor_displays_as_text_and_makes_no_widgets(rec: Recorder) -> None:
    mon = ui.monitor(interval=0.05, window=5)
    try:
        bundle = mon._repr_mimebundle_()
        assert list(bundle) == ["text/plain"] and "nbhw memory: sampling every 0.05 s" in bundle["text/plain"]
        assert not rec.comms()
        assert isinstance(mon.samples, memory.Samples) and isinstance(mon.cells, list)
    finally:
        mon.stop()
    assert "nbhw memory: stopped" in repr(mon)


def test_displaying_again_shows_the_same_widget_instead_of_adding_work(
    rec: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ui, "in_kernel", lambda: True)
    mon = ui.monitor(interval=0.05, window=5)
    first = mon._repr_mimebundle_()["application/vnd.jupyter.widget-view+json"]["model_id"]
    again = ui.monitor(interval=0.05, window=5)._repr_mimebundle_()
    assert again["application/vnd.jupyter.widget-view+json"]["model_id"] == first
    assert len(ui.views()) == 1 and "nbhw memory: sampling" in again["text/plain"]
    ui.views()[0].close()
    assert not mon.running  # it was the last view
    mon.start()
    fresh = mon._repr_mimebundle_()["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert fresh != first and len(ui.views()) == 1
