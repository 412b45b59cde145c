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
