"""On a real NVIDIA GPU with the Hub offline: transformers' default Hub kernels (on since 5.25) can't be fetched, and
nbhw's plan says so before the cell fails the same way; with use_kernels=False the plan has no such problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpuenv import gpu_only, run_probe

pytestmark = gpu_only()


@pytest.mark.timeout(600)
def test_the_plan_names_the_uncached_kernels_that_stop_an_offline_load(
    billion_model: Path, record_property: Any
) -> None:
    facts = run_probe("offline_kernels", str(billion_model), env={"USE_HUB_KERNELS": None}, timeout=540)
    record_property("use_kernels", facts["use_kernels"])
    record_property("load_error", (facts["load_error"] or "none")[:160])
    if not facts["use_kernels"]:
        pytest.skip("this transformers leaves Hub kernels off by default")
    said = [p for p in facts["problems"] if "the Hub is offline" in p]
    record_property("plan_says", said[0][:160] if said else "nothing")
    assert len(said) == 1 and "use_kernels=False" in said[0], facts["problems"]
    assert facts["load_error"] is not None and "not available in the local cache" in facts["load_error"], facts
    failed_on = facts["load_error"].split("'")[1]  # kernels names the repository it could not find
    assert failed_on in said[0], (failed_on, said[0])
    assert not any("the Hub is offline" in p for p in facts["problems_without_kernels"])
