"""The %hw panel in real JupyterLab 4 and Notebook 7: four tabs, a live Load tab, and "Insert cell below" that puts
exactly the previewed code directly below its panel's cell, 20 of 20 times and while another cell runs."""

from __future__ import annotations

import time

import pytest
from transformers import LlamaConfig

from nbhw.core.hf.tiny_model import tiny_model_path
from nbhw.core.plan.load_form import cached_models
from tests.browser.harness import (
    NotebookPage,
    choose,
    code_box,
    control,
    open_tab,
    options_when,
    poll,
    previewed,
    selected,
)

pytestmark = pytest.mark.browser

TABS = ["Devices", "Memory", "Attention", "Load"]
SLEEP = "import time\ntime.sleep(60)"


@pytest.fixture(scope="module")
def tiny() -> str:
    # Built here, in the same NBHW_HOME the kernels inherit, so no cell prints the build's progress bar.
    return str(tiny_model_path())


def changed_preview(nb: NotebookPage, cell: int, before: str, must_contain: str) -> str:
    box = code_box(nb, cell)

    def check() -> str | None:
        now = box.inner_text()
        return now if now != before and must_contain in now else None

    return poll(f"cell {cell}'s preview to show {must_contain}", check, 30)


def test_hw_shows_one_panel_with_all_four_tabs(notebook: NotebookPage, tiny: str) -> None:
    nb = notebook.open("panel.ipynb", ["%load_ext nbhw", "%hw"])
    nb.run_all()
    assert nb.check_widgets(1) == 1  # one panel
    titles = nb.cell(1).locator(".lm-TabBar-tab .lm-TabBar-tabLabel").all_inner_texts()
    assert titles == TABS

    devices = nb.cell(1).locator("table.nbhw-backends")
    devices.wait_for(timeout=60_000)
    assert "✓ usable" in devices.locator("tr[data-backend='cpu'] td").last.inner_text()
    nb.screenshot(f"{nb.name}-devices", cell=1)

    open_tab(nb, 1, "Memory")
    graph = nb.cell(1).locator(".nbhw-memory .js-plotly-plot")
    graph.wait_for(timeout=60_000)
    box = graph.bounding_box()
    assert box is not None and box["width"] > 400 and box["height"] > 150
    nb.screenshot(f"{nb.name}-memory", cell=1)

    open_tab(nb, 1, "Attention")
    table = nb.cell(1).locator(".nbhw-attention-tab table").first
    table.wait_for(timeout=60_000)
    poll("the advice table", lambda: "sdpa" in table.inner_text() or None, 30)
    assert "flash_attention_2" in table.inner_text()
    nb.screenshot(f"{nb.name}-attention", cell=1)

    open_tab(nb, 1, "Load")
    code = previewed(nb, 1)
    # The kernel reads the same HF cache as this process: its newest cached model, else the tiny one.
    assert "from_pretrained" in code and (cached_models() or [tiny])[0] in code
    nb.screenshot(f"{nb.name}-load", cell=1)
    assert nb.errors(1) == []


