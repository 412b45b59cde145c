"""``%hw``: parse the words, then call core and ui. Nothing else lives here."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.display import display
from traitlets import Float

from nbhw.core.errors import UserError
from nbhw.core.memory.out_of_memory import is_out_of_memory

if TYPE_CHECKING:
    from collections.abc import Iterable

    from nbhw.core.argument import Argument
    from nbhw.core.serve.arguments import ServeArgs
    from nbhw.core.serve.serve_plan import ServePlan
    from nbhw.core.train.arguments import TrainArgs
    from nbhw.core.train.train_plan import TrainPlan


def in_kernel(shell: Any) -> bool:
    """Whether the shell talks to a Jupyter front end (widgets and HTML render) rather than a terminal."""
    return getattr(shell, "kernel", None) is not None


@magics_class
class HwMagics(Magics):
    """The ``%hw`` magic; ``%config HwMagics.interval = 1.0`` sets the memory graph's defaults."""

    interval = Float(0.5, help="Seconds between memory samples for %hw memory.").tag(config=True)
    window = Float(600.0, help="Seconds of memory history the graph keeps.").tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.magics["line"]["hw"] = HwLine(self)  # %hw? reads the help from the command table when asked

    @line_magic
    def hw(self, line: str = "") -> None:
        # The command table and every command's words load at the first %hw, not at %load_ext (benchmarks/bench.py).
        from nbhw import commands

        try:
            args = commands.parse(commands.magic_parser(), commands.split(line))
            own = getattr(self, f"_run_{args.command or 'panel'}", None)  # the panel and the session's commands
            if own is not None:
                own(args)
            else:
                self._show_answer(commands.answer(args), args)
        except UserError as exc:
            raise UsageError(str(exc)) from None
        except commands.HelpShown:
            print(commands.magic_help())

    def _show_answer(self, result: Any, args: argparse.Namespace) -> None:
        """A command of the shared table (nbhw.commands.ANSWERS): its answer displayed, its JSON printed, or (--emit)
        its cell written below and the answer displayed."""
        if getattr(args, "emit", False) and getattr(result, "code", None) is not None:
            self.shell.set_next_input(result.code, replace=False)
            display(result)
        else:
            self._show(result, args)

    def _show(self, result: Any, args: argparse.Namespace) -> None:
        if getattr(args, "json", False):
            print(json.dumps(result.to_dict(), indent=2))
        else:
            display(result)

    def _run_panel(self, args: argparse.Namespace) -> None:
        from nbhw.ui.panel import panel  # ipywidgets and plotly: only when a panel is asked for

        shown = panel(interval=self.interval, window=self.window)
        if in_kernel(self.shell):
            display(shown)
        else:
            print(shown.text())

    def _run_memory(self, args: argparse.Namespace) -> None:
        from nbhw import commands
        from nbhw.core.memory.arguments import MEMORY_ARGUMENTS
        from nbhw.ui import memory  # plotly: only when a graph is asked for

        asked = commands.values(args, MEMORY_ARGUMENTS)
        if asked.get("stop"):
            memory.stop()
            print("nbhw: memory sampling stopped (%hw memory starts it again)")
            return
        interval, window = asked.get("interval", self.interval), asked.get("window", self.window)
        monitor = memory.monitor(interval=interval, window=window)
        if in_kernel(self.shell):
            display(monitor)
        else:
            print(monitor.text())

    def _run_load(self, args: argparse.Namespace) -> None:
        from nbhw import commands
        from nbhw.core.argument import given
        from nbhw.core.plan.arguments import PLAN_ARGUMENTS
        from nbhw.core.plan.load_plan import LoadPlan  # imported by the answer already: nbhw.plan() imports all three
        from nbhw.core.serve.serve_plan import ServePlan
        from nbhw.core.train.train_plan import TrainPlan

        plan = commands.answer(args)  # a mistake in the words is a UsageError here, not a message in a panel
        if isinstance(plan, TrainPlan):
            self._load_train(plan, args)
            return
        if isinstance(plan, ServePlan):
            self._load_serve(plan, args)
            return
        assert isinstance(plan, LoadPlan), type(plan)
        if args.emit:
            self.shell.set_next_input(plan.code, replace=False)
            display(plan.view(code=False))
        elif args.json:
            print(json.dumps(plan.to_dict(), indent=2))
        elif self._has_controls(PLAN_ARGUMENTS, given(args, PLAN_ARGUMENTS)):
            # The words as the plan read them ("half" is float16), for the arguments the line gave.
            self._open_load_tab(
                args.model, args, **{name: getattr(plan.args, name) for name in given(args, PLAN_ARGUMENTS)}
            )
        else:
            display(plan)

    def _load_train(self, plan: TrainPlan, args: argparse.Namespace) -> None:
        """%hw load --task train: the Load tab in its Train mode (--emit, --json, a terminal: the training plan)."""
        from nbhw.core.train.arguments import TRAIN_ARGUMENTS

        self._load_mode(plan, plan.asked, TRAIN_ARGUMENTS, args)

    def _load_serve(self, plan: ServePlan, args: argparse.Namespace) -> None:
        """%hw load --task serve: the Load tab in its Serve mode (--emit, --json, a terminal, a word without a
        control such as --reserve: the serving plan)."""
        from nbhw.core.serve.arguments import SERVE_ARGUMENTS

        self._load_mode(plan, plan.args, SERVE_ARGUMENTS, args)

    def _load_mode(
        self,
        plan: TrainPlan | ServePlan,
        asked: TrainArgs | ServeArgs,
        declared: tuple[Argument, ...],
        args: argparse.Namespace,
    ) -> None:
        """The Load tab in the mode of ``args.task`` when every word given has a control there, else the answer."""
        from nbhw.core.argument import given

        names = [name for name, value in given(args, declared).items() if value is not False]
        if args.emit or args.json or not self._has_controls(declared, names):
            self._show_answer(plan, args)
            return
        # On the plan's model (None: nbhw's tiny one), with the words as the plan read them ("4k": 4096).
        self._open_load_tab(plan.model, args, task=args.task, **{name: getattr(asked, name) for name in names})

    def _has_controls(self, declared: tuple[Argument, ...], names: Iterable[str]) -> bool:
        """In a kernel, whether the Load tab has a control for every argument the line gave (--reserve, --pinned:
        the report instead)."""
        return in_kernel(self.shell) and all(a.control for a in declared if a.name in set(names))

    def _open_load_tab(self, model: Any, args: argparse.Namespace, **words: Any) -> None:
        from nbhw.ui.panel import panel  # ipywidgets and plotly: only when a panel is asked for

        display(panel(model, offline=args.offline, tab="Load", interval=self.interval, window=self.window, **words))

    def _run_holders(self, args: argparse.Namespace) -> None:
        from nbhw import commands, session  # lazy: see above
        from nbhw.core.memory.arguments import HOLDERS_ARGUMENTS

        self._show(session.shell_holders(self.shell, **commands.values(args, HOLDERS_ARGUMENTS)), args)

    def _run_free(self, args: argparse.Namespace) -> None:
        from nbhw import commands, session  # lazy: see above
        from nbhw.core.memory.arguments import FREE_ARGUMENTS

        self._show(session.shell_free(self.shell, **commands.values(args, FREE_ARGUMENTS)), args)

    def _run_loaded(self, args: argparse.Namespace) -> None:
        from nbhw import session  # lazy: see above

        self._show(session.loaded(), args)

    def _run_pin(self, args: argparse.Namespace) -> None:
        from nbhw import commands, session  # lazy: see above
        from nbhw.core.measured.arguments import PIN_ARGUMENTS

        asked = commands.values(args, PIN_ARGUMENTS)
        pinned = session.pin(asked.get("model"), asked.get("path"))
        print(f"nbhw: pinned {pinned.data['model_class']} ({pinned.model}) to {pinned.path}")


