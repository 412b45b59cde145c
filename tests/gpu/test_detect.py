"""On a real NVIDIA GPU: what nbhw detects (from NVML, no CUDA context) is what torch and NVML say about the card."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gpu.gpuenv import GIB, NvmlGpu, gpu_only, nvml_gpus, run_probe, same_uuid

pytestmark = gpu_only()

# NVML's total counts memory the driver keeps for itself; CUDA's totalGlobalMem does not. A few percent at most.
TOTAL_MEMORY_GAP = 0.03


def _nvml(uuid: str | None, gpus: list[NvmlGpu]) -> NvmlGpu:
    found = [g for g in gpus if same_uuid(g.uuid, uuid)]
    assert len(found) == 1, f"nbhw's uuid {uuid} is not one NVML reports: {[g.uuid for g in gpus]}"
    return found[0]


def test_detection_agrees_with_nvml_and_with_torch_after_it(gpu0: NvmlGpu, record_property: Any) -> None:
    facts = run_probe("detect")
    assert facts["usable"], facts["reason"]
    assert not facts["context_after_detect"]["initialized"], "nbhw.detect() initialised CUDA"
    ours, theirs = facts["nbhw"], facts["torch"]
    assert [d["device"] for d in ours] == [d["device"] for d in theirs], (ours, theirs)
    gpus, _ = nvml_gpus()
    for mine, torch_says in zip(ours, theirs, strict=True):
        nvml = _nvml(mine["uuid"], gpus)
        cc = f"{nvml.compute_capability[0]}.{nvml.compute_capability[1]}"
        assert (mine["name"], mine["total_memory"], mine["compute_capability"]) == (nvml.name, nvml.memory_total, cc)
        assert same_uuid(mine["uuid"], torch_says["uuid"]), (mine, torch_says)
        assert mine["name"] == torch_says["name"]
        assert mine["compute_capability"] == torch_says["compute_capability"]
        assert (mine["bf16"], mine["tf32"]) == (torch_says["bf16"], torch_says["tf32"])
        gap = abs(mine["total_memory"] - torch_says["total_memory"]) / mine["total_memory"]
        assert gap <= TOTAL_MEMORY_GAP, (mine["total_memory"], torch_says["total_memory"])
        assert not [n for n in mine["notes"] if "was built for" in n], mine["notes"]
    # transformers' own answers for the current device (cuda:0)
    assert (facts["transformers"]["bf16"], facts["transformers"]["tf32"]) == (ours[0]["bf16"], ours[0]["tf32"])
    first, torch_first = ours[0], theirs[0]
    record_property("gpu", first["name"])
    record_property("cc", first["compute_capability"])
    record_property("nvml_total_gib", round(first["total_memory"] / GIB, 2))
    record_property("torch_total_gib", round(torch_first["total_memory"] / GIB, 2))
    record_property("bf16_tf32", f"{first['bf16']}/{first['tf32']}")
    record_property("torch", facts["torch_version"])


@pytest.mark.parametrize("what", ["detect", "report", "attention", "plan", "doctor"])
def test_no_cuda_context_after(what: str, record_property: Any) -> None:
    facts = run_probe("context", what)
    before, after, control = facts["before"], facts["after"], facts["control"]
    assert control is not None and control["initialized"], "the control could not create a CUDA context"
    assert not after["initialized"], f"nbhw's {what} initialised CUDA in torch (said: {facts['said']})"
    if control["listed"]:
        # NVML lists this process once it holds a context (the control proves it), so absence means none.
        assert not after["listed"], f"nbhw's {what} left a CUDA context: NVML lists pid {facts['pid']}"
        record_property("nvml", "pid checked")
    else:
        # NVML can't see this PID (a PID namespace): a context costs hundreds of MiB of device memory instead.
        context_cost = sum(control["used"]) - sum(after["used"])
        ours = sum(after["used"]) - sum(before["used"])
        assert context_cost >= 64 * 2**20, f"neither NVML's pids nor its used memory show a context: {facts}"
        assert ours < context_cost / 2, (
            f"nbhw's {what} took {ours} bytes of device memory, a context takes ~{context_cost}"
        )
        record_property("nvml", f"pid hidden; used memory checked (context {context_cost // 2**20} MiB)")
    said = facts["said"]
    if what == "detect":
        assert "cuda" in said["usable"], said
    elif what == "attention":
        assert said["device"] == "cuda:0" and said["live"], said
    elif what == "plan":
        assert said["problems"] == [] and said["device_map"] == {"": "0"}, said
    elif what == "doctor":
        assert said["checks"]["torch architectures"] in {"ok", "finding"}, said  # read, not "unknown"
    record_property("said", str(said)[:80])
