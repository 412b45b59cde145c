"""The environment variables that decide devices, and the traps they set in a notebook."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from nbhw.core.hardware import visible_devices
from nbhw.core.hardware.data import EnvAnalysis, EnvVar
from nbhw.core.hardware.nvml import NvmlView


@contextlib.contextmanager
def variable_set(name: str, value: str) -> Iterator[None]:
    """``name=value`` in this process's environment for the duration, then as it was (unset, or its old value)."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


ALWAYS_SHOWN = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "ACCELERATE_TORCH_DEVICE", "HF_HUB_OFFLINE")
SHOWN_WHEN_SET = (
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "ASCEND_RT_VISIBLE_DEVICES",
    "MLU_VISIBLE_DEVICES",
    "MUSA_VISIBLE_DEVICES",
    "NEURON_RT_VISIBLE_CORES",
    "HF_HOME",
    "HF_HUB_CACHE",
    "TRANSFORMERS_OFFLINE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_ENABLE_MPS_FALLBACK",
    "PYTORCH_NVML_BASED_CUDA_CHECK",
    "ACCELERATE_USE_CPU",
    "USE_TORCH_XLA",
    "USE_HUB_KERNELS",
    "LOCAL_RANK",
    "WORLD_SIZE",
)


def _cuda_visible_meaning(value: str | None) -> str:
    if value is None:
        return "unset: every GPU is visible"
    if value.strip() == "":
        return "empty: hides every GPU from CUDA"
    return f"only these GPUs are visible, renumbered cuda:0.. in the listed order ({value})"


def _order_meaning(value: str | None) -> str:
    if value == "PCI_BUS_ID":
        return "cuda:N follows PCI bus order, like nvidia-smi"
    if value in (None, "FASTEST_FIRST"):
        return "CUDA numbers GPUs fastest-first, which may not match nvidia-smi; PCI_BUS_ID makes them agree"
    return f"unknown value {value!r}: CUDA accepts FASTEST_FIRST or PCI_BUS_ID"


def _meaning(name: str, value: str | None) -> str:
    fixed = {
        "ACCELERATE_TORCH_DEVICE": "accelerate / Trainer fall back to this device when no accelerator is found",
        "HF_HUB_OFFLINE": "set: the Hub is never contacted; configs and weights come from the local cache only",
        "TRANSFORMERS_OFFLINE": "transformers will not contact the Hub",
        "PYTORCH_ENABLE_MPS_FALLBACK": "ops missing on MPS run on the CPU instead of failing",
        "ACCELERATE_USE_CPU": "accelerate and Trainer are forced onto the CPU",
        "USE_HUB_KERNELS": "switches transformers' Hub kernels on or off",
        "PYTORCH_NVML_BASED_CUDA_CHECK": "torch.cuda.is_available() asks NVML instead of initialising CUDA",
    }
    if name == "CUDA_VISIBLE_DEVICES":
        return _cuda_visible_meaning(value)
    if name == "CUDA_DEVICE_ORDER":
        return _order_meaning(value)
    if name == "ACCELERATE_TORCH_DEVICE" and value is None:
        return "unset: accelerate / Trainer fall back to cpu when no accelerator is found"
    if name == "HF_HUB_OFFLINE" and value is None:
        return "unset: configs and weights may be fetched from the Hub when not cached"
    return fixed.get(name, "set")


def variables() -> list[EnvVar]:
    """The variables that matter: the key ones always, the rest when set."""
    names = list(ALWAYS_SHOWN) + [n for n in SHOWN_WHEN_SET if n in os.environ]
    return [EnvVar(n, os.environ.get(n), _meaning(n, os.environ.get(n))) for n in names]


def _init_warning(visible: visible_devices.VisibleGpus) -> str | None:
    """CUDA initialised with another CUDA_VISIBLE_DEVICES than the one in os.environ now."""
    actual = visible.initialised_rows
    if actual is None:
        return None
    wanted = [r.nvml_index for r in visible.rows]
    if [r.nvml_index for r in actual] == wanted or (not visible.rows and not actual and not visible.hides_all):
        return None
    return (
        f"CUDA_VISIBLE_DEVICES is now {os.environ.get('CUDA_VISIBLE_DEVICES')!r}, but CUDA was initialised in "
        f"this process with a different value ({len(actual)} GPU(s)): changing it after CUDA starts has no "
        "effect; restart the kernel and set it before importing torch"
    )


def analyse(view: NvmlView) -> EnvAnalysis:
    """Variables, the cuda:N ↔ nvidia-smi mapping and the warnings that follow from them."""
    result = EnvAnalysis(variables=variables())
    if not view.available or not view.gpus:
        return result
    visible = visible_devices.visible_gpus(view.gpus)
    result.gpu_order = visible.initialised_rows or visible.rows
    result.gpu_order_exact = visible.exact
    result.warnings.extend(visible.problems)
    if visible.hides_all:
        result.warnings.append("CUDA_VISIBLE_DEVICES is empty: no GPU is visible to CUDA in this process")
    several = len(view.gpus) > 1
    if several and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and visible.order_differs_from_nvidia_smi:
        how = "" if visible.exact else " (predicted: CUDA's fastest-first order is a driver heuristic)"
        result.warnings.append(
            f"cuda:N does not match nvidia-smi's numbering here{how}; set CUDA_DEVICE_ORDER=PCI_BUS_ID before "
            "importing torch to make them agree"
        )
    warning = _init_warning(visible)
    if warning:
        result.warnings.append(warning)
    return result
