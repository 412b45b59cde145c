"""``python -m nbhw``: the same words as %hw, for terminals and scripts. Exit 2 on a user mistake."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Sequence
from typing import Any

from nbhw import commands
from nbhw.core.argument import given
from nbhw.core.errors import UserError

# Each runner imports the core module it runs when it runs: a command pays for its own imports only.


def _printed(result: Any, args: argparse.Namespace) -> None:
    print(json.dumps(result.to_dict(), indent=2) if args.json else result.text())


def _devices(args: argparse.Namespace) -> int:
    from nbhw.core.hardware.detect import detect

    _printed(detect(), args)
    return 0


def _report(args: argparse.Namespace) -> int:
    from nbhw.core.hardware.report import report

    result = report()
    print(result.json() if args.json else result.text())
    return 0


def _doctor(args: argparse.Namespace) -> int:
    """Exit 1 when a finding is an error: something will fail (a script can stop before loading)."""
    from nbhw.core.hardware.doctor import doctor

    result = doctor()
    _printed(result, args)
    return 1 if result.errors else 0


def _memory(args: argparse.Namespace) -> int:
    """The figures now: one sample of every source (a terminal process has no cells to attribute)."""
    from nbhw.core import memory  # numpy: only for this command

    sampler = memory.Sampler()
    sampler.tick()
    print(memory.text(sampler, memory.CellLog(sampler)))
    return 0


def _attention(args: argparse.Namespace) -> int:
    from nbhw.core.advice.arguments import ADVICE_ARGUMENTS
    from nbhw.core.advice.attention import advise

    _printed(advise(args.model, offline=args.offline, **given(args, ADVICE_ARGUMENTS)), args)
    return 0


def _quantization(args: argparse.Namespace) -> int:
    from nbhw.core.advice import quantization
    from nbhw.core.advice.arguments import QUANTIZATION_ARGUMENTS

    _printed(quantization.advise(args.model, offline=args.offline, **given(args, QUANTIZATION_ARGUMENTS)), args)
    return 0


def _targets(args: argparse.Namespace) -> int:
    from nbhw.core.hardware.targets import targets

    _printed(targets(args.vendor), args)
    return 0


def _load(args: argparse.Namespace) -> int:
    from nbhw.core.plan.load_plan import LoadPlan
    from nbhw.core.plan.task import from_words

    plan = from_words(args)  # a word the other task takes is a mistake here (exit 2)
    if not isinstance(plan, LoadPlan):
        return _trained(plan, args)
    if args.emit:
        print(plan.code, end="")
    else:
        _printed(plan, args)
    return 1 if plan.check() else 0


def _fit(args: argparse.Namespace) -> int:
    """Exit 1 when nothing fits (a script can stop before loading)."""
    from nbhw.core.fit.solver import from_words

    result = from_words(args)
    if args.emit and result.code is not None:
        print(result.code, end="")
    else:
        _printed(result, args)
    return 0 if result.plan is not None else 1


def _session_only(args: argparse.Namespace) -> int:
    """holders, free, loaded and pin read the running session's tensors and models: a new process has none."""
    raise UserError(
        f"nbhw {args.command}: only inside a running Python session (%hw {args.command} in IPython or Jupyter, "
        f"nbhw.{args.command}() in Python); a new `python -m nbhw` process holds none of your tensors"
    )


def _train(args: argparse.Namespace) -> int:
    """Exit 1 when the plan does not fit or does not run (a script can stop before training)."""
    from nbhw.core.train.train_plan import from_words  # lazy: torch and peft only for this command

    return _trained(from_words(args), args)


def _trained(plan: Any, args: argparse.Namespace) -> int:
    if args.emit:
        print(plan.code, end="")
    elif args.json:
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.text(), end="")
    return 1 if plan.fits is False or not plan.recommended.ok else 0


# One runner per command of the table (nbhw.commands.COMMANDS); a test checks they match.
RUNNERS = {
    "devices": _devices,
    "memory": _memory,
    "attention": _attention,
    "load": _load,
    "quantization": _quantization,
    "targets": _targets,
    "train": _train,
    "fit": _fit,
    "report": _report,
    "doctor": _doctor,
    "holders": _session_only,
    "free": _session_only,
    "loaded": _session_only,
    "pin": _session_only,
}


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
