"""Hardware this machine doesn't have, faked at the boundary nbhw asks: NVML, amdsmi, plugin modules, torch.<device>.

Use the ``fake_hw`` fixture (tests/conftest.py): ``fake_hw.nvidia(FakeGpu(...))``, ``fake_hw.plugin("npu", ...)``,
``fake_hw.xpu(...)``, ``fake_hw.mps(...)``, ``fake_hw.rocm(...)``, ``fake_hw.tpu(...)``. Everything is undone by
monkeypatch at the end of the test.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import platform
import sys
import types
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from nbhw.core.hardware import nvml, presence, probes

GIB = 1024**3


@dataclass
class FakeGpu:
    """One fake accelerator device."""

    name: str = "NVIDIA A100-SXM4-80GB"
    total: int = 80 * GIB
    used: int = 1 * GIB
    cc: tuple[int, int] = (8, 0)
    uuid: str = ""
    pci_bus_id: str = ""
    fail: bool = False
    processes: list[tuple[int, int]] = field(default_factory=list)
    arch: str = "gfx942"
    bf16: bool = True


# ---------------------------------------------------------------- NVML


class NVMLError(Exception):
    """Like pynvml.NVMLError."""


class NVMLError_LibraryNotFound(NVMLError):
    """Like pynvml's: libnvidia-ml.so.1 missing."""


class NVMLError_DriverNotLoaded(NVMLError):
    """Like pynvml's: driver not loaded."""


class FakeNvml(types.ModuleType):
    """A stand-in for the ``pynvml`` module with configurable GPUs and faults."""

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded

    def __init__(
        self,
        gpus: list[FakeGpu],
        init_error: type[Exception] | None = None,
        driver: str = "580.65.06",
        cuda: int = 13000,
    ) -> None:
        super().__init__("pynvml")
        for i, g in enumerate(gpus):
            g.uuid = g.uuid or f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}"
            g.pci_bus_id = g.pci_bus_id or f"00000000:{0x10 + i:02X}:00.0"
        self.gpus = gpus
        self.init_error = init_error
        self.driver = driver
        self.cuda = cuda
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error("fake NVML init failure")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        if index >= len(self.gpus):
            raise NVMLError("Invalid Argument")
        gpu = self.gpus[index]
        if gpu.fail:
            raise NVMLError("GPU is lost")
        return gpu

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(busId=h.pci_bus_id)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        if h.fail:
            raise NVMLError("GPU is lost")
        return types.SimpleNamespace(total=h.total, used=h.used, free=h.total - h.used)

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu) -> tuple[int, int]:
        return h.cc

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in h.processes]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: FakeGpu) -> list[Any]:
        return []


# ---------------------------------------------------------------- torch device modules


class FakeDeviceModule(types.ModuleType):
    """A stand-in for ``torch.<device>`` (torch.npu, torch.xpu, ...) with per-process memory counters."""

    def __init__(self, name: str, gpus: list[FakeGpu], available: bool = True) -> None:
        super().__init__(f"torch.{name}")
        self.gpus = gpus
        self.available = available
        self.allocated = [0 for _ in gpus]
        self.reserved = [0 for _ in gpus]
        self.peak = [0 for _ in gpus]

    def _is_compiled(self) -> bool:
        return True

    def is_available(self) -> bool:
        return self.available and bool(self.gpus)

    def device_count(self) -> int:
        return len(self.gpus) if self.available else 0

    def get_device_name(self, i: int = 0) -> str:
        return self.gpus[i].name

    def get_device_properties(self, i: int = 0) -> Any:
        g = self.gpus[i]
        return types.SimpleNamespace(
            name=g.name,
            total_memory=g.total,
            has_bfloat16_conversions=g.bf16,
            has_fp16=True,
            has_subgroup_matrix_multiply_accumulate_tensor_float32=False,
        )

    def mem_get_info(self, i: int = 0) -> tuple[int, int]:
        g = self.gpus[i]
        return g.total - g.used, g.total

    def is_bf16_supported(self) -> bool:
        return self.gpus[0].bf16

    def memory_allocated(self, i: int = 0) -> int:
        return self.allocated[i]

    def memory_reserved(self, i: int = 0) -> int:
        return self.reserved[i]

    def max_memory_allocated(self, i: int = 0) -> int:
        return self.peak[i]

    def reset_peak_memory_stats(self, i: int = 0) -> None:
        self.peak[i] = self.allocated[i]


