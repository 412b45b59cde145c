"""The memory sampler without widgets: sources, one sample, ring buffer, schedule, thread, per-cell records."""

from __future__ import annotations

import gc
import math
import mmap
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from nbhw.core import memory
from nbhw.core.errors import UserError
from tests.support.fakes import GIB, FakeGpu, FakeHardware
from tests.support.memory_sources import Broken, Clock, FakeSource, Running

MIB = 1024**2


@pytest.fixture
def stopped_samplers() -> Iterator[list[memory.Sampler]]:
    made: list[memory.Sampler] = []
    yield made
    for s in made:
        s.stop()


# ---------------------------------------------------------------- one sample


def test_one_sample_reads_every_source_and_a_failing_one_only_loses_its_own_values() -> None:
    a, b = FakeSource("fake:0"), FakeSource("fake:1", kinds=("used", "capacity"))
    a.set(allocated=5 * MIB, capacity=GIB)
    b.set(used=7 * MIB, capacity=2 * GIB)
    sample = memory.take_sample([a, Broken(), b])
    assert sample.values == {
        "fake:0 allocated": 5 * MIB,
        "fake:0 capacity": GIB,
        "fake:1 used": 7 * MIB,
        "fake:1 capacity": 2 * GIB,
    }
    assert sample.errors == {"gpu9 (broken)": "RuntimeError: GPU is lost"}


def test_host_source_reports_this_process_rss_and_the_machines_available_memory() -> None:
    import psutil

    values = {**memory.HostSource().read(), **memory.MachineSource().read()}
    assert 0 < values["rss"] < values["capacity"] == psutil.virtual_memory().total
    assert 0 < values["available"] <= values["capacity"]
    before = values["rss"]
    # Fresh pages of its own (an anonymous mapping, written): memory the C heap freed earlier can't stand in for it.
    block = mmap.mmap(-1, 64 * MIB)
    block.write(b"x" * (64 * MIB))
    assert memory.HostSource().read()["rss"] - before > 50 * MIB
    block.close()


@pytest.mark.skipif(sys.platform != "linux", reason="the peak RSS a process can restart (VmHWM) is Linux's")
def test_host_source_keeps_the_kernels_peak_of_a_block_freed_before_anyone_sampled_it() -> None:
    source = memory.HostSource()
    assert source.reset_peak() and source.peak_from == "kernel"
    start = source.read_primary()
    block = mmap.mmap(-1, 96 * MIB)
    block.write(b"x" * (96 * MIB))
    block.close()
    peak = source.peak()
    assert peak is not None and peak - start > 90 * MIB
    assert source.read_primary() - start < 40 * MIB
    # Restarted, the peak is where the process is now.
    assert source.reset_peak() and source.peak() - source.read_primary() < 20 * MIB  # type: ignore[operator]


# ---------------------------------------------------------------- ring buffer


def test_ring_keeps_exactly_the_last_window_of_ticks_as_float32() -> None:
    ring = memory.Ring(5)
    ring.add("a")
    for tick in range(12):
        ring.put(tick, {"a": tick * 10})
    assert len(ring) == 5
    assert ring.ticks().tolist() == [7, 8, 9, 10, 11]
    out = ring.ordered("a")
    assert out.dtype == np.float32 and out.tolist() == [70, 80, 90, 100, 110]
    assert ring.series["a"].shape == (5,)
    assert ring.ordered("a", start_tick=10).tolist() == [100, 110]


def test_ring_marks_skipped_ticks_and_missing_values_as_nan() -> None:
    ring = memory.Ring(6)
    ring.add("a")
    ring.add("b")
    ring.put(0, {"a": 1, "b": 2})
    ring.put(3, {"a": 4})
    a, b = ring.ordered("a"), ring.ordered("b")
    assert a[0] == 1 and np.isnan(a[1:3]).all() and a[3] == 4
    assert b[0] == 2 and np.isnan(b[1:]).all()
    # A gap longer than the ring leaves only the new tick.
    ring.put(100, {"a": 9})
    assert ring.ticks().tolist() == [95, 96, 97, 98, 99, 100]
    assert np.isnan(ring.ordered("a")[:-1]).all() and ring.ordered("a")[-1] == 9
    with pytest.raises(ValueError, match="not after"):
        ring.put(100, {"a": 1})


