"""The memory graph in a real Jupyter kernel: it keeps moving while another cell sleeps; unloading leaves no thread."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.kernel import Kernel, fresh_kernel  # noqa: F401  (the `kernel` fixture)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def widget_ids(messages: list[dict[str, Any]]) -> set[str]:
    return {
        m["content"]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
        for m in messages
        if m["msg_type"] == "display_data" and "application/vnd.jupyter.widget-view+json" in m["content"]["data"]
    }


def figure_updates(messages: list[dict[str, Any]]) -> int:
    return sum(
        1
        for m in messages
        if m["msg_type"] == "comm_msg" and (m["content"]["data"].get("state") or {}).get("_py2js_update")
    )


def test_the_graph_keeps_moving_while_another_cell_sleeps_and_unload_leaves_no_thread(kernel: Kernel) -> None:
    out, _ = kernel.run("import nbhw, sys; print(nbhw.__file__); print(sys.executable)")
    assert out.splitlines() == [str(ROOT / "nbhw" / "__init__.py"), sys.executable]
    kernel.run("%load_ext nbhw")
    _, shown = kernel.run("%hw memory --interval 0.1 --window 60")
    assert any(m["msg_type"] == "comm_open" for m in shown)
    _, again = kernel.run("%hw memory --interval 0.1 --window 60")
    # Showing it again displays the same widget: one graph for the kernel to update, not two.
    assert widget_ids(shown) == widget_ids(again) and len(widget_ids(shown)) == 1
    _, during = kernel.run("import time\nt0 = time.time()\ntime.sleep(3)\nt1 = time.time()")
    # The sampler thread sent graph updates while the cell slept (no cell was free to do it).
    assert figure_updates(during) >= 1
    out, _ = kernel.run(
        "from nbhw.ui import memory as ui\nmon = nbhw.monitor(interval=0.1, window=60)\n"
        "times = mon.samples.times\nprint(int(((times >= t0) & (times <= t1)).sum()))\n"
        "view = ui.views()[0]\nprint(len(ui.views()), view.frames_sent)"
    )
    samples_while_asleep, views_and_frames = out.splitlines()
    assert int(samples_while_asleep) >= 20  # 3 s at 10 Hz
    views, frames = (int(x) for x in views_and_frames.split())
    assert views == 1 and frames >= 2
    _, unloaded = kernel.run("%unload_ext nbhw")
    out, _ = kernel.run(
        "import threading\nprint([t.name for t in threading.enumerate() if t.name.startswith('nbhw')])\n"
        "print(ui.views(), view.closed, view.figure.comm, view.box.comm)"
    )
    # Unloading stops the sampler and closes the graph: its widgets' comms are closed in the front end too.
    assert out.splitlines() == ["[]", "[] True None None"]
    assert sum(m["msg_type"] == "comm_close" for m in unloaded) >= 6
