"""The Load tab's "Make it fit": the solver run for a form, and the form filled with its answer (no widgets here).

What must fit where stays as the form has it (the target, context, batch, padding, encoder_length and the max_memory
budget); every other control is searched, so the answer can change dtype, quantization, attention, kernels and
device_map. A memory share comes back as the form's max_memory with the run's whole ``budget`` carried beside it.
"""

from __future__ import annotations

from nbhw.core.errors import UserError
from nbhw.core.fit.arguments import fit_args
from nbhw.core.fit.solver import FitResult, fit_loading
from nbhw.core.plan.load_form import FORM_WORDS, Form, form_words

KEPT = ("target", "context", "batch", "padding", "encoder_length", "max_memory")


def fit_form(form: Form) -> tuple[Form, FitResult]:
    """The form filled with the solver's answer (unchanged when nothing fits), and the answer itself."""
    if not form.model.strip():
        raise UserError("model: give a Hub id like 'org/name' or the folder of a local model")
    values = form.plan_values()
    kept = {name: values[name] for name in KEPT if values.get(name) is not None}
    result = fit_loading(form.model.strip(), fit_args(), kept, offline=form.offline)
    return filled(form, result), result


def filled(form: Form, result: FitResult) -> Form:
    """The form holding the words of the answer's plan (the form itself when nothing fits)."""
    if result.plan is None:
        return form
    args = result.plan.args
    words = form_words({name: getattr(args, name) for name in FORM_WORDS})
    return Form(form.model, offline=form.offline, **words)
