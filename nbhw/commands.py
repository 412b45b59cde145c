"""The command table of ``%hw`` and ``python -m nbhw``: one list of subcommands and their declared arguments.

Both parsers are built from :data:`COMMANDS`, whose arguments are the declarations in nbhw.core
(:mod:`nbhw.core.argument`), so the magic and the CLI take the same words and give the same errors. Every parse
error becomes a :class:`~nbhw.core.errors.UserError` with one line naming the valid values; the magic turns it into
IPython's ``UsageError``, the CLI into exit code 2.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from nbhw.core.argument import EMIT, JSON, MODEL, OFFLINE, Argument
from nbhw.core.errors import UserError

if TYPE_CHECKING:  # the answers' types; each module is imported when its command runs
    from nbhw.core.advice.attention import AttentionAdvice
    from nbhw.core.advice.quantization import QuantizationAdvice
    from nbhw.core.fit.solver import FitResult
    from nbhw.core.fit.train_search import TrainFitResult
    from nbhw.core.hardware.detect import Hardware
    from nbhw.core.hardware.findings import Preflight
    from nbhw.core.hardware.report import Report
    from nbhw.core.hardware.targets import Targets
    from nbhw.core.render import Shown
    from nbhw.core.serve.serve_plan import ServePlan
    from nbhw.core.task_plan import Plan
    from nbhw.core.train.train_plan import TrainPlan

    Answer = Shown

Surface = Literal["magic", "cli"]
HELP_WIDTH = 100


# A command's words in the table: an argument, or "module:NAME", a tuple of arguments declared in that module, read
# when the command is parsed or its help is shown (%load_ext and the other commands import none of them).
Words = Argument | str


def _resolve(words: tuple[Words, ...]) -> tuple[Argument, ...]:
    found: list[Argument] = []
    for w in words:
        if isinstance(w, str):
            module, name = w.split(":")
            found += getattr(importlib.import_module(module), name)
        else:
            found.append(w)
    return tuple(found)


@dataclass(frozen=True)
class Command:
    """One subcommand: its name (and older names), what it does, and its words in the order help lists them."""

    name: str
    help: str
    words: tuple[Words, ...]
    aliases: tuple[str, ...] = ()
    magic_only: tuple[str, ...] = ()  # arguments that mean nothing in a terminal process (e.g. memory --stop)
    # The command reads the objects of the running Python session (its tensors, Out, the last traceback): %hw and
    # the Python API run it; `python -m nbhw` is a new process holding none of them, so it says so and exits 2.
    session_only: bool = False

    @cached_property
    def arguments(self) -> tuple[Argument, ...]:
        """The declared arguments, imported from their modules on first use."""
        return _resolve(self.words)

    def takes(self, surface: Surface) -> tuple[Argument, ...]:
        """The arguments this command takes on one surface."""
        return tuple(a for a in self.arguments if surface == "magic" or a.name not in self.magic_only)

    def help_on(self, surface: Surface) -> str:
        """What the command does, as that surface's help says it."""
        if self.session_only and surface == "cli":
            return f"{self.help} (only in %hw and Python: a new process holds none of your tensors)"
        return self.help


