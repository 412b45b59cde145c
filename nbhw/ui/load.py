"""The Load tab: controls whose choices come from this machine, and a live preview of the from_pretrained cell.

Every change submits one job to the panels' worker (debounced, off the kernel's thread): choices for the model
(cached), then :func:`nbhw.core.plan.load_form.preview`, then the HTML; the worker applies it under the widgets' lock
unless a newer change came in. The code box's "Insert cell below" and "Copy" run in the browser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ipywidgets

from nbhw.core import render
from nbhw.core.argument import Argument
from nbhw.core.cache import Recent
from nbhw.core.errors import UserError
from nbhw.core.plan import load_form
from nbhw.core.plan.load_form import CONTROLS, Choices, Form, Option, Preview, Unit
from nbhw.ui.codebox import codebox
from nbhw.ui.tree import close_tree
from nbhw.ui.worker import LOCK, Worker, locked, unexpected

DEFAULT = ""  # the dropdown value of "None" (the default): ipywidgets reads a None value as "nothing selected"
LABEL_WIDTH = "150px"
CHOICES_CACHE = 16
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
</style>"""

_choices: Recent[Choices] = Recent(CHOICES_CACHE)


def cached_choices(form: Form) -> Choices:
    """The choices for a form's model, device and dtype, computed once per combination."""
    model, device_map, dtype, offline, target = (
        form.model.strip(),
        form.device_map,
        form.dtype,
        form.offline,
        form.target,
    )
    key = (model, device_map, dtype, offline, target)
    return _choices.get(
        key, lambda: load_form.choices(model, device_map=device_map, dtype=dtype, offline=offline, target=target)
    )


def clear_cache() -> None:
    """Forget cached choices (detection and advice are read again)."""
    _choices.clear()


# ---------------------------------------------------------------- HTML pieces


def device_colors(devices: list[str]) -> dict[str, str]:
    """Each device's colour (the same as in the memory graph), in the order given."""
    return {device: render.device_color(device) for device in dict.fromkeys(devices)}


def picture_html(preview: Preview) -> str:
    """The placement as a row of blocks in model order (decoder layers tall), coloured by device, with a legend."""
    blocks: list[Unit] = preview.units
    if not blocks:
        return ""
    colors = device_colors([u.device for u in blocks])
    cells = "".join(
        f'<span data-device="{render.esc(u.device)}" title="{render.esc(u.name)} → {render.esc(u.device)} '
        f'({render.size(u.bytes)})" style="height:{28 if u.layer else 14}px;background:{colors[u.device]}"></span>'
        for u in blocks
    )
    legend = []
    for device, color in colors.items():
        mine = [u for u in blocks if u.device == device]
        layers = sum(u.layer for u in mine)
        what = f"{layers} layer{'s' if layers != 1 else ''}" + (
            f" + {len(mine) - layers} other" if len(mine) > layers else ""
        )
        size = render.size(sum(u.bytes for u in mine))
        legend.append(f'<span class="swatch" style="background:{color}"></span>{render.esc(device)}: {what}, {size}')
    return (
        f'<div class="nbhw-placement"><b>Placement: {render.esc(preview.verdict)}</b>'
        f'<div class="nbhw-placement-blocks">{cells}</div>'
        f'<div class="nbhw-placement-legend nbhw-note">{"".join(legend)}</div></div>'
    )


def note_html(text: str, bad: bool = False) -> str:
    """A short note beside a control."""
    return f'<span class="nbhw-note{" nbhw-bad" if bad else ""}">{render.esc(text)}</span>'


def message_html(preview: Preview, choices: Choices | None) -> str:
    """The line above the code: the mistake in an entry, or what the dry run says."""
    if preview.error is not None:
        return f'<span class="nbhw-message nbhw-bad">✗ {render.esc(preview.error)}</span>'
    extra = f" ({render.esc(choices.problem)})" if choices is not None and choices.problem else ""
    target = preview.plan.target if preview.plan is not None else None
    lead = f"<b>{render.esc(target.not_here)}</b><br>" if target is not None else ""
    if preview.problems:
        n = len(preview.problems)
        return f'{lead}<span class="nbhw-message nbhw-bad">Dry run: {n} problem{"s" if n > 1 else ""}</span>{extra}'
    accepted = (
        f"transformers' checks, read for {target.label}, accept this plan"
        if target
        else "transformers accepts this plan here"
    )
    return f'{lead}<span class="nbhw-message">✓ Dry run: {accepted}</span>{extra}'


@dataclass
class Result:
    """Everything one job hands to the widgets."""

    form: Form
    choices: Choices | None
    preview: Preview
    picture: str
    report: str


def compute(form: Form) -> Result:
    """Choices, preview and HTML for a form (the worker runs this off the kernel's thread)."""
    try:
        return _compute(form)
    except Exception as exc:
        return Result(form, None, Preview(form, error=unexpected(exc)), "", "")


def _compute(form: Form) -> Result:
    choices: Choices | None = None
    try:
        choices = cached_choices(form)
    except UserError as exc:
        return Result(form, None, Preview(form, error=str(exc)), "", "")
    if form.dtype is None:
        form = form.with_dtype(choices.advised_dtype)
    preview = load_form.preview(form)
    report = preview.plan.html(code=False) if preview.plan is not None else ""
    return Result(form, choices, preview, picture_html(preview), report)


# ---------------------------------------------------------------- the view


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


