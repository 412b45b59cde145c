"""On a real NVIDIA GPU: the pre-flight checks create no CUDA context, leave forked children free to start CUDA,
read the same arch list torch.cuda.get_arch_list() gives, and predict what a real kernel launch does on each GPU."""

from __future__ import annotations

from typing import Any

import pytest

from tests.gpu.gpuenv import gpu_only, run_probe

pytestmark = gpu_only()


@pytest.fixture(scope="module")
def facts() -> dict[str, Any]:
    """One fresh process: nbhw's checks first, then the ground truth (CUDA started on purpose)."""
    return run_probe("preflight")


def test_doctor_creates_no_context_and_leaves_fork_alone(facts: dict[str, Any], record_property: Any) -> None:
    context = facts["context"]
    assert not context["initialized"], "nbhw.doctor() / detect() initialised CUDA in torch"
    assert not context["listed"], f"NVML lists this process after nbhw.doctor(): {context}"
    # The control: torch.cuda.get_arch_list() (what nbhw no longer calls) does put forked children in bad fork,
    # so the signal works here, and nbhw's reading did not set it.
    assert facts["bad_fork_child_after_get_arch_list"], "the fork signal does not work here: nothing proven"
    assert not facts["bad_fork_child_after_nbhw"], "after nbhw.doctor(), a forked child cannot start CUDA"
    record_property("doctor_s", facts["doctor_seconds"])
    record_property("findings", ",".join(facts["findings"]) or "none")


def test_the_arch_list_from_the_binary_is_torchs_own(facts: dict[str, Any], record_property: Any) -> None:
    assert facts["arch_source"] == "CUDA_ARCH_FLAGS in libtorch_python.so", facts["arch_source"]
    assert facts["arch_from_binary"] == facts["get_arch_list"], (facts["arch_from_binary"], facts["get_arch_list"])
    record_property("arch", " ".join(facts["arch_from_binary"]))


def test_each_gpus_verdict_is_what_a_kernel_launch_does(facts: dict[str, Any], record_property: Any) -> None:
    assert set(facts["predicted"]) == set(facts["real"]), (facts["predicted"], facts["real"])
    for device, real in facts["real"].items():
        predicted = facts["predicted"][device]
        assert real in {"runs", "no kernel image"}, f"{device}: {real}"
        assert (predicted != "none") == (real == "runs"), f"{device}: predicted {predicted}, launch {real}"
        if predicted == "none":
            assert "torch:no-kernel-image" in facts["findings"], facts["findings"]
    record_property("verdicts", ", ".join(f"{d}={v}" for d, v in sorted(facts["predicted"].items())))
