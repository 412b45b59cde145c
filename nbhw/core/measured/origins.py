"""Which cell loaded each model, the plan that wrote that cell, and the cells that ran it afterwards.

The front end's post-run-cell hook hands each finished cell here (:func:`after_cell`): the models that appeared in
the namespace are tied to that cell (weakly: a deleted model is forgotten), to its memory record, and to the plan
whose cell it ran (nbhw's plans remember the code they wrote; a cell runs a plan when it holds every statement of
that code up to the ``from_pretrained`` call, whatever its formatting, comments or the lines after). A later cell
calling ``NAME.generate(...)`` is a run of that model; its size (sequences x tokens) is read from what it assigned.
A cell that ran a training plan's notebook cell (same rule) is tied to that training plan.
Nothing here is run from the cell: its source is only parsed.
"""

from __future__ import annotations

import ast
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nbhw.core.measured.loaded import UNKNOWN, models_in
from nbhw.core.memory.cell_records import CellRecord
from nbhw.core.plan.load_plan import LoadPlan, written_plans
from nbhw.core.train.train_plan import TrainPlan
from nbhw.core.train.train_plan import written_plans as written_training

P = TypeVar("P", LoadPlan, TrainPlan)
MOST_RUNS = 20  # generate cells remembered per model


@dataclass(frozen=True)
class Run:
    """A cell that generated with a model: its record and the size it ran at (None when not seen)."""

    execution_count: int | None
    record: CellRecord | None
    batch: int | None
    tokens: int | None  # tokens per sequence at the end: prompt + generated


@dataclass
class Origin:
    """Where a model came from: the cell that loaded it, its plan if nbhw wrote that cell, its later runs."""

    variable: str
    execution_count: int | None
    first_line: str
    record: CellRecord | None
    plan: LoadPlan | None
    asked_attention: str | None
    arguments: dict[str, str]  # the from_pretrained keywords of the cell, as written
    generated: Run | None = None  # the loading cell generated too (the emitted cell does)
    runs: list[Run] = field(default_factory=list)
    training: TrainPlan | None = None  # the training plan whose cell loaded (and trained) it


_origins: weakref.WeakKeyDictionary[Any, Origin] = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_version = [0]


def version() -> int:
    """Changes whenever an origin or a run is added (views redraw on it)."""
    return _version[0]


def origin(model: Any) -> Origin | None:
    """Where ``model`` came from, if nbhw saw the cell that loaded it."""
    with _lock:
        return _origins.get(model)


def origins() -> list[tuple[Any, Origin]]:
    """Every model alive that nbhw saw loaded, with its origin."""
    with _lock:
        return list(_origins.items())


def forget() -> None:
    """Forget every origin (tests; a new session)."""
    with _lock:
        _origins.clear()
        _version[0] += 1


# ---------------------------------------------------------------- reading a cell's source


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _dumps(statements: list[ast.stmt]) -> list[str]:
    return [ast.dump(s) for s in statements]


def _calls(node: ast.AST, attribute: str) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == attribute]


def plan_statements(code: str) -> list[str]:
    """The statements of a plan's cell up to its model's from_pretrained call (what makes the cell that cell)."""
    tree = _parse(code)
    if tree is None:
        return []
    body = tree.body
    last = max((i for i, s in enumerate(body) if _calls(s, "from_pretrained")), default=-1)
    return _dumps(body[: last + 1])


def ran_plan(source: str, tree: ast.Module | None = None) -> LoadPlan | None:
    """The newest plan whose cell ``source`` ran (see the module's docstring)."""
    tree = tree or _parse(source)
    if tree is None:
        return None
    return _newest_ran(tree, written_plans())


def ran_training(tree: ast.Module) -> TrainPlan | None:
    """The newest training plan whose notebook cell this cell ran (the same rule as :func:`ran_plan`)."""
    return _newest_ran(tree, written_training())


def _newest_ran(tree: ast.Module, plans: list[P]) -> P | None:
    """The first of ``plans`` (newest first) whose cell's statements up to from_pretrained the cell holds."""
    held = set(_dumps(tree.body))
    for plan in plans:
        wanted = plan_statements(plan.code)
        if wanted and all(s in held for s in wanted):
            return plan
    return None


