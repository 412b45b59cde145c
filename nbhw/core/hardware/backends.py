"""The backend registry: one entry per row of the Transformers hardware table, plus vendor-added rows.

A vendor adds a row without changing nbhw by exposing a :class:`Backend` (or a callable returning one) under
the ``nbhw.backends`` entry-point group. Rows known to the installed libraries beyond the table (accelerate's
sdaa, transformers' supa) appear when their plugin package is installed.
"""

from __future__ import annotations

import importlib.metadata
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass

from nbhw.core.hardware import presence, probes
from nbhw.core.hardware.data import BackendStatus, Probed

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "nbhw.backends"


@dataclass(frozen=True)
class Backend:
    """A row: what the hardware is, its device string, the package that brings it, and how to probe it."""

    key: str
    hardware: str
    device: str
    package: str
    module: str
    probe: Callable[[], Probed]
    extra: bool = False
    only_when_installed: bool = False


BUILTIN: tuple[Backend, ...] = (
    Backend("cpu", "CPU", "cpu", "torch", "torch", probes.probe_cpu),
    Backend("cuda", "NVIDIA GPU", "cuda", "torch", "torch", probes.probe_cuda_nvidia),
    Backend("rocm", "AMD GPU", "cuda", "torch (ROCm build)", "torch", probes.probe_cuda_rocm),
    Backend(
        "neuron",
        "AWS Trainium",
        "neuron",
        "torch-neuronx",
        "torch_neuronx",
        probes.plugin_probe(
            "neuron",
            "torch_neuronx",
            "AWS Trainium/Inferentia device",
            "pip install torch-neuronx --extra-index-url https://pip.repos.neuron.amazonaws.com (on Trn/Inf)",
        ),
    ),
    Backend("tpu", "Google TPU", "tpu", "torch-tpu", "torch_tpu", probes.probe_tpu),
    Backend("xpu", "Intel GPU", "xpu", "torch", "torch", probes.probe_xpu),
    Backend("mps", "Apple Silicon", "mps", "torch", "torch", probes.probe_mps),
    Backend(
        "hpu",
        "Intel Gaudi",
        "hpu",
        "habana-torch-plugin",
        "habana_frameworks.torch",
        probes.plugin_probe(
            "hpu",
            "habana_frameworks.torch",
            "Intel Gaudi accelerator",
            "install the Intel Gaudi software stack (habana-torch-plugin) on a Gaudi machine",
        ),
    ),
    Backend(
        "npu",
        "Huawei Ascend NPU",
        "npu",
        "torch-npu",
        "torch_npu",
        probes.plugin_probe("npu", "torch_npu", "Ascend NPU", "pip install torch-npu (with the Ascend CANN toolkit)"),
    ),
    Backend(
        "mlu",
        "Cambricon MLU",
        "mlu",
        "torch-mlu",
        "torch_mlu",
        probes.plugin_probe(
            "mlu",
            "torch_mlu",
            "Cambricon MLU",
            "pip install torch-mlu (with Cambricon Neuware)",
            # transformers' cndev-based check, which leaves the MLU driver uninitialised.
            env=("PYTORCH_CNDEV_BASED_MLU_CHECK", "1"),
        ),
    ),
    Backend(
        "musa",
        "Moore Threads GPU",
        "musa",
        "torch-musa",
        "torch_musa",
        probes.plugin_probe(
            "musa", "torch_musa", "Moore Threads GPU", "pip install torch-musa (with the MUSA toolkit)"
        ),
    ),
    Backend(
        "sdaa",
        "Tecorigin SDAA",
        "sdaa",
        "torch-sdaa",
        "torch_sdaa",
        probes.plugin_probe("sdaa", "torch_sdaa", "Tecorigin SDAA", "pip install torch-sdaa"),
        extra=True,
        only_when_installed=True,
    ),
    Backend(
        "supa",
        "Biren SUPA",
        "supa",
        "torch-supa",
        "torch_supa",
        probes.plugin_probe("supa", "torch_supa", "Biren GPU", "pip install torch-supa"),
        extra=True,
        only_when_installed=True,
    ),
)

TABLE_KEYS = tuple(b.key for b in BUILTIN if not b.extra)


def _entry_point_backends() -> list[Backend]:
    found = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            backend = obj() if callable(obj) and not isinstance(obj, Backend) else obj
        except Exception as exc:
            log.warning("nbhw: backend entry point %s failed to load: %s", ep.name, exc)
            continue
        if isinstance(backend, Backend):
            found.append(backend)
    return found


def registry() -> list[Backend]:
    """Every row nbhw knows now: the table, then extras and vendor entry points (a vendor key replaces ours)."""
    rows = {b.key: b for b in BUILTIN}
    for backend in _entry_point_backends():
        rows[backend.key] = Backend(**{**backend.__dict__, "extra": backend.key not in TABLE_KEYS})
    return list(rows.values())


def package_version(backend: Backend) -> str | None:
    """The installed version of the row's package, from its metadata or its module."""
    dist = backend.package.split(" ")[0]
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    module = sys.modules.get(backend.module) or sys.modules.get(backend.module.split(".")[0])
    version = getattr(module, "__version__", None)
    return str(version) if version is not None else None


def status(backend: Backend) -> BackendStatus:
    """Probe one row; a probe that raises becomes a not-usable row that says what failed."""
    installed = probes.module_installed(backend.module)
    row = BackendStatus(
        key=backend.key,
        hardware=backend.hardware,
        device=backend.device,
        package=backend.package,
        installed=installed,
        version=package_version(backend) if installed else None,
        usable=False,
        extra=backend.extra,
    )
    if probes.torch_module() is None:
        row.reason, row.fix = "torch is not installed", "pip install torch"
        return row
    row.torch_accelerator = backend.device == presence.accelerator_type()
    try:
        probed = backend.probe()
    except Exception as exc:
        probed = Probed(False, f"the {backend.key} probe failed: {type(exc).__name__}: {exc}", None)
    row.usable, row.reason, row.fix = probed.usable, probed.reason, probed.fix
    row.devices, row.notes = probed.devices, probed.notes
    if probed.version:
        row.version = probed.version
    if row.installed is False and row.usable:
        row.installed = True
    return row


def probe_all() -> list[BackendStatus]:
    """Every row, in table order; extras only when their package is installed."""
    return [status(b) for b in registry() if not b.only_when_installed or probes.module_installed(b.module)]
