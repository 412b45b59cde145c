"""On a real NVIDIA GPU: nbhw's plan for a locally built ~1B model places it on cuda:0, the cell it writes loads it
there, and what torch then holds is within 5% of the estimate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu import bigmodel
from tests.gpu.gpuenv import GIB, gpu_only, run_probe

pytestmark = gpu_only()

TOLERANCE = 0.05


@pytest.mark.timeout(600)
def test_plan_places_a_1b_model_on_cuda0_and_its_cell_loads_it_within_5_percent(
    billion_model: Path, record_property: Any
) -> None:
    from transformers import AutoConfig

    expected = bigmodel.parameter_count(AutoConfig.from_pretrained(billion_model))
    facts = run_probe("load", str(billion_model), timeout=540)
    assert facts["problems"] == [], facts["problems"]
    placement, estimate = facts["placement"], facts["estimate"]
    assert placement["device_map"] == {"": 0} and placement["kind"] == "one_device", placement
    assert [d["device"] for d in placement["devices"]] == ["cuda:0"], placement["devices"]
    assert 'device_map="auto"' in facts["code"]
    planned = facts["context_after_planning"]
    assert not planned["initialized"] and not planned["listed"], "planning created a CUDA context"
    # The cell ran: every weight on cuda:0, in the checkpoint's bfloat16, all of them.
    assert facts["devices"] == ["cuda:0"] and facts["dtypes"] == ["torch.bfloat16"], facts
    assert facts["parameters"] == expected == estimate["parameters"]
    measured = facts["allocated_after"] - facts["allocated_before"]
    planned_bytes = estimate["total_bytes"]
    ratio = measured / planned_bytes
    assert abs(ratio - 1) <= TOLERANCE, f"torch holds {measured} bytes, nbhw estimated {planned_bytes}"
    record_property("parameters_b", round(expected / 1e9, 3))
    record_property("estimate_gib", round(planned_bytes / GIB, 3))
    record_property("allocated_gib", round(measured / GIB, 3))
    record_property("ratio", round(ratio, 4))
    record_property("cell_s", facts["cell_seconds"])
