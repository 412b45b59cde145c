"""Read decisions straight from the installed libraries' source, without importing them.

Some choices (the device order of ``TrainingArguments``, ``pipeline()``, accelerate's ``device_map`` memory
probe) are written as if/elif chains of availability checks inside functions that would create a CUDA context
if called. nbhw reads those chains from the installed files at run time, so a library change changes nbhw's
answer instead of leaving it stale. Reading a file is a few milliseconds; importing transformers is seconds.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import textwrap
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Step:
    """One branch of an availability chain: the backend it tests and the device string it picks.

    ``probe`` is a backend key ('xpu', 'cuda', ...), 'else' for the final branch, 'env' for an environment
    variable fallback, whose name is ``device`` and default ``default``, or 'accelerator' for torch's own
    accelerator (``torch.accelerator.current_accelerator()``, the build's device type) when its check passes.
    """

    probe: str
    device: str | None
    default: str | None = None


@dataclass(frozen=True)
class Order:
    """An availability chain read from a library function."""

    source: str
    steps: tuple[Step, ...]
    one_device: tuple[str, ...] = ()  # device types the function budgets one device of (the current one)


ELSE, ENV, ACCELERATOR = "else", "env", "accelerator"
# Functions a decision is delegated to (accelerate >= 1.16 asks torch for its accelerator in one place), by the file
# of the same package that defines them.
DELEGATES = {"get_torch_accelerator_backend": "utils/imports.py"}


def library_file(package: str, relative: str) -> Path | None:
    """The path of a file inside an installed top-level package, found without importing the package."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / relative
        if path.is_file():
            return path
    return None


def _block(lines: list[str], start: int, indent: int) -> list[str]:
    end = start + 1
    while end < len(lines):
        line = lines[end]
        stripped = line.lstrip()
        if stripped and len(line) - len(stripped) <= indent and not stripped.startswith((")", "#", "]")):
            break
        end += 1
    return lines[start:end]


def function_source(path: Path, qualname: str) -> str | None:
    """The dedented source of ``Class.method`` or ``function`` in a file, found by its header lines."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start, indent = 0, -1
    for part in qualname.split("."):
        header = re.compile(rf"^(\s*)(?:async\s+)?(?:def|class)\s+{re.escape(part)}\b")
        for i in range(start, len(lines)):
            m = header.match(lines[i])
            if m and len(m.group(1)) > indent:
                start, indent = i, len(m.group(1))
                break
        else:
            return None
    return textwrap.dedent("\n".join(_block(lines, start, indent)))


_PROBE_NAME = re.compile(r"is_(?:torch_)?([a-z0-9]+?)_available")


def _probe_of(test: ast.expr) -> str | None:
    """The backend an `if` tests: is_torch_xpu_available(), is_npu_available(), torch.cuda.is_available()."""
    if isinstance(test, ast.BoolOp):
        return _probe_of(test.values[0])
    if not isinstance(test, ast.Call):
        return None
    func = test.func
    if isinstance(func, ast.Name):
        m = _PROBE_NAME.fullmatch(func.id)
        return m.group(1) if m else None
    if isinstance(func, ast.Attribute) and func.attr == "is_available" and isinstance(func.value, ast.Attribute):
        return func.value.attr
    return None


def _literal(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else "{index}" for v in node.values]
        return "".join(str(p) for p in parts)
    return None


def _env_fallback(node: ast.expr) -> Step | None:
    """os.environ.get("NAME", "default") / os.getenv("NAME", "default") as an env step."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    name = _literal(node.args[0])
    text = ast.unparse(node.func)
    if name is None or text not in {"os.environ.get", "os.getenv"}:
        return None
    default = _literal(node.args[1]) if len(node.args) > 1 else None
    return Step("env", name, default)


def _device_steps(body: list[ast.stmt], probe: str) -> list[Step]:
    """The device a branch picks: torch.device("x:0"), torch.device(f"x:{i}"), torch.device("x", i), torch.x.*."""
    module = ast.Module(body=body, type_ignores=[])
    for node in ast.walk(module):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.device" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.IfExp):
                inner = _probe_of(arg.test) or probe
                steps = [Step(inner, _literal(arg.body))]
                fallback = _env_fallback(arg.orelse)
                steps.append(fallback or Step("else", _literal(arg.orelse)))
                return steps
            return [Step(probe, _literal(arg))]
    for node in ast.walk(module):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute):
            base = node.value
            if isinstance(base.value, ast.Name) and base.value.id == "torch":
                return [Step(probe, base.attr)]
    return [Step(probe, None)]


def _chain(node: ast.If) -> tuple[list[Step], set[int]]:
    steps: list[Step] = []
    seen: set[int] = set()
    current: ast.If | None = node
    while current is not None:
        seen.add(id(current))
        probe = _probe_of(current.test)
        if probe is None:
            break
        steps.extend(_device_steps(current.body, probe))
        orelse = current.orelse
        if len(orelse) == 1 and isinstance(orelse[0], ast.If):
            current = orelse[0]
            continue
        if orelse:
            steps.extend(_device_steps(orelse, "else"))
        current = None
    return steps, seen


def chains(source: str) -> list[list[Step]]:
    """Every if/elif chain of availability checks in a function's source, outermost first."""
    tree = ast.parse(source)
    found: list[list[Step]] = []
    visited: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and id(node) not in visited and _probe_of(node.test):
            steps, seen = _chain(node)
            visited |= seen
            if len(steps) > 1:
                found.append(steps)
    return found


def _current_accelerator(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.accelerator.current_accelerator"
        for n in ast.walk(node)
    )


