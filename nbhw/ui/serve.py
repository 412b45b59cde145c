"""The Load tab's Serve mode: one control per declared serving argument, and a live preview of the serving plan.

Every change submits one job to the panels' worker (at once, off the kernel's thread): the serving plan
(:func:`nbhw.core.serve.serve_form.preview`: the installed transformers' own sizing of its paged cache on the meta
device) shows how many requests fit at once as its message, the plan's figures (the paged cache's pages, bytes and
tokens, the batch buffer, requests held at once, scheduled together, the longest request, CUDA graphs and async
batching) and the ``transformers serve`` command as its report, and the cell in the code box. The widgets and their
job are a Load tab mode's (:mod:`nbhw.ui.mode`); the Load tab (:mod:`nbhw.ui.load`) embeds this view below its
model box and mode switch.
"""

from __future__ import annotations

from collections.abc import Iterator

from nbhw.core import render
from nbhw.core.serve import serve_form
from nbhw.core.serve.serve_form import ServeForm, ServePreview
from nbhw.core.serve.serve_plan import ServePlan
from nbhw.ui.mode import ModeResult, ModeView


def message_html(plan: ServePlan) -> str:
    """The line above the code: how many full-length requests fit at once, or why there is no cache."""
    mark, bad = ("✓", "") if plan.full is not None and plan.full.held else ("✗", " nbhw-bad")
    headline = plan.headline().removeprefix("nbhw serve: ")
    return f'<span class="nbhw-message nbhw-serve-verdict{bad}">{mark} {render.esc(headline)}</span>'


def report_html(plan: ServePlan) -> str:
    """The plan's figures, as its text names them, and the equivalent ``transformers serve`` command."""
    table = render.html_table(("", ""), [list(row) for row in plan.rows()], css_class="nbhw-table nbhw-serve-figures")
    command = (
        f'<p class="nbhw-note">The same server:</p><pre class="nbhw-serve-command">{render.esc(plan.command)}</pre>'
    )
    return table + command


def parts(form: ServeForm) -> Iterator[ModeResult]:
    """The serving plan and its HTML for a form (the worker iterates this off the kernel's thread; one part: the plan
    takes well under a second once the model's config is read)."""
    preview = serve_form.preview(form)
    if preview.plan is None:
        yield ModeResult.mistake(preview)
        return
    yield ModeResult(preview, message_html(preview.plan), report_html(preview.plan))


class ServeView(ModeView):
    """The Serve mode's widgets over a :class:`ServeForm` (a control per declared serving argument that names one,
    :data:`nbhw.core.serve.serve_form.SERVE_CONTROLS`); every change re-plans in the background."""

    def parts(self, form: ServeForm) -> Iterator[ModeResult]:
        return parts(form)

    NAME = "serve"
    PLANNING = "planning the paged cache…"
    PREVIEW = ServePreview
