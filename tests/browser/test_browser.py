"""nbhw in real JupyterLab 4 and Notebook 7 in chromium, and proof that the harness catches a broken widget."""

from __future__ import annotations

import pytest

from tests.browser.harness import ROOT, NotebookPage

pytestmark = pytest.mark.browser

# The Transformers hardware table: backend keys in nbhw's order, and the device string torch uses for each.
BACKENDS = ["cpu", "cuda", "rocm", "neuron", "tpu", "xpu", "mps", "hpu", "npu", "mlu", "musa"]
DEVICE_STRINGS = ["cpu", "cuda", "cuda", "neuron", "tpu", "xpu", "mps", "hpu", "npu", "mlu", "musa"]

BAD_MODULE_WIDGET = """\
import ipywidgets, traitlets

class Broken(ipywidgets.DOMWidget):
    _model_module = traitlets.Unicode("nbhw-no-such-frontend").tag(sync=True)
    _view_module = traitlets.Unicode("nbhw-no-such-frontend").tag(sync=True)
    _model_name = traitlets.Unicode("BrokenModel").tag(sync=True)
    _view_name = traitlets.Unicode("BrokenView").tag(sync=True)

Broken()"""

# A widget view of a model the front end never heard of: it stays "Loading widget..." (or "model not found").
UNKNOWN_MODEL_VIEW = """\
from IPython.display import display
display({"application/vnd.jupyter.widget-view+json": {"model_id": "0" * 32, "version_major": 2, "version_minor": 0}},
        raw=True)"""


def test_hw_devices_renders_the_table_of_every_backend(notebook: NotebookPage) -> None:
    nb = notebook.open("devices.ipynb", ["%load_ext nbhw", "%hw devices"])
    assert nb.cell_count() == 2 and nb.cell_source(1) == "%hw devices"
    nb.run_all()

    table = nb.outputs(1).locator("table.nbhw-backends")
    assert table.is_visible()
    rows = table.locator("tr[data-backend]")
    assert rows.evaluate_all("(rs) => rs.map(r => r.dataset.backend)") == BACKENDS
    first_column = [t.split()[0] for t in rows.locator("td:first-child").all_inner_texts()]
    assert first_column == DEVICE_STRINGS
    assert "✓ usable" in table.locator("tr[data-backend='cpu'] td").last.inner_text()
    text = nb.output_text(1)
    for heading in ("Accelerators here", "Devices", "Who picks what here", "Environment"):
        assert heading in text
    assert nb.cells()[1].count == 2 and nb.kernel_state() == "idle"
    nb.screenshot(f"{nb.name}-output", cell=1)
    nb.screenshot(f"{nb.name}-page")  # the notebook as a user sees it (README's picture)


def test_hw_report_renders(notebook: NotebookPage) -> None:
    nb = notebook.open("report.ipynb", ["%load_ext nbhw\nimport nbhw\nprint(nbhw.__file__)", "%hw report"])
    nb.run_all()
    assert nb.output_text(0).strip() == str(ROOT / "nbhw" / "__init__.py")  # the kernel runs this checkout
    text = nb.output_text(1)
    assert "environment report" in text
    assert "PyTorch:" in text and "Python:" in text
    assert nb.errors(1) == []


def test_a_healthy_widget_passes_the_widget_check(notebook: NotebookPage) -> None:
    nb = notebook.open("healthy.ipynb", ["import ipywidgets\nipywidgets.VBox([ipywidgets.IntSlider(7)])"])
    nb.run_cell(0)
    assert nb.check_widgets() == 1
    slider = nb.outputs(0).locator(".widget-slider")
    assert slider.is_visible()
    assert slider.locator(".widget-readout").inner_text() == "7"


def test_a_broken_widget_fails_the_widget_check(notebook: NotebookPage) -> None:
    nb = notebook.open(
        "broken.ipynb", ["import ipywidgets\nipywidgets.IntSlider(1)", BAD_MODULE_WIDGET, UNKNOWN_MODEL_VIEW]
    )
    nb.run_all()
    assert nb.check_widgets(0) == 1
    with pytest.raises(AssertionError, match="widget failed to display"):
        nb.check_widgets(1)
    with pytest.raises(AssertionError, match=r"widget (failed to display|still loading)"):
        nb.check_widgets(2, timeout=3)
    with pytest.raises(AssertionError, match="widget failed to display"):
        nb.check_widgets()
    # The timeout path, on the placeholder the widget renderer shows while it waits for a model that never comes.
    nb.outputs(0).evaluate("(e) => { e.textContent = 'Loading widget...'; }")
    with pytest.raises(AssertionError, match="still loading after 1 s"):
        nb.check_widgets(0, timeout=1)


def test_hw_attention_renders_the_advice_table(notebook: NotebookPage) -> None:
    nb = notebook.open("attention.ipynb", ["%load_ext nbhw", "%hw attention"])
    nb.run_all()
    html = nb.output_html(1)
    text = nb.output_text(1)
    for key in (
        "eager",
        "sdpa",
        "flex_attention",
        "flash_attention_2",
        "flash_attention_3",
        "flash_attention_4",
        "kernels-community/flash-attn2",
    ):
        assert key in text, key
    assert "works" in text and "won't work" in text
    assert "flash-attn" in text  # the fix names the package
    assert "<table" in html
    nb.screenshot(f"{nb.name}-output", cell=1)
