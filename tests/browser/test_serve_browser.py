"""The Load tab's Serve mode in a real browser (JupyterLab 4 and Notebook 7): the switch's third mode shows the
serving plan's figures and cell for the controls set, and "Insert cell below" puts exactly that serving cell below
the panel."""

from __future__ import annotations

import pytest

import nbhw
from nbhw.core.hf.tiny_model import tiny_model_path
from tests.browser.harness import NotebookPage, choose, control, poll, previewed

pytestmark = pytest.mark.browser

# nbhw's tiny model and the CPU's reserve hold about 520 MiB: a few hundred requests of 64 tokens fit in the rest.
ASKED = {"context": "64", "device_memory": "600MiB", "page_size": "16", "max_batch_tokens": "128", "prompt": "56",
         "answer": "8"}  # fmt: skip


def test_serve_mode_shows_the_serving_plan_and_inserts_its_cell(notebook: NotebookPage) -> None:
    tiny = str(tiny_model_path())  # built here, in the NBHW_HOME the kernel inherits
    nb = notebook.open("serve.ipynb", ["%load_ext nbhw", f"%hw load {tiny}"])
    nb.run_all()
    nb.check_widgets(1)
    assert "from_pretrained" in previewed(nb, 1)

    modes = nb.cell(1).locator(".nbhw-load .widget-toggle-button")
    assert modes.all_inner_texts() == ["Load / generate", "Train", "Serve"]
    modes.filter(has_text="Serve").click()
    attention = control(nb, 1, "dropdown", "attn_implementation", "serve")
    attention.wait_for(timeout=30_000)  # the Serve mode's widgets are made when it is first shown
    choose(attention, "eager")
    for name, word in ASKED.items():
        text = control(nb, 1, "text", name, "serve")
        text.fill(word)
        text.press("Enter")

    plan = nbhw.plan(tiny, task="serve", attn_implementation="eager", **ASKED)  # the same plan, made here
    expected = plan.code.rstrip("\n")
    box = nb.cell(1).locator(".nbhw-serve .nbhw-codebox-code")
    poll("the serving cell for the controls set", lambda: box.inner_text() == expected or None, 90)
    verdict = nb.cell(1).locator(".nbhw-serve .nbhw-serve-verdict")
    assert verdict.inner_text() == "✓ " + plan.headline().removeprefix("nbhw serve: ")
    figures = nb.cell(1).locator(".nbhw-serve .nbhw-serve-figures").inner_text()
    for name in ("paged cache", "requests", "scheduled together", "longest request", "graphs"):
        assert name in figures, figures
    assert nb.cell(1).locator(".nbhw-serve .nbhw-serve-command").inner_text() == plan.command
    assert not nb.cell(1).locator(".nbhw-load .nbhw-codebox-code").first.is_visible()  # the inference preview
    nb.screenshot(f"{nb.name}-serve", cell=1)

    before = nb.cell_count()
    nb.cell(1).locator(".nbhw-serve .nbhw-codebox-insert").click()
    poll("a new cell", lambda: nb.cell_count() == before + 1, 10)
    assert nb.cell_source(2) == expected and "init_continuous_batching" in expected
    assert nb.cell_source(1) == f"%hw load {tiny}"  # the panel's cell did not move
    assert nb.errors(1) == []