def _returned(body: list[ast.stmt]) -> tuple[bool, str | None]:
    """(whether ``body`` returns, the device it returns): ``return "hpu", torch.hpu`` -> (True, "hpu")."""
    for stmt in body:
        if isinstance(stmt, ast.Return):
            value = stmt.value.elts[0] if isinstance(stmt.value, ast.Tuple) and stmt.value.elts else stmt.value
            return True, _literal(value) if value is not None else None
    return False, None


def sequence(source: str) -> list[Step]:
    """A function that returns its pick step by step: torch's accelerator when its check passes, then each
    ``if is_x_available(): return "x", ...``, then the final ``return`` ('else'; device None: no accelerator)."""
    tree = ast.parse(source)
    function = tree.body[0] if tree.body and isinstance(tree.body[0], ast.FunctionDef) else None
    if function is None:
        return []
    steps: list[Step] = []
    for stmt in function.body:
        if isinstance(stmt, ast.If) and (probe := _probe_of(stmt.test)) is not None:
            returns, device = _returned(stmt.body)
            if returns:
                steps.append(Step(probe, device))
        elif isinstance(stmt, ast.Return):
            steps.append(Step(ELSE, _returned([stmt])[1]))
            break
        elif _current_accelerator(stmt) and not any(s.probe == ACCELERATOR for s in steps):
            steps.append(Step(ACCELERATOR, None))
    return steps if any(s.probe == ACCELERATOR for s in steps) else []


def _one_device(source: str) -> tuple[str, ...]:
    """``if device_type == "tpu": devices = [one]``: the device types budgeted one device of."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and node.test.comparators):
            continue
        kind = _literal(node.test.comparators[0])
        for stmt in node.body:
            if kind and isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.List) and len(stmt.value.elts) == 1:
                found.append(kind)
    return tuple(found)


def _delegated(package: str, source: str) -> tuple[str, list[Step]] | None:
    """The steps of the function ``source`` hands its pick to (``DELEGATES``), read from that function's file."""
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    called = {n.func.id for n in calls if isinstance(n.func, ast.Name)}
    for name, relative in DELEGATES.items():
        path = library_file(package, relative) if name in called else None
        inner = function_source(path, name) if path is not None else None
        steps = sequence(inner) if inner is not None else []
        if steps:
            return f"{package}/{relative}:{name}", steps
    return None


@lru_cache(maxsize=16)
def _read_order(package: str, relative: str, qualname: str, mtime: float) -> Order | None:
    path = library_file(package, relative)
    if path is None:
        return None
    source = function_source(path, qualname)
    if source is None:
        return None
    found = chains(source)
    if found:
        longest = max(found, key=len)
        return Order(source=f"{package}/{relative}:{qualname}", steps=tuple(longest))
    delegated = _delegated(package, source)
    if delegated is None:
        return None
    where, steps = delegated
    return Order(f"{package}/{relative}:{qualname} via {where}", tuple(steps), _one_device(source))


def constant_mapping(package: str, relative: str, name: str) -> dict[str, str]:
    """A module-level ``NAME = {"key": "value", ...}`` of string literals in ``package/relative``; {} when absent."""
    path = library_file(package, relative)
    if path is None:
        return {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if not isinstance(node, ast.Assign):
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in node.targets) and isinstance(node.value, ast.Dict):
            pairs = zip(node.value.keys, node.value.values, strict=True)
            return {k: v for key, value in pairs if (k := _literal(key) if key else None) and (v := _literal(value))}
    return {}


def read_order(package: str, relative: str, qualname: str) -> Order | None:
    """The longest availability chain in ``package/relative``'s ``qualname``; None when it can't be read."""
    path = library_file(package, relative)
    if path is None:
        return None
    try:
        return _read_order(package, relative, qualname, os.path.getmtime(path))
    except (OSError, SyntaxError, ValueError):
        return None


def trainer_order() -> Order | None:
    """The device order of ``TrainingArguments._setup_devices`` when not distributed."""
    return read_order("transformers", "training_args.py", "TrainingArguments._setup_devices")


def pipeline_order() -> Order | None:
    """The device order ``Pipeline.__init__`` uses for an integer device (0 when none is given)."""
    return read_order("transformers", "pipelines/base.py", "Pipeline.__init__")


def auto_memory_order() -> Order | None:
    """Which accelerator family accelerate's ``get_max_memory`` counts for ``device_map="auto"``."""
    return read_order("accelerate", "utils/modeling.py", "get_max_memory")


def accelerate_default_order() -> Order | None:
    """The device order of accelerate's ``PartialState.default_device`` (``Accelerator().device``)."""
    return read_order("accelerate", "state.py", "PartialState.default_device")


@lru_cache(maxsize=4)
def _strategies(path: Path, mtime: float) -> tuple[str, ...]:
    source = function_source(path, "check_and_set_device_map")
    if source is None:
        return ()
    for node in ast.walk(ast.parse(source)):
        # `isinstance(device_map, str) and device_map not in ["auto", "balanced", ...]`: the strings kept as they are
        if isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.NotIn):
            names = node.comparators[0]
            if isinstance(names, ast.List | ast.Tuple) and all(isinstance(e, ast.Constant) for e in names.elts):
                return tuple(str(e.value) for e in names.elts if isinstance(e, ast.Constant))
    return ()


def device_map_strategies() -> tuple[str, ...]:
    """The device_map strings transformers computes a map for (its check_and_set_device_map), read from its source:
    calling it imports transformers' modeling code (seconds, the first time). () when it can't be read."""
    path = library_file("transformers", "integrations/accelerate.py")
    if path is None:
        return ()
    return _strategies(path, path.stat().st_mtime)
