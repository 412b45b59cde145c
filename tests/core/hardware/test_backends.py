"""Every backend row in its three states (usable / installed without a device / missing), with fakes at the boundary."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbhw.core.hardware import backends, cuda_arch, detect
from nbhw.core.hardware.data import BackendStatus
from tests.support.fake_binaries import write_elf
from tests.support.fakes import GIB, FakeGpu, FakeHardware

TABLE = ("cpu", "cuda", "rocm", "neuron", "tpu", "xpu", "mps", "hpu", "npu", "mlu", "musa")
DEVICE_STRINGS = {
    "cpu": "cpu",
    "cuda": "cuda",
    "rocm": "cuda",
    "neuron": "neuron",
    "tpu": "tpu",
    "xpu": "xpu",
    "mps": "mps",
    "hpu": "hpu",
    "npu": "npu",
    "mlu": "mlu",
    "musa": "musa",
}
PLUGINS = {
    "neuron": ("torch_neuronx", "torch-neuronx"),
    "hpu": ("habana_frameworks.torch", "habana"),
    "npu": ("torch_npu", "torch-npu"),
    "mlu": ("torch_mlu", "torch-mlu"),
    "musa": ("torch_musa", "torch-musa"),
}


def row(key: str) -> BackendStatus:
    return next(r for r in backends.probe_all() if r.key == key)


def test_registry_has_the_eleven_rows_of_the_transformers_table_in_order() -> None:
    assert backends.TABLE_KEYS == TABLE
    rows = backends.probe_all()
    assert [r.key for r in rows if not r.extra] == list(TABLE)
    assert {r.key: r.device for r in rows if not r.extra} == DEVICE_STRINGS


def test_real_cpu_machine_reports_cpu_usable_and_every_other_row_with_its_reason(fake_hw: FakeHardware) -> None:
    fake_hw.linux_cpu_machine()
    rows = {r.key: r for r in backends.probe_all()}
    assert rows["cpu"].usable
    cpu = rows["cpu"].devices[0]
    assert cpu.device == "cpu" and cpu.total_memory and cpu.total_memory > GIB and cpu.free_memory
    assert [k for k, r in rows.items() if r.usable] == ["cpu"]
    assert "CPU-only build" in (rows["cuda"].reason or "")
    assert "cu" in (rows["cuda"].fix or "")
    assert "not a ROCm build" in (rows["rocm"].reason or "")
    assert "rocm" in (rows["rocm"].fix or "")
    assert "built without XPU support" in (rows["xpu"].reason or "")
    assert "macOS" in (rows["mps"].reason or "")
    for key, (module, package) in PLUGINS.items():
        assert rows[key].reason == f"{module} is not installed", key
        assert package in (rows[key].fix or ""), key
        assert rows[key].installed is False
    assert rows["tpu"].reason == "torch_tpu is not installed"
    for key in TABLE[1:]:
        assert not rows[key].usable and rows[key].fix, key


# ---------------------------------------------------------------- plugin backends: neuron, hpu, npu, mlu, musa


@pytest.mark.parametrize("key", sorted(PLUGINS))
def test_plugin_backend_usable_lists_its_devices(fake_hw: FakeHardware, key: str) -> None:
    module, _ = PLUGINS[key]
    fake_hw.plugin(
        key,
        module,
        FakeGpu(name=f"{key} card", total=64 * GIB, used=4 * GIB),
        FakeGpu(name=f"{key} card", total=64 * GIB, used=0),
    )
    r = row(key)
    assert r.usable and r.installed and r.reason is None
    assert [d.device for d in r.devices] == [f"{key}:0", f"{key}:1"]
    assert r.devices[0].name == f"{key} card"
    assert r.devices[0].total_memory == 64 * GIB and r.devices[0].free_memory == 60 * GIB
    assert r.devices[0].bf16 is True


@pytest.mark.parametrize("key", sorted(PLUGINS))
def test_plugin_installed_but_no_device_says_so_and_points_at_the_hardware(fake_hw: FakeHardware, key: str) -> None:
    module, _ = PLUGINS[key]
    fake_hw.plugin(key, module, available=False)
    r = row(key)
    assert not r.usable and r.installed
    assert r.reason is not None and "installed but no" in r.reason and "was found" in r.reason
    assert r.fix is not None and "run on a machine with" in r.fix


@pytest.mark.parametrize("key", sorted(PLUGINS))
def test_plugin_that_registers_no_torch_module_is_explained(
    fake_hw: FakeHardware, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    module, _ = PLUGINS[key]
    fake_hw.plugin_without_device_module(module)
    for part in range(1, module.count(".") + 1):
        fake_hw.plugin_without_device_module(".".join(module.split(".")[:part]))
    monkeypatch.delattr(torch, key, raising=False)
    r = row(key)
    assert not r.usable and r.reason == f"{module} is installed but did not register torch.{key}"


@pytest.mark.parametrize("key", sorted(PLUGINS))
def test_plugin_missing_names_the_package_to_install(fake_hw: FakeHardware, key: str) -> None:
    module, package = PLUGINS[key]
    fake_hw.plugin(key, module, install=False)
    r = row(key)
    assert not r.usable and not r.installed and r.version is None
    assert r.reason == f"{module} is not installed"
    assert package in (r.fix or "")


# ---------------------------------------------------------------- NVIDIA


def test_nvidia_usable_from_nvml_without_touching_cuda(fake_hw: FakeHardware) -> None:
    import torch

    fake_hw.nvidia(
        FakeGpu(name="NVIDIA H100 80GB HBM3", cc=(9, 0), total=80 * GIB, used=2 * GIB),
        FakeGpu(name="NVIDIA H100 80GB HBM3", cc=(9, 0)),
    )
    r = row("cuda")
    assert r.usable and r.reason is None
    d = r.devices[0]
    assert (d.device, d.name, d.compute_capability) == ("cuda:0", "NVIDIA H100 80GB HBM3", "9.0")
    assert (d.total_memory, d.free_memory) == (80 * GIB, 78 * GIB)
    assert (d.bf16, d.fp16, d.tf32) == (True, True, True)
    assert d.details["nvml_index"] == "0" and d.details["pci_bus_id"].endswith(":10:00.0")
    assert any("driver 580.65.06" in n for n in r.notes)
    assert not torch.cuda.is_initialized()


def test_nvidia_turing_gets_no_bf16_and_a_note(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(name="Tesla T4", cc=(7, 5), total=16 * GIB))
    d = row("cuda").devices[0]
    assert (d.bf16, d.tf32, d.fp16) == (False, False, True)
    assert any("float16" in n for n in d.notes)


def built_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    """torch's binary says it was built for these architectures (CUDA_ARCH_FLAGS in libtorch_python.so)."""
    fake = write_elf(tmp_path / "libtorch_python.so", sections={".rodata": b"\0" + arch.encode() + b"\0"})
    monkeypatch.setattr(cuda_arch, "arch_flags_library", lambda lib_dir: fake)


