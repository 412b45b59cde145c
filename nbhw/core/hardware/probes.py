"""One probe per backend: is it usable here, why not, and its devices.

Probes never create a CUDA context, never allocate on a device and never touch the network. NVIDIA facts
come from NVML; other backends are asked through their torch device module, which vendor plugins register
when imported. Tests fake hardware at exactly these points: the ``pynvml`` / ``amdsmi`` modules, the plugin
modules in ``sys.modules`` and the ``torch.<device>`` modules.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import platform
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from nbhw.core.hardware import cuda_arch, nvml, visible_devices
from nbhw.core.hardware.data import DeviceInfo, Probed
from nbhw.core.hardware.environment import variable_set

CUDA_WHEELS = "https://download.pytorch.org/whl/cu128"
ROCM_WHEELS = "https://download.pytorch.org/whl/rocm6.4"
XPU_WHEELS = "https://download.pytorch.org/whl/xpu"


def torch_module() -> ModuleType | None:
    """torch, imported on first use; None when it is not installed."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        return None


def module_installed(name: str) -> bool:
    """Whether a module can be imported, without importing it."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def torch_build(torch: ModuleType) -> str:
    """'CPU', 'CUDA 12.8' or 'ROCm 6.4' for this torch."""
    version = getattr(torch, "version", None)
    hip = getattr(version, "hip", None)
    cuda = getattr(version, "cuda", None)
    if hip:
        return f"ROCm {hip}"
    if cuda:
        return f"CUDA {cuda}"
    return "CPU"


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_native_bf16() -> bool | None:
    """Whether the CPU computes bf16 natively (AVX512-BF16 / AMX, Apple arm64); None when it can't tell."""
    flags = _cpu_flags()
    if bool(flags & {"avx512_bf16", "amx_bf16"}) or platform.machine() == "arm64":
        return True
    return False if flags else None


def probe_cpu() -> Probed:
    """The CPU is always usable; bf16 speed depends on AVX512-BF16 / AMX."""
    import psutil

    torch = torch_module()
    native_bf16 = cpu_native_bf16()
    dev = DeviceInfo(index=0, device="cpu", name=cpu_name(), bf16=True, fp16=True, tf32=False)
    try:
        mem = psutil.virtual_memory()
        dev.total_memory, dev.free_memory = int(mem.total), int(mem.available)
    except (psutil.Error, OSError) as exc:  # the CPU is still usable; only its memory figures are unknown
        dev.notes.append(f"psutil could not read the machine's memory: {type(exc).__name__}: {exc}")
    if native_bf16 is False:
        dev.notes.append("bf16 runs without native support (no AVX512-BF16/AMX): expect it slower than float32")
    if torch is not None:
        with contextlib.suppress(Exception):
            dev.details["isa"] = str(torch.backends.cpu.get_cpu_capability())
        dev.details["threads"] = str(torch.get_num_threads())
    cores = None
    with contextlib.suppress(psutil.Error, OSError):
        cores = psutil.cpu_count(logical=False)
    dev.details["cores"] = str(cores or "N/A")
    return Probed(usable=True, devices=[dev])


def _nvidia_device(ordinal: int, gpu: nvml.NvmlGpu) -> DeviceInfo:
    cc = gpu.compute_capability
    # bf16 and tf32 run natively from compute capability 8 (Ampere), the rule torch.cuda.is_bf16_supported uses.
    ampere = cc[0] >= 8 if cc else None
    dev = DeviceInfo(
        index=ordinal,
        device=f"cuda:{ordinal}",
        name=gpu.name,
        total_memory=gpu.memory_total,
        free_memory=gpu.memory_free,
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
        bf16=ampere,
        fp16=True if cc else None,
        tf32=ampere,
    )
    dev.details.update({"nvml_index": str(gpu.index), "pci_bus_id": gpu.pci_bus_id or "N/A", "uuid": gpu.uuid or "N/A"})
    if gpu.error:
        dev.notes.append(gpu.error)
    if ampere is False:
        dev.notes.append("bf16 is emulated before compute capability 8.0 (Ampere): use float16")
    return dev


