"""The words of ``%hw`` and ``python -m nbhw``: one parser definition serves the magic and the CLI.

Every parse error becomes a :class:`~nbhw.core.errors.UserError` with one line naming the valid values;
the magic turns it into IPython's ``UsageError``, the CLI into exit code 2.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence
from typing import Any, NoReturn

from nbhw.core.errors import UserError
from nbhw.core.plan.arguments import QUANTIZATION

MAGIC_COMMANDS = ("devices", "memory", "attention", "load", "report")
CLI_COMMANDS = ("devices", "report", "attention", "plan")
QUANTIZE = tuple(QUANTIZATION)


class HelpShown(Exception):
    """Raised instead of exiting after argparse printed help (``--help`` in the CLI)."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UserError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        m = re.fullmatch(r"argument ([^:]*): invalid choice: (.*) \(choose from (.*)\)", message)
        if m:
            what = "subcommand" if m.group(1).startswith("{") else f"{m.group(1)} value"
            message = f"unknown {what} {m.group(2)}; valid: {m.group(3).replace(chr(39), '')}"
        raise UserError(f"{self.prog}: {message}")

    def _subparsers_choices(self) -> list[str]:
        for action in self._subparsers._group_actions if self._subparsers else []:
            return list(getattr(action, "choices", None) or {})
        return []

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            raise UserError(message)
        raise HelpShown()


def seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (e.g. 0.5)") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value


def _json(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true", help="never contact the Hub, even for config.json")


def _attention(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", help="model id or local path (config read offline unless allowed)")
    p.add_argument(
        "--device", metavar="DEV", help="device to advise for, e.g. cuda:0, cpu, mps (default: the best usable)"
    )
    p.add_argument("--dtype", help="dtype to advise for: float32, float16, bfloat16, auto")
    p.add_argument("--kernel", metavar="ORG/REPO[:FUNC]", help="also check this Hub kernel as attn_implementation")
    _model_options(p)
    _json(p)


def _load(p: argparse.ArgumentParser, *, emit: bool) -> None:
    p.add_argument("model", nargs="?", help="model id or local path (default: nbhw's tiny local model)")
    p.add_argument(
        "--device-map",
        dest="device_map",
        metavar="MAP",
        help='auto (default), balanced, balanced_low_0, sequential, a device (cpu, cuda:0), an int, {"": "cpu"}, none',
    )
    p.add_argument("--dtype", help="float32, float16, bfloat16 or auto")
    p.add_argument(
        "--attn",
        dest="attn_implementation",
        metavar="IMPL",
        help="attn_implementation, e.g. sdpa, eager, flash_attention_2",
    )
    p.add_argument("--kernels", dest="use_kernels", action="store_true", help="use_kernels=True (Hub kernels)")
    p.add_argument("--quantize", choices=QUANTIZE, help="bitsandbytes quantization")
    p.add_argument(
        "--max-memory",
        dest="max_memory",
        nargs="+",
        metavar="DEV=SIZE",
        default=None,
        help="per-device memory budget, e.g. 0=70GiB cpu=200GiB",
    )
    _model_options(p)
    if emit:
        p.add_argument(
            "--emit", action="store_true", help="write the code into a new cell below instead of opening the panel"
        )
    else:
        _json(p)


def _add_commands(parser: argparse.ArgumentParser, commands: Sequence[str]) -> None:
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(commands) + "}", parser_class=type(parser))
    helps = {
        "devices": "the backends, devices and who picks what here",
        "memory": "live memory graph with per-cell attribution",
        "attention": "attention, kernel and dtype options that will really work",
        "load": "the from_pretrained cell for this hardware: the panel's Load tab, pre-filled (--emit: a cell below)",
        "plan": "the from_pretrained cell, its estimate, placement and dry-run problems",
        "report": "environment report for bug reports",
    }
    for name in commands:
        p = sub.add_parser(name, help=helps[name], description=helps[name], add_help=parser.add_help)
        if name in {"devices", "report"}:
            _json(p)
        elif name == "memory":
            p.add_argument("--interval", type=seconds, metavar="S", help="seconds between samples")
            p.add_argument("--window", type=seconds, metavar="S", help="seconds of history the graph keeps")
            p.add_argument("--stop", action="store_true", help="stop sampling; the graph says it stopped")
        elif name == "attention":
            _attention(p)
        elif name in {"load", "plan"}:
            _load(p, emit=name == "load")


def magic_parser() -> Parser:
    """The parser behind ``%hw``."""
    parser = Parser(prog="%hw", add_help=False, description="nbhw: hardware for Hugging Face models, in the notebook")
    _add_commands(parser, MAGIC_COMMANDS)
    return parser


def cli_parser() -> Parser:
    """The parser behind ``python -m nbhw``."""
    parser = Parser(prog="nbhw", description="nbhw: hardware for Hugging Face models")
    _add_commands(parser, CLI_COMMANDS)
    return parser


def split(line: str) -> list[str]:
    """Split a magic line like a shell would; unbalanced quotes are a user mistake."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UserError(f"%hw: cannot split {line!r}: {exc}") from None


def subparser(parser: Parser, command: str) -> argparse.ArgumentParser | None:
    """The parser of one subcommand."""
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        choices: Any = getattr(action, "choices", None) or {}
        if command in choices:
            found: argparse.ArgumentParser = choices[command]
            return found
    return None


def options(parser: argparse.ArgumentParser) -> list[str]:
    """The long options a parser takes."""
    return [s for a in parser._actions for s in a.option_strings if s.startswith("--") and s != "--help"]


def parse(parser: Parser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse, turning every mistake into one UserError line that names the valid words."""
    args, extra = parser.parse_known_args(list(argv))
    if extra:
        command = getattr(args, "command", None)
        sub = subparser(parser, command) if command else None
        valid = ", ".join(options(sub)) if sub is not None else ", ".join(sorted(parser._subparsers_choices()))
        where = f"{parser.prog} {command}" if command else parser.prog
        raise UserError(f"{where}: unrecognized {' '.join(extra)!r}; valid: {valid or 'no options'}")
    return args


def magic_help() -> str:
    """``%hw?``: the usage of every subcommand."""
    parser = magic_parser()
    parts = [
        "%hw                          full panel: Devices · Memory · Attention · Load",
        "",
        parser.format_help().strip(),
    ]
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        choices: Any = getattr(action, "choices", None) or {}
        for name, sub in choices.items():
            parts += ["", f"%hw {name}", sub.format_help().strip()]
    return "\n".join(parts)
