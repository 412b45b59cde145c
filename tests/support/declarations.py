"""What each surface (CLI parser, declared arguments) says its words are: read from the surfaces themselves."""

from __future__ import annotations

import argparse

from nbhw import commands
from nbhw.core.argument import Argument


def options_of(top: commands.Parser, command: str) -> dict[str, argparse.Action]:
    sub = commands.subparser(top, command)
    assert sub is not None, command
    return {s: a for a in sub._actions for s in a.option_strings if s not in {"-h", "--help"}} | {
        a.dest: a for a in sub._actions if not a.option_strings
    }


def declared_words(arguments: tuple[Argument, ...]) -> set[str]:
    return {w for a in arguments for w in ((a.name,) if a.positional else (*a.options, *a.negations))}