def _arch_note(arch: tuple[str, ...] | None, dev: DeviceInfo) -> None:
    """Say when this torch ships no kernels for the GPU's architecture (e.g. a new GPU with an old wheel).

    ``arch`` is read from torch's binary (cuda_arch.arch_list_from_binary), not from torch.cuda.get_arch_list():
    that call arms torch's fork trap, so a forked child (accelerate's notebook_launcher) could not start CUDA.
    """
    if not arch or dev.compute_capability is None:
        return
    major, minor = (int(x) for x in dev.compute_capability.split("."))
    verdict = cuda_arch.verdict(cuda_arch.codes(arch), (major, minor))
    built = " ".join(arch)
    if verdict == "none":
        dev.notes.append(
            f"this torch was built for {built}; sm_{major}{minor} is not among them: its first operation on "
            f"{dev.device} fails with 'no kernel image is available' (%hw doctor gives the command that fixes it)"
        )
    elif verdict == "jit":
        dev.notes.append(
            f"this torch was built for {built}: no native kernels for sm_{major}{minor}, so the driver compiles "
            "them from PTX on first use (slow the first time; %hw doctor gives the command that fixes it)"
        )


def probe_cuda_nvidia() -> Probed:
    """NVIDIA GPUs through NVML, mapped to cuda:N the way CUDA will number them."""
    torch = torch_module()
    assert torch is not None
    build = torch_build(torch)
    view = nvml.read()
    if build.startswith("ROCm"):
        return Probed(
            False,
            f"this torch is a ROCm build ({torch.__version__}): it drives AMD GPUs, not NVIDIA",
            f"pip install torch --index-url {CUDA_WHEELS}",
        )
    if build == "CPU":
        driver = "" if view.available else f"; {view.error}"
        gpus = f"; the driver sees {len(view.gpus)} NVIDIA GPU(s)" if view.available and view.gpus else ""
        return Probed(
            False,
            f"this torch ({torch.__version__}) is a CPU-only build{gpus}{driver}",
            f"pip install torch --index-url {CUDA_WHEELS} (a cuXYZ at or below the driver's CUDA version)",
        )
    if not view.available:
        return Probed(False, view.error, "install the NVIDIA driver (nvidia-smi must work)")
    if not view.gpus:
        return Probed(False, "the NVIDIA driver is loaded but sees no GPU", "check nvidia-smi; on a VM, attach a GPU")
    visible = visible_devices.visible_gpus(view.gpus)
    if visible.hides_all:
        return Probed(
            False,
            "CUDA_VISIBLE_DEVICES is set to an empty string, which hides all GPUs",
            "unset CUDA_VISIBLE_DEVICES (or list GPUs) before torch initialises CUDA; restart the kernel",
        )
    rows = visible.initialised_rows or visible.rows
    if not rows:
        return Probed(
            False,
            "; ".join(visible.problems) or "CUDA_VISIBLE_DEVICES selects no GPU",
            "fix CUDA_VISIBLE_DEVICES (e.g. 0,1) and restart the kernel",
        )
    by_index = {g.index: g for g in view.gpus}
    devices = [_nvidia_device(n, by_index[row.nvml_index]) for n, row in enumerate(rows)]
    arch = cuda_arch.arch_list_from_binary(cuda_arch.torch_lib_dir(torch))
    for dev in devices:
        _arch_note(arch, dev)
    notes = [f"driver {view.driver_version}, supports CUDA {view.cuda_driver_version}"] if view.driver_version else []
    return Probed(True, devices=devices, notes=notes + visible.problems)


