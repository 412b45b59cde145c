"""The one status of an advice row: attention implementations, quantization methods, every table of options."""

from __future__ import annotations

from enum import Enum


class Status(str, Enum):
    """Whether an option works on the target, in the words the tables show."""

    WORKS = "works"
    WONT = "won't work"
    HUB = "works via Hub kernel download"
    DOWNLOAD = "needs download, not checked"
    DEPENDS = "depends on the device"
    PACKAGE = "needs a package"
    DEQUANTIZED = "loads dequantized"
    NOT_CHECKED = "not checked"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def usable(self) -> bool:
        """Whether a user can pick it and expect it to load."""
        return self in {Status.WORKS, Status.HUB}

    @property
    def mark(self) -> str:
        """The one-character mark beside an option in the panel's controls."""
        return {Status.WORKS: "✓", Status.WONT: "✗", Status.HUB: "↓", Status.PACKAGE: "+"}.get(self, "?")

    @property
    def css(self) -> str:
        """The CSS class of the status cell in HTML tables."""
        return {Status.WORKS: "ok", Status.WONT: "no"}.get(self, "warn")


STATUSES = tuple(Status)
