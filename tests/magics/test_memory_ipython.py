"""%hw memory in the real IPython shell: per-cell records with the right execution counts, text view, the hooks."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest
from IPython.core.error import UsageError

from nbhw.core import memory

MIB = 1024**2


def nbhw_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("nbhw") and t.is_alive()]


def records() -> dict[int | None, memory.CellRecord]:
    return {r.execution_count: r for r in memory.cells().records}


def test_cells_that_allocate_are_recorded_with_their_execution_counts(
    ip: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_cell("%hw memory --interval 0.05 --window 120", store_history=True)
    # This test's cells only in the table below: an earlier test's cell in this process (a model loaded and trained,
    # its peak now the kernel's exact one) may have used more than any of them.
    memory.cells().records.clear()
    keep = ip.run_cell("import numpy as np\nkeep = np.ones(256 * 2**20 // 8)", store_history=True)
    tensor = ip.run_cell("import torch\ntensor = torch.ones(64 * 2**20)  # 256 MiB on the CPU", store_history=True)
    spike = ip.run_cell("import time\ntmp = np.ones(512 * 2**20 // 8)\ntime.sleep(0.4)\ndel tmp", store_history=True)
    small = ip.run_cell("x = 1", store_history=True)
    got = records()
    counts = [keep.execution_count, tensor.execution_count, spike.execution_count, small.execution_count]
    assert all(c in got for c in counts) and len(set(counts)) == 4
    assert got[keep.execution_count].first_line == "import numpy as np"
    assert got[tensor.execution_count].first_line == "import torch"
    host = got[keep.execution_count].memory["host"]
    assert host.delta >= 200 * MIB and host.peak >= host.end
    assert got[tensor.execution_count].memory["host"].delta >= 200 * MIB
    # Freed before the cell ended: no delta left, but the peak saw it (Linux's own peak RSS; elsewhere the samples).
    spiked = got[spike.execution_count].memory["host"]
    assert abs(spiked.delta) < 100 * MIB and spiked.used >= 400 * MIB
    assert spiked.peak_from == ("kernel" if sys.platform == "linux" else "samples")
    assert got[small.execution_count].memory["host"].used < 50 * MIB
    assert all(got[c].succeeded for c in counts)
    capsys.readouterr()
    ip.run_cell("%hw memory", store_history=True)
    out = capsys.readouterr().out
    assert "nbhw memory: sampling every " in out and "RSS (this process)" in out
    table = out[out.index("Cells that used the most memory") :]
    first_row = table.splitlines()[3]
    assert first_row.startswith(f"  [{spike.execution_count}]") and "tmp = np.ones" not in first_row
    assert f"[{keep.execution_count}]" in table and f"[{tensor.execution_count}]" in table


def test_config_sets_the_defaults_and_options_override_them(ip: Any) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("config", "HwMagics.interval = 0.25")
    ip.run_line_magic("config", "HwMagics.window = 30")
    ip.run_line_magic("hw", "memory")
    sampler = memory.sampler()
    assert (sampler.interval, sampler.window, sampler.running) == (0.25, 30, True)
    ip.run_line_magic("hw", "memory --window 10")
    assert (sampler.interval, sampler.window, sampler.slots) == (0.25, 10, 40)
    ip.run_line_magic("config", "HwMagics.interval = 0.5")
    ip.run_line_magic("config", "HwMagics.window = 600")


def test_stop_stops_the_thread_and_says_so(ip: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("hw", "memory --interval 0.1")
    assert nbhw_threads() == ["nbhw-sampler"]
    capsys.readouterr()
    ip.run_line_magic("hw", "memory --stop")
    assert "memory sampling stopped" in capsys.readouterr().out
    assert nbhw_threads() == [] and not memory.sampler().running
    ip.run_line_magic("hw", "memory --stop")  # stopping twice is fine


def test_bad_settings_are_one_line_usage_errors_and_start_nothing(ip: Any) -> None:
    ip.run_line_magic("load_ext", "nbhw")
    for line, words in (
        ("memory --interval 0.001", "interval must be between 0.05 and 3600"),
        ("memory --interval 0.05 --window 100000", "at most 20000"),
    ):
        with pytest.raises(UsageError) as err:
            ip.run_line_magic("hw", line)
        assert words in str(err.value) and "\n" not in str(err.value)
    assert nbhw_threads() == []


def test_cell_events_are_registered_once_and_removed_with_the_sampler_on_unload(ip: Any) -> None:
    def ours(event: str) -> int:
        return sum(getattr(c, "__name__", "").startswith("_nbhw_") for c in ip.events.callbacks[event])

    ip.run_line_magic("load_ext", "nbhw")
    ip.run_line_magic("reload_ext", "nbhw")
    assert ours("pre_run_cell") == ours("post_run_cell") == 1
    assert ours("post_execute") == 0  # can fire on the widget-message thread; not used
    ip.run_line_magic("hw", "memory --interval 0.1")
    ip.run_line_magic("unload_ext", "nbhw")
    assert ours("pre_run_cell") == ours("post_run_cell") == 0
    assert nbhw_threads() == [] and not memory.sampler().running


def test_loading_the_extension_and_running_cells_imports_nothing_heavy() -> None:
    code = (
        "import sys\nfrom IPython.testing.globalipapp import get_ipython\nip = get_ipython()\n"
        "ip.run_line_magic('load_ext', 'nbhw')\nip.run_cell('x = 1', store_history=True)\n"
        "ip.run_cell('y = x + 1', store_history=True)\n"
        "heavy = ('torch', 'plotly', 'ipywidgets', 'psutil', 'nbhw.core.memory.sampling')\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "[]"
