"""``python -m nbhw``: the same words as %hw, for terminals and scripts. Exit 2 on a user mistake."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Sequence
from typing import Any

from nbhw import commands
from nbhw.core.errors import UserError


def _printed(result: Any, args: argparse.Namespace) -> None:
    if getattr(args, "emit", False) and getattr(result, "code", None) is not None:
        print(result.code, end="")  # the cell alone, for a file or a pipe
    elif args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        text = result.text()
        print(text, end="" if text.endswith("\n") else "\n")


def _answered(args: argparse.Namespace) -> int:
    """A command of the shared table (nbhw.commands.ANSWERS): its answer printed; exit 1 when it says something
    will fail (a script can stop before loading)."""
    result = commands.answer(args)
    _printed(result, args)
    return 1 if commands.failed(result) else 0


def _memory(args: argparse.Namespace) -> int:
    """The figures now: one sample of every source (a terminal process has no cells to attribute)."""
    from nbhw.core import memory  # numpy: only for this command

    sampler = memory.Sampler()
    sampler.tick()
    print(memory.text(sampler, memory.CellLog(sampler)))
    return 0


def _session_only(args: argparse.Namespace) -> int:
    """holders, free, loaded and pin read the running session's tensors and models: a new process has none."""
    raise UserError(
        f"nbhw {args.command}: only inside a running Python session (%hw {args.command} in IPython or Jupyter, "
        f"nbhw.{args.command}() in Python); a new `python -m nbhw` process holds none of your tensors"
    )


# The commands of the shared table, and the two a terminal answers its own way; a test checks every command is here.
RUNNERS = {**dict.fromkeys(commands.ANSWERS, _answered), "memory": _memory,
           **dict.fromkeys(("holders", "free", "loaded", "pin"), _session_only)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the exit code."""
    parser = commands.cli_parser()
    try:
        args = commands.parse(parser, sys.argv[1:] if argv is None else argv)
        if args.command is None:
            parser.print_help()
            return 2
        return RUNNERS[args.command](args)
    except commands.HelpShown:
        return 0
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def cli() -> None:
    """The process entry (``python -m nbhw``, the ``nbhw`` script): :func:`main`, then exit with its code."""
    # A one-shot process: the cyclic collector would walk torch's and transformers' heaps again and again (80 ms
    # for the report, seconds for a plan) to free little before the process exits anyway.
    gc.disable()
    sys.exit(main())


if __name__ == "__main__":
    cli()