def _assigned_call(tree: ast.Module, variable: str, attribute: str) -> ast.Call | None:
    """The call ``variable = ....attribute(...)`` in the cell, if there is one."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
            continue
        named = any(isinstance(t, ast.Name) and t.id == variable for t in node.targets)
        if named and getattr(node.value.func, "attr", None) == attribute:
            return node.value
    return None


def loading_keywords(tree: ast.Module, variable: str) -> tuple[str | None, dict[str, str]]:
    """What ``variable = X.from_pretrained(...)`` asked for: its attn_implementation (None: not given; UNKNOWN:
    not a literal, or no such call) and every keyword as written."""
    call = _assigned_call(tree, variable, "from_pretrained")
    if call is None:
        return UNKNOWN, {}
    written = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg is not None}
    if any(k.arg is None for k in call.keywords):
        return UNKNOWN, written  # **kwargs: nbhw can't tell
    value = next((k.value for k in call.keywords if k.arg == "attn_implementation"), None)
    if value is None:
        return None, written
    try:
        asked = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return UNKNOWN, written
    return (asked if isinstance(asked, str) or asked is None else UNKNOWN), written


def generate_targets(tree: ast.Module, variable: str) -> list[str] | None:
    """The names the cell assigns ``variable.generate(...)`` to ([] when it discards the result); None: no call."""
    owner = variable.split(".", maxsplit=1)[0]
    calls = {id(n) for n in ast.walk(tree) if _generates(n, owner)}
    if not calls:
        return None
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and id(node.value) in calls:
            found += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return found


def _generates(node: ast.AST, owner: str) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "generate"
        and isinstance(func.value, ast.Name)
        and func.value.id == owner
    )


def generated_size(value: Any) -> tuple[int | None, int | None]:
    """Sequences and tokens per sequence of what generate() returned (a tensor, or an output with .sequences)."""
    sequences = getattr(value, "sequences", value)
    shape = getattr(sequences, "shape", None)
    if shape is None or len(shape) != 2:
        return None, None
    return int(shape[0]), int(shape[1])


def _run(tree: ast.Module, variable: str, namespace: Mapping[str, Any], count: int | None,
         record: CellRecord | None) -> Run | None:  # fmt: skip
    targets = generate_targets(tree, variable)
    if targets is None:
        return None
    for target in targets:
        batch, tokens = generated_size(namespace.get(target))
        if batch is not None:
            return Run(count, record, batch, tokens)
    return Run(count, record, None, None)


# ---------------------------------------------------------------- the hook


def after_cell(
    namespace: Mapping[str, Any],
    source: str,
    execution_count: int | None,
    record: CellRecord | None,
    *,
    succeeded: bool = True,
    ran: Callable[[str], str] | None = None,
) -> list[Origin]:
    """A cell finished: tie the models that appeared to it, and note it as a run of the models it generated with
    (a cell that failed ran nothing to compare). Returns the new origins. Cheap when transformers is not imported
    (no model can exist). ``ran``: the Python the cell's source ran as (IPython's ``transform_cell``: magics and
    ``!`` lines), applied only where the source is read."""
    models = models_in(namespace)
    if not models:
        return []
    with _lock:
        known = dict(_origins.items())
    if all(m in known for m in models.values()) and "generate" not in source:
        return []  # nothing new, and no run to note: the cell's source is not even parsed
    if ran is not None:
        source = ran(source)
    tree = _parse(source)
    made: list[Origin] = []
    for variable, model in models.items():
        found = known.get(model)
        if found is None:
            found = _new_origin(variable, namespace, source, tree, count=execution_count, record=record)
            made.append(found)
            with _lock:
                _origins[model] = found
        elif tree is not None and succeeded:
            run = _run(tree, variable, namespace, execution_count, record)
            if run is not None:
                found.runs = [*found.runs, run][-MOST_RUNS:]
                _version[0] += 1
    if made:
        _version[0] += 1
    return made


def _new_origin(variable: str, namespace: Mapping[str, Any], source: str, tree: ast.Module | None, *,
                count: int | None, record: CellRecord | None) -> Origin:  # fmt: skip
    first = next((s.strip() for s in source.splitlines() if s.strip()), "")
    if tree is None:
        return Origin(variable, count, first, record, None, UNKNOWN, {})
    asked, written = loading_keywords(tree, variable)
    if not written and "." in variable:  # a model a holder keeps: the call that made the holder's own variable
        asked, written = loading_keywords(tree, variable.split(".", maxsplit=1)[0])
    plan = ran_plan(source, tree) if written or asked != UNKNOWN else None
    generated = _run(tree, variable, namespace, count, record)
    training = ran_training(tree) if plan is None and "from_pretrained" in source else None
    return Origin(variable, count, first, record, plan, asked, written, generated, training=training)