def test_ring_resized_keeps_the_newest_ticks() -> None:
    ring = memory.Ring(8)
    ring.add("a")
    for tick in range(20):
        ring.put(tick, {"a": tick})
    small = ring.resized(3)
    assert small.ticks().tolist() == [17, 18, 19] and small.ordered("a").tolist() == [17, 18, 19]
    big = small.resized(10)
    assert big.ordered("a").tolist() == [17, 18, 19]
    big.put(20, {"a": 20})
    assert big.ordered("a").tolist() == [17, 18, 19, 20]


# ---------------------------------------------------------------- schedule


def test_schedule_deadlines_stay_on_the_grid_however_long_each_tick_takes() -> None:
    clock = Clock(100.0)
    ticks = memory.schedule(100.0, 0.5, clock)
    deadlines = []
    for work in (0.0, 0.3, 0.1, 0.45, 0.2, 0.0, 0.49):
        tick, wait = next(ticks)
        clock.now += wait  # the thread sleeps until the deadline ...
        deadlines.append(clock.now)
        clock.now += work  # ... then the tick's own work takes time
        assert tick == len(deadlines) - 1
    # next += interval: tick k fires at start + k * interval, no matter how long the ticks before took.
    assert deadlines == pytest.approx([100.0 + 0.5 * k for k in range(7)])


def test_schedule_skips_missed_ticks_instead_of_running_them_in_a_burst() -> None:
    clock = Clock(0.0)
    ticks = memory.schedule(0.0, 1.0, clock)
    assert next(ticks) == (0, 0.0)
    clock.now = 3.4  # the process stalled for over three intervals
    tick, wait = next(ticks)
    assert tick == 3 and wait == 0.0
    tick, wait = next(ticks)
    assert tick == 4 and wait == pytest.approx(0.6)


def test_settings_are_validated_with_one_line_errors() -> None:
    assert memory.validate(0.5, 600) == 1200
    with pytest.raises(UserError, match=r"interval must be between 0.05 and 3600"):
        memory.validate(0.001, 10)
    with pytest.raises(UserError, match="window must be a positive"):
        memory.validate(0.5, math.inf)
    with pytest.raises(UserError, match="at most 20000"):
        memory.validate(0.05, 100_000)


# ---------------------------------------------------------------- sampler without a thread


def test_ticks_fill_samples_with_wall_clock_times_and_since_returns_only_newer_ones() -> None:
    fake = FakeSource()
    wall = Clock(5000.0)
    sampler = memory.Sampler(interval=0.5, window=2.0, sources=[fake], wall=wall)
    for i in range(6):
        fake.set(allocated=i * MIB)
        sampler.tick()
    data = sampler.samples()
    assert sampler.slots == 4 and len(data) == 4
    assert data.values["fake:0 allocated"].tolist() == [2 * MIB, 3 * MIB, 4 * MIB, 5 * MIB]
    assert data.times.tolist() == [5001.0, 5001.5, 5002.0, 5002.5]
    assert [t.key for t in data.traces] == ["fake:0 allocated", "fake:0 capacity"]
    newer = sampler.samples(since=5001.9)
    assert newer.times.tolist() == [5002.0, 5002.5]
    assert newer.values["fake:0 allocated"].tolist() == [4 * MIB, 5 * MIB]
    assert sampler.latest["fake:0 allocated"] == 5 * MIB
    plain = newer.to_dict()
    assert plain["values"]["fake:0 allocated"] == [4 * MIB, 5 * MIB] and plain["times"] == [5002.0, 5002.5]


def test_a_faulting_source_is_recorded_once_and_the_other_traces_continue() -> None:
    fake, broken = FakeSource(), Broken()
    sampler = memory.Sampler(interval=0.5, window=10, sources=[broken, fake])
    for i in range(5):
        fake.set(allocated=(i + 1) * MIB)
        sampler.tick()
    assert broken.calls == 5
    assert sampler.errors == {"gpu9 (broken)": "RuntimeError: GPU is lost"}
    data = sampler.samples()
    assert np.isnan(data.values["gpu9 used"]).all()
    assert data.values["fake:0 allocated"].tolist() == [MIB, 2 * MIB, 3 * MIB, 4 * MIB, 5 * MIB]
    assert "gpu9 used" not in sampler.latest