def _amd_devices(torch: ModuleType) -> tuple[list[DeviceInfo], list[str]]:
    """AMD GPUs through amdsmi (no HIP context); a count from torch when amdsmi is missing."""
    try:
        amdsmi: Any = importlib.import_module("amdsmi")
    except ImportError:
        count = torch.cuda.device_count()
        devs = [DeviceInfo(index=i, device=f"cuda:{i}", bf16=True, fp16=True) for i in range(count)]
        return devs, ["names and memory need amdsmi (pip install amdsmi)"] if count else []
    amdsmi.amdsmi_init()
    handles = list(amdsmi.amdsmi_get_processor_handles())
    picked = torch.cuda._parse_visible_devices()
    chosen = [int(i) for i in picked if isinstance(i, int) and int(i) < len(handles)]
    devices = []
    for ordinal, idx in enumerate(chosen):
        handle = handles[idx]
        asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
        vram = amdsmi.amdsmi_get_gpu_vram_usage(handle)
        arch = str(asic.get("target_graphics_version", "")) or None
        total = int(vram["vram_total"]) * 1024**2
        used = int(vram["vram_used"]) * 1024**2
        devices.append(
            DeviceInfo(
                index=ordinal,
                device=f"cuda:{ordinal}",
                name=str(asic.get("market_name") or "AMD GPU"),
                total_memory=total,
                free_memory=total - used,
                compute_capability=arch,
                # ROCm always supports bf16 (torch.cuda.is_bf16_supported); tf32 only on gfx94x/gfx95x, torch's rule.
                bf16=True,
                fp16=True,
                tf32=bool(arch and arch.startswith(("gfx94", "gfx95"))),
                details={"smi_index": str(idx)},
            )
        )
    return devices, []


def probe_cuda_rocm() -> Probed:
    """AMD GPUs: a ROCm build of torch (torch.version.hip) and GPUs that amdsmi or HIP can see."""
    torch = torch_module()
    assert torch is not None
    build = torch_build(torch)
    if not build.startswith("ROCm"):
        return Probed(
            False,
            f"this torch ({torch.__version__}) is not a ROCm build ({build})",
            f"pip install torch --index-url {ROCM_WHEELS}",
        )
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "" or os.environ.get("HIP_VISIBLE_DEVICES", None) == "":
        return Probed(
            False,
            "CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES is empty, which hides all GPUs",
            "unset it before torch initialises HIP; restart the kernel",
        )
    try:
        devices, notes = _amd_devices(torch)
    except Exception as exc:
        return Probed(False, f"amdsmi failed: {exc}", "check that rocm-smi works and the amdgpu driver is loaded")
    if not devices:
        return Probed(False, "no AMD GPU found by the ROCm runtime", "check rocm-smi; install the amdgpu driver")
    return Probed(True, devices=devices, notes=notes)


def probe_mps() -> Probed:
    """Apple Silicon GPU through Metal."""
    torch = torch_module()
    assert torch is not None
    mps = torch.backends.mps
    if not mps.is_built():
        where = f"{platform.system()} {platform.machine()}"
        return Probed(
            False,
            f"MPS exists only on macOS with Apple Silicon; this is {where}",
            "use a Mac with Apple Silicon (macOS 12.3+) and the standard torch wheel",
        )
    if not mps.is_available():
        return Probed(
            False,
            "this torch has MPS, but this Mac cannot use it (needs Apple Silicon and macOS 12.3+)",
            "update macOS to 12.3 or newer on an Apple Silicon Mac",
        )
    total = int(torch.mps.recommended_max_memory())
    dev = DeviceInfo(
        index=0,
        device="mps",
        name=str(mps.get_name()) if hasattr(mps, "get_name") else "Apple GPU",
        total_memory=total,
        free_memory=max(0, total - int(torch.mps.driver_allocated_memory())),
        # transformers' rule: bf16 on MPS from macOS 14.
        bf16=bool(mps.is_macos_or_newer(14, 0)),
        fp16=True,
        tf32=False,
    )
    return Probed(True, devices=[dev], notes=["unified memory: the GPU shares the Mac's RAM"])


def probe_xpu() -> Probed:
    """Intel GPUs through stock torch's XPU backend."""
    torch = torch_module()
    assert torch is not None
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu._is_compiled():
        return Probed(
            False,
            f"this torch ({torch.__version__}) is built without XPU support",
            f"pip install torch --index-url {XPU_WHEELS}",
        )
    if not xpu.is_available():
        return Probed(
            False,
            "no Intel GPU found (or its driver / Level Zero runtime is missing)",
            "install the Intel GPU driver; check with `sycl-ls`",
        )
    devices = []
    for i in range(xpu.device_count()):
        props = xpu.get_device_properties(i)
        free = _free_memory(xpu, i)
        devices.append(
            DeviceInfo(
                index=i,
                device=f"xpu:{i}",
                name=str(props.name),
                total_memory=int(props.total_memory),
                free_memory=free,
                bf16=bool(getattr(props, "has_bfloat16_conversions", True)),
                fp16=bool(getattr(props, "has_fp16", True)),
                tf32=bool(getattr(props, "has_subgroup_matrix_multiply_accumulate_tensor_float32", False)),
            )
        )
    return Probed(True, devices=devices)


