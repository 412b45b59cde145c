"""Faults at the boundary: every view says what is missing and keeps working.

NVML missing, NVML failing to start, NVML failing on one GPU, a GPU vanishing between samples (and coming back),
torch's memory functions raising, psutil refused this process's memory or the machine's. For each: the devices
view (text and HTML), the report (text and schema-valid JSON), the memory view (text and the live graph), and the
panel's tabs (Devices, Attention, Load) complete, name what is missing, and still show everything else.
(tests/core/hardware/test_backends.py checks the backend rows themselves for the NVML faults.)
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import numpy as np
import psutil
import pytest
import torch

from nbhw.core import memory
from nbhw.core.hardware.detect import detect
from nbhw.core.hardware.report import SCHEMA_PATH, report
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan.load_form import Form
from nbhw.ui import memory as memory_ui
from nbhw.ui.attention import advice_html
from nbhw.ui.devices import devices_html
from nbhw.ui.load import parts
from nbhw.ui.worker import last
from tests.support import fakes
from tests.support.fakes import GIB, FakeGpu, FakeHardware
from tests.support.memcomm import open_widgets


@dataclass
class Fault:
    """One fault, and what each view must say about it."""

    apply: Callable[[FakeHardware, pytest.MonkeyPatch], None]
    devices: str  # in the devices view (text and HTML) and the panel's Devices tab
    report: str  # in the report's text
    memory: str  # among the memory view's errors ("" when memory is not affected)
    still: tuple[str, ...]  # memory traces that must keep their values


def nvml_missing(hw: FakeHardware, mp: pytest.MonkeyPatch) -> None:
    hw.no_nvml_library()
    mp.setattr(torch.version, "cuda", "12.8")


def nvml_init_fails(hw: FakeHardware, mp: pytest.MonkeyPatch) -> None:
    hw.nvidia(FakeGpu(), init_error=fakes.NVMLError_DriverNotLoaded)


def one_gpu_fails(hw: FakeHardware, mp: pytest.MonkeyPatch) -> None:
    hw.nvidia(FakeGpu(name="good"), FakeGpu(name="bad", fail=True))


def torch_memory_raises(hw: FakeHardware, mp: pytest.MonkeyPatch) -> None:
    dev = hw.plugin("npu", "torch_npu", FakeGpu(name="Ascend 910B", total=64 * GIB))

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("npu device error 507899")

    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "reset_peak_memory_stats",
                 "mem_get_info", "get_device_properties"):  # fmt: skip
        mp.setattr(dev, name, boom)


def rss_denied(hw: FakeHardware, mp: pytest.MonkeyPatch) -> None:
    def deny(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise psutil.AccessDenied(pid=os.getpid())

    mp.setattr(psutil.Process, "memory_info", deny)


def meminfo_denied(hw: FakeHardware, mp: pytest.MonkeyPatch) -> None:
    def deny(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", "/proc/meminfo")

    mp.setattr(psutil, "virtual_memory", deny)


FAULTS = {
    "nvml missing": Fault(nvml_missing, "libnvidia-ml.so.1", "libnvidia-ml.so.1", "", ("host rss", "host available")),
    "nvml init fails": Fault(
        nvml_init_fails, "driver is not loaded", "driver is not loaded", "", ("host rss", "host available")
    ),
    "one gpu fails": Fault(
        one_gpu_fails,
        "GPU 1 did not answer: GPU is lost",
        "GPU 1 did not answer: GPU is lost",
        "cuda:1 (NVML): NVMLError: GPU is lost",
        ("host rss", "cuda:0 used", "cuda:1 allocated"),
    ),
    "torch memory raises": Fault(
        torch_memory_raises,
        "torch.npu.get_device_properties(0) failed: RuntimeError: npu device error 507899",
        "torch.npu.mem_get_info(0) failed",
        "npu:0 (torch): RuntimeError: npu device error 507899",
        ("host rss", "host available"),
    ),
    "rss denied": Fault(
        rss_denied, "", "", "host (this process, psutil): AccessDenied", ("host available", "host capacity")
    ),
    "meminfo denied": Fault(
        meminfo_denied,
        "psutil could not read the machine's memory: PermissionError",
        "RAM N/A",
        "host (machine, psutil): PermissionError",
        ("host rss",),
    ),
}


@pytest.fixture(params=list(FAULTS))
def fault(request: pytest.FixtureRequest, fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch) -> Fault:
    found = FAULTS[request.param]
    found.apply(fake_hw, monkeypatch)
    return found


def test_the_devices_view_and_the_report_say_what_is_missing_and_show_the_rest(fault: Fault) -> None:
    hw = detect()
    text, html = hw.text(), hw.html()
    assert fault.devices in text and fault.devices.replace("'", "&#x27;") in html
    assert hw.backend("cpu").usable and "Who picks what here" in text  # the rest is still there
    result = report()
    assert fault.report in result.text()
    data = json.loads(result.json())
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))


def test_the_memory_text_and_graph_name_the_missing_source_and_keep_the_others(fault: Fault) -> None:
    sampler = memory.Sampler(interval=0.5, window=10)
    widgets = open_widgets()
    view = memory_ui.MemoryView(sampler, memory.CellLog(sampler))
    try:
        for _ in range(3):
            sampler.tick()
        data = sampler.samples()
        for key in fault.still:
            assert (~np.isnan(data.values[key])).sum() == 3, key
        text = memory.text(sampler, memory.CellLog(sampler))
        if fault.memory:
            assert fault.memory in text and fault.memory in view.errors.value
            assert len(sampler.errors) == 1  # only what failed
        else:
            assert sampler.errors == {} and view.errors.value == ""
        assert view.figure is not None and len(view.figure.data) >= len(fault.still)
    finally:
        view.close()
    assert open_widgets() == widgets


def test_the_panel_tabs_say_what_is_missing_and_still_plan(fault: Fault) -> None:
    assert fault.devices.replace("'", "&#x27;") in devices_html()
    advice = advice_html("", "", "", offline=True)
    assert "nbhw-bad" not in advice.html and "eager" in advice.html
    result = last(parts(Form(str(tiny_model_path()), dtype="float32")))
    assert result.preview.error is None and "from_pretrained" in result.preview.code


# ---------------------------------------------------------------- a GPU vanishing while the sampler runs


@pytest.fixture
def running() -> Iterator[memory.Sampler]:
    sampler = memory.Sampler(interval=0.05, window=10)
    yield sampler
    sampler.stop()


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_gpu_vanishing_between_samples_is_shown_the_sampler_keeps_going_and_its_return_clears_it(
    fake_hw: FakeHardware, running: memory.Sampler
) -> None:
    nvml = fake_hw.nvidia(FakeGpu(name="first"), FakeGpu(name="second", used=3 * GIB))
    view = memory_ui.MemoryView(running, memory.CellLog(running))
    try:
        running.start()
        wait_for(lambda: running.ticks_taken >= 3)
        assert running.errors == {} and running.latest["cuda:1 used"] == 3 * GIB
        nvml.gpus[1].fail = True  # the GPU falls off the bus (Xid 79): NVML answers "GPU is lost"
        ticks = running.ticks_taken
        wait_for(lambda: running.ticks_taken >= ticks + 5)
        assert running.errors == {"cuda:1 (NVML)": "NVMLError: GPU is lost"}
        assert "cuda:1 used" not in running.latest and running.latest["cuda:0 used"] == GIB
        with memory_ui.LOCK:
            shown = view.errors.value
        assert "cuda:1 (NVML): NVMLError: GPU is lost" in shown
        assert "cuda:1 (NVML): NVMLError: GPU is lost" in memory.text(running, memory.CellLog(running))
        assert [t.name for t in threading.enumerate()].count(memory.THREAD_NAME) == 1
        nvml.gpus[1].fail = False  # back after a driver reset
        ticks = running.ticks_taken
        wait_for(lambda: running.ticks_taken >= ticks + 3)
        assert running.errors == {} and running.latest["cuda:1 used"] == 3 * GIB
        wait_for(lambda: view.errors.value == "")
    finally:
        view.close()
