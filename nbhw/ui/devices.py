"""The Devices tab: nbhw's devices view (backends, devices, who picks what), read in the background."""

from __future__ import annotations

from typing import Any

import ipywidgets as w

from nbhw.core import render
from nbhw.core.hardware.detect import detect
from nbhw.ui.tree import close_tree
from nbhw.ui.worker import Worker, unexpected

WAITING = "<span class='nbhw-note'>detecting…</span>"


def devices_html() -> str:
    """The devices view as HTML, read now."""
    try:
        return detect().html()
    except Exception as exc:  # detection reports failures as values; anything else is a bug to show, not hide
        return f'<span class="nbhw-bad">✗ {render.esc(unexpected(exc))}</span>'


class DevicesView:
    """The devices view and a Refresh button."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.closed = False
        self._key = ("devices", id(self))
        self.html = w.HTML(WAITING)
        self.button = w.Button(description="Refresh", icon="refresh", tooltip="detect again")
        self.button.on_click(lambda _: self.refresh())
        self.box = w.VBox([self.button, self.html])
        self.box.add_class("nbhw-devices-tab")
        self.refresh()

    def refresh(self) -> int:
        """Detect again in the background."""
        return self.worker.submit(self._key, devices_html, self._apply, delay=0)

    def _apply(self, html: str) -> None:
        if not self.closed:
            self.html.value = html

    def widgets(self) -> list[Any]:
        """Every widget this view owns."""
        return [self.button, self.html, self.box]

    def close(self) -> None:
        """Close the widgets, their layouts and styles."""
        self.closed = True
        close_tree(*self.widgets())