def fake_module(name: str, version: str = "9.9.9") -> types.ModuleType:
    """An importable, empty plugin module (find_spec works because __spec__ is set)."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__version__ = version  # type: ignore[attr-defined]
    return module


def _arms_the_fork_trap() -> str:
    raise AssertionError("torch._C._cuda_getArchFlags() was called: it arms torch's fork trap")


class FakeHardware:
    """Builder for fake hardware; every change is undone by pytest's monkeypatch."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.mp = monkeypatch
        self.nvml: FakeNvml | None = None
        nvml.reset()
        monkeypatch.setattr(nvml, "_state", {})

    def _set_nvml(self, module: types.ModuleType | None) -> None:
        self.mp.setitem(sys.modules, "pynvml", module)
        nvml._state.clear()

    def no_nvml_library(self) -> None:
        """The driver is missing: NVML can't load libnvidia-ml.so.1."""
        self.nvml = FakeNvml([], init_error=NVMLError_LibraryNotFound)
        self._set_nvml(self.nvml)

    def nvml_init_fails(self) -> None:
        """NVML is there but nvmlInit fails (driver not loaded)."""
        self.nvml = FakeNvml([], init_error=NVMLError_DriverNotLoaded)
        self._set_nvml(self.nvml)

    def nvidia(self, *gpus: FakeGpu, cuda_build: str = "12.8", init_error: type[Exception] | None = None) -> FakeNvml:
        """NVIDIA GPUs seen by NVML, and a CUDA build of torch."""
        self.nvml = FakeNvml(list(gpus), init_error=init_error)
        self._set_nvml(self.nvml)
        self.mp.setattr(torch.version, "cuda", cuda_build)
        self.mp.setattr(torch.version, "hip", None)
        self.torch_accelerator("cuda")
        # Nothing may ask torch for its arch list: that call arms the fork trap (nbhw reads torch's binary).
        self.mp.setattr(torch._C, "_cuda_getArchFlags", _arms_the_fork_trap, raising=False)
        return self.nvml

    def rocm(self, *gpus: FakeGpu, hip: str = "6.4", amdsmi: bool = True) -> None:
        """AMD GPUs: a ROCm build of torch (torch.version.hip) and amdsmi."""
        self.mp.setattr(torch.version, "hip", hip)
        self.mp.setattr(torch.version, "cuda", None)
        self.torch_accelerator("cuda")  # a ROCm build is torch's cuda device type
        if not amdsmi:
            self.mp.setitem(sys.modules, "amdsmi", None)
            self.mp.setattr(torch.cuda, "device_count", lambda: len(gpus))
            return
        smi = fake_module("amdsmi")
        handles = list(gpus)
        smi.amdsmi_init = lambda: None  # type: ignore[attr-defined]
        smi.amdsmi_get_processor_handles = lambda: handles  # type: ignore[attr-defined]
        smi.amdsmi_get_gpu_asic_info = lambda h: {  # type: ignore[attr-defined]
            "market_name": h.name,
            "target_graphics_version": h.arch,
        }
        smi.amdsmi_get_gpu_vram_usage = lambda h: {  # type: ignore[attr-defined]
            "vram_total": h.total // 2**20,
            "vram_used": h.used // 2**20,
        }
        self.mp.setitem(sys.modules, "amdsmi", smi)

    def plugin(
        self, device: str, module: str, *gpus: FakeGpu, available: bool = True, install: bool = True
    ) -> FakeDeviceModule | None:
        """An out-of-tree backend: its plugin module installed, and torch.<device> registered (or not)."""
        if not install:
            self.mp.setitem(sys.modules, module, None)
            return None
        parts = module.split(".")
        for i in range(1, len(parts) + 1):
            self.mp.setitem(sys.modules, ".".join(parts[:i]), fake_module(".".join(parts[:i])))
        dev = FakeDeviceModule(device, list(gpus), available=available)
        self.mp.setattr(torch, device, dev, raising=False)
        self.torch_accelerator(device)  # the plugin registered its device type (PrivateUse1 wins over a build's)
        return dev

    def plugin_without_device_module(self, module: str) -> None:
        """The plugin is installed but registers nothing on torch."""
        self.mp.setitem(sys.modules, module, fake_module(module))

    def xpu(self, *gpus: FakeGpu, compiled: bool = True) -> FakeDeviceModule:
        """Intel GPUs through stock torch's torch.xpu."""
        dev = FakeDeviceModule("xpu", list(gpus))
        dev._is_compiled = lambda: compiled  # type: ignore[method-assign]
        self.mp.setattr(torch, "xpu", dev)
        if compiled:
            self.torch_accelerator("xpu")
        return dev

    def mps(self, built: bool = True, available: bool = True, macos14: bool = True, total: int = 48 * GIB) -> None:
        """An Apple Silicon Mac."""
        mps = torch.backends.mps
        if built:
            self.torch_accelerator("mps")
        self.mp.setattr(mps, "is_built", lambda: built)
        self.mp.setattr(mps, "is_available", lambda: available)
        self.mp.setattr(mps, "is_macos_or_newer", lambda major, minor: macos14)
        self.mp.setattr(mps, "get_name", lambda: "Apple M3 Max", raising=False)
        self.mp.setattr(torch.mps, "recommended_max_memory", lambda: total)
        self.mp.setattr(torch.mps, "driver_allocated_memory", lambda: 2 * GIB)
        self.mp.setattr(torch.mps, "current_allocated_memory", lambda: 1 * GIB)

    def tpu(self, count: int = 4, installed: bool = True) -> None:
        """Google TPUs through the torch_tpu PrivateUse1 plugin."""
        if not installed:
            self.mp.setitem(sys.modules, "torch_tpu", None)
            return
        self.mp.setitem(sys.modules, "torch_tpu", fake_module("torch_tpu"))
        tpu = types.SimpleNamespace(type="tpu")  # the plugin is registered: torch itself names it
        self.mp.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: tpu)
        self.torch_accelerator("tpu")
        self.mp.setattr(torch.accelerator, "is_available", lambda: count > 0)
        self.mp.setattr(torch.accelerator, "device_count", lambda: count)
        self.mp.setattr(torch.accelerator, "get_memory_info", lambda i=None: (30 * GIB, 32 * GIB))

    def torch_accelerator(self, kind: str | None) -> None:
        """The device type nbhw reads as torch's accelerator (torch.accelerator.current_accelerator(): the build's,
        or a registered plugin's), faked at nbhw's probe: torch itself is left as the CPU build it is, so
        transformers, which asks torch, still runs as on this machine (as a GPU's fakes leave torch.cuda)."""
        self.mp.setattr(presence, "accelerator_type", lambda: kind)

    def linux_cpu_machine(self, *, native_bf16: bool = True) -> None:
        """The machine CI runs on, made explicit: Linux x86_64, a CPU-only torch, no NVIDIA driver, no kernels.

        Tests that describe "this CPU machine" use it, so they pass on a Mac or a GPU box too. ``native_bf16``:
        whether the CPU has AVX512-BF16 / AMX (the dtype advice for the CPU follows it).
        """
        self.no_nvml_library()
        self.mp.setattr(torch.version, "cuda", None)
        self.mp.setattr(torch.version, "hip", None)
        self.torch_accelerator(None)
        self.mp.setattr(torch.cuda, "is_available", lambda: False)
        self.mp.setattr(torch.cuda, "device_count", lambda: 0)
        self.mp.setattr(torch.backends.mps, "is_built", lambda: False)
        self.mp.setattr(torch.backends.mps, "is_available", lambda: False)
        self.mp.setattr(platform, "system", lambda: "Linux")
        self.mp.setattr(platform, "machine", lambda: "x86_64")
        flags = {"sse4_2", "avx2", "avx512f", *({"avx512_bf16", "amx_bf16"} if native_bf16 else ())}
        self.mp.setattr(probes, "_cpu_flags", lambda: flags)
        self.no_kernels()

    def no_kernels(self) -> None:
        """The kernels package is not installed (transformers' check and nbhw's find_spec both say so)."""
        from transformers.utils import import_utils

        real = importlib.util.find_spec

        def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
            return None if name == "kernels" or name.startswith("kernels.") else real(name, *args, **kwargs)

        self.mp.setattr(importlib.util, "find_spec", find_spec)
        self.mp.setattr(import_utils, "is_kernels_available", lambda *a, **k: False)

    def env(self, **values: str | None) -> None:
        """Set (or, with None, unset) environment variables."""
        for name, value in values.items():
            if value is None:
                self.mp.delenv(name, raising=False)
            else:
                self.mp.setenv(name, value)
