"""Fixtures of the browser suite: one JupyterLab, one Notebook 7 and one chromium shared by its tests, a page each.

Every test that takes `notebook` runs twice, in JupyterLab (`[lab]`) and in Notebook 7 (`[notebook7]`), and leaves
a screenshot of its final state, passed or failed, in tests/artifacts/screenshots/<test-name>.png.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from tests.browser.harness import CHROMIUM, LAB, NOTEBOOK7, ROOT, Flavor, JupyterServer, NotebookPage, chromium

SHOTS = ROOT / "tests" / "artifacts" / "screenshots"


def shot_name(test_name: str) -> str:
    """test_x[lab] -> test_x-lab: a plain file name."""
    return re.sub(r"[^\w.-]+", "-", test_name).strip("-")


def _serve(flavor: Flavor) -> Iterator[JupyterServer]:
    with JupyterServer(flavor) as server:
        yield server


# Package scope: shared by the whole browser suite, and stopped as soon as it ends, not at the end of the session.
@pytest.fixture(scope="package")
def lab_server() -> Iterator[JupyterServer]:
    yield from _serve(LAB)


@pytest.fixture(scope="package")
def notebook7_server() -> Iterator[JupyterServer]:
    yield from _serve(NOTEBOOK7)


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup.sh test installs Debian's chromium")
    with chromium() as b:
        yield b


# Each flavor's tests are one group for pytest-xdist (tests/support/schedule.py): a worker starts one server for
# them, and the two flavors run side by side on the two workers.
@pytest.fixture(
    params=[
        pytest.param("lab", marks=pytest.mark.xdist_group("browser-lab")),
        pytest.param("notebook7", marks=pytest.mark.xdist_group("browser-notebook7")),
    ]
)
def server(request: pytest.FixtureRequest) -> JupyterServer:
    """The server of this run of the test: JupyterLab, then Notebook 7."""
    got: JupyterServer = request.getfixturevalue(f"{request.param}_server")
    return got


@pytest.fixture
def notebook(request: pytest.FixtureRequest, browser: Browser, server: JupyterServer) -> Iterator[NotebookPage]:
    """A fresh browser page on `server`; open a notebook with `notebook.open(name, sources)`."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    name = shot_name(request.node.name)
    nb = NotebookPage(context.new_page(), server, SHOTS, name=name)
    try:
        yield nb
    finally:
        with contextlib.suppress(Exception):
            nb.screenshot(name)
        nb.close()
        context.close()
