"""200 cycles of load / %hw / %hw memory / unload (and reload) in one real kernel: nothing accumulates.

After every cycle the kernel reports its nbhw threads, all its threads, its open widgets and comms, and its RSS.
No nbhw thread may outlive ``%unload_ext``, the thread, widget and comm counts must come back to the same number
every cycle, and RSS may grow by at most a small bound after the warm-up (see RSS_BOUND).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.kernel import Kernel

pytestmark = pytest.mark.slow

CYCLES = 200
WARMUP = 10
MIB = 1024**2
# RSS may grow by this much over the 200 cycles after the warm-up. Measured: +1.5 MiB (IPython keeps every cell's
# source and the allocator does not give every page back), flat after ~100 cycles (+1.6 MiB with every tab opened
# in the even cycles). A %hw panel left open with every tab opened keeps ~140 widgets and ~0.7 MiB of RSS (the
# second test measures it), so one leaked panel per cycle would add ~140 MiB and one per 4 cycles ~35 MiB; the
# plotly figure each %hw memory leaked before it was fixed added 36 MiB.
RSS_BOUND = 8 * MIB

PROBE = """
def _nbhw_probe():
    import gc, json, threading, warnings
    import psutil
    from comm import get_comm_manager
    gc.collect()
    try:
        import ipywidgets
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Widget.widgets: deprecated, still the registry
            widgets = len(ipywidgets.Widget.widgets)
    except ImportError:
        widgets = 0
    return json.dumps({
        "nbhw_threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("nbhw")),
        "threads": threading.active_count(),
        "widgets": widgets,
        "comms": len(get_comm_manager().comms),
        "rss": psutil.Process().memory_info().rss,
    })

def _nbhw_settle():
    from nbhw.ui import panel
    if panel.open_panels():
        panel.shared_worker().wait(120)

def _nbhw_every_tab():
    # A panel makes each tab when it is first selected: select them all, as a person looking around would.
    from nbhw.ui import panel
    for p in panel.open_panels():
        for index in range(len(p.widget.children)):
            p.widget.selected_index = index
            _nbhw_settle()
"""

SETTLE = "_nbhw_settle()"
EVERY_TAB = "_nbhw_every_tab()"
# Even cycles open every tab of the panel and let it finish its background work (detection, advice, plan) before
# unloading; odd cycles unload at once, dropping that work mid-way, and reload the extension in the middle
# (%reload_ext unloads: the first panel is closed).
CYCLE = f"%load_ext nbhw\n%hw\n{EVERY_TAB}\n%hw memory\n%unload_ext nbhw\nprint(_nbhw_probe())"
CYCLE_RELOAD = "%load_ext nbhw\n%hw\n%reload_ext nbhw\n%hw memory\n%hw\n%unload_ext nbhw\nprint(_nbhw_probe())"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    # An empty HF cache and NBHW_HOME: the first %hw builds nbhw's tiny model in this kernel, as on a new machine.
    home, hf = tmp_path_factory.mktemp("nbhw-home"), tmp_path_factory.mktemp("hf-home")
    k = Kernel()
    try:
        k.run(
            f"import os\nos.environ.update(HF_HUB_OFFLINE='1', NBHW_HOME={str(home)!r}, HF_HOME={str(hf)!r})\n" + PROBE
        )
        yield k
    finally:
        k.close()


def probe(kernel: Kernel, cell: str) -> dict[str, Any]:
    out, messages = kernel.run(cell, timeout=120)
    errors = [m["content"]["text"] for m in messages if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"]
    assert not errors, (cell, errors)
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


# 200 real kernel round trips: about 2 minutes on an idle 2-core machine, 8.5 on one loaded 2.5x (measured the
# same before and after the one-declaration redesign: 519 s and 498 s), so the suite's 300 s would fail a busy one.
@pytest.mark.timeout(900)
def test_200_load_hw_memory_unload_cycles_leave_no_thread_widget_or_memory_behind(kernel: Kernel) -> None:
    start = probe(kernel, "print(_nbhw_probe())")
    warm = [probe(kernel, CYCLE if i % 2 == 0 else CYCLE_RELOAD) for i in range(WARMUP)]
    base = warm[-1]
    assert [w["widgets"] for w in warm] == [start["widgets"]] * WARMUP, warm  # from the first cycle on
    # What the warm-up left alive (torch, transformers, plotly, nbhw's modules: ~580,000 objects) out of the
    # collector's sight: each probe's full collection then walks what the cycles made, 0.36 s less per cycle, 40 %
    # of the kernel's time. It hides no leak: a frozen object is never collected, so anything it holds stays
    # counted, and a count or RSS can only read higher than without it, never lower.
    kernel.run("import gc\ngc.collect()\ngc.freeze()")
    series = []
    for i in range(CYCLES):
        now = probe(kernel, CYCLE if i % 2 == 0 else CYCLE_RELOAD)
        assert now["nbhw_threads"] == [], (i, now)
        assert (now["threads"], now["widgets"], now["comms"]) == (base["threads"], base["widgets"], base["comms"]), (
            i,
            now,
            base,
        )
        series.append(now["rss"])
    growth = series[-1] - base["rss"]
    print(
        f"\nbefore nbhw: {start['threads']} threads, {start['widgets']} widgets, {start['comms']} comms, "
        f"RSS {start['rss'] / MIB:.1f} MiB"
        f"\nafter {WARMUP} warm-up cycles: {base['threads']} threads, {base['widgets']} widgets, "
        f"{base['comms']} comms, RSS {base['rss'] / MIB:.1f} MiB"
        f"\nafter {CYCLES} more cycles: {now['threads']} threads, {now['widgets']} widgets, {now['comms']} comms, "
        f"RSS {series[-1] / MIB:.1f} MiB (growth {growth / MIB:+.1f} MiB, max {max(series) / MIB:.1f} MiB; "
        f"RSS every 50 cycles: {', '.join(f'{r / MIB:.1f}' for r in series[49::50])})"
    )
    assert growth <= RSS_BOUND, f"RSS grew {growth / MIB:.1f} MiB over {CYCLES} cycles"


def test_panel_cost_what_one_panel_left_open_would_leak(kernel: Kernel) -> None:
    """The yardstick of RSS_BOUND: what a panel that is never closed keeps, every tab opened (20 of them, then
    unload)."""
    before = probe(kernel, "print(_nbhw_probe())")
    kernel.run("%load_ext nbhw")
    after = probe(
        kernel,
        f"for _ in range(20):\n    get_ipython().run_line_magic('hw', '')\n{SETTLE}\n{EVERY_TAB}\n"
        + "print(_nbhw_probe())",
    )
    per_panel = (after["rss"] - before["rss"]) / 20
    widgets = (after["widgets"] - before["widgets"]) / 20
    unloaded = probe(kernel, "%unload_ext nbhw\nprint(_nbhw_probe())")
    print(f"\none panel left open: {widgets:.0f} widgets, {per_panel / MIB:.2f} MiB of RSS")
    assert widgets >= 50 and unloaded["widgets"] == before["widgets"]
    assert per_panel * CYCLES >= 4 * RSS_BOUND  # a panel leaked per cycle would fail the bound 4 times over