def test_load_tab_controls_change_the_preview(notebook: NotebookPage, tiny: str) -> None:
    # A Llama-3.2-1B-sized model (its config.json only) planned for two 1 GiB GPUs this machine lacks.
    llama = notebook.server.root / "llama-1b"
    LlamaConfig(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, dtype="bfloat16",
    ).save_pretrained(llama)  # fmt: skip
    split = f"%hw load {llama} --dtype bfloat16 --max-memory 0=1GiB 1=1GiB cpu=8GiB"  # not the CPU's advice
    nb = notebook.open("load.ipynb", ["%load_ext nbhw", f"%hw load {tiny}", split])
    nb.run_all()
    nb.check_widgets(1)
    code = previewed(nb, 1)
    assert nb.cell(1).locator(".lm-TabBar-tab.lm-mod-current").inner_text() == "Load"

    dtype = control(nb, 1, "dropdown", "dtype")
    # A first code later than FIRST_CODE_WAIT comes after the panel, and the dtypes (the advised one selected) in a
    # message after the code's.
    poll("the advised dtype, selected", lambda: "(advised)" in selected(dtype) or None, 30)
    choose(dtype, "float16")
    code = changed_preview(nb, 1, code, "dtype=torch.float16")

    # The choices follow the code in messages of their own: the preview can show float16 while this dropdown still
    # holds its lone "default" of before the choices were known.
    attn = control(nb, 1, "dropdown", "attn_implementation")
    options = options_when(attn, lambda now: len(now) > 1, "the attention choices", 60)
    assert "✓ sdpa" in options and "✗ flash_attention_2" in options, options
    choose(attn, "✗ flash_attention_2")
    note = nb.cell(1).locator(".nbhw-bad", has_text="flash-attn")
    note.first.wait_for(timeout=30_000)  # the reason it won't work, beside the control
    code = changed_preview(nb, 1, code, 'attn_implementation="flash_attention_2"')
    choose(attn, "✓ eager")
    code = changed_preview(nb, 1, code, 'attn_implementation="eager"')

    choose(control(nb, 1, "dropdown", "device_map"), "sequential")
    code = changed_preview(nb, 1, code, 'device_map="sequential"')

    memory = control(nb, 1, "text", "cpu")
    memory.fill("lots")
    memory.press("Enter")
    message = nb.cell(1).locator(".nbhw-message")
    bad = "max_memory size 'lots' is not valid"
    poll("the message for a bad size", lambda: bad in message.inner_text() or None, 30)
    assert nb.cell(1).locator(".nbhw-codebox-insert").is_disabled()
    memory.fill("2GiB")
    memory.press("Enter")
    code = changed_preview(nb, 1, "", 'max_memory={"cpu": "2GiB"}')
    assert "✓ Dry run" in message.inner_text()

    nb.page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=nb.server.url)
    nb.cell(1).locator(".nbhw-codebox-copy").click()
    status = nb.cell(1).locator(".nbhw-codebox-status")
    poll("the copy to finish", lambda: "Copied" in status.inner_text() or None, 10)
    assert nb.page.evaluate("navigator.clipboard.readText()") == code
    nb.screenshot(f"{nb.name}-output", cell=1)

    # The hardware selector: a catalog target re-plans for it, re-advises the dtype and says it is not here.
    target = control(nb, 1, "dropdown", "target")
    targets = options_when(target, lambda now: len(now) > 1, "the targets", 60)
    assert targets[0] == "this machine" and "2x H100 SXM · NVIDIA cuda, 79.2 GiB each" in targets, targets
    choose(target, "T4 · NVIDIA cuda, 14.75 GiB")
    poll("the dry run read for the T4", lambda: "read for 1x T4" in message.inner_text() or None, 60)
    assert "planning for 1x T4: hardware that is not here" in nb.cell(1).locator(".nbhw-load").inner_text()
    options_when(control(nb, 1, "dropdown", "dtype"), lambda now: "float16 (advised)" in now, "the T4's dtype", 30)
    nb.screenshot(f"{nb.name}-target", cell=1)

    # The picture colours each block by the device it goes to, decoder layers in model order.
    previewed(nb, 2)
    blocks = nb.cell(2).locator(".nbhw-placement-blocks span")
    devices = blocks.evaluate_all("(bs) => bs.map(b => b.dataset.device)")
    assert set(devices) == {"accelerator 0", "accelerator 1", "cpu"}
    colours = blocks.evaluate_all("(bs) => bs.map(b => getComputedStyle(b).backgroundColor)")
    assert len({(d, c) for d, c in zip(devices, colours, strict=True)}) == 3  # one colour per device
    layers = blocks.evaluate_all("(bs) => bs.filter(b => b.title.includes('model.layers.')).length")
    assert layers == 16
    assert "Dry run: " in nb.cell(2).locator(".nbhw-message").inner_text()  # GPUs that are not here: problems
    nb.screenshot(f"{nb.name}-split", cell=2)


def test_insert_cell_below_puts_the_previewed_code_below_its_panel_20_of_20_and_while_a_cell_runs(
    notebook: NotebookPage, tiny: str
) -> None:
    panel_a, panel_b = f"%hw load {tiny} --dtype float32", f"%hw load {tiny} --attn eager"
    nb = notebook.open("insert.ipynb", ["%load_ext nbhw", panel_a, "x = 1", panel_b, SLEEP])
    for i in range(4):
        nb.run_cell(i)
    nb.check_widgets()

    def index(source: str) -> int:
        return [nb.cell_source(k) for k in range(nb.cell_count())].index(source)

    def insert(source: str, select_first: str | None = "x = 1") -> int:
        """Click the panel's Insert once (after selecting another cell); the new cell's index, checked."""
        at = index(source)
        expected = previewed(nb, at)
        if select_first is not None:
            nb.cell(index(select_first)).locator(".jp-InputArea-editor").click()
        before = nb.cell_count()
        nb.cell(at).locator(".nbhw-codebox-insert").click()
        poll("a new cell", lambda: nb.cell_count() == before + 1, 10)
        assert nb.cell_source(at + 1) == expected, f"the cell below {source!r} is not its previewed code"
        assert nb.cell_source(at) == source  # the panel's cell did not move
        return at + 1

    placed = []
    for k in range(20):
        if k == 10:  # a different preview from then on: the code inserted is the code shown now
            before = previewed(nb, index(panel_a))
            choose(control(nb, index(panel_a), "dropdown", "dtype"), "float16")
            changed_preview(nb, index(panel_a), before, "dtype=torch.float16")
        placed.append(insert(panel_a if k % 2 == 0 else panel_b))
    assert len(placed) == 20 and nb.cell_count() == 25

    # Once more while a long cell runs: started from the keyboard, like a user would.
    sleeper = index(SLEEP)
    nb.cell(sleeper).locator(".jp-InputArea-editor").click()
    nb.page.keyboard.press("Control+Enter")
    poll("the sleeping cell to run", lambda: "*" in nb.cells()[sleeper].prompt or None, 30)
    started = time.monotonic()
    inserted = insert(panel_a, select_first=None)
    assert "*" in nb.cells()[index(SLEEP)].prompt, "the long cell should still be running"
    assert time.monotonic() - started < 10  # not after the sleep
    nb.page.evaluate("() => window.jupyterapp.commands.execute('notebook:interrupt-kernel')")
    nb.wait_idle(60)

    # The inserted cell loads the tiny model and generates.
    nb.run_cell(inserted, timeout=180)
    assert nb.errors(inserted) == []
    assert "Hello, my name is" in nb.output_text(inserted)
    # The page as a user sees it: the panel's code box, its buttons, and the inserted cell with its output below.
    nb.cell(inserted).scroll_into_view_if_needed()
    nb.page.mouse.wheel(0, 250)
    nb.screenshot(f"{nb.name}-inserted")
