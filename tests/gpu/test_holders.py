"""On a real NVIDIA GPU: a real torch.OutOfMemoryError, the report's holders and failed size, and free giving back.

The device is made small with ``set_per_process_memory_fraction`` (a 2 GiB budget on cuda:0), so asking for 3 GiB
fails in the caching allocator with CUDA's own message; nbhw's cell hook (``%load_ext nbhw``) builds the report
in a real IPython shell. Figures are checked against torch's own counters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import nbhw
import nbhw.session
from tests.gpu.gpuenv import GIB, MIB, gpu_only
from tests.support.cells import fails, run

pytestmark = gpu_only()


@pytest.fixture
def small_gpu(fresh_ip: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, list[Any]]]:
    """A real shell with nbhw loaded, its reports collected, and cuda:0 limited to 2 GiB for this process."""
    import torch

    torch.zeros(1, device="cuda:0")  # the context first: the budget is then for tensors
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(2 * GIB / total, 0)
    reports: list[Any] = []
    monkeypatch.setattr(nbhw.session, "display", reports.append)
    fresh_ip.run_line_magic("load_ext", "nbhw")
    try:
        yield fresh_ip, reports
    finally:
        fresh_ip.run_line_magic("unload_ext", "nbhw")
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()


def test_a_real_out_of_memory_error_gets_its_report_and_free_gives_the_bytes_back(
    small_gpu: tuple[Any, list[Any]], record_property: Any
) -> None:
    import torch

    shell, reports = small_gpu
    run(
        shell,
        "import torch\nkept = torch.empty(256 * 1024**2, dtype=torch.uint8, device='cuda:0')\n"
        "def step():\n"
        "    x = torch.empty(512 * 1024**2, dtype=torch.uint8, device='cuda:0')\n"
        "    y = torch.empty(3 * 1024**3, dtype=torch.uint8, device='cuda:0')\n",
    )
    error = fails(shell, "step()")
    assert isinstance(error, torch.cuda.OutOfMemoryError)
    record_property("message", str(error)[:400])
    [report] = reports
    assert (report.failed.device, report.failed.nbytes, report.failed.printed) == ("cuda:0", 3 * GIB, "3.00 GiB")
    assert report.device == "cuda:0" and report.held is not None
    held = {g.label: (g.kind, g.nbytes) for g in report.held.groups}
    assert held["kept"] == ("variable", 256 * MIB) and held["step() › x"] == ("traceback", 512 * MIB), held
    allocated = torch.cuda.memory_allocated(0)
    assert report.held.allocated == allocated and report.traceback_bytes == 512 * MIB
    outside = report.held.outside_tensors
    record_property("allocated", allocated)
    record_property("outside_tensors", outside)  # block rounding, the allocator's own: small and not negative
    assert outside is not None and 0 <= outside < 16 * MIB
    assert "nbhw.free(traceback=True)" in report.text()
    del error

    freed = nbhw.free(traceback=True)
    [cuda] = [d for d in freed.devices if d.device == "cuda:0"]
    assert (cuda.expected, cuda.measured, cuda.how) == (512 * MIB, 512 * MIB, "allocator"), freed.text()
    reserved = torch.cuda.memory_reserved(0)
    freed = nbhw.free(names=["kept"], cache=True)
    [cuda] = [d for d in freed.devices if d.device == "cuda:0"]
    assert (cuda.expected, cuda.measured) == (256 * MIB, 256 * MIB), freed.text()
    assert cuda.cache_measured == reserved - torch.cuda.memory_reserved(0) and cuda.cache_measured >= 768 * MIB
    record_property("freed", freed.text())
    assert "kept" not in shell.user_ns
