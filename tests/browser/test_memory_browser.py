"""The live memory graph in a real browser: sane size, moving while another cell sleeps, per-cell attribution."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from tests.browser.harness import NotebookPage, poll

pytestmark = pytest.mark.browser

# The newest x value (a timestamp) plotted by the graph of `cell`, read from plotly's own data on the page.
NEWEST_X = """(arg) => {
  const plots = document.querySelectorAll('.nbhw-memory .js-plotly-plot');
  let newest = null;
  plots.forEach(p => (p.data || []).forEach(t => {
    const xs = t.x || []; const last = xs.length ? xs[xs.length - 1] : null;
    if (last !== null && (newest === null || String(last) > String(newest))) newest = last;
  }));
  return newest === null ? null : String(newest);
}"""

# The time axis' range as plotly.js computed it on the page.
X_RANGE = """() => {
  const g = document.querySelector('.nbhw-memory .js-plotly-plot');
  const r = g && g._fullLayout && g._fullLayout.xaxis && g._fullLayout.xaxis.range;
  return r ? [String(r[0]), String(r[1])] : null;
}"""

SIZE = """() => {
  const g = document.querySelector('.nbhw-memory .js-plotly-plot');
  if (!g) return null;
  const r = g.getBoundingClientRect();
  const box = document.querySelector('.nbhw-memory').getBoundingClientRect();
  return {w: r.width, h: r.height, top: r.top - box.top, boxw: box.width};
}"""


def test_memory_graph_moves_while_a_cell_sleeps_and_attributes_a_big_cell(notebook: NotebookPage) -> None:
    nb = notebook.open(
        "memory.ipynb",
        [
            "%load_ext nbhw\nimport torch",
            "%hw memory --interval 0.25",
            "import time\ntime.sleep(10)",  # 5 s of watching, and room for a slow page to start it
            "big = torch.ones(256, 1024, 1024)  # 1 GiB on the host",
            "%hw memory --stop",
        ],
    )
    nb.run_cell(0)
    nb.run_cell(1)
    assert nb.check_widgets(1) >= 1
    size = poll("the memory graph to be drawn", lambda: nb.page.evaluate(SIZE), 30)
    assert 400 <= size["w"] <= 1400 and 200 <= size["h"] <= 900, size
    assert size["top"] < 80, f"a blank band above the plot: {size}"

    before = nb.start_cell(2)
    seen = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        seen.append(nb.page.evaluate(NEWEST_X))
        time.sleep(1)
    assert "*" in nb.cells()[2].prompt, "the sleep cell should still be running while we watch"
    moving = [x for x in seen if x is not None]
    assert len(set(moving)) >= 3, f"x-range did not advance while another cell slept: {seen}"
    # Every trace is sent as the whole 10-minute window (fixed size), yet the axis spans only what was sampled.
    start, end = (datetime.fromisoformat(x[:23]) for x in nb.page.evaluate(X_RANGE))
    assert timedelta(seconds=3) < end - start < timedelta(seconds=90), (start, end)
    nb.wait_done([2], before, timeout=30)

    nb.run_cell(3)
    big_count = nb.cells()[3].count
    assert big_count is not None
    table = nb.outputs(1).locator(".nbhw-memory-cells")
    poll(
        "the big cell in the per-cell table",
        lambda: (
            f"[{big_count}]" in table.inner_text()
            or str(big_count) in [r.split("\t")[0].strip() for r in table.inner_text().splitlines()]
            or None
        ),
        20,
    )
    rows = [r for r in table.inner_text().splitlines() if "torch.ones(256, 1024, 1024)" in r]
    assert rows, table.inner_text()
    assert str(big_count) in rows[0] and "GiB" in rows[0]
    nb.screenshot(f"{nb.name}-graph", cell=1)

    nb.run_cell(4)
    status = nb.outputs(1).locator(".nbhw-memory-status .state")
    poll("the view to say it stopped", lambda: status.get_attribute("data-state") == "stopped" or None, 10)
    assert "stopped" in status.inner_text()
