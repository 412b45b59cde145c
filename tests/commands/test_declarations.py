"""One declaration for each argument: every surface is derived from it, and each fails here if it drifts.

The surfaces: the options of ``%hw load`` and ``python -m nbhw load``, the keywords of ``nbhw.plan()`` and
``nbhw.panel()``, the Load tab's controls, the keywords of the emitted cell and ``to_dict()["arguments"]``; the same
for the advisor's arguments; and one command table that the magic and the CLI both run.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

import pytest
from IPython.core.error import UsageError

import nbhw
from nbhw import __main__ as cli
from nbhw import commands, magics
from nbhw.core import tasks
from nbhw.core.advice.arguments import ADVICE_ARGUMENTS
from nbhw.core.fit.arguments import FIT_ARGUMENTS, TRAIN_ONLY
from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan import codegen
from nbhw.core.plan.arguments import PLAN_ARGUMENTS, PlanArgs
from nbhw.core.plan.load_form import CONTROLS, OPTIONS
from nbhw.core.serve.arguments import SERVE_ARGUMENTS
from nbhw.core.serve.serve_form import SERVE_CONTROLS
from nbhw.core.tasks import TASK_ARGUMENTS
from nbhw.core.train.arguments import TRAIN_ARGUMENTS
from nbhw.core.train.train_form import TRAIN_CONTROLS
from nbhw.ui.load import LoadView
from nbhw.ui.worker import Worker
from tests.support.declarations import declared_words, options_of

PLAN_NAMES = {a.name for a in PLAN_ARGUMENTS}
# A value for each argument that makes it show in the emitted cell (the tiny model's config names bfloat16).
SHOWN = {
    "target": "T4",
    "dtype": "float16",
    "device_map": "sequential",
    "max_memory": {"cpu": "2GiB"},
    "budget": {"cpu": "3GiB"},
    "attn_implementation": "eager",
    "use_kernels": True,
    "quantization": "4bit",
    "cache_implementation": "offloaded",  # a generate() keyword: the cell's generate call writes it
    # The run's size: not from_pretrained keywords, so nothing in the cell changes (no `emits`). The tiny model
    # takes 256 positions and is decoder-only (an encoder length would be a mistake for it).
    "context": "200",
    "batch": 4,
    "padding": "none",  # how the batch's prompts come: read by the dry run, not by from_pretrained
    "encoder_length": None,
    "reserve": "600MiB",
    "pinned": None,  # a pinned run to compare with: read by the plan, not passed to from_pretrained
}


@pytest.mark.parametrize("surface", ["magic", "cli"])
def test_the_load_words_are_exactly_the_declared_arguments(surface: commands.Surface) -> None:
    words = options_of(commands.parser(surface), "load")
    # --task train / serve: the training and serving plans' words too
    groups = (TASK_ARGUMENTS, PLAN_ARGUMENTS, tasks.TRAIN_ONLY, tasks.SERVE_ONLY)
    expected = set().union(*map(declared_words, groups)) | {"model", "--offline", "--emit", "--json"}
    assert set(words) == expected, set(words) ^ expected
    for a in (a for g in groups for a in g):  # each word lands on the argument's own keyword
        assert {words[w].dest for w in a.options} == {a.name}, a.name


def test_every_argument_is_a_keyword_of_plan_panel_and_to_dict() -> None:
    others = {a.name for a in (*tasks.TRAIN_ONLY, *tasks.SERVE_ONLY)}
    assert set(inspect.signature(nbhw.plan).parameters) == PLAN_NAMES | others | {"task", "model", "offline"}
    panel_keywords = set(inspect.signature(nbhw.panel).parameters) - {"model", "offline", "tab", "interval", "window"}
    # the Load tab's controls, and (task="train" / "serve") its Train and Serve modes': one per declared argument
    # with a control
    assert set(CONTROLS) == {a.name for a in PLAN_ARGUMENTS if a.control}
    assert panel_keywords == set(CONTROLS) | set(TRAIN_CONTROLS) | set(SERVE_CONTROLS) | {"task"}
    assert set(TRAIN_CONTROLS) == {a.name for a in TRAIN_ARGUMENTS if a.control}
    assert set(SERVE_CONTROLS) == {a.name for a in SERVE_ARGUMENTS if a.control}
    # (target and max_memory both set the budget, so one plan can't take both)
    assert set(nbhw.plan(**{k: v for k, v in SHOWN.items() if k != "target"}).to_dict()["arguments"]) == PLAN_NAMES
    assert nbhw.plan(target=SHOWN["target"]).to_dict()["arguments"]["target"] == "T4"
    with pytest.raises(nbhw.UserError, match="unknown argument 'bogus'; valid: target, dtype, device_map"):
        nbhw.plan(bogus=1)


def test_every_control_of_the_load_tab_is_a_declared_argument() -> None:
    worker = Worker(debounce=0.0)
    view = LoadView(nbhw.core.plan.load_form.Form(str(tiny_model_path())), worker)
    try:
        assert set(view.inputs) == set(CONTROLS)
        for name, declared in CONTROLS.items():
            if declared.control != "sizes":
                assert view.control(name).description == name
        dropdowns = {n for n, a in CONTROLS.items() if a.control == "dropdown"}
        assert set(OPTIONS) == dropdowns  # every dropdown says what it offers here
    finally:
        view.close()
        worker.stop()


def emitted(**values: Any) -> set[str]:
    """The keywords of the cell's ``model = ....from_pretrained(model_id, ...)`` and ``model.generate(...)``
    (past the ``max_new_tokens`` of its try-it call)."""
    args = PlanArgs(**values)
    arguments = codegen.call_arguments(args, config_dtype=None, default_device="cpu")
    tree = ast.parse(codegen.cell("m", "AutoModelForCausalLM", arguments))
    found = set()
    for target in ("model", "outputs"):
        assign = next(n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == target)
        assert isinstance(assign.value, ast.Call)
        found |= {k.arg for k in assign.value.keywords if k.arg}
    return found - {"max_new_tokens"}


def test_the_emitted_keywords_are_the_declared_ones() -> None:
    declared = {a.name: a.emits for a in PLAN_ARGUMENTS if a.emits}
    assert set(codegen.EMITTERS) == set(declared)
    checked = {a.name: a.value(SHOWN[a.name]) for a in PLAN_ARGUMENTS}
    assert set(checked) == PLAN_NAMES  # SHOWN covers every argument
    assert emitted(**checked) == set(declared.values())
    for name, keyword in declared.items():  # each argument alone writes its own keyword and nothing else
        assert emitted(**{name: checked[name]}) - {"device_map"} == {keyword} - {"device_map"}, name


@pytest.mark.parametrize("surface", ["magic", "cli"])
def test_the_attention_words_are_the_advisors_declared_arguments(surface: commands.Surface) -> None:
    words = options_of(commands.parser(surface), "attention")
    assert set(words) == declared_words(ADVICE_ARGUMENTS) | {"model", "--offline", "--json"}
    assert set(inspect.signature(nbhw.attention).parameters) == {a.name for a in ADVICE_ARGUMENTS} | {
        "model",
        "offline",
    }


@pytest.mark.parametrize("surface", ["magic", "cli"])
def test_the_fit_words_are_its_own_and_the_plans_declared_arguments(surface: commands.Surface) -> None:
    words = options_of(commands.parser(surface), "fit")
    groups = (FIT_ARGUMENTS, PLAN_ARGUMENTS, TRAIN_ONLY)
    assert set(words) == set().union(*map(declared_words, groups)) | {"model", "--offline", "--emit", "--json"}
    names = {a.name for g in groups for a in g}
    assert set(inspect.signature(nbhw.fit).parameters) == names | {"model", "offline"}
    # task="train" takes the training plan's arguments: each is one of these, declared once
    assert {a.name for a in TRAIN_ARGUMENTS} <= names
    assert not {a.name for a in TRAIN_ONLY} & {a.name for a in (*FIT_ARGUMENTS, *PLAN_ARGUMENTS)}


def test_the_magic_and_the_cli_run_the_same_command_table() -> None:
    magic, terminal = commands.parser("magic"), commands.parser("cli")
    for command in commands.COMMANDS:
        for name in (command.name, *command.aliases):
            here = options_of(magic, name)
            there = options_of(terminal, name)
            only = {w for a in command.arguments if a.name in command.magic_only for w in a.options}
            assert set(here) - only == set(there), name
        # one runner per command, shared by both surfaces, or the magic's own (the panel and the session's commands)
        shared, own = command.name in commands.ANSWERS, hasattr(magics.HwMagics, f"_run_{command.name}")
        assert shared != own or command.name == "load", command.name  # load: the shared plan, the magic's Load tab
    assert set(cli.RUNNERS) == {c.name for c in commands.COMMANDS}
    assert all(cli.RUNNERS[name] is cli.RUNNERS["devices"] for name in commands.ANSWERS)


@pytest.mark.parametrize("dtype", ["half", "float16", "torch.bfloat16", "int8", "fp16"])
def test_attention_and_load_agree_on_every_dtype_word(ip: Any, dtype: str) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    outcomes = []
    for line in (f"attention --dtype {dtype} --json", f"load --dtype {dtype} --json"):
        try:
            ip.run_line_magic("hw", line)
            outcomes.append("ok")
        except UsageError as exc:
            outcomes.append(str(exc).split(";")[0])
    assert outcomes[0] == outcomes[1], outcomes
    assert (outcomes[0] == "ok") == (dtype in {"half", "float16", "torch.bfloat16"})


def test_an_old_word_still_works_as_an_alias() -> None:
    for old, new in (
        ("--attn", "--attn-implementation"),
        ("--quantize", "--quantization"),
        ("--kernels", "--use-kernels"),
    ):
        a = commands.parse(
            commands.cli_parser(), ["plan", old, *(["4bit"] if "quant" in old else ["sdpa"] if "attn" in old else [])]
        )
        b = commands.parse(
            commands.cli_parser(), ["load", new, *(["4bit"] if "quant" in new else ["sdpa"] if "attn" in new else [])]
        )
        assert vars(a) == vars(b), (old, new)


@pytest.mark.parametrize("surface", ["magic", "cli"])
def test_a_new_parser_takes_every_commands_words_however_it_is_called(surface: commands.Surface) -> None:
    """A command's words are added when argparse parses that command, whoever calls it: argparse's own parse_args on a
    parser nothing has used yet took none of them (each test here once ran on a parser an earlier test had used)."""
    for command in commands.COMMANDS:
        fresh = commands.parser.__wrapped__(surface)  # not the cached one: no command parsed yet
        declared = [a for a in command.takes(surface) if not a.positional]
        if not declared:
            continue
        positional = ["MODEL"] if any(a.positional for a in command.takes(surface)) else []
        switch = next((a for a in declared if a.kind in ("switch", "toggle")), None)
        words = [switch.option] if switch is not None else []
        args = fresh.parse_args([command.name, *positional, *words])
        assert all(hasattr(args, a.name) for a in declared), command.name
