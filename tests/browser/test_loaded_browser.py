"""The Memory tab in a real browser shows the line of the cell that loaded a model, after the cell %hw load --emit
wrote runs (JupyterLab 4 and Notebook 7)."""

from __future__ import annotations

import pytest

from nbhw.core.hf.tiny_model import tiny_model_path
from tests.browser.harness import NotebookPage, open_tab, poll

pytestmark = pytest.mark.browser


def test_the_memory_tab_shows_the_loaded_model_s_line(notebook: NotebookPage) -> None:
    tiny = str(tiny_model_path())  # built here, in the NBHW_HOME the kernel inherits
    nb = notebook.open("loaded.ipynb", ["%load_ext nbhw\nimport transformers, torch", "%hw", f"%hw load {tiny} --emit"])
    nb.run_cell(0)
    nb.run_cell(1)
    nb.check_widgets(1)
    open_tab(nb, 1, "Memory")
    nb.cell(1).locator(".nbhw-memory .js-plotly-plot").wait_for(timeout=60_000)
    nb.run_cell(2)
    poll("the cell %hw load --emit writes, below it", lambda: nb.cell_count() == 4 or None, 30)
    assert "from_pretrained" in nb.cell_source(3)
    nb.run_cell(3)
    count = nb.cells()[3].count
    line = nb.cell(1).locator(".nbhw-memory-loaded li", has_text=f"[{count}] loaded model: Qwen3ForCausalLM")
    line.wait_for(timeout=30_000)
    text = line.inner_text()
    assert "attention sdpa; as planned; peak " in text and "vs planned" in text, text
    nb.screenshot(f"{nb.name}-memory-loaded", cell=1)
    assert nb.errors(3) == []
