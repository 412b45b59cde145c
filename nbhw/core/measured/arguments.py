"""The arguments of ``%hw pin`` / ``nbhw.pin()``, declared once (see nbhw.core.argument)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from nbhw.core.argument import argument, arguments
from nbhw.core.errors import UserError


def check_pin_path(value: Any) -> str:
    """Where the pin goes: a path whose folder exists (the file is written or replaced)."""
    if not isinstance(value, str | os.PathLike) or not str(value).strip():
        raise UserError(f"pin path {value!r} is not a path; valid: a file name such as run.json")
    folder = os.path.dirname(os.path.abspath(os.path.expanduser(str(value))))
    if not os.path.isdir(folder):
        raise UserError(f"pin path {str(value)!r}: the folder {folder!r} does not exist")
    if os.path.isdir(os.path.expanduser(str(value))):
        raise UserError(f"pin path {str(value)!r} is a folder; valid: a file name such as run.json")
    return str(value)


def check_variable(value: Any) -> str | None:
    """A variable's name (checked against the loaded models when pinning)."""
    if value is None:
        return None
    if not isinstance(value, str) or not all(part.isidentifier() for part in value.split(".")):
        raise UserError(f"--model {value!r} is not a variable name; valid: the name holding the model, e.g. model")
    return value


@dataclass(frozen=True)
class PinArgs:
    """What ``%hw pin`` writes and for which model."""

    path: str | None = argument(positional=True, check=check_pin_path, help="the JSON file to write, e.g. run.json")
    model: str | None = argument(
        metavar="NAME", check=check_variable, help="the variable holding the model (default: the only one loaded)"
    )  # fmt: skip


PIN_ARGUMENTS = arguments(PinArgs)