def _free_memory(module: Any, index: int) -> int | None:
    fn = getattr(module, "mem_get_info", None)
    if fn is None:
        return None
    try:
        return int(fn(index)[0])
    except Exception:
        return None


def plugin_probe(
    device: str, module: str, hardware: str, install: str, env: tuple[str, str] | None = None
) -> Callable[[], Probed]:
    """A probe for an out-of-tree torch backend: import its plugin, then ask ``torch.<device>``."""

    def probe() -> Probed:
        torch = torch_module()
        assert torch is not None
        if not module_installed(module):
            return Probed(False, f"{module} is not installed", install)
        try:
            importlib.import_module(module)
        except Exception as exc:
            return Probed(False, f"importing {module} failed: {type(exc).__name__}: {exc}", install)
        mod = getattr(torch, device, None)
        if mod is None:
            return Probed(False, f"{module} is installed but did not register torch.{device}", install)
        with variable_set(*env) if env else contextlib.nullcontext():
            available = bool(mod.is_available())
        if not available:
            return Probed(
                False,
                f"{module} is installed but no {hardware} was found (driver or runtime missing?)",
                f"run on a machine with a {hardware} and its driver",
            )
        return Probed(True, devices=[_plugin_device(mod, device, i) for i in range(int(mod.device_count()))])

    return probe


def _ask(notes: list[str], call: str, fn: Callable[[], Any]) -> Any:
    """``fn()``, or None with a note naming the call that failed (a device that vanished, a driver error)."""
    try:
        return fn()
    except Exception as exc:
        notes.append(f"{call} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
        return None


def _plugin_device(mod: Any, device: str, i: int) -> DeviceInfo:
    notes: list[str] = []
    where = f"torch.{device}"
    name = _ask(notes, f"{where}.get_device_name({i})", lambda: str(mod.get_device_name(i)))
    total = _ask(notes, f"{where}.get_device_properties({i})", lambda: int(mod.get_device_properties(i).total_memory))
    bf16 = _ask(notes, f"{where}.is_bf16_supported()", lambda: bool(mod.is_bf16_supported()))
    free = None
    if getattr(mod, "mem_get_info", None) is not None:
        free = _ask(notes, f"{where}.mem_get_info({i})", lambda: int(mod.mem_get_info(i)[0]))
    return DeviceInfo(
        index=i,
        device=f"{device}:{i}",
        name=name,
        total_memory=total,
        free_memory=free,
        bf16=bf16,
        fp16=True if bf16 is not None else None,
        notes=notes,
    )


def probe_tpu() -> Probed:
    """Google TPUs through the torch_tpu plugin (PrivateUse1 accelerator 'tpu'), the path transformers 5 uses."""
    torch = torch_module()
    assert torch is not None
    notes = []
    if module_installed("torch_xla"):
        notes.append(
            "torch_xla is installed: Trainer and accelerate take the XLA path, device_map needs 'tpu' via torch_tpu"
        )
    install = "pip install torch-tpu (on a Cloud TPU VM)"
    if not module_installed("torch_tpu"):
        return Probed(False, "torch_tpu is not installed", install, notes=notes)
    try:
        importlib.import_module("torch_tpu")
    except Exception as exc:
        return Probed(False, f"importing torch_tpu failed: {type(exc).__name__}: {exc}", install, notes=notes)
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != "tpu" or not torch.accelerator.is_available():
        return Probed(False, "torch_tpu is installed but no TPU was found", "run on a Cloud TPU VM", notes=notes)
    devices = []
    for i in range(torch.accelerator.device_count()):
        total = free = None
        with contextlib.suppress(Exception):
            free, total = (int(x) for x in torch.accelerator.get_memory_info(i))
        # transformers: bf16 is always supported on TPUs.
        devices.append(
            DeviceInfo(
                index=i,
                device=f"tpu:{i}",
                name="TPU",
                total_memory=total,
                free_memory=free,
                bf16=True,
                fp16=None,
                tf32=False,
            )
        )
    return Probed(True, devices=devices, notes=notes)