TASKS, PLAN, FIT = "nbhw.core.tasks", "nbhw.core.plan.arguments", "nbhw.core.fit.arguments"
COMMANDS = (
    Command("devices", "the backends, devices and who picks what here", (JSON,)),
    Command(
        "memory",
        "live memory graph with per-cell attribution (in a terminal: the figures now)",
        ("nbhw.core.memory.arguments:MEMORY_ARGUMENTS",),
        magic_only=("stop",),
    ),
    Command(
        "attention",
        "attention, kernel and dtype options that will really work",
        (MODEL, "nbhw.core.advice.arguments:ADVICE_ARGUMENTS", OFFLINE, JSON),
    ),
    Command(
        "load",
        "the from_pretrained cell for this hardware, its dry run, estimate and placement "
        "(%hw: the panel's Load tab, pre-filled; --emit: the cell below; --task train: the training plan)",
        (
            MODEL,
            f"{TASKS}:TASK_ARGUMENTS",
            f"{PLAN}:PLAN_ARGUMENTS",
            f"{TASKS}:TRAIN_ONLY",
            f"{TASKS}:SERVE_ONLY",
            OFFLINE,
            EMIT,
            JSON,
        ),
        aliases=("plan",),
    ),
    Command(
        "serve",
        "serving with continuous batching (generate_batch, transformers serve --continuous-batching): the paged "
        "cache transformers will make here or on --target, how many requests of --context tokens it holds at "
        "once, whether CUDA graphs and async batching are on, the cell and the command (--emit: the cell below)",
        (MODEL, "nbhw.core.serve.arguments:SERVE_ARGUMENTS", OFFLINE, EMIT, JSON),
    ),
    Command(
        "quantization",
        "every quantization method transformers knows: works or not here and on a target, why, the fix, "
        "the weight bytes and the quantization_config code",
        (MODEL, "nbhw.core.advice.arguments:QUANTIZATION_ARGUMENTS", OFFLINE, JSON),
    ),
    Command(
        "targets",
        "the accelerators nbhw can plan for without having them (--target NAME)",
        ("nbhw.core.hardware.targets:TARGETS_ARGUMENTS", JSON),
    ),
    Command(
        "train",
        "can I fine-tune this model (full / LoRA / QLoRA) here or on N devices: per-device memory from one real "
        "training step on meta, the strategies compared, the training cell and the launch command "
        "(--emit: the cell below)",
        (MODEL, "nbhw.core.train.arguments:TRAIN_ARGUMENTS", OFFLINE, EMIT, JSON),
    ),
    Command(
        "fit",
        "make it fit: the best from_pretrained call for --context / --batch on this machine, --max-memory or "
        "--target (--task train: the best fine-tuning method, checkpointing, micro-batch and strategy), by nbhw's "
        "documented order, and why every option ahead of it lost (--emit: the cell below)",
        (MODEL, f"{FIT}:FIT_ARGUMENTS", f"{PLAN}:PLAN_ARGUMENTS", f"{FIT}:TRAIN_ONLY", OFFLINE, EMIT, JSON),
    ),
    Command("report", "environment report for bug reports", (JSON,)),
    Command(
        "loaded",
        "the transformers models in this session: attention, dtypes, device map, bytes per device, and the plan "
        "that wrote their cell beside them",
        (JSON,),
    ),
    Command(
        "pin",
        "write what ran with a loaded model to a small JSON (versions, arguments, attention, kernels, device map, "
        "bytes, peaks); %hw load --pinned PATH checks a later run against it",
        ("nbhw.core.measured.arguments:PIN_ARGUMENTS",),
    ),
    Command(
        "doctor",
        "pre-flight checks of the installed binaries: what will fail before memory, when, and the command "
        "that fixes it",
        (JSON,),
    ),
    Command(
        "holders",
        "what keeps tensors alive, per device, largest first: variables, Out and _, the last traceback, "
        "autograd graphs, the allocator's cache",
        ("nbhw.core.memory.arguments:HOLDERS_ARGUMENTS", JSON),
        session_only=True,
    ),
    Command(
        "free",
        "do only what is chosen (delete variables, clear the output history, the last traceback, the cache), "
        "then the bytes that came back per device, measured",
        ("nbhw.core.memory.arguments:FREE_ARGUMENTS", JSON),
        session_only=True,
    ),
)
BY_NAME = {name: c for c in COMMANDS for name in (c.name, *c.aliases)}
NAMES = tuple(BY_NAME)  # every word that names a subcommand, in %hw and in the CLI alike
MAGIC_COMMANDS = CLI_COMMANDS = NAMES


class HelpShown(Exception):
    """Raised instead of exiting after argparse printed help (``--help`` in the CLI)."""


