"""``%hw``: parse the words, then call core and ui. Nothing else lives here."""

from __future__ import annotations

import argparse
import json
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display
from traitlets import Float

from nbhw import words
from nbhw.core.errors import UserError


def in_kernel(shell: Any) -> bool:
    """Whether the shell talks to a Jupyter front end (widgets and HTML render) rather than a terminal."""
    return getattr(shell, "kernel", None) is not None


@magics_class
class HwMagics(Magics):
    """The ``%hw`` magic; ``%config HwMagics.interval = 1.0`` sets the memory graph's defaults."""

    interval = Float(0.5, help="Seconds between memory samples for %hw memory.").tag(config=True)
    window = Float(600.0, help="Seconds of memory history the graph keeps.").tag(config=True)

    @line_magic
    def hw(self, line: str = "") -> None:
        try:
            args = words.parse(words.magic_parser(), words.split(line))
            getattr(self, f"_run_{args.command or 'panel'}")(args)
        except UserError as exc:
            raise UsageError(str(exc)) from None
        except words.HelpShown:
            print(words.magic_help())

    hw.__doc__ = words.magic_help()

    def _run_panel(self, args: argparse.Namespace) -> None:
        from nbhw.core.detect import detect

        display(detect())

    def _run_devices(self, args: argparse.Namespace) -> None:
        from nbhw.core.detect import detect

        hardware = detect()
        if args.json:
            print(json.dumps(hardware.to_dict(), indent=2))
        else:
            display(hardware)

    def _run_report(self, args: argparse.Namespace) -> None:
        from nbhw.core.report import report

        result = report()
        if args.json:
            print(result.json())
        else:
            display(result)

    def _run_memory(self, args: argparse.Namespace) -> None:
        raise UserError("%hw memory: not available in this version")

    def _run_attention(self, args: argparse.Namespace) -> None:
        from nbhw.core.attention import advise

        advice = advise(args.model, device=args.device, dtype=args.dtype, kernel=args.kernel, offline=args.offline)
        if args.json:
            print(json.dumps(advice.to_dict(), indent=2))
        else:
            display(advice)

    def _run_load(self, args: argparse.Namespace) -> None:
        from nbhw.core.plan import from_words

        plan = from_words(args)
        if args.emit:
            self.shell.set_next_input(plan.code, replace=False)
            display(plan.view(code=False))
        else:
            display(plan)


def load(shell: Any) -> None:
    """Register %hw; IPython's Magics adds the instance to shell.configurables, so %config reaches it."""
    shell.register_magics(HwMagics(shell=shell))


def unload(shell: Any) -> None:
    """Remove %hw and everything the extension started."""
    manager = shell.magics_manager
    manager.magics["line"].pop("hw", None)
    manager.registry.pop("HwMagics", None)
    # By class name: %reload_ext re-imports this module, so an older instance has an older class.
    shell.configurables[:] = [c for c in shell.configurables if type(c).__name__ != "HwMagics"]
