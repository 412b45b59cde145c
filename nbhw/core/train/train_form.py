"""The Load tab's Train mode without widgets: what its controls hold and offer, and what a filled-in form previews.

The controls are the training plan's declared arguments that name a ``control``
(:data:`nbhw.core.train.arguments.TRAIN_ARGUMENTS`), in declaration order. A :class:`TrainForm` holds their words as
typed (the magic's words: ``batch="4"``, ``lora_target_modules="q_proj v_proj"``); :func:`preview` turns it into the
training plan, or into the one-line message of the first mistake. Nothing here raises for a user's entry and nothing
imports a UI library.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from nbhw.core.argument import Argument
from nbhw.core.errors import UserError, one_of
from nbhw.core.hardware.targets import target_of
from nbhw.core.hf import meta_build
from nbhw.core.plan.load_form import Option, target_options
from nbhw.core.train.arguments import TRAIN_ARGUMENTS, TRAINED_ON
from nbhw.core.train.tasks import TASKS
from nbhw.core.train.train_plan import TrainPlan, train_plan

# The declared training arguments the Train mode shows a control for, by name.
TRAIN_CONTROLS: dict[str, Argument] = {a.name: a for a in TRAIN_ARGUMENTS if a.control is not None}
# What the mode switch says for each task the Load tab has a mode for (the values are nbhw.plan()'s task words;
# task="serve" has no mode of its own yet: %hw serve shows it).
TASK_LABELS: dict[str, str] = {"infer": "Load / generate", "train": "Train"}
assert set(TASK_LABELS) <= set(TASKS), "a mode switch label names a task nbhw.plan() does not take"


def task_options() -> list[tuple[str, str]]:
    """The mode switch's (label, task) pairs, in the order of TASKS."""
    return [(TASK_LABELS[task], task) for task in TASKS if task in TASK_LABELS]


def default_word(name: str) -> Any:
    """What a control holds when nothing was chosen: the declared default as a word (None: an empty field)."""
    declared = TRAIN_CONTROLS[name]
    if declared.control == "checkbox":
        return bool(declared.default)
    return as_word(declared, declared.default)


def as_word(declared: Argument, value: Any) -> Any:
    """A value as its control holds it: a bool for a checkbox, else text (None: nothing set)."""
    if declared.control == "checkbox":
        return bool(value)
    shown = declared.word(value) if value is not None else None
    if declared.kind == "words" and shown is not None and not isinstance(shown, str):
        shown = " ".join(shown)
    return None if shown is None or shown == () else str(shown)


def form_words(values: Mapping[str, Any]) -> dict[str, Any]:
    """train_plan() keyword values (as nbhw.panel() takes them) as the words the controls hold; an argument the
    Train mode has no control for is a one-line mistake naming those it has."""
    unknown = [name for name in values if name not in TRAIN_CONTROLS]
    if unknown:
        raise one_of("argument", unknown[0], list(TRAIN_CONTROLS))
    return {name: value if isinstance(value, str) else as_word(TRAIN_CONTROLS[name], value)
            for name, value in values.items()}  # fmt: skip


@dataclass(frozen=True)
class TrainForm:
    """What the Train mode's controls hold: the model, offline, and a word per control that is not its default.

    ``TrainForm.of(model, method="qlora", batch="4")``; ``form.word("batch")`` is what the batch field shows.
    """

    model: str
    offline: bool = False
    given: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, model: str, *, offline: bool = False, **words: Any) -> TrainForm:
        unknown = [name for name in words if name not in TRAIN_CONTROLS]
        if unknown:
            raise TypeError(f"the Train mode has no control {unknown[0]!r}; it has {', '.join(TRAIN_CONTROLS)}")
        kept = tuple((n, w) for n, w in words.items() if w not in (None, "") and w != default_word(n))
        return cls(model, offline, kept)

    def word(self, name: str) -> Any:
        """What one control holds (its default word when not set)."""
        return dict(self.given).get(name, default_word(name))

    @property
    def words(self) -> dict[str, Any]:
        """The controls that hold something other than their default."""
        return dict(self.given)

    def replace(self, *, model: str | None = None, offline: bool | None = None, **words: Any) -> TrainForm:
        """The same form with the model, offline or some controls changed."""
        return TrainForm.of(
            self.model if model is None else model,
            offline=self.offline if offline is None else offline,
            **{**self.words, **words},
        )

    def train_values(self) -> dict[str, Any]:
        """The keyword arguments of nbhw.train_plan() this form gives (words are parsed by their declarations)."""
        values: dict[str, Any] = {}
        for name, word in self.given:
            declared = TRAIN_CONTROLS[name]
            values[name] = tuple(re.split(r"[\s,]+", word.strip())) if declared.kind == "words" else word
        return values


# ---------------------------------------------------------------- what the dropdowns offer


def _target_options() -> list[Option]:
    """This machine, then the catalog entries a training plan takes (NVIDIA and AMD GPUs: torch's cuda devices)."""
    return [o for o in target_options() if o.value is None or _trained_on(o.value)]


def _trained_on(target: str) -> bool:
    found = target_of(target)
    return found is not None and found.accelerator.device in TRAINED_ON


# The dropdowns whose entries are not their declared choices, by argument name.
OPTIONS: dict[str, Callable[[], list[Option]]] = {"target": _target_options}


def options(name: str) -> list[Option]:
    """The entries of one dropdown: its declared choices, or what OPTIONS reads for it."""
    declared = TRAIN_CONTROLS[name]
    if name in OPTIONS:
        return OPTIONS[name]()
    if declared.choices is None:
        raise TypeError(f"the dropdown {name!r} declares no choices and OPTIONS has no entry for it")
    return [Option(choice, choice) for choice in declared.choices]


# ---------------------------------------------------------------- preview


@dataclass
class TrainPreview:
    """What a form gives: the training plan and its code (the notebook training cell for one device, else the
    training script), or the message saying which entry is wrong."""

    form: TrainForm
    plan: TrainPlan | None = None
    code: str = ""
    error: str | None = None

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
    if not form.model.strip():
        return TrainPreview(form, error="model: give a Hub id like 'org/name' or the folder of a local model")
    try:
        with meta_build.quiet():
            found = train_plan(form.model.strip(), offline=form.offline, **form.train_values())
            code = found.code.rstrip("\n")
    except UserError as exc:
        return TrainPreview(form, error=str(exc))
    return TrainPreview(form, found, code)
