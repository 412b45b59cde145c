"""The arguments of ``%hw memory`` / ``nbhw.monitor()``, declared once (see nbhw.core.argument)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nbhw.core.argument import argument, arguments
from nbhw.core.errors import UserError


def seconds(option: str) -> Callable[[str], float]:
    """The parser of a positive number of seconds for one option (its name goes into the message)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise UserError(f"{option} {text!r} is not a number of seconds (e.g. 0.5)") from None
        if not 0 < value < float("inf"):
            raise UserError(f"{option} {text!r} must be a positive number of seconds")
        return value

    return parse


@dataclass(frozen=True)
class MemoryArgs:
    """How the memory graph samples; None: the %config HwMagics defaults."""

    interval: float | None = argument(metavar="S", parse=seconds("--interval"), help="seconds between samples")
    window: float | None = argument(metavar="S", parse=seconds("--window"), help="seconds of history the graph keeps")
    stop: bool = argument(
        default=False, kind="switch", check=bool, help="stop sampling; the graph says it stopped"
    )  # fmt: skip


MEMORY_ARGUMENTS = arguments(MemoryArgs)


def variable_names(value: object) -> tuple[str, ...]:
    """Variable names to free: one name or several (``"model"``, ``["model", "opt"]``)."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise UserError(f"names must be variable names (strings), not {value!r}")


@dataclass(frozen=True)
class HoldersArgs:
    """What ``%hw holders`` / ``nbhw.holders()`` shows."""

    device: str | None = argument(metavar="DEV", help="only this device (cuda:0, mps:0, cpu)")


@dataclass(frozen=True)
class FreeArgs:
    """What ``%hw free`` / ``nbhw.free()`` / the Memory tab's free button does: only what is chosen."""

    names: tuple[str, ...] = argument(
        default=(), kind="words", positional=True, check=variable_names, help="variables to delete from the namespace"
    )  # fmt: skip
    history: bool = argument(
        default=False, kind="switch", check=bool, help="clear the output history (Out, _, __, ___, IPython's copies)"
    )  # fmt: skip
    traceback: bool = argument(
        default=False, kind="switch", check=bool, help="clear the last error's traceback (its frames keep tensors)"
    )  # fmt: skip
    cache: bool = argument(
        default=False, kind="switch", check=bool, help="the device's empty_cache(): hand its cached blocks back"
    )  # fmt: skip


HOLDERS_ARGUMENTS = arguments(HoldersArgs)
FREE_ARGUMENTS = arguments(FreeArgs)
