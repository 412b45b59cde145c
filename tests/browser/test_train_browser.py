"""The Load tab's Train mode in a real browser (JupyterLab 4 and Notebook 7): the switch shows the training plan's
verdict and code for the controls set, and "Insert cell below" puts exactly that training cell below the panel."""

from __future__ import annotations

import pytest

import nbhw
from nbhw.core.hf.tiny_model import tiny_model_path
from tests.browser.harness import NotebookPage, choose, control, poll, previewed

pytestmark = pytest.mark.browser

ASKED = {"method": "full", "context": "128", "device_type": "cpu", "device_memory": "4GiB"}


def test_train_mode_shows_the_training_plan_and_inserts_its_cell(notebook: NotebookPage) -> None:
    tiny = str(tiny_model_path())  # built here, in the NBHW_HOME the kernel inherits
    nb = notebook.open("train.ipynb", ["%load_ext nbhw", f"%hw load {tiny}"])
    nb.run_all()
    nb.check_widgets(1)
    assert "from_pretrained" in previewed(nb, 1)

    nb.cell(1).locator(".nbhw-load .widget-toggle-button", has_text="Train").click()
    method = control(nb, 1, "dropdown", "method", "train")
    method.wait_for(timeout=30_000)  # the Train mode's widgets are made when it is first shown
    choose(method, "full")
    choose(control(nb, 1, "dropdown", "device_type", "train"), "cpu")
    for name in ("context", "device_memory"):
        field = control(nb, 1, "text", name, "train")
        field.fill(ASKED[name])
        field.press("Enter")

    plan = nbhw.train_plan(tiny, **ASKED)  # the same plan, made here
    expected = plan.code.rstrip("\n")
    box = nb.cell(1).locator(".nbhw-train .nbhw-codebox-code")
    poll("the training cell for the controls set", lambda: box.inner_text() == expected or None, 90)
    verdict = nb.cell(1).locator(".nbhw-train .nbhw-train-verdict")
    assert verdict.inner_text() == f"✓ {plan.verdict}" and plan.verdict.startswith("fits: ")
    largest = nb.cell(1).locator(".nbhw-train .nbhw-largest-batch")
    poll("the largest batch", lambda: f"{plan.max_batch:,} rows" in largest.inner_text() or None, 60)
    assert not nb.cell(1).locator(".nbhw-load .nbhw-codebox-code").first.is_visible()  # the inference preview
    nb.screenshot(f"{nb.name}-train", cell=1)

    before = nb.cell_count()
    nb.cell(1).locator(".nbhw-train .nbhw-codebox-insert").click()
    poll("a new cell", lambda: nb.cell_count() == before + 1, 10)
    assert nb.cell_source(2) == expected and "trainer.train()" in expected
    assert nb.cell_source(1) == f"%hw load {tiny}"  # the panel's cell did not move
    assert nb.errors(1) == []
