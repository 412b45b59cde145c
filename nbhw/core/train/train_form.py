"""The Load tab's Train mode without widgets: what its controls hold and offer, and what a filled-in form previews.

The controls are the training plan's declared arguments that name a ``control``
(:data:`nbhw.core.train.arguments.TRAIN_ARGUMENTS`), in declaration order. A :class:`TrainForm` holds their words as
typed (the magic's words: ``batch="4"``, ``lora_target_modules="q_proj v_proj"``); :func:`preview` turns it into the
training plan, or into the one-line message of the first mistake. The form, its words and its preview are
:mod:`nbhw.core.control_form`'s, shared with the Serve mode. Nothing here raises for a user's entry and nothing
imports a UI library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from nbhw.core.argument import Argument
from nbhw.core.control_form import ControlsForm, FormPreview, controls_of
from nbhw.core.errors import UserError
from nbhw.core.hardware.targets import target_of
from nbhw.core.hf import meta_build
from nbhw.core.plan.load_form import Option, target_options
from nbhw.core.train.arguments import TRAIN_ARGUMENTS, TRAINED_ON
from nbhw.core.train.train_plan import TrainPlan, train_plan

# The declared training arguments the Train mode shows a control for, by name.
TRAIN_CONTROLS: dict[str, Argument] = controls_of(TRAIN_ARGUMENTS)
# ---------------------------------------------------------------- what the dropdowns offer


def _target_options() -> list[Option]:
    """This machine, then the catalog entries a training plan takes (NVIDIA and AMD GPUs: torch's cuda devices)."""
    return [o for o in target_options() if o.value is None or _trained_on(o.value)]


def _trained_on(target: str) -> bool:
    found = target_of(target)
    return found is not None and found.accelerator.device in TRAINED_ON


# The dropdowns whose entries are not their declared choices, by argument name.
TRAIN_OPTIONS: dict[str, Callable[[], list[Option]]] = {"target": _target_options}


@dataclass(frozen=True)
class TrainForm(ControlsForm):
    """What the Train mode's controls hold: the model, offline, and a word per control that is not its default.

    ``TrainForm.of(model, method="qlora", batch="4")``; ``form.word("batch")`` is what the batch field shows.
    """

    CONTROLS = TRAIN_CONTROLS
    OPTIONS = TRAIN_OPTIONS
    MODE = "Train"


form_words = TrainForm.form_words
options = TrainForm.options


# ---------------------------------------------------------------- preview


@dataclass
class TrainPreview(FormPreview[TrainForm, TrainPlan]):
    """What a form gives: the training plan and its code (the notebook training cell for one device, else the
    training script), or the message saying which entry is wrong."""

    @property
    def verdict(self) -> str:
        """fits / does not fit / the memory is unknown / does not run ("" for a mistake)."""
        return self.plan.verdict if self.plan is not None else ""

    @cached_property
    def largest_batch(self) -> int | None:
        """The largest per-device batch that fits (a few more dry runs); None when the memory is unknown."""
        if self.plan is None:
            return None
        try:
            with meta_build.quiet():
                return self.plan.max_batch
        except UserError:
            return None  # a batch the strategy can't run (tensor parallelism's divisibility): no answer to show


def preview(form: TrainForm) -> TrainPreview:
    """The training plan of a form (a real training step dry-run on the meta device: 1-10 s), or a TrainPreview
    holding the one-line message of the first mistake."""
    return TrainPreview.planned(form, train_plan)
