"""The layer rule, checked: import-linter's contracts (pyproject.toml) hold, and fail when a forbidden import is added.

Also: no import cycle between nbhw's modules at import time (module-level imports only, as Python runs them), and
no function-level import of nbhw's own modules except the ones that keep ``%load_ext nbhw`` light.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
# Function-level imports of nbhw's own modules that are there on purpose, each with a comment in the code.
# The command surfaces (%hw, python -m nbhw and the runners they share) import in each command's runner what it
# runs, and nothing at load: any function-level import of nbhw there is deliberate (what they load is checked by the
# last test of this file).
SURFACES = {"nbhw/magics.py", "nbhw/__main__.py", "nbhw/commands.py"}
LAZY = {
    ("nbhw/__init__.py", "from nbhw import magics"),  # `import nbhw` stays free of IPython
    ("nbhw/__init__.py", "from nbhw.server import NbhwApp"),  # and of jupyter_server and tornado
    # the Load tab's first code: the holders view (and nbhw.session) only when the Memory tab opens
    ("nbhw/ui/panel.py", "from nbhw.ui.holders import HoldersView"),
}


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": str(LINT.parent)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_the_layer_contracts_hold() -> None:
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 kept, 0 broken" in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("nbhw/core/hardware/detect.py", "from nbhw.core.plan import codegen", "core families"),
        ("nbhw/core/memory/ring.py", "from nbhw.core.advice import status", "core families"),
        ("nbhw/core/plan/codegen.py", "import ipywidgets", "core is pure"),
        ("nbhw/core/render.py", "from nbhw.ui import tree", "core is pure"),
        ("nbhw/ui/load.py", "from nbhw import magics", "surfaces sit on core"),
        ("nbhw/server/metrics.py", "from nbhw.ui import panel", "the server extension sits on core alone"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    shutil.copytree(ROOT / "nbhw", tmp_path / "nbhw", ignore=shutil.ignore_patterns("labextension", "__pycache__"))
    target = tmp_path / module
    # Inside a function, where nothing runs at import: the rule is about the graph, not about what runs first.
    target.write_text(target.read_text() + f"\n\ndef _forbidden() -> None:\n    {line}  # noqa\n")
    proc = lint(tmp_path)
    assert proc.returncode != 0, proc.stdout
    assert "BROKEN" in proc.stdout and contract in " ".join(proc.stdout.split()), proc.stdout


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.Import | ast.ImportFrom, here: str) -> list[str]:
    """The nbhw modules an import statement names (``from a import b`` may name module a.b)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("nbhw")]
    base = node.module or ""
    if not base.startswith("nbhw"):
        return []
    found = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        path = ROOT / candidate.replace(".", "/")
        submodule = path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
        # `from package import submodule` runs the submodule (its package is already being imported)
        found.append(candidate if submodule else base)
    return list(dict.fromkeys(found))


def top_level_imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted((ROOT / "nbhw").rglob("*.py")):
        name = module_name(path)
        tree = ast.parse(path.read_text())
        edges = graph.setdefault(name, set())
        for node in tree.body:  # module level only: what runs when the module is imported
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges.update(m for m in imported(node, name) if m != name)
    return graph


def test_no_import_cycle_between_nbhw_modules_at_import_time() -> None:
    graph = top_level_imports()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert len(graph) > 50  # every module was read


def test_function_level_imports_of_nbhw_are_only_the_deliberate_ones() -> None:
    found = set()
    for path in sorted((ROOT / "nbhw").rglob("*.py")):
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        # `if TYPE_CHECKING:` imports never run: they name a type for mypy, not a lazy import
        typing_only = {
            id(n)
            for block in tree.body
            if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
            for n in ast.walk(block)
        }
        for node in ast.walk(tree):
            nested = isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in top | typing_only
            if nested and imported(node, module_name(path)):
                found.add((str(path.relative_to(ROOT)), ast.unparse(node)))
    assert {f for f in found if f[0] not in SURFACES} <= LAZY, sorted(found - LAZY)
    assert {f[0] for f in found} >= SURFACES  # each surface imports its commands' modules when they run


PLANNER = ("nbhw.core.plan", "nbhw.core.train", "nbhw.core.fit", "nbhw.core.advice", "nbhw.ui")
LOADED = """
import sys
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "nbhw")
print(" ".join(m for m in sys.modules if m.startswith("nbhw")))
ip.run_line_magic("hw", sys.argv[1])
print(" ".join(m for m in sys.modules if m.startswith("nbhw")))
"""


def nbhw_modules(code: str, *argv: str) -> list[set[str]]:
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120, check=True)
    return [set(line.split()) for line in done.stdout.splitlines() if line.startswith("nbhw")]


def test_load_ext_and_a_first_command_import_none_of_the_planner() -> None:
    loaded, devices = nbhw_modules(LOADED, "devices --json")
    assert loaded == {"nbhw", "nbhw._version", "nbhw.magics", "nbhw.core", "nbhw.core.errors", "nbhw.core.memory",
                      "nbhw.core.memory.out_of_memory"}  # fmt: skip
    assert "nbhw.commands" in devices and not [m for m in devices if m.startswith(PLANNER)]
    targets = nbhw_modules(LOADED, "targets --json")[-1]  # a command's words, and only its own
    assert "nbhw.core.hardware.targets" in targets
    assert not [m for m in targets if m.startswith(("nbhw.core.plan", "nbhw.core.train", "nbhw.core.fit"))]
