"""Environment analysis: CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER and the notebook traps around them."""

from __future__ import annotations

import types

import pytest
import torch

from nbhw.core.hardware import detect, environment
from tests.support.fakes import FakeGpu, FakeHardware


def analysis() -> environment.EnvAnalysis:
    return detect.detect().env


def values() -> dict[str, str | None]:
    return {v.name: v.value for v in analysis().variables}


def test_key_variables_are_always_listed_and_others_when_set(fake_hw: FakeHardware) -> None:
    fake_hw.env(HF_HUB_OFFLINE=None, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    found = {v.name: v for v in analysis().variables}
    for name in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ACCELERATE_TORCH_DEVICE", "HF_HUB_OFFLINE"):
        assert name in found
    assert (
        found["CUDA_VISIBLE_DEVICES"].value is None and "every GPU is visible" in found["CUDA_VISIBLE_DEVICES"].meaning
    )
    assert found["PYTORCH_CUDA_ALLOC_CONF"].value == "expandable_segments:True"
    assert "ROCR_VISIBLE_DEVICES" not in found


def test_empty_cuda_visible_devices_is_explained(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu())
    fake_hw.env(CUDA_VISIBLE_DEVICES="")
    env = analysis()
    assert {v.name: v.meaning for v in env.variables}["CUDA_VISIBLE_DEVICES"].startswith("empty: hides every GPU")
    assert any("no GPU is visible" in w for w in env.warnings)


def test_mixed_gpus_without_pci_bus_id_flag_the_nvidia_smi_mismatch(fake_hw: FakeHardware) -> None:
    # nvidia-smi order: a T4 first, then an H100. CUDA's fastest-first puts the H100 at cuda:0.
    fake_hw.nvidia(FakeGpu(name="Tesla T4", cc=(7, 5)), FakeGpu(name="NVIDIA H100", cc=(9, 0)))
    env = analysis()
    assert [(r.device, r.nvml_index, r.name) for r in env.gpu_order] == [
        ("cuda:0", 1, "NVIDIA H100"),
        ("cuda:1", 0, "Tesla T4"),
    ]
    assert env.gpu_order_exact is False
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in w and "does not match nvidia-smi" in w for w in env.warnings)
    assert [d.name for d in detect.detect().backend("cuda").devices] == ["NVIDIA H100", "Tesla T4"]


def test_pci_bus_id_order_matches_nvidia_smi_and_is_not_flagged(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(name="Tesla T4", cc=(7, 5)), FakeGpu(name="NVIDIA H100", cc=(9, 0)))
    fake_hw.env(CUDA_DEVICE_ORDER="PCI_BUS_ID")
    env = analysis()
    assert [r.nvml_index for r in env.gpu_order] == [0, 1]
    assert env.gpu_order_exact and not [w for w in env.warnings if "nvidia-smi" in w]


def test_identical_gpus_need_no_warning(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(), FakeGpu(), FakeGpu(), FakeGpu())
    env = analysis()
    assert [r.nvml_index for r in env.gpu_order] == [0, 1, 2, 3] and env.gpu_order_exact
    assert env.warnings == []


def test_cuda_visible_devices_list_maps_cuda_n_to_physical_gpus(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(), FakeGpu(), FakeGpu(), FakeGpu())
    fake_hw.env(CUDA_VISIBLE_DEVICES="3,1")
    env = analysis()
    assert [(r.device, r.nvml_index) for r in env.gpu_order] == [("cuda:0", 3), ("cuda:1", 1)]
    assert "renumbered" in {v.name: v.meaning for v in env.variables}["CUDA_VISIBLE_DEVICES"]


def test_repeated_entries_hide_every_gpu_as_cuda_does(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(), FakeGpu())
    fake_hw.env(CUDA_VISIBLE_DEVICES="0,0")
    assert not detect.detect().backend("cuda").usable
    assert any("selects no GPU" in w for w in analysis().warnings)


def _initialised_cuda(monkeypatch: pytest.MonkeyPatch, uuids: list[str]) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(uuids))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=uuids[i]))


def test_changing_cuda_visible_devices_after_cuda_init_is_flagged(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    nv = fake_hw.nvidia(FakeGpu(), FakeGpu())
    _initialised_cuda(monkeypatch, [g.uuid for g in nv.gpus])  # CUDA started seeing both GPUs
    fake_hw.env(CUDA_VISIBLE_DEVICES="1")  # ... then the user "selects" GPU 1
    env = analysis()
    assert any("changing it after CUDA starts has no effect" in w for w in env.warnings)
    assert [r.nvml_index for r in env.gpu_order] == [0, 1]  # what CUDA really uses
    assert [d.device for d in detect.detect().backend("cuda").devices] == ["cuda:0", "cuda:1"]


def test_no_init_warning_when_cuda_started_with_the_current_value(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    nv = fake_hw.nvidia(FakeGpu(), FakeGpu())
    _initialised_cuda(monkeypatch, [nv.gpus[1].uuid])
    fake_hw.env(CUDA_VISIBLE_DEVICES="1")
    assert not [w for w in analysis().warnings if "after CUDA starts" in w]


def test_unknown_cuda_device_order_value_is_named(fake_hw: FakeHardware) -> None:
    fake_hw.env(CUDA_DEVICE_ORDER="PCI")
    meaning = {v.name: v.meaning for v in analysis().variables}["CUDA_DEVICE_ORDER"]
    assert "unknown value 'PCI'" in meaning and "PCI_BUS_ID" in meaning
