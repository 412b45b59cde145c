"""The Memory tab's holders section without a browser: nothing walked until asked; Free does only what is ticked."""

from __future__ import annotations

from typing import Any

import pytest

import nbhw
import nbhw.session
from nbhw.core.memory import keeps_alive
from nbhw.ui.holders import HoldersView
from tests.support.cells import run
from tests.support.fake_allocator import FakeDevice, FakeMemory
from tests.support.memcomm import open_widgets


@pytest.fixture
def shell(fresh_ip: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    gpu = FakeDevice(limit=10**9)
    monkeypatch.setattr(nbhw.session, "device_memory", lambda: FakeMemory(gpu))
    fresh_ip.user_ns["gpu"] = gpu
    run(fresh_ip, "import torch\nwith gpu:\n    a = torch.zeros(1000)\n    b = torch.zeros(100)\nalso_a = a")
    return fresh_ip


@pytest.fixture
def walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    counted: list[int] = []
    original = keeps_alive.Walker.__init__

    def counting(self: keeps_alive.Walker, *args: Any) -> None:
        counted.append(1)
        original(self, *args)

    monkeypatch.setattr(keeps_alive.Walker, "__init__", counting)
    return counted


def test_the_section_walks_nothing_until_asked_then_frees_only_what_is_ticked(shell: Any, walks: list[int]) -> None:
    widgets = open_widgets()
    view = HoldersView()
    try:
        assert walks == [] and view.free.disabled and view.table.value == ""
        view.show.click()
        assert walks == [1]
        assert "a + also_a" in view.table.value and "<td>b</td>" in view.table.value
        assert list(view.variables) == ["a", "also_a", "b"]  # largest first: what each one reaches
        view.variables["b"].value = True
        view.others["history"].value = True
        assert not view.free.disabled
        assert view.chosen() == {"names": ("b",), "history": True, "traceback": False, "cache": False}
        view.free.click()
        assert view.freed is not None
        [cpu] = view.freed.devices
        assert (cpu.expected, cpu.measured, cpu.how) == (400, 400, "allocator")
        assert "deleted b" in view.result.value and "came back" in view.result.value
        assert "b" not in shell.user_ns and "a" in shell.user_ns and "also_a" in shell.user_ns
        assert list(view.variables) == ["a", "also_a"]  # the holders afterwards, from the same free: no new walk
        assert not view.others["history"].value and view.free.disabled
    finally:
        view.close()
    assert open_widgets() == widgets


def test_a_mistake_is_a_message_in_the_section_and_nothing_is_deleted(shell: Any) -> None:
    view = HoldersView()
    try:
        view.refresh()
        view.variables["a"].value = True
        del shell.user_ns["a"]  # gone between showing and pressing Free
        view.free.click()
        assert "✗ unknown variable &#x27;a&#x27;" in view.result.value
        assert "also_a" in shell.user_ns and "b" in shell.user_ns
    finally:
        view.close()


def test_the_memory_tab_holds_the_section_below_the_graph(shell: Any, walks: list[int]) -> None:
    widgets = open_widgets()
    p = nbhw.panel(tab="Memory")
    try:
        p.widget  # noqa: B018 - the widgets are made on first use
        assert p.holders is not None and p.holders.box in p._memory_box.children
        assert list(p._memory_box.children).index(p.holders.box) == 1 and walks == []
    finally:
        p.close()
    assert p.holders.closed and open_widgets() == widgets
