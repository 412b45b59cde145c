"""The one exception type for user mistakes: a one-line message that names the valid values."""

from __future__ import annotations

from collections.abc import Iterable


class UserError(ValueError):
    """A mistake in what the user asked for; the message is one line and names the valid values."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def one_of(what: str, value: object, valid: Iterable[object]) -> UserError:
    """The error for `value` not being one of `valid`."""
    choices = ", ".join(str(v) for v in valid)
    return UserError(f"unknown {what} {value!r}; valid: {choices}")
