"""The Load tab's Train mode: one control per declared training argument, and a live preview of the training plan.

Every change submits one job to the panels' worker (at once, off the kernel's thread): the training plan
(:func:`nbhw.core.train.train_form.preview`, a training step dry-run on the meta device, 1-10 s) shows its verdict,
its per-device breakdown and strategies, and its code as soon as it is known; the largest batch follows (a few more
dry runs). The Load tab (:mod:`nbhw.ui.load`) embeds this view below its model box and mode switch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ipywidgets

from nbhw.core import render
from nbhw.core.argument import Argument
from nbhw.core.train import train_form
from nbhw.core.train.train_form import TRAIN_CONTROLS, TrainForm, TrainPreview
from nbhw.ui.codebox import codebox, highlight
from nbhw.ui.tree import close_tree
from nbhw.ui.worker import CONTROL_DELAY, LOCK, Worker, locked, unexpected

DEFAULT = ""  # the dropdown value of None: ipywidgets reads a None value as "nothing selected"
LABEL_WIDTH = "220px"  # the longest name, gradient_accumulation_steps, whole
WIDTH = "500px"
PLANNING = "<span class='nbhw-note'>planning the training step…</span>"
MARKS = {True: "✓", False: "✗", None: "?"}


def _control(name: str) -> Any:
    """An ipywidgets control class whose messages from the browser are handled under the widgets' lock."""
    return locked(getattr(ipywidgets, name))


def note_html(text: str, bad: bool = False) -> str:
    return f'<span class="nbhw-note{" nbhw-bad" if bad else ""}">{render.esc(text)}</span>'


def message_html(preview: TrainPreview) -> str:
    """The line above the code: the mistake in an entry, or the plan's verdict."""
    if preview.error is not None:
        return f'<span class="nbhw-message nbhw-bad">✗ {render.esc(preview.error)}</span>'
    plan = preview.plan
    assert plan is not None
    bad = " nbhw-bad" if plan.fits is False or not plan.recommended.ok else ""
    mark = MARKS[plan.fits] if plan.recommended.ok else MARKS[False]
    lead = "".join(f"<b>{render.esc(n)}</b><br>" for n in plan.notes)  # a catalog target: not here
    return f'{lead}<span class="nbhw-message nbhw-train-verdict{bad}">{mark} {render.esc(plan.verdict)}</span>'


def largest_batch_html(preview: TrainPreview) -> str:
    """The largest batch that fits, when the device's memory is known."""
    plan, largest = preview.plan, preview.largest_batch
    if plan is None:
        return ""
    if largest is None:
        return '<p class="nbhw-note nbhw-largest-batch">Largest batch: the device\'s memory is unknown</p>'
    rows = f"{largest:,} row{'s' if largest != 1 else ''}" if largest else "none (not even batch 1)"
    where = f"{plan.args.context:,} tokens, {plan.recommended.label}"
    return f'<p class="nbhw-largest-batch"><b>Largest batch that fits: {rows}</b> per device ({where})</p>'


def coming(text: str) -> str:
    return f'<p class="nbhw-note nbhw-coming">{render.esc(text)}</p>'


@dataclass
class TrainResult:
    """What one job (or its first part, ``done=False``) hands to the widgets."""

    preview: TrainPreview
    message: str
    report: str
    done: bool = True
    code_html: str | None = None  # the code highlighted, made off the widgets' lock

    def __post_init__(self) -> None:
        if self.code_html is None:
            self.code_html = highlight(self.preview.code)


class _Keep:
    """The ``post`` of a compute run outside the worker: every part is wanted."""

    def __call__(self, partial: TrainResult) -> bool:
        return True