class LoadView:
    """The Load tab's widgets over a :class:`Form`; every change re-plans in the background.

    One control per declared argument that names one (:data:`nbhw.core.plan.load_form.CONTROLS`), in declaration
    order, each with its note beside it; ``max_memory`` is one size field per device accelerate would fill.
    """

    def __init__(self, form: Form, worker: Worker, models: list[str] | None = None) -> None:
        self.form = form
        self.worker = worker
        self.choices: Choices | None = None
        self.result: Result | None = None
        self.closed = False
        self._syncing = False
        self._key = ("load", id(self))
        self.memory_fields: dict[str, Any] = {}
        self._make_controls(form, models or [])
        self.box = self._layout()
        for control in self.controls():
            control.observe(self._changed, names="value")
        self._set_memory_fields([load_form.MemoryField(k, k, None) for k, _ in form.max_memory])
        self.refresh()

    def _make_controls(self, form: Form, models: list[str]) -> None:
        w = _ipywidgets()
        label = {"description_width": LABEL_WIDTH}
        self.model = _control("Combobox")(
            value=form.model, options=list(models), description="model", ensure_option=False,
            continuous_update=False, placeholder="Hub id (org/name) or local folder", style=label,
            layout=w.Layout(width="640px"),
        )  # fmt: skip
        self.offline = _control("Checkbox")(
            value=form.offline, description="offline (never contact the Hub)", indent=False
        )
        self.inputs: dict[str, Any] = {}
        self.notes: dict[str, Any] = {}
        for name, declared in CONTROLS.items():
            if declared.control == "sizes":
                self.inputs[name] = w.HBox(layout=w.Layout(flex_flow="row wrap"))
            else:
                self.inputs[name] = self._input(declared, getattr(form, name))
            self.notes[name] = w.HTML(layout=w.Layout(margin="0 0 0 10px", max_width="520px"))
        self.message = w.HTML("<span class='nbhw-note'>planning…</span>")
        self.code = codebox()
        self.picture = w.HTML()
        self.report = w.HTML()

    def _input(self, declared: Argument, word: Any) -> Any:
        label = {"description_width": LABEL_WIDTH}
        if declared.control == "checkbox":
            return _control("Checkbox")(value=bool(word), description=declared.name, style=label)
        if declared.control == "dropdown":
            shown = DEFAULT if word is None else str(word)
            return self._dropdown(declared.name, shown or "default", shown)
        return _control("Text")(
            value="" if word is None else str(word), description=declared.name, continuous_update=False,
            placeholder=declared.metavar or "", style=label, layout=_ipywidgets().Layout(width="460px"),
        )  # fmt: skip

    def control(self, name: str) -> Any:
        """The widget of one declared argument (a Dropdown, Checkbox or Text; an HBox of fields for max_memory)."""
        return self.inputs[name]

    def note(self, name: str) -> Any:
        """The note beside one argument's control."""
        return self.notes[name]

    def _layout(self) -> Any:
        w = _ipywidgets()
        memory_label = w.HTML(f'<div style="width:{LABEL_WIDTH};text-align:right;padding-right:8px">max_memory</div>')
        rows = [[self.model, self.offline]]
        for name, declared in CONTROLS.items():
            lead = [memory_label] if declared.control == "sizes" else []
            rows.append([*lead, self.inputs[name], self.notes[name]])
        self._rows = [w.HBox(children, layout=w.Layout(align_items="center")) for children in rows]
        self._extras = [w.HTML(STYLE), memory_label]
        box = w.VBox([self._extras[0], *self._rows, self.message, self.code, self.picture, self.report])
        box.add_class("nbhw-load")
        box.add_class("nbhw")
        return box

    def _dropdown(self, name: str, label: str, value: str) -> Any:
        w = _ipywidgets()
        return _control("Dropdown")(
            options=[(label, value)], value=value, description=name, style={"description_width": LABEL_WIDTH},
            layout=w.Layout(width="460px"),
        )  # fmt: skip

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
            self.form = self.read_form()
            if change is not None and change.get("owner") is self.inputs.get("target"):
                # Other hardware, other advice: the dtype settles on the new advised one (a T4: float16), and a
                # target's budget is its catalog memory, so this machine's max_memory fields go.
                self.form = self.form.replace(dtype=None, max_memory=() if self.form.target else self.form.max_memory)
            self.message.value = "<span class='nbhw-note'>planning…</span>"
            self.refresh()

    def refresh(self) -> int:
        """Plan the current form in the background; the job's generation."""
        form = self.form
        return self.worker.submit(self._key, lambda: compute(form), self._apply)

    # -- applying a result (under the lock, on the worker's thread)

    def _apply(self, result: Result) -> None:
        if self.closed:
            return
        self._syncing = True
        try:
            # The newest job's form is this view's form, but for an unset dtype now settled on the advised one.
            self.form = result.form
            if result.choices is not None and result.choices is not self.choices:
                self._show_choices(result.choices, result.form)
            self._show_form(result.form)
            self._show_notes(result)
            self.message.value = message_html(result.preview, result.choices)
            self.code.show(result.preview.code)
            self.picture.value = result.picture
            self.report.value = result.report
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
            text = _control("Text")(
                value=old[f.key].value if f.key in old else sizes.get(f.key, ""), description=f.device,
                placeholder=free, continuous_update=False, layout=_ipywidgets().Layout(width="220px"),
                style={"description_width": "60px"},
            )  # fmt: skip
            text.observe(self._changed, names="value")
            self.memory_fields[f.key] = text
        self.inputs["max_memory"].children = list(self.memory_fields.values())
        close_tree(*old.values())

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
        for name in CONTROLS:
            self.notes[name].value = note_html(choices.notes[name]) if choices.notes.get(name) else ""
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
        shown = [self.inputs["max_memory"], self.message, self.code, self.picture, self.report]
        return [*self.controls(), *notes, *shown, *self.memory_fields.values(), *self._extras, *self._rows, self.box]

    def close(self) -> None:
        """Close the widgets, their layouts and styles; a job still running for this view is dropped."""
        self.closed = True
        close_tree(*self.widgets())
