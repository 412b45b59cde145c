"""On a real NVIDIA GPU: the cuda:N names nbhw shows under CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER are the GPUs
torch then uses, before CUDA starts (nbhw's reading) and after (torch's own mapping).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.gpu.gpuenv import NvmlGpu, gpu_only, nvml_gpus, run_probe, same_uuid

pytestmark = gpu_only()

VISIBLE, ORDER = "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"


def case_env(case: str, gpus: list[NvmlGpu]) -> dict[str, str | None] | None:
    """The environment a case sets (None: the case needs more GPUs than this machine has)."""
    n = len(gpus)
    every = [str(i) for i in range(n)]
    cases: dict[str, dict[str, str | None]] = {
        "unset": {VISIBLE: None, ORDER: None},
        "index-0": {VISIBLE: "0", ORDER: None},
        "uuid-0": {VISIBLE: gpus[0].uuid, ORDER: None},
        "pci-order": {VISIBLE: None, ORDER: "PCI_BUS_ID"},
        "fastest-first": {VISIBLE: None, ORDER: "FASTEST_FIRST"},
        "missing-after-0": {VISIBLE: f"0,{n}", ORDER: None},
        "only-missing": {VISIBLE: str(n), ORDER: None},
        "empty": {VISIBLE: "", ORDER: None},
    }
    if n >= 2:
        cases["reversed"] = {VISIBLE: ",".join(reversed(every)), ORDER: None}
        cases["reversed-pci"] = {VISIBLE: ",".join(reversed(every)), ORDER: "PCI_BUS_ID"}
        cases["uuid-last"] = {VISIBLE: gpus[-1].uuid, ORDER: "PCI_BUS_ID"}
    return cases.get(case)


CASES = [
    "unset",
    "index-0",
    "uuid-0",
    "pci-order",
    "fastest-first",
    "missing-after-0",
    "only-missing",
    "empty",
    "reversed",
    "reversed-pci",
    "uuid-last",
]


def _same(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> bool:
    return [d["device"] for d in ours] == [d["device"] for d in theirs] and all(
        same_uuid(a["uuid"], b["uuid"]) and a["name"] == b["name"] for a, b in zip(ours, theirs, strict=True)
    )


@pytest.mark.parametrize("case", CASES)
def test_cuda_n_names_the_gpu_torch_uses(case: str, record_property: Any) -> None:
    gpus, _ = nvml_gpus()
    env = case_env(case, gpus)
    if env is None:
        pytest.skip(f"{case} needs two GPUs; this machine has {len(gpus)}")
    facts = run_probe("visible", env=env)
    before, after, theirs = facts["nbhw_before"], facts["nbhw_after"], facts["torch"]
    assert not facts["initialized_by_nbhw"], "nbhw.detect() initialised CUDA"
    if case in {"empty", "only-missing"}:
        assert theirs == [] and not before["usable"] and before["devices"] == [], facts
        assert "CUDA_VISIBLE_DEVICES" in (before["reason"] or ""), before["reason"]
    else:
        assert theirs, f"torch sees no GPU under {env}"
        if before["exact"]:
            assert _same(before["devices"], theirs), (
                f"before CUDA starts nbhw shows {before['devices']}; torch {theirs}"
            )
        assert _same(after["devices"], theirs), f"after CUDA starts nbhw shows {after['devices']}; torch {theirs}"
    if case == "missing-after-0":
        said = " ".join(before["notes"])
        assert f"names GPU {len(gpus)}, which does not exist" in said, before["notes"]
    record_property("env", ", ".join(f"{k}={v}" for k, v in env.items() if v is not None) or "unset")
    record_property("torch", ",".join(d["device"] for d in theirs) or "none")
    record_property("nbhw_exact_before_init", before["exact"])