def test_subscribers_hear_every_tick_and_one_that_raises_does_not_stop_the_others() -> None:
    sampler = memory.Sampler(sources=[FakeSource()])
    heard: list[int] = []

    def bad(s: memory.Sampler) -> None:
        raise KeyError("boom")

    sampler.subscribe(bad)
    unsubscribe = sampler.subscribe(lambda s: heard.append(s.ticks_taken))
    sampler.tick()
    sampler.tick()
    unsubscribe()
    sampler.tick()
    assert heard == [1, 2]
    assert sampler.subscriber_errors[0] == "KeyError: 'boom'"


def test_a_new_window_keeps_history_and_a_new_interval_starts_a_new_one() -> None:
    fake = FakeSource()
    sampler = memory.Sampler(interval=0.5, window=5, sources=[fake])
    for i in range(10):
        fake.set(allocated=i)
        sampler.tick()
    sampler.configure(window=2)
    assert sampler.slots == 4 and sampler.samples().values["fake:0 allocated"].tolist() == [6, 7, 8, 9]
    sampler.configure(interval=1.0)
    assert sampler.interval == 1.0 and len(sampler.samples()) == 0


# ---------------------------------------------------------------- the thread


def threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == memory.THREAD_NAME]


def test_start_stop_restart_runs_one_named_daemon_thread(stopped_samplers: list[memory.Sampler]) -> None:
    fake = FakeSource()
    sampler = memory.Sampler(interval=0.05, window=5, sources=[fake])
    stopped_samplers.append(sampler)
    sampler.start()
    sampler.start()  # already running: still one thread
    (thread,) = threads()
    assert thread.daemon and sampler.running
    deadline = time.monotonic() + 5
    while fake.reads < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.reads >= 5
    sampler.stop()
    sampler.stop()  # idempotent
    assert not thread.is_alive() and not threads() and not sampler.running
    reads = fake.reads
    time.sleep(0.15)
    assert fake.reads == reads  # stopped means no more sampling
    sampler.start()
    deadline = time.monotonic() + 5
    while fake.reads < reads + 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert fake.reads >= reads + 3 and len(threads()) == 1
    sampler.stop()
    # The ticks stay on one grid across the restart; the pause shows as a gap (NaN), not as squeezed time.
    data = sampler.samples()
    assert np.isnan(data.values["fake:0 allocated"]).any()
    assert np.all(np.diff(data.ticks) == 1)


def test_the_thread_survives_a_faulting_source(stopped_samplers: list[memory.Sampler]) -> None:
    fake, broken = FakeSource(), Broken()
    sampler = memory.Sampler(interval=0.05, window=5, sources=[broken, fake])
    stopped_samplers.append(sampler)
    sampler.start()
    deadline = time.monotonic() + 5
    while fake.reads < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sampler.running and broken.calls >= 5 and list(sampler.errors) == ["gpu9 (broken)"]
    sampler.stop()


def test_a_sampler_dropped_while_running_ends_its_thread() -> None:
    sampler = memory.Sampler(interval=0.05, window=5, sources=[FakeSource()])
    sampler.start()
    (thread,) = threads()
    del sampler
    gc.collect()
    thread.join(2)
    assert not thread.is_alive()


def test_the_process_has_one_sampler_for_every_graph() -> None:
    assert memory.sampler() is memory.sampler()
    assert memory.cells().sampler is memory.sampler()


def test_stop_all_stops_every_sampler_of_the_process(stopped_samplers: list[memory.Sampler]) -> None:
    a = memory.Sampler(interval=0.05, window=5, sources=[FakeSource()]).start()
    b = memory.Sampler(interval=0.05, window=5, sources=[FakeSource()]).start()
    stopped_samplers += [a, b]
    assert len(threads()) == 2
    memory.stop_all()
    assert not a.running and not b.running and not threads()


# ---------------------------------------------------------------- per-cell records


