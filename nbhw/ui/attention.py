"""The Attention tab: the advisor's table for a model, device and dtype chosen with controls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ipywidgets as w

from nbhw.core import render
from nbhw.core.advice.attention import advise
from nbhw.core.advice.attention_rules import device_types
from nbhw.core.dtypes import AUTO, OFFERED
from nbhw.core.errors import UserError
from nbhw.core.hardware.detect import detect
from nbhw.ui.tree import close_tree
from nbhw.ui.worker import LOCK, Worker, locked, unexpected

BEST = ""  # the device dropdown's "best usable device here" (the advisor's own default)
DTYPE_OPTIONS = [("advised", ""), *((d, d) for d in OFFERED if d != AUTO), (AUTO, AUTO)]


@dataclass
class AdviceResult:
    """The device options and the advice's HTML (or the message of a mistake)."""

    devices: list[tuple[str, str]]
    html: str


def device_options() -> list[tuple[str, str]]:
    """The best device, each usable device, then the device types the advisor can plan for that are not here."""
    here = [d.device for d in detect().devices]
    kinds = {d.split(":")[0] for d in here}
    options = [("best here", BEST), *((d, d) for d in here)]
    options += [(f"{t} (not here)", t) for t in device_types() if t not in kinds]
    return options


def advice_html(model: str, device: str, dtype: str, offline: bool) -> AdviceResult:
    """The advice for the controls' values, computed off the kernel's thread."""
    try:
        devices = device_options()
        advice = advise(model.strip() or None, device=device or None, dtype=dtype or None, offline=offline)
    except UserError as exc:
        return AdviceResult(device_options(), f'<span class="nbhw-bad">✗ {render.esc(str(exc))}</span>')
    except Exception as exc:
        return AdviceResult([("best here", BEST)], f'<span class="nbhw-bad">✗ {render.esc(unexpected(exc))}</span>')
    return AdviceResult(devices, advice.html())


class AttentionView:
    """Model, device and dtype controls over the advisor's table."""

    def __init__(self, worker: Worker, model: str, offline: bool = False, models: list[str] | None = None) -> None:
        self.worker = worker
        self.closed = False
        self._syncing = False
        self._key = ("attention", id(self))
        style = {"description_width": "80px"}
        self.model = locked(w.Combobox)(
            value=model, options=list(models or []), description="model", ensure_option=False,
            continuous_update=False, style=style, layout=w.Layout(width="560px"),
        )  # fmt: skip
        self.device = locked(w.Dropdown)(options=[("best here", BEST)], value=BEST, description="device", style=style)
        self.dtype = locked(w.Dropdown)(options=DTYPE_OPTIONS, value="", description="dtype", style=style)
        self.offline = offline
        self.html = w.HTML("<span class='nbhw-note'>asking the advisor…</span>")
        self.controls = w.HBox([self.model, self.device, self.dtype], layout=w.Layout(flex_flow="row wrap"))
        self.box = w.VBox([self.controls, self.html])
        self.box.add_class("nbhw-attention-tab")
        for control in (self.model, self.device, self.dtype):
            control.observe(self._changed, names="value")
        self.refresh()

    def _changed(self, change: Any = None) -> None:
        with LOCK:
            if not self._syncing and not self.closed:
                self.refresh()

    def refresh(self) -> int:
        """Ask the advisor again in the background."""
        args = (str(self.model.value), str(self.device.value), str(self.dtype.value), self.offline)
        return self.worker.submit(self._key, lambda: advice_html(*args), self._apply)

    def _apply(self, result: AdviceResult) -> None:
        if self.closed:
            return
        self._syncing = True
        try:
            if list(self.device.options) != result.devices:
                value = self.device.value
                with self.device.hold_sync():
                    self.device.options = result.devices
                    self.device.value = value if value in [v for _, v in result.devices] else BEST
            self.html.value = result.html
        finally:
            self._syncing = False

    def widgets(self) -> list[Any]:
        """Every widget this view owns."""
        return [self.model, self.device, self.dtype, self.html, self.controls, self.box]

    def close(self) -> None:
        """Close the widgets, their layouts and styles."""
        self.closed = True
        close_tree(*self.widgets())
