"""The Load tab: controls whose choices come from this machine, and a live preview of the from_pretrained cell.

Every change submits one job to the panels' worker (at once, off the kernel's thread), which iterates its parts
(:func:`parts`, a generator) and hands the tab each as soon as it is known, quickest first: the code
(:func:`nbhw.core.plan.load_form.preview`, with the dtype the precision advice gives until the advisor's choices are
known; uncoloured the first time, while pygments compiles its lexer), sent ahead of every other widget's update, then
the choices and the dry run of from_pretrained's checks with the weights' placement, then the run at batch x context
(one dry run of generate()) with each device's weights / cache / activations / reserve against its budget, then max
context and max batch. The worker applies each part under the widgets' lock unless a newer change came in, and stops
the job then. "Insert cell below" and "Copy" run in the browser.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ipywidgets

from nbhw.core import render
from nbhw.core.argument import Argument
from nbhw.core.cache import Recent
from nbhw.core.errors import UserError
from nbhw.core.fit.fit_form import fit_form
from nbhw.core.plan import load_form
from nbhw.core.plan.load_form import CONTROLS, Choices, Form, Option, Preview
from nbhw.core.plan.plan_view import budget_html, coming, message_html, note_html, picture_html
from nbhw.core.serve.serve_form import ServeForm
from nbhw.core.tasks import task_options
from nbhw.core.train.train_form import TrainForm
from nbhw.ui.codebox import codebox, highlight, quick_html
from nbhw.ui.mode import ModeView
from nbhw.ui.serve import ServeView
from nbhw.ui.train import TrainView
from nbhw.ui.tree import Shared, close_tree
from nbhw.ui.worker import CONTROL_DELAY, LOCK, Worker, locked, unexpected

DEFAULT = ""  # the dropdown value of "None" (the default): ipywidgets reads a None value as "nothing selected"
LABEL_WIDTH = "150px"
LABEL = {"description_width": LABEL_WIDTH}  # the style of a control whose name is its label
CHOICES_CACHE = 16
FIRST_CODE_WAIT = 0.75  # seconds a new Load tab waits for its first code before showing without it
STYLE = """<style>
.nbhw-load .widget-html-content { line-height: 1.35; }
.nbhw-load .nbhw-plan p { margin: 6px 0 2px 0; }
.nbhw-load .nbhw-note { color: var(--jp-ui-font-color2, #555); font-size: 12px; }
.nbhw-load .nbhw-bad { color: var(--jp-error-color1, #b42318); }
.nbhw-load .nbhw-message { font-weight: 600; }
.nbhw-placement-blocks { display: flex; flex-wrap: wrap; gap: 2px; max-width: 860px; align-items: flex-end; }
.nbhw-placement-blocks span { display: inline-block; width: 16px; border-radius: 2px; }
.nbhw-placement-legend span.swatch { display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 10px;
  border-radius: 2px; }
.nbhw-budget { margin: 6px 0; }
.nbhw-budget-row { display: flex; align-items: center; gap: 8px; margin: 2px 0; }
.nbhw-budget-name { width: 110px; text-align: right; font-size: 12px; }
.nbhw-budget-bar { position: relative; display: flex; height: 16px; width: 560px;
  background: var(--jp-layout-color2, #eee); border-radius: 2px; overflow: hidden; }
.nbhw-budget-bar .part { height: 100%; }
.nbhw-budget-bar .over { position: absolute; top: 0; bottom: 0; width: 2px;
  background: var(--jp-error-color1, #b42318); }
</style>"""

_choices: Recent[Choices] = Recent(CHOICES_CACHE)
# The newest choices per model, device and offline, whatever the dtype: shown with the code of a new dtype until its
# own choices are known (only the attention rows' marks can differ, for a moment).
_nearby: Recent[Choices] = Recent(CHOICES_CACHE)


def cached_choices(form: Form) -> Choices:
    """The choices for a form's model, device and dtype, computed once per combination."""
    model, device_map, dtype, offline = form.model.strip(), form.device_map, form.dtype, form.offline
    target = form.target
    key = (model, device_map, dtype, offline, target)
    found = _choices.get(
        key, lambda: load_form.choices(model, device_map=device_map, dtype=dtype, offline=offline, target=target)
    )
    _nearby.put((model, device_map, offline, target), found)
    return found


def clear_cache() -> None:
    """Forget cached choices (detection and advice are read again)."""
    _choices.clear()
    _nearby.clear()


@dataclass
class Result:
    """Everything one job (or one of its parts, ``done=False``) hands to the widgets."""

    form: Form
    choices: Choices | None
    preview: Preview
    picture: str
    report: str
    message: str = ""
    notes: dict[str, str] | None = None
    done: bool = True
    advised: str | None = None  # the precision advice's dtype, before the choices are known
    code_html: str | None = None  # the code highlighted, made off the widgets' lock

    def __post_init__(self) -> None:
        if self.code_html is None:
            self.code_html = highlight(self.preview.code)


def parts(form: Form) -> Iterator[Result]:
    """Choices, preview and HTML for a form, part by part as each is ready, every one ``done=False`` but the last (the
    worker iterates this off the kernel's thread, and stops it once a newer change made it stale: the rest is not
    computed, a dry run under way included)."""
    try:
        yield from _parts(form)
    except Exception as exc:
        failed = Preview(form, error=unexpected(exc))
        yield Result(form, None, failed, "", "", message_html(failed, None))


def _known_choices(form: Form) -> Choices | None:
    """The form's choices if they are known, else those of the same model and device with another dtype."""
    model, device_map, offline, target = form.model.strip(), form.device_map, form.offline, form.target
    found = _choices.peek((model, device_map, form.dtype, offline, target))
    return found if found is not None else _nearby.peek((model, device_map, offline, target))


def _parts(form: Form) -> Iterator[Result]:
    choices = _known_choices(form)
    advised = choices.advised_dtype if choices is not None else load_form.quick_dtype(form)
    if form.dtype is None:
        if advised is None:
            asked = _choices_or_error(form)
            if isinstance(asked, Result):
                yield asked
                return
            choices, advised = asked, asked.advised_dtype
        form = form.with_dtype(advised)
    preview = load_form.preview(form)
    if preview.error is not None:
        yield Result(form, choices, preview, "", "", message_html(preview, choices))
        return
    waiting = "<span class='nbhw-note'>checking with transformers…</span>"
    yield Result(form, choices, preview, "", coming("the dry run and the estimate are coming"), waiting, done=False,
                 advised=advised, code_html=quick_html(preview.code))  # fmt: skip
    html = highlight(preview.code)  # the same HTML (cached) once the lexer is ready; the first time, coloured now
    found = _choices_or_error(form)
    if isinstance(found, Result):
        yield found
        return
    plan = preview.plan
    assert plan is not None
    message = message_html(preview, found)
    notes = load_form.size_notes(plan)
    weights = picture_html(preview, run=False)
    report = coming(f"the run at {plan.context:,} tokens, batch {plan.batch}: planning…") + plan.html(
        code=False, run=False
    )
    yield Result(form, found, preview, weights, report, message, notes, done=False, code_html=html)
    picture = picture_html(preview, run=True) + budget_html(preview)
    report = coming("max context and max batch: searching…") + plan.html(code=False, searches=False)
    yield Result(form, found, preview, picture, report, message, notes, done=False, code_html=html)
    yield Result(form, found, preview, picture, plan.html(code=False), message, notes, code_html=html)


def _choices_or_error(form: Form) -> Choices | Result:
    try:
        return cached_choices(form)
    except UserError as exc:
        failed = Preview(form, error=str(exc))
        return Result(form, None, failed, "", "", message_html(failed, None))


# ---------------------------------------------------------------- the view


def _size_key(form: Form) -> tuple[Any, ...]:
    """What the notes beside the run's size controls depend on (:func:`load_form.size_notes`): not the dtype."""
    return (form.model.strip(), form.offline, form.target, form.context, form.encoder_length)


def _pairs(options: list[Option], current: str | None) -> list[tuple[str, str]]:
    """Dropdown (label, value) pairs, with the current value added when the choices don't hold it."""
    pairs = [(o.label, DEFAULT if o.value is None else o.value) for o in options]
    value = DEFAULT if current is None else current
    if value not in [v for _, v in pairs]:
        pairs.append((f"{value} (given)", value))
    return pairs


def _ipywidgets() -> Any:
    return ipywidgets


def _control(name: str) -> Any:
    """An ipywidgets control class (Dropdown, Text, ...) whose messages from the browser are handled under the lock."""
    return locked(getattr(_ipywidgets(), name))


# The Load tab's modes beside "Load / generate", by task: each made when first shown.
MODE_VIEWS: dict[str, type[ModeView]] = {"train": TrainView, "serve": ServeView}
FIT_TIP = "search dtype, quantization, cache, attention, kernels and device_map for what fits this context and budget"


def _fitted(form: Form) -> tuple[Form, str]:
    """The form filled with the solver's answer and a one-line note (a mistake or nothing fits: the form as it was)."""
    try:
        filled, result = fit_form(form)
    except UserError as exc:
        return form, note_html(str(exc), bad=True)
    if result.plan is None:
        changes = "; ".join(c.what for c in result.nearest) or "no change nbhw tries fits either"
        return form, note_html(f"nothing fits among {len(result.search.options)} options; nearest: {changes}", bad=True)
    rejected = f"{len(result.rejected)} options ahead of it rejected (nbhw.fit() lists why)"
    return filled, note_html(f"{result.headline().removeprefix('nbhw fit: ')} — {rejected}")


class LoadView:
    """The Load tab's widgets over a :class:`Form`; every change re-plans in the background.

    One control per declared argument that names one (:data:`nbhw.core.plan.load_form.CONTROLS`), in declaration
    order, each with its note beside it; ``max_memory`` is one size field per device accelerate would fill. The
    mode switch ``task`` shows the Train mode (:class:`nbhw.ui.train.TrainView`, ``.train``) or the Serve mode
    (:class:`nbhw.ui.serve.ServeView`, ``.serve``) instead, each made when first shown, under the same model box;
    each mode keeps its own controls and preview.
    """

    def __init__(
        self,
        form: Form,
        worker: Worker,
        models: list[str] | None = None,
        *,
        task: str = "infer",
        train: TrainForm | None = None,
        serve: ServeForm | None = None,
    ) -> None:
        self.form = form
        self.worker = worker
        self.choices: Choices | None = None
        self.result: Result | None = None
        self.modes: dict[str, ModeView] = {}  # the other modes' views, by task, once shown
        self.closed = False
        self._syncing = False
        self._key = ("load", id(self))
        self._forms = {"train": train or TrainForm.of(form.model, offline=form.offline),
                       "serve": serve or ServeForm.of(form.model, offline=form.offline)}  # fmt: skip
        self._replan_on_return = task != "infer"  # the inference plan waits until its mode is shown
        self.memory_fields: dict[str, Any] = {}
        self._size_notes: tuple[tuple[Any, ...], dict[str, str]] = ((), {})  # the last notes of the run's sizes
        self._shared = Shared()
        # Under the lock: the first plan's parts are applied once the widgets exist.
        with LOCK:
            first = self._first_plan() if task == "infer" else None
            try:
                self._make_widgets(form, models or [], task)
            except BaseException:
                self.closed = True  # the first plan drops its results
                raise
            if first is not None:
                self._apply(first)  # with the widgets' comms, ahead of the panel's display

    def _first_plan(self) -> Result | None:
        """Start planning the form and wait for its first part (the code), up to FIRST_CODE_WAIT seconds.

        The widgets are made after it rather than beside it: each widget's message to the front end lets the
        other thread take the interpreter for up to 5 ms (sys.getswitchinterval()), so making them while the
        worker computes slowed both down, and the code reached the page well after the panel. Past the wait (a
        model whose config comes from the Hub), or at once when the worker is busy with another job (another
        panel's), the tab shows without its code, which follows.
        """
        form, ready = self.form, threading.Event()
        first: list[Result] = []  # the first part, once computed

        def handing() -> Iterator[Result]:
            """The form's parts, the first of them (the code, ``done=False``) handed to this thread as well."""
            try:
                for part in parts(form):
                    if not first and not part.done:
                        first.append(part)
                        ready.set()
                    yield part
            finally:
                ready.set()  # the job's end (or its stop) without a first part

        idle = self.worker.idle()
        self.worker.submit_parts(self._key, handing, self._apply, delay=0.0)
        if idle:
            ready.wait(FIRST_CODE_WAIT)
        return first[0] if first else None

    def _make_widgets(self, form: Form, models: list[str], task: str) -> None:
        self._make_controls(form, models, task)
        self.box = self._layout()
        for control in self.controls():
            control.observe(self._changed, names="value")
        self.task.observe(self._task_changed, names="value")
        self._set_memory_fields([load_form.MemoryField(k, k, None) for k, _ in form.max_memory])
        if task != "infer":
            self._show_task(task)

    def _html(self, value: str = "", **layout: Any) -> Any:
        w = _ipywidgets()
        return w.HTML(value, **self._shared.looks(w.HTML, **layout))

    def _make_controls(self, form: Form, models: list[str], task: str) -> None:
        w, shared = _ipywidgets(), self._shared
        toggles, combobox, checkbox = _control("ToggleButtons"), _control("Combobox"), _control("Checkbox")
        self.task = toggles(options=task_options(), value=task, **shared.looks(toggles, {"button_width": "140px"}))
        self.model = combobox(
            value=form.model, options=list(models), description="model", ensure_option=False,
            continuous_update=False, placeholder="Hub id (org/name) or local folder",
            **shared.looks(combobox, LABEL, width="640px"),
        )  # fmt: skip
        self.offline = checkbox(
            value=form.offline, description="offline (never contact the Hub)", indent=False, **shared.looks(checkbox)
        )
        self.inputs: dict[str, Any] = {}
        self.notes: dict[str, Any] = {}
        for name, declared in CONTROLS.items():
            if declared.control == "sizes":
                self.inputs[name] = w.HBox(layout=shared.layout(flex_flow="row wrap"))
            else:
                self.inputs[name] = self._input(declared, getattr(form, name))
            self.notes[name] = self._html(margin="0 0 0 10px", max_width="520px")
        button = _control("Button")
        self.fit_button = button(description="Make it fit", tooltip=FIT_TIP, icon="magic", **shared.looks(button))
        self.fit_button.on_click(self._make_it_fit)
        self.fit_note = self._html()
        self.message = self._html("<span class='nbhw-note'>planning…</span>")
        self.code = codebox(layout=shared.layout())
        self.picture = self._html()
        self.report = w.HTML(_dom_classes=("nbhw-load-report",), **shared.looks(w.HTML))

    def _input(self, declared: Argument, word: Any) -> Any:
        if declared.control == "checkbox":
            checkbox = _control("Checkbox")
            return checkbox(value=bool(word), description=declared.name, **self._shared.looks(checkbox, LABEL))
        if declared.control == "dropdown":
            shown = DEFAULT if word is None else str(word)
            return self._dropdown(declared.name, shown or "default", shown)
        text = _control("Text")
        return text(
            value="" if word is None else str(word), description=declared.name, continuous_update=False,
            placeholder=declared.metavar or "", **self._shared.looks(text, LABEL, width="460px"),
        )  # fmt: skip

    def control(self, name: str) -> Any:
        """The widget of one declared argument (a Dropdown, Checkbox or Text; an HBox of fields for max_memory)."""
        return self.inputs[name]

    def note(self, name: str) -> Any:
        """The note beside one argument's control."""
        return self.notes[name]

    def _layout(self) -> Any:
        w, shared = _ipywidgets(), self._shared
        memory_label = self._html(
            f'<div style="width:{LABEL_WIDTH};text-align:right;padding-right:8px">max_memory</div>'
        )
        rows = [[self.model, self.offline]]
        for name, declared in CONTROLS.items():
            lead = [memory_label] if declared.control == "sizes" else []
            rows.append([*lead, self.inputs[name], self.notes[name]])
        self._rows = [w.HBox(children, layout=shared.layout(align_items="center")) for children in rows]
        self._extras = [self._html(STYLE), memory_label]
        self._fit_row = w.HBox([self.fit_button, self.fit_note], layout=shared.layout(align_items="center"))
        # infer_box has a layout of its own: the Train mode hides it.
        self.infer_box = w.VBox([*self._rows[1:], self._fit_row, self.message, self.code, self.picture, self.report])
        return w.VBox([self._extras[0], self._rows[0], self.task, self.infer_box], layout=shared.layout(),
                      _dom_classes=("nbhw-load", "nbhw"))  # fmt: skip

    def _dropdown(self, name: str, label: str, value: str) -> Any:
        dropdown = _control("Dropdown")
        return dropdown(
            options=[(label, value)],
            value=value,
            description=name,
            **self._shared.looks(dropdown, LABEL, width="460px"),
        )

    def controls(self) -> list[Any]:
        """The controls whose changes re-plan (the max_memory fields observe themselves)."""
        declared = [self.inputs[n] for n, a in CONTROLS.items() if a.control != "sizes"]
        return [self.model, self.offline, *declared]

    # -- the form

    def read_form(self) -> Form:
        """The form as the controls hold it now."""
        words: dict[str, Any] = {}
        for name, declared in CONTROLS.items():
            if declared.control == "sizes":
                words[name] = tuple((key, str(f.value)) for key, f in self.memory_fields.items())
            elif declared.control == "checkbox":
                words[name] = bool(self.inputs[name].value)
            else:
                words[name] = self.inputs[name].value or None
        return Form(str(self.model.value), offline=bool(self.offline.value), **words)

    def _changed(self, change: Any = None) -> None:
        with LOCK:
            if self._syncing or self.closed:
                return
            if self.task.value != "infer":  # the model goes to the mode shown; the inference plan waits
                self._replan_on_return = True
                shown = self.modes.get(str(self.task.value))
                if shown is not None:
                    shown.follow(str(self.model.value), bool(self.offline.value))
                return
            self.form = self.read_form()
            if change is not None and change.get("owner") is self.inputs.get("target"):
                # Other hardware, other advice: the dtype settles on the new advised one (a T4: float16), and a
                # target's budget is its catalog memory, so this machine's max_memory fields go.
                self.form = self.form.replace(dtype=None, max_memory=() if self.form.target else self.form.max_memory)
            self.message.value = "<span class='nbhw-note'>planning…</span>"
            self.refresh()

    def refresh(self, delay: float = CONTROL_DELAY) -> int:
        """Plan the current form in the background, each part shown as it comes; the job's generation."""
        form = self.form
        return self.worker.submit_parts(self._key, lambda: parts(form), self._apply, delay=delay)

    # -- the mode: load / generate, train or serve

    @property
    def train(self) -> TrainView | None:
        """The Train mode's view, once shown."""
        shown = self.modes.get("train")
        return shown if isinstance(shown, TrainView) else None

    @property
    def serve(self) -> ServeView | None:
        """The Serve mode's view, once shown."""
        shown = self.modes.get("serve")
        return shown if isinstance(shown, ServeView) else None

    def _task_changed(self, change: Any) -> None:
        with LOCK:
            if not self.closed:
                self._show_task(str(change["new"]))

    def _show_task(self, task: str) -> None:
        """Show one mode's controls and preview (under the lock); the others keep their own values."""
        model, offline = str(self.model.value), bool(self.offline.value)
        shown = self.modes.get(task)
        if shown is None and task in MODE_VIEWS:
            shown = MODE_VIEWS[task](self._forms[task].replace(model=model, offline=offline), self.worker)
            self.modes[task] = shown
            self.box.children = [*self.box.children, shown.box]
        elif shown is not None:
            shown.follow(model, offline)
        self.infer_box.layout.display = None if task == "infer" else "none"
        for name, view in self.modes.items():
            view.box.layout.display = None if name == task else "none"
        if task == "infer" and self._replan_on_return:
            self._replan_on_return = False
            self._changed()

    # -- "Make it fit"

    def _make_it_fit(self, button: Any = None) -> None:
        with LOCK:
            if self.closed:
                return
            form = self.read_form()
            self.fit_note.value = "<span class='nbhw-note'>searching every option…</span>"
            self.worker.submit(("fit", id(self)), lambda: _fitted(form), self._apply_fit, delay=0)

    def _apply_fit(self, found: tuple[Form, str]) -> None:
        """Fill every control with the answer and plan it (under the lock, on the worker's thread)."""
        if self.closed:
            return
        form, note = found
        self._syncing = True
        try:
            self.form = form
            self._show_form(form)
            self.fit_note.value = note
        finally:
            self._syncing = False
        self.refresh(delay=0)

    # -- applying a result (under the lock, on the worker's thread)

    def _apply(self, result: Result) -> None:
        if self.closed:
            return
        self._syncing = True
        try:
            # The newest job's form is this view's form, but for an unset dtype now settled on the advised one.
            self.form = result.form
            # The code first: each widget update is one message the browser handles in order.
            self.code.show(result.preview.code, html=result.code_html)
            if result.choices is not None and result.choices is not self.choices:
                self._show_choices(result.choices, result.form)
            if self.choices is not None:
                self._show_form(result.form)
            elif result.advised is not None:  # before the choices: the dtypes, the advised one marked
                pairs = _pairs(load_form.dtype_options(result.advised), result.form.dtype)
                with self.inputs["dtype"].hold_sync():
                    self.inputs["dtype"].options = pairs
                    self.inputs["dtype"].value = result.form.dtype or DEFAULT
            self._show_notes(result)
            self.message.value = result.message
            self.picture.value = result.picture
            self.report.value = result.report
            if result.done:
                self.result = result
        finally:
            self._syncing = False

    def _dropdowns(self) -> list[str]:
        return [n for n, a in CONTROLS.items() if a.control == "dropdown"]

    def _show_choices(self, choices: Choices, form: Form) -> None:
        self.choices = choices
        for name in self._dropdowns():
            dropdown, value = self.inputs[name], getattr(form, name)
            pairs = _pairs(list(choices.options.get(name, ())), value)
            if list(dropdown.options) != pairs:
                with dropdown.hold_sync():  # options and value in one message
                    dropdown.options = pairs
                    dropdown.value = DEFAULT if value is None else value
        known = {f.key for f in choices.memory}
        extra = [load_form.MemoryField(k, k, None) for k, _ in form.max_memory if k not in known]
        self._set_memory_fields([*choices.memory, *extra])

    def _set_memory_fields(self, fields: list[load_form.MemoryField]) -> None:
        if [f.key for f in fields] == list(self.memory_fields):
            return
        sizes = dict(self.form.max_memory)
        old, self.memory_fields = self.memory_fields, {}
        for f in fields:
            free = f"free {render.size(f.free)}" if f.free is not None else "size, e.g. 70GiB"
            kind = _control("Text")
            text = kind(
                value=old[f.key].value if f.key in old else sizes.get(f.key, ""), description=f.device,
                placeholder=free, continuous_update=False,
                **self._shared.looks(kind, {"description_width": "60px"}, width="220px"),
            )  # fmt: skip
            text.observe(self._changed, names="value")
            self.memory_fields[f.key] = text
        self.inputs["max_memory"].children = list(self.memory_fields.values())
        close_tree(*old.values(), keep=tuple(self._shared.widgets()))

    def _show_form(self, form: Form) -> None:
        self.model.value = form.model
        self.offline.value = form.offline
        for name, declared in CONTROLS.items():
            value = getattr(form, name)
            if declared.control == "dropdown":
                self._show_dropdown(self.inputs[name], value)
            elif declared.control == "checkbox":
                self.inputs[name].value = bool(value)
            elif declared.control == "text":
                self.inputs[name].value = "" if value is None else str(value)
        sizes = dict(form.max_memory)
        for key, field in self.memory_fields.items():
            field.value = sizes.get(key, "")

    @staticmethod
    def _show_dropdown(dropdown: Any, value: Any) -> None:
        wanted = DEFAULT if value is None else value
        if wanted not in [v for _, v in dropdown.options]:
            with dropdown.hold_sync():
                dropdown.options = [*dropdown.options, (f"{wanted} (given)", wanted)]
                dropdown.value = wanted
        elif dropdown.value != wanted:
            dropdown.value = wanted

    def _show_notes(self, result: Result) -> None:
        choices = result.choices
        if choices is None:
            return
        sized = _size_key(result.form)
        if result.notes is not None:
            self._size_notes = (sized, result.notes)
        # Before the checks a part has no size notes: those shown stay while they are about the same sizes.
        kept = self._size_notes[1] if result.notes is None and self._size_notes[0] == sized else {}
        notes = {**choices.notes, **kept, **(result.notes or {})}
        for name in CONTROLS:
            self.notes[name].value = note_html(notes[name]) if notes.get(name) else ""
        option = choices.option("attn_implementation", result.form.attn_implementation)
        if option is None:
            text = "not one of the advisor's rows: checked by the dry run only"
            self.notes["attn_implementation"].value = note_html(text)
        else:
            self.notes["attn_implementation"].value = note_html(option.reason, bad=not option.ok)

    # -- lifecycle

    def widgets(self) -> list[Any]:
        """Every widget this view owns (closed with it)."""
        notes = list(self.notes.values())
        shown = [self.inputs["max_memory"], self.fit_button, self.fit_note, self._fit_row, self.message, self.code,
                 self.picture, self.report]  # fmt: skip
        rows = [*self._extras, *self._rows, self.task, self.infer_box, self.box]
        return [*self.controls(), *notes, *shown, *self.memory_fields.values(), *rows, *self._shared.widgets()]

    def close(self) -> None:
        """Close the widgets, their layouts and styles, the other modes' too; a job still running is dropped."""
        self.closed = True
        for view in self.modes.values():
            view.close()
        close_tree(*self.widgets())
