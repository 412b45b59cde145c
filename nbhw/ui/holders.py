"""The Memory tab's holders section: what keeps tensors alive, and a Free button that does only what was chosen.

Nothing is walked until "Show what holds memory" is pressed. The choices are the variables that hold tensors, the
output history, the last error's traceback and the allocator's cache; "Free chosen" runs ``nbhw.free`` with exactly
those (then ``gc.collect()``) and shows, per device, the bytes that came back, measured, against what was expected,
with the holders as they are afterwards.
"""

from __future__ import annotations

from typing import Any

import ipywidgets as w
from IPython import get_ipython

from nbhw.core.errors import UserError
from nbhw.core.memory.freeing import Freed
from nbhw.core.memory.holders import Holders
from nbhw.core.render import esc, size
from nbhw.session import shell_free, shell_holders
from nbhw.ui.tree import close_tree

BOX_CLASS = "nbhw-holders"
INTRO = (
    "<b>What holds memory</b> <span class='nbhw-note'>— the live tensors grouped by what keeps them alive: "
    "variables, the output history, the last error's traceback, autograd graphs</span>"
)
# Choice -> the keyword of nbhw.free it sets; variables are added per report.
OTHER_CHOICES = {
    "history": "output history (Out, _, __, ___)",
    "traceback": "the last error's traceback",
    "cache": "the allocator's cache (empty_cache)",
}


class HoldersView:
    """The holders table, one checkbox per thing that can be freed, and the Free button."""

    def __init__(self) -> None:
        self.closed = False
        self.report: Holders | None = None
        self.freed: Freed | None = None
        self.intro = w.HTML(INTRO)
        self.show = w.Button(description="Show what holds memory", icon="search", layout=w.Layout(width="auto"))
        self.show.add_class("nbhw-holders-show")
        self.show.on_click(lambda _: self.refresh())
        self.table = w.HTML()
        self.table.add_class("nbhw-holders-table")
        self.variables: dict[str, Any] = {}
        self.others = {key: _checkbox(label, f"nbhw-holders-{key}") for key, label in OTHER_CHOICES.items()}
        for box in self.others.values():
            box.observe(self._enable, names="value")
        self.label = w.HTML("<span class='nbhw-note'>free:</span>")
        self.choices = w.VBox()
        self.free = w.Button(description="Free chosen", icon="trash", button_style="warning", disabled=True)
        self.free.add_class("nbhw-holders-free")
        self.free.on_click(lambda _: self.free_chosen())
        self.result = w.HTML()
        self.result.add_class("nbhw-holders-freed")
        self.box = w.VBox([self.intro, self.show, self.table, self.choices, self.free, self.result])
        self.box.add_class(BOX_CLASS)

    def refresh(self) -> Holders | None:
        """Walk now and show what keeps tensors alive."""
        shell = get_ipython()
        if shell is None or self.closed:
            return None
        self._show_report(shell_holders(shell))
        return self.report

    def chosen(self) -> dict[str, Any]:
        """The keywords of nbhw.free the ticked boxes stand for."""
        names = tuple(name for name, box in self.variables.items() if box.value)
        return {"names": names, **{key: bool(box.value) for key, box in self.others.items()}}

    def free_chosen(self) -> Freed | None:
        """Free exactly what is ticked; show what came back, and the holders afterwards."""
        shell = get_ipython()
        if shell is None or self.closed:
            return None
        try:
            self.freed = shell_free(shell, **self.chosen())
        except UserError as exc:
            self.result.value = f"<span class='nbhw-bad'>✗ {esc(exc)}</span>"
            return None
        for box in self.others.values():
            box.value = False
        self.result.value = self.freed.html()
        self._show_report(self.freed.after)
        return self.freed

    def _show_report(self, report: Holders) -> None:
        self.report = report
        self.table.value = report.html()
        names = {h.name: report.reached_from(h.label) for h in report.holders if h.kind == "variable" and h.name}
        old = list(self.variables.values())
        self.variables = {
            name: _checkbox(f"{name} ({size(nbytes)})", "nbhw-holders-name", name)
            for name, nbytes in sorted(names.items(), key=lambda item: -item[1])
        }
        for box in self.variables.values():
            box.observe(self._enable, names="value")
        self.choices.children = [self.label, *self.variables.values(), *self.others.values()]
        close_tree(*old)
        self._enable()

    def _enable(self, change: Any = None) -> None:
        self.free.disabled = not any(box.value for box in [*self.variables.values(), *self.others.values()])

    def close(self) -> None:
        """Close every widget of the section."""
        self.closed = True
        close_tree(self.box, self.label, *self.variables.values(), *self.others.values())


def _checkbox(label: str, css: str, name: str = "") -> Any:
    box = w.Checkbox(value=False, description=label, indent=False, layout=w.Layout(width="auto"))
    box.add_class(css)
    if name:
        box.add_class(f"nbhw-holders-name-{name}")
    return box
