"""The Memory tab's holders section in a real browser: it shows what holds memory, and Free deletes what is ticked."""

from __future__ import annotations

import pytest

from tests.browser.harness import NotebookPage, poll

pytestmark = pytest.mark.browser


def test_the_memory_tab_shows_the_holders_and_frees_the_ticked_variable(notebook: NotebookPage) -> None:
    nb = notebook.open(
        "holders.ipynb",
        [
            "%load_ext nbhw\nimport torch\nbig = torch.zeros(64, 1024, 1024)  # 256 MiB\nsmall = torch.zeros(10)",
            "%hw",
            "print('big' in globals(), 'small' in globals())",
        ],
    )
    nb.run_cell(0)
    nb.run_cell(1)
    assert nb.check_widgets(1) == 1
    nb.cell(1).locator(".lm-TabBar-tab", has_text="Memory").click()
    section = nb.cell(1).locator(".nbhw-holders")
    section.wait_for(timeout=60_000)
    assert section.locator(".nbhw-holders-table").inner_text() == ""  # nothing walked until asked
    section.locator("button.nbhw-holders-show").click()
    table = section.locator(".nbhw-holders-table")
    poll("the holders table", lambda: "256.0 MiB" in table.inner_text() or None, 60)
    rows = [r for r in table.inner_text().splitlines() if r.startswith("big")]
    assert rows and "variable" in rows[0], table.inner_text()
    section.locator(".nbhw-holders-name-big input").check()
    section.locator("button.nbhw-holders-free").click()
    freed = section.locator(".nbhw-holders-freed")
    poll("what came back", lambda: "deleted big" in freed.inner_text() or None, 60)
    [cpu] = [r.split("\t") for r in freed.inner_text().splitlines() if r.startswith("cpu")]
    assert [c.strip() for c in cpu[:3]] == ["cpu", "256.0 MiB", "256.0 MiB"], cpu  # expected, came back
    nb.screenshot(f"{nb.name}-freed", cell=1)
    nb.run_cell(2)
    assert nb.output_text(2).strip() == "False True"
