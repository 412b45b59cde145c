"""The repository keeps its promises: the commands README and the docs give are the ones CI runs, the code is lint-
and type-clean."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def command_in(page: str, comment: str) -> str:
    """The command on the line of ``page`` (a path from the repository root) that ends with ``# comment``."""
    text = (ROOT / page).read_text()
    m = re.search(rf"^(.+?)\s+# {re.escape(comment)}$", text, re.M)
    assert m, (page, comment)
    return m.group(1).strip()


def readme_command(comment: str) -> str:
    return command_in("README.md", comment)


def test_ci_runs_the_test_command_written_in_readme() -> None:
    ci = (ROOT / ".ci/run").read_text()
    assert readme_command("the tests") in ci.splitlines()


def test_readme_quickstart_command_exists() -> None:
    assert readme_command("the quickstart notebook in JupyterLab") == "scripts/quickstart.sh"
    assert "notebooks/quickstart.ipynb" in (ROOT / "scripts/quickstart.sh").read_text()


def test_readme_links_only_to_files_that_exist() -> None:
    # Relative links (the docs' pages, the guide's notebooks, the picture), so that they work on GitHub too.
    links = re.findall(r"\]\(([^)#]+)\)", (ROOT / "README.md").read_text())
    assert links and all("://" not in link for link in links), links
    assert not [link for link in links if not (ROOT / link).is_file()]


def test_contributing_benchmark_command_runs_from_the_repository_root() -> None:
    command = command_in("docs/contributing.md", "the benchmarks")
    assert command.startswith(".venv/bin/python -m benchmarks.bench")
    argv = [sys.executable, "-m", "benchmarks.bench", *command.split()[3:], "--help"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "--only" in proc.stdout, proc.stderr


def test_every_module_the_benchmarks_import_exists() -> None:
    # Function-level imports too: `bench.py --only fit` imported its section from where it was before the move.
    missing = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                top = name.split(".")[0]
                if top in {"benchmarks", "tests", "nbhw"} and not _importable(name):
                    missing.append(f"{path.name}: {name}")
    assert not [m for m in missing if not _is_attribute(m.split(": ")[1])], missing


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _is_attribute(name: str) -> bool:
    """``from X import f``: f is an attribute of module X, not a module."""
    module, _, attribute = name.rpartition(".")
    return _importable(module) and hasattr(importlib.import_module(module), attribute)


def test_contributing_layout_names_every_module_once() -> None:
    text = (ROOT / "docs/contributing.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1].split("jupyter-config/")[0]  # the nbhw/ part
    named = re.findall(r"^\s+([a-z_][a-z_0-9]*\.py)\b", block, re.M)
    modules = [p for p in (ROOT / "nbhw").rglob("*.py") if p.name != "__init__.py" or p.parent == ROOT / "nbhw"]
    for path in modules:  # each module's name appears under its own folder's heading, once
        assert named.count(path.name) == sum(p.name == path.name for p in modules), path.relative_to(ROOT)
    assert len(named) == len(modules)


def test_the_benchmarks_are_not_collected_as_tests(pytestconfig: pytest.Config) -> None:
    # The benchmarks live in benchmarks/, outside the folders pytest collects; none is left under tests/.
    assert pytestconfig.getini("testpaths") == ["tests"]
    assert not list((ROOT / "tests").rglob("bench*.py"))
    assert sorted(p.name for p in (ROOT / "benchmarks").glob("bench*.py")) == [
        "bench.py",
        "bench_cold_fit.py",
        "bench_fit.py",
        "bench_holders.py",
        "bench_memory.py",
        "bench_panel.py",
        "bench_plan.py",
        "bench_run.py",
        "bench_train.py",
    ]


@pytest.mark.slow
def test_ruff_is_clean() -> None:
    proc = subprocess.run(
        [BIN / "ruff", "check", "nbhw", "tests", "benchmarks"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout


@pytest.mark.slow
def test_ruff_format_is_clean() -> None:
    argv = [BIN / "ruff", "format", "--check", "nbhw", "tests", "benchmarks"]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


def test_pre_commit_runs_the_same_checks_as_the_tests() -> None:
    import yaml

    hooks = [h["id"] for repo in yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"]
             for h in repo["hooks"]]  # fmt: skip
    assert hooks == ["ruff", "ruff-format", "mypy", "lint-imports"]


@pytest.mark.slow
def test_mypy_is_clean() -> None:
    proc = subprocess.run([BIN / "mypy"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout


@pytest.mark.slow
def test_quickstart_notebook_runs_every_cell_without_errors() -> None:
    nb = nbformat.read(ROOT / "notebooks/quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    html = "".join(o.get("data", {}).get("text/html", "") for o in outputs)
    assert 'data-backend="musa"' in html and "environment report" in html


def test_every_module_has_tests_the_quick_loop_runs() -> None:
    """tests/ mirrors the package: scripts/quick_tests.py finds a test folder for each module of nbhw."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import quick_tests
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    for module in (ROOT / "nbhw").rglob("*.py"):
        path = str(module.relative_to(ROOT))
        folders = quick_tests.tests_for(path)
        assert folders or module.name == "_version.py", path
        assert all((ROOT / f).is_dir() and list((ROOT / f).rglob("test_*.py")) for f in folders), (path, folders)
    assert quick_tests.tests_for("nbhw/core/plan/run.py") == ["tests/core/plan"]
    assert quick_tests.tests_for("tests/support/fakes.py") == []
    assert quick_tests.tests_for("README.md") == []