class HwLine:
    """What IPython calls for ``%hw``: the magic's method, with ``%hw?`` reading the command table's help only when
    asked (building it imports every command's words, which %load_ext must not)."""

    def __init__(self, magics: HwMagics) -> None:
        self.magics = magics

    def __call__(self, line: str = "") -> None:
        self.magics.hw(line)

    @property
    def __doc__(self) -> str:  # type: ignore[override]
        from nbhw import commands

        return commands.magic_help()


def _memory() -> Any:
    # The sampler and its cell log are imported only by %hw memory / nbhw.monitor(): until then a hook is a lookup.
    return sys.modules.get("nbhw.core.memory.process")


def _nbhw_pre_run_cell(info: Any) -> None:
    """Per-cell memory: a cell starts (runs on the main thread, before the cell)."""
    memory = _memory()
    if memory is not None:
        memory.cell_started(info, getattr(info, "raw_cell", "") or "")


def _nbhw_post_run_cell(result: Any) -> None:
    """Per-cell memory: the cell ended (main thread); ``result.info`` is the object pre_run_cell saw.

    After a cell that ran out of memory, the report below its error; once transformers is imported, the models
    that appeared are tied to this cell (nbhw.loaded()); any other cell costs an attribute read.
    """
    memory = _memory()
    if memory is not None and result is not None:
        memory.cell_finished(result.info, result.execution_count, result.success)
    error = getattr(result, "error_in_exec", None)
    out_of_memory = error is not None and is_out_of_memory(error)
    shell = get_ipython()
    models = result is not None and shell is not None and "transformers" in sys.modules
    if out_of_memory or models:
        # lazy: only a cell that ran out of memory, or once the user's code imported transformers (models exist)
        from nbhw import session

        if models:
            session.after_cell(shell, result)  # after the record: the models tie to it
        if out_of_memory:
            session.show_out_of_memory(result)


CELL_EVENTS = {"pre_run_cell": _nbhw_pre_run_cell, "post_run_cell": _nbhw_post_run_cell}


def load(shell: Any) -> None:
    """Register %hw and the cell events; IPython's Magics adds the instance to shell.configurables (%config)."""
    shell.register_magics(HwMagics(shell=shell))
    for event, callback in CELL_EVENTS.items():
        shell.events.register(event, callback)


def _remove_cell_events(shell: Any) -> None:
    # By name: %reload_ext re-imports this module, so the registered functions may be older copies.
    for event, callback in CELL_EVENTS.items():
        callbacks = shell.events.callbacks.get(event, [])
        callbacks[:] = [c for c in callbacks if getattr(c, "__name__", None) != callback.__name__]


def unload(shell: Any) -> None:
    """Remove %hw and the cell events, and stop everything the extension started."""
    _remove_cell_events(shell)
    for views in (sys.modules.get("nbhw.ui.panel"), sys.modules.get("nbhw.ui.memory")):
        if views is not None:
            views.close_all()  # panels first: a panel's graph is also one of the memory views
    sampling = sys.modules.get("nbhw.core.memory.sampling")
    if sampling is not None:
        sampling.stop_all()
    manager = shell.magics_manager
    manager.magics["line"].pop("hw", None)
    manager.registry.pop("HwMagics", None)
    # By class name: %reload_ext re-imports this module, so an older instance has an older class.
    shell.configurables[:] = [c for c in shell.configurables if type(c).__name__ != "HwMagics"]
