"""A Load tab mode without widgets: the words its controls hold, what its dropdowns offer, and what a form previews.

A mode (Train: :mod:`nbhw.core.train.train_form`, Serve: :mod:`nbhw.core.serve.serve_form`) shows one control per
declared argument of its plan that names a ``control``, in declaration order. Its form, a :class:`ControlsForm`
subclass naming those arguments, holds their words as typed (the magic's words: ``batch="4"``,
``lora_target_modules="q_proj v_proj"``); :meth:`FormPreview.planned` turns a form into its plan, or into the
one-line message of the first mistake. Nothing here raises for a user's entry and nothing imports a UI library.
It sits over the load planner (its dropdown entries are the Load tab's :class:`~nbhw.core.plan.load_form.Option`)
and under the plans whose modes use it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from nbhw.core.argument import Argument
from nbhw.core.errors import UserError, one_of
from nbhw.core.hf import meta_build
from nbhw.core.plan.load_form import Option

MODEL_MISSING = "model: give a Hub id like 'org/name' or the folder of a local model"


def controls_of(declared: Iterable[Argument]) -> dict[str, Argument]:
    """The declared arguments a mode shows a control for, by name, in declaration order."""
    return {a.name: a for a in declared if a.control is not None}


def as_word(declared: Argument, value: Any) -> Any:
    """A value as its control holds it: a bool for a checkbox, else text (None: nothing set)."""
    if declared.control == "checkbox":
        return bool(value)
    shown = declared.word(value) if value is not None else None
    if declared.kind == "words" and shown is not None and not isinstance(shown, str):
        shown = " ".join(shown)
    return None if shown is None or shown == () else str(shown)


FormT = TypeVar("FormT", bound="ControlsForm")


@dataclass(frozen=True)
class ControlsForm:
    """What a mode's controls hold: the model, offline, and a word per control that is not its default.

    A subclass names its ``CONTROLS`` (:func:`controls_of` its plan's declarations), the dropdowns whose entries
    are not their declared choices (``OPTIONS``) and the ``MODE`` its mistakes name.
    ``Form.of(model, batch="4")``; ``form.word("batch")`` is what the batch field shows.
    """

    CONTROLS: ClassVar[dict[str, Argument]] = {}
    OPTIONS: ClassVar[Mapping[str, Callable[[], list[Option]]]] = {}
    MODE: ClassVar[str] = ""

    model: str
    offline: bool = False
    given: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def default_word(cls, name: str) -> Any:
        """What a control holds when nothing was chosen: the declared default as a word (None: an empty field)."""
        return as_word(cls.CONTROLS[name], cls.CONTROLS[name].default)

    @classmethod
    def form_words(cls, values: Mapping[str, Any]) -> dict[str, Any]:
        """Plan keyword values (as nbhw.panel() takes them) as the words the controls hold; an argument the mode has
        no control for is a one-line mistake naming those it has."""
        unknown = [name for name in values if name not in cls.CONTROLS]
        if unknown:
            raise one_of("argument", unknown[0], list(cls.CONTROLS))
        return {name: value if isinstance(value, str) else as_word(cls.CONTROLS[name], value)
                for name, value in values.items()}  # fmt: skip

    @classmethod
    def options(cls, name: str) -> list[Option]:
        """The entries of one dropdown: its declared choices, or what OPTIONS reads for it."""
        if name in cls.OPTIONS:
            return cls.OPTIONS[name]()
        choices = cls.CONTROLS[name].choices
        if choices is None:
            raise TypeError(f"the dropdown {name!r} declares no choices and OPTIONS has no entry for it")
        return [Option(choice, choice) for choice in choices]

    @classmethod
    def of(cls: type[FormT], model: str, *, offline: bool = False, **words: Any) -> FormT:
        unknown = [name for name in words if name not in cls.CONTROLS]
        if unknown:
            raise TypeError(f"the {cls.MODE} mode has no control {unknown[0]!r}; it has {', '.join(cls.CONTROLS)}")
        kept = tuple((n, w) for n, w in words.items() if w not in (None, "") and w != cls.default_word(n))
        return cls(model, offline, kept)

    def word(self, name: str) -> Any:
        """What one control holds (its default word when not set)."""
        return dict(self.given).get(name, self.default_word(name))

    @property
    def words(self) -> dict[str, Any]:
        """The controls that hold something other than their default."""
        return dict(self.given)

    def replace(self: FormT, *, model: str | None = None, offline: bool | None = None, **words: Any) -> FormT:
        """The same form with the model, offline or some controls changed."""
        return self.of(
            self.model if model is None else model,
            offline=self.offline if offline is None else offline,
            **{**self.words, **words},
        )

    def plan_values(self) -> dict[str, Any]:
        """The plan's keyword arguments this form gives (words are parsed by their declarations)."""
        values: dict[str, Any] = {}
        for name, word in self.given:
            declared = self.CONTROLS[name]
            values[name] = tuple(re.split(r"[\s,]+", word.strip())) if declared.kind == "words" else word
        return values


class Planned(Protocol):
    """A plan a mode previews: its cell's source."""

    @property
    def code(self) -> str: ...


PlanT = TypeVar("PlanT", bound=Planned)
PreviewT = TypeVar("PreviewT", bound="FormPreview[Any, Any]")


@dataclass
class FormPreview(Generic[FormT, PlanT]):
    """What a form gives: its plan and the plan's code, or the message saying which entry is wrong."""

    form: FormT
    plan: PlanT | None = None
    code: str = ""
    error: str | None = None

    @classmethod
    def planned(cls: type[PreviewT], form: Any, make: Callable[..., Any]) -> PreviewT:
        """``make(model, offline=..., **form.plan_values())`` of a form (quietly: a meta build's warnings are not
        the user's), or the one-line message of the first mistake."""
        if not form.model.strip():
            return cls(form, error=MODEL_MISSING)
        try:
            with meta_build.quiet():
                found = make(form.model.strip(), offline=form.offline, **form.plan_values())
                code = found.code.rstrip("\n")
        except UserError as exc:
            return cls(form, error=str(exc))
        return cls(form, found, code)
