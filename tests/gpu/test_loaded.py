"""On a real NVIDIA GPU: nbhw.loaded() after nbhw's cell loads a ~1B model on cuda:0, in a real IPython shell.

The bytes nbhw reports on cuda:0 must equal what the allocator holds for the model (torch.cuda.memory_allocated's
rise over the loading cell, less what the cell's own outputs keep); the plan comparison must name no difference;
the loading and generate cells' peaks must be the allocator's (max_memory_allocated since the cell began) and within
max(10 %, 256 MiB) of the plan's figures. Written for the GPU suite; skips without an NVIDIA GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpuenv import gpu_only

pytestmark = gpu_only()

MIB = 2**20
SLACK = 256 * MIB


def run(shell: Any, code: str) -> Any:
    result = shell.run_cell(code, store_history=True)
    result.raise_error()
    return result


@pytest.mark.timeout(600)
def test_loaded_on_cuda_matches_the_allocator_and_the_plan(ip: Any, billion_model: Path, record_property: Any) -> None:
    import torch

    import nbhw
    from nbhw.core.measured import origins

    ip.run_line_magic("load_ext", "nbhw")
    origins.forget()
    run(ip, "import torch, transformers\ntorch.zeros(1, device='cuda')")  # the context, outside the measured cells
    run(ip, "%hw memory --interval 0.1 --window 300")
    try:
        plan = nbhw.plan(str(billion_model), dtype="bfloat16")
        before = torch.cuda.memory_allocated()
        run(ip, plan.code)
        held = torch.cuda.memory_allocated() - before
        run(ip, "batch = tokenizer(['Hello'] * 4, return_tensors='pt').to('cuda')\n"
                "out = model.generate(**batch, max_new_tokens=1000, min_new_tokens=1000, do_sample=False)")  # fmt: skip
        found = nbhw.loaded()["model"]
    finally:
        run(ip, "%hw memory --stop")
    on_gpu = found.loaded.bytes_on("cuda:0")
    record_property("model_bytes_cuda0", on_gpu)
    record_property("allocated_rise", held)
    assert 0 <= held - on_gpu <= 4 * MIB, (held, on_gpu)  # the cell's inputs and outputs stay on the GPU too
    assert found.comparison is not None and found.comparison.differences == (), found.lines()
    peaks = [p for p in found.comparison.peaks if p.device == "cuda:0"]
    assert len(peaks) == 2, found.lines()
    for peak in peaks:
        record_property(f"peak_{peak.cell}", peak.words)
        assert "the allocator's peak" in peak.measured_by
        assert abs(peak.delta) <= max(0.10 * peak.planned, SLACK), peak.words
    ip.run_cell("model = tokenizer = inputs = outputs = batch = out = None")
    origins.forget()