def test_cells_record_delta_and_the_allocator_peak_reset_around_each_cell() -> None:
    gpu = FakeSource("fake:0", peaks=True)
    wall = Clock(100.0)
    sampler = Running(interval=0.5, window=60, sources=[gpu], wall=wall)
    log = memory.CellLog(sampler)
    gpu.set(allocated=10 * GIB)  # before the cell; the old peak must not count for it
    gpu.set(allocated=2 * GIB)
    log.begin("cell-1", "\n  x = torch.zeros(...)  \nmore")
    assert gpu.resets == 1
    gpu.set(allocated=6 * GIB)
    gpu.set(allocated=3 * GIB)
    wall.now = 101.0
    record = log.end("cell-1", execution_count=7, succeeded=True)
    assert record is not None and log.records[-1] is record
    assert record.execution_count == 7 and record.first_line == "x = torch.zeros(...)"
    assert (record.started, record.ended, record.succeeded) == (100.0, 101.0, True)
    fake = record.memory["fake:0"]
    assert (fake.start, fake.end, fake.peak, fake.peak_from) == (2 * GIB, 3 * GIB, 6 * GIB, "allocator")
    assert fake.delta == GIB and fake.used == 4 * GIB
    assert log.end("cell-1", 7, True) is None  # recorded once


def test_without_a_peak_counter_the_cell_peak_is_the_sampled_maximum() -> None:
    host = FakeSource("host", kinds=("rss", "available"))
    wall = Clock(1000.0)
    sampler = Running(interval=0.5, window=60, sources=[host], wall=wall)
    log = memory.CellLog(sampler)
    host.set(rss=GIB)
    for _ in range(2000):  # samples before the cell, one of them high, must not count
        sampler.tick()
    host.set(rss=9 * GIB)
    sampler.tick()
    host.set(rss=GIB)
    sampler.tick()
    wall.now = sampler.samples().times[-1] + 0.1
    log.begin(1, "a = make()")
    for rss in (2 * GIB, 5 * GIB, 3 * GIB):
        host.set(rss=rss)
        sampler.tick()
    wall.now = sampler.samples().times[-1] + 0.1
    record = log.end(1, 3, True)
    assert record is not None
    m = record.memory["host"]
    assert (m.start, m.end, m.peak, m.peak_from) == (GIB, 3 * GIB, 5 * GIB, "samples")


def test_cells_are_not_recorded_while_the_sampler_is_stopped() -> None:
    sampler = memory.Sampler(sources=[FakeSource()])
    log = memory.CellLog(sampler)
    log.begin(1, "x = 1")
    assert log.end(1, 1, True) is None and not log.records


def test_the_table_ranks_cells_by_the_memory_they_needed_on_any_device() -> None:
    host, gpu = FakeSource("host", kinds=("rss",)), FakeSource("fake:0", peaks=True)
    sampler = Running(sources=[host, gpu])
    log = memory.CellLog(sampler)
    for count, (rss, alloc) in enumerate([(MIB, 0), (0, 3 * GIB), (2 * GIB, 0)], start=1):
        log.begin(count, f"cell {count}")
        host.set(rss=host.values["rss"] + rss)
        gpu.set(allocated=gpu.values["allocated"] + alloc)
        log.end(count, count, True)
    rows = memory.cell_rows(log)
    assert [r[0] for r in rows] == ["[2]", "[3]", "[1]"]
    assert rows[0] == ["[2]", "cell 2", "fake:0", "+3.000 GiB", "3.000 GiB"]
    assert "Cells that used the most memory" in memory.text(sampler, log)


# ---------------------------------------------------------------- real devices, faked at the boundary


