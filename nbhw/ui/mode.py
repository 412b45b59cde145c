"""A mode of the Load tab beside "Load / generate" (Train, Serve): one control per declared argument of its plan,
a message line, the code box with "Insert cell below" and "Copy", and the plan's report.

Every change submits one job to the panels' worker (at once, off the kernel's thread); a subclass says what the job
computes (:meth:`ModeView.parts`: the plan of a :class:`~nbhw.core.control_form.ControlsForm` and its HTML, a
generator that may yield a first part before the rest), and the worker shows each part as it comes. The Load tab
(:mod:`nbhw.ui.load`) embeds a mode's box below its model box and mode switch and hands it the model
(:meth:`ModeView.follow`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import ipywidgets

from nbhw.core import render
from nbhw.core.argument import Argument
from nbhw.core.control_form import ControlsForm, FormPreview
from nbhw.core.plan.plan_view import note_html
from nbhw.ui.codebox import codebox, highlight
from nbhw.ui.tree import close_tree
from nbhw.ui.worker import CONTROL_DELAY, LOCK, Worker, locked, unexpected

DEFAULT = ""  # the dropdown value of None: ipywidgets reads a None value as "nothing selected"
WIDTH = "500px"


def _control(name: str) -> Any:
    """An ipywidgets control class whose messages from the browser are handled under the widgets' lock."""
    return locked(getattr(ipywidgets, name))


def mistake_html(error: str) -> str:
    """The line above the code for a mistake in an entry."""
    return f'<span class="nbhw-message nbhw-bad">✗ {render.esc(error)}</span>'


@dataclass
class ModeResult:
    """What one job (or its first part, ``done=False``) hands to the widgets."""

    preview: FormPreview[Any, Any]
    message: str
    report: str
    done: bool = True
    code_html: str | None = None  # the code highlighted, made off the widgets' lock

    def __post_init__(self) -> None:
        if self.code_html is None:
            self.code_html = highlight(self.preview.code)

    @classmethod
    def mistake(cls, preview: FormPreview[Any, Any]) -> ModeResult:
        """A form with a mistake: its one line, no code, no report."""
        return cls(preview, mistake_html(str(preview.error)), "")


class ModeView:
    """A mode's widgets over its form; every change re-plans in the background.

    One control per declared argument that names one (the form's ``CONTROLS``), in declaration order, each with its
    declared help beside it. A subclass names its ``NAME`` (the task: the CSS classes ``nbhw-NAME`` and
    ``nbhw-NAME-report``), what the message says while ``PLANNING``, its ``PREVIEW`` class and :meth:`parts`.
    """

    NAME: ClassVar[str] = ""
    PLANNING: ClassVar[str] = "planning…"
    PREVIEW: ClassVar[type[FormPreview[Any, Any]]] = FormPreview
    LABEL_WIDTH: ClassVar[str] = "160px"

    def __init__(self, form: ControlsForm, worker: Worker) -> None:
        self.form = form
        self.worker = worker
        self.result: ModeResult | None = None
        self.closed = False
        self._key = (self.NAME, id(self))
        w, controls = ipywidgets, form.CONTROLS
        self.inputs = {name: self._input(declared, form.word(name)) for name, declared in controls.items()}
        self.notes = {name: w.HTML(note_html(declared.help), layout=w.Layout(margin="0 0 0 10px", max_width="560px"))
                      for name, declared in controls.items()}  # fmt: skip
        self.message = w.HTML(self._planning())
        self.code = codebox()
        self.report = w.HTML()
        self.report.add_class(f"nbhw-{self.NAME}-report")
        self._rows = [w.HBox([self.inputs[n], self.notes[n]], layout=w.Layout(align_items="center"))
                      for n in controls]  # fmt: skip
        self.box = w.VBox([*self._rows, self.message, self.code, self.report])
        self.box.add_class(f"nbhw-{self.NAME}")
        for control in self.inputs.values():
            control.observe(self._changed, names="value")
        self.refresh(delay=0.0)

    def parts(self, form: Any) -> Iterator[ModeResult]:
        """The plan and its HTML for a form, part by part (on the worker's thread): each ``done=False`` but the last."""
        raise NotImplementedError

    def _planning(self) -> str:
        return f"<span class='nbhw-note'>{render.esc(self.PLANNING)}</span>"

    def _input(self, declared: Argument, word: Any) -> Any:
        label = {"description_width": self.LABEL_WIDTH}
        if declared.control == "checkbox":
            return _control("Checkbox")(value=bool(word), description=declared.name, style=label,
                                        layout=ipywidgets.Layout(width=WIDTH))  # fmt: skip
        if declared.control == "dropdown":
            pairs = [(o.label, DEFAULT if o.value is None else o.value) for o in self.form.options(declared.name)]
            value = DEFAULT if word is None else str(word)
            if value not in [v for _, v in pairs]:
                pairs.append((f"{value} (given)", value))
            return _control("Dropdown")(options=pairs, value=value, description=declared.name, style=label,
                                        layout=ipywidgets.Layout(width=WIDTH))  # fmt: skip
        return _control("Text")(
            value="" if word is None else str(word), description=declared.name, continuous_update=False,
            placeholder=declared.metavar or "", style=label, layout=ipywidgets.Layout(width=WIDTH),
        )  # fmt: skip

    def control(self, name: str) -> Any:
        """The widget of one declared argument (a Dropdown, Checkbox or Text)."""
        return self.inputs[name]

    # -- the form

    def read_form(self) -> Any:
        """The form as the controls hold it now (the model as last handed over)."""
        controls = self.form.CONTROLS
        words = {name: control.value if controls[name].control == "checkbox" else control.value or None
                 for name, control in self.inputs.items()}  # fmt: skip
        return self.form.of(self.form.model, offline=self.form.offline, **words)

    def follow(self, model: str, offline: bool) -> None:
        """The Load tab's model (or offline) changed: plan for it (nothing to do when it is the same)."""
        with LOCK:
            if self.closed or (model, offline) == (self.form.model, self.form.offline):
                return
            self.form = self.form.replace(model=model, offline=offline)
            self.message.value = self._planning()
            self.refresh()

    def _changed(self, change: Any = None) -> None:
        with LOCK:
            if self.closed:
                return
            self.form = self.read_form()
            self.message.value = self._planning()
            self.refresh()

    def refresh(self, delay: float = CONTROL_DELAY) -> int:
        """Plan the current form in the background; the job's generation."""
        form = self.form
        return self.worker.submit_parts(self._key, lambda: self._guarded(form), self._apply, delay=delay)

    def _guarded(self, form: Any) -> Iterator[ModeResult]:
        """parts(), with a bug shown as the tab's one line rather than leaving it waiting."""
        try:
            yield from self.parts(form)
        except Exception as exc:
            yield ModeResult.mistake(self.PREVIEW(form, error=unexpected(exc)))

    def _apply(self, result: ModeResult) -> None:
        """Show a result (under the widgets' lock, on the worker's thread)."""
        if self.closed:
            return
        self.message.value = result.message
        self.code.show(result.preview.code, html=result.code_html)
        self.report.value = result.report
        if result.done:
            self.result = result

    # -- lifecycle

    def widgets(self) -> list[Any]:
        """Every widget this view owns (closed with it)."""
        shown = [self.message, self.code, self.report, *self._rows, self.box]
        return [*self.inputs.values(), *self.notes.values(), *shown]

    def close(self) -> None:
        """Close the widgets, their layouts and styles; a job still running for this view is dropped."""
        self.closed = True
        close_tree(*self.widgets())
