"""The words of %hw holders / %hw free, declared once; the CLI says why it has no session to look at."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest

import nbhw
from nbhw import __main__ as cli
from nbhw import commands
from nbhw.core.memory.arguments import FREE_ARGUMENTS, HOLDERS_ARGUMENTS
from tests.support.declarations import declared_words, options_of


@pytest.mark.parametrize("surface", ["magic", "cli"])
def test_the_words_are_exactly_the_declared_arguments(surface: commands.Surface) -> None:
    top = commands.parser(surface)
    assert set(options_of(top, "holders")) == declared_words(HOLDERS_ARGUMENTS) | {"--json"}
    assert set(options_of(top, "free")) == declared_words(FREE_ARGUMENTS) | {"--json"}


def test_the_functions_take_the_declared_keywords() -> None:
    assert set(inspect.signature(nbhw.holders).parameters) == {a.name for a in HOLDERS_ARGUMENTS}
    assert set(inspect.signature(nbhw.free).parameters) == {a.name for a in FREE_ARGUMENTS}
    for a in FREE_ARGUMENTS:  # the same defaults: nothing is chosen unless asked
        assert inspect.signature(nbhw.free).parameters[a.name].default == a.default


def test_free_takes_any_number_of_names_then_the_switches() -> None:
    args = commands.parse(commands.magic_parser(), ["free", "model", "opt", "--history", "--cache"])
    assert commands.values(args, FREE_ARGUMENTS) == {
        "names": ("model", "opt"), "history": True, "traceback": False, "cache": True,
    }  # fmt: skip
    assert commands.values(commands.parse(commands.magic_parser(), ["free"]), FREE_ARGUMENTS)["names"] == ()


def test_the_magics_help_lists_both() -> None:
    text = commands.magic_help()
    assert "%hw holders [--device DEV] [--json]" in text
    assert "%hw free [NAMES ...] [--history] [--traceback] [--cache] [--json]" in text


@pytest.mark.parametrize("command", ["holders", "free"])
def test_the_cli_says_in_one_line_that_only_a_session_holds_tensors(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([command]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: nbhw {command}: only inside a running Python session (%hw {command} in IPython or Jupyter, "
        f"nbhw.{command}() in Python); a new `python -m nbhw` process holds none of your tensors\n"
    )


def test_the_cli_help_says_so_too() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nbhw", "free", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0
    assert "only in %hw and Python: a new process holds none of your tensors" in " ".join(proc.stdout.split())
