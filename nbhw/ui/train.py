"""The Load tab's Train mode: one control per declared training argument, and a live preview of the training plan.

Every change submits one job to the panels' worker (at once, off the kernel's thread): the training plan
(:func:`nbhw.core.train.train_form.preview`, a training step dry-run on the meta device, 1-10 s) shows its verdict,
its per-device breakdown and strategies, and its code as soon as it is known; the largest batch follows (a few more
dry runs). The widgets and their job are a Load tab mode's (:mod:`nbhw.ui.mode`); the Load tab
(:mod:`nbhw.ui.load`) embeds this view below its model box and mode switch.
"""

from __future__ import annotations

from collections.abc import Iterator

from nbhw.core import render
from nbhw.core.plan.plan_view import coming
from nbhw.core.train import train_form
from nbhw.core.train.train_form import TrainForm, TrainPreview
from nbhw.ui.mode import ModeResult, ModeView, mistake_html

MARKS = {True: "✓", False: "✗", None: "?"}


def message_html(preview: TrainPreview) -> str:
    """The line above the code: the mistake in an entry, or the plan's verdict."""
    if preview.error is not None:
        return mistake_html(preview.error)
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


def parts(form: TrainForm) -> Iterator[ModeResult]:
    """The training plan and its HTML for a form (the worker iterates this off the kernel's thread): the plan as soon
    as it is known, then with the largest batch."""
    preview = train_form.preview(form)
    if preview.error is not None:
        yield ModeResult.mistake(preview)
        return
    assert preview.plan is not None
    first = ModeResult(preview, message_html(preview), coming("largest batch: searching…") + preview.plan.html(),
                       done=False)  # fmt: skip
    yield first
    yield ModeResult(preview, first.message, largest_batch_html(preview) + preview.plan.html(),
                     code_html=first.code_html)  # fmt: skip


class TrainView(ModeView):
    """The Train mode's widgets over a :class:`TrainForm`; every change re-plans in the background.

    One control per declared training argument that names one (:data:`nbhw.core.train.train_form.TRAIN_CONTROLS`),
    in declaration order, each with its declared help beside it. The model is the Load tab's: :meth:`follow` hands
    it over.
    """

    NAME = "train"
    PLANNING = "planning the training step…"
    PREVIEW = TrainPreview
    LABEL_WIDTH = "220px"  # the longest name, gradient_accumulation_steps, whole

    def parts(self, form: TrainForm) -> Iterator[ModeResult]:
        return parts(form)
