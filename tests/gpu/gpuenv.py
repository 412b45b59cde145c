"""Is there an NVIDIA GPU to verify against, and how to ask a fresh Python about it.

The decision reads torch's build and NVML only: it never creates a CUDA context, so the suite's "no context after
detection" checks stay honest however the suite starts. NVML is asked here through pynvml directly, not through
nbhw, so the suite does not take nbhw's word for what it checks.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class NvmlGpu:
    """One GPU as NVML reports it (index = nvidia-smi index)."""

    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total: int
    compute_capability: tuple[int, int]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus() -> tuple[list[NvmlGpu], str | None]:
    """Every GPU NVML sees, or why NVML can't say (no CUDA context either way)."""
    try:
        import pynvml
    except ImportError:
        return [], "the nvidia-ml-py package (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:
        return [], f"NVML could not start ({type(exc).__name__}: {exc})"
    try:
        gpus = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            gpus.append(
                NvmlGpu(
                    index=i,
                    name=_text(pynvml.nvmlDeviceGetName(h)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(h)),
                    pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(h).busId),
                    memory_total=int(pynvml.nvmlDeviceGetMemoryInfo(h).total),
                    compute_capability=(int(major), int(minor)),
                )
            )
        return gpus, None
    except Exception as exc:
        return [], f"NVML failed ({type(exc).__name__}: {exc})"
    finally:
        pynvml.nvmlShutdown()


def torch_problem() -> str | None:
    """Why this torch can't drive an NVIDIA GPU (None when it is a CUDA build), without initialising CUDA."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if getattr(torch.version, "hip", None):
        return f"this torch ({torch.__version__}) is a ROCm build; this suite checks NVIDIA GPUs"
    if not getattr(torch.version, "cuda", None) or not torch.backends.cuda.is_built():
        return f"this torch ({torch.__version__}) is a CPU-only build (torch.cuda is not compiled)"
    return None


def reasons_no_gpu(torch_reason: str | None, gpus: list[NvmlGpu], nvml_error: str | None, visible: str | None) -> str:
    """The one-line skip reason from the facts; '' when there is a GPU to verify against."""
    reasons = [torch_reason] if torch_reason else []
    if nvml_error:
        reasons.append(nvml_error)
    elif not gpus:
        reasons.append("NVML sees no GPU")
    if visible is not None and not visible.strip():
        reasons.append("CUDA_VISIBLE_DEVICES is empty, which hides every GPU")
    return "no NVIDIA GPU to verify against: " + "; ".join(reasons) if reasons else ""


@functools.cache
def why_no_gpu() -> str:
    """'' when an NVIDIA GPU and a CUDA build of torch are here; else one line saying what is missing."""
    gpus, error = nvml_gpus()
    return reasons_no_gpu(torch_problem(), gpus, error, os.environ.get("CUDA_VISIBLE_DEVICES"))


def gpu_only() -> list[pytest.MarkDecorator]:
    """The marks of a GPU test module: ``gpu``, and a skip (with the reason) when there is no NVIDIA GPU here."""
    reason = why_no_gpu()
    return [pytest.mark.gpu, pytest.mark.skipif(bool(reason), reason=reason or "an NVIDIA GPU is here")]


def same_uuid(a: str | None, b: str | None) -> bool:
    """NVML writes 'GPU-<uuid>', torch writes the bare uuid."""
    return bool(a and b) and str(a).removeprefix("GPU-") == str(b).removeprefix("GPU-")


def probe_env(overrides: dict[str, str | None] | None = None) -> dict[str, str]:
    """The environment for a probe: this one, the repo on PYTHONPATH, offline, and ``overrides`` (None unsets)."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + path if path else "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    # Offline, transformers 5.25's default Hub kernels can't be fetched and the load fails (what the plan now says,
    # tests/gpu/test_offline_kernels.py); the memory checks load with the layers' own code.
    env.setdefault("USE_HUB_KERNELS", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name, value in (overrides or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def run_probe(*args: str, env: dict[str, str | None] | None = None, timeout: float = 300) -> dict[str, Any]:
    """Run ``python -m tests.gpu.probe ARGS`` in a fresh process and return the JSON it prints last.

    A fresh process is the honest place for "no CUDA context" checks: nothing this test process did counts there.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "tests.gpu.probe", *args],
        cwd=ROOT,
        env=probe_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise AssertionError(f"probe {' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
