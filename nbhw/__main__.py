"""``python -m nbhw``: the same words as %hw, for terminals and scripts. Exit 2 on a user mistake."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence

from nbhw import commands
from nbhw.core.errors import UserError


def _devices(args: argparse.Namespace) -> int:
    import json

    from nbhw.core.hardware.detect import detect

    hardware = detect()
    print(json.dumps(hardware.to_dict(), indent=2) if args.json else hardware.text())
    return 0


def _report(args: argparse.Namespace) -> int:
    from nbhw.core.hardware.report import report

    result = report()
    print(result.json() if args.json else result.text())
    return 0


def _attention(args: argparse.Namespace) -> int:
    import json

    from nbhw.core.advice.attention import advise

    advice = advise(args.model, device=args.device, dtype=args.dtype, kernel=args.kernel, offline=args.offline)
    print(json.dumps(advice.to_dict(), indent=2) if args.json else advice.text())
    return 0


def _plan(args: argparse.Namespace) -> int:
    import json

    from nbhw.core.plan.load_plan import from_words

    plan = from_words(args)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else plan.text())
    return 1 if plan.check() else 0


COMMANDS = {"devices": _devices, "report": _report, "attention": _attention, "plan": _plan}


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return the exit code."""
    parser = commands.cli_parser()
    try:
        args = commands.parse(parser, sys.argv[1:] if argv is None else argv)
        if args.command is None:
            parser.print_help()
            return 2
        return COMMANDS[args.command](args)
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
