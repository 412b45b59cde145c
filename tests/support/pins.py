"""Pages printed with the pinned libraries (scripts/constraints.txt): their tests compare only under those."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def skip_unless_pinned(what: str, *names: str) -> None:
    """Skip when one of ``names`` is not at its pinned version here (the compatibility run's other sets)."""
    text = (ROOT / "scripts" / "constraints.txt").read_text()
    pins = dict(line.split("==", 1) for line in text.splitlines() if "==" in line)
    for name in names:
        here = importlib.metadata.version(name)
        if pins.get(name) != here:
            pytest.skip(f"{what} is for {name} {pins.get(name)} (the pins); {here} here")