def _valid_commands() -> str:
    aliases = [a for c in COMMANDS for a in c.aliases]
    return ", ".join(c.name for c in COMMANDS) + (f" (also: {', '.join(aliases)})" if aliases else "")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises UserError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        m = re.fullmatch(r"argument ([^:]*): invalid choice: (.*) \(choose from (.*)\)", message)
        if m and m.group(1).startswith("{"):
            message = f"unknown subcommand {m.group(2)}; valid: {_valid_commands()}"
        elif m:
            message = f"unknown {m.group(1)} value {m.group(2)}; valid: {m.group(3).replace(chr(39), '')}"
        raise UserError(f"{self.prog}: {message}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            raise UserError(message)
        raise HelpShown()


class CommandParser(Parser):
    """One subcommand's parser: its arguments are added when it is first used (:func:`subparser`), so a line
    imports the words of its own command only."""

    def __init__(self, *args: Any, command: Command, surface: Surface, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.command, self.surface, self.complete = command, surface, False

    def with_arguments(self) -> CommandParser:
        """This parser with every argument of its command added (once)."""
        if not self.complete:
            self.complete = True
            for a in self.command.takes(self.surface):
                _add(self, a)
        return self

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:  # argparse's own overloads, passed through
        """argparse parses a subcommand's words with this: they are added first, whoever asked (the top parser's
        parse_args, :func:`parse`, a test)."""
        return super(CommandParser, self.with_arguments()).parse_known_args(*args, **kwargs)


def _help(text: str) -> str:
    return text.replace("%", "%%")  # argparse %-formats help ("%hw" would be a format)


def _add(p: argparse.ArgumentParser, a: Argument) -> None:
    if a.positional:
        p.add_argument(a.name, nargs="*" if a.kind == "words" else "?", help=_help(a.help))
    elif a.kind == "switch":
        p.add_argument(*a.options, dest=a.name, action="store_true", help=_help(a.help))
    elif a.kind == "toggle":
        p.add_argument(*a.options, dest=a.name, action="store_true", default=None, help=_help(a.help))
        p.add_argument(*a.negations, dest=a.name, action="store_false", default=None, help=argparse.SUPPRESS)
    else:
        nargs = "+" if a.kind == "words" else None
        p.add_argument(
            *a.options, dest=a.name, metavar=a.metavar, nargs=nargs, choices=a.choices, default=None,
            help=_help(a.help),
        )  # fmt: skip


def _formatter(prog: str) -> argparse.HelpFormatter:
    # A fixed width: argparse asks the terminal's size for every argument added, which %load_ext would pay for.
    return argparse.HelpFormatter(prog, width=HELP_WIDTH)


@functools.cache
def parser(surface: Surface) -> Parser:
    """The parser behind ``%hw`` (surface "magic") or ``python -m nbhw`` ("cli"), built once from the table."""
    magic = surface == "magic"
    top = Parser(
        prog="%hw" if magic else "nbhw",
        add_help=not magic,
        description="nbhw: hardware for Hugging Face models" + (", in the notebook" if magic else ""),
        formatter_class=_formatter,
    )
    names = "{" + ",".join(c.name for c in COMMANDS) + "}"
    sub = top.add_subparsers(dest="command", metavar=names, parser_class=CommandParser)
    for command in COMMANDS:
        sub.add_parser(
            command.name, aliases=list(command.aliases), help=_help(command.help_on(surface)),
            description=command.help_on(surface),  # not %-formatted by argparse, unlike help
            add_help=not magic, formatter_class=_formatter, command=command, surface=surface,
        )  # fmt: skip
    return top


def magic_parser() -> Parser:
    """The parser behind ``%hw``."""
    return parser("magic")


def cli_parser() -> Parser:
    """The parser behind ``python -m nbhw``."""
    return parser("cli")


def split(line: str) -> list[str]:
    """Split a magic line like a shell would; unbalanced quotes are a user mistake."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise UserError(f"%hw: cannot split {line!r}: {exc}") from None


def subparser(top: Parser, command: str) -> CommandParser | None:
    """The parser of one subcommand (or of an alias), with its arguments."""
    for action in top._subparsers._group_actions if top._subparsers else []:
        choices: Any = getattr(action, "choices", None) or {}
        if command in choices:
            found: CommandParser = choices[command]
            return found.with_arguments()
    return None


def options(p: argparse.ArgumentParser) -> list[str]:
    """The long options a parser takes."""
    return [s for a in p._actions for s in a.option_strings if s.startswith("--") and s != "--help"]


def parse(top: Parser, argv: Sequence[str]) -> argparse.Namespace:
    """Parse, turning every mistake into one UserError line that names the valid words."""
    args, extra = top.parse_known_args(list(argv))  # the words of the command the line names, and no other's
    if extra:
        command = getattr(args, "command", None)
        sub = subparser(top, command) if command else None
        valid = ", ".join(options(sub)) if sub is not None else _valid_commands()
        where = f"{top.prog} {command}" if command else top.prog
        raise UserError(f"{where}: unrecognized {' '.join(extra)!r}; valid: {valid or 'no options'}")
    if getattr(args, "command", None) in BY_NAME:
        args.command = BY_NAME[args.command].name  # an alias runs the command it names
    return args


def values(args: argparse.Namespace, declared: Sequence[Argument]) -> dict[str, Any]:
    """The declared arguments the words gave, each checked by its declaration (a mistake is a UserError)."""
    given = {a.name: getattr(args, a.name, None) for a in declared}
    return {name: a.value(given[name]) for a in declared if (name := a.name) and given[name] is not None}


def _usage(a: Argument) -> str:
    if a.positional:
        return f"[{a.name.upper()}{' ...' if a.kind == 'words' else ''}]"
    if a.kind == "toggle":
        return f"[{a.option} | {a.negations[0]}]"
    value = "" if a.kind == "switch" else f" {a.metavar or '{' + ','.join(a.choices or ()) + '}'}"
    return f"[{a.option}{value}{' ...' if a.kind == 'words' else ''}]"


def _words(a: Argument) -> str:
    if a.positional:
        return a.name.upper()
    if a.kind == "toggle":
        return ", ".join((*a.options, *a.negations))
    return ", ".join(a.options) + ("" if a.kind == "switch" else f" {a.metavar or a.name.upper()}")


def magic_help() -> str:
    """``%hw?``: the usage of every subcommand, written from the command table (no parser is built for it)."""
    parts = ["%hw                          full panel: Devices · Memory · Attention · Load"]
    for command in COMMANDS:
        also = f"  (also: {', '.join(f'%hw {a}' for a in command.aliases)})" if command.aliases else ""
        usage = " ".join(_usage(a) for a in command.takes("magic"))
        parts += ["", f"%hw {command.name} {usage}".rstrip() + also, f"    {command.help}"]
        parts += [f"    {_words(a):<34} {a.help}" for a in command.takes("magic")]
    return "\n".join(parts)


# ---------------------------------------------------------------- one runner per command, for every surface
# Each runner imports the core module it runs when it runs (a command pays for its own imports only) and returns the
# answer: %hw displays it (or its JSON, or writes its cell below), python -m nbhw prints it and exits by it. Commands
# that read the running session (memory's graph, holders, free, loaded, pin) and the panel are the magic's own.


def _devices(args: argparse.Namespace) -> Hardware:
    from nbhw.core.hardware.detect import detect

    return detect()


def _report(args: argparse.Namespace) -> Report:
    from nbhw.core.hardware.report import report

    return report()


def _doctor(args: argparse.Namespace) -> Preflight:
    from nbhw.core.hardware.doctor import doctor

    return doctor()


def _attention(args: argparse.Namespace) -> AttentionAdvice:
    from nbhw.core.advice.arguments import ADVICE_ARGUMENTS
    from nbhw.core.advice.attention import advise
    from nbhw.core.argument import given

    return advise(args.model, offline=args.offline, **given(args, ADVICE_ARGUMENTS))


def _quantization(args: argparse.Namespace) -> QuantizationAdvice:
    from nbhw.core.advice import quantization
    from nbhw.core.advice.arguments import QUANTIZATION_ARGUMENTS
    from nbhw.core.argument import given

    return quantization.advise(args.model, offline=args.offline, **given(args, QUANTIZATION_ARGUMENTS))


def _targets(args: argparse.Namespace) -> Targets:
    from nbhw.core.hardware.targets import targets

    return targets(args.vendor)


def _load(args: argparse.Namespace) -> Plan:
    from nbhw.core.task_plan import from_words

    return from_words(args)  # a word the other task takes is a mistake here


def _serve(args: argparse.Namespace) -> ServePlan:
    from nbhw.core.argument import given
    from nbhw.core.serve.arguments import SERVE_ARGUMENTS
    from nbhw.core.serve.serve_plan import serve_plan

    return serve_plan(args.model, offline=args.offline, **given(args, SERVE_ARGUMENTS))


def _train(args: argparse.Namespace) -> TrainPlan:
    from nbhw.core.train.train_plan import from_words

    return from_words(args)


def _fit(args: argparse.Namespace) -> FitResult | TrainFitResult:
    from nbhw.core.fit.solver import from_words

    return from_words(args)


def _fails(result: Answer) -> bool:
    """Whether an answer says something will fail, by its kind (each module is imported already: it answered)."""
    from nbhw.core.fit.result import SearchResult
    from nbhw.core.hardware.findings import Preflight
    from nbhw.core.plan.load_plan import LoadPlan
    from nbhw.core.serve.serve_plan import ServePlan
    from nbhw.core.train.train_plan import TrainPlan

    if isinstance(result, Preflight):
        return bool(result.errors)
    if isinstance(result, TrainPlan):
        return bool(result.fits is False or not result.recommended.ok)
    if isinstance(result, LoadPlan):
        return bool(result.check())
    if isinstance(result, SearchResult):
        return result.plan is None
    if isinstance(result, ServePlan):
        return result.full is None or result.full.held == 0
    return False


ANSWERS = {"devices": _devices, "report": _report, "doctor": _doctor, "attention": _attention,
           "quantization": _quantization, "targets": _targets, "load": _load, "train": _train, "fit": _fit,
           "serve": _serve}  # fmt: skip


def answer(args: argparse.Namespace) -> Answer:
    """The answer of the command the parsed words name (a mistake in them is a UserError)."""
    return ANSWERS[args.command](args)


def failed(result: Answer) -> bool:
    """Whether an answer says something will fail (python -m nbhw exits 1, so a script can stop before loading):
    the doctor's errors, a load plan's problems, a training plan that doesn't fit or doesn't run, nothing that fits."""
    return _fails(result)
