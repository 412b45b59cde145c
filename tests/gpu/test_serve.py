"""On a real NVIDIA GPU: nbhw's serving plan against the continuous batching manager transformers makes there.

The plan is made first (nothing allocated), then the ~1B random-weight model is loaded on cuda:0 and the manager is
made with the plan's ContinuousBatchingConfig and started: its paged cache must be within max(3 %, 256 MiB) of
nbhw's (the free memory transformers reads after the load against nbhw's device memory less the planned weights
and reserve), its sector size exactly nbhw's, and its graphs / async / max_memory_percent decisions nbhw's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.gpu.gpuenv import GIB, gpu_only, run_probe

pytestmark = gpu_only()

MIB = 2**20


@pytest.mark.timeout(600)
def test_the_managers_paged_cache_on_the_card_is_nbhws(billion_model: Path, record_property: Any) -> None:
    facts = run_probe("serve", str(billion_model), "4096", timeout=540)
    for key, value in facts.items():
        record_property(key, value)
    assert facts["problem"] is None, facts
    assert facts["bytes_per_sector"][0] == facts["bytes_per_sector"][1], facts
    planned, real = facts["planned_cache_bytes"], facts["real_cache_bytes"]
    assert abs(real - planned) <= max(0.03 * real, 256 * MIB), facts
    record_property("cache_gib", [round(planned / GIB, 3), round(real / GIB, 3)])
    assert (facts["planned_graphs"], facts["planned_async"], facts["planned_percent"]) == (
        facts["real_graphs"], facts["real_async"], facts["real_percent"])  # fmt: skip
