"""The Load tab's Serve mode without widgets: what its controls hold and offer, and what a filled-in form previews.

The controls are the serving plan's declared arguments that name a ``control``
(:data:`nbhw.core.serve.arguments.SERVE_ARGUMENTS`), in declaration order. A :class:`ServeForm` holds their words as
typed (``context="8k"``, ``memory_percent="0.9"``); :func:`preview` turns it into the serving plan
(:func:`nbhw.core.serve.serve_plan.serve_plan`, what ``nbhw.plan(task="serve")`` answers), or into the one-line
message of the first mistake. The form, its words and its preview are :mod:`nbhw.core.control_form`'s, shared with
the Train mode. Nothing here raises for a user's entry and nothing imports a UI library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nbhw.core.argument import Argument
from nbhw.core.control_form import ControlsForm, FormPreview, controls_of
from nbhw.core.dtypes import OFFERED
from nbhw.core.hardware.targets import target_of
from nbhw.core.plan.load_form import Option, target_options
from nbhw.core.serve.arguments import COMPILE_LEVELS, SERVE_ARGUMENTS, SERVED_ATTENTION, SERVED_ON, TP_SIZES
from nbhw.core.serve.serve_plan import ServePlan, serve_plan

# The declared serving arguments the Serve mode shows a control for, by name.
SERVE_CONTROLS: dict[str, Argument] = controls_of(SERVE_ARGUMENTS)

# ---------------------------------------------------------------- what the dropdowns offer


def _target_options() -> list[Option]:
    """This machine, then the catalog entries a serving plan takes (the torch devices transformers' continuous
    batching sizes its cache on)."""
    return [o for o in target_options() if o.value is None or _served_on(o.value)]


def _served_on(target: str) -> bool:
    found = target_of(target)
    return found is not None and found.accelerator.device in SERVED_ON


def _dtype_options() -> list[Option]:
    return [Option(dtype, dtype) for dtype in OFFERED]


def _attention_options() -> list[Option]:
    return [Option(None, "default (the model's own, usually sdpa)"), *(Option(a, a) for a in SERVED_ATTENTION)]


def _tp_options() -> list[Option]:
    return [Option(None, "default (every card of the target, else 1)"), *(Option(str(n), str(n)) for n in TP_SIZES)]


def _compile_options() -> list[Option]:
    return [Option(None, "default (0: no compile)"), *(Option(str(n), str(n)) for n in COMPILE_LEVELS)]


# The dropdowns whose entries are not their declared choices, by argument name.
SERVE_OPTIONS: dict[str, Callable[[], list[Option]]] = {
    "target": _target_options,
    "tp_size": _tp_options,
    "dtype": _dtype_options,
    "attn_implementation": _attention_options,
    "compile_level": _compile_options,
}


@dataclass(frozen=True)
class ServeForm(ControlsForm):
    """What the Serve mode's controls hold: the model, offline, and a word per control that is not its default.

    ``ServeForm.of(model, context="8k", prompt="512", answer="256")``; ``form.word("context")`` is what the context
    field shows.
    """

    CONTROLS = SERVE_CONTROLS
    OPTIONS = SERVE_OPTIONS
    MODE = "Serve"


# ---------------------------------------------------------------- preview


@dataclass
class ServePreview(FormPreview[ServeForm, ServePlan]):
    """What a form gives: the serving plan and its cell, or the message saying which entry is wrong."""


def preview(form: ServeForm) -> ServePreview:
    """The serving plan of a form (transformers' own sizing on the meta device: well under a second once the model's
    config is read), or a ServePreview holding the one-line message of the first mistake."""
    return ServePreview.planned(form, serve_plan)