def compute(form: TrainForm, post: Any = None) -> TrainResult:
    """The training plan and its HTML for a form (the worker runs this off the kernel's thread); ``post`` receives
    the plan as soon as it is known, and says False once a newer change made this one stale."""
    post = post or _Keep()
    try:
        preview = train_form.preview(form)
        if preview.error is not None:
            return TrainResult(preview, message_html(preview), "")
        assert preview.plan is not None
        first = TrainResult(preview, message_html(preview), coming("largest batch: searching…") + preview.plan.html(),
                            done=False)  # fmt: skip
        if not post(first):
            return first
        return TrainResult(preview, first.message, largest_batch_html(preview) + preview.plan.html(),
                           code_html=first.code_html)  # fmt: skip
    except Exception as exc:
        failed = TrainPreview(form, error=unexpected(exc))
        return TrainResult(failed, message_html(failed), "")


class TrainView:
    """The Train mode's widgets over a :class:`TrainForm`; every change re-plans in the background.

    One control per declared training argument that names one (:data:`TRAIN_CONTROLS`), in declaration order, each
    with its declared help beside it. The model is the Load tab's: :meth:`follow` hands it over.
    """

    def __init__(self, form: TrainForm, worker: Worker) -> None:
        self.form = form
        self.worker = worker
        self.result: TrainResult | None = None
        self.closed = False
        self._key = ("train", id(self))
        w = ipywidgets
        self.inputs = {name: self._input(declared, form.word(name)) for name, declared in TRAIN_CONTROLS.items()}
        self.notes = {name: w.HTML(note_html(declared.help), layout=w.Layout(margin="0 0 0 10px", max_width="560px"))
                      for name, declared in TRAIN_CONTROLS.items()}  # fmt: skip
        self.message = w.HTML(PLANNING)
        self.code = codebox()
        self.report = w.HTML()
        self.report.add_class("nbhw-train-report")
        self._rows = [w.HBox([self.inputs[n], self.notes[n]], layout=w.Layout(align_items="center"))
                      for n in TRAIN_CONTROLS]  # fmt: skip
        self.box = w.VBox([*self._rows, self.message, self.code, self.report])
        self.box.add_class("nbhw-train")
        for control in self.inputs.values():
            control.observe(self._changed, names="value")
        self.refresh(delay=0.0)

    def _input(self, declared: Argument, word: Any) -> Any:
        label = {"description_width": LABEL_WIDTH}
        if declared.control == "checkbox":
            return _control("Checkbox")(value=bool(word), description=declared.name, style=label,
                                        layout=ipywidgets.Layout(width=WIDTH))  # fmt: skip
        if declared.control == "dropdown":
            pairs = [(o.label, DEFAULT if o.value is None else o.value) for o in train_form.options(declared.name)]
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
        """The widget of one declared training argument (a Dropdown, Checkbox or Text)."""
        return self.inputs[name]

    # -- the form

    def read_form(self) -> TrainForm:
        """The form as the controls hold it now (the model as last handed over)."""
        words = {name: control.value if TRAIN_CONTROLS[name].control == "checkbox" else control.value or None
                 for name, control in self.inputs.items()}  # fmt: skip
        return TrainForm.of(self.form.model, offline=self.form.offline, **words)

    def follow(self, model: str, offline: bool) -> None:
        """The Load tab's model (or offline) changed: plan for it (nothing to do when it is the same)."""
        with LOCK:
            if self.closed or (model, offline) == (self.form.model, self.form.offline):
                return
            self.form = self.form.replace(model=model, offline=offline)
            self.message.value = PLANNING
            self.refresh()

    def _changed(self, change: Any = None) -> None:
        with LOCK:
            if self.closed:
                return
            self.form = self.read_form()
            self.message.value = PLANNING
            self.refresh()

    def refresh(self, delay: float = CONTROL_DELAY) -> int:
        """Plan the current form in the background; the job's generation."""
        form = self.form
        return self.worker.submit(
            self._key, lambda post: compute(form, post), self._apply, delay=delay, progress=self._apply
        )

    def _apply(self, result: TrainResult) -> None:
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
