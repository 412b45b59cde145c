"""The live memory view: widget messages recorded through a comm stand-in, bounded bytes per tick, one lock."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from nbhw.core import memory
from nbhw.ui import memory as ui
from tests.fakes import GIB
from tests.memcomm import Recorder, recording_comms
from tests.test_memory import Broken, Clock, FakeSource, Running

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


def test_bytes_per_tick_stay_flat_after_ten_times_the_window(rec: Recorder) -> None:
    host, gpu = Changing("host", kinds=("rss", "available", "capacity")), Changing()
    sampler = memory.Sampler(interval=0.5, window=30, sources=[host, gpu])
    ui.MemoryView(sampler, memory.CellLog(sampler))
    rec.drain()
    slots = sampler.slots
    sent = []
    for tick in range(10 * slots + 1):
        sampler.tick()
        _, nbytes, messages = rec.drain()
        sent.append(nbytes)
        # One plotly update per tick, no separate restyle/relayout messages.
        assert len(updates(messages, "_py2js_update")) == 1, tick
        assert not updates(messages, "_py2js_restyle") and not updates(messages, "_py2js_relayout")
        if tick == 10 * slots:
            (update,) = updates(messages, "_py2js_update")
            arrays = [y for y in update["style_data"]["y"] if isinstance(y, dict)]
            buffers = [b for _, bs in messages for b in bs]
            # The series travel as float32 binary buffers one window long (rss, available, allocated);
            # their x is x0 + dx, not an array. Capacity lines and peak markers are a few points each.
            assert len(arrays) == 3
            assert {y["dtype"] for y in arrays} == {"float32"} and {tuple(y["shape"]) for y in arrays} == {(slots,)}
            assert sorted(memoryview(b).nbytes for b in buffers) == [4 * slots] * 3
            xs = [x for x in update["style_data"]["x"] if x != "_undefined_"]
            assert all(len(x) <= 2 for x in xs)
    full = sent[slots - 1 : 2 * slots]
    late = sent[9 * slots :]
    assert max(late) <= max(full) + 16, (max(full), max(late))
    assert min(late) >= min(full) - 16
    # Before the window is full, less is sent; the window bounds it.
    assert sent[1] < sent[slots - 1]


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
    assert allocated.y.dtype == np.float32 and allocated.y.tolist() == [1.0, 5.0, 2.0]
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


def test_a_faulting_source_is_shown_once_and_the_rest_of_the_graph_continues(rec: Recorder) -> None:
    fake = Changing()
    sampler = memory.Sampler(interval=0.5, window=30, sources=[Broken(), fake])
    view = ui.MemoryView(sampler, memory.CellLog(sampler))
    for _ in range(4):
        sampler.tick()
    assert view.errors.value.count("GPU is lost") == 1 and "gpu9 (broken)" in view.errors.value
    names = [t.name for t in view.figure.data]
    assert len(view.figure.data[names.index("fake:0 allocated by torch (this process)")].y) == 4


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
