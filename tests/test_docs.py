"""The documentation site: built as scripts/docs.sh builds it (warnings are errors), every public name of nbhw in its
reference, every guide notebook executed without an error, and a README short enough to read."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import nbhw

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# The build scripts/docs.sh runs, output folder last (test_docs_script_builds_the_same_way keeps them the same).
SPHINX = ["-m", "sphinx", "-E", "-W", "--keep-going", "-b", "html", "docs"]
# One worker builds the site for all its tests (the fixture is the module's; tests/support/schedule.py).
pytestmark = pytest.mark.xdist_group("docs")
# Eleven notebooks of about 45 s each on two busy cores, with room to spare: the suite's 300 s would stop it.
BUILD_TIMEOUT = 1500


def public_names() -> list[str]:
    return [name for name in nbhw.__all__ if not (name.startswith("__") and name.endswith("__"))]


def guide_pages() -> list[str]:
    """The pages docs/guide/index.md's table of contents lists, in its order."""
    text = (DOCS / "guide" / "index.md").read_text()
    block = re.search(r"```\{toctree\}\n(.*?)```", text, re.S)
    assert block, "docs/guide/index.md has no toctree"
    return [line.strip() for line in block.group(1).splitlines() if line.strip() and not line.startswith(":")]


def inventory(path: Path) -> dict[str, str]:
    """objects.inv (Sphinx's format 2: four lines of header, then zlib): each name and its domain:role."""
    header, _, body = path.read_bytes().partition(b"zlib.\n")
    assert header.startswith(b"# Sphinx inventory version 2"), header[:60]
    names = {}
    for line in zlib.decompress(body).decode().splitlines():
        m = re.match(r"(.+?)\s+(\S+:\S+)\s+-?\d+\s+\S+\s+.*$", line)
        if m:
            names[m.group(1)] = m.group(2)
    return names


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built once for this module, into a temporary folder (its executed notebooks in ../jupyter_execute)."""
    out = tmp_path_factory.mktemp("docs") / "html"
    argv = [sys.executable, *SPHINX, str(out)]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    problems = [line for line in (proc.stdout + proc.stderr).splitlines() if "WARNING" in line or "ERROR" in line]
    assert proc.returncode == 0, "\n".join(problems[-40:]) or (proc.stdout + proc.stderr)[-4000:]
    return out


def test_docs_script_builds_the_same_way() -> None:
    script = (ROOT / "scripts" / "docs.sh").read_text()
    assert f".venv/bin/python {shlex.join(SPHINX)} " in script


def test_the_api_page_names_every_public_name() -> None:
    # The build's inventory says the same (below); this says it in a second, without building.
    text = (DOCS / "reference" / "api.md").read_text()
    documented = set(re.findall(r"^\.\. (?:auto\w+|py:\w+):: nbhw\.(\w+)$", text, re.M))
    assert sorted(set(public_names()) - documented) == []


def test_readme_is_short() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines: the rest belongs in the documentation site (docs/)"


def test_the_browser_tests_retake_the_documentation_s_pictures() -> None:
    # Each picture named in tests/browser/harness.py's DOCS_IMAGES is one a browser test really takes, of a file
    # docs/images has: a renamed test would leave its picture to go stale.
    from tests.browser.harness import DOCS_IMAGES

    tests = {
        name
        for path in (ROOT / "tests" / "browser").glob("test_*.py")
        for name in re.findall(r"^def (test_\w+)\(", path.read_text(), re.M)
    }
    for shot, image in DOCS_IMAGES.items():
        assert re.sub(r"-(lab|notebook7)-[\w-]+$", "", shot) in tests, shot
        assert (DOCS / "images" / image).is_file(), image


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + 120)
def test_every_public_name_is_in_the_reference(site: Path) -> None:
    names = inventory(site / "objects.inv")
    missing = [name for name in public_names() if not names.get(f"nbhw.{name}", "").startswith("py:")]
    assert missing == [], f"not in the site's reference (docs/reference/api.md): {missing}"
    assert (site / "reference" / "api.html").is_file()


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT + 120)
def test_every_guide_notebook_ran_without_error(site: Path) -> None:
    executed = site.parent / "jupyter_execute" / "guide"
    pages = guide_pages()
    assert pages, "the guide lists no page"
    for page in pages:
        assert (site / "guide" / f"{page}.html").is_file(), page
        path = executed / f"{page}.ipynb"
        assert path.is_file(), f"{page}: not executed by the build (a notebook, docs/guide/{page}.ipynb?)"
        cells = json.loads(path.read_text())["cells"]
        code = {i: cell for i, cell in enumerate(cells) if cell["cell_type"] == "code"}
        assert code, f"{page}: no code cell"
        not_run = [i for i, cell in code.items() if cell.get("execution_count") is None]
        assert not_run == [], f"{page}: cells {not_run} were not executed"
        # A cell tagged raises-exception shows an error on purpose (an out-of-memory to look into): only those may.
        errors = [
            f"cell {i}: {out.get('ename')}: {out.get('evalue')}"
            for i, cell in code.items()
            if "raises-exception" not in cell.get("metadata", {}).get("tags", [])
            for out in cell.get("outputs", [])
            if out.get("output_type") == "error"
        ]
        assert errors == [], f"{page}: {errors}"