def test_discovery_without_torch_imported_does_not_import_it() -> None:
    code = (
        "import sys; from nbhw.core import memory; s = memory.Sampler(); s.tick(); "
        "print(sorted(s.latest)); assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "'host available', 'host capacity', 'host rss'" in proc.stdout


def test_a_plugin_device_gets_allocator_traces_and_its_peak_counter_is_used_per_cell(fake_hw: FakeHardware) -> None:
    npu = fake_hw.plugin("npu", "torch_npu", FakeGpu(name="Ascend 910B", total=64 * GIB))
    assert npu is not None
    sampler = Running(interval=0.5, window=60)
    keys = [t.key for t in sampler.traces]
    assert keys[:3] == ["host rss", "host available", "host capacity"]
    assert keys[3:] == ["npu:0 allocated", "npu:0 reserved", "npu:0 capacity"]
    npu.allocated[0], npu.reserved[0] = 3 * GIB, 4 * GIB
    sampler.tick()
    assert sampler.latest["npu:0 allocated"] == 3 * GIB and sampler.latest["npu:0 capacity"] == 64 * GIB
    log = memory.CellLog(sampler)
    npu.peak[0] = 20 * GIB  # a peak from before the cell
    log.begin("c", "model.to('npu')")
    assert npu.peak[0] == 3 * GIB  # reset_peak_memory_stats ran
    npu.allocated[0] = 9 * GIB
    npu.peak[0] = 12 * GIB
    npu.allocated[0] = 5 * GIB
    record = log.end("c", 4, True)
    assert record is not None
    m = record.memory["npu:0"]
    assert (m.start, m.end, m.peak, m.peak_from) == (3 * GIB, 5 * GIB, 12 * GIB, "allocator")


def test_nvidia_gpus_show_driver_memory_and_no_cuda_counters_before_torch_initialises_cuda(
    fake_hw: FakeHardware,
) -> None:
    import torch

    gpus = fake_hw.nvidia(FakeGpu(total=80 * GIB, used=30 * GIB), FakeGpu(name="NVIDIA H100", used=GIB, cc=(9, 0)))
    sampler = Running(interval=0.5, window=60)
    keys = [t.key for t in sampler.traces]
    for n in (0, 1):
        assert f"cuda:{n} allocated" in keys and f"cuda:{n} used" in keys and f"cuda:{n} capacity" in keys
    assert not torch.cuda.is_initialized()
    sampler.tick()
    # CUDA numbers the H100 (newer) first; the A100, nvidia-smi's GPU 0, is cuda:1. Another process holds
    # 30 GiB there: the driver's view shows it, torch's allocator in this process holds nothing.
    assert sampler.latest["cuda:1 used"] == 30 * GIB and sampler.latest["cuda:1 allocated"] == 0
    assert sampler.latest["cuda:1 capacity"] == 80 * GIB and sampler.latest["cuda:0 used"] == GIB
    assert not torch.cuda.is_initialized()  # reading never created a CUDA context
    gpus.gpus[1].fail = True
    sampler.tick()
    sampler.tick()
    assert list(sampler.errors) == ["cuda:0 (NVML)"] and "GPU is lost" in sampler.errors["cuda:0 (NVML)"]
    assert sampler.latest["cuda:1 used"] == 30 * GIB and sampler.latest["host rss"] > 0


def test_without_torch_nvml_gpus_are_named_by_their_nvidia_smi_index(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_hw.nvidia(FakeGpu(used=2 * GIB))
    monkeypatch.delitem(sys.modules, "torch")
    sampler = memory.Sampler(interval=0.5, window=60)
    assert [t.key for t in sampler.traces][3:] == ["gpu0 used", "gpu0 capacity"]
    sampler.tick()
    assert sampler.latest["gpu0 used"] == 2 * GIB


def test_importing_torch_later_adds_the_device_traces_after_the_cell(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = sys.modules["torch"]
    fake_hw.plugin("npu", "torch_npu", FakeGpu())
    monkeypatch.delitem(sys.modules, "torch")
    sampler = Running(interval=0.5, window=60)
    heard: list[int] = []
    sampler.subscribe(lambda s: heard.append(len(s.traces)))
    assert [t.device for t in sampler.traces] == ["host"] * 3
    assert sampler.refresh_sources() is False
    monkeypatch.setitem(sys.modules, "torch", torch)  # the user's cell imported torch
    assert sampler.refresh_sources() is True
    assert "npu:0 allocated" in [t.key for t in sampler.traces] and heard == [6]
    assert sampler.refresh_sources() is False  # discovered once


def test_cuda_counters_are_read_once_torch_has_initialised_cuda(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    fake_hw.nvidia(FakeGpu(total=80 * GIB, used=12 * GIB))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i=0: 9 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i=0: 10 * GIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: FakeProps())
    sampler = Running(interval=0.5, window=60)
    sampler.tick()
    assert (sampler.latest["cuda:0 allocated"], sampler.latest["cuda:0 reserved"]) == (9 * GIB, 10 * GIB)
    assert sampler.latest["cuda:0 used"] == 12 * GIB


class FakeProps:
    """torch.cuda.get_device_properties for the GPU NVML calls GPU 0 (the UUID the fake NVML gives it)."""

    uuid = "GPU-00000000-aaaa-bbbb-cccc-000000000000"
