"""One argument, declared once: its keyword, its words, its help, its check, its control and what it emits.

Every surface is derived from these declarations: the options of ``%hw`` and ``python -m nbhw``
(:mod:`nbhw.commands`), the keywords of ``nbhw.plan()`` / ``nbhw.panel()`` and their ``to_dict()``, the Load tab's
controls (:mod:`nbhw.ui.load`) and the keywords of the emitted cell (:mod:`nbhw.core.plan.codegen`). A dataclass
declares its arguments as fields made with :func:`argument`; :func:`arguments` reads them back.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from nbhw.core.errors import UserError

# "toggle": a switch that can also be turned off (--kernels / --no-kernels); not given, it stays None (the default).
Kind = Literal["word", "words", "switch", "toggle"]
Control = Literal["dropdown", "checkbox", "text", "sizes"]
METADATA = "nbhw.argument"


def _same(value: Any) -> Any:
    return value


def _word(value: Any) -> Any:
    return value


@dataclass(frozen=True)
class Argument:
    """One argument: the Python keyword, the option people type, how a word becomes a value, and where it shows."""

    name: str
    help: str
    flag: str | None = None
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    kind: Kind = "word"
    choices: tuple[str, ...] | None = None
    parse: Callable[[Any], Any] = _same
    check: Callable[[Any], Any] = _same
    default: Any = None
    control: Control | None = None
    emits: str | None = None
    word: Callable[[Any], Any] = _word
    positional: bool = False

    @property
    def option(self) -> str:
        """The option of the magic and the CLI: ``--attn-implementation`` for ``attn_implementation``."""
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def options(self) -> tuple[str, ...]:
        """The option and its aliases (older words that keep working)."""
        return (self.option, *self.aliases)

    @property
    def negations(self) -> tuple[str, ...]:
        """A toggle's options that turn it off (``--no-kernels``); none for other kinds."""
        return tuple("--no-" + o.removeprefix("--") for o in self.options) if self.kind == "toggle" else ()

    def value(self, given: Any) -> Any:
        """The checked value of what a user gave, as a word (``"32k"``) or as a Python value (``32768``)."""
        return self.check(self.parse(given) if isinstance(given, str) else given)


def argument(*, help: str, default: Any = None, **declared: Any) -> Any:
    """A dataclass field that declares an argument (its name is the field's name)."""
    spec = {"help": help, "default": default, **declared}
    return dataclasses.field(default=default, metadata={METADATA: spec})


def arguments(cls: Any) -> tuple[Argument, ...]:
    """The arguments a dataclass declares, in field order."""
    found = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(METADATA)
        if spec is not None:
            found.append(Argument(name=f.name, **spec))
    return tuple(found)


def checked(cls: Any, values: Mapping[str, Any]) -> Any:
    """An instance of ``cls`` from keyword values, each checked by its declaration; unknown names are mistakes."""
    declared = {a.name: a for a in arguments(cls)}
    unknown = [name for name in values if name not in declared]
    if unknown:
        raise UserError(f"unknown argument {unknown[0]!r}; valid: {', '.join(declared)}")
    return cls(**{name: declared[name].value(v) for name, v in values.items()})


def given(namespace: Any, declared: Iterable[Argument]) -> dict[str, Any]:
    """The declared arguments a parsed command line gave, as typed (argparse's dest is each argument's name)."""
    found = {a.name: getattr(namespace, a.name, None) for a in declared}
    return {name: value for name, value in found.items() if value is not None}


def to_dict(instance: Any) -> dict[str, Any]:
    """Every declared argument of ``instance`` as JSON-ready data (see :func:`plain_values`)."""
    declared = arguments(type(instance))
    return plain_values({a.name: getattr(instance, a.name) for a in declared}, declared)


def plain_values(values: Mapping[str, Any], declared: Iterable[Argument]) -> dict[str, Any]:
    """Checked values of declared arguments as JSON-ready data: dict keys as strings, tuples as lists, a checked
    object (a Target) as the words its declaration writes it with."""
    by_name = {a.name: a for a in declared}

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, tuple | list):
            return [plain(v) for v in value]
        return value

    def written(a: Argument, value: Any) -> Any:
        return value if isinstance(value, PLAIN) else a.word(value)

    return {name: plain(written(by_name[name], value)) for name, value in values.items()}


PLAIN = (str, int, float, bool, type(None), dict, tuple, list)  # what JSON writes as it is


def signature(func: Callable[..., Any], *groups: Iterable[Argument], keep: Iterable[str] = ()) -> inspect.Signature:
    """``func``'s signature with the declared arguments as keyword-only parameters (what help() and Jupyter show)."""
    own = inspect.signature(func)
    kept = [p for name, p in own.parameters.items() if name in set(keep)]
    declared = [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=a.default) for g in groups for a in g]
    positional = [p for p in kept if p.kind is not inspect.Parameter.KEYWORD_ONLY]
    keyword = [p for p in kept if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return own.replace(parameters=[*positional, *declared, *keyword])


# ---------------------------------------------------------------- arguments several commands share

MODEL = Argument(
    "model", "model id or local path (config read offline unless allowed; default: nbhw's tiny local model)",
    positional=True,
)  # fmt: skip
OFFLINE = Argument("offline", "never contact the Hub, even for config.json", kind="switch", default=False)
JSON = Argument("json", "print JSON instead of the table", kind="switch", default=False)
EMIT = Argument(
    "emit", "%hw: write the code into a new cell below instead of opening the panel; the CLI prints only the code",
    kind="switch", default=False,
)  # fmt: skip