def test_nvidia_gpu_newer_than_the_torch_build_is_flagged(
    fake_hw: FakeHardware, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # fake_hw.nvidia() makes torch._C._cuda_getArchFlags fail the test: asking torch arms its fork trap.
    fake_hw.nvidia(FakeGpu(name="NVIDIA RTX PRO 6000", cc=(12, 0)))
    built_for(tmp_path, monkeypatch, "sm_80 sm_86 sm_90")
    d = row("cuda").devices[0]
    assert any("sm_120 is not among them" in n and "no kernel image" in n for n in d.notes), d.notes


@pytest.mark.parametrize(
    "case",
    [
        ("sm_80 sm_90a", (9, 0), None),  # sm_90a runs on exactly 9.0 (the old reading dropped it)
        ("sm_80 compute_80", (9, 0), "PTX"),  # PTX JIT-compiles for newer GPUs: slow, not impossible
        ("sm_80 sm_86", (8, 9), None),  # a cubin runs on a higher minor of its major
        ("sm_90", (8, 9), "not among them"),
    ],
)
def test_the_arch_note_follows_nvidias_rule(
    fake_hw: FakeHardware,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[str, tuple[int, int], str | None],
) -> None:
    arch, cc, note = case
    fake_hw.nvidia(FakeGpu(cc=cc))
    built_for(tmp_path, monkeypatch, arch)
    notes = [n for n in row("cuda").devices[0].notes if "this torch was built for" in n]
    assert (notes == []) if note is None else (len(notes) == 1 and note in notes[0]), notes


def test_the_arch_note_does_not_arm_the_fork_trap(fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[str] = []
    fake_hw.nvidia(FakeGpu(cc=(12, 0)))
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: calls.append("called") or ["sm_80"])
    monkeypatch.setattr(torch._C, "_cuda_getArchFlags", lambda: calls.append("called") or "sm_80", raising=False)
    assert row("cuda").usable and calls == []


def test_cuda_visible_devices_empty_hides_all_gpus(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu())
    fake_hw.env(CUDA_VISIBLE_DEVICES="")
    r = row("cuda")
    assert not r.usable
    assert r.reason == "CUDA_VISIBLE_DEVICES is set to an empty string, which hides all GPUs"
    assert "unset CUDA_VISIBLE_DEVICES" in (r.fix or "")


def test_cuda_visible_devices_selects_and_renumbers(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(name="A"), FakeGpu(name="B"), FakeGpu(name="C"))
    fake_hw.env(CUDA_VISIBLE_DEVICES="2,0", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    r = row("cuda")
    assert [(d.device, d.name, d.details["nvml_index"]) for d in r.devices] == [
        ("cuda:0", "C", "2"),
        ("cuda:1", "A", "0"),
    ]


def test_cuda_visible_devices_by_uuid(fake_hw: FakeHardware) -> None:
    nv = fake_hw.nvidia(FakeGpu(name="A"), FakeGpu(name="B"))
    fake_hw.env(CUDA_VISIBLE_DEVICES=nv.gpus[1].uuid[:12], CUDA_DEVICE_ORDER="PCI_BUS_ID")
    assert [d.name for d in row("cuda").devices] == ["B"]


def test_cuda_visible_devices_pointing_past_the_last_gpu_is_reported(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(name="A"))
    fake_hw.env(CUDA_VISIBLE_DEVICES="0,3", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    r = row("cuda")
    assert [d.name for d in r.devices] == ["A"]
    assert any("names GPU 3, which does not exist" in n for n in r.notes)


def test_cpu_torch_with_nvidia_gpus_present_says_install_a_cuda_build(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    fake_hw.nvidia(FakeGpu())
    monkeypatch.setattr(torch.version, "cuda", None)
    r = row("cuda")
    assert not r.usable
    assert r.reason is not None and "CPU-only build" in r.reason and "the driver sees 1 NVIDIA GPU" in r.reason
    assert "download.pytorch.org/whl/cu" in (r.fix or "")


def test_nvml_library_missing_degrades_with_an_explanation(
    fake_hw: FakeHardware, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    fake_hw.no_nvml_library()
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    r = row("cuda")
    assert not r.usable and "libnvidia-ml.so.1" in (r.reason or "")
    assert "driver" in (r.fix or "")
    hw = detect.detect()
    assert hw.nvidia.available is False and "libnvidia-ml" in (hw.nvidia.error or "")


def test_nvml_init_failure_degrades_and_detection_still_completes(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(), init_error=__import__("tests.support.fakes").support.fakes.NVMLError_DriverNotLoaded)
    hw = detect.detect()
    assert hw.backend("cpu").usable
    assert not hw.backend("cuda").usable and "driver is not loaded" in (hw.backend("cuda").reason or "")


def test_nvml_failing_on_one_gpu_keeps_the_others(fake_hw: FakeHardware) -> None:
    fake_hw.nvidia(FakeGpu(name="good"), FakeGpu(name="bad", fail=True), FakeGpu(name="good2"))
    fake_hw.env(CUDA_DEVICE_ORDER="PCI_BUS_ID")
    r = row("cuda")
    assert r.usable
    assert [d.name for d in r.devices] == ["good", None, "good2"]
    assert any("did not answer" in n for n in r.devices[1].notes)


# ---------------------------------------------------------------- AMD ROCm


def test_rocm_build_is_told_apart_from_nvidia(fake_hw: FakeHardware) -> None:
    fake_hw.rocm(FakeGpu(name="AMD Instinct MI300X", arch="gfx942", total=192 * GIB, used=0))
    rows = {r.key: r for r in backends.probe_all()}
    assert rows["rocm"].usable and not rows["cuda"].usable
    assert "ROCm build" in (rows["cuda"].reason or "") and "AMD" in (rows["cuda"].reason or "")
    d = rows["rocm"].devices[0]
    assert (d.device, d.name, d.compute_capability, d.bf16, d.tf32) == (
        "cuda:0",
        "AMD Instinct MI300X",
        "gfx942",
        True,
        True,
    )
    assert d.total_memory == 192 * GIB


def test_rocm_build_without_gpus(fake_hw: FakeHardware) -> None:
    fake_hw.rocm()
    r = row("rocm")
    assert not r.usable and r.reason == "no AMD GPU found by the ROCm runtime"


def test_rocm_without_amdsmi_counts_devices_and_says_what_is_missing(fake_hw: FakeHardware) -> None:
    fake_hw.rocm(FakeGpu(), FakeGpu(), amdsmi=False)
    r = row("rocm")
    assert r.usable and [d.device for d in r.devices] == ["cuda:0", "cuda:1"]
    assert any("amdsmi" in n for n in r.notes)


# ---------------------------------------------------------------- XPU, MPS, TPU


def test_xpu_usable(fake_hw: FakeHardware) -> None:
    fake_hw.xpu(FakeGpu(name="Intel(R) Data Center GPU Max 1550", total=128 * GIB, used=0))
    r = row("xpu")
    assert r.usable and r.devices[0].device == "xpu:0" and r.devices[0].name.startswith("Intel")
    assert r.devices[0].free_memory == 128 * GIB


def test_xpu_built_but_no_gpu(fake_hw: FakeHardware) -> None:
    fake_hw.xpu()
    r = row("xpu")
    assert not r.usable and "no Intel GPU found" in (r.reason or "")


def test_xpu_not_in_this_build(fake_hw: FakeHardware) -> None:
    fake_hw.xpu(FakeGpu(), compiled=False)
    r = row("xpu")
    assert not r.usable and "built without XPU support" in (r.reason or "")
    assert "whl/xpu" in (r.fix or "")


def test_mps_usable_on_apple_silicon(fake_hw: FakeHardware) -> None:
    fake_hw.mps(total=48 * GIB)
    r = row("mps")
    assert r.usable and r.devices[0].device == "mps" and r.devices[0].name == "Apple M3 Max"
    assert r.devices[0].total_memory == 48 * GIB and r.devices[0].free_memory == 46 * GIB
    assert r.devices[0].bf16 is True


def test_mps_before_macos_14_has_no_bf16(fake_hw: FakeHardware) -> None:
    fake_hw.mps(macos14=False)
    assert row("mps").devices[0].bf16 is False


def test_mps_built_but_unavailable(fake_hw: FakeHardware) -> None:
    fake_hw.mps(available=False)
    r = row("mps")
    assert not r.usable and "this Mac cannot use it" in (r.reason or "")


def test_mps_not_built(fake_hw: FakeHardware) -> None:
    fake_hw.mps(built=False)
    assert "only on macOS" in (row("mps").reason or "")


def test_tpu_usable(fake_hw: FakeHardware) -> None:
    fake_hw.tpu(count=4)
    r = row("tpu")
    assert r.usable and [d.device for d in r.devices] == ["tpu:0", "tpu:1", "tpu:2", "tpu:3"]
    assert r.devices[0].bf16 is True and r.devices[0].total_memory == 32 * GIB


def test_tpu_installed_without_tpus(fake_hw: FakeHardware) -> None:
    fake_hw.tpu(count=0)
    r = row("tpu")
    assert not r.usable and r.installed and "no TPU was found" in (r.reason or "")


def test_tpu_missing(fake_hw: FakeHardware) -> None:
    fake_hw.tpu(installed=False)
    r = row("tpu")
    assert not r.usable and not r.installed and "torch-tpu" in (r.fix or "")


# ---------------------------------------------------------------- extras and vendors


def test_extra_rows_appear_only_when_their_package_is_installed(fake_hw: FakeHardware) -> None:
    assert "sdaa" not in [r.key for r in backends.probe_all()]
    fake_hw.plugin("sdaa", "torch_sdaa", FakeGpu(name="T100"))
    r = row("sdaa")
    assert r.extra and r.usable and r.devices[0].device == "sdaa:0"


def test_a_vendor_adds_a_row_through_the_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from nbhw.core.hardware.data import DeviceInfo, Probed

    vendor = backends.Backend(
        "qpu", "Quantum PU", "qpu", "torch-qpu", "torch", lambda: Probed(True, devices=[DeviceInfo(0, "qpu:0", "Q1")])
    )
    ep = importlib.metadata.EntryPoint("qpu", "tests.core.hardware.test_backends:VENDOR", backends.ENTRY_POINT_GROUP)
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group=None: [ep] if group == backends.ENTRY_POINT_GROUP else []
    )
    monkeypatch.setitem(globals(), "VENDOR", vendor)
    rows = {r.key: r for r in backends.probe_all()}
    assert rows["qpu"].usable and rows["qpu"].extra and rows["qpu"].devices[0].name == "Q1"
    assert list(rows)[: len(TABLE)] == list(TABLE)


def test_a_probe_that_raises_becomes_a_row_that_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("driver exploded")

    vendor = backends.Backend("boom", "Boom", "boom", "torch", "torch", broken)  # type: ignore[arg-type]
    r = backends.status(vendor)
    assert not r.usable and r.reason == "the boom probe failed: RuntimeError: driver exploded"
